//! What fetchahead buys per decode step: the simulated DeepSeek-scale step of
//! `fetchahead_lab::decode_step` (a hasher; 61 layers with 89 all-reduce and 49 all-gather windows,
//! 3.6 ms in all, each followed by bf16 GEMV readers of the next weights; spin compute between;
//! Engram layers 2 and 15 gathering rows looked up in a row store on disk), timed with CUDA
//! events, eager and replayed from a CUDA graph, in six configurations: neither feature, the
//! Engram prefetcher only, the L2 plan only, both, and the two floors (rows resident, plan off and
//! on) the Engram stall is measured from. Lookups two ways, each with its own store:
//!
//! - cold: the DRAM row cache off, io_uring O_DIRECT reads (preadv where io_uring is missing),
//!   the table's pages evicted before each step, so every row comes from the disk;
//! - warm: the DRAM row cache on, sized for the whole table and filled first.
//!
//! Printed at the end: the step table per lookup setting and execution mode (mean step, p10-p90,
//! the share each configuration saves against neither, the Engram stall against its floor as a
//! share of the step's lookup time), whether the outputs were bit-identical across every
//! configuration, the readers' cold and warm times, and the DGX Spark projection with its model
//! and assumptions.
//!
//! Knobs: FETCHAHEAD_BENCH_DIR (where the table is written; point it at the NVMe),
//! FETCHAHEAD_BENCH_ROWS (rows per Engram layer, default 2^19), FETCHAHEAD_BENCH_SAMPLES (timed
//! steps per configuration, default 20), FETCHAHEAD_BENCH_LOOKUPS and FETCHAHEAD_BENCH_CONFIGS
//! (comma lists narrowing the run: `cold,warm`; configuration ids such as `floor,floor_plan`),
//! FETCHAHEAD_BENCH_TIMELINE (a file: the step recorded on the device timeline, rows resident,
//! plan off and on, eager and replayed, as a Chrome trace), FETCHAHEAD_BENCH_COLLECTIVE_WRITES
//! (0: the simulated collectives leave the readers' activations unwritten; default 1, each
//! writes them as a real all-reduce or all-gather writes its result).
mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use fetchahead::kernels::gpu::Gpu;
use fetchahead::prefetch::prefetcher::Join;
use fetchahead::store::{LayerRows, RowStore};
use fetchahead::timeline::DEFAULT_CAPACITY;
use fetchahead_lab::LabKernels;
use fetchahead_lab::decode_step::{
    DECODE_LEAD_IN_US, DecodeShape, DecodeStep, DecodeWeights, GB10, ModelWindow, ReaderTime, Run,
    Runs, SparkModel, StepConfig, StepOutputs, model_windows, reader_times, report, spark_lines,
    sweep,
};
use fetchahead_lab::forward::LayerTable;
use fetchahead_lab::trace::{TRACED, trace_decode_step};
use rand::{RngExt, SeedableRng, rngs::SmallRng};

use common::{BenchStore, knob, write_bench_table};

const DIM: usize = 256;
const VOCAB: u32 = 128 * 1024;
/// Cold and warm runs of each reader matrix for the projection.
const READER_REPS: usize = 41;

/// One way of reading the table.
struct Lookups {
    label: &'static str,
    what: String,
    store: Arc<RowStore>,
    tables: Vec<Arc<dyn LayerTable>>,
    evict: bool,
}

impl Lookups {
    fn open(label: &'static str, dir: &Path, layers: &[u32], cache_bytes: u64) -> Lookups {
        let BenchStore { store, what, evict } = BenchStore::open(label, dir, cache_bytes);
        let tables = layers
            .iter()
            .map(|&l| {
                Arc::new(LayerRows::new(store.clone(), l).expect("a layer of the table"))
                    as Arc<dyn LayerTable>
            })
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
            self.store.evict_page_cache().expect("evict the page cache");
        }
    }

    /// Looks every row of every layer up once, so that the row cache holds the table.
    fn fill(&self, rows: u64) {
        common::fill_row_cache(&self.tables, rows, DIM);
    }
}

/// `n` random tokens.
fn tokens(rng: &mut SmallRng, n: u32) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(0..VOCAB)).collect()
}

/// Per lookup setting: its runs, the model's windows, the work before the first gather.
type Measured<'a> = (&'a Lookups, Runs, Vec<ModelWindow>, f64);

