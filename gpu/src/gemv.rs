//! Weight-bound bf16 GEMV for decode (M <= 16): `y[m, n] = sum_k x[m, k] * w[n, k]`, f32 out.
//!
//! One warp owns 16 weight rows and a split of K, and multiplies with `mma.m16n8k16` (bf16 in,
//! f32 accumulate): the weights are the 16x16 A tile, the activations the 16x8 B tile. K is
//! permuted inside each 32-element step so that every lane reads its A and B fragments as single
//! 16-byte loads: lane (g, t) loads weight rows g and g + 8 at elements 8t..8t+8 and activation
//! row g (or 8 + g) at the same elements (cached: every warp re-reads x). Four steps are loaded
//! before any is multiplied, for eight 16-byte weight loads in flight per lane. Splits of K write
//! f32 partials; the last warp of a row group to finish sums them in split order (so the result
//! is deterministic) in the same launch, loading [`REDUCE_BATCH`] splits' partials at a time.
//!
//! The `_cluster` variants keep the split-K sum on chip: a row group is one thread-block cluster
//! of 1-8 blocks of [`CLUSTER_BLOCK_WARPS`] warps, each warp a split; the warps' partials meet in
//! their block's shared memory, the blocks' sums in the first block's (distributed shared
//! memory), always added in split order. No partials, counters or atomics in global memory: after
//! its weight loads a warp's only round trips are on chip.

/// Activation rows handled per 8-row MMA tile.
pub const M_TILE: u32 = 8;
/// Steps of [`GEMV_K_STEP`](crate::params::GEMV_K_STEP) loaded before any is multiplied.
pub const UNROLL: u32 = 4;
/// The `_deep` variants' steps loaded before any is multiplied (16 weight loads per lane).
pub const DEEP_UNROLL: u32 = 8;
/// Threads per GEMV block (4 warps).
pub const BLOCK_THREADS: u32 = 128;
/// Split partials the reducing lane loads before it adds any (one memory round trip each batch).
pub const REDUCE_BATCH: usize = 16;
/// Warps per block of the [`Reduce::Cluster`] variants (one K split each).
pub const CLUSTER_BLOCK_WARPS: u32 = 8;
/// The most blocks a [`Reduce::Cluster`] row group spreads over (the portable cluster size).
pub const MAX_CLUSTER_BLOCKS: u32 = 8;

/// How a variant sums the K splits of a row group (16 weight rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    /// Each split is a warp anywhere in the grid, blocks of [`BLOCK_THREADS`]: the splits write
    /// partials to global memory and the last to arrive (an atomic count) sums them. Any number
    /// of splits that divides K's 32-element steps.
    Global,
    /// A row group is one cluster of `splits / CLUSTER_BLOCK_WARPS` blocks (a power of two up to
    /// [`MAX_CLUSTER_BLOCKS`]) of [`CLUSTER_BLOCK_WARPS`] warps; any K that is a multiple of 32
    /// (the splits' steps may differ by one, or be none).
    Cluster,
}

impl Reduce {
    /// Threads per block of a launch.
    pub const fn block_threads(self) -> u32 {
        match self {
            Reduce::Global => BLOCK_THREADS,
            Reduce::Cluster => CLUSTER_BLOCK_WARPS * 32,
        }
    }

    /// Whether a launch of `splits` K splits is valid for `k`.
    pub const fn accepts(self, splits: u32, k: u32) -> bool {
        let steps = k / crate::params::GEMV_K_STEP;
        if k == 0 || !k.is_multiple_of(crate::params::GEMV_K_STEP) || splits == 0 {
            return false;
        }
        match self {
            Reduce::Global => steps.is_multiple_of(splits),
            Reduce::Cluster => {
                let blocks = splits / CLUSTER_BLOCK_WARPS;
                splits.is_multiple_of(CLUSTER_BLOCK_WARPS)
                    && blocks.is_power_of_two()
                    && blocks <= MAX_CLUSTER_BLOCKS
            }
        }
    }
}

