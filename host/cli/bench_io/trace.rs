//! `bench-io --trace`: the row store on a real lookup trace. Per scheduler step the step's ids
//! are one lookup (the store reads each distinct row once and counts a hit per id asked, so the
//! hit rate weights a step's distinct rows by how often the step asks for each); the first half
//! of the steps warms the cache, the second half is counted. Beside the store: Belady's MIN on
//! the same batches, LRU, ARC, W-TinyLFU and exact LFU replayed on them, and the store's own
//! policy replayed without reads (told, with --docs, which request asked for each id and when
//! each finished, as an engine knows), at budgets in shares of the trace's distinct rows and of the
//! table's rows.
use std::collections::HashSet;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use fetchahead::Error;
use fetchahead::store::belady::{HitCount, belady};
use fetchahead::store::make::{TableSpec, WriteOptions, write_table_with};
use fetchahead::store::measure::percentiles_us;
use fetchahead::store::policies::Policy;
use fetchahead::store::requests::{StepRequests, read_requests, step_requests};
use fetchahead::store::trace::{
    Step, StepBatch, batch_ids, known_future, read_ids, read_prompts, read_steps, step_batches,
};
use fetchahead::store::{
    Known, ReadPath, RowStore, StoreOptions, cache_bytes_for, cache_rows, replay_row_cache,
    replay_row_cache_known, replay_row_cache_requests,
};
use serde_json::{Value, json};

use super::BenchIoArgs;

/// Layer of the table the trace is looked up in.
const LAYER: u32 = 1;

/// A budget: what it is a share of, and the rows it holds.
struct Budget {
    name: String,
    /// The goal's budgets run against the real store too; the others are replayed only.
    goal: bool,
    rows: u64,
}

fn budgets(distinct: u64, table_rows: u64, extra: &[f64]) -> Vec<Budget> {
    let of = |n: u64, pct: f64| ((n as f64 * pct / 100.0).round() as u64).max(1);
    let mut out: Vec<Budget> = extra
        .iter()
        .map(|&pct| Budget {
            name: format!("{pct}% of distinct rows"),
            goal: false,
            rows: of(distinct, pct),
        })
        .collect();
    for (name, n) in [("distinct rows", distinct), ("R", table_rows)] {
        for pct in [1.0, 5.0] {
            out.retain(|b| b.name != format!("{pct}% of {name}"));
            out.push(Budget {
                name: format!("{pct}% of {name}"),
                goal: true,
                rows: of(n, pct),
            });
        }
    }
    out.sort_by_key(|b| b.rows);
    out
}

/// The table the trace is looked up in: the one in `args.dir`, or, where there is none, one of
/// `--trace-rows` rows written there once (reused by later runs).
fn table(args: &BenchIoArgs, max_id: u64, say: &impl Fn(String)) -> fetchahead::Result<()> {
    let empty = match std::fs::read_dir(&args.dir) {
        Ok(mut d) => d.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => {
            return Err(Error::Io {
                file: args.dir.clone(),
                op: "read_dir",
                source: e,
            });
        }
    };
    if empty {
        if max_id >= args.trace_rows {
            return Err(Error::invalid(
                "--trace-rows",
                format!(
                    "{}: the trace asks for row {max_id}; want more rows",
                    args.trace_rows
                ),
            ));
        }
        let spec = TableSpec {
            rows: args.trace_rows,
            layers: vec![LAYER],
            dim: args.trace_dim,
            shards: 1,
            seed: args.seed,
        };
        say(format!(
            "writing a table of {} rows (dim {}) to {} (once; later runs reuse it)",
            spec.rows,
            spec.dim,
            args.dir.display()
        ));
        let options = WriteOptions {
            writer: "bench-io".into(),
            force: false,
        };
        write_table_with(&args.dir, &spec, &options, |_| {})?;
    }
    Ok(())
}

/// The store's figures on the counted steps at one budget.
struct Measured {
    hits: HitCount,
    reads_per_step: f64,
    rows_per_s: f64,
    decode_us: (f64, f64),
    prefill_us: (f64, f64),
    decode_steps: usize,
    prefill_steps: usize,
    /// With look-ahead: rows the advise thread read ahead a counted step, and the time a step
    /// waited for it before its lookup (what the compute of the step before must hide), median.
    ahead: Option<(f64, f64)>,
}

