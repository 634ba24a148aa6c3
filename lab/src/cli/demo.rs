//! `fetchahead-lab demo` (the default command): simulated decode and prefill steps of a model with
//! Engram layers. A hash kernel turns a token stream into each Engram layer's row ids, compute
//! kernels stand in for the layers, and the gathers consume the rows, three ways: rows resident
//! on the device (the floor), the synchronous lookup path, and the side-stream prefetcher. GPU
//! idle before the gathers is each way's step time minus the resident one's. Each step is timed
//! behind a lead-in kernel, so that its time excludes the CPU's enqueue of the step, which is
//! printed on its own.
//!
//! The rows come from the row store: a generated table under `--data-dir` (written once, reused
//! while it matches the options), one [`LayerRows`] per Engram layer. The demo writes only its own
//! table (its manifest says the demo wrote it): a directory holding anything else is refused
//! unless `--force`. `--memory` reads a generated table in RAM instead, with a simulated storage
//! latency.
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::LabKernels;
use crate::forward::{
    FlagLanes, ForwardShape, GatherPath, LEAD_IN_US, LayerTable, SimulatedForward,
};
use clap::{Args, Parser};
use fetchahead::kernels::gpu::Gpu;
use fetchahead::prefetch::lookup::MemoryRows;
use fetchahead::prefetch::prefetcher::{Completion, Join, PrefetcherConfig};
use fetchahead::store::make::{DirState, TableSpec, WriteOptions, dir_state, write_table_with};
use fetchahead::store::{LayerRows, ReadPath, RowStore, Stats, StoreOptions};
use fetchahead::{Error, Result};
use indicatif::{ProgressBar, ProgressStyle};
use rand::{RngExt, SeedableRng, rngs::SmallRng};

mod decode;

#[derive(Args, Clone, Debug)]
pub struct DemoArgs {
    /// Where the demo's table lives (relative to the working directory); written when absent or
    /// not matching --rows, --dim, --engram-layers and --seed, reused otherwise. A directory
    /// holding anything but the demo's own table is refused (see --force).
    #[arg(long, default_value = "data/demo-table")]
    pub data_dir: PathBuf,
    /// Replace the files the demo's table writes in --data-dir even when the demo did not write
    /// them, listing each first (a symlink is replaced, never what it points at); every other
    /// file is left alone.
    #[arg(long)]
    pub force: bool,
    /// Use a generated table in RAM with a simulated lookup latency instead of the row store.
    #[arg(long)]
    pub memory: bool,
    /// Rows of each Engram layer's table (the default, 2 layers of 256 + 8 bytes a row, is
    /// 264 MiB).
    #[arg(long, default_value_t = 1 << 19)]
    pub rows: u64,
    /// FP8 elements per row.
    #[arg(long, default_value_t = 256)]
    pub dim: usize,
    /// The row store's read path for rows that miss its DRAM cache: auto (measured by
    /// `fetchahead tune`; never mmap), uring, preadv, buffered, or mmap (a shard truncated while
    /// it runs raises SIGBUS and kills the process).
    #[arg(long, default_value = "auto")]
    pub read_path: ReadPath,
    /// The row store's DRAM row cache, MiB (0: off).
    #[arg(long, default_value_t = 64)]
    pub cache_mib: u64,
    /// Layers in the simulated model.
    #[arg(long, default_value_t = 14)]
    pub layers: u32,
    /// Which layers (1-based) are Engram layers: the table holds one tensor pair for each.
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
    /// With --memory: simulated storage latency of each lookup, microseconds.
    #[arg(long, default_value_t = 1500)]
    pub lookup_latency_us: u64,
    /// Timed steps per phase and path (after one warm-up step).
    #[arg(long, default_value_t = 10)]
    pub steps: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// How the side stream learns a lookup is done: flag (a lookup thread shared by the
    /// forward's layers, the earliest-gathered layer's lookup first; the measured best, and
    /// `PrefetcherConfig::default()`'s) or host-function (host functions on the driver's thread).
    #[arg(long, value_enum, default_value_t = CompletionArg::from(PrefetcherConfig::default().completion))]
    pub completion: CompletionArg,
    /// How a gather waits for its rows: tags (each row's tag on the device, the step joining
    /// the side stream once at its end; the measured best, and the default's) or at-gather
    /// (the stream waits for the side stream at each gather).
    #[arg(long, value_enum, default_value_t = JoinArg::from(PrefetcherConfig::default().join))]
    pub join: JoinArg,
    /// Check mode: after each prefetched gather, gather synchronously and count differences.
    #[arg(long)]
    pub check: bool,
    /// The prefetcher's gather + dequant variant (`fetchahead kernels` lists them); default:
    /// the fastest measured for the device's arch.
    #[arg(long, value_name = "NAME")]
    pub variant: Option<String>,
    /// After the decode-step section, record its step (rows resident, the L2 plan off and on,
    /// eager and replayed) on the device timeline and write it to FILE as a Chrome trace
    /// (replaced only with --force).
    #[arg(long, value_name = "FILE")]
    pub timeline: Option<PathBuf>,
}

