//! `L2Plan`: learns which weights follow each collective of a forward, and warms them into L2
//! while the next forward's collective runs.
//!
//! Learning: the caller brackets a forward with a [`Signature`] it chooses, announces each
//! collective before launching it, and reports every weight a kernel consumes. Per signature the
//! plan keeps, for each collective, the weights consumed after it, in order, up to a byte budget
//! per window. Replay: before collective `k` the plan forks a side stream from the main stream,
//! prefetches window `k` there, and joins it back at the next collective or at the end of the
//! forward; inside a CUDA graph capture the fork and join become a graph branch.
//!
//! The rules that keep a plan harmless: a prefetch is only a cache hint, so a stale plan can
//! only waste bandwidth; a forward with more collectives than learned prefetches nothing past the
//! plan; an eager forward that saw no collectives never replaces a learned plan; a signature is
//! frozen once captured, and the segment tables a capture used live as long as the plan (and as
//! long as the caller keeps the [`ForwardOutcome::tables`] it got back).
//!
//! [`Planner`] is the plan logic alone, on the CPU; [`L2Plan`] drives the device with it.
use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream, sys};
use fetchahead_gpu::l2_prefetch;
use fetchahead_gpu::params::{PrefetchParams, Segment};

use crate::access_policy::PersistingL2;
use crate::error::CudaCall;
use crate::kernels::Kernels;
use crate::segments::{SEGMENT_ALIGN, SegmentTable, aligned_segment};
use crate::window_fit::WindowFit;
use crate::{Error, Result};

/// What the caller says identifies a forward's shape (for example tokens in the batch and the
/// forward mode); forwards of one signature are expected to consume the same weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Signature(pub u64);

impl Signature {
    /// A signature from a token count and a caller-defined mode number.
    pub fn new(tokens: u32, mode: u32) -> Signature {
        Signature((mode as u64) << 32 | tokens as u64)
    }
}

/// The largest segment a window holds: a tensor is cut into pieces of this size so that one
/// large weight still spreads its prefetch over several blocks (blocks stride over segments).
pub const SEGMENT_PIECE: u64 = 512 << 10;

/// The default budget per window: a tenth of L2 (6 MiB of the H200's 60 MiB, 2.4 MiB of the
/// DGX Spark's 24 MiB), leaving the rest to the collective's and the reader's own traffic.
pub fn default_budget(l2_bytes: u64) -> u64 {
    let budget = l2_bytes / 10;
    (budget - budget % SEGMENT_ALIGN).max(SEGMENT_ALIGN)
}

/// The most bytes a window may have for [`Replay::Auto`] to read it in with loads: a third of
/// L2 (16-byte multiple). On the H200 (60 MiB L2, 2026-11-29) a GEMV after a load-read window
/// of 8 or 16 MiB ran faster than after a bulk-prefetched one, after 32 MiB slower (BENCHMARKS.md).
pub fn read_limit(l2_bytes: u64) -> u64 {
    let limit = l2_bytes / 3;
    limit - limit % SEGMENT_ALIGN
}

/// The prefetch variant [`Replay::Auto`] warms a window of `bytes` with on a device with
/// `l2_bytes` of L2: loads up to [`read_limit`], the bulk prefetch above.
pub fn auto_variant(bytes: u64, l2_bytes: u64) -> usize {
    if bytes <= read_limit(l2_bytes) {
        l2_prefetch::LOADS_VARIANT
    } else {
        l2_prefetch::BULK_VARIANT
    }
}

/// How a learned window is warmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replay {
    /// The default: a window of at most [`read_limit`] bytes is read in by the SMs
    /// (`l2_prefetch_loads`), a larger one bulk-prefetched (`l2_prefetch`), on a side stream.
    Auto,
    /// `l2_prefetch::VARIANTS[variant]` on a side stream (0: plain bulk, 1: evict_last, 2: a
    /// prefetch per 128-byte line, 3: loads).
    Prefetch { variant: usize },
    /// The main stream's access-policy window set over the window's first weight (persisting
    /// lines in the L2 set-aside). Eager forwards only: a captured forward gets no window.
    AccessPolicy,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlanConfig {
    /// Bytes kept per window (rounded down to 16).
    pub budget_per_window: u64,
    /// Bytes per prefetch instruction (a multiple of 16).
    pub chunk: u32,
    /// Prefetch blocks of the bulk and per-line variants: `min(segments, max_blocks)`. The loads
    /// variant runs `l2_prefetch::LOADS_BLOCKS_PER_SEGMENT` blocks a segment, up to one an SM.
    pub max_blocks: u32,
    /// Threads per block of the bulk and per-line variants (the loads variant's:
    /// `l2_prefetch::LOADS_THREADS`).
    pub threads: u32,
    pub replay: Replay,
    /// When the host launches a window's prefetch (it runs alongside the collective either way).
    pub launch: PrefetchLaunch,
}

