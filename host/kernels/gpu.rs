//! Opening a CUDA device, and telling "no GPU here" apart from a real failure.
use std::sync::Arc;

use cudarc::driver::{CudaContext, sys};

use crate::error::CudaCall;
use crate::{Error, Result};

/// Set to 1 where a GPU must exist (the GPU machine's runner): tests then fail instead of skipping.
pub const REQUIRE_GPU_ENV: &str = "FETCHAHEAD_REQUIRE_GPU";

/// A device and what the launches need to know about it.
#[derive(Clone, Debug)]
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub multiprocessors: u32,
    pub l2_bytes: u64,
}

impl Gpu {
    /// Whether device `ordinal` exists, without creating a context: `Ok(count)` of devices, or
    /// [`Error::NoDevice`] saying why not (no driver library, no device, too few).
    pub fn check_present(ordinal: usize) -> Result<usize> {
        // cudarc panics on first use without libcuda.
        if !crate::driver::culib_present() {
            return Err(Error::NoDevice(
                "the CUDA driver library (libcuda.so) is not installed".into(),
            ));
        }
        let count = CudaContext::device_count()
            .call("cuDeviceGetCount")
            .map_err(|e| {
                Error::NoDevice(format!("the CUDA driver found no usable device ({e})"))
            })?;
        if count as usize <= ordinal {
            return Err(Error::NoDevice(format!(
                "device {ordinal} asked for, {count} present"
            )));
        }
        Ok(count as usize)
    }

    /// Opens device `ordinal`, or says why there is none (no driver library, no device).
    pub fn open(ordinal: usize) -> Result<Gpu> {
        Gpu::check_present(ordinal)?;
        let ctx = CudaContext::new(ordinal).call("cuCtxCreate")?;
        let attr = |a| ctx.attribute(a).call("cuDeviceGetAttribute");
        use sys::CUdevice_attribute::*;
        Ok(Gpu {
            name: ctx.name().call("cuDeviceGetName")?,
            compute_capability: ctx.compute_capability().call("cuDeviceGetAttribute")?,
            multiprocessors: attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            l2_bytes: attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as u64,
            ctx,
        })
    }

    /// Opens device 0 for a test or bench: `Ok(None)` (after printing why) when there is none,
    /// unless `FETCHAHEAD_REQUIRE_GPU=1`, when that is an error.
    pub fn for_test(what: &str) -> Result<Option<Gpu>> {
        match Gpu::open(0) {
            Ok(gpu) => Ok(Some(gpu)),
            Err(Error::NoDevice(why)) if !gpu_required() => {
                eprintln!("skipping {what}: {why} (set {REQUIRE_GPU_ENV}=1 to make this fail)");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

pub fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU_ENV).is_ok_and(|v| v == "1")
}
