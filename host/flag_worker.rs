//! Flag-mode completion: a host worker thread of its own runs a staging set's lookups, and the
//! side stream waits for them on a pinned flag with `cuStreamWaitValue32` instead of running a
//! host function. Host functions of every stream run on the driver's one callback thread, so
//! several layers' lookups serialize there; each flag worker runs in parallel with the others.
//!
//! Per prefetch the stream publishes `count + 1` in `request` (after the ids copy), waits for
//! `done == 1`, clears `done` and copies the rows. The values are the same at every replay, so
//! the sequence can be captured into a graph.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, sys};

use crate::error::CudaCall;
use crate::lookup_job::LookupJobs;
use crate::table::TableMemory;
use crate::{Error, Result};

/// How long the worker spins after its last lookup before it polls with short sleeps.
const SPIN: Duration = Duration::from_millis(2);
/// The sleep between polls once idle.
const IDLE_POLL: Duration = Duration::from_micros(20);

/// The two flag words in pinned host memory.
#[derive(Clone, Copy)]
struct Flags {
    /// `[request, done]`, cached pinned memory mapped for the device.
    host: *mut u32,
}

// SAFETY: the words are accessed only as atomics (host) and by stream memory operations (device).
unsafe impl Send for Flags {}

impl Flags {
    fn request(&self) -> &AtomicU32 {
        // SAFETY: `host` points at two aligned u32 of a pinned allocation that outlives the
        // worker (the FlagWorker joins its thread before freeing it); only atomics touch them.
        unsafe { AtomicU32::from_ptr(self.host) }
    }

    fn done(&self) -> &AtomicU32 {
        // SAFETY: as above, the second word.
        unsafe { AtomicU32::from_ptr(self.host.add(1)) }
    }
}

/// A lookup thread and its flags, for one staging set.
pub struct FlagWorker {
    device: u64,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    _flags: TableMemory,
}

impl FlagWorker {
    /// Starts the thread that runs `jobs` when the stream asks.
    pub fn start(
        ctx: &Arc<CudaContext>,
        jobs: Arc<LookupJobs>,
        name: String,
    ) -> Result<FlagWorker> {
        let mut memory = TableMemory::pinned_host(ctx, 8)?;
        let TableMemory::PinnedHost {
            host,
            device_address,
        } = &mut memory
        else {
            return Err(Error::invalid("flags", "not pinned host memory"));
        };
        let device = *device_address;
        let flags = Flags {
            host: host.as_mut_ptr().call("cuEventSynchronize")?.cast(),
        };
        flags.request().store(0, Ordering::Relaxed);
        flags.done().store(0, Ordering::Relaxed);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn({
                let stop = stop.clone();
                move || serve(flags, &jobs, &stop)
            })
            .map_err(|e| Error::invalid("flag worker", format!("cannot start its thread: {e}")))?;
        Ok(FlagWorker {
            device,
            stop,
            thread: Some(thread),
            _flags: memory,
        })
    }

    /// Enqueues on `s`: publish the request for `count` rows, wait for the worker, re-arm.
    ///
    /// # Safety
    /// `s` is a valid stream of the flags' context; the ids copy the lookup reads was enqueued
    /// on `s` before this.
    pub unsafe fn enqueue(&self, count: usize, s: sys::CUstream) -> Result<()> {
        let request = u32::try_from(count + 1)
            .map_err(|_| Error::invalid("count", format!("{count} rows in one request")))?;
        let (request_at, done_at) = (self.device, self.device + 4);
        let write = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        let equal = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as u32;
        // SAFETY: both addresses are device addresses of the live pinned flag words.
        unsafe {
            sys::cuStreamWriteValue32_v2(s, request_at, request, write)
                .result()
                .call("cuStreamWriteValue32")?;
            sys::cuStreamWaitValue32_v2(s, done_at, 1, equal)
                .result()
                .call("cuStreamWaitValue32")?;
            sys::cuStreamWriteValue32_v2(s, done_at, 0, write)
                .result()
                .call("cuStreamWriteValue32")
        }
    }
}

impl Drop for FlagWorker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The worker's loop: wait for a request, run it, signal done.
fn serve(flags: Flags, jobs: &LookupJobs, stop: &AtomicBool) {
    let mut last_work = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let request = flags.request().load(Ordering::Acquire);
        if request == 0 {
            if last_work.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(IDLE_POLL);
            }
            continue;
        }
        flags.request().store(0, Ordering::Relaxed);
        // SAFETY: in flag mode the stream runs no host-function job of this table, and it copies
        // nothing to or from the staging set between publishing the request and seeing `done`.
        unsafe { jobs.run(request as usize - 1) };
        flags.done().store(1, Ordering::Release);
        last_work = Instant::now();
    }
}
