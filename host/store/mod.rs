//! The NVMe row store for Engram tables: rows of FP8-E4M3 weights and E8M0 scales read from
//! safetensors shards, every read of a batch in flight at once, hot rows held in DRAM.
//!
//! - [`layout`]: finding and checking each layer's tensors in the shards.
//! - [`ReadPath`]: io_uring O_DIRECT batches, a preadv thread pool, mmap + WILLNEED, buffered.
//! - [`tune`]: `Auto`'s measured choice of path by batch size.
//! - [`make`]: writing generated tables; [`measure`]: timing lookups and raw reads.
//! - [`belady`], [`zipf`]: the optimum the row cache is measured against, and the workload.
//! - [`sketch`]: the TinyLFU frequency sketch the row cache admits and evicts by.
//! - [`trace`]: real lookup traces (`.u64`, `.u64.xz`) and their scheduler steps, as batches;
//!   [`policies`]: LRU, ARC, W-TinyLFU and exact LFU replayed on them, the row cache's peers.
//! - [`LayerRows`]: one layer of a store as a [`RowLookup`](crate::row_lookup::RowLookup).
//!
//! The guide below (this folder's `README.md`) shows it in use.
#![doc = include_str!("README.md")]
use std::fmt;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use memmap2::{Advice, Mmap, UncheckedAdvice};

use crate::error::RowIds;
use crate::{Error, Result};

mod advise;
pub mod ahead;
mod aligned;
pub mod belady;
mod cache;
mod dio;
mod fault;
pub(crate) mod file;
mod layer_rows;
pub mod layout;
pub mod make;
pub mod measure;
mod mmap;
mod plan;
pub mod policies;
mod preadv;
mod prefetch;
pub mod requests;
pub mod sketch;
pub mod trace;
pub mod tune;
mod uring;
pub mod zipf;

use aligned::AlignedBuf;
use cache::RowCache;
use fault::FaultState;
#[doc(hidden)]
pub use fault::ReadFault;
pub use layer_rows::LayerRows;
use layout::{MX_BLOCK, TableLayout};
use plan::{Kind, MAX_EXTENT, OutRows, Plan};
pub use tune::Tuning;
pub use uring::{QUEUE_DEPTH, RingFeatures};

/// Idle io_uring rings a store keeps (one per thread that looked rows up through io_uring).
const MAX_IDLE_RINGS: usize = 64;
/// Ids ahead whose resident scales a lookup prefetches while copying the current one's.
const SCALES_AHEAD: usize = 8;
/// Reads per ring below which a batch stays on one ring.
const MULTI_RING_MIN: usize = 8192;
/// A shard's size and mtime are checked at most this often (an fstat costs 0.3-1.6 us, a
/// tenth of a small page-cache batch), by the first batch that reads it after the interval.
const SHARD_CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(1);

/// How a lookup reads the rows that miss the DRAM cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReadPath {
    /// Chosen by batch size from `fetchahead tune`'s figures (io_uring when never tuned); never
    /// mmap, so that the default cannot raise SIGBUS.
    Auto,
    /// io_uring batches of O_DIRECT reads, up to [`StoreOptions::uring_depth`] in flight.
    Uring,
    /// A pool of threads each issuing blocking `preadv` (O_DIRECT when available).
    Preadv,
    /// mmap (MADV_RANDOM), `posix_fadvise(WILLNEED)` for the whole batch, then one copy. Only
    /// when asked for by name (`Auto` never takes it): a shard truncated while a lookup copies
    /// out of the mapping raises SIGBUS, which kills the process.
    Mmap,
    /// One buffered `pread` after another.
    Buffered,
}

impl ReadPath {
    /// Every concrete path.
    pub const ALL: [ReadPath; 4] = [
        ReadPath::Uring,
        ReadPath::Preadv,
        ReadPath::Mmap,
        ReadPath::Buffered,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ReadPath::Auto => "auto",
            ReadPath::Uring => "uring",
            ReadPath::Preadv => "preadv",
            ReadPath::Mmap => "mmap",
            ReadPath::Buffered => "buffered",
        }
    }
}

impl fmt::Display for ReadPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReadPath {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        [
            ReadPath::Auto,
            ReadPath::Uring,
            ReadPath::Preadv,
            ReadPath::Mmap,
            ReadPath::Buffered,
        ]
        .into_iter()
        .find(|p| p.name() == s)
        .ok_or_else(|| {
            Error::invalid(
                "read path",
                format!("`{s}`; want auto, uring, preadv, mmap or buffered"),
            )
        })
    }
}

/// How to open a store. Every way an option arrives (a field here, a Python keyword, a
/// `FETCHAHEAD_*` variable, a CLI flag) goes through [`StoreOptions::validate`] when the store
/// opens, with the bounds of [`OPTION_BOUNDS`].
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// First row this rank owns.
    pub row_start: u64,
    /// Rows this rank owns; `None` or `Some(0)`: to the end of the table (0 means the same in
    /// every entry point: the C ABI's `num_rows` and Python's `num_rows=0`).
    pub num_rows: Option<u64>,
    pub read_path: ReadPath,
    /// DRAM row cache budget; 0 turns the cache off.
    pub cache_bytes: u64,
    /// Hold the owned rows' scales in DRAM, so that a cold row costs one read.
    pub resident_scales: bool,
    /// Threads of the preadv pool (its queue depth), 1 to 1024.
    pub preadv_threads: usize,
    /// Reads in flight per io_uring ring (rounded up to a power of two), 1 to 4096.
    pub uring_depth: u32,
    /// Rings (each on its own thread) a large io_uring batch is spread over, at most one per
    /// 8192 reads; 1 keeps every batch on the calling thread's ring. 1 to 64.
    pub uring_rings: usize,
    /// Use O_DIRECT where the filesystem allows it.
    pub direct_io: bool,
    /// Keep room in the row cache (charged to `cache_bytes`: 16 bytes a row or less) for the
    /// future references [`RowStore::advise_future`] hands it; without it, `advise_future`
    /// marks nothing.
    pub lookahead: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            row_start: 0,
            num_rows: None,
            read_path: ReadPath::Auto,
            cache_bytes: 0,
            resident_scales: true,
            preadv_threads: 64,
            uring_depth: QUEUE_DEPTH,
            uring_rings: 1,
            direct_io: true,
            lookahead: false,
        }
    }
}

/// The bounds of one numeric option of [`StoreOptions`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionBounds {
    /// The field (and Python keyword).
    pub field: &'static str,
    /// The `FETCHAHEAD_*` variable that sets it, if any.
    pub env: Option<&'static str>,
    pub min: u64,
    pub max: u64,
}

impl OptionBounds {
    /// `value` when it is within the bounds, else an error naming the option as `what` (the
    /// field, the variable or the flag the value came from).
    pub fn check(&self, what: &'static str, value: u64) -> Result<u64> {
        if (self.min..=self.max).contains(&value) {
            Ok(value)
        } else {
            Err(Error::invalid(
                what,
                format!("{value}; want {} to {}", self.min, self.max),
            ))
        }
    }

    /// [`check`](Self::check) of a text value (a variable or a flag).
    pub fn parse(&self, what: &'static str, value: &str) -> Result<u64> {
        let v = value.trim().parse::<u64>().map_err(|_| {
            Error::invalid(
                what,
                format!("`{value}`; want a number from {} to {}", self.min, self.max),
            )
        })?;
        self.check(what, v)
    }
}

/// `preadv_threads`: more threads than this only thrash (10000 took a minute to start).
pub const PREADV_THREADS: OptionBounds = OptionBounds {
    field: "preadv_threads",
    env: Some("FETCHAHEAD_PREADV_THREADS"),
    min: 1,
    max: 1024,
};
/// `uring_depth`: reads in flight per ring.
pub const URING_DEPTH: OptionBounds = OptionBounds {
    field: "uring_depth",
    env: Some("FETCHAHEAD_URING_DEPTH"),
    min: 1,
    max: 4096,
};
/// `uring_rings`: threads a large io_uring batch is spread over.
pub const URING_RINGS: OptionBounds = OptionBounds {
    field: "uring_rings",
    env: None,
    min: 1,
    max: 64,
};
/// Every numeric option's bounds, the one table every entry point checks against.
pub const OPTION_BOUNDS: [OptionBounds; 3] = [PREADV_THREADS, URING_DEPTH, URING_RINGS];

