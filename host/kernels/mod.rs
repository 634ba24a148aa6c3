//! Kernel loading and launches: the PTX built from `gpu/` for each arch, the device, the loaded
//! kernels of one device and their checked launches (gather, gather + dequant, L2 prefetch, the
//! gather check), the out-of-range id check, and another module's kernels loaded beside them.
//!
//! May depend on: `crate::driver`, [`crate::error`], `fetchahead_gpu` (the kernels' parameter
//! structs, variant tables and kernel list).
//!
//! - [`ptx`]: the embedded PTX of the product's module and the choice for a device.
//! - [`gpu`]: opening a device; detecting that there is none.
//! - [`launch`]: [`Kernels`], every kernel of the product's module loaded for one device.
//! - [`module`]: [`KernelModule`], another module's PTX (the lab's) loaded at the same arch, and
//!   the launches its kernels take.
//! - [`id_check`]: the status word a gather writes for out-of-range ids, read back as an error.

pub mod gpu;
pub mod id_check;
pub mod launch;
pub mod module;
pub mod ptx;

pub use gpu::Gpu;
pub use id_check::IdCheck;
pub use launch::{
    Kernels, LoadedKernel, Slot, check_aligned, check_aligned_to, dequant_rows,
    dequant_variant_named, gather_variant_named, prefetch_variant_named,
};
pub use module::KernelModule;
pub use ptx::BuiltPtx;
