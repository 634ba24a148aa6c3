//! io_uring batches: every extent of a lookup in flight at once (up to the ring's depth), each an
//! O_DIRECT read into its own page-aligned slot. As fio's `t/io_uring` does it: the slots are one
//! registered buffer (`ReadFixed`), the shards registered files, the ring single-issuer with
//! deferred task work and no SQ index array where the kernel has them, the ring's own descriptor
//! registered for a long lookup's enters, and completions reaped in batches.
use std::io;
use std::os::fd::RawFd;
use std::thread::ThreadId;

use io_uring::{CompletionQueue, IoUring, SubmissionQueue, Submitter, opcode, squeue, types};

use super::aligned::AlignedBuf;
use super::plan::{Extent, MAX_EXTENT, OutRows, Plan, Step, step};
use super::{Failure, Inner};
use crate::store::layout::LayerLayout;

/// Reads in flight per ring by default: deeper than fio's QD64 so that a batch never waits on a
/// free slot while the device could take more.
pub const QUEUE_DEPTH: u32 = 256;

/// Ring depths a lookup must have this many times over in reads before it registers the ring's
/// descriptor: the register and unregister calls then cost under 1/16 of the enters they spare a
/// descriptor lookup (a lookup waits for a quarter of the ring at a time, four enters per depth).
const RING_FD_MIN_DEPTHS: usize = 8;

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
    /// `IORING_SETUP_NO_SQARRAY`: submissions skip the SQ index array (kernel 6.6).
    pub no_sqarray: bool,
    pub registered_buffers: bool,
    pub registered_files: bool,
    /// `IORING_REGISTER_RING_FDS`: a long lookup's enters pass the ring by its registered index,
    /// skipping the descriptor lookup (kernel 5.18).
    pub registered_ring_fd: bool,
    /// The shards are open with O_NOATIME, so reads skip the access-time check (the store's
    /// files, not the ring: reported here beside what the ring's reads cost).
    pub noatime_reads: bool,
    /// Why a feature is missing, when one is.
    pub fallbacks: Vec<String>,
}

/// The slots of one ring's reads and what is to be (re)submitted.
struct Slots {
    depth: u32,
    slots: Vec<Slot>,
    free: Vec<u32>,
    again: Vec<u32>,
    /// Slots whose reads completed in the current batch, to be delivered.
    landed: Vec<u32>,
}

/// A ring and its slots, owned by one lookup at a time, and used only by the thread that made it
/// (a single-issuer ring refuses any other; a registered ring descriptor is the thread's own).
pub(crate) struct UringReader {
    ring: IoUring,
    buf: AlignedBuf,
    slots: Slots,
    owner: ThreadId,
    features: RingFeatures,
}

/// How completions are handed to the task that waits for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TaskRun {
    SingleIssuerDefer,
    Coop,
    Plain,
}

impl TaskRun {
    const CHEAPEST_FIRST: [TaskRun; 3] =
        [TaskRun::SingleIssuerDefer, TaskRun::Coop, TaskRun::Plain];

    fn name(self) -> &'static str {
        match self {
            TaskRun::SingleIssuerDefer => "single_issuer+defer_taskrun",
            TaskRun::Coop => "coop_taskrun",
            TaskRun::Plain => "none",
        }
    }

    fn flags(self) -> &'static str {
        match self {
            TaskRun::SingleIssuerDefer => "IORING_SETUP_SINGLE_ISSUER|DEFER_TASKRUN",
            TaskRun::Coop => "IORING_SETUP_COOP_TASKRUN",
            TaskRun::Plain => "io_uring_setup",
        }
    }
}

/// The setup flags one `io_uring_setup` call asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Setup {
    task_run: TaskRun,
    no_sqarray: bool,
}