/// The variables [`StoreOptions::from_env`] reads, each overriding one default.
pub const ENV_SETTINGS: [(&str, &str); 5] = [
    (
        "FETCHAHEAD_READ_PATH",
        "read_path: auto, uring, preadv, mmap or buffered",
    ),
    (
        "FETCHAHEAD_CACHE_BYTES",
        "cache_bytes: bytes, or with a K, M or G suffix (powers of 1024)",
    ),
    (
        "FETCHAHEAD_URING_DEPTH",
        "uring_depth: reads in flight per io_uring lookup, 1 to 4096",
    ),
    (
        "FETCHAHEAD_PREADV_THREADS",
        "preadv_threads: threads of the preadv pool, 1 to 1024",
    ),
    ("FETCHAHEAD_DIRECT_IO", "direct_io: 1 or 0"),
];

impl StoreOptions {
    /// The defaults, with each `FETCHAHEAD_*` variable of [`ENV_SETTINGS`] that is set replacing
    /// its field; set fields on the result to override the environment. A malformed value is an
    /// error naming the variable.
    pub fn from_env() -> Result<StoreOptions> {
        StoreOptions::from_env_except(&[])
    }

    /// [`StoreOptions::from_env`] without reading the variables named in `explicit` (those of
    /// options the caller passes itself: an explicit argument wins, and the variable is not
    /// even parsed).
    pub fn from_env_except(explicit: &[&str]) -> Result<StoreOptions> {
        StoreOptions::from_vars(|name| {
            (!explicit.contains(&name))
                .then(|| std::env::var(name).ok())
                .flatten()
        })
    }

    /// [`StoreOptions::from_env`] with the variables read through `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<StoreOptions> {
        let mut options = StoreOptions::default();
        let bad = |name: &'static str, value: &str, want: &str| {
            Error::invalid(name, format!("`{value}`; want {want}"))
        };
        let [read_path, cache, depth, threads, direct] = ENV_SETTINGS.map(|(name, _)| name);
        if let Some(v) = var(read_path) {
            options.read_path = v
                .trim()
                .parse()
                .map_err(|_| bad(read_path, &v, "auto, uring, preadv, mmap or buffered"))?;
        }
        if let Some(v) = var(cache) {
            options.cache_bytes =
                parse_bytes(&v).ok_or_else(|| bad(cache, &v, "bytes, e.g. 1073741824 or 1G"))?;
            // Checked here too, so that a refusal names the variable the budget came from.
            check_cache_budget(options.cache_bytes, &format!("{cache}={}", v.trim()))?;
        }
        if let Some(v) = var(depth) {
            options.uring_depth = URING_DEPTH.parse(depth, &v)? as u32;
        }
        if let Some(v) = var(threads) {
            options.preadv_threads = PREADV_THREADS.parse(threads, &v)? as usize;
        }
        if let Some(v) = var(direct) {
            options.direct_io = match v.trim() {
                "1" | "true" | "on" => true,
                "0" | "false" | "off" => false,
                _ => return Err(bad(direct, &v, "1 or 0")),
            };
        }
        Ok(options)
    }

    /// Checks every option against its bounds ([`OPTION_BOUNDS`]; the cache budget against the
    /// memory there is); an error names the option. [`RowStore::open`] calls it.
    pub fn validate(&self) -> Result<()> {
        PREADV_THREADS.check(PREADV_THREADS.field, self.preadv_threads as u64)?;
        URING_DEPTH.check(URING_DEPTH.field, u64::from(self.uring_depth))?;
        URING_RINGS.check(URING_RINGS.field, self.uring_rings as u64)?;
        check_cache_budget(self.cache_bytes, "cache_bytes")
    }
}

/// A row cache budget past the memory there is is refused: the cache sizes its index from the
/// budget up front, and that allocation would fail (an abort), not just never fill. `source`
/// says where the budget came from.
fn check_cache_budget(bytes: u64, source: &str) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    crate::memory::check_fits(bytes, &format!("the DRAM row cache's budget ({source})"))
}

/// `123`, `64K`, `512M`, `2G` (powers of 1024; an optional trailing `iB` or `B`).
fn parse_bytes(value: &str) -> Option<u64> {
    let v = value.trim();
    let v = v
        .strip_suffix("iB")
        .or_else(|| v.strip_suffix('B'))
        .unwrap_or(v);
    let (digits, shift) = match v.chars().last()? {
        'K' | 'k' => (&v[..v.len() - 1], 10),
        'M' | 'm' => (&v[..v.len() - 1], 20),
        'G' | 'g' => (&v[..v.len() - 1], 30),
        'T' | 't' => (&v[..v.len() - 1], 40),
        _ => (v, 0),
    };
    digits.trim().parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// Counters since the store opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Rows served from the DRAM cache.
    pub hits: u64,
    /// Rows that were not in the cache (duplicates within a batch count each time).
    pub misses: u64,
    /// Reads issued (one per extent of adjacent rows' blocks).
    pub reads: u64,
    /// Bytes those reads asked for.
    pub bytes: u64,
    /// Distinct rows those reads delivered (`bytes / rows_read`: bytes read per row).
    pub rows_read: u64,
    /// Distinct rows `advise` read into the cache (not counted as hits or misses).
    pub advised: u64,
    /// `advise` batches dropped because the warming queue was full.
    pub advise_dropped: u64,
    /// `advise` batches whose warming failed.
    pub advise_failed: u64,
}

impl std::ops::Sub for Stats {
    type Output = Stats;

    /// `after - before`, field by field: the counts of what happened in between (wrapping, so
    /// that a pair taken out of order cannot panic).
    fn sub(self, before: Stats) -> Stats {
        Stats {
            hits: self.hits.wrapping_sub(before.hits),
            misses: self.misses.wrapping_sub(before.misses),
            reads: self.reads.wrapping_sub(before.reads),
            bytes: self.bytes.wrapping_sub(before.bytes),
            rows_read: self.rows_read.wrapping_sub(before.rows_read),
            advised: self.advised.wrapping_sub(before.advised),
            advise_dropped: self.advise_dropped.wrapping_sub(before.advise_dropped),
            advise_failed: self.advise_failed.wrapping_sub(before.advise_failed),
        }
    }
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    reads: AtomicU64,
    bytes: AtomicU64,
    rows_read: AtomicU64,
    advised: AtomicU64,
    advise_dropped: AtomicU64,
    advise_failed: AtomicU64,
}

/// Who asked for a lookup: the caller's hit rate counts only its own lookups.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    User,
    Advise,
}

/// One extent that could not be read.
pub(crate) struct Failure {
    extent: u32,
    error: io::Error,
}

impl Failure {
    fn internal(extent: u32) -> Self {
        Failure {
            extent,
            error: io::Error::other("a read returned fewer bytes than its plan (a bug)"),
        }
    }
}

struct ShardIo {
    buffered: File,
    direct: Option<File>,
    map: Mmap,
    /// Size and mtime when the store opened: a batch that read the shard checks them after its
    /// reads, so that a shard rewritten in place fails the lookup instead of mixing tables.
    opened: ShardStamp,
    /// When the stamp was last checked (ns since the store opened; 0: never).
    checked_at: AtomicU64,
    /// Set once a check found the shard changed: every later batch reading it fails.
    changed: std::sync::atomic::AtomicBool,
}

impl ShardIo {
    /// Opens shard `p` buffered and mapped, and with O_DIRECT unless `direct_off` says why not
    /// (set here when the shard refuses it); O_NOATIME likewise, through `noatime_off`.
    fn open(
        p: &Path,
        direct_off: &mut Option<String>,
        noatime_off: &mut Option<String>,
    ) -> Result<ShardIo> {
        let buffered = file::open_noatime(|f| file::open_regular(p, f), noatime_off)?;
        // SAFETY: the mapping is read-only and only the mmap path reads it, which runs only
        // when asked for by name (never under Auto); its length check before each batch
        // narrows, but cannot close, the window in which a shrinking file raises SIGBUS.
        let map = unsafe { Mmap::map(&buffered) }.map_err(|e| Error::io(p, "mmap", e))?;
        map.advise(Advice::Random)
            .map_err(|e| Error::io(p, "madvise(MADV_RANDOM)", e))?;
        let direct = if direct_off.is_some() {
            None
        } else {
            match file::open_noatime(|f| open_direct(p, f), noatime_off) {
                Ok(f) => Some(f),
                Err(why) => {
                    *direct_off = Some(why);
                    None
                }
            }
        };
        let opened = ShardStamp::of(&buffered).map_err(|e| Error::io(p, "fstat", e))?;
        Ok(ShardIo {
            buffered,
            direct,
            map,
            opened,
            checked_at: AtomicU64::new(0),
            changed: std::sync::atomic::AtomicBool::new(false),
        })
    }
}

