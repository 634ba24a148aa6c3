//! `fetchahead._native`: the pyo3 layer under the `fetchahead` Python package.
//!
//! This module is private: it takes raw addresses (the Python layer passes `data_ptr()` of
//! tensors and arrays it has checked) and raw stream handles. The public API, with its
//! validation, torch ops and docstrings, is `python/fetchahead/__init__.py`.
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::sys;
use fetchahead::device_abi::defaults::BySize;
use fetchahead::device_abi::{dequant, gather};
use fetchahead::kernels::Kernels;
use fetchahead::l2_plan::segments::SegmentTable;
use fetchahead::l2_plan::{CollectiveKind, L2Plan as RustL2Plan, PlanConfig, Replay, Signature};
use fetchahead::prefetch::flag_worker::FlagLane as RustFlagLane;
use fetchahead::prefetch::lookup::MemoryRows;
use fetchahead::prefetch::prefetcher::{
    Completion, Join, Prefetcher as RustPrefetcher, PrefetcherConfig,
};
use fetchahead::row_lookup::RowLookup;
use fetchahead::store::{
    LayerRows, PREADV_THREADS, ReadPath, RowStore as RustRowStore, StoreOptions, URING_DEPTH,
};
use fetchahead::{DequantVariant, GatherVariant};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

mod device;
mod errors;
mod logs;
mod torch_abi;
mod trace;

use device::DeviceKernels;

use errors::to_py;

type PyRes<T> = PyResult<T>;

/// Ends every entry: forwards the queued log records to Python, then maps the crate's error.
fn done<T>(py: Python<'_>, r: fetchahead::Result<T>) -> PyRes<T> {
    logs::drain(py);
    r.map_err(|e| to_py(py, e))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `{"gather": [(name, about), ...], "gather_dequant": [...]}`.
#[pyfunction]
fn variants(py: Python<'_>) -> PyRes<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    let g: Vec<(&str, &str)> = gather::VARIANTS.iter().map(|v| (v.name, v.about)).collect();
    let q: Vec<(&str, &str)> = dequant::VARIANTS
        .iter()
        .map(|v| (v.name, v.about))
        .collect();
    d.set_item(Family::Gather.name(), g)?;
    d.set_item(Family::Dequant.name(), q)?;
    Ok(d)
}

/// A kernel family, as Python names it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Gather,
    Dequant,
}

impl Family {
    fn named(name: &str) -> fetchahead::Result<Family> {
        match name {
            "gather" => Ok(Family::Gather),
            "gather_dequant" => Ok(Family::Dequant),
            other => Err(fetchahead::Error::invalid(
                "family",
                format!("`{other}`; want gather or gather_dequant"),
            )),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Family::Gather => "gather",
            Family::Dequant => "gather_dequant",
        }
    }

    /// The argument name of the family's (first) table tensor.
    fn table_name(self) -> &'static str {
        match self {
            Family::Gather => "table",
            Family::Dequant => "weights",
        }
    }

    /// Variant `name` of this family (parsed here, once), or the default of `defaults`.
    fn variant(
        self,
        name: Option<&str>,
        defaults: &fetchahead::device_abi::defaults::Defaults,
    ) -> fetchahead::Result<Variant> {
        Ok(match self {
            Family::Gather => Variant(Handle::Gather(match name {
                Some(name) => Pick::Named(fetchahead::gather_variant_named(name)?),
                None => Pick::BySize(defaults.gather),
            })),
            Family::Dequant => Variant(Handle::Dequant(match name {
                Some(name) => Pick::Named(fetchahead::dequant_variant_named(name)?),
                None => Pick::BySize(defaults.dequant),
            })),
        })
    }
}

/// A kernel variant resolved once from its name: the handle Python keeps and passes to the
/// launches (names only where a user gives or reads one).
#[pyclass(frozen, module = "fetchahead._native")]
#[derive(Clone, Copy)]
struct Variant(Handle);

/// A [`Variant`]'s family and handle.
#[derive(Clone, Copy)]
enum Handle {
    Gather(Pick<GatherVariant>),
    Dequant(Pick<DequantVariant>),
}

/// A named variant, or an arch's default, which picks by each call's rows.
#[derive(Clone, Copy)]
enum Pick<V: 'static> {
    Named(V),
    BySize(BySize<V>),
}

impl<V: Copy + PartialEq> Pick<V> {
    fn for_rows(&self, rows: u64) -> V {
        match self {
            Pick::Named(v) => *v,
            Pick::BySize(by) => by.for_rows(rows),
        }
    }
}

impl Handle {
    /// The name of the variant a call of `rows` rows launches.
    fn name_for(&self, rows: u64) -> &'static str {
        match self {
            Handle::Gather(p) => p.for_rows(rows).name(),
            Handle::Dequant(p) => p.for_rows(rows).name(),
        }
    }
}

