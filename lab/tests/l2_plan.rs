//! The L2 plan: its logic on the CPU, and on a GPU (skipped without one) the GEMV against the
//! CPU reference, forwards bit-identical with and without prefetch (eager and in a CUDA graph),
//! and the prefetch kernel over awkward segments (run this under compute-sanitizer too).
mod common;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use cudarc::driver::{CudaStream, sys};
use fetchahead::device_abi::gemv::Reduce;
use fetchahead::device_abi::l2_prefetch::PrefetchVariant;
use fetchahead::device_abi::params::Segment;
use fetchahead::device_abi::{gemv, l2_prefetch};
use fetchahead::kernels::gpu::Gpu;
use fetchahead::l2_plan::pace::PROBE_LAG;
use fetchahead::l2_plan::segments::{SegmentTable, aligned_segment, check_segment};
use fetchahead::l2_plan::{
    DEFAULT_TWICE_FIT, L2Plan, Learned, PlanConfig, Planner, PrefetchLaunch, Replay, SEGMENT_PIECE,
    Signature, auto_variant, default_budget, graph_sms, once_jobs, prefetch_choice, read_limit,
};
use fetchahead::{Error, Result};
use fetchahead_lab::LabKernels;
use fetchahead_lab::gemv::{Gemv, GemvLaunch};
use fetchahead_lab::reference;
use half::bf16;
use rand::{RngExt, SeedableRng, rngs::SmallRng};

const MIB: u64 = 1 << 20;
const SIG: Signature = Signature(7);

fn seg(address: u64, bytes: u64) -> Segment {
    Segment { address, bytes }
}

/// One forward on the CPU planner: `windows[k]` are the weights consumed after collective k.
fn forward(p: &mut Planner, sig: Signature, captured: bool, windows: &[&[(u64, u64)]]) -> Learned {
    p.begin(sig, captured).unwrap();
    for w in windows {
        p.collective().unwrap();
        for &(a, b) in *w {
            p.consume(a, b).unwrap();
        }
    }
    p.end().unwrap().learned
}

fn learns_windows_in_consumption_order() {
    let mut p = Planner::new(MIB).unwrap();
    p.begin(SIG, false).unwrap();
    // Before the first collective: no window to warm it in, ignored.
    p.consume(0x10_0000, 4096).unwrap();
    let (k, window) = p.collective().unwrap();
    assert_eq!((k, window.len()), (0, 0));
    p.consume(0x20_0000, 4096).unwrap();
    p.consume(0x30_0000, 8192).unwrap();
    p.collective().unwrap();
    p.consume(0x40_0000, 1024).unwrap();
    let summary = p.end().unwrap();
    assert_eq!(summary.learned, Learned::New);
    assert!(summary.new_signature);
    assert_eq!(summary.collectives, 2);
    let plan = p.plan(SIG).unwrap();
    assert_eq!(plan.len(), 2);
    assert_eq!(
        plan.window(0),
        &[seg(0x20_0000, 4096), seg(0x30_0000, 8192)]
    );
    assert_eq!(plan.window(1), &[seg(0x40_0000, 1024)]);
    assert_eq!(plan.window_bytes(0), 12288);
    assert!(plan.window(2).is_empty());

    // The next forward of the signature is handed the learned windows, in order.
    p.begin(SIG, false).unwrap();
    assert_eq!(
        p.collective().unwrap().1,
        &[seg(0x20_0000, 4096), seg(0x30_0000, 8192)]
    );
    assert_eq!(p.collective().unwrap().1, &[seg(0x40_0000, 1024)]);
    // More collectives than learned: nothing past the plan.
    assert!(p.collective().unwrap().1.is_empty());
    p.abort();
}

fn trims_each_window_to_the_budget() {
    let mut p = Planner::new(1000).unwrap();
    assert_eq!(p.budget(), 992, "rounded down to 16");
    forward(
        &mut p,
        SIG,
        false,
        &[
            &[(0x1000, 600), (0x8000, 600), (0x9000, 600)],
            &[(0xA000, 2000)],
        ],
    );
    let plan = p.plan(SIG).unwrap();
    assert_eq!(plan.window(0), &[seg(0x1000, 592), seg(0x8000, 400)]);
    assert_eq!(plan.window(1), &[seg(0xA000, 992)]);
}

fn cuts_large_weights_into_pieces() {
    let mut p = Planner::new(4 * MIB).unwrap();
    let piece = SEGMENT_PIECE;
    forward(
        &mut p,
        SIG,
        false,
        &[&[
            (0x1000_0000, piece * 2 + 4096),
            (0x2000_0000, 3 * MIB),
            (0x1000_0000, 64),
        ]],
    );
    let plan = p.plan(SIG).unwrap();
    let mut want = vec![
        seg(0x1000_0000, piece),
        seg(0x1000_0000 + piece, piece),
        seg(0x1000_0000 + 2 * piece, 4096),
    ];
    let mut left = 4 * MIB - 2 * piece - 4096;
    let mut address = 0x2000_0000;
    while left > 0 {
        want.push(seg(address, left.min(piece)));
        address += left.min(piece);
        left -= left.min(piece);
    }
    assert_eq!(plan.window(0), &want[..]);
    assert_eq!(plan.window_bytes(0), 4 * MIB);
}

fn keeps_only_the_aligned_part_and_refuses_null() {
    let mut p = Planner::new(MIB).unwrap();
    p.begin(SIG, false).unwrap();
    p.collective().unwrap();
    p.consume(0x1008, 100).unwrap(); // 0x1008..0x106c -> 0x1010..0x1060
    p.consume(0x2001, 10).unwrap(); // nothing aligned inside: skipped
    p.consume(0x3000, 64).unwrap();
    p.consume(0x3000, 64).unwrap(); // the same weight again in one window: once
    assert!(matches!(p.consume(0, 4096), Err(Error::Invalid { .. })));
    assert!(matches!(
        p.consume(u64::MAX - 15, 4096),
        Err(Error::Invalid { .. })
    ));
    p.end().unwrap();
    assert_eq!(
        p.plan(SIG).unwrap().window(0),
        &[seg(0x1010, 0x50), seg(0x3000, 64)]
    );

    assert_eq!(aligned_segment(0x1000, 15).unwrap(), None);
    assert_eq!(aligned_segment(0x100f, 33).unwrap(), Some(seg(0x1010, 32)));
    assert!(check_segment(&seg(0x1000, 32)).is_ok());
    for bad in [
        seg(0, 32),
        seg(0x1008, 32),
        seg(0x1000, 40),
        seg(0x1000, 0),
        seg(u64::MAX - 15, 32),
    ] {
        assert!(check_segment(&bad).is_err(), "{bad:?} must be refused");
    }
}

