//! The `fetchahead` command line.
use std::process::ExitCode;

use clap::Parser;

mod cli;

#[derive(Parser)]
#[command(
    name = "fetchahead",
    version,
    about = "Gets bytes to the GPU before the kernels that need them start"
)]
struct Args {
    #[command(subcommand)]
    command: Option<cli::Command>,
}

fn main() -> ExitCode {
    fetchahead::logging::init_stderr();
    let args = Args::parse();
    match cli::run(args.command.unwrap_or_default()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
