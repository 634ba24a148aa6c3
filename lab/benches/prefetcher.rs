//! The prefetcher in a simulated forward: hasher, 14 layers of ~1 ms compute, Engram gathers at
//! layers 1 and 14, each reading its layer of a row store through `LayerRows`. Each step is
//! timed with CUDA events, eager and replayed from a CUDA graph, for the rows resident on the
//! device, the synchronous path, the host-function prefetcher and the flag-mode prefetcher (a
//! lookup thread per layer, and one lane for the forward serving the layers in gather order),
//! with real row-store lookups two ways:
//!
//! - cold: the DRAM row cache off, io_uring O_DIRECT reads (preadv where io_uring is missing),
//!   and the table's pages evicted (POSIX_FADV_DONTNEED) before each measured step, so that
//!   every row comes from the disk even where O_DIRECT is refused;
//! - warm: the DRAM row cache on, sized for the whole table and filled with every row first.
//!
//! Each step runs behind a lead-in kernel (`forward::LEAD_IN_US`) ahead of its start event, so
//! that the CPU enqueues the step while the GPU is busy, as in an engine: the step times exclude
//! the CPU's enqueue, whose host time is printed per path on its own.
//!
//! Exposed stall = step time with lookups minus step time with the rows resident. After the runs
//! the bench prints each stall beside the lookup time measured in the same run on the same
//! store (the goal: at most 2% of it when the compute before the gather is at least the lookup
//! time), and the store's hit rate and IOPS over each run. Two more cold configurations, a few
//! steps each, are made so that the goal's condition holds: the same tokens with each layer's
//! compute raised to 1.1 x the measured lookup, and a decode step of fewer tokens (compute
//! raised the same way only if its lookup does not fit under the standard compute).
//!
//! Simulated: tables in RAM whose lookups sleep 800 us, under the standard compute (20 steps a
//! path and mode): the stall the prefetcher's own machinery leaves, without the disk's spread.
//!
//! Chain overhead: one prefetch and its gather on a stream, with a lookup that writes nothing
//! (and one that sleeps 800 us), minus the time spent inside the lookup, per completion mode,
//! eager and replayed: the fixed cost of the copy, completion and join machinery.
//!
//! The table (2 layers of FETCHAHEAD_BENCH_ROWS rows of 256 + 8 bytes; default 2^19 rows, 264
//! MiB) is written into a temporary directory under FETCHAHEAD_BENCH_DIR (default: the system's
//! temp dir; point it at the NVMe: tmpfs has no cold reads). Other knobs:
//! FETCHAHEAD_BENCH_TOKENS (tokens per step, default 64), FETCHAHEAD_BENCH_COMPUTE_US (per
//! layer, default 1000), FETCHAHEAD_BENCH_DECODE_TOKENS (the cold decode configuration's tokens,
//! default 8).
mod common;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use cudarc::driver::{CudaGraph, CudaStream, DevicePtr, sys};
use fetchahead::kernels::gpu::Gpu;
use fetchahead::prefetch::lookup::MemoryRows;
use fetchahead::prefetch::prefetcher::{Completion, Join, Prefetcher, PrefetcherConfig};
use fetchahead::row_lookup::RowLookup;
use fetchahead::store::{LayerRows, RowStore, Stats};
use fetchahead_lab::LabKernels;
use fetchahead_lab::forward::{
    FlagLanes, ForwardShape, GatherPath, LEAD_IN_US, LayerTable, SimulatedForward, StepTime,
};
use rand::{RngExt, SeedableRng, rngs::SmallRng};

use common::{BenchStore, knob, write_bench_table};

