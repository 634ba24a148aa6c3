//! `fetchahead kernels` and `fetchahead ptx --arch ARCH`.
use std::io::{self, Write};
use std::process::ExitCode;

use fetchahead::device_abi::all_kernels;
use fetchahead::kernels::ptx;

pub fn list() -> fetchahead::Result<ExitCode> {
    let about = |name: &str| {
        all_kernels()
            .find(|k| k.name == name)
            .map_or("", |k| k.about)
    };
    let mut text = String::new();
    for built in ptx::BUILT {
        let held = ptx::entries(built.text).count();
        let runs_on = if built.arch.ends_with('a') {
            "exactly that arch"
        } else {
            "that arch and newer"
        };
        text += &format!(
            "{} ({} bytes of PTX, {held} kernels; runs on {runs_on})\n",
            built.arch,
            built.text.len()
        );
        for entry in ptx::entries(built.text) {
            text += &format!("  {entry:<28} {}\n", about(entry));
        }
        let absent: Vec<String> = all_kernels()
            .filter(|k| !built.holds(k.needs) && !k.name.ends_with("_timed"))
            .map(|k| format!("{} (sm_{})", k.name, k.needs))
            .collect();
        if !absent.is_empty() {
            text += &format!(
                "  not here, each needing the arch named (and its _timed twin): {}\n",
                absent.join(", ")
            );
        }
    }
    write_stdout(&text)
}

pub fn print_ptx(arch: &str) -> fetchahead::Result<ExitCode> {
    write_stdout(ptx::for_arch(arch)?.text)
}

/// Writes to stdout; a reader that stops early (`| head`) ends the output quietly.
fn write_stdout(text: &str) -> fetchahead::Result<ExitCode> {
    match io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => {
            eprintln!("error: writing to stdout: {e}");
            Ok(ExitCode::FAILURE)
        }
        _ => Ok(ExitCode::SUCCESS),
    }
}
