//! Subcommands, one module each.
use std::process::ExitCode;

use clap::Subcommand;

mod bench_io;
mod check;
mod demo;
mod inspect;
mod kernels;
mod make_table;
pub(crate) mod trace;
mod tune;

#[derive(Subcommand)]
pub enum Command {
    /// List every kernel of every arch this build embeds.
    Kernels,
    /// Print the PTX built for one arch.
    Ptx {
        /// e.g. sm_90 or sm_121a
        #[arg(long)]
        arch: String,
    },
    /// Run every kernel against the CPU reference on this machine's GPU, with bandwidth.
    Check(check::CheckArgs),
    /// Simulated decode and prefill steps on a row-store table under --data-dir (written once):
    /// hashed ids, side-stream prefetch, compute, gathers; GPU idle before the gathers with and
    /// without the prefetcher, hit rate and IOPS (the default command).
    Demo(demo::DemoArgs),
    /// Write a generated Engram table (safetensors shards) for the row store: into an empty
    /// directory or over a table make-table wrote (replaced whole), never elsewhere without --force.
    MakeTable(make_table::MakeTableArgs),
    /// Show a table's tensors, rows, bytes, shards and row alignment to 4 KiB pages.
    Inspect(inspect::InspectArgs),
    /// Measure the read paths on this disk and write Auto's choice beside the table (mmap is
    /// measured, never chosen: a truncated shard would raise SIGBUS).
    Tune(tune::TuneArgs),
    /// Benchmark every read path cold and warm beside a raw io_uring QD64 baseline.
    BenchIo(bench_io::BenchIoArgs),
    /// Record a short simulated decode step (rows resident, the L2 plan off and on, eager and
    /// replayed from a CUDA graph) on the device timeline and write it as a Chrome trace JSON.
    Trace(trace::TraceArgs),
}

impl Default for Command {
    fn default() -> Self {
        Command::Demo(demo::DemoArgs::default())
    }
}

pub fn run(command: Command) -> fetchahead::Result<ExitCode> {
    match command {
        Command::Kernels => kernels::list(),
        Command::Ptx { arch } => kernels::print_ptx(&arch),
        Command::Check(args) => check::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::MakeTable(args) => make_table::run(&args),
        Command::Inspect(args) => inspect::run(&args),
        Command::Tune(args) => tune::run(&args),
        Command::BenchIo(args) => bench_io::run(&args),
        Command::Trace(args) => trace::run(&args),
    }
}