#[pymethods]
impl Variant {
    #[getter]
    fn family(&self) -> &'static str {
        match self.0 {
            Handle::Gather(_) => Family::Gather,
            Handle::Dequant(_) => Family::Dequant,
        }
        .name()
    }

    /// The variant's name; an arch's default is `"default"` (see `name_for`).
    #[getter]
    fn name(&self) -> &'static str {
        match self.0 {
            Handle::Gather(Pick::Named(v)) => v.name(),
            Handle::Dequant(Pick::Named(v)) => v.name(),
            _ => "default",
        }
    }

    /// The name of the variant a call of `rows` rows launches (a default picks by size).
    fn name_for(&self, rows: u64) -> &'static str {
        self.0.name_for(rows)
    }

    fn __repr__(&self) -> String {
        format!("<fetchahead {} variant {}>", self.family(), self.name())
    }
}

/// The defaults of `arch` (None: the tested chip's, `fetchahead_gpu::defaults`).
fn defaults_of(
    arch: Option<&str>,
) -> fetchahead::Result<&'static fetchahead::device_abi::defaults::Defaults> {
    use fetchahead::device_abi::defaults::BY_ARCH;
    match arch {
        Some(arch) => BY_ARCH.iter().find(|d| d.arch == arch).ok_or_else(|| {
            let built: Vec<&str> = BY_ARCH.iter().map(|d| d.arch).collect();
            fetchahead::Error::UnknownArch {
                arch: arch.to_string(),
                built: built.join(", "),
            }
        }),
        None => Ok(&BY_ARCH[0]),
    }
}

/// Variant `name` of `family` ("gather" or "gather_dequant"), or for None the default for
/// `arch` (None: the tested chip's). A device's own default: `Device.variant`.
#[pyfunction]
#[pyo3(signature = (family, name=None, arch=None))]
fn variant(py: Python<'_>, family: &str, name: Option<&str>, arch: Option<&str>) -> PyRes<Variant> {
    let r = Family::named(family).and_then(|f| f.variant(name, defaults_of(arch)?));
    done(py, r)
}

/// Writes a generated table (the CLI's `make-table`); returns the shard paths.
#[pyfunction]
#[pyo3(signature = (dir, rows, layers, dim=256, shards=1, seed=1))]
fn make_table(
    py: Python<'_>,
    dir: std::path::PathBuf,
    rows: u64,
    layers: Vec<u32>,
    dim: usize,
    shards: usize,
    seed: u64,
) -> PyRes<Vec<std::path::PathBuf>> {
    let spec = fetchahead::store::make::TableSpec {
        rows,
        layers,
        dim,
        shards,
        seed,
    };
    let r = py.detach(|| fetchahead::store::make::write_table(&dir, &spec, |_| {}));
    done(py, r)
}

/// Forwards queued log records to `logging.getLogger("fetchahead")`.
#[pyfunction]
fn drain_logs(py: Python<'_>) {
    logs::drain(py);
}

/// Log records dropped because the queue was full before Python drained it.
#[pyfunction]
fn dropped_log_records() -> u64 {
    logs::dropped()
}

/// The gather and gather + dequant variants' names, in table order.
fn fetchahead_gpu_names() -> impl Iterator<Item = &'static str> {
    gather::VARIANTS
        .iter()
        .map(|v| v.name)
        .chain(dequant::VARIANTS.iter().map(|v| v.name))
}

/// The kernels of one device (shared with the native torch kernels, `device::on_device`).
#[pyclass(frozen, module = "fetchahead._native")]
struct Device {
    device: Arc<DeviceKernels>,
    kernels: Arc<Kernels>,
}

#[pymethods]
impl Device {
    #[new]
    fn new(py: Python<'_>, ordinal: usize) -> PyRes<Self> {
        let r = device::on_device(ordinal).map(|device| Device {
            kernels: device.kernels.clone(),
            device,
        });
        done(py, r)
    }

