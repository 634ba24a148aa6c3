//! The host half of a staged lookup: what a host function (or the flag-mode worker) runs to fill
//! one staging set, and the record of the lookups that failed.
//!
//! A host node captured into a graph keeps the one pointer it was given, so the row count must be
//! in what it points at: each staging set has a table of jobs, one per count `0..=capacity`,
//! built once, and a prefetch of `n` rows enqueues job `n`.
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use crate::Error;
use crate::driver::host_fn::HostCall;
use crate::prefetch::staging::{HostSpans, StagingLayout};
use crate::row_lookup::{RowLookup, lookup_or_zero};

/// One failed lookup: why, and the ids it was asked for (its rows were zero-filled).
#[derive(Clone, Debug)]
pub struct LookupFailure {
    pub message: String,
    pub ids: Vec<i64>,
}

/// The failures of one prefetcher's lookups: all counted, the first few kept in full.
#[derive(Debug, Default)]
pub struct FailureLog {
    count: AtomicU64,
    kept: Mutex<Vec<LookupFailure>>,
}

impl FailureLog {
    /// Failures kept until taken; later ones are only counted.
    pub const KEPT: usize = 16;

    fn record(&self, error: &Error, ids: &[i64]) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() < Self::KEPT {
            log::warn!(
                "fetchahead: a lookup of {} rows failed ({error}); its rows were zero-filled",
                ids.len()
            );
            kept.push(LookupFailure {
                message: error.to_string(),
                ids: ids.to_vec(),
            });
        }
    }

    /// Failed lookups since creation.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The kept failures, oldest first, clearing them.
    pub fn take(&self) -> Vec<LookupFailure> {
        std::mem::take(&mut *self.kept.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// What every job of one staging set shares.
struct Target {
    store: Arc<dyn RowLookup>,
    host: HostSpans,
    layout: StagingLayout,
    failures: Arc<FailureLog>,
    lookups: AtomicU64,
    rows: AtomicU64,
    /// Nanoseconds spent inside lookups of at least one row.
    busy_ns: AtomicU64,
}

// SAFETY: the raw pointers in `host` point into pinned buffers that the owning staging set keeps
// alive; they are written only by `run`, which the stream (or the flag worker) calls one at a time.
unsafe impl Send for Target {}
// SAFETY: as above.
unsafe impl Sync for Target {}

impl Target {
    /// Looks up the `count` ids in the staging set's pinned ids into its pinned rows.
    fn run(&self, count: usize) {
        // SAFETY: count <= capacity (the job table has capacity + 1 entries) and the spans hold
        // capacity rows; only this staging set's stream runs its jobs, one at a time, and nothing
        // else touches the pinned buffers while the stream is between its copies.
        let (ids, weights, scales) = unsafe {
            (
                std::slice::from_raw_parts(self.host.ids, count),
                std::slice::from_raw_parts_mut(self.host.weights, self.layout.weight_bytes(count)),
                std::slice::from_raw_parts_mut(self.host.scales, self.layout.scale_bytes(count)),
            )
        };
        let start = Instant::now();
        if let Err(e) = lookup_or_zero(&*self.store, ids, weights, scales) {
            self.failures.record(&e, ids);
        }
        if count > 0 {
            let ns = start.elapsed().as_nanos() as u64;
            self.busy_ns.fetch_add(ns, Ordering::Relaxed);
            self.lookups.fetch_add(1, Ordering::Relaxed);
            self.rows.fetch_add(count as u64, Ordering::Relaxed);
        }
        // The rows sit in write-combined memory: drain them before whatever signals completion
        // (the driver after a host function, the flag store in flag mode).
        fence(Ordering::SeqCst);
    }
}

/// Job `count`: a lookup of the first `count` staged ids.
pub struct Job {
    target: *const Target,
    count: usize,
}

// SAFETY: `target` points into the `LookupJobs` that owns this job, which outlives every use;
// `Target` is Sync (its store is Send + Sync, its counters atomic).
unsafe impl Sync for Job {}
// SAFETY: as above.
unsafe impl Send for Job {}

impl HostCall for Job {
    fn call(&self) {
        // SAFETY: the job table and its target live as long as the `LookupJobs` that owns both.
        unsafe { &*self.target }.run(self.count);
    }
}

/// The lookups of one staging set, one job per row count.
pub struct LookupJobs {
    jobs: Box<[Job]>,
    /// An `Arc` rather than a `Box`: the jobs' pointers stay valid when the owner moves.
    target: Arc<Target>,
}

impl LookupJobs {
    pub fn new(
        store: Arc<dyn RowLookup>,
        host: HostSpans,
        layout: StagingLayout,
        failures: Arc<FailureLog>,
    ) -> LookupJobs {
        let target = Arc::new(Target {
            store,
            host,
            layout,
            failures,
            lookups: AtomicU64::new(0),
            rows: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
        });
        let at = Arc::as_ptr(&target);
        let jobs = (0..=layout.capacity())
            .map(|count| Job { target: at, count })
            .collect();
        LookupJobs { jobs, target }
    }

    /// Job `count`, or `None` past the capacity.
    pub(crate) fn job(&self, count: usize) -> Option<&Job> {
        self.jobs.get(count)
    }

    /// Runs job `count` on this thread (the flag-mode worker).
    ///
    /// # Safety
    /// No stream runs a job of this table meanwhile, and no copy to or from the staging set's
    /// pinned buffers is in flight.
    pub(crate) unsafe fn run(&self, count: usize) {
        if count < self.jobs.len() {
            self.target.run(count);
        }
    }

    /// Lookups of at least one row run, and rows looked up (graph replays included).
    pub fn counts(&self) -> (u64, u64) {
        (
            self.target.lookups.load(Ordering::Relaxed),
            self.target.rows.load(Ordering::Relaxed),
        )
    }

    /// Nanoseconds spent inside those lookups.
    pub fn busy_ns(&self) -> u64 {
        self.target.busy_ns.load(Ordering::Relaxed)
    }
}
