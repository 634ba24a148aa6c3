//! Flag-mode completion: a lookup thread (a [`FlagLane`]) runs staging sets' lookups, and each
//! side stream waits for its own with `cuStreamWaitValue32` on a pinned flag pair (a
//! `FlagSlot`) instead of running a host function. Host functions of every stream run on the
//! driver's one callback thread; a lane is a thread of the crate's own, woken by a flag.
//!
//! A lane runs one lookup at a time. Prefetchers whose lookups read one disk share a lane, so
//! that two lookups do not split the disk between them, and the lane's side stream, so that
//! their requests arrive in the order their prefetches were enqueued (a forward enqueues its
//! Engram layers in gather order, so the lookup needed first never waits for a later layer's).
//! Among requests that wait together, the lane runs the one of the lowest rank first. A
//! prefetcher made without a lane joins its context's default lane ([`FlagLane::shared_for`]),
//! the configuration the benches measured best ("flag-lane"). A lane per prefetcher ("flag-layer":
//! [`FlagLane::start`] and [`Prefetcher::in_lane`](crate::Prefetcher::in_lane) for each) lets
//! their lookups run at once; that serves only tables on separate disks (or lookups that never
//! touch one), since on one disk the earliest-gathered layer's lookup then shares the disk with
//! the later ones': it stalled 92-97% of the lookup time on cold decode lookups in
//! `benches/prefetcher.rs`, against 1.1-2.6% for one shared lane.
//!
//! Per prefetch the stream publishes `count + 1` in its slot's `request` word (after the ids
//! copy), waits for `done == 1`, clears `done` and copies the rows. The values are the same at
//! every replay, so the sequence can be captured into a graph.
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaStream, PinnedHostSlice, sys};

use crate::driver::{self, stream};
use crate::error::CudaCall;
use crate::prefetch::lookup_job::LookupJobs;
use crate::{Error, Result};

/// How long a lane spins after its last lookup before it polls with short sleeps.
const SPIN: Duration = Duration::from_millis(2);
/// The sleep between polls once idle: the most a request waits to be seen.
const IDLE_POLL: Duration = Duration::from_micros(10);
/// The lane thread's timer slack. Linux's default (50 us) stretches every idle poll's sleep by up
/// to that much: on the H200 machine (2026-11-29) a flag-mode prefetch chain after an idle spell
/// cost 70 us beyond its lookup with 20 us polls and the default slack.
const TIMER_SLACK_NS: libc::c_ulong = 1_000;

/// A slot's two flag words, `[request, done]`.
#[derive(Clone, Copy)]
struct Flags {
    host: *mut u32,
}

// SAFETY: the words are accessed only as atomics (host) and by stream memory operations (device).
unsafe impl Send for Flags {}

impl Flags {
    fn request(&self) -> &AtomicU32 {
        // SAFETY: `host` points at two aligned u32 that outlive the slot's registration (a
        // FlagSlot leaves its lane before freeing them); only atomics touch them on the host.
        unsafe { AtomicU32::from_ptr(self.host) }
    }

    fn done(&self) -> &AtomicU32 {
        // SAFETY: as above, the second word.
        unsafe { AtomicU32::from_ptr(self.host.add(1)) }
    }
}

/// The lookup a slot's request runs, given the request's row count.
type RunJob = Box<dyn Fn(usize) + Send + Sync>;

/// One registered slot, as the lane's thread sees it.
struct Entry {
    id: u64,
    rank: u32,
    flags: Flags,
    run: RunJob,
}

/// What a lane's thread and its slots share.
#[derive(Default)]
struct LaneState {
    /// Held while a lookup runs, so that a slot leaves only between lookups.
    slots: Mutex<Vec<Entry>>,
    stop: AtomicBool,
    next_id: AtomicU64,
}

impl LaneState {
    fn register(&self, rank: u32, flags: Flags, run: RunJob) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        slots.push(Entry {
            id,
            rank,
            flags,
            run,
        });
        id
    }

    /// Removes slot `id`, waiting for a lookup that is running.
    fn deregister(&self, id: u64) {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        slots.retain(|e| e.id != id);
    }

    /// Runs the waiting request of the lowest rank (the first registered among equal ranks);
    /// false when no request waits.
    fn run_next(&self) -> bool {
        let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let next = slots
            .iter()
            .filter_map(|e| {
                let request = e.flags.request().load(Ordering::Acquire);
                (request != 0).then_some((e, request))
            })
            .min_by_key(|(e, _)| e.rank);
        let Some((entry, request)) = next else {
            return false;
        };
        entry.flags.request().store(0, Ordering::Relaxed);
        (entry.run)(request as usize - 1);
        entry.flags.done().store(1, Ordering::Release);
        true
    }
}

