//! [`Planner`]: the plan logic alone, on the CPU (no device), and the plan's configuration.
//! The module doc of [`crate::l2_plan`] says what a plan learns and the rules that keep it
//! harmless.
use std::collections::HashMap;

use fetchahead_gpu::l2_prefetch::{self, PrefetchVariant};
use fetchahead_gpu::params::Segment;

use crate::l2_plan::segments::{SEGMENT_ALIGN, aligned_segment};
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
// The partitioned reads (loads and copies) count a piece as this many jobs.
const _: () = assert!(SEGMENT_PIECE == l2_prefetch::JOBS_PER_SEGMENT * l2_prefetch::LOADS_JOB);

/// The default cap on what one window warms: half of L2 (30 MiB of the H200's 60 MiB, 12 MiB of
/// the DGX Spark's 24 MiB). It is a cap, not the amount: each window's bytes are then cut to
/// what its prefetch issues within the window (`window_fit`), so a window long enough for a
/// whole weight warms all of it, and a short one what fits. Raise it with
/// [`PlanConfig::budget_per_window`] or `FETCHAHEAD_L2_BUDGET_MB`. On the H200 (2026-12-01, the
/// decode-step bench, rows resident) the plan saved 0.234 ms a replayed step with 30 MiB a
/// window against 0.078 ms with a tenth of L2, and 0.350 ms against 0.183 ms eagerly.
pub fn default_budget(l2_bytes: u64) -> u64 {
    let budget = l2_bytes / 2;
    (budget - budget % SEGMENT_ALIGN).max(SEGMENT_ALIGN)
}

/// The most bytes a window may have for [`Replay::Auto`] to read it in with loads: half of L2
/// (16-byte multiple), so that every window of the default budget is read in. On the H200
/// (2026-12-01) lines read in by the SMs gave a reader 0.9-1.0 of a warm reader's speed at 6 to
/// 28 MiB, lines bulk-prefetched 0.2-0.7 (`benches/cuda/l2_warm_probe.cu`, L2 full of clean
/// lines), and in the decode step 30 MiB windows saved 0.350 ms eagerly read in against 0.267
/// ms with the bulk prefetch above 20 MiB.
pub fn read_limit(l2_bytes: u64) -> u64 {
    let limit = l2_bytes / 2;
    limit - limit % SEGMENT_ALIGN
}

/// The prefetch variant [`Replay::Auto`] warms a window of `bytes` with on a device with
/// `l2_bytes` of L2: loads up to [`read_limit`], the bulk prefetch above.
pub fn auto_variant(bytes: u64, l2_bytes: u64) -> PrefetchVariant {
    if bytes <= read_limit(l2_bytes) {
        l2_prefetch::LOADS_VARIANT
    } else {
        l2_prefetch::BULK_VARIANT
    }
}

/// The variant a window's prefetch of `issued` bytes runs and the SMs it may use, on a device
/// of `(l2_bytes, multiprocessors)` whose loaded PTX holds `l2_prefetch_copies` or not: the
/// variant [`PlanConfig::replay`] names or [`auto_variant`]'s on all SMs but
/// [`PlanConfig::free_sms`], except that under [`Replay::Auto`] a `captured` window the loads
/// would read goes to the copies on [`PlanConfig::graph_sms`] SMs.
pub fn prefetch_choice(
    config: &PlanConfig,
    captured: bool,
    issued: u64,
    (l2_bytes, multiprocessors): (u64, u32),
    copies_loaded: bool,
) -> (PrefetchVariant, u32) {
    let variant = match config.replay {
        Replay::Prefetch { variant } => variant,
        _ => auto_variant(issued, l2_bytes),
    };
    let graph = config
        .graph_sms
        .unwrap_or_else(|| graph_sms(multiprocessors))
        .min(multiprocessors);
    if captured
        && graph > 0
        && config.replay == Replay::Auto
        && variant == l2_prefetch::LOADS_VARIANT
        && copies_loaded
    {
        (l2_prefetch::COPIES_VARIANT, graph)
    } else {
        let sms = multiprocessors.saturating_sub(config.free_sms).max(1);
        (variant, sms)
    }
}