/// `--completion`: [`Completion`] as the command line spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CompletionArg {
    Flag,
    HostFunction,
}

impl From<Completion> for CompletionArg {
    fn from(c: Completion) -> Self {
        match c {
            Completion::Flag => CompletionArg::Flag,
            Completion::HostFunction => CompletionArg::HostFunction,
        }
    }
}

impl From<CompletionArg> for Completion {
    fn from(c: CompletionArg) -> Self {
        match c {
            CompletionArg::Flag => Completion::Flag,
            CompletionArg::HostFunction => Completion::HostFunction,
        }
    }
}

/// `--join`: [`Join`] as the command line spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum JoinArg {
    Tags,
    AtGather,
}

impl From<Join> for JoinArg {
    fn from(j: Join) -> Self {
        match j {
            Join::Tags => JoinArg::Tags,
            Join::AtGather => JoinArg::AtGather,
        }
    }
}

impl From<JoinArg> for Join {
    fn from(j: JoinArg) -> Self {
        match j {
            JoinArg::Tags => Join::Tags,
            JoinArg::AtGather => Join::AtGather,
        }
    }
}

impl DemoArgs {
    /// What clap cannot check: as make-table, a layer listed twice is an error, not merged; a
    /// demo of no steps is refused rather than run.
    fn validate(&self) -> Result<()> {
        let mut seen = Vec::with_capacity(self.engram_layers.len());
        for &l in &self.engram_layers {
            if seen.contains(&l) {
                return Err(Error::invalid(
                    "--engram-layers",
                    format!("{:?} lists layer {l} twice", self.engram_layers),
                ));
            }
            seen.push(l);
        }
        if self.steps == 0 {
            return Err(Error::invalid(
                "--steps",
                "0 timed steps measure nothing; want at least 1",
            ));
        }
        if self.decode_tokens == 0 || self.prefill_tokens == 0 {
            return Err(Error::invalid(
                "tokens",
                format!(
                    "--decode-tokens {} and --prefill-tokens {}: want at least 1 each",
                    self.decode_tokens, self.prefill_tokens
                ),
            ));
        }
        // The host half's buffers are sized by these arguments: check them before allocating.
        let rows_per_step = (self.decode_tokens.max(self.prefill_tokens) as u64)
            .checked_mul(u64::from(self.heads))
            .and_then(|n| n.checked_mul((self.dim + self.dim / 32) as u64 * 2))
            .unwrap_or(u64::MAX);
        fetchahead::memory::check_fits(rows_per_step, "one step's lookup buffers")?;
        self.dequant_variant()?;
        Ok(())
    }

    /// --variant resolved to its handle (`None`: the arch's default).
    fn dequant_variant(&self) -> Result<Option<fetchahead::DequantVariant>> {
        self.variant
            .as_deref()
            .map(fetchahead::dequant_variant_named)
            .transpose()
    }

    fn shape(&self) -> ForwardShape {
        ForwardShape {
            layers: self.layers,
            engram_layers: self.engram_layer_ids(),
            compute_us: self.compute_us,
            heads: self.heads,
            ngram: self.ngram,
            seed: self.seed,
        }
    }

    fn engram_layer_ids(&self) -> Vec<u32> {
        let mut layers = self.engram_layers.clone();
        layers.sort_unstable();
        layers.dedup();
        layers
    }

    fn spec(&self) -> TableSpec {
        TableSpec {
            rows: self.rows,
            layers: self.engram_layer_ids(),
            dim: self.dim,
            shards: 1,
            seed: self.seed,
        }
    }
}

/// Parses the defaults declared above, so that `fetchahead-lab` alone runs exactly `fetchahead-lab demo`.
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

