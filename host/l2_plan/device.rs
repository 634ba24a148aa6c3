//! [`L2Plan`]: the plan on a device, learning through a [`Planner`] and replaying each window
//! on a side stream forked from the main stream (a graph branch inside a capture).
use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream, sys};
use fetchahead_gpu::l2_prefetch::{self, PrefetchVariant};
use fetchahead_gpu::params::{PrefetchParams, Segment};

use crate::driver::stream;
use crate::error::CudaCall;
use crate::kernels::Kernels;
use crate::l2_plan::access_policy::PersistingL2;
use crate::l2_plan::pace::HostPace;
use crate::l2_plan::partitions::Partitions;
use crate::l2_plan::planner::{
    CollectiveKind, Counters, ForwardSummary, Learned, PlanConfig, Planner, Replay, Signature,
    Span, no_forward, prefetch_choice,
};
use crate::l2_plan::segments::{SEGMENT_ALIGN, SegmentTable};
use crate::l2_plan::window_fit::WindowFit;
use crate::{Error, Result};
/// What a forward's end returns to the caller.
#[derive(Debug)]
pub struct ForwardOutcome {
    pub summary: ForwardSummary,
    /// For a captured forward: the segment tables its graph reads. The plan keeps them too;
    /// keep this beside the graph when the graph may outlive the plan.
    pub tables: Option<Arc<SegmentTable>>,
}

/// The plan on a device: learning through a [`Planner`], replay on a side stream.
#[derive(Debug)]
pub struct L2Plan {
    kernels: Arc<Kernels>,
    main: Arc<CudaStream>,
    side: Arc<CudaStream>,
    fork: CudaEvent,
    join: CudaEvent,
    planner: Planner,
    config: PlanConfig,
    tables: HashMap<Signature, Arc<SegmentTable>>,
    /// A prefetch branch forked and not yet joined back into `main`.
    branch_open: bool,
    /// Whether the current forward is being captured (read from the stream at its start).
    captured: bool,
    persisting: Option<PersistingL2>,
    policy_window_set: bool,
    /// Learned byte caps that end each window's prefetch with its window.
    fit: WindowFit,
    /// Per window index of an eager forward: its start, its end and its prefetch's end.
    timing: Vec<WindowTiming>,
    /// A prefetched window whose end is recorded at its first `consume`.
    awaiting: Option<Measure>,
    /// A prefetch forked but not launched yet (launched at the first `consume`).
    deferred: Option<Deferred>,
    /// Windows with all three events recorded, not yet read.
    pending: Vec<Measure>,
    /// The device's L2 partitions, when measured ([`PlanConfig::partitions`]) and two.
    partitions: Option<Partitions>,
    /// Whether the GPU keeps up with the host in eager forwards ([`PlanConfig::host_pace`]).
    pace: HostPace,
}

/// Timing events of one window of an eager forward.
#[derive(Debug)]
struct WindowTiming {
    start: CudaEvent,
    end: CudaEvent,
    prefetch_end: CudaEvent,
}

/// A window's prefetch, forked and ready to launch.
#[derive(Clone, Copy, Debug)]
struct Deferred {
    variant: PrefetchVariant,
    params: PrefetchParams,
    blocks: u32,
    threads: u32,
    issued: u64,
    measure: Option<Measure>,
}

/// A prefetch being measured against its window.
#[derive(Clone, Copy, Debug)]
struct Measure {
    signature: Signature,
    k: usize,
    issued: u64,
    /// The window's first segment: the least a cap keeps.
    floor: u64,
}