/// The jobs of a partitioned `l2_prefetch_loads` read of `issued` bytes that one partition's
/// blocks read alone (`PrefetchParams::once_jobs`, counted from the window's end), so that two
/// copies of the rest and one of these fit in `twice_fit` x `l2_bytes`. A window that fits twice
/// is read whole by both partitions (0). Jobs are counted as whole: a window whose pieces are
/// shorter than `SEGMENT_PIECE` has empty quarters among its jobs, and reads a little less once.
pub fn once_jobs(issued: u64, l2_bytes: u64, twice_fit: f64) -> u32 {
    let room = (twice_fit.max(0.0) * l2_bytes as f64) as u64;
    let twice = room.saturating_sub(issued).min(issued);
    u32::try_from((issued - twice).div_ceil(l2_prefetch::LOADS_JOB)).unwrap_or(u32::MAX)
}

/// [`PlanConfig::twice_fit`] by default. On the H200 (2026-12-02, the decode-step bench's
/// readers, each prefetched alone) 0.8 lifted q_a + kv_a (28.9 MiB) from 0.84-0.86 of its
/// replayed cold - warm to 0.91-0.93, where 0.7 cost o_proj and 0.9 did less; the whole step's
/// saving did not move (0.277 ms replayed, 0.400-0.406 ms eager).
pub const DEFAULT_TWICE_FIT: f64 = 0.8;

/// How a learned window is warmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replay {
    /// The default: a window of at most [`read_limit`] bytes (half of L2) is read in by the SMs
    /// (`l2_prefetch_loads`; in a captured forward on sm_90 and newer, bulk copies on
    /// [`PlanConfig::graph_sms`] SMs), a larger one bulk-prefetched (`l2_prefetch`), on a side
    /// stream ([`prefetch_choice`]).
    Auto,
    /// One prefetch variant on a side stream, named once (`PrefetchVariant::named("l2_prefetch")`,
    /// or `l2_prefetch::BULK_VARIANT` / `LOADS_VARIANT`).
    Prefetch { variant: PrefetchVariant },
    /// The main stream's access-policy window set over the window's first weight (persisting
    /// lines in the L2 set-aside). Eager forwards only: a captured forward gets no window.
    AccessPolicy,
}

