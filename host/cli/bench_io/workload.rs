//! `bench-io --zipf`: the row store under the Engram workload. Zipf ids with duplicates as decode
//! and prefill batches, the cache's hit rate per budget beside Belady's optimum on the same trace
//! (and with `advise` of the next batch), cold reads' rows/s and CPU per read beside fio on the
//! same file at the same depth, and two layers with an advise at once.
use std::process::ExitCode;
use std::time::{Duration, Instant};

use fetchahead::store::belady::{HitCount, belady};
use fetchahead::store::measure::{
    FioReads, cpu_seconds, fio_random_reads, percentiles_us, time_lookups,
};
use fetchahead::store::zipf::{ZipfRows, block_sharing};
use fetchahead::store::{
    ReadPath, RowStore, Stats, StoreOptions, cache_bytes_for, cache_rows, replay_row_cache,
};
use serde_json::{Value, json};

use super::BenchIoArgs;

/// Rows/s, IOPS, latency and CPU of timed lookups.
fn timing(times: &[Duration], rows: usize, d: &Stats, cpu_s: f64) -> Value {
    let secs: f64 = times.iter().map(Duration::as_secs_f64).sum();
    let (p50, p99) = percentiles_us(times);
    json!({
        "batches": times.len(),
        "rows_per_s": rows as f64 / secs,
        "iops": d.reads as f64 / secs,
        "p50_us": p50,
        "p99_us": p99,
        "reads": d.reads,
        "bytes_per_row_read": d.bytes as f64 / d.rows_read.max(1) as f64,
        "cpu_us_per_read": if d.reads > 0 { cpu_s / d.reads as f64 * 1e6 } else { 0.0 },
    })
}

pub fn run(args: &BenchIoArgs) -> fetchahead::Result<ExitCode> {
    let say = |line: String| {
        if !args.json {
            println!("{line}");
        }
    };
    let base = StoreOptions {
        uring_depth: args.uring_depth,
        ..StoreOptions::default()
    };
    let store = RowStore::open(&args.dir, base.clone())?;
    let layer = store.layers()[0];
    let Some(span) = store.layout().layer(layer).map(|l| l.weight.clone()) else {
        return Ok(ExitCode::FAILURE);
    };
    let file = store.layout().path(span.file).to_path_buf();
    let dim = store.dim();
    let (block, block_why) = store.read_block();
    let block_why = block_why.map(str::to_string);
    let path = match store.uring() {
        Ok(()) => ReadPath::Uring,
        Err(why) => {
            eprintln!("WARNING: io_uring unavailable ({why}); the workload reads through auto");
            ReadPath::Auto
        }
    };
    let direct = store.direct_io().is_ok();
    if let Err(why) = store.direct_io() {
        eprintln!("WARNING: no O_DIRECT here ({why}): cold figures come from the page cache");
    }
    let stride = match args.stride {
        0 => block.div_ceil(span.row_bytes).max(1),
        s => s,
    };
    let range = store.row_range();
    say(format!(
        "table {}: {} rows, dim {dim}, read block {block} B{}, ids every {stride} row(s), path {path}",
        file.display(),
        range.end - range.start,
        block_why
            .as_deref()
            .map_or(String::new(), |w| format!(" ({w})")),
    ));
    let mut zipf_rows = Vec::new();
    let laws: &[f64] = if args.cold_only { &[] } else { &args.zipf };
    for &s in laws {
        let mut z = ZipfRows::new(range.clone(), stride, s, args.seed)?;
        let population = z.population();
        for (kind, n, count) in [
            ("decode", args.decode_rows, args.decode_batches.max(2)),
            (
                "prefill",
                args.zipf_prefill_rows,
                args.prefill_batches.max(2),
            ),
        ] {
            let trace = z.batches(count, n);
            let from = count / 2;
            let sharing = trace[from..]
                .iter()
                .map(|b| block_sharing(b, span.offset, span.row_bytes, block))
                .sum::<f64>()
                / (count - from) as f64;
            let case = ZipfCase {
                args,
                base: &base,
                path,
                layer,
                dim,
                s,
                stride,
                kind,
                n,
                count,
                population,
                range: &range,
                trace: &trace,
                sharing,
            };
            for &pct in &args.budgets {
                zipf_rows.push(case.budget(pct, &say)?);
            }
        }
    }
    let cold = cold_vs_fio(
        args, &base, path, layer, &file, &span, block, stride, direct, &say,
    )?;
    let concurrent = if args.cold_only {
        json!({"skipped": "--cold-only"})
    } else {
        two_layers_and_advise(args, &base, path, stride, &say)?
    };
    if args.json {
        let out = json!({
            "file": file.display().to_string(),
            "direct_io": direct,
            "read_block": block,
            "read_block_fallback": block_why,
            "stride": stride,
            "path": path.name(),
            "ring": store.ring_features().or_else(|| probe_ring(&args.dir, &base)).map(|f| json!({
                "task_run": f.task_run, "no_sqarray": f.no_sqarray,
                "registered_buffers": f.registered_buffers,
                "registered_files": f.registered_files,
                "registered_ring_fd": f.registered_ring_fd, "noatime_reads": f.noatime_reads,
                "fallbacks": f.fallbacks,
            })),
            "zipf": zipf_rows,
            "cold": cold,
            "concurrent": concurrent,
        });
        println!("{out}");
    }
    Ok(ExitCode::SUCCESS)
}

