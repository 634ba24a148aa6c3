//! The C ABI for engines (`include/fetchahead.h`): open a table, create a prefetcher per Engram
//! layer, prefetch and gather on the caller's raw `CUstream` with the caller's device pointers,
//! read errors and counters, close. Every entry catches panics (nothing unwinds into C) and
//! returns a status code; [`fetchahead_last_error`] gives the calling thread's last message.
//!
//! `fetchahead_prefetch` and `fetchahead_gather_dequant` allocate nothing and are capturable into
//! a CUDA graph. [`fetchahead_lookup`] is a host-function entry for engines that enqueue the
//! lookup with `cudaLaunchHostFunc` themselves.
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cudarc::driver::sys;

use crate::DequantVariant;
use crate::error::ErrorKind;
use crate::kernels::Kernels;
use crate::prefetch::flag_worker::FlagLane;
use crate::prefetch::lookup::MemoryRows;
use crate::prefetch::prefetcher::{Completion, Join, Prefetcher, PrefetcherConfig};
use crate::row_lookup::{RowLookup, lookup_or_zero};
use crate::{Error, Result};

pub const FETCHAHEAD_OK: c_int = 0;
pub const FETCHAHEAD_ERR_INVALID: c_int = 1;
pub const FETCHAHEAD_ERR_CUDA: c_int = 2;
pub const FETCHAHEAD_ERR_NO_DEVICE: c_int = 3;
pub const FETCHAHEAD_ERR_LOOKUP: c_int = 4;
pub const FETCHAHEAD_ERR_NOT_WARMED: c_int = 5;
pub const FETCHAHEAD_ERR_ORDER: c_int = 6;
pub const FETCHAHEAD_ERR_STAGING_FULL: c_int = 7;
pub const FETCHAHEAD_ERR_PANIC: c_int = 8;

/// Fault kinds for [`fetchahead_table_inject`] (in-memory tables only).
pub const FETCHAHEAD_FAULT_NONE: u32 = 0;
pub const FETCHAHEAD_FAULT_FAIL_ON_ID: u32 = 1;
pub const FETCHAHEAD_FAULT_FAIL_NEXT: u32 = 2;
pub const FETCHAHEAD_FAULT_CORRUPT_NEXT: u32 = 3;
pub const FETCHAHEAD_FAULT_LATENCY_US: u32 = 4;

/// Bytes of message kept per lookup error record, NUL included.
pub const FETCHAHEAD_MESSAGE_BYTES: usize = 256;

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// The status code of `e`, from its [`ErrorKind`] (the mapping the Python classes come from).
fn code(e: &Error) -> c_int {
    kind_code(e.kind())
}

/// The C status code of each error kind (the Python classes are made from the same kinds).
fn kind_code(kind: ErrorKind) -> c_int {
    match kind {
        ErrorKind::Cuda | ErrorKind::NoPtx => FETCHAHEAD_ERR_CUDA,
        ErrorKind::NoDevice => FETCHAHEAD_ERR_NO_DEVICE,
        ErrorKind::RowId | ErrorKind::RowLookup | ErrorKind::RowRead => FETCHAHEAD_ERR_LOOKUP,
        ErrorKind::IdsOutOfRange | ErrorKind::InvalidArgument => FETCHAHEAD_ERR_INVALID,
        // Opening a row store: a table that is missing, malformed or unreadable.
        ErrorKind::File
        | ErrorKind::FileNotFound
        | ErrorKind::FilePermission
        | ErrorKind::Table
        | ErrorKind::ReadPathUnavailable
        | ErrorKind::OutOfMemory
        | ErrorKind::NoSpace
        | ErrorKind::WouldOverwrite => FETCHAHEAD_ERR_INVALID,
        ErrorKind::StagingFull => FETCHAHEAD_ERR_STAGING_FULL,
        ErrorKind::NotWarmed => FETCHAHEAD_ERR_NOT_WARMED,
        ErrorKind::PrefetchOrder => FETCHAHEAD_ERR_ORDER,
    }
}

/// `message` as C reads it whole: a NUL (a file name can hold one) would end the C string
/// there, so it is written as `\0`.
fn c_message(message: String) -> String {
    if message.contains('\0') {
        message.replace('\0', "\\0")
    } else {
        message
    }
}

fn set_last_error(message: String) {
    LAST_ERROR.with(|m| *m.borrow_mut() = c_message(message));
}

/// A call that succeeded leaves no message behind: `fetchahead_last_error` then gives "".
fn clear_last_error() {
    LAST_ERROR.with(|m| m.borrow_mut().clear());
}

/// Runs `body`, turning an error or a panic into a status code and the thread's last message.
/// Every entry that can log also installs the stderr logger (once, unless the engine has one).
fn guard(body: impl FnOnce() -> Result<()>) -> c_int {
    crate::logging::init_stderr();
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => {
            clear_last_error();
            FETCHAHEAD_OK
        }
        Ok(Err(e)) => {
            set_last_error(e.to_string());
            code(&e)
        }
        Err(_) => {
            set_last_error("fetchahead panicked (a bug); the call did nothing further".into());
            FETCHAHEAD_ERR_PANIC
        }
    }
}

fn null(what: &'static str) -> Error {
    Error::invalid(what, "null pointer")
}

/// Copies `message` into `buf` (`len` bytes, NUL-terminated, truncated) when `buf` is not null.
///
/// # Safety
/// `buf` is null or writable for `len` bytes.
unsafe fn copy_message(message: &str, buf: *mut c_char, len: usize) {
    if buf.is_null() || len == 0 {
        return;
    }
    let n = message.len().min(len - 1);
    // SAFETY: `buf` holds `len > n` bytes (the caller's contract).
    unsafe {
        std::ptr::copy_nonoverlapping(message.as_ptr().cast(), buf, n);
        *buf.add(n) = 0;
    }
}

