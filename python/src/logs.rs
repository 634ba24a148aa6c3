//! Rust `log` records to Python's `logging.getLogger("fetchahead")`.
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
        let mut q = RECORDS.lock().unwrap_or_else(PoisonError::into_inner);
        if q.len() >= QUEUE {
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        q.push_back(Record {
            level: record.level(),
            target: record.target().to_string(),
            message: record.args().to_string(),
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
    static LOGGER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let Ok(logger) = LOGGER.get_or_try_init(py, || {
        py.import("logging")?
            .call_method1("getLogger", ("fetchahead",))
            .map(Bound::unbind)
    }) else {
        return;
    };
    let logger = logger.bind(py);
    for r in records {
        let level = match r.level {
            log::Level::Error => 40,
            log::Level::Warn => 30,
            log::Level::Info => 20,
            log::Level::Debug => 10,
            log::Level::Trace => 5,
        };
        let extra = pyo3::types::PyDict::new(py);
        let _ = extra.set_item("rust_target", &r.target);
        let kwargs = pyo3::types::PyDict::new(py);
        let _ = kwargs.set_item("extra", extra);
        // A failing handler must not turn the fetchahead call into an error.
        if let Err(e) = logger.call_method("log", (level, "%s", r.message), Some(&kwargs)) {
            e.write_unraisable(py, None);
        }
    }
}

/// Logs `message` at `level` ("error", "warn", "info", "debug") from a new thread, waits for
/// that thread, and returns: the record reaches `logging` at the end of this call (tests).
#[pyfunction]
pub fn _log_example(py: Python<'_>, level: &str, message: String) {
    let level = match level {
        "error" => log::Level::Error,
        "warn" => log::Level::Warn,
        "info" => log::Level::Info,
        _ => log::Level::Debug,
    };
    py.detach(move || {
        let _ =
            std::thread::spawn(move || log::log!(target: "fetchahead", level, "{message}")).join();
    });
    drain(py);
}