/// The summary after the measurements: the failures, the step tables, whether the outputs were
/// bit-identical, the readers' times and the projection.
fn summary(
    shape: &DecodeShape,
    failures: &[String],
    differences: &[String],
    all_runs: &[Measured],
    times: &[ReaderTime],
) {
    let windows = shape.schedule().expect("the DeepSeek shape's schedule");
    println!("\n== decode step summary");
    for line in shape.describe(&windows) {
        println!("{line}");
    }
    for f in failures {
        println!("FAILED: {f}");
    }
    println!(
        "\nstep = GPU time from a start event behind a {} ms lead-in (the CPU's enqueue, printed \
         apart in ms, is not in it); saves = neither's mean minus this one's; Engram stall = this \
         step minus its floor (rows resident, the same plan setting), as a share of the step's \
         lookup time (both Engram layers, measured inside the lookups in the same steps)",
        DECODE_LEAD_IN_US / 1000
    );
    for (lookups, runs, _, before_ms) in all_runs {
        println!(
            "\n{} lookups: {}; {} ids a step per Engram layer; {before_ms:.3} ms of compute and \
             collectives before the first Engram gather",
            lookups.label,
            lookups.what,
            shape.tokens * shape.heads
        );
        for graph in [false, true] {
            for line in report(lookups.label, graph, runs) {
                println!("{line}");
            }
        }
    }
    println!(
        "\noutputs (every reader's y and every Engram layer's rows, same tokens, poisoned before) \
         bit-identical across all {} configurations, eager and graph, cold and warm: {}",
        StepConfig::ALL.len(),
        if differences.is_empty() {
            "yes".to_string()
        } else {
            format!("NO: {}", differences.join("; "))
        }
    );
    println!(
        "\nreaders on this device (median of {READER_REPS}, event-timed behind a 20 us idle \
         collective): cold with L2 full of other, clean lines / warm right after the same \
         launch; eager, and replayed from a graph, also after the plan's prefetch kernel read \
         its weights in (the share: of cold - warm, what that prefetch gives it); a replayed \
         reader is its graph less the collective's alone after the same set-up of L2 (the \
         collective's times in brackets, cold / warm / prefetched)"
    );
    for t in times {
        let share = (t.replay_cold_us - t.replay_prefetched_us)
            / (t.replay_cold_us - t.replay_warm_us).max(1e-9);
        println!(
            "  {:<20} [{} x {}] {:>6.1} MiB: eager cold {:.2} us, warm {:.2} us; replayed cold \
             {:.2} us, warm {:.2} us, prefetched {:.2} us (share {share:.2}) [{:.2} / {:.2} / \
             {:.2} us]",
            t.matrix.name,
            t.matrix.rows,
            t.matrix.k,
            t.matrix.bytes() as f64 / (1u64 << 20) as f64,
            t.cold_us,
            t.warm_us,
            t.replay_cold_us,
            t.replay_warm_us,
            t.replay_prefetched_us,
            t.replay_collective_us[0],
            t.replay_collective_us[1],
            t.replay_collective_us[2],
        );
    }
    println!();
    for line in SparkModel::assumptions(&GB10) {
        println!("{line}");
    }
    for (lookups, runs, windows, _) in all_runs {
        for graph in [false, true] {
            match spark_lines(lookups.label, graph, runs, windows, times) {
                Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
                Err(e) => println!("projection failed: {e}"),
            }
        }
    }
}

