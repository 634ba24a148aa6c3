//! Row tables the kernels read, in device memory or in pinned host memory mapped for the device.
//!
//! May depend on: [`crate::kernels`] (launches), `crate::driver` (mapped pinned memory),
//! [`crate::error`].

pub mod table;

pub use table::{Mxfp8Table, Placement, RowTable, TableMemory};
