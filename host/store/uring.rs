//! io_uring batches: every extent of a lookup in flight at once (up to the ring's depth), each an
//! O_DIRECT read into its own page-aligned slot.
use std::io;

use io_uring::{IoUring, opcode, types};

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

/// A ring and its slots, owned by one lookup at a time.
pub(crate) struct UringReader {
    depth: u32,
    ring: IoUring,
    buf: AlignedBuf,
    slots: Vec<Slot>,
    free: Vec<u32>,
    again: Vec<u32>,
}

impl UringReader {
    /// A ring with `depth` reads in flight at most (a power of two, 1..=4096).
    pub fn new(depth: u32) -> io::Result<Self> {
        let depth = depth.clamp(1, 4096).next_power_of_two();
        let ring = IoUring::new(depth)?;
        Ok(UringReader {
            depth,
            ring,
            buf: AlignedBuf::new(depth as usize * MAX_EXTENT as usize),
            slots: vec![Slot::default(); depth as usize],
            free: Vec::with_capacity(depth as usize),
            again: Vec::with_capacity(depth as usize),
        })
    }

    /// Reads every extent of `plan`, delivering rows as reads complete. Failed extents land in
    /// `failures`; the call returns only when nothing is in flight, so the slots are free again.
    pub fn read(
        &mut self,
        inner: &Inner,
        layer: &LayerLayout,
        plan: &Plan,
        out: &OutRows,
        failures: &mut Vec<Failure>,
    ) -> io::Result<()> {
        self.free.clear();
        self.free.extend((0..self.depth).rev());
        self.again.clear();
        let n = plan.extents.len();
        let mut next = 0usize;
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
                    let (fd, _) = inner.read_fd(ext.file as usize);
                    // SAFETY: slot * MAX_EXTENT + done + (len - done) <= depth * MAX_EXTENT,
                    // the buffer's length; the slot is not the target of any other read in flight.
                    let dst =
                        unsafe { base.add(slot as usize * MAX_EXTENT as usize + s.done as usize) };
                    let entry = opcode::Read::new(types::Fd(fd), dst, ext.len - s.done)
                        .offset(ext.offset + u64::from(s.done))
                        .build()
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
            match self.ring.submit_and_wait(1) {
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
