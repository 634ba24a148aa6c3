//! Native CUDA kernels for the hot torch ops, registered through libtorch's stable C ABI
//! (torch 2.10 and later): the dispatcher calls Rust directly, with no Python kernel between,
//! so a call costs torch's dispatch and the launch (issue 26). The ops stay defined, with their
//! fakes, by `fetchahead/_torch.py`; only their CUDA kernels are these. Without the shim (an
//! older torch) or with `FETCHAHEAD_TORCH_NATIVE=0`, the Python kernels serve instead.
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock, PoisonError};

use pyo3::prelude::*;

mod args;
mod kernels;
mod prefetch;
mod shim;
mod throw;

use shim::{BoxedKernel, LibraryHandle, Shim, c_name};
use throw::Thrower;

/// The stable ABI version these kernels are written against (`TORCH_VERSION_2_10_0`): the
/// version the shim converts their arguments for (strings need 2.10).
const STABLE_ABI_2_10: u64 = (2 << 56) | (10 << 48);

/// What the kernels call: the shim and the thrower.
pub struct Native {
    shim: Shim,
    thrower: Thrower,
}

static NATIVE: OnceLock<Native> = OnceLock::new();

/// The loaded shim: set before any kernel is registered, so every kernel finds it.
fn native() -> &'static Native {
    NATIVE
        .get()
        .expect("the native kernels are registered only after the shim is loaded")
}

/// The ops with a native CUDA kernel, and the kernel of each.
const KERNELS: [(&str, BoxedKernel); 7] = [
    ("gather_unchecked", kernels::kernel::<0>),
    ("gather_out_unchecked", kernels::kernel::<1>),
    ("gather_dequant_unchecked", kernels::kernel::<2>),
    ("gather_dequant_out_unchecked", kernels::kernel::<3>),
    ("prefetch", prefetch::kernel::<0>),
    ("prefetched_gather_dequant", prefetch::kernel::<1>),
    ("prefetched_gather_dequant_out", prefetch::kernel::<2>),
];

/// Registers the native CUDA kernels of the `fetchahead` ops `_torch.py` defined, resolving
/// the shim from `torch_lib` (the imported torch's `lib` folder); returns the ops' names.
/// Raises `RuntimeError` with the reason when this torch lacks the shim (the caller then
/// registers its Python kernels). Registers once a process; later calls return the names.
#[pyfunction]
fn register_torch_kernels(torch_lib: PathBuf) -> PyResult<Vec<&'static str>> {
    static REGISTERED: Mutex<Option<usize>> = Mutex::new(None);
    let mut registered = REGISTERED.lock().unwrap_or_else(PoisonError::into_inner);
    let names = KERNELS.iter().map(|(name, _)| *name).collect();
    if registered.is_some() {
        return Ok(names);
    }
    let fail = pyo3::exceptions::PyRuntimeError::new_err;
    if NATIVE.get().is_none() {
        let shim = Shim::load(&torch_lib).map_err(fail)?;
        let thrower = Thrower::load().map_err(fail)?;
        let _ = NATIVE.set(Native { shim, thrower });
    }
    let shim = &native().shim;
    let (ns, key, file) = (c_name("fetchahead"), c_name("CUDA"), c_name(file!()));
    let mut library: LibraryHandle = std::ptr::null_mut();
    // SAFETY: C strings that outlive the call; writes one handle, which is never deleted
    // (deleting it would remove the registrations).
    let status = unsafe {
        (shim.library_init_impl)(
            ns.as_ptr(),
            key.as_ptr(),
            file.as_ptr(),
            line!(),
            &mut library,
        )
    };
    if status != 0 || library.is_null() {
        return Err(fail(
            "torch refused a CUDA library for the fetchahead namespace".to_string(),
        ));
    }
    for (name, kernel) in KERNELS {
        let op = c_name(name);
        // SAFETY: an op `_torch.py` defined; the kernel is a boxed kernel of its schema.
        let status = unsafe { (shim.library_impl)(library, op.as_ptr(), kernel, STABLE_ABI_2_10) };
        if status != 0 {
            return Err(fail(format!(
                "torch refused the native kernel of fetchahead::{name}"
            )));
        }
    }
    *registered = Some(library as usize);
    Ok(names)
}

/// The fetchahead exception of the native kernel's refusal that torch raised as the
/// `RuntimeError` saying `raised` (None: not one of ours).
#[pyfunction]
fn take_op_error(py: Python<'_>, raised: &str) -> Option<Py<PyAny>> {
    throw::take(raised).map(|e| crate::errors::to_py(py, e).into_value(py).into_any())
}

/// Registers `prefetcher` (on CUDA device `device`) for the native prefetcher ops under op
/// handle `handle`.
#[pyfunction]
fn register_op_prefetcher(handle: i64, prefetcher: &Bound<'_, crate::Prefetcher>, device: i32) {
    let p = prefetcher.get();
    prefetch::register(handle, p.inner.clone(), device, p.dim as i64);
}

/// Drops what [`register_op_prefetcher`] registered under `handle`.
#[pyfunction]
fn unregister_op_prefetcher(handle: i64) {
    prefetch::unregister(handle);
}

pub fn add_to(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(register_torch_kernels, m)?)?;
    m.add_function(wrap_pyfunction!(take_op_error, m)?)?;
    m.add_function(wrap_pyfunction!(register_op_prefetcher, m)?)?;
    m.add_function(wrap_pyfunction!(unregister_op_prefetcher, m)?)?;
    Ok(())
}