fn relearns_until_captured_then_freezes() {
    let mut p = Planner::new(MIB).unwrap();
    let a: &[(u64, u64)] = &[(0x1000, 256)];
    let b: &[(u64, u64)] = &[(0x2000, 512)];
    assert_eq!(forward(&mut p, SIG, false, &[a]), Learned::New);
    assert_eq!(forward(&mut p, SIG, false, &[a]), Learned::Unchanged);
    assert_eq!(forward(&mut p, SIG, false, &[b]), Learned::Replaced);
    assert_eq!(p.plan(SIG).unwrap().window(0), &[seg(0x2000, 512)]);
    assert_eq!(forward(&mut p, SIG, false, &[b, a]), Learned::Replaced);
    assert_eq!(p.plan(SIG).unwrap().len(), 2);

    assert!(!p.is_frozen(SIG));
    assert_eq!(
        forward(&mut p, SIG, true, &[b, a]),
        Learned::Captured { mismatch: false }
    );
    assert!(p.is_frozen(SIG));
    // Frozen: an eager forward that differs changes nothing.
    assert_eq!(forward(&mut p, SIG, false, &[a]), Learned::Frozen);
    assert_eq!(p.plan(SIG).unwrap().window(0), &[seg(0x2000, 512)]);
    assert_eq!(p.plan(SIG).unwrap().len(), 2);
    // Other signatures still learn.
    assert_eq!(
        forward(&mut p, Signature::new(16, 1), false, &[a]),
        Learned::New
    );
    assert_eq!(p.counters().mismatches_at_capture, 0);
    p.forget_unfrozen();
    assert!(p.plan(Signature::new(16, 1)).is_none());
    assert!(p.plan(SIG).is_some());
}

fn a_forward_without_collectives_never_replaces_a_plan() {
    let mut p = Planner::new(MIB).unwrap();
    assert_eq!(forward(&mut p, SIG, false, &[]), Learned::NoCollectives);
    assert!(p.plan(SIG).is_none());
    forward(&mut p, SIG, false, &[&[(0x1000, 256)]]);
    p.begin(SIG, false).unwrap();
    p.consume(0x9000, 256).unwrap();
    assert_eq!(p.end().unwrap().learned, Learned::NoCollectives);
    assert_eq!(p.plan(SIG).unwrap().window(0), &[seg(0x1000, 256)]);
}

fn counts_mismatches_at_capture_and_forwards_without_a_plan() {
    let mut p = Planner::new(MIB).unwrap();
    let a: &[(u64, u64)] = &[(0x1000, 256)];
    let b: &[(u64, u64)] = &[(0x2000, 256)];
    forward(&mut p, SIG, false, &[a, b]);
    // One collective fewer than learned, then other weights: both mismatches; still frozen.
    assert_eq!(
        forward(&mut p, SIG, true, &[a]),
        Learned::Captured { mismatch: true }
    );
    assert_eq!(
        forward(&mut p, SIG, true, &[a, a]),
        Learned::Captured { mismatch: true }
    );
    assert_eq!(
        forward(&mut p, SIG, true, &[a, b]),
        Learned::Captured { mismatch: false }
    );
    assert_eq!(p.plan(SIG).unwrap().window(1), &[seg(0x2000, 256)]);
    // Captured before any plan: nothing to prefetch, frozen empty, a mismatch if it saw weights.
    let fresh = Signature::new(1, 2);
    assert_eq!(
        forward(&mut p, fresh, true, &[a]),
        Learned::Captured { mismatch: true }
    );
    assert_eq!(forward(&mut p, fresh, false, &[a]), Learned::Frozen);
    let c = p.counters();
    assert_eq!(c.mismatches_at_capture, 3);
    assert_eq!(c.forwards, 6);
    // The first forward of SIG and both of `fresh` began without a learned segment.
    assert_eq!(c.forwards_without_plan, 3);
    assert_eq!(c.signatures, 2);
}

fn refuses_misuse() {
    let mut p = Planner::new(MIB).unwrap();
    assert!(Planner::new(15).is_err());
    assert!(p.collective().is_err());
    assert!(p.consume(0x1000, 16).is_err());
    assert!(p.end().is_err());
    p.begin(SIG, false).unwrap();
    assert!(p.begin(SIG, false).is_err());
    p.abort();
    assert!(p.begin(SIG, false).is_ok());
}

fn default_budget_follows_the_l2_size() {
    // A cap of half of L2: 30 MiB on the H200, 12 MiB on the DGX Spark's 24 MiB.
    assert_eq!(default_budget(60 * MIB), 30 * MIB);
    assert_eq!(default_budget(24 * MIB), 12 * MIB);
    assert_eq!(default_budget(100), 48);
    assert_eq!(default_budget(0), 16);
    assert_eq!(PlanConfig::for_l2(60 * MIB).budget_per_window, 30 * MIB);
}

fn reads_windows_in_up_to_a_third_of_l2_by_default() {
    assert_eq!(PlanConfig::for_l2(60 * MIB).replay, Replay::Auto);
    assert_eq!(read_limit(60 * MIB), 30 * MIB);
    assert_eq!(read_limit(24 * MIB), 12 * MIB);
    assert_eq!(read_limit(100), 48);
    // The default budget's windows are always read in.
    for l2 in [24 * MIB, 50 * MIB, 60 * MIB, 126 * MIB] {
        assert!(default_budget(l2) <= read_limit(l2), "L2 {l2}");
        assert_eq!(
            auto_variant(default_budget(l2), l2),
            l2_prefetch::LOADS_VARIANT
        );
    }
    let (loads, bulk) = (l2_prefetch::LOADS_VARIANT, l2_prefetch::BULK_VARIANT);
    assert_eq!(auto_variant(16 * MIB, 60 * MIB), loads);
    assert_eq!(auto_variant(30 * MIB, 60 * MIB), loads);
    assert_eq!(auto_variant(30 * MIB + 16, 60 * MIB), bulk);
    assert_eq!(auto_variant(32 * MIB, 60 * MIB), bulk);
    assert_eq!(auto_variant(12 * MIB, 24 * MIB), loads);
    assert_eq!(auto_variant(13 * MIB, 24 * MIB), bulk);
}

/// A window that two copies fit in L2 is read whole by both partitions; a larger one's tail,
/// counted from its end, by one partition only, so that both copies of the rest and one of the
/// tail fill at most `twice_fit` of L2.
fn reads_the_tail_of_a_window_too_large_for_two_copies_once() {
    let job = l2_prefetch::LOADS_JOB;
    assert_eq!(job, 128 << 10);
    let l2 = 60 * MIB;
    assert_eq!(PlanConfig::for_l2(l2).twice_fit, DEFAULT_TWICE_FIT);
    assert_eq!(once_jobs(6 * MIB, l2, 0.8), 0);
    assert_eq!(once_jobs(24 * MIB, l2, 0.8), 0);
    // 48 MiB of room: 19 MiB twice, 10 MiB once.
    assert_eq!(once_jobs(29 * MIB, l2, 0.8), (10 * MIB / job) as u32);
    assert_eq!(
        once_jobs(29 * MIB + 1, l2, 0.8),
        (10 * MIB / job) as u32 + 1
    );
    // No room for a second copy of anything: all of it once.
    assert_eq!(once_jobs(50 * MIB, l2, 0.8), (50 * MIB / job) as u32);
    assert_eq!(once_jobs(6 * MIB, l2, 0.0), (6 * MIB / job) as u32);
    assert_eq!(once_jobs(0, l2, 0.8), 0);
}

