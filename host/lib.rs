//! fetchahead: gets bytes to the GPU's multiprocessors before the kernels that need them start.
//!
//! - [`ptx`]: the PTX built from `gpu/` for each arch, and the choice for a device.
//! - [`gpu`]: opening a device; detecting that there is none.
//! - [`kernels`]: the loaded kernels and their launches (gather, gather + dequant, L2 prefetch,
//!   bf16 GEMV, simulated collective).
//! - [`gemv`]: a bf16 GEMV with its buffers, the weight-bound reader of tests and benches.
//! - [`segments`]: prefetch segments checked on the host and uploaded as a device table.
//! - [`l2_plan`]: the learned plan that warms the next weights into L2 during collectives.
//! - [`access_policy`]: the persisting-L2 access-policy window, the plan's alternative mode.
//! - [`table`]: row tables in device memory or in pinned host memory mapped for the device.
//! - [`reference`]: the CPU reference every kernel is checked against.
//! - [`selfcheck`]: runs every kernel against the reference on this machine's GPU.
//! - [`lookup`]: the row lookup the prefetcher calls ([`lookup::RowLookup`]), and an in-memory table.
//! - [`staging`]: pinned host buffers and device mirrors for staged rows.
//! - [`host_fn`]: enqueuing Rust work on a stream (`cuLaunchHostFunc`).
//! - [`prefetcher`]: the side-stream prefetcher of one Engram layer.
//! - [`ffi`]: the C ABI for engines (`include/fetchahead.h`).
//! - [`forward`]: a simulated forward with Engram layers, for the demo and the bench.
//! - [`memory`]: allocations sized by input, checked and fallible.
//! - [`decode_step`]: a simulated DeepSeek-scale decode step with both features, and its
//!   projection to the DGX Spark.
//! - [`store`]: the NVMe row store for Engram tables (safetensors shards, io_uring, DRAM cache).

pub mod access_policy;
pub mod check_log;
pub mod decode_step;
pub mod error;
pub mod ffi;
pub mod flag_worker;
pub mod forward;
pub mod gemv;
pub mod gpu;
pub mod host_fn;
pub mod id_check;
pub mod kernels;
pub mod l2_plan;
pub mod lookup;
pub mod lookup_job;
pub mod memory;
pub mod prefetcher;
pub mod ptx;
pub mod reference;
pub mod segments;
pub mod selfcheck;
pub mod staging;
pub mod store;
pub mod stream;
pub mod table;
pub mod window_fit;

pub use error::{Error, Result};
pub use fetchahead_gpu as device_abi;
