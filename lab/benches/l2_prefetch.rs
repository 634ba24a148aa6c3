//! L2 prefetch during a collective, on this machine's GPU (skipped without one).
//!
//! Per iteration, untimed: a write of twice the L2 size evicts the weights (the traffic of the
//! layers in between). Timed with CUDA events: a simulated collective (4 CTAs polling for T us),
//! then a weight-bound bf16 GEMV (M = 1 or 16, K = 4096, W MiB of weights). Modes: no prefetch;
//! the L2 plan's default replay (windows up to half of L2 read in by loads, larger ones
//! bulk-prefetched) with the whole of W as budget and with the default budget; each prefetch
//! variant alone (bulk, per line, loads, evict_last); the bulk prefetch launched before the
//! collective or over every SM; the access-policy window (persisting L2) on the GEMV. Each runs eagerly
//! and replayed from a CUDA graph. Criterion times window + GEMV; the summary printed at the end
//! gives, from the same iterations, the GEMV's own time, both ratios to no prefetch, and the
//! spread of no prefetch; then the prefetch issue time per MiB, the slack the prefetch needs
//! before its reader, and the DGX Spark's figures as far as they can be reasoned.
use std::collections::BTreeMap;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use cudarc::driver::{CudaEvent, CudaGraph, CudaSlice, CudaStream, DevicePtr, sys};
use fetchahead::device_abi::l2_prefetch::PrefetchVariant;
use fetchahead::device_abi::params::{GemvParams, PrefetchParams, Segment};
use fetchahead::device_abi::{gemv, l2_prefetch};
use fetchahead::driver::{memory, stream};
use fetchahead::kernels::gpu::Gpu;
use fetchahead::l2_plan::access_policy::{AccessWindow, PersistingL2};
use fetchahead::l2_plan::segments::SegmentTable;
use fetchahead::l2_plan::{
    L2Plan, PlanConfig, PrefetchLaunch, Replay, SEGMENT_PIECE, Signature, default_budget,
    read_limit,
};
use fetchahead::{Error, Result};
use fetchahead_lab::LabKernels;
use fetchahead_lab::gemv::{Gemv, GemvLaunch};
use half::bf16;
use rand::{RngExt, SeedableRng, rngs::SmallRng};

const MIB: u64 = 1 << 20;
const K: u32 = 4096;
const COLLECTIVE_BLOCKS: u32 = 4;
const SIG: Signature = Signature(1);
const MS: [u32; 2] = [1, 16];
const WEIGHTS_MIB: [u64; 4] = [4, 8, 16, 32];
const WINDOWS_US: [u64; 3] = [5, 20, 50];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Mode {
    None,
    NoneStream,
    Prefetch,
    PrefetchBulk,
    PrefetchEarly,
    PrefetchLines,
    PrefetchLoads,
    PrefetchWide,
    PrefetchDefaultBudget,
    EvictLast,
    AccessPolicy,
}

impl Mode {
    const ALL: [Mode; 11] = [
        Mode::None,
        Mode::NoneStream,
        Mode::Prefetch,
        Mode::PrefetchBulk,
        Mode::PrefetchEarly,
        Mode::PrefetchLines,
        Mode::PrefetchLoads,
        Mode::PrefetchWide,
        Mode::PrefetchDefaultBudget,
        Mode::EvictLast,
        Mode::AccessPolicy,
    ];

    fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::NoneStream => "none_stream",
            Mode::Prefetch => "prefetch",
            Mode::PrefetchBulk => "prefetch_bulk",
            Mode::PrefetchEarly => "prefetch_early",
            Mode::PrefetchLines => "prefetch_lines",
            Mode::PrefetchLoads => "prefetch_loads",
            Mode::PrefetchWide => "prefetch_wide",
            Mode::PrefetchDefaultBudget => "prefetch_default_budget",
            Mode::EvictLast => "evict_last",
            Mode::AccessPolicy => "access_policy",
        }
    }
}

/// (m, W MiB, T us, graph, mode)
type Key = (u32, u64, u64, bool, Mode);

/// Per iteration: (GEMV us, window + GEMV us).
type Samples = Vec<(f64, f64)>;

fn cuda(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |source| Error::Cuda { call, source }
}

/// Everything one bench run shares.
struct Bench {
    kernels: Arc<LabKernels>,
    stream: Arc<CudaStream>,
    flush: CudaSlice<u8>,
    flush_address: u64,
    /// Where [`Bench::evict_weights`] copies a GEMV's activations (the largest, M = 16).
    activations: CudaSlice<u16>,
    events: [CudaEvent; 3],
}

impl Bench {
    fn new(gpu: &Gpu) -> Result<Bench> {
        let kernels = Arc::new(LabKernels::load(gpu)?);
        let stream = gpu.ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
        let flush_bytes = (2 * gpu.l2_bytes).clamp(64 * MIB, 512 * MIB) as usize;
        let flush = stream
            .alloc_zeros::<u8>(flush_bytes)
            .map_err(cuda("cuMemAlloc"))?;
        let flush_address = flush.device_ptr(&stream).0;
        let event = || {
            gpu.ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(cuda("cuEventCreate"))
        };
        let activations = stream
            .alloc_zeros::<u16>(16 * K as usize)
            .map_err(cuda("cuMemAlloc"))?;
        Ok(Bench {
            events: [event()?, event()?, event()?],
            activations,
            kernels,
            stream,
            flush,
            flush_address,
        })
    }

    /// Writes twice the L2 size, evicting (normal-priority) weights from L2.
    fn flush_l2(&self) -> Result<()> {
        // SAFETY: the flush buffer is this struct's own allocation of `len` bytes.
        unsafe {
            memory::memset_d8_async(
                self.flush_address,
                0x5A,
                self.flush.len(),
                self.stream.cu_stream(),
            )
        }
    }

