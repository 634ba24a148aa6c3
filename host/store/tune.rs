//! `Auto`'s choice of read path by batch size, measured on this disk by `fetchahead tune` and
//! kept beside the table.
use std::path::{Path, PathBuf};

use super::measure::{percentiles_us, time_lookups, unique_rows};
use super::{ReadPath, RowStore};
use crate::{Error, Result};

/// The file `tune` writes: `DIR/fetchahead-tune.json`, or `FILE.tune.json` beside one file.
pub fn tune_file(table: &Path) -> PathBuf {
    if table.is_dir() {
        table.join("fetchahead-tune.json")
    } else {
        let mut name = table.as_os_str().to_owned();
        name.push(".tune.json");
        PathBuf::from(name)
    }
}

/// Batches up to `max_batch` rows use `path`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TunedRange {
    pub max_batch: u64,
    pub path: ReadPath,
    /// The cold median that decided it, for the record.
    pub p50_us: f64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tuning {
    /// Sorted by `max_batch`; empty: never measured.
    pub ranges: Vec<TunedRange>,
}

impl Tuning {
    /// The measured choice for a batch of `n` rows; unmeasured, io_uring when the kernel has it
    /// (every read in flight), else the preadv pool.
    pub fn choose(&self, n: usize, uring: bool) -> ReadPath {
        let tuned = self
            .ranges
            .iter()
            .find(|r| n as u64 <= r.max_batch)
            .or(self.ranges.last())
            .map(|r| r.path)
            .filter(|&p| uring || p != ReadPath::Uring);
        tuned.unwrap_or(if uring {
            ReadPath::Uring
        } else {
            ReadPath::Preadv
        })
    }

    pub fn load(file: &Path) -> Result<Option<Self>> {
        let bytes = match std::fs::read(file) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(file, "read", e)),
        };
        let bad = |why: &str| Error::invalid("tune file", format!("{}: {why}", file.display()));
        let value: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| bad(&e.to_string()))?;
        let list = value
            .get("ranges")
            .and_then(|r| r.as_array())
            .ok_or_else(|| bad("no `ranges` list"))?;
        let mut ranges = Vec::with_capacity(list.len());
        for r in list {
            let max_batch = r
                .get("max_batch")
                .and_then(|m| m.as_u64())
                .ok_or_else(|| bad("a range lacks max_batch"))?;
            let path = r
                .get("path")
                .and_then(|p| p.as_str())
                .and_then(|p| p.parse::<ReadPath>().ok())
                .ok_or_else(|| bad("a range lacks a known path"))?;
            let p50_us = r.get("p50_us").and_then(|p| p.as_f64()).unwrap_or(0.0);
            ranges.push(TunedRange {
                max_batch,
                path,
                p50_us,
            });
        }
        ranges.sort_by_key(|r| r.max_batch);
        Ok(Some(Tuning { ranges }))
    }

    pub fn save(&self, file: &Path) -> Result<()> {
        let ranges: Vec<serde_json::Value> = self
            .ranges
            .iter()
            .map(|r| serde_json::json!({"max_batch": r.max_batch, "path": r.path.name(), "p50_us": r.p50_us}))
            .collect();
        let text = serde_json::to_string_pretty(&serde_json::json!({ "ranges": ranges }))
            .map_err(|e| Error::invalid("tune file", e.to_string()))?;
        std::fs::write(file, text).map_err(|e| Error::io(file, "write", e))
    }
}

/// One measured (batch, path) pair.
#[derive(Clone, Copy, Debug)]
pub struct TuneSample {
    pub batch: usize,
    pub path: ReadPath,
    pub p50_us: f64,
}

/// Times every available path on cold batches of growing size and keeps the fastest for each (a
/// later path must beat an earlier one by 5%);
/// each size's choice holds up to the geometric middle between it and the next size.
pub fn measure(
    store: &RowStore,
    layer: u32,
    seed: u64,
    mut report: impl FnMut(&TuneSample),
) -> Result<Tuning> {
    const SIZES: [(usize, usize); 4] = [(8, 50), (72, 50), (4096, 5), (32768, 2)];
    let range = store.row_range();
    let mut best: Vec<TuneSample> = Vec::new();
    for (k, &(batch, iters)) in SIZES.iter().enumerate() {
        let batches: Vec<Vec<i64>> = (0..iters)
            .map(|i| unique_rows(range.clone(), batch, seed ^ ((k * 1000 + i) as u64)))
            .collect();
        let mut winner: Option<TuneSample> = None;
        for path in ReadPath::ALL {
            // One read at a time cannot win at these sizes and would take minutes.
            if (path == ReadPath::Buffered && batch > 4096)
                || (path == ReadPath::Uring && store.uring().is_err())
            {
                continue;
            }
            let times = time_lookups(store, path, layer, &batches, true)?;
            let sample = TuneSample {
                batch,
                path,
                p50_us: percentiles_us(&times).0,
            };
            report(&sample);
            // Ties within noise go to the path measured first (ReadPath::ALL's order).
            if winner.is_none_or(|w| sample.p50_us < w.p50_us * 0.95) {
                winner = Some(sample);
            }
        }
        best.extend(winner);
    }
    let mut ranges = Vec::with_capacity(best.len());
    for (i, s) in best.iter().enumerate() {
        let max_batch = match best.get(i + 1) {
            Some(next) => ((s.batch as f64 * next.batch as f64).sqrt()) as u64,
            None => u64::MAX,
        };
        ranges.push(TunedRange {
            max_batch,
            path: s.path,
            p50_us: s.p50_us,
        });
    }
    Ok(Tuning { ranges })
}
