//! The projection of a measured step to another device (the DGX Spark's GB10), from the readers'
//! cold and warm times measured on this one.
use std::sync::Arc;

use cudarc::driver::{CudaGraph, CudaSlice, CudaStream, DevicePtr};
use fetchahead_gpu::l2_prefetch;
use fetchahead_gpu::params::{PrefetchParams, Segment};

use crate::LabKernels;
use crate::forward::StepClock;
use fetchahead::error::CudaCall;
use fetchahead::l2_plan::window_fit::TAIL;
use fetchahead::l2_plan::{SEGMENT_PIECE, SegmentTable, default_budget};
use fetchahead::{Error, Result};

use super::{
    DecodeStep, DecodeWeights, MIB, Matrix, PLAN_GOAL, Reader, Run, Runs, StepConfig,
    capture_graph, percentile,
};

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
    /// Replayed from a graph: the graph's time less the same graph without the reader, the two
    /// timed with L2 set up the same way (so that what the collective itself loses to a cold
    /// L2, its code, its launch's parameters and its output's lines, is not counted as the
    /// reader's).
    pub replay_cold_us: f64,
    pub replay_warm_us: f64,
    /// Replayed as for `replay_cold_us`, its weights read into L2 after the flush by the plan's
    /// own prefetch (the SMs' read its configuration picks, from both L2 partitions where the
    /// device has two, on the SMs the plan uses): what the plan can give this reader at best.
    pub replay_prefetched_us: f64,
    /// The graph without the reader (the idle collective alone), replayed cold, warm and
    /// prefetched as above: what was taken off each of the three.
    pub replay_collective_us: [f64; 3],
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
    /// Rows resident, every reader warmed by hand on the plan's kind of branch
    /// ([`StepConfig::FloorHand`]); NaN where not run.
    pub floor_hand: f64,
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
    /// The ideal saving on the measuring device with every reader's weights warmed whole, ms,
    /// in the measured execution mode: what warming by hand is measured against.
    pub ideal_whole_ms: f64,
    /// The saving of warming every reader by hand on a side branch, ms (NaN where not run).
    pub hand_saved_ms: f64,
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
        let (mut ideal_eager_us, mut ideal_whole_us) = (0.0, 0.0);
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
                ideal_whole_us += (cold - warm).max(0.0);
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
            ideal_whole_ms: ideal_whole_us / 1e3,
            hand_saved_ms: measured.floor - measured.floor_hand,
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

/// The spin ahead of each timed replay in [`reader_times`], us: longer than a graph's launch
/// takes on the host, so that the launch's latency is not timed.
const REPLAY_LEAD_IN_US: u64 = 60;

