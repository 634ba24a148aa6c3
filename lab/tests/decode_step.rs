//! The simulated decode step: its schedule and Spark projection on the CPU, and on the GPU a
//! small step whose outputs are bit-identical across every configuration, eager and replayed.
mod common;
#[path = "../../tests/common/counting_alloc.rs"]
mod counting_alloc;
use std::sync::Arc;

use counting_alloc::allocations;
use cudarc::driver::DevicePtr;
use fetchahead::kernels::gpu::Gpu;
use fetchahead::l2_plan::default_budget;
use fetchahead::prefetch::lookup::MemoryRows;
use fetchahead::{Error, Result};
use fetchahead_lab::LabKernels;
use fetchahead_lab::decode_step::{
    DecodeShape, DecodeStep, DecodeWeights, GB10, Matrix, MeasuredStep, ModelWindow, ReaderTime,
    Run, SparkModel, StepConfig, StepOutputs, WindowRole, sweep,
};
use fetchahead_lab::forward::LayerTable;

fn the_deepseek_schedule_holds_the_origin_storys_windows() {
    let shape = DecodeShape::deepseek();
    let windows = shape.schedule().unwrap();
    let all_reduces = windows.iter().filter(|w| w.role.is_all_reduce()).count();
    let gathers = windows
        .iter()
        .filter(|w| w.role == WindowRole::Gather)
        .count();
    assert_eq!((all_reduces, gathers), (89, 49));
    let total: u64 = windows.iter().map(|w| w.ns).sum();
    assert!(
        total.abs_diff(3_600_000) < 1_000,
        "{total} ns in collectives"
    );
    for l in 1..=shape.layers {
        let attention = windows
            .iter()
            .filter(|w| w.layer == l && w.role == WindowRole::Attention)
            .count();
        assert_eq!(attention, 1, "layer {l}");
    }
    assert!(windows.windows(2).all(|p| p[0].layer <= p[1].layer));
    assert_eq!(windows, shape.schedule().unwrap(), "deterministic per seed");
    let reseeded = DecodeShape {
        seed: 18,
        ..shape.clone()
    };
    assert_ne!(windows, reseeded.schedule().unwrap());
    // Every reader's weights are far larger than an H200's L2 over the step.
    let bytes: u64 = windows
        .iter()
        .map(|w| shape.readers(w.role).iter().map(Matrix::bytes).sum::<u64>())
        .sum();
    assert!(bytes > 40 * (60 << 20), "{bytes} bytes a step");
    assert_eq!(shape.describe(&windows).len(), 2);
}

fn bad_shapes_are_errors_not_panics() {
    let good = DecodeShape::deepseek();
    let bad = [
        DecodeShape {
            layers: 0,
            ..good.clone()
        },
        DecodeShape {
            all_reduces: 10,
            ..good.clone()
        },
        DecodeShape {
            tokens: 17,
            ..good.clone()
        },
        DecodeShape {
            spread: (0.0, 1.0),
            ..good.clone()
        },
        DecodeShape {
            spread: (1.0, f64::NAN),
            ..good.clone()
        },
        DecodeShape {
            collectives_us: 0,
            ..good.clone()
        },
        DecodeShape {
            after_moe: vec![],
            ..good.clone()
        },
        DecodeShape {
            after_gather: vec![Matrix {
                name: "odd",
                rows: 15,
                k: 64,
            }],
            ..good.clone()
        },
    ];
    for shape in bad {
        assert!(shape.schedule().is_err(), "{shape:?}");
    }
}