    /// Evicts `gemv`'s weights ([`Bench::flush_l2`]) and then reads its activations, which stay
    /// in L2 as they do in an engine, where the kernel before the GEMV (the collective itself,
    /// for an all-reduce) has just written them. Without this the flush would leave every GEMV,
    /// prefetched or not, waiting on DRAM for its first activation loads.
    fn evict_weights(&self, gemv: &Gemv) -> Result<()> {
        self.flush_l2()?;
        let bytes = gemv.x_len() * 2;
        assert!(bytes <= self.activations.len() * 2, "M <= 16, K = {K}");
        // SAFETY: x is the GEMV's live allocation of `bytes`; the destination is this struct's
        // own, at least as large, and neither overlaps the other.
        unsafe {
            memory::memcpy_dtod_async(
                self.activations.device_ptr(&self.stream).0,
                gemv.params().x,
                bytes,
                self.stream.cu_stream(),
            )
        }
    }

    /// Records event `i` on the stream; inside a capture it becomes an (external) event record
    /// node, which the flag allows only while capturing.
    fn mark(&self, i: usize) -> Result<()> {
        stream::record_mark(&self.events[i], &self.stream)
    }

    /// (GEMV us, window + GEMV us) of the last forward; waits for it.
    fn read(&self) -> Result<(f64, f64)> {
        let gemv = self.events[1]
            .elapsed_ms(&self.events[2])
            .map_err(cuda("cuEventElapsedTime"))?;
        let total = self.events[0]
            .elapsed_ms(&self.events[2])
            .map_err(cuda("cuEventElapsedTime"))?;
        Ok((gemv as f64 * 1e3, total as f64 * 1e3))
    }

    /// One forward: mark 0, collective (the plan forks its prefetch first), mark 1, GEMV,
    /// mark 2, join. Eager, or captured when the stream is capturing.
    fn forward(
        &self,
        gemv: &Gemv,
        ns: u64,
        plan: Option<&mut L2Plan>,
        policy: Option<AccessWindow>,
    ) -> Result<()> {
        self.mark(0)?;
        let mut plan = plan;
        if let Some(plan) = plan.as_deref_mut() {
            plan.begin_forward(SIG)?;
            plan.collective()?;
        }
        // SAFETY: no flag is polled.
        unsafe {
            self.kernels
                .launch_collective(self.stream.cu_stream(), COLLECTIVE_BLOCKS, ns, 0)
        }?;
        self.mark(1)?;
        if let Some(plan) = plan.as_deref_mut() {
            let (address, bytes) = gemv.weights();
            plan.consume(address, bytes)?;
        }
        gemv.launch(&self.kernels, &self.stream, policy)?;
        self.mark(2)?;
        if let Some(plan) = plan {
            plan.end_forward()?;
        }
        Ok(())
    }
}

/// One configuration's state: its plan (learned by one eager forward), set-aside, graph.
/// Fields drop in order: the graph before the plan whose tables it reads.
struct Setup {
    graph: Option<CudaGraph>,
    plan: Option<L2Plan>,
    persisting: Option<PersistingL2>,
    policy: Option<AccessWindow>,
}

fn setup(bench: &Bench, gemv: &Gemv, mode: Mode, ns: u64, graph: bool) -> Result<Setup> {
    let (w_address, w_bytes) = gemv.weights();
    let gpu = bench.kernels.gpu();
    let mut config = PlanConfig::for_l2(gpu.l2_bytes);
    config.budget_per_window = w_bytes;
    let plan = match mode {
        Mode::None | Mode::NoneStream | Mode::AccessPolicy => None,
        Mode::Prefetch => Some(config),
        Mode::PrefetchBulk => Some(PlanConfig {
            replay: Replay::Prefetch {
                variant: l2_prefetch::BULK_VARIANT,
            },
            ..config
        }),
        Mode::PrefetchEarly => Some(PlanConfig {
            launch: PrefetchLaunch::BeforeCollective,
            ..config
        }),
        Mode::PrefetchLines => Some(PlanConfig {
            replay: Replay::Prefetch {
                variant: PrefetchVariant::must("l2_prefetch_lines"),
            },
            ..config
        }),
        Mode::PrefetchLoads => Some(PlanConfig {
            replay: Replay::Prefetch {
                variant: l2_prefetch::LOADS_VARIANT,
            },
            ..config
        }),
        Mode::PrefetchWide => Some(PlanConfig {
            max_blocks: gpu.multiprocessors,
            ..config
        }),
        Mode::PrefetchDefaultBudget => Some(PlanConfig::for_l2(gpu.l2_bytes)),
        Mode::EvictLast => Some(PlanConfig {
            replay: Replay::Prefetch {
                variant: PrefetchVariant::must("l2_prefetch_evict_last"),
            },
            ..config
        }),
    };
    let mut plan = plan
        .map(|c| L2Plan::new(bench.kernels.product().clone(), bench.stream.clone(), c))
        .transpose()?;
    let (persisting, policy) = if mode == Mode::AccessPolicy {
        let persisting = PersistingL2::reserve(gpu, w_bytes)?;
        persisting.reset_lines()?;
        let window = persisting.window(w_address, w_bytes);
        (Some(persisting), Some(window))
    } else {
        (None, None)
    };
    // The plan learns from one eager forward and fits its window to the window's length over
    // three more (an engine's warm-up forwards before capture); every timed forward replays it.
    for _ in 0..4 {
        bench.evict_weights(gemv)?;
        bench.forward(gemv, ns, plan.as_mut(), policy)?;
        bench
            .stream
            .synchronize()
            .map_err(cuda("cuStreamSynchronize"))?;
    }
    let graph = if graph {
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        bench
            .stream
            .begin_capture(mode)
            .map_err(cuda("cuStreamBeginCapture"))?;
        let captured = bench.forward(gemv, ns, plan.as_mut(), policy);
        let graph = bench
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(cuda("cuStreamEndCapture"))?;
        captured?;
        let graph = graph.ok_or_else(|| Error::Invalid {
            what: "capture",
            why: "empty graph".into(),
        })?;
        graph.upload().map_err(cuda("cuGraphUpload"))?;
        Some(graph)
    } else {
        None
    };
    Ok(Setup {
        plan,
        persisting,
        policy,
        graph,
    })
}

