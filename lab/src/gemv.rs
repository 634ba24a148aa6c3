//! A bf16 GEMV with its buffers: the weight-bound reader the L2 plan warms weights for, used by
//! the tests and benches as the kernel after a collective.
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use fetchahead_gpu::gemv::Reduce;
use fetchahead_gpu::params::GemvParams;
use half::bf16;

use crate::LabKernels;
use fetchahead::error::CudaCall;
use fetchahead::l2_plan::access_policy::AccessWindow;
use fetchahead::{Error, Result};

/// Which GEMV kernel runs and how K is split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvLaunch {
    /// An index into `fetchahead_gpu::gemv::VARIANTS`.
    pub variant: usize,
    /// K splits, as the variant's `Reduce::accepts` allows.
    pub splits: u32,
}

impl GemvLaunch {
    /// What the host picks for `m x k` activations and `n` weight rows on `kernels`' device.
    pub fn default_for(kernels: &LabKernels, m: u32, n: u32, k: u32) -> Result<GemvLaunch> {
        let variant = LabKernels::gemv_variant(m)?;
        Ok(GemvLaunch {
            variant,
            splits: kernels.gemv_splits(variant, n, k)?,
        })
    }
}

/// What one GEMV writes, zeroed on the device, and the shape they are sized for: the split-K
/// partials (one element unless a [`Reduce::Global`] launch splits K), one arrival counter per 16
/// weight rows for the split-K epilogue, and `y`. [`Gemv`] and the decode step's readers build
/// their params here alike.
pub(crate) struct GemvOutputs {
    pub partial: CudaSlice<f32>,
    pub counters: CudaSlice<u32>,
    pub y: CudaSlice<f32>,
    m: u32,
    n: u32,
    splits: u32,
}

impl GemvOutputs {
    /// Allocates on `stream` the outputs of an `m x n` GEMV whose variant reduces by `reduce`,
    /// K split `splits` ways.
    pub(crate) fn alloc(
        stream: &Arc<CudaStream>,
        reduce: Reduce,
        m: u32,
        n: u32,
        splits: u32,
    ) -> Result<GemvOutputs> {
        let (mu, nu) = (m as usize, n as usize);
        let partial_len = if reduce == Reduce::Global && splits > 1 {
            splits as usize * mu * nu
        } else {
            1
        };
        let partial = stream.alloc_zeros::<f32>(partial_len).call("cuMemAlloc")?;
        let counters = stream
            .alloc_zeros::<u32>((nu / 16).max(1))
            .call("cuMemAlloc")?;
        let y = stream
            .alloc_zeros::<f32>((mu * nu).max(1))
            .call("cuMemAlloc")?;
        Ok(GemvOutputs {
            partial,
            counters,
            y,
            m,
            n,
            splits,
        })
    }

    /// The params of the GEMV of `m x k` activations at `x` and `n x k` weights at `w` (device
    /// addresses) into these outputs, not recorded on the timeline.
    pub(crate) fn params(&self, stream: &CudaStream, x: u64, w: u64, k: u32) -> GemvParams {
        GemvParams {
            x,
            w,
            partial: self.partial.device_ptr(stream).0,
            y: self.y.device_ptr(stream).0,
            counters: self.counters.device_ptr(stream).0,
            m: self.m,
            n: self.n,
            k,
            splits: self.splits,
            timeline: fetchahead_gpu::params::TimelineParams::OFF,
        }
    }
}

/// `y[m, n] = sum_k x[m, k] * w[n, k]`: bf16 `x` and `w`, f32 `y`, in device memory.
#[derive(Debug)]
pub struct Gemv {
    x: CudaSlice<u16>,
    w: CudaSlice<u16>,
    partial: CudaSlice<f32>,
    /// One arrival counter per 16 weight rows for the split-K epilogue (zero between launches).
    _counters: CudaSlice<u32>,
    y: CudaSlice<f32>,
    params: GemvParams,
    variant: usize,
}

