//! `fetchahead bench-io`: every read path on cold and warm data, for decode, mid and prefill
//! batches, beside a raw io_uring O_DIRECT 4 KiB random-read baseline of the same file at QD64.
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use fetchahead::store::measure::{percentiles_us, raw_random_reads, time_lookups, unique_rows};
use fetchahead::store::{ReadPath, RowStore, StoreOptions};
use serde_json::json;

mod trace;
mod workload;

#[derive(Args)]
pub struct BenchIoArgs {
    /// A model directory or one .safetensors file.
    pub dir: PathBuf,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Rows in the prefill batch.
    #[arg(long, default_value_t = 100_000)]
    pub prefill_rows: usize,
    /// Batches timed per (path, size): decode, 4096, prefill (three positive counts).
    #[arg(long, value_delimiter = ',', default_value = "50,5,2")]
    pub iters: Vec<usize>,
    /// 4 KiB reads in the baseline (at least 1).
    #[arg(long, default_value_t = 200_000)]
    pub baseline_reads: u64,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Reads in flight per io_uring lookup.
    #[arg(long, default_value_t = fetchahead::store::QUEUE_DEPTH)]
    pub uring_depth: u32,
    /// Only these read paths (comma-separated); all when not given.
    #[arg(long, value_delimiter = ',')]
    pub paths: Vec<ReadPath>,
    /// The Engram workload instead: ids drawn from Zipf laws with these exponents (e.g.
    /// 0.8,1.0,1.2), the cache's hit rate beside Belady's optimum per budget, cold reads beside
    /// fio, two layers and an advise at once.
    #[arg(long, value_delimiter = ',')]
    pub zipf: Vec<f64>,
    /// Cache budgets, percent of the rows the ids are drawn from.
    #[arg(long, value_delimiter = ',', default_value = "1,5,10")]
    pub budgets: Vec<f64>,
    /// Decode batches in a Zipf trace (the first half warms the cache, uncounted).
    #[arg(long, default_value_t = 2000)]
    pub decode_batches: usize,
    /// Rows a decode batch asks (per layer).
    #[arg(long, default_value_t = 72)]
    pub decode_rows: usize,
    /// Batches of a longer trace replayed through the cache's policy alone (no reads) beside
    /// Belady and the law's top-k mass, decode and prefill (prefill batches: this / 200); 0
    /// skips it. The default's uncounted first half is 7.2M references of 72-row decode
    /// batches: enough for the rows at a 5% budget's boundary to be seen (a tenth of it is not).
    #[arg(long, default_value_t = 200_000)]
    pub replay_batches: usize,
    /// Rows a Zipf prefill batch asks.
    #[arg(long, default_value_t = 20_000)]
    pub zipf_prefill_rows: usize,
    /// Prefill batches in a Zipf trace (the first half warms the cache, uncounted).
    #[arg(long, default_value_t = 12)]
    pub prefill_batches: usize,
    /// Ids use every STRIDE-th row only; 0: one row per read block, so that the rows of a batch
    /// rarely share a block, as in a production table (~384M rows a layer).
    #[arg(long, default_value_t = 0)]
    pub stride: u64,
    /// Seconds of each fio peer run (skipped with a reason where fio is missing).
    #[arg(long, default_value_t = 4)]
    pub fio_seconds: u32,
    /// Store and fio turns per configuration of the cold comparison (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub cold_rounds: usize,
    /// With --zipf: only the cold comparison with fio (no traces, no two-layer run).
    #[arg(long)]
    pub cold_only: bool,
    /// A real lookup trace instead (`.u64` or `.u64.xz`, row ids as little-endian u64): the
    /// store on it step by step beside Belady and LRU, ARC, W-TinyLFU and exact LFU. DIR is the
    /// table; where DIR is empty or absent a table of --trace-rows rows is written there once.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// The trace's scheduler steps (`.steps.u32`: decode, prefill token counts a step).
    #[arg(long, requires = "trace")]
    pub steps: Option<PathBuf>,
    /// Rows of the table written for --trace (the trace's R).
    #[arg(long, default_value_t = 10_344_164)]
    pub trace_rows: u64,
    /// FP8 elements a row of the table written for --trace.
    #[arg(long, default_value_t = 256)]
    pub trace_dim: usize,
    /// Row ids a token asks (Engram: 2 n-gram orders x 8 heads).
    #[arg(long, default_value_t = 16)]
    pub ids_per_token: usize,
    /// Tokens a batch when no --steps file is given.
    #[arg(long, default_value_t = 2048)]
    pub trace_batch_tokens: usize,
    /// Budgets replayed (no reads) beside the goal's four (1% and 5% of the trace's distinct
    /// rows and of R), in percent of the distinct rows.
    #[arg(long, value_delimiter = ',', default_value = "0.5,2,10,20")]
    pub trace_budgets: Vec<f64>,
    /// The trace's documents (a JSON array with each request's `prompt_tokens`, in arrival
    /// order): with --steps, the look-ahead measurement (a prompt's later chunks handed to the
    /// cache as future references from its first chunk on).
    #[arg(long, requires = "steps")]
    pub docs: Option<PathBuf>,
    /// Steps ahead a prompt's chunk is handed over at most (look-ahead).
    #[arg(long, default_value_t = 8)]
    pub lookahead_steps: u32,
    /// Look-ahead, replayed: rows of the chunks due at a step read ahead of it, at most this
    /// share of the cache's rows (0: marks only; the store reads at most
    /// `store::ahead::READ_AHEAD_SHARE`).
    #[arg(long, default_value_t = fetchahead::store::ahead::READ_AHEAD_SHARE)]
    pub read_ahead_share: f64,
    /// Look-ahead, replayed: a chunk is read ahead once its step is at most this many lookups
    /// away, the next one counted (the store's is `store::ahead::READ_AHEAD_LOOKUPS`).
    #[arg(long, default_value_t = fetchahead::store::ahead::READ_AHEAD_LOOKUPS)]
    pub read_ahead_lookups: u32,
    /// With --trace: replays only (no table, no reads).
    #[arg(long, requires = "trace")]
    pub replay_only: bool,
}

