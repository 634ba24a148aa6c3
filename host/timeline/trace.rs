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

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring of `capacity` records after `head` reservations, reservation `r` of `records`
    /// written into its slot (later reservations over earlier ones, as on the device).
    fn ring(capacity: u64, records: &[TimelineRecord]) -> Vec<u64> {
        let mut words = vec![0u64; HEADER_WORDS + capacity as usize * RECORD_WORDS];
        words[0] = records.len() as u64;
        words[1] = capacity;
        for (r, rec) in records.iter().enumerate() {
            let at = HEADER_WORDS + (r as u64 & (capacity - 1)) as usize * RECORD_WORDS;
            words[at] = rec.start_ns;
            words[at + 1] = rec.end_ns;
            words[at + 2] = rec.kernel as u64 | (rec.label as u64) << 32;
            words[at + 3] = rec.block as u64 | (rec.sm as u64) << 32;
        }
        words
    }

    fn record(start_ns: u64, end_ns: u64, kernel: u32, block: u32, sm: u32) -> TimelineRecord {
        TimelineRecord {
            start_ns,
            end_ns,
            kernel,
            label: 7,
            block,
            sm,
        }
    }

    fn id_of(name: &str) -> u32 {
        fetchahead_gpu::all_kernels()
            .position(|e| e.name == name)
            .unwrap() as u32
    }

    #[test]
    fn records_come_back_sorted_by_start() {
        let recs = [
            record(5_000, 6_000, 1, 0, 3),
            record(1_000, 9_000, 2, 1, 0),
            record(3_000, 3_500, 1, 2, 1),
        ];
        let c = Capture::from_ring_words(&ring(8, &recs)).unwrap();
        assert_eq!((c.lost, c.unfinished), (0, 0));
        let starts: Vec<u64> = c.records.iter().map(|r| r.start_ns).collect();
        assert_eq!(starts, [1_000, 3_000, 5_000]);
        assert_eq!(c.records[0], recs[1], "every field read back");
    }

    #[test]
    fn a_wrapped_ring_keeps_the_newest_and_counts_the_lost() {
        // Six reservations into four slots: the first two were overwritten.
        let recs: Vec<TimelineRecord> = (0..6)
            .map(|i| record(100 * (i + 1), 100 * (i + 1) + 50, 0, i as u32, 0))
            .collect();
        let c = Capture::from_ring_words(&ring(4, &recs)).unwrap();
        assert_eq!(c.lost, 2);
        assert_eq!(c.unfinished, 0);
        let blocks: Vec<u32> = c.records.iter().map(|r| r.block).collect();
        assert_eq!(blocks, [2, 3, 4, 5]);
    }

    #[test]
    fn an_unfinished_block_is_counted_not_drawn() {
        let recs = [record(1_000, 0, 0, 0, 0), record(2_000, 2_100, 0, 1, 0)];
        let c = Capture::from_ring_words(&ring(4, &recs)).unwrap();
        assert_eq!((c.records.len(), c.unfinished), (1, 1));
        // Reserved but not yet started: counted too.
        let mut words = ring(4, &recs);
        words[0] = 3;
        let c = Capture::from_ring_words(&words).unwrap();
        assert_eq!((c.records.len(), c.unfinished), (1, 2));
    }

    #[test]
    fn a_bad_ring_is_an_error_not_a_panic() {
        assert!(Capture::from_ring_words(&[]).is_err());
        assert!(Capture::from_ring_words(&[0, 3, 0, 0, 0, 0]).is_err());
        assert!(
            Capture::from_ring_words(&[1, 4, 0, 0, 0, 0]).is_err(),
            "short"
        );
        assert!(Capture::from_ring_words(&[0, 1 << 63]).is_err(), "huge");
        assert!(
            Capture::from_ring_words(&ring(2, &[]))
                .unwrap()
                .records
                .is_empty()
        );
    }

    #[test]
    fn the_trace_is_chrome_json_with_eager_and_replayed_side_by_side() {
        let (prefetch, reader) = (id_of("l2_prefetch_loads"), id_of("gemv_bf16_m8_cluster"));
        let eager = [
            record(10_000, 14_000, prefetch, 0, 5),
            record(12_000, 13_000, reader, 3, 9),
        ];
        let replayed = [record(90_000, 91_500, reader, 1, 2)];
        let mut trace = Trace::new();
        trace.add_step(
            "eager step 1",
            Capture::from_ring_words(&ring(4, &eager)).unwrap(),
        );
        let mut words = ring(1, &replayed);
        words[0] = 3; // two blocks lost to the wrap
        trace.add_step("replayed step 1", Capture::from_ring_words(&words).unwrap());
        let text = serde_json::to_string(&trace.to_json()).unwrap();
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, trace.to_json(), "round trip");
        let events = back["traceEvents"].as_array().unwrap();
        let spans: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(spans.len(), 3);
        // Times in microseconds from each step's first block.
        assert_eq!(spans[0]["ts"], 0.0);
        assert_eq!(spans[0]["dur"], 4.0);
        assert_eq!(spans[1]["ts"], 2.0);
        assert_eq!(spans[2]["ts"], 0.0, "the replayed step starts at 0 too");
        assert_eq!(spans[0]["name"], "l2_prefetch_loads (window 7)");
        assert_eq!(spans[0]["cat"], "l2 prefetch");
        assert_eq!(spans[1]["cat"], "reader");
        assert_eq!(spans[0]["tid"], 5, "tid is the SM");
        assert_eq!(spans[1]["args"]["block"], 3);
        assert_eq!(spans[1]["args"]["window"], 7);
        assert_ne!(spans[0]["pid"], spans[2]["pid"], "one process a step");
        let name_of = |pid: &Value| {
            events
                .iter()
                .find(|e| e["ph"] == "M" && e["name"] == "process_name" && &e["pid"] == pid)
                .map(|e| e["args"]["name"].clone())
        };
        assert_eq!(name_of(&spans[0]["pid"]), Some(json!("eager step 1")));
        assert_eq!(name_of(&spans[2]["pid"]), Some(json!("replayed step 1")));
        assert_eq!(back["otherData"]["records"]["replayed step 1"]["lost"], 2);
        let losses: Vec<_> = trace.losses().collect();
        assert_eq!(losses, [("eager step 1", 0, 0), ("replayed step 1", 2, 0)]);
    }

    #[test]
    fn an_unlabelled_launch_is_named_by_its_kernel_alone() {
        let mut r = record(1, 2, id_of("spin"), 0, 0);
        r.label = NO_LABEL;
        let mut trace = Trace::new();
        trace.add_step("s", Capture::from_ring_words(&ring(1, &[r])).unwrap());
        let json = trace.to_json();
        let span = json["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["ph"] == "X")
            .unwrap()
            .clone();
        assert_eq!(span["name"], "spin");
        assert_eq!(span["cat"], "spin");
        assert_eq!(span["args"]["window"], Value::Null);
    }

    #[test]
    fn every_instrumented_kernel_has_a_kind() {
        for name in ["l2_prefetch", "collective_spin", "gemv_bf16_m8", "spin"] {
            assert_ne!(kind_of(name), "other", "{name}");
        }
        assert_eq!(kind_of("staged_dequant_tagged"), "engram gather");
        assert_eq!(kind_of("gather_dequant_packed"), "engram gather");
        assert_eq!(kind_of("hash_ngrams"), "other");
        assert_eq!(kernel_name(u32::MAX), format!("kernel {}", u32::MAX));
    }

    #[test]
    fn writing_replaces_nothing_without_force_and_never_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let mut trace = Trace::new();
        trace.add_step(
            "s",
            Capture::from_ring_words(&ring(2, &[record(1, 5, 0, 0, 0)])).unwrap(),
        );
        let out = dir.path().join("t.json");
        trace.write(&out, false).unwrap();
        let text = fs::read_to_string(&out).unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&text).unwrap(),
            trace.to_json()
        );
        assert!(trace.write(&out, false).is_err(), "exists, no force");
        trace.write(&out, true).unwrap();
        let target = dir.path().join("other");
        fs::write(&target, "not mine").unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(trace.write(&link, true).is_err());
        assert_eq!(fs::read_to_string(&target).unwrap(), "not mine");
        let left: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 3, "no temporary file left behind");
    }
}
