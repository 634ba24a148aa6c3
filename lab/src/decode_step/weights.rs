//! The step's readers: one bf16 GEMV per reader of every window, each over weights of its own.
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use fetchahead_gpu::params::GemvParams;
use half::bf16;
use rand::{RngExt, SeedableRng, rngs::SmallRng};

use crate::LabKernels;
use crate::gemv::{GemvLaunch, GemvOutputs};
use fetchahead::error::CudaCall;
use fetchahead::{Error, Result};

use super::{DecodeShape, Matrix, WindowRole, WindowSpec};

/// One reader: the crate's bf16 GEMV (`y = x w^T`, the variant and K splits the host picks)
/// over weights of its own. Its activations `x` are the step's shared activations of its K, as
/// every projection after a collective reads that collective's output, so they stay in L2 as
/// in an engine and the reader waits on DRAM for its weights alone.
///
/// Beside it, its shadow: the same GEMV over the same weights and activations into outputs of
/// its own, which the step runs on a side branch to warm the reader by hand
/// ([`StepConfig::FloorHand`](super::StepConfig::FloorHand)).
pub struct Reader {
    run: ReaderRun,
    shadow: ReaderRun,
    /// Read by both runs: dropped after them.
    _w: CudaSlice<u16>,
}

/// One GEMV launch's outputs and params.
struct ReaderRun {
    _partial: CudaSlice<f32>,
    /// Zero between launches (the split-K epilogue's arrival counters).
    _counters: CudaSlice<u32>,
    y: CudaSlice<f32>,
    params: GemvParams,
    variant: usize,
}

impl ReaderRun {
    /// Outputs on `stream` for the GEMV `variant` with `splits` of `m x k` activations at `x` and
    /// `n x k` weights at `w`.
    fn new(
        stream: &Arc<CudaStream>,
        GemvLaunch { variant, splits }: GemvLaunch,
        (x, w): (u64, u64),
        (m, n, k): (u32, u32, u32),
    ) -> Result<ReaderRun> {
        let reduce = LabKernels::gemv_variant_at(variant)?.reduce;
        let outputs = GemvOutputs::alloc(stream, reduce, m, n, splits)?;
        let params = outputs.params(stream, x, w, k);
        let GemvOutputs {
            partial,
            counters,
            y,
            ..
        } = outputs;
        Ok(ReaderRun {
            _partial: partial,
            _counters: counters,
            y,
            params,
            variant,
        })
    }

    fn launch(&self, kernels: &LabKernels, stream: &CudaStream) -> Result<()> {
        // SAFETY: w and x are the owning reader's weights and activations, alive while it is;
        // y, partial and counters are this run's own allocations of the sizes the params name
        // (as `Gemv` sizes them), written by this run's launches alone, one at a time on the
        // stream.
        unsafe { kernels.launch_gemv(stream.cu_stream(), self.variant, self.params, None) }
    }
}

impl Reader {
    /// Copies `w` (`n x k` bf16) to the device on `stream`, with outputs for it and its shadow,
    /// reading the `m x k` activations at `x` (a live device allocation that outlives the
    /// reader).
    fn new(
        kernels: &LabKernels,
        stream: &Arc<CudaStream>,
        x: u64,
        w: &[bf16],
        m: u32,
        k: u32,
    ) -> Result<Reader> {
        let n = u32::try_from(w.len() / k.max(1) as usize)
            .map_err(|_| Error::invalid("reader", format!("{} weights", w.len())))?;
        let launch = GemvLaunch::default_for(kernels, m, n, k)?;
        let bits: Vec<u16> = w.iter().map(|b| b.to_bits()).collect();
        let w = stream.clone_htod(&bits).call("cuMemcpyHtoD")?;
        let address = w.device_ptr(stream).0;
        Ok(Reader {
            run: ReaderRun::new(stream, launch, (x, address), (m, n, k))?,
            shadow: ReaderRun::new(stream, launch, (x, address), (m, n, k))?,
            _w: w,
        })
    }

    /// Device address and bytes of the weights: what the plan learns.
    pub fn weights(&self) -> (u64, u64) {
        let p = self.run.params;
        (p.w, p.n as u64 * p.k as u64 * 2)
    }

    pub fn params(&self) -> GemvParams {
        self.run.params
    }

    /// Device address and bytes of the activations it reads (`m x k` bf16), shared with the
    /// step's other readers of its K: what a window's collective writes.
    pub fn activations(&self) -> (u64, u64) {
        let p = self.run.params;
        (p.x, p.m as u64 * p.k as u64 * 2)
    }

    /// Launches the reader on `stream` (raw addresses, nothing allocated: capturable).
    pub fn launch(&self, kernels: &LabKernels, stream: &CudaStream) -> Result<()> {
        self.run.launch(kernels, stream)
    }

