//! Subcommands, one module each.
use std::process::ExitCode;

use clap::Subcommand;

mod check;
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
}

impl Default for Command {
    fn default() -> Self {
        Command::Check(check::CheckArgs::default())
    }
}

pub fn run(command: Command) -> fetchahead::Result<ExitCode> {
    match command {
        Command::Kernels => kernels::list(),
        Command::Ptx { arch } => kernels::print_ptx(&arch),
        Command::Check(args) => check::run(&args),
    }
}
