//! Row gather: `out[i] = table[ids[i]]`, rows a multiple of 16 bytes, int64 ids.
//!
//! Every variant reads each row with 16-byte loads that skip L1 (a gathered row is read once) and
//! writes 16-byte stores; an id outside `0..rows` writes a zero row and is recorded in the
//! launch's `IdStatus`. A new variant is one kernel below plus one line in [`VARIANTS`].

/// Threads per block for every gather and dequant launch.
pub const BLOCK_THREADS: u32 = 256;

/// How a variant maps work to threads; the host sizes the grid from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// One thread per 16-byte chunk of output, `unroll` chunks (a grid-stride apart) loaded before
    /// any is stored, over a grid-stride loop.
    ChunkPerThread { unroll: u32 },
    /// One warp per row, its lanes over the row's 16-byte chunks.
    WarpPerRow,
}

/// A kernel of the gather family: its PTX entry name and shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    pub name: &'static str,
    pub shape: Shape,
    pub about: &'static str,
}

pub const VARIANTS: &[Variant] = &[
    Variant {
        name: "gather_chunk16",
        shape: Shape::ChunkPerThread { unroll: 1 },
        about: "a thread per 16-byte chunk, grid-stride",
    },
    Variant {
        name: "gather_chunk16_x4",
        shape: Shape::ChunkPerThread { unroll: 4 },
        about: "a thread per 16-byte chunk, 4 loads in flight per thread",
    },
    Variant {
        name: "gather_warp_row",
        shape: Shape::WarpPerRow,
        about: "a warp per row, lanes over 16-byte chunks",
    },
];

/// A kernel that takes [`GatherParams`](crate::params::GatherParams) and does nothing: the launch
/// cost every small gather is measured against.
pub const EMPTY_KERNEL: &str = "gather_empty";

#[cfg(target_arch = "nvptx64")]
mod kernels {
    use crate::device::{
        global_thread, grid_threads, load_i64, load_stream_16, record_bad_id, store_16,
    };
    use crate::params::{CHUNK_BYTES, GatherParams};

    /// The source address of output row `i`'s chunk `c`, or `None` (after recording it) when the
    /// row's id is outside the table.
    #[inline(always)]
    unsafe fn source(p: &GatherParams, i: u64, c: u32) -> Option<u64> {
        // SAFETY: i < n, so ids + 8 i lies in the ids array.
        let id = unsafe { load_i64(p.ids + 8 * i) };
        if id >= 0 && (id as u64) < p.rows {
            Some(p.table + id as u64 * p.row_bytes as u64 + (c * CHUNK_BYTES) as u64)
        } else {
            if c == 0 {
                // SAFETY: the host passes the address of a live IdStatus.
                unsafe { record_bad_id(p.status, i) };
            }
            None
        }
    }

    /// Splits a chunk number into (row, chunk in row); `t < n * chunks < 2^32`, checked on the host.
    #[inline(always)]
    fn split(t: u64, chunks: u32) -> (u64, u32) {
        let t = t as u32;
        if chunks.is_power_of_two() {
            let shift = chunks.trailing_zeros();
            ((t >> shift) as u64, t & (chunks - 1))
        } else {
            ((t / chunks) as u64, t % chunks)
        }
    }

    #[inline(always)]
    unsafe fn chunk_per_thread<const UNROLL: usize>(p: &GatherParams) {
        // At least 1 (the host refuses narrower rows), so the divisions below cannot trap.
        let chunks = (p.row_bytes / CHUNK_BYTES).max(1);
        let total = p.n * chunks as u64;
        let stride = grid_threads();
        let mut base = global_thread();
        while base < total {
            let mut data = [[0u32; 4]; UNROLL];
            let mut dest = [u64::MAX; UNROLL];
            for j in 0..UNROLL {
                let t = base + j as u64 * stride;
                if t < total {
                    let (i, c) = split(t, chunks);
                    dest[j] = p.out + i * p.row_bytes as u64 + (c * CHUNK_BYTES) as u64;
                    // SAFETY: `source` returns only addresses of rows inside the table.
                    if let Some(src) = unsafe { source(p, i, c) } {
                        data[j] = unsafe { load_stream_16(src) };
                    }
                }
            }
            for j in 0..UNROLL {
                if dest[j] != u64::MAX {
                    // SAFETY: dest is chunk c of output row i < n, owned by this thread.
                    unsafe { store_16(dest[j], data[j]) };
                }
            }
            base += UNROLL as u64 * stride;
        }
    }

    /// Per thread: one 16-byte chunk at a time; a warp covers two 256-byte rows.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gather_chunk16(p: GatherParams) {
        unsafe { chunk_per_thread::<1>(&p) }
    }

    /// Per thread: four chunks loaded before any store, for more bytes in flight per thread.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gather_chunk16_x4(p: GatherParams) {
        unsafe { chunk_per_thread::<4>(&p) }
    }

    /// Per warp: one row, each lane 16 bytes at a time (a 256-byte row keeps 16 lanes busy).
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gather_warp_row(p: GatherParams) {
        let chunks = p.row_bytes / CHUNK_BYTES;
        let lane = (global_thread() % 32) as u32;
        let warps = grid_threads() / 32;
        let mut i = global_thread() / 32;
        while i < p.n {
            let mut c = lane;
            while c < chunks {
                let dest = p.out + i * p.row_bytes as u64 + (c * CHUNK_BYTES) as u64;
                // SAFETY: `source` returns only addresses inside the table.
                let data = match unsafe { source(&p, i, c) } {
                    Some(src) => unsafe { load_stream_16(src) },
                    None => [0; 4],
                };
                // SAFETY: dest is chunk c of output row i < n, owned by this lane.
                unsafe { store_16(dest, data) };
                c += 32;
            }
            i += warps;
        }
    }

    /// Does nothing: the floor a small gather's launch is compared with.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gather_empty(_p: GatherParams) {}
}