/// The cheapest setup `build` accepts: everything first (one call where the kernel has it all),
/// else the cheapest task-run mode alone, then NO_SQARRAY added to it. Each refusal is recorded
/// in `fallbacks`.
fn setup_ladder<R>(
    mut build: impl FnMut(Setup) -> io::Result<R>,
    fallbacks: &mut Vec<String>,
) -> io::Result<(R, Setup)> {
    let best = Setup {
        task_run: TaskRun::SingleIssuerDefer,
        no_sqarray: true,
    };
    let best_err = match build(best) {
        Ok(ring) => return Ok((ring, best)),
        Err(e) => e,
    };
    let mut last = best_err;
    for task_run in TaskRun::CHEAPEST_FIRST {
        let alone = Setup {
            task_run,
            no_sqarray: false,
        };
        let ring = match build(alone) {
            Ok(ring) => ring,
            Err(e) => {
                fallbacks.push(format!("{}: {e}", task_run.flags()));
                last = e;
                continue;
            }
        };
        if task_run == TaskRun::SingleIssuerDefer {
            // The same mode with NO_SQARRAY was the first call refused.
            fallbacks.push(format!("IORING_SETUP_NO_SQARRAY: {last}"));
            return Ok((ring, alone));
        }
        let with = Setup {
            no_sqarray: true,
            ..alone
        };
        return match build(with) {
            Ok(better) => Ok((better, with)),
            Err(e) => {
                fallbacks.push(format!("IORING_SETUP_NO_SQARRAY: {e}"));
                Ok((ring, alone))
            }
        };
    }
    Err(last)
}

fn build_ring(depth: u32, setup: Setup) -> io::Result<IoUring> {
    let mut builder = IoUring::builder();
    match setup.task_run {
        TaskRun::SingleIssuerDefer => builder.setup_single_issuer().setup_defer_taskrun(),
        TaskRun::Coop => builder.setup_coop_taskrun(),
        TaskRun::Plain => &mut builder,
    };
    if setup.no_sqarray {
        builder.setup_no_sqarray();
    }
    builder.build(depth)
}

/// Registers the ring's descriptor for this thread's enters through `submitter`; the reason it
/// cannot, else.
fn register_ring_fd(submitter: &mut Submitter<'_>) -> Result<(), String> {
    submitter
        .register_ring_fd()
        .map_err(|e| format!("IORING_REGISTER_RING_FDS: {e}"))
}

