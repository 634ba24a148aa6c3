//! The device-side timeline: each instrumented kernel's blocks (the L2 prefetches, the Engram
//! gathers, and the simulation's collectives, readers and spin) record their start and end
//! (`%globaltimer`), SM and block into a ring in device memory; [`trace`] turns what is read back
//! into a Chrome trace that Perfetto opens.
//!
//! Off by default and free when off: a launch then runs the plain kernel, which has no timeline
//! code, and hands it a null ring (`TimelineParams::OFF`); on, it runs the kernel's `_timed` twin. On through [`Kernels::enable_timeline`] or with
//! `FETCHAHEAD_TIMELINE=1` when the kernels load; every launch through [`Kernels`] then carries
//! the ring, the kernel's id and the label last set with [`Kernels::set_timeline_label`]. A graph
//! captured meanwhile keeps the ring in its nodes, so its replays record too.
//!
//! May depend on: `crate::kernels`, [`crate::error`], `fetchahead_gpu::timeline` (the record and
//! the ring's layout, defined once there).

pub mod trace;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use cudarc::driver::{CudaSlice, DevicePtr};
use fetchahead_gpu::timeline::{NO_LABEL, TimelineParams, ring_bytes};

use crate::error::CudaCall;
use crate::kernels::Kernels;
use crate::{Error, Result};
pub use trace::{Capture, Trace, kind_of};

/// The setting that turns the timeline on when the kernels load (`1`: on).
pub const TIMELINE_ENV: &str = "FETCHAHEAD_TIMELINE";
/// Records a ring holds unless told otherwise (32 MiB of device memory): a DeepSeek-scale decode
/// step records about 280 thousand blocks, most of them its readers' clusters.
pub const DEFAULT_CAPACITY: u64 = 1 << 20;

/// The timeline's state in a [`Kernels`]: the ring's address (0: off) and the current label,
/// read by every launch, and the ring itself, kept until the kernels drop (a graph captured
/// with the timeline on may still write it).
#[derive(Debug)]
pub(crate) struct TimelineSwitch {
    address: AtomicU64,
    label: AtomicU32,
    ring: Mutex<Option<CudaSlice<u64>>>,
}

impl TimelineSwitch {
    pub(crate) fn off() -> TimelineSwitch {
        TimelineSwitch {
            address: AtomicU64::new(0),
            label: AtomicU32::new(NO_LABEL),
            ring: Mutex::new(None),
        }
    }

    /// What a launch of kernel `id` hands the kernel.
    pub(crate) fn params(&self, id: u32) -> TimelineParams {
        match self.address.load(Ordering::Relaxed) {
            0 => TimelineParams::OFF,
            ring => TimelineParams {
                ring,
                kernel: id,
                label: self.label.load(Ordering::Relaxed),
            },
        }
    }
}

/// Whether [`TIMELINE_ENV`] asks for the timeline.
pub fn enabled_by_env() -> bool {
    std::env::var(TIMELINE_ENV).is_ok_and(|v| v == "1")
}

impl Kernels {
    /// Turns the timeline on: later launches record their blocks. The ring (of `capacity`
    /// records, a power of two) is allocated on the first call and kept; a later call with
    /// another capacity is an error.
    pub fn enable_timeline(&self, capacity: u64) -> Result<()> {
        if capacity == 0 || !capacity.is_power_of_two() || capacity > 1 << 26 {
            return Err(Error::invalid(
                "timeline capacity",
                format!("{capacity} records; want a power of two up to 2^26"),
            ));
        }
        let mut ring = self.timeline.ring.lock().map_err(|_| poisoned())?;
        let address = match ring.as_ref() {
            Some(r) if r.len() as u64 * 8 != ring_bytes(capacity) => {
                return Err(Error::invalid(
                    "timeline capacity",
                    format!(
                        "the ring was allocated for {} records; asked for {capacity}",
                        (r.len() as u64 * 8 - ring_bytes(0))
                            / fetchahead_gpu::timeline::RECORD_BYTES
                    ),
                ));
            }
            Some(r) => r.device_ptr(&self.gpu.ctx.default_stream()).0,
            None => {
                crate::memory::check_fits(ring_bytes(capacity), "the timeline's read-back")?;
                let stream = self.gpu.ctx.default_stream();
                let words = (ring_bytes(capacity) / 8) as usize;
                let mut r = stream.alloc_zeros::<u64>(words).call("cuMemAlloc")?;
                stream
                    .memcpy_htod(&[0u64, capacity], &mut r.slice_mut(0..2))
                    .call("cuMemcpyHtoD")?;
                stream.synchronize().call("cuStreamSynchronize")?;
                let address = r.device_ptr(&stream).0;
                *ring = Some(r);
                address
            }
        };
        self.timeline.address.store(address, Ordering::Relaxed);
        Ok(())
    }

    /// Turns the timeline off: later launches record nothing (graphs captured while it was on
    /// still do).
    pub fn disable_timeline(&self) {
        self.timeline.address.store(0, Ordering::Relaxed);
    }

    pub fn timeline_enabled(&self) -> bool {
        self.timeline.address.load(Ordering::Relaxed) != 0
    }

    /// The label later launches record (a window index; [`NO_LABEL`] for none).
    pub fn set_timeline_label(&self, label: u32) {
        self.timeline.label.store(label, Ordering::Relaxed);
    }

    /// Waits for the device, reads the ring back and empties it. An error if the timeline was
    /// never enabled.
    pub fn take_timeline(&self) -> Result<Capture> {
        let mut ring = self.timeline.ring.lock().map_err(|_| poisoned())?;
        let ring = ring.as_mut().ok_or_else(|| {
            Error::invalid(
                "timeline",
                format!("never enabled (Kernels::enable_timeline, or {TIMELINE_ENV}=1)"),
            )
        })?;
        self.gpu.ctx.synchronize().call("cuCtxSynchronize")?;
        let stream = self.gpu.ctx.default_stream();
        let words = stream.clone_dtoh(&*ring).call("cuMemcpyDtoH")?;
        stream
            .memcpy_htod(&[0u64], &mut ring.slice_mut(0..1))
            .call("cuMemcpyHtoD")?;
        stream.synchronize().call("cuStreamSynchronize")?;
        Capture::from_ring_words(&words)
    }
}

fn poisoned() -> Error {
    Error::invalid("timeline", "a thread panicked while holding the ring")
}