/// The calling thread's last error message, copied NUL-terminated into `buf` (`len` bytes,
/// truncated); returns its full length in bytes. Every call that returns a status clears it
/// when it succeeds: an empty message means the last such call on this thread succeeded (a NUL
/// inside a message, from a file name, is written as `\0`).
///
/// # Safety
/// `buf` is null or writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_last_error(buf: *mut c_char, len: usize) -> usize {
    catch_unwind(|| {
        LAST_ERROR.with(|m| {
            let m = m.borrow();
            // SAFETY: the caller's contract.
            unsafe { copy_message(&m, buf, len) };
            m.len()
        })
    })
    .unwrap_or(0)
}

/// The library's version, NUL-terminated and static (Cargo's version: the wheel's and the
/// crate's too).
#[unsafe(no_mangle)]
pub extern "C" fn fetchahead_version() -> *const c_char {
    static VERSION: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();
    VERSION
        .get_or_init(|| std::ffi::CString::new(crate::info::VERSION).unwrap_or_default())
        .as_ptr()
}

/// What the library was built as, a static NUL-terminated JSON object: `version`,
/// `git_commit`, `archs` (the embedded PTX), `features` (the crate's, on in this build),
/// `target`. `fetchahead info` adds what it finds on the machine (device, read paths, settings).
#[unsafe(no_mangle)]
pub extern "C" fn fetchahead_build_info() -> *const c_char {
    static INFO: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();
    INFO.get_or_init(|| {
        std::ffi::CString::new(crate::info::build().to_string()).unwrap_or_default()
    })
    .as_ptr()
}

/// A row table open for lookups: what the prefetchers and [`fetchahead_lookup`] read.
pub struct TableHandle {
    store: Arc<dyn RowLookup>,
    /// The same table when it is an in-memory one (fault injection works on it).
    memory: Option<Arc<MemoryRows>>,
    /// The last failure of [`fetchahead_lookup`], which runs on the driver's thread.
    lookup_error: Mutex<String>,
}

/// Opens an in-memory table of `rows` rows of `dim` FP8 elements generated from `seed`.
///
/// # Safety
/// `out` is writable; on success `*out` is a table to close with `fetchahead_table_close`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_open_memory_table(
    rows: u64,
    dim: u32,
    seed: u64,
    out: *mut *mut TableHandle,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let memory = Arc::new(MemoryRows::generate(rows, dim as usize, seed)?);
        let handle = Box::new(TableHandle {
            store: memory.clone(),
            memory: Some(memory),
            lookup_error: Mutex::new(String::new()),
        });
        // SAFETY: `out` is writable (checked non-null; the caller's contract).
        unsafe { *out = Box::into_raw(handle) };
        Ok(())
    })
}

/// Opens one Engram layer of an on-disk table (a model directory or one `.safetensors` file):
/// the rows `row_start..row_start + num_rows` (`num_rows` 0: every row from `row_start`), with the
/// row store's defaults (read path chosen by `fetchahead tune`, scales resident in DRAM,
/// O_DIRECT where the filesystem allows it, no DRAM row cache), each overridden by its
/// `FETCHAHEAD_*` variable when set (`store::ENV_SETTINGS`).
///
/// # Safety
/// `dir` is a NUL-terminated path; `out` is writable; on success `*out` is a table to close with
/// `fetchahead_table_close`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_open_store(
    dir: *const c_char,
    layer: u32,
    row_start: u64,
    num_rows: u64,
    out: *mut *mut TableHandle,
) -> c_int {
    use crate::store::{LayerRows, RowStore, StoreOptions};
    use std::os::unix::ffi::OsStrExt;
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        if dir.is_null() {
            return Err(null("dir"));
        }
        // SAFETY: `dir` is a NUL-terminated string (the caller's contract).
        let bytes = unsafe { std::ffi::CStr::from_ptr(dir) }.to_bytes();
        let path = std::path::Path::new(std::ffi::OsStr::from_bytes(bytes));
        let options = StoreOptions {
            row_start,
            num_rows: (num_rows > 0).then_some(num_rows),
            ..StoreOptions::from_env()?
        };
        let store = Arc::new(RowStore::open(path, options)?);
        let rows = LayerRows::new(store, layer)?;
        let handle = Box::new(TableHandle {
            store: Arc::new(rows),
            memory: None,
            lookup_error: Mutex::new(String::new()),
        });
        // SAFETY: `out` is writable (checked non-null; the caller's contract).
        unsafe { *out = Box::into_raw(handle) };
        Ok(())
    })
}

/// Arms a fault on an in-memory table: `FAIL_ON_ID` (arg: the id, -1 disarms), `FAIL_NEXT` and
/// `CORRUPT_NEXT` (arg: how many lookups), `LATENCY_US` (arg: microseconds per lookup), `NONE`.
///
/// # Safety
/// `table` is a table from `fetchahead_open_*`, not yet closed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_table_inject(
    table: *const TableHandle,
    fault: u32,
    arg: i64,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let table = unsafe { table.as_ref() }.ok_or(null("table"))?;
        let memory = table
            .memory
            .as_ref()
            .ok_or(Error::invalid("table", "faults need an in-memory table"))?;
        let n = u32::try_from(arg.max(0)).unwrap_or(u32::MAX);
        match fault {
            FETCHAHEAD_FAULT_NONE => {
                memory.fail_on_id(None);
                memory.fail_next(0);
                memory.corrupt_next(0);
                memory.set_latency(Duration::ZERO);
            }
            FETCHAHEAD_FAULT_FAIL_ON_ID => memory.fail_on_id((arg >= 0).then_some(arg)),
            FETCHAHEAD_FAULT_FAIL_NEXT => memory.fail_next(n),
            FETCHAHEAD_FAULT_CORRUPT_NEXT => memory.corrupt_next(n),
            FETCHAHEAD_FAULT_LATENCY_US => memory.set_latency(Duration::from_micros(n as u64)),
            other => return Err(Error::invalid("fault", format!("no fault kind {other}"))),
        }
        Ok(())
    })
}