impl Replay {
    /// The name [`Replay::named`] takes for this replay.
    pub fn name(self) -> &'static str {
        match self {
            Replay::Auto => "auto",
            Replay::AccessPolicy => "access_policy",
            Replay::Prefetch { variant } => variant.name(),
        }
    }

    /// The replay named `name`: `auto`, `access_policy`, or an L2 prefetch variant's name
    /// (`l2_prefetch`, `l2_prefetch_loads`, ...); an unknown name is an error that lists them.
    pub fn named(name: &str) -> Result<Self> {
        match name {
            "auto" => Ok(Replay::Auto),
            "access_policy" => Ok(Replay::AccessPolicy),
            _ => PrefetchVariant::named(name)
                .map(|variant| Replay::Prefetch { variant })
                .ok_or_else(|| {
                    let names: Vec<_> = ["auto", "access_policy"]
                        .into_iter()
                        .chain(l2_prefetch::VARIANTS.iter().map(|v| v.name))
                        .collect();
                    Error::invalid(
                        "L2 plan replay",
                        format!("no replay named `{name}` (one of: {})", names.join(", ")),
                    )
                }),
        }
    }
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
    /// Whether eager forwards time each window and cut its bytes to what fits in it
    /// (`window_fit`); off, every window warms its whole budget.
    pub fit: bool,
    /// Whether windows announced as all-gathers ([`CollectiveKind::AllGather`]) are warmed;
    /// off, they are counted (the windows keep their numbers) but nothing is prefetched in them.
    pub all_gather: bool,
    /// Whether the plan measures the device's L2 partitions when it is made
    /// (`l2_plan::partitions`) and `l2_prefetch_loads` then reads each byte from an SM of each
    /// partition, so that a reader on any SM finds it near.
    pub partitions: bool,
    /// Whether eager forwards leave windows cold while the GPU has caught up with the host
    /// (`l2_plan::pace`): the prefetch then could not shorten the forward and its driver calls
    /// would lengthen it.
    pub host_pace: bool,
    /// Multiprocessors the loads prefetch (`l2_prefetch_loads`, one block of
    /// `l2_prefetch::LOADS_THREADS` filling an SM) leaves free, so that the collective beside it
    /// and the kernels after it find SMs to start on. A captured graph launches the prefetch's
    /// node before the collective's: with a block on every SM, the H200's replayed collective
    /// waited 10-11 us for the first of them to end.
    pub free_sms: u32,
    /// With `partitions`: the share of L2 a window's two copies may fill. Each partition's SMs
    /// read every byte, a copy in each partition; a window too large for two copies (q_a +
    /// kv_a, 28.9 MiB of the H200's 60 MiB) would evict its own first lines with its last, so
    /// its tail is read by one partition only ([`once_jobs`]).
    pub twice_fit: f64,
    /// SMs a captured forward's windows are warmed from by bulk copies (`l2_prefetch_copies`,
    /// two one-warp blocks an SM) under [`Replay::Auto`] on sm_90 and newer, where eager ones
    /// use the loads: `None` (the default) a third of the device's SMs ([`graph_sms`]),
    /// `Some(0)` the loads as eagerly. Replayed, a window's branch node is dispatched beside its
    /// collective, whose start waits for the prefetch's grid; a grid of small blocks is
    /// dispatched sooner. On an H100 (2026-12-05, the decode-step bench, two runs each) the
    /// replayed collective then started 0.26-0.38 us after its compute instead of 0.49 us, and
    /// the plan saved 0.448 ms a step on 32 or 48 SMs against the loads' 0.441 ms (66 SMs:
    /// 0.444-0.445).
    pub graph_sms: Option<u32>,
}

/// What kind of collective a window runs, as the caller announces it
/// (`L2Plan::collective_of`); only [`PlanConfig::all_gather`] tells kinds apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CollectiveKind {
    #[default]
    AllReduce,
    AllGather,
    /// Any other collective (reduce-scatter, all-to-all, a custom op).
    Other,
}

impl CollectiveKind {
    /// `all_reduce`, `all_gather` or `other` (the C ABI's 0, 1 and 2).
    pub fn named(name: &str) -> Result<Self> {
        match name {
            "all_reduce" => Ok(CollectiveKind::AllReduce),
            "all_gather" => Ok(CollectiveKind::AllGather),
            "other" => Ok(CollectiveKind::Other),
            _ => Err(Error::invalid(
                "collective kind",
                format!("`{name}`; want all_reduce, all_gather or other"),
            )),
        }
    }

    /// The C ABI's number: 0 all-reduce, 1 all-gather, 2 other.
    pub fn from_code(code: u32) -> Result<Self> {
        match code {
            0 => Ok(CollectiveKind::AllReduce),
            1 => Ok(CollectiveKind::AllGather),
            2 => Ok(CollectiveKind::Other),
            _ => Err(Error::invalid(
                "collective kind",
                format!("{code}; want 0 (all-reduce), 1 (all-gather) or 2 (other)"),
            )),
        }
    }
}

/// [`PlanConfig::free_sms`] by default.
pub const DEFAULT_FREE_SMS: u32 = 16;

/// The SMs a captured forward's copies prefetch runs on when [`PlanConfig::graph_sms`] is
/// `None`: a third of the device's `multiprocessors` (44 of the H100's or H200's 132, 16 of the
/// GB10's 48), at least one.
pub fn graph_sms(multiprocessors: u32) -> u32 {
    multiprocessors.div_ceil(3).max(1)
}

