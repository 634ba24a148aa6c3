//! io_uring batches: every extent of a lookup in flight at once (up to the ring's depth), each an
//! O_DIRECT read into its own page-aligned slot. As fio's `t/io_uring` does it: the slots are one
//! registered buffer (`ReadFixed`), the shards registered files, the ring single-issuer with
//! deferred task work where the kernel has them, and completions reaped in batches.
use std::io;
use std::os::fd::RawFd;
use std::thread::ThreadId;

use io_uring::{IoUring, opcode, squeue, types};

use super::aligned::AlignedBuf;
use super::plan::{Extent, MAX_EXTENT, OutRows, Plan, Step, step};
use super::{Failure, Inner};
use crate::store::layout::LayerLayout;

/// Reads in flight per ring by default: deeper than fio's QD64 so that a batch never waits on a
/// free slot while the device could take more.
pub const QUEUE_DEPTH: u32 = 256;

#[derive(Clone, Copy, Default)]
struct Slot {
    extent: u32,
    done: u32,
    attempts: u32,
}

/// What a ring got from the kernel, each feature falling back on its own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RingFeatures {
    /// `single_issuer+defer_taskrun`, `coop_taskrun` or `none`.
    pub task_run: &'static str,
    pub registered_buffers: bool,
    pub registered_files: bool,
    /// Why a feature is missing, when one is.
    pub fallbacks: Vec<String>,
}

/// A ring and its slots, owned by one lookup at a time, and used only by the thread that made it
/// (a single-issuer ring refuses any other).
pub(crate) struct UringReader {
    depth: u32,
    ring: IoUring,
    buf: AlignedBuf,
    slots: Vec<Slot>,
    free: Vec<u32>,
    again: Vec<u32>,
    owner: ThreadId,
    features: RingFeatures,
}

/// The ring with the cheapest task-run mode the kernel takes.
fn build_ring(depth: u32, fallbacks: &mut Vec<String>) -> io::Result<(IoUring, &'static str)> {
    match IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(depth)
    {
        Ok(ring) => return Ok((ring, "single_issuer+defer_taskrun")),
        Err(e) => fallbacks.push(format!("IORING_SETUP_SINGLE_ISSUER|DEFER_TASKRUN: {e}")),
    }
    match IoUring::builder().setup_coop_taskrun().build(depth) {
        Ok(ring) => return Ok((ring, "coop_taskrun")),
        Err(e) => fallbacks.push(format!("IORING_SETUP_COOP_TASKRUN: {e}")),
    }
    Ok((IoUring::new(depth)?, "none"))
}

impl UringReader {
    /// A ring with `depth` reads in flight at most (a power of two, 1..=4096), reading `files`
    /// (indexed as the store's shards).
    pub fn new(depth: u32, files: &[RawFd]) -> io::Result<Self> {
        let depth = depth.clamp(1, 4096).next_power_of_two();
        let mut fallbacks = Vec::new();
        let (ring, task_run) = build_ring(depth, &mut fallbacks)?;
        let mut buf = AlignedBuf::new(depth as usize * MAX_EXTENT as usize);
        let iov = [libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.as_slice().len(),
        }];
        // SAFETY: the iovec covers `buf`, which the reader owns and drops only after the ring
        // (field order: `ring` before `buf`), so it stays valid while registered.
        let registered_buffers = match unsafe { ring.submitter().register_buffers(&iov) } {
            Ok(()) => true,
            Err(e) => {
                fallbacks.push(format!("IORING_REGISTER_BUFFERS: {e}"));
                false
            }
        };
        let registered_files = files.iter().all(|&fd| fd >= 0)
            && match ring.submitter().register_files(files) {
                Ok(()) => true,
                Err(e) => {
                    fallbacks.push(format!("IORING_REGISTER_FILES: {e}"));
                    false
                }
            };
        if !fallbacks.is_empty() {
            log::warn!("io_uring fell back: {}", fallbacks.join("; "));
        }
        Ok(UringReader {
            depth,
            ring,
            buf,
            slots: vec![Slot::default(); depth as usize],
            free: Vec::with_capacity(depth as usize),
            again: Vec::with_capacity(depth as usize),
            owner: std::thread::current().id(),
            features: RingFeatures {
                task_run,
                registered_buffers,
                registered_files,
                fallbacks,
            },
        })
    }

    pub fn owner(&self) -> ThreadId {
        self.owner
    }

    pub fn features(&self) -> &RingFeatures {
        &self.features
    }
}

/// The read of `len` bytes at `offset` of shard `file` into `dst` (inside the slot buffer).
fn entry(
    f: &RingFeatures,
    inner: &Inner,
    file: u32,
    dst: *mut u8,
    len: u32,
    offset: u64,
) -> squeue::Entry {
    {
        match (f.registered_files, f.registered_buffers) {
            (true, true) => opcode::ReadFixed::new(types::Fixed(file), dst, len, 0)
                .offset(offset)
                .build(),
            (true, false) => opcode::Read::new(types::Fixed(file), dst, len)
                .offset(offset)
                .build(),
            (false, true) => {
                let (fd, _) = inner.read_fd(file as usize);
                opcode::ReadFixed::new(types::Fd(fd), dst, len, 0)
                    .offset(offset)
                    .build()
            }
            (false, false) => {
                let (fd, _) = inner.read_fd(file as usize);
                opcode::Read::new(types::Fd(fd), dst, len)
                    .offset(offset)
                    .build()
            }
        }
    }
}