/// A table's shards, open for every read path, and why O_DIRECT and O_NOATIME are off, when
/// they are.
struct OpenedShards {
    shards: Vec<ShardIo>,
    direct_off: Option<String>,
    noatime_off: Option<String>,
}

impl OpenedShards {
    /// Opens every shard of `layout`; O_DIRECT for all of them or none (`direct_io` false, or
    /// one shard refusing it, turns it off for every shard).
    fn open(layout: &TableLayout, direct_io: bool) -> Result<OpenedShards> {
        let mut shards = Vec::with_capacity(layout.files.len());
        let mut direct_off = (!direct_io).then(|| "turned off by the caller".to_string());
        let mut noatime_off = None;
        for shard in &layout.files {
            shards.push(ShardIo::open(
                &shard.path,
                &mut direct_off,
                &mut noatime_off,
            )?);
        }
        if direct_off.is_some() {
            for s in &mut shards {
                s.direct = None;
            }
        }
        if let Some(why) = &noatime_off {
            note_noatime_off(&shards, why);
        }
        Ok(OpenedShards {
            shards,
            direct_off,
            noatime_off,
        })
    }
}

/// What a shard looked like: its size and modification time (seconds, nanoseconds).
#[derive(Clone, Copy, PartialEq, Eq)]
struct ShardStamp {
    len: u64,
    mtime: (i64, i64),
}

impl ShardStamp {
    fn of(file: &File) -> io::Result<ShardStamp> {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata()?;
        Ok(ShardStamp {
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
        })
    }
}

impl fmt::Display for ShardStamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} bytes, modified at {}.{:09}",
            self.len, self.mtime.0, self.mtime.1
        )
    }
}

/// Per-lookup working memory, reused so that a warm lookup allocates nothing.
#[derive(Default)]
struct Scratch {
    plan: Plan,
    slot: Option<AlignedBuf>,
    failures: Vec<Failure>,
    /// The missed rows as read (weights then scales, one row per unique row), for the cache.
    fill: Vec<u8>,
    /// A user lookup's ids, for the cache to count (it sorts them).
    asked: Vec<u64>,
}

pub(crate) struct Inner {
    /// The table's path as opened, made absolute.
    path: PathBuf,
    /// When the store opened (the shards' check times count from it).
    opened_at: std::time::Instant,
    layout: TableLayout,
    layer_ids: Vec<u32>,
    rows: Range<u64>,
    shards: Vec<ShardIo>,
    /// Why O_DIRECT is off, when it is.
    direct_off: Option<String>,
    /// Why the shards are open without O_NOATIME, when they are.
    noatime_off: Option<String>,
    /// Why io_uring is unavailable, when it is.
    uring_off: Option<String>,
    /// Reads are aligned to this many bytes (the shards' O_DIRECT alignment).
    block: u64,
    /// Why `block` is a page rather than what the file allows, when statx could not say.
    block_why: Option<String>,
    /// Resident scales per layer (index as in `layout.layers`), rows of `rows` only.
    scales: Vec<Option<Vec<u8>>>,
    cache: Option<RowCache>,
    read_path: ReadPath,
    tuning: Tuning,
    preadv_threads: usize,
    uring_depth: u32,
    uring_rings: usize,
    /// Threads for a batch spread over several rings.
    ring_pool: OnceLock<std::result::Result<rayon::ThreadPool, String>>,
    pool: OnceLock<std::result::Result<rayon::ThreadPool, String>>,
    scratch: Mutex<Vec<Scratch>>,
    /// Idle rings, each usable only by the thread that made it (single-issuer rings).
    rings: Mutex<Vec<uring::UringReader>>,
    /// What the last ring set up got from the kernel.
    ring_features: Mutex<Option<uring::RingFeatures>>,
    counters: Counters,
    fault: OnceLock<FaultState>,
    /// Chunks `advise_future` handed over, read into the cache when they are next.
    ahead: ahead::ReadAhead,
}

/// Engram rows of one tensor-parallel rank, read from NVMe. `Send + Sync`: lookups from many
/// threads proceed at once, each with its own ring and buffers.
pub struct RowStore {
    inner: Arc<Inner>,
    advisor: advise::Advisor,
}

impl RowStore {
    /// Opens and validates a table (a model directory or one `.safetensors` file).
    pub fn open(path: &Path, options: StoreOptions) -> Result<Self> {
        options.validate()?;
        // Every later use of the path (the tune file) is the one opened, whatever the working
        // directory becomes.
        let path =
            &std::path::absolute(path).map_err(|e| Error::io(path, "resolve the path", e))?;
        let layout = TableLayout::open(path)?;
        let rows = owned_rows(&options, layout.rows())?;
        let OpenedShards {
            shards,
            direct_off,
            noatime_off,
        } = OpenedShards::open(&layout, options.direct_io)?;
        let (block, block_why) = read_block_of(&layout, &shards);
        if options.read_path == ReadPath::Mmap {
            log::warn!(
                "fetchahead: the mmap read path was asked for: a shard truncated while lookups \
                 run can raise SIGBUS and kill this process (Auto never picks mmap)"
            );
        }
        let uring_off = io_uring::IoUring::new(4)
            .err()
            .map(|e| format!("io_uring_setup: {e}"));
        let scales = resident_scales(&layout, &shards, &rows, options.resident_scales)?;
        let tuning = Tuning::load(&tune::tune_file(path))?.unwrap_or_default();
        let cache = row_cache(&options, &layout)?;
        let layer_count = layout.layers.len();
        let inner = Arc::new(Inner {
            layer_ids: layout.layers.iter().map(|l| l.layer).collect(),
            layout,
            rows,
            shards,
            direct_off,
            noatime_off,
            uring_off,
            block,
            block_why,
            scales,
            cache,
            read_path: options.read_path,
            tuning,
            path: path.to_path_buf(),
            opened_at: std::time::Instant::now(),
            preadv_threads: options.preadv_threads,
            uring_depth: options.uring_depth,
            uring_rings: options.uring_rings,
            ring_pool: OnceLock::new(),
            pool: OnceLock::new(),
            scratch: Mutex::new(Vec::new()),
            rings: Mutex::new(Vec::new()),
            ring_features: Mutex::new(None),
            counters: Counters::default(),
            fault: OnceLock::new(),
            ahead: ahead::ReadAhead::new(layer_count),
        });
        let advisor = advise::Advisor::start(inner.clone())
            .map_err(|e| Error::io(path, "spawn the advise thread", e))?;
        Ok(RowStore { inner, advisor })
    }

    /// Fills `weights_out` (`ids.len() * dim` bytes) and `scales_out` (`ids.len() * dim / 32`)
    /// with the rows of `ids`, in order, through the store's read path. Ids are absolute row ids
    /// within [`row_range`](Self::row_range); one outside it fails the call before any read.
    pub fn lookup(
        &self,
        layer: u32,
        ids: &[i64],
        weights_out: &mut [u8],
        scales_out: &mut [u8],
    ) -> Result<()> {
        self.lookup_with(self.inner.read_path, layer, ids, weights_out, scales_out)
    }

    /// [`lookup`](Self::lookup) through a given path.
    pub fn lookup_with(
        &self,
        path: ReadPath,
        layer: u32,
        ids: &[i64],
        weights_out: &mut [u8],
        scales_out: &mut [u8],
    ) -> Result<()> {
        let _nvtx = crate::nvtx::range(c"fetchahead.lookup");
        self.inner
            .lookup(Caller::User, path, layer, ids, weights_out, scales_out)?;
        self.read_due(layer);
        Ok(())
    }

