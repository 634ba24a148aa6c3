//! A simulated decode step at DeepSeek scale with both of the crate's features: what fetchahead
//! buys per step.
//!
//! The step: the Engram hash of the step's tokens (and the Engram prefetches right after it),
//! then per layer its collectives, each a simulated collective kernel ([`LabKernels::launch_collective`])
//! followed by weight-bound readers of the next weights (the crate's bf16 GEMV over weights of
//! DeepSeek-V3's projection shapes per tensor-parallel rank), spin kernels for the rest of each
//! layer's compute before each collective, and at the end of each Engram layer its gather of the
//! looked-up rows. Every reader reads weights of its own: the step's weights are far larger than
//! L2, so that without the plan every reader starts cold, as in a real step.
//!
//! Four configurations ([`StepConfig`]): neither feature (the synchronous Engram lookup at the
//! gather, no L2 plan), the Engram prefetcher only, the L2 plan only, both; and the floors the
//! Engram stall is measured from (rows resident on the device, with and without the plan). Each
//! runs eagerly or from a captured CUDA graph; outputs (every reader's and every Engram layer's)
//! are bit-identical across them ([`StepOutputs`]).
//!
//! [`SparkModel`] projects the measured step to the DGX Spark (GB10); its assumptions are listed
//! in [`SparkModel::assumptions`].
use std::sync::Arc;

use cudarc::driver::{CudaGraph, CudaSlice, CudaStream, DevicePtr, sys};
use fetchahead_gpu::gemv::Reduce;
use fetchahead_gpu::l2_prefetch;
use fetchahead_gpu::params::{GemvParams, PrefetchParams, Segment};
use fetchahead_gpu::timeline::NO_LABEL;
use half::bf16;
use rand::{RngExt, SeedableRng, rngs::SmallRng};

use crate::LabKernels;
use crate::forward::{
    EngramLayers, FlagLanes, ForwardShape, GatherPath, LayerTable, StepClock, StepTime,
};
use crate::gemv::GemvLaunch;
use fetchahead::error::CudaCall;
use fetchahead::l2_plan::window_fit::{MEASURES, TAIL, WindowFit};
use fetchahead::l2_plan::{
    CollectiveKind, L2Plan, PlanConfig, SEGMENT_PIECE, SegmentTable, Signature, default_budget,
};
use fetchahead::prefetch::prefetcher::{Completion, Join, PrefetcherConfig, Stats};
use fetchahead::{Error, Result};

const MIB: f64 = (1u64 << 20) as f64;

/// The GPU's lead-in before a timed decode step's start event, microseconds: longer than the
/// CPU's eager enqueue of a whole step (a few hundred launches), so that the step's GPU time
/// holds no wait for the CPU ([`StepTime::lead_in_overrun`] says when it did not suffice).
pub const DECODE_LEAD_IN_US: u64 = 10_000;

/// CTAs of each simulated collective (a decode all-reduce or all-gather runs on 1-8).
pub const COLLECTIVE_BLOCKS: u32 = 4;

/// A weight matrix a reader reads: `rows x k` bf16, `y = x w^T`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Matrix {
    pub name: &'static str,
    pub rows: u32,
    pub k: u32,
}

impl Matrix {
    pub fn bytes(&self) -> u64 {
        self.rows as u64 * self.k as u64 * 2
    }
}

/// Which collective a window is, and so which weights its readers read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WindowRole {
    /// An all-gather of the attention's output: the o_proj shard reads next.
    Gather,
    /// The layer's first all-reduce (after attention): the MoE block's entry reads next.
    Attention,
    /// A further all-reduce (after the MoE block): the next layer's attention input reads next.
    Moe,
}

impl WindowRole {
    pub fn is_all_reduce(self) -> bool {
        self != WindowRole::Gather
    }

    /// Mean length relative to an all-gather: an all-reduce (reduce-scatter + all-gather)
    /// moves twice the bytes.
    fn weight(self) -> f64 {
        if self.is_all_reduce() { 2.0 } else { 1.0 }
    }
}

/// One collective of the step and the layer it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSpec {
    /// 1-based.
    pub layer: u32,
    pub role: WindowRole,
    /// How long the collective polls.
    pub ns: u64,
}

/// The simulated model and step.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeShape {
    pub layers: u32,
    /// All-reduces in a step: one per layer after attention, the rest spread over the layers.
    pub all_reduces: u32,
    pub all_gathers: u32,
    /// Microseconds the step spends inside collectives, all windows together.
    pub collectives_us: u64,
    /// Each window's length is its role's mean times a factor drawn uniformly from this range
    /// (then all are scaled to `collectives_us`).
    pub spread: (f64, f64),
    /// Spin compute per layer, microseconds, split evenly before the layer's collectives.
    pub compute_us: u64,
    /// Tokens per step on this rank: the readers' M (1..=16) and the Engram hash's tokens.
    pub tokens: u32,
    /// The Engram layers (1-based, sorted, distinct), each gathering at the end of the layer.
    pub engram_layers: Vec<u32>,
    /// Engram ids per token per layer, and tokens each id hashes.
    pub heads: u32,
    pub ngram: u32,
    pub seed: u64,
    /// What each role's readers read, in order.
    pub after_gather: Vec<Matrix>,
    pub after_attention: Vec<Matrix>,
    pub after_moe: Vec<Matrix>,
}

/// DeepSeek-V3's hidden size.
const HIDDEN: u32 = 7168;

impl DecodeShape {
    /// A DeepSeek-V3-class decode step on one of 8 tensor-parallel ranks: 61 layers; the origin
    /// story's 89 all-reduces and 49 all-gathers, 3.6 ms in all; 8 tokens a step; Engram
    /// layers 2 and 15; each layer 680 us of other compute, so that the step is about the
    /// origin story's 48 ms. Readers (bf16; DeepSeek-V3 ships FP8 weights, the crate's reader
    /// is a bf16 GEMV, so every read is twice the FP8 bytes):
    /// - after an all-gather: the o_proj shard, [7168, 128 heads x 128 / 8] = 28 MiB;
    /// - after a layer's first all-reduce: the MoE router [256, 7168] (3.5 MiB), then the
    ///   shared expert's gate and up shard [2 x 2048 / 8, 7168] (7 MiB);
    /// - after a further all-reduce: the next layer's MLA down-projections, q_a and kv_a
    ///   [1536 + 576, 7168], replicated on every rank (28.9 MiB).
    pub fn deepseek() -> DecodeShape {
        DecodeShape {
            layers: 61,
            all_reduces: 89,
            all_gathers: 49,
            collectives_us: 3600,
            spread: (0.5, 1.5),
            compute_us: 680,
            tokens: 8,
            engram_layers: vec![2, 15],
            heads: 8,
            ngram: 3,
            seed: 17,
            after_gather: vec![Matrix {
                name: "o_proj / 8",
                rows: HIDDEN,
                k: 128 * 128 / 8,
            }],
            after_attention: vec![
                Matrix {
                    name: "router",
                    rows: 256,
                    k: HIDDEN,
                },
                Matrix {
                    name: "shared gate+up / 8",
                    rows: 2 * 2048 / 8,
                    k: HIDDEN,
                },
            ],
            after_moe: vec![Matrix {
                name: "q_a + kv_a",
                rows: 1536 + 576,
                k: HIDDEN,
            }],
        }
    }