/// A lookup thread serving the flag slots registered with it, one lookup at a time, and the
/// side stream its prefetchers share.
pub struct FlagLane {
    state: Arc<LaneState>,
    thread: Option<JoinHandle<()>>,
    side: Mutex<Option<Arc<CudaStream>>>,
}

impl FlagLane {
    /// Starts the lane's thread, named `name`.
    pub fn start(name: String) -> Result<Arc<FlagLane>> {
        let state = Arc::new(LaneState::default());
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn({
                let state = state.clone();
                move || serve(&state)
            })
            .map_err(|e| Error::invalid("flag lane", format!("cannot start its thread: {e}")))?;
        Ok(Arc::new(FlagLane {
            state,
            thread: Some(thread),
            side: Mutex::new(None),
        }))
    }

    /// The default lane of `ctx`'s prefetchers, started on first use and kept while a prefetcher
    /// holds it (the prefetchers made without a lane of their own share it).
    pub fn shared_for(ctx: &Arc<CudaContext>) -> Result<Arc<FlagLane>> {
        type Lanes = Vec<(usize, std::sync::Weak<FlagLane>)>;
        static SHARED: Mutex<Lanes> = Mutex::new(Vec::new());
        // The context's own address: a live lane holds its side stream, which holds the
        // context, so the address cannot be reused while the entry's lane is alive.
        let key = Arc::as_ptr(ctx) as usize;
        let mut lanes = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        lanes.retain(|(_, lane)| lane.strong_count() > 0);
        if let Some(lane) = lanes
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, lane)| lane.upgrade())
        {
            return Ok(lane);
        }
        let lane = FlagLane::start(format!("fetchahead-lane{}", ctx.ordinal()))?;
        // Its side stream now, in this context, so that the key's context stays alive with it.
        lane.side_stream(ctx)?;
        lanes.push((key, Arc::downgrade(&lane)));
        Ok(lane)
    }

    /// The side stream of the lane's prefetchers, made on first use in `ctx`: one stream keeps
    /// their requests in the order they were enqueued. A lane serves one context.
    pub(crate) fn side_stream(&self, ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>> {
        let mut side = self.side.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(stream) = side.as_ref() {
            if !Arc::ptr_eq(stream.context(), ctx) {
                return Err(Error::invalid(
                    "flag lane",
                    "its prefetchers must share one CUDA context",
                ));
            }
            return Ok(stream.clone());
        }
        let stream = ctx.new_stream().call("cuStreamCreate")?;
        *side = Some(stream.clone());
        Ok(stream)
    }
}

impl Drop for FlagLane {
    /// Runs when the last slot and owner are gone: no request can be waiting.
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The lane's loop: run the waiting request of the lowest rank, or wait for one.
fn serve(state: &LaneState) {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and changes only this thread's
    // timer slack; a failure (an old kernel) leaves the default, which is only slower.
    let set = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, TIMER_SLACK_NS) };
    if set != 0 {
        log::debug!("fetchahead: flag lane keeps the default timer slack (prctl failed)");
    }
    let mut last_work = Instant::now();
    while !state.stop.load(Ordering::Relaxed) {
        if state.run_next() {
            last_work = Instant::now();
        } else if last_work.elapsed() < SPIN {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(IDLE_POLL);
        }
    }
}

/// One staging set's place in a lane: its pinned flag words and its registration.
pub(crate) struct FlagSlot {
    lane: Arc<FlagLane>,
    id: u64,
    device: u64,
    _flags: PinnedHostSlice<u8>,
}

impl FlagSlot {
    /// Registers `jobs` with `lane` at `rank` (lower runs first), with flag words in pinned
    /// memory of `ctx` mapped for the device.
    pub fn new(
        ctx: &Arc<CudaContext>,
        lane: &Arc<FlagLane>,
        rank: u32,
        jobs: Arc<LookupJobs>,
    ) -> Result<FlagSlot> {
        let (mut memory, device) = driver::memory::mapped_pinned(ctx, 8)?;
        let host = &mut memory;
        let flags = Flags {
            host: host.as_mut_ptr().call("cuEventSynchronize")?.cast(),
        };
        flags.request().store(0, Ordering::Relaxed);
        flags.done().store(0, Ordering::Relaxed);
        let run: RunJob = Box::new(move |count| {
            // SAFETY: in flag mode the stream runs no host-function job of this table, and it
            // copies nothing to or from the staging set between publishing the request and
            // seeing `done`; the lane runs one job at a time.
            unsafe { jobs.run(count) }
        });
        let id = lane.state.register(rank, flags, run);
        Ok(FlagSlot {
            lane: lane.clone(),
            id,
            device,
            _flags: memory,
        })
    }

