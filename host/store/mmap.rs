//! mmap with MADV_RANDOM (set when the store opens): `posix_fadvise(WILLNEED)` for every extent
//! of the batch first, so that the kernel has all of the batch's reads in flight, then one copy
//! per row out of the mapping.
//!
//! The one read path that can kill its process: a shard truncated between the length check below
//! and the copy raises SIGBUS. It runs only when a caller names it (`ReadPath::Mmap`, `--read-path
//! mmap`); `Auto` never takes it, and opening a store with it logs a warning.
use std::io;

use super::plan::{OutRows, Plan, Step, step};
use super::{Failure, Inner};
use crate::store::layout::LayerLayout;

pub(crate) fn read_mapped(
    inner: &Inner,
    layer: &LayerLayout,
    plan: &Plan,
    out: &OutRows,
    failures: &mut Vec<Failure>,
) {
    for ext in &plan.extents {
        let fd = inner.buffered_fd(ext.file as usize);
        // SAFETY: plain syscall on an open descriptor; advice only, it cannot fault.
        unsafe {
            libc::posix_fadvise(
                fd,
                ext.offset as libc::off_t,
                libc::off_t::from(ext.len),
                libc::POSIX_FADV_WILLNEED,
            )
        };
    }
    // Touching a page past the end of a file that shrank since it was mapped raises SIGBUS; the
    // file's length, taken once per batch, keeps those reads from reaching the mapping.
    let mut known: Option<(usize, u64)> = None;
    for (i, ext) in plan.extents.iter().enumerate() {
        let file = ext.file as usize;
        let len = match known {
            Some((f, len)) if f == file => Ok(len),
            _ => inner.current_len(file),
        };
        let len = match len {
            Ok(len) => {
                known = Some((file, len));
                len
            }
            Err(error) => {
                failures.push(Failure {
                    extent: i as u32,
                    error,
                });
                continue;
            }
        };
        let available = len.saturating_sub(ext.offset).min(u64::from(ext.len));
        let mut done = 0u32;
        let mut attempts = 0u32;
        let outcome = loop {
            let mut res = available.saturating_sub(u64::from(done)) as i64;
            if let Some(fault) = inner.fault() {
                res = fault.apply(|row| plan.covers(ext, row), res);
            }
            match step(ext, || false, done, res, &mut attempts) {
                Step::Done => break Ok(()),
                Step::Again { done: d } => done = d,
                Step::Failed(e) => break Err(e),
            }
        };
        let failure = match outcome.and_then(|()| {
            inner
                .mapped(file, ext.offset, available)
                .ok_or_else(|| io::Error::other("the extent lies outside the mapping"))
        }) {
            Ok(data) if plan.deliver(layer, ext, data, out) => continue,
            Ok(_) => Failure::internal(i as u32),
            Err(error) => Failure {
                extent: i as u32,
                error,
            },
        };
        failures.push(failure);
    }
}