    /// The readers of a window of `role`.
    pub fn readers(&self, role: WindowRole) -> &[Matrix] {
        match role {
            WindowRole::Gather => &self.after_gather,
            WindowRole::Attention => &self.after_attention,
            WindowRole::Moe => &self.after_moe,
        }
    }

    /// The Engram side's shape (the hash and the Engram layers) for [`EngramLayers`].
    pub fn forward_shape(&self) -> ForwardShape {
        ForwardShape {
            layers: self.layers,
            engram_layers: self.engram_layers.clone(),
            compute_us: self.compute_us,
            heads: self.heads,
            ngram: self.ngram,
            seed: self.seed,
        }
    }

    /// Refuses a shape the step cannot run (the Engram layers are checked with the tables).
    pub fn check(&self) -> Result<()> {
        let bad = |why: String| Err(Error::invalid("decode step", why));
        if self.layers == 0 || self.all_reduces < self.layers {
            return bad(format!(
                "{} layers and {} all-reduces: want at least one layer and one all-reduce a layer",
                self.layers, self.all_reduces
            ));
        }
        if self.tokens == 0 || self.tokens > 16 {
            return bad(format!("{} tokens a step, want 1..=16", self.tokens));
        }
        let (lo, hi) = self.spread;
        if !(lo > 0.0 && hi >= lo && hi.is_finite()) {
            return bad(format!("window spread {lo}..{hi}: want 0 < low <= high"));
        }
        if self.collectives_us == 0 {
            return bad("no time in collectives".into());
        }
        for role in [WindowRole::Gather, WindowRole::Attention, WindowRole::Moe] {
            let readers = self.readers(role);
            if readers.is_empty() {
                return bad(format!("no reader after a {role:?} window"));
            }
            if let Some(m) = readers
                .iter()
                .find(|m| m.rows == 0 || m.rows % 16 != 0 || m.k == 0 || m.k % 32 != 0)
            {
                return bad(format!(
                    "{} is [{}, {}]: want rows a positive multiple of 16, k of 32",
                    m.name, m.rows, m.k
                ));
            }
        }
        Ok(())
    }

    /// The step's collectives in order, drawn from the seed: each layer's all-gathers, its
    /// attention all-reduce, then its further all-reduces; the extra all-reduces and the
    /// all-gathers go to layers drawn uniformly; lengths are each role's mean (an all-reduce
    /// twice an all-gather) times a factor drawn from `spread`, scaled so that they add up to
    /// `collectives_us`.
    pub fn schedule(&self) -> Result<Vec<WindowSpec>> {
        self.check()?;
        let mut rng = SmallRng::seed_from_u64(self.seed);
        let layers = self.layers as usize;
        let mut gathers = vec![0u32; layers];
        let mut moe = vec![0u32; layers];
        for _ in 0..self.all_gathers {
            gathers[rng.random_range(0..layers)] += 1;
        }
        for _ in self.layers..self.all_reduces {
            moe[rng.random_range(0..layers)] += 1;
        }
        let mut roles = Vec::new();
        for l in 0..layers {
            let layer = l as u32 + 1;
            let push = |roles: &mut Vec<(u32, WindowRole)>, role, n| {
                roles.extend((0..n).map(|_| (layer, role)));
            };
            push(&mut roles, WindowRole::Gather, gathers[l]);
            push(&mut roles, WindowRole::Attention, 1);
            push(&mut roles, WindowRole::Moe, moe[l]);
        }
        let (lo, hi) = self.spread;
        let lengths: Vec<f64> = roles
            .iter()
            .map(|(_, role)| {
                role.weight()
                    * if hi > lo {
                        rng.random_range(lo..hi)
                    } else {
                        lo
                    }
            })
            .collect();
        let scale = self.collectives_us as f64 * 1e3 / lengths.iter().sum::<f64>();
        Ok(roles
            .iter()
            .zip(&lengths)
            .map(|(&(layer, role), len)| WindowSpec {
                layer,
                role,
                ns: (len * scale).round().max(1.0) as u64,
            })
            .collect())
    }

    /// The lines that state the step's sizes and assumptions (for the bench and the demo).
    pub fn describe(&self, windows: &[WindowSpec]) -> Vec<String> {
        let count = |role| windows.iter().filter(|w| w.role == role).count();
        let total_ns: u64 = windows.iter().map(|w| w.ns).sum();
        let (min, max) = windows
            .iter()
            .fold((u64::MAX, 0), |(a, b), w| (a.min(w.ns), b.max(w.ns)));
        let bytes: u64 = windows
            .iter()
            .map(|w| self.readers(w.role).iter().map(Matrix::bytes).sum::<u64>())
            .sum();
        let readers = |role| {
            self.readers(role)
                .iter()
                .map(|m| {
                    format!(
                        "{} [{} x {}] {:.1} MiB",
                        m.name,
                        m.rows,
                        m.k,
                        m.bytes() as f64 / MIB
                    )
                })
                .collect::<Vec<_>>()
                .join(" then ")
        };
        vec![
            format!(
                "decode step: {} layers, {} all-reduce and {} all-gather windows ({:.2} ms in all, \
                 {:.1}-{:.1} us each, drawn from seed {}), {} us of spin compute a layer, {} \
                 tokens a step (the readers' M), Engram layers {:?} ({} ids a token each)",
                self.layers,
                count(WindowRole::Attention) + count(WindowRole::Moe),
                count(WindowRole::Gather),
                total_ns as f64 / 1e6,
                min as f64 / 1e3,
                max as f64 / 1e3,
                self.seed,
                self.compute_us,
                self.tokens,
                self.engram_layers,
                self.heads
            ),
            format!(
                "readers (bf16 GEMV, weights of DeepSeek-V3 shapes per rank of 8; each window's \
                 weights its own, {:.2} GiB a step, so every read is cold without the plan; the \
                 activations one buffer per K, read by every reader, so they stay in L2 as a \
                 collective's output would): after an all-gather: {}; after a layer's first \
                 all-reduce: {}; after a further all-reduce: {}",
                bytes as f64 / (MIB * 1024.0),
                readers(WindowRole::Gather),
                readers(WindowRole::Attention),
                readers(WindowRole::Moe)
            ),
        ]
    }
}

/// One reader: the crate's bf16 GEMV (`y = x w^T`, the variant and K splits the host picks)
/// over weights of its own. Its activations `x` are the step's shared activations of its K, as
/// every projection after a collective reads that collective's output, so they stay in L2 as
/// in an engine and the reader waits on DRAM for its weights alone.
pub struct Reader {
    _w: CudaSlice<u16>,
    _partial: CudaSlice<f32>,
    /// Zero between launches (the split-K epilogue's arrival counters).
    _counters: CudaSlice<u32>,
    y: CudaSlice<f32>,
    params: GemvParams,
    variant: usize,
}