fn decode_step(c: &mut Criterion) {
    // Whether each collective ends by writing its readers' activations, as a real one does
    // (the default; 0 leaves them where the last reader of their K left them).
    let shape = DecodeShape {
        collective_writes: knob("FETCHAHEAD_BENCH_COLLECTIVE_WRITES", 1) != 0,
        ..DecodeShape::deepseek()
    };
    let windows = shape.schedule().expect("the DeepSeek shape's schedule");
    for line in shape.describe(&windows) {
        println!("{line}");
    }
    let Some(gpu) = Gpu::for_test("the decode_step bench").expect("open the GPU") else {
        println!(
            "skipped (no GPU): the step's timings, the output comparison, the readers' times and \
             the {} projection, which is made from them. Its model:",
            GB10.name
        );
        for line in SparkModel::assumptions(&GB10) {
            println!("  {line}");
        }
        return;
    };
    let kernels = Arc::new(LabKernels::load(&gpu).expect("load the kernels"));
    // SAFETY: from here on every launch passes raw addresses taken at creation, and no slice is
    // shared between streams without the crate's own fork and join events.
    unsafe { gpu.ctx.disable_event_tracking() };
    let samples = knob("FETCHAHEAD_BENCH_SAMPLES", 20).max(10) as usize;
    // How the prefetched gathers wait for their rows: tags (the step's default) or at-gather.
    let join = match std::env::var("FETCHAHEAD_BENCH_JOIN").as_deref() {
        Ok("at-gather") => Join::AtGather,
        Ok("tags") | Err(_) => Join::Tags,
        Ok(other) => panic!("FETCHAHEAD_BENCH_JOIN={other}: say tags or at-gather"),
    };
    println!("prefetched gathers wait for their rows: {join:?} (FETCHAHEAD_BENCH_JOIN)");
    let rows = knob("FETCHAHEAD_BENCH_ROWS", 1 << 19);
    println!(
        "{} ({} SMs, L2 {} MiB), PTX {}; each step behind a {} ms lead-in",
        gpu.name,
        gpu.multiprocessors,
        gpu.l2_bytes >> 20,
        kernels.arch(),
        DECODE_LEAD_IN_US / 1000
    );

    let (tmp, spec) = write_bench_table(rows, shape.engram_layers.clone(), DIM);
    let cold = Lookups::open("cold", tmp.path(), &spec.layers, 0);
    let warm = Lookups::open(
        "warm",
        tmp.path(),
        &spec.layers,
        2 * spec.data_bytes() + (64 << 20),
    );
    warm.fill(rows);

    let setup = gpu.ctx.new_stream().expect("a stream");
    let t = Instant::now();
    let weights =
        Arc::new(DecodeWeights::new(&kernels, &setup, &shape).expect("the step's weights"));
    println!(
        "weights: {:.2} GiB in {} windows, written in {:.1} s",
        weights.bytes() as f64 / (1u64 << 30) as f64,
        weights.windows().len(),
        t.elapsed().as_secs_f64()
    );
    let times = reader_times(
        &kernels,
        &setup,
        &weights,
        shape.collective_writes,
        READER_REPS,
    )
    .expect("reader times");

    let mut rng = SmallRng::seed_from_u64(7);
    let check_tokens = tokens(&mut rng, shape.tokens);
    let mut reference: Option<StepOutputs> = None;
    let mut differences = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    let mut all_runs: Vec<Measured> = Vec::new();
    let mut group = c.benchmark_group("decode_step");
    group
        .sample_size(samples)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_millis(500))
        .nresamples(1000);
    // FETCHAHEAD_BENCH_LOOKUPS and FETCHAHEAD_BENCH_CONFIGS (comma lists: cold,warm and the
    // configurations' ids, e.g. floor,floor_plan) narrow the run; both default to all.
    let picked = |name: &str, id: &str| {
        std::env::var(name)
            .map(|v| v.split(',').any(|x| x.trim() == id))
            .unwrap_or(true)
    };
    for lookups in [&cold, &warm] {
        if !picked("FETCHAHEAD_BENCH_LOOKUPS", lookups.label) {
            continue;
        }
        let stream = gpu.ctx.new_stream().expect("a stream");
        let mut s = DecodeStep::with_join(
            kernels.clone(),
            stream,
            &lookups.tables,
            shape.clone(),
            weights.clone(),
            join,
        )
        .expect("the decode step");
        s.warm_plan().expect("warm the plan");
        let configs = StepConfig::ALL
            .into_iter()
            .filter(|config| picked("FETCHAHEAD_BENCH_CONFIGS", config.id()));
        // The same check tokens for every configuration of both lookup settings: outputs
        // compare across all of them.
        let sweep = sweep(&mut s, configs, &check_tokens, &mut reference, |case| {
            let id = format!("{}/{}/{}", lookups.label, case.exec(), case.config().id());
            // One untimed step first (a graph's first launch, the lane's first lookup).
            lookups.before_step();
            case.timed(&tokens(&mut rng, shape.tokens), &mut Run::default())?;
            let mut run = Run::default();
            let mut failure = None;
            group.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    let mut total = 0.0;
                    for _ in 0..iters {
                        lookups.before_step();
                        match case.timed(&tokens(&mut rng, shape.tokens), &mut run) {
                            Ok(t) => total += t.gpu_ms,
                            Err(e) => {
                                failure.get_or_insert(e);
                            }
                        }
                    }
                    Duration::from_secs_f64(total / 1e3)
                })
            });
            failure.map_or(Ok(run), Err)
        });
        let label = |what: &String| format!("{} {what}", lookups.label);
        failures.extend(sweep.failures.iter().map(label));
        differences.extend(sweep.differences.iter().map(label));
        let runs = sweep.runs;
        // The timeline of the step (rows resident, plan off and on, eager and replayed), once.
        if let Some(out) =
            std::env::var_os("FETCHAHEAD_BENCH_TIMELINE").filter(|_| lookups.label == cold.label)
        {
            let traced = trace_decode_step(&mut s, &TRACED, 1, DEFAULT_CAPACITY)
                .and_then(|t| t.write(Path::new(&out), false).map(|()| t));
            match traced {
                Ok(t) => println!(
                    "timeline: {} blocks written to {}",
                    t.records(),
                    Path::new(&out).display()
                ),
                Err(e) => failures.push(format!("timeline: {e}")),
            }
        }
        let errors = s.engram_stats().lookup_errors;
        if errors > 0 {
            failures.push(format!("{} lookups: {errors} lookup errors", lookups.label));
        }
        let windows = model_windows(&s);
        all_runs.push((lookups, runs, windows, s.before_first_gather_ms()));
    }
    group.finish();

    summary(&shape, &failures, &differences, &all_runs, &times);
    if !differences.is_empty() || !failures.is_empty() {
        eprintln!("decode_step bench: outputs differed or configurations failed (above)");
        std::process::exit(1);
    }
}

criterion_group!(benches, decode_step);
criterion_main!(benches);
