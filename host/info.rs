//! What this build is and what it finds here: `fetchahead info`, Python's
//! `fetchahead.show_config()` and the C ABI's `fetchahead_build_info()` all read it.
use serde_json::{Value, json};

use crate::kernels::Gpu;
use crate::kernels::ptx;

/// The crate's version (Cargo's: the one version source; Python's wheel and the C ABI read it).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit built (`build.rs`; "unknown" when built outside a git checkout).
pub const GIT_COMMIT: &str = env!("FETCHAHEAD_GIT_COMMIT");

/// What the build itself fixed: version, commit, embedded archs, the build's features.
pub fn build() -> Value {
    json!({
        "version": VERSION,
        "git_commit": GIT_COMMIT,
        "archs": ptx::BUILT.iter().map(|p| p.arch).collect::<Vec<_>>(),
        "features": features(),
        "target": format!("{}-{}", std::env::consts::ARCH, std::env::consts::OS),
    })
}

/// The crate's features this build has on (`cli`, `selfcheck`): none for a library as an engine
/// links it.
fn features() -> Vec<&'static str> {
    [
        ("cli", cfg!(feature = "cli")),
        ("selfcheck", cfg!(feature = "selfcheck")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect()
}

/// [`build`], then the device found (device 0) and the PTX it loads, each kernel family's
/// default variant, the read paths available on this kernel, and every setting in effect.
pub fn report() -> Value {
    let mut r = build();
    let (device, arch, l2) = match Gpu::open(0) {
        Ok(gpu) => {
            let (major, minor) = gpu.compute_capability;
            let loads = ptx::for_device(&gpu.name, major, minor);
            let arch = loads.as_ref().ok().map(|c| c.ptx.arch);
            (
                json!({
                    "name": gpu.name,
                    "compute_capability": format!("{major}.{minor}"),
                    "multiprocessors": gpu.multiprocessors,
                    "l2_bytes": gpu.l2_bytes,
                    "ptx": match &loads {
                        Ok(c) => json!(c.ptx.arch),
                        Err(e) => json!(format!("none: {e}")),
                    },
                    "ptx_why": match &loads {
                        Ok(c) => json!(c.to_string()),
                        Err(e) => json!(e.to_string()),
                    },
                }),
                arch,
                Some(gpu.l2_bytes),
            )
        }
        Err(e) => (json!(format!("no device ({e})")), None, None),
    };
    r["device"] = device;
    let defaults: Vec<Value> = match arch {
        Some(arch) => vec![defaults_of(fetchahead_gpu::defaults::for_arch(arch))],
        None => fetchahead_gpu::defaults::BY_ARCH
            .iter()
            .map(defaults_of)
            .collect(),
    };
    r["default_variants"] = json!(defaults);
    r["read_paths"] = json!(
        crate::store::read_paths_here()
            .into_iter()
            .map(|(path, found)| match found {
                Ok(how) => json!({"path": path, "available": true, "how": how}),
                Err(why) => json!({"path": path, "available": false, "why": why}),
            })
            .collect::<Vec<_>>()
    );
    r["settings"] = json!(
        crate::settings::in_effect(l2)
            .into_iter()
            .map(
                |s| json!({"name": s.name, "value": s.value, "source": s.source, "about": s.about})
            )
            .collect::<Vec<_>>()
    );
    r["nvtx"] = json!(match crate::nvtx::state() {
        crate::nvtx::State::Off => "off".to_string(),
        crate::nvtx::State::On(lib) => format!("on ({lib})"),
        crate::nvtx::State::Unavailable(why) => format!("unavailable: {why}"),
    });
    r
}

fn defaults_of(d: &fetchahead_gpu::defaults::Defaults) -> Value {
    json!({
        "arch": d.arch,
        "gather": by_size(d.gather.buckets().iter().map(|(n, v)| (*n, v.name()))),
        "gather_dequant": by_size(d.dequant.buckets().iter().map(|(n, v)| (*n, v.name()))),
        "measured_on": d.measured_on,
    })
}

/// A default by call size in words: `a (up to 1024 rows), b (up to 16384), c (more)`.
fn by_size(buckets: impl Iterator<Item = (u64, &'static str)>) -> String {
    let mut words = Vec::new();
    for (i, (up_to, name)) in buckets.enumerate() {
        words.push(match (up_to, i) {
            (u64::MAX, 0) => name.to_string(),
            (u64::MAX, _) => format!("{name} (more)"),
            (_, 0) => format!("{name} (up to {up_to} rows)"),
            _ => format!("{name} (up to {up_to})"),
        });
    }
    words.join(", ")
}

/// [`report`] as the lines `fetchahead info` prints.
pub fn render(r: &Value) -> String {
    let s = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<26} {v}\n"));
    line("version", s(&r["version"]));
    line("git commit", s(&r["git_commit"]));
    let archs: Vec<String> = r["archs"]
        .as_array()
        .map(|a| a.iter().map(&s).collect())
        .unwrap_or_default();
    line("embedded PTX", archs.join(", "));
    match &r["device"] {
        Value::Object(d) => {
            line(
                "device",
                format!(
                    "{} (compute capability {}, {} SMs, {} MiB L2)",
                    s(&d["name"]),
                    s(&d["compute_capability"]),
                    s(&d["multiprocessors"]),
                    d["l2_bytes"].as_u64().unwrap_or(0) >> 20
                ),
            );
            line("loads PTX", s(&d["ptx"]));
        }
        other => line("device", s(other)),
    }
    for d in r["default_variants"].as_array().into_iter().flatten() {
        line(
            &format!("defaults {}", s(&d["arch"])),
            format!(
                "gather {}, gather_dequant {} ({})",
                s(&d["gather"]),
                s(&d["gather_dequant"]),
                s(&d["measured_on"])
            ),
        );
    }
    for p in r["read_paths"].as_array().into_iter().flatten() {
        let how = if p["available"].as_bool() == Some(true) {
            s(&p["how"])
        } else {
            format!("unavailable: {}", s(&p["why"]))
        };
        line(&format!("read path {}", s(&p["path"])), how);
    }
    line("nvtx", s(&r["nvtx"]));
    for st in r["settings"].as_array().into_iter().flatten() {
        line(
            &s(&st["name"]),
            format!("{} ({})", s(&st["value"]), s(&st["source"])),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_names_the_build_and_every_setting() {
        let r = report();
        assert_eq!(r["version"], VERSION);
        assert!(!r["archs"].as_array().unwrap().is_empty());
        let names: Vec<&str> = r["settings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        for known in crate::settings::known_settings() {
            assert!(names.contains(&known), "{known} missing from {names:?}");
        }
        for s in r["settings"].as_array().unwrap() {
            let source = s["source"].as_str().unwrap();
            let set = std::env::var(s["name"].as_str().unwrap()).is_ok();
            assert_eq!(source, if set { "env" } else { "default" }, "{s}");
        }
        let paths: Vec<&str> = r["read_paths"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["path"].as_str().unwrap())
            .collect();
        assert_eq!(paths, ["uring", "preadv", "buffered", "mmap"]);
        let text = render(&r);
        assert!(
            text.contains(VERSION) && text.contains("FETCHAHEAD_READ_PATH"),
            "{text}"
        );
    }
}
