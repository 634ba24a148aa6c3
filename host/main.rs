//! The `fetchahead` command line (`fetchahead::cli`, which the Python wheel's command runs too).
use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(fetchahead::cli::main(std::env::args_os()))
}
