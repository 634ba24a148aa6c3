//! The product's `fetchahead` command line: one module per subcommand, and [`main`], which the
//! binary (`host/main.rs`) and the Python wheel's `fetchahead` command (`python -m fetchahead`)
//! both run, so that there is one CLI. The lab's command (`fetchahead-lab`: the demo, the trace)
//! extends it: it flattens [`Command`] among its own and runs it with [`run_in`], naming the PTX
//! modules it embeds.
use std::ffi::OsString;
use std::io::Write as _;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench_io;
mod check;
mod inspect;
pub mod kernels;
mod make_table;
mod tune;

pub use kernels::{Embedded, PRODUCT};

#[derive(Parser)]
#[command(
    name = "fetchahead",
    version,
    about = "Gets bytes to the GPU before the kernels that need them start",
    arg_required_else_help = true
)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

/// Runs the command line `args` (the program name first) and returns its exit status: 0, 1 for
/// a failure (printed as `error: ...`), 2 for a usage error (clap's). Prints `--help` and
/// `--version` itself rather than exiting the process.
pub fn main(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> u8 {
    main_with(args, |a: Args| run(a.command))
}

/// [`main`] for a parser of the caller's (`A`, the lab's command line): parses `args` with it
/// and calls `run` on what it parsed, with the exit statuses and printing [`main`] describes.
pub fn main_with<A: Parser>(
    args: impl IntoIterator<Item = impl Into<OsString> + Clone>,
    run: impl FnOnce(A) -> fetchahead::Result<ExitCode>,
) -> u8 {
    crate::logging::init_stderr();
    let code = match A::try_parse_from(args) {
        Ok(args) => match run(args) {
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

#[derive(Subcommand)]
pub enum Command {
    /// What this build is and what it finds here: version, git commit, embedded archs, the
    /// device and the PTX it loads, default variants, read paths, every FETCHAHEAD_* setting.
    Info {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List every kernel of every arch and PTX module this binary embeds, marked with its module.
    Kernels,
    /// Print the PTX built for one arch.
    Ptx {
        /// e.g. sm_90 or sm_121a
        #[arg(long)]
        arch: String,
        /// The PTX module: product (the default) or lab (in fetchahead-lab).
        #[arg(long, value_name = "MODULE")]
        module: Option<String>,
    },
    /// Run every kernel against the CPU reference on this machine's GPU, with bandwidth.
    Check(check::CheckArgs),
    /// Write a generated Engram table (safetensors shards) for the row store: into an empty
    /// directory or over a table make-table wrote (replaced whole), never elsewhere without --force.
    MakeTable(make_table::MakeTableArgs),
    /// Show a table's tensors, rows, bytes, shards and row alignment to 4 KiB pages.
    Inspect(inspect::InspectArgs),
    /// Measure the read paths on this disk and write Auto's choice beside the table (mmap is
    /// measured, never chosen: a truncated shard would raise SIGBUS).
    Tune(tune::TuneArgs),
    /// Benchmark every read path cold and warm beside a raw io_uring QD64 baseline.
    BenchIo(Box<bench_io::BenchIoArgs>),
}

/// Runs `command` in the product's binary, which embeds the product's module only.
pub fn run(command: Command) -> fetchahead::Result<ExitCode> {
    run_in(command, &[PRODUCT])
}

/// Runs `command` in a binary that embeds the PTX modules `embedded` (`fetchahead kernels` and
/// `fetchahead ptx` read them).
pub fn run_in(command: Command, embedded: &[Embedded]) -> fetchahead::Result<ExitCode> {
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
        Command::Kernels => kernels::list(embedded),
        Command::Ptx { arch, module } => kernels::print_ptx(embedded, &arch, module.as_deref()),
        Command::Check(args) => check::run(&args),
        Command::MakeTable(args) => make_table::run(&args),
        Command::Inspect(args) => inspect::run(&args),
        Command::Tune(args) => tune::run(&args),
        Command::BenchIo(args) => bench_io::run(&args),
    }
}