const DIM: usize = 256;
const LAYERS: [u32; 2] = [1, 14];
const VOCAB: u32 = 128 * 1024;
/// Timed steps per path and mode in the extra cold configurations, after one warm-up step.
const FIT_STEPS: usize = 6;
/// The extra configurations' compute per layer: at least this times the measured lookup.
const FIT_MARGIN: f64 = 1.1;
/// Chain overhead: timed chains per case (after one warm-up), the host's idle time before each
/// (longer than the flag lane's 2 ms of spinning, as between a forward's steps), and the sleep of
/// the sleeping lookup.
const CHAIN_REPS: usize = 20;
const CHAIN_IDLE: Duration = Duration::from_millis(5);
const CHAIN_SLEEP: Duration = Duration::from_micros(800);
/// The simulated configuration: rows of its RAM tables, each lookup's sleep (under the standard
/// 1 ms of compute before the first gather), and its timed steps per path and mode.
const SIMULATED_ROWS: u64 = 1 << 16;
const SIMULATED_LATENCY: Duration = Duration::from_micros(800);
const SIMULATED_STEPS: usize = 20;

/// One run's timed steps, summed.
#[derive(Clone, Copy, Default)]
struct Sums {
    gpu_ms: f64,
    enqueue_ms: f64,
    overruns: u64,
    steps: u64,
    /// The steps whose first Engram layer's own lookup took no longer than the compute before
    /// its gather (the goal's condition, step by step), their GPU and lookup milliseconds.
    held_steps: u64,
    held_gpu_ms: f64,
    held_lookup_ms: f64,
}

impl Sums {
    fn gpu(&self) -> f64 {
        self.gpu_ms / self.steps.max(1) as f64
    }

    fn enqueue(&self) -> f64 {
        self.enqueue_ms / self.steps.max(1) as f64
    }
}

/// Every run's sums, by name: `{configuration}/{who}/{path}/{eager|graph}`.
type Runs = RefCell<BTreeMap<String, Sums>>;

/// One timed step and the milliseconds its first Engram layer's lookup took (0 without one).
#[derive(Clone, Copy)]
struct Timed {
    time: StepTime,
    lookup_ms: f64,
}

/// Adds step `t` to run `name`; `before_gather_ms` is the compute before the first gather.
fn record(runs: &Runs, name: &str, t: Timed, before_gather_ms: f64) {
    let mut m = runs.borrow_mut();
    let e = m.entry(name.to_string()).or_default();
    e.gpu_ms += t.time.gpu_ms;
    e.enqueue_ms += t.time.enqueue_ms;
    e.overruns += u64::from(t.time.lead_in_overrun);
    e.steps += 1;
    if t.lookup_ms > 0.0 && t.lookup_ms <= before_gather_ms {
        e.held_steps += 1;
        e.held_gpu_ms += t.time.gpu_ms;
        e.held_lookup_ms += t.lookup_ms;
    }
}

fn run_name(config: &str, who: &str, path: GatherPath, replayed: bool) -> String {
    let mode = if replayed { "graph" } else { "eager" };
    format!("{config}/{who}/{path:?}/{mode}")
}

/// One forward per completion variant, and the paths each is timed on.
struct Variant {
    who: &'static str,
    completion: Completion,
    lanes: FlagLanes,
    paths: &'static [GatherPath],
}

const VARIANTS: [Variant; 3] = [
    Variant {
        who: "host-fn",
        completion: Completion::HostFunction,
        lanes: FlagLanes::Shared,
        paths: &[GatherPath::Resident, GatherPath::Sync, GatherPath::Prefetch],
    },
    Variant {
        who: "flag-layer",
        completion: Completion::Flag,
        lanes: FlagLanes::PerLayer,
        paths: &[GatherPath::Prefetch],
    },
    Variant {
        who: "flag-lane",
        completion: Completion::Flag,
        lanes: FlagLanes::Shared,
        paths: &[GatherPath::Prefetch],
    },
];

/// The runs printed per configuration, in order: (who, path).
const REPORTED: [(&str, GatherPath); 4] = [
    ("host-fn", GatherPath::Sync),
    ("host-fn", GatherPath::Prefetch),
    ("flag-layer", GatherPath::Prefetch),
    ("flag-lane", GatherPath::Prefetch),
];