impl Reader {
    /// Copies `w` (`n x k` bf16) to the device on `stream`, with outputs, reading the `m x k`
    /// activations at `x` (a live device allocation that outlives the reader).
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
        let GemvLaunch { variant, splits } = GemvLaunch::default_for(kernels, m, n, k)?;
        let reduce = LabKernels::gemv_variant_at(variant)?.reduce;
        let bits: Vec<u16> = w.iter().map(|b| b.to_bits()).collect();
        let w = stream.clone_htod(&bits).call("cuMemcpyHtoD")?;
        let partial_len = if reduce == Reduce::Global && splits > 1 {
            splits as usize * m as usize * n as usize
        } else {
            1
        };
        let partial = stream.alloc_zeros::<f32>(partial_len).call("cuMemAlloc")?;
        let counters = stream
            .alloc_zeros::<u32>((n as usize / 16).max(1))
            .call("cuMemAlloc")?;
        let y = stream
            .alloc_zeros::<f32>((m as usize * n as usize).max(1))
            .call("cuMemAlloc")?;
        let params = GemvParams {
            x,
            w: w.device_ptr(stream).0,
            partial: partial.device_ptr(stream).0,
            y: y.device_ptr(stream).0,
            counters: counters.device_ptr(stream).0,
            m,
            n,
            k,
            splits,
            timeline: fetchahead_gpu::params::TimelineParams::OFF,
        };
        Ok(Reader {
            _w: w,
            _partial: partial,
            _counters: counters,
            y,
            params,
            variant,
        })
    }

    /// Device address and bytes of the weights: what the plan learns.
    pub fn weights(&self) -> (u64, u64) {
        (
            self.params.w,
            self.params.n as u64 * self.params.k as u64 * 2,
        )
    }

    pub fn params(&self) -> GemvParams {
        self.params
    }

    /// Launches the reader on `stream` (raw addresses, nothing allocated: capturable).
    pub fn launch(&self, kernels: &LabKernels, stream: &CudaStream) -> Result<()> {
        // SAFETY: w, y, partial and counters are this reader's own allocations of the sizes the
        // params name (as `Gemv` sizes them), alive while it is; x is its weights' owner's
        // activations of m x k bf16, alive as long; y, partial and counters are written by this
        // reader's launches alone, one at a time on the stream.
        unsafe { kernels.launch_gemv(stream.cu_stream(), self.variant, self.params, None) }
    }

    /// Copies `y` back (waits for `stream`).
    pub fn read_y(&self, stream: &Arc<CudaStream>) -> Result<Vec<f32>> {
        let y = stream.clone_dtoh(&self.y).call("cuMemcpyDtoH")?;
        stream.synchronize().call("cuStreamSynchronize")?;
        Ok(y)
    }
}

/// The step's readers: one [`Reader`] per reader of every window, each over weights of its own,
/// and the activations they share (one buffer per K).
pub struct DecodeWeights {
    /// The readers' M.
    tokens: u32,
    windows: Vec<WindowSpec>,
    /// `readers[w]`: window `w`'s readers, in order.
    readers: Vec<Vec<Reader>>,
    /// `matrices[w][r]`: what `readers[w][r]` reads.
    matrices: Vec<Vec<Matrix>>,
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

/// Which features a step runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StepConfig {
    /// Engram rows resident on the device (no lookup), no plan: the floor of the plan-off steps.
    Floor,
    /// Rows resident, with the L2 plan: the floor of the plan-on steps.
    FloorPlan,
    /// Neither feature: each Engram layer looks its rows up synchronously at its gather.
    Neither,
    /// The Engram prefetcher only.
    Prefetcher,
    /// The L2 plan only.
    Plan,
    /// Both.
    Both,
}

impl StepConfig {
    pub const ALL: [StepConfig; 6] = [
        StepConfig::Floor,
        StepConfig::FloorPlan,
        StepConfig::Neither,
        StepConfig::Prefetcher,
        StepConfig::Plan,
        StepConfig::Both,
    ];

    pub fn gather(self) -> GatherPath {
        match self {
            StepConfig::Floor | StepConfig::FloorPlan => GatherPath::Resident,
            StepConfig::Neither | StepConfig::Plan => GatherPath::Sync,
            StepConfig::Prefetcher | StepConfig::Both => GatherPath::Prefetch,
        }
    }

    pub fn l2_plan(self) -> bool {
        matches!(
            self,
            StepConfig::FloorPlan | StepConfig::Plan | StepConfig::Both
        )
    }

    /// The floor this configuration's Engram stall is measured from.
    pub fn floor(self) -> StepConfig {
        if self.l2_plan() {
            StepConfig::FloorPlan
        } else {
            StepConfig::Floor
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            StepConfig::Floor => "floor (rows resident)",
            StepConfig::FloorPlan => "floor + L2 plan",
            StepConfig::Neither => "neither",
            StepConfig::Prefetcher => "Engram prefetcher only",
            StepConfig::Plan => "L2 plan only",
            StepConfig::Both => "both",
        }
    }

    /// A short name for criterion's ids.
    pub fn id(self) -> &'static str {
        match self {
            StepConfig::Floor => "floor",
            StepConfig::FloorPlan => "floor_plan",
            StepConfig::Neither => "neither",
            StepConfig::Prefetcher => "prefetcher",
            StepConfig::Plan => "plan",
            StepConfig::Both => "both",
        }
    }
}

/// A step's outputs copied back: every reader's `y` (as bits) and every Engram layer's rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepOutputs {
    pub readers: Vec<Vec<u32>>,
    pub engram: Vec<Vec<u16>>,
}

impl StepOutputs {
    /// Where `self` and `other` first differ (`None`: bit-identical).
    pub fn first_difference(&self, other: &StepOutputs) -> Option<String> {
        if self.readers.len() != other.readers.len() || self.engram.len() != other.engram.len() {
            return Some("different numbers of outputs".into());
        }
        if let Some(i) = (0..self.readers.len()).find(|&i| self.readers[i] != other.readers[i]) {
            return Some(format!("reader {i}'s output"));
        }
        (0..self.engram.len())
            .find(|&k| self.engram[k] != other.engram[k])
            .map(|k| format!("Engram layer {k}'s rows"))
    }
}

/// A decode step on one stream: the Engram layers, the readers (shared), the L2 plan.
pub struct DecodeStep {
    kernels: Arc<LabKernels>,
    main: Arc<CudaStream>,
    shape: DecodeShape,
    weights: Arc<DecodeWeights>,
    engram: EngramLayers,
    plan: L2Plan,
    signature: Signature,
    clock: StepClock,
    /// Spin nanoseconds before each window of a layer (the layer's compute split evenly).
    compute_ns: Vec<u64>,
}

impl DecodeStep {
    /// A step over `weights` (built from `shape`) on `main`, with one Engram table per Engram
    /// layer; the prefetchers complete through one shared flag lane (`Completion::Flag`,
    /// `FlagLanes::Shared`, the mode measured best), their gathers wait for tagged rows
    /// (`Join::Tags`: the step joins their side stream once, at its end) and the plan has the
    /// device's defaults
    /// (`PlanConfig::for_l2`, `Replay::Auto`).
    pub fn new(
        kernels: Arc<LabKernels>,
        main: Arc<CudaStream>,
        tables: &[Arc<dyn LayerTable>],
        shape: DecodeShape,
        weights: Arc<DecodeWeights>,
    ) -> Result<DecodeStep> {
        Self::with_join(kernels, main, tables, shape, weights, Join::Tags)
    }