/// The writer the demo's tables' manifests name.
const WRITER: &str = "demo";

/// One phase of the demo: its name and tokens per step.
struct Phase {
    name: &'static str,
    tokens: usize,
}

/// The Engram layers' tables, in `engram_layers` order, and the store they read (none in memory).
struct Tables {
    layers: Vec<Arc<dyn LayerTable>>,
    store: Option<Arc<RowStore>>,
}

impl Tables {
    fn stats(&self) -> Option<Stats> {
        self.store.as_ref().map(|s| s.stats())
    }
}

/// Why the demo's table in `dir` is not the one `spec` describes (`None`: it is).
fn table_mismatch(dir: &Path, recorded: Option<&TableSpec>, spec: &TableSpec) -> Option<String> {
    let Some(have) = recorded else {
        return Some("an older demo's table, without a manifest".into());
    };
    if have != spec {
        return Some(format!(
            "it has layers {:?}, {} rows of dim {}, seed {}; want layers {:?}, {} rows of dim {}, \
             seed {}",
            have.layers,
            have.rows,
            have.dim,
            have.seed,
            spec.layers,
            spec.rows,
            spec.dim,
            spec.seed
        ));
    }
    match RowStore::open(dir, StoreOptions::default()) {
        Ok(store) if store.layers() == spec.layers && store.row_range().end == spec.rows => None,
        Ok(_) => Some("its files do not match its manifest".into()),
        Err(e) => Some(e.to_string()),
    }
}