    /// Launches its shadow on `stream`: the same GEMV into outputs of its own, which nothing
    /// reads, so that it may run beside the reader's own launches on another stream (capturable).
    pub fn launch_shadow(&self, kernels: &LabKernels, stream: &CudaStream) -> Result<()> {
        self.shadow.launch(kernels, stream)
    }

    /// Copies `y` back (waits for `stream`).
    pub fn read_y(&self, stream: &Arc<CudaStream>) -> Result<Vec<f32>> {
        let y = stream.clone_dtoh(&self.run.y).call("cuMemcpyDtoH")?;
        stream.synchronize().call("cuStreamSynchronize")?;
        Ok(y)
    }
}

/// The step's readers: one [`Reader`] per reader of every window, each over weights of its own,
/// and the activations they share (one buffer per K).
pub struct DecodeWeights {
    /// The readers' M.
    pub(super) tokens: u32,
    windows: Vec<WindowSpec>,
    /// `readers[w]`: window `w`'s readers, in order.
    readers: Vec<Vec<Reader>>,
    /// `matrices[w][r]`: what `readers[w][r]` reads.
    pub(super) matrices: Vec<Vec<Matrix>>,
    /// (K, `tokens x K` bf16): the activations of every reader of that K.
    _activations: Vec<(u32, CudaSlice<u16>)>,
}

impl DecodeWeights {
    /// Allocates and fills every reader's weights and the shared activations on `stream`
    /// (random bf16 from the shape's seed; each reader's weights a different stretch of one
    /// random pool).
    pub fn new(
        kernels: &LabKernels,
        stream: &Arc<CudaStream>,
        shape: &DecodeShape,
    ) -> Result<Self> {
        let windows = shape.schedule()?;
        const SLACK: usize = 1 << 16;
        let roles = [WindowRole::Gather, WindowRole::Attention, WindowRole::Moe];
        let largest = roles
            .iter()
            .flat_map(|&r| shape.readers(r))
            .map(|m| (m.rows as usize * m.k as usize).max(16 * m.k as usize))
            .max()
            .unwrap_or(0);
        let mut rng = SmallRng::seed_from_u64(shape.seed ^ 0x5EED);
        let pool: Vec<bf16> = (0..largest + SLACK)
            .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
            .collect();
        let m = shape.tokens;
        let mut activations: Vec<(u32, CudaSlice<u16>)> = Vec::new();
        for k in roles.iter().flat_map(|&r| shape.readers(r)).map(|m| m.k) {
            if activations.iter().all(|(have, _)| *have != k) {
                let x: Vec<u16> = pool[(k as usize * 7) % SLACK..][..m as usize * k as usize]
                    .iter()
                    .map(|b| b.to_bits())
                    .collect();
                activations.push((k, stream.clone_htod(&x).call("cuMemcpyHtoD")?));
            }
        }
        let x_of = |k: u32| {
            activations
                .iter()
                .find(|(have, _)| *have == k)
                .map(|(_, x)| x.device_ptr(stream).0)
                .ok_or_else(|| Error::invalid("reader", format!("no activations of k = {k}")))
        };
        let mut readers = Vec::with_capacity(windows.len());
        let mut matrices = Vec::with_capacity(windows.len());
        let mut i = 0usize;
        for w in &windows {
            let mut window = Vec::new();
            for matrix in shape.readers(w.role) {
                let off = (i * 4099) % SLACK;
                let weights = &pool[off..][..matrix.rows as usize * matrix.k as usize];
                window.push(Reader::new(
                    kernels,
                    stream,
                    x_of(matrix.k)?,
                    weights,
                    m,
                    matrix.k,
                )?);
                i += 1;
            }
            readers.push(window);
            matrices.push(shape.readers(w.role).to_vec());
        }
        stream.synchronize().call("cuStreamSynchronize")?;
        Ok(DecodeWeights {
            tokens: m,
            windows,
            readers,
            matrices,
            _activations: activations,
        })
    }

    pub fn windows(&self) -> &[WindowSpec] {
        &self.windows
    }

    /// Window `w`'s readers and what each reads.
    pub fn readers(&self, w: usize) -> impl Iterator<Item = (&Reader, &Matrix)> {
        let gemvs = self.readers.get(w).map_or(&[][..], |v| v);
        let matrices = self.matrices.get(w).map_or(&[][..], |v| v);
        gemvs.iter().zip(matrices)
    }

    /// Bytes every reader of the step reads.
    pub fn bytes(&self) -> u64 {
        self.matrices.iter().flatten().map(Matrix::bytes).sum()
    }
}