    /// As [`DecodeStep::new`], the prefetchers' gathers waiting for their rows the way `join`
    /// says (the bench compares the two).
    pub fn with_join(
        kernels: Arc<LabKernels>,
        main: Arc<CudaStream>,
        tables: &[Arc<dyn LayerTable>],
        shape: DecodeShape,
        weights: Arc<DecodeWeights>,
        join: Join,
    ) -> Result<DecodeStep> {
        let same_readers = weights
            .matrices
            .iter()
            .zip(weights.windows())
            .all(|(m, w)| m.as_slice() == shape.readers(w.role));
        if weights.windows() != shape.schedule()?.as_slice()
            || weights.tokens != shape.tokens
            || !same_readers
        {
            return Err(Error::invalid(
                "decode step",
                "the weights were built for another shape",
            ));
        }
        // Tags: the gathers wait for their rows in the kernel, and the step joins the side
        // stream once at its end, which saves each Engram layer 2-3 us in a replayed graph.
        let prefetch = PrefetcherConfig {
            completion: Completion::Flag,
            join,
            ..Default::default()
        };
        let engram = EngramLayers::new(
            kernels.clone(),
            &main,
            tables,
            &shape.forward_shape(),
            shape.tokens as usize,
            prefetch,
            FlagLanes::Shared,
        )?;
        let plan = L2Plan::new(
            kernels.product().clone(),
            main.clone(),
            PlanConfig::from_env(kernels.gpu().l2_bytes)?,
        )?;
        let compute_ns = (1..=shape.layers)
            .map(|l| {
                let n = weights.windows().iter().filter(|w| w.layer == l).count() as u64;
                shape.compute_us * 1000 / n.max(1)
            })
            .collect();
        let clock = StepClock::new(&main)?;
        main.synchronize().call("cuStreamSynchronize")?;
        Ok(DecodeStep {
            signature: Signature::new(shape.tokens, 17),
            kernels,
            main,
            shape,
            weights,
            engram,
            plan,
            clock,
            compute_ns,
        })
    }

    pub fn shape(&self) -> &DecodeShape {
        &self.shape
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.main
    }

    pub fn weights(&self) -> &Arc<DecodeWeights> {
        &self.weights
    }

    pub fn plan(&self) -> &L2Plan {
        &self.plan
    }

    pub fn kernels(&self) -> &Arc<LabKernels> {
        &self.kernels
    }

    /// Writes the next step's tokens (at most `shape.tokens`).
    pub fn set_tokens(&mut self, tokens: &[u32]) -> Result<()> {
        self.engram.set_tokens(&self.main, tokens)
    }

    /// Enqueues one step on the stream: capturable. With the plan, the plan learns in its first
    /// eager steps and fits its windows over the next three (`l2_plan/window_fit.rs`); call
    /// [`DecodeStep::warm_plan`] before timing or capturing.
    pub fn enqueue(&mut self, config: StepConfig) -> Result<()> {
        let s = self.main.cu_stream();
        let path = config.gather();
        let n_tokens = self.shape.tokens as usize;
        let plan = config.l2_plan();
        if plan {
            self.plan.begin_forward(self.signature)?;
        }
        self.kernels.set_timeline_label(NO_LABEL);
        // SAFETY: `s` is this step's own stream, given to every call of the step.
        unsafe { self.engram.enqueue_head(path, n_tokens, s)? };
        let mut w = 0;
        let windows = self.weights.windows();
        for l in 1..=self.shape.layers {
            let compute_ns = self.compute_ns[l as usize - 1];
            let mut spun = false;
            while let Some(window) = windows.get(w).filter(|x| x.layer == l) {
                // The device timeline labels the window's launches (and the next gather) with it.
                self.kernels.set_timeline_label(w as u32);
                // SAFETY: this step's stream.
                unsafe { self.kernels.launch_spin(s, compute_ns)? };
                spun = true;
                if plan {
                    let kind = if window.role.is_all_reduce() {
                        CollectiveKind::AllReduce
                    } else {
                        CollectiveKind::AllGather
                    };
                    self.plan.collective_of(kind)?;
                }
                // SAFETY: no flag is polled.
                unsafe {
                    self.kernels
                        .launch_collective(s, COLLECTIVE_BLOCKS, window.ns, 0)?
                };
                for (gemv, _) in self.weights.readers(w) {
                    if plan {
                        let (address, bytes) = gemv.weights();
                        self.plan.consume(address, bytes)?;
                    }
                    gemv.launch(&self.kernels, &self.main)?;
                }
                w += 1;
            }
            if !spun {
                // SAFETY: this step's stream.
                unsafe { self.kernels.launch_spin(s, compute_ns)? };
            }
            if let Some(k) = self.shape.engram_layers.iter().position(|&e| e == l) {
                // SAFETY: the head above was enqueued on `s` with this path and token count.
                unsafe { self.engram.enqueue_gather(k, path, n_tokens, s)? };
            }
        }
        // SAFETY: this step's stream, given to its gathers.
        unsafe { self.engram.finish(path, s)? };
        self.kernels.set_timeline_label(NO_LABEL);
        if plan {
            self.plan.end_forward()?;
        }
        Ok(())
    }

    /// Eager steps with the plan until it has learned and fitted every window (one to learn,
    /// three to time the windows), rows resident; waits for each.
    pub fn warm_plan(&mut self) -> Result<()> {
        for _ in 0..1 + MEASURES {
            self.enqueue(StepConfig::FloorPlan)?;
            self.main.synchronize().call("cuStreamSynchronize")?;
        }
        Ok(())
    }

    /// One eager step behind the lead-in, between timing events.
    pub fn time(&mut self, config: StepConfig) -> Result<StepTime> {
        let started = self
            .clock
            .begin(&self.kernels, &self.main, DECODE_LEAD_IN_US)?;
        self.enqueue(config)?;
        self.clock.finish(&self.main, started)
    }

    /// One launch of `graph` (captured from this step) behind the lead-in, between timing
    /// events.
    pub fn time_replay(&mut self, graph: &CudaGraph) -> Result<StepTime> {
        let started = self
            .clock
            .begin(&self.kernels, &self.main, DECODE_LEAD_IN_US)?;
        graph.launch().call("cuGraphLaunch")?;
        self.clock.finish(&self.main, started)
    }

    /// Captures one step into a graph (launch it on [`DecodeStep::stream`]; drop it before this
    /// step). A capture with the plan freezes its signature: warm the plan first.
    pub fn capture(&mut self, config: StepConfig) -> Result<CudaGraph> {
        let main = self.main.clone();
        capture_graph(&main, || self.enqueue(config))
    }

    /// Fills every output (readers' and Engram layers') with 0xFF bytes, so that an output the
    /// next step does not write shows.
    pub fn poison(&mut self) -> Result<()> {
        self.engram.poison(&self.main)?;
        for w in 0..self.weights.windows().len() {
            for (gemv, _) in self.weights.readers(w) {
                let p = gemv.params();
                let bytes = p.m as usize * p.n as usize * 4;
                // SAFETY: `y` is the GEMV's own allocation of m x n f32, alive with the
                // weights this step holds; written by nothing else on this stream meanwhile.
                unsafe {
                    fetchahead::driver::memory::memset_d8_async(
                        p.y,
                        0xFF,
                        bytes,
                        self.main.cu_stream(),
                    )
                }?;
            }
        }
        Ok(())
    }

