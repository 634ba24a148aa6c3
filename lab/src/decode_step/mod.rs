//! A simulated decode step at DeepSeek scale with both of the crate's features: what fetchahead
//! buys per step.
//!
//! The step: the Engram hash of the step's tokens (and the Engram prefetches right after it),
//! then per layer its collectives, each a simulated collective kernel
//! ([`LabKernels::launch_collective`](crate::LabKernels::launch_collective)) followed by weight-bound readers of the next weights (the crate's bf16 GEMV over weights of
//! DeepSeek-V3's projection shapes per tensor-parallel rank), spin kernels for the rest of each
//! layer's compute before each collective, and at the end of each Engram layer its gather of the
//! looked-up rows. Every reader reads weights of its own: the step's weights are far larger than
//! L2, so that without the plan every reader starts cold, as in a real step.
//!
//! Four configurations ([`StepConfig`]): neither feature (the synchronous Engram lookup at the
//! gather, no L2 plan), the Engram prefetcher only, the L2 plan only, both; and the floors the
//! Engram stall is measured from (rows resident on the device, with and without the plan). Each
//! runs eagerly or from a captured CUDA graph; outputs (every reader's and every Engram layer's)
//! are bit-identical across them ([`StepOutputs`]).
//!
//! [`SparkModel`] projects the measured step to the DGX Spark (GB10); its assumptions are listed
//! in [`SparkModel::assumptions`].
//!
//! - `shape`: [`DecodeShape`], the model and its windows' schedule.
//! - `weights`: [`DecodeWeights`], every window's readers over weights of their own.
//! - `step`: [`DecodeStep`] in each [`StepConfig`], timed, captured, its [`StepOutputs`].
//! - `driver`: [`sweep`], the one driver of every configuration, eager and replayed, that the
//!   demo, the decode-step bench and its test run.
//! - `report`: [`Run`], a configuration's timed steps, and the step table ([`report`]).
//! - `spark`: the readers' measured times and the projection ([`SparkModel`], [`spark_lines`]).
use std::sync::Arc;

use cudarc::driver::{CudaGraph, CudaStream, sys};

use fetchahead::error::CudaCall;
use fetchahead::{Error, Result};

mod driver;
mod report;
mod shape;
mod spark;
mod step;
mod weights;

pub use driver::{Case, Sweep, sweep};
pub use report::{PLAN_GOAL, Run, Runs, percentile, report};
pub use shape::{DecodeShape, Matrix, WindowRole, WindowSpec};
pub use spark::{
    GB10, MeasuredStep, ModelWindow, ReaderTime, SparkModel, TargetDevice, model_windows,
    reader_times, spark_lines,
};
pub use step::{DecodeStep, StepConfig, StepOutputs};
pub use weights::{DecodeWeights, Reader};

const MIB: f64 = (1u64 << 20) as f64;

/// The GPU's lead-in before a timed decode step's start event, microseconds: longer than the
/// CPU's eager enqueue of a whole step (a few hundred launches), so that the step's GPU time
/// holds no wait for the CPU ([`StepTime::lead_in_overrun`](crate::forward::StepTime) says when
/// it did not suffice).
pub const DECODE_LEAD_IN_US: u64 = 10_000;

/// CTAs of each simulated collective (a decode all-reduce or all-gather runs on 1-8).
pub const COLLECTIVE_BLOCKS: u32 = 4;

/// What `enqueue` puts on `stream`, captured into an uploaded graph (launch it on `stream`).
fn capture_graph(
    stream: &Arc<CudaStream>,
    enqueue: impl FnOnce() -> Result<()>,
) -> Result<CudaGraph> {
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    stream.begin_capture(mode).call("cuStreamBeginCapture")?;
    let enqueued = enqueue();
    let graph = stream
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .call("cuStreamEndCapture")?;
    enqueued?;
    let graph = graph.ok_or_else(|| Error::invalid("graph", "the capture recorded nothing"))?;
    graph.upload().call("cuGraphUpload")?;
    Ok(graph)
}