impl UringReader {
    /// Reads the extents `extents` of `plan`, delivering rows as reads complete. Failed extents land in
    /// `failures`; the call returns only when nothing is in flight, so the slots are free again.
    pub fn read(
        &mut self,
        inner: &Inner,
        layer: &LayerLayout,
        plan: &Plan,
        extents: std::ops::Range<usize>,
        out: &OutRows,
        failures: &mut Vec<Failure>,
    ) -> io::Result<()> {
        self.free.clear();
        self.free.extend((0..self.depth).rev());
        self.again.clear();
        let n = extents.end.min(plan.extents.len());
        let mut next = extents.start;
        let mut in_flight = 0u32;
        let base = self.buf.as_mut_ptr();
        loop {
            // Fill the submission queue: retries first, then new extents.
            {
                let mut sq = self.ring.submission();
                loop {
                    let slot = if let Some(slot) = self.again.pop() {
                        slot
                    } else if next < n {
                        let Some(slot) = self.free.pop() else { break };
                        self.slots[slot as usize] = Slot {
                            extent: next as u32,
                            done: 0,
                            attempts: 0,
                        };
                        next += 1;
                        slot
                    } else {
                        break;
                    };
                    let s = self.slots[slot as usize];
                    let ext = &plan.extents[s.extent as usize];
                    // SAFETY: slot * MAX_EXTENT + done + (len - done) <= depth * MAX_EXTENT,
                    // the buffer's length; the slot is not the target of any other read in flight.
                    let dst =
                        unsafe { base.add(slot as usize * MAX_EXTENT as usize + s.done as usize) };
                    let entry = entry(
                        &self.features,
                        inner,
                        ext.file,
                        dst,
                        ext.len - s.done,
                        ext.offset + u64::from(s.done),
                    )
                    .user_data(u64::from(slot));
                    // SAFETY: the buffer outlives the read: `self` owns it and this function
                    // returns only after every submitted read has completed.
                    if unsafe { sq.push(&entry) }.is_err() {
                        self.again.push(slot);
                        break;
                    }
                    in_flight += 1;
                }
            }
            if in_flight == 0 {
                return Ok(());
            }
            // Wake once per batch of completions, not per read: for all of them when every read
            // of the lookup is in flight, else for a quarter of the ring to refill it.
            let want = if next >= n && self.again.is_empty() {
                in_flight
            } else {
                (in_flight / 4).max(1)
            };
            match self.ring.submit_and_wait(want as usize) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
                // Reads the kernel already took may still be writing into the slots: wait them
                // out (or leak the slots if the ring is unusable) before giving up.
                Err(e) => {
                    self.drain(in_flight);
                    return Err(e);
                }
            }
            let cq = self.ring.completion();
            for cqe in cq {
                in_flight -= 1;
                let slot = cqe.user_data() as u32;
                let s = &mut self.slots[slot as usize];
                let ext: &Extent = &plan.extents[s.extent as usize];
                let mut res = i64::from(cqe.result());
                if let Some(fault) = inner.fault() {
                    res = fault.apply(|row| plan.covers(ext, row), res);
                }
                let (_, direct) = inner.read_fd(ext.file as usize);
                match step(ext, direct, s.done, res, &mut s.attempts) {
                    Step::Done => {
                        // SAFETY: the read into this slot has completed and no other read
                        // targets it; the range lies inside the buffer (see the push above).
                        let data = unsafe {
                            std::slice::from_raw_parts(
                                base.add(slot as usize * MAX_EXTENT as usize),
                                ext.len as usize,
                            )
                        };
                        if !plan.deliver(layer, ext, data, out) {
                            failures.push(Failure::internal(s.extent));
                        }
                        self.free.push(slot);
                    }
                    Step::Again { done } => {
                        s.done = done;
                        self.again.push(slot);
                    }
                    Step::Failed(error) => {
                        failures.push(Failure {
                            extent: s.extent,
                            error,
                        });
                        self.free.push(slot);
                    }
                }
            }
        }
    }

    /// Waits out `in_flight` reads after a fatal ring error, so that no read targets the slots.
    fn drain(&mut self, mut in_flight: u32) {
        while in_flight > 0 {
            if self.ring.submit_and_wait(1).is_err() {
                // The ring is unusable; keep the buffer alive forever rather than risk a write
                // into freed memory.
                std::mem::forget(std::mem::replace(&mut self.buf, AlignedBuf::new(1)));
                return;
            }
            in_flight -= self.ring.completion().count() as u32;
        }
    }
}
