//! The simulation the demo, the benches and the tests use; not part of an engine's surface
//! (behind the `simulation` cargo feature, on by default; an engine may build with
//! `default-features = false`).
//!
//! May depend on everything else in the crate; nothing outside `sim/`, the CLI, the benches and
//! the tests depends on it.
//!
//! - [`kernels`]: the launches of the hash, spin, collective and bf16 GEMV kernels (an `impl
//!   Kernels` block).
//! - [`gemv`]: a bf16 GEMV with its buffers, the weight-bound reader of tests and benches.
//! - [`forward`]: a simulated forward with Engram layers, for the demo and the bench.
//! - [`decode_step`]: a simulated DeepSeek-scale decode step with both features, and its
//!   projection to the DGX Spark.
//! - [`reference`](mod@reference): the CPU reference every kernel is checked against.
//! - [`selfcheck`]: runs every kernel against the reference on this machine's GPU.
//! - [`trace`]: decode steps recorded on the device timeline, eager and replayed, for
//!   `fetchahead trace`, the demo and the decode-step bench.

pub mod decode_step;
pub mod forward;
pub mod gemv;
pub mod kernels;
pub mod reference;
pub mod selfcheck;
pub mod trace;

pub use kernels::{GEMV_MAX_SPLITS, GEMV_WARPS_PER_SM};
