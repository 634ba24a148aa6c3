//! `fetchahead demo` (the default command): simulated decode and prefill steps of a model with
//! Engram layers. A hash kernel turns a token stream into each Engram layer's row ids, compute
//! kernels stand in for the layers, and the gathers consume the rows, three ways: rows resident
//! on the device (the floor), the synchronous lookup path, and the side-stream prefetcher. GPU
//! idle before the gathers is each way's step time minus the resident one's.
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser};
use fetchahead::forward::{ForwardShape, GatherPath, SimulatedForward};
use fetchahead::gpu::Gpu;
use fetchahead::kernels::Kernels;
use fetchahead::lookup::{MemoryRows, RowLookup};
use fetchahead::prefetcher::{Completion, PrefetcherConfig};
use fetchahead::{Error, Result};
use rand::{RngExt, SeedableRng, rngs::SmallRng};

#[derive(Args, Clone, Debug)]
pub struct DemoArgs {
    /// Rows in the table, split evenly between the Engram layers.
    #[arg(long, default_value_t = 1 << 20)]
    pub rows: u64,
    /// FP8 elements per row.
    #[arg(long, default_value_t = 256)]
    pub dim: usize,
    /// Layers in the simulated model.
    #[arg(long, default_value_t = 14)]
    pub layers: u32,
    /// Which layers (1-based) are Engram layers.
    #[arg(long, value_delimiter = ',', default_value = "1,14")]
    pub engram_layers: Vec<u32>,
    /// Simulated compute per layer, microseconds.
    #[arg(long, default_value_t = 1000)]
    pub compute_us: u64,
    /// Hash heads per Engram layer (ids per token).
    #[arg(long, default_value_t = 8)]
    pub heads: u32,
    /// Tokens each id hashes.
    #[arg(long, default_value_t = 3)]
    pub ngram: u32,
    /// Tokens per decode step.
    #[arg(long, default_value_t = 64)]
    pub decode_tokens: usize,
    /// Tokens per prefill step.
    #[arg(long, default_value_t = 1024)]
    pub prefill_tokens: usize,
    /// Simulated storage latency of each lookup of the in-memory table, microseconds.
    #[arg(long, default_value_t = 1500)]
    pub lookup_latency_us: u64,
    /// Timed steps per phase and path (after one warm-up step).
    #[arg(long, default_value_t = 10)]
    pub steps: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Complete lookups through a worker thread and a pinned flag instead of host functions.
    #[arg(long)]
    pub flag: bool,
    /// Check mode: after each prefetched gather, gather synchronously and count differences.
    #[arg(long)]
    pub check: bool,
}

impl DemoArgs {
    fn shape(&self) -> ForwardShape {
        let mut engram_layers = self.engram_layers.clone();
        engram_layers.sort_unstable();
        engram_layers.dedup();
        ForwardShape {
            layers: self.layers,
            engram_layers,
            compute_us: self.compute_us,
            heads: self.heads,
            ngram: self.ngram,
            seed: self.seed,
        }
    }
}

/// Parses the defaults declared above, so that `fetchahead` alone runs exactly `fetchahead demo`.
#[derive(Parser)]
struct DefaultsOnly {
    #[command(flatten)]
    args: DemoArgs,
}

impl Default for DemoArgs {
    fn default() -> Self {
        DefaultsOnly::parse_from(["demo"]).args
    }
}

const VOCAB: u32 = 128 * 1024;

/// One phase of the demo: its name and tokens per step.
struct Phase {
    name: &'static str,
    tokens: usize,
}