    #[getter]
    fn arch(&self) -> &'static str {
        self.kernels.arch()
    }

    /// Why this PTX was loaded: "sm_90 PTX for a 10.0 device: the newest embedded PTX not
    /// newer than the device ...", or "... forced by FETCHAHEAD_PTX_ARCH=sm_80".
    #[getter]
    fn ptx_reason(&self) -> String {
        self.kernels.ptx_choice().to_string()
    }

    /// The kernel variants this PTX lacks (they need a newer arch), with the SM each needs.
    #[getter]
    fn not_held(&self) -> Vec<(&'static str, u32)> {
        fetchahead_gpu_names()
            .filter(|name| !self.kernels.holds(name))
            .map(|name| {
                (
                    name,
                    fetchahead::kernels::ptx::kernel_needs(name).unwrap_or(0),
                )
            })
            .collect()
    }

    #[getter]
    fn name(&self) -> String {
        self.kernels.gpu().name.clone()
    }

    /// Variant `name` of `family` (None: this device's arch's default), resolved once.
    #[pyo3(signature = (family, name=None))]
    fn variant(&self, py: Python<'_>, family: &str, name: Option<&str>) -> PyRes<Variant> {
        let r = Family::named(family).and_then(|f| f.variant(name, self.kernels.defaults()));
        done(py, r)
    }

    #[getter]
    fn l2_bytes(&self) -> u64 {
        self.kernels.gpu().l2_bytes
    }

    /// The device address of a pinned host address (mapped memory, zero-copy).
    fn host_device_address(&self, py: Python<'_>, host: u64) -> PyRes<u64> {
        let r = fetchahead::driver::memory::host_device_address(&self.kernels.gpu().ctx, host)
            .and_then(|mapped| {
                mapped.ok_or_else(|| {
                    fetchahead::Error::invalid(
                        "table",
                        "a CPU tensor that is not pinned (use tensor.pin_memory())",
                    )
                })
            });
        done(py, r)
    }

    /// Launches `variant` on `stream`, either family: rows `table` (`scales`: their E8M0
    /// scales for gather + dequant, 0 for a gather) of `width` (bytes for a gather, elements
    /// for gather + dequant); status 0: the device's scratch status.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        py: Python<'_>,
        variant: &Variant,
        table: u64,
        scales: u64,
        rows: u64,
        width: u32,
        ids: u64,
        n: u64,
        out: u64,
        status: u64,
        stream: usize,
    ) -> PyRes<()> {
        let at = device::Launch {
            table,
            scales,
            rows,
            width,
            ids,
            n,
            out,
            status,
        };
        // SAFETY: the Python layer checked each tensor's device, size, dtype and alignment
        // against these numbers; the tensors outlive the launch in the stream's order.
        let r = unsafe { self.device.launch(variant.0, &at, stream as sys::CUstream) };
        done(py, r)
    }
}

/// Where a prefetcher's rows come from.
#[derive(Clone)]
enum Source {
    Store(Arc<RustRowStore>),
    Memory(Arc<MemoryRows>),
}

/// A row store (see `fetchahead.RowStore`).
#[pyclass(frozen, module = "fetchahead._native")]
struct RowStore {
    store: Arc<RustRowStore>,
}

fn read_path(name: &str) -> fetchahead::Result<ReadPath> {
    name.parse()
}

