//! The persisting-L2 calls of a context.
use cudarc::driver::{CudaContext, CudaStream, sys};

use crate::Result;
use crate::error::CudaCall;

/// Sets the access-policy window of the kernels launched on `stream` from now on.
pub(crate) fn set_stream_access_policy(
    ctx: &CudaContext,
    stream: &CudaStream,
    value: &sys::CUlaunchAttributeValue,
) -> Result<()> {
    ctx.bind_to_thread().call("cuCtxSetCurrent")?;
    // SAFETY: a live stream of this context (bound above) and a fully initialised attribute
    // value, read during the call.
    unsafe {
        sys::cuStreamSetAttribute(
            stream.cu_stream(),
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW,
            value,
        )
    }
    .result()
    .call("cuStreamSetAttribute")
}

/// Turns every persisting line of `ctx` back into a normal one (the set-aside stays).
pub(crate) fn reset_persisting_lines(ctx: &CudaContext) -> Result<()> {
    ctx.bind_to_thread().call("cuCtxSetCurrent")?;
    // SAFETY: no arguments; acts on the current context, bound above.
    unsafe { sys::cuCtxResetPersistingL2Cache() }
        .result()
        .call("cuCtxResetPersistingL2Cache")
}