/// How a GEMV variant reads its weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightLoads {
    /// `ld.global.nc.v4`, no cache hints.
    Plain,
    /// `ld.global.nc.L1::no_allocate.L2::256B.v4`: not kept in L1, 256-byte L2 fetches.
    Stream,
    /// `ld.global.nc.L2::256B.v4`: 256-byte L2 fetches (a lane group's four steps of one row).
    Fetch256,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    pub name: &'static str,
    /// The most activation rows the variant handles.
    pub max_m: u32,
    pub loads: WeightLoads,
    pub reduce: Reduce,
    pub about: &'static str,
}

/// The weight loads of the variants the host launches (the first whose `max_m` covers M): on the
/// H200 (2026-11-29) unhinted loads read weights already in L2 fastest (32 MiB: 9.8 us against
/// 10.4 with 256-byte fetches and 14.3 streaming), which is what a prefetch leaves; from DRAM
/// the streaming loads are fastest (15.7 us against 18.1). The others stay for the benches.
pub const DEFAULT_LOADS: WeightLoads = WeightLoads::Plain;
/// How the variants the host launches sum their K splits.
pub const DEFAULT_REDUCE: Reduce = Reduce::Cluster;

/// The row of a variant: `tiles` M tiles of [`M_TILE`] rows, its weight loads and its split-K
/// sum (`unroll`, the loads in flight, only shapes the body).
macro_rules! gemv_row {
    (
        $name:expr, $about:expr,
        gemv { tiles: $t:literal, loads: $l:ident, reduce: $r:ident, unroll: $u:ident }
    ) => {
        Variant {
            name: $name,
            max_m: $t * M_TILE,
            loads: WeightLoads::$l,
            reduce: Reduce::$r,
            about: $about,
        }
    };
}

/// The body of a variant, from the same tokens as its row: `Global` sums through global
/// memory (`gemv`), `Cluster` on chip (`gemv_cluster`); the loads pick the cache hint.
#[cfg(target_arch = "nvptx64")]
macro_rules! gemv_body {
    ($p:ident, gemv { tiles: $t:literal, loads: $l:ident, reduce: Global, unroll: $u:ident }) => {
        super::kernels::gemv::<
            $t,
            { super::kernels::hint_of(super::WeightLoads::$l) },
            { super::$u as usize },
        >(&$p)
    };
    ($p:ident, gemv { tiles: $t:literal, loads: $l:ident, reduce: Cluster, unroll: $u:ident }) => {
        super::kernels::gemv_cluster::<
            $t,
            { super::kernels::hint_of(super::WeightLoads::$l) },
            { super::$u as usize },
        >(&$p)
    };
}

// Every GEMV kernel. The host checked each launch's shape and buffers' alignment (check_gemv)
// and launched a cluster per row group for the `Cluster` ones.
/// The arch tier a variant's instructions need: the on-chip split-K sum across a cluster needs
/// sm_90; the rest (`mma.sync`, 16-byte loads) sm_80.
macro_rules! gemv_needs {
    (
        $then:ident!($($pre:tt)*)
        gemv { tiles: $t:literal, loads: $l:ident, reduce: Cluster, unroll: $u:ident }
    ) => {
        $then! { $($pre)* sm_90 }
    };
    ($then:ident!($($pre:tt)*) $($kind:tt)*) => {
        $then! { $($pre)* sm_80 }
    };
}

