//! The side-stream prefetcher of one Engram layer: `prefetch` forks a side stream off the caller's
//! stream, copies the ids to the host, runs the row lookup in a host function into pinned
//! staging, and copies the rows to the device; `gather_dequant` joins the side stream back and
//! launches the fused gather + dequant on the staged rows.
//!
//! Every call takes the caller's raw stream, allocates nothing, and is capturable: inside a CUDA
//! graph capture it records an ordinary fork/join branch with a host node, and each replay looks
//! up the ids of that replay.
//!
//! The synchronous path (ids copy, lookup, row copies and gather all on the caller's stream, with
//! its own staging set) serves three uses: [`Prefetcher::gather_dequant_sync`], the fallback after
//! a lookup error, and check mode, which runs it after every prefetched gather and counts on the
//! device the gathers whose outputs differ.
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr, sys};
use fetchahead_gpu::defaults::BySize;
use fetchahead_gpu::dequant::DequantVariant;
use fetchahead_gpu::params::{CheckCounter, CheckParams};

use crate::driver::{host_fn, stream};
use crate::error::CudaCall;
use crate::kernels::Kernels;
use crate::kernels::launch::check_aligned_to;
use crate::prefetch::check_log::CheckLog;
use crate::prefetch::flag_worker::{FlagLane, FlagSlot};
use crate::prefetch::lookup_job::{FailureLog, LookupFailure, LookupJobs};
use crate::prefetch::staging::{StagingBuffers, StagingLayout};
use crate::row_lookup::RowLookup;
use crate::{Error, Result};

/// How a prefetcher is built.
#[derive(Clone, Copy, Debug)]
pub struct PrefetcherConfig {
    /// Most rows per prefetch (rounded up to a power of two).
    pub capacity: usize,
    /// The gather + dequant variant (a row of `fetchahead_gpu::dequant::VARIANTS`, resolved
    /// from a name where a user gave one); `None`: the fastest measured for the device's arch
    /// and each gather's rows (`fetchahead_gpu::defaults`). Under [`Join::Tags`] it serves only
    /// the synchronous gathers (check mode, the fallback after a failed lookup,
    /// [`Prefetcher::gather_dequant_sync`]): the prefetched gathers run
    /// `staged_dequant_tagged`, whose layout is its own; a prefetcher built so says so in a
    /// warning.
    pub variant: Option<DequantVariant>,
    /// Run the synchronous path after every prefetched gather and count differing outputs.
    pub check: bool,
    /// Check mode: how often the count is logged (read without waiting, by the gathers or
    /// [`Prefetcher::poll_check`]).
    pub check_log_every: Duration,
    /// After a failed lookup, serve later gathers through the synchronous path.
    pub fallback_on_error: bool,
    /// How the side stream learns that a lookup is done.
    pub completion: Completion,
    /// How a gather waits for its prefetched rows.
    pub join: Join,
    /// [`Join::Tags`]: how long a row waits for its tag before it comes out as zeros (counted by
    /// [`Prefetcher::late_rows`]), so that a stalled lookup cannot hang the device.
    pub tag_timeout: Duration,
}

/// How a gather waits for the rows its prefetch staged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Join {
    /// The caller's stream waits for the side stream at each gather (an event), and nothing
    /// else is needed: for a caller that cannot call [`Prefetcher::finish`]. In a replayed
    /// graph it stalled the decode step's Engram layers 3.7-6.2% of the lookup time (warm rows),
    /// against 0.6-1.5% for [`Join::Tags`] (BENCHMARKS.md, "Decode step").
    AtGather,
    /// Each staged row carries the id it holds, copied after the rows, and the gather (the
    /// `staged_dequant_tagged` kernel) waits for row `i`'s tag to equal `ids[i]`; the caller's
    /// stream joins the side stream only at [`Prefetcher::finish`], called once after the
    /// forward's last gather (a CUDA graph capture must call it before it ends). Inside a
    /// replayed graph each wait of the main chain on the side branch costs it 2-3 us on the
    /// H200 however early the branch finished (`benches/cuda/graph_join_probe.cu`); the tags
    /// cost nothing there. The default: the decode step's best measured join. Eager callers
    /// that never capture may skip `finish` (the tags order every gather after its rows; the
    /// next prefetch forks after the gather); a capture cannot end without it.
    #[default]
    Tags,
}

