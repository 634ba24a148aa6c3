//! `Auto`'s choice of read path by batch size, measured on this disk by `fetchahead tune` and
//! kept beside the table. `Auto` never takes the mmap path: a shard truncated under a mapping
//! raises SIGBUS, which would kill the engine; mmap is measured for the record only and is there
//! for callers who ask for it by name.
use std::path::{Path, PathBuf};

use super::file::{read_small_optional, write_replacing};
use super::measure::{percentiles_us, time_lookups, unique_rows};
use super::{ReadPath, RowStore};
use crate::{Error, Result};

/// A tune file larger than this is not one.
const MAX_TUNE_FILE: u64 = 1 << 20;

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
    /// The measured choice for a batch of `n` rows; unmeasured (or measured as mmap, which
    /// `Auto` never takes), io_uring when the kernel has it (every read in flight), else the
    /// preadv pool.
    pub fn choose(&self, n: usize, uring: bool) -> ReadPath {
        let tuned = self
            .ranges
            .iter()
            .find(|r| n as u64 <= r.max_batch)
            .or(self.ranges.last())
            .map(|r| r.path)
            .filter(|&p| (uring || p != ReadPath::Uring) && p != ReadPath::Mmap);
        tuned.unwrap_or(if uring {
            ReadPath::Uring
        } else {
            ReadPath::Preadv
        })
    }

    /// Reads a tune file (`None` when there is none); a FIFO or device there is refused. A tune
    /// file is a hint: one that does not parse is ignored with a warning (`Auto` then chooses
    /// as if never tuned), and `fetchahead tune --force` replaces it.
    pub fn load(file: &Path) -> Result<Option<Self>> {
        let Some(bytes) = read_small_optional(file, MAX_TUNE_FILE)? else {
            return Ok(None);
        };
        match Self::parse(file, &bytes) {
            Ok(tuning) => Ok(Some(tuning)),
            Err(e) => {
                log::warn!(
                    "fetchahead: ignoring the tune file ({e}); Auto chooses as if never tuned \
                     (`fetchahead tune --force` replaces it)"
                );
                Ok(None)
            }
        }
    }

    fn parse(file: &Path, bytes: &[u8]) -> Result<Self> {
        let bad = |why: &str| Error::invalid("tune file", format!("{}: {why}", file.display()));
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| bad(&e.to_string()))?;
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
        Ok(Tuning { ranges })
    }

    /// Writes the tune file through a temporary file renamed into place. Refuses to replace
    /// what is not a tune file (a symlink, another file, a FIFO) unless `force`.
    pub fn save(&self, file: &Path) -> Result<()> {
        self.save_with(file, false)
    }

    /// [`save`](Self::save); `force` replaces whatever is at `file` (a symlink itself, never
    /// what it points at).
    pub fn save_with(&self, file: &Path, force: bool) -> Result<()> {
        Self::check_replaceable(file, force)?;
        let ranges: Vec<serde_json::Value> = self
            .ranges
            .iter()
            .map(|r| serde_json::json!({"max_batch": r.max_batch, "path": r.path.name(), "p50_us": r.p50_us}))
            .collect();
        let text = serde_json::to_string_pretty(&serde_json::json!({ "ranges": ranges }))
            .map_err(|e| Error::invalid("tune file", e.to_string()))?;
        write_replacing(file, text.as_bytes())
    }

    /// Whether [`save_with`](Self::save_with) could write `file`, checked before measuring so
    /// that `tune` never measures for seconds to find it cannot keep the result: what is there
    /// must be a tune file (or `force`), and its directory writable.
    pub fn check_can_save(file: &Path, force: bool) -> Result<()> {
        Self::check_replaceable(file, force)?;
        let dir = match file.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::invalid("tune file", format!("{dir:?} holds a NUL byte")))?;
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        if unsafe { libc::access(c.as_ptr(), libc::W_OK) } != 0 {
            return Err(Error::io(
                file,
                "write (checked before measuring)",
                std::io::Error::last_os_error(),
            ));
        }
        Ok(())
    }

    /// Refuses to replace what is not a tune file (unless `force`).
    fn check_replaceable(file: &Path, force: bool) -> Result<()> {
        if !force && let Ok(meta) = std::fs::symlink_metadata(file) {
            let ours = meta.file_type().is_file()
                && read_small_optional(file, MAX_TUNE_FILE)
                    .ok()
                    .flatten()
                    .is_some_and(|b| Self::parse(file, &b).is_ok());
            if !ours {
                let what = if meta.file_type().is_file() {
                    "a file that is not a tune file"
                } else {
                    super::file::kind_of(meta.file_type())
                };
                return Err(Error::WouldOverwrite {
                    path: file.to_path_buf(),
                    why: format!(
                        "it is {what}, which fetchahead tune did not write (pass --force to \
                         replace it)"
                    ),
                });
            }
        }
        Ok(())
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
/// later path must beat an earlier one by 5%; mmap is timed and reported but never kept);
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
            // Ties within noise go to the path measured first (ReadPath::ALL's order); mmap is
            // measured for the record, never chosen (SIGBUS on a truncated shard).
            if path != ReadPath::Mmap && winner.is_none_or(|w| sample.p50_us < w.p50_us * 0.95) {
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