/// One timed iteration of a configuration.
fn iteration(bench: &Bench, gemv: &Gemv, ns: u64, s: &mut Setup) -> Result<(f64, f64)> {
    bench.evict_weights(gemv)?;
    match &s.graph {
        Some(graph) => graph.launch().map_err(cuda("cuGraphLaunch"))?,
        None => bench.forward(gemv, ns, s.plan.as_mut(), s.policy)?,
    }
    bench.read()
}

fn random_bf16(rng: &mut SmallRng, n: usize) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
        .collect()
}

/// Random activations (`m x K`) and weights (`W MiB`, `K` wide) for a GEMV: (x, w, weight rows).
fn random_inputs(rng: &mut SmallRng, m: u32, w_mib: u64) -> (Vec<bf16>, Vec<bf16>, usize) {
    let rows = (w_mib * MIB / (2 * K as u64)) as usize;
    let x = random_bf16(rng, m as usize * K as usize);
    let w = random_bf16(rng, rows * K as usize);
    (x, w, rows)
}

fn median(v: &mut [f64]) -> f64 {
    percentile(v, 0.5)
}

fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn bench_l2_prefetch(c: &mut Criterion) {
    if let Err(e) = run(c) {
        eprintln!("l2_prefetch bench failed: {e}");
        std::process::exit(1);
    }
}

fn run(c: &mut Criterion) -> Result<()> {
    let Some(gpu) = Gpu::for_test("the l2_prefetch bench")? else {
        return Ok(());
    };
    let bench = Bench::new(&gpu)?;
    println!(
        "{} (sm_{}{}, {} SMs, L2 {:.1} MiB), PTX {}",
        gpu.name,
        gpu.compute_capability.0,
        gpu.compute_capability.1,
        gpu.multiprocessors,
        gpu.l2_bytes as f64 / MIB as f64,
        bench.kernels.arch()
    );
    // Graph capture reads raw addresses only; cudarc's per-slice events must stay out of it.
    // SAFETY: from here on every launch passes raw addresses and no slice is shared between
    // streams without the plan's own fork and join.
    unsafe { gpu.ctx.disable_event_tracking() };

    let sections = Sections::from_env()?;
    let mut rng = SmallRng::seed_from_u64(7);
    if sections.once {
        once(&bench, &mut rng)?;
    }
    if sections.sweep {
        gemv_sweep(&bench, &mut rng)?;
    }
    if sections.gap {
        gap(&bench, &mut rng)?;
    }
    if !sections.plan {
        if sections.rest {
            issue_time(&bench)?;
            slack(&bench, &mut rng)?;
            spark(&bench);
        }
        return Ok(());
    }
    let mut samples: BTreeMap<Key, Samples> = BTreeMap::new();
    // The window caps the plans learned (bytes their prefetch keeps), per configuration.
    let mut caps: BTreeMap<Key, u64> = BTreeMap::new();
    let mut graphs_work = true;
    let mut group = c.benchmark_group("l2_prefetch");
    group
        .sample_size(10)
        .warm_up_time(std::time::Duration::from_millis(20))
        .measurement_time(std::time::Duration::from_millis(80))
        .nresamples(1000);
    for m in MS {
        for w_mib in WEIGHTS_MIB {
            let (x, w, _) = random_inputs(&mut rng, m, w_mib);
            let host_gemv = Gemv::new(&bench.kernels, &bench.stream, &x, &w, m, K)?;
            // The same product with streaming weight loads: the fastest GEMV from DRAM.
            let stream_launch = GemvLaunch {
                variant: gemv::VARIANTS
                    .iter()
                    .position(|v| m <= v.max_m && v.loads == gemv::WeightLoads::Stream)
                    .expect("a streaming GEMV variant covers M <= 16"),
                ..host_gemv.launch_config()
            };
            let stream_gemv = Gemv::with_launch(&bench.stream, &x, &w, m, K, stream_launch)?;
            for t_us in WINDOWS_US {
                let ns = t_us * 1000;
                for graph in [false, true] {
                    if graph && !graphs_work {
                        continue;
                    }
                    for mode in Mode::ALL {
                        let gemv = if mode == Mode::NoneStream {
                            &stream_gemv
                        } else {
                            &host_gemv
                        };
                        let mut s = match setup(&bench, gemv, mode, ns, graph) {
                            Ok(s) => s,
                            Err(e) if mode == Mode::AccessPolicy => {
                                println!("access-policy mode unavailable: {e}");
                                continue;
                            }
                            Err(e) if graph => {
                                println!(
                                    "graph replay unavailable, graph configurations skipped: {e}"
                                );
                                graphs_work = false;
                                break;
                            }
                            Err(e) => return Err(e),
                        };
                        let key: Key = (m, w_mib, t_us, graph, mode);
                        let mut failure = None;
                        let exec = if graph { "graph" } else { "eager" };
                        let id = format!("{}/{exec}/M{m}/W{w_mib}MiB/T{t_us}us", mode.name());
                        let store = samples.entry(key).or_default();
                        group.bench_function(id, |b| {
                            b.iter_custom(|iters| {
                                let mut total = std::time::Duration::ZERO;
                                for _ in 0..iters {
                                    match iteration(&bench, gemv, ns, &mut s) {
                                        Ok((g, t)) => {
                                            store.push((g, t));
                                            total += std::time::Duration::from_secs_f64(t * 1e-6);
                                        }
                                        Err(e) => {
                                            failure.get_or_insert(e);
                                        }
                                    }
                                }
                                total
                            })
                        });
                        if let Some(e) = failure {
                            if !graph {
                                return Err(e);
                            }
                            println!("graph replay failed, graph configurations skipped: {e}");
                            samples.remove(&key);
                            graphs_work = false;
                            break;
                        }
                        if let Some(cap) = s.plan.as_ref().and_then(|p| p.window_cap(SIG, 0)) {
                            caps.insert(key, cap);
                        }
                        if let Some(p) = &s.persisting {
                            p.reset_lines()?;
                        }
                        drop(s);
                    }
                }
            }
        }
    }
    group.finish();
    summary(&mut samples);
    println!("\nwindows the plan cut to what their prefetch issues within them (learned cap):");
    for ((m, w_mib, t_us, graph, mode), cap) in &caps {
        if *cap < w_mib * MIB {
            let exec = if *graph { "graph" } else { "eager" };
            println!(
                "  {} M{m} W{w_mib}MiB T{t_us}us {exec}: {:.2} MiB",
                mode.name(),
                *cap as f64 / MIB as f64
            );
        }
    }
    copy_peer(&bench, &samples)?;
    if sections.rest {
        issue_time(&bench)?;
        slack(&bench, &mut rng)?;
        spark(&bench);
    }
    Ok(())
}