    /// Sends the rows of the chunks due within the next [`ahead::READ_AHEAD_LOOKUPS`] lookups of
    /// `layer` (handed over by [`advise_future`](Self::advise_future)) to the advise thread, to
    /// be read into the cache while the caller computes.
    fn read_due(&self, layer: u32) {
        let (Some(cache), Ok(li)) = (&self.inner.cache, self.inner.layer_index(layer)) else {
            return;
        };
        if !cache.looks_ahead() {
            return;
        }
        let most = (cache.capacity() as f64 * ahead::READ_AHEAD_SHARE) as usize;
        let next = cache.now(li) + u64::from(ahead::READ_AHEAD_LOOKUPS);
        let rows = self.inner.ahead.take_due(li, next, most);
        if rows.is_empty() {
            return;
        }
        self.send_advise(layer, &rows);
    }

    /// Queues checked `ids` of `layer` for the advise thread; a batch the full queue drops is
    /// counted.
    fn send_advise(&self, layer: u32, ids: &[i64]) {
        if !self.advisor.send(layer, ids) {
            self.inner
                .counters
                .advise_dropped
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Waits until the advise thread has read every batch sent to it (from [`advise`] and the
    /// read-ahead of [`advise_future`]): for benches and tests that stand in for the compute a
    /// read overlaps.
    ///
    /// [`advise`]: RowStore::advise
    /// [`advise_future`]: RowStore::advise_future
    pub fn wait_advised(&self) {
        self.advisor.wait_idle();
    }

    /// Starts warming the rows of a coming batch and returns at once: into the row cache when
    /// there is one, else into the page cache. Bad ids fail here; read errors are only counted.
    pub fn advise(&self, layer: u32, ids: &[i64]) -> Result<()> {
        self.inner.layer_index(layer)?;
        self.inner.check_range(ids)?;
        self.send_advise(layer, ids);
        Ok(())
    }

    /// The table's path (a directory or one file), made absolute when the store opened.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Hands the row cache rows a coming lookup of `layer` asks for: the lookup `steps_ahead`
    /// lookups of the layer from now (1: the next). Until then each is admitted when read,
    /// whatever its count, and no eviction takes it; and once it is at most
    /// [`ahead::READ_AHEAD_LOOKUPS`] lookups away (at once for `steps_ahead` 2 or less), the
    /// advise thread reads them into the cache, most asked first
    /// and at most [`ahead::READ_AHEAD_SHARE`] of the cache's rows, so that the lookup finds
    /// them. An engine knows a prompt when its request arrives, so the ids of its later prefill
    /// chunks can be handed over once, while the earlier chunks run. Returns how many ids were
    /// noted: 0 without a cache or [`StoreOptions::lookahead`] (then nothing is read ahead
    /// either); fewer when the room for future references (a slot a cached row) is full. Bad
    /// ids fail here.
    pub fn advise_future(&self, layer: u32, ids: &[i64], steps_ahead: u32) -> Result<usize> {
        let li = self.inner.layer_index(layer)?;
        self.inner.check_range(ids)?;
        let Some(cache) = &self.inner.cache else {
            return Ok(0);
        };
        let noted = ids
            .iter()
            .filter(|&&id| cache.mark(li, id as u64, steps_ahead))
            .count();
        if cache.looks_ahead() {
            let due = cache.now(li) + u64::from(steps_ahead.max(1));
            self.inner.ahead.hand_over(li, due, ids.iter().copied());
            self.read_due(layer);
        }
        Ok(noted)
    }

    /// Notes that request `request` (the engine's id for it, below 2^31) asked for `ids` of
    /// `layer` in the lookup just made: the row cache remembers, per cached row, the one request
    /// that asked for it, or that more than one did. With [`request_finished`] the rows only a
    /// finished request asked for (its document's own n-grams) count half. Returns at once
    /// without a cache. Bad ids fail here.
    ///
    /// [`request_finished`]: RowStore::request_finished
    pub fn asked_by(&self, layer: u32, request: u32, ids: &[i64]) -> Result<()> {
        let li = self.inner.layer_index(layer)?;
        self.inner.check_range(ids)?;
        if let Some(cache) = &self.inner.cache {
            cache.asked_by(li, request, ids.iter().map(|&id| id as u64));
        }
        Ok(())
    }

    /// Notes that request `request` finished (its last output token was looked up).
    pub fn request_finished(&self, request: u32) {
        if let Some(cache) = &self.inner.cache {
            cache.request_finished(request);
        }
    }

    /// Bytes of one row's weights (FP8 elements); its scales are `dim() / 32` bytes.
    pub fn dim(&self) -> usize {
        self.inner.layout.dim
    }

    pub fn layers(&self) -> &[u32] {
        &self.inner.layer_ids
    }

    /// The rows this rank owns.
    pub fn row_range(&self) -> Range<u64> {
        self.inner.rows.clone()
    }

    pub fn stats(&self) -> Stats {
        let c = &self.inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            hits: get(&c.hits),
            misses: get(&c.misses),
            reads: get(&c.reads),
            bytes: get(&c.bytes),
            rows_read: get(&c.rows_read),
            advised: get(&c.advised),
            advise_dropped: get(&c.advise_dropped),
            advise_failed: get(&c.advise_failed),
        }
    }

    /// Rows and bytes held in the DRAM cache.
    pub fn cached(&self) -> (usize, u64) {
        self.inner
            .cache
            .as_ref()
            .map_or((0, 0), |c| (c.len(), c.weight()))
    }

    pub fn layout(&self) -> &TableLayout {
        &self.inner.layout
    }

    pub fn read_path(&self) -> ReadPath {
        self.inner.read_path
    }

    pub fn tuning(&self) -> &Tuning {
        &self.inner.tuning
    }

    /// The path `Auto` takes for a batch of `n` rows.
    pub fn auto_path(&self, n: usize) -> ReadPath {
        self.inner.tuning.choose(n, self.inner.uring_off.is_none())
    }

    /// Ok when reads bypass the page cache (O_DIRECT), else why not.
    pub fn direct_io(&self) -> std::result::Result<(), &str> {
        self.inner.direct_off.as_deref().map_or(Ok(()), Err)
    }

    /// What the io_uring rings got from the kernel (registered buffers and files, task-run
    /// flags, and why any is missing); `None` before the first io_uring lookup.
    pub fn ring_features(&self) -> Option<RingFeatures> {
        self.inner
            .ring_features
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The block reads are aligned to and sized in: the shards' O_DIRECT alignment from
    /// `statx(STATX_DIOALIGN)` (512 bytes where allowed), a page where it could not be known (and
    /// why), 512 bytes without O_DIRECT.
    pub fn read_block(&self) -> (u64, Option<&str>) {
        (self.inner.block, self.inner.block_why.as_deref())
    }

    /// Ok when the kernel offers io_uring, else why not.
    pub fn uring(&self) -> std::result::Result<(), &str> {
        self.inner.uring_off.as_deref().map_or(Ok(()), Err)
    }

    /// Drops the table's pages from the page cache (and this process's mappings of them), so
    /// that the next reads come from the disk.
    pub fn evict_page_cache(&self) -> Result<()> {
        for (i, shard) in self.inner.shards.iter().enumerate() {
            // SAFETY: the mapping is private to this store and read-only; MADV_DONTNEED only
            // drops its page-table entries, and later reads fault the file's bytes back in.
            unsafe { shard.map.unchecked_advise(UncheckedAdvice::DontNeed) }
                .map_err(|e| Error::io(self.inner.layout.path(i), "madvise(MADV_DONTNEED)", e))?;
            // SAFETY: plain syscall on an open descriptor.
            let rc = unsafe {
                libc::posix_fadvise(shard.buffered.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED)
            };
            if rc != 0 {
                let e = io::Error::from_raw_os_error(rc);
                return Err(Error::io(
                    self.inner.layout.path(i),
                    "posix_fadvise(DONTNEED)",
                    e,
                ));
            }
        }
        Ok(())
    }

    /// Makes reads misbehave from now on, for tests of the error path. False when a fault was
    /// already set (one per store).
    #[doc(hidden)]
    pub fn inject_read_fault(&self, fault: ReadFault) -> bool {
        self.inner.fault.set(FaultState::new(fault)).is_ok()
    }
}

/// The read paths this kernel offers, probed once here: io_uring (a small ring, with the
/// features it got), preadv and buffered reads (always), mmap (always; measured, never chosen
/// by `auto`). O_DIRECT depends on each table's filesystem and is said when a store opens.
pub fn read_paths_here() -> Vec<(&'static str, std::result::Result<String, String>)> {
    let uring = std::fs::File::open("/dev/null")
        .map_err(|e| format!("cannot open /dev/null to probe with: {e}"))
        .and_then(|null| {
            use std::os::fd::AsRawFd;
            let reader = uring::UringReader::new(8, &[null.as_raw_fd()], None)
                .map_err(|e| format!("io_uring_setup: {e}"))?;
            let f = reader.features();
            let on = |b: bool| if b { "yes" } else { "no" };
            Ok(format!(
                "task run {}, no SQ array {}, registered buffers {}, registered files {}, \
                 registered ring fd {}",
                f.task_run,
                on(f.no_sqarray),
                on(f.registered_buffers),
                on(f.registered_files),
                on(f.registered_ring_fd)
            ))
        });
    vec![
        ("uring", uring),
        ("preadv", Ok("a pool of preadv threads".to_string())),
        ("buffered", Ok("pread through the page cache".to_string())),
        (
            "mmap",
            Ok("measured by tune, never chosen by auto (a truncated shard raises SIGBUS)".into()),
        ),
    ]
}

/// The hit count the store's row cache gets on `batches` with a budget of `cache_bytes` for rows
/// of `dim` weights (and `dim / 32` scales), replayed without reading anything: the cache is the
/// store's own, used as a lookup uses it.
pub fn replay_row_cache(
    cache_bytes: u64,
    dim: usize,
    batches: &[Vec<i64>],
    counted_from: usize,
) -> belady::HitCount {
    replay_row_cache_then(cache_bytes, dim, batches, counted_from, || ()).0
}

/// [`replay_row_cache`], then `then` called while the cache still holds its rows: for tests that
/// measure what the cache really keeps resident (rows and bookkeeping) against its budget.
#[doc(hidden)]
pub fn replay_row_cache_then<T>(
    cache_bytes: u64,
    dim: usize,
    batches: &[Vec<i64>],
    counted_from: usize,
    then: impl FnOnce() -> T,
) -> (belady::HitCount, T) {
    let cache = RowCache::new(cache_bytes, dim + dim / MX_BLOCK, 1, false);
    let (count, _) = replay_on(&cache, dim, batches, counted_from, Known::default());
    let out = then();
    drop(cache);
    (count, out)
}

/// Per batch, the future references to hand over before it: `(steps_ahead, ids)`.
pub type FutureRefs<'a> = [Vec<(u32, &'a [i64])>];

/// What a replay knows ahead of each lookup, as an engine knows it.
#[derive(Clone, Copy)]
pub struct Known<'a> {
    /// Per batch, the later prefill chunks handed over before it
    /// ([`RowStore::advise_future`]).
    pub future: Option<&'a FutureRefs<'a>>,
    /// Rows of the chunks due at a batch read ahead of it, while the batch before it runs, at
    /// most this share of the cache's rows (as [`RowStore::advise_future`] reads them); 0 reads
    /// nothing ahead.
    pub read_share: f64,
    /// A chunk is read ahead once its lookup is at most this many lookups away, this one
    /// counted (1: just before it; [`ahead::READ_AHEAD_LOOKUPS`] in the store).
    pub read_lookups: u32,
    /// Per batch, its ids by request and the requests finishing with it.
    pub requests: Option<&'a [requests::StepRequests]>,
}

