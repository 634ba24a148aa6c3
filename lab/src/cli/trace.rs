//! `fetchahead-lab trace --out FILE.json`: a short simulated decode step (rows resident, the L2 plan
//! off and on, eager and replayed from a graph) recorded on the device timeline and written as a
//! Chrome trace that Perfetto (ui.perfetto.dev) opens.
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use crate::LabKernels;
use crate::decode_step::{DecodeStep, DecodeWeights};
use crate::trace::{TRACED, memory_tables, short_shape, trace_decode_step};
use clap::Args;
use fetchahead::kernels::gpu::Gpu;
use fetchahead::timeline::{DEFAULT_CAPACITY, Trace};
use fetchahead::{Error, Result};

#[derive(Args, Clone, Debug)]
pub struct TraceArgs {
    /// The Chrome trace JSON to write (not replaced unless --force).
    #[arg(long)]
    pub out: PathBuf,
    /// Replace --out if it exists (never through a symlink).
    #[arg(long)]
    pub force: bool,
    /// Layers of the DeepSeek-scale step to run (its collectives scaled with them).
    #[arg(long, default_value_t = 4)]
    pub layers: u32,
    /// Steps recorded per configuration and mode.
    #[arg(long, default_value_t = 1)]
    pub steps: usize,
}

pub fn run(args: &TraceArgs) -> Result<ExitCode> {
    if args.steps == 0 {
        return Err(Error::invalid("--steps", "0 steps; want at least 1"));
    }
    let gpu = match Gpu::open(0) {
        Ok(gpu) => gpu,
        Err(Error::NoDevice(why)) => {
            println!("trace: the timeline is recorded on a CUDA device, and there is none: {why}");
            return Ok(ExitCode::FAILURE);
        }
        Err(e) => return Err(e),
    };
    let kernels = Arc::new(LabKernels::load(&gpu)?);
    let shape = short_shape(args.layers);
    let cuda = |call: &'static str| move |source| Error::Cuda { call, source };
    let stream = gpu.ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
    let weights = Arc::new(DecodeWeights::new(&kernels, &stream, &shape)?);
    let tables = memory_tables(&shape, 1 << 14)?;
    let mut step = DecodeStep::new(kernels, stream, &tables, shape.clone(), weights)?;
    let trace = trace_decode_step(&mut step, &TRACED, args.steps, DEFAULT_CAPACITY)?;
    write(&trace, &args.out, args.force)?;
    println!(
        "trace: {} layers, {} windows; {} blocks recorded",
        shape.layers,
        shape.all_reduces + shape.all_gathers,
        trace.records()
    );
    Ok(ExitCode::SUCCESS)
}

/// Writes `trace` to `out` and says what it holds and lost (the demo and the bench share it).
pub fn write(trace: &Trace, out: &Path, force: bool) -> Result<()> {
    trace.write(out, force)?;
    for (step, lost, unfinished) in trace.losses() {
        if lost > 0 || unfinished > 0 {
            println!(
                "trace: {step}: {lost} blocks lost to the ring's wrap, {unfinished} unfinished \
                 (a larger ring: fewer --layers)"
            );
        }
    }
    println!(
        "trace: wrote {} (open it in ui.perfetto.dev; docs/plots/timeline_svg.py draws it)",
        out.display()
    );
    Ok(())
}
