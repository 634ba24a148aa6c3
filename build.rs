//! Compiles `gpu/` to PTX with rustc's own `nvptx64-nvidia-cuda` target, once per arch listed in
//! `FETCHAHEAD_ARCHS` (default `sm_121a,sm_90,sm_80`), checks that each PTX holds exactly the
//! kernels its arch can run (a kernel's `needs`, from gpu/'s declarations), and embeds the PTX
//! through `$OUT_DIR/ptx.rs`. Each arch's build is reported as a cargo warning line with its time
//! (cargo shows them when this script ends; the arch builds take most of a first build's time).
//! It also records the git commit built (`FETCHAHEAD_GIT_COMMIT`, "unknown" outside a git
//! checkout, e.g. from an sdist).
//!
//! This builds the product's module: the kernels an engine loads. `lab/build.rs` includes this
//! file and calls [`embed_ptx`] for the lab's (`--cfg fetchahead_lab`), so that both modules are
//! built and checked by the same code.
//!
//! The sm_80 PTX is the baseline: the driver JIT-compiles a plain (not `a`) PTX for any newer
//! device, so it runs the kernels that need nothing newer on A100, L40S and the RTX parts.
//!
//! The kernel crate needs nightly features, so its child build alone runs with
//! `RUSTC_BOOTSTRAP=1`, `-Zbuild-std=core` and `-Cpanic=immediate-abort`, with this build's
//! `CARGO_*` variables removed.
use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use fetchahead_gpu::{Module, parse_arch};

const DEFAULT_ARCHS: &str = "sm_121a,sm_90,sm_80";
const TARGET: &str = "nvptx64-nvidia-cuda";
/// The arch tiers above the baseline whose kernels a PTX holds only from that SM on (the
/// `fetchahead_sm{N}` cfgs of gpu/).
const TIERS: [u32; 2] = [89, 90];
const COMPONENTS: [&str; 3] = ["rust-src", "llvm-bitcode-linker", "llvm-tools"];

fn main() {
    git_commit();
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    embed_ptx(Module::Product, &manifest_dir);
}

/// Compiles `module`'s kernels of `root`'s `gpu/` once per arch of `FETCHAHEAD_ARCHS`, checks
/// each PTX against the kernel list, and writes `$OUT_DIR/ptx.rs`: `BUILT`, one `BuiltPtx` an
/// arch (the including crate has `BuiltPtx` in scope).
pub(crate) fn embed_ptx(module: Module, root: &Path) {
    let gpu = root.join("gpu");
    println!("cargo:rerun-if-changed={}", gpu.join("src").display());
    println!(
        "cargo:rerun-if-changed={}",
        gpu.join("Cargo.toml").display()
    );
    println!("cargo:rerun-if-changed={}", root.join("build.rs").display());
    println!("cargo:rerun-if-env-changed=FETCHAHEAD_ARCHS");

    let archs = env::var("FETCHAHEAD_ARCHS").unwrap_or_else(|_| DEFAULT_ARCHS.to_string());
    let archs: Vec<&str> = archs
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    for arch in &archs {
        if parse_arch(arch).is_none() {
            fail(&format!(
                "FETCHAHEAD_ARCHS: `{arch}` is not an arch like sm_90 or sm_121a"
            ));
        }
    }
    if archs.is_empty() {
        fail("FETCHAHEAD_ARCHS names no arch; set it to e.g. sm_121a,sm_90");
    }

    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    ensure_components(&rustc);

    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    // Shared by every profile and by clippy, so core is built once per arch, not once per build.
    let mut ptx_root = out_dir
        .ancestors()
        .nth(4)
        .unwrap_or(&out_dir)
        .join("fetchahead-ptx");
    if module == Module::Lab {
        ptx_root.push("lab");
    }

    let mut table = String::from("pub const BUILT: &[BuiltPtx] = &[\n");
    for (i, arch) in archs.iter().enumerate() {
        let started = std::time::Instant::now();
        let ptx = build_arch(&rustc, &gpu, &ptx_root.join(arch), arch, module);
        println!(
            "cargo:warning=fetchahead: the {} module's kernels for {arch} compiled to PTX ({} of \
             {}, {:.1} s; FETCHAHEAD_ARCHS picks the archs)",
            module.name(),
            i + 1,
            archs.len(),
            started.elapsed().as_secs_f64()
        );
        check_entries(arch, &ptx, module);
        let ptx = require_block_sizes(arch, &ptx, module);
        let file = format!("{arch}.ptx");
        fs::write(out_dir.join(&file), &ptx).unwrap();
        writeln!(
            table,
            "    BuiltPtx {{ arch: {arch:?}, text: include_str!(concat!(env!(\"OUT_DIR\"), \"/{file}\")) }},"
        )
        .unwrap();
    }
    table.push_str("];\n");
    fs::write(out_dir.join("ptx.rs"), table).unwrap();
}