struct Row {
    path: &'static str,
    batch: usize,
    cold: bool,
    source: &'static str,
    samples: usize,
    rows_per_s: f64,
    iops: f64,
    p50_us: f64,
    p99_us: f64,
}

fn summarize(
    path: &'static str,
    batch: usize,
    cold: bool,
    source: &'static str,
    times: &[Duration],
    reads: u64,
) -> Row {
    let secs: f64 = times.iter().map(Duration::as_secs_f64).sum();
    let (p50_us, p99_us) = percentiles_us(times);
    Row {
        path,
        batch,
        cold,
        source,
        samples: times.len(),
        rows_per_s: (batch * times.len()) as f64 / secs,
        iops: reads as f64 / secs,
        p50_us,
        p99_us,
    }
}

/// What clap cannot check, before anything is opened or allocated.
fn validate(args: &BenchIoArgs) -> fetchahead::Result<()> {
    use fetchahead::Error;
    if args.iters.len() != 3 || args.iters.contains(&0) {
        return Err(Error::invalid(
            "--iters",
            format!(
                "{:?}: want three positive counts (decode, 4096 and prefill batches)",
                args.iters
            ),
        ));
    }
    if args.baseline_reads == 0 {
        return Err(Error::invalid("--baseline-reads", "0: want at least 1"));
    }
    if args.prefill_rows == 0 {
        return Err(Error::invalid("--prefill-rows", "0: want at least 1"));
    }
    // The store's own bounds, named as the flag.
    fetchahead::store::URING_DEPTH.check("--uring-depth", u64::from(args.uring_depth))?;
    if args.cold_rounds == 0 {
        return Err(Error::invalid("--cold-rounds", "0: want at least 1"));
    }
    Ok(())
}

