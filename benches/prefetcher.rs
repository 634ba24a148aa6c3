//! The prefetcher in a simulated forward: hasher, 14 layers of ~1 ms compute, Engram gathers at
//! layers 1 and 14, each reading its layer of a row store through `LayerRows`. Each step is
//! timed with CUDA events, eager and replayed from a CUDA graph, for the rows resident on the
//! device, the synchronous path, the host-function prefetcher and the flag-mode prefetcher, with
//! real row-store lookups two ways:
//!
//! - cold: the DRAM row cache off, io_uring O_DIRECT reads (preadv where io_uring is missing),
//!   and the table's pages evicted (POSIX_FADV_DONTNEED) before each measured step, so that
//!   every row comes from the disk even where O_DIRECT is refused;
//! - warm: the DRAM row cache on, sized for the whole table and filled with every row first.
//!
//! Exposed stall = step time with lookups minus step time with the rows resident. After the runs
//! the bench prints each stall beside the lookup time measured in the same run on the same
//! store (the goal: at most 2% of it when the compute before the gather is at least the lookup
//! time), and the store's hit rate and IOPS over each run.
//!
//! The table (2 layers of FETCHAHEAD_BENCH_ROWS rows of 256 + 8 bytes; default 2^19 rows, 264
//! MiB) is written into a temporary directory under FETCHAHEAD_BENCH_DIR (default: the system's
//! temp dir; point it at the NVMe: tmpfs has no cold reads). Other knobs:
//! FETCHAHEAD_BENCH_TOKENS (tokens per step, default 64), FETCHAHEAD_BENCH_COMPUTE_US (per
//! layer, default 1000).
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use cudarc::driver::{CudaGraph, CudaStream, sys};
use fetchahead::forward::{ForwardShape, GatherPath, LayerTable, SimulatedForward};
use fetchahead::gpu::Gpu;
use fetchahead::kernels::Kernels;
use fetchahead::prefetcher::{Completion, PrefetcherConfig};
use fetchahead::store::make::{TableSpec, write_table};
use fetchahead::store::{LayerRows, ReadPath, RowStore, Stats, StoreOptions};
use rand::{RngExt, SeedableRng, rngs::SmallRng};

const DIM: usize = 256;
const LAYERS: [u32; 2] = [1, 14];

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

/// One way of reading the table: its store, one `LayerTable` per Engram layer, and whether
/// the page cache is emptied before each measured step.
struct Lookups {
    label: &'static str,
    what: String,
    store: Arc<RowStore>,
    tables: Vec<Arc<dyn LayerTable>>,
    evict: bool,
}

impl Lookups {
    fn open(label: &'static str, dir: &std::path::Path, cache_bytes: u64) -> Lookups {
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
        let tables = LAYERS
            .iter()
            .map(|&l| Arc::new(LayerRows::new(store.clone(), l).unwrap()) as Arc<dyn LayerTable>)
            .collect();
        Lookups {
            label,
            what,
            store,
            tables,
            evict,
        }
    }

    fn before_step(&self) {
        if self.evict {
            self.store.evict_page_cache().unwrap();
        }
    }

    /// Looks every row of every layer up once, so that the row cache holds the table.
    fn fill(&self, rows: u64) {
        let batch = 4096;
        let mut w = vec![0u8; batch * DIM];
        let mut s = vec![0u8; batch * DIM / 32];
        for t in &self.tables {
            for first in (0..rows).step_by(batch) {
                let ids: Vec<i64> = (first..(first + batch as u64).min(rows))
                    .map(|i| i as i64)
                    .collect();
                let n = ids.len();
                t.lookup(&ids, &mut w[..n * DIM], &mut s[..n * DIM / 32])
                    .unwrap();
            }
        }
    }

