//! The PTX that `build.rs` compiled from `gpu/`'s product module, one text per arch, and the
//! choice for a device.
//!
//! The driver JIT-compiles a plain PTX (`sm_90`) for its own arch or any newer one, so a device
//! gets the newest embedded PTX not newer than it. An `a` PTX (`sm_121a`) uses instructions of
//! exactly that chip and runs only there. [`PTX_ARCH_ENV`] forces one by name (to run the
//! baseline on a newer chip, as the tests do).
use std::fmt;

use fetchahead_gpu::parse_arch;

use crate::{Error, Result};

/// One arch's PTX, embedded at build time.
#[derive(Clone, Copy, Debug)]
pub struct BuiltPtx {
    /// `sm_90`, `sm_121a`, ...
    pub arch: &'static str,
    pub text: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/ptx.rs"));

/// Names the embedded PTX to load (`sm_80`, `sm_90`, ...) instead of the device's own choice.
pub const PTX_ARCH_ENV: &str = "FETCHAHEAD_PTX_ARCH";

impl BuiltPtx {
    /// Its SM number: `sm_121a` -> 121.
    pub fn sm(&self) -> u32 {
        parse_arch(self.arch).map_or(0, |(sm, _)| sm)
    }

    /// Whether a device of SM number `device_sm` can load it: a plain PTX on its arch or a newer
    /// one, an `a` PTX on exactly its arch.
    pub fn runs_on(&self, device_sm: u32) -> bool {
        match parse_arch(self.arch) {
            Some((sm, false)) => sm <= device_sm,
            Some((sm, true)) => sm == device_sm,
            None => false,
        }
    }

    /// Whether it holds a kernel whose instructions need SM `needs` (an `Entry::needs`): build.rs
    /// checks that each PTX holds exactly the kernels its arch meets the needs of.
    pub fn holds(&self, needs: u32) -> bool {
        needs <= self.sm()
    }
}

/// Why a PTX was chosen for a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Built for exactly the device's arch.
    Exact,
    /// No PTX of the device's own arch: the newest plain one older than it.
    NewestNotNewer,
    /// Named by [`PTX_ARCH_ENV`].
    Forced,
}

/// The PTX a device loads, and why.
#[derive(Clone, Copy, Debug)]
pub struct Choice {
    pub ptx: &'static BuiltPtx,
    /// The device's compute capability.
    pub device: (i32, i32),
    pub reason: Reason,
}

impl fmt::Display for Choice {
    /// `sm_90 PTX for a 10.0 device: the newest embedded not newer than the device`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (major, minor) = self.device;
        write!(f, "{} PTX for a {major}.{minor} device: ", self.ptx.arch)?;
        match self.reason {
            Reason::Exact => f.write_str("built for exactly this arch"),
            Reason::NewestNotNewer => f.write_str(
                "the newest embedded PTX not newer than the device (the driver compiles it \
                 forward)",
            ),
            Reason::Forced => write!(f, "forced by {PTX_ARCH_ENV}={}", self.ptx.arch),
        }
    }
}

/// The archs this build embeds, comma-separated.
pub fn built_archs() -> String {
    archs_of(BUILT)
}

pub(crate) fn archs_of(built: &[BuiltPtx]) -> String {
    built.iter().map(|p| p.arch).collect::<Vec<_>>().join(",")
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

/// The PTX a device of compute capability `major.minor` loads: [`PTX_ARCH_ENV`]'s when set,
/// otherwise [`choose`]'s.
pub fn for_device(device: &str, major: i32, minor: i32) -> Result<Choice> {
    let forced = std::env::var(PTX_ARCH_ENV).ok();
    choose(BUILT, device, (major, minor), forced.as_deref())
}

/// The PTX among `built` a device of compute capability `cc` loads: `forced` (an arch name,
/// checked to be built and loadable there), else the device's own arch (its `a` build first),
/// else the newest plain PTX older than the device.
pub fn choose(
    built: &'static [BuiltPtx],
    device: &str,
    cc: (i32, i32),
    forced: Option<&str>,
) -> Result<Choice> {
    let (major, minor) = cc;
    let device_sm = (major.max(0) * 10 + minor.max(0)) as u32;
    let choice = |ptx, reason| Choice {
        ptx,
        device: cc,
        reason,
    };
    if let Some(arch) = forced.map(str::trim).filter(|a| !a.is_empty()) {
        let ptx = built
            .iter()
            .find(|p| p.arch == arch)
            .ok_or_else(|| Error::UnknownArch {
                arch: format!("{arch} (from {PTX_ARCH_ENV})"),
                built: archs_of(built),
            })?;
        if !ptx.runs_on(device_sm) {
            return Err(Error::invalid(
                "FETCHAHEAD_PTX_ARCH",
                format!(
                    "{arch} PTX cannot run on {device} (compute capability {major}.{minor}): a \
                     plain PTX runs on its arch and newer ones, an `a` PTX on its arch only"
                ),
            ));
        }
        return Ok(choice(ptx, Reason::Forced));
    }
    let exact = |specific| {
        built
            .iter()
            .find(|p| parse_arch(p.arch) == Some((device_sm, specific)))
    };
    if let Some(ptx) = exact(true).or_else(|| exact(false)) {
        return Ok(choice(ptx, Reason::Exact));
    }
    built
        .iter()
        .filter(|p| p.runs_on(device_sm))
        .max_by_key(|p| p.sm())
        .map(|ptx| choice(ptx, Reason::NewestNotNewer))
        .ok_or_else(|| Error::NoPtxForDevice {
            device: device.to_string(),
            major,
            minor,
            wanted: format!("sm_{major}{minor}"),
            built: archs_of(built),
        })
}

/// The names of the kernel entries in a PTX text, in order.
pub fn entries(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter_map(|line| {
        let rest = line.trim_start().strip_prefix(".visible .entry ")?;
        rest.split('(').next()
    })
}

/// The SM number a kernel needs (`fetchahead_gpu::all_kernels()`'s `needs`), if it is one (of
/// either module).
pub fn kernel_needs(name: &str) -> Option<u32> {
    fetchahead_gpu::all_kernels()
        .find(|e| e.name == name)
        .map(|e| e.needs)
}