#[pymethods]
impl RowStore {
    #[new]
    #[pyo3(signature = (path, row_start=None, num_rows=None, read_path=None, cache_bytes=None,
        resident_scales=None, preadv_threads=None, uring_depth=None, direct_io=None,
        lookahead=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: std::path::PathBuf,
        row_start: Option<u64>,
        num_rows: Option<u64>,
        read_path: Option<String>,
        cache_bytes: Option<u64>,
        resident_scales: Option<bool>,
        preadv_threads: Option<u64>,
        uring_depth: Option<u64>,
        direct_io: Option<bool>,
        lookahead: Option<bool>,
    ) -> PyRes<Self> {
        // An explicit argument wins over its variable, which is then not even parsed.
        let explicit: Vec<&str> = [
            (read_path.is_some(), "FETCHAHEAD_READ_PATH"),
            (cache_bytes.is_some(), "FETCHAHEAD_CACHE_BYTES"),
            (uring_depth.is_some(), "FETCHAHEAD_URING_DEPTH"),
            (preadv_threads.is_some(), "FETCHAHEAD_PREADV_THREADS"),
            (direct_io.is_some(), "FETCHAHEAD_DIRECT_IO"),
        ]
        .into_iter()
        .filter_map(|(given, name)| given.then_some(name))
        .collect();
        let r = py.detach(|| {
            let mut o = StoreOptions::from_env_except(&explicit)?;
            if let Some(v) = lookahead {
                o.lookahead = v;
            }
            if let Some(v) = row_start {
                o.row_start = v;
            }
            if num_rows.is_some() {
                o.num_rows = num_rows;
            }
            if let Some(v) = read_path {
                o.read_path = self::read_path(&v)?;
            }
            if let Some(v) = cache_bytes {
                o.cache_bytes = v;
            }
            if let Some(v) = resident_scales {
                o.resident_scales = v;
            }
            // Checked against the store's own bounds before narrowing, so that 2^32 is refused
            // as too many, never wrapped.
            if let Some(v) = preadv_threads {
                o.preadv_threads = PREADV_THREADS.check(PREADV_THREADS.field, v)? as usize;
            }
            if let Some(v) = uring_depth {
                o.uring_depth = URING_DEPTH.check(URING_DEPTH.field, v)? as u32;
            }
            if let Some(v) = direct_io {
                o.direct_io = v;
            }
            RustRowStore::open(&path, o)
        });
        let store = done(py, r)?;
        Ok(RowStore {
            store: Arc::new(store),
        })
    }

    #[getter]
    fn dim(&self) -> usize {
        self.store.dim()
    }

    #[getter]
    fn layers(&self) -> Vec<u32> {
        self.store.layers().to_vec()
    }

    #[getter]
    fn row_range(&self) -> (u64, u64) {
        let r = self.store.row_range();
        (r.start, r.end)
    }

    #[getter]
    fn read_path(&self) -> &'static str {
        self.store.read_path().name()
    }

    /// Why O_DIRECT is off, or None when it is on.
    #[getter]
    fn direct_io_off(&self) -> Option<String> {
        self.store.direct_io().err().map(str::to_string)
    }

    /// Why io_uring is unavailable, or None.
    #[getter]
    fn uring_off(&self) -> Option<String> {
        self.store.uring().err().map(str::to_string)
    }

    /// The path `auto` takes for a batch of `n` rows.
    fn auto_path(&self, n: usize) -> &'static str {
        self.store.auto_path(n).name()
    }

    /// Lookup into caller buffers (`n` int64 ids at `ids`, `n * dim` bytes at `weights`,
    /// `n * dim / 32` at `scales`), without the GIL.
    #[pyo3(signature = (layer, ids, n, weights, scales, path=None))]
    #[allow(clippy::too_many_arguments)]
    fn lookup_into(
        &self,
        py: Python<'_>,
        layer: u32,
        ids: usize,
        n: usize,
        weights: usize,
        scales: usize,
        path: Option<String>,
    ) -> PyRes<()> {
        let dim = self.store.dim();
        let store = self.store.clone();
        let r = py.detach(move || {
            let path = path.as_deref().map(read_path).transpose()?;
            if n == 0 {
                return Ok(());
            }
            // SAFETY: the Python layer passes C-contiguous buffers of these sizes that it keeps
            // alive (and unaliased) for the call.
            let (ids, w, s) = unsafe {
                (
                    std::slice::from_raw_parts(ids as *const i64, n),
                    std::slice::from_raw_parts_mut(weights as *mut u8, n * dim),
                    std::slice::from_raw_parts_mut(scales as *mut u8, n * dim / 32),
                )
            };
            match path {
                Some(p) => store.lookup_with(p, layer, ids, w, s),
                None => store.lookup(layer, ids, w, s),
            }
        });
        done(py, r)
    }

    /// Starts warming `n` ids at `ids` and returns at once.
    fn advise(&self, py: Python<'_>, layer: u32, ids: usize, n: usize) -> PyRes<()> {
        let ids: &[i64] = if n == 0 {
            &[]
        } else {
            // SAFETY: as for `lookup_into`; the store copies the ids before returning.
            unsafe { std::slice::from_raw_parts(ids as *const i64, n) }
        };
        let r = self.store.advise(layer, ids);
        done(py, r)
    }

    /// Waits (without the GIL) until the advise thread has read every batch sent to it.
    fn wait_advised(&self, py: Python<'_>) {
        py.detach(|| self.store.wait_advised());
        logs::drain(py);
    }

    /// Hands the cache `n` ids at `ids` that the lookup `steps_ahead` lookups from now asks
    /// for (read ahead when it is near); returns how many were noted.
    fn advise_future(
        &self,
        py: Python<'_>,
        layer: u32,
        ids: usize,
        n: usize,
        steps_ahead: u32,
    ) -> PyRes<usize> {
        let ids: &[i64] = if n == 0 {
            &[]
        } else {
            // SAFETY: as for `lookup_into`: `ids` points at `n` live int64 ids the caller keeps
            // alive for the call; the store reads them before returning.
            unsafe { std::slice::from_raw_parts(ids as *const i64, n) }
        };
        let r = self.store.advise_future(layer, ids, steps_ahead);
        done(py, r)
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyRes<Bound<'py, PyDict>> {
        let s = self.store.stats();
        let (cached_rows, cached_bytes) = self.store.cached();
        let d = PyDict::new(py);
        d.set_item("hits", s.hits)?;
        d.set_item("misses", s.misses)?;
        d.set_item("reads", s.reads)?;
        d.set_item("bytes", s.bytes)?;
        d.set_item("advised", s.advised)?;
        d.set_item("advise_dropped", s.advise_dropped)?;
        d.set_item("advise_failed", s.advise_failed)?;
        d.set_item("cached_rows", cached_rows)?;
        d.set_item("cached_bytes", cached_bytes)?;
        d.set_item("read_path", self.store.read_path().name())?;
        d.set_item("direct_io", self.store.direct_io().is_ok())?;
        d.set_item("uring", self.store.uring().is_ok())?;
        logs::drain(py);
        Ok(d)
    }

    /// The table's path, made absolute when the store opened.
    #[getter]
    fn path(&self) -> std::path::PathBuf {
        self.store.path().to_path_buf()
    }

    /// Measures each read path (cold batches) and writes `auto`'s choice beside the table (the
    /// path resolved when the store opened, whatever the working directory is now), having
    /// checked first that it can. Returns `[(max_batch, path), ...]`; a reopened store uses it.
    fn tune(&self, py: Python<'_>, seed: u64, force: bool) -> PyRes<Vec<(u64, String)>> {
        use fetchahead::store::tune::{Tuning, measure, tune_file};
        let store = self.store.clone();
        let r = py.detach(move || {
            let file = tune_file(store.path());
            Tuning::check_can_save(&file, force)?;
            let layer = store.layers().first().copied().unwrap_or(0);
            let tuning = measure(&store, layer, seed, |_| {})?;
            tuning.save_with(&file, force)?;
            Ok(tuning
                .ranges
                .iter()
                .map(|r| (r.max_batch, r.path.name().to_string()))
                .collect())
        });
        done(py, r)
    }

    /// Drops the table's pages from the page cache.
    fn evict_page_cache(&self, py: Python<'_>) -> PyRes<()> {
        let r = self.store.evict_page_cache();
        done(py, r)
    }
}