/// How the side stream learns that a prefetch's lookup is done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Completion {
    /// The lookup runs in a host function (`cuLaunchHostFunc`), on the driver's one callback
    /// thread shared by all streams.
    HostFunction,
    /// The lookup runs on a lookup thread (a [`FlagLane`]: the prefetcher's own, or one shared
    /// with [`Prefetcher::in_lane`]); the stream waits on a pinned flag (`cuStreamWaitValue32`).
    /// The default: on the H200 it stalled the side stream 0.0-0.8% of the lookup time where
    /// host functions stalled it 3.7-25.6% (BENCHMARKS.md).
    #[default]
    Flag,
}

impl Default for PrefetcherConfig {
    fn default() -> Self {
        PrefetcherConfig {
            capacity: 4096,
            variant: None,
            check: false,
            check_log_every: Duration::from_secs(10),
            fallback_on_error: true,
            completion: Completion::Flag,
            join: Join::Tags,
            tag_timeout: Duration::from_secs(1),
        }
    }
}

/// Counts since creation. Host-side counts (`prefetches`, `gathers`, `sync_gathers`) count calls,
/// so a graph replay adds nothing to them; `lookups` and `rows_looked_up` count lookups run,
/// replays included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub prefetches: u64,
    pub gathers: u64,
    pub sync_gathers: u64,
    pub lookups: u64,
    pub rows_looked_up: u64,
    /// Nanoseconds spent inside those lookups (on the thread that ran them).
    pub lookup_ns: u64,
    pub lookup_errors: u64,
    /// Check mode's periodic logs of its count.
    pub check_logs: u64,
    /// Whether gathers now take the synchronous path after a lookup error.
    pub fell_back: bool,
}

impl std::ops::AddAssign for Stats {
    /// Sums two prefetchers' stats (`fell_back` if either fell back).
    fn add_assign(&mut self, other: Stats) {
        self.prefetches += other.prefetches;
        self.gathers += other.gathers;
        self.sync_gathers += other.sync_gathers;
        self.lookups += other.lookups;
        self.rows_looked_up += other.rows_looked_up;
        self.lookup_ns += other.lookup_ns;
        self.lookup_errors += other.lookup_errors;
        self.check_logs += other.check_logs;
        self.fell_back |= other.fell_back;
    }
}

/// A staging set and the lookups that fill it.
struct Stage {
    staging: StagingBuffers,
    jobs: Arc<LookupJobs>,
}

impl Stage {
    fn new(
        stream: &Arc<CudaStream>,
        layout: StagingLayout,
        store: &Arc<dyn RowLookup>,
        failures: &Arc<FailureLog>,
    ) -> Result<Stage> {
        let staging = StagingBuffers::new(stream, layout)?;
        let jobs = Arc::new(LookupJobs::new(
            store.clone(),
            staging.host(),
            layout,
            failures.clone(),
        ));
        Ok(Stage { staging, jobs })
    }

    /// Enqueues on `s`: the ids to the host, the lookup (a host function, or a request through
    /// `slot` to its flag lane), the rows to the device, and with `tags` the ids after them.
    ///
    /// # Safety
    /// `ids` holds `count` int64 on the device until `s` has run these copies.
    unsafe fn enqueue(
        &self,
        ids: u64,
        count: usize,
        s: sys::CUstream,
        slot: Option<&FlagSlot>,
        tags: bool,
    ) -> Result<()> {
        let _nvtx = crate::nvtx::range(c"fetchahead.stage");
        let layout = self.staging.layout();
        let job = self.jobs.job(count).ok_or(Error::StagingFull {
            count,
            capacity: layout.capacity(),
        })?;
        let (host, device) = (self.staging.host(), self.staging.device());
        // SAFETY: count <= capacity, so every span lies inside the staging allocations, which
        // (with the job table) live as long as the prefetcher; the caller vouches for `ids`.
        unsafe {
            stream::copy_to_host(host.ids.cast(), ids, 8 * count, s)?;
            match slot {
                Some(slot) => slot.enqueue(count, s)?,
                None => host_fn::enqueue(s, job)?,
            }
            let _copies = crate::nvtx::range(c"fetchahead.copy");
            stream::copy_to_device(device.weights, host.weights, layout.weight_bytes(count), s)?;
            stream::copy_to_device(device.scales, host.scales, layout.scale_bytes(count), s)?;
            // After the rows, in stream order: a tag is never ahead of its row.
            if tags {
                stream::copy_to_device(device.tags, host.ids.cast(), 8 * count, s)?;
            }
            Ok(())
        }
    }
}

