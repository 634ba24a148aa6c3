//! Row gather: `out[i] = table[ids[i]]`, rows a multiple of 16 bytes, int64 ids.
//!
//! Most variants read each row with 16-byte loads that skip L1 (a gathered row is read once) and
//! write 16-byte stores; the others move rows through shared memory with asynchronous copies
//! (`cp.async`, or bulk copies in and bulk stores out), which hold the bytes in flight without
//! registers. An id outside `0..rows` writes a zero row and is recorded in the launch's
//! `IdStatus`. A new variant is one declaration in the `variants!` list below, which emits both
//! its [`VARIANTS`] row and its kernel entry (plus a body inside `mod kernels` when no kind
//! fits).

/// Threads per block for every gather and dequant launch, unless the variant's [`Shape`] says
/// otherwise.
pub const BLOCK_THREADS: u32 = 256;

/// How a variant maps work to threads; the host sizes the grid from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// One thread per 16-byte chunk of output, `unroll` chunks (a grid-stride apart) loaded before
    /// any is stored, over a grid-stride loop.
    ChunkPerThread { unroll: u32, block_threads: u32 },
    /// One block per `unroll * BLOCK_THREADS` consecutive 16-byte chunks of output, thread `t`
    /// taking chunks `t, t + BLOCK_THREADS, ...` of it: every id, then every chunk, loaded
    /// before any is stored, so a block's bytes in flight are one contiguous stretch of
    /// output. The grid covers the call once.
    ChunkTile { unroll: u32 },
    /// One warp per row, its lanes over the row's 16-byte chunks.
    WarpPerRow,
    /// One warp per 32 consecutive rows: each lane loads one id (the next batch's ids are
    /// loaded before this batch's rows), then the lanes walk the batch's chunks in order.
    WarpPerRows,
    /// A warp per `32 * unroll` consecutive 16-byte chunks of output, each lane loading `unroll`
    /// chunks (32 apart) before storing any, over a grid of `blocks_per_sm` blocks a
    /// multiprocessor striding over the spans: few threads, many bytes in flight each, a
    /// warp's output contiguous.
    WarpSpan { unroll: u32, blocks_per_sm: u32 },
    /// One block of `block_threads` threads per tile of `tile_bytes` consecutive output bytes
    /// (the last tile partial), over a grid of at most as many blocks as fit on the device at
    /// once, each block striding over the tiles.
    TilePerBlock { block_threads: u32, tile_bytes: u32 },
    /// One thread per `word_bytes` bytes of output, the grid covering the call once (no loop):
    /// each thread's index math is 32-bit and its loads predicated rather than branched around,
    /// so that the first load waits on nothing but the thread's own index (the shape of the
    /// Triton peer's gather, ahead at decode sizes).
    WordsOnePass { word_bytes: u32 },
    /// `rows` rows a warp in one pass, `warps` warps a block, lane `l` copying 8-byte word `l`
    /// (and `l + 32 j` of rows wider than 256 bytes) of each of its warp's rows, as the Triton
    /// peer's tile takes its rows: the warp's ids in one load shared by shuffles, with no
    /// arithmetic on the row's width before it, then every row's word loaded before any is
    /// stored. For decode-size calls, where a call's time is its chain of dependent loads.
    RowsTile { rows: u32, warps: u32 },
}

impl Shape {
    /// Whether the grid covers the call once (a block per tile), rather than being capped at
    /// what fits on the device and striding.
    pub const fn one_pass(self) -> bool {
        matches!(
            self,
            Shape::ChunkTile { .. } | Shape::WordsOnePass { .. } | Shape::RowsTile { .. }
        )
    }

    /// Threads per block of a launch of this shape.
    pub const fn block_threads(self) -> u32 {
        match self {
            Shape::TilePerBlock { block_threads, .. }
            | Shape::ChunkPerThread { block_threads, .. } => block_threads,
            Shape::RowsTile { warps, .. } => 32 * warps,
            _ => BLOCK_THREADS,
        }
    }
}

/// A kernel of the gather family: its PTX entry name and shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    pub name: &'static str,
    pub shape: Shape,
    pub about: &'static str,
}

/// The row of a variant, from its kind: `chunk` (a thread a chunk, `unroll` loads in flight),
/// `pipelined` (a thread a chunk, the next id loaded early), `ring` (a thread a chunk through
/// `cp.async`), `span` (a warp a span of chunks), `rows` (a warp per 32 rows) or `custom` (a
/// hand-written body with the shape it is launched with) or `hand_written` (the row only: its
/// entry is written by hand in `kernels`).
macro_rules! gather_row {
    ($name:expr, $about:expr, chunk { unroll: $u:literal, $($rest:tt)* }) => {
        Variant {
            name: $name,
            shape: Shape::ChunkPerThread {
                unroll: $u,
                block_threads: block_of!($($rest)*),
            },
            about: $about,
        }
    };
    ($name:expr, $about:expr, tile { unroll: $u:literal, $($rest:tt)* }) => {
        Variant {
            name: $name,
            shape: Shape::ChunkTile { unroll: $u },
            about: $about,
        }
    };
    ($name:expr, $about:expr, pipelined { $($rest:tt)* }) => {
        Variant {
            name: $name,
            shape: Shape::ChunkPerThread {
                unroll: 1,
                block_threads: BLOCK_THREADS,
            },
            about: $about,
        }
    };
    ($name:expr, $about:expr, ring { $($rest:tt)* }) => {
        Variant {
            name: $name,
            shape: Shape::ChunkPerThread {
                unroll: 1,
                block_threads: BLOCK_THREADS,
            },
            about: $about,
        }
    };
    (
        $name:expr, $about:expr,
        span { unroll: $u:literal, blocks_per_sm: $b:literal, body: $f:ident }
    ) => {
        Variant {
            name: $name,
            shape: Shape::WarpSpan {
                unroll: $u,
                blocks_per_sm: $b,
            },
            about: $about,
        }
    };
    ($name:expr, $about:expr, rows { $($rest:tt)* }) => {
        Variant {
            name: $name,
            shape: Shape::WarpPerRows,
            about: $about,
        }
    };
    ($name:expr, $about:expr, custom { shape: $shape:expr, body: $f:ident }) => {
        Variant {
            name: $name,
            shape: $shape,
            about: $about,
        }
    };
    ($name:expr, $about:expr, hand_written { shape: $shape:expr }) => {
        Variant {
            name: $name,
            shape: $shape,
            about: $about,
        }
    };
}