/// A generated in-memory table with fault injection (tests and examples).
#[pyclass(frozen, module = "fetchahead._native")]
struct MemoryTable {
    rows: Arc<MemoryRows>,
}

#[pymethods]
impl MemoryTable {
    #[new]
    fn new(py: Python<'_>, rows: u64, dim: usize, seed: u64) -> PyRes<Self> {
        let r = py.detach(|| MemoryRows::generate(rows, dim, seed));
        Ok(MemoryTable {
            rows: Arc::new(done(py, r)?),
        })
    }

    #[getter]
    fn rows(&self) -> u64 {
        self.rows.rows()
    }

    #[getter]
    fn dim(&self) -> usize {
        self.rows.dim()
    }

    /// `(weights, scales)` as bytes.
    fn bytes<'py>(
        &self,
        py: Python<'py>,
    ) -> (
        Bound<'py, pyo3::types::PyBytes>,
        Bound<'py, pyo3::types::PyBytes>,
    ) {
        (
            pyo3::types::PyBytes::new(py, self.rows.weights()),
            pyo3::types::PyBytes::new(py, self.rows.scales()),
        )
    }

    /// Faults: `fail_on_id` (-1 disarms), `fail_next`, `corrupt_next` (lookups),
    /// `latency_us`, `none`.
    fn inject(&self, py: Python<'_>, fault: &str, arg: i64) -> PyRes<()> {
        let n = u32::try_from(arg.max(0)).unwrap_or(u32::MAX);
        let m = &self.rows;
        let r = match fault {
            "none" => {
                m.fail_on_id(None);
                m.fail_next(0);
                m.corrupt_next(0);
                m.set_latency(std::time::Duration::ZERO);
                Ok(())
            }
            "fail_on_id" => {
                m.fail_on_id((arg >= 0).then_some(arg));
                Ok(())
            }
            "fail_next" => {
                m.fail_next(n);
                Ok(())
            }
            "corrupt_next" => {
                m.corrupt_next(n);
                Ok(())
            }
            "latency_us" => {
                m.set_latency(std::time::Duration::from_micros(n as u64));
                Ok(())
            }
            other => Err(fetchahead::Error::Invalid {
                what: "fault",
                why: format!(
                    "`{other}`; want none, fail_on_id, fail_next, corrupt_next or latency_us"
                ),
            }),
        };
        done(py, r)
    }
}

/// A lookup thread shared by flag-mode prefetchers.
#[pyclass(frozen, module = "fetchahead._native")]
struct FlagLane {
    lane: Arc<RustFlagLane>,
}

#[pymethods]
impl FlagLane {
    #[new]
    fn new(py: Python<'_>) -> PyRes<Self> {
        let r = RustFlagLane::start("fetchahead-lane".into());
        Ok(FlagLane { lane: done(py, r)? })
    }
}

/// One Engram layer's side-stream prefetcher.
#[pyclass(frozen, module = "fetchahead._native")]
struct Prefetcher {
    /// Shared with the native prefetcher ops (`torch_abi::prefetch`).
    inner: Arc<Mutex<RustPrefetcher>>,
    dim: usize,
    capacity: usize,
}

