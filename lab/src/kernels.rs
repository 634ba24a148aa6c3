//! The lab's kernels: [`LabKernels`], the product's [`Kernels`] of one device with the lab's PTX
//! module loaded beside them at the same arch, and the launches of the hash, spin, collective
//! and bf16 GEMV kernels, through the product's checked launch paths.
use std::ops::Deref;
use std::sync::Arc;

use cudarc::driver::sys;
use fetchahead::kernels::{
    Gpu, KernelModule, Kernels, LoadedKernel, Slot, check_aligned, check_aligned_to,
};
use fetchahead::{Error, Result};
use fetchahead_gpu::gemv::Reduce;
use fetchahead_gpu::params::{
    CollectiveParams, GEMV_K_STEP, GEMV_ROWS_PER_WARP, GemvParams, HashParams, MAX_NGRAM,
    SpinParams, TimelineParams,
};
use fetchahead_gpu::{collective, gather, gemv, hash, spin};

use crate::ptx;

/// GEMV warps a multiprocessor that [`LabKernels::gemv_splits`] stays within.
pub const GEMV_WARPS_PER_SM: u32 = 16;
/// The most K splits [`LabKernels::gemv_splits`] picks.
pub const GEMV_MAX_SPLITS: u32 = 16;

/// The product's kernels of one device and the lab's module loaded beside them, at the arch the
/// product's loaded. It dereferences to those [`Kernels`] (the lab launches both), and holds them
/// in an `Arc` for what takes them shared (a prefetcher).
#[derive(Debug)]
pub struct LabKernels {
    kernels: Arc<Kernels>,
    _module: KernelModule,
    gemv: Vec<Slot>,
    collective: LoadedKernel,
    hash: LoadedKernel,
    spin: LoadedKernel,
}

impl Deref for LabKernels {
    type Target = Kernels;

    fn deref(&self) -> &Kernels {
        &self.kernels
    }
}

impl LabKernels {
    /// Loads the product's kernels for `gpu` ([`Kernels::load`]) and the lab's beside them.
    pub fn load(gpu: &Gpu) -> Result<LabKernels> {
        LabKernels::beside(Arc::new(Kernels::load(gpu)?))
    }

    /// Loads the lab's module at the arch `kernels` loaded.
    pub fn beside(kernels: Arc<Kernels>) -> Result<LabKernels> {
        let module = kernels.load_module(ptx::BUILT)?;
        let threads = gather::BLOCK_THREADS;
        let gemv = gemv::VARIANTS
            .iter()
            .zip(gemv::NEEDS)
            .map(|(v, &needs)| module.slot(v.name, needs, threads))
            .collect::<Result<_>>()?;
        Ok(LabKernels {
            gemv,
            collective: module.kernel(collective::KERNEL, threads)?,
            hash: module.kernel(hash::KERNEL, threads)?,
            spin: module.kernel(spin::KERNEL, threads)?,
            _module: module,
            kernels,
        })
    }

    /// The product's kernels, shared.
    pub fn product(&self) -> &Arc<Kernels> {
        &self.kernels
    }

    /// Hashes `p.n_tokens` tokens into `p.n_tokens * p.heads` ids.
    ///
    /// # Safety
    /// `tokens` holds `n_tokens` u32 and `ids` holds `n_tokens * heads` i64, written by nothing
    /// else during the launch.
    pub unsafe fn launch_hash(&self, stream: sys::CUstream, p: HashParams) -> Result<()> {
        if p.heads == 0 || p.rows == 0 || p.ngram == 0 || p.ngram > MAX_NGRAM {
            return Err(Error::invalid(
                "hash",
                format!(
                    "{} heads, {} rows, n-gram {} (heads and rows positive, n-gram 1..={MAX_NGRAM})",
                    p.heads, p.rows, p.ngram
                ),
            ));
        }
        check_aligned_to("tokens", p.tokens, 4)?;
        check_aligned_to("hash ids", p.ids, 8)?;
        let threads = p.n_tokens * p.heads as u64;
        // SAFETY: the caller guarantees the addresses; one thread per (token, head).
        unsafe {
            self.kernels.launch(
                &self.hash,
                &TimelineParams::OFF,
                threads,
                stream,
                p,
                gather::BLOCK_THREADS,
            )
        }
    }

    /// Keeps every multiprocessor busy for `nanos` nanoseconds: a stand-in for a layer's compute.
    ///
    /// # Safety
    /// `stream` is a valid stream of this device's context.
    pub unsafe fn launch_spin(&self, stream: sys::CUstream, nanos: u64) -> Result<()> {
        let threads = self.gpu().multiprocessors as u64 * gather::BLOCK_THREADS as u64;
        let p = SpinParams {
            nanos,
            timeline: self.timeline_params(&self.spin),
        };
        // SAFETY: the spin kernel touches no memory.
        unsafe {
            self.kernels.launch(
                &self.spin,
                &p.timeline,
                threads,
                stream,
                p,
                gather::BLOCK_THREADS,
            )
        }
    }