/// The table's row width in FP8 elements (0 for a null table).
///
/// # Safety
/// `table` is null or a table from `fetchahead_open_*`, not yet closed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_table_dim(table: *const TableHandle) -> u32 {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the caller's contract.
        unsafe { table.as_ref() }.map_or(0, |t| t.store.dim() as u32)
    }))
    .unwrap_or(0)
}

/// The last failure of `fetchahead_lookup` on this table, as [`fetchahead_last_error`].
///
/// # Safety
/// `table` is a table from `fetchahead_open_*`; `buf` is null or writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_table_lookup_error(
    table: *const TableHandle,
    buf: *mut c_char,
    len: usize,
) -> usize {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the caller's contract.
        let Some(table) = (unsafe { table.as_ref() }) else {
            set_last_error("fetchahead_table_lookup_error: invalid table: null pointer".into());
            return 0;
        };
        let m = table
            .lookup_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // SAFETY: the caller's contract.
        unsafe { copy_message(&m, buf, len) };
        m.len()
    }))
    .unwrap_or(0)
}

/// Closes a table. Prefetchers created on it keep its rows alive; a `Work` naming it must not
/// run after this.
///
/// # Safety
/// `table` is null or a table from `fetchahead_open_*`, closed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_table_close(table: *mut TableHandle) {
    if !table.is_null() {
        // SAFETY: the caller's contract: made by Box::into_raw, closed once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(table) })));
    }
}

/// One lookup for an engine's own host function: `fetchahead_lookup(&work)` enqueued with
/// `cudaLaunchHostFunc`. `ids`, `weights` (`count * dim` bytes) and `scales` (`count * dim / 32`
/// bytes) are host memory (pinned, for the engine's async copies).
#[repr(C)]
pub struct Work {
    pub table: *const TableHandle,
    pub ids: *const i64,
    pub weights: *mut u8,
    pub scales: *mut u8,
    pub count: u64,
    /// Written by the lookup: `FETCHAHEAD_OK`, or an error code (the rows are then zero-filled
    /// and the message is kept for `fetchahead_table_lookup_error`).
    pub status: i32,
}

/// Runs the lookup described by `work` (a `Work *`): the host-function entry. Makes no CUDA call,
/// never unwinds, and zero-fills the rows on any failure.
///
/// # Safety
/// `work` is null or points at a `Work` whose buffers hold `count` rows, alive for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_lookup(work: *mut c_void) {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the caller's contract.
        let Some(work) = (unsafe { work.cast::<Work>().as_mut() }) else {
            set_last_error("fetchahead_lookup: invalid work: null pointer".into());
            return;
        };
        // SAFETY: the caller's contract.
        let table = unsafe { work.table.as_ref() };
        // Every failure leaves its own message: on this thread, and on the table when there is
        // one (the host function runs on the driver's thread, where the engine cannot ask).
        let fail = |work: &mut Work, e: Error| {
            let message = c_message(format!("fetchahead_lookup: {e}"));
            if let Some(table) = table {
                *table
                    .lookup_error
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = message.clone();
            }
            set_last_error(message);
            work.status = code(&e);
        };
        let Some(table) = table else {
            fail(work, null("work.table"));
            return;
        };
        let dim = table.store.dim();
        let count = usize::try_from(work.count)
            .ok()
            .filter(|c| c.checked_mul(dim).is_some());
        let Some(count) = count else {
            let count = work.count;
            fail(
                work,
                Error::invalid("work.count", format!("{count} rows of dim {dim} overflow")),
            );
            return;
        };
        if count > 0 && (work.ids.is_null() || work.weights.is_null() || work.scales.is_null()) {
            let which = [
                ("ids", work.ids.is_null()),
                ("weights", work.weights.is_null()),
                ("scales", work.scales.is_null()),
            ]
            .iter()
            .filter(|(_, n)| *n)
            .map(|(w, _)| *w)
            .collect::<Vec<_>>()
            .join(", ");
            fail(
                work,
                Error::invalid("work", format!("{which} null for a lookup of {count} rows")),
            );
            return;
        }
        let (ids, weights, scales): (&[i64], &mut [u8], &mut [u8]) = if count == 0 {
            (&[], &mut [], &mut [])
        } else {
            // SAFETY: non-null, and sized for `count` rows (the caller's contract).
            unsafe {
                (
                    std::slice::from_raw_parts(work.ids, count),
                    std::slice::from_raw_parts_mut(work.weights, count * dim),
                    std::slice::from_raw_parts_mut(work.scales, count * dim / 32),
                )
            }
        };
        match lookup_or_zero(&*table.store, ids, weights, scales) {
            Ok(()) => {
                clear_last_error();
                work.status = FETCHAHEAD_OK;
            }
            Err(e) => fail(work, e),
        }
    }));
    if outcome.is_err() {
        set_last_error("fetchahead_lookup panicked (a bug); the rows are not valid".into());
        // SAFETY: the caller's contract (null or a live `Work`).
        if let Some(work) = unsafe { work.cast::<Work>().as_mut() } {
            work.status = FETCHAHEAD_ERR_PANIC;
        }
    }
}

