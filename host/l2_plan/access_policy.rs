//! The alternative to prefetching: an access-policy window over the persisting L2 set-aside.
//!
//! `cuCtxSetLimit(CU_LIMIT_PERSISTING_L2_CACHE_SIZE)` sets part of L2 aside for lines marked
//! persisting; a window `{base, bytes, hit_ratio}` on a stream (or on one launch) marks the lines
//! its kernels touch inside the window persisting, so that they survive the streaming traffic of
//! the kernels in between. Unlike a prefetch it brings nothing in early: the first read after the
//! lines were evicted still comes from DRAM.
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, sys};

use crate::driver;
use crate::error::CudaCall;
use crate::kernels::gpu::Gpu;
use crate::{Error, Result};

/// One access-policy window: `hit_ratio` of the lines in `base..base + bytes` persist, the rest
/// stream.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AccessWindow {
    pub base: u64,
    pub bytes: u64,
    pub hit_ratio: f32,
}

impl AccessWindow {
    fn value(&self) -> sys::CUlaunchAttributeValue {
        driver::launch::access_policy_value(self.base, self.bytes, self.hit_ratio)
    }

    /// The window as a launch attribute for `cuLaunchKernelEx`.
    pub fn launch_attribute(&self) -> sys::CUlaunchAttribute {
        sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW,
            pad: [0; 4],
            value: self.value(),
        }
    }
}

/// The persisting L2 set-aside of one context, released when dropped.
#[derive(Debug)]
pub struct PersistingL2 {
    ctx: Arc<CudaContext>,
    set_aside: u64,
    max_window: u64,
}

impl PersistingL2 {
    /// Sets aside up to `bytes` of L2 for persisting lines (clamped to the device's maximum).
    pub fn reserve(gpu: &Gpu, bytes: u64) -> Result<PersistingL2> {
        use sys::CUdevice_attribute::*;
        let attr = |a| gpu.ctx.attribute(a).call("cuDeviceGetAttribute");
        let max_set_aside = attr(CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE)? as u64;
        let max_window = attr(CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE)? as u64;
        if max_set_aside == 0 || max_window == 0 {
            return Err(Error::invalid(
                "persisting L2",
                format!("{} has no persisting L2 set-aside", gpu.name),
            ));
        }
        let limit = sys::CUlimit::CU_LIMIT_PERSISTING_L2_CACHE_SIZE;
        gpu.ctx
            .set_limit(limit, bytes.min(max_set_aside) as usize)
            .call("cuCtxSetLimit")?;
        let set_aside = gpu.ctx.get_limit(limit).call("cuCtxGetLimit")? as u64;
        Ok(PersistingL2 {
            ctx: gpu.ctx.clone(),
            set_aside,
            max_window,
        })
    }

    /// Bytes of L2 the driver set aside.
    pub fn set_aside(&self) -> u64 {
        self.set_aside
    }

    /// The window over `bytes` at `base`, clipped to the device's largest window, with the hit
    /// ratio that fits it into the set-aside.
    pub fn window(&self, base: u64, bytes: u64) -> AccessWindow {
        let bytes = bytes.min(self.max_window);
        let hit_ratio = if bytes == 0 {
            0.0
        } else {
            (self.set_aside as f64 / bytes as f64).min(1.0) as f32
        };
        AccessWindow {
            base,
            bytes,
            hit_ratio,
        }
    }

    /// Sets (or with `None` clears) the window of the kernels launched on `stream` from now on.
    pub fn set_stream_window(
        &self,
        stream: &CudaStream,
        window: Option<AccessWindow>,
    ) -> Result<()> {
        let value = window
            .unwrap_or(AccessWindow {
                base: 0,
                bytes: 0,
                hit_ratio: 0.0,
            })
            .value();
        driver::l2::set_stream_access_policy(&self.ctx, stream, &value)
    }

    /// Turns every persisting line back into a normal one (the set-aside stays).
    pub fn reset_lines(&self) -> Result<()> {
        driver::l2::reset_persisting_lines(&self.ctx)
    }
}

impl Drop for PersistingL2 {
    fn drop(&mut self) {
        // Errors here have no caller to go to; the context keeps the first one.
        let _ = self.reset_lines();
        let limit = sys::CUlimit::CU_LIMIT_PERSISTING_L2_CACHE_SIZE;
        self.ctx.record_err(self.ctx.set_limit(limit, 0));
    }
}