/// One Zipf law's batches of one kind, measured budget by budget.
struct ZipfCase<'a> {
    args: &'a BenchIoArgs,
    base: &'a StoreOptions,
    path: ReadPath,
    layer: u32,
    dim: usize,
    /// The law's exponent.
    s: f64,
    stride: u64,
    kind: &'static str,
    /// Rows a batch.
    n: usize,
    /// Batches, the first half warm-up.
    count: usize,
    population: u64,
    range: &'a std::ops::Range<u64>,
    trace: &'a [Vec<i64>],
    /// The counted batches' mean share of rows sharing a read block.
    sharing: f64,
}

impl ZipfCase<'_> {
    /// The store's hit rate (plain and with `advise`) and timing at a budget of `pct`% of the
    /// law's population, beside Belady, the policy replayed alone and a longer replay; printed,
    /// and returned as JSON.
    fn budget(&self, pct: f64, say: &impl Fn(String)) -> fetchahead::Result<Value> {
        let ZipfCase {
            args,
            base,
            path,
            layer,
            dim,
            s,
            stride,
            kind,
            n,
            count,
            population,
            range,
            trace,
            sharing,
        } = *self;
        let from = count / 2;
        let want = (population as f64 * pct / 100.0).round() as u64;
        let cache_bytes = cache_bytes_for(want.max(1), dim);
        let capacity = cache_rows(cache_bytes, dim);
        let opt = belady(trace, capacity, from);
        let replayed = replay_row_cache(cache_bytes, dim, trace, from);
        let long = long_replay(args, kind, s, stride, n, cache_bytes, dim, range)?;
        let measured = measure_trace(args, base, cache_bytes, path, layer, trace, from)?;
        let advised = measure_advised(args, base, cache_bytes, path, layer, trace, from)?;
        let rate = |h: HitCount| h.rate();
        say(format!(
            "zipf {s} {kind:<7} budget {pct:>4}% ({capacity} rows): hit rate {:.3} = {:.3} x Belady {:.3} (replayed policy {:.3}); with advise {:.3}; {:.0} rows/s, {:.0} IOPS, p50 {:.0} us, p99 {:.0} us, {:.0} B/row read, rows sharing a block {:.2}%",
            measured.0.rate(),
            measured.0.rate() / opt.rate().max(1e-12),
            opt.rate(),
            replayed.rate(),
            advised.rate(),
            measured.1["rows_per_s"].as_f64().unwrap_or(0.0),
            measured.1["iops"].as_f64().unwrap_or(0.0),
            measured.1["p50_us"].as_f64().unwrap_or(0.0),
            measured.1["p99_us"].as_f64().unwrap_or(0.0),
            measured.1["bytes_per_row_read"].as_f64().unwrap_or(0.0),
            100.0 * sharing,
        ));
        if let Some(l) = &long {
            say(format!(
                "    policy alone on {} batches after {} uncounted references: {:.3} = {:.3} x Belady {:.3}, {:.3} x the law's top-k mass {:.3}; the hottest rows pinned (knows the law): {:.3} = {:.3} x",
                l.batches,
                l.warm_up,
                l.policy.rate(),
                l.policy.rate() / l.belady.rate().max(1e-12),
                l.belady.rate(),
                l.policy.rate() / l.law_top_k.max(1e-12),
                l.law_top_k,
                l.static_head.rate(),
                l.static_head.rate() / l.belady.rate().max(1e-12),
            ));
        }
        Ok(json!({
            "s": s, "kind": kind, "batch": n, "batches_counted": count - from,
            "budget_pct": pct, "cache_rows": capacity, "population": population,
            "hit_rate": rate(measured.0), "belady_hit_rate": rate(opt),
            "vs_belady": rate(measured.0) / rate(opt).max(1e-12),
            "replayed_hit_rate": rate(replayed),
            "advise_hit_rate": rate(advised),
            "long_replay": long.as_ref().map(|l| json!({
                "batches": l.batches, "hit_rate": l.policy.rate(),
                "belady_hit_rate": l.belady.rate(),
                "vs_belady": l.policy.rate() / l.belady.rate().max(1e-12),
                "warm_up_references": l.warm_up,
                "law_top_k_mass": l.law_top_k,
                "vs_law_top_k": l.policy.rate() / l.law_top_k.max(1e-12),
                "static_head_hit_rate": l.static_head.rate(),
                "static_head_vs_belady": l.static_head.rate() / l.belady.rate().max(1e-12),
            })),
            "block_sharing": sharing,
            "timing": measured.1,
        }))
    }
}