/// What the store is told beside each step's ids, as an engine tells it.
#[derive(Clone, Copy)]
struct Told<'a> {
    requests: Option<&'a [StepRequests]>,
    /// Each step's known future chunks (look-ahead on when given).
    future: Option<&'a [FutureOf<'a>]>,
}

fn measure(
    args: &BenchIoArgs,
    cache_bytes: u64,
    path: ReadPath,
    steps: &[StepBatch],
    batches: &[Vec<i64>],
    from: usize,
    told: Told<'_>,
) -> fetchahead::Result<Measured> {
    let store = RowStore::open(
        &args.dir,
        StoreOptions {
            cache_bytes,
            uring_depth: args.uring_depth,
            lookahead: told.future.is_some(),
            ..StoreOptions::default()
        },
    )?;
    let longest = batches.iter().map(Vec::len).max().unwrap_or(0);
    let dim = store.dim();
    let mut weights = vec![0u8; longest * dim];
    let mut scales = vec![0u8; longest * dim / 32];
    let mut waits = Vec::new();
    // Step `t`: its future chunks handed over and the wait for the read-ahead (what the
    // compute of the step before overlaps, not timed), its lookup into the reused buffers
    // (timed), then which request asked for which ids.
    let mut lookup = |t: usize, ids: &[i64]| {
        if let Some(future) = told.future {
            for &(steps_ahead, chunk) in future.get(t).into_iter().flatten() {
                store.advise_future(LAYER, chunk, steps_ahead)?;
            }
            let start = Instant::now();
            store.wait_advised();
            waits.push(start.elapsed());
        }
        let n = ids.len();
        let start = Instant::now();
        store.lookup_with(
            path,
            LAYER,
            ids,
            &mut weights[..n * dim],
            &mut scales[..n * dim / 32],
        )?;
        let took = start.elapsed();
        if let Some(step) = told.requests.and_then(|r| r.get(t)) {
            for span in &step.spans {
                store.asked_by(
                    LAYER,
                    span.request,
                    ids.get(span.ids.clone()).unwrap_or(&[]),
                )?;
            }
            for &r in &step.finished {
                store.request_finished(r);
            }
        }
        Ok::<Duration, Error>(took)
    };
    for (t, ids) in batches[..from].iter().enumerate() {
        lookup(t, ids)?;
    }
    store.evict_page_cache()?;
    let before = store.stats();
    let (mut decode, mut prefill) = (Vec::new(), Vec::new());
    let mut total = Duration::ZERO;
    for (i, (step, ids)) in steps[from..].iter().zip(&batches[from..]).enumerate() {
        let e = lookup(from + i, ids)?;
        total += e;
        if step.prefill {
            prefill.push(e);
        } else {
            decode.push(e);
        }
    }
    let after = store.stats();
    let counted = batches.len() - from;
    let asked: usize = batches[from..].iter().map(Vec::len).sum();
    let per_step = |n: u64| n as f64 / counted.max(1) as f64;
    let ahead = told.future.map(|_| {
        let counted_waits = &waits[waits.len().saturating_sub(counted)..];
        (
            per_step(after.advised - before.advised),
            percentiles_us(counted_waits).0,
        )
    });
    Ok(Measured {
        hits: HitCount {
            hits: after.hits - before.hits,
            requests: (after.hits + after.misses) - (before.hits + before.misses),
        },
        reads_per_step: per_step(after.reads - before.reads),
        rows_per_s: asked as f64 / total.as_secs_f64().max(1e-9),
        decode_us: percentiles_us(&decode),
        prefill_us: percentiles_us(&prefill),
        decode_steps: decode.len(),
        prefill_steps: prefill.len(),
        ahead,
    })
}

/// The system's 1-minute load average (timing figures are only as quiet as the machine).
fn load_average() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