/// One way of reading the table: its store, one `LayerTable` per Engram layer, and whether
/// the page cache is emptied before each measured step.
struct Lookups {
    label: &'static str,
    what: String,
    /// The row store behind the tables (none for the simulated lookups).
    store: Option<Arc<RowStore>>,
    tables: Vec<Arc<dyn LayerTable>>,
    evict: bool,
}

impl Lookups {
    fn open(label: &'static str, dir: &std::path::Path, cache_bytes: u64) -> Lookups {
        let BenchStore { store, what, evict } = BenchStore::open(label, dir, cache_bytes);
        let tables = LAYERS
            .iter()
            .map(|&l| Arc::new(LayerRows::new(store.clone(), l).unwrap()) as Arc<dyn LayerTable>)
            .collect();
        Lookups {
            label,
            what,
            store: Some(store),
            tables,
            evict,
        }
    }

    /// Tables in RAM whose every lookup sleeps `latency` first: a lookup time without the disk's
    /// spread, so that the stall measures the prefetcher alone.
    fn simulated(rows: u64, latency: Duration) -> Lookups {
        let tables = (0..LAYERS.len() as u64)
            .map(|seed| {
                let table = MemoryRows::generate(rows, DIM, seed).expect("generate a table");
                table.set_latency(latency);
                Arc::new(table) as Arc<dyn LayerTable>
            })
            .collect();
        Lookups {
            label: "simulated",
            what: format!(
                "tables in RAM, each lookup sleeping {} us",
                latency.as_micros()
            ),
            store: None,
            tables,
            evict: false,
        }
    }

    fn stats(&self) -> Stats {
        self.store
            .as_ref()
            .map_or_else(Stats::default, |s| s.stats())
    }

    fn before_step(&self) {
        if let Some(store) = self.store.as_ref().filter(|_| self.evict) {
            store.evict_page_cache().unwrap();
        }
    }

