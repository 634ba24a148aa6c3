//! Every gather and gather + dequant variant against the CPU reference on the GPU, for tables in
//! device memory and in mapped pinned host memory. Fresh random inputs every run (the seed is
//! printed), the output poisoned before each launch. Without a GPU the runner reports them as
//! ignored, with the reason; with FETCHAHEAD_REQUIRE_GPU=1 they fail.
// The self-check's CPU reference (`fetchahead::selfcheck::reference`), one source; each test
// file uses part of it.
mod common;
#[allow(dead_code)]
#[path = "../host/selfcheck/reference.rs"]
mod reference;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use fetchahead::device_abi::{gather, width_build};
use fetchahead::kernels::Kernels;
use fetchahead::kernels::gpu::Gpu;
use fetchahead::kernels::id_check::IdCheck;
use fetchahead::selfcheck::{fresh_seed, poison};
use fetchahead::tables::table::{Mxfp8Table, Placement, RowTable};
use fetchahead::{DequantVariant, Error, GatherVariant};
use rand::{Rng, RngExt, SeedableRng, rngs::SmallRng};

const DIM: usize = 256;
const PLACEMENTS: [Placement; 2] = [Placement::Device, Placement::PinnedHost];
/// 0, 1, under a warp, not a multiple of the block, a few blocks, and over a million.
const SIZES: [usize; 6] = [0, 1, 31, 1000, 4099, 1 << 20];

struct Setup {
    kernels: Kernels,
    stream: Arc<CudaStream>,
    rng: SmallRng,
    /// The variants checked, and those left out because the loaded PTX does not hold them.
    checked: Vec<&'static str>,
    not_held: Vec<&'static str>,
}

fn setup(what: &str) -> Option<Setup> {
    setup_arch(what, None)
}

/// As [`setup`], with the PTX of `arch` loaded (as `FETCHAHEAD_PTX_ARCH` would) when given.
fn setup_arch(what: &str, arch: Option<&str>) -> Option<Setup> {
    let gpu = Gpu::for_test(what).expect("opening the GPU")?;
    let kernels = match arch {
        Some(arch) => Kernels::load_arch(&gpu, arch),
        None => Kernels::load(&gpu),
    }
    .expect("loading the kernels");
    let stream = gpu.ctx.default_stream();
    let seed = fresh_seed();
    eprintln!("{what}: seed {seed}, {}", kernels.ptx_choice());
    Some(Setup {
        kernels,
        stream,
        rng: SmallRng::seed_from_u64(seed),
        checked: Vec::new(),
        not_held: Vec::new(),
    })
}

impl Setup {
    /// Whether to check `name`: the loaded PTX holds it (otherwise it is recorded, and said, as
    /// left out).
    fn held(&mut self, name: &'static str) -> bool {
        if self.kernels.holds(name) {
            if !self.checked.contains(&name) {
                self.checked.push(name);
            }
            return true;
        }
        if !self.not_held.contains(&name) {
            eprintln!(
                "  {name}: not in the {} PTX (needs a newer arch), not checked",
                self.kernels.arch()
            );
            self.not_held.push(name);
        }
        false
    }
}

fn random_bytes(rng: &mut SmallRng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    v
}

/// Random ids into `rows`, with duplicates (a quarter of them repeat an earlier id).
fn random_ids(rng: &mut SmallRng, n: usize, rows: u64) -> Vec<i64> {
    let mut ids: Vec<i64> = (0..n).map(|_| rng.random_range(0..rows as i64)).collect();
    for i in 1..n {
        if rng.random_range(0..4) == 0 {
            ids[i] = ids[rng.random_range(0..i)];
        }
    }
    ids
}

fn address<T>(stream: &Arc<CudaStream>, slice: &CudaSlice<T>) -> u64 {
    slice.device_ptr(stream).0
}

fn every_gather_variant_matches_the_reference() {
    let Some(mut s) = setup("gather variants") else {
        return;
    };
    check_gathers(&mut s, DIM, &PLACEMENTS, &SIZES);
}

/// Rows of 1, 3 and 17 16-byte chunks: a warp's chunks then cover many rows, or rows start at
/// uneven lanes.
fn every_gather_variant_matches_the_reference_at_other_row_widths() {
    let Some(mut s) = setup("gather variants, other row widths") else {
        return;
    };
    for row_bytes in [16, 48, 272] {
        check_gathers(
            &mut s,
            row_bytes,
            &[Placement::Device],
            &[1, 31, 1000, 4099],
        );
    }
}

