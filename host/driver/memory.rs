//! Pinned host memory mapped for the device, and device memsets and copies.
use std::sync::Arc;

use cudarc::driver::{CudaContext, DeviceRepr, PinnedHostSlice, result, sys};

use crate::Result;
use crate::error::CudaCall;

/// `len` bytes (at least one) of pinned host memory mapped into the device's address space,
/// cached for CPU reads and writes (not write-combined), contents unspecified until written; and
/// the device address of its first byte.
pub(crate) fn mapped_pinned(
    ctx: &Arc<CudaContext>,
    len: usize,
) -> Result<(PinnedHostSlice<u8>, u64)> {
    // SAFETY: the memory is uninitialized bytes; every caller writes it before reading.
    let mut host =
        unsafe { ctx.alloc_pinned_with_flags::<u8>(len.max(1), sys::CU_MEMHOSTALLOC_DEVICEMAP) }
            .call("cuMemHostAlloc")?;
    let host_ptr = host.as_mut_ptr().call("cuEventSynchronize")?;
    let mut device_address: sys::CUdeviceptr = 0;
    // SAFETY: host_ptr is a live allocation made with CU_MEMHOSTALLOC_DEVICEMAP.
    unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device_address, host_ptr.cast(), 0) }
        .result()
        .call("cuMemHostGetDevicePointer")?;
    Ok((host, device_address))
}

/// Enqueues setting `bytes` bytes at device address `address` to `value`.
///
/// # Safety
/// `address..address + bytes` lies in a live device allocation that nothing else writes
/// meanwhile on other streams; `stream` is a valid stream of its context.
pub unsafe fn memset_d8_async(
    address: u64,
    value: u8,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller guarantees the span and the stream.
    unsafe { result::memset_d8_async(address, value, bytes, stream) }.call("cuMemsetD8Async")
}

/// Enqueues a copy of `bytes` bytes from device address `src` to device address `dst`.
///
/// # Safety
/// Both spans lie in live device allocations and do not overlap; `stream` is a valid stream.
pub unsafe fn memcpy_dtod_async(
    dst: u64,
    src: u64,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller guarantees both spans and the stream.
    unsafe { result::memcpy_dtod_async(dst, src, bytes, stream) }.call("cuMemcpyDtoDAsync")
}

/// Enqueues a copy of `dst.len()` values from device address `src` into `dst`.
///
/// # Safety
/// `src` holds `dst.len()` values of `T` in a live device allocation; `dst` stays alive and
/// unread until the stream has run the copy.
pub(crate) unsafe fn memcpy_dtoh_async<T: DeviceRepr>(
    dst: &mut [T],
    src: u64,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller guarantees the source span and the destination's lifetime.
    unsafe { result::memcpy_dtoh_async(dst, src, stream) }.call("cuMemcpyDtoHAsync")
}
