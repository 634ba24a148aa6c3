//! The native CUDA kernels of the prefetcher ops `prefetch`, `prefetched_gather_dequant` and
//! `prefetched_gather_dequant_out`: a prefetcher registered under its op handle, the ids of
//! its pending prefetch held until the gather (so torch's allocator cannot reuse them before
//! the side stream has read them).
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use cudarc::driver::sys;
use fetchahead::Error;
use fetchahead::prefetch::prefetcher::Prefetcher;

use super::args;
use super::shim::{Owned, TensorHandle};
use super::throw::Prepared;
use super::{Native, native};

/// A registered prefetcher.
struct Entry {
    prefetcher: Arc<Mutex<Prefetcher>>,
    device: i32,
    dim: i64,
    /// The ids tensor of the pending prefetch.
    held: Option<HeldIds>,
}

/// A tensor handle held across calls.
struct HeldIds(TensorHandle);

// SAFETY: an `at::Tensor*` may be deleted from any thread (its refcount is atomic); this one
// is only ever deleted, under the registry's lock.
unsafe impl Send for HeldIds {}

impl Drop for HeldIds {
    fn drop(&mut self) {
        drop(Owned::new(&native().shim, self.0));
    }
}

fn registry() -> std::sync::MutexGuard<'static, HashMap<i64, Entry>> {
    static REGISTRY: LazyLock<Mutex<HashMap<i64, Entry>>> = LazyLock::new(Default::default);
    lock(&REGISTRY)
}

/// Registers `prefetcher` (of rows of `dim`, on CUDA device `device`) under op handle `handle`.
pub fn register(handle: i64, prefetcher: Arc<Mutex<Prefetcher>>, device: i32, dim: i64) {
    let entry = Entry {
        prefetcher,
        device,
        dim,
        held: None,
    };
    registry().insert(handle, entry);
}

/// Drops the prefetcher of `handle` (and the ids it held).
pub fn unregister(handle: i64) {
    let gone = registry().remove(&handle);
    drop(gone);
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Which prefetcher op.
#[derive(Clone, Copy, PartialEq)]
enum Op {
    Prefetch,
    Gather,
    GatherOut,
}

/// The boxed kernel of op `OP` (0: `prefetch`, 1: `prefetched_gather_dequant`, 2:
/// `prefetched_gather_dequant_out`).
///
/// # Safety
/// Called by the dispatcher with the stack of the op's schema.
pub unsafe extern "C-unwind" fn kernel<const OP: usize>(stack: *mut u64, _args: u64, _rets: u64) {
    let op = [Op::Prefetch, Op::Gather, Op::GatherOut][OP];
    let n = native();
    // SAFETY: the dispatcher's stack of this op's schema.
    let refusal = unsafe { refusal_of(n, op, stack) };
    if let Some(prepared) = refusal {
        // SAFETY: `refusal_of` returned: everything taken from the stack is freed, and this
        // frame holds nothing to drop (see `Thrower::throw`).
        unsafe { n.thrower.throw(prepared) }
    }
}

/// Runs the op; for a refusal, the exception to throw.
///
/// # Safety
/// `stack` holds the op's arguments.
unsafe fn refusal_of(n: &Native, op: Op, stack: *mut u64) -> Option<Prepared> {
    // SAFETY: the caller's stack.
    unsafe { run(n, op, stack) }
        .err()
        .map(|e| n.thrower.prepare(e))
}

/// `(int handle, Tensor ids, Tensor ticket[, Tensor out])`.
///
/// # Safety
/// `stack` holds the op's arguments.
unsafe fn run(n: &Native, op: Op, stack: *mut u64) -> Result<(), Error> {
    let shim = &n.shim;
    // SAFETY: the schema's arguments, each taken once.
    let (handle, ids, ticket, out) = unsafe {
        (
            *stack as i64,
            Owned::new(shim, *stack.add(1) as _),
            Owned::new(shim, *stack.add(2) as _),
            (op == Op::GatherOut).then(|| Owned::new(shim, *stack.add(3) as _)),
        )
    };
    drop(ticket);
    let mut registry = registry();
    let entry = registry
        .get_mut(&handle)
        .ok_or_else(|| Error::invalid("handle", format!("no live prefetcher {handle}")))?;
    let f = args::ids(shim, &ids)?;
    args::on_device(shim, &f, "ids", entry.device)?;
    let stream = shim
        .stream(entry.device)
        .map_err(|why| Error::invalid("stream", why))? as sys::CUstream;
    let shape = [f.sizes[0], entry.dim];
    let bf16 = shim.codes.bfloat16;
    match op {
        Op::Prefetch => {
            // SAFETY: `ids` holds `n` int64 on the prefetcher's device (checked), and is held
            // below until the gather.
            unsafe { lock(&entry.prefetcher).prefetch(f.address, f.sizes[0] as usize, stream)? };
            entry.held = Some(HeldIds(ids.release()));
        }
        Op::GatherOut => {
            let given = out.expect("the _out op takes out");
            let o = args::out(shim, &given, shape, bf16, entry.device)?;
            // SAFETY: `out` checked for the prefetched rows' shape, dtype, device, alignment.
            unsafe { lock(&entry.prefetcher).gather_dequant(o.address, stream)? };
            entry.held = None;
        }
        Op::Gather => {
            let made = shim
                .empty_2d(shape, bf16, entry.device)
                .ok_or(Error::invalid("out", "torch could not allocate the output"))?;
            let o = args::facts_of(&made, "out")?;
            // SAFETY: a new tensor of the prefetched rows' shape and dtype on their device.
            unsafe { lock(&entry.prefetcher).gather_dequant(o.address, stream)? };
            entry.held = None;
            // SAFETY: the op has one return, at the stack's start.
            unsafe { *stack = made.release() as u64 };
        }
    }
    Ok(())
}
