//! The demo's decode-step section: the DeepSeek-scale decode step of
//! [`crate::decode_step`] on the demo's own row-store table, in every configuration (neither
//! feature, the Engram prefetcher only, the L2 plan only, both, and the floors), eager and
//! replayed from a CUDA graph; the outputs compared across them; the DGX Spark projection.
use std::sync::Arc;
use std::time::Instant;

use crate::LabKernels;
use crate::decode_step::{
    self, DECODE_LEAD_IN_US, DecodeShape, DecodeStep, DecodeWeights, GB10, Run, SparkModel,
    StepConfig, model_windows, reader_times, report, spark_lines,
};
use crate::forward::LayerTable;
use crate::trace::{TRACED, trace_decode_step};
use fetchahead::kernels::gpu::Gpu;
use fetchahead::timeline::DEFAULT_CAPACITY;
use fetchahead::{Error, Result};
use rand::rngs::SmallRng;

use super::{DemoArgs, token_stream};

/// Cold and warm runs of each reader matrix for the projection.
const READER_REPS: usize = 25;

/// The decode step the demo runs: DeepSeek-V3's, with the demo's hash. The demo table's Engram
/// layers sit at the step's Engram layers (2 and 15) when there are as many; otherwise at the
/// demo's own layer numbers.
fn shape(args: &DemoArgs) -> DecodeShape {
    let deepseek = DecodeShape::deepseek();
    let demo_layers = args.engram_layer_ids();
    let engram_layers = if demo_layers.len() == deepseek.engram_layers.len() {
        deepseek.engram_layers.clone()
    } else {
        demo_layers
    };
    DecodeShape {
        engram_layers,
        heads: args.heads,
        ngram: args.ngram,
        ..deepseek
    }
}

/// Without a GPU: the step's sizes, the projection's model, and what was skipped.
pub fn skipped(args: &DemoArgs) {
    let shape = shape(args);
    println!();
    match shape.schedule() {
        Ok(windows) => shape
            .describe(&windows)
            .iter()
            .for_each(|l| println!("{l}")),
        Err(e) => println!("decode step: {e}"),
    }
    println!(
        "skipped: the decode step's timings, its output comparison and the {} projection made \
         from them (they need a CUDA device). The projection's model:",
        GB10.name
    );
    for line in SparkModel::assumptions(&GB10) {
        println!("  {line}");
    }
}

/// Runs the section; false when outputs differed or lookups failed. A shape the demo's options
/// make impossible (Engram layers past the step's 61) is reported and skipped.
pub fn run(
    args: &DemoArgs,
    gpu: &Gpu,
    kernels: &Arc<LabKernels>,
    tables: &[Arc<dyn LayerTable>],
    rng: &mut SmallRng,
) -> Result<bool> {
    let shape = shape(args);
    println!("\n== decode step at DeepSeek scale: what fetchahead buys per step");
    let windows = match shape.schedule() {
        Ok(w) => w,
        Err(e) => {
            println!("decode step skipped: {e}");
            return Ok(true);
        }
    };
    for line in shape.describe(&windows) {
        println!("{line}");
    }
    println!(
        "the demo table's Engram layers {:?} are the step's layers {:?}",
        args.engram_layer_ids(),
        shape.engram_layers
    );
    let cuda = |call: &'static str| move |source| Error::Cuda { call, source };
    let setup = gpu.ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
    let t = Instant::now();
    let weights = Arc::new(DecodeWeights::new(kernels, &setup, &shape)?);
    println!(
        "weights: {:.2} GiB written in {:.1} s; lookups through the demo's row store as \
         configured above; {} timed steps per configuration, each behind a {} ms lead-in",
        weights.bytes() as f64 / (1u64 << 30) as f64,
        t.elapsed().as_secs_f64(),
        args.steps,
        DECODE_LEAD_IN_US / 1000
    );
    let times = reader_times(
        kernels,
        &setup,
        &weights,
        shape.collective_writes,
        READER_REPS,
    )?;
    let main = gpu.ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
    let mut step = match DecodeStep::new(kernels.clone(), main, tables, shape.clone(), weights) {
        Ok(step) => step,
        Err(e @ Error::Invalid { .. }) => {
            println!("decode step skipped: {e}");
            return Ok(true);
        }
        Err(e) => return Err(e),
    };
    step.warm_plan()?;
    let check_tokens = token_stream(rng, shape.tokens as usize);
    let tokens = shape.tokens as usize;
    let sweep = decode_step::sweep(
        &mut step,
        StepConfig::ALL,
        &check_tokens,
        &mut None,
        |case| {
            // One untimed step first (a graph's first launch, the lane's first lookup).
            case.timed(&token_stream(rng, tokens), &mut Run::default())?;
            let mut run = Run::default();
            for _ in 0..args.steps {
                case.timed(&token_stream(rng, tokens), &mut run)?;
            }
            Ok(run)
        },
    );
    println!(
        "step = GPU ms behind the lead-in (the CPU's enqueue apart, in ms); saves = against \
         neither; Engram stall = step minus its floor (rows resident, same plan setting), as a \
         share of the step's lookup time"
    );
    for graph in [false, true] {
        for line in report("demo", graph, &sweep.runs) {
            println!("{line}");
        }
    }
    for f in &sweep.failures {
        println!("FAILED: {f}");
    }
    println!(
        "outputs (every reader's and Engram layer's, same tokens) bit-identical across the \
         configurations, eager and graph: {}",
        if sweep.differences.is_empty() {
            "yes".to_string()
        } else {
            format!("NO: {}", sweep.differences.join("; "))
        }
    );
    for line in SparkModel::assumptions(&GB10) {
        println!("{line}");
    }
    let model = model_windows(&step);
    for graph in [false, true] {
        for line in spark_lines("demo", graph, &sweep.runs, &model, &times)? {
            println!("{line}");
        }
    }
    if let Some(out) = &args.timeline {
        let trace = trace_decode_step(&mut step, &TRACED, 1, DEFAULT_CAPACITY)?;
        crate::cli::trace::write(&trace, out, args.force)?;
    }
    Ok(sweep.passed() && step.engram_stats().lookup_errors == 0)
}