fn loads_launch_four_blocks_a_segment_up_to_one_an_sm() {
    let (loads, bulk) = (l2_prefetch::LOADS_VARIANT, l2_prefetch::BULK_VARIANT);
    let threads = l2_prefetch::LOADS_THREADS;
    assert_eq!(
        l2_prefetch::launch_shape(loads, 8, 132, 8, 64),
        (32, threads)
    );
    assert_eq!(
        l2_prefetch::launch_shape(loads, 64, 132, 8, 64),
        (132, threads)
    );
    assert_eq!(
        l2_prefetch::launch_shape(loads, u32::MAX, 132, 8, 64),
        (132, threads)
    );
    // The other variants keep the configured shape.
    assert_eq!(l2_prefetch::launch_shape(bulk, 64, 132, 8, 64), (8, 64));
    assert_eq!(l2_prefetch::launch_shape(bulk, 3, 132, 8, 64), (3, 64));
    let evict_last = PrefetchVariant::must("l2_prefetch_evict_last");
    assert_eq!(
        l2_prefetch::launch_shape(evict_last, 64, 132, 32, 256),
        (32, 256)
    );
}

/// Captured windows the loads would read go to the copies on a third of the SMs by default;
/// eager ones, named variants, windows for the bulk prefetch, `graph_sms` 0 and PTX without the
/// copies keep the eager choice.
fn captured_windows_take_the_copies_on_a_third_of_the_sms() {
    let h200 = (60 * MIB, 132);
    let (loads, copies, bulk) = (
        l2_prefetch::LOADS_VARIANT,
        l2_prefetch::COPIES_VARIANT,
        l2_prefetch::BULK_VARIANT,
    );
    let auto = PlanConfig::for_l2(h200.0);
    let small = 6 * MIB;
    let eager_sms = 132 - auto.free_sms;
    assert_eq!(
        prefetch_choice(&auto, false, small, h200, true),
        (loads, eager_sms)
    );
    assert_eq!(
        prefetch_choice(&auto, true, small, h200, true),
        (copies, 44)
    );
    assert_eq!(
        prefetch_choice(&auto, true, small, (24 * MIB, 48), true),
        (copies, 16)
    );
    // Without the copies in the loaded PTX (the sm_80 baseline), the loads as eagerly.
    assert_eq!(
        prefetch_choice(&auto, true, small, h200, false),
        (loads, eager_sms)
    );
    // A window past the read limit is bulk-prefetched, captured or not.
    let large = read_limit(h200.0) + MIB;
    assert_eq!(auto_variant(large, h200.0), bulk);
    assert_eq!(
        prefetch_choice(&auto, true, large, h200, true),
        (bulk, eager_sms)
    );
    let mut config = auto;
    config.graph_sms = Some(0);
    assert_eq!(
        prefetch_choice(&config, true, small, h200, true),
        (loads, eager_sms)
    );
    config.graph_sms = Some(500);
    assert_eq!(
        prefetch_choice(&config, true, small, h200, true),
        (copies, 132)
    );
    config.graph_sms = Some(8);
    assert_eq!(
        prefetch_choice(&config, true, small, h200, true),
        (copies, 8)
    );
    config.replay = Replay::Prefetch { variant: loads };
    assert_eq!(
        prefetch_choice(&config, true, small, h200, true),
        (loads, eager_sms)
    );
    assert_eq!(graph_sms(132), 44);
}

// ---- On the GPU ----

/// The layers of a test forward: a collective, then a GEMV over its own weights.
struct Layers {
    gemvs: Vec<Gemv>,
    /// How long each layer's collective polls.
    window_ns: u64,
    /// Host time each layer spends before its collective (a host-bound forward's Python).
    host_ns: u64,
}

const K: u32 = 1024;

impl Layers {
    /// `layers` GEMVs of `m x K` activations against `rows x K` weights, random bf16.
    fn new(
        kernels: &LabKernels,
        stream: &Arc<CudaStream>,
        layers: usize,
        m: u32,
        rows: u32,
        seed: u64,
    ) -> Result<Layers> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut gemvs = Vec::new();
        for _ in 0..layers {
            let x = random_bf16(&mut rng, (m * K) as usize);
            let w = random_bf16(&mut rng, (rows * K) as usize);
            gemvs.push(Gemv::new(kernels, stream, &x, &w, m, K)?);
        }
        Ok(Layers {
            gemvs,
            window_ns: 2_000,
            host_ns: 0,
        })
    }

    /// One forward on `stream`: per layer a collective (2 us unless changed) then the GEMV,
    /// announced to `plan`.
    fn run(
        &self,
        kernels: &LabKernels,
        stream: &CudaStream,
        mut plan: Option<&mut L2Plan>,
        sig: Signature,
    ) -> Result<()> {
        if let Some(plan) = plan.as_deref_mut() {
            plan.begin_forward(sig)?;
        }
        for gemv in &self.gemvs {
            let busy = Instant::now();
            while busy.elapsed().as_nanos() < self.host_ns as u128 {
                std::hint::spin_loop();
            }
            if let Some(plan) = plan.as_deref_mut() {
                plan.collective()?;
            }
            // SAFETY: no flag is polled.
            unsafe { kernels.launch_collective(stream.cu_stream(), 4, self.window_ns, 0) }?;
            if let Some(plan) = plan.as_deref_mut() {
                let (address, bytes) = gemv.weights();
                plan.consume(address, bytes)?;
            }
            gemv.launch(kernels, stream, None)?;
        }
        if let Some(plan) = plan {
            plan.end_forward()?;
        }
        Ok(())
    }

    fn poison(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        self.gemvs.iter_mut().try_for_each(|g| g.poison(stream))
    }

    fn outputs(&self, stream: &Arc<CudaStream>) -> Result<Vec<Vec<f32>>> {
        self.gemvs.iter().map(|g| g.read_y(stream)).collect()
    }
}

fn random_bf16(rng: &mut SmallRng, n: usize) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
        .collect()
}

fn bits(outputs: &[Vec<f32>]) -> Vec<Vec<u32>> {
    outputs
        .iter()
        .map(|o| o.iter().map(|v| v.to_bits()).collect())
        .collect()
}

/// GPU tests run one at a time: one sets the context's persisting-L2 limit, others capture.
static GPU_LOCK: Mutex<()> = Mutex::new(());

