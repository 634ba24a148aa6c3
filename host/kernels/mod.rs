//! Kernel loading and launches: the PTX built from `gpu/` for each arch, the device, the loaded
//! kernels of one device and their checked launches (gather, gather + dequant, L2 prefetch, the
//! gather check), and the out-of-range id check.
//!
//! May depend on: `crate::driver`, [`crate::error`], `fetchahead_gpu` (the kernels' parameter
//! structs and variant tables). The simulation's launches (hash, spin, collective, GEMV) live in
//! `crate::sim`, as a second `impl Kernels` block.
//!
//! - [`ptx`]: the embedded PTX and the choice for a device.
//! - [`gpu`]: opening a device; detecting that there is none.
//! - [`launch`]: [`Kernels`], every kernel of the variant tables loaded for one device.
//! - [`id_check`]: the status word a gather writes for out-of-range ids, read back as an error.

pub mod gpu;
pub mod id_check;
pub mod launch;
pub mod ptx;

pub use gpu::Gpu;
pub use id_check::IdCheck;
pub use launch::{Kernels, dequant_variant_named, gather_variant_named, prefetch_variant_named};
pub use ptx::BuiltPtx;
