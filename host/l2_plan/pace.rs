//! [`HostPace`]: whether the GPU keeps up with the host in an eager forward, so that the plan
//! spends no host time on prefetches that cannot shorten the forward.
//!
//! A window's prefetch costs the host three driver calls (an event record, a stream wait and a
//! kernel launch: about 4 us from Python on the H200, most of it the launch). When the GPU is
//! behind the host, that cost is hidden and the warmed readers shorten the forward. When the GPU
//! has caught up, the forward's time is the host's: a faster reader only idles sooner, and the
//! calls make the forward slower. So every [`PROBE_EVERY`] windows the plan records an event at
//! the reader's point of a window (its first `consume`) and asks [`PROBE_LAG`] collectives
//! later whether the GPU has passed it: if it has, the GPU is less than that many windows behind
//! the host, and the plan's windows are counted but not warmed until a later probe finds the
//! GPU behind again (the next forward's first windows follow the last probe too). One record and
//! one query every [`PROBE_EVERY`] windows; captured forwards are never probed (a replayed graph
//! has no host in its way).
use cudarc::driver::{CudaEvent, CudaStream, sys};

use crate::Result;
use crate::error::CudaCall;

/// Windows between probes.
pub const PROBE_EVERY: usize = 8;
/// Collectives between a probe's mark and its question: more than one, since a launch reaches
/// an idle GPU several microseconds after the host made it (a few microseconds of host time
/// can separate one window's reader from the next collective).
pub const PROBE_LAG: usize = 2;

/// The host-bound test of an eager forward's windows.
#[derive(Debug)]
pub struct HostPace {
    probe: CudaEvent,
    /// The window whose reader's point the probe marks, until the next collective asks.
    armed: Option<usize>,
    /// What the last probe found: the GPU had caught up with the host.
    host_bound: bool,
}

impl HostPace {
    /// A pace with its probe event on `stream`'s context; it starts as not host-bound.
    pub fn new(stream: &CudaStream) -> Result<HostPace> {
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
        Ok(HostPace {
            probe: stream
                .context()
                .new_event(Some(flags))
                .call("cuEventCreate")?,
            armed: None,
            host_bound: false,
        })
    }

    /// A forward begins as the last probe left the pace (its first windows until its own first
    /// probe is asked); a probe left armed by the last forward says nothing about this one.
    pub fn begin_forward(&mut self) {
        self.armed = None;
    }

    /// The reader's point of window `k` on `main` (its first `consume`): marked every
    /// [`PROBE_EVERY`] windows.
    pub fn reader_point(&mut self, k: usize, main: &CudaStream) -> Result<()> {
        if self.armed.is_none() && k.is_multiple_of(PROBE_EVERY) {
            self.probe.record(main).call("cuEventRecord")?;
            self.armed = Some(k);
        }
        Ok(())
    }

    /// Collective `k` is about to be launched: whether the GPU had caught up with the host, as
    /// the last probe found (asked now when it marked window `k - PROBE_LAG`).
    pub fn host_bound(&mut self, k: usize) -> Result<bool> {
        if let Some(marked) = self.armed
            && k >= marked + PROBE_LAG
        {
            self.host_bound = self.probe.try_is_complete().call("cuEventQuery")?;
            self.armed = None;
        }
        Ok(self.host_bound)
    }
}