/// How a prefetcher is built (`fetchahead_prefetcher_config` in C).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FfiPrefetcherConfig {
    /// Most rows per prefetch (rounded up to a power of two).
    pub capacity: u64,
    /// Gather + dequant variant by name (a NUL-terminated string, `fetchahead kernels` lists
    /// them); null: the fastest measured for the device's arch.
    pub variant: *const c_char,
    /// Nonzero: check mode.
    pub check: u32,
    /// Nonzero: fall back to the synchronous path after a lookup error.
    pub fallback_on_error: u32,
    /// `FETCHAHEAD_COMPLETION_HOST_FUNCTION` or `FETCHAHEAD_COMPLETION_FLAG`.
    pub completion: u32,
    /// Check mode: the count's log period in milliseconds (0: the default, 10 s).
    pub check_log_ms: u32,
    /// `FETCHAHEAD_JOIN_TAGS` (the default: call [`fetchahead_prefetcher_finish`] once after the
    /// step's last gather) or `FETCHAHEAD_JOIN_AT_GATHER` (0, what a zeroed config asks for).
    pub join: u32,
}

/// Writes the recommended configuration to `*out`, `PrefetcherConfig::default()`'s: capacity
/// 4096, the arch's fastest measured gather + dequant variant (`variant` null), flag completion
/// and tagged gathers (the measured best), fallback on, check mode off.
///
/// # Safety
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_prefetcher_config_default(
    out: *mut FfiPrefetcherConfig,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let out = unsafe { out.as_mut() }.ok_or(null("out"))?;
        let d = PrefetcherConfig::default();
        *out = FfiPrefetcherConfig {
            capacity: d.capacity as u64,
            variant: std::ptr::null(),
            check: d.check as u32,
            fallback_on_error: d.fallback_on_error as u32,
            completion: match d.completion {
                Completion::HostFunction => FETCHAHEAD_COMPLETION_HOST_FUNCTION,
                Completion::Flag => FETCHAHEAD_COMPLETION_FLAG,
            },
            check_log_ms: 0,
            join: match d.join {
                Join::AtGather => FETCHAHEAD_JOIN_AT_GATHER,
                Join::Tags => FETCHAHEAD_JOIN_TAGS,
            },
        };
        Ok(())
    })
}

/// Each gather waits for its prefetch's side stream (an event): nothing else to call.
pub const FETCHAHEAD_JOIN_AT_GATHER: u32 = 0;
/// Each gather waits on the device for its rows' tags; the caller's stream joins the side stream
/// at [`fetchahead_prefetcher_finish`], once after the step's last gather (a graph capture
/// cannot end without it). The default.
pub const FETCHAHEAD_JOIN_TAGS: u32 = 1;

/// Lookups run in a host function on the driver's callback thread.
pub const FETCHAHEAD_COMPLETION_HOST_FUNCTION: u32 = 0;
/// Lookups run on the prefetcher's own worker thread; the stream waits on a pinned flag.
pub const FETCHAHEAD_COMPLETION_FLAG: u32 = 1;

/// The variant the C string `name` names, resolved once here (null: `None`, the device's
/// default).
fn variant_named(name: *const c_char) -> Result<Option<DequantVariant>> {
    if name.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller passes a NUL-terminated string (the header's contract for `variant`).
    let name = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy();
    crate::kernels::dequant_variant_named(&name).map(Some)
}

/// A prefetcher (it holds its table's rows alive).
pub struct PrefetcherHandle {
    prefetcher: Prefetcher,
}

/// Creates a prefetcher over `table` on CUDA device `device` (its primary context: the one the
/// CUDA runtime, and so PyTorch, uses). Warm it before capturing a graph.
///
/// # Safety
/// `table` is an open table, `config` readable, `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_prefetcher_create(
    table: *const TableHandle,
    device: i32,
    config: *const FfiPrefetcherConfig,
    out: *mut *mut PrefetcherHandle,
) -> c_int {
    // SAFETY: the caller's contract, passed on.
    guard(|| unsafe { create_prefetcher(table, device, config, None, out) })
}

/// A lookup thread that flag-mode prefetchers share (`fetchahead_flag_lane` in C): one lookup at
/// a time, in the order the prefetches were enqueued.
pub struct FlagLaneHandle {
    lane: Arc<FlagLane>,
}

/// Starts a flag lane for [`fetchahead_prefetcher_create_in_lane`].
///
/// # Safety
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_flag_lane_create(out: *mut *mut FlagLaneHandle) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let lane = FlagLane::start("fetchahead-lane".into())?;
        // SAFETY: `out` is writable (checked non-null; the caller's contract).
        unsafe { *out = Box::into_raw(Box::new(FlagLaneHandle { lane })) };
        Ok(())
    })
}

/// Releases the caller's hold on `lane` (null: nothing); its thread stops once the prefetchers
/// made in it are closed too.
///
/// # Safety
/// `lane` is null or a lane from [`fetchahead_flag_lane_create`], closed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_flag_lane_close(lane: *mut FlagLaneHandle) {
    if !lane.is_null() {
        // SAFETY: the caller's contract: a live lane handle, closed once.
        drop(unsafe { Box::from_raw(lane) });
    }
}

/// As [`fetchahead_prefetcher_create`], a flag-mode prefetcher (`config.completion` must be
/// `FETCHAHEAD_COMPLETION_FLAG`) whose lookups run on `lane`, shared with the lane's other
/// prefetchers. `rank` orders requests that wait together (the layer's gather order).
///
/// # Safety
/// As [`fetchahead_prefetcher_create`]; `lane` is a live lane.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_prefetcher_create_in_lane(
    table: *const TableHandle,
    device: i32,
    config: *const FfiPrefetcherConfig,
    lane: *const FlagLaneHandle,
    rank: u32,
    out: *mut *mut PrefetcherHandle,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let lane = unsafe { lane.as_ref() }.ok_or(null("lane"))?;
        // SAFETY: the caller's contract, passed on.
        unsafe { create_prefetcher(table, device, config, Some((&lane.lane, rank)), out) }
    })
}