/// `FETCHAHEAD_GIT_COMMIT` for the crate: the checkout's commit, or "unknown" outside a git
/// checkout. Reruns when HEAD moves (not on every edit: uncommitted changes are not marked).
fn git_commit() {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    if let Some(p) = git(&["rev-parse", "--git-path", "HEAD"]) {
        println!("cargo:rerun-if-changed={p}");
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(p) = git(&["rev-parse", "--git-path", &branch])
    {
        println!("cargo:rerun-if-changed={p}");
    }
    println!("cargo:rustc-env=FETCHAHEAD_GIT_COMMIT={commit}");
}

fn fail(message: &str) -> ! {
    eprintln!("error: fetchahead: {message}");
    std::process::exit(1);
}

fn sysroot(rustc: &str) -> PathBuf {
    let out = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .unwrap_or_else(|e| fail(&format!("cannot run `{rustc} --print sysroot`: {e}")));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn components_present(sysroot: &Path) -> bool {
    let host = env::var("HOST").unwrap();
    let bin = sysroot.join("lib/rustlib").join(&host).join("bin");
    sysroot.join("lib/rustlib/src/rust/library/core").is_dir()
        && (bin.join("llvm-bitcode-linker").is_file()
            || bin.join("self-contained/llvm-bitcode-linker").is_file())
        && bin.join("llvm-link").is_file()
}

/// The toolchain cargo runs this build with: rustup's proxy sets `RUSTUP_TOOLCHAIN`; else what
/// `rustup show active-toolchain` names.
fn active_toolchain() -> Option<String> {
    env::var("RUSTUP_TOOLCHAIN").ok().or_else(|| {
        let out = Command::new("rustup")
            .args(["show", "active-toolchain"])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace().next().map(str::to_string)
    })
}

/// The child build needs the core sources, the bitcode linker, and LLVM's tools (the linker
/// calls `llvm-link`, and an older system `llvm-link` on PATH rejects its arguments). Missing
/// ones are added with rustup, for the toolchain in use; rustup's own output is passed through
/// when that fails.
fn ensure_components(rustc: &str) {
    let root = sysroot(rustc);
    if components_present(&root) {
        return;
    }
    let toolchain = active_toolchain();
    let mut fix = format!("rustup component add {}", COMPONENTS.join(" "));
    if let Some(t) = &toolchain {
        write!(fix, " --toolchain {t}").unwrap();
    }
    println!("cargo:warning=fetchahead: adding the rustup components the PTX build needs: {fix}");
    let mut rustup = Command::new("rustup");
    rustup.args(["component", "add"]).args(COMPONENTS);
    if let Some(t) = &toolchain {
        rustup.args(["--toolchain", t]);
    }
    let said = match rustup.output() {
        Ok(out) if out.status.success() && components_present(&root) => return,
        Ok(out) => format!(
            "rustup exited with {}:\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => format!("rustup could not be run ({e}); is the toolchain installed by rustup?"),
    };
    eprintln!("{said}");
    fail(&format!(
        "the PTX build needs rustup components {COMPONENTS:?} (rustup's output is above); run \
         `{fix}`"
    ));
}

fn build_arch(rustc: &str, gpu: &Path, target_dir: &Path, arch: &str, module: Module) -> String {
    let mut flags = vec![
        "-Zunstable-options".to_string(),
        "-Cpanic=immediate-abort".to_string(),
        format!("-Ctarget-cpu={arch}"),
        // Kernels keep per-thread arrays (loads in flight) in registers only when their loops
        // over constant bounds unroll fully.
        "-Cllvm-args=-unroll-threshold=2000".to_string(),
    ];
    let sm = parse_arch(arch).map_or(0, |(sm, _)| sm);
    // LLVM's default PTX ISA for an arch is older than some instructions the kernels use: the
    // bulk L2 prefetch needs PTX 8.0 (sm_90 defaults to 7.8), the e4m3 conversion 7.8, and
    // the cache hints (`L1::no_allocate`, `L2::256B`, `createpolicy`) 7.4 (sm_80 defaults to
    // 7.0). From sm_100 on the default is new enough.
    match sm {
        90..100 => flags.push("-Ctarget-feature=+ptx80".to_string()),
        89 => flags.push("-Ctarget-feature=+ptx78".to_string()),
        0..89 => flags.push("-Ctarget-feature=+ptx74".to_string()),
        _ => {}
    }
    // The kernels' tiers (gpu/src/lib.rs `for_tier!`): an entry is compiled into this PTX only
    // when the arch has what it needs.
    for tier in TIERS.iter().filter(|&&t| sm >= t) {
        flags.push("--cfg".to_string());
        flags.push(format!("fetchahead_sm{tier}"));
    }
    // gpu/src/lib.rs compiles one module's families a build.
    if module == Module::Lab {
        flags.push("--cfg".to_string());
        flags.push("fetchahead_lab".to_string());
    }
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    for (key, _) in env::vars() {
        if key.starts_with("CARGO_") && key != "CARGO_HOME" {
            cmd.env_remove(key);
        }
    }
    cmd.env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTFLAGS")
        .env("RUSTC", rustc)
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"))
        .current_dir(gpu)
        .args(["rustc", "--quiet", "--profile", "ptx", "--target", TARGET])
        .args(["-Zbuild-std=core", "--crate-type", "cdylib", "--target-dir"])
        .arg(target_dir);
    let out = cmd
        .output()
        .unwrap_or_else(|e| fail(&format!("cannot run cargo for the {arch} PTX build: {e}")));
    if !out.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
        fail(&format!(
            "the {arch} PTX build of gpu/'s {} module failed (its output is above)",
            module.name()
        ));
    }
    let ptx = target_dir.join(TARGET).join("ptx/fetchahead_gpu.ptx");
    fs::read_to_string(&ptx).unwrap_or_else(|e| {
        fail(&format!(
            "the {arch} PTX build wrote no {}: {e}",
            ptx.display()
        ))
    })
}

/// Every kernel of `module` the host loads on this arch (those whose `needs` it meets) is an
/// entry of this PTX, taking a parameter block of exactly the size the host passes; no other
/// kernel is, and the PTX has no entry that the list (`fetchahead_gpu::all_kernels`, derived
/// from gpu/'s declarations) does not hold for `module`.
fn check_entries(arch: &str, ptx: &str, module: Module) {
    let sm = parse_arch(arch).map_or(0, |(sm, _)| sm);
    let here = module.name();
    for entry in fetchahead_gpu::all_kernels() {
        let (name, size) = (entry.name, entry.param_bytes);
        let present = ptx.contains(&format!(".entry {name}("));
        if entry.module != module || entry.needs > sm {
            if present {
                fail(&format!(
                    "{arch} PTX of the {here} module has kernel `{name}`, which its declaration \
                     puts in the {} module, needing sm_{} (gpu/src/lib.rs's cfgs and the list \
                     disagree)",
                    entry.module.name(),
                    entry.needs
                ));
            }
            continue;
        }
        if !present {
            fail(&format!(
                "{arch} PTX of the {here} module has no kernel `{name}` (listed in gpu/'s \
                 declarations, needing sm_{})",
                entry.needs
            ));
        }
        if !ptx.contains(&format!(".param .align 8 .b8 {name}_param_0[{size}]")) {
            fail(&format!(
                "{arch} PTX: kernel `{name}` does not take one {size}-byte parameter"
            ));
        }
    }
    for name in entries(ptx) {
        if !fetchahead_gpu::all_kernels().any(|e| e.name == name) {
            fail(&format!(
                "{arch} PTX of the {here} module has kernel `{name}`, which no declaration of \
                 the kernel list holds (`FAMILIES` in gpu/src/lib.rs: a `variants!` table or a \
                 hand-written entry's row); declare it there"
            ));
        }
    }
}

/// `ptx` with a `.reqntid` directive on each entry of `module` whose declaration fixes its block
/// size (`fetchahead_gpu::Declared::block_threads`: the width builds), which LLVM's PTX has no
/// way to carry from Rust. A launch with another block size then fails rather than running a
/// body that assumes its own (ptxas's code is the same, and a replayed decode-size call no
/// faster: `benches/cuda/module_probe.cu`'s `fa/reqntid`, BENCHMARKS.md).
fn require_block_sizes(arch: &str, ptx: &str, module: Module) -> String {
    let mut out = ptx.to_string();
    for entry in fetchahead_gpu::all_kernels().filter(|e| e.module == module) {
        let Some(threads) = entry.block_threads else {
            continue;
        };
        let Some(start) = out.find(&format!(".entry {}(", entry.name)) else {
            continue; // not in this arch's PTX (check_entries said whether it should be)
        };
        // The parameter list closes on a line of its own: `)`, then LLVM's comment.
        let close = out[start..]
            .find("\n)")
            .map(|at| start + at + 1)
            .unwrap_or_else(|| {
                fail(&format!(
                    "{arch} PTX: `{}` has no parameter list",
                    entry.name
                ))
            });
        let line_end = out[close..]
            .find('\n')
            .map(|at| close + at + 1)
            .unwrap_or_else(|| fail(&format!("{arch} PTX: `{}` has no body", entry.name)));
        if !out[line_end..].starts_with('{') {
            fail(&format!(
                "{arch} PTX: `{}`'s parameter list is not followed by its body",
                entry.name
            ));
        }
        out.insert_str(line_end, &format!(".reqntid {threads}, 1, 1\n"));
    }
    out
}

/// The names of the kernel entries in a PTX text (as `host/kernels/ptx.rs` reads them).
fn entries(ptx: &str) -> impl Iterator<Item = &str> {
    ptx.lines().filter_map(|line| {
        let rest = line.trim_start().strip_prefix(".visible .entry ")?;
        rest.split('(').next()
    })
}