pub fn run(args: &BenchIoArgs) -> fetchahead::Result<ExitCode> {
    validate(args)?;
    if args.trace.is_some() {
        return trace::run(args);
    }
    if !args.zipf.is_empty() {
        return workload::run(args);
    }
    let say = |line: String| {
        if !args.json {
            println!("{line}");
        }
    };
    let options = StoreOptions {
        uring_depth: args.uring_depth,
        ..StoreOptions::default()
    };
    let store = RowStore::open(&args.dir, options.clone())?;
    let layer = store.layers()[0];
    let span = store.layout().layer(layer).map(|l| l.weight.clone());
    let Some(span) = span else {
        return Ok(ExitCode::FAILURE);
    };
    let file = store.layout().path(span.file).to_path_buf();
    let direct = store.direct_io().is_ok();
    if let Err(why) = store.direct_io() {
        eprintln!(
            "WARNING: O_DIRECT is not supported here ({why}): the uring and preadv paths read through the page cache and the raw baseline is skipped"
        );
    }
    let baseline = if direct {
        let b = raw_random_reads(
            &file,
            span.offset..span.offset + span.len(),
            64,
            args.baseline_reads,
            args.seed,
        )?;
        say(format!(
            "baseline: raw io_uring O_DIRECT 4 KiB random reads of {} at QD64: {:.0} IOPS (p50 {:.0} us, p99 {:.0} us, {} reads)",
            file.display(),
            b.iops,
            b.p50_us,
            b.p99_us,
            b.reads
        ));
        Some(b)
    } else {
        None
    };
    // The prefill batch's ids, outputs and cache are sized by the argument: check it first.
    let row_bytes = (store.dim() + store.dim() / 32 + 64) as u64;
    fetchahead::memory::check_fits(
        (args.prefill_rows.max(4096) as u64).saturating_mul(row_bytes * 4),
        "the prefill batch's ids, outputs and row cache",
    )?;
    let sizes = [72, 4096, args.prefill_rows];
    let bench = Bench {
        args,
        store: &store,
        layer,
        sizes: &sizes,
        baseline_iops: baseline.map(|b| b.iops),
    };
    let mut rows = Vec::new();
    for path in ReadPath::ALL {
        if !args.paths.is_empty() && !args.paths.contains(&path) {
            continue;
        }
        if path == ReadPath::Uring && store.uring().is_err() {
            eprintln!(
                "WARNING: io_uring unavailable ({}); uring path skipped",
                store.uring().err().unwrap_or("")
            );
            continue;
        }
        rows.extend(bench.path_rows(path, direct, &say)?);
    }
    // The DRAM row cache: batches read once, then served from the cache.
    let cache_bytes = (args.prefill_rows.max(4096) as u64) * (store.dim() as u64 + 64) * 2;
    let cached = RowStore::open(
        &args.dir,
        StoreOptions {
            cache_bytes,
            ..options
        },
    )?;
    let bench = Bench {
        store: &cached,
        ..bench
    };
    rows.extend(bench.cache_rows(&say)?);
    let stats = cached.stats();
    say(format!(
        "row cache: {} hits, {} misses",
        stats.hits, stats.misses
    ));
    if args.json {
        let results: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({
                    "path": r.path, "batch": r.batch, "cold": r.cold, "source": r.source,
                    "samples": r.samples, "rows_per_s": r.rows_per_s, "iops": r.iops,
                    "p50_us": r.p50_us, "p99_us": r.p99_us,
                })
            })
            .collect();
        let out = json!({
            "file": file.display().to_string(),
            "direct_io": direct,
            "baseline_iops": baseline.map(|b| b.iops),
            "baseline": baseline.map(|b| json!({"depth": 64, "reads": b.reads, "iops": b.iops, "p50_us": b.p50_us, "p99_us": b.p99_us})),
            "results": results,
        });
        println!("{out}");
    }
    Ok(ExitCode::SUCCESS)
}

/// One store's timed lookups at the bench's batch sizes.
struct Bench<'a> {
    args: &'a BenchIoArgs,
    store: &'a RowStore,
    layer: u32,
    sizes: &'a [usize],
    baseline_iops: Option<f64>,
}

