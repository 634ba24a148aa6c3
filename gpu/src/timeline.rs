//! The device-side timeline: per block of a launch, when it started and ended (`%globaltimer`),
//! on which SM, which block, which kernel and the host's label for the launch, written into a
//! ring buffer in device memory that the host reads back.
//!
//! Off by default and free when off: every recorded kernel has a twin, `{name}_timed`, the same
//! body wrapped in `device::begin` and `device::end`, and the host launches the twin only when
//! the timeline is on; the plain kernel carries no timeline code (its registers, and so its
//! occupancy, are as they were). Both take the same parameter struct, which ends with a
//! [`TimelineParams`] (`ring` 0: off). In the twin, thread 0 of each block reserves a slot with
//! one atomic add on the ring's head (the slot is the head modulo the capacity, so a full ring
//! overwrites its oldest records and the host counts what was lost), writes the start before the
//! kernel's work, and writes the end after a block barrier that every thread reaches when its
//! share of the work is done.

/// What a launch hands an instrumented kernel: the ring (0: the timeline is off), the kernel's
/// position in `all_kernels()` and the host's label for the launch (a window index).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimelineParams {
    /// Device address of a [`TimelineHeader`] followed by its records; 0: off.
    pub ring: u64,
    /// The kernel's index in [`crate::all_kernels`].
    pub kernel: u32,
    /// The host's label for this launch ([`NO_LABEL`]: none).
    pub label: u32,
}

impl TimelineParams {
    /// The timeline off: nothing is recorded.
    pub const OFF: TimelineParams = TimelineParams {
        ring: 0,
        kernel: 0,
        label: NO_LABEL,
    };
}

/// A launch the host gave no label.
pub const NO_LABEL: u32 = u32::MAX;

/// The ring's first 16 bytes; its records follow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimelineHeader {
    /// Slots reserved since the host last cleared it (it may exceed `capacity`: the ring wrapped).
    pub head: u64,
    /// Records the ring holds, a power of two.
    pub capacity: u64,
}

/// One block of one launch. `end_ns` is 0 until the block has finished.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimelineRecord {
    /// `%globaltimer` before the block's work, nanoseconds.
    pub start_ns: u64,
    /// `%globaltimer` after every thread of the block finished its work.
    pub end_ns: u64,
    /// The kernel's index in [`crate::all_kernels`].
    pub kernel: u32,
    /// The launch's label ([`NO_LABEL`]: none).
    pub label: u32,
    /// `%ctaid.x`.
    pub block: u32,
    /// `%smid`.
    pub sm: u32,
}

/// Bytes of the header before record 0.
pub const HEADER_BYTES: u64 = core::mem::size_of::<TimelineHeader>() as u64;
/// Bytes of one record.
pub const RECORD_BYTES: u64 = core::mem::size_of::<TimelineRecord>() as u64;

/// Bytes of a ring of `capacity` records.
pub const fn ring_bytes(capacity: u64) -> u64 {
    HEADER_BYTES + capacity * RECORD_BYTES
}

const _: () = assert!(HEADER_BYTES == 16 && RECORD_BYTES == 32);
const _: () = assert!(core::mem::size_of::<TimelineParams>() == 16);

/// The kernel side: [`begin`] before a kernel's body, [`end`] after it, both by every thread.
///
/// The slot's address passes from `begin` to `end` through an 8-byte `.shared` word, not a
/// register: nothing stays live across the kernel's body, so an instrumented kernel keeps the
/// registers (and the occupancy) it had.
#[cfg(target_arch = "nvptx64")]
pub(crate) mod device {
    use core::arch::asm;

    use super::{HEADER_BYTES, RECORD_BYTES, TimelineParams};
    use crate::device::{
        atomic_add_u64, block, block_sync, global_timer_ns, load_i64, sm_id, store_i64,
        store_v2_u32, thread_in_block,
    };

    /// Thread 0 of the block reserves a slot, writes its start and leaves the slot's address in
    /// the block's timeline word. Declares that word, so an entry calls it exactly once.
    ///
    /// # Safety
    /// `t.ring` is 0 or the address of a live ring whose header's capacity is a nonzero power
    /// of two.
    #[inline(always)]
    pub(crate) unsafe fn begin(t: &TimelineParams) {
        // SAFETY: declares the block's 8-byte timeline word (function scope, once per entry);
        // touches no memory.
        unsafe {
            asm!(
                ".shared .align 8 .b8 fa_timeline_slot[8];",
                options(nomem, nostack, preserves_flags)
            )
        };
        if t.ring == 0 || thread_in_block() != 0 {
            return;
        }
        // SAFETY: the ring is live; the head is its first word, the capacity its second, and
        // the host does not change the capacity while kernels run.
        let (reserved, capacity) =
            unsafe { (atomic_add_u64(t.ring, 1), load_i64(t.ring + 8) as u64) };
        let slot = t.ring + HEADER_BYTES + (reserved & capacity.wrapping_sub(1)) * RECORD_BYTES;
        // SAFETY: reserved mod capacity < capacity: a record inside the ring, owned by this
        // block until the ring wraps onto it (then the host counts the loss); the timeline word
        // was declared above.
        unsafe {
            store_i64(slot + 8, 0);
            store_v2_u32(slot + 16, [t.kernel, t.label]);
            store_v2_u32(slot + 24, [block(), sm_id()]);
            store_i64(slot, global_timer_ns() as i64);
            asm!("st.shared.u64 [fa_timeline_slot], {0};", in(reg64) slot,
                 options(nostack, preserves_flags));
        }
    }

    /// Waits for every thread of the block, then thread 0 writes the end into the slot
    /// [`begin`] reserved.
    ///
    /// # Safety
    /// [`begin`] ran before it in this entry, and every thread of the block calls this (the
    /// kernel body returns, never exits, so none is missing at the barrier).
    #[inline(always)]
    pub(crate) unsafe fn end(t: &TimelineParams) {
        if t.ring == 0 {
            return;
        }
        // Uniform across the block: `t` is the launch's parameter.
        block_sync();
        if thread_in_block() == 0 {
            let slot: u64;
            // SAFETY: thread 0 wrote the word in `begin`, before the barrier; the record is
            // the one it reserved for this block.
            unsafe {
                asm!("ld.shared.u64 {0}, [fa_timeline_slot];", out(reg64) slot,
                     options(nostack, preserves_flags));
                store_i64(slot + 8, global_timer_ns() as i64);
            }
        }
    }
}
