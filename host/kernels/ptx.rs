//! The PTX that `build.rs` compiled from `gpu/`, one text per arch, and the choice for a device.
use crate::{Error, Result};

/// One arch's PTX, embedded at build time.
#[derive(Clone, Copy, Debug)]
pub struct BuiltPtx {
    /// `sm_90`, `sm_121a`, ...
    pub arch: &'static str,
    pub text: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/ptx.rs"));

/// The archs this build embeds, comma-separated.
pub fn built_archs() -> String {
    BUILT.iter().map(|p| p.arch).collect::<Vec<_>>().join(",")
}

/// The PTX for `arch`, exactly as named.
pub fn for_arch(arch: &str) -> Result<&'static BuiltPtx> {
    BUILT
        .iter()
        .find(|p| p.arch == arch)
        .ok_or_else(|| Error::UnknownArch {
            arch: arch.to_string(),
            built: built_archs(),
        })
}

/// The arch a device of compute capability `major.minor` runs: 9.0 -> `sm_90`, 12.1 -> `sm_121a`
/// (the `a` build uses instructions specific to that chip, so it is preferred when both exist).
pub fn for_compute_capability(device: &str, major: i32, minor: i32) -> Result<&'static BuiltPtx> {
    let plain = format!("sm_{major}{minor}");
    let specific = format!("{plain}a");
    BUILT
        .iter()
        .find(|p| p.arch == specific)
        .or_else(|| BUILT.iter().find(|p| p.arch == plain))
        .ok_or_else(|| Error::NoPtxForDevice {
            device: device.to_string(),
            major,
            minor,
            wanted: if major >= 10 { specific } else { plain },
            built: built_archs(),
        })
}

/// The names of the kernel entries in a PTX text, in order.
pub fn entries(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter_map(|line| {
        let rest = line.trim_start().strip_prefix(".visible .entry ")?;
        rest.split('(').next()
    })
}