type Device = (Arc<LabKernels>, Arc<CudaStream>, MutexGuard<'static, ()>);

fn open(what: &str) -> Result<Option<Device>> {
    let lock = GPU_LOCK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let Some(gpu) = Gpu::for_test(what)? else {
        return Ok(None);
    };
    let kernels = Arc::new(LabKernels::load(&gpu)?);
    let stream = gpu.ctx.new_stream().map_err(|source| Error::Cuda {
        call: "cuStreamCreate",
        source,
    })?;
    Ok(Some((kernels, stream, lock)))
}

fn gemv_matches_the_cpu_reference() -> Result<()> {
    let Some((kernels, stream, _lock)) = open("gemv_matches_the_cpu_reference")? else {
        return Ok(());
    };
    let mut rng = SmallRng::seed_from_u64(rand::rng().random());
    // (m, n, k): one split and several, both variants, a tail shorter than the unroll.
    for (m, n, k) in [
        (1, 64, 4096),
        (5, 48, 1056),
        (8, 4096, 4096),
        (9, 32, 512),
        (16, 1024, 2048),
        (16, 16, 32),
    ] {
        let x = random_bf16(&mut rng, (m * k) as usize);
        let w = random_bf16(&mut rng, (n * k) as usize);
        let want = reference::gemv(&x, &w, m as usize, k as usize);
        let default = Gemv::new(&kernels, &stream, &x, &w, m, k)?.launch_config();
        // The host's choice, then every variant that covers m: global splits at one and at the
        // most K allows up to 64 (33 for k = 1056: a partial reduction batch), clusters of 1, 2
        // and 8 blocks (64 splits: uneven, or empty, for k < 2048).
        let steps = k / 32;
        let most = (1..=64.min(steps))
            .rev()
            .find(|s| steps.is_multiple_of(*s))
            .unwrap_or(1);
        let mut launches = vec![default];
        for (variant, v) in gemv::VARIANTS.iter().enumerate() {
            if m > v.max_m {
                continue;
            }
            let splits = match v.reduce {
                Reduce::Global => vec![1, most],
                Reduce::Cluster => vec![8, 16, 64],
            };
            for splits in splits {
                launches.push(GemvLaunch { variant, splits });
            }
        }
        launches.dedup();
        for config in launches {
            let mut gemv = Gemv::with_launch(&stream, &x, &w, m, k, config)?;
            check_gemv(&kernels, &stream, &mut gemv, &want, (m, n, k))?;
        }
    }
    Ok(())
}

/// Launches `gemv` twice against `want`: the split-K epilogue must leave its arrival counters
/// ready for the next launch, and the result must not change.
fn check_gemv(
    kernels: &LabKernels,
    stream: &Arc<CudaStream>,
    gemv: &mut Gemv,
    want: &[f64],
    (m, n, k): (u32, u32, u32),
) -> Result<()> {
    let config = gemv.launch_config();
    let name = gemv::VARIANTS[config.variant].name;
    let mut first = None;
    for launch in 0..2 {
        gemv.poison(stream)?;
        gemv.launch(kernels, stream, None)?;
        let got = gemv.read_y(stream)?;
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            // f32 accumulation of k products of magnitude < 1, in k / 16 + splits steps.
            let tolerance = 1e-5 * (k as f64).sqrt() * 4.0 + 1e-6;
            assert!(
                (*g as f64 - w).abs() <= tolerance,
                "{name} m {m} n {n} k {k} splits {}, launch {launch}: y[{}, {}] = {g}, want {w}",
                config.splits,
                i / n as usize,
                i % n as usize
            );
        }
        let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
        assert_eq!(
            first.get_or_insert_with(|| got.clone()),
            &got,
            "{name} m {m} n {n} k {k} splits {}",
            config.splits
        );
    }
    Ok(())
}

fn gemv_refuses_bad_shapes() -> Result<()> {
    let Some((kernels, stream, _lock)) = open("gemv_refuses_bad_shapes")? else {
        return Ok(());
    };
    let mut rng = SmallRng::seed_from_u64(1);
    let x = random_bf16(&mut rng, 17 * 64);
    let w = random_bf16(&mut rng, 16 * 64);
    let m17 = Gemv::new(&kernels, &stream, &x[..17 * 64], &w, 17, 64)
        .and_then(|gemv| gemv.launch(&kernels, &stream, None));
    assert!(m17.is_err(), "m = 17");
    let m9_on_m8 = GemvLaunch {
        variant: 0,
        splits: 1,
    };
    assert_eq!(gemv::VARIANTS[0].max_m, 8);
    let gemv = Gemv::with_launch(&stream, &x[..9 * 64], &w, 9, 64, m9_on_m8)?;
    assert!(
        gemv.launch(&kernels, &stream, None).is_err(),
        "m = 9 on an M <= 8 variant"
    );
    let gemv = Gemv::new(&kernels, &stream, &x[..64], &w[..8 * 64], 1, 64)?;
    assert!(gemv.launch(&kernels, &stream, None).is_err(), "n = 8");
    let cluster = gemv::VARIANTS
        .iter()
        .position(|v| v.reduce == Reduce::Cluster)
        .expect("a cluster variant");
    for splits in [4, 12, 128] {
        let launch = GemvLaunch {
            variant: cluster,
            splits,
        };
        let gemv = Gemv::with_launch(&stream, &x[..64], &w, 1, 64, launch)?;
        assert!(
            gemv.launch(&kernels, &stream, None).is_err(),
            "{splits} splits on a cluster variant"
        );
    }
    let gemv = Gemv::new(&kernels, &stream, &x[..48], &w[..16 * 48], 1, 48)?;
    assert!(gemv.launch(&kernels, &stream, None).is_err(), "k = 48");
    Ok(())
}