#[pymethods]
impl Prefetcher {
    #[new]
    #[pyo3(signature = (device, source, layer, capacity, variant, check, fallback_on_error,
        completion, check_log_ms, lane=None, rank=0, join="tags"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        device: &Device,
        source: &Bound<'_, PyAny>,
        layer: u32,
        capacity: usize,
        variant: &Variant,
        check: bool,
        fallback_on_error: bool,
        completion: &str,
        check_log_ms: u64,
        lane: Option<&FlagLane>,
        rank: u32,
        join: &str,
    ) -> PyRes<Self> {
        let source = if let Ok(s) = source.cast::<RowStore>() {
            Source::Store(s.get().store.clone())
        } else if let Ok(m) = source.cast::<MemoryTable>() {
            Source::Memory(m.get().rows.clone())
        } else {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "source must be a fetchahead.RowStore or a fetchahead.MemoryTable",
            ));
        };
        let Variant(Handle::Dequant(pick)) = *variant else {
            return done(
                py,
                Err(fetchahead::Error::invalid(
                    "variant",
                    format!(
                        "`{}` is a gather variant; a prefetcher gathers with a gather_dequant one",
                        variant.name()
                    ),
                )),
            );
        };
        let kernels = device.kernels.clone();
        let lane = lane.map(|l| l.lane.clone());
        let completion = completion.to_string();
        let join = join.to_string();
        let r = py.detach(move || {
            let store: Arc<dyn RowLookup> = match source {
                Source::Store(s) => Arc::new(LayerRows::new(s, layer)?),
                Source::Memory(m) => m,
            };
            let completion = match completion.as_str() {
                "flag" => Completion::Flag,
                "host_function" => Completion::HostFunction,
                other => {
                    return Err(fetchahead::Error::Invalid {
                        what: "completion",
                        why: format!("`{other}`; want flag or host_function"),
                    });
                }
            };
            let join = match join.as_str() {
                "tags" => Join::Tags,
                "at_gather" => Join::AtGather,
                other => {
                    return Err(fetchahead::Error::Invalid {
                        what: "join",
                        why: format!("`{other}`; want tags or at_gather"),
                    });
                }
            };
            let defaults = PrefetcherConfig::default();
            let config = PrefetcherConfig {
                capacity,
                variant: match pick {
                    Pick::Named(v) => Some(v),
                    Pick::BySize(_) => None,
                },
                check,
                fallback_on_error,
                completion,
                join,
                check_log_every: if check_log_ms == 0 {
                    defaults.check_log_every
                } else {
                    std::time::Duration::from_millis(check_log_ms)
                },
                ..defaults
            };
            let mut p = match lane {
                Some(lane) => RustPrefetcher::in_lane(kernels, store, config, &lane, rank)?,
                None => RustPrefetcher::new(kernels, store, config)?,
            };
            p.warm()?;
            Ok(p)
        });
        let p = done(py, r)?;
        Ok(Prefetcher {
            dim: p.dim(),
            capacity: p.capacity(),
            inner: Arc::new(Mutex::new(p)),
        })
    }

    #[getter]
    fn dim(&self) -> usize {
        self.dim
    }

    #[getter]
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn prefetch(&self, py: Python<'_>, ids: u64, n: usize, stream: usize) -> PyRes<()> {
        // SAFETY: the Python layer checked that `ids` holds `n` int64 on this device; the
        // tensor is kept alive until the gather (the op's contract).
        let r = unsafe { lock(&self.inner).prefetch(ids, n, stream as sys::CUstream) };
        done(py, r)
    }

    fn gather_dequant(&self, py: Python<'_>, out: u64, stream: usize) -> PyRes<()> {
        // SAFETY: the Python layer checked `out`'s size, dtype, device and alignment.
        let r = unsafe { lock(&self.inner).gather_dequant(out, stream as sys::CUstream) };
        done(py, r)
    }

    fn gather_dequant_sync(
        &self,
        py: Python<'_>,
        ids: u64,
        n: usize,
        out: u64,
        stream: usize,
    ) -> PyRes<()> {
        // SAFETY: as for `prefetch` and `gather_dequant`.
        let r =
            unsafe { lock(&self.inner).gather_dequant_sync(ids, n, out, stream as sys::CUstream) };
        done(py, r)
    }

    /// Tagged gathers: `stream` joins the side stream's work of the last prefetch.
    fn finish(&self, py: Python<'_>, stream: usize) -> PyRes<()> {
        // SAFETY: `stream` is the caller's current stream of this device, the gathers' stream.
        let r = unsafe { lock(&self.inner).finish(stream as sys::CUstream) };
        done(py, r)
    }

    /// Tagged gathers: rows given up on after the tag timeout since the last call (waits).
    fn late_rows(&self, py: Python<'_>) -> PyRes<u32> {
        let r = py.detach(|| lock(&self.inner).late_rows());
        done(py, r)
    }

    /// `[(message, ids), ...]`, oldest first.
    fn take_errors(&self, py: Python<'_>) -> Vec<(String, Vec<i64>)> {
        let failures = lock(&self.inner).take_errors();
        logs::drain(py);
        failures.into_iter().map(|f| (f.message, f.ids)).collect()
    }

    fn resume(&self, py: Python<'_>) {
        lock(&self.inner).resume();
        logs::drain(py);
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyRes<Bound<'py, PyDict>> {
        let s = lock(&self.inner).stats();
        let d = PyDict::new(py);
        d.set_item("prefetches", s.prefetches)?;
        d.set_item("gathers", s.gathers)?;
        d.set_item("sync_gathers", s.sync_gathers)?;
        d.set_item("lookups", s.lookups)?;
        d.set_item("rows_looked_up", s.rows_looked_up)?;
        d.set_item("lookup_ns", s.lookup_ns)?;
        d.set_item("lookup_errors", s.lookup_errors)?;
        d.set_item("check_logs", s.check_logs)?;
        d.set_item("fell_back", s.fell_back)?;
        logs::drain(py);
        Ok(d)
    }

    /// Waits for the device; the count of differing gathers, None with check mode off.
    fn check_differed(&self, py: Python<'_>) -> PyRes<Option<u32>> {
        let r = py.detach(|| lock(&self.inner).check_differed());
        done(py, r)
    }

    /// Never waits: a count that has arrived, else None; enqueues the next on `stream`.
    fn poll_check(&self, py: Python<'_>, stream: usize) -> PyRes<Option<u32>> {
        // SAFETY: `stream` is the caller's current stream of this device.
        let r = unsafe { lock(&self.inner).poll_check(stream as sys::CUstream) };
        done(py, r)
    }
}