impl Default for Known<'_> {
    fn default() -> Self {
        Known {
            future: None,
            read_share: 0.0,
            read_lookups: ahead::READ_AHEAD_LOOKUPS,
            requests: None,
        }
    }
}

/// The store's row cache replayed on `batches` as [`replay_row_cache`], with what `known`
/// holds handed over as an engine hands it: before batch `b`, each `(steps_ahead, ids)` of
/// `future[b]` (the cache then keeps room for future references within the same budget), and
/// with a read share, the rows of the chunks due at `b` read into the cache before it. Returns
/// the hit count and the distinct rows read (missed or read ahead) over the counted batches.
pub fn replay_row_cache_known(
    cache_bytes: u64,
    dim: usize,
    batches: &[Vec<i64>],
    counted_from: usize,
    known: Known<'_>,
) -> (belady::HitCount, u64) {
    let cache = RowCache::new(cache_bytes, dim + dim / MX_BLOCK, 1, known.future.is_some());
    replay_on(&cache, dim, batches, counted_from, known)
}

/// [`replay_row_cache`] with each step's ids by request and the requests finishing with it
/// handed to the cache, as an engine knows them.
pub fn replay_row_cache_requests(
    cache_bytes: u64,
    dim: usize,
    batches: &[Vec<i64>],
    counted_from: usize,
    requests: &[requests::StepRequests],
) -> belady::HitCount {
    let known = Known {
        requests: Some(requests),
        ..Known::default()
    };
    replay_row_cache_known(cache_bytes, dim, batches, counted_from, known).0
}

/// `batches` looked up in `cache` as a lookup uses it (with what `known` holds handed over),
/// without reading anything: the hit count and the distinct rows read over the batches from
/// `counted_from` on.
fn replay_on(
    cache: &RowCache,
    dim: usize,
    batches: &[Vec<i64>],
    counted_from: usize,
    known: Known<'_>,
) -> (belady::HitCount, u64) {
    let row = vec![0u8; dim + dim / MX_BLOCK];
    let (w, s) = row.split_at(dim);
    let mut out = row.clone();
    let mut count = belady::HitCount::default();
    let mut read = 0u64;
    let (mut missed, mut asked) = (Vec::new(), Vec::new());
    // The chunks handed over so far, by the batch they are due at.
    let mut due: Vec<Vec<&[i64]>> = vec![Vec::new(); batches.len() + 1];
    let most_ahead = (cache.capacity() as f64 * known.read_share) as usize;
    let mut ahead = Vec::new();
    for (b, batch) in batches.iter().enumerate() {
        if let Some(handed) = known.future.and_then(|f| f.get(b)) {
            for &(steps, ids) in handed {
                for &id in ids {
                    cache.mark(0, id as u64, steps);
                }
                // Read once its lookup is `read_lookups` lookups away (this one counted).
                let at = b + (steps.max(known.read_lookups) - known.read_lookups) as usize;
                if let Some(d) = due.get_mut(at) {
                    d.push(ids);
                }
            }
        }
        if most_ahead > 0 {
            ahead.clear();
            ahead.extend(due[b].iter().flat_map(|ids| ids.iter().copied()));
            let (ow, os) = out.split_at_mut(dim);
            ahead::most_asked_first(&mut ahead, most_ahead);
            for &id in &ahead {
                if !cache.get(0, id as u64, ow, os) {
                    cache.insert(0, id as u64, w, s);
                    if b >= counted_from {
                        read += 1;
                    }
                }
            }
        }
        missed.clear();
        let mut hits = 0;
        for &id in batch {
            let (ow, os) = out.split_at_mut(dim);
            if cache.get(0, id as u64, ow, os) {
                hits += 1;
            } else {
                missed.push(id);
            }
        }
        asked.clear();
        asked.extend(batch.iter().map(|&id| id as u64));
        cache.asked(0, &mut asked);
        missed.sort_unstable();
        missed.dedup();
        for &id in &missed {
            cache.insert(0, id as u64, w, s);
        }
        if let Some(step) = known.requests.and_then(|r| r.get(b)) {
            for span in &step.spans {
                let ids = batch.get(span.ids.clone()).unwrap_or(&[]);
                cache.asked_by(0, span.request, ids.iter().map(|&id| id as u64));
            }
            for &r in &step.finished {
                cache.request_finished(r);
            }
        }
        if b >= counted_from {
            count.hits += hits;
            count.requests += batch.len() as u64;
            read += missed.len() as u64;
        }
    }
    (count, read)
}

/// Rows a row cache of `cache_bytes` holds for rows of `dim` weights.
pub fn cache_rows(cache_bytes: u64, dim: usize) -> usize {
    cache::rows_in(cache_bytes, dim + dim / MX_BLOCK, false)
}

