//! Subcommands, one module each.
use std::process::ExitCode;

use clap::Subcommand;

mod check;
mod demo;
mod kernels;

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
    /// Simulated decode and prefill steps: hashed ids, side-stream prefetch, compute, gathers;
    /// GPU idle before the gathers with and without the prefetcher (the default command).
    Demo(demo::DemoArgs),
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
    }
}