impl Bench<'_> {
    fn iters(&self, k: usize) -> usize {
        self.args.iters.get(k).copied().unwrap_or(1).max(1)
    }

    /// Read path `path` at each size, cold (every batch's rows new) and warm (read once before).
    fn path_rows(
        &self,
        path: ReadPath,
        direct: bool,
        say: &impl Fn(String),
    ) -> fetchahead::Result<Vec<Row>> {
        let (args, store, layer) = (self.args, self.store, self.layer);
        let range = store.row_range();
        let warm_source = match path {
            ReadPath::Uring | ReadPath::Preadv if direct => "disk",
            _ => "page-cache",
        };
        let mut rows = Vec::new();
        for (k, &batch) in self.sizes.iter().enumerate() {
            let batches: Vec<Vec<i64>> = (0..self.iters(k))
                .map(|i| {
                    unique_rows(
                        range.clone(),
                        batch,
                        args.seed ^ ((k as u64) << 32) ^ i as u64 ^ 0x5eed,
                    )
                })
                .collect();
            // A table smaller than the batch gives every row once.
            let batch = batches.first().map_or(0, Vec::len);
            for cold in [true, false] {
                if !cold {
                    // Each cold batch evicted the one before it: read them all once, untimed.
                    time_lookups(store, path, layer, &batches, false)?;
                }
                let before = store.stats().reads;
                let times = time_lookups(store, path, layer, &batches, cold)?;
                let reads = store.stats().reads - before;
                let source = if cold { "disk" } else { warm_source };
                let row = summarize(path.name(), batch, cold, source, &times, reads);
                say(line(&row, self.baseline_iops));
                rows.push(row);
            }
        }
        Ok(rows)
    }

    /// The DRAM row cache at each size: a batch read once, then served from the cache.
    fn cache_rows(&self, say: &impl Fn(String)) -> fetchahead::Result<Vec<Row>> {
        let range = self.store.row_range();
        let mut rows = Vec::new();
        for (k, &batch) in self.sizes.iter().enumerate() {
            let ids = unique_rows(range.clone(), batch, self.args.seed ^ 0xcace ^ k as u64);
            let batch = ids.len();
            let n = if k == 0 { 1000 } else { self.iters(k).max(5) };
            let batches = vec![ids; n];
            time_lookups(self.store, ReadPath::Auto, self.layer, &batches[..1], false)?;
            let times = time_lookups(self.store, ReadPath::Auto, self.layer, &batches, false)?;
            let row = summarize("auto", batch, false, "cache", &times, 0);
            say(line(&row, self.baseline_iops));
            rows.push(row);
        }
        Ok(rows)
    }
}

fn line(r: &Row, baseline_iops: Option<f64>) -> String {
    let ratio = match baseline_iops {
        Some(b) if r.source != "cache" => format!("  {:.2}x baseline", r.rows_per_s / b),
        _ => String::new(),
    };
    format!(
        "{:<9} batch {:>6} {:<4} {:<10} n={:<4} {:>11.0} rows/s {:>10.0} IOPS  p50 {:>10.1} us  p99 {:>10.1} us{ratio}",
        r.path,
        r.batch,
        if r.cold { "cold" } else { "warm" },
        r.source,
        r.samples,
        r.rows_per_s,
        r.iops,
        r.p50_us,
        r.p99_us
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchIoArgs,
    }

    fn parse(extra: &[&str]) -> BenchIoArgs {
        let mut argv = vec!["bench-io", "dir"];
        argv.extend_from_slice(extra);
        Cli::parse_from(argv).args
    }

    /// Issue 12, case 9: zeros, a wrong count of --iters and no baseline reads are refused.
    #[test]
    fn bench_io_arguments_are_checked() {
        assert!(validate(&parse(&[])).is_ok());
        for bad in [
            &["--iters", "0,0,0"][..],
            &["--iters", "5,2"],
            &["--iters", "5,2,1,1"],
            &["--iters", "5,0,1"],
            &["--baseline-reads", "0"],
            &["--prefill-rows", "0"],
            &["--cold-rounds", "0"],
        ] {
            let msg = validate(&parse(bad)).unwrap_err().to_string();
            assert!(msg.contains(bad[0]), "{bad:?}: {msg}");
        }
    }
}