fn the_spark_projection_follows_its_model() {
    let m = Matrix {
        name: "w",
        rows: 1024,
        k: 4096,
    };
    let bytes = m.bytes() as f64; // 8 MiB
    let times = [ReaderTime {
        matrix: m,
        cold_us: 9.0,
        warm_us: 6.0,
        replay_cold_us: 8.0,
        replay_warm_us: 6.0,
        replay_prefetched_us: 6.5,
        replay_collective_us: [20.0; 3],
    }];
    // Two 30 us windows; 4 MiB of each warmed here.
    let windows: Vec<ModelWindow> = (0..2)
        .map(|_| ModelWindow {
            ns: 30_000,
            readers: vec![m],
            warmed_here: 4 << 20,
        })
        .collect();
    // Here: the ideal saving is 2 x 3 us x 4/8 = 3 us; the plan saved 1.5 us: half.
    let measured = MeasuredStep {
        floor: 8.0,
        floor_plan: 8.0 - 0.0015,
        floor_hand: f64::NAN,
        neither: 10.0,
        prefetcher: 9.0,
        plan: 10.0 - 0.0015,
        both: 9.0 - 0.0015,
    };
    let p = SparkModel::project(GB10, &windows, &times, measured, false).unwrap();
    let bw = GB10.dram_bytes_per_s;
    assert!((p.share_of_ideal() - 0.5).abs() < 1e-6);
    assert!((p.share_of_eager_ideal() - 0.5).abs() < 1e-6);
    // Replayed: the ideal from the replayed times, 2 x 2 us x 4/8 = 2 us; 1.5 us is 0.75 of it
    // and still 0.5 of the eager ideal.
    let g = SparkModel::project(GB10, &windows, &times, measured, true).unwrap();
    assert!(
        (g.ideal_here_ms - 0.002).abs() < 1e-9,
        "{}",
        g.ideal_here_ms
    );
    assert!((g.share_of_ideal() - 0.75).abs() < 1e-6);
    assert!((g.share_of_eager_ideal() - 0.5).abs() < 1e-6);
    assert_eq!(p.budget, default_budget(24 << 20));
    assert!((p.realized - 0.5).abs() < 1e-6, "{}", p.realized);
    let shift_ms = 2.0 * (6.0 + bytes / bw * 1e6 - 9.0) / 1e3;
    assert!((p.neither - (10.0 + shift_ms)).abs() < 1e-9);
    // The 12 MiB cap and 30 us x 1.25 at 273 GB/s (10.2 MB) are both more than the window's
    // 8 MiB: each window warms its whole weight.
    assert_eq!(p.budget, 12 << 20);
    assert_eq!(p.warmed, 2 * m.bytes());
    let saved_ms = 0.5 * 2.0 * m.bytes() as f64 / bw * 1e3;
    assert!((p.neither - p.plan - saved_ms).abs() < 1e-9);
    assert!((p.neither - p.prefetcher - 1.0).abs() < 1e-9);
    assert!((p.plan - p.both - 1.0).abs() < 1e-9);
    // A window shorter than its prefetch is cut to what fits.
    let short = [ModelWindow {
        ns: 2_000,
        readers: vec![m],
        warmed_here: 0,
    }];
    let p = SparkModel::project(GB10, &short, &times, measured, false).unwrap();
    assert!(
        p.warmed.abs_diff((1.25 * 2e-6 * bw) as u64) <= 1,
        "{}",
        p.warmed
    );
    // A reader without a measured time is an error.
    let other = Matrix { rows: 16, ..m };
    let missing = [ModelWindow {
        ns: 2_000,
        readers: vec![other],
        warmed_here: 0,
    }];
    assert!(SparkModel::project(GB10, &missing, &times, measured, false).is_err());
    assert!(SparkModel::assumptions(&GB10).len() >= 4);
}

fn outputs_name_their_first_difference() {
    let a = StepOutputs {
        readers: vec![vec![1, 2], vec![3]],
        engram: vec![vec![4]],
    };
    assert_eq!(a.first_difference(&a.clone()), None);
    let mut b = a.clone();
    b.readers[1][0] = 9;
    assert_eq!(a.first_difference(&b).as_deref(), Some("reader 1's output"));
    let mut c = a.clone();
    c.engram[0][0] = 9;
    assert_eq!(
        a.first_difference(&c).as_deref(),
        Some("Engram layer 0's rows")
    );
}

/// A small step: 3 layers, 4 all-reduces and 2 all-gathers, small readers.
fn small_shape() -> DecodeShape {
    let m = |name, rows, k| Matrix { name, rows, k };
    DecodeShape {
        layers: 3,
        all_reduces: 4,
        all_gathers: 2,
        collectives_us: 60,
        compute_us: 20,
        tokens: 4,
        engram_layers: vec![1, 3],
        seed: 5,
        after_gather: vec![m("g", 64, 512)],
        after_attention: vec![m("a0", 32, 256), m("a1", 48, 512)],
        after_moe: vec![m("m", 128, 256)],
        ..DecodeShape::deepseek()
    }
}