/// The cache's policy and Belady on a longer trace of the same law (no reads): hit rates once
/// the cache is warm, which a trace short enough to read from disk may not reach.
#[allow(clippy::too_many_arguments)]
fn long_replay(
    args: &BenchIoArgs,
    kind: &str,
    s: f64,
    stride: u64,
    n: usize,
    cache_bytes: u64,
    dim: usize,
    range: &std::ops::Range<u64>,
) -> fetchahead::Result<Option<LongReplay>> {
    let count = match kind {
        "decode" => args.replay_batches,
        _ => args.replay_batches / 200,
    };
    if count < 2 {
        return Ok(None);
    }
    let mut z = ZipfRows::new(range.clone(), stride, s, args.seed ^ 0x10f6)?;
    let trace = z.batches(count, n);
    let from = count / 2;
    let capacity = cache_rows(cache_bytes, dim);
    // The best any policy that does not see the future can do on independent draws: the
    // `capacity` hottest rows of the law, pinned from the start (it knows the law).
    let head: std::collections::HashSet<i64> = (0..capacity as u64)
        .filter_map(|r| z.row_of_rank(r))
        .collect();
    let static_head =
        fetchahead::store::belady::replay(&trace, from, |id| head.contains(&id), |_| {});
    // The same bound exactly: the law's mass on its `capacity` hottest ranks.
    let mass = |k: u64| (1..=k).map(|r| (r as f64).powf(-s)).sum::<f64>();
    let law_top_k = mass(capacity as u64) / mass(z.population()).max(1e-300);
    Ok(Some(LongReplay {
        policy: replay_row_cache(cache_bytes, dim, &trace, from),
        belady: belady(&trace, capacity, from),
        static_head,
        law_top_k,
        batches: count - from,
        warm_up: from * n,
    }))
}

