//! `advise`: a background thread warms the rows of a coming batch, so the caller never waits.
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::{Caller, Inner, ReadPath};

/// Batches waiting to be warmed; more are dropped (and counted) rather than block the caller.
const PENDING: usize = 16;

pub(crate) struct Advisor {
    batches: Option<SyncSender<(u32, Vec<i64>)>>,
    /// Id buffers the warming thread has finished with, reused so that `advise` stops
    /// allocating once it has seen its largest batch.
    spare: Arc<Mutex<Vec<Vec<i64>>>>,
    /// Batches sent and not yet warmed, with a condition the thread signals when it is 0.
    pending: Arc<(Mutex<usize>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Advisor {
    pub fn start(inner: Arc<Inner>) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel::<(u32, Vec<i64>)>(PENDING);
        let spare: Arc<Mutex<Vec<Vec<i64>>>> =
            Arc::new(Mutex::new(Vec::with_capacity(PENDING + 1)));
        let returned = spare.clone();
        let pending = Arc::new((Mutex::new(0usize), Condvar::new()));
        let done = pending.clone();
        let thread = std::thread::Builder::new()
            .name("fetchahead-advise".into())
            .spawn(move || {
                let (mut weights, mut scales) = (Vec::new(), Vec::new());
                while let Ok((layer, ids)) = rx.recv() {
                    inner.warm(layer, &ids, &mut weights, &mut scales);
                    let mut spare = returned.lock().unwrap_or_else(|e| e.into_inner());
                    if spare.len() <= PENDING {
                        spare.push(ids);
                    }
                    drop(spare);
                    one_done(&done);
                }
            })?;
        Ok(Advisor {
            batches: Some(tx),
            spare,
            pending,
            thread: Some(thread),
        })
    }

    /// Queues `ids` for warming; false when the queue is full and the batch was dropped.
    pub fn send(&self, layer: u32, ids: &[i64]) -> bool {
        let Some(tx) = &self.batches else {
            return false;
        };
        let mut batch = self
            .spare
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_default();
        batch.clear();
        batch.extend_from_slice(ids);
        // Counted before sending, so that the thread never finishes a batch not yet counted.
        *self.pending.0.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        match tx.try_send((layer, batch)) {
            Ok(()) => true,
            Err(TrySendError::Full((_, batch)) | TrySendError::Disconnected((_, batch))) => {
                one_done(&self.pending);
                self.spare
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(batch);
                false
            }
        }
    }

    /// Blocks until every batch sent so far has been warmed (or dropped).
    pub fn wait_idle(&self) {
        let (count, idle) = &*self.pending;
        let mut count = count.lock().unwrap_or_else(|e| e.into_inner());
        while *count > 0 {
            count = idle.wait(count).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// One batch of `pending` warmed or dropped; wakes the waiters when none is left.
fn one_done(pending: &(Mutex<usize>, Condvar)) {
    let (count, idle) = pending;
    let mut count = count.lock().unwrap_or_else(|e| e.into_inner());
    *count = count.saturating_sub(1);
    if *count == 0 {
        idle.notify_all();
    }
}

impl Drop for Advisor {
    fn drop(&mut self) {
        self.batches = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Inner {
    /// Reads `ids` into the row cache; without a cache, asks the kernel to read their pages
    /// into the page cache (which helps the mmap and buffered paths).
    fn warm(&self, layer: u32, ids: &[i64], weights: &mut Vec<u8>, scales: &mut Vec<u8>) {
        if self.cache.is_some() {
            let sdim = self.layout.dim / super::layout::MX_BLOCK;
            weights.resize(ids.len() * self.layout.dim, 0);
            scales.resize(ids.len() * sdim, 0);
            if self
                .lookup(Caller::Advise, ReadPath::Auto, layer, ids, weights, scales)
                .is_err()
            {
                self.counters.advise_failed.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        let Some(l) = self.layout.layer(layer) else {
            return;
        };
        for &id in ids {
            let span = &l.weight;
            let fd = self.buffered_fd(span.file);
            // SAFETY: plain syscall on an open descriptor; advice only.
            unsafe {
                libc::posix_fadvise(
                    fd,
                    span.row_offset(id as u64) as libc::off_t,
                    span.row_bytes as libc::off_t,
                    libc::POSIX_FADV_WILLNEED,
                )
            };
        }
    }
}
