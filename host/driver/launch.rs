//! Kernel launches and their attributes.
use std::ffi::c_void;

use cudarc::driver::{CudaFunction, result, sys};

use crate::Result;
use crate::error::CudaCall;

/// An all-zero launch-attribute value, for the caller to fill one member of.
fn zeroed_attribute_value() -> sys::CUlaunchAttributeValue {
    // SAFETY: an all-zero union is a valid value of every member (plain integers and enums
    // whose zero is a listed variant); the caller writes the member it uses.
    unsafe { std::mem::zeroed() }
}

/// A launch attribute asking for clusters of `blocks` blocks along x.
pub(crate) fn cluster_attribute(blocks: u32) -> sys::CUlaunchAttribute {
    let mut value = zeroed_attribute_value();
    value.clusterDim.x = blocks;
    value.clusterDim.y = 1;
    value.clusterDim.z = 1;
    sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        pad: [0; 4],
        value,
    }
}

/// An access-policy window value: `hit_ratio` of the lines in `base..base + bytes` persist, the
/// rest stream.
pub(crate) fn access_policy_value(
    base: u64,
    bytes: u64,
    hit_ratio: f32,
) -> sys::CUlaunchAttributeValue {
    let mut value = zeroed_attribute_value();
    value.accessPolicyWindow = sys::CUaccessPolicyWindow {
        base_ptr: base as *mut c_void,
        num_bytes: bytes as usize,
        hitRatio: hit_ratio,
        hitProp: sys::CUaccessProperty::CU_ACCESS_PROPERTY_PERSISTING,
        missProp: sys::CUaccessProperty::CU_ACCESS_PROPERTY_STREAMING,
    };
    value
}

/// One `cuLaunchKernel` of `blocks x threads` with `p` as the kernel's one argument, by value.
///
/// # Safety
/// `P` is the parameter struct `function` takes, the addresses inside `p` are valid for the
/// launch, `stream` is a valid stream of `function`'s context, and that context is current.
pub(crate) unsafe fn launch_kernel<P: Copy>(
    function: &CudaFunction,
    blocks: u32,
    threads: u32,
    stream: sys::CUstream,
    p: P,
) -> Result<()> {
    let _nvtx = crate::nvtx::range(c"fetchahead.launch");
    let mut params = p;
    let mut args = [&mut params as *mut P as *mut c_void];
    // SAFETY: one argument of the struct type the kernel takes (build.rs checked its size);
    // the caller guarantees the addresses inside it and the stream.
    unsafe {
        result::launch_kernel(
            function.cu_function(),
            (blocks, 1, 1),
            (threads, 1, 1),
            0,
            stream,
            &mut args,
        )
    }
    .call("cuLaunchKernel")
}

/// One `cuLaunchKernelEx` of `function` with `config` (its grid, block, stream and attributes)
/// and `p` as the kernel's one argument, by value.
///
/// # Safety
/// As [`launch_kernel`]; `config`'s attribute pointer covers its `numAttrs` attributes.
pub(crate) unsafe fn launch_kernel_ex<P: Copy>(
    function: &CudaFunction,
    config: &sys::CUlaunchConfig,
    p: P,
) -> Result<()> {
    let _nvtx = crate::nvtx::range(c"fetchahead.launch");
    let mut params = p;
    let mut args = [&mut params as *mut P as *mut c_void];
    // SAFETY: one argument of the struct type the kernel takes (build.rs checked its size);
    // `config` and its attributes live across the call; the caller guarantees the rest.
    unsafe {
        sys::cuLaunchKernelEx(
            config,
            function.cu_function(),
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
    .call("cuLaunchKernelEx")
}

/// How many clusters of `function` launched as `config` the device runs at once.
///
/// # Safety
/// `config`'s attribute pointer covers its `numAttrs` attributes; `function`'s context is
/// current.
pub(crate) unsafe fn max_active_clusters(
    function: &CudaFunction,
    config: &sys::CUlaunchConfig,
) -> Result<u32> {
    let mut clusters = 0;
    // SAFETY: a query: `config` and its attributes live across the call, the function is a
    // loaded one, and `clusters` is a writable int.
    unsafe { sys::cuOccupancyMaxActiveClusters(&mut clusters, function.cu_function(), config) }
        .result()
        .call("cuOccupancyMaxActiveClusters")?;
    Ok(clusters.max(0) as u32)
}
