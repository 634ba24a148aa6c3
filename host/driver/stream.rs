//! The raw, stream-ordered driver calls made on streams the crate may not own (an engine's
//! `CUstream`): event fork/join, async copies between pinned host memory and device memory,
//! 32-bit flag writes and waits, and the capture status. Each is capturable into a CUDA graph.
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, result, sys};

use crate::Result;
use crate::error::CudaCall;

/// The capture status of `stream`: none, active, or invalidated.
///
/// # Safety
/// `stream` is a valid stream of `ctx` (or the null stream).
pub unsafe fn capture_status(
    ctx: &CudaContext,
    stream: sys::CUstream,
) -> Result<sys::CUstreamCaptureStatus> {
    ctx.bind_to_thread().call("cuCtxSetCurrent")?;
    // SAFETY: a status query; the caller's stream is a valid stream of `ctx`.
    unsafe { result::stream::is_capturing(stream) }.call("cuStreamIsCapturing")
}

/// Whether `stream` is being captured into a graph (an invalidated capture counts).
///
/// # Safety
/// As [`capture_status`].
pub unsafe fn is_capturing(ctx: &CudaContext, stream: sys::CUstream) -> Result<bool> {
    // SAFETY: the caller's guarantees, passed on.
    let status = unsafe { capture_status(ctx, stream) }?;
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

/// Records `event` on `stream` as a timing mark: inside a capture it becomes an external event
/// record node (a flag the driver accepts only while capturing), so that the replayed graph
/// records it too, as an eager stream does.
pub fn record_mark(event: &CudaEvent, stream: &CudaStream) -> Result<()> {
    if event.context() != stream.context() {
        return Err(crate::Error::invalid(
            "event",
            "an event of another context than the stream's",
        ));
    }
    let capturing = stream.capture_status().call("cuStreamIsCapturing")?
        == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
    let flags = if capturing {
        sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32
    } else {
        0
    };
    // SAFETY: a live event and a live stream of one context (checked above), both owned by the
    // caller's cudarc wrappers.
    unsafe { sys::cuEventRecordWithFlags(event.cu_event(), stream.cu_stream(), flags) }
        .result()
        .call("cuEventRecordWithFlags")
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

/// Enqueues a write of `value` to the 32-bit word at device address `at`.
///
/// # Safety
/// `at` is the device address of a live, 4-byte aligned word (device memory or pinned host
/// memory mapped for the device) until the stream has run the write; `stream` is valid.
pub unsafe fn write_value32(stream: sys::CUstream, at: u64, value: u32) -> Result<()> {
    let write = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
    // SAFETY: the caller guarantees the word and the stream.
    unsafe { sys::cuStreamWriteValue32_v2(stream, at, value, write) }
        .result()
        .call("cuStreamWriteValue32")
}

/// Makes `stream` wait until the 32-bit word at device address `at` equals `value`.
///
/// # Safety
/// As [`write_value32`].
pub unsafe fn wait_value32_eq(stream: sys::CUstream, at: u64, value: u32) -> Result<()> {
    let equal = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as u32;
    // SAFETY: the caller guarantees the word and the stream.
    unsafe { sys::cuStreamWaitValue32_v2(stream, at, value, equal) }
        .result()
        .call("cuStreamWaitValue32")
}
