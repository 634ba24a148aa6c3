//! A simulated communication collective: the window an L2 prefetch hides behind.
//!
//! A real all-reduce of a decode step is a 1-8 CTA kernel whose threads poll flags in global
//! memory while the multiprocessors and DRAM sit idle, and which ends by writing its result, the
//! next kernel's activations, into L2. This kernel does the same for a fixed time: thread 0 of
//! each block polls the flag (an uncached 4-byte load) until `ns` nanoseconds of `%globaltimer`
//! have passed; then, if it has an output, every thread rewrites its share of it in place (the
//! same values, so that what reads it is unchanged). Without an output the other threads exit
//! at once.

/// The most CTAs the host launches it with.
pub const MAX_BLOCKS: u32 = 8;
/// Threads per block (only thread 0 polls; all of them write the output).
pub const BLOCK_THREADS: u32 = 256;

pub const KERNEL: &str = "collective_spin";
/// Its twin that records the device timeline.
pub const KERNEL_TIMED: &str = "collective_spin_timed";

#[cfg(target_arch = "nvptx64")]
mod kernels {
    use crate::device::{
        block_sync, global_thread, global_timer_ns, grid_threads, hint, load_hinted_16,
        load_volatile_u32, store_16, thread_in_block,
    };
    use crate::params::CollectiveParams;

    /// 16-byte words each thread loads before it stores them when writing the output.
    const WORDS_IN_FLIGHT: usize = 8;

    /// Per block: thread 0 polls until the time is up; then the output is written.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn collective_spin(p: CollectiveParams) {
        // SAFETY: the host passes a live flag or 0, and a live output or none.
        unsafe { run(&p) }
    }

    /// As `collective_spin`, recording its blocks on the device timeline.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn collective_spin_timed(p: CollectiveParams) {
        // SAFETY: the host passes a live flag or 0, and a live output or none.
        timed!(p, unsafe { run(&p) })
    }

    #[inline(always)]
    unsafe fn run(p: &CollectiveParams) {
        if thread_in_block() == 0 {
            // SAFETY: the caller's flag.
            unsafe { poll(p) };
        }
        if p.out_bytes == 0 {
            return;
        }
        // Uniform over the block (a parameter), so every thread reaches the barrier.
        block_sync();
        // SAFETY: the host passes a live, 16-byte aligned output of `out_bytes` (a multiple
        // of 16); each word is read and written by one thread only.
        unsafe { rewrite(p.out, p.out_bytes / 16) };
    }

    /// Rewrites `words` 16-byte words at `out` in place, the grid's threads striding over them,
    /// each thread loading up to `WORDS_IN_FLIGHT` before it stores them.
    ///
    /// # Safety
    /// `out` is a live, 16-byte aligned allocation of at least `words` words that nothing else
    /// touches during the kernel.
    #[inline(always)]
    unsafe fn rewrite(out: u64, words: u64) {
        let stride = grid_threads();
        let mut first = global_thread();
        while first < words {
            let mut v = [[0u32; 4]; WORDS_IN_FLIGHT];
            for (j, word) in v.iter_mut().enumerate() {
                let i = first + j as u64 * stride;
                if i < words {
                    // SAFETY: word `i` lies in the output (the caller's bound).
                    *word = unsafe { load_hinted_16::<{ hint::COHERENT }>(out + i * 16) };
                }
            }
            for (j, word) in v.iter().enumerate() {
                let i = first + j as u64 * stride;
                if i < words {
                    // SAFETY: as above; this thread alone owns word `i`.
                    unsafe { store_16(out + i * 16, *word) };
                }
            }
            first += WORDS_IN_FLIGHT as u64 * stride;
        }
    }

    /// Thread 0's poll until the time is up.
    #[inline(always)]
    unsafe fn poll(p: &CollectiveParams) {
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
