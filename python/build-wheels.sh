#!/usr/bin/env bash
# The wheels a team installs without Rust: manylinux abi3 wheels for x86_64 and aarch64 (one each
# for every CPython from 3.10, every torch and every CUDA version) and an sdist, then checks.
#
#   bash python/build-wheels.sh [OUT_DIR]      (default python/dist; about 4 min a target on 2 CPUs)
#
# The wheels are linked by zig (pip's `ziglang`) against the glibc of their manylinux tag, so the
# aarch64 one cross-builds here and neither depends on this machine's glibc. Checks: each wheel's
# WHEEL metadata and file name carry the cp310-abi3 manylinux tag of its architecture, auditwheel
# finds the x86_64 wheel consistent with its tag, and the x86_64 wheel installs into a fresh venv
# whose PATH has no cargo and imports there (no GPU needed), its `fetchahead` command running.
# Build tools (maturin, ziglang, auditwheel) come from PyPI into a throwaway venv.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-python/dist}")
python=${PYTHON:-python3}
manylinux=${FETCHAHEAD_MANYLINUX:-manylinux_2_28}
targets=(x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"

echo "== build tools"
"$python" -m venv "$work/tools"
"$work/tools/bin/pip" install --quiet --disable-pip-version-check 'maturin>=1.5,<2' ziglang auditwheel
export PATH="$work/tools/bin:$PATH"
for target in "${targets[@]}"; do
    rustup target list --installed | grep -qx "$target" || rustup target add "$target"
done

version=$(cargo metadata --no-deps --format-version 1 |
    "$python" -c 'import json, sys; print({p["name"]: p["version"] for p in json.load(sys.stdin)["packages"]}["fetchahead"])')
echo "fetchahead $version (Cargo's version, the wheels' too)"

echo "== wheels"
host=$(rustc -vV | sed -n 's/^host: //p')
for target in "${targets[@]}"; do
    started=$SECONDS
    # The host's wheel builds into target/release, reusing what `cargo build --release` built
    # (zig only links it); another arch builds into target/<triple>. No --strip: its RUSTFLAGS
    # would rebuild every dependency, and the build scripts the cross build shares.
    [ "$target" = "$host" ] && as_target=() || as_target=(--target "$target")
    maturin build --release -m python/Cargo.toml "${as_target[@]}" --zig \
        --compatibility "$manylinux" -o "$work/wheels"
    echo "$target: $((SECONDS - started)) s"
done
maturin sdist -m python/Cargo.toml -o "$work/wheels"

echo "== tags"
"$python" - "$work/wheels" "$version" "$manylinux" <<'EOF'
import pathlib, re, subprocess, sys, tempfile, zipfile

wheels, version, manylinux = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
found = sorted(wheels.glob("*.whl"))
arches = set()
for whl in found:
    name, ver, py, abi, plat = whl.stem.split("-")
    assert (name, ver, py, abi) == ("fetchahead", version, "cp310", "abi3"), whl.name
    arch = plat.split("_", 3)[-1]
    assert plat == f"{manylinux}_{arch}", (whl.name, plat)
    with zipfile.ZipFile(whl) as z:
        meta = z.read(f"fetchahead-{version}.dist-info/WHEEL").decode()
        entry = z.read(f"fetchahead-{version}.dist-info/entry_points.txt").decode()
        tags = [l.split(":", 1)[1].strip() for l in meta.splitlines() if l.startswith("Tag:")]
        assert tags == [f"cp310-abi3-{plat}"], (whl.name, tags)
        assert "fetchahead=fetchahead.__main__:main" in entry.replace(" ", ""), entry
        command = z.getinfo("fetchahead/_bin/fetchahead")
        assert command.external_attr >> 16 & 0o111, "fetchahead/_bin/fetchahead is not executable"
        # The command is its own binary: the extension links no CLI crate.
        native = z.read("fetchahead/_native.abi3.so")
        assert b"clap" not in native and b"indicatif" not in native, "the extension links the CLI"
        # auditwheel reads the extension; the command's glibc needs are checked here, for both.
        with tempfile.TemporaryDirectory() as d:
            needs = subprocess.run(["readelf", "-V", "--wide", z.extract(command, d)],
                                   capture_output=True, text=True, check=True).stdout
    glibc = max(tuple(map(int, v.split("."))) for v in re.findall(r"GLIBC_(\d+(?:\.\d+)+)", needs))
    assert glibc <= tuple(map(int, manylinux.split("_")[1:3])), (whl.name, "command needs glibc", glibc)
    arches.add(arch)
    print(f"{whl.name}: WHEEL tag {tags[0]}, console script fetchahead (its own binary, "
          f"{command.file_size >> 20} MiB, glibc {'.'.join(map(str, glibc))}), no CLI crate in the extension")
assert arches == {"x86_64", "aarch64"}, arches
sdists = list(wheels.glob(f"fetchahead-{version}.tar.gz"))
assert len(sdists) == 1, list(wheels.iterdir())
import tarfile

with tarfile.open(sdists[0]) as t:
    names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
# What a build from the sdist needs: the kernels, build.rs, the host crate, the binding.
for needed in ("build.rs", "gpu/src/lib.rs", "host/lib.rs", "python/src/lib.rs", "python/build.rs",
               "pyproject.toml"):
    assert any(n == needed or n.endswith("/" + needed) for n in names), (needed, sorted(names)[:20])
print(f"{sdists[0].name}: the sdist, {len(names)} files")
EOF
x86=$(ls "$work"/wheels/fetchahead-*x86_64.whl)
auditwheel show "$x86" | tee "$work/audit.txt"
# auditwheel wraps its lines: read the report as one.
tr -s '\n ' '  ' < "$work/audit.txt" |
    grep -q "consistent with the following platform tag: \"${manylinux}_x86_64\"" || {
    echo "auditwheel: $x86 is not consistent with ${manylinux}_x86_64" >&2
    exit 1
}

echo "== the x86_64 wheel in a fresh venv, no cargo on PATH"
"$python" -m venv "$work/fresh"
# numpy from the index first (it is the wheel's one dependency); then only the venv on PATH.
"$work/fresh/bin/pip" install --quiet --disable-pip-version-check numpy
env -i HOME="$work" PATH="$work/fresh/bin" "$work/fresh/bin/pip" install --quiet \
    --disable-pip-version-check --no-deps "$x86"
(cd "$work" && env -i HOME="$work" PATH="$work/fresh/bin" CUDA_VISIBLE_DEVICES= \
    "$work/fresh/bin/python" - "$version" <<'EOF'
import shutil, subprocess, sys

assert shutil.which("cargo") is None and shutil.which("rustc") is None, "cargo is on PATH"
import fetchahead

assert fetchahead.__version__ == sys.argv[1], fetchahead.__version__
assert "site-packages" in fetchahead.__file__, fetchahead.__file__
report = fetchahead.show_config(print_it=False)
assert str(report["device"]).startswith("no device"), report["device"]
try:
    fetchahead.L2Plan()
except fetchahead.NoDeviceError as e:
    print(f"L2Plan() without a device: NoDeviceError ({e.why})")
else:
    raise SystemExit("L2Plan() made without a device")
out = subprocess.run(["fetchahead", "--version"], capture_output=True, text=True, check=True)
assert out.stdout.strip() == f"fetchahead {sys.argv[1]}", out.stdout
print(f"imported fetchahead {fetchahead.__version__} from {fetchahead.__file__}; "
      f"embedded PTX {', '.join(report['archs'])}; `fetchahead --version`: {out.stdout.strip()}")
EOF
)
cp "$work"/wheels/* "$out/"
echo "== ok: $(cd "$out" && ls fetchahead-"$version"* | tr '\n' ' ')"