    /// Host milliseconds of one lookup of `n` random rows of one layer, averaged over 20, each
    /// prepared as a measured step is.
    fn lookup_ms(&self, rows: u64, n: usize, rng: &mut SmallRng) -> f64 {
        let mut w = vec![0u8; n * DIM];
        let mut s = vec![0u8; n * DIM / 32];
        let mut total = Duration::ZERO;
        for i in 0..20 {
            let ids: Vec<i64> = (0..n).map(|_| rng.random_range(0..rows as i64)).collect();
            self.before_step();
            let start = Instant::now();
            self.tables[i % self.tables.len()]
                .lookup(&ids, &mut w, &mut s)
                .unwrap();
            total += start.elapsed();
        }
        total.as_secs_f64() * 1e3 / 20.0
    }
}

/// `after - before` of the counters the bench reports.
fn delta(before: Stats, after: Stats) -> Stats {
    Stats {
        hits: after.hits - before.hits,
        misses: after.misses - before.misses,
        reads: after.reads - before.reads,
        bytes: after.bytes - before.bytes,
        ..Stats::default()
    }
}

fn prefetcher(c: &mut Criterion) {
    let Some(gpu) = Gpu::for_test("the prefetcher bench").unwrap() else {
        return;
    };
    let kernels = Arc::new(Kernels::load(&gpu).unwrap());
    let tokens = knob("FETCHAHEAD_BENCH_TOKENS", 64) as usize;
    let rows = knob("FETCHAHEAD_BENCH_ROWS", 1 << 19);
    let shape = ForwardShape {
        layers: 14,
        engram_layers: LAYERS.to_vec(),
        compute_us: knob("FETCHAHEAD_BENCH_COMPUTE_US", 1000),
        heads: 8,
        ngram: 3,
        seed: 1,
    };
    let rows_per_lookup = tokens * shape.heads as usize;

    let tmp = match std::env::var_os("FETCHAHEAD_BENCH_DIR") {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .expect("temp dir for the bench table");
    let spec = TableSpec {
        rows,
        layers: LAYERS.to_vec(),
        dim: DIM,
        shards: 1,
        seed: 1,
    };
    let t = Instant::now();
    write_table(tmp.path(), &spec, |_| {}).expect("write the bench table");
    println!(
        "table: {} ({:.0} MiB, written in {:.1} s)",
        tmp.path().display(),
        spec.data_bytes() as f64 / (1u64 << 20) as f64,
        t.elapsed().as_secs_f64()
    );
    let cold = Lookups::open("cold", tmp.path(), 0);
    let warm = Lookups::open("warm", tmp.path(), 2 * spec.data_bytes() + (64 << 20));
    warm.fill(rows);

    let mut rng = SmallRng::seed_from_u64(7);
    let means = Means::default();
    let mut reports = Vec::new();
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
    for lookups in [&cold, &warm] {
        let label = lookups.label;
        let lookup = lookups.lookup_ms(rows, rows_per_lookup, &mut rng);
        let mut forwards: Vec<(Completion, SimulatedForward)> =
            [Completion::HostFunction, Completion::Flag]
                .into_iter()
                .map(|completion| {
                    let main = gpu.ctx.new_stream().unwrap();
                    let forward = SimulatedForward::new(
                        kernels.clone(),
                        main,
                        &lookups.tables,
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
        let before = lookups.store.stats();
        let mut lookup_steps_ms = 0.0;
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
                                lookups.before_step();
                                let ms = if replayed {
                                    time_graph(forward.stream(), &graph)
                                } else {
                                    forward.time(path, tokens).unwrap()
                                };
                                record(&means, &name, ms);
                                if path != GatherPath::Resident {
                                    lookup_steps_ms += ms;
                                }
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
        let d = delta(before, lookups.store.stats());
        reports.push((label, lookups.what.clone(), lookup, d, lookup_steps_ms));
    }
    group.finish();

    println!("\nexposed stall = step - resident step, beside the lookup time of the same run");
    for (label, what, lookup, d, steps_ms) in reports {
        println!(
            "{label} lookups ({what}): {lookup:.3} ms per lookup of {rows_per_lookup} rows; over \
             the steps with lookups: hit rate {:.1}%, {:.0} reads/s of step time",
            100.0 * d.hits as f64 / (d.hits + d.misses).max(1) as f64,
            d.reads as f64 / (steps_ms / 1e3).max(1e-9)
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