impl L2Plan {
    /// A plan replaying on `main` through a side stream it creates now (so before any capture).
    /// [`Replay::AccessPolicy`] also sets aside L2 for persisting lines (the budget's size).
    pub fn new(kernels: Arc<Kernels>, main: Arc<CudaStream>, config: PlanConfig) -> Result<L2Plan> {
        if config.chunk == 0 || !config.chunk.is_multiple_of(SEGMENT_ALIGN as u32) {
            return Err(Error::invalid(
                "L2 plan chunk",
                format!("{} is not a positive multiple of 16", config.chunk),
            ));
        }
        if config.max_blocks == 0 || config.threads == 0 || config.threads > 1024 {
            return Err(Error::invalid(
                "L2 plan launch",
                format!("{} blocks x {} threads", config.max_blocks, config.threads),
            ));
        }
        let persisting = match config.replay {
            Replay::Auto | Replay::Prefetch { .. } => None,
            Replay::AccessPolicy => Some(PersistingL2::reserve(
                kernels.gpu(),
                config.budget_per_window,
            )?),
        };
        let partitions = match config.replay {
            Replay::AccessPolicy => None,
            _ if !config.partitions => None,
            _ => match Partitions::measure(&kernels, &main) {
                Ok(p) => {
                    log::info!("L2 plan: {p}");
                    p.two.then_some(p)
                }
                Err(e) => {
                    log::warn!(
                        "L2 plan: the L2 partitions were not measured ({e}); each byte is read once"
                    );
                    None
                }
            },
        };
        let ctx = main.context().clone();
        let pace = HostPace::new(&main)?;
        Ok(L2Plan {
            side: ctx.new_stream().call("cuStreamCreate")?,
            fork: ctx.new_event(None).call("cuEventCreate")?,
            join: ctx.new_event(None).call("cuEventCreate")?,
            planner: Planner::new(config.budget_per_window)?,
            kernels,
            main,
            config,
            tables: HashMap::new(),
            branch_open: false,
            captured: false,
            persisting,
            policy_window_set: false,
            fit: WindowFit::default(),
            timing: Vec::new(),
            awaiting: None,
            deferred: None,
            pending: Vec::new(),
            partitions,
            pace,
        })
    }

    pub fn counters(&self) -> Counters {
        self.planner.counters()
    }

    pub fn planner(&self) -> &Planner {
        &self.planner
    }

    pub fn config(&self) -> &PlanConfig {
        &self.config
    }

    /// The device's L2 partitions as the plan measured them, if it found two.
    pub fn partitions(&self) -> Option<&Partitions> {
        self.partitions.as_ref()
    }

    /// The side stream prefetches run on.
    pub fn side_stream(&self) -> &Arc<CudaStream> {
        &self.side
    }

    /// Moves the plan between forwards to another main stream of its context, for example the
    /// stream a framework captures a CUDA graph on. The side stream stays the plan's own.
    pub fn set_main_stream(&mut self, main: Arc<CudaStream>) -> Result<()> {
        if self.planner.current().is_some() {
            return Err(Error::invalid(
                "L2 plan main stream",
                "changed inside a forward; change it before begin_forward",
            ));
        }
        if !Arc::ptr_eq(main.context(), self.main.context()) {
            return Err(Error::invalid(
                "L2 plan main stream",
                "belongs to another CUDA context than the plan's",
            ));
        }
        self.main = main;
        Ok(())
    }

    /// Whether all-gather windows are warmed ([`PlanConfig::all_gather`]), from the next
    /// collective on.
    pub fn set_all_gather(&mut self, enabled: bool) {
        self.config.all_gather = enabled;
    }

    /// Whether eager windows are left cold while the GPU keeps up with the host
    /// ([`PlanConfig::host_pace`]), from the next collective on.
    pub fn set_host_pace(&mut self, enabled: bool) {
        self.config.host_pace = enabled;
    }

    /// Changes the budget per window for plans learned from now on.
    pub fn set_budget(&mut self, budget_per_window: u64) -> Result<()> {
        self.planner.set_budget(budget_per_window)?;
        self.config.budget_per_window = self.planner.budget();
        Ok(())
    }

    /// Starts a forward of `signature` on the main stream; whether it is being captured into a
    /// graph is read from the stream.
    pub fn begin_forward(&mut self, signature: Signature) -> Result<()> {
        let captured = capturing(&self.main)?;
        if !captured {
            // The events are re-recorded from here on: what has not completed is dropped.
            self.read_measures(true)?;
        }
        self.planner.begin(signature, captured)?;
        self.pace.begin_forward();
        // Read once a forward: a forward is captured whole or not at all, and `collective` is
        // called once a window, so it asks the driver nothing it need not.
        self.captured = captured;
        Ok(())
    }

    /// The cap learned for window `k` of `signature` (bytes its prefetch keeps), if measured.
    pub fn window_cap(&self, signature: Signature, k: usize) -> Option<u64> {
        self.config
            .fit
            .then(|| self.fit.cap(signature, k))
            .flatten()
    }

