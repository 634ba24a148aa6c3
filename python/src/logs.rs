//! Rust `log` records to Python's `logging`: each to the child logger of the part it came from
//! (`fetchahead.store`, `fetchahead.prefetch`, `fetchahead.l2_plan`, `fetchahead.kernels`, else
//! `fetchahead`), with the time it happened and its Rust file and line as the record's own
//! (`fetchahead/_logs.py` makes the records).
//!
//! A record may come from any thread, including the driver's callback thread while a Python
//! thread holds the GIL and waits for that very callback, so the logger never takes the GIL: it
//! queues the record (up to [`QUEUE`] of them; beyond that records are dropped and counted) and
//! the queue is forwarded to `logging` on a Python thread at the end of every call into this
//! module, and by `fetchahead.flush_logs()` (also run at exit).
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// Records kept between drains.
const QUEUE: usize = 4096;

struct Record {
    level: log::Level,
    target: String,
    message: String,
    file: Option<&'static str>,
    line: u32,
    /// Seconds since the Unix epoch when the record was made (Python's `record.created`).
    created: f64,
}

static RECORDS: Mutex<VecDeque<Record>> = Mutex::new(VecDeque::new());
static PENDING: AtomicBool = AtomicBool::new(false);
static DROPPED: AtomicU64 = AtomicU64::new(0);

struct QueueLogger;

impl log::Log for QueueLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let mut q = RECORDS.lock().unwrap_or_else(PoisonError::into_inner);
        if q.len() >= QUEUE {
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        q.push_back(Record {
            level: record.level(),
            target: record.target().to_string(),
            message: record.args().to_string(),
            file: record.file_static(),
            line: record.line().unwrap_or(0),
            created,
        });
        PENDING.store(true, Ordering::Release);
    }

    fn flush(&self) {}
}

/// Installs the queue as the process's logger (unless the host program installed one).
pub fn install() {
    static LOGGER: QueueLogger = QueueLogger;
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Debug);
    }
}

pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Forwards the queued records to `logging`; cheap (one atomic load) when there are none.
pub fn drain(py: Python<'_>) {
    if !PENDING.swap(false, Ordering::Acquire) {
        return;
    }
    let records: Vec<Record> = RECORDS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .drain(..)
        .collect();
    static FORWARD: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let Ok(forward) = FORWARD.get_or_try_init(py, || {
        py.import("fetchahead._logs")?
            .getattr("forward")
            .map(Bound::unbind)
    }) else {
        return;
    };
    let batch: Vec<_> = records
        .into_iter()
        .map(|r| {
            let level = match r.level {
                log::Level::Error => 40,
                log::Level::Warn => 30,
                log::Level::Info => 20,
                log::Level::Debug => 10,
                log::Level::Trace => 5,
            };
            (
                level,
                logger_name(&r.target),
                r.message,
                r.file.unwrap_or("<rust>"),
                r.line,
                r.created,
                r.target,
            )
        })
        .collect();
    // A failing handler must not turn the fetchahead call into an error.
    if let Err(e) = forward.bind(py).call1((batch,)) {
        e.write_unraisable(py, None);
    }
}

/// The Python logger of a record from Rust module path `target`: the part's child logger.
pub fn logger_name(target: &str) -> &'static str {
    let part = target
        .strip_prefix("fetchahead::")
        .map(|rest| rest.split("::").next().unwrap_or(""));
    match part {
        Some("store") => "fetchahead.store",
        Some("prefetch") => "fetchahead.prefetch",
        Some("l2_plan") => "fetchahead.l2_plan",
        Some("kernels" | "driver" | "tables" | "timeline" | "nvtx") => "fetchahead.kernels",
        _ => "fetchahead",
    }
}

/// Logs `message` at `level` ("error", "warn", "info", "debug") with target `target` from a new
/// thread, waits for that thread, and returns: the record reaches `logging` at the end of this
/// call (tests).
#[pyfunction]
#[pyo3(signature = (level, message, target="fetchahead".to_string(), delay_ms=0))]
pub fn _log_example(py: Python<'_>, level: &str, message: String, target: String, delay_ms: u64) {
    let level = match level {
        "error" => log::Level::Error,
        "warn" => log::Level::Warn,
        "info" => log::Level::Info,
        _ => log::Level::Debug,
    };
    py.detach(move || {
        let _ = std::thread::spawn(move || log::log!(target: &target, level, "{message}")).join();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
    });
    drain(py);
}