variants! {
    params: GemvParams, row: gemv_row, body: gemv_body, needs: gemv_needs;
    /// Per lane: two 16-byte weight loads and one 16-byte activation load per 32 K, one tile.
    gemv_bf16_m8: gemv { tiles: 1, loads: Plain, reduce: Global, unroll: UNROLL }
        => "bf16 GEMV, M <= 8: one mma.m16n8k16 per 16 K, unhinted 16-byte loads";
    /// Per lane: two 16-byte weight loads and two 16-byte activation loads per 32 K, two tiles.
    gemv_bf16_m16: gemv { tiles: 2, loads: Plain, reduce: Global, unroll: UNROLL }
        => "bf16 GEMV, M <= 16: two mma.m16n8k16 per 16 K, unhinted 16-byte loads";
    /// As `gemv_bf16_m8` with [`DEEP_UNROLL`] steps loaded before any is multiplied.
    gemv_bf16_m8_deep: gemv { tiles: 1, loads: Plain, reduce: Global, unroll: DEEP_UNROLL }
        => "bf16 GEMV, M <= 8, 16 weight loads in flight per lane";
    /// As `gemv_bf16_m16` with [`DEEP_UNROLL`] steps loaded before any is multiplied.
    gemv_bf16_m16_deep: gemv { tiles: 2, loads: Plain, reduce: Global, unroll: DEEP_UNROLL }
        => "bf16 GEMV, M <= 16, 16 weight loads in flight per lane";
    /// As `gemv_bf16_m8`, the weights read with 256-byte L2 fetches.
    gemv_bf16_m8_fetch256: gemv { tiles: 1, loads: Fetch256, reduce: Global, unroll: UNROLL }
        => "bf16 GEMV, M <= 8, weights read with 256-byte L2 fetches";
    /// As `gemv_bf16_m16`, the weights read with 256-byte L2 fetches.
    gemv_bf16_m16_fetch256: gemv { tiles: 2, loads: Fetch256, reduce: Global, unroll: UNROLL }
        => "bf16 GEMV, M <= 16, weights read with 256-byte L2 fetches";
    /// As `gemv_bf16_m8`, the weights read with L1 bypass and 256-byte L2 fetches.
    gemv_bf16_m8_stream: gemv { tiles: 1, loads: Stream, reduce: Global, unroll: UNROLL }
        => "bf16 GEMV, M <= 8, weights read with L1 bypass and 256-byte L2 fetches";
    /// As `gemv_bf16_m16`, the weights read with L1 bypass and 256-byte L2 fetches.
    gemv_bf16_m16_stream: gemv { tiles: 2, loads: Stream, reduce: Global, unroll: UNROLL }
        => "bf16 GEMV, M <= 16, weights read with L1 bypass and 256-byte L2 fetches";
    /// `gemv_bf16_m8` with the split-K sum on chip across a cluster.
    gemv_bf16_m8_cluster: gemv { tiles: 1, loads: Plain, reduce: Cluster, unroll: UNROLL }
        => "bf16 GEMV, M <= 8, split-K summed on chip across a cluster of 1-8 blocks";
    /// `gemv_bf16_m16` with the split-K sum on chip across a cluster.
    gemv_bf16_m16_cluster: gemv { tiles: 2, loads: Plain, reduce: Cluster, unroll: UNROLL }
        => "bf16 GEMV, M <= 16, split-K summed on chip across a cluster of 1-8 blocks";
    /// `gemv_bf16_m8_cluster` with [`DEEP_UNROLL`] steps loaded before any is multiplied.
    gemv_bf16_m8_cluster_deep: gemv { tiles: 1, loads: Plain, reduce: Cluster, unroll: DEEP_UNROLL }
        => "bf16 GEMV, M <= 8, split-K on chip, 16 weight loads in flight per lane";
    /// `gemv_bf16_m16_cluster` with [`DEEP_UNROLL`] steps loaded before any is multiplied.
    gemv_bf16_m16_cluster_deep: gemv { tiles: 2, loads: Plain, reduce: Cluster, unroll: DEEP_UNROLL }
        => "bf16 GEMV, M <= 16, split-K on chip, 16 weight loads in flight per lane";
}

#[cfg(target_arch = "nvptx64")]
mod kernels {
    use super::{CLUSTER_BLOCK_WARPS, DEEP_UNROLL, M_TILE, REDUCE_BATCH, UNROLL};
    use crate::cluster;
    use crate::device::{
        atomic_inc_acq_rel, block_sync, global_thread, hint, load_16, load_hinted_16,
        load_relaxed_f32, mma_16x8x16_bf16, store_f32, store_relaxed_u32, thread_in_block,
        warp_broadcast_lane0, warp_sync,
    };
    use crate::params::{GEMV_K_STEP, GEMV_ROWS_PER_WARP, GemvParams};
    use crate::smem::{load_shared_f32, shared_buffer, store_shared_16};