struct LongReplay {
    policy: HitCount,
    belady: HitCount,
    static_head: HitCount,
    /// The law's exact top-k mass at the cache's rows.
    law_top_k: f64,
    batches: usize,
    /// Uncounted references before the counted half.
    warm_up: usize,
}

fn probe_ring(
    dir: &std::path::Path,
    base: &StoreOptions,
) -> Option<fetchahead::store::RingFeatures> {
    let store = RowStore::open(dir, base.clone()).ok()?;
    let (mut w, mut s) = (vec![0u8; store.dim()], vec![0u8; store.dim() / 32]);
    let first = store.row_range().start as i64;
    store
        .lookup_with(ReadPath::Uring, store.layers()[0], &[first], &mut w, &mut s)
        .ok()?;
    store.ring_features()
}

/// A fresh store with `cache_bytes` of row cache, after looking `warm_up` up (uncounted).
fn warmed_store(
    args: &BenchIoArgs,
    base: &StoreOptions,
    cache_bytes: u64,
    path: ReadPath,
    layer: u32,
    warm_up: &[Vec<i64>],
) -> fetchahead::Result<RowStore> {
    let store = RowStore::open(
        &args.dir,
        StoreOptions {
            cache_bytes,
            ..base.clone()
        },
    )?;
    time_lookups(&store, path, layer, warm_up, false)?;
    Ok(store)
}

/// Hit count and timing of the counted part of `trace` on a fresh store with `cache_bytes`.
fn measure_trace(
    args: &BenchIoArgs,
    base: &StoreOptions,
    cache_bytes: u64,
    path: ReadPath,
    layer: u32,
    trace: &[Vec<i64>],
    from: usize,
) -> fetchahead::Result<(HitCount, Value)> {
    let store = warmed_store(args, base, cache_bytes, path, layer, &trace[..from])?;
    store.evict_page_cache()?;
    let (before, cpu0) = (store.stats(), cpu_seconds());
    let times = time_lookups(&store, path, layer, &trace[from..], false)?;
    let d = store.stats() - before;
    let rows: usize = trace[from..].iter().map(Vec::len).sum();
    let hits = HitCount {
        hits: d.hits,
        requests: d.hits + d.misses,
    };
    Ok((hits, timing(&times, rows, &d, cpu_seconds() - cpu0)))
}

/// The same, with each batch's successor advised just before the batch is looked up.
fn measure_advised(
    args: &BenchIoArgs,
    base: &StoreOptions,
    cache_bytes: u64,
    path: ReadPath,
    layer: u32,
    trace: &[Vec<i64>],
    from: usize,
) -> fetchahead::Result<HitCount> {
    let store = warmed_store(args, base, cache_bytes, path, layer, &trace[..from])?;
    let before = store.stats();
    let dim = store.dim();
    let longest = trace.iter().map(Vec::len).max().unwrap_or(0);
    let (mut w, mut s) = (vec![0u8; longest * dim], vec![0u8; longest * dim / 32]);
    for (k, ids) in trace.iter().enumerate().skip(from) {
        if let Some(next) = trace.get(k + 1) {
            store.advise(layer, next)?;
        }
        store.lookup_with(
            path,
            layer,
            ids,
            &mut w[..ids.len() * dim],
            &mut s[..ids.len() * dim / 32],
        )?;
    }
    let d = store.stats() - before;
    Ok(HitCount {
        hits: d.hits,
        requests: d.hits + d.misses,
    })
}

/// `n` distinct ids, every `stride`-th row, uniformly drawn (cold reads touch one row per block).
fn sparse_unique(store: &RowStore, n: usize, stride: u64, seed: u64) -> Vec<i64> {
    let r = store.row_range();
    let slots = (r.end - r.start) / stride;
    fetchahead::store::measure::unique_rows(0..slots, n, seed)
        .into_iter()
        .map(|k| (r.start + k as u64 * stride) as i64)
        .collect()
}