/// The budget a row cache needs to hold `rows` rows of `dim` weights.
pub fn cache_bytes_for(rows: u64, dim: usize) -> u64 {
    cache::bytes_for_rows(rows as usize, dim + dim / MX_BLOCK, false)
}

/// The rows `options` gives this rank of a table of `total` rows.
fn owned_rows(options: &StoreOptions, total: u64) -> Result<Range<u64>> {
    let end = match options.num_rows {
        Some(n) if n > 0 => options.row_start.checked_add(n),
        _ => Some(total),
    };
    match end {
        Some(end) if options.row_start <= end && end <= total => Ok(options.row_start..end),
        _ => Err(Error::invalid(
            "row range",
            format!(
                "rows {}..{} of a table with {total} rows",
                options.row_start,
                end.map_or("overflow".to_string(), |e| e.to_string())
            ),
        )),
    }
}

/// The block reads are aligned to: the largest O_DIRECT alignment of the shards (at least
/// [`dio::MIN_BLOCK`]), and why it is a page rather than what a file allows, when statx could
/// not say.
fn read_block_of(layout: &TableLayout, shards: &[ShardIo]) -> (u64, Option<String>) {
    let (mut block, mut block_why) = (dio::MIN_BLOCK, None);
    for (i, s) in shards.iter().enumerate() {
        if let Some(d) = &s.direct {
            let (b, why) = dio::read_block(dio::dio_offset_align(d));
            block = block.max(b);
            if let Some(why) = why {
                block_why.get_or_insert(format!("{}: {why}", layout.path(i).display()));
            }
        }
    }
    (block, block_why)
}

/// Each layer's scales of `rows`, read into DRAM when `resident` (else `None` per layer).
fn resident_scales(
    layout: &TableLayout,
    shards: &[ShardIo],
    rows: &Range<u64>,
    resident: bool,
) -> Result<Vec<Option<Vec<u8>>>> {
    let sdim = layout.dim / MX_BLOCK;
    let mut scales = Vec::with_capacity(layout.layers.len());
    for l in &layout.layers {
        if !resident {
            scales.push(None);
            continue;
        }
        // The header's row count was checked against the file's length, but a sparse file
        // can claim any length: check the size against memory before allocating.
        let want = crate::memory::product(rows.end - rows.start, sdim as u64, "resident scales")?;
        let mut bytes = crate::memory::zeroed(
            want,
            &format!(
                "the resident scales of layer {} ({})",
                l.layer, l.scale.name
            ),
        )?;
        let file = &shards[l.scale.file].buffered;
        file.read_exact_at(&mut bytes, l.scale.row_offset(rows.start))
            .map_err(|e| Error::io(layout.path(l.scale.file), "read scales", e))?;
        scales.push(Some(bytes));
    }
    Ok(scales)
}

/// The DRAM row cache `options` asks for (none for a budget of 0).
fn row_cache(options: &StoreOptions, layout: &TableLayout) -> Result<Option<RowCache>> {
    if options.cache_bytes > 0 {
        // The cache sizes its index from the budget up front: a budget past the memory there
        // is would fail that allocation (an abort), not just never fill.
        crate::memory::check_fits(options.cache_bytes, "the DRAM row cache's budget")?;
    }
    Ok((options.cache_bytes > 0).then(|| {
        RowCache::new(
            options.cache_bytes,
            layout.dim + layout.dim / MX_BLOCK,
            layout.layers.len(),
            options.lookahead,
        )
    }))
}

/// Says once per process that the shards are open without O_NOATIME, and only when that is a
/// surprise: the kernel allows O_NOATIME to a file's owner alone, so a table of another user
/// (a shared model directory) falls back quietly (a debug record).
fn note_noatime_off(shards: &[ShardIo], why: &str) {
    use std::os::unix::fs::MetadataExt;
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let foreign = shards
        .iter()
        .any(|s| s.buffered.metadata().is_ok_and(|m| m.uid() != me));
    if foreign || WARNED.swap(true, Ordering::Relaxed) {
        log::debug!("fetchahead: shards opened without O_NOATIME ({why})");
    } else {
        log::warn!(
            "fetchahead: shards opened without O_NOATIME ({why}): every read checks the access \
             time (said once per process)"
        );
    }
}

/// Opens `path` with O_DIRECT (and `extra` flags) and proves it with one aligned read; Err says
/// why not.
fn open_direct(path: &Path, extra: libc::c_int) -> std::result::Result<File, String> {
    let file = file::open_regular(path, libc::O_DIRECT | extra)
        .map_err(|e| format!("open(O_DIRECT) of {}: {e}", path.display()))?;
    let mut probe = AlignedBuf::new(layout::PAGE as usize);
    file.read_at(probe.as_mut_slice(), 0)
        .map_err(|e| format!("an O_DIRECT read of {}: {e}", path.display()))?;
    Ok(file)
}

impl Inner {
    fn layer_index(&self, layer: u32) -> Result<usize> {
        self.layer_ids
            .iter()
            .position(|&l| l == layer)
            .ok_or_else(|| Error::NoSuchLayer {
                layer,
                have: self.layer_ids.clone(),
            })
    }

    fn check_range(&self, ids: &[i64]) -> Result<()> {
        let (start, end) = (self.rows.start, self.rows.end);
        let mut count = 0u64;
        let mut first = None;
        for (i, &id) in ids.iter().enumerate() {
            if id < 0 || (id as u64) < start || (id as u64) >= end {
                count += 1;
                first.get_or_insert((i, id));
            }
        }
        match first {
            None => Ok(()),
            Some((first_index, first_id)) => Err(Error::RowsOutOfRange {
                count,
                n: ids.len() as u64,
                start,
                end,
                first_index: first_index as u64,
                first_id,
            }),
        }
    }

    /// The descriptor reads of `file` use, and whether it is O_DIRECT.
    fn read_fd(&self, file: usize) -> (RawFd, bool) {
        match self.shards.get(file) {
            Some(ShardIo {
                direct: Some(d), ..
            }) => (d.as_raw_fd(), true),
            Some(s) => (s.buffered.as_raw_fd(), false),
            None => (-1, false),
        }
    }

    fn buffered_fd(&self, file: usize) -> RawFd {
        self.shards.get(file).map_or(-1, |s| s.buffered.as_raw_fd())
    }

    /// Fails when shard `file`'s size or mtime differs from when the store opened it, checked
    /// at most once per [`SHARD_CHECK_EVERY`]; once changed, the shard fails every lookup.
    fn check_unchanged(&self, file: usize) -> Result<()> {
        let Some(shard) = self.shards.get(file) else {
            return Ok(());
        };
        let path = self.layout.path(file);
        if !shard.changed.load(Ordering::Relaxed) {
            // At least 1: 0 means never checked.
            let now = (self.opened_at.elapsed().as_nanos() as u64).max(1);
            let last = shard.checked_at.load(Ordering::Relaxed);
            if last != 0 && now.saturating_sub(last) < SHARD_CHECK_EVERY.as_nanos() as u64 {
                return Ok(());
            }
            shard.checked_at.store(now, Ordering::Relaxed);
            let stamp = ShardStamp::of(&shard.buffered).map_err(|e| Error::io(path, "fstat", e))?;
            if stamp == shard.opened {
                return Ok(());
            }
            shard.changed.store(true, Ordering::Relaxed);
        }
        let now = match ShardStamp::of(&shard.buffered) {
            Ok(stamp) => stamp.to_string(),
            Err(e) => format!("unknown ({e})"),
        };
        Err(Error::ShardChanged {
            file: path.to_path_buf(),
            why: format!("it was {} and is {now}", shard.opened),
        })
    }

    fn current_len(&self, file: usize) -> io::Result<u64> {
        match self.shards.get(file) {
            Some(s) => Ok(s.buffered.metadata()?.len()),
            None => Err(io::Error::other("no such shard")),
        }
    }

    /// `len` bytes of the mapping of `file` from `offset`.
    fn mapped(&self, file: usize, offset: u64, len: u64) -> Option<&[u8]> {
        let map = &self.shards.get(file)?.map;
        map.get(offset as usize..offset.checked_add(len)? as usize)
    }

    fn fault(&self) -> Option<&FaultState> {
        self.fault.get()
    }