/// The `FETCHAHEAD_L2_*` settings [`PlanConfig::from_env`] reads, each with what it takes.
pub const PLAN_ENV_SETTINGS: [(&str, &str); 9] = [
    (
        "FETCHAHEAD_L2_BUDGET_MB",
        "budget_per_window: MiB a window may warm at most (a decimal number, > 0)",
    ),
    (
        "FETCHAHEAD_L2_REPLAY",
        "replay: auto, access_policy or an L2 prefetch variant's name",
    ),
    (
        "FETCHAHEAD_L2_LAUNCH",
        "launch: auto (the default), after or before",
    ),
    ("FETCHAHEAD_L2_FIT", "fit: 1 (the default) or 0"),
    (
        "FETCHAHEAD_L2_ALL_GATHER",
        "all_gather: 1 (the default: all-gather windows warmed too) or 0",
    ),
    (
        "FETCHAHEAD_L2_PARTITIONS",
        "partitions: 1 (the default: each byte read from both L2 partitions) or 0",
    ),
    (
        "FETCHAHEAD_L2_HOST_PACE",
        "host_pace: 1 (the default: eager windows left cold while the GPU keeps up with the host) or 0",
    ),
    (
        "FETCHAHEAD_L2_FREE_SMS",
        "free_sms: multiprocessors the loads prefetch leaves free for the collective (a whole number)",
    ),
    (
        "FETCHAHEAD_L2_GRAPH_SMS",
        "graph_sms: auto (the default: a third of the SMs), 0 (captured forwards warm as eager ones) or the SMs a captured forward's copies prefetch runs on",
    ),
];

/// When the host launches a window's prefetch on the side stream. The side stream always waits
/// for the main stream's point before the collective, so the prefetch runs alongside it either
/// way; what differs is which launch comes first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefetchLaunch {
    /// At `collective()`, before the caller launches the collective.
    BeforeCollective,
    /// At the first `consume()` after the collective (the caller has launched it by then), or
    /// at the next `collective()` / `end_forward()` when nothing was consumed. In a captured
    /// graph the collective's node is then created first.
    AfterCollective,
    /// The default: before the collective in a captured forward, after it in an eager one.
    /// Replayed on the H200 (2026-12-01, the decode-step bench, a prefetch of 96 bytes a window
    /// so that only the branch counts), a branch whose prefetch node came after the collective's
    /// cost the step 0.082 ms over its 138 windows, one whose node came first 0.025 ms; eagerly
    /// the two placements saved the same, and launching at `consume` keeps `collective` cheap
    /// for a host-bound caller. Handing eager launches to a worker thread instead was measured
    /// and dropped: from Python, `collective` (which then only recorded the fork event) took
    /// 8.3-8.7 us a call against 0.9 inline, the two threads' driver calls waiting on each other.
    Auto,
}

impl PrefetchLaunch {
    /// Whether the prefetch launches at `collective()`, in a forward captured or not.
    pub fn before_collective(self, captured: bool) -> bool {
        match self {
            PrefetchLaunch::BeforeCollective => true,
            PrefetchLaunch::AfterCollective => false,
            PrefetchLaunch::Auto => captured,
        }
    }
}

impl PlanConfig {
    /// The defaults for a device with `l2_bytes` of L2: [`default_budget`], [`Replay::Auto`],
    /// [`PrefetchLaunch::Auto`], windows fitted, and for bulk prefetches 16 KiB chunks and
    /// `min(n, 8)` blocks of 64 threads.
    pub fn for_l2(l2_bytes: u64) -> PlanConfig {
        PlanConfig {
            budget_per_window: default_budget(l2_bytes),
            chunk: l2_prefetch::DEFAULT_CHUNK,
            max_blocks: l2_prefetch::DEFAULT_MAX_BLOCKS,
            threads: l2_prefetch::DEFAULT_THREADS,
            replay: Replay::Auto,
            launch: PrefetchLaunch::Auto,
            fit: true,
            all_gather: true,
            partitions: true,
            host_pace: true,
            free_sms: DEFAULT_FREE_SMS,
            twice_fit: DEFAULT_TWICE_FIT,
            graph_sms: None,
        }
    }