    /// Call before launching each collective on the main stream: joins the previous window's
    /// prefetch and forks this window's.
    ///
    /// In eager forwards the plan also times each prefetched window against its prefetch (the
    /// window ends at the first `consume` after the collective) and, from the next eager
    /// forward on, caps the window's bytes to what its prefetch issues within it
    /// (`WindowFit`); a captured forward uses the caps learned so far.
    pub fn collective(&mut self) -> Result<()> {
        self.collective_of(CollectiveKind::AllReduce)
    }

    /// [`L2Plan::collective`] for a collective of `kind`: with [`PlanConfig::all_gather`] off,
    /// an all-gather's window is counted but not warmed.
    pub fn collective_of(&mut self, kind: CollectiveKind) -> Result<()> {
        let _nvtx = crate::nvtx::range(c"fetchahead.l2_window");
        // The last window's prefetch goes out if its reader never came; it is not joined here.
        // A prefetch writes nothing the main stream reads, and the side stream runs the windows'
        // prefetches in order, so the branch is joined once, at `end_forward`: inside a replayed
        // graph each wait of the main chain on the branch cost it 0.7-3 us on the H200
        // (`benches/cuda/graph_join_probe.cu`), 138 of them a decode step.
        self.launch_deferred()?;
        // A window whose reader never reported its weights is not measured.
        self.awaiting = None;
        let signature = self.planner.current().ok_or_else(no_forward)?;
        let captured = self.captured;
        let (k, _) = self.planner.collective()?;
        let host_bound = !captured && self.config.host_pace && self.pace.host_bound(k)?;
        // A window the fit still times is warmed all the same: a capture after host-bound
        // warm-up forwards needs its cut.
        let measuring = self.config.fit && self.fit.wants_measure(signature, k);
        if host_bound && !measuring {
            // The GPU has caught up with the host: a warmed reader would only idle sooner.
            if self
                .planner
                .plan(signature)
                .is_some_and(|w| w.spans.get(k).is_some_and(|s| s.len > 0))
            {
                self.planner.count_host_bound();
            }
            return Ok(());
        }
        if kind == CollectiveKind::AllGather && !self.config.all_gather {
            return Ok(());
        }
        let Some(span) = self
            .planner
            .plan(signature)
            .and_then(|w| w.spans.get(k))
            .copied()
        else {
            return Ok(());
        };
        let Some(table) = self.tables.get(&signature).cloned() else {
            return Ok(());
        };
        match self.config.replay {
            Replay::Auto | Replay::Prefetch { .. } => {
                self.fork_prefetch(signature, k, span, &table, measuring)
            }
            Replay::AccessPolicy if !captured => self.set_policy_window(signature, k),
            Replay::AccessPolicy => Ok(()),
        }
    }

    /// Forks window `k`'s prefetch (`span` of `table`) onto the side stream, cut to the
    /// window's learned cap and timed while the fit is still `measuring` it (eager forwards
    /// only); launched now or at the first `consume` ([`PlanConfig::launch`]).
    fn fork_prefetch(
        &mut self,
        signature: Signature,
        k: usize,
        span: Span,
        table: &SegmentTable,
        measuring: bool,
    ) -> Result<()> {
        let captured = self.captured;
        let window = self
            .planner
            .plan(signature)
            .map_or(&[][..], |w| w.window(k));
        let Some(first) = window.first() else {
            return Ok(());
        };
        let n = match self.window_cap(signature, k) {
            Some(cap) => WindowFit::prefix_within(window.iter().map(|s| s.bytes), cap),
            None => span.len,
        };
        let issued = window[..n].iter().map(|s| s.bytes).sum();
        let floor = first.bytes;
        let gpu = self.kernels.gpu();
        let (variant, sms) = prefetch_choice(
            &self.config,
            captured,
            issued,
            (gpu.l2_bytes, gpu.multiprocessors),
            self.kernels.holds(l2_prefetch::COPIES_VARIANT.name()),
        );
        let (blocks, threads) = l2_prefetch::launch_shape(
            variant,
            n as u32,
            sms,
            self.config.max_blocks,
            self.config.threads,
        );
        let (partitions, claims) = match variant.variant().method {
            l2_prefetch::Method::Loads | l2_prefetch::Method::Copies => table.partitioned(),
            _ => (0, 0),
        };
        let measure = (!captured && measuring).then_some(Measure {
            signature,
            k,
            issued,
            floor,
        });
        if measure.is_some() {
            self.start_timing(k)?;
        }
        let params = PrefetchParams {
            segments: table.address_of(span.start),
            n: n as u64,
            chunk: self.config.chunk,
            // Read only with a partition map (the loads variant's), ignored otherwise.
            once_jobs: super::planner::once_jobs(
                issued,
                self.kernels.gpu().l2_bytes,
                self.config.twice_fit,
            ),
            partitions,
            claims,
            timeline: fetchahead_gpu::params::TimelineParams::OFF,
        };
        self.fork.record(&self.main).call("cuEventRecord")?;
        self.side.wait(&self.fork).call("cuStreamWaitEvent")?;
        self.deferred = Some(Deferred {
            variant,
            params,
            blocks,
            threads,
            issued,
            measure,
        });
        if self.config.launch.before_collective(captured) {
            self.launch_deferred()?;
        }
        Ok(())
    }

