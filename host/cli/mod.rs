//! The `fetchahead` command line: one module per subcommand, and [`main`], which the binary
//! (`host/main.rs`) and the Python wheel's `fetchahead` command (`python -m fetchahead`) both
//! run, so that there is one CLI.
use std::ffi::OsString;
use std::io::Write as _;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench_io;
mod check;
mod demo;
mod inspect;
mod kernels;
mod make_table;
pub(crate) mod trace;
mod tune;

#[derive(Parser)]
#[command(
    name = "fetchahead",
    version,
    about = "Gets bytes to the GPU before the kernels that need them start"
)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
}

/// Runs the command line `args` (the program name first) and returns its exit status: 0, 1 for
/// a failure (printed as `error: ...`), 2 for a usage error (clap's). Prints `--help` and
/// `--version` itself rather than exiting the process.
pub fn main(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> u8 {
    crate::logging::init_stderr();
    let code = match Args::try_parse_from(args) {
        Ok(args) => match run(args.command.unwrap_or_default()) {
            Ok(code) => {
                if code == ExitCode::SUCCESS {
                    0
                } else {
                    1
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                1
            }
        },
        Err(e) => {
            let _ = e.print();
            e.exit_code().clamp(0, 255) as u8
        }
    };
    let _ = std::io::stdout().flush();
    code
}

/// The prefetcher modes the demo runs when given no option (the test that every surface
/// defaults alike reads them).
pub fn demo_defaults() -> (crate::Completion, crate::Join) {
    let args = demo::DemoArgs::default();
    (args.completion.into(), args.join.into())
}

#[derive(Subcommand)]
pub enum Command {
    /// What this build is and what it finds here: version, git commit, embedded archs, the
    /// device and the PTX it loads, default variants, read paths, every FETCHAHEAD_* setting.
    Info {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
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
        Command::Info { json } => {
            let report = crate::info::report();
            if json {
                println!("{report:#}");
            } else {
                print!("{}", crate::info::render(&report));
            }
            Ok(ExitCode::SUCCESS)
        }
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
