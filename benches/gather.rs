//! Every gather and gather + dequant variant, 256-byte rows, random ids into a 4 GiB table (many
//! times the L2), n in {72, 4096, 65536, 1M, 4M}, on three tables (`TableKind`): an MXFP8 quantization of
//! Gaussian weights (what an Engram table holds), uniformly random bytes (E4M3 NaN codes and every
//! scale included) and a low-entropy table (zero weights, one scale). Effective bandwidth counts
//! table bytes read, output bytes written and id bytes; its peer is a device-to-device copy of
//! the same table and output bytes measured in the same run (and a 1 GiB copy, printed for
//! reference). At n = 72 the peer is an empty kernel launched with the same grid. A pinned host
//! table is measured, on the same three tables, against a pinned host-to-device copy of the same
//! bytes. Criterion samples the quantized table; the others are timed by the summary's medians.
//!
//! The summary ends with each family's winners at each n: the variants whose slowest time over
//! the three device tables is within 2% of the smallest. These are eager launches, back to back;
//! the record of winners the defaults are checked against (`benches/recorded/winners.txt`)
//! comes from `benches/triton/peers.py --record`, which replays calls of up to 65536 rows from a
//! CUDA graph, as decode runs them.
//!
//! `FETCHAHEAD_BENCH_TABLE_GIB` (default 4) sets the device table size.
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, sys};
use fetchahead::device_abi::params::MX_BLOCK;
use fetchahead::device_abi::params::{DequantParams, GatherParams};
use fetchahead::driver::memory::memcpy_async;
use fetchahead::kernels::Kernels;
use fetchahead::kernels::gpu::Gpu;
use fetchahead::kernels::id_check::IdCheck;
use fetchahead::tables::table::TableMemory;
use fetchahead::{DequantVariant, GatherVariant};
use rand::{Rng, RngExt, SeedableRng, rngs::SmallRng};

const DIM: u64 = 256;
const SIZES: [u64; 5] = [72, 4096, 1 << 16, 1 << 20, 4 << 20];
const LAUNCHES_PER_SAMPLE: u32 = 20;
/// Rows generated once per table kind and repeated over the table (random ids over 4 GiB make
/// the repetition invisible to the caches).
const PIECE_ROWS: usize = 1 << 16;
/// Variants whose slowest-table time is within this factor of the fastest's are recorded as
/// tied winners at their size: a default must be within 2% of the best variant (issue 24).
const WINNER_TIE: f64 = 1.02;

/// What the table holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TableKind {
    /// MXFP8 by the OCP rule from Gaussian weights: per block of 32, scale = floor(log2(amax)) -
    /// 8 as E8M0, elements divided by 2^scale, clamped to +-448, rounded to E4M3.
    Quantized,
    /// Uniformly random weight and scale bytes, NaN codes included.
    RandomBytes,
    /// Zero weights, every scale 2^0.
    LowEntropy,
}

const TABLE_KINDS: [TableKind; 3] = [
    TableKind::Quantized,
    TableKind::RandomBytes,
    TableKind::LowEntropy,
];

impl TableKind {
    fn label(self) -> &'static str {
        match self {
            TableKind::Quantized => "quantized",
            TableKind::RandomBytes => "random-bytes",
            TableKind::LowEntropy => "low-entropy",
        }
    }

    /// `PIECE_ROWS` rows of weights and of scales.
    fn piece(self, rng: &mut SmallRng) -> (Vec<u8>, Vec<u8>) {
        let (elements, blocks) = (PIECE_ROWS * DIM as usize, PIECE_ROWS * (DIM / 32) as usize);
        match self {
            TableKind::Quantized => quantized_gaussian(rng, blocks),
            TableKind::RandomBytes => {
                let (mut w, mut s) = (vec![0u8; elements], vec![0u8; blocks]);
                rng.fill_bytes(&mut w);
                rng.fill_bytes(&mut s);
                (w, s)
            }
            TableKind::LowEntropy => (vec![0u8; elements], vec![127u8; blocks]),
        }
    }
}

