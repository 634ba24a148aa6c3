//! Helpers the benches share (each bench includes this folder with `mod common;`): the
//! environment knobs, the table a bench writes and the folder it goes to, and the row store a
//! bench reads that table through.
#![allow(dead_code)]
use std::path::Path;
use std::sync::Arc;

use fetchahead::store::{ReadPath, RowStore, StoreOptions};

/// The number in environment variable `name`, or `default` when it is unset or not a number.
pub fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A fresh folder for a bench's table: under `FETCHAHEAD_BENCH_DIR` when set (a folder on the
/// NVMe drive to measure), else the system's temporary folder.
pub fn table_dir() -> tempfile::TempDir {
    match std::env::var_os("FETCHAHEAD_BENCH_DIR") {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .expect("temp dir for the bench table")
}

/// Writes a one-shard table of `rows` rows of `dim` bytes for `layers` into a fresh
/// [`table_dir`], saying where and how long it took.
pub fn write_bench_table(
    rows: u64,
    layers: Vec<u32>,
    dim: usize,
) -> (tempfile::TempDir, fetchahead::store::make::TableSpec) {
    use fetchahead::store::make::{TableSpec, write_table};
    let tmp = table_dir();
    let spec = TableSpec {
        rows,
        layers,
        dim,
        shards: 1,
        seed: 1,
    };
    let t = std::time::Instant::now();
    write_table(tmp.path(), &spec, |_| {}).expect("write the bench table");
    println!(
        "table: {} ({:.0} MiB, written in {:.1} s)",
        tmp.path().display(),
        spec.data_bytes() as f64 / (1u64 << 20) as f64,
        t.elapsed().as_secs_f64()
    );
    (tmp, spec)
}

/// A bench's row store over its table, and how it reads.
pub struct BenchStore {
    pub store: Arc<RowStore>,
    /// What the measurement reads through, for the report.
    pub what: String,
    /// No row cache: the page cache is to be emptied before each measured step (a cold read).
    pub evict: bool,
}

impl BenchStore {
    /// The table in `dir` read through io_uring (preadv where this kernel has none, said
    /// loudly), O_DIRECT where the filesystem allows it, with a DRAM row cache of `cache_bytes`
    /// (0: none, and the page cache evicted before each step). `label` names the configuration
    /// in the warnings.
    pub fn open(label: &str, dir: &Path, cache_bytes: u64) -> BenchStore {
        let open = |read_path| {
            let options = StoreOptions {
                read_path,
                cache_bytes,
                ..Default::default()
            };
            Arc::new(RowStore::open(dir, options).expect("open the bench table"))
        };
        let mut store = open(ReadPath::Uring);
        if let Err(why) = store.uring() {
            println!("WARNING: no io_uring ({why}): {label} lookups read through preadv");
            store = open(ReadPath::Preadv);
        }
        let direct = match store.direct_io() {
            Ok(()) => "O_DIRECT".to_string(),
            Err(why) => {
                println!(
                    "WARNING: no O_DIRECT ({why}): misses read through the page cache, which \
                     the cold run empties before each step"
                );
                "buffered".to_string()
            }
        };
        let evict = cache_bytes == 0;
        let what = if evict {
            format!(
                "{} {direct}, no row cache, page cache evicted before each step",
                store.read_path()
            )
        } else {
            format!("{} MiB DRAM row cache filled first", cache_bytes >> 20)
        };
        BenchStore { store, what, evict }
    }
}

/// Looks every row `0..rows` of each of `tables` (rows of `dim` bytes) up once, so that the row
/// cache holds the whole table.
pub fn fill_row_cache(
    tables: &[Arc<dyn fetchahead_lab::forward::LayerTable>],
    rows: u64,
    dim: usize,
) {
    let batch = 4096;
    let mut w = vec![0u8; batch * dim];
    let mut s = vec![0u8; batch * dim / 32];
    for t in tables {
        for first in (0..rows).step_by(batch) {
            let ids: Vec<i64> = (first..(first + batch as u64).min(rows))
                .map(|i| i as i64)
                .collect();
            let n = ids.len();
            t.lookup(&ids, &mut w[..n * dim], &mut s[..n * dim / 32])
                .expect("fill the row cache");
        }
    }
}
