//! fetchahead's lab: the simulation the demo, the lab's benches and tests use, on top of the
//! product (`fetchahead`), which never depends on it. An engine links the product alone.
//!
//! May depend on: the product's public surface, `fetchahead_gpu` (the lab's kernel families'
//! parameters and tables), and this lab's own PTX module ([`ptx`]), which only the lab loads.
//!
//! - [`ptx`]: the lab's PTX module, built by `lab/build.rs` from `gpu/`'s lab families.
//! - [`kernels`]: [`LabKernels`], the product's kernels and the lab's module loaded beside them,
//!   and the launches of the hash, spin, collective and bf16 GEMV kernels.
//! - [`gemv`]: a bf16 GEMV with its buffers, the weight-bound reader of tests and benches.
//! - [`forward`]: a simulated forward with Engram layers, for the demo and the bench.
//! - [`decode_step`]: a simulated DeepSeek-scale decode step with both features, the one driver
//!   of its configurations, and its projection to the DGX Spark.
//! - [`reference`](mod@reference): the CPU reference of the GEMV (the product's kernels' is
//!   `fetchahead::selfcheck::reference`).
//! - [`trace`]: decode steps recorded on the device timeline, eager and replayed, for
//!   `fetchahead-lab trace`, the demo and the decode-step bench.
//! - [`cli`]: the `fetchahead-lab` command line: the demo (its default), the trace, and the
//!   product's commands over both PTX modules.

pub mod cli;
pub mod decode_step;
pub mod forward;
pub mod gemv;
pub mod kernels;
pub mod ptx;
pub mod reference;
pub mod trace;

pub use kernels::{GEMV_MAX_SPLITS, GEMV_WARPS_PER_SM, LabKernels};