/// # Safety
/// As [`fetchahead_prefetcher_create`].
unsafe fn create_prefetcher(
    table: *const TableHandle,
    device: i32,
    config: *const FfiPrefetcherConfig,
    lane: Option<(&Arc<FlagLane>, u32)>,
    out: *mut *mut PrefetcherHandle,
) -> Result<()> {
    // SAFETY: the caller's contract.
    let (table, config) = unsafe { (table.as_ref(), config.as_ref()) };
    let (table, config) = (table.ok_or(null("table"))?, config.ok_or(null("config"))?);
    if out.is_null() {
        return Err(null("out"));
    }
    let ordinal =
        usize::try_from(device).map_err(|_| Error::invalid("device", format!("{device}")))?;
    let kernels = Kernels::shared(ordinal)?;
    let check_log_every = match config.check_log_ms {
        0 => PrefetcherConfig::default().check_log_every,
        ms => Duration::from_millis(ms.into()),
    };
    let config = PrefetcherConfig {
        capacity: usize::try_from(config.capacity).unwrap_or(usize::MAX),
        variant: variant_named(config.variant)?,
        check: config.check != 0,
        fallback_on_error: config.fallback_on_error != 0,
        completion: match config.completion {
            FETCHAHEAD_COMPLETION_HOST_FUNCTION => Completion::HostFunction,
            FETCHAHEAD_COMPLETION_FLAG => Completion::Flag,
            other => {
                return Err(Error::invalid(
                    "completion",
                    format!("no completion mode {other}"),
                ));
            }
        },
        check_log_every,
        join: match config.join {
            FETCHAHEAD_JOIN_AT_GATHER => Join::AtGather,
            FETCHAHEAD_JOIN_TAGS => Join::Tags,
            other => return Err(Error::invalid("join", format!("no join mode {other}"))),
        },
        ..PrefetcherConfig::default()
    };
    let store = table.store.clone();
    let prefetcher = match lane {
        Some((lane, rank)) => Prefetcher::in_lane(kernels, store, config, lane, rank)?,
        None => Prefetcher::new(kernels, store, config)?,
    };
    // SAFETY: `out` is writable (checked non-null; the caller's contract).
    unsafe { *out = Box::into_raw(Box::new(PrefetcherHandle { prefetcher })) };
    Ok(())
}

/// # Safety
/// `p` is null or a live prefetcher used by no other thread during the call.
unsafe fn prefetcher<'a>(p: *mut PrefetcherHandle) -> Result<&'a mut Prefetcher> {
    // SAFETY: the caller's contract.
    unsafe { p.as_mut() }
        .map(|h| &mut h.prefetcher)
        .ok_or(null("prefetcher"))
}

/// First use of every buffer and kernel; call it before capturing a graph.
///
/// # Safety
/// `p` is a live prefetcher.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_prefetcher_warm(p: *mut PrefetcherHandle) -> c_int {
    // SAFETY: the caller's contract.
    guard(|| unsafe { prefetcher(p) }?.warm())
}

/// Starts fetching the rows of `count` int64 ids at device address `ids` on a side stream forked
/// from `stream`. Capturable; allocates nothing.
///
/// # Safety
/// `p` is a live prefetcher; `ids` holds `count` ids on its device, unchanged until the gather
/// has run; `stream` is a valid stream of the device's primary context (or null, the legacy one).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_prefetch(
    p: *mut PrefetcherHandle,
    ids: *const i64,
    count: u64,
    stream: sys::CUstream,
) -> c_int {
    guard(|| {
        let count =
            usize::try_from(count).map_err(|_| Error::invalid("count", format!("{count}")))?;
        // SAFETY: the caller's contract.
        unsafe { prefetcher(p)?.prefetch(ids as u64, count, stream) }
    })
}

/// Joins the side stream into `stream` and writes the prefetched rows as bf16 to `out`
/// (`count * dim`, 16-byte aligned). Capturable; allocates nothing.
///
/// # Safety
/// `p` is a live prefetcher; `out` holds `count * dim` bf16 on its device; `stream` as for
/// `fetchahead_prefetch`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_gather_dequant(
    p: *mut PrefetcherHandle,
    out: *mut u16,
    stream: sys::CUstream,
) -> c_int {
    // SAFETY: the caller's contract.
    guard(|| unsafe { prefetcher(p)?.gather_dequant(out as u64, stream) })
}

/// `FETCHAHEAD_JOIN_TAGS`: makes `stream` wait for the side stream's work of the last
/// prefetch, which the tagged gathers did not wait for. Call it once after a step's last gather
/// (before a capture ends); nothing to do with `FETCHAHEAD_JOIN_AT_GATHER`. Capturable.
///
/// # Safety
/// `p` is a live prefetcher; `stream` the stream its gathers were given.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_prefetcher_finish(
    p: *mut PrefetcherHandle,
    stream: sys::CUstream,
) -> c_int {
    // SAFETY: the caller's contract.
    guard(|| unsafe { prefetcher(p)?.finish(stream) })
}

/// `FETCHAHEAD_JOIN_TAGS`: writes to `*late` the rows the gathers since the last call gave up
/// on after the tag timeout (1 s; written as zeros, and logged). Waits for the device.
///
/// # Safety
/// `p` is a live prefetcher; `late` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_late_rows(p: *mut PrefetcherHandle, late: *mut u32) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let (p, late) = unsafe { (prefetcher(p)?, late.as_mut().ok_or(null("late"))?) };
        *late = p.late_rows()?;
        Ok(())
    })
}