/// When the host launches a window's prefetch on the side stream. The side stream always waits
/// for the main stream's point before the collective, so the prefetch runs alongside it either
/// way; what differs is which launch comes first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefetchLaunch {
    /// At `collective()`, before the caller launches the collective.
    BeforeCollective,
    /// At the first `consume()` after the collective (the caller has launched it by then), or
    /// at the next `collective()` / `end_forward()` when nothing was consumed. In a captured
    /// graph the collective's node is then created first; on the H200 a prefetch node created
    /// first delayed the collective's start by about 1.8 us in replay.
    AfterCollective,
}

impl PlanConfig {
    /// The defaults for a device with `l2_bytes` of L2: [`default_budget`], [`Replay::Auto`],
    /// and for bulk prefetches 16 KiB chunks and `min(n, 8)` blocks of 64 threads.
    pub fn for_l2(l2_bytes: u64) -> PlanConfig {
        PlanConfig {
            budget_per_window: default_budget(l2_bytes),
            chunk: l2_prefetch::DEFAULT_CHUNK,
            max_blocks: l2_prefetch::DEFAULT_MAX_BLOCKS,
            threads: l2_prefetch::DEFAULT_THREADS,
            replay: Replay::Auto,
            launch: PrefetchLaunch::AfterCollective,
        }
    }
}

/// What the plan did so far, readable at any time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Windows whose prefetch (or access-policy window) was issued from the host; a captured
    /// forward counts once, at capture, however often its graph is replayed.
    pub windows_prefetched: u64,
    /// Bytes those windows cover.
    pub bytes_prefetched: u64,
    /// Forwards that began with no learned segment for their signature.
    pub forwards_without_plan: u64,
    /// Captured forwards whose collectives or weights differed from the frozen plan.
    pub mismatches_at_capture: u64,
    pub forwards: u64,
    /// Signatures with a stored plan.
    pub signatures: u64,
}

/// One collective's learned weights, as a range of [`Windows::segments`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Span {
    start: usize,
    len: usize,
    bytes: u64,
}

/// A forward's windows: one per collective, each the weights consumed after it, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Windows {
    segments: Vec<Segment>,
    spans: Vec<Span>,
}

impl Windows {
    /// Collectives seen (windows, empty ones included).
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The segments of window `k`, in consumption order (empty past the last window).
    pub fn window(&self, k: usize) -> &[Segment] {
        self.spans
            .get(k)
            .and_then(|s| self.segments.get(s.start..s.start + s.len))
            .unwrap_or(&[])
    }

    /// Bytes window `k` covers.
    pub fn window_bytes(&self, k: usize) -> u64 {
        self.spans.get(k).map_or(0, |s| s.bytes)
    }

    /// Every segment, window after window (the layout of the device table).
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    fn clear(&mut self) {
        self.segments.clear();
        self.spans.clear();
    }

    fn open_window(&mut self) {
        self.spans.push(Span {
            start: self.segments.len(),
            len: 0,
            bytes: 0,
        });
    }

    /// Appends `s` to the last window, trimmed to what is left of `budget` and cut into pieces
    /// of at most [`SEGMENT_PIECE`] bytes; a weight whose start the window already covers (the
    /// same tensor consumed twice) is skipped.
    fn push_within(&mut self, s: Segment, budget: u64) {
        let Some(span) = self.spans.last_mut() else {
            return;
        };
        let window = self.segments.get(span.start..).unwrap_or(&[]);
        if window
            .iter()
            .any(|w| w.address <= s.address && s.address - w.address < w.bytes)
        {
            return;
        }
        let mut left = s.bytes.min(budget.saturating_sub(span.bytes));
        let mut address = s.address;
        while left > 0 {
            let bytes = left.min(SEGMENT_PIECE);
            self.segments.push(Segment { address, bytes });
            span.len += 1;
            span.bytes += bytes;
            address += bytes;
            left -= bytes;
        }
    }
}

