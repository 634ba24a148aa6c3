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
//! - [`store`]: the NVMe row store for Engram tables (safetensors shards, io_uring, DRAM cache).

pub mod access_policy;
pub mod error;
pub mod gemv;
pub mod gpu;
pub mod id_check;
pub mod kernels;
pub mod l2_plan;
pub mod ptx;
pub mod reference;
pub mod segments;
pub mod selfcheck;
pub mod store;
pub mod table;

pub use error::{Error, Result};
pub use fetchahead_gpu as device_abi;