/// The learned L2 plan on one device.
#[pyclass(frozen, module = "fetchahead._native")]
struct L2Plan {
    inner: Mutex<RustL2Plan>,
    kernels: Arc<Kernels>,
    /// Segment tables returned by captured forwards: kept as long as the plan.
    captured: Mutex<Vec<Arc<SegmentTable>>>,
}

/// The device segment tables a captured forward's graph reads: keep this object beside the
/// graph when the graph may outlive the plan.
#[pyclass(frozen, module = "fetchahead._native")]
struct CapturedTables {
    _tables: Arc<SegmentTable>,
}

/// Wraps a framework's stream handle for the plan.
fn borrowed(kernels: &Kernels, stream: usize) -> Arc<cudarc::driver::CudaStream> {
    // SAFETY: `stream` is a live stream of this device's primary context (the framework's
    // current stream); the wrapper never destroys it, and the framework keeps its streams for
    // the process's life (torch's stream pool).
    unsafe {
        kernels
            .gpu()
            .ctx
            .wrap_borrowed_stream(stream as sys::CUstream)
    }
}

#[pymethods]
impl L2Plan {
    #[new]
    #[pyo3(signature = (device, stream, budget_per_window=None, replay=None))]
    fn new(
        py: Python<'_>,
        device: &Device,
        stream: usize,
        budget_per_window: Option<u64>,
        replay: Option<&str>,
    ) -> PyRes<Self> {
        let kernels = device.kernels.clone();
        // The device's defaults and the FETCHAHEAD_L2_* settings; the arguments win.
        let mut config = done(py, PlanConfig::from_env(kernels.gpu().l2_bytes))?;
        if let Some(b) = budget_per_window {
            config.budget_per_window = b;
        }
        if let Some(name) = replay {
            config.replay = done(py, Replay::named(name))?;
        }
        let main = borrowed(&kernels, stream);
        let r = RustL2Plan::new(kernels.clone(), main, config);
        Ok(L2Plan {
            inner: Mutex::new(done(py, r)?),
            kernels,
            captured: Mutex::new(Vec::new()),
        })
    }

    fn begin_forward(&self, py: Python<'_>, signature: u64, stream: usize) -> PyRes<()> {
        let main = borrowed(&self.kernels, stream);
        let r = (|| {
            let mut plan = lock(&self.inner);
            plan.set_main_stream(main)?;
            plan.begin_forward(Signature(signature))
        })();
        done(py, r)
    }

    /// `kind`: 0 all-reduce (the default), 1 all-gather, 2 other.
    #[pyo3(signature = (kind=0))]
    fn collective(&self, py: Python<'_>, kind: u32) -> PyRes<()> {
        let r = CollectiveKind::from_code(kind).and_then(|k| lock(&self.inner).collective_of(k));
        done(py, r)
    }

    fn set_all_gather(&self, enabled: bool) {
        lock(&self.inner).set_all_gather(enabled);
    }

    fn set_host_pace(&self, enabled: bool) {
        lock(&self.inner).set_host_pace(enabled);
    }

    fn consume(&self, py: Python<'_>, address: u64, bytes: u64) -> PyRes<()> {
        let r = lock(&self.inner).consume(address, bytes);
        done(py, r)
    }

    /// `{"signature", "collectives", "captured", "learned", "new_signature"}`.
    fn end_forward<'py>(&self, py: Python<'py>) -> PyRes<Bound<'py, PyDict>> {
        let r = lock(&self.inner).end_forward();
        let outcome = done(py, r)?;
        let d = PyDict::new(py);
        if let Some(t) = outcome.tables {
            lock(&self.captured).push(t.clone());
            d.set_item("tables", CapturedTables { _tables: t })?;
        }
        let s = outcome.summary;
        d.set_item("signature", s.signature.0)?;
        d.set_item("collectives", s.collectives)?;
        d.set_item("captured", s.captured)?;
        d.set_item("learned", format!("{:?}", s.learned).to_lowercase())?;
        d.set_item("new_signature", s.new_signature)?;
        Ok(d)
    }

    fn set_budget(&self, py: Python<'_>, budget_per_window: u64) -> PyRes<()> {
        let r = lock(&self.inner).set_budget(budget_per_window);
        done(py, r)
    }

    fn counters<'py>(&self, py: Python<'py>) -> PyRes<Bound<'py, PyDict>> {
        let c = lock(&self.inner).counters();
        let d = PyDict::new(py);
        d.set_item("windows_prefetched", c.windows_prefetched)?;
        d.set_item("bytes_prefetched", c.bytes_prefetched)?;
        d.set_item("forwards_without_plan", c.forwards_without_plan)?;
        d.set_item("mismatches_at_capture", c.mismatches_at_capture)?;
        d.set_item("forwards", c.forwards)?;
        d.set_item("signatures", c.signatures)?;
        d.set_item("windows_host_bound", c.windows_host_bound)?;
        logs::drain(py);
        Ok(d)
    }
}

