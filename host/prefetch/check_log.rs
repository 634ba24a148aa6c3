//! Check mode's periodic log: every period, a 16-byte copy of the device counter into pinned host
//! memory, enqueued behind the checks so far, and read (and logged) once its event has fired, at
//! a later poll. Nothing waits on the GPU: a poll only queries an event.
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaEvent, PinnedHostSlice, sys};
use fetchahead_gpu::params::CheckCounter;

use crate::Result;
use crate::driver::stream;
use crate::error::CudaCall;

/// The counter's snapshots and when the next is due.
pub struct CheckLog {
    period: Duration,
    words: *mut u32,
    _pinned: PinnedHostSlice<u32>,
    copied: CudaEvent,
    /// A snapshot is on its way (its copy enqueued, not yet read).
    pending: bool,
    last: Option<Instant>,
    logs: u64,
}

// SAFETY: `words` points into the pinned allocation this struct owns; only `&mut self` methods
// read it, after the copy that writes it has completed.
unsafe impl Send for CheckLog {}

impl CheckLog {
    /// A log of one counter, a snapshot every `period` (the first at the first poll).
    pub fn new(ctx: &Arc<CudaContext>, period: Duration) -> Result<CheckLog> {
        let words = size_of::<CheckCounter>() / 4;
        // Read by the CPU: cached pinned memory, not write-combined.
        // SAFETY: the contents are unspecified until a copy completes; they are read only then.
        let mut pinned =
            unsafe { ctx.alloc_pinned_with_flags::<u32>(words, 0) }.call("cuMemHostAlloc")?;
        Ok(CheckLog {
            period,
            words: pinned.as_mut_ptr().call("cuEventSynchronize")?,
            _pinned: pinned,
            copied: ctx.new_event(None).call("cuEventCreate")?,
            pending: false,
            last: None,
            logs: 0,
        })
    }

    /// Whether a poll has anything to do: a snapshot on its way or one due.
    pub fn due(&self) -> bool {
        self.pending || self.period_passed()
    }

    /// Whether `period` has passed since the last snapshot was enqueued (or none was).
    fn period_passed(&self) -> bool {
        self.last.is_none_or(|t| t.elapsed() >= self.period)
    }

    /// Snapshots logged so far.
    pub fn logs(&self) -> u64 {
        self.logs
    }

    /// Reads and logs a snapshot whose copy has completed (returning the count of differing
    /// gathers it holds), and enqueues the next copy on `stream` when one is due.
    ///
    /// # Safety
    /// `counter` is the device address of a live `CheckCounter`, `stream` a valid stream of the
    /// log's context that is not being captured.
    pub unsafe fn poll(&mut self, counter: u64, stream: sys::CUstream) -> Result<Option<u32>> {
        let mut read = None;
        if self.pending && self.copied.try_is_complete().call("cuEventQuery")? {
            // SAFETY: the copy into the pinned words has completed, and nothing else writes them
            // until the next copy, enqueued below.
            let differed = unsafe { self.words.read_volatile() };
            self.pending = false;
            self.logs += 1;
            if differed > 0 {
                log::warn!(
                    "fetchahead check mode: {differed} prefetched gathers differed from the \
                     synchronous path so far"
                );
            } else {
                log::info!("fetchahead check mode: no prefetched gather differed so far");
            }
            read = Some(differed);
        }
        if !self.pending && self.period_passed() {
            // SAFETY: the pinned words hold a whole CheckCounter; the caller vouches for the
            // counter and the stream.
            unsafe {
                stream::copy_to_host(
                    self.words.cast(),
                    counter,
                    size_of::<CheckCounter>(),
                    stream,
                )?;
                stream::record(&self.copied, stream)?;
            }
            self.pending = true;
            self.last = Some(Instant::now());
        }
        Ok(read)
    }
}
