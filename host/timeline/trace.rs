//! The timeline read back and written as a Chrome trace: no GPU needed, so that the conversion is
//! tested on synthetic rings.
use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::path::Path;

use fetchahead_gpu::timeline::{NO_LABEL, TimelineRecord};
use fetchahead_gpu::{collective, dequant, gather, gemv, l2_prefetch, spin, staged};
use serde_json::{Value, json};

use crate::{Error, Result};

/// Words of the ring header, then of each record (the layout of `fetchahead_gpu::timeline`).
const HEADER_WORDS: usize = (fetchahead_gpu::timeline::HEADER_BYTES / 8) as usize;
const RECORD_WORDS: usize = (fetchahead_gpu::timeline::RECORD_BYTES / 8) as usize;

/// The blocks one read of the ring holds, oldest start first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Capture {
    /// Every finished block the ring still held, sorted by start, then SM, then block.
    pub records: Vec<TimelineRecord>,
    /// Blocks whose records the ring overwrote before the read (it wrapped).
    pub lost: u64,
    /// Records reserved but not finished at the read (or overwritten while a block ran).
    pub unfinished: u64,
}

impl Capture {
    /// Parses a ring copied back from the device as u64 words: the header (`head`,
    /// `capacity`), then `capacity` records. Only the last `capacity` reservations survive a
    /// wrap; the others are counted in [`Capture::lost`].
    pub fn from_ring_words(words: &[u64]) -> Result<Capture> {
        let bad = |why: String| Err(Error::invalid("timeline ring", why));
        let [head, capacity] = match words.get(..HEADER_WORDS) {
            Some(&[head, capacity]) => [head, capacity],
            _ => return bad(format!("{} words, shorter than its header", words.len())),
        };
        if !capacity.is_power_of_two() {
            return bad(format!("capacity {capacity} is not a power of two"));
        }
        let need = (capacity as u128) * RECORD_WORDS as u128 + HEADER_WORDS as u128;
        if (words.len() as u128) < need {
            return bad(format!(
                "{} words for a capacity of {capacity} records ({need} words)",
                words.len()
            ));
        }
        let kept = head.min(capacity);
        let mut capture = Capture {
            records: Vec::with_capacity(kept as usize),
            lost: head - kept,
            unfinished: 0,
        };
        for reserved in head - kept..head {
            let at = HEADER_WORDS + (reserved & (capacity - 1)) as usize * RECORD_WORDS;
            let w = &words[at..at + RECORD_WORDS];
            let record = TimelineRecord {
                start_ns: w[0],
                end_ns: w[1],
                kernel: w[2] as u32,
                label: (w[2] >> 32) as u32,
                block: w[3] as u32,
                sm: (w[3] >> 32) as u32,
            };
            if record.start_ns == 0 || record.end_ns < record.start_ns {
                capture.unfinished += 1;
            } else {
                capture.records.push(record);
            }
        }
        capture
            .records
            .sort_by_key(|r| (r.start_ns, r.sm, r.block, r.kernel));
        Ok(capture)
    }
}

/// What a kernel is, for a trace's categories and colors.
pub fn kind_of(kernel: &str) -> &'static str {
    fn has(mut names: impl Iterator<Item = &'static str>, kernel: &str) -> bool {
        names.any(|n| n == kernel)
    }
    if has(l2_prefetch::VARIANTS.iter().map(|v| v.name), kernel) {
        "l2 prefetch"
    } else if kernel == collective::KERNEL {
        "collective"
    } else if has(gemv::VARIANTS.iter().map(|v| v.name), kernel) {
        "reader"
    } else if kernel == spin::KERNEL {
        "spin"
    } else if kernel == staged::KERNEL
        || has(gather::VARIANTS.iter().map(|v| v.name), kernel)
        || has(dequant::VARIANTS.iter().map(|v| v.name), kernel)
    {
        "engram gather"
    } else {
        "other"
    }
}

/// The name of kernel `id` (its index in `fetchahead_gpu::all_kernels`).
pub fn kernel_name(id: u32) -> String {
    fetchahead_gpu::all_kernels()
        .nth(id as usize)
        .map_or_else(|| format!("kernel {id}"), |e| e.name.to_string())
}