/// Check mode's device state: the synchronous path's output and the differing-gathers counter,
/// and the counter's periodic log.
struct Check {
    out: CudaSlice<u16>,
    counter: CudaSlice<u32>,
    log: CheckLog,
}

impl Check {
    fn addresses(&self, stream: &CudaStream) -> (u64, u64) {
        (
            self.out.device_ptr(stream).0,
            self.counter.device_ptr(stream).0,
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Ahead,
    Sync,
}

/// A prefetch whose gather has not been enqueued yet.
#[derive(Clone, Copy, Debug)]
struct Pending {
    ids: u64,
    count: usize,
    path: Path,
}

/// Prefetches one Engram layer's rows on a side stream; see the module documentation.
pub struct Prefetcher {
    kernels: Arc<Kernels>,
    config: PrefetcherConfig,
    /// The arch's default by call size, for a `config.variant` of `None` (resolved once).
    defaults: BySize<DequantVariant>,
    dim: usize,
    side: Arc<CudaStream>,
    fork: CudaEvent,
    join: CudaEvent,
    /// Flag mode's place in its lane; dropped (it leaves the lane) before the staging it writes.
    flag: Option<FlagSlot>,
    ahead: Stage,
    sync: Stage,
    check: Option<Check>,
    check_addresses: (u64, u64),
    failures: Arc<FailureLog>,
    /// Failures seen when prefetching last (re)started; more than this means fall back.
    failures_at_resume: u64,
    pending: Option<Pending>,
    /// [`Join::Tags`]: a gather ran that `main` has not joined the side stream after.
    unjoined: bool,
    fell_back: bool,
    prefetches: u64,
    gathers: u64,
    sync_gathers: u64,
}

impl Prefetcher {
    /// A prefetcher over `store` on `kernels`' device. In flag mode (the default) its lookups run
    /// on the device's default lane ([`FlagLane::shared_for`]), shared with the other
    /// prefetchers made this way, whose side stream it shares too (the measured best: one
    /// lookup at a time, in the order the prefetches were enqueued); with host functions it has
    /// a side stream of its own. Not yet warm: call [`Prefetcher::warm`] before capturing a
    /// graph.
    pub fn new(
        kernels: Arc<Kernels>,
        store: Arc<dyn RowLookup>,
        config: PrefetcherConfig,
    ) -> Result<Prefetcher> {
        match config.completion {
            Completion::Flag => {
                let lane = FlagLane::shared_for(&kernels.gpu().ctx)?;
                Self::build(kernels, store, config, Some((lane, 0)))
            }
            Completion::HostFunction => Self::build(kernels, store, config, None),
        }
    }

    /// A flag-mode prefetcher whose lookups run on `lane`, shared with other prefetchers. They
    /// share the lane's side stream too, so their lookups run in the order their prefetches
    /// were enqueued (in gather order, in a forward); `rank` orders requests that wait together.
    /// `config.completion` must be [`Completion::Flag`].
    pub fn in_lane(
        kernels: Arc<Kernels>,
        store: Arc<dyn RowLookup>,
        config: PrefetcherConfig,
        lane: &Arc<FlagLane>,
        rank: u32,
    ) -> Result<Prefetcher> {
        if config.completion != Completion::Flag {
            return Err(Error::invalid(
                "completion",
                format!(
                    "{:?}: a flag lane serves Completion::Flag only",
                    config.completion
                ),
            ));
        }
        Self::build(kernels, store, config, Some((lane.clone(), rank)))
    }

    fn build(
        kernels: Arc<Kernels>,
        store: Arc<dyn RowLookup>,
        config: PrefetcherConfig,
        lane: Option<(Arc<FlagLane>, u32)>,
    ) -> Result<Prefetcher> {
        let dim = store.dim();
        let layout = StagingLayout::new(config.capacity, dim)?;
        let defaults = kernels.defaults().dequant;
        if let (Join::Tags, Some(named)) = (config.join, config.variant) {
            log::warn!(
                "fetchahead: gather + dequant variant {} serves only this prefetcher's \
                 synchronous gathers (check mode, the fallback, gather_dequant_sync): under \
                 Join::Tags the prefetched gathers run {} (Join::AtGather runs the variant for \
                 them too)",
                named.name(),
                fetchahead_gpu::staged::KERNEL
            );
        }
        let ctx = kernels.gpu().ctx.clone();
        // Prefetchers sharing a lane share its side stream too, so that their requests reach the
        // lane in the order they were enqueued (an earlier layer's never behind a later one's).
        let side = match &lane {
            Some((lane, _)) => lane.side_stream(&ctx)?,
            None => ctx.new_stream().call("cuStreamCreate")?,
        };
        let failures = Arc::new(FailureLog::default());
        let ahead = Stage::new(&side, layout, &store, &failures)?;
        let sync = Stage::new(&side, layout, &store, &failures)?;
        let flag = match config.completion {
            Completion::HostFunction => None,
            Completion::Flag => {
                let (lane, rank) = match lane {
                    Some(shared) => shared,
                    None => (FlagLane::shared_for(&ctx)?, 0),
                };
                Some(FlagSlot::new(&ctx, &lane, rank, ahead.jobs.clone())?)
            }
        };
        let check = if config.check {
            let words = size_of::<CheckCounter>() / 4;
            Some(Check {
                out: side
                    .alloc_zeros::<u16>(layout.capacity() * dim)
                    .call("cuMemAlloc")?,
                counter: side.alloc_zeros::<u32>(words).call("cuMemAlloc")?,
                log: CheckLog::new(&ctx, config.check_log_every)?,
            })
        } else {
            None
        };
        let check_addresses = check.as_ref().map_or((0, 0), |c| c.addresses(&side));
        side.synchronize().call("cuStreamSynchronize")?;
        Ok(Prefetcher {
            fork: ctx.new_event(None).call("cuEventCreate")?,
            join: ctx.new_event(None).call("cuEventCreate")?,
            kernels,
            config,
            defaults,
            dim,
            side,
            flag,
            ahead,
            sync,
            check,
            check_addresses,
            failures,
            failures_at_resume: 0,
            pending: None,
            unjoined: false,
            fell_back: false,
            prefetches: 0,
            gathers: 0,
            sync_gathers: 0,
        })
    }

    /// Rows per prefetch (a power of two).
    pub fn capacity(&self) -> usize {
        self.ahead.staging.layout().capacity()
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn config(&self) -> PrefetcherConfig {
        self.config
    }

    /// The variant a gather of `rows` rows runs: the configured one, or the arch's default for
    /// that size.
    fn variant_for(&self, rows: usize) -> DequantVariant {
        self.config
            .variant
            .unwrap_or_else(|| self.defaults.for_rows(rows as u64))
    }

    /// The side stream the prefetches run on.
    pub fn side_stream(&self) -> &Arc<CudaStream> {
        &self.side
    }

    /// First use of every buffer, kernel and the host-function path, eagerly. Call it before
    /// capturing a graph that prefetches; an eager prefetch warms on first use by itself.
    pub fn warm(&mut self) -> Result<()> {
        // Every variant a gather may pick: the named one, or each of the default's sizes.
        let variants: Vec<DequantVariant> = match self.config.variant {
            Some(v) => vec![v],
            None => self.defaults.variants().collect(),
        };
        let (kernels, side) = (&*self.kernels, &*self.side);
        self.ahead.staging.warm(kernels, &variants, side)?;
        self.sync.staging.warm(kernels, &variants, side)?;
        let s = side.cu_stream();
        // One lookup of no rows on each path: the host-function (or flag) machinery's first use.
        // SAFETY: no ids are read; the stream is synchronized below.
        unsafe {
            let arange = self.ahead.staging.device().arange;
            self.ahead
                .enqueue(arange, 0, s, self.flag.as_ref(), false)?;
            self.sync.enqueue(arange, 0, s, None, false)?;
        }
        if self.check.is_some() {
            let (out, counter) = self.check_addresses;
            // One chunk of the check output against itself: equal, so the counter stays 0.
            let p = CheckParams {
                a: out,
                b: out,
                chunks: 1,
                counter,
            };
            // SAFETY: `out` holds at least one 16-byte chunk and `counter` is a live CheckCounter.
            unsafe { self.kernels.launch_check_equal(s, p)? };
        }
        side.synchronize().call("cuStreamSynchronize")
    }

    fn is_warm(&self) -> bool {
        self.ahead.staging.is_warm() && self.sync.staging.is_warm()
    }

    /// Warms on first use, unless `main` is being captured: then that is an error naming the fix.
    ///
    /// # Safety
    /// `main` is a valid stream of this device's context.
    unsafe fn ensure_warm(&mut self, main: sys::CUstream) -> Result<()> {
        if self.is_warm() {
            return Ok(());
        }
        // SAFETY: the caller vouches for `main`.
        if unsafe { stream::is_capturing(&self.kernels.gpu().ctx, main)? } {
            return Err(Error::NotWarmed {
                what: "the prefetcher",
            });
        }
        self.warm()
    }

    /// Starts fetching the rows of the `count` ids at device address `ids`: the side stream waits
    /// for the work enqueued on `main` so far, then copies the ids, looks them up and stages the
    /// rows. After a lookup error (with `fallback_on_error`) it only records the ids, and the
    /// gather takes the synchronous path.
    ///
    /// # Safety
    /// `ids` holds `count` int64 on this device and keeps them unchanged until the matching
    /// [`Prefetcher::gather_dequant`] has run on `main` (in every replay, when captured); `main`
    /// is a valid stream of this device's context. A graph captured from these calls must not be
    /// launched after the prefetcher is dropped.
    pub unsafe fn prefetch(&mut self, ids: u64, count: usize, main: sys::CUstream) -> Result<()> {
        self.ahead.staging.layout().check_count(count)?;
        if self.pending.is_some() {
            return Err(Error::PrefetchOrder(
                "prefetch called again before the gather of the previous prefetch",
            ));
        }
        check_ids(ids, count)?;
        // SAFETY: the caller vouches for `main`.
        unsafe { self.ensure_warm(main)? };
        let failed = self.failures.count() - self.failures_at_resume;
        if self.config.fallback_on_error && failed > 0 && !self.fell_back {
            self.fell_back = true;
            log::warn!(
                "fetchahead: {failed} row lookup(s) failed; gathers now take the synchronous path \
                 (take_errors() has the failures, resume() goes back to prefetching)"
            );
        }
        let path = if self.fell_back {
            Path::Sync
        } else {
            // SAFETY: `main` (the caller's) and the side stream are streams of this context.
            unsafe { stream::wait_for(&self.fork, main, self.side.cu_stream())? };
            let tags = self.config.join == Join::Tags;
            // SAFETY: the caller vouches for `ids` until the gather.
            unsafe {
                self.ahead
                    .enqueue(ids, count, self.side.cu_stream(), self.flag.as_ref(), tags)?
            };
            // The join point is the end of this prefetch's own work: a side stream shared by a
            // lane's prefetchers holds later prefetches behind it, which this gather must not
            // wait for. The next record comes only after this gather's wait (`pending`).
            // SAFETY: the side stream and the event belong to this context.
            unsafe { stream::record(&self.join, self.side.cu_stream())? };
            Path::Ahead
        };
        self.pending = Some(Pending { ids, count, path });
        self.prefetches += 1;
        Ok(())
    }

    /// Makes `main` wait for the side stream and writes the prefetched rows, dequantized, to
    /// `out` (`count * dim` bf16 at a 16-byte aligned device address). In check mode the
    /// synchronous path then gathers the same ids again and the two outputs are compared.
    ///
    /// # Safety
    /// `out` holds `count * dim` bf16 on this device, written by nothing else until `main` has
    /// run the gather; `main` is the stream the prefetch was given (or one ordered after it).
    pub unsafe fn gather_dequant(&mut self, out: u64, main: sys::CUstream) -> Result<()> {
        let p = self.pending.ok_or(Error::PrefetchOrder(
            "gather_dequant called without a prefetch",
        ))?;
        check_out(out, p.count)?;
        self.pending = None;
        match p.path {
            Path::Ahead => {
                match self.config.join {
                    Join::AtGather => {
                        // SAFETY: `main` is the caller's stream of this context; the join was
                        // recorded at the end of this prefetch.
                        unsafe { stream::wait(&self.join, main)? };
                        if p.count > 0 {
                            let params = self.ahead.staging.gather_params(out, p.count);
                            // SAFETY: the staged rows hold `count` rows; the caller vouches for
                            // `out`.
                            unsafe {
                                self.kernels.launch_gather_dequant(
                                    main,
                                    self.variant_for(p.count),
                                    params,
                                )?
                            };
                        }
                    }
                    Join::Tags => {
                        if p.count > 0 {
                            let timeout = u64::try_from(self.config.tag_timeout.as_nanos())
                                .unwrap_or(u64::MAX);
                            let params = self
                                .ahead
                                .staging
                                .tagged_params(out, p.ids, p.count, timeout);
                            // SAFETY: the staged rows and tags hold `count` entries, written by
                            // this prefetch's copies rows first; the ids are unchanged until
                            // this gather has run (the prefetch's contract); the caller vouches
                            // for `out`.
                            unsafe { self.kernels.launch_staged_dequant(main, params)? };
                        }
                        self.unjoined = true;
                    }
                }
                self.gathers += 1;
                if self.check.is_some() && p.count > 0 {
                    let (check_out, counter) = self.check_addresses;
                    // SAFETY: the check output holds `capacity * dim` bf16, `count <= capacity`;
                    // the ids are unchanged until now (the prefetch's contract).
                    unsafe { self.sync_path(p.ids, p.count, check_out, main)? };
                    let chunks = (p.count * self.dim * 2 / 16) as u64;
                    let params = CheckParams {
                        a: out,
                        b: check_out,
                        chunks,
                        counter,
                    };
                    // SAFETY: both outputs hold `count * dim` bf16 written before on `main`.
                    unsafe { self.kernels.launch_check_equal(main, params)? };
                    // SAFETY: the caller's stream; `poll_check` skips a capture.
                    unsafe { self.poll_check(main)? };
                }
                Ok(())
            }
            // SAFETY: the caller vouches for `ids` (at the prefetch) and for `out`.
            Path::Sync => unsafe { self.sync_path(p.ids, p.count, out, main) },
        }
    }

    /// [`Join::Tags`]: makes `main` wait for the side stream's work of the last prefetch, which
    /// its gathers did not wait for. Call it once after a forward's last gather; a CUDA graph
    /// capture that prefetched must call it before it ends. Nothing to do otherwise.
    ///
    /// # Safety
    /// `main` is a valid stream of this device's context, the one the gathers were given.
    pub unsafe fn finish(&mut self, main: sys::CUstream) -> Result<()> {
        if self.unjoined {
            // SAFETY: the caller vouches for `main`; the join was recorded at the end of the
            // last prefetch.
            unsafe { stream::wait(&self.join, main)? };
            self.unjoined = false;
        }
        Ok(())
    }

    /// [`Join::Tags`]: rows the gathers since the last call gave up on after `tag_timeout`
    /// (written as zeros); waits for the device. Logged as an error when any.
    pub fn late_rows(&mut self) -> Result<u32> {
        let (late, first) = self.ahead.staging.take_late(&self.side)?;
        if late > 0 {
            log::error!(
                "fetchahead: {late} prefetched row(s) did not arrive within {:?} and were gathered \
                 as zeros (first at position {first})",
                self.config.tag_timeout
            );
        }
        Ok(late)
    }

    /// The synchronous path alone: looks up the `count` ids at `ids` on `main` (ids copy, host
    /// lookup, row copies) and gathers them into `out`, with no side stream.
    ///
    /// # Safety
    /// As [`Prefetcher::prefetch`] for `ids` and [`Prefetcher::gather_dequant`] for `out`.
    pub unsafe fn gather_dequant_sync(
        &mut self,
        ids: u64,
        count: usize,
        out: u64,
        main: sys::CUstream,
    ) -> Result<()> {
        self.sync.staging.layout().check_count(count)?;
        check_ids(ids, count)?;
        check_out(out, count)?;
        // SAFETY: the caller vouches for `main`.
        unsafe { self.ensure_warm(main)? };
        // SAFETY: the caller vouches for both addresses.
        unsafe { self.sync_path(ids, count, out, main) }
    }

    /// # Safety
    /// As [`Prefetcher::gather_dequant_sync`], with `count` checked against the capacity.
    unsafe fn sync_path(
        &mut self,
        ids: u64,
        count: usize,
        out: u64,
        main: sys::CUstream,
    ) -> Result<()> {
        // SAFETY: the caller vouches for `ids`; the sync staging set is used only on `main`.
        unsafe { self.sync.enqueue(ids, count, main, None, false)? };
        if count > 0 {
            let params = self.sync.staging.gather_params(out, count);
            // SAFETY: the staged rows hold `count` rows; the caller vouches for `out`.
            unsafe {
                self.kernels
                    .launch_gather_dequant(main, self.variant_for(count), params)?
            };
        }
        self.sync_gathers += 1;
        Ok(())
    }

    /// The failed lookups kept since the last call (their rows were zero-filled), oldest first.
    pub fn take_errors(&self) -> Vec<LookupFailure> {
        self.failures.take()
    }

    /// Goes back to prefetching after a fallback; a later lookup error falls back again.
    pub fn resume(&mut self) {
        self.failures_at_resume = self.failures.count();
        self.fell_back = false;
    }

    pub fn stats(&self) -> Stats {
        let (ahead_lookups, ahead_rows) = self.ahead.jobs.counts();
        let (sync_lookups, sync_rows) = self.sync.jobs.counts();
        Stats {
            prefetches: self.prefetches,
            gathers: self.gathers,
            sync_gathers: self.sync_gathers,
            lookups: ahead_lookups + sync_lookups,
            rows_looked_up: ahead_rows + sync_rows,
            lookup_ns: self.ahead.jobs.busy_ns() + self.sync.jobs.busy_ns(),
            lookup_errors: self.failures.count(),
            check_logs: self.check.as_ref().map_or(0, |c| c.log.logs()),
            fell_back: self.fell_back,
        }
    }

    /// Check mode's periodic log, for callers that replay graphs (eager gathers call it
    /// themselves): when a snapshot of the counter has arrived it is logged and returned, and
    /// when `check_log_every` has passed since the last one a new snapshot is enqueued on
    /// `main`. Never waits for the GPU; does nothing while `main` is being captured or with
    /// check mode off.
    ///
    /// # Safety
    /// `main` is a valid stream of this device's context.
    pub unsafe fn poll_check(&mut self, main: sys::CUstream) -> Result<Option<u32>> {
        let counter = self.check_addresses.1;
        let Some(check) = self.check.as_mut().filter(|c| c.log.due()) else {
            return Ok(None);
        };
        // SAFETY: the caller vouches for `main`.
        if unsafe { stream::is_capturing(&self.kernels.gpu().ctx, main)? } {
            return Ok(None);
        }
        // SAFETY: `counter` is the live CheckCounter of this prefetcher; `main` is not capturing.
        unsafe { check.log.poll(counter, main) }
    }

    /// Check mode's counter: prefetched gathers whose output differed from the synchronous
    /// path's (expected 0); `None` when check mode is off. Waits for all work on the device.
    pub fn check_differed(&self) -> Result<Option<u32>> {
        let Some(check) = &self.check else {
            return Ok(None);
        };
        self.kernels
            .gpu()
            .ctx
            .synchronize()
            .call("cuCtxSynchronize")?;
        let mut words = [0u32; 4];
        self.side
            .memcpy_dtoh(&check.counter, &mut words)
            .call("cuMemcpyDtoH")?;
        self.side.synchronize().call("cuStreamSynchronize")?;
        let differed = words[0];
        if differed > 0 {
            log::warn!(
                "fetchahead check mode: {differed} prefetched gathers differed from the \
                 synchronous path"
            );
        } else {
            log::debug!("fetchahead check mode: no prefetched gather differed");
        }
        Ok(Some(differed))
    }
}

impl Drop for Prefetcher {
    /// Lets every enqueued lookup finish before the staging and the jobs go away.
    fn drop(&mut self) {
        let _ = self.kernels.gpu().ctx.synchronize();
    }
}

/// `count` ids need an 8-byte aligned, non-null address (none for no ids).
fn check_ids(ids: u64, count: usize) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    check_aligned_to("ids", ids, 8)
}

/// An output of `count` rows needs a 16-byte aligned, non-null address (none for no rows).
fn check_out(out: u64, count: usize) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    check_aligned_to("out", out, 16)
}