/// Writes the demo's table into `args.data_dir` with a progress bar unless a matching one is
/// there; true when it was reused. Only the demo's own table is rewritten: anything else in the
/// directory is refused, naming what is there, unless `--force`.
fn prepare_table(args: &DemoArgs) -> Result<bool> {
    let dir = &args.data_dir;
    let spec = args.spec();
    let shown = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
    let state = dir_state(dir)?;
    match &state {
        DirState::Absent | DirState::Empty => println!("table: writing {}", shown.display()),
        DirState::Ours(m) if m.writer == WRITER => {
            let mismatch = if !m.complete && m.spec.is_some() {
                Some("a rewrite of it did not finish".to_string())
            } else {
                table_mismatch(dir, m.spec.as_ref().filter(|_| m.complete), &spec)
            };
            match mismatch {
                None => {
                    println!("table: reusing {}", shown.display());
                    return Ok(true);
                }
                Some(why) => println!("table: rewriting {} ({why})", shown.display()),
            }
        }
        _ if args.force => println!(
            "table: --force: replacing the table files in {} (it held {})",
            shown.display(),
            state.describe()
        ),
        _ => {
            return Err(Error::WouldOverwrite {
                path: shown,
                why: format!(
                    "it holds {}, not the demo's own table; the demo writes only its own table: \
                     pass --force to replace it, or give --data-dir another directory",
                    state.describe()
                ),
            });
        }
    }
    let bar = ProgressBar::new(spec.data_bytes());
    bar.set_style(
        ProgressStyle::with_template(
            "  {bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let t = Instant::now();
    let options = WriteOptions {
        writer: WRITER.into(),
        force: args.force,
    };
    write_table_with(dir, &spec, &options, |done| bar.set_position(done))?;
    bar.finish_and_clear();
    println!(
        "  wrote {:.0} MiB in {:.1} s",
        spec.data_bytes() as f64 / (1u64 << 20) as f64,
        t.elapsed().as_secs_f64()
    );
    Ok(false)
}

/// Opens the Engram layers' tables: the row store under `args.data_dir` (written first when
/// needed), or generated tables in RAM.
fn open_tables(args: &DemoArgs) -> Result<Tables> {
    let layers = args.engram_layer_ids();
    if args.memory {
        let latency = Duration::from_micros(args.lookup_latency_us);
        let tables = layers
            .iter()
            .map(|&l| {
                let t = MemoryRows::generate(args.rows, args.dim, args.seed ^ u64::from(l))?;
                t.set_latency(latency);
                Ok(Arc::new(t) as Arc<dyn LayerTable>)
            })
            .collect::<Result<_>>()?;
        return Ok(Tables {
            layers: tables,
            store: None,
        });
    }
    prepare_table(args)?;
    if args.read_path == ReadPath::Mmap {
        eprintln!(
            "WARNING: --read-path mmap: a shard truncated while the demo runs raises SIGBUS and \
             kills it (auto never picks mmap)"
        );
    }
    let options = StoreOptions {
        read_path: args.read_path,
        cache_bytes: args.cache_mib.saturating_mul(1 << 20),
        ..Default::default()
    };
    let store = Arc::new(RowStore::open(&args.data_dir, options)?);
    let tables = layers
        .iter()
        .map(|&l| Ok(Arc::new(LayerRows::new(store.clone(), l)?) as Arc<dyn LayerTable>))
        .collect::<Result<_>>()?;
    Ok(Tables {
        layers: tables,
        store: Some(store),
    })
}

fn describe(args: &DemoArgs, tables: &Tables) {
    let per_layer_mib = args.rows as f64 * (args.dim + args.dim / 32) as f64 / (1u64 << 20) as f64;
    match &tables.store {
        None => println!(
            "table: in memory, {} Engram layers of {} rows x {} FP8 (+ E8M0 scales), {:.0} MiB \
             each, seed {}; each lookup sleeps {} us first (simulated storage)",
            tables.layers.len(),
            args.rows,
            args.dim,
            per_layer_mib,
            args.seed,
            args.lookup_latency_us
        ),
        Some(store) => {
            let direct = match store.direct_io() {
                Ok(()) => "O_DIRECT".to_string(),
                Err(why) => format!("page cache (no O_DIRECT: {why})"),
            };
            println!(
                "row store: layers {:?} of {} rows x {} FP8 (+ E8M0 scales), {:.0} MiB each; \
                 read path {}, {direct}; DRAM row cache {} MiB",
                store.layers(),
                store.row_range().end,
                store.dim(),
                per_layer_mib,
                read_path_line(store, args.decode_tokens * args.heads as usize),
                args.cache_mib
            );
        }
    }
}

/// The read path as the store takes it: `auto` says what it picks for a decode batch; a path
/// asked for by name is that path.
fn read_path_line(store: &RowStore, batch: usize) -> String {
    match store.read_path() {
        ReadPath::Auto => format!("auto (batch of {batch} rows: {})", store.auto_path(batch)),
        ReadPath::Mmap => "mmap (asked for: a shard truncated while the demo runs would raise \
                           SIGBUS)"
            .to_string(),
        p => p.to_string(),
    }
}

/// The demo's two phases: decode steps, then prefill steps.
fn phases(args: &DemoArgs) -> [Phase; 2] {
    [
        Phase {
            name: "decode",
            tokens: args.decode_tokens,
        },
        Phase {
            name: "prefill",
            tokens: args.prefill_tokens,
        },
    ]
}

pub fn run(args: &DemoArgs) -> Result<ExitCode> {
    args.validate()?;
    let shape = args.shape();
    shape.check(args.rows)?;
    let tables = open_tables(args)?;
    describe(args, &tables);
    let phases = phases(args);
    let mut rng = SmallRng::seed_from_u64(args.seed);
    let gpu = match Gpu::open(0) {
        Ok(gpu) => gpu,
        Err(Error::NoDevice(why)) => {
            println!("\nno GPU here ({why}); running the host half only");
            return without_gpu(args, &shape, &tables, &phases, &mut rng);
        }
        Err(e) => return Err(e),
    };
    let kernels = Arc::new(LabKernels::load(&gpu)?);
    let phases_ok = forward_phases(args, &gpu, &kernels, shape, &tables, &phases, &mut rng)?;
    let decode_ok = decode::run(args, &gpu, &kernels, &tables.layers, &mut rng)?;
    Ok(if phases_ok && decode_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Without a GPU: the host half of every phase, its lookups checked against the table's own
/// bytes, and what was skipped.
fn without_gpu(
    args: &DemoArgs,
    shape: &ForwardShape,
    tables: &Tables,
    phases: &[Phase],
    rng: &mut SmallRng,
) -> Result<ExitCode> {
    let results = host_half(args, shape, tables, phases, rng)?;
    print_host_half(phases, &results);
    decode::skipped(args);
    let wrong: usize = results.iter().map(|r| r.wrong_rows).sum();
    println!(
        "\nlookups equal the table's own bytes{}: {}\n\
         skipped: the hash kernel, row copies, compute, gathers and GPU idle times (they \
         need a CUDA device)",
        if tables.store.is_some() {
            " (read straight from its files)"
        } else {
            ""
        },
        if wrong == 0 {
            "yes".to_string()
        } else {
            format!("NO ({wrong} rows differ)")
        }
    );
    Ok(if wrong == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The simulated forward's phases on the GPU, each three ways (rows resident, synchronous,
/// prefetched), as a table; true when every output matched and no lookup failed.
fn forward_phases(
    args: &DemoArgs,
    gpu: &Gpu,
    kernels: &Arc<LabKernels>,
    shape: ForwardShape,
    tables: &Tables,
    phases: &[Phase],
    rng: &mut SmallRng,
) -> Result<bool> {
    let completion = Completion::from(args.completion);
    let join = Join::from(args.join);
    println!(
        "{} ({} SMs); {} layers of {} us compute, Engram layers {:?}, {} heads, {}-gram hashes, \
         lookups completed by {completion:?}, gathers joined by {join:?}",
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
        join,
        check: args.check,
        variant: args.dequant_variant()?,
        ..Default::default()
    };
    let mut forward = SimulatedForward::new(
        kernels.clone(),
        main,
        &tables.layers,
        shape,
        max_tokens,
        config,
        FlagLanes::Shared,
    )?;
    println!(
        "\n{:<8} {:>7} {:>10} {:>12} {:>9} {:>12} {:>13} {:>17} {:>11} {:>6} {:>9}",
        "phase",
        "tokens",
        "rows/step",
        "resident ms",
        "sync ms",
        "prefetch ms",
        "idle sync ms",
        "idle prefetch ms",
        "rows/s",
        "hit %",
        "IOPS"
    );
    let mut all_match = true;
    for phase in phases {
        let r = run_phase(args, &mut forward, tables, phase, rng)?;
        all_match &= r.outputs_match;
        let differed = forward.check_differed()?;
        all_match &= differed.unwrap_or(0) == 0;
        let (hit, iops) = store_columns(r.store.as_ref(), r.prefetch_ms * args.steps as f64);
        println!(
            "{:<8} {:>7} {:>10} {:>12.2} {:>9.2} {:>12.2} {:>13.2} {:>17.2} {:>11.0} {hit:>6} \
             {iops:>9}",
            phase.name,
            phase.tokens,
            r.rows_per_step,
            r.resident_ms,
            r.sync_ms,
            r.prefetch_ms,
            r.sync_ms - r.resident_ms,
            r.prefetch_ms - r.resident_ms,
            r.rows_per_s,
        );
        println!(
            "         CPU enqueue per step (not in the step times): resident {:.3} ms, sync {:.3} \
             ms, prefetch {:.3} ms{}",
            r.enqueue_ms[0],
            r.enqueue_ms[1],
            r.enqueue_ms[2],
            if r.lead_in_overruns > 0 {
                format!(
                    "; the {LEAD_IN_US} us lead-in ran out in {} steps (their times may hold \
                     waits for the CPU)",
                    r.lead_in_overruns
                )
            } else {
                String::new()
            }
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
        "\nidle = step time minus the resident step time (the GPU waiting on lookups); each step is \
         timed on the GPU behind a {LEAD_IN_US} us lead-in kernel, so that the CPU's enqueue of \
         the step (printed apart) is not in it; hit % and IOPS: the row store's counters over \
         the prefetched steps (reads / their time)\n\
         prefetched outputs equal the resident gathers and the GPU hash equals the CPU hash: {}; \
         lookup errors: {errors}",
        if all_match { "yes" } else { "NO" }
    );
    Ok(all_match && errors == 0)
}

/// The store's hit rate and reads per second over `ms` milliseconds, as table cells.
fn store_columns(delta: Option<&Stats>, ms: f64) -> (String, String) {
    match delta {
        None => ("-".into(), "-".into()),
        Some(d) => (
            format!(
                "{:.1}",
                100.0 * d.hits as f64 / (d.hits + d.misses).max(1) as f64
            ),
            format!("{:.0}", d.reads as f64 / (ms / 1e3).max(1e-9)),
        ),
    }
}

/// `after - before`, where both were taken.
fn delta(before: Option<Stats>, after: Option<Stats>) -> Option<Stats> {
    Some(after? - before?)
}

/// What the host half measured in one phase.
struct HostPhase {
    rows_per_step: usize,
    /// Lookup time per step, all Engram layers.
    lookup_ms: f64,
    /// Lookup time over the phase.
    total_ms: f64,
    /// The store's counters over the phase (`None` in memory).
    store: Option<Stats>,
    /// Looked-up rows that differ from the table's bytes.
    wrong_rows: usize,
}

/// Without a GPU: hashes on the CPU, runs the lookups the prefetcher would run through the
/// Engram layers' tables, and checks each looked-up row against the table's own bytes.
fn host_half(
    args: &DemoArgs,
    shape: &ForwardShape,
    tables: &Tables,
    phases: &[Phase],
    rng: &mut SmallRng,
) -> Result<Vec<HostPhase>> {
    let (dim, sdim) = (args.dim, args.dim / 32);
    let steps = args.steps.max(1);
    let mut results = Vec::with_capacity(phases.len());
    for phase in phases {
        let n = phase.tokens * args.heads as usize;
        let streams: Vec<Vec<u32>> = (0..steps)
            .map(|_| token_stream(rng, phase.tokens))
            .collect();
        let mut ids = Vec::with_capacity(n);
        let mut weights = vec![0u8; n * dim];
        let mut scales = vec![0u8; n * sdim];
        let mut busy = Duration::ZERO;
        let mut wrong_rows = 0;
        let before = tables.stats();
        for (k, table) in tables.layers.iter().enumerate() {
            table.with_bytes(&mut |all_w, all_s| {
                for tokens in &streams {
                    shape.hash_on_host(args.rows, k, tokens, &mut ids);
                    let start = Instant::now();
                    table.lookup(&ids, &mut weights, &mut scales)?;
                    busy += start.elapsed();
                    for (i, &id) in ids.iter().enumerate() {
                        let r = id as usize;
                        wrong_rows += usize::from(
                            weights[i * dim..(i + 1) * dim] != all_w[r * dim..(r + 1) * dim]
                                || scales[i * sdim..(i + 1) * sdim]
                                    != all_s[r * sdim..(r + 1) * sdim],
                        );
                    }
                }
                Ok(())
            })?;
        }
        results.push(HostPhase {
            rows_per_step: n * tables.layers.len(),
            lookup_ms: busy.as_secs_f64() * 1e3 / steps as f64,
            total_ms: busy.as_secs_f64() * 1e3,
            store: delta(before, tables.stats()),
            wrong_rows,
        });
    }
    Ok(results)
}

fn print_host_half(phases: &[Phase], results: &[HostPhase]) {
    println!(
        "{:<8} {:>7} {:>10} {:>16} {:>11} {:>6} {:>9}",
        "phase", "tokens", "rows/step", "lookup ms/step", "rows/s", "hit %", "IOPS"
    );
    for (phase, r) in phases.iter().zip(results) {
        let (hit, iops) = store_columns(r.store.as_ref(), r.total_ms);
        println!(
            "{:<8} {:>7} {:>10} {:>16.2} {:>11.0} {hit:>6} {iops:>9}",
            phase.name,
            phase.tokens,
            r.rows_per_step,
            r.lookup_ms,
            r.rows_per_step as f64 / (r.lookup_ms / 1e3).max(1e-9)
        );
    }
    println!(
        "lookup ms/step: every Engram layer's lookup of one step, one after another on this \
         thread; hit % and IOPS: the row store's counters over the phase (reads / lookup time)"
    );
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
    /// Mean host milliseconds of one step's enqueue: resident, sync, prefetch.
    enqueue_ms: [f64; 3],
    /// Timed steps whose lead-in ran out before the enqueue returned.
    lead_in_overruns: usize,
    rows_per_s: f64,
    outputs_match: bool,
    /// The store's counters over the prefetched steps (`None` in memory).
    store: Option<Stats>,
}

/// One warm-up and `steps` timed forwards of each path, each path on fresh token streams (so that
/// the row cache holds no row for the prefetcher that the synchronous path just read); then the
/// last prefetched stream's output against the resident gather, and the GPU hash against the CPU's.
fn run_phase(
    args: &DemoArgs,
    forward: &mut SimulatedForward,
    tables: &Tables,
    phase: &Phase,
    rng: &mut SmallRng,
) -> Result<PhaseResult> {
    let paths = [GatherPath::Resident, GatherPath::Sync, GatherPath::Prefetch];
    let mut ms = [0f64; 3];
    let mut enqueue_ms = [0f64; 3];
    let mut lead_in_overruns = 0;
    let mut store = None;
    let mut streams: Vec<Vec<u32>> = Vec::new();
    for (i, &path) in paths.iter().enumerate() {
        streams = (0..=args.steps)
            .map(|_| token_stream(rng, phase.tokens))
            .collect();
        let mut before = None;
        for (step, tokens) in streams.iter().enumerate() {
            forward.set_tokens(tokens)?;
            if step == 1 {
                before = tables.stats();
            }
            let timed = forward.time(path, phase.tokens)?;
            if step > 0 {
                ms[i] += timed.gpu_ms / args.steps.max(1) as f64;
                enqueue_ms[i] += timed.enqueue_ms / args.steps.max(1) as f64;
                lead_in_overruns += usize::from(timed.lead_in_overrun);
            }
        }
        if path == GatherPath::Prefetch {
            store = delta(before, tables.stats());
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
        enqueue_ms,
        lead_in_overruns,
        rows_per_s: rows_per_step as f64 / (ms[2] / 1e3).max(1e-9),
        outputs_match,
        store,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_runs_the_librarys_default_modes() {
        let args = DemoArgs::default();
        let d = PrefetcherConfig::default();
        assert_eq!(Completion::from(args.completion), d.completion);
        assert_eq!(Join::from(args.join), d.join);
        // The measured best (BENCHMARKS.md: the shared flag lane, tagged gathers).
        assert_eq!((d.completion, d.join), (Completion::Flag, Join::Tags));
    }

    fn small(dir: &Path) -> DemoArgs {
        DemoArgs {
            data_dir: dir.join("demo-table"),
            rows: 3000,
            dim: 64,
            cache_mib: 1,
            decode_tokens: 16,
            prefill_tokens: 128,
            steps: 3,
            lookup_latency_us: 0,
            ..DemoArgs::default()
        }
    }

    /// The demo's host half on a small row store: the table is written once and reused, every
    /// looked-up row equals the file's bytes, and the store's counters move with the lookups.
    #[test]
    fn host_half_reads_the_row_store() {
        let tmp = tempfile::tempdir().unwrap();
        let args = small(tmp.path());
        assert!(
            !prepare_table(&args).unwrap(),
            "a fresh directory is written"
        );
        assert!(prepare_table(&args).unwrap(), "a matching table is reused");
        let tables = open_tables(&args).unwrap();
        let store = tables.store.clone().expect("the row store, not memory");
        assert_eq!(store.layers(), &[1, 14]);
        assert_eq!(store.row_range(), 0..args.rows);
        let phases = phases(&args);
        let mut rng = SmallRng::seed_from_u64(3);
        let results = host_half(&args, &args.shape(), &tables, &phases, &mut rng).unwrap();
        for (phase, r) in phases.iter().zip(&results) {
            assert_eq!(
                r.wrong_rows, 0,
                "{}: rows differ from the table",
                phase.name
            );
            assert_eq!(r.rows_per_step, phase.tokens * args.heads as usize * 2);
            let d = r.store.expect("store counters");
            assert_eq!(
                d.hits + d.misses,
                (r.rows_per_step * args.steps) as u64,
                "{}: every looked-up row is a hit or a miss",
                phase.name
            );
            assert!(
                d.reads > 0 && d.bytes > 0,
                "{}: no reads counted",
                phase.name
            );
        }
        // A different seed is a different table: rewritten, not reused.
        let reseeded = DemoArgs {
            seed: 2,
            ..small(tmp.path())
        };
        assert!(!prepare_table(&reseeded).unwrap());
    }

    #[test]
    fn host_half_reads_memory_tables() {
        let tmp = tempfile::tempdir().unwrap();
        let args = DemoArgs {
            memory: true,
            ..small(tmp.path())
        };
        let tables = open_tables(&args).unwrap();
        assert!(tables.store.is_none());
        assert!(!args.data_dir.exists(), "--memory writes no table");
        let mut rng = SmallRng::seed_from_u64(3);
        let results = host_half(&args, &args.shape(), &tables, &phases(&args), &mut rng).unwrap();
        assert!(
            results
                .iter()
                .all(|r| r.wrong_rows == 0 && r.store.is_none())
        );
    }

    /// Issue 12, case 1: a shard that links to a user's file, a user's other files and a
    /// make-table table are refused (naming --force and --data-dir) and stay byte for byte;
    /// --force replaces the link, never what it points at.
    #[test]
    fn the_demo_writes_only_its_own_table() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real.safetensors");
        let bytes: Vec<u8> = (0..50_000u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(&real, &bytes).unwrap();
        let args = small(tmp.path());
        std::fs::create_dir(&args.data_dir).unwrap();
        let link = args.data_dir.join("model.safetensors");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let msg = prepare_table(&args).unwrap_err().to_string();
        assert!(
            msg.contains("a symlink to") && msg.contains("--force") && msg.contains("--data-dir"),
            "{msg}"
        );
        assert_eq!(std::fs::read(&real).unwrap(), bytes);
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );

        // A table from make-table: refused, untouched.
        let made = tmp.path().join("made");
        let spec = TableSpec {
            rows: 1000,
            ..args.spec()
        };
        fetchahead::store::make::write_table(&made, &spec, |_| {}).unwrap();
        let shard = std::fs::read(made.join("model.safetensors")).unwrap();
        let theirs = DemoArgs {
            data_dir: made.clone(),
            ..small(tmp.path())
        };
        let msg = prepare_table(&theirs).unwrap_err().to_string();
        assert!(msg.contains("fetchahead make-table"), "{msg}");
        assert_eq!(
            std::fs::read(made.join("model.safetensors")).unwrap(),
            shard
        );

        let forced = DemoArgs {
            force: true,
            ..small(tmp.path())
        };
        assert!(!prepare_table(&forced).unwrap());
        assert_eq!(
            std::fs::read(&real).unwrap(),
            bytes,
            "written through the link"
        );
        assert!(std::fs::symlink_metadata(&link).unwrap().is_file());
        // Now the demo's own: reused without --force.
        assert!(prepare_table(&small(tmp.path())).unwrap());
    }

    /// A table an older demo wrote (its shard and seed marker, no manifest) is the demo's own.
    #[test]
    fn an_older_demos_table_is_rewritten() {
        let tmp = tempfile::tempdir().unwrap();
        let args = small(tmp.path());
        let scratch = tmp.path().join("scratch");
        fetchahead::store::make::write_table(&scratch, &args.spec(), |_| {}).unwrap();
        std::fs::create_dir(&args.data_dir).unwrap();
        std::fs::rename(
            scratch.join("model.safetensors"),
            args.data_dir.join("model.safetensors"),
        )
        .unwrap();
        let seed = args
            .data_dir
            .join(fetchahead::store::make::LEGACY_DEMO_SEED);
        std::fs::write(&seed, "1").unwrap();
        assert!(!prepare_table(&args).unwrap(), "rewritten, with a manifest");
        assert!(!seed.exists());
        assert!(prepare_table(&args).unwrap());
    }

    /// Issue 12, cases 3 and 9: arguments a user gets wrong are errors, never an abort or a
    /// silent change.
    #[test]
    fn demo_arguments_are_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let twice = DemoArgs {
            engram_layers: vec![1, 1],
            ..small(tmp.path())
        };
        let msg = twice.validate().unwrap_err().to_string();
        assert!(msg.contains("layer 1 twice"), "{msg}");
        let none = DemoArgs {
            steps: 0,
            ..small(tmp.path())
        };
        assert!(none.validate().unwrap_err().to_string().contains("--steps"));
        assert!(small(tmp.path()).validate().is_ok());
        let huge = DemoArgs {
            memory: true,
            rows: 1_000_000_000_000,
            ..small(tmp.path())
        };
        let msg = open_tables(&huge).err().unwrap().to_string();
        assert!(msg.contains("memory"), "{msg}");
    }

    /// Issue 12, case 8: `--read-path preadv` says preadv, not Auto's choice.
    #[test]
    fn the_read_path_shown_is_the_one_taken() {
        let tmp = tempfile::tempdir().unwrap();
        let args = small(tmp.path());
        prepare_table(&args).unwrap();
        for (path, want) in [
            (ReadPath::Preadv, "preadv"),
            (ReadPath::Buffered, "buffered"),
            (ReadPath::Mmap, "SIGBUS"),
        ] {
            let options = StoreOptions {
                read_path: path,
                ..StoreOptions::default()
            };
            let store = RowStore::open(&args.data_dir, options).unwrap();
            let line = read_path_line(&store, 512);
            assert!(
                line.starts_with(path.name()) && line.contains(want),
                "{line}"
            );
            assert!(!line.contains("batch of"), "{line}");
        }
        let store = RowStore::open(&args.data_dir, StoreOptions::default()).unwrap();
        assert!(read_path_line(&store, 512).starts_with("auto (batch of 512 rows: "));
    }
}
