#!/bin/sh
# A fast-device stand-in for the row-store benches: a loop device over a file in tmpfs, formatted
# ext4 and mounted. O_DIRECT reads there cost ~100 us at QD1 and peak CPU-bound near 200k/s, so
# the store's software cost shows where the real disk would hide it.
#
#   benches/fast-device.sh up [MOUNT] [SIZE_MB]   # prints the mount point
#   benches/fast-device.sh down [MOUNT]
#
# Needs root (losetup, mkfs.ext4, mount); says why and exits 77 (skipped) where not allowed.
set -eu
cmd=${1:-}
mnt=${2:-/mnt/fetchahead-fast}
size_mb=${3:-6144}
state="$mnt.state"
backing_dir=${FETCHAHEAD_TMPFS:-/dev/shm}

skip() {
	echo "SKIP fast device: $*" >&2
	exit 77
}

case "$cmd" in
up)
	[ "$(id -u)" = 0 ] || skip "needs root (losetup, mkfs.ext4, mount)"
	for tool in losetup mkfs.ext4 mount; do
		command -v "$tool" >/dev/null 2>&1 || skip "$tool not found"
	done
	[ -e "$state" ] && { echo "already up: $(cat "$state")" >&2; echo "$mnt"; exit 0; }
	fstype=$(stat -f -c %T "$backing_dir")
	[ "$fstype" = tmpfs ] || skip "$backing_dir is $fstype, not tmpfs (set FETCHAHEAD_TMPFS)"
	img=$(mktemp "$backing_dir/fetchahead-fast.XXXXXX")
	truncate -s "${size_mb}M" "$img"
	if ! dev=$(losetup -f --show "$img" 2>/dev/null); then
		rm -f "$img"
		skip "losetup refused (no loop devices here?)"
	fi
	if ! mkfs.ext4 -q -F "$dev" || ! mkdir -p "$mnt" || ! mount "$dev" "$mnt"; then
		losetup -d "$dev"
		rm -f "$img"
		skip "mkfs.ext4 or mount of $dev failed"
	fi
	echo "$dev $img" >"$state"
	echo "$mnt"
	;;
down)
	[ -e "$state" ] || { echo "not up: no $state" >&2; exit 0; }
	read -r dev img <"$state"
	umount "$mnt"
	losetup -d "$dev"
	rm -f "$img" "$state"
	rmdir "$mnt" 2>/dev/null || true
	echo "down: $dev detached, $img removed" >&2
	;;
*)
	echo "usage: $0 up [MOUNT] [SIZE_MB] | down [MOUNT]" >&2
	exit 2
	;;
esac