pub fn run(args: &BenchIoArgs) -> fetchahead::Result<ExitCode> {
    let say = |line: String| {
        if !args.json {
            println!("{line}");
        }
    };
    let Some(trace_file) = &args.trace else {
        return Ok(ExitCode::FAILURE);
    };
    let ids = read_ids(trace_file)?;
    let steps = args.steps.as_deref().map(read_steps).transpose()?;
    let cut = step_batches(
        ids.len(),
        steps.as_deref(),
        args.ids_per_token,
        args.trace_batch_tokens,
    )?;
    let batches = batch_ids(&ids, &cut);
    if batches.len() < 2 {
        return Err(Error::invalid(
            "trace",
            format!(
                "{}: {} batch(es); want at least 2 (half warm-up, half counted)",
                trace_file.display(),
                batches.len()
            ),
        ));
    }
    let from = batches.len() / 2;
    let future = future_chunks(args, &ids, steps.as_deref(), &cut)?;
    let distinct = ids.iter().copied().collect::<HashSet<i64>>().len() as u64;
    let max_id = ids.iter().copied().max().unwrap_or(0) as u64;
    say(format!(
        "trace {}: {} ids, {} distinct rows, {} steps ({} prefill), counted from step {from}",
        trace_file.display(),
        ids.len(),
        distinct,
        batches.len(),
        cut.iter().filter(|b| b.prefill).count(),
    ));
    let (store_path, table_rows) = trace_store(args, max_id, &say)?;
    let requests = match (&args.docs, steps.as_deref()) {
        (Some(docs), Some(steps)) => Some(step_requests(
            steps,
            &read_requests(docs)?,
            args.ids_per_token,
        )?),
        _ => None,
    };
    let replay = Replayed {
        args,
        cut: &cut,
        batches: &batches,
        from,
        future: future.as_deref(),
        store_path,
        by_count: counts_by_row(&batches[from..]),
        requests: requests.as_deref(),
    };
    let rows_json = budgets(distinct, table_rows, &args.trace_budgets)
        .into_iter()
        .map(|b| replay.budget(&b, &say))
        .collect::<fetchahead::Result<Vec<Value>>>()?;
    let load = load_average();
    say(format!(
        "load average {}",
        load.map_or("unknown".into(), |l| format!("{l:.2}"))
    ));
    if args.json {
        println!(
            "{}",
            json!({
                "trace": trace_file.display().to_string(),
                "steps_file": args.steps.as_ref().map(|p| p.display().to_string()),
                "ids": ids.len(),
                "distinct_rows": distinct,
                "table_rows": table_rows,
                "steps": batches.len(),
                "counted_from": from,
                "load_average": load,
                "budgets": rows_json,
            })
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A step's known future chunks: `(steps ahead, their ids)`.
type FutureOf<'a> = Vec<(u32, &'a [i64])>;

/// With --docs and --steps: each step's known future chunks.
fn future_chunks<'a>(
    args: &BenchIoArgs,
    ids: &'a [i64],
    steps: Option<&[Step]>,
    cut: &[StepBatch],
) -> fetchahead::Result<Option<Vec<FutureOf<'a>>>> {
    Ok(match (&args.docs, steps) {
        (Some(docs), Some(steps)) => {
            let prompts = read_prompts(docs)?;
            let f = known_future(
                steps,
                cut,
                &prompts,
                args.ids_per_token,
                args.lookahead_steps,
            )?;
            let f: Vec<Vec<(u32, &[i64])>> = f
                .iter()
                .map(|chunks| {
                    chunks
                        .iter()
                        .map(|c| (c.steps_ahead, ids.get(c.ids.clone()).unwrap_or(&[])))
                        .collect()
                })
                .collect();
            Some(f)
        }
        _ => None,
    })
}

/// The store the trace is replayed against (written once where DIR holds none) and its rows;
/// with --replay-only none, and the trace's R.
fn trace_store(
    args: &BenchIoArgs,
    max_id: u64,
    say: &impl Fn(String),
) -> fetchahead::Result<(Option<ReadPath>, u64)> {
    Ok(if args.replay_only {
        (None, args.trace_rows)
    } else {
        table(args, max_id, say)?;
        let probe = RowStore::open(&args.dir, StoreOptions::default())?;
        let range = probe.row_range();
        if max_id >= range.end {
            return Err(Error::invalid(
                "table",
                format!(
                    "{} has rows {}..{}; the trace asks for row {max_id}",
                    args.dir.display(),
                    range.start,
                    range.end
                ),
            ));
        }
        let path = if probe.uring().is_ok() {
            ReadPath::Uring
        } else {
            ReadPath::Auto
        };
        (Some(path), range.end - range.start)
    })
}