/// How a forward's end changed its signature's plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learned {
    /// The first plan of this signature.
    New,
    /// A different plan replaced the learned one.
    Replaced,
    /// The forward matched the learned plan.
    Unchanged,
    /// The forward saw no collectives; the learned plan (if any) stays.
    NoCollectives,
    /// The signature is frozen (captured before); an eager forward leaves it as it is.
    Frozen,
    /// A captured forward froze the signature; `mismatch` when it differed from the plan.
    Captured { mismatch: bool },
}

/// What one forward did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForwardSummary {
    pub signature: Signature,
    pub collectives: usize,
    pub captured: bool,
    pub learned: Learned,
    /// This forward stored the signature's first plan (logged once).
    pub new_signature: bool,
}

#[derive(Clone, Debug)]
struct LearnedPlan {
    windows: Windows,
    frozen: bool,
}

#[derive(Clone, Copy, Debug)]
struct OpenForward {
    signature: Signature,
    captured: bool,
    collectives: usize,
}

/// The plan logic, without a device: learning, budget trimming, relearning, freezing, mismatch
/// counting. Nothing here allocates per forward once its buffers have grown to the largest
/// forward, except when a plan is stored or replaced.
#[derive(Debug)]
pub struct Planner {
    budget: u64,
    plans: HashMap<Signature, LearnedPlan>,
    open: Option<OpenForward>,
    observed: Windows,
    counters: Counters,
}