    /// [`PlanConfig::for_l2`] with each `FETCHAHEAD_L2_*` variable of [`PLAN_ENV_SETTINGS`]
    /// that is set replacing its field; fields set on the result afterwards win over the
    /// environment. A malformed value is an error naming the variable.
    pub fn from_env(l2_bytes: u64) -> Result<PlanConfig> {
        PlanConfig::from_vars(l2_bytes, |name| std::env::var(name).ok())
    }

    /// [`PlanConfig::from_env`] with the variables read through `var`.
    pub fn from_vars(l2_bytes: u64, var: impl Fn(&str) -> Option<String>) -> Result<PlanConfig> {
        let mut config = PlanConfig::for_l2(l2_bytes);
        let bad = |name: &'static str, value: &str, want: &str| {
            Error::invalid(name, format!("`{value}`; want {want}"))
        };
        let [
            budget,
            replay,
            launch,
            fit,
            all_gather,
            partitions,
            host_pace,
            free_sms,
            graph_sms,
        ] = PLAN_ENV_SETTINGS.map(|(name, _)| name);
        if let Some(v) = var(budget) {
            let mib: f64 = v
                .trim()
                .parse()
                .ok()
                .filter(|m: &f64| m.is_finite() && *m > 0.0 && *m <= (1u64 << 24) as f64)
                .ok_or_else(|| bad(budget, &v, "MiB, a number above 0, e.g. 6 or 2.5"))?;
            let bytes = (mib * (1u64 << 20) as f64) as u64;
            config.budget_per_window = (bytes - bytes % SEGMENT_ALIGN).max(SEGMENT_ALIGN);
        }
        if let Some(v) = var(replay) {
            config.replay = Replay::named(v.trim()).map_err(|e| bad(replay, &v, &e.to_string()))?;
        }
        if let Some(v) = var(launch) {
            config.launch = match v.trim() {
                "auto" => PrefetchLaunch::Auto,
                "after" => PrefetchLaunch::AfterCollective,
                "before" => PrefetchLaunch::BeforeCollective,
                _ => return Err(bad(launch, &v, "auto, after or before")),
            };
        }
        let switch = |name: &'static str, v: &str| match v.trim() {
            "1" => Ok(true),
            "0" => Ok(false),
            _ => Err(bad(name, v, "1 or 0")),
        };
        if let Some(v) = var(fit) {
            config.fit = switch(fit, &v)?;
        }
        if let Some(v) = var(all_gather) {
            config.all_gather = switch(all_gather, &v)?;
        }
        if let Some(v) = var(partitions) {
            config.partitions = switch(partitions, &v)?;
        }
        if let Some(v) = var(host_pace) {
            config.host_pace = switch(host_pace, &v)?;
        }
        if let Some(v) = var(free_sms) {
            config.free_sms = v
                .trim()
                .parse()
                .map_err(|_| bad(free_sms, &v, "a whole number of SMs, e.g. 8"))?;
        }
        if let Some(v) = var(graph_sms) {
            config.graph_sms = match v.trim() {
                "auto" => None,
                n => Some(n.parse().map_err(|_| {
                    bad(
                        graph_sms,
                        &v,
                        "auto, 0 (as eager) or a whole number of SMs, e.g. 32",
                    )
                })?),
            };
        }
        Ok(config)
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
    /// Eager windows left cold because the GPU had caught up with the host
    /// ([`PlanConfig::host_pace`]).
    pub windows_host_bound: u64,
}

/// One collective's learned weights, as a range of [`Windows::segments`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Span {
    pub(super) start: usize,
    pub(super) len: usize,
    bytes: u64,
}

/// A forward's windows: one per collective, each the weights consumed after it, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Windows {
    segments: Vec<Segment>,
    pub(super) spans: Vec<Span>,
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

    /// Records that an eager window was left cold while the GPU kept up with the host.
    pub fn count_host_bound(&mut self) {
        self.counters.windows_host_bound += 1;
    }

    /// The index of the latest collective of the forward in progress.
    pub fn latest_window(&self) -> Option<usize> {
        self.open.and_then(|f| f.collectives.checked_sub(1))
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

pub(super) fn no_forward() -> Error {
    Error::invalid(
        "L2 plan forward",
        "no forward is open (call begin_forward first)",
    )
}
