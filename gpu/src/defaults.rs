//! The variant each kernel family launches when the caller names none: for each arch, the
//! fastest measured in the gather bench (`benches/gather.rs`, figures in BENCHMARKS.md), chosen
//! by name here and nowhere else. `tests/defaults.rs` checks these names against the winners the
//! bench recorded in `benches/recorded/winners.txt`.

/// The default variants of one arch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Defaults {
    /// The arch these apply to, as `build.rs` names it (`sm_90`, `sm_121a`).
    pub arch: &'static str,
    /// A name in [`crate::gather::VARIANTS`].
    pub gather: &'static str,
    /// A name in [`crate::dequant::VARIANTS`].
    pub dequant: &'static str,
    /// Where the choice comes from.
    pub measured_on: &'static str,
}

/// One entry per arch `build.rs` builds by default.
pub const BY_ARCH: &[Defaults] = &[
    Defaults {
        arch: "sm_90",
        gather: "gather_chunk16_nohint_x2",
        dequant: "gather_dequant_u8_packed_x2",
        measured_on: "H200, gather bench",
    },
    // Not yet measured on a GB10: the H200's winners, the closest measured chip.
    Defaults {
        arch: "sm_121a",
        gather: "gather_chunk16_nohint_x2",
        dequant: "gather_dequant_u8_packed_x2",
        measured_on: "H200's winners (no GB10 measurement yet)",
    },
];

/// The defaults for `arch`, or the first entry's (the tested chip's) for an arch without one.
pub fn for_arch(arch: &str) -> &'static Defaults {
    BY_ARCH
        .iter()
        .find(|d| d.arch == arch)
        .unwrap_or(&BY_ARCH[0])
}