/// Which parts run: `FETCHAHEAD_L2_BENCH` lists them (comma-separated `plan`, `sweep`, `gap`,
/// `rest`, `once`; all but `once` when unset). `plan` is the criterion run with its summary and
/// peer, `sweep` the GEMV launch sweep, `gap` what separates a prefetched GEMV from a warm one,
/// `rest` the issue time, slack and DGX Spark figures, `once` a
/// few eager forwards per configuration for a profiler to time the kernels alone (see
/// [`once`]).
struct Sections {
    plan: bool,
    sweep: bool,
    rest: bool,
    once: bool,
    gap: bool,
}

impl Sections {
    fn from_env() -> Result<Sections> {
        let Ok(list) = std::env::var("FETCHAHEAD_L2_BENCH") else {
            return Ok(Sections {
                plan: true,
                sweep: true,
                rest: true,
                once: false,
                gap: true,
            });
        };
        let mut s = Sections {
            plan: false,
            sweep: false,
            rest: false,
            once: false,
            gap: false,
        };
        for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "plan" => s.plan = true,
                "sweep" => s.sweep = true,
                "rest" => s.rest = true,
                "once" => s.once = true,
                "gap" => s.gap = true,
                other => {
                    return Err(Error::Invalid {
                        what: "FETCHAHEAD_L2_BENCH",
                        why: format!("unknown part {other:?}; want plan, sweep, rest, gap or once"),
                    });
                }
            }
        }
        Ok(s)
    }
}

/// The GEMV alone over every variant and K split: cold (after an L2 flush) and warm (after the
/// same GEMV, its weights in L2), each behind a 20 us idle collective, median of 15 each,
/// event-timed. The ratio cold / warm bounds
/// what a perfect prefetch can give; the host's default launch is marked.
fn gemv_sweep(bench: &Bench, rng: &mut SmallRng) -> Result<()> {
    // Each timed launch follows a 20 us idle collective, as in the plan bench, so that the GPU
    // is busy while the host enqueues the timed launch and the events time the GPU alone.
    let idle = || {
        // SAFETY: no flag is polled.
        unsafe {
            bench
                .kernels
                .launch_collective(bench.stream.cu_stream(), 1, 20_000, 0)
        }
    };
    let mut us = Vec::new();
    for _ in 0..15 {
        idle()?;
        bench.mark(1)?;
        // SAFETY: the spin kernel touches no memory.
        unsafe { bench.kernels.launch_spin(bench.stream.cu_stream(), 0) }?;
        bench.mark(2)?;
        us.push(event_us(bench)?);
    }
    println!(
        "\n== GEMV launch sweep (K = {K}); an empty kernel over every SM takes {:.2} us the same way",
        median(&mut us)
    );
    println!(
        "{:>3} {:>5} {:<22} {:>6} {:>6} {:>9} {:>9} {:>10} {:>10} {:>7}",
        "M",
        "WMiB",
        "variant",
        "splits",
        "warps",
        "cold us",
        "warm us",
        "cold GB/s",
        "warm GB/s",
        "c / w"
    );
    for (variant, v) in gemv::VARIANTS.iter().enumerate() {
        if v.reduce == gemv::Reduce::Cluster {
            let fit = (0..=gemv::MAX_CLUSTER_BLOCKS.ilog2())
                .map(|b| bench.kernels.gemv_max_clusters(variant, 1 << b))
                .collect::<Result<Vec<u32>>>()?;
            println!("{}: clusters of 1, 2, 4, 8 blocks at once: {fit:?}", v.name);
        }
    }
    // 1 MiB (sweep only) shows the fixed cost.
    for m in MS {
        for w_mib in [1].into_iter().chain(WEIGHTS_MIB) {
            let (x, w, rows) = random_inputs(rng, m, w_mib);
            let default = GemvLaunch::default_for(&bench.kernels, m, rows as u32, K)?;
            for (variant, v) in gemv::VARIANTS.iter().enumerate() {
                if m > v.max_m {
                    continue;
                }
                for splits in [1, 2, 4, 8, 16, 32, 64]
                    .into_iter()
                    .filter(|s| v.reduce.accepts(*s, K))
                {
                    let launch = GemvLaunch { variant, splits };
                    let gemv = Gemv::with_launch(&bench.stream, &x, &w, m, K, launch)?;
                    let mut cold = Vec::new();
                    let mut warm = Vec::new();
                    for _ in 0..15 {
                        bench.evict_weights(&gemv)?;
                        idle()?;
                        bench.mark(1)?;
                        gemv.launch(&bench.kernels, &bench.stream, None)?;
                        bench.mark(2)?;
                        cold.push(event_us(bench)?);
                        gemv.launch(&bench.kernels, &bench.stream, None)?;
                        idle()?;
                        bench.mark(1)?;
                        gemv.launch(&bench.kernels, &bench.stream, None)?;
                        bench.mark(2)?;
                        warm.push(event_us(bench)?);
                    }
                    let (c, wm) = (median(&mut cold), median(&mut warm));
                    let gbs = |t: f64| (w_mib * MIB) as f64 / (t * 1e-6) / 1e9;
                    println!(
                        "{:>3} {:>5} {:<22} {:>6} {:>6} {:>9.2} {:>9.2} {:>10.0} {:>10.0} {:>7.2}{}",
                        m,
                        w_mib,
                        v.name,
                        splits,
                        rows as u32 / 16 * splits,
                        c,
                        wm,
                        gbs(c),
                        gbs(wm),
                        c / wm,
                        if launch == default { "  (default)" } else { "" }
                    );
                }
            }
        }
    }
    Ok(())
}

