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
    /// One warp per 32 consecutive rows: each lane loads one id (the next batch's ids are
    /// loaded before this batch's rows), then the lanes walk the batch's chunks in order.
    WarpPerRows,
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
        name: "gather_chunk16_pipe",
        shape: Shape::ChunkPerThread { unroll: 1 },
        about: "a thread per 16-byte chunk, the next chunk's id loaded before this chunk's row",
    },
    Variant {
        name: "gather_chunk16_ahead",
        shape: Shape::ChunkPerThread { unroll: 1 },
        about: "as _pipe, and the next row bulk-prefetched into L2 one step ahead",
    },
    Variant {
        name: "gather_chunk16_nohint",
        shape: Shape::ChunkPerThread { unroll: 1 },
        about: "a thread per 16-byte chunk, loads without the L1 and L2 cache hints",
    },
    Variant {
        name: "gather_chunk16_nohint_x2",
        shape: Shape::ChunkPerThread { unroll: 2 },
        about: "a thread per 16-byte chunk, 2 unhinted loads in flight per thread",
    },
    Variant {
        name: "gather_chunk16_coherent",
        shape: Shape::ChunkPerThread { unroll: 1 },
        about: "a thread per 16-byte chunk, loads through the coherent path (ld.global)",
    },
    Variant {
        name: "gather_chunk16_l2_128",
        shape: Shape::ChunkPerThread { unroll: 1 },
        about: "a thread per 16-byte chunk, loads asking L2 for whole 128-byte lines",
    },
    Variant {
        name: "gather_chunk16_l1bypass",
        shape: Shape::ChunkPerThread { unroll: 1 },
        about: "a thread per 16-byte chunk, loads bypassing L1 only (no 256-byte L2 fetch)",
    },
    Variant {
        name: "gather_chunk16_nohint_cs",
        shape: Shape::ChunkPerThread { unroll: 1 },
        about: "a thread per 16-byte chunk, unhinted loads, streaming stores",
    },
    Variant {
        name: "gather_chunk16_nohint_pipe",
        shape: Shape::ChunkPerThread { unroll: 1 },
        about: "a thread per 16-byte chunk, unhinted loads, the next chunk's id loaded early",
    },
    Variant {
        name: "gather_chunk16_cs",
        shape: Shape::ChunkPerThread { unroll: 1 },
        about: "a thread per 16-byte chunk, streaming (evict-first) stores",
    },
    Variant {
        name: "gather_warp_batch_x4",
        shape: Shape::WarpPerRows,
        about: "a warp per 32 rows: ids in one load, 4 chunks in flight per lane",
    },
    Variant {
        name: "gather_warp_batch_x8",
        shape: Shape::WarpPerRows,
        about: "a warp per 32 rows: ids in one load, 8 chunks in flight per lane",
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
        global_thread, grid_threads, hint, load_hinted_16, load_i64, load_i64_early,
        load_stream_16, prefetch_l2, record_bad_id, shuffle_i64, store_16, store_16_streaming,
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
    unsafe fn chunk_per_thread<const UNROLL: usize, const STREAMING: bool, const HINT: u8>(
        p: &GatherParams,
    ) {
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
                        data[j] = unsafe { load_hinted_16::<HINT>(src) };
                    }
                }
            }
            for j in 0..UNROLL {
                if dest[j] != u64::MAX {
                    // SAFETY: dest is chunk c of output row i < n, owned by this thread.
                    unsafe {
                        if STREAMING {
                            store_16_streaming(dest[j], data[j]);
                        } else {
                            store_16(dest[j], data[j]);
                        }
                    }
                }
            }
            base += UNROLL as u64 * stride;
        }
    }

    /// Per thread: one 16-byte chunk at a time; a warp covers two 256-byte rows.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gather_chunk16(p: GatherParams) {
        unsafe { chunk_per_thread::<1, false, { hint::STREAM }>(&p) }
    }

    /// Per thread: one chunk, stored with evict-first priority (output read once, later).
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gather_chunk16_cs(p: GatherParams) {
        unsafe { chunk_per_thread::<1, true, { hint::STREAM }>(&p) }
    }

    /// Per thread: one chunk at a time, the id of the next chunk requested before this chunk's
    /// row, so the id's latency overlaps the row's instead of adding to it.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gather_chunk16_pipe(p: GatherParams) {
        unsafe { chunk_pipelined::<false, { hint::STREAM }>(&p) }
    }

    /// As `gather_chunk16_pipe`, and the thread that will copy the next row's first chunk asks
    /// L2 for that whole row now (a bulk prefetch costs no registers), doubling the bytes in
    /// flight.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gather_chunk16_ahead(p: GatherParams) {
        unsafe { chunk_pipelined::<true, { hint::STREAM }>(&p) }
    }

    #[inline(always)]
    unsafe fn chunk_pipelined<const AHEAD: bool, const HINT: u8>(p: &GatherParams) {
        let chunks = (p.row_bytes / CHUNK_BYTES).max(1);
        let total = p.n * chunks as u64;
        let stride = grid_threads();
        let id_of = |t: u64| {
            // SAFETY: t < total, so its row is below n and inside the ids array.
            if t < total {
                unsafe { load_i64_early(p.ids + 8 * split(t, chunks).0) }
            } else {
                -1
            }
        };
        let valid = |id: i64| id >= 0 && (id as u64) < p.rows;
        let mut t = global_thread();
        let mut id = id_of(t);
        while t < total {
            let next = t + stride;
            let next_id = id_of(next);
            if AHEAD && next < total && split(next, chunks).1 == 0 && valid(next_id) {
                // SAFETY: next_id < rows: the whole row lies in the table; rows are 16-byte
                // multiples at a 16-byte aligned base.
                unsafe { prefetch_l2(p.table + next_id as u64 * p.row_bytes as u64, p.row_bytes) };
            }
            let (i, c) = split(t, chunks);
            let mut data = [0u32; 4];
            if valid(id) {
                let src = p.table + id as u64 * p.row_bytes as u64 + (c * CHUNK_BYTES) as u64;
                // SAFETY: id < rows and c < chunks: inside row `id`.
                data = unsafe { load_hinted_16::<HINT>(src) };
            } else if c == 0 {
                // SAFETY: the host passes the address of a live IdStatus.
                unsafe { record_bad_id(p.status, i) };
            }
            // SAFETY: chunk c of output row i < n, owned by this thread.
            unsafe {
                store_16(
                    p.out + i * p.row_bytes as u64 + (c * CHUNK_BYTES) as u64,
                    data,
                )
            };
            id = next_id;
            t = next;
        }
    }

    /// Per thread: one chunk, loaded with no cache hints (no L1 bypass, no 256-byte L2 fetch).
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gather_chunk16_nohint(p: GatherParams) {
        unsafe { chunk_per_thread::<1, false, { hint::PLAIN }>(&p) }
    }

    /// Per thread: two unhinted chunks in flight.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gather_chunk16_nohint_x2(p: GatherParams) {
        unsafe { chunk_per_thread::<2, false, { hint::PLAIN }>(&p) }
    }

    /// Per thread: one chunk through the coherent (L1) path.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gather_chunk16_coherent(p: GatherParams) {
        unsafe { chunk_per_thread::<1, false, { hint::COHERENT }>(&p) }
    }

    /// Per thread: one chunk, L2 fetching whole 128-byte lines.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gather_chunk16_l2_128(p: GatherParams) {
        unsafe { chunk_per_thread::<1, false, { hint::L2_128 }>(&p) }
    }

    /// Per thread: one chunk, loaded bypassing L1 only (no 256-byte L2 fetch).
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gather_chunk16_l1bypass(p: GatherParams) {
        unsafe { chunk_per_thread::<1, false, { hint::L1_BYPASS }>(&p) }
    }

    /// Per thread: one chunk, no cache hints, streaming stores.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gather_chunk16_nohint_cs(p: GatherParams) {
        unsafe { chunk_per_thread::<1, true, { hint::PLAIN }>(&p) }
    }

    /// Per thread: one chunk, no cache hints, the next chunk's id loaded early.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gather_chunk16_nohint_pipe(p: GatherParams) {
        unsafe { chunk_pipelined::<false, { hint::PLAIN }>(&p) }
    }

    /// Per thread: four chunks loaded before any store, for more bytes in flight per thread.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gather_chunk16_x4(p: GatherParams) {
        unsafe { chunk_per_thread::<4, false, { hint::STREAM }>(&p) }
    }

    /// Per warp: 32 rows, 4 chunks in flight per lane.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gather_warp_batch_x4(p: GatherParams) {
        unsafe { warp_batch::<4>(&p) }
    }

    /// Per warp: 32 rows, 8 chunks in flight per lane.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gather_warp_batch_x8(p: GatherParams) {
        unsafe { warp_batch::<8>(&p) }
    }

    /// The id of row `row`, or -1 past the end; issued where it stands (not moved to its use),
    /// so that the next batch's ids load while this batch's rows do.
    #[inline(always)]
    unsafe fn batch_id(p: &GatherParams, row: u64) -> i64 {
        // SAFETY: row < n, so ids + 8 row lies in the ids array.
        if row < p.n {
            unsafe { load_i64_early(p.ids + 8 * row) }
        } else {
            -1
        }
    }

    #[inline(always)]
    unsafe fn warp_batch<const IN_FLIGHT: usize>(p: &GatherParams) {
        let chunks = (p.row_bytes / CHUNK_BYTES).max(1);
        let slots = 32 * chunks; // chunks in a batch of 32 rows
        let lane = (global_thread() % 32) as u32;
        let step = grid_threads(); // warps * 32 rows
        let mut base = global_thread() - lane as u64;
        // SAFETY: batch_id reads only ids below n.
        let mut id = unsafe { batch_id(p, base + lane as u64) };
        while base < p.n {
            let next = base + step;
            // SAFETY: as above.
            let next_id = unsafe { batch_id(p, next + lane as u64) };
            let row = base + lane as u64;
            if row < p.n && !(id >= 0 && (id as u64) < p.rows) {
                // SAFETY: the host passes the address of a live IdStatus.
                unsafe { record_bad_id(p.status, row) };
            }
            let mut s0 = lane;
            while s0 < slots {
                let mut data = [[0u32; 4]; IN_FLIGHT];
                let mut dest = [u64::MAX; IN_FLIGHT];
                for j in 0..IN_FLIGHT {
                    let s = s0 + 32 * j as u32;
                    let (r, c) = split(s as u64, chunks);
                    // Every lane shuffles (s < slots is the same for the whole warp).
                    let rid = shuffle_i64(id, r as u32 & 31);
                    if s < slots && base + r < p.n {
                        dest[j] = p.out + base * p.row_bytes as u64 + (s * CHUNK_BYTES) as u64;
                        if rid >= 0 && (rid as u64) < p.rows {
                            let src = p.table
                                + rid as u64 * p.row_bytes as u64
                                + (c * CHUNK_BYTES) as u64;
                            // SAFETY: rid < rows and c < chunks: inside row `rid`.
                            data[j] = unsafe { load_stream_16(src) };
                        }
                    }
                }
                for j in 0..IN_FLIGHT {
                    if dest[j] != u64::MAX {
                        // SAFETY: chunk s of this batch's output, owned by this lane.
                        unsafe { store_16(dest[j], data[j]) };
                    }
                }
                s0 += 32 * IN_FLIGHT as u32;
            }
            id = next_id;
            base = next;
        }
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
