//! `fetchahead kernels` and `fetchahead ptx --arch ARCH [--module MODULE]`, over the PTX modules
//! the running binary embeds: the product's (this crate's) and, in `fetchahead-lab`, the lab's.
use std::io::{self, Write};
use std::process::ExitCode;

use fetchahead::device_abi::{Module, all_kernels};
use fetchahead::kernels::ptx::{self, BuiltPtx};
use fetchahead::{Error, Result};

/// A PTX module a binary embeds: which one, and its PTX for each arch built.
#[derive(Clone, Copy, Debug)]
pub struct Embedded {
    pub module: Module,
    pub built: &'static [BuiltPtx],
}

/// The product's module, which every binary embeds.
pub const PRODUCT: Embedded = Embedded {
    module: Module::Product,
    built: ptx::BUILT,
};

/// Every arch of every embedded module, each module's kernels marked with its name, what the
/// arch leaves out, and the kernels of a module this binary does not embed.
pub fn list(embedded: &[Embedded]) -> Result<ExitCode> {
    let mut text = String::new();
    let archs = embedded.iter().flat_map(|e| e.built.iter().map(|b| b.arch));
    let mut seen = Vec::new();
    for arch in archs {
        if seen.contains(&arch) {
            continue;
        }
        seen.push(arch);
        for e in embedded {
            if let Some(built) = e.built.iter().find(|b| b.arch == arch) {
                text += &module_listing(e.module, built);
            }
        }
    }
    for module in Module::ALL {
        if embedded.iter().all(|e| e.module != module) {
            let names: Vec<&str> = plain_kernels(module).map(|k| k.name).collect();
            text += &format!(
                "the {} module is not in this binary ({}); its kernels: {}\n",
                module.name(),
                match module {
                    Module::Lab => "fetchahead-lab embeds and loads it",
                    Module::Product => "every fetchahead binary embeds it",
                },
                names.join(", ")
            );
        }
    }
    write_stdout(&text)
}

/// One arch's PTX of `module`: its heading, each entry marked with the module, and the kernels
/// of the module that need a newer arch.
fn module_listing(module: Module, built: &BuiltPtx) -> String {
    let about = |name: &str| {
        all_kernels()
            .find(|k| k.name == name)
            .map_or("(not in the kernel list)", |k| k.about)
    };
    let held = ptx::entries(built.text).count();
    let runs_on = if built.arch.ends_with('a') {
        "exactly that arch"
    } else {
        "that arch and newer"
    };
    let mut text = format!(
        "{} {} module ({} bytes of PTX, {held} kernels; runs on {runs_on})\n",
        built.arch,
        module.name(),
        built.text.len()
    );
    let mark = format!("[{}]", module.name());
    for entry in ptx::entries(built.text) {
        text += &format!("  {entry:<28} {mark:<9} {}\n", about(entry));
    }
    let absent: Vec<String> = plain_kernels(module)
        .filter(|k| !built.holds(k.needs))
        .map(|k| format!("{} (sm_{})", k.name, k.needs))
        .collect();
    if !absent.is_empty() {
        text += &format!(
            "  not here, each needing the arch named (and its _timed twin): {}\n",
            absent.join(", ")
        );
    }
    text
}

/// `module`'s kernels, their timed twins left out.
fn plain_kernels(module: Module) -> impl Iterator<Item = fetchahead::device_abi::Entry> {
    all_kernels().filter(move |k| k.module == module && k.twin_of.is_none())
}

/// `module`'s PTX for `arch` (`product` when not named), from what this binary embeds.
pub fn print_ptx(embedded: &[Embedded], arch: &str, module: Option<&str>) -> Result<ExitCode> {
    let name = module.unwrap_or(Module::Product.name());
    let module = Module::named(name).ok_or_else(|| {
        Error::invalid(
            "--module",
            format!("`{name}` is no PTX module; want product or lab"),
        )
    })?;
    let Some(e) = embedded.iter().find(|e| e.module == module) else {
        return Err(Error::invalid(
            "--module",
            format!(
                "this binary does not embed the {name} module (`fetchahead-lab ptx --module \
                 {name}` prints it)"
            ),
        ));
    };
    let built = e
        .built
        .iter()
        .find(|b| b.arch == arch)
        .ok_or_else(|| Error::UnknownArch {
            arch: arch.to_string(),
            built: e.built.iter().map(|b| b.arch).collect::<Vec<_>>().join(","),
        })?;
    write_stdout(built.text)
}

/// Writes to stdout; a reader that stops early (`| head`) ends the output quietly.
fn write_stdout(text: &str) -> Result<ExitCode> {
    match io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => {
            eprintln!("error: writing to stdout: {e}");
            Ok(ExitCode::FAILURE)
        }
        _ => Ok(ExitCode::SUCCESS),
    }
}