    /// The cache hint of a variant's weight loads.
    pub(super) const fn hint_of(loads: super::WeightLoads) -> u8 {
        match loads {
            super::WeightLoads::Plain => hint::PLAIN,
            super::WeightLoads::Stream => hint::STREAM,
            super::WeightLoads::Fetch256 => hint::L2_256,
        }
    }

    /// One warp's product of rows `16 group .. 16 group + 16` of `w` with `x` over the 32-element
    /// steps `first_step .. first_step + steps` of K: lane (g, t)'s `TILES` accumulator
    /// fragments, for rows g and g + 8 and activation rows 8q + 2t and 8q + 2t + 1.
    #[inline(always)]
    unsafe fn warp_product<const TILES: usize, const HINT: u8, const U: usize>(
        p: &GemvParams,
        group: u64,
        first_step: u64,
        steps: u64,
        lane: u32,
    ) -> [[f32; 4]; TILES] {
        let (g, t) = ((lane / 4) as u64, (lane % 4) as u64);
        let row_bytes = p.k as u64 * 2;
        let row_lo = group * GEMV_ROWS_PER_WARP as u64 + g;
        // Byte offset of this lane's 8 elements in the first step.
        let lane_offset = first_step * GEMV_K_STEP as u64 * 2 + t * 16;
        let w_lo = p.w + row_lo * row_bytes + lane_offset;
        let w_hi = w_lo + 8 * row_bytes;
        let mut x_row = [0u64; TILES];
        let mut x_live = [false; TILES];
        for q in 0..TILES {
            let m = q as u64 * M_TILE as u64 + g;
            x_live[q] = m < p.m as u64;
            x_row[q] = p.x + m * row_bytes + lane_offset;
        }
        let mut acc = [[0f32; 4]; TILES];
        let step_bytes = GEMV_K_STEP as u64 * 2;
        let mut step = 0u64;
        while step < steps {
            let batch = (steps - step).min(U as u64) as usize;
            let mut lo = [[0u32; 4]; U];
            let mut hi = [[0u32; 4]; U];
            let mut xs = [[[0u32; 4]; TILES]; U];
            for j in 0..U {
                if j < batch {
                    let off = (step + j as u64) * step_bytes;
                    // SAFETY: rows row_lo and row_lo + 8 < n and elements < k (the host checked
                    // n % 16 == 0 and the caller's steps lie inside K); nothing writes w or x.
                    unsafe {
                        lo[j] = load_hinted_16::<HINT>(w_lo + off);
                        hi[j] = load_hinted_16::<HINT>(w_hi + off);
                    }
                    for q in 0..TILES {
                        if x_live[q] {
                            // SAFETY: row m < p.m of x, the same elements as the weights.
                            xs[j][q] = unsafe { load_16(x_row[q] + off) };
                        }
                    }
                }
            }
            for j in 0..U {
                if j < batch {
                    for q in 0..TILES {
                        let (a, b, x) = (lo[j], hi[j], xs[j][q]);
                        acc[q] = mma_16x8x16_bf16([a[0], b[0], a[1], b[1]], [x[0], x[1]], acc[q]);
                        acc[q] = mma_16x8x16_bf16([a[2], b[2], a[3], b[3]], [x[2], x[3]], acc[q]);
                    }
                }
            }
            step += batch as u64;
        }
        acc
    }

    /// Element `(m, n)` of `y` that value `i` of tile `q` of lane (g, t) holds.
    #[inline(always)]
    fn fragment_element(group: u64, lane: u32, q: usize, i: usize) -> (u64, u64) {
        let (g, t) = ((lane / 4) as u64, (lane % 4) as u64);
        let m = q as u64 * M_TILE as u64 + 2 * t + (i % 2) as u64;
        let n = group * GEMV_ROWS_PER_WARP as u64 + g + 8 * (i / 2) as u64;
        (m, n)
    }

