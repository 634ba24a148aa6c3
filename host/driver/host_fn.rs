//! The one wrapper of `cuLaunchHostFunc`: enqueues a Rust call on a stream. The call runs on the
//! driver's callback thread, never unwinds into the driver, and makes no CUDA call (the driver
//! forbids them there). Captured into a graph it becomes a host node, run at every replay.
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};

use cudarc::driver::{result, sys};

use crate::Result;
use crate::error::CudaCall;

/// Work a stream runs on the host, in stream order.
pub trait HostCall: Sync {
    /// Runs on the driver's callback thread: no CUDA calls, no blocking on the stream.
    fn call(&self);
}

/// Enqueues `call.call()` on `stream`.
///
/// # Safety
/// `call` stays at its address, alive and unmoved, until the stream has run it: if the stream is
/// being captured, until every launch of every graph made from the capture has finished.
pub unsafe fn enqueue<T: HostCall>(stream: sys::CUstream, call: &T) -> Result<()> {
    let data = call as *const T as *mut c_void;
    // SAFETY: `trampoline::<T>` reads `data` only as a `&T`, which the caller keeps alive.
    unsafe { result::stream::launch_host_function(stream, trampoline::<T>, data) }
        .call("cuLaunchHostFunc")
}

/// The function the driver calls: a panic stops here (the call's own error handling has
/// recorded what it could) instead of unwinding through the driver's frames.
unsafe extern "C" fn trampoline<T: HostCall>(data: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `enqueue` passed a `&T` that its caller keeps alive until this has run.
        let call = unsafe { &*(data as *const T) };
        call.call();
    }));
}
