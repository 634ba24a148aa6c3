//! The raw-driver layer: the only code that calls cudarc's `sys::cu*` and `result::*`.
//!
//! Each function here is one small checked call with a `// SAFETY:` comment saying which
//! invariant holds; everything above it (kernels, tables, the L2 plan, the prefetch pipeline)
//! and the lab (`fetchahead-lab`) use these functions or cudarc's safe types. Public only where
//! another crate needs a call: [`memory`]'s memsets and copies at raw device addresses. `.ci/run`
//! fails on a raw call outside this folder.
//!
//! May depend on: cudarc, [`crate::error`]. Nothing else in the crate.
//!
//! Public for the crates beside this one (the Python binding, the benches, the lab): the few
//! raw calls they need are here as safe or documented unsafe functions, never in their own code
//! (the same `.ci/run` gate covers them).
//!
//! - [`stream`]: stream-ordered calls on raw streams: capture status, event fork and join, async
//!   copies, 32-bit flag writes and waits.
//! - [`host_fn`]: the one `cuLaunchHostFunc` wrapper.
//! - [`launch`]: `cuLaunchKernel`, `cuLaunchKernelEx`, cluster occupancy, launch attributes.
//! - [`memory`]: pinned host memory mapped for the device, device memsets and copies.
//! - [`l2`]: the persisting-L2 calls (stream access-policy window, reset).

pub(crate) mod host_fn;
pub(crate) mod l2;
pub(crate) mod launch;
pub mod memory;
pub mod stream;

/// Whether libcuda can be loaded (cudarc panics on the first call otherwise).
pub fn culib_present() -> bool {
    // SAFETY: only probes whether libcuda can be loaded; loads nothing else.
    unsafe { cudarc::driver::sys::is_culib_present() }
}