impl Gemv {
    /// Copies `x` (`m x k`) and `w` (`n x k`) to the device on `stream`, with output buffers,
    /// launched as [`GemvLaunch::default_for`] picks.
    pub fn new(
        kernels: &LabKernels,
        stream: &Arc<CudaStream>,
        x: &[bf16],
        w: &[bf16],
        m: u32,
        k: u32,
    ) -> Result<Gemv> {
        let n = if k == 0 {
            0
        } else {
            (w.len() / k as usize) as u32
        };
        let launch = GemvLaunch::default_for(kernels, m, n, k)?;
        Gemv::with_launch(stream, x, w, m, k, launch)
    }

    /// As [`Gemv::new`], launched as `launch` says.
    pub fn with_launch(
        stream: &Arc<CudaStream>,
        x: &[bf16],
        w: &[bf16],
        m: u32,
        k: u32,
        launch: GemvLaunch,
    ) -> Result<Gemv> {
        let (mu, ku) = (m as usize, k as usize);
        if ku == 0 || x.len() != mu * ku || !w.len().is_multiple_of(ku) {
            return Err(Error::invalid(
                "gemv",
                format!(
                    "x of {} and w of {} elements for m = {m}, k = {k}",
                    x.len(),
                    w.len()
                ),
            ));
        }
        let n = u32::try_from(w.len() / ku)
            .map_err(|_| Error::invalid("gemv", format!("{} weight rows", w.len() / ku)))?;
        let GemvLaunch { variant, splits } = launch;
        let reduce = LabKernels::gemv_variant_at(variant)?.reduce;
        let bits = |v: &[bf16]| v.iter().map(|b| b.to_bits()).collect::<Vec<u16>>();
        let x = stream.clone_htod(&bits(x)).call("cuMemcpyHtoD")?;
        let w = stream.clone_htod(&bits(w)).call("cuMemcpyHtoD")?;
        let outputs = GemvOutputs::alloc(stream, reduce, m, n, splits)?;
        let params = outputs.params(stream, x.device_ptr(stream).0, w.device_ptr(stream).0, k);
        let GemvOutputs {
            partial,
            counters,
            y,
            ..
        } = outputs;
        Ok(Gemv {
            x,
            w,
            partial,
            _counters: counters,
            y,
            params,
            variant,
        })
    }

    /// Device address and bytes of the weights: what a plan learns.
    pub fn weights(&self) -> (u64, u64) {
        (self.params.w, self.w.len() as u64 * 2)
    }

    pub fn params(&self) -> GemvParams {
        self.params
    }

    pub fn launch_config(&self) -> GemvLaunch {
        GemvLaunch {
            variant: self.variant,
            splits: self.params.splits,
        }
    }

    /// Launches the GEMV on `stream` (raw addresses, nothing allocated or recorded: capturable).
    pub fn launch(
        &self,
        kernels: &LabKernels,
        stream: &CudaStream,
        policy: Option<AccessWindow>,
    ) -> Result<()> {
        // SAFETY: the buffers are this struct's own allocations of the sizes the params name,
        // alive while it is; y and partial are written only by this GEMV's launches.
        unsafe { kernels.launch_gemv(stream.cu_stream(), self.variant, self.params, policy) }
    }

    /// Fills `y` with NaN bits (0xFF bytes) so that an unwritten element shows.
    pub fn poison(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        fetchahead::selfcheck::poison(stream, &mut self.y)
    }

    /// Copies `y` back (waits for `stream`).
    pub fn read_y(&self, stream: &Arc<CudaStream>) -> Result<Vec<f32>> {
        let y = stream.clone_dtoh(&self.y).call("cuMemcpyDtoH")?;
        stream.synchronize().call("cuStreamSynchronize")?;
        Ok(y)
    }

    /// The activations' device buffer (kept alive with the weights).
    pub fn x_len(&self) -> usize {
        self.x.len()
    }

    /// Bytes of the split-K partial buffer.
    pub fn partial_bytes(&self) -> usize {
        self.partial.len() * 4
    }
}