/// The body of a variant, from the same tokens as its row.
#[cfg(target_arch = "nvptx64")]
macro_rules! gather_body {
    (
        $p:ident,
        chunk { unroll: $u:literal, streaming: $cs:literal, hint: $h:ident $(, block: $b:literal)? }
    ) => {
        super::kernels::chunk_per_thread::<$u, $cs, { crate::device::hint::$h }>(&$p)
    };
    ($p:ident, tile { unroll: $u:literal, hint: $h:ident }) => {
        super::kernels::chunk_tile::<$u, { crate::device::hint::$h }>(&$p)
    };
    ($p:ident, pipelined { ahead: $ahead:literal, hint: $h:ident }) => {
        super::kernels::chunk_pipelined::<$ahead, { crate::device::hint::$h }>(&$p)
    };
    ($p:ident, ring { depth: $d:literal }) => {{
        let ring = crate::smem::shared_buffer::<
            { $d * super::BLOCK_THREADS * crate::params::CHUNK_BYTES },
        >();
        // SAFETY: the host launches BLOCK_THREADS threads a block, for which the ring is sized.
        super::kernels::chunk_ring::<$d>(&$p, ring)
    }};
    ($p:ident, span { unroll: $u:literal, blocks_per_sm: $b:literal, body: $f:ident }) => {
        super::kernels::$f::<$u>(&$p)
    };
    ($p:ident, rows { in_flight: $n:literal }) => {
        super::kernels::warp_batch::<$n>(&$p)
    };
    ($p:ident, custom { shape: $shape:expr, body: $f:ident }) => {
        super::kernels::$f(&$p)
    };
}

/// The arch tier a variant's instructions need, from the same tokens as its row: the L2 bulk
/// prefetch of `ahead` and the bulk copies of `bulk` need sm_90; the rest (16-byte loads,
/// `cp.async`) sm_80.
macro_rules! gather_needs {
    ($then:ident!($($pre:tt)*) pipelined { ahead: true, $($rest:tt)* }) => {
        $then! { $($pre)* sm_90 }
    };
    ($then:ident!($($pre:tt)*) custom { shape: $shape:expr, body: bulk }) => {
        $then! { $($pre)* sm_90 }
    };
    ($then:ident!($($pre:tt)*) $($kind:tt)*) => {
        $then! { $($pre)* sm_80 }
    };
}

