//! The variant each kernel family launches when the caller names none: for each arch and call
//! size, the fastest measured (`benches/triton/peers.py`, figures in BENCHMARKS.md), chosen by
//! name here and nowhere else, and resolved to its handle when this crate builds (a name no row
//! has fails the build). `tests/defaults.rs` checks them against the winners the benches
//! recorded in `benches/recorded/`.
use crate::dequant::DequantVariant;
use crate::gather::GatherVariant;

/// A family's default by the number of rows a call gathers: `(up_to, variant)` pairs in rising
/// `up_to`, the last one `u64::MAX`; a call of `n` rows gets the first whose `up_to` >= n.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BySize<V: 'static>(pub &'static [(u64, V)]);

impl<V: Copy + PartialEq> BySize<V> {
    /// The variant for a call of `n` rows.
    pub fn for_rows(&self, n: u64) -> V {
        match self.0.iter().find(|(up_to, _)| n <= *up_to) {
            Some((_, v)) => *v,
            None => self.0[self.0.len() - 1].1,
        }
    }

    /// The buckets, `(up_to, variant)` in rising `up_to`.
    pub fn buckets(&self) -> &'static [(u64, V)] {
        self.0
    }

    /// Each distinct variant of the buckets, in bucket order.
    pub fn variants(&self) -> impl Iterator<Item = V> + '_ {
        let all = self.0;
        all.iter()
            .enumerate()
            .filter(move |(i, (_, v))| !all[..*i].iter().any(|(_, w)| w == v))
            .map(|(_, (_, v))| *v)
    }
}

/// The default variants of one arch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Defaults {
    /// The arch these apply to, as `build.rs` names it (`sm_90`, `sm_121a`).
    pub arch: &'static str,
    /// Rows of [`crate::gather::VARIANTS`] by call size.
    pub gather: BySize<GatherVariant>,
    /// Rows of [`crate::dequant::VARIANTS`] by call size.
    pub dequant: BySize<DequantVariant>,
    /// Where the choice comes from.
    pub measured_on: &'static str,
}

/// The H200's winners by call size (`benches/triton/peers.py --record`, 16M-row table, random
/// ids, three tables; the buckets' bounds lie between its sizes 72, 4096, 65536, 1M and 4M):
/// per-call latency decides the small calls (a thread per 8 bytes in one pass with predicated
/// loads, the Triton peer's shape: 1.32 against 1.40-1.42 us at 72 rows), streaming stores
/// (`_cs`) the middle ones, and for the large ones a block per contiguous stretch of output with
/// every id and row loaded before any store (`gather_tile_x4_nc`, ahead of the Triton peer at 1M
/// and 4M rows). The dequant's small calls take a thread per 8 elements in one pass, loads and
/// stores predicated, in blocks of 128 (`gather_dequant_unit_pass_b128`: 1.39-1.40 against
/// 1.47-1.49 us at 72 rows, 2.01-2.04 against 2.21-2.25 at 4096; the sizes 72 and 4096 of the
/// record re-run for it on 2026-12-03), its large ones a thread per 16 elements in one pass in
/// blocks of 64, the Triton peer's shape, written as straight-line predicated code
/// (`gather_dequant_chunk_pass_b64`: 907-909 us at 4M rows against the earlier default's 963-966
/// and the peer's 915-917, at the data-movement ceiling; the dequant record re-run on
/// 2026-12-04).
const H200_GATHER: BySize<GatherVariant> = BySize(&[
    (16 << 10, GatherVariant::must("gather_words8_pass")),
    (256 << 10, GatherVariant::must("gather_chunk16_nohint_cs")),
    (u64::MAX, GatherVariant::must("gather_tile_x4_nc")),
]);
const H200_DEQUANT: BySize<DequantVariant> = BySize(&[
    (
        16 << 10,
        DequantVariant::must("gather_dequant_unit_pass_b128"),
    ),
    (
        256 << 10,
        DequantVariant::must("gather_dequant_u8_packed_x4_cs"),
    ),
    (
        u64::MAX,
        DequantVariant::must("gather_dequant_chunk_pass_b64"),
    ),
]);

/// One entry per arch `build.rs` builds by default.
pub const BY_ARCH: &[Defaults] = &[
    Defaults {
        arch: "sm_90",
        gather: H200_GATHER,
        dequant: H200_DEQUANT,
        measured_on: "H200, benches/triton/peers.py by size",
    },
    // Not yet measured on a GB10: the H200's winners, the closest measured chip.
    Defaults {
        arch: "sm_121a",
        gather: H200_GATHER,
        dequant: H200_DEQUANT,
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