/// Median microseconds of each distinct reader matrix of `weights` on `stream`, cold and warm,
/// launched eagerly and replayed from a CUDA graph; `reps` of each.
///
/// Cold: after a write of twice the L2 size that is then read back, so that L2 is full of clean
/// lines, as a decode step's earlier readers leave it (after the write alone the cold reader
/// also paid the write-back of the lines it displaced: on the H200 that doubled its cold - warm
/// difference), and the activations read back into L2 (every reader of the step reads them).
/// Warm: right after the same launch. Each launch follows a 20 us idle collective, which ends
/// by rewriting the reader's activations when `collective_writes` (as the step's collectives
/// do with [`DecodeShape::collective_writes`](super::DecodeShape::collective_writes)).
/// Replayed: the collective and the reader captured as one graph, timed around its launch, less
/// the same graph without the reader timed after the same set-up of L2 (cold, warm or
/// prefetched). Taking off a collective timed warm instead counted what the collective itself
/// loses after a flush as the reader's cold time.
pub fn reader_times(
    kernels: &LabKernels,
    stream: &Arc<CudaStream>,
    weights: &DecodeWeights,
    collective_writes: bool,
    reps: usize,
) -> Result<Vec<ReaderTime>> {
    let flush = CleanFlush::new(kernels, stream)?;
    let prefetch = PlanPrefetch::new(kernels, stream)?;
    let clock = StepClock::new(stream)?;
    let s = stream.cu_stream();
    // The collective before `gemv`, writing its activations or nothing.
    let collective = |gemv: &Reader| -> Result<()> {
        let output = if collective_writes {
            gemv.activations()
        } else {
            (0, 0)
        };
        // SAFETY: this function's stream; no flag is polled; the output is the reader's own
        // activations, which nothing else uses meanwhile.
        unsafe { kernels.launch_collective_writing(s, 1, 20_000, 0, output) }
    };
    let capture = |gemv: &Reader, with_reader: bool| -> Result<CudaGraph> {
        capture_graph(stream, || {
            collective(gemv)?;
            if with_reader {
                gemv.launch(kernels, stream)?;
            }
            Ok(())
        })
    };
    // Each replay starts behind a spin long enough to cover the graph's launch on the host: the
    // start event must not fire while the launch is still being enqueued, or the host's launch
    // latency (which varies from run to run) is timed as the reader's.
    // A replay whose lead-in ran out (the host was descheduled) is timed again, a few times,
    // `before` (which sets L2 up) enqueued again ahead of each.
    let replay_us = |graph: &CudaGraph, before: &dyn Fn() -> Result<()>| -> Result<f64> {
        for _ in 0..4 {
            before()?;
            let started = clock.begin(kernels, stream, REPLAY_LEAD_IN_US)?;
            graph.launch().call("cuGraphLaunch")?;
            let t = clock.finish(stream, started)?;
            if !t.lead_in_overrun {
                return Ok(t.gpu_ms * 1e3);
            }
        }
        Err(Error::invalid(
            "reader times",
            format!("a graph's launch outlasted its {REPLAY_LEAD_IN_US} us lead-in four times"),
        ))
    };
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
                collective(gemv)?;
                let started = clock.begin(kernels, stream, 0)?;
                gemv.launch(kernels, stream)?;
                Ok(clock.finish(stream, started)?.gpu_ms * 1e3)
            };
            // The collective alone (its output's write included), and the same with the reader.
            let idle = capture(gemv, false)?;
            let graph = capture(gemv, true)?;
            let weights_table = prefetch.table_of(gemv.weights())?;
            let replayed = |l2: L2Before, timed: &CudaGraph| -> Result<f64> {
                let before = || -> Result<()> {
                    match l2 {
                        L2Before::Cold => flush.run(activations),
                        // The whole graph's launch warms its reader (and its collective).
                        L2Before::Warm => graph.launch().call("cuGraphLaunch"),
                        L2Before::Prefetched => {
                            flush.run(activations)?;
                            prefetch.run(&weights_table)
                        }
                    }
                };
                replay_us(timed, &before)
            };
            const STATES: [L2Before; 3] = [L2Before::Cold, L2Before::Warm, L2Before::Prefetched];
            let mut t = [(); 8].map(|_| Vec::new());
            for _ in 0..reps.max(1) {
                t[0].push(eager(true)?);
                t[1].push(eager(false)?);
                for (i, l2) in STATES.into_iter().enumerate() {
                    t[2 + i].push(replayed(l2, &graph)?);
                    t[5 + i].push(replayed(l2, &idle)?);
                }
            }
            let [
                cold_us,
                warm_us,
                replay_cold_us,
                replay_warm_us,
                replay_prefetched_us,
                idle_cold_us,
                idle_warm_us,
                idle_prefetched_us,
            ] = t.map(|mut v| percentile(&mut v, 0.5));
            times.push(ReaderTime {
                matrix: *matrix,
                cold_us,
                warm_us,
                replay_cold_us: replay_cold_us - idle_cold_us,
                replay_warm_us: replay_warm_us - idle_warm_us,
                replay_prefetched_us: replay_prefetched_us - idle_prefetched_us,
                replay_collective_us: [idle_cold_us, idle_warm_us, idle_prefetched_us],
            });
        }
    }
    Ok(times)
}

/// What a timed replay of [`reader_times`] finds in L2.
#[derive(Clone, Copy)]
enum L2Before {
    /// Clean lines of the flush buffer.
    Cold,
    /// The reader's own lines, from the same graph's launch just before.
    Warm,
    /// The reader's weights, read in after the flush by the plan's prefetch kernel.
    Prefetched,
}

/// The plan's prefetch as a window launches it (the SMs' read the plan's configuration picks,
/// `l2_prefetch_loads` or `l2_prefetch_copies`, each byte from both L2 partitions when the
/// device has two, on the SMs the configuration leaves it), over one reader's weights.
struct PlanPrefetch<'a> {
    kernels: &'a LabKernels,
    stream: &'a Arc<CudaStream>,
    partitions: Option<fetchahead::l2_plan::partitions::Partitions>,
    blocks_sms: u32,
    variant: l2_prefetch::PrefetchVariant,
}

impl<'a> PlanPrefetch<'a> {
    fn new(kernels: &'a LabKernels, stream: &'a Arc<CudaStream>) -> Result<Self> {
        let map = fetchahead::l2_plan::partitions::Partitions::measure(kernels.product(), stream)?;
        let config = fetchahead::l2_plan::PlanConfig::from_env(kernels.gpu().l2_bytes)?;
        let variant = match config.replay {
            fetchahead::l2_plan::Replay::Prefetch { variant }
                if variant.variant().method == l2_prefetch::Method::Copies =>
            {
                variant
            }
            // What `Replay::Auto` reads a window within the default cap with.
            _ => l2_prefetch::LOADS_VARIANT,
        };
        Ok(PlanPrefetch {
            variant,
            kernels,
            stream,
            partitions: map.two.then_some(map),
            blocks_sms: kernels
                .gpu()
                .multiprocessors
                .saturating_sub(config.free_sms)
                .max(1),
        })
    }