/// The synchronous path: looks up and gathers `count` ids into `out`, all on `stream`.
///
/// # Safety
/// As `fetchahead_prefetch` and `fetchahead_gather_dequant`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_gather_dequant_sync(
    p: *mut PrefetcherHandle,
    ids: *const i64,
    count: u64,
    out: *mut u16,
    stream: sys::CUstream,
) -> c_int {
    guard(|| {
        let count =
            usize::try_from(count).map_err(|_| Error::invalid("count", format!("{count}")))?;
        // SAFETY: the caller's contract.
        unsafe { prefetcher(p)?.gather_dequant_sync(ids as u64, count, out as u64, stream) }
    })
}

/// Counters (`fetchahead_counters` in C).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FfiCounters {
    pub prefetches: u64,
    pub gathers: u64,
    pub sync_gathers: u64,
    pub lookups: u64,
    pub rows_looked_up: u64,
    pub lookup_errors: u64,
    /// Nonzero while gathers take the synchronous path after a lookup error.
    pub fell_back: u32,
    /// Check mode: gathers whose output differed from the synchronous path's; -1 when off.
    pub check_differed: i32,
}

/// Reads the counters. In check mode this waits for all work on the device (not capturable).
///
/// # Safety
/// `p` is a live prefetcher; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_read_counters(
    p: *mut PrefetcherHandle,
    out: *mut FfiCounters,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let (p, out) = unsafe { (prefetcher(p)?, out.as_mut().ok_or(null("out"))?) };
        let s = p.stats();
        *out = FfiCounters {
            prefetches: s.prefetches,
            gathers: s.gathers,
            sync_gathers: s.sync_gathers,
            lookups: s.lookups,
            rows_looked_up: s.rows_looked_up,
            lookup_errors: s.lookup_errors,
            fell_back: s.fell_back as u32,
            check_differed: p
                .check_differed()?
                .map_or(-1, |n| n.min(i32::MAX as u32) as i32),
        };
        Ok(())
    })
}

/// Check mode's periodic log, for callers that replay graphs (eager gathers poll it
/// themselves): writes to `*differed` the count of a snapshot that has arrived (it is logged
/// too), or -1 when none has; enqueues the next snapshot on `stream` when 10 s have passed.
/// Never waits for the GPU; does nothing while `stream` is being captured or check mode is off.
///
/// # Safety
/// `p` is a live prefetcher, `stream` a valid stream of its device, `differed` writable or null.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_poll_check(
    p: *mut PrefetcherHandle,
    stream: sys::CUstream,
    differed: *mut i32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let read = unsafe { prefetcher(p)?.poll_check(stream)? };
        if !differed.is_null() {
            let value = read.map_or(-1, |n| n.min(i32::MAX as u32) as i32);
            // SAFETY: `differed` is writable (the caller's contract).
            unsafe { *differed = value };
        }
        Ok(())
    })
}

/// One failed lookup (`fetchahead_lookup_error` in C): its ids are
/// `ids_out[ids_offset .. ids_offset + ids_copied]` of the `fetchahead_take_errors` call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FfiLookupError {
    /// Ids the failed lookup was asked for.
    pub id_count: u64,
    pub ids_offset: u64,
    /// Of them, those that fitted in `ids_out`.
    pub ids_copied: u64,
    pub message: [c_char; FETCHAHEAD_MESSAGE_BYTES],
}

/// Takes the kept lookup failures (oldest first; up to 16 kept between calls): writes up to
/// `cap` records to `errors` and their ids, concatenated, to `ids_out` (`ids_cap` ids), and the
/// number of failures taken to `*taken` (records past `cap` are dropped).
///
/// # Safety
/// `p` is a live prefetcher; `errors` writable for `cap` records (or null with `cap` 0);
/// `ids_out` writable for `ids_cap` ids (or null with `ids_cap` 0); `taken` writable or null.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_take_errors(
    p: *mut PrefetcherHandle,
    errors: *mut FfiLookupError,
    cap: u32,
    ids_out: *mut i64,
    ids_cap: u64,
    taken: *mut u32,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let p = unsafe { prefetcher(p)? };
        if (errors.is_null() && cap > 0) || (ids_out.is_null() && ids_cap > 0) {
            return Err(null("errors or ids_out"));
        }
        let failures = p.take_errors();
        let mut offset = 0usize;
        for (i, f) in failures.iter().take(cap as usize).enumerate() {
            let copied = f.ids.len().min((ids_cap as usize).saturating_sub(offset));
            let mut record = FfiLookupError {
                id_count: f.ids.len() as u64,
                ids_offset: offset as u64,
                ids_copied: copied as u64,
                message: [0; FETCHAHEAD_MESSAGE_BYTES],
            };
            // SAFETY: `message` holds FETCHAHEAD_MESSAGE_BYTES bytes; `ids_out` holds
            // `ids_cap >= offset + copied` ids and `errors` `cap > i` records (the caller's contract).
            unsafe {
                copy_message(
                    &f.message,
                    record.message.as_mut_ptr(),
                    FETCHAHEAD_MESSAGE_BYTES,
                );
                if copied > 0 {
                    std::ptr::copy_nonoverlapping(f.ids.as_ptr(), ids_out.add(offset), copied);
                }
                errors.add(i).write(record);
            }
            offset += copied;
        }
        if !taken.is_null() {
            // SAFETY: the caller's contract.
            unsafe { *taken = failures.len().min(u32::MAX as usize) as u32 };
        }
        Ok(())
    })
}

/// Goes back to prefetching after a fallback to the synchronous path.
///
/// # Safety
/// `p` is a live prefetcher.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_prefetcher_resume(p: *mut PrefetcherHandle) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        unsafe { prefetcher(p)? }.resume();
        Ok(())
    })
}