variants! {
    params: GatherParams, row: gather_row, body: gather_body, needs: gather_needs;
    /// Per thread: one 16-byte chunk at a time; a warp covers two 256-byte rows.
    gather_chunk16: chunk { unroll: 1, streaming: false, hint: STREAM }
        => "a thread per 16-byte chunk, grid-stride";
    /// Per thread: four chunks loaded before any store, for more bytes in flight per thread.
    gather_chunk16_x4: chunk { unroll: 4, streaming: false, hint: STREAM }
        => "a thread per 16-byte chunk, 4 loads in flight per thread";
    /// Per thread: one chunk at a time, the id of the next chunk requested before this chunk's
    /// row, so the id's latency overlaps the row's instead of adding to it.
    gather_chunk16_pipe: pipelined { ahead: false, hint: STREAM }
        => "a thread per 16-byte chunk, the next chunk's id loaded before this chunk's row";
    /// As `gather_chunk16_pipe`, and the thread that will copy the next row's first chunk asks
    /// L2 for that whole row now (a bulk prefetch costs no registers), doubling the bytes in
    /// flight.
    gather_chunk16_ahead: pipelined { ahead: true, hint: STREAM }
        => "as _pipe, and the next row bulk-prefetched into L2 one step ahead";
    /// Per thread: one chunk, loaded with no cache hints (no L1 bypass, no 256-byte L2 fetch).
    gather_chunk16_nohint: chunk { unroll: 1, streaming: false, hint: PLAIN }
        => "a thread per 16-byte chunk, loads without the L1 and L2 cache hints";
    /// Per thread: two unhinted chunks in flight.
    gather_chunk16_nohint_x2: chunk { unroll: 2, streaming: false, hint: PLAIN }
        => "a thread per 16-byte chunk, 2 unhinted loads in flight per thread";
    /// A warp per 4 KiB of output, 8 loads in flight a lane (launched 1 block an SM).
    gather_span8_b1: span { unroll: 8, blocks_per_sm: 1, body: warp_span }
        => "a warp per 4 KiB of output, 8 unhinted loads in flight a lane, 1 block an SM";
    /// A warp per 4 KiB of output, 8 loads in flight a lane (launched 2 blocks an SM).
    gather_span8_b2: span { unroll: 8, blocks_per_sm: 2, body: warp_span }
        => "a warp per 4 KiB of output, 8 unhinted loads in flight a lane, 2 blocks an SM";
    /// A warp per 2 KiB of output, 4 loads in flight a lane (launched 2 blocks an SM).
    gather_span4_b2: span { unroll: 4, blocks_per_sm: 2, body: warp_span }
        => "a warp per 2 KiB of output, 4 unhinted loads in flight a lane, 2 blocks an SM";
    /// A warp per 2 KiB of output, 4 loads in flight a lane (launched 4 blocks an SM).
    gather_span4_b4: span { unroll: 4, blocks_per_sm: 4, body: warp_span }
        => "a warp per 2 KiB of output, 4 unhinted loads in flight a lane, 4 blocks an SM";
    /// As `gather_span4_b4`, the next span's ids loaded during this span's rows.
    gather_span4_b4_ahead: span { unroll: 4, blocks_per_sm: 4, body: warp_span_ahead }
        => "as gather_span4_b4, the next span's ids loaded while this span's rows load";
    /// As `gather_span8_b2` with the next span's ids loaded ahead, one id load a row, shared over
    /// the warp by shuffles.
    gather_span8_b2_ahead_shfl: span { unroll: 8, blocks_per_sm: 2, body: warp_span_shared_ids }
        => "as gather_span8_b2, next ids loaded ahead, one id load a row shared by shuffles";
    /// Per thread: one chunk through the coherent (L1) path.
    gather_chunk16_coherent: chunk { unroll: 1, streaming: false, hint: COHERENT }
        => "a thread per 16-byte chunk, loads through the coherent path (ld.global)";
    /// Per thread: one chunk, L2 fetching whole 128-byte lines.
    gather_chunk16_l2_128: chunk { unroll: 1, streaming: false, hint: L2_128 }
        => "a thread per 16-byte chunk, loads asking L2 for whole 128-byte lines";
    /// Per thread: one chunk, loaded bypassing L1 only (no 256-byte L2 fetch).
    gather_chunk16_l1bypass: chunk { unroll: 1, streaming: false, hint: L1_BYPASS }
        => "a thread per 16-byte chunk, loads bypassing L1 only (no 256-byte L2 fetch)";
    /// Per thread: one chunk, no cache hints, streaming stores.
    gather_chunk16_nohint_cs: chunk { unroll: 1, streaming: true, hint: PLAIN }
        => "a thread per 16-byte chunk, unhinted loads, streaming stores";
    /// Per thread: one chunk, no cache hints, the next chunk's id loaded early.
    gather_chunk16_nohint_pipe: pipelined { ahead: false, hint: PLAIN }
        => "a thread per 16-byte chunk, unhinted loads, the next chunk's id loaded early";
    /// Per thread: one chunk, stored with evict-first priority (output read once, later).
    gather_chunk16_cs: chunk { unroll: 1, streaming: true, hint: STREAM }
        => "a thread per 16-byte chunk, streaming (evict-first) stores";
    /// Per thread: four unhinted chunks in flight.
    gather_chunk16_nohint_x4: chunk { unroll: 4, streaming: false, hint: PLAIN }
        => "a thread per 16-byte chunk, 4 unhinted loads in flight per thread";
    /// Per thread: a ring of 4 16-byte shared slots, each filled by `cp.async` a grid-stride
    /// step ahead of its store, so 4 chunks are in flight per thread without holding registers.
    gather_cp_async: ring { depth: 4 }
        => "a thread per 16-byte chunk, 4 cp.async copies in flight through shared memory";
    /// As `gather_cp_async`, 8 chunks in flight per thread.
    gather_cp_async_x8: ring { depth: 8 }
        => "a thread per 16-byte chunk, 8 cp.async copies in flight through shared memory";
    /// Per warp (one a block): output tiles of 8 KiB, each filled by one bulk copy per row into
    /// a shared stage and written out by one bulk store, 4 stages deep; the bulk copy engine
    /// holds the bytes in flight, not registers.
    gather_bulk: custom {
        shape: Shape::TilePerBlock { block_threads: 32, tile_bytes: BULK_TILE_BYTES },
        body: bulk
    } => "a warp per 8 KiB output tile: bulk row copies into shared memory, one bulk store";
    /// Per warp: 32 rows, 4 chunks in flight per lane.
    gather_warp_batch_x4: rows { in_flight: 4 }
        => "a warp per 32 rows: ids in one load, 4 chunks in flight per lane";
    /// Per warp: 32 rows, 8 chunks in flight per lane.
    gather_warp_batch_x8: rows { in_flight: 8 }
        => "a warp per 32 rows: ids in one load, 8 chunks in flight per lane";
    /// Per thread: one unhinted chunk, blocks of 64 threads (a small call over more SMs).
    gather_chunk16_nohint_b64: chunk { unroll: 1, streaming: false, hint: PLAIN, block: 64 }
        => "a thread per 16-byte chunk, unhinted loads, blocks of 64 threads";
    /// Per block: 2 chunks a thread of one contiguous stretch of output, coherent loads.
    gather_tile_x2: tile { unroll: 2, hint: COHERENT }
        => "a block per 2 x 256 consecutive chunks, ids then rows loaded, coherent loads";
    /// Per block: 4 chunks a thread of one contiguous stretch of output, coherent loads.
    gather_tile_x4: tile { unroll: 4, hint: COHERENT }
        => "a block per 4 x 256 consecutive chunks, ids then rows loaded, coherent loads";
    /// As `gather_tile_x4`, reads through the non-coherent path.
    gather_tile_x4_nc: tile { unroll: 4, hint: PLAIN }
        => "as gather_tile_x4, reads through the non-coherent path";
    /// Per block: 8 chunks a thread of one contiguous stretch of output, coherent loads.
    gather_tile_x8: tile { unroll: 8, hint: COHERENT }
        => "a block per 8 x 256 consecutive chunks, ids then rows loaded, coherent loads";
    // Its entry is in `kernels`: called through a body function, its PTX's registers and blocks
    // came out in another order.
    gather_warp_row: hand_written { shape: Shape::WarpPerRow }
        => "a warp per row, lanes over 16-byte chunks";
    /// Per thread: 8 bytes of one row, one pass over the call, predicated loads (decode sizes).
    gather_words8_pass: custom { shape: Shape::WordsOnePass { word_bytes: 8 }, body: words8_pass }
        => "a thread per 8 bytes, one pass, 32-bit indices, predicated loads";
    /// Per thread: 16 bytes of one row, one pass over the call, predicated loads.
    gather_words16_pass: custom { shape: Shape::WordsOnePass { word_bytes: 16 }, body: words16_pass }
        => "a thread per 16 bytes, one pass, 32-bit indices, predicated loads";
    /// Per warp: 2 rows, 8 bytes of each a lane, the ids in one load (decode sizes).
    gather_rows2_w2: custom { shape: Shape::RowsTile { rows: 2, warps: 2 }, body: rows2_tile }
        => "a warp per 2 rows, 8 bytes of each a lane, the warp's ids in one load, blocks of 64";
    /// Per warp: 2 rows, 8 bytes of each a lane, the ids in one load, a warp a block.
    gather_rows2_w1: custom { shape: Shape::RowsTile { rows: 2, warps: 1 }, body: rows2_tile_w1 }
        => "a warp per 2 rows, 8 bytes of each a lane, the warp's ids in one load, blocks of 32";
    /// Per thread: one unhinted chunk, blocks of 128 threads.
    gather_chunk16_nohint_b128: chunk { unroll: 1, streaming: false, hint: PLAIN, block: 128 }
        => "a thread per 16-byte chunk, unhinted loads, blocks of 128 threads";
}

