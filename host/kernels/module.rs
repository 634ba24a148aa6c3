//! A PTX module beside the product's own, loaded for the device and the arch a [`Kernels`]
//! loaded, and its kernels launched through the same checked paths as the product's (the grid
//! capped at what is resident, the device timeline carried, clusters and launch attributes
//! through `cuLaunchKernelEx`). The lab (`fetchahead-lab`) loads its kernels this way; the
//! product loads only its own module.
use std::sync::Arc;

use cudarc::driver::{CudaModule, sys};
use fetchahead_gpu::params::TimelineParams;

use crate::driver;
use crate::error::CudaCall;
use crate::kernels::launch::{Kernels, LoadedKernel, Slot};
use crate::kernels::ptx::{self, BuiltPtx};
use crate::{Error, Result};

/// Another module's PTX, loaded for one device at the arch its [`Kernels`] loaded.
#[derive(Debug)]
pub struct KernelModule {
    module: Arc<CudaModule>,
    ptx: &'static BuiltPtx,
}

impl KernelModule {
    /// The arch of the PTX loaded.
    pub fn arch(&self) -> &'static str {
        self.ptx.arch
    }

    /// Kernel `name`, its blocks per multiprocessor measured for blocks of `block_threads`.
    pub fn kernel(&self, name: &str, block_threads: u32) -> Result<LoadedKernel> {
        LoadedKernel::load(&self.module, name, block_threads)
    }

    /// Kernel `name` when this PTX holds it (its instructions need SM `needs`), else why not.
    pub fn slot(&self, name: &'static str, needs: u32, block_threads: u32) -> Result<Slot> {
        Slot::load(&self.module, self.ptx, name, needs, block_threads)
    }
}

impl Kernels {
    /// Loads the PTX among `built` of the arch these kernels loaded: a module built for the
    /// same `FETCHAHEAD_ARCHS`, as the lab's is, so that both modules run the same arch's code.
    pub fn load_module(&self, built: &'static [BuiltPtx]) -> Result<KernelModule> {
        let arch = self.arch();
        let ptx = built
            .iter()
            .find(|p| p.arch == arch)
            .ok_or_else(|| Error::UnknownArch {
                arch: format!("{arch} (the arch the product's kernels loaded)"),
                built: ptx::archs_of(built),
            })?;
        let module = self
            .gpu
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx.text))
            .call("cuModuleLoadData")?;
        Ok(KernelModule { module, ptx })
    }

    /// What a launch of `kernel` hands it for the device timeline (`TimelineParams::OFF` while
    /// the timeline is off).
    pub fn timeline_params(&self, kernel: &LoadedKernel) -> TimelineParams {
        self.timeline.params(kernel.id)
    }

    /// One launch of exactly `blocks x threads`: `kernel`, or its timed twin when `timeline`
    /// (the one inside `p`) is on.
    ///
    /// # Safety
    /// As [`Kernels::launch`].
    pub unsafe fn launch_grid<P: Copy>(
        &self,
        kernel: &LoadedKernel,
        timeline: &TimelineParams,
        blocks: u32,
        threads: u32,
        stream: sys::CUstream,
        p: P,
    ) -> Result<()> {
        // SAFETY: the caller guarantees `P` and the addresses inside `p`.
        unsafe { self.launch_exact(kernel.function_for(timeline), blocks, threads, stream, p) }
    }

    /// One `cuLaunchKernelEx` of `blocks x threads`: `kernel` (its timed twin when `timeline` is
    /// on), in clusters of `cluster` blocks along x when given, with `attribute` (an
    /// access-policy window, say) when given. Launch attributes stay on the node of a captured
    /// graph.
    ///
    /// # Safety
    /// As [`Kernels::launch`]; a cluster launch is of a kernel that may run in clusters.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_with<P: Copy>(
        &self,
        kernel: &LoadedKernel,
        timeline: &TimelineParams,
        (blocks, threads): (u32, u32),
        cluster: Option<u32>,
        attribute: Option<sys::CUlaunchAttribute>,
        stream: sys::CUstream,
        p: P,
    ) -> Result<()> {
        // At most two attributes, in a fixed array: a launch allocates nothing.
        let mut attrs = [driver::launch::cluster_attribute(1); 2];
        let mut count = 0;
        for a in [attribute, cluster.map(driver::launch::cluster_attribute)]
            .into_iter()
            .flatten()
        {
            attrs[count] = a;
            count += 1;
        }
        let config = launch_config(blocks, threads, stream, &mut attrs[..count]);
        self.gpu.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: `config` and its attributes live across the call; the caller guarantees `P`,
        // the addresses inside `p` and the stream; the context is bound above.
        unsafe { driver::launch::launch_kernel_ex(kernel.function_for(timeline), &config, p) }
    }

    /// How many clusters of `blocks` blocks of `threads` threads of `kernel` the device runs at
    /// once.
    pub fn max_active_clusters(
        &self,
        kernel: &LoadedKernel,
        blocks: u32,
        threads: u32,
    ) -> Result<u32> {
        let mut attrs = [driver::launch::cluster_attribute(blocks)];
        let config = launch_config(blocks, threads, std::ptr::null_mut(), &mut attrs);
        self.gpu.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: `config` and its attribute live across the query; the function is a loaded
        // one of this context, bound above.
        unsafe { driver::launch::max_active_clusters(&kernel.function, &config) }
    }
}

/// A launch of `blocks x threads` on `stream` with `attrs`, which must outlive its use.
fn launch_config(
    blocks: u32,
    threads: u32,
    stream: sys::CUstream,
    attrs: &mut [sys::CUlaunchAttribute],
) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: blocks,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: threads,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: stream,
        attrs: attrs.as_mut_ptr(),
        numAttrs: attrs.len() as u32,
    }
}