impl Planner {
    /// A planner keeping up to `budget_per_window` bytes per window (rounded down to 16; at
    /// least 16).
    pub fn new(budget_per_window: u64) -> Result<Planner> {
        let budget = budget_per_window - budget_per_window % SEGMENT_ALIGN;
        if budget == 0 {
            return Err(Error::invalid(
                "L2 plan budget",
                format!("{budget_per_window} bytes per window is below 16"),
            ));
        }
        Ok(Planner {
            budget,
            plans: HashMap::new(),
            open: None,
            observed: Windows::default(),
            counters: Counters::default(),
        })
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Changes the budget; plans learned from now on use it.
    pub fn set_budget(&mut self, budget_per_window: u64) -> Result<()> {
        let fresh = Planner::new(budget_per_window)?;
        self.budget = fresh.budget;
        Ok(())
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// The learned windows of `signature`.
    pub fn plan(&self, signature: Signature) -> Option<&Windows> {
        self.plans.get(&signature).map(|p| &p.windows)
    }

    pub fn is_frozen(&self, signature: Signature) -> bool {
        self.plans.get(&signature).is_some_and(|p| p.frozen)
    }

    /// The signature of the forward in progress.
    pub fn current(&self) -> Option<Signature> {
        self.open.map(|f| f.signature)
    }

    /// Starts a forward; `captured` when its launches go into a CUDA graph.
    pub fn begin(&mut self, signature: Signature, captured: bool) -> Result<()> {
        if let Some(open) = self.open {
            return Err(Error::invalid(
                "L2 plan forward",
                format!(
                    "{:?} began while {:?} is still open",
                    signature, open.signature
                ),
            ));
        }
        self.observed.clear();
        self.open = Some(OpenForward {
            signature,
            captured,
            collectives: 0,
        });
        self.counters.forwards += 1;
        let planned = self
            .plans
            .get(&signature)
            .is_some_and(|p| !p.windows.segments.is_empty());
        if !planned {
            self.counters.forwards_without_plan += 1;
        }
        Ok(())
    }

    /// A collective is about to start: returns its index `k` and the learned window `k` to warm
    /// (empty past the plan, or without one).
    pub fn collective(&mut self) -> Result<(usize, &[Segment])> {
        let open = self.open.as_mut().ok_or_else(no_forward)?;
        let k = open.collectives;
        open.collectives += 1;
        self.observed.open_window();
        let window = self
            .plans
            .get(&open.signature)
            .map_or(&[][..], |p| p.windows.window(k));
        Ok((k, window))
    }

    /// A kernel after the latest collective consumes `bytes` of weights at `address`: kept,
    /// trimmed to its 16-byte aligned part and to the window's budget. Weights consumed before
    /// the first collective have no window and are ignored. A null address is an error.
    pub fn consume(&mut self, address: u64, bytes: u64) -> Result<()> {
        if self.open.is_none() {
            return Err(no_forward());
        }
        if let Some(segment) = aligned_segment(address, bytes)? {
            self.observed.push_within(segment, self.budget);
        }
        Ok(())
    }

    /// Records that the replay issued a window of `bytes`.
    pub fn count_prefetch(&mut self, bytes: u64) {
        self.counters.windows_prefetched += 1;
        self.counters.bytes_prefetched += bytes;
    }

    /// Ends the forward and learns from it.
    pub fn end(&mut self) -> Result<ForwardSummary> {
        let open = self.open.take().ok_or_else(no_forward)?;
        let existing = self.plans.get_mut(&open.signature);
        let had_plan = existing.is_some();
        let learned = match existing {
            Some(plan) if open.captured => {
                let mismatch = plan.windows != self.observed;
                plan.frozen = true;
                Learned::Captured { mismatch }
            }
            None if open.captured => {
                // Nothing was prefetched into this graph; freeze an empty plan all the same.
                let mismatch = !self.observed.segments.is_empty();
                self.plans.insert(
                    open.signature,
                    LearnedPlan {
                        windows: Windows::default(),
                        frozen: true,
                    },
                );
                Learned::Captured { mismatch }
            }
            Some(plan) if plan.frozen => Learned::Frozen,
            _ if open.collectives == 0 => Learned::NoCollectives,
            Some(plan) if plan.windows == self.observed => Learned::Unchanged,
            Some(plan) => {
                plan.windows.clone_from(&self.observed);
                Learned::Replaced
            }
            None => {
                self.plans.insert(
                    open.signature,
                    LearnedPlan {
                        windows: self.observed.clone(),
                        frozen: false,
                    },
                );
                Learned::New
            }
        };
        if let Learned::Captured { mismatch: true } = learned {
            self.counters.mismatches_at_capture += 1;
        }
        let new_signature = !had_plan && self.plans.contains_key(&open.signature);
        if new_signature {
            self.counters.signatures += 1;
        }
        Ok(ForwardSummary {
            signature: open.signature,
            collectives: open.collectives,
            captured: open.captured,
            learned,
            new_signature,
        })
    }

    /// Drops the forward in progress without learning from it (its launches failed).
    pub fn abort(&mut self) {
        self.open = None;
    }

    /// Forgets every plan that is not frozen (for example after weights moved).
    pub fn forget_unfrozen(&mut self) {
        self.plans.retain(|_, p| p.frozen);
        self.counters.signatures = self.plans.len() as u64;
    }
}

fn no_forward() -> Error {
    Error::invalid(
        "L2 plan forward",
        "no forward is open (call begin_forward first)",
    )
}

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
    persisting: Option<PersistingL2>,
    policy_window_set: bool,
    /// Learned byte caps that end each window's prefetch with its window.
    fit: WindowFit,
    /// Per window index of an eager forward: its start, its end and its prefetch's end.
    timing: Vec<WindowTiming>,
    /// A prefetched window whose end is recorded at its first `consume`.
    awaiting: Option<Measure>,
    /// A prefetch forked but not launched yet ([`PrefetchLaunch::AfterCollective`]).
    deferred: Option<Deferred>,
    /// Windows with all three events recorded, not yet read.
    pending: Vec<Measure>,
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
    variant: usize,
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
            Replay::Prefetch { variant } if variant >= l2_prefetch::VARIANTS.len() => {
                return Err(Error::invalid(
                    "L2 plan replay",
                    format!("no prefetch variant {variant}"),
                ));
            }
            Replay::Auto | Replay::Prefetch { .. } => None,
            Replay::AccessPolicy => Some(PersistingL2::reserve(
                kernels.gpu(),
                config.budget_per_window,
            )?),
        };
        let ctx = main.context().clone();
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
            persisting,
            policy_window_set: false,
            fit: WindowFit::default(),
            timing: Vec::new(),
            awaiting: None,
            deferred: None,
            pending: Vec::new(),
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
        self.planner.begin(signature, captured)
    }

    /// The cap learned for window `k` of `signature` (bytes its prefetch keeps), if measured.
    pub fn window_cap(&self, signature: Signature, k: usize) -> Option<u64> {
        self.fit.cap(signature, k)
    }

    /// Call before launching each collective on the main stream: joins the previous window's
    /// prefetch and forks this window's.
    ///
    /// In eager forwards the plan also times each prefetched window against its prefetch (the
    /// window ends at the first `consume` after the collective) and, from the next eager
    /// forward on, caps the window's bytes to what its prefetch issues within it
    /// ([`WindowFit`]); a captured forward uses the caps learned so far.
    pub fn collective(&mut self) -> Result<()> {
        self.join_branch()?;
        // A window whose reader never reported its weights is not measured.
        self.awaiting = None;
        let signature = self.planner.current().ok_or_else(no_forward)?;
        let captured = capturing(&self.main)?;
        let (k, _) = self.planner.collective()?;
        let Some(span) = self
            .planner
            .plan(signature)
            .and_then(|w| w.spans.get(k))
            .copied()
        else {
            return Ok(());
        };
        // The window's leading contiguous run (a tensor's pieces): what an access-policy
        // window, one address range, can cover.
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
        let (Some(lead), Some(table)) = (lead, self.tables.get(&signature)) else {
            return Ok(());
        };
        match self.config.replay {
            Replay::Auto | Replay::Prefetch { .. } => {
                let window = self
                    .planner
                    .plan(signature)
                    .map_or(&[][..], |w| w.window(k));
                let Some(first) = window.first() else {
                    return Ok(());
                };
                let n = match self.fit.cap(signature, k) {
                    Some(cap) => WindowFit::prefix_within(window.iter().map(|s| s.bytes), cap),
                    None => span.len,
                };
                let issued = window[..n].iter().map(|s| s.bytes).sum();
                let variant = match self.config.replay {
                    Replay::Prefetch { variant } => variant,
                    _ => auto_variant(issued, self.kernels.gpu().l2_bytes),
                };
                let (blocks, threads) = l2_prefetch::launch_shape(
                    variant,
                    n as u32,
                    self.kernels.gpu().multiprocessors,
                    self.config.max_blocks,
                    self.config.threads,
                );
                let measure =
                    (!captured && self.fit.wants_measure(signature, k)).then_some(Measure {
                        signature,
                        k,
                        issued,
                        floor: first.bytes,
                    });
                if measure.is_some() {
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
                        .call("cuEventRecord")?;
                }
                self.fork.record(&self.main).call("cuEventRecord")?;
                self.side.wait(&self.fork).call("cuStreamWaitEvent")?;
                self.deferred = Some(Deferred {
                    variant,
                    params: PrefetchParams {
                        segments: table.address_of(span.start),
                        n: n as u64,
                        chunk: self.config.chunk,
                        _pad: 0,
                    },
                    blocks,
                    threads,
                    issued,
                    measure,
                });
                if self.config.launch == PrefetchLaunch::BeforeCollective {
                    self.launch_deferred()?;
                }
            }
            Replay::AccessPolicy => {
                if captured {
                    return Ok(());
                }
                if let Some(persisting) = &self.persisting {
                    let window = persisting.window(lead.address, lead.bytes);
                    persisting.set_stream_window(&self.main, Some(window))?;
                    self.policy_window_set = true;
                    self.planner.count_prefetch(window.bytes);
                }
            }
        }
        Ok(())
    }

    /// A kernel after the latest collective consumes `bytes` of weights at `address` (a live
    /// device allocation for as long as this plan may prefetch it).
    pub fn consume(&mut self, address: u64, bytes: u64) -> Result<()> {
        self.launch_deferred()?;
        self.planner.consume(address, bytes)?;
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
        self.join.record(&self.side).call("cuEventRecord")?;
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
            let table = Arc::new(SegmentTable::upload(&self.main, segments)?);
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
            ctx.record_err(self.main.wait(&self.join));
        }
    }
}

/// Whether `stream` is capturing into a graph.
fn capturing(stream: &CudaStream) -> Result<bool> {
    let status = stream.capture_status().call("cuStreamIsCapturing")?;
    match status {
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => Ok(false),
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => Ok(true),
        _ => Err(Error::invalid(
            "L2 plan forward",
            "the main stream's capture was invalidated",
        )),
    }
}