    /// The outputs of the last step of `config` (waits for the stream).
    pub fn outputs(&self, config: StepConfig) -> Result<StepOutputs> {
        let mut readers = Vec::new();
        for w in 0..self.weights.windows().len() {
            for (gemv, _) in self.weights.readers(w) {
                readers.push(
                    gemv.read_y(&self.main)?
                        .iter()
                        .map(|v| v.to_bits())
                        .collect(),
                );
            }
        }
        let mut engram = Vec::new();
        for k in 0..self.engram.len() {
            let (_, rows) =
                self.engram
                    .read(&self.main, k, config.gather(), self.shape.tokens as usize)?;
            engram.push(rows);
        }
        Ok(StepOutputs { readers, engram })
    }

    /// The Engram prefetchers' stats, summed over the layers.
    pub fn engram_stats(&self) -> Stats {
        self.engram.stats()
    }

    /// The first Engram layer's stats.
    pub fn first_layer_stats(&self) -> Stats {
        self.engram.layer_stats(0).unwrap_or_default()
    }

    /// Milliseconds of spin compute and collectives a step runs before its first Engram gather.
    pub fn before_first_gather_ms(&self) -> f64 {
        let first = self.shape.engram_layers.first().copied().unwrap_or(0);
        let windows_ns: u64 = self
            .weights
            .windows()
            .iter()
            .filter(|w| w.layer <= first)
            .map(|w| w.ns)
            .sum();
        (self.shape.compute_us * u64::from(first) * 1000 + windows_ns) as f64 / 1e6
    }

    /// Bytes the plan warms in window `w` of a step (its budget, then the cut learned for the
    /// window), 0 before the plan has learned.
    pub fn warmed_bytes(&self, w: usize) -> u64 {
        let Some(windows) = self.plan.planner().plan(self.signature) else {
            return 0;
        };
        let skipped = !self.plan.config().all_gather
            && self
                .weights
                .windows()
                .get(w)
                .is_some_and(|x| !x.role.is_all_reduce());
        if skipped {
            return 0;
        }
        let segments = windows.window(w);
        let n = match self.plan.window_cap(self.signature, w) {
            Some(cap) => WindowFit::prefix_within(segments.iter().map(|s| s.bytes), cap),
            None => segments.len(),
        };
        segments.iter().take(n).map(|s| s.bytes).sum()
    }
}

/// A device the step is projected to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TargetDevice {
    pub name: &'static str,
    /// DRAM bytes a second (the published peak).
    pub dram_bytes_per_s: f64,
    pub l2_bytes: u64,
    pub multiprocessors: u32,
}

/// The DGX Spark's GB10: 273 GB/s LPDDR5X, 24 MiB L2, 48 SMs (published figures).
pub const GB10: TargetDevice = TargetDevice {
    name: "DGX Spark (GB10)",
    dram_bytes_per_s: 273e9,
    l2_bytes: 24 << 20,
    multiprocessors: 48,
};

/// One reader matrix's times measured on the measuring device, microseconds: cold (L2 full of
/// other, clean lines) and warm (right after the same launch), each behind an idle collective,
/// launched eagerly and replayed from a graph ([`reader_times`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReaderTime {
    pub matrix: Matrix,
    pub cold_us: f64,
    pub warm_us: f64,
    /// Replayed from a graph: the graph's time less the same graph without the reader.
    pub replay_cold_us: f64,
    pub replay_warm_us: f64,
}

impl ReaderTime {
    /// (cold, warm) of one execution mode.
    pub fn of_mode(&self, graph: bool) -> (f64, f64) {
        if graph {
            (self.replay_cold_us, self.replay_warm_us)
        } else {
            (self.cold_us, self.warm_us)
        }
    }
}

/// The measured mean step times, milliseconds, of one execution mode (eager or graph).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MeasuredStep {
    /// Rows resident, without and with the plan: the plan's saving free of lookup noise.
    pub floor: f64,
    pub floor_plan: f64,
    pub neither: f64,
    pub prefetcher: f64,
    pub plan: f64,
    pub both: f64,
}

/// One window as the model needs it: its length, its readers' matrices, and the bytes the plan
/// warmed in it on the measuring device.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelWindow {
    pub ns: u64,
    pub readers: Vec<Matrix>,
    pub warmed_here: u64,
}

/// The projection of a measured step to another device; see [`SparkModel::assumptions`].
#[derive(Clone, Debug, PartialEq)]
pub struct SparkModel {
    pub target: TargetDevice,
    /// The plan's default budget per window there (`PlanConfig::for_l2`).
    pub budget: u64,
    /// Projected step times, ms.
    pub neither: f64,
    pub prefetcher: f64,
    pub plan: f64,
    pub both: f64,
    /// The readers' cold time a step there, ms.
    pub readers_cold_ms: f64,
    /// Bytes the plan warms a step there.
    pub warmed: u64,
    /// The share of the ideal saving (warm bytes at the cold rate) the measuring device's plan
    /// realized, applied to the target.
    pub realized: f64,
    /// The ideal saving on the measuring device, ms (warmed bytes x (cold - warm) per byte),
    /// from the readers' times in the measured execution mode.
    pub ideal_here_ms: f64,
    /// The same from the readers' eager times.
    pub ideal_eager_ms: f64,
    /// The plan's saving on the measuring device, ms, with the rows resident.
    pub saved_here_ms: f64,
}