/// What a GEMV's L2 and TLB start from in [`gap`]: each preparation runs after the weights are
/// evicted (but `Warm`), then a 20 us idle collective, then the timed GEMV.
#[derive(Clone, Copy, Debug)]
enum Start {
    /// Nothing: weights in DRAM.
    Cold,
    /// The same GEMV just ran (no eviction).
    Warm,
    /// The plan's prefetch: 512 KiB pieces, 8 blocks x 64 threads.
    Prefetch,
    /// The same bytes in 16 KiB pieces over blocks on every SM.
    PrefetchEverySm,
    /// [`Start::Prefetch`], then every SM prefetches one line per `stride` bytes of the weights
    /// (its TLBs learn every page the GEMV reads).
    PrefetchTouch { stride: u64 },
    /// Only the touch: the TLBs warm, the weights cold.
    Touch { stride: u64 },
    /// The plan's pieces read by `l2_prefetch_loads`, launched as the plan launches it.
    PrefetchLoads,
    /// The GEMV's weights read by another launch of it (one-block clusters, other SMs per row).
    OtherReader,
}

impl Start {
    const ALL: [Start; 9] = [
        Start::Cold,
        Start::Warm,
        Start::Prefetch,
        Start::PrefetchEverySm,
        Start::PrefetchTouch { stride: 2 * MIB },
        Start::PrefetchTouch { stride: 64 << 10 },
        Start::Touch { stride: 64 << 10 },
        Start::PrefetchLoads,
        Start::OtherReader,
    ];

    fn name(self) -> String {
        match self {
            Start::Cold => "cold".into(),
            Start::Warm => "warm".into(),
            Start::Prefetch => "prefetch 8x64".into(),
            Start::PrefetchEverySm => "prefetch every SM".into(),
            Start::PrefetchTouch { stride } => format!("prefetch + touch/{}K", stride >> 10),
            Start::Touch { stride } => format!("touch/{}K only", stride >> 10),
            Start::PrefetchLoads => "read by loads".into(),
            Start::OtherReader => "read by other launch".into(),
        }
    }
}

