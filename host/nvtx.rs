//! NVTX ranges around lookups, staging, copies, L2 windows and kernel launches, for Nsight
//! Systems and the torch profiler: off unless `FETCHAHEAD_NVTX=1`.
//!
//! NVTX v3 is header-only in C; a program without its headers reaches the profiler through a
//! library that exports the entry points: `libnvToolsExt.so.1` (CUDA 12 and before) or
//! `libnvtx3interop.so.1` (CUDA 13), loaded here with `dlopen` on first use when the setting is
//! on (nothing is loaded when it is off; the Python package first loads pip's copy of either,
//! which torch's CUDA wheels install off the loader's path). With the setting on and no library,
//! one warning says so and ranges stay off. Off, a range costs one relaxed atomic load.
use std::ffi::{CStr, c_char, c_int};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

/// `1` turns the ranges on.
pub const NVTX_ENV: &str = "FETCHAHEAD_NVTX";

/// The libraries tried, in order.
const LIBRARIES: [&CStr; 3] = [
    c"libnvToolsExt.so.1",
    c"libnvtx3interop.so.1",
    c"libnvToolsExt.so",
];

const UNKNOWN: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
static API: OnceLock<Result<Api, String>> = OnceLock::new();

#[derive(Clone, Copy)]
struct Api {
    push: unsafe extern "C" fn(*const c_char) -> c_int,
    pop: unsafe extern "C" fn() -> c_int,
    library: &'static CStr,
}

/// What the setting and the library made of the ranges in this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// `FETCHAHEAD_NVTX` unset or not `1`: nothing loaded.
    Off,
    /// On, through the library named.
    On(String),
    /// On, but no library could be loaded (why); ranges are off.
    Unavailable(String),
}

/// The ranges' state, deciding it on first call (reading the setting, loading the library).
pub fn state() -> State {
    if !enabled() {
        return match API.get() {
            Some(Err(why)) => State::Unavailable(why.clone()),
            _ => State::Off,
        };
    }
    match API.get() {
        Some(Ok(api)) => State::On(api.library.to_string_lossy().into_owned()),
        _ => State::Off,
    }
}

#[inline]
fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        ON => true,
        OFF => false,
        _ => decide_once(),
    }
}

#[cold]
fn decide_once() -> bool {
    let setting = std::env::var(NVTX_ENV).ok();
    let on = matches!(decide(setting.as_deref(), load), Decision::On);
    STATE.store(if on { ON } else { OFF }, Ordering::Relaxed);
    on
}

/// What a setting value leads to, `load` called only when it asks for the ranges.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    Off,
    On,
    Unavailable,
}

fn decide(setting: Option<&str>, load: impl FnOnce() -> Result<Api, String>) -> Decision {
    if setting.map(str::trim) != Some("1") {
        return Decision::Off;
    }
    let api = API.get_or_init(|| {
        let loaded = load();
        if let Err(why) = &loaded {
            log::warn!(
                target: "fetchahead::kernels",
                "{NVTX_ENV}=1 but NVTX ranges are off: {why} (put the CUDA toolkit's \
                 libnvToolsExt.so.1 or libnvtx3interop.so.1 on the loader's path)"
            );
        }
        loaded
    });
    if api.is_ok() {
        Decision::On
    } else {
        Decision::Unavailable
    }
}

/// `dlopen`s the first of [`LIBRARIES`] found and resolves the two entry points.
fn load() -> Result<Api, String> {
    for name in LIBRARIES {
        // SAFETY: `name` is NUL-terminated; dlopen runs the library's initialisers, which for
        // libnvToolsExt only set up its injection hooks.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            continue;
        }
        // SAFETY: `handle` is a live library handle and the names are NUL-terminated.
        let (push, pop) = unsafe {
            (
                libc::dlsym(handle, c"nvtxRangePushA".as_ptr()),
                libc::dlsym(handle, c"nvtxRangePop".as_ptr()),
            )
        };
        if push.is_null() || pop.is_null() {
            return Err(format!(
                "{} has no nvtxRangePushA / nvtxRangePop",
                name.to_string_lossy()
            ));
        }
        // SAFETY: NVTX's C declarations: `int nvtxRangePushA(const char *)` and
        // `int nvtxRangePop(void)`; the handle is never closed, so the pointers stay valid.
        let api = unsafe {
            Api {
                push: std::mem::transmute::<
                    *mut libc::c_void,
                    unsafe extern "C" fn(*const c_char) -> c_int,
                >(push),
                pop: std::mem::transmute::<*mut libc::c_void, unsafe extern "C" fn() -> c_int>(pop),
                library: name,
            }
        };
        return Ok(api);
    }
    Err(format!(
        "none of {} could be loaded",
        LIBRARIES.map(|l| l.to_string_lossy()).join(", ")
    ))
}

/// An open NVTX range: popped when dropped. Inert when the ranges are off.
#[must_use = "the range ends when this is dropped"]
pub struct Range {
    pop: Option<unsafe extern "C" fn() -> c_int>,
}

impl Drop for Range {
    fn drop(&mut self) {
        if let Some(pop) = self.pop {
            // SAFETY: a range pushed by this thread in `range`, popped once.
            unsafe { pop() };
        }
    }
}

fn push(name: &CStr) -> Range {
    match API.get() {
        Some(Ok(api)) => {
            // SAFETY: `name` is NUL-terminated and lives for the call.
            unsafe { (api.push)(name.as_ptr()) };
            Range { pop: Some(api.pop) }
        }
        _ => Range { pop: None },
    }
}

/// A range named `name` until the result is dropped.
#[inline]
pub fn range(name: &'static CStr) -> Range {
    if !enabled() {
        return Range { pop: None };
    }
    push(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_loads_nothing() {
        for setting in [None, Some("0"), Some(""), Some("yes")] {
            let d = decide(setting, || panic!("loaded with {setting:?}"));
            assert_eq!(d, Decision::Off, "{setting:?}");
        }
    }

    #[test]
    fn on_without_a_library_is_unavailable_and_loads_once() {
        let failed = || Err("no libnvToolsExt.so.1 here".to_string());
        assert_eq!(decide(Some("1"), failed), Decision::Unavailable);
        // Decided once: a second look does not load again.
        let d = decide(Some("1"), || panic!("loaded twice"));
        assert_eq!(d, Decision::Unavailable);
    }
}