/// Eager forwards: without a plan, learning, then replaying each prefetch variant and the
/// access-policy mode, all bit-identical, with the counters the replays imply.
fn forward_is_bit_identical_with_prefetch_eager() -> Result<()> {
    let Some((kernels, stream, _lock)) = open("forward_is_bit_identical_with_prefetch_eager")?
    else {
        return Ok(());
    };
    let l2 = kernels.gpu().l2_bytes;
    let mut layers = Layers::new(&kernels, &stream, 3, 16, 2048, rand::rng().random())?;
    layers.run(&kernels, &stream, None, SIG)?;
    let want = bits(&layers.outputs(&stream)?);

    let after = PrefetchLaunch::AfterCollective;
    let replays = [
        (Replay::Auto, after),
        (
            Replay::Prefetch {
                variant: l2_prefetch::BULK_VARIANT,
            },
            after,
        ),
        (
            Replay::Prefetch {
                variant: PrefetchVariant::must("l2_prefetch_evict_last"),
            },
            after,
        ),
        (
            Replay::Prefetch {
                variant: l2_prefetch::LOADS_VARIANT,
            },
            after,
        ),
        (
            Replay::Prefetch {
                variant: l2_prefetch::BULK_VARIANT,
            },
            PrefetchLaunch::BeforeCollective,
        ),
        (Replay::AccessPolicy, after),
    ];
    for (replay, launch) in replays {
        let mut config = PlanConfig::for_l2(l2);
        config.replay = replay;
        config.launch = launch;
        // Every window warmed, whether or not this host outpaces the GPU.
        config.host_pace = false;
        let mut plan = match L2Plan::new(kernels.product().clone(), stream.clone(), config) {
            Ok(plan) => plan,
            Err(e) if replay == Replay::AccessPolicy => {
                eprintln!("skipping the access-policy mode: {e}");
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut bytes = Vec::new();
        for forward in 0..3 {
            layers.poison(&stream)?;
            layers.run(&kernels, &stream, Some(&mut plan), SIG)?;
            assert_eq!(
                bits(&layers.outputs(&stream)?),
                want,
                "{replay:?}, forward {forward}"
            );
            bytes.push(plan.counters().bytes_prefetched);
        }
        let c = plan.counters();
        let window = (2048 * K as u64 * 2).min(config.budget_per_window);
        // The first forward learned; the next two warmed every window.
        assert_eq!(c.forwards, 3, "{replay:?}");
        assert_eq!(c.forwards_without_plan, 1, "{replay:?}");
        assert_eq!(c.windows_prefetched, 6, "{replay:?}");
        if replay != Replay::AccessPolicy {
            // The second forward prefetched whole windows and timed them; the third at most
            // that, each window cut to what its prefetch issued within the 2 us collective.
            assert_eq!(bytes[1] - bytes[0], 3 * window, "{replay:?}");
            assert!(bytes[2] - bytes[1] <= 3 * window, "{replay:?}");
            for k in 0..3 {
                assert!(plan.window_cap(SIG, k).is_some(), "{replay:?} window {k}");
            }
        }
        assert_eq!(c.signatures, 1);
        assert_eq!(plan.planner().plan(SIG).map(|w| w.len()), Some(3));
    }
    Ok(())
}

/// A window's prefetch is cut to what it issues within the window, learned over eager
/// forwards, and a long window keeps it whole; the outputs stay exact either way.
fn caps_each_window_to_what_its_prefetch_issues_within_it() -> Result<()> {
    let Some((kernels, stream, _lock)) =
        open("caps_each_window_to_what_its_prefetch_issues_within_it")?
    else {
        return Ok(());
    };
    // 16 MiB of weights behind one collective: about 13 us for the bulk prefetch to issue on an
    // H200 (8 x 64 threads), whatever L2 holds. The test pins that variant: the default would
    // read these weights with loads, which finish inside a short window when the previous
    // forward left the weights in L2, as it does here.
    let rows = 8192;
    let weights = rows as u64 * K as u64 * 2;
    for (window_ns, cut) in [(2_000, true), (200_000, false)] {
        let mut layers = Layers::new(&kernels, &stream, 1, 1, rows, rand::rng().random())?;
        layers.window_ns = window_ns;
        layers.run(&kernels, &stream, None, SIG)?;
        let want = bits(&layers.outputs(&stream)?);
        let mut config = PlanConfig::for_l2(kernels.gpu().l2_bytes);
        config.budget_per_window = weights;
        config.replay = Replay::Prefetch {
            variant: l2_prefetch::BULK_VARIANT,
        };
        config.host_pace = false;
        let mut plan = L2Plan::new(kernels.product().clone(), stream.clone(), config)?;
        let mut issued = Vec::new();
        for forward in 0..4 {
            layers.poison(&stream)?;
            let before = plan.counters().bytes_prefetched;
            layers.run(&kernels, &stream, Some(&mut plan), SIG)?;
            assert_eq!(bits(&layers.outputs(&stream)?), want, "forward {forward}");
            issued.push(plan.counters().bytes_prefetched - before);
        }
        let cap = plan.window_cap(SIG, 0).expect("a measured window");
        // Forward 0 learned, 1 prefetched the whole window and timed it, 2 and 3 used the cap.
        assert_eq!(issued[..2], [0, weights], "{window_ns} ns window");
        if cut {
            assert!(cap < weights, "{window_ns} ns window: cap {cap}");
            assert!(issued[3] < weights, "{window_ns} ns window: {issued:?}");
            assert!(
                issued[3] >= SEGMENT_PIECE,
                "{window_ns} ns window: {issued:?}"
            );
        } else {
            assert!(cap >= weights, "{window_ns} ns window: cap {cap}");
            assert_eq!(issued[3], weights, "{window_ns} ns window");
        }
    }
    Ok(())
}

/// Eager forwards whose host is slower than their GPU leave windows cold (their prefetch could
/// not shorten the forward), counted, once the fit has timed the windows; with the GPU behind
/// the host every window is warmed; the outputs stay exact either way, and with `host_pace` off
/// every window is warmed.
fn leaves_windows_cold_while_the_gpu_keeps_up_with_the_host() -> Result<()> {
    let Some((kernels, stream, _lock)) =
        open("leaves_windows_cold_while_the_gpu_keeps_up_with_the_host")?
    else {
        return Ok(());
    };
    let windows = 32u64;
    let mut layers = Layers::new(
        &kernels,
        &stream,
        windows as usize,
        1,
        256,
        rand::rng().random(),
    )?;
    layers.run(&kernels, &stream, None, SIG)?;
    let want = bits(&layers.outputs(&stream)?);
    for pace in [true, false] {
        let mut config = PlanConfig::for_l2(kernels.gpu().l2_bytes);
        config.host_pace = pace;
        let mut plan = L2Plan::new(kernels.product().clone(), stream.clone(), config)?;
        layers.run(&kernels, &stream, Some(&mut plan), SIG)?; // learns
        let mut delta = |layers: &mut Layers, gpu_behind: bool| -> Result<(u64, u64)> {
            stream.synchronize().map_err(cuda("cuStreamSynchronize"))?;
            layers.poison(&stream)?;
            if gpu_behind {
                // SAFETY: a live stream of the device's context.
                unsafe { kernels.launch_spin(stream.cu_stream(), 50_000_000) }?;
            }
            let before = plan.counters();
            layers.run(&kernels, &stream, Some(&mut plan), SIG)?;
            assert_eq!(bits(&layers.outputs(&stream)?), want, "pace {pace}");
            let after = plan.counters();
            Ok((
                after.windows_prefetched - before.windows_prefetched,
                after.windows_host_bound - before.windows_host_bound,
            ))
        };
        // 100 us of host time a window against a few of GPU time: the host is the bottleneck.
        // The fit's three timed forwards warm every window all the same.
        layers.host_ns = 100_000;
        for _ in 0..3 {
            assert_eq!(delta(&mut layers, false)?, (windows, 0), "pace {pace}");
        }
        let (warmed, cold) = delta(&mut layers, false)?;
        assert_eq!(warmed + cold, windows, "pace {pace}");
        if pace {
            // The first probe is asked at the third collective; the GPU has caught up by then.
            assert!(cold >= windows - 8, "{warmed} warmed, {cold} cold");
        } else {
            assert_eq!(cold, 0);
        }
        // 50 ms of GPU work ahead of the forward: the GPU stays behind the host throughout. The
        // first windows follow the last forward's pace until this forward's first probe.
        layers.host_ns = 0;
        let (warmed, cold) = delta(&mut layers, true)?;
        assert_eq!(warmed + cold, windows, "pace {pace}");
        assert!(cold <= PROBE_LAG as u64, "pace {pace}: {cold} cold");
        assert_eq!(delta(&mut layers, true)?, (windows, 0), "pace {pace}");
    }
    Ok(())
}

/// A stale plan (learned on other weights) only wastes bandwidth: the outputs stay exact, and
/// the next eager forward relearns.
fn a_stale_plan_keeps_outputs_exact() -> Result<()> {
    let Some((kernels, stream, _lock)) = open("a_stale_plan_keeps_outputs_exact")? else {
        return Ok(());
    };
    let old = Layers::new(&kernels, &stream, 2, 1, 1024, rand::rng().random())?;
    let mut new = Layers::new(&kernels, &stream, 3, 4, 512, rand::rng().random())?;
    new.run(&kernels, &stream, None, SIG)?;
    let want = bits(&new.outputs(&stream)?);
    let mut config = PlanConfig::for_l2(kernels.gpu().l2_bytes);
    config.host_pace = false;
    let mut plan = L2Plan::new(kernels.product().clone(), stream.clone(), config)?;
    old.run(&kernels, &stream, Some(&mut plan), SIG)?;
    for forward in 0..2 {
        new.poison(&stream)?;
        new.run(&kernels, &stream, Some(&mut plan), SIG)?;
        assert_eq!(bits(&new.outputs(&stream)?), want, "forward {forward}");
    }
    // The stale plan's two windows were warmed in the first forward (nothing past them for
    // the third collective), the relearned plan's three in the second.
    assert_eq!(plan.counters().windows_prefetched, 2 + 3);
    assert_eq!(plan.planner().plan(SIG).map(|w| w.len()), Some(3));
    Ok(())
}

/// Graphs: a forward captured without a plan and one captured with a learned plan (the prefetch
/// becomes a graph branch) both replay bit-identical to the eager forward.
fn forward_is_bit_identical_with_prefetch_in_a_graph() -> Result<()> {
    let Some((kernels, stream, _lock)) = open("forward_is_bit_identical_with_prefetch_in_a_graph")?
    else {
        return Ok(());
    };
    let cuda = |call: &'static str| move |source| Error::Cuda { call, source };
    let mut layers = Layers::new(&kernels, &stream, 4, 1, 4096, rand::rng().random())?;
    layers.run(&kernels, &stream, None, SIG)?;
    let want = bits(&layers.outputs(&stream)?);

    // Each variant by name (`Replay::Prefetch`: eager and captured alike), then `Replay::Auto`
    // with captured forwards on the copies prefetch (`graph_sms`: 8 SMs), then on the loads.
    let variants = PrefetchVariant::all().map(|v| (Some(v), 0));
    for (variant, graph_sms) in variants.chain([(None, 8), (None, 0)]) {
        let mut config = PlanConfig::for_l2(kernels.gpu().l2_bytes);
        match variant {
            Some(variant) => config.replay = Replay::Prefetch { variant },
            None => config.graph_sms = Some(graph_sms),
        }
        let variant = variant.map_or(format!("auto, graph_sms {graph_sms}"), |v| v.to_string());
        let mut plan = L2Plan::new(kernels.product().clone(), stream.clone(), config)?;
        // One forward learns, two more time the windows (2 us each): the capture bakes in
        // windows cut to fit.
        for _ in 0..3 {
            layers.run(&kernels, &stream, Some(&mut plan), SIG)?;
            stream.synchronize().map_err(cuda("cuStreamSynchronize"))?;
        }
        assert!(plan.window_cap(SIG, 3).is_some());
        // SAFETY: nothing in this test uses cudarc's per-slice event tracking from here on;
        // every launch passes raw addresses.
        unsafe { stream.context().disable_event_tracking() };

        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        let flags = sys::CUgraphInstantiate_flags(0);
        stream
            .begin_capture(mode)
            .map_err(cuda("cuStreamBeginCapture"))?;
        layers.run(&kernels, &stream, None, SIG)?;
        let plain = stream
            .end_capture(flags)
            .map_err(cuda("cuStreamEndCapture"))?;

        let before = plan.counters();
        stream
            .begin_capture(mode)
            .map_err(cuda("cuStreamBeginCapture"))?;
        let run = layers.run(&kernels, &stream, Some(&mut plan), SIG);
        let prefetched = stream
            .end_capture(flags)
            .map_err(cuda("cuStreamEndCapture"))?;
        run?;
        let after = plan.counters();
        assert!(plan.planner().is_frozen(SIG));
        assert_eq!(after.mismatches_at_capture, 0);
        assert_eq!(
            after.windows_prefetched - before.windows_prefetched,
            4,
            "one branch per collective"
        );

        for graph in [plain, prefetched] {
            let graph = graph.ok_or_else(|| Error::Invalid {
                what: "capture",
                why: "empty graph".into(),
            })?;
            for replay in 0..3 {
                layers.poison(&stream)?;
                graph.launch().map_err(cuda("cuGraphLaunch"))?;
                assert_eq!(
                    bits(&layers.outputs(&stream)?),
                    want,
                    "variant {variant}, replay {replay}"
                );
            }
        }
        // Frozen: an eager forward after the capture changes nothing, and still matches.
        layers.poison(&stream)?;
        layers.run(&kernels, &stream, Some(&mut plan), SIG)?;
        assert_eq!(bits(&layers.outputs(&stream)?), want);
        // SAFETY: back to the default for the next variant's eager forwards.
        unsafe { stream.context().enable_event_tracking() };
    }
    Ok(())
}

/// The prefetch kernel over segments of every awkward shape: sizes not a multiple of the chunk,
/// more segments than blocks, one block and many threads. Run under
/// `compute-sanitizer --tool memcheck` as well (see README).
fn prefetch_kernel_runs_clean() -> Result<()> {
    let Some((kernels, stream, _lock)) = open("prefetch_kernel_runs_clean")? else {
        return Ok(());
    };
    let cuda = |call: &'static str| move |source| Error::Cuda { call, source };
    let bytes = 8 * MIB as usize;
    let buffer = stream
        .alloc_zeros::<u8>(bytes)
        .map_err(cuda("cuMemAlloc"))?;
    let base = {
        use cudarc::driver::DevicePtr;
        buffer.device_ptr(&stream).0
    };
    let segments = [
        seg(base, 16),
        seg(base + 16, 16 * 1024 - 16),
        seg(base + 64 * 1024, 1 << 20),
        seg(base + (2 << 20), (1 << 20) + 48),
        seg(base + bytes as u64 - 4096, 4096),
        seg(base + (4 << 20), 3 * 16),
        seg(base + (5 << 20), (3 << 20) - 4096),
        seg(base, bytes as u64),
        seg(base + 1024, 16 * 1024 + 16),
        seg(base + (3 << 20), 256 * 1024),
    ];
    let table = SegmentTable::upload(&stream, &segments)?;
    assert_eq!(table.len(), segments.len());
    for variant in PrefetchVariant::all() {
        for (blocks, threads, chunk) in [
            (8, 64, 16 << 10),
            (1, 1024, 16),
            (3, 32, 4096),
            (64, 64, 1 << 20),
        ] {
            let p = fetchahead::device_abi::params::PrefetchParams {
                segments: table.address(),
                n: table.len() as u64,
                chunk,
                once_jobs: 0,
                partitions: 0,
                claims: 0,
                timeline: fetchahead::device_abi::params::TimelineParams::OFF,
            };
            // SAFETY: the table holds checked segments inside `buffer`, alive past the sync.
            unsafe { kernels.launch_l2_prefetch(stream.cu_stream(), variant, p, blocks, threads) }?;
        }
    }
    stream.synchronize().map_err(cuda("cuStreamSynchronize"))?;
    // Unchecked segments never reach the device.
    assert!(SegmentTable::upload(&stream, &[seg(base + 8, 32)]).is_err());
    assert!(SegmentTable::upload(&stream, &[seg(base, 40)]).is_err());
    assert!(SegmentTable::upload(&stream, &[seg(0, 32)]).is_err());
    Ok(())
}

/// The `FETCHAHEAD_L2_*` settings: each replaces its default, a malformed one is an error
/// naming the variable, and the launch placement follows the capture by default.
fn reads_its_settings_from_the_environment() {
    let vars = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let none = PlanConfig::from_vars(60 * MIB, vars(&[])).unwrap();
    assert_eq!(none, PlanConfig::for_l2(60 * MIB));
    assert_eq!(none.launch, PrefetchLaunch::Auto);
    assert!(none.fit);
    let set = PlanConfig::from_vars(
        60 * MIB,
        vars(&[
            ("FETCHAHEAD_L2_BUDGET_MB", "2.5"),
            ("FETCHAHEAD_L2_REPLAY", "l2_prefetch"),
            ("FETCHAHEAD_L2_LAUNCH", "before"),
            ("FETCHAHEAD_L2_FIT", "0"),
            ("FETCHAHEAD_L2_HOST_PACE", "0"),
            ("FETCHAHEAD_L2_FREE_SMS", " 24 "),
            ("FETCHAHEAD_L2_GRAPH_SMS", "32"),
        ]),
    )
    .unwrap();
    assert!(none.host_pace);
    assert!(!set.host_pace);
    assert_eq!(none.free_sms, fetchahead::l2_plan::DEFAULT_FREE_SMS);
    assert_eq!(set.free_sms, 24);
    assert_eq!(none.graph_sms, None);
    assert_eq!(set.graph_sms, Some(32));
    assert_eq!(graph_sms(48), 16);
    assert_eq!(graph_sms(1), 1);
    assert_eq!(set.budget_per_window, 5 * MIB / 2);
    assert_eq!(
        set.replay,
        Replay::Prefetch {
            variant: l2_prefetch::BULK_VARIANT
        }
    );
    assert_eq!(set.launch, PrefetchLaunch::BeforeCollective);
    assert!(!set.fit);
    for (name, value) in [
        ("FETCHAHEAD_L2_BUDGET_MB", "0"),
        ("FETCHAHEAD_L2_BUDGET_MB", "-1"),
        ("FETCHAHEAD_L2_BUDGET_MB", "six"),
        ("FETCHAHEAD_L2_REPLAY", "l2_prefetch_nope"),
        ("FETCHAHEAD_L2_LAUNCH", "sometimes"),
        ("FETCHAHEAD_L2_FIT", "yes"),
        ("FETCHAHEAD_L2_HOST_PACE", "2"),
        ("FETCHAHEAD_L2_FREE_SMS", "-1"),
        ("FETCHAHEAD_L2_FREE_SMS", "a few"),
        ("FETCHAHEAD_L2_GRAPH_SMS", "1.5"),
    ] {
        let pairs: &'static [(&'static str, &'static str)] =
            Box::leak(vec![(name, value)].into_boxed_slice());
        let e = PlanConfig::from_vars(60 * MIB, vars(pairs)).unwrap_err();
        assert!(e.to_string().contains(name), "{name}={value}: {e}");
    }
    assert!(PrefetchLaunch::Auto.before_collective(true));
    assert!(!PrefetchLaunch::Auto.before_collective(false));
    assert!(PrefetchLaunch::BeforeCollective.before_collective(false));
    assert!(!PrefetchLaunch::AfterCollective.before_collective(true));
}

/// A CUDA error of `call`.
fn cuda(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |source| Error::Cuda { call, source }
}

/// Issue 22: inside a replayed graph of collective windows and readers, the plan's prefetch
/// brings the readers' time (their blocks' span on the device timeline) to within 10% of the
/// same readers warmed by hand (each read once just before, in the same graph), and clearly
/// below the same readers cold. Each window's weights (16 MiB) are its own, 128 MiB in all, so
/// without the plan every reader is cold.
fn a_replayed_plan_brings_readers_near_hand_warmed() -> Result<()> {
    let Some((kernels, stream, _lock)) = open("a_replayed_plan_brings_readers_near_hand_warmed")?
    else {
        return Ok(());
    };
    const WINDOWS: usize = 8;
    let mut layers = Layers::new(&kernels, &stream, WINDOWS, 8, 8192, 11)?;
    layers.window_ns = 30_000;
    let sig = Signature::new(8, 22);
    let mut config = PlanConfig::for_l2(kernels.gpu().l2_bytes);
    config.budget_per_window = 16 << 20;
    let mut plan = L2Plan::new(kernels.product().clone(), stream.clone(), config)?;
    // The plan learns, then fits its windows, eagerly.
    for _ in 0..4 {
        layers.run(&kernels, &stream, Some(&mut plan), sig)?;
    }
    stream.synchronize().map_err(cuda("cuStreamSynchronize"))?;
    let capture = |f: &mut dyn FnMut() -> Result<()>| -> Result<cudarc::driver::CudaGraph> {
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        stream
            .begin_capture(mode)
            .map_err(cuda("cuStreamBeginCapture"))?;
        let r = f();
        let graph = stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(cuda("cuStreamEndCapture"))?;
        r?;
        graph.ok_or_else(|| Error::invalid("graph", "empty capture"))
    };
    kernels.enable_timeline(fetchahead::timeline::DEFAULT_CAPACITY)?;
    // Each window's reader launch labelled with the window (the hand-warming read unlabelled).
    let windows = |warm_by_hand: bool, plan: Option<&mut L2Plan>| -> Result<()> {
        let mut plan = plan;
        if let Some(plan) = plan.as_deref_mut() {
            plan.begin_forward(sig)?;
        }
        for (w, gemv) in layers.gemvs.iter().enumerate() {
            if let Some(plan) = plan.as_deref_mut() {
                plan.collective()?;
            }
            kernels.set_timeline_label(fetchahead::device_abi::timeline::NO_LABEL);
            // SAFETY: no flag is polled.
            unsafe { kernels.launch_collective(stream.cu_stream(), 4, layers.window_ns, 0) }?;
            if let Some(plan) = plan.as_deref_mut() {
                let (address, bytes) = gemv.weights();
                plan.consume(address, bytes)?;
            }
            if warm_by_hand {
                gemv.launch(&kernels, &stream, None)?;
            }
            kernels.set_timeline_label(w as u32);
            gemv.launch(&kernels, &stream, None)?;
        }
        kernels.set_timeline_label(fetchahead::device_abi::timeline::NO_LABEL);
        if let Some(plan) = plan {
            plan.end_forward()?;
        }
        Ok(())
    };
    let cold = capture(&mut || windows(false, None))?;
    let by_hand = capture(&mut || windows(true, None))?;
    let planned = capture(&mut || windows(false, Some(&mut plan)))?;
    // The readers' summed span over the windows, median of replays.
    let readers_us = |graph: &cudarc::driver::CudaGraph| -> Result<f64> {
        let mut sums = Vec::new();
        for _ in 0..9 {
            kernels.take_timeline()?;
            graph.launch().map_err(cuda("cuGraphLaunch"))?;
            let capture = kernels.take_timeline()?;
            let mut span = [(u64::MAX, 0u64); WINDOWS];
            for r in &capture.records {
                let name = fetchahead::timeline::trace::kernel_name(r.kernel);
                if let (true, Some(s)) = (name.starts_with("gemv"), span.get_mut(r.label as usize))
                {
                    *s = (s.0.min(r.start_ns), s.1.max(r.end_ns));
                }
            }
            assert!(
                span.iter().all(|s| s.1 > 0),
                "a window's reader was not recorded"
            );
            sums.push(span.iter().map(|(a, b)| (b - a) as f64 / 1e3).sum::<f64>());
        }
        sums.sort_by(f64::total_cmp);
        Ok(sums[sums.len() / 2])
    };
    let (cold_us, hand_us, plan_us) = (
        readers_us(&cold)?,
        readers_us(&by_hand)?,
        readers_us(&planned)?,
    );
    kernels.disable_timeline();
    println!(
        "readers over {WINDOWS} replayed windows: cold {cold_us:.2} us, warmed by hand \
         {hand_us:.2} us, with the plan {plan_us:.2} us"
    );
    assert!(
        hand_us < 0.9 * cold_us,
        "the hand-warmed readers ({hand_us:.2} us) should be clearly faster than cold \
         ({cold_us:.2} us): the test's weights are not cold"
    );
    assert!(
        plan_us <= 1.10 * hand_us,
        "with the plan the replayed readers took {plan_us:.2} us, more than 10% over the \
         hand-warmed {hand_us:.2} us (cold {cold_us:.2} us)"
    );
    Ok(())
}

/// A partitioned `l2_prefetch_loads` launch with a tail read once, run twice: the launch's last
/// block leaves all four claim counters zero for the next, the tail's too. Run under
/// `compute-sanitizer --tool memcheck` as well.
fn a_partitioned_read_with_a_once_tail_leaves_its_claims_zero() -> Result<()> {
    let Some((kernels, stream, _lock)) =
        open("a_partitioned_read_with_a_once_tail_leaves_its_claims_zero")?
    else {
        return Ok(());
    };
    let cuda = |call: &'static str| move |source| Error::Cuda { call, source };
    let bytes = 6 * MIB;
    let buffer = stream
        .alloc_zeros::<u8>(bytes as usize)
        .map_err(cuda("cuMemAlloc"))?;
    let base = {
        use cudarc::driver::DevicePtr;
        buffer.device_ptr(&stream).0
    };
    // Half the SMs in each partition, whatever the device has.
    let mut map = [0u8; fetchahead::device_abi::params::MAX_SMS];
    map.iter_mut()
        .enumerate()
        .for_each(|(sm, p)| *p = (sm % 2) as u8);
    let pieces: Vec<Segment> = (0..bytes / SEGMENT_PIECE)
        .map(|i| seg(base + i * SEGMENT_PIECE, SEGMENT_PIECE))
        .collect();
    let table = SegmentTable::upload_with(&stream, &pieces, Some(&map))?;
    let (partitions, claims) = table.partitioned();
    assert!(partitions != 0 && claims != 0);
    let sms = kernels.gpu().multiprocessors;
    let (blocks, threads) = l2_prefetch::launch_shape(
        l2_prefetch::LOADS_VARIANT,
        table.len() as u32,
        sms,
        l2_prefetch::DEFAULT_MAX_BLOCKS,
        l2_prefetch::DEFAULT_THREADS,
    );
    let jobs = table.len() as u32 * 4;
    for once in [jobs / 2, jobs, 1] {
        let p = fetchahead::device_abi::params::PrefetchParams {
            segments: table.address(),
            n: table.len() as u64,
            chunk: l2_prefetch::DEFAULT_CHUNK,
            once_jobs: once,
            partitions,
            claims,
            timeline: fetchahead::device_abi::params::TimelineParams::OFF,
        };
        // SAFETY: the table's pieces lie in `buffer`, its map and claims are its own, alive
        // past the sync; launches on one stream, one at a time.
        unsafe {
            kernels.launch_l2_prefetch(
                stream.cu_stream(),
                l2_prefetch::LOADS_VARIANT,
                p,
                blocks,
                threads,
            )
        }?;
    }
    let words = stream.alloc_zeros::<u32>(4).map_err(cuda("cuMemAlloc"))?;
    let words_at = {
        use cudarc::driver::DevicePtr;
        words.device_ptr(&stream).0
    };
    // SAFETY: the claims are 16 bytes of the table's allocation; `words` holds 16 bytes.
    unsafe {
        fetchahead::driver::memory::memcpy_dtod_async(words_at, claims, 16, stream.cu_stream())
    }?;
    let left = stream.clone_dtoh(&words).map_err(cuda("cuMemcpyDtoH"))?;
    stream.synchronize().map_err(cuda("cuStreamSynchronize"))?;
    assert_eq!(left, [0, 0, 0, 0], "claims after the launches");
    Ok(())
}

/// The plan's L2 partition map (`l2_plan::partitions`): every SM is probed, and a device found
/// to have two partitions has SMs in both, the far ones clearly slower to hit lines SM 0 read.
fn measures_the_l2_partitions_of_every_sm() -> Result<()> {
    let Some((kernels, stream, _lock)) = open("measures_the_l2_partitions_of_every_sm")? else {
        return Ok(());
    };
    let map = fetchahead::l2_plan::partitions::Partitions::measure(&kernels, &stream)?;
    println!("{map}");
    let sms = kernels.gpu().multiprocessors as usize;
    assert_eq!(map.cycles.len(), sms);
    assert!(
        map.cycles.iter().all(|&c| c > 0),
        "SMs without a probe block: {:?}",
        map.cycles
    );
    assert_eq!(map.of_sm[0], 0, "SM 0 is near itself");
    if map.two {
        let (near, far) = map.sizes();
        assert!(near > 0 && far > 0, "{near} near, {far} far");
    }
    let plan = L2Plan::new(
        kernels.product().clone(),
        stream.clone(),
        PlanConfig::for_l2(kernels.gpu().l2_bytes),
    )?;
    assert_eq!(
        plan.partitions().is_some(),
        map.two,
        "the plan measures the same map"
    );
    Ok(())
}

common::harness::tests! {
    cpu: [
        reads_its_settings_from_the_environment,
        learns_windows_in_consumption_order,
        trims_each_window_to_the_budget,
        cuts_large_weights_into_pieces,
        keeps_only_the_aligned_part_and_refuses_null,
        relearns_until_captured_then_freezes,
        a_forward_without_collectives_never_replaces_a_plan,
        counts_mismatches_at_capture_and_forwards_without_a_plan,
        refuses_misuse,
        default_budget_follows_the_l2_size,
        reads_windows_in_up_to_a_third_of_l2_by_default,
        loads_launch_four_blocks_a_segment_up_to_one_an_sm,
        captured_windows_take_the_copies_on_a_third_of_the_sms,
        reads_the_tail_of_a_window_too_large_for_two_copies_once,
    ],
    gpu: [
        gemv_matches_the_cpu_reference,
        gemv_refuses_bad_shapes,
        forward_is_bit_identical_with_prefetch_eager,
        caps_each_window_to_what_its_prefetch_issues_within_it,
        a_stale_plan_keeps_outputs_exact,
        leaves_windows_cold_while_the_gpu_keeps_up_with_the_host,
        forward_is_bit_identical_with_prefetch_in_a_graph,
        a_replayed_plan_brings_readers_near_hand_warmed,
        measures_the_l2_partitions_of_every_sm,
        a_partitioned_read_with_a_once_tail_leaves_its_claims_zero,
        prefetch_kernel_runs_clean,
    ],
}