/// Output bytes per tile of `gather_bulk`: 32 rows of 256 bytes.
pub const BULK_TILE_BYTES: u32 = 8192;

// The decode-size variants built for 256-byte rows (the product's): their split of a thread's
// index into row and word folds to a shift and a mask.
width_builds! {
    params: GatherParams, width: 256;
    gather_words8_pass: sm_80 => kernels::words_pass::<8, 256>;
    gather_words16_pass: sm_80 => kernels::words_pass::<16, 256>;
}

variant_handle!(GatherVariant, "gather");

/// A kernel that takes [`GatherParams`](crate::params::GatherParams) and does nothing: the launch
/// cost every small gather is measured against.
pub const EMPTY_KERNEL: &str = "gather_empty";

#[cfg(target_arch = "nvptx64")]
mod kernels {
    use core::num::NonZeroU32;

    use super::{BLOCK_THREADS, BULK_TILE_BYTES};
    use crate::device::{
        block, blocks, global_thread, grid_threads, hint, load_8_if, load_16_if, load_hinted_16,
        load_i64, load_i64_early, load_i64_hinted, load_i64_if, load_stream_16, prefetch_l2,
        record_bad_id, shuffle_i64, store_8_if, store_16, store_16_if, store_16_streaming,
        thread_in_block, warp_sync,
    };
    use crate::params::{CHUNK_BYTES, GatherParams};
    use crate::smem::{
        bulk_commit, bulk_load, bulk_store, bulk_wait, bulk_wait_read, commit_async, copy_async_16,
        fence_mbarrier_init, fence_proxy_async, load_shared_16, mbarrier_arrive,
        mbarrier_expect_tx, mbarrier_init, mbarrier_wait, shared_buffer, store_shared_16,
        wait_async, wait_async_oldest,
    };
    use crate::warp_rows::WarpRows;

    /// [`Shape::WordsOnePass`](super::Shape::WordsOnePass) of `W`-byte words (8 or 16): thread
    /// `t` copies word `t % (row_bytes / W)` of output row `t / (row_bytes / W)`; the host
    /// launches exactly `n * row_bytes / W` threads, rounded up to whole blocks, below 2^32.
    /// A bad id's row is written as zeros and recorded by its first word's thread. `ROW`: the
    /// row width as a constant (a width build's, the call's `row_bytes`), 0 to read it from
    /// `p`. Blocks are [`BLOCK_THREADS`] threads (the shape's), a constant too: nothing before
    /// the id's load reads a special register but the thread's and block's index.
    #[inline(always)]
    pub(super) unsafe fn words_pass<const W: u32, const ROW: u32>(p: &GatherParams) {
        let row_bytes = if ROW == 0 { p.row_bytes } else { ROW };
        let words = NonZeroU32::new(row_bytes / W).unwrap_or(NonZeroU32::MIN);
        let t = block() * BLOCK_THREADS + thread_in_block();
        let (i, w) = split(t as u64, words.get());
        let offset = (w * W) as u64;
        let live = i < p.n;
        // SAFETY: read only when `live`: i < n, inside the ids array.
        let id = unsafe { load_i64_if(p.ids + 8 * i, live) };
        let found = live && (id as u64) < p.rows;
        let src = p.table + (id as u64).wrapping_mul(row_bytes as u64) + offset;
        let dest = p.out + i * row_bytes as u64 + offset;
        if W == 8 {
            // SAFETY: read only when `found`: word w of row id < rows, 8-byte aligned; written
            // only when `live`: word w of output row i < n, by this thread alone.
            unsafe { store_8_if(dest, load_8_if(src, found), live) };
        } else {
            // SAFETY: as above, 16-byte aligned.
            unsafe { store_16_if(dest, load_16_if(src, found), live) };
        }
        if live && !found && w == 0 {
            // SAFETY: the host passes the address of a live IdStatus.
            unsafe { record_bad_id(p.status, i) };
        }
    }

    /// [`Shape::RowsTile`](super::Shape::RowsTile) ([`WarpRows`]): each lane copies 8-byte
    /// word `w` of each of its warp's `ROWS` rows, `w = lane` (and `lane + 32 j` for rows wider
    /// than 256 bytes), every row's word loaded under a predicate before any is stored; a bad
    /// id's row is written as zeros and recorded by lane 0. The host launches whole blocks of
    /// `32 WARPS` threads over `n` rows, `ROWS` a warp.
    #[inline(always)]
    unsafe fn rows_tile<const ROWS: usize, const WARPS: u32>(p: &GatherParams) {
        // SAFETY: the host passes n ids at p.ids.
        let tile = unsafe { WarpRows::<ROWS>::load::<WARPS>(p.ids, p.n, p.rows) };
        let words = p.row_bytes / 8;
        let row_bytes = p.row_bytes as u64;
        tile.each_part(words, |w| {
            let word = w < words;
            let offset = 8 * w as u64;
            let mut v = [[0u32; 2]; ROWS];
            for (k, v) in v.iter_mut().enumerate() {
                let src = p.table + (tile.ids[k] as u64).wrapping_mul(row_bytes) + offset;
                // SAFETY: read only when word w of row ids[k] < rows exists: 8 bytes inside
                // the table, 8-byte aligned (rows are whole 16-byte chunks).
                *v = unsafe { load_8_if(src, word & tile.found(k)) };
            }
            for (k, v) in v.iter().enumerate() {
                let i = tile.first + k as u64;
                // SAFETY: written only when row i < n and word w exists: word w of output row
                // i, by this thread alone.
                unsafe { store_8_if(p.out + i * row_bytes + offset, *v, word & tile.live(k)) };
            }
        });
        // SAFETY: the host passes the address of a live IdStatus.
        unsafe { tile.record_bad_ids(p.status) };
    }

    #[inline(always)]
    pub(super) unsafe fn rows2_tile(p: &GatherParams) {
        // SAFETY: the caller's launch of this shape.
        unsafe { rows_tile::<2, 2>(p) }
    }