/// The entry a call of variant `name` over rows `width` wide runs: its width build when it has
/// one of that width (whose results the reference then checks), else its own.
fn expected_entry(name: &'static str, width: usize) -> &'static str {
    match width_build(name) {
        Some(b) if b.width as usize == width => b.name,
        _ => name,
    }
}

/// Every gather variant on rows of `row_bytes`, each placement and batch size.
fn check_gathers(s: &mut Setup, row_bytes: usize, placements: &[Placement], sizes: &[usize]) {
    let rows = 1u64 << 16;
    let table_bytes = random_bytes(&mut s.rng, rows as usize * row_bytes);
    let mut check = IdCheck::new(&s.stream).unwrap();
    for &placement in placements {
        let mut table =
            RowTable::from_bytes(&s.stream, &table_bytes, row_bytes as u32, placement).unwrap();
        for &n in sizes {
            let ids = random_ids(&mut s.rng, n, rows);
            let want = reference::gather(&table_bytes, row_bytes, &ids);
            let ids_dev = s.stream.clone_htod(&ids).unwrap();
            let mut out = s.stream.alloc_zeros::<u8>((n * row_bytes).max(1)).unwrap();
            for variant in GatherVariant::all() {
                let v = variant.variant();
                if !s.held(v.name) {
                    continue;
                }
                let entry = s.kernels.gather_entry(variant, row_bytes as u32).unwrap();
                assert_eq!(entry, expected_entry(v.name, row_bytes));
                poison(&s.stream, &mut out).unwrap();
                table
                    .gather(&s.kernels, &s.stream, variant, &ids_dev, &mut out, &check)
                    .unwrap();
                check
                    .take(&s.stream, address(&s.stream, &ids_dev), n as u64, rows)
                    .unwrap();
                let got = s.stream.clone_dtoh(&out).unwrap();
                let differs = got[..n * row_bytes]
                    .iter()
                    .zip(&want)
                    .position(|(a, b)| a != b);
                if let Some(i) = differs {
                    panic!(
                        "{entry} {placement:?} {row_bytes}-byte rows n={n}: output row {} (id \
                         {}) differs",
                        i / row_bytes,
                        ids[i / row_bytes]
                    );
                }
            }
        }
    }
}

/// Rows of every E4M3 byte (each row holds all 256 values, shuffled) under each edge scale.
fn edge_table(rng: &mut SmallRng) -> (Vec<u8>, Vec<u8>) {
    const EDGE_SCALES: [u8; 8] = [0, 1, 2, 127, 246, 247, 254, 255];
    let mut weights = Vec::new();
    let mut scales = Vec::new();
    for &scale in &EDGE_SCALES {
        let mut row: Vec<u8> = (0..=255u8).collect();
        for i in (1..row.len()).rev() {
            row.swap(i, rng.random_range(0..=i));
        }
        weights.extend_from_slice(&row);
        scales.extend(std::iter::repeat_n(scale, DIM / 32));
    }
    // One more row mixing the edge scales within the row.
    weights.extend(0..=255u8);
    scales.extend_from_slice(&EDGE_SCALES);
    (weights, scales)
}

fn check_dequant(s: &mut Setup, weights: &[u8], scales: &[u8], sizes: &[usize], what: &str) {
    check_dequant_dim(s, weights, scales, DIM, sizes, what)
}

fn check_dequant_dim(
    s: &mut Setup,
    weights: &[u8],
    scales: &[u8],
    dim: usize,
    sizes: &[usize],
    what: &str,
) {
    let rows = (weights.len() / dim) as u64;
    let mut check = IdCheck::new(&s.stream).unwrap();
    for placement in PLACEMENTS {
        let mut table =
            Mxfp8Table::from_bytes(&s.stream, weights, scales, dim as u32, placement).unwrap();
        for &n in sizes {
            let ids = random_ids(&mut s.rng, n, rows);
            let want = reference::gather_dequant(weights, scales, dim, &ids);
            let ids_dev = s.stream.clone_htod(&ids).unwrap();
            let mut out = s.stream.alloc_zeros::<u16>((n * dim).max(1)).unwrap();
            let mut outputs = Vec::new();
            for variant in DequantVariant::all() {
                let v = variant.variant();
                if !s.held(v.name) {
                    continue;
                }
                let entry = s.kernels.dequant_entry(variant, dim as u32).unwrap();
                assert_eq!(entry, expected_entry(v.name, dim));
                poison(&s.stream, &mut out).unwrap();
                table
                    .gather_dequant(&s.kernels, &s.stream, variant, &ids_dev, &mut out, &check)
                    .unwrap();
                check
                    .take(&s.stream, address(&s.stream, &ids_dev), n as u64, rows)
                    .unwrap();
                let got = s.stream.clone_dtoh(&out).unwrap();
                let got = got[..n * dim].to_vec();
                if let Some(i) = reference::first_bf16_mismatch(&got, &want) {
                    let (row, col) = (i / dim, i % dim);
                    let id = ids[row] as usize;
                    panic!(
                        "{what}: {entry} {placement:?} n={n}: element {col} of row {row} (id {id}): e4m3 {:#04x} scale {} -> {:#06x}, want {:#06x}",
                        weights[id * dim + col],
                        scales[id * dim / 32 + col / 32],
                        got[i],
                        want[i]
                    );
                }
                outputs.push(got);
            }
            // Both variants write the same bits, NaN payloads included.
            assert!(
                outputs.windows(2).all(|w| w[0] == w[1]),
                "{what}: variants differ bitwise"
            );
        }
    }
}

fn gather_dequant_is_exact_for_every_e4m3_byte_at_the_edge_scales() {
    let Some(mut s) = setup("gather_dequant edges") else {
        return;
    };
    let (weights, scales) = edge_table(&mut s.rng);
    check_dequant(&mut s, &weights, &scales, &[1, 31, 1000], "edge scales");
}

fn gather_dequant_matches_the_reference_on_random_rows() {
    let Some(mut s) = setup("gather_dequant random") else {
        return;
    };
    let rows = 1usize << 15;
    let weights = random_bytes(&mut s.rng, rows * DIM);
    let scales = random_bytes(&mut s.rng, rows * DIM / 32);
    check_dequant(&mut s, &weights, &scales, &SIZES, "random");
}

fn gather_dequant_matches_the_reference_at_other_dims() {
    let Some(mut s) = setup("gather_dequant dims") else {
        return;
    };
    // 32 and 96 give rows of 4 and 12 eight-element units (not a power of two); 288 and 512
    // rows that span warps unevenly.
    for dim in [32usize, 96, 288, 512] {
        let rows = 4099usize;
        let weights = random_bytes(&mut s.rng, rows * dim);
        let scales = random_bytes(&mut s.rng, rows * dim / 32);
        let what = format!("random, dim {dim}");
        check_dequant_dim(&mut s, &weights, &scales, dim, &[1, 37, 1000, 5003], &what);
    }
}

/// The baseline (sm_80) PTX, forced on this device: every gather and gather + dequant variant
/// it holds, bit-exact against the same references, on the same inputs as the tests above. It
/// holds exactly the variants that need nothing newer, and a launch of another says which arch
/// that variant needs.
fn the_baseline_ptx_matches_the_reference() {
    let Some(mut s) = setup_arch("baseline PTX", Some("sm_80")) else {
        return;
    };
    assert_eq!(s.kernels.arch(), "sm_80");
    assert_eq!(
        s.kernels.ptx_choice().reason,
        fetchahead::kernels::ptx::Reason::Forced
    );
    check_gathers(&mut s, DIM, &PLACEMENTS, &SIZES);
    check_gathers(&mut s, 48, &[Placement::Device], &[1, 31, 1000, 4099]);
    let (weights, scales) = edge_table(&mut s.rng);
    check_dequant(
        &mut s,
        &weights,
        &scales,
        &[1, 31, 1000],
        "baseline, edge scales",
    );
    let rows = 1usize << 15;
    let weights = random_bytes(&mut s.rng, rows * DIM);
    let scales = random_bytes(&mut s.rng, rows * DIM / 32);
    check_dequant(&mut s, &weights, &scales, &SIZES, "baseline, random");
    check_dequant_dim(
        &mut s,
        &weights[..4099 * 96],
        &scales[..4099 * 3],
        96,
        &[1, 37, 1000],
        "baseline, dim 96",
    );

    let needs = |name: &str| fetchahead::kernels::ptx::kernel_needs(name).unwrap();
    let variants: Vec<&str> = gather::VARIANTS
        .iter()
        .map(|v| v.name)
        .chain(
            fetchahead::device_abi::dequant::VARIANTS
                .iter()
                .map(|v| v.name),
        )
        .collect();
    let want_checked: Vec<&str> = variants
        .iter()
        .copied()
        .filter(|n| needs(n) <= 80)
        .collect();
    let want_absent: Vec<&str> = variants.iter().copied().filter(|n| needs(n) > 80).collect();
    assert_eq!(
        s.checked, want_checked,
        "the variants checked on the baseline"
    );
    assert_eq!(
        s.not_held, want_absent,
        "the variants left out of the baseline"
    );
    assert!(
        s.checked.len() >= 30,
        "{} variants checked",
        s.checked.len()
    );
    eprintln!(
        "baseline PTX: {} variants bit-exact, {} left out (they need sm_89 or sm_90)",
        s.checked.len(),
        s.not_held.len()
    );

    // A variant the baseline lacks: refused before any launch, naming the arch it needs.
    let p = fetchahead::device_abi::params::GatherParams {
        table: 0x1000,
        ids: 0x2000,
        out: 0x3000,
        status: 0x4000,
        n: 10,
        rows: 10,
        row_bytes: 256,
        _pad: 0,
        timeline: fetchahead::device_abi::params::TimelineParams::OFF,
    };
    let bulk = GatherVariant::named("gather_bulk").unwrap();
    // SAFETY: refused before launch (the loaded PTX does not hold it), so no address is touched.
    let result = unsafe { s.kernels.launch_gather(s.stream.cu_stream(), bulk, p) };
    match result {
        Err(e @ Error::KernelNeedsArch { needs: 90, .. }) => {
            let m = e.to_string();
            assert!(
                m.contains("gather_bulk")
                    && m.contains("sm_90")
                    && m.contains("FETCHAHEAD_PTX_ARCH"),
                "{m}"
            );
        }
        other => panic!("gather_bulk on the baseline: {other:?}"),
    }
}

fn ids_outside_the_table_write_zero_rows_and_are_reported() {
    let Some(mut s) = setup("bad ids") else {
        return;
    };
    let rows = 1000u64;
    let weights = random_bytes(&mut s.rng, rows as usize * DIM);
    let scales = vec![127u8; rows as usize * DIM / 32];
    let mut ids = random_ids(&mut s.rng, 5000, rows);
    let bad = [
        (17usize, -1i64),
        (18, rows as i64),
        (4000, i64::MAX),
        (4999, i64::MIN),
    ];
    for &(i, id) in &bad {
        ids[i] = id;
    }
    let ids_dev = s.stream.clone_htod(&ids).unwrap();
    let ids_address = address(&s.stream, &ids_dev);
    let mut check = IdCheck::new(&s.stream).unwrap();
    let expect_error = |result: Result<(), Error>, what: &str| match result {
        Err(Error::IdsOutOfRange {
            count,
            first_index,
            first_id,
            n,
            ..
        }) => {
            assert_eq!(
                (count, first_index, first_id, n),
                (4, 17, -1, 5000),
                "{what}"
            );
        }
        other => panic!("{what}: expected IdsOutOfRange, got {other:?}"),
    };

    let mut table =
        RowTable::from_bytes(&s.stream, &weights, DIM as u32, Placement::Device).unwrap();
    let mut out = s.stream.alloc_zeros::<u8>(ids.len() * DIM).unwrap();
    for variant in GatherVariant::all() {
        let v = variant.variant();
        poison(&s.stream, &mut out).unwrap();
        table
            .gather(&s.kernels, &s.stream, variant, &ids_dev, &mut out, &check)
            .unwrap();
        expect_error(
            check.take(&s.stream, ids_address, ids.len() as u64, rows),
            v.name,
        );
        let got = s.stream.clone_dtoh(&out).unwrap();
        assert_eq!(got, reference::gather(&weights, DIM, &ids), "{}", v.name);
        // The record was reset: a clean launch reports nothing.
        check
            .take(&s.stream, ids_address, ids.len() as u64, rows)
            .unwrap();
    }

    let mut mx =
        Mxfp8Table::from_bytes(&s.stream, &weights, &scales, DIM as u32, Placement::Device)
            .unwrap();
    let mut out = s.stream.alloc_zeros::<u16>(ids.len() * DIM).unwrap();
    for variant in DequantVariant::all() {
        let v = variant.variant();
        poison(&s.stream, &mut out).unwrap();
        mx.gather_dequant(&s.kernels, &s.stream, variant, &ids_dev, &mut out, &check)
            .unwrap();
        expect_error(
            check.take(&s.stream, ids_address, ids.len() as u64, rows),
            v.name,
        );
        let got = s.stream.clone_dtoh(&out).unwrap();
        let want = reference::gather_dequant(&weights, &scales, DIM, &ids);
        assert_eq!(
            reference::first_bf16_mismatch(&got, &want),
            None,
            "{}",
            v.name
        );
        for &(i, _) in &bad {
            assert!(
                got[i * DIM..(i + 1) * DIM].iter().all(|&x| x == 0),
                "{}: row {i} not zero",
                v.name
            );
        }
    }
}

fn launches_refuse_bad_shapes_with_an_error() {
    let Some(s) = setup("launch validation") else {
        return;
    };
    let stream = s.stream.cu_stream();
    let ok = fetchahead::device_abi::params::GatherParams {
        table: 0x1000,
        ids: 0x2000,
        out: 0x3000,
        status: 0x4000,
        n: 10,
        rows: 10,
        row_bytes: 256,
        _pad: 0,
        timeline: fetchahead::device_abi::params::TimelineParams::OFF,
    };
    let cases = [
        (
            "row width 24",
            fetchahead::device_abi::params::GatherParams {
                row_bytes: 24,
                ..ok
            },
        ),
        (
            "unaligned table",
            fetchahead::device_abi::params::GatherParams {
                table: 0x1008,
                ..ok
            },
        ),
        (
            "null out",
            fetchahead::device_abi::params::GatherParams { out: 0, ..ok },
        ),
        (
            "2^32 chunks",
            fetchahead::device_abi::params::GatherParams { n: 1 << 28, ..ok },
        ),
    ];
    let first = GatherVariant::at(0).unwrap();
    for (what, p) in cases {
        // SAFETY: every case is refused before launch, so no address is touched.
        let result = unsafe { s.kernels.launch_gather(stream, first, p) };
        assert!(
            matches!(result, Err(Error::Invalid { .. })),
            "{what}: {result:?}"
        );
    }
    // 2^26 rows of 256 elements are 2^31 units of 8 but 2^32 quads: a quad-pass variant, whose
    // threads index quads in 32 bits, refuses the call.
    let quads = fetchahead::device_abi::params::DequantParams {
        weights: 0x1000,
        scales: 0x2000,
        ids: 0x3000,
        out: 0x4000,
        rows: 10,
        n: 1 << 26,
        dim: 256,
        status: 0x5000,
        timeline: fetchahead::device_abi::params::TimelineParams::OFF,
    };
    let quad = DequantVariant::named("gather_dequant_quad_pass_b256").unwrap();
    // SAFETY: refused before launch, so no address is touched.
    let result = unsafe { s.kernels.launch_gather_dequant(stream, quad, quads) };
    assert!(
        matches!(result, Err(Error::Invalid { .. })),
        "2^32 quads: {result:?}"
    );
    // An index past the table makes no handle; a name no row has, no variant.
    assert!(GatherVariant::at(gather::VARIANTS.len()).is_none());
    let result = s.kernels.gather_variant(Some("no_such_gather"), 72);
    assert!(
        matches!(result, Err(Error::Invalid { .. })),
        "missing variant: {result:?}"
    );
}

common::harness::tests! {
    cpu: [
    ],
    gpu: [
        every_gather_variant_matches_the_reference,
        every_gather_variant_matches_the_reference_at_other_row_widths,
        gather_dequant_is_exact_for_every_e4m3_byte_at_the_edge_scales,
        gather_dequant_matches_the_reference_on_random_rows,
        gather_dequant_matches_the_reference_at_other_dims,
        ids_outside_the_table_write_zero_rows_and_are_reported,
        launches_refuse_bad_shapes_with_an_error,
        the_baseline_ptx_matches_the_reference,
    ],
}