    /// Enqueues on `s`: publish the request for `count` rows, wait for the lane, re-arm.
    ///
    /// # Safety
    /// `s` is a valid stream of the flags' context; the ids copy the lookup reads was enqueued
    /// on `s` before this.
    pub unsafe fn enqueue(&self, count: usize, s: sys::CUstream) -> Result<()> {
        let request = u32::try_from(count + 1)
            .map_err(|_| Error::invalid("count", format!("{count} rows in one request")))?;
        let (request_at, done_at) = (self.device, self.device + 4);
        // SAFETY: both addresses are device addresses of the live pinned flag words.
        unsafe {
            stream::write_value32(s, request_at, request)?;
            stream::wait_value32_eq(s, done_at, 1)?;
            stream::write_value32(s, done_at, 0)
        }
    }
}

impl Drop for FlagSlot {
    /// Leaves the lane (after a lookup of any slot that is running) before the flags are freed.
    fn drop(&mut self) {
        self.lane.state.deregister(self.id);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// Flag words in ordinary memory; the test plays the stream's part.
    struct Words(Box<[AtomicU32; 2]>);

    impl Words {
        fn new() -> Words {
            Words(Box::new([AtomicU32::new(0), AtomicU32::new(0)]))
        }

        fn flags(&self) -> Flags {
            Flags {
                host: self.0.as_ptr().cast_mut().cast::<u32>(),
            }
        }

        fn request(&self, count: u32) {
            self.0[1].store(0, Ordering::Relaxed);
            self.0[0].store(count + 1, Ordering::Release);
        }

        /// Waits for `done`, failing after a minute (a lane that never answers).
        fn wait_done(&self) {
            let t = Instant::now();
            while self.0[1].load(Ordering::Acquire) != 1 {
                assert!(
                    t.elapsed() < Duration::from_secs(60),
                    "the lane never answered"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    type Order = Arc<Mutex<Vec<(&'static str, usize)>>>;

    fn recorder(order: &Order, name: &'static str) -> RunJob {
        let order = order.clone();
        Box::new(move |count| order.lock().unwrap().push((name, count)))
    }

    /// Two requests that wait together run in rank order, not in the order they arrived.
    #[test]
    fn waiting_requests_run_lowest_rank_first() {
        // Declared before the lane: the lane's thread stops before the words go.
        let (first, second, blocker) = (Words::new(), Words::new(), Words::new());
        let lane = FlagLane::start("test-lane".into()).unwrap();
        let order = Order::default();
        // The blocker's lookup holds the lane until released, so that both requests wait.
        let (started_tx, started_rx) = mpsc::channel::<()>();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let (started_tx, release_rx) = (Mutex::new(started_tx), Mutex::new(release_rx));
        let blocked = {
            let order = order.clone();
            Box::new(move |count| {
                started_tx.lock().unwrap().send(()).unwrap();
                release_rx.lock().unwrap().recv().unwrap();
                order.lock().unwrap().push(("blocker", count));
            })
        };
        lane.state.register(7, blocker.flags(), blocked);
        lane.state
            .register(1, second.flags(), recorder(&order, "second"));
        lane.state
            .register(0, first.flags(), recorder(&order, "first"));

        blocker.request(2);
        started_rx.recv().unwrap();
        second.request(5);
        first.request(3);
        release_tx.send(()).unwrap();
        for w in [&blocker, &first, &second] {
            w.wait_done();
        }
        assert_eq!(
            *order.lock().unwrap(),
            [("blocker", 2), ("first", 3), ("second", 5)]
        );
        assert!(
            [&blocker, &first, &second]
                .iter()
                .all(|w| w.0[0].load(Ordering::Relaxed) == 0),
            "every request is taken"
        );
    }

    /// A slot that left the lane is never run; the others still are.
    #[test]
    fn a_slot_that_left_is_not_run() {
        let (gone, stays) = (Words::new(), Words::new());
        let lane = FlagLane::start("test-lane".into()).unwrap();
        let order = Order::default();
        let id = lane
            .state
            .register(0, gone.flags(), recorder(&order, "gone"));
        lane.state
            .register(1, stays.flags(), recorder(&order, "stays"));
        lane.state.deregister(id);
        gone.request(4);
        stays.request(6);
        stays.wait_done();
        assert_eq!(*order.lock().unwrap(), [("stays", 6)]);
        assert_eq!(
            gone.0[0].load(Ordering::Relaxed),
            5,
            "the request is left unread"
        );
        assert_eq!(gone.0[1].load(Ordering::Relaxed), 0);
    }
}