impl SparkModel {
    /// Projects `measured` (one execution mode's step times on the measuring device, replayed
    /// from a graph when `graph`) to `target` from the windows, the readers' measured times and
    /// the measuring device's warmed bytes per window.
    pub fn project(
        target: TargetDevice,
        windows: &[ModelWindow],
        times: &[ReaderTime],
        measured: MeasuredStep,
        graph: bool,
    ) -> Result<SparkModel> {
        let budget = default_budget(target.l2_bytes);
        let bw = target.dram_bytes_per_s;
        let time_of = |m: &Matrix| {
            times
                .iter()
                .find(|t| t.matrix == *m)
                .copied()
                .ok_or_else(|| Error::invalid("Spark model", format!("no time for {}", m.name)))
        };
        let (mut shift_us, mut ideal_here_us, mut warmed, mut saving_us) = (0.0, 0.0, 0u64, 0.0);
        let mut ideal_eager_us = 0.0;
        for w in windows {
            let bytes: u64 = w.readers.iter().map(Matrix::bytes).sum();
            // The window's cut there: a prefetch reading at the DRAM rate may run a quarter of
            // the window past it.
            let fits = ((1.0 + TAIL) * w.ns as f64 * 1e-9 * bw) as u64;
            let warm_there = budget.min(bytes).min(fits);
            warmed += warm_there;
            saving_us += warm_there as f64 / bw * 1e6;
            let mut here_left = w.warmed_here.min(bytes);
            for m in &w.readers {
                let t = time_of(m)?;
                // Cold there: the reader's work with its weights in L2 (its warm time here),
                // plus its weights streamed from DRAM at the target's rate.
                shift_us += t.warm_us + m.bytes() as f64 / bw * 1e6 - t.cold_us;
                let warm_here = here_left.min(m.bytes());
                here_left -= warm_here;
                let share = warm_here as f64 / m.bytes().max(1) as f64;
                let (cold, warm) = t.of_mode(graph);
                ideal_here_us += (cold - warm).max(0.0) * share;
                ideal_eager_us += (t.cold_us - t.warm_us).max(0.0) * share;
            }
        }
        // The plan's saving with the rows resident: no lookup's spread in it.
        let saved_here_ms = measured.floor - measured.floor_plan;
        let ideal_here_ms = ideal_here_us / 1e3;
        let realized = if ideal_here_ms > 0.0 {
            (saved_here_ms / ideal_here_ms).clamp(0.0, 1.0)
        } else {
            0.0
        };
        let neither = measured.neither + shift_us / 1e3;
        let plan = neither - realized * saving_us / 1e3;
        let prefetcher = neither - (measured.neither - measured.prefetcher);
        let both = plan - (measured.plan - measured.both);
        let readers_cold_ms = windows
            .iter()
            .flat_map(|w| &w.readers)
            .map(|m| Ok(time_of(m)?.warm_us + m.bytes() as f64 / bw * 1e6))
            .sum::<Result<f64>>()?
            / 1e3;
        Ok(SparkModel {
            target,
            budget,
            neither,
            prefetcher,
            plan,
            both,
            readers_cold_ms,
            warmed,
            realized,
            ideal_here_ms,
            ideal_eager_ms: ideal_eager_us / 1e3,
            saved_here_ms,
        })
    }

    /// The plan's saving here as a share of the measured mode's ideal (unclamped).
    pub fn share_of_ideal(&self) -> f64 {
        if self.ideal_here_ms > 0.0 {
            self.saved_here_ms / self.ideal_here_ms
        } else {
            0.0
        }
    }

    /// The plan's saving here as a share of the eager ideal (the realized share is of the
    /// measured mode's own ideal).
    pub fn share_of_eager_ideal(&self) -> f64 {
        if self.ideal_eager_ms > 0.0 {
            self.saved_here_ms / self.ideal_eager_ms
        } else {
            0.0
        }
    }

    /// The model in one paragraph, then its assumptions, one a line.
    pub fn assumptions(target: &TargetDevice) -> Vec<String> {
        vec![
            format!(
                "Model: the projected step is the measured step with every reader's time \
                 replaced. A reader cold on the {} takes its measured warm time here (launch, \
                 math, L2 reads) plus its weight bytes at {:.0} GB/s; with the plan, window k \
                 warms W_k = min(budget, its bytes, (1 + {TAIL}) x its length x {:.0} GB/s) \
                 bytes (the default budget of a {} MiB L2, cut so that the prefetch ends within \
                 a quarter window of the collective, as the plan's window fit does), and the \
                 step saves W_k / {:.0} GB/s per window, times the share of its ideal saving the \
                 plan realized here. Collectives, the other compute and the Engram stall are \
                 as measured here.",
                target.name,
                target.dram_bytes_per_s / 1e9,
                target.dram_bytes_per_s / 1e9,
                target.l2_bytes >> 20,
                target.dram_bytes_per_s / 1e9,
            ),
            "assumption: the readers stream weights at the published DRAM peak there (a real \
             GEMV reaches less, which would lengthen the cold reads and raise the saving: the \
             projected saving is a lower bound in that respect)"
                .into(),
            "assumption: a warmed byte costs nothing beyond the reader's warm time (its L2 read \
             is inside it); the realized share measured here (the plan's saving with the rows \
             resident / (warmed bytes x (cold - warm) per byte)) carries the rest of what separates a prefetched line from a warm \
             one"
            .into(),
            format!(
                "assumption: the reader's warm time here stands for its fixed cost there, though \
                 the target has {} SMs against the measuring device's (small beside the DRAM \
                 time of these weights there)",
                target.multiprocessors
            ),
            "assumption: collectives take as long (the same interconnect time), and the rest of \
             the step (the spin compute standing for attention, experts and the rest) is held \
             at its measured length: a real step there would be longer in those parts too, \
             which would lower every share"
                .into(),
            "assumption: the Engram lookups run on the host as here (same CPU, disk and row \
             cache), so the prefetcher saves what it saved here"
                .into(),
        ]
    }
}

/// What `enqueue` puts on `stream`, captured into an uploaded graph (launch it on `stream`).
fn capture_graph(
    stream: &Arc<CudaStream>,
    enqueue: impl FnOnce() -> Result<()>,
) -> Result<CudaGraph> {
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    stream.begin_capture(mode).call("cuStreamBeginCapture")?;
    let enqueued = enqueue();
    let graph = stream
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .call("cuStreamEndCapture")?;
    enqueued?;
    let graph = graph.ok_or_else(|| Error::invalid("graph", "the capture recorded nothing"))?;
    graph.upload().call("cuGraphUpload")?;
    Ok(graph)
}

/// Median microseconds of each distinct reader matrix of `weights` on `stream`, cold and warm,
/// launched eagerly and replayed from a CUDA graph; `reps` of each.
///
/// Cold: after a write of twice the L2 size that is then read back, so that L2 is full of clean
/// lines, as a decode step's earlier readers leave it (after the write alone the cold reader
/// also paid the write-back of the lines it displaced: on the H200 that doubled its cold - warm
/// difference), and the activations read back into L2 (every reader of the step reads them).
/// Warm: right after the same launch. Each launch follows a 20 us idle collective. Replayed:
/// the collective and the reader captured as one graph, timed around its launch, less the same
/// graph without the reader.
pub fn reader_times(
    kernels: &LabKernels,
    stream: &Arc<CudaStream>,
    weights: &DecodeWeights,
    reps: usize,
) -> Result<Vec<ReaderTime>> {
    let flush = CleanFlush::new(kernels, stream)?;
    let clock = StepClock::new(stream)?;
    let s = stream.cu_stream();
    let collective = || -> Result<()> {
        // SAFETY: this function's stream; no flag is polled.
        unsafe { kernels.launch_collective(s, 1, 20_000, 0) }
    };
    let capture = |with_reader: Option<&Reader>| -> Result<CudaGraph> {
        capture_graph(stream, || {
            collective()?;
            with_reader.map_or(Ok(()), |gemv| gemv.launch(kernels, stream))
        })
    };
    let replay_us = |graph: &CudaGraph| -> Result<f64> {
        let started = clock.begin(kernels, stream, 0)?;
        graph.launch().call("cuGraphLaunch")?;
        Ok(clock.finish(stream, started)?.gpu_ms * 1e3)
    };
    let idle = capture(None)?;
    let mut idle_us = Vec::new();
    for _ in 0..reps.max(1) {
        idle_us.push(replay_us(&idle)?);
    }
    let idle_us = percentile(&mut idle_us, 0.5);
    let mut times: Vec<ReaderTime> = Vec::new();
    for w in 0..weights.windows().len() {
        for (gemv, matrix) in weights.readers(w) {
            if times.iter().any(|t| t.matrix == *matrix) {
                continue;
            }
            let p = gemv.params();
            let activations = (p.x, p.m as usize * p.k as usize * 2);
            let eager = |cold: bool| -> Result<f64> {
                if cold {
                    flush.run(activations)?;
                }
                collective()?;
                let started = clock.begin(kernels, stream, 0)?;
                gemv.launch(kernels, stream)?;
                Ok(clock.finish(stream, started)?.gpu_ms * 1e3)
            };
            let graph = capture(Some(gemv))?;
            let replayed = |cold: bool| -> Result<f64> {
                if cold {
                    flush.run(activations)?;
                } else {
                    replay_us(&graph)?;
                }
                Ok(replay_us(&graph)? - idle_us)
            };
            let mut t = [(); 4].map(|_| Vec::new());
            for _ in 0..reps.max(1) {
                t[0].push(eager(true)?);
                t[1].push(eager(false)?);
                t[2].push(replayed(true)?);
                t[3].push(replayed(false)?);
            }
            let [cold_us, warm_us, replay_cold_us, replay_warm_us] =
                t.map(|mut v| percentile(&mut v, 0.5));
            times.push(ReaderTime {
                matrix: *matrix,
                cold_us,
                warm_us,
                replay_cold_us,
                replay_warm_us,
            });
        }
    }
    Ok(times)
}

