//! Check mode's comparison: two bf16 buffers (a prefetched gather's output and the synchronous
//! path's output for the same ids) compared bit for bit; a launch that sees any difference adds
//! one to a device counter.
//!
//! Per thread: one 16-byte chunk of each buffer at a time, grid-stride. Each block reduces its
//! verdict with one barrier; the last block to finish folds the launch's verdict into the counter
//! and clears the per-launch words, so that the counter counts launches, not elements, and a
//! launch replayed from a CUDA graph needs no host reset.

/// The comparison kernel's entry.
pub const KERNEL: &str = "check_equal";

#[cfg(target_arch = "nvptx64")]
mod kernels {
    use crate::device::{
        atomic_add_u32, atomic_exch_u32, block_any, blocks, fence_gpu, global_thread, grid_threads,
        load_stream_16, thread_in_block,
    };
    use crate::params::CheckParams;

    /// Byte offsets of the `CheckCounter` fields.
    const DIFFERED: u64 = 0;
    const MISMATCH: u64 = 4;
    const BLOCKS_DONE: u64 = 8;

    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn check_equal(p: CheckParams) {
        let mut differs = false;
        let stride = grid_threads();
        let mut t = global_thread();
        while t < p.chunks {
            // SAFETY: t < chunks, so both 16-byte reads lie inside the buffers.
            let (a, b) = unsafe { (load_stream_16(p.a + 16 * t), load_stream_16(p.b + 16 * t)) };
            differs |= a != b;
            t += stride;
        }
        // Every thread reaches the barrier: the loop above has no early exit.
        let block_differs = block_any(differs);
        if thread_in_block() != 0 {
            return;
        }
        // SAFETY: the host passes the address of a live CheckCounter; only thread 0 of each block
        // touches it, with atomics.
        unsafe {
            if block_differs {
                atomic_exch_u32(p.counter + MISMATCH, 1);
            }
            // This block's verdict is visible before its ticket is.
            fence_gpu();
            if atomic_add_u32(p.counter + BLOCKS_DONE, 1) == blocks() - 1 {
                fence_gpu();
                if atomic_exch_u32(p.counter + MISMATCH, 0) != 0 {
                    atomic_add_u32(p.counter + DIFFERED, 1);
                }
                atomic_exch_u32(p.counter + BLOCKS_DONE, 0);
            }
        }
    }
}