    /// K splits for GEMV `variant` over `n x k` weights on this device.
    ///
    /// [`Reduce::Global`]: the most (up to [`GEMV_MAX_SPLITS`]) that keep the warps within
    /// [`GEMV_WARPS_PER_SM`] a multiprocessor; the H200 sweep (2026-11-29, K = 4096) was
    /// fastest at 512, 1024, 2048 and 2048 warps for 4, 8, 16 and 32 MiB, which this gives.
    ///
    /// [`Reduce::Cluster`]: the largest cluster (up to [`gemv::MAX_CLUSTER_BLOCKS`] blocks)
    /// whose row groups all fit on the device at once (`cuOccupancyMaxActiveClusters`) within
    /// [`GEMV_WARPS_PER_SM`] warps a multiprocessor, and whose warps each get at least one
    /// 32-element step. In the H200 sweep (2026-11-29) a second wave of clusters cost more than
    /// the extra splits gained.
    pub fn gemv_splits(&self, variant: usize, n: u32, k: u32) -> Result<u32> {
        let v = LabKernels::gemv_variant_at(variant)?;
        let groups = (n / GEMV_ROWS_PER_WARP).max(1);
        let warps = GEMV_WARPS_PER_SM * self.gpu().multiprocessors;
        let steps = k / GEMV_K_STEP;
        Ok(match v.reduce {
            Reduce::Global => {
                let want = (warps / groups).clamp(1, GEMV_MAX_SPLITS);
                (1..=want)
                    .rev()
                    .find(|s| steps.is_multiple_of(*s))
                    .unwrap_or(1)
            }
            Reduce::Cluster => {
                let mut blocks = 1;
                for b in (1..=gemv::MAX_CLUSTER_BLOCKS.ilog2()).map(|b| 1 << b) {
                    let splits = b * gemv::CLUSTER_BLOCK_WARPS;
                    if groups * splits > warps || splits > steps {
                        break;
                    }
                    if groups > self.gemv_max_clusters(variant, b)? {
                        break;
                    }
                    blocks = b;
                }
                blocks * gemv::CLUSTER_BLOCK_WARPS
            }
        })
    }

    /// How many clusters of `blocks` blocks of cluster GEMV `variant` the device runs at once.
    pub fn gemv_max_clusters(&self, variant: usize, blocks: u32) -> Result<u32> {
        let kernel = self.pick(&self.gemv, variant, "gemv")?;
        self.max_active_clusters(kernel, blocks, Reduce::Cluster.block_threads())
    }