    #[inline(always)]
    pub(super) unsafe fn rows2_tile_w1(p: &GatherParams) {
        // SAFETY: the caller's launch of this shape.
        unsafe { rows_tile::<2, 1>(p) }
    }

    #[inline(always)]
    pub(super) unsafe fn words8_pass(p: &GatherParams) {
        // SAFETY: the caller's launch of this shape.
        unsafe { words_pass::<8, 0>(p) }
    }

    #[inline(always)]
    pub(super) unsafe fn words16_pass(p: &GatherParams) {
        // SAFETY: the caller's launch of this shape.
        unsafe { words_pass::<16, 0>(p) }
    }

    /// The source address of output row `i`'s chunk `c`, or `None` (after recording it) when the
    /// row's id is outside the table.
    #[inline(always)]
    unsafe fn source(p: &GatherParams, i: u64, c: u32) -> Option<u64> {
        // SAFETY: i < n, so ids + 8 i lies in the ids array.
        let id = unsafe { load_i64(p.ids + 8 * i) };
        // SAFETY: the caller's `p`, passed on.
        unsafe { source_of(p, id, i, c) }
    }

    /// As [`source`], for output row `i` whose id `id` is already loaded.
    #[inline(always)]
    unsafe fn source_of(p: &GatherParams, id: i64, i: u64, c: u32) -> Option<u64> {
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

    /// 16-byte chunks per row: at least 1 (the host refuses narrower rows), as a type whose
    /// divisions need no zero check.
    #[inline(always)]
    fn row_chunks(p: &GatherParams) -> NonZeroU32 {
        NonZeroU32::new(p.row_bytes / CHUNK_BYTES).unwrap_or(NonZeroU32::MIN)
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
    pub(super) unsafe fn chunk_per_thread<
        const UNROLL: usize,
        const STREAMING: bool,
        const HINT: u8,
    >(
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

    /// [`Shape::ChunkTile`](super::Shape::ChunkTile): block `b` takes tiles `b, b + blocks, ...`
    /// of `UNROLL * BLOCK_THREADS` chunks (one pass when the grid covers the call).
    #[inline(always)]
    pub(super) unsafe fn chunk_tile<const UNROLL: usize, const HINT: u8>(p: &GatherParams) {
        // Two copies, so that rows of a power-of-two number of chunks split by shift and mask
        // and no division sits on the path to the first load.
        // SAFETY: the caller's `p`, passed on.
        unsafe {
            if row_chunks(p).get().is_power_of_two() {
                chunk_tile_body::<UNROLL, HINT, true>(p)
            } else {
                chunk_tile_body::<UNROLL, HINT, false>(p)
            }
        }
    }

    /// [`chunk_tile`] for rows whose number of chunks is (`POW2`) or is not a power of two.
    #[inline(always)]
    unsafe fn chunk_tile_body<const UNROLL: usize, const HINT: u8, const POW2: bool>(
        p: &GatherParams,
    ) {
        let chunks = row_chunks(p).get();
        let split = |t: u64, chunks: u32| {
            if POW2 {
                let t = t as u32;
                ((t >> chunks.trailing_zeros()) as u64, t & (chunks - 1))
            } else {
                split(t, chunks)
            }
        };
        let total = p.n * chunks as u64;
        let tile_chunks = (UNROLL as u32 * BLOCK_THREADS) as u64;
        let mut tile = block() as u64;
        while tile * tile_chunks < total {
            let first = tile * tile_chunks + thread_in_block() as u64;
            // Every id loaded unconditionally (a chunk past the end reads the last one's, and
            // is never used): no branch holds the first load back.
            let mut ids = [-1i64; UNROLL];
            for (j, id) in ids.iter_mut().enumerate() {
                let t = (first + (j as u32 * BLOCK_THREADS) as u64).min(total - 1);
                // SAFETY: t < total, so its row is below n and inside the ids array.
                *id = unsafe { load_i64_hinted::<HINT>(p.ids + 8 * split(t, chunks).0) };
            }
            let mut data = [[0u32; 4]; UNROLL];
            for j in 0..UNROLL {
                let t = first + (j as u32 * BLOCK_THREADS) as u64;
                if t < total {
                    let (i, c) = split(t, chunks);
                    // SAFETY: `source_of` returns only addresses of rows inside the table.
                    if let Some(src) = unsafe { source_of(p, ids[j], i, c) } {
                        data[j] = unsafe { load_hinted_16::<HINT>(src) };
                    }
                }
            }
            for (j, chunk) in data.iter().enumerate() {
                let t = first + (j as u32 * BLOCK_THREADS) as u64;
                if t < total {
                    let (i, c) = split(t, chunks);
                    let dest = p.out + i * p.row_bytes as u64 + (c * CHUNK_BYTES) as u64;
                    // SAFETY: dest is chunk c of output row i < n, owned by this thread.
                    unsafe { store_16(dest, *chunk) };
                }
            }
            tile += blocks() as u64;
        }
    }

    /// A warp per `32 * UNROLL` consecutive chunks: lane `l` loads the ids of chunks
    /// `l, l + 32, ...` of the span, then all their rows' chunks, then stores them (unhinted
    /// loads), so that no row load waits behind another chunk's id.
    #[inline(always)]
    pub(super) unsafe fn warp_span<const UNROLL: usize>(p: &GatherParams) {
        // At least 1 (the host refuses narrower rows), so the divisions below cannot trap.
        let chunks = (p.row_bytes / CHUNK_BYTES).max(1);
        let total = p.n * chunks as u64;
        let lane = global_thread() % 32;
        let span = 32 * UNROLL as u64;
        let stride = grid_threads() / 32 * span;
        let mut base = global_thread() / 32 * span;
        while base < total {
            let mut at = [(u64::MAX, 0u32); UNROLL];
            let mut ids = [-1i64; UNROLL];
            for j in 0..UNROLL {
                let t = base + j as u64 * 32 + lane;
                if t < total {
                    let (i, c) = split(t, chunks);
                    at[j] = (i, c);
                    // SAFETY: i < n, so ids + 8 i lies in the ids array.
                    ids[j] = unsafe { load_i64(p.ids + 8 * i) };
                }
            }
            let mut data = [[0u32; 4]; UNROLL];
            for j in 0..UNROLL {
                let (i, c) = at[j];
                if i == u64::MAX {
                    continue;
                }
                // SAFETY: `source_of` returns only addresses of rows inside the table.
                if let Some(src) = unsafe { source_of(p, ids[j], i, c) } {
                    data[j] = unsafe { load_hinted_16::<{ hint::PLAIN }>(src) };
                }
            }
            for j in 0..UNROLL {
                let (i, c) = at[j];
                if i != u64::MAX {
                    let dest = p.out + i * p.row_bytes as u64 + (c * CHUNK_BYTES) as u64;
                    // SAFETY: dest is chunk c of output row i < n, owned by this thread.
                    unsafe { store_16(dest, data[j]) };
                }
            }
            base += stride;
        }
    }

    /// As [`warp_span`], software-pipelined: the ids of the warp's next span (a grid stride on)
    /// are requested before this span's rows, so they load while the rows do, and after the
    /// first span no row load waits on an id.
    #[inline(always)]
    pub(super) unsafe fn warp_span_ahead<const UNROLL: usize>(p: &GatherParams) {
        // At least 1 (the host refuses narrower rows), so the divisions below cannot trap.
        let chunks = (p.row_bytes / CHUNK_BYTES).max(1);
        let total = p.n * chunks as u64;
        let lane = global_thread() % 32;
        let span = 32 * UNROLL as u64;
        let stride = grid_threads() / 32 * span;
        // This lane's chunks of the span at `base` as (row, chunk in row), row u32::MAX past the
        // end (rows are below n < 2^32), and their rows' ids, the id loads issued where they
        // stand rather than at their use.
        let span_chunks = |base: u64| {
            let mut at = [(u32::MAX, 0u32); UNROLL];
            let mut ids = [-1i64; UNROLL];
            for j in 0..UNROLL {
                let t = base + j as u64 * 32 + lane;
                if t < total {
                    let (i, c) = split(t, chunks);
                    at[j] = (i as u32, c);
                    // SAFETY: i < n, so ids + 8 i lies in the ids array.
                    ids[j] = unsafe { load_i64_early(p.ids + 8 * i) };
                }
            }
            (at, ids)
        };
        let mut base = global_thread() / 32 * span;
        let (mut at, mut ids) = span_chunks(base);
        while base < total {
            let next = base + stride;
            let (next_at, next_ids) = span_chunks(next);
            let mut data = [[0u32; 4]; UNROLL];
            for j in 0..UNROLL {
                let (i, c) = at[j];
                if i == u32::MAX {
                    continue;
                }
                // SAFETY: `source_of` returns only addresses of rows inside the table.
                if let Some(src) = unsafe { source_of(p, ids[j], i as u64, c) } {
                    data[j] = unsafe { load_hinted_16::<{ hint::PLAIN }>(src) };
                }
            }
            for j in 0..UNROLL {
                let (i, c) = at[j];
                if i != u32::MAX {
                    let dest = p.out + i as u64 * p.row_bytes as u64 + (c * CHUNK_BYTES) as u64;
                    // SAFETY: dest is chunk c of output row i < n, owned by this thread.
                    unsafe { store_16(dest, data[j]) };
                }
            }
            (at, ids) = (next_at, next_ids);
            base = next;
        }
    }

    /// As [`warp_span_ahead`], each id loaded once: lane `l` loads the id of the `l`-th row the
    /// warp's next span touches (a span ahead, as there), and each chunk takes its row's id from
    /// that lane by shuffle. A 256-byte row's 16 lanes then share one id load instead of issuing
    /// 16; a span over more than 32 rows (rows narrower than `UNROLL` chunks) loads the ids past
    /// its 32nd row directly, at their use.
    #[inline(always)]
    pub(super) unsafe fn warp_span_shared_ids<const UNROLL: usize>(p: &GatherParams) {
        // At least 1 (the host refuses narrower rows), so the divisions below cannot trap.
        let chunks = (p.row_bytes / CHUNK_BYTES).max(1);
        let total = p.n * chunks as u64;
        let lane = global_thread() % 32;
        let span = 32 * UNROLL as u64;
        let stride = grid_threads() / 32 * span;
        // The id of the `lane`-th row the span at `base` touches (-1 if it touches fewer),
        // issued where it stands rather than at its use.
        let span_row_id = |base: u64| {
            let row = split(base, chunks).0 + lane;
            if base < total && row < p.n && row * (chunks as u64) < base + span {
                // SAFETY: row < n: inside the ids array.
                unsafe { load_i64_early(p.ids + 8 * row) }
            } else {
                -1
            }
        };
        let mut base = global_thread() / 32 * span;
        let mut id = span_row_id(base);
        while base < total {
            let next = base + stride;
            let next_id = span_row_id(next);
            let first = split(base, chunks).0;
            let mut data = [[0u32; 4]; UNROLL];
            let mut dest = [u64::MAX; UNROLL];
            for j in 0..UNROLL {
                let t = base + j as u64 * 32 + lane;
                let (i, c) = split(t, chunks);
                let k = i.wrapping_sub(first);
                // Every lane shuffles (the loop is the same for the whole warp), before any
                // branches on its own chunk.
                let shared = shuffle_i64(id, k as u32 & 31);
                if t < total {
                    dest[j] = p.out + i * p.row_bytes as u64 + (c * CHUNK_BYTES) as u64;
                    let row_id = if k < 32 {
                        shared
                    } else {
                        // SAFETY: i < n, so ids + 8 i lies in the ids array.
                        unsafe { load_i64(p.ids + 8 * i) }
                    };
                    // SAFETY: `source_of` returns only addresses of rows inside the table.
                    if let Some(src) = unsafe { source_of(p, row_id, i, c) } {
                        data[j] = unsafe { load_hinted_16::<{ hint::PLAIN }>(src) };
                    }
                }
            }
            for j in 0..UNROLL {
                if dest[j] != u64::MAX {
                    // SAFETY: dest is chunk c of output row i < n, owned by this thread.
                    unsafe { store_16(dest[j], data[j]) };
                }
            }
            id = next_id;
            base = next;
        }
    }

    #[inline(always)]
    pub(super) unsafe fn chunk_pipelined<const AHEAD: bool, const HINT: u8>(p: &GatherParams) {
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

    /// One chunk per grid-stride step, as `chunk_per_thread`, through a ring of `DEPTH` shared
    /// slots: step `k + DEPTH`'s copy starts as soon as step `k` is stored. The slots of one
    /// depth lie side by side (thread `t` at `16 t`), so the block's accesses hit every bank once.
    /// Each thread reads back only what it copied itself, so no barrier is needed; ids load one
    /// step before their copy starts.
    ///
    /// # Safety
    /// `ring` is a shared buffer of `DEPTH * BLOCK_THREADS * 16` bytes and the block has at most
    /// BLOCK_THREADS threads.
    #[inline(always)]
    pub(super) unsafe fn chunk_ring<const DEPTH: u32>(p: &GatherParams, ring: u32) {
        let chunks = (p.row_bytes / CHUNK_BYTES).max(1);
        let total = p.n * chunks as u64;
        let stride = grid_threads();
        let mine = ring + thread_in_block() * CHUNK_BYTES;
        let slot_addr = |slot: u32| mine + slot * BLOCK_THREADS * CHUNK_BYTES;
        let id_of = |t: u64| {
            // SAFETY: t < total, so its row is below n and inside the ids array.
            if t < total {
                unsafe { load_i64_early(p.ids + 8 * split(t, chunks).0) }
            } else {
                -1
            }
        };
        // Starts step t's copy into `slot`, or zeroes the slot for a bad id; past the end, nothing.
        let fill = |t: u64, id: i64, slot: u32| {
            if t >= total {
                return;
            }
            let (i, c) = split(t, chunks);
            if id >= 0 && (id as u64) < p.rows {
                let src = p.table + id as u64 * p.row_bytes as u64 + (c * CHUNK_BYTES) as u64;
                // SAFETY: id < rows and c < chunks: inside row `id`; the slot is this thread's
                // and was read back (or never used) before this refill.
                unsafe { copy_async_16(slot_addr(slot), src) };
            } else {
                // SAFETY: this thread's slot, as above.
                unsafe { store_shared_16(slot_addr(slot), [0; 4]) };
                if c == 0 {
                    // SAFETY: the host passes the address of a live IdStatus.
                    unsafe { record_bad_id(p.status, i) };
                }
            }
        };
        let mut t = global_thread();
        for slot in 0..DEPTH {
            let step = t + slot as u64 * stride;
            fill(step, id_of(step), slot);
            commit_async();
        }
        let mut ahead = id_of(t + DEPTH as u64 * stride);
        let mut slot = 0;
        while t < total {
            // The oldest group, this step's copy, has landed.
            wait_async_oldest::<DEPTH>();
            // SAFETY: this thread's slot, filled for step t (copied or zeroed).
            let data = unsafe { load_shared_16(slot_addr(slot)) };
            let (i, c) = split(t, chunks);
            // SAFETY: chunk c of output row i < n, owned by this thread.
            unsafe {
                store_16(
                    p.out + i * p.row_bytes as u64 + (c * CHUNK_BYTES) as u64,
                    data,
                )
            };
            let refill = t + DEPTH as u64 * stride;
            let next_ahead = id_of(refill + stride);
            fill(refill, ahead, slot);
            commit_async();
            ahead = next_ahead;
            slot = if slot + 1 == DEPTH { 0 } else { slot + 1 };
            t += stride;
        }
        wait_async::<0>();
    }

    /// Tiles in flight per block of `gather_bulk`: one is stored while the others load.
    const BULK_STAGES: u32 = 4;

    /// `gather_bulk`'s body: 4 stages of 8 KiB tiles in one shared buffer.
    #[inline(always)]
    pub(super) unsafe fn bulk(p: &GatherParams) {
        let smem = shared_buffer::<{ BULK_STAGES * BULK_TILE_BYTES + 8 * BULK_STAGES }>();
        // SAFETY: the buffer holds the stages and, after them, one mbarrier per stage; the
        // host launches one warp a block (Shape::TilePerBlock).
        unsafe { bulk_tiles::<BULK_TILE_BYTES, BULK_STAGES>(p, smem) }
    }

    /// The pipeline of `gather_bulk`. The block's `k`-th tile is tile `block + k * blocks` of
    /// the output, staged in `k % STAGES`; that stage's mbarrier completes one phase per tile
    /// (32 arrivals, one a lane, plus the bytes its copies bring), so the `k`-th tile's phase
    /// has parity `(k / STAGES) % 2`. Lane 0 issues every bulk store, so its group count says
    /// when a stage may be refilled: tile `k - 1 + STAGES` goes into the stage of tile `k - 1`
    /// once that tile's store has read it, while tile `k`'s store runs.
    ///
    /// # Safety
    /// `smem` is a shared buffer of `STAGES * TILE` bytes followed by `8 * STAGES` bytes, and the
    /// block is one warp.
    #[inline(always)]
    unsafe fn bulk_tiles<const TILE: u32, const STAGES: u32>(p: &GatherParams, smem: u32) {
        // A refill goes into the stage before the awaited one, so there must be two.
        const { assert!(STAGES >= 2 && TILE.is_multiple_of(CHUNK_BYTES)) };
        let lane = thread_in_block();
        let bars = smem + STAGES * TILE;
        let chunks = row_chunks(p);
        let total = p.n * chunks.get() as u64;
        let tiles = total.div_ceil((TILE / CHUNK_BYTES) as u64);
        let (first, step) = (block() as u64, (blocks() as u64).max(1));
        if first >= tiles {
            return;
        }
        let mine = (tiles - first).div_ceil(step);
        if lane == 0 {
            for s in 0..STAGES {
                // SAFETY: the barrier words lie after the stages, 8-byte aligned, used by
                // nothing else; the warp syncs below before any use.
                unsafe { mbarrier_init(bars + 8 * s, 32) };
            }
            fence_mbarrier_init();
        }
        warp_sync();
        let stage = |k: u64| (k % STAGES as u64) as u32;
        // The id of this lane's first row in the block's k-th tile (-1 if it has none), issued
        // where it stands so that it loads while the warp waits.
        let first_id = |k: u64| {
            // The tile starts below total < 2^32.
            let start = ((first + k * step) * (TILE / CHUNK_BYTES) as u64) as u32;
            let row = (start / chunks + lane) as u64;
            // SAFETY: row < n: inside the ids array.
            if row < p.n {
                unsafe { load_i64_early(p.ids + 8 * row) }
            } else {
                -1
            }
        };
        let fill = |k: u64, id: i64| {
            let s = stage(k);
            // SAFETY: tile `first + k * step` exists (k < mine); stage s is free: never used,
            // or its last tile was awaited and its store has read it.
            unsafe {
                fill_tile::<TILE>(
                    p,
                    smem + s * TILE,
                    bars + 8 * s,
                    first + k * step,
                    total,
                    id,
                )
            }
        };
        for k in 0..STAGES as u64 {
            if k < mine {
                fill(k, first_id(k));
            }
        }
        for k in 0..mine {
            let s = stage(k);
            let refill = k >= 1 && k - 1 + (STAGES as u64) < mine;
            let ahead = if refill {
                first_id(k - 1 + STAGES as u64)
            } else {
                -1
            };
            // SAFETY: tile k was filled into stage s (above, or when tile k - STAGES was stored),
            // and each of its lanes arrives once, so the phase completes.
            unsafe { mbarrier_wait(bars + 8 * s, ((k / STAGES as u64) % 2) as u32) };
            if lane == 0 {
                let start = (first + k * step) * (TILE / CHUNK_BYTES) as u64;
                let end = (start + (TILE / CHUNK_BYTES) as u64).min(total);
                fence_proxy_async();
                // SAFETY: output chunks start..end lie in the output, written by this store
                // alone; the stage holds them (the phase completed) and is not rewritten before
                // the wait below.
                unsafe {
                    bulk_store(
                        p.out + start * CHUNK_BYTES as u64,
                        smem + s * TILE,
                        ((end - start) * CHUNK_BYTES as u64) as u32,
                    )
                };
                bulk_commit();
            }
            if refill {
                if lane == 0 {
                    // Every store but tile k's has read its stage, tile k - 1's among them.
                    bulk_wait_read::<1>();
                }
                warp_sync();
                fill(k - 1 + STAGES as u64, ahead);
            }
        }
        if lane == 0 {
            // The stores read shared memory, which must outlive them.
            bulk_wait::<0>();
        }
    }

    /// One lane's share of filling tile `tile` (output chunks `tile * TILE / 16` on, at most
    /// `TILE / 16`, below `total`) into the shared `stage`: the lanes take the rows the tile
    /// touches in turn; each copies its part of a row with one bulk copy (first raising the
    /// barrier's expected bytes by its size), or zeroes it for an id outside the table (recorded
    /// once, by the part holding the row's first chunk); then the lane arrives on `bar`.
    /// `first_id` is the id of the lane's first row, loaded by the caller ahead of time.
    ///
    /// # Safety
    /// `stage` holds TILE bytes of shared memory nothing reads or writes until `bar`'s current
    /// phase completes; `bar` expects one arrival from each of the 32 lanes, all calling this;
    /// `tile` starts below `total`, and `total = n * row_bytes / 16 < 2^32`.
    #[inline(always)]
    unsafe fn fill_tile<const TILE: u32>(
        p: &GatherParams,
        stage: u32,
        bar: u32,
        tile: u64,
        total: u64,
        first_id: i64,
    ) {
        let chunks = row_chunks(p);
        let start = (tile * (TILE / CHUNK_BYTES) as u64) as u32;
        let end = (start as u64 + (TILE / CHUNK_BYTES) as u64).min(total) as u32;
        let last_row = (end - 1) / chunks;
        let mut row = start / chunks + thread_in_block();
        let mut id = first_id;
        let mut zeroed = false;
        while row <= last_row {
            let row_start = row * chunks.get();
            let (a, b) = (row_start.max(start), (row_start + chunks.get()).min(end));
            let dst = stage + (a - start) * CHUNK_BYTES;
            let bytes = (b - a) * CHUNK_BYTES;
            if id >= 0 && (id as u64) < p.rows {
                let src = p.table
                    + id as u64 * p.row_bytes as u64
                    + ((a - row_start) * CHUNK_BYTES) as u64;
                // SAFETY: chunks a..b of row `id` lie in the table and go to their place in the
                // stage; the expected bytes rise before the copy can complete them, and before
                // this lane arrives.
                unsafe {
                    mbarrier_expect_tx(bar, bytes);
                    bulk_load(dst, src, bytes, bar);
                }
            } else {
                let mut at = dst;
                while at < dst + bytes {
                    // SAFETY: inside this lane's part of the stage.
                    unsafe { store_shared_16(at, [0; 4]) };
                    at += CHUNK_BYTES;
                }
                zeroed = true;
                if a == row_start {
                    // SAFETY: the host passes the address of a live IdStatus.
                    unsafe { record_bad_id(p.status, row as u64) };
                }
            }
            row += 32;
            if row <= last_row {
                // SAFETY: row <= last_row < n: inside the ids array.
                id = unsafe { load_i64(p.ids + 8 * row as u64) };
            }
        }
        if zeroed {
            // The zeros are read by the bulk store, through the async proxy.
            fence_proxy_async();
        }
        // SAFETY: the phase expects this lane's one arrival.
        unsafe { mbarrier_arrive(bar) };
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
    pub(super) unsafe fn warp_batch<const IN_FLIGHT: usize>(p: &GatherParams) {
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
    /// Declared in [`VARIANTS`](super::VARIANTS) as `hand_written`.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gather_warp_row(p: GatherParams) {
        // SAFETY: the host validated `p` (launch_gather).
        unsafe { warp_row(&p) }
    }

    /// As `gather_warp_row`, recording its blocks on the device timeline (`TIMED`'s name).
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gather_warp_row_timed(p: GatherParams) {
        // SAFETY: the host validated `p` (launch_gather).
        timed!(p, unsafe { warp_row(&p) })
    }

    #[inline(always)]
    unsafe fn warp_row(p: &GatherParams) {
        let p = *p;
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
