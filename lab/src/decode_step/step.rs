//! The decode step on one stream in each of its configurations: the Engram layers, the readers,
//! the L2 plan; its timed and captured runs and its outputs.
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaGraph, CudaStream};
use fetchahead_gpu::timeline::NO_LABEL;

use crate::LabKernels;
use crate::forward::{EngramLayers, FlagLanes, GatherPath, LayerTable, StepClock, StepTime};
use fetchahead::error::CudaCall;
use fetchahead::l2_plan::window_fit::{MEASURES, WindowFit};
use fetchahead::l2_plan::{CollectiveKind, L2Plan, PlanConfig, Signature};
use fetchahead::prefetch::prefetcher::{Completion, Join, PrefetcherConfig, Stats};
use fetchahead::{Error, Result};

use super::{COLLECTIVE_BLOCKS, DECODE_LEAD_IN_US, DecodeShape, DecodeWeights, capture_graph};

/// Which features a step runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StepConfig {
    /// Engram rows resident on the device (no lookup), no plan: the floor of the plan-off steps.
    Floor,
    /// Rows resident, with the L2 plan: the floor of the plan-on steps.
    FloorPlan,
    /// Rows resident, no plan, each window's readers warmed by hand: their shadows (the same
    /// GEMVs into outputs of their own) run on a side branch forked from the main stream before
    /// the window's collective and launched after it (a GEMV fills every SM: launched first, it
    /// would hold the collective back), joined once at the step's end. What leaving each
    /// reader's lines as its own run does saves, its branch included: the comparison for the
    /// plan's branch in the step.
    FloorHand,
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
    pub const ALL: [StepConfig; 7] = [
        StepConfig::Floor,
        StepConfig::FloorPlan,
        StepConfig::FloorHand,
        StepConfig::Neither,
        StepConfig::Prefetcher,
        StepConfig::Plan,
        StepConfig::Both,
    ];

    pub fn gather(self) -> GatherPath {
        match self {
            StepConfig::Floor | StepConfig::FloorPlan | StepConfig::FloorHand => {
                GatherPath::Resident
            }
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
            StepConfig::FloorHand => "floor + warmed by hand",
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
            StepConfig::FloorHand => "floor_hand",
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

/// The side branch of [`StepConfig::FloorHand`]: a stream of its own (made before any capture),
/// forked from the main stream before each window's collective and joined once at the step's
/// end, as the plan's is.
struct HandBranch {
    side: Arc<CudaStream>,
    fork: CudaEvent,
    join: CudaEvent,
}

impl HandBranch {
    fn new(main: &Arc<CudaStream>) -> Result<HandBranch> {
        let ctx = main.context();
        Ok(HandBranch {
            side: ctx.new_stream().call("cuStreamCreate")?,
            fork: ctx.new_event(None).call("cuEventCreate")?,
            join: ctx.new_event(None).call("cuEventCreate")?,
        })
    }

    /// Forks the side stream from `main` (before the window's collective).
    fn fork(&self, main: &CudaStream) -> Result<()> {
        self.fork.record(main).call("cuEventRecord")?;
        self.side.wait(&self.fork).call("cuStreamWaitEvent")
    }

    /// Runs window `w`'s reader shadows on the side stream, in order (launched after the
    /// window's collective), unlabelled on the device timeline (they are not the window's
    /// readers).
    fn warm(&self, kernels: &LabKernels, weights: &DecodeWeights, w: usize) -> Result<()> {
        kernels.set_timeline_label(NO_LABEL);
        for (reader, _) in weights.readers(w) {
            reader.launch_shadow(kernels, &self.side)?;
        }
        kernels.set_timeline_label(w as u32);
        Ok(())
    }

    /// Joins the side stream back into `main`.
    fn join(&self, main: &CudaStream) -> Result<()> {
        self.join.record(&self.side).call("cuEventRecord")?;
        main.wait(&self.join).call("cuStreamWaitEvent")
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
    hand: HandBranch,
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
        let hand = HandBranch::new(&main)?;
        main.synchronize().call("cuStreamSynchronize")?;
        Ok(DecodeStep {
            hand,
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
        let hand = config == StepConfig::FloorHand;
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
                if hand {
                    self.hand.fork(&self.main)?;
                }
                let output = match self.weights.readers(w).next() {
                    Some((first, _)) if self.shape.collective_writes => first.activations(),
                    _ => (0, 0),
                };
                // SAFETY: no flag is polled; the output is the window's readers' activations,
                // alive with the weights; the collective writes back the values it reads, so
                // the hand's shadows, which may read them meanwhile, see the same bytes.
                unsafe {
                    self.kernels.launch_collective_writing(
                        s,
                        COLLECTIVE_BLOCKS,
                        window.ns,
                        0,
                        output,
                    )?
                };
                if hand {
                    self.hand.warm(&self.kernels, &self.weights, w)?;
                }
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
        if hand {
            self.hand.join(&self.main)?;
        }
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