/// Every configuration, eager and replayed from a graph (the one sweep the demo and the bench
/// run), gives the same outputs bit for bit, run after run, and every output was written
/// (poisoned before).
fn a_small_steps_outputs_are_bit_identical_across_configurations() -> Result<()> {
    let Some(gpu) = Gpu::for_test("a_small_steps_outputs_are_bit_identical_across_configurations")?
    else {
        return Ok(());
    };
    let kernels = Arc::new(LabKernels::load(&gpu)?);
    // SAFETY: every launch of this test passes raw addresses taken at creation.
    unsafe { gpu.ctx.disable_event_tracking() };
    let cuda = |call: &'static str| move |source| Error::Cuda { call, source };
    let shape = small_shape();
    let stream = gpu.ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
    let weights = Arc::new(DecodeWeights::new(&kernels, &stream, &shape)?);
    let tables: Vec<Arc<dyn LayerTable>> = (0..2)
        .map(|seed| Ok(Arc::new(MemoryRows::generate(4096, 256, seed)?) as Arc<dyn LayerTable>))
        .collect::<Result<_>>()?;
    let tokens = [3, 1, 4, 1];
    // The same outputs whether or not the collectives write their readers' activations.
    let mut reference = None;
    for collective_writes in [true, false] {
        let shape = DecodeShape {
            collective_writes,
            ..shape.clone()
        };
        let mut step = DecodeStep::new(
            kernels.clone(),
            stream.clone(),
            &tables,
            shape,
            weights.clone(),
        )?;
        step.warm_plan()?;
        let sweep = sweep(
            &mut step,
            StepConfig::ALL,
            &tokens,
            &mut reference,
            |case| {
                let name = case.name();
                let mut first: Option<StepOutputs> = None;
                for run in 0..2 {
                    let got = case.checked(&tokens)?;
                    assert!(
                        got.readers.iter().all(|y| y.iter().all(|&v| v != u32::MAX)),
                        "{name} run {run}: a reader output was not written"
                    );
                    assert!(
                        got.engram.iter().all(|r| r.iter().all(|&v| v != u16::MAX)),
                        "{name} run {run}: an Engram row was not written"
                    );
                    match &first {
                        None => first = Some(got),
                        Some(want) => {
                            assert_eq!(want.first_difference(&got), None, "{name} run {run}")
                        }
                    }
                }
                Ok(Run::default())
            },
        );
        assert!(sweep.failures.is_empty(), "{:?}", sweep.failures);
        assert!(
            sweep.differences.is_empty(),
            "collective writes {collective_writes}: {:?}",
            sweep.differences
        );
        assert_eq!(sweep.runs.len(), 2 * StepConfig::ALL.len());
        let counters = step.plan().counters();
        assert!(counters.windows_prefetched > 0, "{counters:?}");
        assert_eq!(counters.mismatches_at_capture, 0, "{counters:?}");
        assert_eq!(step.engram_stats().lookup_errors, 0);
    }
    Ok(())
}

/// The simulated collective's write of its result (the readers' activations, rewritten in
/// place) leaves every byte as it was, over 1-8 blocks and outputs from one word to more than
/// the grid covers in one pass; an output it cannot write is refused before any launch.
fn a_collectives_write_leaves_its_output_as_it_was() -> Result<()> {
    let Some(gpu) = Gpu::for_test("a_collectives_write_leaves_its_output_as_it_was")? else {
        return Ok(());
    };
    let kernels = LabKernels::load(&gpu)?;
    let cuda = |call: &'static str| move |source| Error::Cuda { call, source };
    let stream = gpu.ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
    let bytes: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let buffer = stream.clone_htod(&bytes).map_err(cuda("cuMemcpyHtoD"))?;
    let at = buffer.device_ptr(&stream).0;
    let s = stream.cu_stream();
    for (blocks, len) in [(1, 16), (4, 112 << 10), (3, 4096 + 16), (8, 300_000)] {
        // SAFETY: `buffer` is this test's own allocation of 300,000 bytes, used by nothing else
        // until the copy back below, on the same stream.
        unsafe { kernels.launch_collective_writing(s, blocks, 1_000, 0, (at, len)) }?;
    }
    let back = stream.clone_dtoh(&buffer).map_err(cuda("cuMemcpyDtoH"))?;
    stream.synchronize().map_err(cuda("cuStreamSynchronize"))?;
    assert!(back == bytes, "the collective changed its output");
    for bad in [(at + 8, 64), (at, 24), (0, 16), (at, 0)] {
        // SAFETY: refused before any launch (the assertion checks it).
        let launched = unsafe { kernels.launch_collective_writing(s, 2, 1_000, 0, bad) };
        assert!(launched.is_err(), "{bad:?} was accepted");
    }
    Ok(())
}

