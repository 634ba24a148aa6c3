//! The prefetch pipeline of one Engram layer: row lookups, staging buffers, the side-stream
//! prefetcher, the flag lane that runs lookups off the driver's callback thread, and the check
//! log of check mode.
//!
//! Data flows ids -> [`RowLookup`](crate::row_lookup::RowLookup) (for example a
//! [`crate::store::LayerRows`]) -> [`staging`] -> gather. May depend on: [`crate::kernels`],
//! [`crate::row_lookup`], `crate::driver` (stream calls, host functions, mapped pinned memory),
//! [`crate::memory`], [`crate::error`].
//!
//! - [`prefetcher`]: [`Prefetcher`], the side-stream prefetcher of one Engram layer.
//! - [`lookup`]: an in-memory table ([`MemoryRows`]) for tests, examples and fault injection.
//! - [`staging`]: pinned host buffers and device mirrors for staged rows.
//! - [`flag_worker`]: [`FlagLane`], lookups on a worker thread woken by stream-written flags.
//! - `lookup_job`, `check_log`: the lookup job a stream runs, and check mode's log.
//!
//! The guide below (this folder's `README.md`) shows it in use.
#![doc = include_str!("README.md")]

pub(crate) mod check_log;
pub mod flag_worker;
pub mod lookup;
pub(crate) mod lookup_job;
pub mod prefetcher;
pub mod staging;

pub use flag_worker::FlagLane;
pub use lookup::MemoryRows;
pub use lookup_job::LookupFailure;
pub use prefetcher::{Completion, Join, Prefetcher, PrefetcherConfig, Stats};
pub use staging::StagingLayout;