    /// One warp: rows `16 r .. 16 r + 16` of `w`, split `s` of K, `TILES` tiles of 8 x rows.
    #[inline(always)]
    pub(super) unsafe fn gemv<const TILES: usize, const HINT: u8, const U: usize>(p: &GemvParams) {
        let warp = global_thread() / 32;
        let lane = (global_thread() % 32) as u32;
        // At least 1 so that the division below cannot trap (the host refuses n < 16 anyway).
        let row_groups = ((p.n / GEMV_ROWS_PER_WARP) as u64).max(1);
        let splits = p.splits.max(1) as u64;
        if warp >= row_groups * splits {
            return;
        }
        let (group, split) = (warp % row_groups, warp / row_groups);
        let steps = p.k as u64 / GEMV_K_STEP as u64 / splits;
        // SAFETY: split < splits, so steps split * steps .. (split + 1) * steps lie inside K.
        let acc = unsafe { warp_product::<TILES, HINT, U>(p, group, split * steps, steps, lane) };
        let out = if splits > 1 {
            p.partial + split * p.m as u64 * p.n as u64 * 4
        } else {
            p.y
        };
        for q in 0..TILES {
            for (i, v) in acc[q].iter().enumerate() {
                let (m, n) = fragment_element(group, lane, q, i);
                if m < p.m as u64 {
                    // SAFETY: m < p.m and n < p.n index this split's [m, n] output; one lane
                    // owns each element.
                    unsafe { store_f32(out + (m * p.n as u64 + n) * 4, *v) };
                }
            }
        }
        if splits > 1 {
            // SAFETY: the host passes n / 16 zeroed counters and the partials with splits > 1.
            unsafe { reduce_if_last(p, group, splits, lane) };
        }
    }

    /// Fragment values a lane holds with two tiles (the most); a block's partials are this many
    /// f32 per lane per warp.
    const LANE_VALUES: u32 = 8;
    /// f32 values of one warp's (or one block's) partial fragments.
    const WARP_VALUES: u32 = 32 * LANE_VALUES;
    /// The cluster variants' shared buffer: every warp's partials, then one block sum per rank
    /// of the cluster (written into the first block's by all of them).
    const CLUSTER_SHARED_BYTES: u32 =
        (CLUSTER_BLOCK_WARPS + super::MAX_CLUSTER_BLOCKS) * WARP_VALUES * 4;

    /// One block of a row group's cluster: warp w is split `rank * warps + w` of K. The warps'
    /// fragments meet in this block's shared memory, where thread e sums value e over the warps
    /// in order; the blocks' sums meet in rank 0's, which sums them in rank order and writes y.
    #[inline(always)]
    pub(super) unsafe fn gemv_cluster<const TILES: usize, const HINT: u8, const U: usize>(
        p: &GemvParams,
    ) {
        let shared = shared_buffer::<CLUSTER_SHARED_BYTES>();
        // Says "this block has started": no block writes another's shared memory before the
        // matching wait below.
        cluster::arrive_relaxed();
        let (rank, blocks) = (cluster::block_rank(), cluster::cluster_blocks());
        let group = cluster::cluster_x() as u64;
        let (warp, lane) = (thread_in_block() / 32, thread_in_block() % 32);
        // At least 1 so that the divisions below cannot trap (a cluster has a block).
        let splits = (blocks as u64 * CLUSTER_BLOCK_WARPS as u64).max(1);
        let split = (rank * CLUSTER_BLOCK_WARPS + warp) as u64;
        let total_steps = p.k as u64 / GEMV_K_STEP as u64;
        let (first, end) = (
            split * total_steps / splits,
            (split + 1) * total_steps / splits,
        );
        // SAFETY: first <= end <= total_steps, so the steps lie inside K; the host launched one
        // cluster per row group, so group < n / 16.
        let acc = unsafe { warp_product::<TILES, HINT, U>(p, group, first, end - first, lane) };
        let warp_slot = shared + (warp * WARP_VALUES + lane * LANE_VALUES) * 4;
        for (q, a) in acc.iter().enumerate() {
            // SAFETY: 16-byte aligned, inside this warp's partials; only this lane writes them.
            unsafe { store_shared_16(warp_slot + q as u32 * 16, a.map(f32::to_bits)) };
        }
        block_sync();
        // Thread e sums value e (lane e / LANE_VALUES's value e % LANE_VALUES) over the warps.
        let e = thread_in_block();
        let lane_of = e / LANE_VALUES;
        let (q, i) = ((e % LANE_VALUES / 4) as usize, (e % 4) as usize);
        let live = q < TILES;
        let value = |base: u32, parts: u32| {
            let mut sum = 0f32;
            for w in 0..parts {
                // SAFETY: inside the shared buffer (parts <= the warps or ranks it holds);
                // written before a barrier this thread has passed.
                sum += unsafe { load_shared_f32(base + (w * WARP_VALUES + e) * 4) };
            }
            sum
        };
        let block_sum = if live {
            value(shared, CLUSTER_BLOCK_WARPS)
        } else {
            0.0
        };
        let ranks = shared + CLUSTER_BLOCK_WARPS * WARP_VALUES * 4;
        cluster::wait();
        if live {
            let slot = cluster::map_shared(ranks + (rank * WARP_VALUES + e) * 4, 0);
            // SAFETY: rank < blocks <= MAX_CLUSTER_BLOCKS slots in rank 0's buffer, which has
            // started (the wait above); only this thread writes this slot, and rank 0 reads it
            // after the barrier below.
            unsafe { cluster::store_shared_f32(slot, block_sum) };
        }
        cluster::arrive_release();
        cluster::wait();
        if rank != 0 || !live {
            return;
        }
        let (m, n) = fragment_element(group, lane_of, q, i);
        if m < p.m as u64 {
            // SAFETY: m < p.m and n < p.n index y; rank 0's thread e alone writes this element.
            unsafe { store_f32(p.y + (m * p.n as u64 + n) * 4, value(ranks, blocks)) };
        }
    }

