//! The prefetcher's gather of staged rows without a join: each staged row carries a tag (the id
//! it holds), written by the side stream after the rows, and the gather waits for row `i`'s tag
//! to equal `ids[i]` instead of the main stream waiting for the side stream.
//!
//! Inside a CUDA graph, a dependency of the main chain on a side branch of copies costs the main
//! chain 2-3 us at the node that waits, even when the branch finished long before
//! (`benches/cuda/graph_join_probe.cu`); a tag read beside the id read costs nothing more than
//! the staged gather's own index load. A tag equal to the id it is asked for is correct whatever
//! step wrote it: the table does not change, so the staged bytes are that row's bytes.
//!
//! Same layout as `gather_dequant_u8_packed_x2` (a lane per 8 elements, 2 units a lane, every
//! warp store 512 contiguous bytes), with the packed conversion: the dequant's own tile loop
//! (`unit_tiles!` in `dequant.rs`), with the tag wait in its load step. Ordering: the side stream's row
//! copies complete before its tag copy starts (stream order), the tags are read at GPU scope
//! (`ld.relaxed.gpu`, both units' at once), and a row's loads are issued only after its tag
//! compared equal (a control dependency; the GPU does not load speculatively) and read past L1
//! (`ld.global.cg`), so they see the copied rows, never a stale line. A row whose tag does not
//! arrive within `timeout_ns` comes out as zeros and is recorded in `late`, so that a stalled
//! side stream cannot hang the device.

/// The kernel's entry.
pub const KERNEL: &str = "staged_dequant_tagged";
/// Its twin that records the device timeline.
pub const KERNEL_TIMED: &str = "staged_dequant_tagged_timed";

/// Units of 8 elements a lane converts per pass.
pub const UNROLL: u32 = 2;

/// Threads a launch over `n` rows of `dim` elements needs (before the grid cap).
pub const fn threads(n: u64, dim: u32) -> u64 {
    let units = n * (dim / 8) as u64;
    units.div_ceil(32 * UNROLL as u64) * 32
}

#[cfg(target_arch = "nvptx64")]
mod kernels {
    use super::UNROLL;
    use crate::dequant::Conversion;
    use crate::dequant::kernels::unit_tiles;
    use crate::device::{
        global_timer_ns, load_i64, load_l2_8, load_l2_u8, load_relaxed_i64, record_bad_id, store_16,
    };
    use crate::params::StagedParams;

    const PACKED: u8 = Conversion::Packed as u8;
    const N: usize = UNROLL as usize;

    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn staged_dequant_tagged(p: StagedParams) {
        // SAFETY: the host validated `p` (launch_staged_dequant).
        unsafe { tagged(&p) }
    }

    /// As `staged_dequant_tagged`, recording its blocks on the device timeline.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn staged_dequant_tagged_timed(p: StagedParams) {
        // SAFETY: the host validated `p` (launch_staged_dequant).
        timed!(p, unsafe { tagged(&p) })
    }

    /// The dequant's tile loop (`unit_tiles!`) over the staged rows: each unit's key is the id
    /// asked for and the tag its staged row holds, and a row is read once the two are equal.
    #[inline(always)]
    unsafe fn tagged(p: &StagedParams) {
        let p = *p;
        unit_tiles! {
            unroll: N, conversion: PACKED, dim: p.dim, n: p.n,
            names: [split, scales_per_row, total, u, j, i, c, w, s],
            keys: wanted = [(0i64, 0i64)] {
                let i = split(u).0;
                // SAFETY: i < n: inside the ids and the tags.
                unsafe { (load_i64(p.ids + 8 * i), load_relaxed_i64(p.tags + 8 * i)) }
            }
            load: {
                if u >= total {
                    continue;
                }
                let (want, tag) = wanted[j];
                let mut ready = tag == want;
                if !ready {
                    let started = global_timer_ns();
                    while !ready && global_timer_ns() - started < p.timeout_ns {
                        // SAFETY: as above.
                        ready = unsafe { load_relaxed_i64(p.tags + 8 * i) } == want;
                    }
                    if !ready && c == 0 {
                        // SAFETY: the host passes the address of a live IdStatus.
                        unsafe { record_bad_id(p.late, i) };
                    }
                }
                // A late row stays zero bytes at scale 2^0: a row of +0.0.
                if ready {
                    // SAFETY: i < n and c < dim / 8: 8 bytes inside staged row i (8-byte
                    // aligned: rows are 16-byte aligned), and its scale byte.
                    unsafe {
                        w[j] = load_l2_8(p.weights + i * p.dim as u64 + 8 * c as u64);
                        s[j] = load_l2_u8(p.scales + i * scales_per_row + (c / 4) as u64);
                    }
                }
            }
            store: |out| {
                // SAFETY: unit u's 16 bytes of output, inside the n rows, owned by this thread.
                unsafe { store_16(p.out + 16 * u, out) };
            }
        }
    }
}