/// Why a prefetched GEMV runs behind a warm one (1-3 us at 16-32 MiB): the host's GEMV after
/// each [`Start`], median of 15, event-timed as in the sweep. A prefetch that closes the gap
/// when every SM also touches the pages points at TLB misses; one that closes it when issued
/// from every SM, or only when the GEMV's own SMs read the lines, at where in L2 the lines sit.
///
/// `FETCHAHEAD_GAP_REPS` (default 15) sets the launches per start; 1 suits a profiler.
fn gap(bench: &Bench, rng: &mut SmallRng) -> Result<()> {
    let reps = match std::env::var("FETCHAHEAD_GAP_REPS") {
        Ok(v) => v
            .parse::<usize>()
            .ok()
            .filter(|r| *r > 0)
            .ok_or_else(|| Error::Invalid {
                what: "FETCHAHEAD_GAP_REPS",
                why: format!("{v:?} is not a positive count"),
            })?,
        Err(_) => 15,
    };
    let spread = 4 * bench.kernels.gpu().multiprocessors;
    let idle = || {
        // SAFETY: no flag is polled.
        unsafe {
            bench
                .kernels
                .launch_collective(bench.stream.cu_stream(), 1, 20_000, 0)
        }
    };
    let (bulk, lines) = (
        l2_prefetch::BULK_VARIANT,
        PrefetchVariant::must("l2_prefetch_lines"),
    );
    let prefetch = |table: &SegmentTable, variant: PrefetchVariant, blocks: u32, threads: u32| {
        // SAFETY: checked segments inside the GEMV's weights, alive past the reads.
        unsafe {
            bench.kernels.launch_l2_prefetch(
                bench.stream.cu_stream(),
                variant,
                whole_table(table),
                blocks,
                threads,
            )
        }
    };
    println!(
        "\n== gap: the host's GEMV (K = {K}) after each start, 20 us idle between, median of {reps} us;\n   touch: {spread} blocks each prefetch one line per stride of the weights"
    );
    for m in MS {
        for w_mib in WEIGHTS_MIB {
            let (x, w, _) = random_inputs(rng, m, w_mib);
            let gemv = Gemv::new(&bench.kernels, &bench.stream, &x, &w, m, K)?;
            let (address, bytes) = gemv.weights();
            let pieces = piece_table(bench, address, bytes)?;
            let fine: Vec<_> = (0..bytes / l2_prefetch::DEFAULT_CHUNK as u64)
                .map(|i| Segment {
                    address: address + i * l2_prefetch::DEFAULT_CHUNK as u64,
                    bytes: l2_prefetch::DEFAULT_CHUNK as u64,
                })
                .collect();
            let fine = SegmentTable::upload(&bench.stream, &fine)?;
            // Block b of `spread` handles segments b, b + spread, ...: entry j * spread + b is
            // line j, so every block touches every line.
            let touch = |stride: u64| {
                let lines: Vec<_> = (0..bytes / stride)
                    .flat_map(|j| {
                        (0..spread).map(move |_| Segment {
                            address: address + j * stride,
                            bytes: 16,
                        })
                    })
                    .collect();
                SegmentTable::upload(&bench.stream, &lines)
            };
            let touches = [touch(2 * MIB)?, touch(64 << 10)?];
            let touch_of = |stride: u64| &touches[usize::from(stride != 2 * MIB)];
            let config = gemv.launch_config();
            let other = GemvParams {
                splits: gemv::CLUSTER_BLOCK_WARPS,
                ..gemv.params()
            };
            print!("M {m:>2} W {w_mib:>2} MiB ({} splits):", config.splits);
            for start in Start::ALL {
                let mut us = Vec::new();
                for _ in 0..reps {
                    if let Start::Warm = start {
                        gemv.launch(&bench.kernels, &bench.stream, None)?;
                    } else {
                        bench.evict_weights(&gemv)?;
                    }
                    match start {
                        Start::Cold | Start::Warm => {}
                        Start::Prefetch => prefetch(&pieces, bulk, 8, 64)?,
                        Start::PrefetchEverySm => prefetch(&fine, bulk, spread, 32)?,
                        Start::PrefetchTouch { stride } => {
                            prefetch(&pieces, bulk, 8, 64)?;
                            prefetch(touch_of(stride), lines, spread, 32)?;
                        }
                        Start::Touch { stride } => prefetch(touch_of(stride), lines, spread, 32)?,
                        Start::PrefetchLoads => {
                            let variant = l2_prefetch::LOADS_VARIANT;
                            let (blocks, threads) = l2_prefetch::launch_shape(
                                variant,
                                pieces.len() as u32,
                                bench.kernels.gpu().multiprocessors,
                                l2_prefetch::DEFAULT_MAX_BLOCKS,
                                l2_prefetch::DEFAULT_THREADS,
                            );
                            prefetch(&pieces, variant, blocks, threads)?
                        }
                        Start::OtherReader => {
                            // SAFETY: the GEMV's own buffers; a cluster variant needs no
                            // partials or counters, and y is rewritten by the timed launch.
                            unsafe {
                                bench.kernels.launch_gemv(
                                    bench.stream.cu_stream(),
                                    config.variant,
                                    other,
                                    None,
                                )
                            }?
                        }
                    }
                    idle()?;
                    bench.mark(1)?;
                    gemv.launch(&bench.kernels, &bench.stream, None)?;
                    bench.mark(2)?;
                    us.push(event_us(bench)?);
                }
                print!("  {} {:.2}", start.name(), median(&mut us));
            }
            println!();
        }
    }
    Ok(())
}

/// For a profiler (ncu with `--cache-control none --clock-control none -k regex:gemv`): per M and
/// W, `ONCE_REPS` eager forwards with a 20 us window and no prefetch, then as many with the
/// plain prefetch (budget W), each after an L2 flush, one at a time. The profiler serializes the
/// kernels, so the prefetched GEMVs find every prefetched line landed: their duration is what a
/// complete prefetch gives, and the kernel durations leave the launch costs out.
fn once(bench: &Bench, rng: &mut SmallRng) -> Result<()> {
    const ONCE_REPS: usize = 3;
    println!(
        "\n== once: per (M, W): {ONCE_REPS} GEMVs without prefetch, then {ONCE_REPS} prefetched"
    );
    for m in MS {
        for w_mib in WEIGHTS_MIB {
            let (x, w, _) = random_inputs(rng, m, w_mib);
            let gemv = Gemv::new(&bench.kernels, &bench.stream, &x, &w, m, K)?;
            println!("M {m} W {w_mib} MiB: {:?}", gemv.launch_config());
            for mode in [Mode::None, Mode::Prefetch] {
                let mut s = setup(bench, &gemv, mode, 20_000, false)?;
                for _ in 0..ONCE_REPS {
                    iteration(bench, &gemv, 20_000, &mut s)?;
                }
            }
        }
    }
    Ok(())
}

/// Microseconds between events 1 and 2 (waits for event 2): the timed part of a measurement.
fn event_us(bench: &Bench) -> Result<f64> {
    let ms = bench.events[1]
        .elapsed_ms(&bench.events[2])
        .map_err(cuda("cuEventElapsedTime"))?;
    Ok(ms as f64 * 1e3)
}