    /// Looks every row of every layer up once, so that the row cache holds the table.
    fn fill(&self, rows: u64) {
        common::fill_row_cache(&self.tables, rows, DIM);
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

/// One configuration's setting and what its lookups measured.
struct Config {
    name: String,
    what: String,
    tokens: usize,
    compute_us: u64,
    /// How `compute_us` was chosen, when not the standard compute.
    note: String,
    lookup_ms: f64,
    store: Stats,
    /// GPU milliseconds of the steps with lookups, for the store's reads per second.
    lookup_steps_ms: f64,
}

/// One forward per variant over `lookups`' tables.
fn forwards(
    kernels: &Arc<LabKernels>,
    gpu: &Gpu,
    lookups: &Lookups,
    shape: &ForwardShape,
    tokens: usize,
) -> Vec<(&'static Variant, SimulatedForward)> {
    VARIANTS
        .iter()
        .map(|v| {
            let forward = SimulatedForward::new(
                kernels.clone(),
                gpu.ctx.new_stream().unwrap(),
                &lookups.tables,
                shape.clone(),
                tokens,
                PrefetcherConfig {
                    completion: v.completion,
                    // The Prefetcher table's figures were measured joined at each gather.
                    join: Join::AtGather,
                    ..Default::default()
                },
                v.lanes,
            )
            .unwrap();
            (v, forward)
        })
        .collect()
}

/// One step on fresh random tokens, prepared (page cache) as `lookups` says: eager, or a launch
/// of `graph`.
fn step(
    forward: &mut SimulatedForward,
    lookups: &Lookups,
    path: GatherPath,
    graph: Option<&CudaGraph>,
    tokens: usize,
    rng: &mut SmallRng,
) -> Timed {
    let step: Vec<u32> = (0..tokens).map(|_| rng.random_range(0..VOCAB)).collect();
    forward.set_tokens(&step).unwrap();
    lookups.before_step();
    let busy = |f: &SimulatedForward| f.layer_stats(0).map_or(0, |s| s.lookup_ns);
    let before = busy(forward);
    let time = match graph {
        Some(graph) => forward.time_replay(graph),
        None => forward.time(path, tokens),
    }
    .unwrap();
    Timed {
        time,
        lookup_ms: (busy(forward) - before) as f64 / 1e6,
    }
}

/// `steps` timed steps (after one warm-up) of every variant's paths, eager and replayed, at the
/// forwards' current compute; returns the GPU milliseconds of the steps with lookups.
fn fixed_steps(
    config: &str,
    forwards: &mut [(&'static Variant, SimulatedForward)],
    lookups: &Lookups,
    (tokens, steps): (usize, usize),
    runs: &Runs,
    rng: &mut SmallRng,
) -> f64 {
    let mut lookup_steps_ms = 0.0;
    for (variant, forward) in forwards.iter_mut() {
        for &path in variant.paths {
            let graph = forward.capture(path, tokens).unwrap();
            for replayed in [false, true] {
                let name = run_name(config, variant.who, path, replayed);
                let graph = replayed.then_some(&graph);
                step(forward, lookups, path, graph, tokens, rng);
                let before_gather_ms = forward.compute_before_first_gather_ms();
                for _ in 0..steps {
                    let t = step(forward, lookups, path, graph, tokens, rng);
                    record(runs, &name, t, before_gather_ms);
                    if path != GatherPath::Resident {
                        lookup_steps_ms += t.time.gpu_ms;
                    }
                }
            }
        }
    }
    lookup_steps_ms
}

/// A lookup that writes no rows and times itself (after sleeping `sleep`): the chain's stand-in,
/// so that the chain's time minus the time inside the lookup is the machinery's alone.
struct TimedLookup {
    sleep: Duration,
    last_ns: AtomicU64,
}

impl RowLookup for TimedLookup {
    fn dim(&self) -> usize {
        DIM
    }

    fn lookup(
        &self,
        _ids: &[i64],
        _weights: &mut [u8],
        _scales: &mut [u8],
    ) -> fetchahead::Result<()> {
        let start = Instant::now();
        if !self.sleep.is_zero() {
            std::thread::sleep(self.sleep);
        }
        self.last_ns
            .store(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// Captures one prefetch of `n` ids at `ids` and its gather into `out` on `main`.
fn capture_chain(
    main: &Arc<CudaStream>,
    p: &mut Prefetcher,
    ids: u64,
    n: usize,
    out: u64,
) -> CudaGraph {
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    main.begin_capture(mode).unwrap();
    let s = main.cu_stream();
    // SAFETY: `ids` and `out` are live allocations of n ids and n * DIM bf16 that outlive the
    // graph, which is dropped before the prefetcher.
    let enqueued = unsafe {
        p.prefetch(ids, n, s)
            .and_then(|()| p.gather_dequant(out, s))
    };
    let graph = main.end_capture(sys::CUgraphInstantiate_flags(0)).unwrap();
    enqueued.unwrap();
    graph.expect("the capture recorded nodes")
}

/// The chain overhead lines: per completion mode, lookup and eager or replayed, the mean of
/// `CHAIN_REPS` chains (fork, ids copy to the host, completion, row copies to the device, join
/// and gather of `n` rows) minus the time inside the lookup.
fn chain_overhead(gpu: &Gpu, kernels: &Arc<LabKernels>, n: usize) -> Vec<String> {
    let main = gpu.ctx.new_stream().unwrap();
    let ids = main.alloc_zeros::<i64>(n).unwrap();
    let out = main.alloc_zeros::<u16>(n * DIM).unwrap();
    let (ids_at, out_at) = (ids.device_ptr(&main).0, out.device_ptr(&main).0);
    let timed = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = gpu.ctx.new_event(timed).unwrap();
    let end = gpu.ctx.new_event(timed).unwrap();
    let s = main.cu_stream();
    let mut lines = Vec::new();
    for (who, completion) in [
        ("host-fn", Completion::HostFunction),
        ("flag", Completion::Flag),
    ] {
        for (kind, sleep) in [("none", Duration::ZERO), ("sleep", CHAIN_SLEEP)] {
            let lookup = Arc::new(TimedLookup {
                sleep,
                last_ns: AtomicU64::new(0),
            });
            let config = PrefetcherConfig {
                capacity: n,
                completion,
                join: Join::AtGather,
                ..Default::default()
            };
            let mut p = Prefetcher::new(kernels.product().clone(), lookup.clone(), config).unwrap();
            p.warm().unwrap();
            let graph = capture_chain(&main, &mut p, ids_at, n, out_at);
            for replayed in [false, true] {
                let (mut chain, mut inside, mut worst) = (0.0, 0.0, f64::MIN);
                for rep in 0..=CHAIN_REPS {
                    std::thread::sleep(CHAIN_IDLE);
                    // SAFETY: `main` is this bench's stream.
                    unsafe { kernels.launch_spin(s, LEAD_IN_US * 1000) }.unwrap();
                    start.record(&main).unwrap();
                    if replayed {
                        graph.launch().unwrap();
                    } else {
                        // SAFETY: as in `capture_chain`; the chain is waited for below.
                        unsafe {
                            p.prefetch(ids_at, n, s).unwrap();
                            p.gather_dequant(out_at, s).unwrap();
                        }
                    }
                    end.record(&main).unwrap();
                    end.synchronize().unwrap();
                    let ms = start.elapsed_ms(&end).unwrap() as f64;
                    let lookup_ms = lookup.last_ns.load(Ordering::Relaxed) as f64 / 1e6;
                    if rep > 0 {
                        chain += ms / CHAIN_REPS as f64;
                        inside += lookup_ms / CHAIN_REPS as f64;
                        worst = worst.max(ms - lookup_ms);
                    }
                }
                lines.push(format!(
                    "  chain overhead {:<5} {who:<7} lookup {kind:<5}: chain {chain:.3} ms - inside \
                     the lookup {inside:.3} ms = {:.3} ms (worst of {CHAIN_REPS}: {worst:.3} ms)",
                    if replayed { "graph" } else { "eager" },
                    chain - inside
                ));
            }
            drop(graph);
        }
    }
    lines
}

fn prefetcher(c: &mut Criterion) {
    let Some(gpu) = Gpu::for_test("the prefetcher bench").unwrap() else {
        return;
    };
    let kernels = Arc::new(LabKernels::load(&gpu).unwrap());
    let tokens = knob("FETCHAHEAD_BENCH_TOKENS", 64).max(1) as usize;
    let decode_tokens = (knob("FETCHAHEAD_BENCH_DECODE_TOKENS", 8) as usize).clamp(1, tokens);
    let rows = knob("FETCHAHEAD_BENCH_ROWS", 1 << 19);
    let shape = ForwardShape {
        layers: 14,
        engram_layers: LAYERS.to_vec(),
        compute_us: knob("FETCHAHEAD_BENCH_COMPUTE_US", 1000),
        heads: 8,
        ngram: 3,
        seed: 1,
    };
    let heads = shape.heads as usize;
    let rows_per_lookup = tokens * heads;
    let chain = chain_overhead(&gpu, &kernels, rows_per_lookup);

    let (tmp, spec) = write_bench_table(rows, LAYERS.to_vec(), DIM);
    let cold = Lookups::open("cold", tmp.path(), 0);
    let warm = Lookups::open("warm", tmp.path(), 2 * spec.data_bytes() + (64 << 20));
    warm.fill(rows);

    let mut rng = SmallRng::seed_from_u64(7);
    let runs = Runs::default();
    let mut configs = Vec::new();
    println!(
        "{}: {tokens} tokens x {heads} heads = {rows_per_lookup} rows per Engram layer per step; \
         {} layers of {} us; Engram layers {:?}; each step behind a {LEAD_IN_US} us lead-in",
        gpu.name, shape.layers, shape.compute_us, shape.engram_layers
    );

    let mut group = c.benchmark_group("prefetcher");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for lookups in [&cold, &warm] {
        let label = lookups.label;
        let lookup = lookups.lookup_ms(rows, rows_per_lookup, &mut rng);
        let mut forwards = forwards(&kernels, &gpu, lookups, &shape, tokens);
        let before = lookups.stats();
        let mut lookup_steps_ms = 0.0;
        for (variant, forward) in &mut forwards {
            for &path in variant.paths {
                let graph = forward.capture(path, tokens).unwrap();
                for replayed in [false, true] {
                    let name = run_name(label, variant.who, path, replayed);
                    group.bench_function(&name, |b| {
                        b.iter_custom(|iters| {
                            let mut total = 0.0;
                            let before_gather_ms = forward.compute_before_first_gather_ms();
                            for _ in 0..iters {
                                let graph = replayed.then_some(&graph);
                                let t = step(forward, lookups, path, graph, tokens, &mut rng);
                                record(&runs, &name, t, before_gather_ms);
                                if path != GatherPath::Resident {
                                    lookup_steps_ms += t.time.gpu_ms;
                                }
                                total += t.time.gpu_ms;
                            }
                            Duration::from_secs_f64(total / 1e3)
                        })
                    });
                }
                drop(graph);
            }
        }
        configs.push(Config {
            name: label.to_string(),
            what: lookups.what.clone(),
            tokens,
            compute_us: shape.compute_us,
            note: String::new(),
            lookup_ms: lookup,
            store: lookups.stats() - before,
            lookup_steps_ms,
        });
        if lookups.evict {
            // The goal's condition for cold lookups: compute before the first gather >= lookup.
            for (name, fit_tokens) in [("cold-fit", tokens), ("cold-decode", decode_tokens)] {
                let n = fit_tokens * heads;
                let lookup = lookups.lookup_ms(rows, n, &mut rng);
                let needed = (FIT_MARGIN * lookup * 1e3).ceil() as u64;
                let compute_us = shape.compute_us.max(needed);
                let note = if compute_us > shape.compute_us {
                    format!(
                        " (raised from {} us to {FIT_MARGIN} x the lookup)",
                        shape.compute_us
                    )
                } else {
                    format!(" (the standard compute: {FIT_MARGIN} x the lookup fits under it)")
                };
                for (_, forward) in &mut forwards {
                    forward.set_compute_us(compute_us);
                }
                let before = lookups.stats();
                let lookup_steps_ms = fixed_steps(
                    name,
                    &mut forwards,
                    lookups,
                    (fit_tokens, FIT_STEPS),
                    &runs,
                    &mut rng,
                );
                configs.push(Config {
                    name: name.to_string(),
                    what: lookups.what.clone(),
                    tokens: fit_tokens,
                    compute_us,
                    note,
                    lookup_ms: lookup,
                    store: lookups.stats() - before,
                    lookup_steps_ms,
                });
            }
        }
        for (_, forward) in &forwards {
            assert_eq!(
                forward.stats().lookup_errors,
                0,
                "lookup errors during the bench"
            );
        }
    }
    group.finish();

    // Lookups of a fixed latency under the standard compute: the prefetcher's own share of the
    // stall, without the disk's spread.
    let simulated = Lookups::simulated(SIMULATED_ROWS, SIMULATED_LATENCY);
    let lookup = simulated.lookup_ms(SIMULATED_ROWS, rows_per_lookup, &mut rng);
    let mut forwards = forwards(&kernels, &gpu, &simulated, &shape, tokens);
    let lookup_steps_ms = fixed_steps(
        simulated.label,
        &mut forwards,
        &simulated,
        (tokens, SIMULATED_STEPS),
        &runs,
        &mut rng,
    );
    configs.push(Config {
        name: simulated.label.to_string(),
        what: simulated.what.clone(),
        tokens,
        compute_us: shape.compute_us,
        note: String::new(),
        lookup_ms: lookup,
        store: Stats::default(),
        lookup_steps_ms,
    });
    drop(forwards);

    println!(
        "\nexposed stall = step - resident step (GPU time from a start event behind a \
         {LEAD_IN_US} us lead-in kernel, so the CPU's enqueue of the step is not in it), beside \
         the lookup time of the same run; enqueue = host time of the step's launches (eager) or \
         of the graph launch, not in the step time"
    );
    for config in &configs {
        report(config, &runs, heads, &shape);
    }
    println!(
        "\nchain overhead: one prefetch of {rows_per_lookup} ids and its gather on one stream \
         (fork, ids to the host, lookup, rows to the device, join, gather), after {} ms idle, \
         minus the time inside the lookup (none: writes nothing; sleep: {} us); mean of \
         {CHAIN_REPS}",
        CHAIN_IDLE.as_millis(),
        CHAIN_SLEEP.as_micros()
    );
    for line in chain {
        println!("{line}");
    }
}

/// Prints one configuration's stalls beside its lookup time.
fn report(config: &Config, runs: &Runs, heads: usize, shape: &ForwardShape) {
    let runs = runs.borrow();
    let rows = config.tokens * heads;
    let d = &config.store;
    let before_gather_ms = (config.compute_us * u64::from(shape.engram_layers[0])) as f64 / 1e3;
    println!(
        "{} lookups ({}): {} tokens = {rows} rows per Engram layer, {} layers of {} us{}; lookup \
         {:.3} ms per {rows} rows; compute before the first gather {before_gather_ms:.3} ms >= \
         lookup: {}; {}",
        config.name,
        config.what,
        config.tokens,
        shape.layers,
        config.compute_us,
        config.note,
        config.lookup_ms,
        if before_gather_ms >= config.lookup_ms {
            "yes"
        } else {
            "no"
        },
        if d.hits + d.misses == 0 {
            "no row store".to_string()
        } else {
            format!(
                "over the steps with lookups: hit rate {:.1}%, {:.0} reads/s of step time",
                100.0 * d.hits as f64 / (d.hits + d.misses) as f64,
                d.reads as f64 / (config.lookup_steps_ms / 1e3).max(1e-9)
            )
        }
    );
    for replayed in [false, true] {
        let mode = if replayed { "graph" } else { "eager" };
        let resident_name = run_name(&config.name, "host-fn", GatherPath::Resident, replayed);
        let Some(resident) = runs.get(&resident_name) else {
            continue;
        };
        for (who, path) in REPORTED {
            let Some(run) = runs.get(&run_name(&config.name, who, path, replayed)) else {
                continue;
            };
            let stall = run.gpu() - resident.gpu();
            let overruns = run.overruns + resident.overruns;
            let held = if path != GatherPath::Prefetch {
                String::new()
            } else if run.held_steps > 0 {
                let n = run.held_steps as f64;
                let held_stall = run.held_gpu_ms / n - resident.gpu();
                let held_lookup = run.held_lookup_ms / n;
                format!(
                    "; steps whose first lookup fit under its compute: {} of {}, stall {held_stall:.3} \
                     ms = {:.1}% of their lookup ({held_lookup:.3} ms)",
                    run.held_steps,
                    run.steps,
                    100.0 * held_stall / held_lookup.max(1e-9)
                )
            } else {
                format!(
                    "; no step's first lookup fit under its compute (of {})",
                    run.steps
                )
            };
            println!(
                "  {mode:<5} {who:<10} {:<8} step {:8.3} ms, resident {:8.3} ms, stall {stall:7.3} \
                 ms = {:6.1}% of the lookup time; enqueue {:.3} ms (resident {:.3} ms){held}{}",
                format!("{path:?}"),
                run.gpu(),
                resident.gpu(),
                100.0 * stall / config.lookup_ms.max(1e-9),
                run.enqueue(),
                resident.enqueue(),
                if overruns > 0 {
                    format!(
                        "; the lead-in ran out in {overruns} of {} steps",
                        run.steps + resident.steps
                    )
                } else {
                    String::new()
                }
            );
        }
    }
}

criterion_group!(benches, prefetcher);
criterion_main!(benches);