/// Closes a prefetcher after waiting for the device. Graphs that captured it must be destroyed
/// first.
///
/// # Safety
/// `p` is null or a prefetcher from `fetchahead_prefetcher_create`, closed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_prefetcher_close(p: *mut PrefetcherHandle) {
    if !p.is_null() {
        // SAFETY: the caller's contract: made by Box::into_raw, closed once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(p) })));
    }
}

/// An L2 plan on one device (`fetchahead_l2_plan` in C). The segment tables of captured
/// forwards live as long as the plan.
pub struct L2PlanHandle {
    plan: crate::l2_plan::L2Plan,
    kernels: Arc<Kernels>,
}

/// A forward's end (`fetchahead_l2_forward_summary` in C).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FfiForwardSummary {
    pub signature: u64,
    pub collectives: u64,
    /// Nonzero: the forward was captured into a graph.
    pub captured: u32,
    /// `FETCHAHEAD_LEARNED_*`.
    pub learned: u32,
    /// Nonzero: this forward stored its signature's first plan.
    pub new_signature: u32,
    pub _reserved: u32,
}

/// What a forward did to its signature's plan (`l2_plan::Learned`).
pub const FETCHAHEAD_LEARNED_NEW: u32 = 0;
pub const FETCHAHEAD_LEARNED_REPLACED: u32 = 1;
pub const FETCHAHEAD_LEARNED_UNCHANGED: u32 = 2;
pub const FETCHAHEAD_LEARNED_NO_COLLECTIVES: u32 = 3;
pub const FETCHAHEAD_LEARNED_FROZEN: u32 = 4;
pub const FETCHAHEAD_LEARNED_CAPTURED: u32 = 5;
pub const FETCHAHEAD_LEARNED_CAPTURED_MISMATCH: u32 = 6;

/// The plan's counters (`fetchahead_l2_counters` in C).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FfiL2Counters {
    pub windows_prefetched: u64,
    pub bytes_prefetched: u64,
    pub forwards_without_plan: u64,
    pub mismatches_at_capture: u64,
    pub forwards: u64,
    pub signatures: u64,
    pub windows_host_bound: u64,
}

/// Wraps the caller's stream.
///
/// # Safety
/// `stream` is a live stream of `kernels`' context (or null, the legacy stream), alive while
/// the plan may use it.
unsafe fn borrowed_stream(
    kernels: &Kernels,
    stream: sys::CUstream,
) -> Arc<cudarc::driver::CudaStream> {
    // SAFETY: the caller's contract; the wrapper never destroys the stream.
    unsafe { kernels.gpu().ctx.wrap_borrowed_stream(stream) }
}

/// Creates an L2 plan on device `device` (its primary context) for forwards on `stream`, with
/// `budget_per_window` bytes per window at most (0: half of L2) and the default replay. Its side
/// stream is made now, so call it before any capture.
///
/// # Safety
/// `stream` is a valid stream of the device's primary context (or null); `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_l2_plan_create(
    device: i32,
    stream: sys::CUstream,
    budget_per_window: u64,
    out: *mut *mut L2PlanHandle,
) -> c_int {
    // SAFETY: the caller's contract, passed on; a null replay is the default.
    unsafe {
        fetchahead_l2_plan_create_with_replay(
            device,
            stream,
            budget_per_window,
            std::ptr::null(),
            out,
        )
    }
}

/// As [`fetchahead_l2_plan_create`], the window's replay named by `replay`: `auto` (also a
/// null `replay`), `access_policy`, or an L2 prefetch variant's name (`l2_prefetch`,
/// `l2_prefetch_loads`, ...). An unknown name fails with the list of names, before any device
/// work.
///
/// # Safety
/// As [`fetchahead_l2_plan_create`]; `replay` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_l2_plan_create_with_replay(
    device: i32,
    stream: sys::CUstream,
    budget_per_window: u64,
    replay: *const c_char,
    out: *mut *mut L2PlanHandle,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let replay = if replay.is_null() {
            None
        } else {
            // SAFETY: the caller passes a NUL-terminated string.
            let name = unsafe { std::ffi::CStr::from_ptr(replay) }.to_string_lossy();
            Some(crate::l2_plan::Replay::named(&name)?)
        };
        let ordinal =
            usize::try_from(device).map_err(|_| Error::invalid("device", format!("{device}")))?;
        let kernels = Kernels::shared(ordinal)?;
        // The device's defaults and the FETCHAHEAD_L2_* settings; the arguments win.
        let mut config = crate::l2_plan::PlanConfig::from_env(kernels.gpu().l2_bytes)?;
        if budget_per_window > 0 {
            config.budget_per_window = budget_per_window;
        }
        if let Some(replay) = replay {
            config.replay = replay;
        }
        // SAFETY: the caller's contract.
        let main = unsafe { borrowed_stream(&kernels, stream) };
        let plan = crate::l2_plan::L2Plan::new(kernels.clone(), main, config)?;
        // SAFETY: `out` is writable (checked non-null; the caller's contract).
        unsafe { *out = Box::into_raw(Box::new(L2PlanHandle { plan, kernels })) };
        Ok(())
    })
}

/// # Safety
/// `p` is null or a live plan used by no other thread during the call.
unsafe fn l2_plan<'a>(p: *mut L2PlanHandle) -> Result<&'a mut L2PlanHandle> {
    // SAFETY: the caller's contract.
    unsafe { p.as_mut() }.ok_or(null("plan"))
}

/// Starts a forward of `signature` on `stream` (which may be being captured, and may differ
/// from the last forward's).
///
/// # Safety
/// `p` is a live plan; `stream` a valid stream of its device's primary context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_l2_plan_begin_forward(
    p: *mut L2PlanHandle,
    signature: u64,
    stream: sys::CUstream,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let h = unsafe { l2_plan(p)? };
        // SAFETY: the caller's contract.
        let main = unsafe { borrowed_stream(&h.kernels, stream) };
        h.plan.set_main_stream(main)?;
        h.plan.begin_forward(crate::l2_plan::Signature(signature))
    })
}