/// Every `FETCHAHEAD_*` store setting: `[(name, meaning), ...]`.
#[pyfunction]
fn env_settings(py: Python<'_>) -> PyRes<Bound<'_, PyList>> {
    PyList::new(py, fetchahead::store::ENV_SETTINGS)
}

/// Whether the CUDA driver library can be loaded here.
#[pyfunction]
fn driver_present() -> bool {
    fetchahead::driver::culib_present()
}

/// Raises `NoDeviceError` unless CUDA device `ordinal` exists; returns the device count. Creates
/// no context (the Python constructors call it before torch touches a device).
#[pyfunction]
fn require_device(py: Python<'_>, ordinal: usize) -> PyRes<usize> {
    done(py, fetchahead::Gpu::check_present(ordinal))
}

/// The prefetcher defaults as Rust states them: `{"rust": {...}}`, `{"completion", "join",
/// "capacity", "check", "fallback_on_error"}` in Python's spelling (the test that Python's and
/// Rust's agree reads it; C's is checked against Rust's by `tests/ffi_l2_plan.rs`, the demo's
/// by the lab's tests).
#[pyfunction]
fn default_prefetcher_config(py: Python<'_>) -> PyRes<Bound<'_, PyDict>> {
    let entry = |completion: Completion, join: Join| {
        let r = PrefetcherConfig::default();
        let d = PyDict::new(py);
        d.set_item(
            "completion",
            match completion {
                Completion::Flag => "flag",
                Completion::HostFunction => "host_function",
            },
        )?;
        d.set_item(
            "join",
            match join {
                Join::Tags => "tags",
                Join::AtGather => "at_gather",
            },
        )?;
        d.set_item("capacity", r.capacity)?;
        d.set_item("check", r.check)?;
        d.set_item("fallback_on_error", r.fallback_on_error)?;
        PyRes::Ok(d)
    };
    let r = PrefetcherConfig::default();
    let d = PyDict::new(py);
    d.set_item("rust", entry(r.completion, r.join)?)?;
    Ok(d)
}

/// `fetchahead info`'s report as JSON: build, device and the PTX it loads, default variants,
/// read paths, settings in effect; and its text.
#[pyfunction]
fn config_report(py: Python<'_>) -> (String, String) {
    let report = py.detach(fetchahead::info::report);
    logs::drain(py);
    (report.to_string(), fetchahead::info::render(&report))
}

/// The NVTX ranges' state: "off", "on (library)" or "unavailable: why".
#[pyfunction]
fn nvtx_state() -> String {
    match fetchahead::nvtx::state() {
        fetchahead::nvtx::State::Off => "off".into(),
        fetchahead::nvtx::State::On(lib) => format!("on ({lib})"),
        fetchahead::nvtx::State::Unavailable(why) => format!("unavailable: {why}"),
    }
}

/// Every error kind's Python class, from the crate's one `ErrorKind` list (C's status codes are
/// made from the same kinds, `fetchahead::ffi`).
#[pyfunction]
fn error_kinds() -> Vec<&'static str> {
    fetchahead::error::ErrorKind::ALL
        .iter()
        .map(|k| errors::class_of(*k))
        .collect()
}

/// Raises the exception of one example error of kind `kind` (tests of the mapping).
#[pyfunction]
fn _raise_example(py: Python<'_>, kind: &str) -> PyRes<()> {
    done(py, Err(errors::example(kind)))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyRes<()> {
    logs::install();
    fetchahead::settings::warn_unknown_env();
    m.add_function(wrap_pyfunction!(variants, m)?)?;
    m.add_function(wrap_pyfunction!(variant, m)?)?;
    m.add_function(wrap_pyfunction!(make_table, m)?)?;
    m.add_function(wrap_pyfunction!(drain_logs, m)?)?;
    m.add_function(wrap_pyfunction!(dropped_log_records, m)?)?;
    m.add_function(wrap_pyfunction!(env_settings, m)?)?;
    m.add_function(wrap_pyfunction!(_raise_example, m)?)?;
    m.add_function(wrap_pyfunction!(driver_present, m)?)?;
    m.add_function(wrap_pyfunction!(require_device, m)?)?;
    m.add_function(wrap_pyfunction!(error_kinds, m)?)?;
    m.add_function(wrap_pyfunction!(default_prefetcher_config, m)?)?;
    m.add_function(wrap_pyfunction!(config_report, m)?)?;
    m.add_function(wrap_pyfunction!(nvtx_state, m)?)?;
    m.add_function(wrap_pyfunction!(logs::_log_example, m)?)?;
    m.add_class::<Device>()?;
    m.add_class::<Variant>()?;
    m.add_class::<RowStore>()?;
    m.add_class::<MemoryTable>()?;
    m.add_class::<FlagLane>()?;
    m.add_class::<Prefetcher>()?;
    m.add_class::<L2Plan>()?;
    m.add_class::<CapturedTables>()?;
    torch_abi::add_to(m)?;
    trace::add_to(m)?;
    m.add("__version__", fetchahead::info::VERSION)?;
    m.add("__git_commit__", fetchahead::info::GIT_COMMIT)?;
    Ok(())
}
