//! The lab's PTX module, one text per arch, built by `lab/build.rs` from `gpu/`'s lab families
//! for the same `FETCHAHEAD_ARCHS` as the product's, so that [`LabKernels`](crate::LabKernels)
//! loads it at the arch the product's kernels loaded.
use fetchahead::kernels::BuiltPtx;

include!(concat!(env!("OUT_DIR"), "/ptx.rs"));
