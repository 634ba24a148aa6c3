//! The self-check: every gather and gather + dequant variant run on this machine's GPU against
//! the CPU [`reference`](mod@reference), for a table in device memory and one in mapped pinned
//! host memory, each launch timed (`fetchahead check`), and the output poisoning every check of
//! a kernel uses. The reference and the run are feature `selfcheck`: they are built on the
//! `half` and `float8` crates, the only code that needs them, so that a library built without
//! the feature links neither. The product's tests include `reference.rs` by path.
//!
//! May depend on: [`crate::kernels`], [`crate::tables`], `crate::driver`.
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};
use fetchahead_gpu::{dequant, gather};
use rand::Rng;

use crate::Result;
use crate::kernels::Kernels;
use crate::tables::table::Placement;

#[cfg(feature = "selfcheck")]
pub mod reference;
#[cfg(feature = "selfcheck")]
mod run;
#[cfg(feature = "selfcheck")]
pub use run::{run, run_only};

/// Bytes per Engram row: 256 FP8 weights (the scales travel separately).
pub const ROW_BYTES: u32 = 256;

/// One kernel's result on one table placement.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub kernel: &'static str,
    pub placement: Placement,
    pub passed: bool,
    /// Empty when passed; otherwise where the output first differed.
    pub detail: String,
    /// Bytes moved (table rows read + output written + ids) per second of the timed launch.
    pub bytes_per_s: f64,
}

/// The names of the variants `run` checks: every gather and gather + dequant variant.
pub fn checked_variants() -> impl Iterator<Item = &'static str> {
    gather::VARIANTS
        .iter()
        .map(|v| v.name)
        .chain(dequant::VARIANTS.iter().map(|v| v.name))
}

/// The variants `run` leaves out on `kernels` because the loaded PTX does not hold them, each
/// with the SM its instructions need.
pub fn not_held(kernels: &Kernels) -> Vec<(&'static str, u32)> {
    checked_variants()
        .filter(|name| !kernels.holds(name))
        .map(|name| (name, crate::kernels::ptx::kernel_needs(name).unwrap_or(0)))
        .collect()
}

/// `Ok` when `run` checks a variant named `name`; otherwise an error that lists the names.
pub fn check_variant_name(name: &str) -> Result<()> {
    if checked_variants().any(|v| v == name) {
        return Ok(());
    }
    let names: Vec<_> = checked_variants().collect();
    Err(crate::Error::invalid(
        "variant",
        format!(
            "no gather or gather + dequant variant named `{name}` (one of: {})",
            names.join(", ")
        ),
    ))
}

/// Fills a device buffer with 0xFF bytes, so that an unwritten element fails the comparison.
pub fn poison<T: cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    out: &mut CudaSlice<T>,
) -> Result<()> {
    let bytes = out.len() * size_of::<T>();
    let (address, _use) = out.device_ptr_mut(stream);
    // SAFETY: the slice owns `bytes` bytes at `address`.
    unsafe { crate::driver::memory::memset_d8_async(address, 0xFF, bytes, stream.cu_stream()) }
}

/// A fresh seed for a run (printed, so that a failure can be replayed).
pub fn fresh_seed() -> u64 {
    rand::rng().next_u64()
}
