//! `fetchahead demo` (the default command): simulated decode and prefill steps of a model with
//! Engram layers. A hash kernel turns a token stream into each Engram layer's row ids, compute
//! kernels stand in for the layers, and the gathers consume the rows, three ways: rows resident
//! on the device (the floor), the synchronous lookup path, and the side-stream prefetcher. GPU
//! idle before the gathers is each way's step time minus the resident one's.
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, sys};
use fetchahead::device_abi::hash;
use fetchahead::device_abi::params::{DequantParams, HashParams};
use fetchahead::gpu::Gpu;
use fetchahead::id_check::IdCheck;
use fetchahead::kernels::Kernels;
use fetchahead::lookup::{MemoryRows, RowLookup};
use fetchahead::prefetcher::{Prefetcher, PrefetcherConfig};
use fetchahead::table::{Mxfp8Table, Placement};
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
    let layout = Layout::new(args)?;
    println!(
        "table: {} rows x {} FP8 (+ E8M0 scales), in memory, seed {}; {} Engram layers of {} \
         rows; lookups sleep {} us first (simulated storage)",
        args.rows,
        args.dim,
        args.seed,
        layout.engram.len(),
        layout.rows_per_layer,
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
    let gpu = match Gpu::open(0) {
        Ok(gpu) => gpu,
        Err(Error::NoDevice(why)) => {
            println!("\nno GPU here ({why}); running the host half only");
            host_half(args, &layout, &table, &phases)?;
            println!(
                "skipped: the hash kernel, row copies, compute, gathers and GPU idle times (they \
                 need a CUDA device)"
            );
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e),
    };
    let kernels = Arc::new(Kernels::load(&gpu)?);
    println!(
        "{} ({} SMs); {} layers of {} us compute, Engram layers {:?}, {} heads, {}-gram hashes",
        gpu.name,
        gpu.multiprocessors,
        args.layers,
        args.compute_us,
        layout.engram,
        args.heads,
        args.ngram
    );
    let mut demo = GpuDemo::new(args, &layout, kernels, &table, &phases)?;
    println!(
        "\n{:<8} {:>7} {:>10} {:>12} {:>9} {:>12} {:>13} {:>15} {:>11}",
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
        let r = demo.phase(phase)?;
        all_match &= r.outputs_match;
        println!(
            "{:<8} {:>7} {:>10} {:>12.2} {:>9.2} {:>12.2} {:>13.2} {:>15.2} {:>11.0}",
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
    }
    let errors = demo.lookup_errors();
    println!(
        "\nprefetched outputs equal the resident gathers: {}; lookup errors: {errors}",
        if all_match { "yes" } else { "NO" }
    );
    Ok(if all_match && errors == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Which layers gather and which rows each Engram layer owns.
struct Layout {
    engram: Vec<u32>,
    rows_per_layer: u64,
}

impl Layout {
    fn new(args: &DemoArgs) -> Result<Layout> {
        let mut engram = args.engram_layers.clone();
        engram.sort_unstable();
        engram.dedup();
        if engram.is_empty() || engram.iter().any(|&l| l == 0 || l > args.layers) {
            return Err(Error::Invalid {
                what: "engram layers",
                why: format!(
                    "{:?}: each must be in 1..={}",
                    args.engram_layers, args.layers
                ),
            });
        }
        let rows_per_layer = args.rows / engram.len() as u64;
        if rows_per_layer == 0 || args.heads == 0 || args.ngram == 0 || args.ngram > 8 {
            return Err(Error::Invalid {
                what: "demo",
                why: format!(
                    "{} rows for {} Engram layers, {} heads, n-gram {} (1..=8)",
                    args.rows,
                    engram.len(),
                    args.heads,
                    args.ngram
                ),
            });
        }
        Ok(Layout {
            engram,
            rows_per_layer,
        })
    }

    /// The hash seed of Engram layer `k`.
    fn seed(&self, args: &DemoArgs, k: usize) -> u64 {
        args.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ k as u64
    }
}

/// The hash kernel's computation on the CPU: `ids[t * heads + h]` for Engram layer `k`.
fn hash_on_host(args: &DemoArgs, layout: &Layout, k: usize, tokens: &[u32], ids: &mut Vec<i64>) {
    ids.clear();
    let rows = hash::divisor(layout.rows_per_layer);
    let row_start = k as u64 * layout.rows_per_layer;
    for t in 0..tokens.len() {
        for h in 0..args.heads {
            let mut state = hash::start(layout.seed(args, k), h);
            for j in 0..args.ngram as usize {
                state = hash::fold(state, if j <= t { tokens[t - j] } else { 0 });
            }
            ids.push(hash::finish(state, row_start, rows));
        }
    }
}

/// Without a GPU: hashes on the CPU and times the lookups the prefetcher would run.
fn host_half(args: &DemoArgs, layout: &Layout, table: &MemoryRows, phases: &[Phase]) -> Result<()> {
    let mut rng = SmallRng::seed_from_u64(args.seed);
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
        for _ in 0..args.steps {
            let tokens: Vec<u32> = (0..phase.tokens)
                .map(|_| rng.random_range(0..VOCAB))
                .collect();
            for k in 0..layout.engram.len() {
                hash_on_host(args, layout, k, &tokens, &mut ids);
                let start = Instant::now();
                table.lookup(&ids, &mut weights, &mut scales)?;
                busy += start.elapsed();
            }
        }
        let rows = (n * layout.engram.len()) as f64;
        let ms = busy.as_secs_f64() * 1e3 / args.steps.max(1) as f64;
        println!(
            "{:<8} {:>7} {:>10} {:>16.2} {:>11.0}",
            phase.name,
            phase.tokens,
            rows as usize,
            ms,
            rows / (ms / 1e3).max(1e-9)
        );
    }
    Ok(())
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

#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    Resident,
    Sync,
    Prefetch,
}

/// Per Engram layer: its ids, its outputs, its prefetcher.
struct EngramLayer {
    ids: CudaSlice<i64>,
    out: CudaSlice<u16>,
    resident_out: CudaSlice<u16>,
    prefetcher: Prefetcher,
}

struct GpuDemo<'a> {
    args: &'a DemoArgs,
    layout: &'a Layout,
    kernels: Arc<Kernels>,
    main: Arc<CudaStream>,
    /// The whole table on the device, and its weights' and scales' addresses.
    _table: Mxfp8Table,
    resident: (u64, u64),
    check: IdCheck,
    tokens: CudaSlice<u32>,
    layers: Vec<EngramLayer>,
    rng: SmallRng,
}

impl<'a> GpuDemo<'a> {
    fn new(
        args: &'a DemoArgs,
        layout: &'a Layout,
        kernels: Arc<Kernels>,
        table: &Arc<MemoryRows>,
        phases: &[Phase],
    ) -> Result<GpuDemo<'a>> {
        let ctx = kernels.gpu().ctx.clone();
        let main = ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
        let max_tokens = phases.iter().map(|p| p.tokens).max().unwrap_or(1).max(1);
        let max_ids = max_tokens * args.heads as usize;
        let mut table_on_device = Mxfp8Table::from_bytes(
            &main,
            table.weights(),
            table.scales(),
            args.dim as u32,
            Placement::Device,
        )?;
        let resident = (
            table_on_device.weights.address(&main),
            table_on_device.scales.address(&main),
        );
        let config = PrefetcherConfig {
            capacity: max_ids,
            ..Default::default()
        };
        let mut layers = Vec::new();
        for _ in &layout.engram {
            let mut prefetcher =
                Prefetcher::new(kernels.clone(), table.clone() as Arc<dyn RowLookup>, config)?;
            prefetcher.warm()?;
            layers.push(EngramLayer {
                ids: main.alloc_zeros(max_ids).map_err(cuda("cuMemAlloc"))?,
                out: main
                    .alloc_zeros(max_ids * args.dim)
                    .map_err(cuda("cuMemAlloc"))?,
                resident_out: main
                    .alloc_zeros(max_ids * args.dim)
                    .map_err(cuda("cuMemAlloc"))?,
                prefetcher,
            });
        }
        Ok(GpuDemo {
            check: IdCheck::new(&main)?,
            tokens: main.alloc_zeros(max_tokens).map_err(cuda("cuMemAlloc"))?,
            rng: SmallRng::seed_from_u64(args.seed),
            args,
            layout,
            kernels,
            main,
            _table: table_on_device,
            resident,
            layers,
        })
    }

    fn lookup_errors(&self) -> u64 {
        self.layers
            .iter()
            .map(|l| l.prefetcher.stats().lookup_errors)
            .sum()
    }

    /// One warm-up and `steps` timed steps of each path, on the same token streams.
    fn phase(&mut self, phase: &Phase) -> Result<PhaseResult> {
        let n = phase.tokens * self.args.heads as usize;
        let streams: Vec<Vec<u32>> = (0..=self.args.steps)
            .map(|_| {
                (0..phase.tokens)
                    .map(|_| self.rng.random_range(0..VOCAB))
                    .collect()
            })
            .collect();
        let mut ms = [0f64; 3];
        let mut outputs_match = true;
        for (i, path) in [Path::Resident, Path::Sync, Path::Prefetch]
            .into_iter()
            .enumerate()
        {
            for (step, tokens) in streams.iter().enumerate() {
                let elapsed = self.step(path, tokens)?;
                if step > 0 {
                    ms[i] += elapsed / self.args.steps as f64;
                }
            }
        }
        // The last token stream, gathered from the resident table and by the prefetcher.
        self.hashes_match(streams.last().map_or(&[][..], |t| t))?;
        for layer in &self.layers {
            let got = self
                .main
                .clone_dtoh(&layer.out)
                .map_err(cuda("cuMemcpyDtoH"))?;
            let want = self
                .main
                .clone_dtoh(&layer.resident_out)
                .map_err(cuda("cuMemcpyDtoH"))?;
            outputs_match &= got[..n * self.args.dim] == want[..n * self.args.dim];
        }
        let rows_per_step = n * self.layers.len();
        Ok(PhaseResult {
            rows_per_step,
            resident_ms: ms[0],
            sync_ms: ms[1],
            prefetch_ms: ms[2],
            rows_per_s: rows_per_step as f64 / (ms[2] / 1e3).max(1e-9),
            outputs_match,
        })
    }

    /// One forward: hash, (prefetch), layers of compute with the Engram gathers; milliseconds
    /// between events around it.
    fn step(&mut self, path: Path, tokens: &[u32]) -> Result<f64> {
        let (args, s) = (self.args, self.main.cu_stream());
        let n = tokens.len() * args.heads as usize;
        self.main
            .memcpy_htod(tokens, &mut self.tokens)
            .map_err(cuda("cuMemcpyHtoD"))?;
        let ctx = self.main.context();
        let timed = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = ctx.new_event(timed).map_err(cuda("cuEventCreate"))?;
        let end = ctx.new_event(timed).map_err(cuda("cuEventCreate"))?;
        start.record(&self.main).map_err(cuda("cuEventRecord"))?;
        let tokens_address = self.tokens.device_ptr(&self.main).0;
        for (k, layer) in self.layers.iter_mut().enumerate() {
            let p = HashParams {
                tokens: tokens_address,
                ids: layer.ids.device_ptr(&self.main).0,
                n_tokens: tokens.len() as u64,
                seed: self.layout.seed(args, k),
                row_start: k as u64 * self.layout.rows_per_layer,
                rows: self.layout.rows_per_layer,
                heads: args.heads,
                ngram: args.ngram,
            };
            // SAFETY: the token buffer holds the step's tokens and `ids` room for n ids.
            unsafe { self.kernels.launch_hash(s, p)? };
            if path == Path::Prefetch {
                let ids = layer.ids.device_ptr(&self.main).0;
                // SAFETY: `ids` holds n ids, unchanged until this layer's gather below.
                unsafe { layer.prefetcher.prefetch(ids, n, s)? };
            }
        }
        for l in 1..=args.layers {
            // SAFETY: `s` is this demo's own stream.
            unsafe { self.kernels.launch_spin(s, args.compute_us * 1000)? };
            let Some(k) = self.layout.engram.iter().position(|&e| e == l) else {
                continue;
            };
            let layer = &mut self.layers[k];
            match path {
                Path::Resident => {
                    let p = DequantParams {
                        weights: self.resident.0,
                        scales: self.resident.1,
                        ids: layer.ids.device_ptr(&self.main).0,
                        out: layer.resident_out.device_ptr(&self.main).0,
                        status: self.check.address(),
                        n: n as u64,
                        rows: args.rows,
                        dim: args.dim as u32,
                        _pad: 0,
                    };
                    // SAFETY: the resident table holds `rows` rows, `ids` n ids, `out` n rows.
                    unsafe { self.kernels.launch_gather_dequant(s, 0, p)? };
                }
                Path::Sync => {
                    let (ids, out) = (
                        layer.ids.device_ptr(&self.main).0,
                        layer.out.device_ptr(&self.main).0,
                    );
                    // SAFETY: n ids and n * dim bf16 of output.
                    unsafe { layer.prefetcher.gather_dequant_sync(ids, n, out, s)? };
                }
                Path::Prefetch => {
                    let out = layer.out.device_ptr(&self.main).0;
                    // SAFETY: n * dim bf16 of output.
                    unsafe { layer.prefetcher.gather_dequant(out, s)? };
                }
            }
        }
        end.record(&self.main).map_err(cuda("cuEventRecord"))?;
        end.synchronize().map_err(cuda("cuEventSynchronize"))?;
        Ok(start.elapsed_ms(&end).map_err(cuda("cuEventElapsedTime"))? as f64)
    }

    /// The hash kernel's ids of the last step against the same hash on the CPU.
    fn hashes_match(&self, tokens: &[u32]) -> Result<()> {
        let n = tokens.len() * self.args.heads as usize;
        let mut want = Vec::new();
        for (k, layer) in self.layers.iter().enumerate() {
            hash_on_host(self.args, self.layout, k, tokens, &mut want);
            let got = self
                .main
                .clone_dtoh(&layer.ids)
                .map_err(cuda("cuMemcpyDtoH"))?;
            if got[..n] != want[..] {
                return Err(Error::Invalid {
                    what: "hash kernel",
                    why: format!("Engram layer {k}: the GPU ids differ from the CPU hash"),
                });
            }
        }
        Ok(())
    }
}

fn cuda(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |source| Error::Cuda { call, source }
}