/// The table: per configuration the medians of GEMV and window + GEMV, ratios to no prefetch.
fn summary(samples: &mut BTreeMap<Key, Samples>) {
    println!(
        "\n== L2 prefetch: medians in us; speedup = none / mode; p10-p90 of none's window+GEMV is the spread;\n   x stream = none_stream's GEMV (streaming weight loads, the fastest from DRAM) / mode's GEMV"
    );
    println!(
        "{:<6} {:>3} {:>4} {:>4} {:<24} {:>9} {:>10} {:>8} {:>9} {:>9} {:>12}",
        "exec",
        "M",
        "WMiB",
        "Tus",
        "mode",
        "gemv",
        "win+gemv",
        "gemv x",
        "x stream",
        "total x",
        "none spread"
    );
    let keys: Vec<Key> = samples.keys().copied().collect();
    let mut goal_gemv = Vec::new();
    let mut slower = Vec::new();
    for key in keys {
        let (m, w, t, graph, mode) = key;
        let none_key = (m, w, t, graph, Mode::None);
        let stats = |s: &Samples| {
            let mut g: Vec<f64> = s.iter().map(|x| x.0).collect();
            let mut tt: Vec<f64> = s.iter().map(|x| x.1).collect();
            let spread = percentile(&mut tt, 0.9) - percentile(&mut tt, 0.1);
            (median(&mut g), median(&mut tt), spread)
        };
        let (g, total, _) = stats(&samples[&key]);
        let (g0, t0, spread0) = samples
            .get(&none_key)
            .map_or((f64::NAN, f64::NAN, f64::NAN), stats);
        let (gs, ..) = samples
            .get(&(m, w, t, graph, Mode::NoneStream))
            .map_or((f64::NAN, f64::NAN, f64::NAN), stats);
        println!(
            "{:<6} {:>3} {:>4} {:>4} {:<24} {:>9.2} {:>10.2} {:>8.2} {:>9.2} {:>9.3} {:>12.2}",
            if graph { "graph" } else { "eager" },
            m,
            w,
            t,
            mode.name(),
            g,
            total,
            g0 / g,
            gs / g,
            t0 / total,
            spread0
        );
        if matches!(mode, Mode::Prefetch | Mode::PrefetchBulk) && t >= 20 && w <= 32 {
            goal_gemv.push((key, g0 / g, gs / g));
        }
        if !matches!(mode, Mode::None | Mode::NoneStream) && total - t0 > spread0 {
            slower.push((key, total - t0, spread0));
        }
    }
    for goal_mode in [Mode::Prefetch, Mode::PrefetchBulk] {
        let of_mode: Vec<_> = goal_gemv
            .iter()
            .filter(|((.., mode), ..)| *mode == goal_mode)
            .collect();
        let met = of_mode.iter().filter(|(_, r, _)| *r >= 1.3).count();
        let met_stream = of_mode.iter().filter(|(.., r)| *r >= 1.3).count();
        println!(
            "goal, GEMV >= 1.3x faster after a window >= 20 us ({}, budget W): {met} of {} configurations against none, {met_stream} against none_stream",
            goal_mode.name(),
            of_mode.len()
        );
        for ((m, w, t, graph, _), r, rs) in of_mode.iter().filter(|(_, r, _)| *r < 1.3) {
            println!(
                "  missed: M{m} W{w}MiB T{t}us {}: {r:.2}x ({rs:.2}x against none_stream)",
                if *graph { "graph" } else { "eager" }
            );
        }
    }
    println!(
        "configurations whose window + GEMV is slower than none by more than none's spread: {}",
        slower.len()
    );
    for mode in Mode::ALL {
        let n = slower.iter().filter(|((.., m), ..)| *m == mode).count();
        if n > 0 {
            println!("  {}: {n}", mode.name());
        }
    }
    for ((m, w, t, graph, mode), d, s) in &slower {
        println!(
            "  {} M{m} W{w}MiB T{t}us {}: +{d:.2} us (spread {s:.2} us)",
            mode.name(),
            if *graph { "graph" } else { "eager" }
        );
    }
}

/// The peer: device-to-device copy bandwidth (bytes read + written per second) of 32 MiB, cold,
/// against the GEMV's cold weight bandwidth from the same run.
fn copy_peer(bench: &Bench, samples: &BTreeMap<Key, Samples>) -> Result<()> {
    let bytes = 32 * MIB as usize;
    let src = bench
        .stream
        .alloc_zeros::<u8>(bytes)
        .map_err(cuda("cuMemAlloc"))?;
    let dst = bench
        .stream
        .alloc_zeros::<u8>(bytes)
        .map_err(cuda("cuMemAlloc"))?;
    let (src_address, dst_address) = (
        src.device_ptr(&bench.stream).0,
        dst.device_ptr(&bench.stream).0,
    );
    let mut us = Vec::new();
    for _ in 0..20 {
        bench.flush_l2()?;
        bench.mark(1)?;
        // SAFETY: two live allocations of `bytes` bytes each, not overlapping.
        unsafe {
            memory::memcpy_dtod_async(dst_address, src_address, bytes, bench.stream.cu_stream())
        }?;
        bench.mark(2)?;
        us.push(event_us(bench)?);
    }
    let copy = 2.0 * bytes as f64 / (median(&mut us) * 1e-6) / 1e9;
    println!("\n== peer: device-to-device copy of 32 MiB, cold: {copy:.0} GB/s (read + write)");
    println!(
        "{:<6} {:>3} {:>5} {:>12} {:>9}",
        "exec", "M", "WMiB", "GEMV GB/s", "of copy"
    );
    for (&(m, w, t, graph, mode), s) in samples {
        if mode != Mode::None || t != WINDOWS_US[WINDOWS_US.len() - 1] {
            continue;
        }
        let mut g: Vec<f64> = s.iter().map(|x| x.0).collect();
        let gbs = (w * MIB) as f64 / (median(&mut g) * 1e-6) / 1e9;
        let exec = if graph { "graph" } else { "eager" };
        println!(
            "{exec:<6} {m:>3} {w:>5} {gbs:>12.0} {:>8.0}%",
            100.0 * gbs / copy
        );
    }
    Ok(())
}

/// `bytes` (a multiple of [`SEGMENT_PIECE`]) at `address` in the plan's layout: 512 KiB pieces,
/// one prefetch block per piece up to the launch's blocks.
fn piece_table(bench: &Bench, address: u64, bytes: u64) -> Result<SegmentTable> {
    let pieces: Vec<_> = (0..bytes / SEGMENT_PIECE)
        .map(|i| Segment {
            address: address + i * SEGMENT_PIECE,
            bytes: SEGMENT_PIECE,
        })
        .collect();
    SegmentTable::upload(&bench.stream, &pieces)
}

