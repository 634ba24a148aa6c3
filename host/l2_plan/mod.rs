//! The L2 plan: learns which weights follow each collective of a forward, and warms them into L2
//! while the next forward's collective runs.
//!
//! Learning: the caller brackets a forward with a [`Signature`] it chooses, announces each
//! collective before launching it, and reports every weight a kernel consumes. Per signature the
//! plan keeps, for each collective, the weights consumed after it, in order, up to a byte budget
//! per window. Replay: before collective `k` the plan forks a side stream from the main stream,
//! prefetches window `k` there, and joins it back at the next collective or at the end of the
//! forward; inside a CUDA graph capture the fork and join become a graph branch.
//!
//! The rules that keep a plan harmless: a prefetch is only a cache hint, so a stale plan can
//! only waste bandwidth; a forward with more collectives than learned prefetches nothing past the
//! plan; an eager forward that saw no collectives never replaces a learned plan; a signature is
//! frozen once captured, and the segment tables a capture used live as long as the plan (and as
//! long as the caller keeps the [`ForwardOutcome::tables`] it got back).
//!
//! May depend on: [`crate::kernels`] (the prefetch launch), `crate::driver`, [`crate::error`].
//! The CPU side ([`planner`], `window_fit`) depends on no device at all.
//!
//! - [`planner`]: [`Planner`], the plan logic alone, on the CPU, and its configuration.
//! - [`device`]: [`L2Plan`], which drives the device with a planner.
//! - [`window_fit`]: the byte caps that fit each window's prefetch into its window.
//! - [`pace`]: whether the GPU keeps up with the host, so that eager windows the host is the
//!   bottleneck of spend no host time on prefetches.
//! - [`partitions`]: which L2 partition each SM is near, measured on the device.
//! - [`segments`]: prefetch segments checked on the host and uploaded as a device table.
//! - [`access_policy`]: the persisting-L2 access-policy window, the plan's alternative mode.
//!
//! The guide below (this folder's `README.md`) shows it in use.
#![doc = include_str!("README.md")]

pub mod access_policy;
pub mod device;
pub mod pace;
pub mod partitions;
pub mod planner;
pub mod segments;
pub mod window_fit;

pub use access_policy::{AccessWindow, PersistingL2};
pub use device::{ForwardOutcome, L2Plan};
pub use planner::{
    CollectiveKind, Counters, DEFAULT_FREE_SMS, DEFAULT_TWICE_FIT, ForwardSummary, Learned,
    PLAN_ENV_SETTINGS, PlanConfig, Planner, PrefetchLaunch, Replay, SEGMENT_PIECE, Signature,
    Windows, auto_variant, default_budget, graph_sms, once_jobs, prefetch_choice, read_limit,
};
pub use segments::{SEGMENT_ALIGN, SegmentTable, aligned_segment, check_segment};