/// `blocks` MX blocks of standard Gaussian weights quantized by the OCP rule.
fn quantized_gaussian(rng: &mut SmallRng, blocks: usize) -> (Vec<u8>, Vec<u8>) {
    let mut weights = Vec::with_capacity(blocks * MX_BLOCK as usize);
    let mut scales = Vec::with_capacity(blocks);
    let mut block = [0f32; MX_BLOCK as usize];
    for _ in 0..blocks {
        for pair in block.chunks_mut(2) {
            // Box-Muller: two standard normals from two uniforms.
            let (u, v): (f32, f32) = (rng.random_range(f32::EPSILON..1.0), rng.random());
            let r = (-2.0 * u.ln()).sqrt();
            let t = std::f32::consts::TAU * v;
            pair[0] = r * t.cos();
            pair[1] = r * t.sin();
        }
        let amax = block.iter().fold(0f32, |m, x| m.max(x.abs()));
        // E4M3's largest power of two is 2^8.
        let exp = if amax > 0.0 {
            amax.log2().floor() as i32 - 8
        } else {
            -127
        };
        let exp = exp.clamp(-127, 127);
        scales.push((exp + 127) as u8);
        let unit = 2f32.powi(exp);
        weights.extend(
            block
                .iter()
                .map(|x| float8::F8E4M3::from_f32((x / unit).clamp(-448.0, 448.0)).to_bits()),
        );
    }
    (weights, scales)
}