    fn pool(&self) -> Result<&rayon::ThreadPool> {
        let pool = self.pool.get_or_init(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(self.preadv_threads)
                .thread_name(|i| format!("fetchahead-preadv-{i}"))
                .build()
                .map_err(|e| e.to_string())
        });
        pool.as_ref().map_err(|why| Error::ReadPathUnavailable {
            path: "preadv",
            why: why.clone(),
        })
    }

    /// Rings a batch of `extents` reads is spread over: one until each ring would get
    /// `MULTI_RING_MIN` reads, at most `uring_rings`.
    fn rings_for(&self, extents: usize) -> usize {
        (extents / MULTI_RING_MIN).clamp(1, self.uring_rings)
    }

    /// A large batch on several rings at once, each on its own thread of the store's ring pool
    /// (when one ring's thread, submitting and copying, is the limit).
    fn read_rings(
        &self,
        layer: &layout::LayerLayout,
        plan: &Plan,
        out: &OutRows,
        failures: &mut Vec<Failure>,
        rings: usize,
    ) -> Result<()> {
        use rayon::prelude::*;
        let pool = self
            .ring_pool
            .get_or_init(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(self.uring_rings)
                    .thread_name(|i| format!("fetchahead-uring-{i}"))
                    .build()
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|why| Error::ReadPathUnavailable {
                path: "uring",
                why: why.clone(),
            })?;
        let n = plan.extents.len();
        let chunk = n.div_ceil(rings);
        let failed = Mutex::new(std::mem::take(failures));
        let fatal: Mutex<Option<Error>> = Mutex::new(None);
        pool.install(|| {
            (0..rings).into_par_iter().with_max_len(1).for_each(|k| {
                let range = k * chunk..((k + 1) * chunk).min(n);
                let mut local = Vec::new();
                let outcome = self.take_ring().and_then(|mut reader| {
                    reader
                        .read(self, layer, plan, range, out, &mut local)
                        .map_err(|e| {
                            Error::io(self.layout.path(layer.weight.file), "io_uring_enter", e)
                        })?;
                    self.give_ring(reader);
                    Ok(())
                });
                if let Err(e) = outcome {
                    fatal
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_or_insert(e);
                }
                failed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .append(&mut local);
            })
        });
        *failures = failed.into_inner().unwrap_or_else(|e| e.into_inner());
        match fatal.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// This thread's idle ring, or a new one.
    fn take_ring(&self) -> Result<uring::UringReader> {
        let me = std::thread::current().id();
        let mut rings = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = rings.iter().position(|r| r.owner() == me) {
            return Ok(rings.swap_remove(i));
        }
        drop(rings);
        let fds: Vec<RawFd> = (0..self.shards.len()).map(|i| self.read_fd(i).0).collect();
        let reader = uring::UringReader::new(self.uring_depth, &fds, self.noatime_off.as_deref())
            .map_err(|e| Error::ReadPathUnavailable {
            path: "uring",
            why: e.to_string(),
        })?;
        self.note_ring_features(reader.features());
        Ok(reader)
    }

    /// Keeps `features` as what the last ring set up got (or lost since).
    fn note_ring_features(&self, features: &uring::RingFeatures) {
        *self.ring_features.lock().unwrap_or_else(|e| e.into_inner()) = Some(features.clone());
    }

    fn give_ring(&self, reader: uring::UringReader) {
        let mut rings = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        // Rings of threads that are gone can never be used again: keep a bounded number.
        if rings.len() >= MAX_IDLE_RINGS {
            rings.remove(0);
        }
        rings.push(reader);
    }

    fn resolve(&self, path: ReadPath, n: usize) -> Result<ReadPath> {
        let path = match path {
            ReadPath::Auto => self.tuning.choose(n, self.uring_off.is_none()),
            p => p,
        };
        match (&self.uring_off, path) {
            (Some(why), ReadPath::Uring) => Err(Error::ReadPathUnavailable {
                path: "uring",
                why: why.clone(),
            }),
            _ => Ok(path),
        }
    }

    fn lookup(
        &self,
        caller: Caller,
        path: ReadPath,
        layer: u32,
        ids: &[i64],
        weights_out: &mut [u8],
        scales_out: &mut [u8],
    ) -> Result<()> {
        let li = self.layer_index(layer)?;
        let (dim, sdim) = (self.layout.dim, self.layout.dim / MX_BLOCK);
        if weights_out.len() != ids.len() * dim || scales_out.len() != ids.len() * sdim {
            return Err(Error::invalid(
                "lookup outputs",
                format!(
                    "{} and {} bytes for {} ids; want {} and {}",
                    weights_out.len(),
                    scales_out.len(),
                    ids.len(),
                    ids.len() * dim,
                    ids.len() * sdim
                ),
            ));
        }
        if ids.len() > u32::MAX as usize {
            return Err(Error::invalid(
                "lookup ids",
                format!("{} ids in one batch; at most {}", ids.len(), u32::MAX),
            ));
        }
        self.check_range(ids)?;
        if ids.is_empty() {
            return Ok(());
        }
        let path = self.resolve(path, ids.len())?;
        let mut scratch = self
            .scratch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_default();
        let outcome = self.lookup_in(&mut scratch, caller, path, li, ids, weights_out, scales_out);
        self.scratch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(scratch);
        outcome
    }

    #[allow(clippy::too_many_arguments)]
    fn lookup_in(
        &self,
        scratch: &mut Scratch,
        caller: Caller,
        path: ReadPath,
        li: usize,
        ids: &[i64],
        weights_out: &mut [u8],
        scales_out: &mut [u8],
    ) -> Result<()> {
        let layer = &self.layout.layers[li];
        let (dim, sdim) = (self.layout.dim, self.layout.dim / MX_BLOCK);
        let plan = &mut scratch.plan;
        plan.clear();
        let resident = self.scales.get(li).and_then(Option::as_ref);
        if let Some(scales) = resident {
            self.copy_resident_scales(scales, ids, scales_out);
        }
        self.serve_cached(
            caller,
            li,
            ids,
            plan,
            &mut scratch.asked,
            weights_out,
            scales_out,
        );
        if plan.order.is_empty() {
            return Ok(());
        }
        plan.group();
        plan.add_extents(Kind::Weight, &layer.weight, self.block);
        if resident.is_none() {
            plan.add_extents(Kind::Scale, &layer.scale, self.block);
        }
        let row_bytes = dim + sdim;
        let fill = &mut scratch.fill;
        if self.cache.is_some() {
            fill.resize(plan.uniques.len() * row_bytes, 0);
        }
        let out = OutRows::new(
            weights_out,
            scales_out,
            self.cache.is_some().then_some((&mut fill[..], dim)),
        );
        let failures = &mut scratch.failures;
        failures.clear();
        self.read_misses(path, layer, plan, &out, &mut scratch.slot, failures)?;
        self.count_reads(plan);
        if let Some(error) = self.row_read_error(layer, plan, failures) {
            return Err(error);
        }
        // After the reads, at most one fstat per shard the batch read (two shards at most) and
        // per millisecond: a shard rewritten before or while they ran fails the lookup, before
        // any row reaches the cache.
        self.check_unchanged(layer.weight.file)?;
        if resident.is_none() && layer.scale.file != layer.weight.file {
            self.check_unchanged(layer.scale.file)?;
        }
        if let Some(byte) = self.fault().and_then(FaultState::scribble) {
            weights_out.fill(byte);
            scales_out.fill(byte);
        }
        if let Some(cache) = &self.cache {
            self.fill_cache(cache, li, plan, fill, resident);
        }
        if caller == Caller::Advise {
            // Counted once the rows are in the cache.
            self.counters
                .advised
                .fetch_add(plan.uniques.len() as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Copies the resident scales of `ids` (owned rows, checked) to `scales_out`, in order.
    fn copy_resident_scales(&self, scales: &[u8], ids: &[i64], scales_out: &mut [u8]) {
        let sdim = self.layout.dim / MX_BLOCK;
        for (pos, &id) in ids.iter().enumerate() {
            // The ids of a batch are scattered over the owned rows' scales (48 MB for 6M
            // rows): ask for the row a few ids ahead, so that the misses overlap.
            if let Some(&ahead) = ids.get(pos + SCALES_AHEAD) {
                let at = (ahead as u64).wrapping_sub(self.rows.start) as usize * sdim;
                prefetch::for_read(scales.as_ptr().wrapping_add(at), sdim);
            }
            let at = (id as u64 - self.rows.start) as usize * sdim;
            if let (Some(dst), Some(src)) = (
                scales_out.get_mut(pos * sdim..(pos + 1) * sdim),
                scales.get(at..at + sdim),
            ) {
                dst.copy_from_slice(src);
            }
        }
    }

    /// Copies the rows of `ids` the DRAM cache holds to their outputs and puts the others in
    /// `plan.order`; a user's lookup counts as the cache's asks (`asked`: their buffer), hits
    /// and misses.
    #[allow(clippy::too_many_arguments)]
    fn serve_cached(
        &self,
        caller: Caller,
        li: usize,
        ids: &[i64],
        plan: &mut Plan,
        asked: &mut Vec<u64>,
        weights_out: &mut [u8],
        scales_out: &mut [u8],
    ) {
        let (dim, sdim) = (self.layout.dim, self.layout.dim / MX_BLOCK);
        let mut hits = 0u64;
        let record = caller == Caller::User;
        for (pos, &id) in ids.iter().enumerate() {
            let hit = self.cache.as_ref().is_some_and(|c| {
                c.get(
                    li,
                    id as u64,
                    &mut weights_out[pos * dim..(pos + 1) * dim],
                    &mut scales_out[pos * sdim..(pos + 1) * sdim],
                )
            });
            if hit {
                hits += 1;
            } else {
                plan.order.push((id as u64, pos as u32));
            }
        }
        if let (Some(c), true) = (&self.cache, record) {
            asked.clear();
            asked.extend(ids.iter().map(|&id| id as u64));
            c.asked(li, asked);
        }
        let c = &self.counters;
        if caller == Caller::User {
            c.hits.fetch_add(hits, Ordering::Relaxed);
            c.misses
                .fetch_add(plan.order.len() as u64, Ordering::Relaxed);
        }
    }

    /// Reads `plan`'s extents through `path` into `out` (`slot`: the buffered path's read
    /// buffer, made on first use). Extents that fail land in `failures`; Err only when the path
    /// itself fails (a ring as a whole, a thread pool that cannot start).
    fn read_misses(
        &self,
        path: ReadPath,
        layer: &layout::LayerLayout,
        plan: &Plan,
        out: &OutRows,
        slot: &mut Option<AlignedBuf>,
        failures: &mut Vec<Failure>,
    ) -> Result<()> {
        match path {
            ReadPath::Uring if self.rings_for(plan.extents.len()) > 1 => {
                let rings = self.rings_for(plan.extents.len());
                self.read_rings(layer, plan, out, failures, rings)?;
            }
            ReadPath::Uring => {
                let mut reader = self.take_ring()?;
                let all = 0..plan.extents.len();
                if let Err(e) = reader.read(self, layer, plan, all, out, failures) {
                    // The ring failed as a whole: never reuse it (its queues may hold stale
                    // entries); the next lookup on this thread sets up a fresh one.
                    return Err(Error::io(
                        self.layout.path(layer.weight.file),
                        "io_uring_enter",
                        e,
                    ));
                }
                self.give_ring(reader);
            }
            ReadPath::Preadv => preadv::read_pooled(self, self.pool()?, layer, plan, out, failures),
            ReadPath::Mmap => mmap::read_mapped(self, layer, plan, out, failures),
            ReadPath::Buffered | ReadPath::Auto => {
                let slot = slot.get_or_insert_with(|| AlignedBuf::new(MAX_EXTENT as usize));
                preadv::read_buffered(self, layer, plan, out, slot, failures)
            }
        }
        Ok(())
    }

    /// Counts a batch's reads: the extents issued, the bytes they asked for and the distinct
    /// rows they delivered.
    fn count_reads(&self, plan: &Plan) {
        let c = &self.counters;
        c.reads
            .fetch_add(plan.extents.len() as u64, Ordering::Relaxed);
        let bytes: u64 = plan.extents.iter().map(|e| u64::from(e.len)).sum();
        c.bytes.fetch_add(bytes, Ordering::Relaxed);
        c.rows_read
            .fetch_add(plan.uniques.len() as u64, Ordering::Relaxed);
    }

    /// The error of a batch some of whose reads failed (`None` when none did): every row the
    /// failed reads held, and the first failure's file, offset and cause (taken out of it).
    fn row_read_error(
        &self,
        layer: &layout::LayerLayout,
        plan: &Plan,
        failures: &mut [Failure],
    ) -> Option<Error> {
        if failures.is_empty() {
            return None;
        }
        let rows = plan.rows_of(failures.iter().map(|f| f.extent as usize));
        let first = failures.first_mut()?;
        let ext = plan.extents.get(first.extent as usize).copied();
        let mut source = std::mem::replace(&mut first.error, io::Error::other(""));
        if source.kind() == io::ErrorKind::UnexpectedEof
            && let Some(e) = ext
        {
            // Say where the file ends now, not where the read stopped.
            let now = match self.current_len(e.file as usize) {
                Ok(len) => format!("the file is {len} bytes now"),
                Err(err) => format!("its length is unknown ({err})"),
            };
            source = io::Error::new(io::ErrorKind::UnexpectedEof, format!("{source}; {now}"));
        }
        Some(Error::RowRead {
            layer: layer.layer,
            rows: RowIds(rows),
            file: ext.map_or_else(PathBuf::new, |e| {
                self.layout.path(e.file as usize).to_path_buf()
            }),
            offset: ext.map_or(0, |e| e.offset),
            source,
        })
    }

    /// Hands the row cache the rows a batch read, from the store's own copies only (`fill`, the
    /// rows as read, and the resident scales): never read `weights_out` or `scales_out` back.
    fn fill_cache(
        &self,
        cache: &RowCache,
        li: usize,
        plan: &Plan,
        fill: &[u8],
        resident: Option<&Vec<u8>>,
    ) {
        let (dim, sdim) = (self.layout.dim, self.layout.dim / MX_BLOCK);
        let row_bytes = dim + sdim;
        for (u, unique) in plan.uniques.iter().enumerate() {
            let Some(row) = fill.get(u * row_bytes..(u + 1) * row_bytes) else {
                continue;
            };
            let (w, read_scales) = row.split_at(dim);
            let at = (unique.row - self.rows.start) as usize * sdim;
            let s = match resident {
                Some(scales) => scales.get(at..at + sdim).unwrap_or(read_scales),
                None => read_scales,
            };
            cache.insert(li, unique.row, w, s);
        }
    }
}

#[cfg(test)]
mod env_tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn no_variables_give_the_defaults() {
        let o = StoreOptions::from_vars(vars(&[])).unwrap();
        let d = StoreOptions::default();
        assert_eq!(
            (o.read_path, o.cache_bytes, o.uring_depth, o.direct_io),
            (d.read_path, d.cache_bytes, d.uring_depth, d.direct_io)
        );
    }

    #[test]
    fn each_variable_overrides_its_field() {
        let o = StoreOptions::from_vars(vars(&[
            ("FETCHAHEAD_READ_PATH", "preadv"),
            ("FETCHAHEAD_CACHE_BYTES", "512M"),
            ("FETCHAHEAD_URING_DEPTH", "32"),
            ("FETCHAHEAD_PREADV_THREADS", "8"),
            ("FETCHAHEAD_DIRECT_IO", "0"),
        ]))
        .unwrap();
        assert_eq!(o.read_path, ReadPath::Preadv);
        assert_eq!(o.cache_bytes, 512 << 20);
        assert_eq!(o.uring_depth, 32);
        assert_eq!(o.preadv_threads, 8);
        assert!(!o.direct_io);
        assert_eq!(parse_bytes("2GiB"), Some(2 << 30));
        assert_eq!(parse_bytes("4096"), Some(4096));
    }

    #[test]
    fn a_malformed_value_names_its_variable() {
        for (name, value) in [
            ("FETCHAHEAD_READ_PATH", "fast"),
            ("FETCHAHEAD_CACHE_BYTES", "lots"),
            ("FETCHAHEAD_URING_DEPTH", "0"),
            ("FETCHAHEAD_DIRECT_IO", "maybe"),
        ] {
            let e = StoreOptions::from_vars(vars(&[(name, value)])).unwrap_err();
            assert!(e.to_string().contains(name), "{e}");
        }
    }
}
