//! The prefetcher in a simulated forward: hasher, 14 layers of ~1 ms compute, Engram gathers at
//! layers 1 and 14. Each step is timed with CUDA events, eager and replayed from a CUDA graph,
//! for the rows resident on the device, the synchronous path, the host-function prefetcher and
//! the flag-mode prefetcher, with lookups from the in-memory table warm (no added latency) and
//! cold (a simulated storage latency per lookup).
//!
//! Exposed stall = step time with lookups minus step time with the rows resident. After the runs
//! the bench prints each stall beside the lookup time measured in the same run (the goal: at
//! most 2% of it when the compute before the gather is at least the lookup time).
//!
//! Knobs: FETCHAHEAD_BENCH_TOKENS (tokens per step, default 64), FETCHAHEAD_BENCH_COLD_US
//! (simulated latency of a cold lookup, default 800), FETCHAHEAD_BENCH_COMPUTE_US (per layer,
//! default 1000).
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use cudarc::driver::{CudaGraph, CudaStream, sys};
use fetchahead::forward::{ForwardShape, GatherPath, SimulatedForward};
use fetchahead::gpu::Gpu;
use fetchahead::kernels::Kernels;
use fetchahead::lookup::{MemoryRows, RowLookup};
use fetchahead::prefetcher::{Completion, PrefetcherConfig};
use rand::{RngExt, SeedableRng, rngs::SmallRng};

const ROWS: u64 = 1 << 20;
const DIM: usize = 256;

fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Mean milliseconds per step, per bench name, from the bench's own event timings.
type Means = RefCell<BTreeMap<String, (f64, u64)>>;

fn record(means: &Means, name: &str, ms: f64) {
    let mut m = means.borrow_mut();
    let e = m.entry(name.to_string()).or_insert((0.0, 0));
    e.0 += ms;
    e.1 += 1;
}

fn mean(means: &Means, name: &str) -> Option<f64> {
    means.borrow().get(name).map(|(total, n)| total / *n as f64)
}

/// Milliseconds between events around one graph launch.
fn time_graph(stream: &Arc<CudaStream>, graph: &CudaGraph) -> f64 {
    let timed = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let ctx = stream.context();
    let start = ctx.new_event(timed).unwrap();
    let end = ctx.new_event(timed).unwrap();
    start.record(stream).unwrap();
    graph.launch().unwrap();
    end.record(stream).unwrap();
    end.synchronize().unwrap();
    start.elapsed_ms(&end).unwrap() as f64
}

/// Host milliseconds of one lookup of `n` random rows, averaged over 20.
fn lookup_ms(table: &MemoryRows, n: usize, rng: &mut SmallRng) -> f64 {
    let mut w = vec![0u8; n * DIM];
    let mut s = vec![0u8; n * DIM / 32];
    let start = Instant::now();
    for _ in 0..20 {
        let ids: Vec<i64> = (0..n).map(|_| rng.random_range(0..ROWS as i64)).collect();
        table.lookup(&ids, &mut w, &mut s).unwrap();
    }
    start.elapsed().as_secs_f64() * 1e3 / 20.0
}

