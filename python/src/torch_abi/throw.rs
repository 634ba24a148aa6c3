//! How a native kernel refuses a call: a C++ `std::runtime_error`, thrown through the Itanium
//! C++ ABI of the C++ runtime torch runs on, which the dispatcher passes up and torch's Python
//! binding raises as a `RuntimeError` with the message (what the stable ABI's own
//! `STD_TORCH_CHECK` does). A C ABI kernel has no other way to fail a call.
//!
//! The error itself is kept for the thread (`take`), so that the public functions raise
//! fetchahead's own class, with its attributes, rather than torch's `RuntimeError`.
use std::cell::RefCell;
use std::ffi::{CString, c_char, c_void};

use libloading::os::unix::Library;

/// `__cxa_allocate_exception`, the `std::runtime_error(const char*)` constructor, its
/// destructor and type_info, and `__cxa_throw`.
pub struct Thrower {
    allocate: unsafe extern "C" fn(usize) -> *mut c_void,
    construct: unsafe extern "C" fn(*mut c_void, *const c_char),
    destroy: unsafe extern "C" fn(*mut c_void),
    type_info: usize,
    throw: unsafe extern "C-unwind" fn(
        *mut c_void,
        *mut c_void,
        unsafe extern "C" fn(*mut c_void),
    ) -> !,
    _runtime: Library,
}

/// Bytes allocated for the exception object: `std::runtime_error` is 16 (a vtable pointer
/// and a reference-counted string) on x86_64 and aarch64; more is harmless.
const EXCEPTION_BYTES: usize = 64;

impl Thrower {
    /// Resolves the symbols from the loaded C++ runtime (`libstdc++.so.6`, which torch needs).
    pub fn load() -> Result<Thrower, String> {
        let runtime = super::shim::loaded(std::path::Path::new("libstdc++.so.6"))?;
        fn get<T: Copy>(lib: &Library, name: &[u8]) -> Result<T, String> {
            // SAFETY: each `T` is the C ABI type of the named libstdc++ function or object
            // (their mangled names fix the signatures); `lib` is kept in the `Thrower`.
            unsafe { lib.get::<T>(name) }.map(|s| *s).map_err(|e| {
                let name = String::from_utf8_lossy(&name[..name.len() - 1]);
                format!("the C++ runtime has no `{name}`: {e}")
            })
        }
        let type_info: *mut c_void = get(&runtime, b"_ZTISt13runtime_error\0")?;
        Ok(Thrower {
            allocate: get(&runtime, b"__cxa_allocate_exception\0")?,
            construct: get(&runtime, b"_ZNSt13runtime_errorC1EPKc\0")?,
            destroy: get(&runtime, b"_ZNSt13runtime_errorD1Ev\0")?,
            type_info: type_info as usize,
            throw: get(&runtime, b"__cxa_throw\0")?,
            _runtime: runtime,
        })
    }

    /// Keeps `error` for this thread and builds the exception that [`Thrower::throw`] throws:
    /// everything that needs dropping is done here, in a frame that has returned by then.
    pub fn prepare(&self, error: fetchahead::Error) -> Prepared {
        let message = error.to_string();
        let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
        PENDING.with(|p| *p.borrow_mut() = Some((message, error)));
        // SAFETY: an exception object of room for a runtime_error, built in place by its
        // constructor (which copies the text); the C++ runtime owns it from the throw.
        unsafe {
            let object = (self.allocate)(EXCEPTION_BYTES);
            (self.construct)(object, text.as_ptr());
            Prepared(object)
        }
    }

    /// Throws a prepared exception to the dispatcher.
    ///
    /// The exception is raised by the process's C++ runtime and unwinds with its unwinder
    /// (libgcc's), while this extension's own Rust code carries another (the one its linker
    /// bundled): so the unwind must cross only Rust frames that hold nothing to drop, which
    /// have no personality routine for the foreign unwinder to call. The kernels call this
    /// with no live value that needs dropping, after [`Thrower::prepare`] returned.
    ///
    /// # Safety
    /// Called from a boxed kernel (`extern "C-unwind"`) that the dispatcher called, as its
    /// last act, with nothing left to drop in its frame.
    #[inline(always)]
    pub unsafe fn throw(&self, prepared: Prepared) -> ! {
        // SAFETY: the caller's contract; the object, its type_info and destructor match.
        unsafe { (self.throw)(prepared.0, self.type_info as *mut c_void, self.destroy) }
    }
}

/// An exception object built by [`Thrower::prepare`], to be thrown.
pub struct Prepared(*mut c_void);

thread_local! {
    /// The last refused call's message and error on this thread.
    static PENDING: RefCell<Option<(String, fetchahead::Error)>> = const { RefCell::new(None) };
}

/// The error of the refused call whose `RuntimeError` says `raised` (None: that error was not
/// a refusal of ours); whatever was kept is cleared.
pub fn take(raised: &str) -> Option<fetchahead::Error> {
    PENDING
        .with(|p| p.borrow_mut().take())
        .filter(|(message, _)| raised.contains(message.as_str()))
        .map(|(_, error)| error)
}