/// The step table from synthetic runs: every configuration's line, the goal line and the
/// plan's saving lines, without a device.
fn the_report_reads_every_configuration() {
    use fetchahead_lab::decode_step::{Run, Runs, report, spark_lines};
    use fetchahead_lab::forward::StepTime;
    let mut runs = Runs::new();
    let base = |c: StepConfig| match c {
        StepConfig::Floor => 47.0,
        StepConfig::FloorPlan => 46.7,
        StepConfig::FloorHand => 46.6,
        StepConfig::Neither => 49.0,
        StepConfig::Prefetcher => 47.01,
        StepConfig::Plan => 48.7,
        StepConfig::Both => 46.71,
    };
    for c in StepConfig::ALL {
        for graph in [false, true] {
            let mut run = Run::default();
            for i in 0..20 {
                let t = StepTime {
                    gpu_ms: base(c) + 0.001 * (i % 3) as f64,
                    enqueue_ms: 2.0,
                    lead_in_overrun: false,
                };
                let lookup = if c.gather() == fetchahead_lab::forward::GatherPath::Resident {
                    0.0
                } else {
                    1.8
                };
                run.record(t, lookup, lookup / 2.0, 1.4);
            }
            runs.insert((graph, c), run);
        }
    }
    let lines = report("cold", false, &runs);
    lines.iter().for_each(|l| println!("{l}"));
    assert_eq!(lines.len(), 2 + 7 + 1 + 4, "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("goal, both on") && l.contains("met"))
    );
    assert!(
        lines
            .iter()
            .filter(|l| l.contains("L2 plan with") && l.contains(": measurable"))
            .count()
            == 3,
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("warmed by hand") && l.contains(": measurable")),
        "{lines:#?}"
    );
    let m = Matrix {
        name: "w",
        rows: 1024,
        k: 4096,
    };
    let times = [ReaderTime {
        matrix: m,
        cold_us: 9.0,
        warm_us: 6.0,
        replay_cold_us: 8.0,
        replay_warm_us: 6.0,
        replay_prefetched_us: 6.5,
        replay_collective_us: [20.0; 3],
    }];
    let windows = [ModelWindow {
        ns: 30_000,
        readers: vec![m],
        warmed_here: 4 << 20,
    }];
    let lines = spark_lines("cold", true, &runs, &windows, &times).unwrap();
    lines.iter().for_each(|l| println!("{l}"));
    assert_eq!(lines.len(), 5);
    assert!(lines[1].contains("of the graph ideal") && lines[1].contains("goal 0.8"));
    assert!(lines[2].contains("warmed by hand") && lines[2].contains("ideal of whole readers"));
    assert!(lines[4].contains("origin story's +7%"));
    // No runs: a line saying so, no panic.
    assert_eq!(report("cold", false, &Runs::new()).len(), 1);
}

/// The decode step's own hot path allocates nothing once warm: an eager step's enqueue of the
/// readers, collectives, spin compute, resident gathers and the plan's replay (the floors; the
/// lookup paths are the prefetcher's).
fn a_warm_steps_enqueue_allocates_nothing() -> Result<()> {
    let Some(gpu) = Gpu::for_test("a_warm_steps_enqueue_allocates_nothing")? else {
        return Ok(());
    };
    let kernels = Arc::new(LabKernels::load(&gpu)?);
    let cuda = |call: &'static str| move |source| Error::Cuda { call, source };
    let shape = small_shape();
    let stream = gpu.ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
    let weights = Arc::new(DecodeWeights::new(&kernels, &stream, &shape)?);
    let tables: Vec<Arc<dyn LayerTable>> = (0..2)
        .map(|seed| Ok(Arc::new(MemoryRows::generate(4096, 256, seed)?) as Arc<dyn LayerTable>))
        .collect::<Result<_>>()?;
    let mut step = DecodeStep::new(kernels.clone(), stream.clone(), &tables, shape, weights)?;
    step.warm_plan()?;
    for config in [StepConfig::Floor, StepConfig::FloorPlan] {
        step.enqueue(config)?;
        stream.synchronize().map_err(cuda("cuStreamSynchronize"))?;
        let before = allocations();
        step.enqueue(config)?;
        let allocated = allocations() - before;
        stream.synchronize().map_err(cuda("cuStreamSynchronize"))?;
        assert_eq!(
            allocated, 0,
            "{config:?}: {allocated} allocations in a warm enqueue"
        );
    }
    Ok(())
}

common::harness::tests! {
    cpu: [
        the_deepseek_schedule_holds_the_origin_storys_windows,
        bad_shapes_are_errors_not_panics,
        the_spark_projection_follows_its_model,
        outputs_name_their_first_difference,
        the_report_reads_every_configuration,
    ],
    gpu: [
        a_small_steps_outputs_are_bit_identical_across_configurations,
        a_warm_steps_enqueue_allocates_nothing,
        a_collectives_write_leaves_its_output_as_it_was,
    ],
}