/// Call right before launching each collective on the forward's stream.
///
/// # Safety
/// `p` is a live plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_l2_plan_collective(p: *mut L2PlanHandle) -> c_int {
    // SAFETY: the caller's contract.
    guard(|| unsafe { l2_plan(p)? }.plan.collective())
}

/// [`fetchahead_l2_plan_collective`] for a collective of `kind`: 0 all-reduce, 1 all-gather,
/// 2 other. With all-gather windows switched off (`fetchahead_l2_plan_set_all_gather` or
/// `FETCHAHEAD_L2_ALL_GATHER=0`) an all-gather's window is counted but not warmed.
///
/// # Safety
/// `p` is a live plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_l2_plan_collective_kind(
    p: *mut L2PlanHandle,
    kind: u32,
) -> c_int {
    guard(|| {
        let kind = crate::l2_plan::CollectiveKind::from_code(kind)?;
        // SAFETY: the caller's contract.
        unsafe { l2_plan(p)? }.plan.collective_of(kind)
    })
}

/// Whether all-gather windows are warmed (`enabled` nonzero, the default) or only counted.
///
/// # Safety
/// `p` is a live plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_l2_plan_set_all_gather(
    p: *mut L2PlanHandle,
    enabled: c_int,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        unsafe { l2_plan(p)? }.plan.set_all_gather(enabled != 0);
        Ok(())
    })
}

/// Whether eager windows are left cold while the GPU keeps up with the host (`enabled`
/// nonzero, the default: their prefetch could not shorten the forward) or always warmed.
///
/// # Safety
/// `p` is a live plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_l2_plan_set_host_pace(
    p: *mut L2PlanHandle,
    enabled: c_int,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        unsafe { l2_plan(p)? }.plan.set_host_pace(enabled != 0);
        Ok(())
    })
}

/// Bytes a window may warm at most, for plans learned from now on (a multiple of 16 is kept).
///
/// # Safety
/// `p` is a live plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_l2_plan_set_budget(
    p: *mut L2PlanHandle,
    budget_per_window: u64,
) -> c_int {
    // SAFETY: the caller's contract.
    guard(|| unsafe { l2_plan(p)? }.plan.set_budget(budget_per_window))
}

/// A kernel after the latest collective reads `bytes` of weights at device address `address`
/// (allocated for as long as the plan may prefetch it).
///
/// # Safety
/// `p` is a live plan.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_l2_plan_consume(
    p: *mut L2PlanHandle,
    address: u64,
    bytes: u64,
) -> c_int {
    // SAFETY: the caller's contract.
    guard(|| unsafe { l2_plan(p)? }.plan.consume(address, bytes))
}

/// Ends the forward; writes its summary to `*out` when `out` is not null.
///
/// # Safety
/// `p` is a live plan; `out` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_l2_plan_end_forward(
    p: *mut L2PlanHandle,
    out: *mut FfiForwardSummary,
) -> c_int {
    use crate::l2_plan::Learned;
    guard(|| {
        // SAFETY: the caller's contract.
        let outcome = unsafe { l2_plan(p)? }.plan.end_forward()?;
        let s = outcome.summary;
        // SAFETY: the caller's contract.
        if let Some(out) = unsafe { out.as_mut() } {
            *out = FfiForwardSummary {
                signature: s.signature.0,
                collectives: s.collectives as u64,
                captured: s.captured as u32,
                learned: match s.learned {
                    Learned::New => FETCHAHEAD_LEARNED_NEW,
                    Learned::Replaced => FETCHAHEAD_LEARNED_REPLACED,
                    Learned::Unchanged => FETCHAHEAD_LEARNED_UNCHANGED,
                    Learned::NoCollectives => FETCHAHEAD_LEARNED_NO_COLLECTIVES,
                    Learned::Frozen => FETCHAHEAD_LEARNED_FROZEN,
                    Learned::Captured { mismatch: false } => FETCHAHEAD_LEARNED_CAPTURED,
                    Learned::Captured { mismatch: true } => FETCHAHEAD_LEARNED_CAPTURED_MISMATCH,
                },
                new_signature: s.new_signature as u32,
                _reserved: 0,
            };
        }
        Ok(())
    })
}

/// Reads the plan's counters.
///
/// # Safety
/// `p` is a live plan; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_l2_plan_counters(
    p: *mut L2PlanHandle,
    out: *mut FfiL2Counters,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let (h, out) = unsafe { (l2_plan(p)?, out.as_mut().ok_or(null("out"))?) };
        let c = h.plan.counters();
        *out = FfiL2Counters {
            windows_prefetched: c.windows_prefetched,
            bytes_prefetched: c.bytes_prefetched,
            forwards_without_plan: c.forwards_without_plan,
            mismatches_at_capture: c.mismatches_at_capture,
            forwards: c.forwards,
            signatures: c.signatures,
            windows_host_bound: c.windows_host_bound,
        };
        Ok(())
    })
}

/// Closes a plan. Graphs that captured its forwards must be destroyed first.
///
/// # Safety
/// `p` is null or a plan from [`fetchahead_l2_plan_create`], closed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fetchahead_l2_plan_close(p: *mut L2PlanHandle) {
    if !p.is_null() {
        // SAFETY: the caller's contract: made by Box::into_raw, closed once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(p) })));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_kind_has_a_status_code_of_the_header() {
        for &kind in ErrorKind::ALL {
            let code = kind_code(kind);
            assert!(
                (FETCHAHEAD_ERR_INVALID..=FETCHAHEAD_ERR_PANIC).contains(&code),
                "{kind:?}: {code}"
            );
        }
    }
}