impl UringReader {
    /// A ring with `depth` reads in flight at most (a power of two, 1..=4096), reading `files`
    /// (indexed as the store's shards); `noatime_off`: why those are open without O_NOATIME.
    pub fn new(depth: u32, files: &[RawFd], noatime_off: Option<&str>) -> io::Result<Self> {
        let depth = depth.clamp(1, 4096).next_power_of_two();
        let mut fallbacks = Vec::new();
        let (ring, setup) = setup_ladder(|s| build_ring(depth, s), &mut fallbacks)?;
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
        // Lookups register the descriptor only while they run (the registration is this
        // thread's, and would keep the ring alive if the reader were dropped elsewhere): probe
        // once here so that a refusal is known, and said, up front.
        let mut probe = ring.submitter();
        let registered_ring_fd = match register_ring_fd(&mut probe) {
            Ok(()) => match probe.unregister_ring_fd() {
                Ok(()) => true,
                Err(e) => {
                    fallbacks.push(format!("IORING_UNREGISTER_RING_FDS: {e}"));
                    false
                }
            },
            Err(why) => {
                fallbacks.push(why);
                false
            }
        };
        if !fallbacks.is_empty() {
            log::warn!("io_uring fell back: {}", fallbacks.join("; "));
        }
        // Said when the store opened its shards; listed here too.
        fallbacks.extend(noatime_off.map(str::to_string));
        Ok(UringReader {
            ring,
            buf,
            slots: Slots {
                depth,
                slots: vec![Slot::default(); depth as usize],
                free: Vec::with_capacity(depth as usize),
                again: Vec::with_capacity(depth as usize),
                landed: Vec::with_capacity(depth as usize),
            },
            owner: std::thread::current().id(),
            features: RingFeatures {
                task_run: setup.task_run.name(),
                no_sqarray: setup.no_sqarray,
                registered_buffers,
                registered_files,
                registered_ring_fd,
                noatime_reads: noatime_off.is_none(),
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

/// What one lookup's reads need besides the ring.
struct Batch<'a> {
    inner: &'a Inner,
    layer: &'a LayerLayout,
    plan: &'a Plan,
    out: &'a OutRows,
    features: &'a RingFeatures,
    /// The slot buffer: slot `i` is `MAX_EXTENT` bytes from `base + i * MAX_EXTENT`.
    base: *mut u8,
}

/// A fatal ring error, and whether reads may still be writing into the slots.
struct RingError {
    error: io::Error,
    unusable: bool,
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
        let n = extents.end.min(plan.extents.len());
        let start = extents.start.min(n);
        let long = n - start >= RING_FD_MIN_DEPTHS * self.slots.depth as usize;
        let base = self.buf.as_mut_ptr();
        let (mut submitter, mut sq, mut cq) = self.ring.split();
        let registered = long
            && self.features.registered_ring_fd
            && match register_ring_fd(&mut submitter) {
                Ok(()) => true,
                // The probe passed, so this thread's table of registered rings is full (16):
                // say so once, and stop trying on this ring.
                Err(why) => {
                    log::warn!("io_uring fell back: {why}");
                    self.features.registered_ring_fd = false;
                    self.features.fallbacks.push(why);
                    inner.note_ring_features(&self.features);
                    false
                }
            };
        let batch = Batch {
            inner,
            layer,
            plan,
            out,
            features: &self.features,
            base,
        };
        let outcome = self
            .slots
            .pump(&submitter, &mut sq, &mut cq, &batch, start..n, failures);
        if registered && let Err(e) = submitter.unregister_ring_fd() {
            log::warn!("io_uring: IORING_UNREGISTER_RING_FDS: {e}");
        }
        match outcome {
            Ok(()) => Ok(()),
            Err(RingError { error, unusable }) => {
                if unusable {
                    // Keep the buffer alive forever rather than risk a write into freed memory.
                    std::mem::forget(std::mem::replace(&mut self.buf, AlignedBuf::new(1)));
                }
                Err(error)
            }
        }
    }
}

/// Where one pump is: the next extent of its range to submit, the range's end, and the reads in
/// flight.
struct Progress {
    next: usize,
    end: usize,
    in_flight: u32,
}

impl Slots {
    /// Submits `range`'s extents and reaps their completions until none is in flight.
    fn pump(
        &mut self,
        submitter: &Submitter<'_>,
        sq: &mut SubmissionQueue<'_>,
        cq: &mut CompletionQueue<'_>,
        b: &Batch<'_>,
        range: std::ops::Range<usize>,
        failures: &mut Vec<Failure>,
    ) -> Result<(), RingError> {
        self.free.clear();
        self.free.extend((0..self.depth).rev());
        self.again.clear();
        let mut at = Progress {
            next: range.start,
            end: range.end,
            in_flight: 0,
        };
        loop {
            self.submit(sq, b, &mut at);
            if at.in_flight == 0 {
                return Ok(());
            }
            self.wait(submitter, cq, &at)?;
            cq.sync();
            // Two passes: the verdicts first, with the output lines of every landed read
            // prefetched, then the copies, whose scattered stores then overlap their misses
            // instead of waiting for them one after another.
            self.reap(cq, b, &mut at, failures);
            self.deliver_landed(b, failures);
            cq.sync();
        }
    }

    /// Fills the submission queue: retries first, then new extents, until the queue, the free
    /// slots or the extents run out.
    fn submit(&mut self, sq: &mut SubmissionQueue<'_>, b: &Batch<'_>, at: &mut Progress) {
        let plan = b.plan;
        sq.sync();
        loop {
            let slot = if let Some(slot) = self.again.pop() {
                slot
            } else if at.next < at.end {
                let Some(slot) = self.free.pop() else { break };
                self.slots[slot as usize] = Slot {
                    extent: at.next as u32,
                    done: 0,
                    attempts: 0,
                };
                at.next += 1;
                slot
            } else {
                break;
            };
            let s = self.slots[slot as usize];
            let ext = &plan.extents[s.extent as usize];
            // SAFETY: slot * MAX_EXTENT + done + (len - done) <= depth * MAX_EXTENT,
            // the buffer's length; the slot is not the target of any other read in flight.
            let dst = unsafe {
                b.base
                    .add(slot as usize * MAX_EXTENT as usize + s.done as usize)
            };
            let entry = entry(
                b.features,
                b.inner,
                ext.file,
                dst,
                ext.len - s.done,
                ext.offset + u64::from(s.done),
            )
            .user_data(u64::from(slot));
            // SAFETY: the buffer outlives the read: the reader owns it and `read` returns
            // only after every submitted read has completed (or leaks it, see RingError).
            if unsafe { sq.push(&entry) }.is_err() {
                self.again.push(slot);
                break;
            }
            at.in_flight += 1;
        }
        sq.sync();
    }

    /// Submits what is queued and waits for a batch of completions. A fatal error first waits
    /// out the reads the kernel already took (they may still be writing into the slots).
    fn wait(
        &self,
        submitter: &Submitter<'_>,
        cq: &mut CompletionQueue<'_>,
        at: &Progress,
    ) -> Result<(), RingError> {
        // Wake once per batch of completions, not per read: for all of them when every read
        // of the lookup is in flight, else for a quarter of the ring to refill it.
        let want = if at.next >= at.end && self.again.is_empty() {
            at.in_flight
        } else {
            (at.in_flight / 4).max(1)
        };
        match submitter.submit_and_wait(want as usize) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(()),
            // Reads the kernel already took may still be writing into the slots: wait them
            // out (or leak the slots if the ring is unusable) before giving up.
            Err(error) => {
                let unusable = !drain(submitter, cq, at.in_flight);
                Err(RingError { error, unusable })
            }
        }
    }

    /// The verdict on each completion: a whole read lands (its output lines prefetched, its
    /// copy left to [`deliver_landed`](Self::deliver_landed)), a short or interrupted one goes
    /// again, and a failed one lands in `failures` and frees its slot.
    fn reap(
        &mut self,
        cq: &mut CompletionQueue<'_>,
        b: &Batch<'_>,
        at: &mut Progress,
        failures: &mut Vec<Failure>,
    ) {
        let plan = b.plan;
        self.landed.clear();
        for cqe in &mut *cq {
            at.in_flight -= 1;
            let slot = cqe.user_data() as u32;
            let s = &mut self.slots[slot as usize];
            let ext: &Extent = &plan.extents[s.extent as usize];
            let mut res = i64::from(cqe.result());
            if let Some(fault) = b.inner.fault() {
                res = fault.apply(|row| plan.covers(ext, row), res);
            }
            let direct = || b.inner.read_fd(ext.file as usize).1;
            match step(ext, direct, s.done, res, &mut s.attempts) {
                Step::Done => {
                    plan.prefetch_outputs(b.layer, ext, b.out);
                    self.landed.push(slot);
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

    /// Copies the rows of every landed read to their outputs and frees its slot.
    fn deliver_landed(&mut self, b: &Batch<'_>, failures: &mut Vec<Failure>) {
        let plan = b.plan;
        for &slot in &self.landed {
            let extent = self.slots[slot as usize].extent;
            let ext = &plan.extents[extent as usize];
            // SAFETY: the read into this slot has completed and no other read targets it
            // until it is freed below; the range lies inside the buffer (see `submit`).
            let data = unsafe {
                std::slice::from_raw_parts(
                    b.base.add(slot as usize * MAX_EXTENT as usize),
                    ext.len as usize,
                )
            };
            if !plan.deliver(b.layer, ext, data, b.out) {
                failures.push(Failure::internal(extent));
            }
            self.free.push(slot);
        }
    }
}

/// Waits out `in_flight` reads after a fatal ring error, so that no read targets the slots;
/// false when the ring is unusable and some may still.
fn drain(submitter: &Submitter<'_>, cq: &mut CompletionQueue<'_>, mut in_flight: u32) -> bool {
    while in_flight > 0 {
        if submitter.submit_and_wait(1).is_err() {
            return false;
        }
        cq.sync();
        in_flight -= (&mut *cq).count() as u32;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel that refuses the setups `refuses` says no to, with EINVAL as Linux does.
    fn kernel(refuses: impl Fn(Setup) -> bool) -> impl FnMut(Setup) -> io::Result<Setup> {
        move |s| {
            if refuses(s) {
                Err(io::Error::from_raw_os_error(libc::EINVAL))
            } else {
                Ok(s)
            }
        }
    }

    fn ladder(refuses: impl Fn(Setup) -> bool) -> (io::Result<Setup>, Vec<String>) {
        let mut fallbacks = Vec::new();
        let got = setup_ladder(kernel(refuses), &mut fallbacks).map(|(ring, setup)| {
            assert_eq!(
                ring, setup,
                "the ring returned is the one built with the setup"
            );
            setup
        });
        (got, fallbacks)
    }

    #[test]
    fn a_new_kernel_gets_everything_in_one_call() {
        let mut calls = 0;
        let mut fallbacks = Vec::new();
        let (_, s) = setup_ladder(
            |s| {
                calls += 1;
                Ok::<_, io::Error>(s)
            },
            &mut fallbacks,
        )
        .unwrap();
        assert_eq!(
            (s.task_run, s.no_sqarray, calls),
            (TaskRun::SingleIssuerDefer, true, 1)
        );
        assert!(fallbacks.is_empty());
    }

    #[test]
    fn a_kernel_before_6_6_keeps_single_issuer_without_no_sqarray() {
        let (s, fallbacks) = ladder(|s| s.no_sqarray);
        let s = s.unwrap();
        assert_eq!(
            (s.task_run, s.no_sqarray),
            (TaskRun::SingleIssuerDefer, false)
        );
        assert_eq!(fallbacks.len(), 1, "{fallbacks:?}");
        assert!(
            fallbacks[0].starts_with("IORING_SETUP_NO_SQARRAY: "),
            "{fallbacks:?}"
        );
    }

    #[test]
    fn a_5_19_kernel_gets_coop_taskrun_and_says_what_it_refused() {
        let (s, fallbacks) = ladder(|s| s.no_sqarray || s.task_run == TaskRun::SingleIssuerDefer);
        let s = s.unwrap();
        assert_eq!((s.task_run, s.no_sqarray), (TaskRun::Coop, false));
        assert!(fallbacks[0].starts_with("IORING_SETUP_SINGLE_ISSUER|DEFER_TASKRUN: "));
        assert!(fallbacks[1].starts_with("IORING_SETUP_NO_SQARRAY: "));
        assert_eq!(fallbacks.len(), 2, "{fallbacks:?}");
    }

    #[test]
    fn no_sqarray_without_single_issuer_is_still_taken() {
        let (s, fallbacks) = ladder(|s| s.task_run == TaskRun::SingleIssuerDefer);
        let s = s.unwrap();
        assert_eq!((s.task_run, s.no_sqarray), (TaskRun::Coop, true));
        assert_eq!(fallbacks.len(), 1, "{fallbacks:?}");
    }

    #[test]
    fn a_plain_ring_is_the_last_resort_and_nothing_is_an_error() {
        let (s, fallbacks) = ladder(|s| s.no_sqarray || s.task_run != TaskRun::Plain);
        assert_eq!(s.unwrap().task_run, TaskRun::Plain);
        assert_eq!(fallbacks.len(), 3, "{fallbacks:?}");
        let (s, fallbacks) = ladder(|_| true);
        assert_eq!(
            s.unwrap_err().raw_os_error(),
            Some(libc::EINVAL),
            "{fallbacks:?}"
        );
    }

    /// With this thread's table of registered rings full (16 slots), a reader says it cannot
    /// register its descriptor, and still reads.
    #[test]
    fn a_full_ring_fd_table_is_a_loud_fallback() {
        std::thread::spawn(|| {
            let file = tempfile::tempfile().unwrap();
            let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
            let mut others = Vec::new();
            for _ in 0..16 {
                let Ok(ring) = IoUring::new(2) else {
                    eprintln!("SKIP a_full_ring_fd_table_is_a_loud_fallback: no io_uring here");
                    return;
                };
                // The registration outlives the Submitter: it is the thread's, until it exits.
                let _ = ring.submitter().register_ring_fd();
                others.push(ring);
            }
            let reader = UringReader::new(8, &[fd], None).unwrap();
            let f = reader.features();
            assert!(!f.registered_ring_fd, "{f:?}");
            assert!(
                f.fallbacks
                    .iter()
                    .any(|w| w.starts_with("IORING_REGISTER_RING_FDS: ")),
                "{f:?}"
            );
        })
        .join()
        .unwrap();
        // A fresh thread has room again.
        std::thread::spawn(|| {
            let file = tempfile::tempfile().unwrap();
            let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
            let Ok(reader) = UringReader::new(8, &[fd], None) else {
                return;
            };
            let f = reader.features();
            assert_eq!(
                f.registered_ring_fd,
                !f.fallbacks.iter().any(|w| w.contains("RING_FDS")),
                "{f:?}"
            );
        })
        .join()
        .unwrap();
    }
}
