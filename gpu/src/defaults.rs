//! The variant each kernel family launches when the caller names none: for each arch, the
//! fastest measured in the gather bench (`benches/gather.rs`, figures in BENCHMARKS.md), chosen
//! by name here and nowhere else, and resolved to its handle when this crate builds (a name no
//! row has fails the build). `tests/defaults.rs` checks them against the winners the bench
//! recorded in `benches/recorded/winners.txt`.
use crate::dequant::DequantVariant;
use crate::gather::GatherVariant;

/// The default variants of one arch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Defaults {
    /// The arch these apply to, as `build.rs` names it (`sm_90`, `sm_121a`).
    pub arch: &'static str,
    /// A row of [`crate::gather::VARIANTS`].
    pub gather: GatherVariant,
    /// A row of [`crate::dequant::VARIANTS`].
    pub dequant: DequantVariant,
    /// Where the choice comes from.
    pub measured_on: &'static str,
}

/// One entry per arch `build.rs` builds by default.
pub const BY_ARCH: &[Defaults] = &[
    Defaults {
        arch: "sm_90",
        gather: GatherVariant::must("gather_chunk16_nohint_x2"),
        dequant: DequantVariant::must("gather_dequant_u8_packed_x2"),
        measured_on: "H200, gather bench",
    },
    // Not yet measured on a GB10: the H200's winners, the closest measured chip.
    Defaults {
        arch: "sm_121a",
        gather: GatherVariant::must("gather_chunk16_nohint_x2"),
        dequant: DequantVariant::must("gather_dequant_u8_packed_x2"),
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
