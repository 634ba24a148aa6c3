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
    pub about: &'static str,
}

/// The weight loads of the variants the host launches (the first whose `max_m` covers M): on the
/// H200 (2026-11-29) unhinted loads read weights already in L2 fastest (32 MiB: 9.8 us against
/// 10.4 with 256-byte fetches and 14.3 streaming), which is what a prefetch leaves; from DRAM
/// the streaming loads are fastest (15.7 us against 18.1). The others stay for the benches.
pub const DEFAULT_LOADS: WeightLoads = WeightLoads::Plain;

/// Every GEMV kernel.
pub const VARIANTS: &[Variant] = &[
    Variant {
        name: "gemv_bf16_m8",
        max_m: 8,
        loads: WeightLoads::Plain,
        about: "bf16 GEMV, M <= 8: one mma.m16n8k16 per 16 K, unhinted 16-byte loads",
    },
    Variant {
        name: "gemv_bf16_m16",
        max_m: 16,
        loads: WeightLoads::Plain,
        about: "bf16 GEMV, M <= 16: two mma.m16n8k16 per 16 K, unhinted 16-byte loads",
    },
    Variant {
        name: "gemv_bf16_m8_deep",
        max_m: 8,
        loads: WeightLoads::Plain,
        about: "bf16 GEMV, M <= 8, 16 weight loads in flight per lane",
    },
    Variant {
        name: "gemv_bf16_m16_deep",
        max_m: 16,
        loads: WeightLoads::Plain,
        about: "bf16 GEMV, M <= 16, 16 weight loads in flight per lane",
    },
    Variant {
        name: "gemv_bf16_m8_fetch256",
        max_m: 8,
        loads: WeightLoads::Fetch256,
        about: "bf16 GEMV, M <= 8, weights read with 256-byte L2 fetches",
    },
    Variant {
        name: "gemv_bf16_m16_fetch256",
        max_m: 16,
        loads: WeightLoads::Fetch256,
        about: "bf16 GEMV, M <= 16, weights read with 256-byte L2 fetches",
    },
    Variant {
        name: "gemv_bf16_m8_stream",
        max_m: 8,
        loads: WeightLoads::Stream,
        about: "bf16 GEMV, M <= 8, weights read with L1 bypass and 256-byte L2 fetches",
    },
    Variant {
        name: "gemv_bf16_m16_stream",
        max_m: 16,
        loads: WeightLoads::Stream,
        about: "bf16 GEMV, M <= 16, weights read with L1 bypass and 256-byte L2 fetches",
    },
];

#[cfg(target_arch = "nvptx64")]
mod kernels {
    use super::{DEEP_UNROLL, M_TILE, REDUCE_BATCH, UNROLL};
    use crate::device::{
        atomic_inc_acq_rel, global_thread, hint, load_16, load_hinted_16, load_relaxed_f32,
        mma_16x8x16_bf16, store_f32, store_relaxed_u32, warp_broadcast_lane0, warp_sync,
    };
    use crate::params::{GEMV_K_STEP, GEMV_ROWS_PER_WARP, GemvParams};

    /// One warp: rows `16 r .. 16 r + 16` of `w`, split `s` of K, `TILES` tiles of 8 x rows.
    #[inline(always)]
    unsafe fn gemv<const TILES: usize, const HINT: u8, const U: usize>(p: &GemvParams) {
        let warp = global_thread() / 32;
        let lane = (global_thread() % 32) as u32;
        let (g, t) = ((lane / 4) as u64, (lane % 4) as u64);
        // At least 1 so that the division below cannot trap (the host refuses n < 16 anyway).
        let row_groups = ((p.n / GEMV_ROWS_PER_WARP) as u64).max(1);
        let splits = p.splits.max(1) as u64;
        if warp >= row_groups * splits {
            return;
        }
        let (group, split) = (warp % row_groups, warp / row_groups);
        let row_bytes = p.k as u64 * 2;
        let steps = p.k as u64 / GEMV_K_STEP as u64 / splits;
        let first_step = split * steps;
        let row_lo = group * GEMV_ROWS_PER_WARP as u64 + g;
        // Byte offset of this lane's 8 elements in step 0 of its split.
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
                    // n % 16 == 0 and k % (32 splits) == 0); nothing writes w or x.
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
        // Lane (g, t) holds rows g and g + 8, activation rows 8q + 2t and 8q + 2t + 1.
        let out = if splits > 1 {
            p.partial + split * p.m as u64 * p.n as u64 * 4
        } else {
            p.y
        };
        for q in 0..TILES {
            for (i, v) in acc[q].iter().enumerate() {
                let m = q as u64 * M_TILE as u64 + 2 * t + (i % 2) as u64;
                let n = row_lo + 8 * (i / 2) as u64;
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

    /// Per lane: two 16-byte weight loads and one 16-byte activation load per 32 K, one tile.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gemv_bf16_m8(p: GemvParams) {
        // SAFETY: the host checked the shape and alignment of p's buffers (check_gemv).
        unsafe { gemv::<1, { hint::PLAIN }, { UNROLL as usize }>(&p) }
    }

    /// Per lane: two 16-byte weight loads and two 16-byte activation loads per 32 K, two tiles.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gemv_bf16_m16(p: GemvParams) {
        // SAFETY: the host checked the shape and alignment of p's buffers (check_gemv).
        unsafe { gemv::<2, { hint::PLAIN }, { UNROLL as usize }>(&p) }
    }

    /// As `gemv_bf16_m8` with [`DEEP_UNROLL`] steps loaded before any is multiplied.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gemv_bf16_m8_deep(p: GemvParams) {
        // SAFETY: the host checked the shape and alignment of p's buffers (check_gemv).
        unsafe { gemv::<1, { hint::PLAIN }, { DEEP_UNROLL as usize }>(&p) }
    }

    /// As `gemv_bf16_m16` with [`DEEP_UNROLL`] steps loaded before any is multiplied.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gemv_bf16_m16_deep(p: GemvParams) {
        // SAFETY: the host checked the shape and alignment of p's buffers (check_gemv).
        unsafe { gemv::<2, { hint::PLAIN }, { DEEP_UNROLL as usize }>(&p) }
    }

    /// As `gemv_bf16_m8`, the weights read with 256-byte L2 fetches.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gemv_bf16_m8_fetch256(p: GemvParams) {
        // SAFETY: the host checked the shape and alignment of p's buffers (check_gemv).
        unsafe { gemv::<1, { hint::L2_256 }, { UNROLL as usize }>(&p) }
    }

    /// As `gemv_bf16_m16`, the weights read with 256-byte L2 fetches.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gemv_bf16_m16_fetch256(p: GemvParams) {
        // SAFETY: the host checked the shape and alignment of p's buffers (check_gemv).
        unsafe { gemv::<2, { hint::L2_256 }, { UNROLL as usize }>(&p) }
    }

    /// As `gemv_bf16_m8`, the weights read with L1 bypass and 256-byte L2 fetches.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gemv_bf16_m8_stream(p: GemvParams) {
        // SAFETY: the host checked the shape and alignment of p's buffers (check_gemv).
        unsafe { gemv::<1, { hint::STREAM }, { UNROLL as usize }>(&p) }
    }

    /// As `gemv_bf16_m16`, the weights read with L1 bypass and 256-byte L2 fetches.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn gemv_bf16_m16_stream(p: GemvParams) {
        // SAFETY: the host checked the shape and alignment of p's buffers (check_gemv).
        unsafe { gemv::<2, { hint::STREAM }, { UNROLL as usize }>(&p) }
    }
}