/// Leaves L2 full of clean lines of a buffer of its own (twice the L2 size, 64-512 MiB): a write
/// of it, then a read of it by every SM (`l2_prefetch_loads`), then the activations read back.
struct CleanFlush<'a> {
    kernels: &'a LabKernels,
    stream: &'a Arc<CudaStream>,
    buffer: CudaSlice<u8>,
    table: SegmentTable,
}

impl<'a> CleanFlush<'a> {
    fn new(kernels: &'a LabKernels, stream: &'a Arc<CudaStream>) -> Result<Self> {
        let bytes = (2 * kernels.gpu().l2_bytes).clamp(64 << 20, 512 << 20);
        let buffer = stream
            .alloc_zeros::<u8>(bytes as usize)
            .call("cuMemAlloc")?;
        let base = buffer.device_ptr(stream).0;
        let segments: Vec<Segment> = (0..bytes)
            .step_by(SEGMENT_PIECE as usize)
            .map(|at| Segment {
                address: base + at,
                bytes: SEGMENT_PIECE.min(bytes - at),
            })
            .collect();
        let table = SegmentTable::upload(stream, &segments)?;
        Ok(CleanFlush {
            kernels,
            stream,
            buffer,
            table,
        })
    }

    /// Flushes, then reads the `(address, bytes)` activations back into L2.
    fn run(&self, (x, x_bytes): (u64, usize)) -> Result<()> {
        let s = self.stream.cu_stream();
        let base = self.buffer.device_ptr(self.stream).0;
        let bytes = self.buffer.len();
        // SAFETY: the flush buffer is this flush's own allocation of `bytes` bytes.
        unsafe { fetchahead::driver::memory::memset_d8_async(base, 0x5A, bytes, s) }?;
        let n = self.table.len() as u32;
        let gpu = self.kernels.gpu();
        let (blocks, threads) = l2_prefetch::launch_shape(
            l2_prefetch::LOADS_VARIANT,
            n,
            gpu.multiprocessors,
            l2_prefetch::DEFAULT_MAX_BLOCKS,
            l2_prefetch::DEFAULT_THREADS,
        );
        let params = PrefetchParams {
            segments: self.table.address_of(0),
            n: n as u64,
            chunk: l2_prefetch::DEFAULT_CHUNK,
            _pad: 0,
            partitions: 0,
            claims: 0,
            timeline: fetchahead_gpu::params::TimelineParams::OFF,
        };
        // SAFETY: the table holds the flush buffer's pieces, live while this flush lives.
        unsafe {
            self.kernels
                .launch_l2_prefetch(s, l2_prefetch::LOADS_VARIANT, params, blocks, threads)
        }?;
        // SAFETY: x is a reader's live activations of `x_bytes`; the flush buffer, at least
        // 64 MiB, holds them and does not overlap them. The copy's writes are the activations'
        // bytes again, as a collective's output would leave them in L2.
        unsafe { fetchahead::driver::memory::memcpy_dtod_async(base, x, x_bytes, s) }
    }
}

/// The `q` quantile (0..=1, nearest rank) of `v`, NaN when empty.
pub fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize]
}

/// One configuration's timed steps.
#[derive(Clone, Debug, Default)]
pub struct Run {
    /// GPU milliseconds of each step.
    pub steps: Vec<f64>,
    pub enqueue_ms: f64,
    pub overruns: usize,
    /// Milliseconds inside the step's Engram lookups (all layers), summed over the steps.
    pub lookup_ms: f64,
    /// Steps whose first Engram layer's lookup took no longer than the step's work before its
    /// gather (the prefetcher's condition), their GPU and lookup milliseconds.
    pub held: usize,
    pub held_gpu_ms: f64,
    pub held_lookup_ms: f64,
    /// Bytes the plan warmed over the steps (eager; a graph counts at its capture).
    pub warmed_bytes: u64,
}

impl Run {
    /// Adds a step: its time, its lookups' milliseconds (all layers, the first layer) and the
    /// work before the first gather.
    pub fn record(&mut self, t: StepTime, lookup_ms: f64, first_ms: f64, before_ms: f64) {
        self.steps.push(t.gpu_ms);
        self.enqueue_ms += t.enqueue_ms;
        self.overruns += usize::from(t.lead_in_overrun);
        self.lookup_ms += lookup_ms;
        if first_ms > 0.0 && first_ms <= before_ms {
            self.held += 1;
            self.held_gpu_ms += t.gpu_ms;
            self.held_lookup_ms += lookup_ms;
        }
    }

    pub fn mean(&self) -> f64 {
        self.steps.iter().sum::<f64>() / self.steps.len().max(1) as f64
    }

    /// The standard error of the mean.
    pub fn sem(&self) -> f64 {
        let n = self.steps.len();
        if n < 2 {
            return f64::NAN;
        }
        let m = self.mean();
        let var = self.steps.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1) as f64;
        (var / n as f64).sqrt()
    }

    /// (p10, p90) of the step times.
    pub fn spread(&self) -> (f64, f64) {
        let mut v = self.steps.clone();
        (percentile(&mut v, 0.1), percentile(&mut v, 0.9))
    }

    /// Mean milliseconds of a step's lookups.
    pub fn lookup(&self) -> f64 {
        self.lookup_ms / self.steps.len().max(1) as f64
    }
}

/// The runs of one lookup setting, by (graph replayed, configuration).
pub type Runs = std::collections::BTreeMap<(bool, StepConfig), Run>;