/// Cold batches with no cache (every row one read) beside fio at the same depth and block.
#[allow(clippy::too_many_arguments)]
fn cold_vs_fio(
    args: &BenchIoArgs,
    base: &StoreOptions,
    path: ReadPath,
    layer: u32,
    file: &std::path::Path,
    span: &fetchahead::store::layout::TensorSpan,
    block: u64,
    stride: u64,
    direct: bool,
    say: &dyn Fn(String),
) -> fetchahead::Result<Vec<Value>> {
    let cold = ColdReads {
        args,
        base,
        path,
        layer,
        file,
        span,
        block,
        stride,
        direct,
        say,
    };
    // (reads in flight per ring, rings): one ring at QD64 and at the store's depth, and the
    // store's depth split over two rings on two threads.
    let half = (args.uring_depth / 2).max(1);
    [(64u32, 1usize), (args.uring_depth, 1), (half, 2)]
        .into_iter()
        .map(|(ring_depth, rings)| cold.at_depth(ring_depth, rings))
        .collect()
}

/// The cold comparison's table and settings, the same at every depth.
struct ColdReads<'a> {
    args: &'a BenchIoArgs,
    base: &'a StoreOptions,
    path: ReadPath,
    layer: u32,
    file: &'a std::path::Path,
    span: &'a fetchahead::store::layout::TensorSpan,
    block: u64,
    stride: u64,
    direct: bool,
    say: &'a dyn Fn(String),
}

/// One depth of the cold comparison: its store, batches and outputs, and its rounds so far.
struct ColdDepth {
    store: RowStore,
    /// Rows a batch.
    n: usize,
    /// Reads in flight over all the rings.
    depth: u32,
    rings: usize,
    /// Whether the page cache is evicted before each batch (without O_DIRECT).
    evict: bool,
    /// The warm-up batch, then two batches a round.
    batches: Vec<Vec<i64>>,
    weights_out: Vec<u8>,
    scales_out: Vec<u8>,
    rounds: Vec<Value>,
    times: Vec<Duration>,
    /// Reads, bytes and rows read over the rounds.
    stats: Stats,
    cpu: f64,
    /// Why fio cannot run, once it could not: the later rounds skip it too.
    fio_skip: Option<String>,
}

