//! With the `command` feature (which maturin turns on for the wheel, pyproject.toml): builds the
//! product's `fetchahead` command line, the binary `cargo build --features cli` makes, for this
//! build's target and profile, and leaves it at `$OUT_DIR/fetchahead`, from where maturin puts it
//! in the wheel (`fetchahead/_bin/fetchahead`, run by `fetchahead.__main__`).
//!
//! The command is its own executable, so that the extension an engine imports links none of the
//! CLI's crates (clap, indicatif). It is built by a second cargo in a target directory of its own
//! (beside this build's profile directory), with this build's linker settings (maturin's zig
//! wrapper for a manylinux wheel) and rustflags, so that it runs wherever the wheel installs.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if env::var_os("CARGO_FEATURE_COMMAND").is_none() {
        return;
    }
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest
        .parent()
        .expect("python/ sits in the repository")
        .to_path_buf();
    for watched in ["host", "gpu/src", "build.rs", "Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let target = env::var("TARGET").unwrap();
    let release = env::var("PROFILE").as_deref() == Ok("release");
    // OUT_DIR is <profile dir>/build/<package>-<hash>/out: the command's own target directory
    // sits beside the build directory, so cargo's lock on this build is not the second cargo's.
    let target_dir = out_dir
        .ancestors()
        .nth(3)
        .unwrap_or(&out_dir)
        .join("fetchahead-command");
    let started = std::time::Instant::now();
    let built = build(&root, &target_dir, &target, release);
    println!(
        "cargo:warning=fetchahead: the fetchahead command built for {target} ({:.1} s), for the \
         wheel",
        started.elapsed().as_secs_f64()
    );
    std::fs::copy(&built, out_dir.join("fetchahead")).unwrap_or_else(|e| {
        fail(&format!(
            "cannot copy {} into {}: {e}",
            built.display(),
            out_dir.display()
        ))
    });
}

/// Runs the second cargo; returns the binary's path.
fn build(root: &Path, target_dir: &Path, target: &str, release: bool) -> PathBuf {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    // The variables cargo sets for this build script describe this package, not the command's;
    // the linker, runner and rustflags settings (CARGO_TARGET_*, CARGO_ENCODED_RUSTFLAGS) and
    // CARGO_HOME are kept.
    for (key, _) in env::vars() {
        let ours = [
            "CARGO_PKG_",
            "CARGO_CFG_",
            "CARGO_FEATURE_",
            "CARGO_MANIFEST_",
            "CARGO_CRATE_",
        ]
        .iter()
        .any(|p| key.starts_with(p));
        if ours || key == "CARGO_PRIMARY_PACKAGE" || key == "CARGO_TARGET_DIR" {
            cmd.env_remove(key);
        }
    }
    cmd.current_dir(root)
        .args([
            "build",
            "--quiet",
            "-p",
            "fetchahead",
            "--bin",
            "fetchahead",
        ])
        .args(["--features", "cli", "--target", target, "--target-dir"])
        .arg(target_dir);
    if release {
        // Symbols stripped, as a command installed on PATH is (13.5 MB unstripped).
        cmd.args(["--release", "--config", "profile.release.strip=true"]);
    }
    // This script's stdout is read by cargo as directives: the second cargo's goes to stderr.
    let status = cmd
        .stdout(std::process::Stdio::from(std::io::stderr()))
        .status()
        .unwrap_or_else(|e| fail(&format!("cannot run cargo for the fetchahead command: {e}")));
    if !status.success() {
        fail("the build of the fetchahead command failed (its output is above)");
    }
    let profile = if release { "release" } else { "debug" };
    target_dir.join(target).join(profile).join("fetchahead")
}

fn fail(why: &str) -> ! {
    eprintln!("error: {why}");
    std::process::exit(1);
}
