//! Blocking reads: a thread pool of `preadv` calls (one extent per task, so that the pool's size
//! is the queue depth), and plain buffered reads one after another on the caller's thread.
use std::cell::RefCell;
use std::os::fd::RawFd;
use std::sync::Mutex;

use rayon::prelude::*;

use super::aligned::AlignedBuf;
use super::plan::{Extent, MAX_EXTENT, OutRows, Plan, Step, step};
use super::{Failure, Inner};
use crate::store::layout::LayerLayout;

thread_local! {
    /// Each pool thread's read slot, allocated on its first read.
    static SLOT: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
}

/// Reads `ext` into `buf` with `preadv`, retrying EINTR and short reads.
pub(crate) fn read_extent(
    inner: &Inner,
    plan: &Plan,
    ext: &Extent,
    fd: RawFd,
    direct: bool,
    buf: &mut [u8],
) -> std::io::Result<()> {
    let mut done = 0u32;
    let mut attempts = 0u32;
    loop {
        let want = &mut buf[done as usize..ext.len as usize];
        let iov = libc::iovec {
            iov_base: want.as_mut_ptr().cast(),
            iov_len: want.len(),
        };
        // SAFETY: iov points into `buf`, which is live and exclusively borrowed for the call.
        let n = unsafe { libc::preadv(fd, &iov, 1, (ext.offset + u64::from(done)) as libc::off_t) };
        let mut res = if n < 0 { -i64::from(errno()) } else { n as i64 };
        if let Some(fault) = inner.fault() {
            res = fault.apply(|row| plan.covers(ext, row), res);
        }
        match step(ext, || direct, done, res, &mut attempts) {
            Step::Done => return Ok(()),
            Step::Again { done: d } => done = d,
            Step::Failed(e) => return Err(e),
        }
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Every extent as its own task on the store's pool.
pub(crate) fn read_pooled(
    inner: &Inner,
    pool: &rayon::ThreadPool,
    layer: &LayerLayout,
    plan: &Plan,
    out: &OutRows,
    failures: &mut Vec<Failure>,
) {
    let failed = Mutex::new(std::mem::take(failures));
    pool.install(|| {
        plan.extents
            .par_iter()
            .with_max_len(1)
            .enumerate()
            .for_each(|(i, ext)| {
                SLOT.with(|slot| {
                    let mut slot = slot.borrow_mut();
                    let buf = slot.get_or_insert_with(|| AlignedBuf::new(MAX_EXTENT as usize));
                    let (fd, direct) = inner.read_fd(ext.file as usize);
                    let outcome = read_extent(inner, plan, ext, fd, direct, buf.as_mut_slice());
                    let failure = match outcome {
                        Ok(()) if plan.deliver(layer, ext, buf.as_slice(), out) => return,
                        Ok(()) => Failure::internal(i as u32),
                        Err(error) => Failure {
                            extent: i as u32,
                            error,
                        },
                    };
                    failed
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(failure);
                })
            });
    });
    *failures = failed.into_inner().unwrap_or_else(|e| e.into_inner());
}

/// One buffered `pread` after another, through the page cache.
pub(crate) fn read_buffered(
    inner: &Inner,
    layer: &LayerLayout,
    plan: &Plan,
    out: &OutRows,
    buf: &mut AlignedBuf,
    failures: &mut Vec<Failure>,
) {
    for (i, ext) in plan.extents.iter().enumerate() {
        let fd = inner.buffered_fd(ext.file as usize);
        match read_extent(inner, plan, ext, fd, false, buf.as_mut_slice()) {
            Ok(()) if plan.deliver(layer, ext, buf.as_slice(), out) => {}
            Ok(()) => failures.push(Failure::internal(i as u32)),
            Err(error) => failures.push(Failure {
                extent: i as u32,
                error,
            }),
        }
    }
}