/// The step table of one execution mode: every configuration's mean step, what it saves
/// against neither feature, and its Engram stall against its floor; then the goal's lines.
pub fn report(label: &str, graph: bool, runs: &Runs) -> Vec<String> {
    let mode = if graph { "graph" } else { "eager" };
    let get = |c: StepConfig| runs.get(&(graph, c)).filter(|r| !r.steps.is_empty());
    let Some(neither) = get(StepConfig::Neither) else {
        return vec![format!("{label} {mode}: no steps of neither feature")];
    };
    let base = neither.mean();
    let mut lines = vec![
        format!("{label} lookups, {mode}:"),
        format!(
            "  {:<24} {:>9} {:>17} {:>17} {:>26} {:>8}",
            "configuration",
            "step ms",
            "p10-p90 ms",
            "saves (share)",
            "Engram stall (of lookups)",
            "enqueue"
        ),
    ];
    for c in StepConfig::ALL {
        let Some(r) = get(c) else { continue };
        let (p10, p90) = r.spread();
        let saved = match c.gather() {
            GatherPath::Resident => "-".to_string(),
            _ => {
                let saved = base - r.mean();
                format!("{saved:.3} ({:.2}%)", 100.0 * saved / base)
            }
        };
        let stall = match (c.gather(), get(c.floor())) {
            (GatherPath::Resident, _) | (_, None) => "-".to_string(),
            (_, Some(floor)) => {
                let stall = r.mean() - floor.mean();
                format!(
                    "{stall:.3} ms ({:.1}% of {:.3})",
                    100.0 * stall / r.lookup().max(1e-9),
                    r.lookup()
                )
            }
        };
        lines.push(format!(
            "  {:<24} {:>9.3} {:>17} {:>17} {:>26} {:>8.3}{}",
            c.name(),
            r.mean(),
            format!("{p10:.3}-{p90:.3}"),
            saved,
            stall,
            r.enqueue_ms / r.steps.len() as f64,
            if r.overruns > 0 {
                format!(" (lead-in ran out in {} of {})", r.overruns, r.steps.len())
            } else {
                String::new()
            }
        ));
    }
    if let (Some(both), Some(floor)) = (get(StepConfig::Both), get(StepConfig::FloorPlan)) {
        let stall = both.mean() - floor.mean();
        let share = 100.0 * stall / both.lookup().max(1e-9);
        let held = if both.held > 0 {
            let n = both.held as f64;
            let held_stall = both.held_gpu_ms / n - floor.mean();
            format!(
                "; the {} of {} steps whose first lookup fit before its gather: {:.1}%",
                both.held,
                both.steps.len(),
                100.0 * held_stall / (both.held_lookup_ms / n).max(1e-9)
            )
        } else {
            format!(
                "; no step's first lookup fit before its gather (of {})",
                both.steps.len()
            )
        };
        lines.push(format!(
            "  goal, both on: Engram stall {stall:.3} ms = {share:.1}% of the step's {:.3} ms of \
             lookups (<= 2%: {}){held}",
            both.lookup(),
            if share <= 2.0 { "met" } else { "NOT met" }
        ));
    }
    for (with, without, what) in [
        (StepConfig::FloorPlan, StepConfig::Floor, "rows resident"),
        (
            StepConfig::Plan,
            StepConfig::Neither,
            "synchronous Engram lookups",
        ),
        (
            StepConfig::Both,
            StepConfig::Prefetcher,
            "the Engram prefetcher",
        ),
    ] {
        if let (Some(a), Some(b)) = (get(with), get(without)) {
            let saved = b.mean() - a.mean();
            let noise = 3.0 * (a.sem().powi(2) + b.sem().powi(2)).sqrt();
            let warmed = if graph {
                "its graph warms what its capture did".to_string()
            } else {
                format!(
                    "warmed {:.1} MiB a step",
                    a.warmed_bytes as f64 / MIB / a.steps.len() as f64
                )
            };
            lines.push(format!(
                "  L2 plan with {what}: saves {saved:.3} ms = {:.2}% of the step (3 standard \
                 errors of the difference: {noise:.3} ms: {}); {warmed}",
                100.0 * saved / b.mean(),
                if saved > noise {
                    "measurable"
                } else {
                    "NOT measurable"
                },
            ));
        }
    }
    lines
}

/// The windows as [`SparkModel::project`] needs them, with the bytes `step`'s plan warms.
pub fn model_windows(step: &DecodeStep) -> Vec<ModelWindow> {
    let weights = step.weights();
    weights
        .windows()
        .iter()
        .enumerate()
        .map(|(w, spec)| ModelWindow {
            ns: spec.ns,
            readers: weights.readers(w).map(|(_, m)| *m).collect(),
            warmed_here: step.warmed_bytes(w),
        })
        .collect()
}

/// The share of its ideal the L2 plan's saving should reach, in either execution mode.
pub const PLAN_GOAL: f64 = 0.8;

/// The projection's lines for one execution mode's runs.
pub fn spark_lines(
    label: &str,
    graph: bool,
    runs: &Runs,
    windows: &[ModelWindow],
    times: &[ReaderTime],
) -> Result<Vec<String>> {
    let mode = if graph { "graph" } else { "eager" };
    let mean = |c| runs.get(&(graph, c)).map_or(f64::NAN, Run::mean);
    let measured = MeasuredStep {
        floor: mean(StepConfig::Floor),
        floor_plan: mean(StepConfig::FloorPlan),
        neither: mean(StepConfig::Neither),
        prefetcher: mean(StepConfig::Prefetcher),
        plan: mean(StepConfig::Plan),
        both: mean(StepConfig::Both),
    };
    let m = SparkModel::project(GB10, windows, times, measured, graph)?;
    let share = |t: f64| 100.0 * (m.neither - t) / m.neither;
    let gain = m.neither / m.plan - 1.0;
    let verdict = |x: f64| if x >= PLAN_GOAL { "met" } else { "NOT MET" };
    Ok(vec![
        format!(
            "{} projected from the {label} lookups' {mode} steps: budget {:.2} MiB a window, \
             {:.1} MiB warmed a step, readers cold {:.2} ms a step, realized share {:.2} (here, rows \
             resident, the plan saved {:.3} ms of an ideal {:.3} ms = {:.2}% of the step: its \
             warmed bytes x the readers' (cold - warm) time per byte, {mode})",
            m.target.name,
            m.budget as f64 / MIB,
            m.warmed as f64 / MIB,
            m.readers_cold_ms,
            m.realized,
            m.saved_here_ms,
            m.ideal_here_ms,
            100.0 * m.ideal_here_ms / measured.floor
        ),
        format!(
            "  L2 plan, {mode}: {:.2} of the {mode} ideal ({}), {:.2} of the eager ideal {:.3} ms \
             ({}); goal {PLAN_GOAL} of each",
            m.share_of_ideal(),
            verdict(m.share_of_ideal()),
            m.share_of_eager_ideal(),
            m.ideal_eager_ms,
            verdict(m.share_of_eager_ideal()),
        ),
        format!(
            "  step ms: neither {:.3}, Engram prefetcher only {:.3} ({:.2}%), L2 plan only {:.3} \
             ({:.2}%), both {:.3} ({:.2}%)",
            m.neither,
            m.prefetcher,
            share(m.prefetcher),
            m.plan,
            share(m.plan),
            m.both,
            share(m.both)
        ),
        format!(
            "  the L2 plan's decode throughput gain there: +{:.2}% ({:.1}% of the origin story's \
             +7%)",
            100.0 * gain,
            100.0 * gain / 0.07
        ),
    ])
}
