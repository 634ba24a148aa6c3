//! The `fetchahead-lab` command line: the lab's commands (the demo, its default, and the trace)
//! and every command of the product's `fetchahead` (`fetchahead::cli`), run over both PTX
//! modules, so that `kernels` and `ptx` show the lab's too.
use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use fetchahead::cli::{Embedded, PRODUCT};
use fetchahead::device_abi::Module;

pub mod demo;
pub mod trace;

/// The PTX modules this binary embeds: the product's and the lab's.
pub const EMBEDDED: [Embedded; 2] = [
    PRODUCT,
    Embedded {
        module: Module::Lab,
        built: crate::ptx::BUILT,
    },
];

#[derive(Parser)]
#[command(
    name = "fetchahead-lab",
    version,
    about = "fetchahead's lab: the simulated forward and decode step (the demo, the default), the \
             timeline trace, and the product's commands"
)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Simulated decode and prefill steps on a row-store table under --data-dir (written once):
    /// hashed ids, side-stream prefetch, compute, gathers; GPU idle before the gathers with and
    /// without the prefetcher, hit rate and IOPS; then the DeepSeek-scale decode step (the
    /// default command).
    Demo(demo::DemoArgs),
    /// Record a short simulated decode step (rows resident, the L2 plan off and on, eager and
    /// replayed from a CUDA graph) on the device timeline and write it as a Chrome trace JSON.
    Trace(trace::TraceArgs),
    #[command(flatten)]
    Product(fetchahead::cli::Command),
}

/// Runs the command line `args` (the program name first) as [`fetchahead::cli::main`] runs the
/// product's, and returns its exit status; no command runs the demo.
pub fn main(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> u8 {
    fetchahead::cli::main_with(args, |a: Args| run(a.command.unwrap_or_default()))
}

impl Default for Command {
    fn default() -> Self {
        Command::Demo(demo::DemoArgs::default())
    }
}

fn run(command: Command) -> fetchahead::Result<ExitCode> {
    match command {
        Command::Demo(args) => demo::run(&args),
        Command::Trace(args) => trace::run(&args),
        Command::Product(command) => fetchahead::cli::run_in(command, &EMBEDDED),
    }
}

/// The prefetcher modes the demo runs when given no option: the product's defaults
/// (`PrefetcherConfig::default()`), which the demo's options take as theirs.
pub fn demo_defaults() -> (fetchahead::Completion, fetchahead::Join) {
    let args = demo::DemoArgs::default();
    (args.completion.into(), args.join.into())
}

#[cfg(test)]
mod tests {
    use fetchahead::PrefetcherConfig;

    /// The demo runs the prefetcher as an engine gets it by default (the Python and C defaults
    /// are checked against the same `PrefetcherConfig::default()` by the product's tests).
    #[test]
    fn the_demo_defaults_are_the_prefetchers() {
        let d = PrefetcherConfig::default();
        assert_eq!(super::demo_defaults(), (d.completion, d.join));
    }
}