impl ColdReads<'_> {
    /// Store and fio in turns, `--cold-rounds` times, at `ring_depth` reads in flight on each
    /// of `rings` rings: the rounds and their medians.
    fn at_depth(&self, ring_depth: u32, rings: usize) -> fetchahead::Result<Value> {
        let mut d = self.open_depth(ring_depth, rings)?;
        for r in 0..self.args.cold_rounds.max(1) {
            self.round(&mut d, r)?;
        }
        Ok(d.summary())
    }

    /// A fresh store at the depth, its batches (the first looked up once, uncounted) and its
    /// outputs.
    fn open_depth(&self, ring_depth: u32, rings: usize) -> fetchahead::Result<ColdDepth> {
        let args = self.args;
        let depth = ring_depth * rings as u32;
        let store = RowStore::open(
            &args.dir,
            StoreOptions {
                uring_depth: ring_depth,
                uring_rings: rings,
                ..self.base.clone()
            },
        )?;
        let n = args.zipf_prefill_rows;
        // Store and fio take turns, `--cold-rounds` times, so that both see the same drift of a
        // shared machine; each round's ratio is kept, and the median reported.
        let rounds_n = args.cold_rounds.max(1);
        let batches: Vec<Vec<i64>> = (0..(1 + 2 * rounds_n) as u64)
            .map(|i| {
                sparse_unique(
                    &store,
                    n,
                    self.stride,
                    args.seed ^ 0xc01d ^ (i << 8) ^ depth as u64,
                )
            })
            .collect();
        // O_DIRECT reads bypass the page cache: evicting it before each batch would only add
        // its cost to the CPU counted per read. Without O_DIRECT the batches are evicted.
        let evict = !self.direct;
        time_lookups(&store, self.path, self.layer, &batches[..1], evict)?;
        // Outputs allocated and touched once, as a prefetcher's staging is: their first-touch
        // page faults are not the store's cost per read.
        let dim = store.dim();
        let (weights_out, scales_out) = (vec![1u8; n * dim], vec![1u8; n * dim / 32]);
        Ok(ColdDepth {
            store,
            n,
            depth,
            rings,
            evict,
            batches,
            weights_out,
            scales_out,
            rounds: Vec::new(),
            times: Vec::new(),
            stats: Stats::default(),
            cpu: 0.0,
            fio_skip: None,
        })
    }

    /// Round `r`: the store's two cold batches, then fio at the same depth; printed, and kept.
    fn round(&self, d: &mut ColdDepth, r: usize) -> fetchahead::Result<()> {
        let (before, cpu0) = (d.store.stats(), cpu_seconds());
        let mut times = Vec::with_capacity(2);
        for ids in &d.batches[1 + 2 * r..3 + 2 * r] {
            if d.evict {
                d.store.evict_page_cache()?;
            }
            let t = Instant::now();
            d.store.lookup_with(
                self.path,
                self.layer,
                ids,
                &mut d.weights_out,
                &mut d.scales_out,
            )?;
            times.push(t.elapsed());
        }
        let cpu = cpu_seconds() - cpu0;
        let stats = d.store.stats() - before;
        let t = timing(&times, d.n * times.len(), &stats, cpu);
        d.times.extend_from_slice(&times);
        d.cpu += cpu;
        d.stats.reads += stats.reads;
        d.stats.bytes += stats.bytes;
        d.stats.rows_read += stats.rows_read;
        let fio = self.fio_peer(d);
        let rows_per_s = t["rows_per_s"].as_f64().unwrap_or(0.0);
        let cpu_per_read = t["cpu_us_per_read"].as_f64().unwrap_or(0.0);
        let (n, depth, rings, block) = (d.n, d.depth, d.rings, self.block);
        match &fio {
            Ok(f) => (self.say)(format!(
                "cold {n} rows at QD{depth} ({rings} ring(s)), round {r}: {rows_per_s:.0} rows/s = {:.2} x fio's {:.0} IOPS ({block} B randread); CPU {cpu_per_read:.2} us/read vs fio {:.2} us/read ({:.2} x)",
                rows_per_s / f.iops,
                f.iops,
                f.cpu_us_per_read,
                cpu_per_read / f.cpu_us_per_read.max(1e-12),
            )),
            Err(why) => {
                (self.say)(format!(
                    "cold {n} rows at QD{depth} ({rings} ring(s)), round {r}: {rows_per_s:.0} rows/s, CPU {cpu_per_read:.2} us/read; SKIP fio peer: {why}"
                ));
                d.fio_skip = Some(why.clone());
            }
        }
        d.rounds.push(json!({
            "timing": t,
            "fio": match &fio {
                Ok(f) => json!({"command": f.command, "reads": f.reads, "iops": f.iops,
                    "cpu_us_per_read": f.cpu_us_per_read, "p50_us": f.p50_us, "p99_us": f.p99_us,
                    "rows_per_s_vs_fio": rows_per_s / f.iops,
                    "cpu_vs_fio": cpu_per_read / f.cpu_us_per_read.max(1e-12)}),
                Err(why) => json!({"skipped": why}),
            },
        }));
        Ok(())
    }

    /// fio's random reads of the same tensor at `d`'s depth, or why they cannot run.
    fn fio_peer(&self, d: &ColdDepth) -> Result<FioReads, String> {
        match (&d.fio_skip, self.direct) {
            (Some(why), _) => Err(String::clone(why)),
            (None, false) => Err("no O_DIRECT here".into()),
            (None, true) => fio_random_reads(
                self.file,
                self.span.offset..self.span.offset + self.span.len(),
                self.block,
                d.depth,
                self.args.fio_seconds,
            ),
        }
    }
}