    /// GEMV `variant` (an index into `gemv::VARIANTS`), or an error naming it.
    pub fn gemv_variant_at(variant: usize) -> Result<&'static gemv::Variant> {
        gemv::VARIANTS
            .get(variant)
            .ok_or_else(|| Error::invalid("gemv", format!("no GEMV variant {variant}")))
    }

    /// The GEMV variant the host launches for `m` activation rows: the first with
    /// `gemv::DEFAULT_LOADS` and `gemv::DEFAULT_REDUCE` that covers `m` (an index into
    /// `gemv::VARIANTS`).
    pub fn gemv_variant(m: u32) -> Result<usize> {
        gemv::VARIANTS
            .iter()
            .position(|v| {
                m <= v.max_m && v.loads == gemv::DEFAULT_LOADS && v.reduce == gemv::DEFAULT_REDUCE
            })
            .ok_or_else(|| Error::invalid("gemv", format!("m = {m}, want 1..=16")))
    }

    /// Launches bf16 GEMV `variant` (an index into `gemv::VARIANTS`), `y = x w^T`, on `stream`;
    /// with `p.splits > 1` the same launch sums the K splits. With `policy`, the GEMV launch
    /// carries an access-policy window (a launch attribute, so a captured graph keeps it on the
    /// node).
    ///
    /// # Safety
    /// `x` holds `m x k` bf16, `w` holds `n x k` bf16, `y` holds `m x n` f32 and, for a
    /// [`Reduce::Global`] variant with splits, `partial` holds `splits x m x n` f32 and
    /// `counters` `n / 16` u32 left zero by the last launch (zero when new); `y`, `partial` and
    /// `counters` are used by nothing else meanwhile.
    pub unsafe fn launch_gemv(
        &self,
        stream: sys::CUstream,
        variant: usize,
        p: GemvParams,
        policy: Option<fetchahead::AccessWindow>,
    ) -> Result<()> {
        let v = LabKernels::gemv_variant_at(variant)?;
        check_gemv(&p, v.reduce)?;
        let kernel = self.pick(&self.gemv, variant, "gemv")?;
        let p = GemvParams {
            timeline: self.timeline_params(kernel),
            ..p
        };
        if p.m > v.max_m {
            return Err(Error::invalid(
                "gemv",
                format!("m = {} above {}'s {}", p.m, v.name, v.max_m),
            ));
        }
        let groups = (p.n / GEMV_ROWS_PER_WARP) as u64;
        let block_threads = v.reduce.block_threads();
        let (blocks, cluster) = match v.reduce {
            Reduce::Global => (
                (groups * p.splits as u64 * 32).div_ceil(block_threads as u64),
                None,
            ),
            Reduce::Cluster => {
                let cluster = p.splits / gemv::CLUSTER_BLOCK_WARPS;
                (groups * cluster as u64, Some(cluster))
            }
        };
        let blocks = u32::try_from(blocks)
            .map_err(|_| Error::invalid("gemv", format!("{blocks} blocks")))?;
        let window = policy.map(|w| w.launch_attribute());
        // SAFETY: `p` is the struct the kernel takes; a cluster variant runs in clusters; the
        // caller guarantees the buffers and the stream.
        unsafe {
            self.launch_with(
                kernel,
                &p.timeline,
                (blocks, block_threads),
                cluster,
                window,
                stream,
                p,
            )
        }
    }

    /// Launches the simulated collective: `blocks` (1..=8) CTAs polling `flag` (0: none) for
    /// `ns` nanoseconds, writing nothing.
    ///
    /// # Safety
    /// `flag` is 0 or the address of a live, 4-byte aligned u32 in device memory.
    pub unsafe fn launch_collective(
        &self,
        stream: sys::CUstream,
        blocks: u32,
        ns: u64,
        flag: u64,
    ) -> Result<()> {
        // SAFETY: the caller's flag; no output.
        unsafe { self.launch_collective_writing(stream, blocks, ns, flag, (0, 0)) }
    }

    /// As [`LabKernels::launch_collective`], then writing its result as an all-reduce does:
    /// `output` (device address, bytes) rewritten in place, so that the next kernel finds its
    /// activations freshly written in L2 (`(0, 0)`: nothing written).
    ///
    /// # Safety
    /// `flag` as above; `output` is `(0, 0)` or a live device allocation of that many bytes
    /// that nothing else uses while the collective runs.
    pub unsafe fn launch_collective_writing(
        &self,
        stream: sys::CUstream,
        blocks: u32,
        ns: u64,
        flag: u64,
        output: (u64, u64),
    ) -> Result<()> {
        if blocks == 0 || blocks > collective::MAX_BLOCKS {
            return Err(Error::invalid(
                "collective",
                format!("{blocks} blocks, want 1..=8"),
            ));
        }
        if !flag.is_multiple_of(4) {
            return Err(Error::invalid(
                "collective flag",
                format!("{flag:#x} is not 4-byte aligned"),
            ));
        }
        let (out, out_bytes) = output;
        if !out.is_multiple_of(16)
            || !out_bytes.is_multiple_of(16)
            || (out == 0) != (out_bytes == 0)
        {
            return Err(Error::invalid(
                "collective output",
                format!("{out_bytes} bytes at {out:#x}: want both 0, or 16-byte aligned"),
            ));
        }
        let p = CollectiveParams {
            ns,
            flag,
            out,
            out_bytes,
            timeline: self.timeline_params(&self.collective),
        };
        let threads = collective::BLOCK_THREADS;
        // SAFETY: the caller guarantees `flag` and `output`; the checks above bound the launch.
        unsafe { self.launch_grid(&self.collective, &p.timeline, blocks, threads, stream, p) }
    }
}

/// Checks a GEMV's shape and alignment before any launch of a variant that reduces as `reduce`.
fn check_gemv(p: &GemvParams, reduce: Reduce) -> Result<()> {
    if p.m == 0 || p.m > 16 {
        return Err(Error::invalid("gemv", format!("m = {}, want 1..=16", p.m)));
    }
    if p.n == 0 || !p.n.is_multiple_of(GEMV_ROWS_PER_WARP) {
        return Err(Error::invalid(
            "gemv",
            format!("n = {} is not a positive multiple of 16", p.n),
        ));
    }
    if !reduce.accepts(p.splits, p.k) {
        let want = match reduce {
            Reduce::Global => "k a positive multiple of 32 x splits",
            Reduce::Cluster => "k a positive multiple of 32, splits 8 x 1, 2, 4 or 8 blocks",
        };
        return Err(Error::invalid(
            "gemv",
            format!("k = {} with {} splits; want {want}", p.k, p.splits),
        ));
    }
    check_aligned("gemv x", p.x)?;
    check_aligned("gemv w", p.w)?;
    check_aligned_to("gemv y", p.y, 4)?;
    if reduce == Reduce::Global && p.splits > 1 {
        check_aligned_to("gemv partial", p.partial, 4)?;
        check_aligned_to("gemv counters", p.counters, 4)?;
    }
    Ok(())
}
