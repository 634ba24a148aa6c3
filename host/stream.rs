//! The raw, stream-ordered driver calls the prefetcher makes on streams it may not own (an
//! engine's `CUstream`): event fork/join, async copies between pinned host memory and device
//! memory, and the capture status. Each is capturable into a CUDA graph.
use cudarc::driver::{CudaContext, CudaEvent, result, sys};

use crate::Result;
use crate::error::CudaCall;

/// Whether `stream` is being captured into a graph.
///
/// # Safety
/// `stream` is a valid stream of `ctx` (or the null stream).
pub unsafe fn is_capturing(ctx: &CudaContext, stream: sys::CUstream) -> Result<bool> {
    ctx.bind_to_thread().call("cuCtxSetCurrent")?;
    // SAFETY: a status query; the caller's stream is a valid stream of `ctx`.
    let status = unsafe { result::stream::is_capturing(stream) }.call("cuStreamIsCapturing")?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// `waiter` waits for the work enqueued on `signaller` so far, through `event`: in a capture,
/// this is the fork (or join) edge of the graph.
///
/// # Safety
/// Both streams are valid streams of `event`'s context.
pub unsafe fn wait_for(
    event: &CudaEvent,
    signaller: sys::CUstream,
    waiter: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller's guarantees, passed on.
    unsafe {
        record(event, signaller)?;
        wait(event, waiter)
    }
}

/// Records `event` on `stream`: the point a later [`wait`] waits for.
///
/// # Safety
/// `event` is a live event of the stream's context and `stream` a valid stream; an event may be
/// recorded again once its earlier waits are enqueued.
pub unsafe fn record(event: &CudaEvent, stream: sys::CUstream) -> Result<()> {
    // SAFETY: the caller's guarantees.
    unsafe { result::event::record(event.cu_event(), stream) }.call("cuEventRecord")
}

/// Makes `stream` wait for the work before the latest record of `event`.
///
/// # Safety
/// As [`record`].
pub unsafe fn wait(event: &CudaEvent, stream: sys::CUstream) -> Result<()> {
    // SAFETY: the caller's guarantees.
    unsafe {
        result::stream::wait_event(
            stream,
            event.cu_event(),
            sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
        )
    }
    .call("cuStreamWaitEvent")
}

/// Enqueues a copy of `bytes` bytes from device address `src` into pinned host memory at `dst`.
///
/// # Safety
/// `dst` is pinned host memory of at least `bytes` bytes and `src` a device allocation of at
/// least `bytes` bytes, both alive until the copy has run (in every replay, when captured).
pub unsafe fn copy_to_host(
    dst: *mut u8,
    src: u64,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: the caller guarantees both spans and their lifetimes.
    unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, bytes, stream) }
        .result()
        .call("cuMemcpyDtoHAsync")
}

/// Enqueues a copy of `bytes` bytes from pinned host memory at `src` to device address `dst`.
///
/// # Safety
/// As [`copy_to_host`], the other way round.
pub unsafe fn copy_to_device(
    dst: u64,
    src: *const u8,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: the caller guarantees both spans and their lifetimes.
    unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), bytes, stream) }
        .result()
        .call("cuMemcpyHtoDAsync")
}