impl ColdDepth {
    /// The depth's timing over every round, the medians of the rounds' ratios to fio, and the
    /// rounds.
    fn summary(&self) -> Value {
        let median = |key: &str| {
            let mut v: Vec<f64> = self
                .rounds
                .iter()
                .filter_map(|r| r["fio"][key].as_f64())
                .collect();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied()
        };
        let n = self.n;
        json!({
            "batch": n, "depth": self.depth, "rings": self.rings,
            "timing": timing(&self.times, n * self.times.len(), &self.stats, self.cpu),
            "median_rows_per_s_vs_fio": median("rows_per_s_vs_fio"),
            "median_cpu_vs_fio": median("cpu_vs_fio"),
            "rounds": self.rounds,
        })
    }
}

/// Two layers' cold lookups at once, with an advise of the next batch running beside them,
/// against the same lookups one after the other.
fn two_layers_and_advise(
    args: &BenchIoArgs,
    base: &StoreOptions,
    path: ReadPath,
    stride: u64,
    say: &dyn Fn(String),
) -> fetchahead::Result<Value> {
    let probe = RowStore::open(&args.dir, base.clone())?;
    let layers = probe.layers().to_vec();
    let [a, b, ..] = layers[..] else {
        say("SKIP two layers at once: the table has one layer".into());
        return Ok(json!({"skipped": "one layer"}));
    };
    drop(probe);
    let store = RowStore::open(
        &args.dir,
        StoreOptions {
            cache_bytes: 64 << 20,
            ..base.clone()
        },
    )?;
    let n = args.zipf_prefill_rows;
    let dim = store.dim();
    // Batches 8.. are only advised: background reads into the cache beside the lookups.
    let batches: Vec<Vec<i64>> = (0..12u64)
        .map(|i| sparse_unique(&store, n, stride, args.seed ^ 0xb0b ^ (i << 12)))
        .collect();
    let (mut w, mut s) = (vec![0u8; n * dim], vec![0u8; n * dim / 32]);
    let t = Instant::now();
    for ids in &batches[..4] {
        for layer in [a, b] {
            store.lookup_with(path, layer, ids, &mut w, &mut s)?;
        }
    }
    let alone = (8 * n) as f64 / t.elapsed().as_secs_f64();
    let advised_at_start = store.stats().advised;
    let t = Instant::now();
    for (k, ids) in batches[4..8].iter().enumerate() {
        store.advise(a, &batches[8 + k])?;
        std::thread::scope(|scope| -> fetchahead::Result<()> {
            let other = scope.spawn(|| {
                let (mut w, mut s) = (vec![0u8; n * dim], vec![0u8; n * dim / 32]);
                store.lookup_with(path, b, ids, &mut w, &mut s)
            });
            store.lookup_with(path, a, ids, &mut w, &mut s)?;
            other
                .join()
                .unwrap_or_else(|e| std::panic::resume_unwind(e))
        })?;
    }
    // Rows the advise thread had read by the time the lookups ended count beside them.
    let secs = t.elapsed().as_secs_f64();
    let together = (8 * n) as f64 / secs;
    let advised = store.stats().advised - advised_at_start;
    let with_advised = together + advised as f64 / secs;
    say(format!(
        "two layers x {n} cold rows: {together:.0} lookup rows/s at once ({with_advised:.0} rows/s with the {advised} rows advised beside them) vs {alone:.0} rows/s one after the other ({:.2} x)",
        with_advised / alone
    ));
    Ok(
        json!({"batch": n, "layers": [a, b], "rows_per_s_together": together,
        "rows_advised_beside": advised, "rows_per_s_together_with_advised": with_advised,
        "rows_per_s_alone": alone}),
    )
}
