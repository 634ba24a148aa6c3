//! fetchahead: gets bytes to the GPU's multiprocessors before the kernels that need them start.
//!
//! This is the product: what an engine links and loads. The lab (`fetchahead-lab`, in `lab/`:
//! the simulation, the decode-step driver, the demo, their kernels' PTX module) depends on it,
//! never the other way round.
//!
//! The folders are the architecture, each layer using only the ones above it:
//!
//! - [`driver`]: the raw-driver layer, the only code that calls cudarc's `sys`/`result` (in this
//!   crate and in the binding, the benches and the lab, which use its public functions).
//! - [`kernels`]: the product's PTX built from `gpu/` for each arch, opening a device, the loaded
//!   kernels and their checked launches ([`Kernels`], [`Gpu`]), and another module's kernels
//!   loaded beside them ([`KernelModule`], the lab's way in).
//! - [`tables`]: row tables in device memory or in pinned host memory mapped for the device.
//! - [`l2_plan`]: the learned plan that warms the next weights into L2 during collectives; its CPU
//!   [`Planner`] apart from the device side ([`L2Plan`]), and the access-policy alternative.
//! - [`row_lookup`]: the [`RowLookup`] trait the store implements and the prefetcher and the C ABI
//!   call, below both.
//! - [`store`]: the NVMe row store for Engram tables (safetensors shards, io_uring, DRAM cache).
//! - [`prefetch`]: the prefetch pipeline of one Engram layer: lookups, staging, the side-stream
//!   [`Prefetcher`], the [`FlagLane`], check mode's log.
//! - [`ffi`]: the C ABI for engines (`include/fetchahead.h`).
//! - [`timeline`]: the device-side timeline (each instrumented kernel's blocks, start and end)
//!   and its Chrome trace.
//! - [`selfcheck`]: every gather and gather + dequant variant against the CPU reference (the
//!   `half` and `float8` crates, feature `selfcheck`), for `fetchahead check`; the output
//!   poisoning the tests use too.
//! - `cli` (feature `cli`, which turns `selfcheck` on): the product's `fetchahead` command line
//!   (info, kernels, ptx, check, make-table, inspect, tune, bench-io), which the binary and the
//!   Python wheel's command both run, and which the lab's command extends; [`info`]: the build
//!   and configuration report; [`nvtx`]: the profiler ranges (`FETCHAHEAD_NVTX=1`).
//! - [`error`], [`logging`], [`memory`]: the one error type, the stderr logger of the CLI and the
//!   C library (`FETCHAHEAD_LOG`), allocations sized by input, checked and fallible;
//!   [`settings`]: every `FETCHAHEAD_*` variable's name, and the warning about unknown ones.
//!
//! The main types are re-exported here.

// The CLI's modules name the crate as its users do.
extern crate self as fetchahead;

#[cfg(feature = "cli")]
pub mod cli;
pub mod driver;
pub mod error;
pub mod ffi;
pub mod info;
pub mod kernels;
pub mod l2_plan;
pub mod logging;
pub mod memory;
pub mod nvtx;
pub mod prefetch;
pub mod row_lookup;
pub mod selfcheck;
pub mod settings;
pub mod store;
pub mod tables;
pub mod timeline;

pub use error::{Error, Result};
pub use fetchahead_gpu as device_abi;
pub use fetchahead_gpu::dequant::DequantVariant;
pub use fetchahead_gpu::gather::GatherVariant;
pub use fetchahead_gpu::l2_prefetch::PrefetchVariant;
pub use kernels::{
    Gpu, IdCheck, KernelModule, Kernels, dequant_variant_named, gather_variant_named,
    prefetch_variant_named, ptx,
};
pub use l2_plan::{
    AccessWindow, L2Plan, PersistingL2, PlanConfig, Planner, Replay, SegmentTable, Signature,
};
pub use prefetch::{
    Completion, FlagLane, Join, MemoryRows, Prefetcher, PrefetcherConfig, StagingLayout,
};
pub use row_lookup::RowLookup;
pub use store::{LayerRows, ReadPath, RowStore, StoreOptions};
pub use tables::{Mxfp8Table, Placement, RowTable};

/// The README's Rust snippets, compiled as doctests (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
