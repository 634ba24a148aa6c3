//! A simulated communication collective: the window an L2 prefetch hides behind.
//!
//! A real all-reduce of a decode step is a 1-8 CTA kernel whose threads poll flags in global
//! memory while the multiprocessors and DRAM sit idle. This kernel does the same for a fixed time:
//! thread 0 of each block polls the flag (an uncached 4-byte load) until `ns` nanoseconds of
//! `%globaltimer` have passed; the other threads exit at once.

/// The most CTAs the host launches it with.
pub const MAX_BLOCKS: u32 = 8;
/// Threads per block (one warp; only thread 0 polls).
pub const BLOCK_THREADS: u32 = 32;

pub const KERNEL: &str = "collective_spin";
/// Its twin that records the device timeline.
pub const KERNEL_TIMED: &str = "collective_spin_timed";

#[cfg(target_arch = "nvptx64")]
mod kernels {
    use crate::device::{global_timer_ns, load_volatile_u32, thread_in_block};
    use crate::params::CollectiveParams;

    /// Per block: thread 0 polls until the time is up; nothing is written.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn collective_spin(p: CollectiveParams) {
        // SAFETY: the host passes a live flag or 0.
        unsafe { poll(&p) }
    }

    /// As `collective_spin`, recording its blocks on the device timeline.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn collective_spin_timed(p: CollectiveParams) {
        // SAFETY: the host passes a live flag or 0.
        timed!(p, unsafe { poll(&p) })
    }

    #[inline(always)]
    unsafe fn poll(p: &CollectiveParams) {
        if thread_in_block() != 0 {
            return;
        }
        let start = global_timer_ns();
        while global_timer_ns().wrapping_sub(start) < p.ns {
            if p.flag != 0 {
                // SAFETY: the host passes the address of a live u32 (or 0, never read). The
                // asm has side effects, so the poll stays although its value is unused.
                let _ = unsafe { load_volatile_u32(p.flag) };
            }
        }
    }
}
