//! The `fetchahead-lab` command line (`fetchahead_lab::cli`): the demo (the default), the
//! timeline trace, and the product's commands.
use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(fetchahead_lab::cli::main(std::env::args_os()))
}