    /// Records window `k`'s start on the main stream, making its timing events on first use.
    fn start_timing(&mut self, k: usize) -> Result<()> {
        let ctx = self.main.context();
        while self.timing.len() <= k {
            let event = || {
                ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .call("cuEventCreate")
            };
            self.timing.push(WindowTiming {
                start: event()?,
                end: event()?,
                prefetch_end: event()?,
            });
        }
        self.timing[k]
            .start
            .record(&self.main)
            .call("cuEventRecord")
    }

    /// [`Replay::AccessPolicy`], eagerly: the main stream's access-policy window over window
    /// `k`'s leading contiguous run (a tensor's pieces), what one address range can cover.
    fn set_policy_window(&mut self, signature: Signature, k: usize) -> Result<()> {
        let lead = self.planner.plan(signature).and_then(|w| {
            let window = w.window(k);
            let first = window.first()?;
            let bytes = window
                .windows(2)
                .take_while(|p| p[0].address + p[0].bytes == p[1].address)
                .fold(first.bytes, |sum, p| sum + p[1].bytes);
            Some(Segment {
                address: first.address,
                bytes,
            })
        });
        if let (Some(lead), Some(persisting)) = (lead, &self.persisting) {
            let window = persisting.window(lead.address, lead.bytes);
            persisting.set_stream_window(&self.main, Some(window))?;
            self.policy_window_set = true;
            self.planner.count_prefetch(window.bytes);
        }
        Ok(())
    }

    /// A kernel after the latest collective consumes `bytes` of weights at `address` (a live
    /// device allocation for as long as this plan may prefetch it).
    pub fn consume(&mut self, address: u64, bytes: u64) -> Result<()> {
        self.launch_deferred()?;
        self.planner.consume(address, bytes)?;
        if let Some(k) = self.planner.latest_window()
            && !self.captured
            && self.config.host_pace
        {
            self.pace.reader_point(k, &self.main)?;
        }
        if let Some(measure) = self.awaiting.take() {
            // Recorded before the reader's launch: it completes when the collective has.
            self.timing[measure.k]
                .end
                .record(&self.main)
                .call("cuEventRecord")?;
            self.pending.push(measure);
        }
        Ok(())
    }

    /// Launches the forked prefetch, if one waits, on the side stream.
    fn launch_deferred(&mut self) -> Result<()> {
        let _nvtx = crate::nvtx::range(c"fetchahead.l2_window.prefetch");
        let Some(d) = self.deferred.take() else {
            return Ok(());
        };
        // SAFETY: the table holds the plan's segments (checked when uploaded), the window's
        // first `params.n` at `params.segments`, inside weights the caller reported as live
        // device memory; the table lives as long as the plan (or the captured graph's outcome).
        unsafe {
            self.kernels.launch_l2_prefetch(
                self.side.cu_stream(),
                d.variant,
                d.params,
                d.blocks,
                d.threads,
            )
        }?;
        if let Some(measure) = d.measure {
            let timing = &self.timing[measure.k];
            timing
                .prefetch_end
                .record(&self.side)
                .call("cuEventRecord")?;
            self.awaiting = Some(measure);
        }
        self.branch_open = true;
        self.planner.count_prefetch(d.issued);
        Ok(())
    }