pub fn run(args: &DemoArgs) -> Result<ExitCode> {
    let shape = args.shape();
    shape.check(args.rows)?;
    println!(
        "table: {} rows x {} FP8 (+ E8M0 scales), in memory, seed {}; {} Engram layers of {} \
         rows; each lookup sleeps {} us first (simulated storage)",
        args.rows,
        args.dim,
        args.seed,
        shape.engram_layers.len(),
        shape.rows_per_layer(args.rows),
        args.lookup_latency_us
    );
    println!(
        "  (the row store of issue 4, with its data directory, cache hit rate and IOPS, is not on \
         this branch: this demo runs on the in-memory table)"
    );
    let table = Arc::new(MemoryRows::generate(args.rows, args.dim, args.seed)?);
    table.set_latency(Duration::from_micros(args.lookup_latency_us));
    let phases = [
        Phase {
            name: "decode",
            tokens: args.decode_tokens,
        },
        Phase {
            name: "prefill",
            tokens: args.prefill_tokens,
        },
    ];
    let mut rng = SmallRng::seed_from_u64(args.seed);
    let gpu = match Gpu::open(0) {
        Ok(gpu) => gpu,
        Err(Error::NoDevice(why)) => {
            println!("\nno GPU here ({why}); running the host half only");
            host_half(args, &shape, &table, &phases, &mut rng)?;
            println!(
                "skipped: the hash kernel, row copies, compute, gathers and GPU idle times (they \
                 need a CUDA device)"
            );
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e),
    };
    let kernels = Arc::new(Kernels::load(&gpu)?);
    let completion = if args.flag {
        Completion::Flag
    } else {
        Completion::HostFunction
    };
    println!(
        "{} ({} SMs); {} layers of {} us compute, Engram layers {:?}, {} heads, {}-gram hashes, \
         lookups completed by {completion:?}",
        gpu.name,
        gpu.multiprocessors,
        args.layers,
        args.compute_us,
        shape.engram_layers,
        args.heads,
        args.ngram
    );
    let main = gpu.ctx.new_stream().map_err(|source| Error::Cuda {
        call: "cuStreamCreate",
        source,
    })?;
    let max_tokens = phases.iter().map(|p| p.tokens).max().unwrap_or(1);
    let config = PrefetcherConfig {
        completion,
        check: args.check,
        ..Default::default()
    };
    let mut forward = SimulatedForward::new(kernels, main, &table, shape, max_tokens, config)?;
    println!(
        "\n{:<8} {:>7} {:>10} {:>12} {:>9} {:>12} {:>13} {:>17} {:>11}",
        "phase",
        "tokens",
        "rows/step",
        "resident ms",
        "sync ms",
        "prefetch ms",
        "idle sync ms",
        "idle prefetch ms",
        "rows/s"
    );
    let mut all_match = true;
    for phase in &phases {
        let r = run_phase(args, &mut forward, phase, &mut rng)?;
        all_match &= r.outputs_match;
        let differed = forward.check_differed()?;
        all_match &= differed.unwrap_or(0) == 0;
        println!(
            "{:<8} {:>7} {:>10} {:>12.2} {:>9.2} {:>12.2} {:>13.2} {:>17.2} {:>11.0}",
            phase.name,
            phase.tokens,
            r.rows_per_step,
            r.resident_ms,
            r.sync_ms,
            r.prefetch_ms,
            r.sync_ms - r.resident_ms,
            r.prefetch_ms - r.resident_ms,
            r.rows_per_s
        );
        if let Some(n) = differed {
            println!(
                "         check mode: {n} prefetched gathers differed from the synchronous path so far \
                 (the prefetch column includes check mode's synchronous gathers)"
            );
        }
    }
    let errors = forward.stats().lookup_errors;
    println!(
        "\nidle = step time minus the resident step time (the GPU waiting on lookups)\n\
         prefetched outputs equal the resident gathers and the GPU hash equals the CPU hash: {}; \
         lookup errors: {errors}",
        if all_match { "yes" } else { "NO" }
    );
    Ok(if all_match && errors == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Without a GPU: hashes on the CPU and times the lookups the prefetcher would run.
fn host_half(
    args: &DemoArgs,
    shape: &ForwardShape,
    table: &MemoryRows,
    phases: &[Phase],
    rng: &mut SmallRng,
) -> Result<()> {
    println!(
        "{:<8} {:>7} {:>10} {:>16} {:>11}",
        "phase", "tokens", "rows/step", "lookup ms/step", "rows/s"
    );
    for phase in phases {
        let n = phase.tokens * args.heads as usize;
        let mut ids = Vec::with_capacity(n);
        let mut weights = vec![0u8; n * args.dim];
        let mut scales = vec![0u8; n * args.dim / 32];
        let mut busy = Duration::ZERO;
        for _ in 0..args.steps.max(1) {
            let tokens = token_stream(rng, phase.tokens);
            for k in 0..shape.engram_layers.len() {
                shape.hash_on_host(args.rows, k, &tokens, &mut ids);
                let start = Instant::now();
                table.lookup(&ids, &mut weights, &mut scales)?;
                busy += start.elapsed();
            }
        }
        let rows = n * shape.engram_layers.len();
        let ms = busy.as_secs_f64() * 1e3 / args.steps.max(1) as f64;
        println!(
            "{:<8} {:>7} {:>10} {:>16.2} {:>11.0}",
            phase.name,
            phase.tokens,
            rows,
            ms,
            rows as f64 / (ms / 1e3).max(1e-9)
        );
    }
    Ok(())
}

fn token_stream(rng: &mut SmallRng, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(0..VOCAB)).collect()
}

/// What one phase measured.
struct PhaseResult {
    rows_per_step: usize,
    resident_ms: f64,
    sync_ms: f64,
    prefetch_ms: f64,
    rows_per_s: f64,
    outputs_match: bool,
}

/// One warm-up and `steps` timed forwards of each path on the same token streams; then the last
/// stream's prefetched output against the resident gather, and the GPU hash against the CPU's.
fn run_phase(
    args: &DemoArgs,
    forward: &mut SimulatedForward,
    phase: &Phase,
    rng: &mut SmallRng,
) -> Result<PhaseResult> {
    let streams: Vec<Vec<u32>> = (0..=args.steps)
        .map(|_| token_stream(rng, phase.tokens))
        .collect();
    let paths = [GatherPath::Resident, GatherPath::Sync, GatherPath::Prefetch];
    let mut ms = [0f64; 3];
    for (i, &path) in paths.iter().enumerate() {
        for (step, tokens) in streams.iter().enumerate() {
            forward.set_tokens(tokens)?;
            let elapsed = forward.time(path, phase.tokens)?;
            if step > 0 {
                ms[i] += elapsed / args.steps.max(1) as f64;
            }
        }
    }
    let last = streams.last().map_or(&[][..], |t| t);
    forward.set_tokens(last)?;
    forward.time(GatherPath::Resident, phase.tokens)?;
    let mut outputs_match = true;
    let mut want_ids = Vec::new();
    for k in 0..forward.engram_layers() {
        let (ids, resident) = forward.read(k, GatherPath::Resident, phase.tokens)?;
        let (_, prefetched) = forward.read(k, GatherPath::Prefetch, phase.tokens)?;
        forward
            .shape()
            .hash_on_host(args.rows, k, last, &mut want_ids);
        outputs_match &= resident == prefetched && ids == want_ids;
    }
    let rows_per_step = phase.tokens * args.heads as usize * forward.engram_layers();
    Ok(PhaseResult {
        rows_per_step,
        resident_ms: ms[0],
        sync_ms: ms[1],
        prefetch_ms: ms[2],
        rows_per_s: rows_per_step as f64 / (ms[2] / 1e3).max(1e-9),
        outputs_match,
    })
}