/// How often each row is asked in `batches`, most asked first.
fn counts_by_row(batches: &[Vec<i64>]) -> Vec<u64> {
    let mut counts: std::collections::HashMap<i64, u64> = std::collections::HashMap::new();
    for id in batches.iter().flatten() {
        *counts.entry(*id).or_insert(0) += 1;
    }
    let mut by_count: Vec<u64> = counts.into_values().collect();
    by_count.sort_unstable_by(|a, b| b.cmp(a));
    by_count
}

/// A trace cut into steps, replayed budget by budget.
struct Replayed<'a> {
    args: &'a BenchIoArgs,
    cut: &'a [StepBatch],
    batches: &'a [Vec<i64>],
    /// The first counted step (the steps before warm the caches).
    from: usize,
    future: Option<&'a [FutureOf<'a>]>,
    store_path: Option<ReadPath>,
    /// The counted steps' row counts, most asked first (the top-k bound).
    by_count: Vec<u64>,
    /// With --docs and --steps: each step's ids by request, and the requests finishing.
    requests: Option<&'a [StepRequests]>,
}

impl Replayed<'_> {
    /// The share of the counted requests that the `k` most asked rows take: the counted
    /// half's own k most asked rows pinned from the start (with perfect knowledge of
    /// popularity and none of order: what independent draws allow).
    fn top_k(&self, k: usize) -> f64 {
        let requests: u64 = self.by_count.iter().sum();
        self.by_count.iter().take(k).sum::<u64>() as f64 / requests.max(1) as f64
    }

    /// Budget `b`: Belady, the top-k bound, the shipped policy and its peers replayed, the
    /// store measured and the look-ahead at the goal's budgets; printed, and returned as JSON.
    fn budget(&self, b: &Budget, say: &impl Fn(String)) -> fetchahead::Result<Value> {
        let Replayed {
            args,
            cut,
            batches,
            from,
            future,
            store_path,
            ..
        } = *self;
        let dim = args.trace_dim;
        let top_k = |k: usize| self.top_k(k);
        let cache_bytes = cache_bytes_for(b.rows, dim);
        let capacity = cache_rows(cache_bytes, dim);
        let opt = belady(batches, capacity, from);
        let shipped = match self.requests {
            Some(r) => replay_row_cache_requests(cache_bytes, dim, batches, from, r),
            None => replay_row_cache(cache_bytes, dim, batches, from),
        };
        let peers: Vec<(Policy, HitCount)> = Policy::ALL
            .iter()
            .map(|&p| (p, p.replay(batches, capacity, from)))
            .collect();
        let best = peers.iter().map(|(_, h)| h.rate()).fold(0.0f64, f64::max);
        let x = |r: f64| r / opt.rate().max(1e-12);
        let told = Told {
            requests: self.requests,
            future: None,
        };
        let measured = match (store_path, b.goal) {
            (Some(path), true) => Some(measure(args, cache_bytes, path, cut, batches, from, told)?),
            _ => None,
        };
        let measured_ahead = match (store_path, b.goal, future) {
            (Some(path), true, Some(f)) => Some(measure(
                args,
                cache_bytes,
                path,
                cut,
                batches,
                from,
                Told {
                    future: Some(f),
                    ..told
                },
            )?),
            _ => None,
        };
        say(format!(
            "budget {} ({capacity} rows): Belady {:.3}, top-k {:.3}; shipped policy {:.3} = {:.3} x Belady, {:.3} x the best peer; {}",
            b.name,
            opt.rate(),
            top_k(capacity),
            shipped.rate(),
            x(shipped.rate()),
            shipped.rate() / best.max(1e-12),
            peers
                .iter()
                .map(|(p, h)| format!("{} {:.3} ({:.3} x)", p.name(), h.rate(), x(h.rate())))
                .collect::<Vec<_>>()
                .join(", "),
        ));
        for (m, what) in [(&measured, "store"), (&measured_ahead, "store, look-ahead")] {
            let Some(m) = m else {
                continue;
            };
            let ahead = m.ahead.map_or(String::new(), |(rows, wait)| {
                format!(", {rows:.0} rows read ahead a step (median wait {wait:.0} us)")
            });
            say(format!(
                "    {what}: hit rate {:.3} = {:.3} x Belady, {:.1} disk reads a step, {:.0} rows/s, decode p50 {:.0} us p99 {:.0} us ({} steps), prefill p50 {:.0} us p99 {:.0} us ({} steps)",
                m.hits.rate(),
                x(m.hits.rate()),
                m.reads_per_step,
                m.rows_per_s,
                m.decode_us.0,
                m.decode_us.1,
                m.decode_steps,
                m.prefill_us.0,
                m.prefill_us.1,
                m.prefill_steps,
            ) + &ahead);
        }
        let counted = (batches.len() - from) as f64;
        let lookahead = match (&future, b.goal) {
            (Some(f), true) => {
                let told = Known {
                    requests: self.requests,
                    ..Known::default()
                };
                let (without, read_without) =
                    replay_row_cache_known(cache_bytes, dim, batches, from, told);
                let known = Known {
                    future: Some(f),
                    read_share: args.read_ahead_share,
                    read_lookups: args.read_ahead_lookups.max(1),
                    ..told
                };
                let (with, read_with) =
                    replay_row_cache_known(cache_bytes, dim, batches, from, known);
                say(format!(
                    "    look-ahead ({} steps): hit rate {:.3} = {:.3} x Belady, {:.0} rows read a step; without {:.3} = {:.3} x, {:.0} rows read a step",
                    args.lookahead_steps,
                    with.rate(),
                    x(with.rate()),
                    read_with as f64 / counted,
                    without.rate(),
                    x(without.rate()),
                    read_without as f64 / counted,
                ));
                Some(json!({
                    "steps": args.lookahead_steps,
                    "hit_rate": with.rate(), "vs_belady": x(with.rate()),
                    "rows_read_per_step": read_with as f64 / counted,
                    "without_hit_rate": without.rate(), "without_vs_belady": x(without.rate()),
                    "without_rows_read_per_step": read_without as f64 / counted,
                }))
            }
            _ => None,
        };
        let mut policies = serde_json::Map::new();
        for (p, h) in &peers {
            policies.insert(p.name().into(), json!(h.rate()));
        }
        Ok(json!({
            "budget": b.name,
            "goal_budget": b.goal,
            "cache_rows": capacity,
            "cache_bytes": cache_bytes,
            "belady_hit_rate": opt.rate(),
            "top_k_hit_rate": top_k(capacity),
            "shipped_hit_rate": shipped.rate(),
            "shipped_vs_belady": x(shipped.rate()),
            "shipped_told_requests": self.requests.is_some(),
            "best_peer_hit_rate": best,
            "policies": Value::Object(policies),
            "lookahead": lookahead,
            "store": measured.as_ref().map(|m| store_json(m, opt.rate())),
            "store_lookahead": measured_ahead.as_ref().map(|m| store_json(m, opt.rate())),
        }))
    }
}

/// The store's figures at one budget, as JSON (`belady`: Belady's hit rate at that budget).
fn store_json(m: &Measured, belady: f64) -> Value {
    json!({
        "hit_rate": m.hits.rate(),
        "vs_belady": m.hits.rate() / belady.max(1e-12),
        "requests": m.hits.requests,
        "disk_reads_per_step": m.reads_per_step,
        "rows_per_s": m.rows_per_s,
        "decode": {"steps": m.decode_steps, "p50_us": m.decode_us.0, "p99_us": m.decode_us.1},
        "prefill": {"steps": m.prefill_steps, "p50_us": m.prefill_us.0, "p99_us": m.prefill_us.1},
        "read_ahead_rows_per_step": m.ahead.map(|a| a.0),
        "read_ahead_wait_p50_us": m.ahead.map(|a| a.1),
    })
}