/// A prefetch of every segment of `table` in the default chunks.
fn whole_table(table: &SegmentTable) -> PrefetchParams {
    PrefetchParams {
        segments: table.address(),
        n: table.len() as u64,
        chunk: l2_prefetch::DEFAULT_CHUNK,
        once_jobs: 0,
        partitions: 0,
        claims: 0,
        timeline: fetchahead::device_abi::params::TimelineParams::OFF,
    }
}

/// The prefetch kernel alone on an idle GPU: its duration is the time to issue the prefetches.
fn issue_time(bench: &Bench) -> Result<()> {
    println!("\n== prefetch issue time (kernel duration, median of 20, after an L2 flush)");
    println!(
        "{:<24} {:>5} {:>7} {:>8} {:>9} {:>9}",
        "variant", "WMiB", "blocks", "threads", "us", "us/MiB"
    );
    let bytes = 32 * MIB as usize;
    let buffer = bench
        .stream
        .alloc_zeros::<u8>(bytes)
        .map_err(cuda("cuMemAlloc"))?;
    let base = buffer.device_ptr(&bench.stream).0;
    for w_mib in WEIGHTS_MIB {
        let table = piece_table(bench, base, w_mib * MIB)?;
        for variant in PrefetchVariant::all() {
            let v = variant.variant();
            let shapes: &[(u32, u32)] = if v.method == l2_prefetch::Method::Loads {
                // Pieces of 512 KiB: 8 blocks take one a piece at 4 MiB; the plan launches
                // LOADS_BLOCKS_PER_SEGMENT a piece, up to one an SM (132 on the H200).
                &[(8, 1024), (32, 1024), (132, 1024)]
            } else {
                &[(8, 64), (1, 64), (32, 64), (8, 256)]
            };
            for &(blocks, threads) in shapes {
                let mut us = Vec::new();
                for _ in 0..20 {
                    bench.flush_l2()?;
                    bench.mark(1)?;
                    // SAFETY: checked segments inside `buffer`, alive past the reads below.
                    unsafe {
                        bench.kernels.launch_l2_prefetch(
                            bench.stream.cu_stream(),
                            variant,
                            whole_table(&table),
                            blocks,
                            threads,
                        )
                    }?;
                    bench.mark(2)?;
                    us.push(event_us(bench)?);
                }
                let t = median(&mut us);
                println!(
                    "{:<24} {:>5} {:>7} {:>8} {:>9.2} {:>9.2}",
                    v.name,
                    w_mib,
                    blocks,
                    threads,
                    t,
                    t / w_mib as f64
                );
            }
        }
    }
    Ok(())
}

/// GEMV time after the prefetch finished issuing, with S us of idle slack in between.
fn slack(bench: &Bench, rng: &mut SmallRng) -> Result<()> {
    let w_mib = 32u64;
    println!(
        "\n== slack: {w_mib} MiB prefetched (plain, 8 x 64), S us of idle collective, then the GEMV (M = 1); median of 20"
    );
    println!("{:>6} {:>10} {:>14}", "S us", "cold us", "prefetched us");
    let (x, w, _) = random_inputs(rng, 1, w_mib);
    let gemv = Gemv::new(&bench.kernels, &bench.stream, &x, &w, 1, K)?;
    let (address, bytes) = gemv.weights();
    let table = piece_table(bench, address, bytes)?;
    for s_us in [0u64, 1, 2, 5, 10, 20, 50] {
        let mut row = [0f64; 2];
        for (i, prefetch) in [false, true].into_iter().enumerate() {
            let mut us = Vec::new();
            for _ in 0..20 {
                bench.evict_weights(&gemv)?;
                if prefetch {
                    let p = whole_table(&table);
                    // SAFETY: checked segments inside the GEMV's weights, alive past the reads.
                    unsafe {
                        bench.kernels.launch_l2_prefetch(
                            bench.stream.cu_stream(),
                            l2_prefetch::BULK_VARIANT,
                            p,
                            8,
                            64,
                        )
                    }?;
                }
                if s_us > 0 {
                    // SAFETY: no flag is polled.
                    unsafe {
                        bench
                            .kernels
                            .launch_collective(bench.stream.cu_stream(), 1, s_us * 1000, 0)
                    }?;
                }
                bench.mark(1)?;
                gemv.launch(&bench.kernels, &bench.stream, None)?;
                bench.mark(2)?;
                us.push(event_us(bench)?);
            }
            row[i] = median(&mut us);
        }
        println!("{:>6} {:>10.2} {:>14.2}", s_us, row[0], row[1]);
    }
    Ok(())
}

/// The DGX Spark (GB10): reasoned from its L2 size, not measured here.
fn spark(bench: &Bench) {
    let spark_l2 = 24 * MIB;
    let budget = default_budget(spark_l2);
    let here = bench.kernels.gpu().l2_bytes;
    println!(
        "\n== DGX Spark, reasoned (not measured): L2 24 MiB -> default budget {:.2} MiB per window",
        budget as f64 / MIB as f64
    );
    println!(
        "   (this device: L2 {:.1} MiB -> default budget {:.2} MiB)",
        here as f64 / MIB as f64,
        default_budget(here) as f64 / MIB as f64
    );
    for w_mib in WEIGHTS_MIB {
        let covered = (budget as f64 / (w_mib * MIB) as f64).min(1.0);
        println!(
            "   W {w_mib:>2} MiB: the default budget warms the first {:.0}% of the weights; the rest is read cold",
            covered * 100.0
        );
    }
    println!(
        "   The issue time per MiB and the slack above bound how much of a window's budget is warm in time."
    );
    println!(
        "   The default replay reads windows of up to {:.2} MiB in with loads there ({:.2} MiB here), so every\n   default-budget window; whether its L2 favours loads as the H200's does is not known.",
        read_limit(spark_l2) as f64 / MIB as f64,
        read_limit(here) as f64 / MIB as f64
    );
}

criterion_group!(benches, bench_l2_prefetch);
criterion_main!(benches);