fn prefetcher(c: &mut Criterion) {
    let Some(gpu) = Gpu::for_test("the prefetcher bench").unwrap() else {
        return;
    };
    let kernels = Arc::new(Kernels::load(&gpu).unwrap());
    let tokens = knob("FETCHAHEAD_BENCH_TOKENS", 64) as usize;
    let cold_us = knob("FETCHAHEAD_BENCH_COLD_US", 800);
    let shape = ForwardShape {
        layers: 14,
        engram_layers: vec![1, 14],
        compute_us: knob("FETCHAHEAD_BENCH_COMPUTE_US", 1000),
        heads: 8,
        ngram: 3,
        seed: 1,
    };
    let rows_per_lookup = tokens * shape.heads as usize;
    let table = Arc::new(MemoryRows::generate(ROWS, DIM, 1).unwrap());
    let mut rng = SmallRng::seed_from_u64(7);
    let mut forwards: Vec<(Completion, SimulatedForward)> =
        [Completion::HostFunction, Completion::Flag]
            .into_iter()
            .map(|completion| {
                let main = gpu.ctx.new_stream().unwrap();
                let forward = SimulatedForward::new(
                    kernels.clone(),
                    main,
                    &table,
                    shape.clone(),
                    tokens,
                    PrefetcherConfig {
                        completion,
                        ..Default::default()
                    },
                )
                .unwrap();
                (completion, forward)
            })
            .collect();
    let means = Means::default();
    let mut lookups = Vec::new();
    println!(
        "{}: {tokens} tokens x {} heads = {rows_per_lookup} rows per Engram layer per step; {} \
         layers of {} us; Engram layers {:?}",
        gpu.name, shape.heads, shape.layers, shape.compute_us, shape.engram_layers
    );

    let mut group = c.benchmark_group("prefetcher");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for (label, latency_us) in [("warm", 0), ("cold", cold_us)] {
        table.set_latency(Duration::from_micros(latency_us));
        lookups.push((
            label,
            latency_us,
            lookup_ms(&table, rows_per_lookup, &mut rng),
        ));
        for (completion, forward) in &mut forwards {
            let paths: &[GatherPath] = match completion {
                Completion::HostFunction => {
                    &[GatherPath::Resident, GatherPath::Sync, GatherPath::Prefetch]
                }
                Completion::Flag => &[GatherPath::Prefetch],
            };
            for &path in paths {
                let graph = forward.capture(path, tokens).unwrap();
                for replayed in [false, true] {
                    let name = format!(
                        "{label}/{}/{path:?}/{}",
                        match completion {
                            Completion::HostFunction => "host-fn",
                            Completion::Flag => "flag",
                        },
                        if replayed { "graph" } else { "eager" }
                    );
                    group.bench_function(&name, |b| {
                        b.iter_custom(|iters| {
                            let mut total = 0.0;
                            for _ in 0..iters {
                                let step: Vec<u32> = (0..tokens)
                                    .map(|_| rng.random_range(0..128 * 1024))
                                    .collect();
                                forward.set_tokens(&step).unwrap();
                                let ms = if replayed {
                                    time_graph(forward.stream(), &graph)
                                } else {
                                    forward.time(path, tokens).unwrap()
                                };
                                record(&means, &name, ms);
                                total += ms;
                            }
                            Duration::from_secs_f64(total / 1e3)
                        })
                    });
                }
                drop(graph);
            }
            assert_eq!(
                forward.stats().lookup_errors,
                0,
                "lookup errors during the bench"
            );
        }
    }
    group.finish();

    println!("\nexposed stall = step - resident step, beside the lookup time of the same run");
    for (label, latency_us, lookup) in lookups {
        println!(
            "{label} lookups (+{latency_us} us simulated): {lookup:.3} ms per lookup of {rows_per_lookup} rows"
        );
        for mode in ["eager", "graph"] {
            let Some(resident) = mean(&means, &format!("{label}/host-fn/Resident/{mode}")) else {
                continue;
            };
            for (who, path) in [
                ("host-fn", "Sync"),
                ("host-fn", "Prefetch"),
                ("flag", "Prefetch"),
            ] {
                if let Some(step) = mean(&means, &format!("{label}/{who}/{path}/{mode}")) {
                    let stall = step - resident;
                    println!(
                        "  {mode:<5} {who:<7} {path:<8} step {step:7.3} ms, resident {resident:7.3} ms, \
                         stall {stall:7.3} ms = {:6.1}% of the lookup time",
                        100.0 * stall / lookup.max(1e-9)
                    );
                }
            }
        }
    }
}

criterion_group!(benches, prefetcher);
criterion_main!(benches);