    /// The split-K epilogue of one warp: publishes its partials, and if it is the last split of
    /// its row group to do so, sums all splits in order into `y` and resets the counter.
    #[inline(always)]
    unsafe fn reduce_if_last(p: &GemvParams, group: u64, splits: u64, lane: u32) {
        let counter = p.counters + group * 4;
        // The warp barrier orders every lane's partial stores before lane 0's count, whose
        // release publishes them all (as CUTLASS's barrier arrives: sync, then one release op);
        // its acquire, followed by the second barrier, makes the other splits' partials visible
        // to every lane of the last warp.
        warp_sync();
        let mut arrived = 0;
        if lane == 0 {
            // SAFETY: counter `group` < n / 16 of the host's zeroed array.
            arrived = unsafe { atomic_inc_acq_rel(counter) } + 1;
        }
        let arrived = warp_broadcast_lane0(arrived) as u64;
        warp_sync();
        if arrived != splits {
            return;
        }
        let (m_rows, n) = (p.m as u64, p.n as u64);
        let mut e = lane as u64;
        while e < GEMV_ROWS_PER_WARP as u64 * m_rows {
            let (row, m) = (e % GEMV_ROWS_PER_WARP as u64, e / GEMV_ROWS_PER_WARP as u64);
            let i = m * n + group * GEMV_ROWS_PER_WARP as u64 + row;
            let mut sum = 0f32;
            let mut first = 0u64;
            while first < splits {
                // Every load of a batch is issued before the first add waits on one.
                let mut part = [0f32; REDUCE_BATCH];
                for (j, v) in part.iter_mut().enumerate() {
                    let s = first + j as u64;
                    if s < splits {
                        // SAFETY: s < splits, m < p.m and the row < p.n index the
                        // [splits, m, n] partials.
                        *v = unsafe { load_relaxed_f32(p.partial + (s * m_rows * n + i) * 4) };
                    }
                }
                for (j, v) in part.iter().enumerate() {
                    if first + (j as u64) < splits {
                        sum += *v;
                    }
                }
                first += REDUCE_BATCH as u64;
            }
            // SAFETY: i indexes y[m, n]; only this warp writes row group `group` of y.
            unsafe { store_f32(p.y + i * 4, sum) };
            e += 32;
        }
        if lane == 0 {
            // SAFETY: as above; the next launch, in stream order, finds the counter zero.
            unsafe { store_relaxed_u32(counter, 0) };
        }
    }
}