    /// Reads the measured windows whose events have completed into the caps; the others are
    /// kept, or dropped with `drop_incomplete`. Never waits.
    fn read_measures(&mut self, drop_incomplete: bool) -> Result<()> {
        let mut i = 0;
        while i < self.pending.len() {
            let m = self.pending[i];
            let t = &self.timing[m.k];
            let done = t.end.try_is_complete().call("cuEventQuery")?
                && t.prefetch_end.try_is_complete().call("cuEventQuery")?;
            if !done {
                if drop_incomplete {
                    self.pending.swap_remove(i);
                } else {
                    i += 1;
                }
                continue;
            }
            let ns = |end: &CudaEvent| -> Result<f64> {
                Ok(t.start.elapsed_ms(end).call("cuEventElapsedTime")? as f64 * 1e6)
            };
            let (window_ns, prefetch_ns) = (ns(&t.end)?, ns(&t.prefetch_end)?);
            let cap = self
                .fit
                .observe(m.signature, m.k, m.issued, window_ns, prefetch_ns, m.floor);
            log::debug!(
                "L2 plan {:?} window {}: {} bytes issued in {:.1} us, window {:.1} us: cap {}",
                m.signature,
                m.k,
                m.issued,
                prefetch_ns / 1e3,
                window_ns / 1e3,
                cap
            );
            self.pending.swap_remove(i);
        }
        Ok(())
    }

    /// Ends the forward: joins the last prefetch, learns, and (eager forwards only) uploads a
    /// changed plan's segment table in the main stream's order.
    pub fn end_forward(&mut self) -> Result<ForwardOutcome> {
        if let Err(e) = self.join_branch() {
            self.planner.abort();
            return Err(e);
        }
        if self.policy_window_set {
            if let Some(persisting) = &self.persisting {
                persisting.set_stream_window(&self.main, None)?;
            }
            self.policy_window_set = false;
        }
        self.awaiting = None;
        let summary = self.planner.end()?;
        if !summary.captured {
            self.read_measures(false)?;
        }
        if matches!(summary.learned, Learned::New | Learned::Replaced) {
            let segments = self
                .planner
                .plan(summary.signature)
                .map_or(&[][..], |w| w.segments());
            // The old table (if any) is freed in the main stream's order, after every prefetch
            // that read it: those were joined into the main stream.
            let map = self.partitions.as_ref().map(|p| &p.of_sm);
            let table = Arc::new(SegmentTable::upload_with(&self.main, segments, map)?);
            self.tables.insert(summary.signature, table);
        }
        if summary.new_signature {
            let windows = self.planner.plan(summary.signature).map_or(0, |w| w.len());
            log::info!(
                "L2 plan: new signature {:?}: {} windows, {} bytes; counters {:?}",
                summary.signature,
                windows,
                self.planner.plan(summary.signature).map_or(0, |w| w
                    .segments()
                    .iter()
                    .map(|s| s.bytes)
                    .sum::<u64>()),
                self.planner.counters()
            );
        }
        let tables = if summary.captured {
            self.tables.get(&summary.signature).cloned()
        } else {
            None
        };
        Ok(ForwardOutcome { summary, tables })
    }

    fn join_branch(&mut self) -> Result<()> {
        self.launch_deferred()?;
        if self.branch_open {
            // The side stream runs the windows in order: its last point joins them all.
            self.join.record(&self.side).call("cuEventRecord")?;
            self.main.wait(&self.join).call("cuStreamWaitEvent")?;
            self.branch_open = false;
        }
        Ok(())
    }
}

impl Drop for L2Plan {
    /// A forward left open may still have a prefetch on the side stream: the main stream waits
    /// for it before the tables are freed in its order.
    fn drop(&mut self) {
        if self.branch_open {
            let ctx = self.main.context();
            ctx.record_err(self.join.record(&self.side));
            ctx.record_err(self.main.wait(&self.join));
        }
    }
}

/// Whether `stream` is capturing into a graph.
fn capturing(stream: &CudaStream) -> Result<bool> {
    // SAFETY: a status query on a live stream of its own context.
    let status = unsafe { stream::capture_status(stream.context(), stream.cu_stream()) }?;
    match status {
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => Ok(false),
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => Ok(true),
        _ => Err(Error::invalid(
            "L2 plan forward",
            "the main stream's capture was invalidated",
        )),
    }
}