    /// The `(address, bytes)` weights cut into the plan's pieces, uploaded with the map.
    fn table_of(&self, (address, bytes): (u64, u64)) -> Result<SegmentTable> {
        SegmentTable::upload_with(
            self.stream,
            &pieces(address, bytes),
            self.partitions.as_ref().map(|p| &p.of_sm),
        )
    }

    fn run(&self, table: &SegmentTable) -> Result<()> {
        // SAFETY: the tables of `table_of` hold live weights of a reader of this step (and,
        // when partitioned, the map and the claims the kernel counts its jobs in).
        unsafe {
            read_in(
                self.kernels,
                self.stream,
                table,
                self.blocks_sms,
                self.variant,
            )
        }
    }
}

/// `(address, bytes)` as the plan's pieces of at most [`SEGMENT_PIECE`] bytes.
fn pieces(address: u64, bytes: u64) -> Vec<Segment> {
    (0..bytes)
        .step_by(SEGMENT_PIECE as usize)
        .map(|at| Segment {
            address: address + at,
            bytes: SEGMENT_PIECE.min(bytes - at),
        })
        .collect()
}

/// The SMs' read `variant` (`l2_prefetch_loads` or `_copies`) over `table` on at most `sms`
/// SMs' worth of blocks.
///
/// # Safety
/// `table`'s segments must be live device memory for the launch (and its partition map and
/// claims, when it has them, as `SegmentTable::upload_with` made them).
unsafe fn read_in(
    kernels: &LabKernels,
    stream: &Arc<CudaStream>,
    table: &SegmentTable,
    sms: u32,
    variant: l2_prefetch::PrefetchVariant,
) -> Result<()> {
    let n = table.len() as u32;
    let (blocks, threads) = l2_prefetch::launch_shape(
        variant,
        n,
        sms,
        l2_prefetch::DEFAULT_MAX_BLOCKS,
        l2_prefetch::DEFAULT_THREADS,
    );
    let (partitions, claims) = table.partitioned();
    let params = PrefetchParams {
        segments: table.address_of(0),
        n: n as u64,
        chunk: l2_prefetch::DEFAULT_CHUNK,
        // Read only with the table's partition map (the plan's), ignored for the flush's.
        once_jobs: fetchahead::l2_plan::once_jobs(
            table.bytes(),
            kernels.gpu().l2_bytes,
            fetchahead::l2_plan::DEFAULT_TWICE_FIT,
        ),
        partitions,
        claims,
        timeline: fetchahead_gpu::params::TimelineParams::OFF,
    };
    // SAFETY: the caller's table, as this function requires.
    unsafe { kernels.launch_l2_prefetch(stream.cu_stream(), variant, params, blocks, threads) }
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
        let table = SegmentTable::upload(stream, &pieces(base, bytes))?;
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
        let sms = self.kernels.gpu().multiprocessors;
        // SAFETY: the table holds the flush buffer's pieces, live while this flush lives.
        unsafe {
            read_in(
                self.kernels,
                self.stream,
                &self.table,
                sms,
                l2_prefetch::LOADS_VARIANT,
            )
        }?;
        // SAFETY: x is a reader's live activations of `x_bytes`; the flush buffer, at least
        // 64 MiB, holds them and does not overlap them. The copy's writes are the activations'
        // bytes again, as a collective's output would leave them in L2.
        unsafe { fetchahead::driver::memory::memcpy_dtod_async(base, x, x_bytes, s) }
    }
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
        floor_hand: mean(StepConfig::FloorHand),
        neither: mean(StepConfig::Neither),
        prefetcher: mean(StepConfig::Prefetcher),
        plan: mean(StepConfig::Plan),
        both: mean(StepConfig::Both),
    };
    let m = SparkModel::project(GB10, windows, times, measured, graph)?;
    let share = |t: f64| 100.0 * (m.neither - t) / m.neither;
    let gain = m.neither / m.plan - 1.0;
    let verdict = |x: f64| if x >= PLAN_GOAL { "met" } else { "NOT MET" };
    let mut lines = vec![
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
    ];
    if m.hand_saved_ms.is_finite() && m.ideal_whole_ms > 0.0 {
        lines.insert(
            2,
            format!(
                "  readers warmed by hand on the same kind of branch, {mode}: saved {:.3} ms = \
                 {:.2} of the {mode} ideal of whole readers {:.3} ms (the plan: {:.2} of it, \
                 {:.2} of what the hand saved)",
                m.hand_saved_ms,
                m.hand_saved_ms / m.ideal_whole_ms,
                m.ideal_whole_ms,
                m.saved_here_ms / m.ideal_whole_ms,
                m.saved_here_ms / m.hand_saved_ms,
            ),
        );
    }
    Ok(lines)
}