/// Steps' captures, each its own process in the trace ("eager step 3", "replayed step 3"), its
/// SMs its threads, its times from its own first block, so that steps line up side by side.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    steps: Vec<(String, Capture)>,
}

impl Trace {
    pub fn new() -> Trace {
        Trace::default()
    }

    /// Adds one step's capture under `name`.
    pub fn add_step(&mut self, name: impl Into<String>, capture: Capture) {
        self.steps.push((name.into(), capture));
    }

    /// Each step's name with the records it lost to a wrap and left unfinished.
    pub fn losses(&self) -> impl Iterator<Item = (&str, u64, u64)> {
        self.steps
            .iter()
            .map(|(name, c)| (name.as_str(), c.lost, c.unfinished))
    }

    /// Blocks recorded over all steps.
    pub fn records(&self) -> usize {
        self.steps.iter().map(|(_, c)| c.records.len()).sum()
    }

    /// The Chrome trace (the JSON object format Perfetto and `chrome://tracing` open): one
    /// complete event (`ph: "X"`, `ts` and `dur` in microseconds) a block.
    pub fn to_json(&self) -> Value {
        let mut events = Vec::new();
        let mut losses = BTreeMap::new();
        for (index, (name, capture)) in self.steps.iter().enumerate() {
            let pid = index as u64 + 1;
            events.push(json!({
                "ph": "M", "name": "process_name", "pid": pid, "args": { "name": name },
            }));
            events.push(json!({
                "ph": "M", "name": "process_sort_index", "pid": pid,
                "args": { "sort_index": index },
            }));
            let origin = capture.records.first().map_or(0, |r| r.start_ns);
            let mut sms: Vec<u32> = capture.records.iter().map(|r| r.sm).collect();
            sms.sort_unstable();
            sms.dedup();
            for sm in sms {
                events.push(json!({
                    "ph": "M", "name": "thread_name", "pid": pid, "tid": sm,
                    "args": { "name": format!("SM {sm}") },
                }));
            }
            let names: Vec<String> = (0..fetchahead_gpu::all_kernels().count() as u32)
                .map(kernel_name)
                .collect();
            for r in &capture.records {
                let kernel = names
                    .get(r.kernel as usize)
                    .cloned()
                    .unwrap_or_else(|| kernel_name(r.kernel));
                let (label, window) = if r.label == NO_LABEL {
                    (kernel.clone(), Value::Null)
                } else {
                    (format!("{kernel} (window {})", r.label), json!(r.label))
                };
                events.push(json!({
                    "ph": "X",
                    "name": label,
                    "cat": kind_of(&kernel),
                    "pid": pid,
                    "tid": r.sm,
                    "ts": (r.start_ns - origin) as f64 / 1e3,
                    "dur": (r.end_ns - r.start_ns) as f64 / 1e3,
                    "args": {
                        "kernel": kernel,
                        "block": r.block,
                        "window": window,
                        "start_ns": r.start_ns,
                    },
                }));
            }
            losses.insert(
                name.clone(),
                json!({ "lost": capture.lost, "unfinished": capture.unfinished }),
            );
        }
        json!({
            "traceEvents": events,
            "displayTimeUnit": "ns",
            "otherData": { "producer": "fetchahead timeline", "records": losses },
        })
    }

    /// Writes the trace to `path`: to a temporary name beside it, renamed into place when
    /// complete. An existing `path` is replaced only with `force`, and never through a symlink.
    pub fn write(&self, path: &Path, force: bool) -> Result<()> {
        let io =
            |e: std::io::Error| Error::invalid("trace file", format!("{}: {e}", path.display()));
        match fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(Error::invalid(
                    "trace file",
                    format!("{} is a symlink; name the file itself", path.display()),
                ));
            }
            Ok(_) if !force => {
                return Err(Error::invalid(
                    "trace file",
                    format!("{} exists; pass --force to replace it", path.display()),
                ));
            }
            _ => {}
        }
        let text = serde_json::to_vec(&self.to_json())
            .map_err(|e| Error::invalid("trace file", format!("JSON: {e}")))?;
        let name = path.file_name().ok_or_else(|| {
            Error::invalid("trace file", format!("{} names no file", path.display()))
        })?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}.tmp", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let written = (|| {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)?;
            f.write_all(&text)?;
            f.sync_all()?;
            fs::rename(&tmp, path)
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(io(e));
        }
        Ok(())
    }
}