/// Median seconds per call of `f` over `samples` event-timed batches of `launches`.
fn median_seconds_of(
    stream: &Arc<CudaStream>,
    samples: usize,
    launches: u32,
    mut f: impl FnMut(),
) -> f64 {
    f();
    let mut times: Vec<f64> = (0..samples)
        .map(|_| event_timed(stream, launches as u64, &mut f).as_secs_f64() / launches as f64)
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Median seconds per call of `f` over `samples` event-timed batches of `LAUNCHES_PER_SAMPLE`.
fn median_seconds(stream: &Arc<CudaStream>, samples: usize, f: impl FnMut()) -> f64 {
    median_seconds_of(stream, samples, LAUNCHES_PER_SAMPLE, f)
}

/// criterion's sampling over CUDA events: `iters` calls between two events.
fn event_timed(stream: &Arc<CudaStream>, iters: u64, mut f: impl FnMut()) -> Duration {
    let ctx = stream.context();
    let (start, end) = (
        ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .unwrap(),
        ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .unwrap(),
    );
    start.record(stream).unwrap();
    for _ in 0..iters {
        f();
    }
    end.record(stream).unwrap();
    end.synchronize().unwrap();
    Duration::from_secs_f64(start.elapsed_ms(&end).unwrap() as f64 / 1e3)
}

struct Row {
    what: String,
    /// Family, variant, table and n, for the winners.
    key: Option<(&'static str, &'static str, TableKind, u64)>,
    seconds: f64,
    bytes: u64,
    peer: &'static str,
    peer_seconds: f64,
    peer_bytes: u64,
}

fn main() {
    let gpu = match Gpu::for_test("gather bench") {
        Ok(Some(gpu)) => gpu,
        Ok(None) => return,
        Err(e) => panic!("{e}"),
    };
    let kernels = Kernels::load(&gpu).unwrap();
    let stream = gpu.ctx.new_stream().unwrap();
    let cu = stream.cu_stream();
    let gib: u64 = std::env::var("FETCHAHEAD_BENCH_TABLE_GIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let rows = (gib << 30) / DIM;
    let mut rng = SmallRng::seed_from_u64(7);
    println!(
        "{} ({} SMs, L2 {} MiB), PTX {}; table {gib} GiB = {rows} rows of {DIM} B",
        gpu.name,
        gpu.multiprocessors,
        gpu.l2_bytes >> 20,
        kernels.arch()
    );

    let mut weights = stream.alloc_zeros::<u8>((rows * DIM) as usize).unwrap();
    let mut scales = stream
        .alloc_zeros::<u8>((rows * DIM / 32) as usize)
        .unwrap();
    let max_n = *SIZES.last().unwrap();
    let ids: Vec<i64> = (0..max_n)
        .map(|_| rng.random_range(0..rows as i64))
        .collect();
    let ids_dev = stream.clone_htod(&ids).unwrap();
    let mut out = stream
        .alloc_zeros::<u8>((max_n * DIM * 2) as usize)
        .unwrap();
    let check = IdCheck::new(&stream).unwrap();
    let ids_addr = ids_dev.device_ptr(&stream).0;
    let out_addr = out.device_ptr_mut(&stream).0;

    // Peer: a device-to-device copy of the bytes a gather of n rows reads and writes (read +
    // written bytes counted), measured per n; 1 GiB is the largest n's.
    let copy_bytes = 1u64 << 30;
    let copy_src = stream.alloc_zeros::<u8>(copy_bytes as usize).unwrap();
    let mut copy_dst = stream.alloc_zeros::<u8>(copy_bytes as usize).unwrap();
    let copy_s = median_seconds(&stream, 15, || {
        stream.memcpy_dtod(&copy_src, &mut copy_dst).unwrap()
    });
    let copy_bw = 2.0 * copy_bytes as f64 / copy_s;
    println!(
        "device-to-device copy of 1 GiB: {:.1} GB/s (read + write)",
        copy_bw / 1e9
    );
    // The same copy of `bytes` (a gather's table bytes): its median seconds.
    let mut copy_of = |bytes: u64| {
        let len = bytes.min(copy_bytes) as usize;
        let (src, mut dst) = (copy_src.slice(..len), copy_dst.slice_mut(..len));
        median_seconds(&stream, 15, || stream.memcpy_dtod(&src, &mut dst).unwrap())
    };
    let copies: Vec<(f64, u64)> = SIZES
        .iter()
        .map(|&n| (copy_of(n * DIM), (n * DIM).min(copy_bytes)))
        .collect();
    for (&n, &(copy_s, copy_bytes)) in SIZES.iter().zip(&copies) {
        if n > 72 {
            println!(
                "n = {n}: device-to-device copy of {:.0} MiB: {:.1} GB/s (read + write)",
                copy_bytes as f64 / (1 << 20) as f64,
                2.0 * copy_bytes as f64 / copy_s / 1e9
            );
        }
    }

    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_millis(300))
        .configure_from_args();
    let mut rows_out = Vec::new();
    for kind in TABLE_KINDS {
        fill_table(&stream, kind, &mut weights, &mut scales, &mut rng);
        let (w_addr, s_addr) = (weights.device_ptr(&stream).0, scales.device_ptr(&stream).0);
        for (&n, &(copy_s, copy_bytes)) in SIZES.iter().zip(&copies) {
            let gp = gather_params((w_addr, rows), ids_addr, out_addr, check.address(), n);
            let dp = dequant_params((w_addr, s_addr, rows), ids_addr, out_addr, &check, n);
            let gather_bytes = n * DIM * 2 + 8 * n;
            let dequant_bytes = n * (DIM + DIM / 32) + n * DIM * 2 + 8 * n;
            let sampled = kind == TableKind::Quantized;
            let mut group = c.benchmark_group(format!("gather/n={n}"));
            // Criterion's samples (quantized table only) and the summary's row, against
            // `empty` (an empty kernel with the variant's grid) at n = 72 and the copy above.
            let mut measure = |family: &'static str,
                               name: &'static str,
                               bytes: u64,
                               launch: &dyn Fn(),
                               empty: &dyn Fn()| {
                if sampled {
                    group.throughput(Throughput::Bytes(bytes));
                    group.bench_function(name, |b| {
                        b.iter_custom(|iters| event_timed(&stream, iters, launch))
                    });
                }
                let seconds = median_seconds(&stream, 15, launch);
                let (peer, peer_seconds, peer_bytes) = if n <= 72 {
                    ("empty kernel", median_seconds(&stream, 15, empty), 0)
                } else {
                    ("d2d copy", copy_s, 2 * copy_bytes)
                };
                rows_out.push(Row {
                    what: format!("{name} {} n={n}", kind.label()),
                    key: Some((family, name, kind, n)),
                    seconds,
                    bytes,
                    peer,
                    peer_seconds,
                    peer_bytes,
                });
            };
            for variant in GatherVariant::all() {
                let v = variant.variant();
                // SAFETY: all addresses are live allocations of the sizes the params state.
                let launch = || unsafe { kernels.launch_gather(cu, variant, gp).unwrap() };
                // SAFETY: the empty kernel reads nothing.
                let empty = || unsafe { kernels.launch_empty(cu, variant, gp).unwrap() };
                measure("gather", v.name, gather_bytes, &launch, &empty);
            }
            for variant in DequantVariant::all() {
                let v = variant.variant();
                // SAFETY: as above.
                let launch = || unsafe { kernels.launch_gather_dequant(cu, variant, dp).unwrap() };
                // SAFETY: the empty kernel reads nothing.
                let empty =
                    || unsafe { kernels.launch_empty_like_dequant(cu, variant, dp).unwrap() };
                measure("dequant", v.name, dequant_bytes, &launch, &empty);
            }
            group.finish();
        }
    }

    // The access pattern alone: the gathers at the largest n over ids 0, 1, 2, ... (each warp's
    // rows contiguous, as a copy reads), against the random ids above: where they are no faster,
    // what separates the kernels from the copy is not the random access.
    let sequential: Vec<i64> = (0..max_n as i64).collect();
    let sequential_dev = stream.clone_htod(&sequential).unwrap();
    let w_addr = weights.device_ptr(&stream).0;
    let gp = gather_params(
        (w_addr, rows),
        sequential_dev.device_ptr(&stream).0,
        out_addr,
        check.address(),
        max_n,
    );
    let bytes = max_n * DIM * 2 + 8 * max_n;
    let (copy_s, copy_bytes) = *copies.last().unwrap();
    for variant in GatherVariant::all() {
        let v = variant.variant();
        // SAFETY: all addresses are live allocations of the sizes the params state.
        let launch = || unsafe { kernels.launch_gather(cu, variant, gp).unwrap() };
        rows_out.push(Row {
            what: format!("{} n={max_n} sequential ids", v.name),
            key: None,
            seconds: median_seconds(&stream, 15, launch),
            bytes,
            peer: "d2d copy",
            peer_seconds: copy_s,
            peer_bytes: 2 * copy_bytes,
        });
    }
    drop((copy_src, copy_dst, sequential_dev, weights, scales));

    // Pinned host table, read over the bus: 1 GiB, against a pinned host-to-device copy, on the
    // same three tables.
    let host_rows = (1u64 << 30) / DIM;
    let mut host_w = TableMemory::pinned_host(&gpu.ctx, (host_rows * DIM) as usize).unwrap();
    let mut host_s = TableMemory::pinned_host(&gpu.ctx, (host_rows * DIM / 32) as usize).unwrap();
    let (hw_addr, hs_addr) = (host_w.address(&stream), host_s.address(&stream));
    for kind in TABLE_KINDS {
        let (w_piece, s_piece) = kind.piece(&mut rng);
        fill_pinned(&mut host_w, &w_piece);
        fill_pinned(&mut host_s, &s_piece);
        for &n in &[4096u64, 1 << 20] {
            let host_ids: Vec<i64> = ids[..n as usize]
                .iter()
                .map(|&i| i % host_rows as i64)
                .collect();
            let host_ids_dev = stream.clone_htod(&host_ids).unwrap();
            let hids = host_ids_dev.device_ptr(&stream).0;
            let gp = gather_params((hw_addr, host_rows), hids, out_addr, check.address(), n);
            let dp = dequant_params((hw_addr, hs_addr, host_rows), hids, out_addr, &check, n);
            let bytes = n * DIM;
            let h2d_s = median_seconds_of(&stream, 5, 5, || {
                // SAFETY: hw_addr is a mapped pinned buffer of >= bytes; out holds >= bytes.
                unsafe { memcpy_async(out_addr, hw_addr, bytes as usize, cu).unwrap() }
            });
            let mut push = |name: &str, seconds: f64| {
                rows_out.push(Row {
                    what: format!("{name} pinned-host {} n={n}", kind.label()),
                    key: None,
                    seconds,
                    bytes,
                    peer: "pinned HtoD copy",
                    peer_seconds: h2d_s,
                    peer_bytes: bytes,
                })
            };
            for variant in GatherVariant::all() {
                let v = variant.variant();
                // SAFETY: as above.
                let launch = || unsafe { kernels.launch_gather(cu, variant, gp).unwrap() };
                push(v.name, median_seconds_of(&stream, 5, 5, launch));
            }
            for variant in DequantVariant::all() {
                let v = variant.variant();
                // SAFETY: as above.
                let launch = || unsafe { kernels.launch_gather_dequant(cu, variant, dp).unwrap() };
                push(v.name, median_seconds_of(&stream, 5, 5, launch));
            }
        }
    }

    println!(
        "\n{:<56} {:>10} {:>10}  {:<18} {:>10} {:>7}",
        "kernel", "time us", "GB/s", "peer", "peer", "ratio"
    );
    for r in &rows_out {
        let bw = r.bytes as f64 / r.seconds;
        let (peer_value, ratio) = if r.peer == "empty kernel" {
            (
                format!("{:.2} us", r.peer_seconds * 1e6),
                r.seconds / r.peer_seconds,
            )
        } else {
            let peer_bw = r.peer_bytes as f64 / r.peer_seconds;
            (format!("{:.1} GB/s", peer_bw / 1e9), bw / peer_bw)
        };
        println!(
            "{:<56} {:>10.2} {:>10.1}  {:<18} {:>10} {:>7.3}",
            r.what,
            r.seconds * 1e6,
            bw / 1e9,
            r.peer,
            peer_value,
            ratio
        );
    }
    println!(
        "(ratio: bandwidth / copy bandwidth; for the empty-kernel peer, time / empty-kernel time; \
         pinned-host bytes: the table bytes a gather reads)"
    );
    spread_and_winners(&rows_out, kernels.arch());
}

/// Per variant at the sizes of at least 1M: its slowest over its fastest table time (the issue's
/// data-independence bound is 1.1). Then each family's winners at each n: the variants within
/// 2% of the smallest worst time over the three tables.
fn spread_and_winners(rows: &[Row], arch: &str) {
    use std::collections::BTreeMap;
    let mut by_variant: BTreeMap<(&str, &str, u64), Vec<f64>> = BTreeMap::new();
    for r in rows {
        if let Some((family, name, _, n)) = r.key {
            by_variant
                .entry((family, name, n))
                .or_default()
                .push(r.seconds);
        }
    }
    println!(
        "\n{:<44} {:>9} {:>11} {:>11} {:>7}",
        "variant (3 tables)", "n", "best us", "worst us", "spread"
    );
    for ((_, name, n), times) in &by_variant {
        if *n < 1 << 20 || times.len() < TABLE_KINDS.len() {
            continue;
        }
        let best = times.iter().copied().fold(f64::INFINITY, f64::min);
        let worst = times.iter().copied().fold(0.0, f64::max);
        println!(
            "{:<44} {:>9} {:>11.2} {:>11.2} {:>7.3}",
            name,
            n,
            best * 1e6,
            worst * 1e6,
            worst / best
        );
    }
    for n in SIZES {
        for family in ["gather", "dequant"] {
            let mut worst: Vec<(&str, f64)> = by_variant
                .iter()
                .filter(|((f, _, m), t)| *f == family && *m == n && t.len() == TABLE_KINDS.len())
                .map(|((_, name, _), t)| (*name, t.iter().copied().fold(0.0, f64::max)))
                .collect();
            worst.sort_by(|a, b| a.1.total_cmp(&b.1));
            let Some(&(_, best)) = worst.first() else {
                continue;
            };
            let tied: Vec<&str> = worst
                .iter()
                .take_while(|(_, t)| *t <= best * WINNER_TIE)
                .map(|(name, _)| *name)
                .collect();
            println!(
                "winners {arch} {family} n={n} (within {:.0}% of {:.2} us, slowest table): {}",
                (WINNER_TIE - 1.0) * 100.0,
                best * 1e6,
                tied.join(" ")
            );
        }
    }
}

/// A gather of `n` ids at `ids` from `table` (address, rows of `DIM` bytes) into `out`.
fn gather_params(table: (u64, u64), ids: u64, out: u64, status: u64, n: u64) -> GatherParams {
    GatherParams {
        table: table.0,
        ids,
        out,
        status,
        n,
        rows: table.1,
        row_bytes: DIM as u32,
        _pad: 0,
        timeline: fetchahead::device_abi::params::TimelineParams::OFF,
    }
}

/// A gather + dequant of `n` ids at `ids` from `table` (weights, scales, rows) into `out`.
fn dequant_params(
    table: (u64, u64, u64),
    ids: u64,
    out: u64,
    check: &IdCheck,
    n: u64,
) -> DequantParams {
    DequantParams {
        weights: table.0,
        scales: table.1,
        ids,
        out,
        rows: table.2,
        n: n as u32,
        dim: DIM as u32,
        status: check.address(),
        timeline: fetchahead::device_abi::params::TimelineParams::OFF,
    }
}

/// Fills the device table with `kind`'s piece, repeated.
fn fill_table(
    stream: &Arc<CudaStream>,
    kind: TableKind,
    weights: &mut CudaSlice<u8>,
    scales: &mut CudaSlice<u8>,
    rng: &mut SmallRng,
) {
    let (w, s) = kind.piece(rng);
    for (dst, piece) in [(weights, w), (scales, s)] {
        let len = dst.len();
        let mut offset = 0;
        while offset < len {
            let take = piece.len().min(len - offset);
            stream
                .memcpy_htod(&piece[..take], &mut dst.slice_mut(offset..offset + take))
                .unwrap();
            offset += take;
        }
    }
    stream.synchronize().unwrap();
}

/// Fills a pinned host table with `piece`, repeated.
fn fill_pinned(memory: &mut TableMemory, piece: &[u8]) {
    let TableMemory::PinnedHost { host, .. } = memory else {
        unreachable!("a pinned host table")
    };
    let bytes = host.as_mut_slice().unwrap();
    for chunk in bytes.chunks_mut(piece.len()) {
        chunk.copy_from_slice(&piece[..chunk.len()]);
    }
}
