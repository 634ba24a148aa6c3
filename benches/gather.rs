//! Every gather and gather + dequant variant, 256-byte rows, random ids into a 4 GiB table (many
//! times the L2), n in {72, 4096, 1M, 4M}. Effective bandwidth counts table bytes read, output
//! bytes written and id bytes; its peer is a device-to-device copy of the same table and output
//! bytes measured in the same run (and a 1 GiB copy, printed for reference). At
//! n = 72 the peer is an empty kernel launched with the same grid. A pinned host table is
//! measured against a pinned host-to-device copy of the same bytes.
//!
//! `FETCHAHEAD_BENCH_TABLE_GIB` (default 4) sets the device table size.
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, sys};
use fetchahead::device_abi::params::{DequantParams, GatherParams};
use fetchahead::device_abi::{dequant, gather};
use fetchahead::gpu::Gpu;
use fetchahead::id_check::IdCheck;
use fetchahead::kernels::Kernels;
use fetchahead::table::TableMemory;
use rand::{Rng, RngExt, SeedableRng, rngs::SmallRng};

const DIM: u64 = 256;
const SIZES: [u64; 4] = [72, 4096, 1 << 20, 4 << 20];
const LAUNCHES_PER_SAMPLE: u32 = 20;

/// Median seconds per call of `f` over `samples` event-timed batches of `LAUNCHES_PER_SAMPLE`.
fn median_seconds(stream: &Arc<CudaStream>, samples: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<f64> = (0..samples)
        .map(|_| {
            event_timed(stream, LAUNCHES_PER_SAMPLE as u64, &mut f).as_secs_f64()
                / LAUNCHES_PER_SAMPLE as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
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

    // The table: random bytes written on the device (filling 4 GiB from the host would dominate).
    let mut weights = stream.alloc_zeros::<u8>((rows * DIM) as usize).unwrap();
    let mut scales = stream
        .alloc_zeros::<u8>((rows * DIM / 32) as usize)
        .unwrap();
    fill_random(&stream, &mut weights, &mut rng);
    fill_random(&stream, &mut scales, &mut rng);
    let max_n = *SIZES.last().unwrap();
    let ids: Vec<i64> = (0..max_n)
        .map(|_| rng.random_range(0..rows as i64))
        .collect();
    let ids_dev = stream.clone_htod(&ids).unwrap();
    let mut out = stream
        .alloc_zeros::<u8>((max_n * DIM * 2) as usize)
        .unwrap();
    let check = IdCheck::new(&stream).unwrap();
    let (w_addr, s_addr) = (weights.device_ptr(&stream).0, scales.device_ptr(&stream).0);
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

    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(800))
        .configure_from_args();
    let mut rows_out = Vec::new();
    for &n in &SIZES {
        let gp = gather_params((w_addr, rows), ids_addr, out_addr, check.address(), n);
        let dp = DequantParams {
            weights: w_addr,
            scales: s_addr,
            ids: ids_addr,
            out: out_addr,
            status: check.address(),
            n,
            rows,
            dim: DIM as u32,
            _pad: 0,
        };
        let gather_bytes = n * DIM * 2 + 8 * n;
        let (copy_s, copy_bytes) = (copy_of(n * DIM), (n * DIM).min(copy_bytes));
        if n > 72 {
            println!(
                "n = {n}: device-to-device copy of {:.0} MiB: {:.1} GB/s (read + write)",
                copy_bytes as f64 / (1 << 20) as f64,
                2.0 * copy_bytes as f64 / copy_s / 1e9
            );
        }
        let dequant_bytes = n * (DIM + DIM / 32) + n * DIM * 2 + 8 * n;
        let mut group = c.benchmark_group(format!("gather/n={n}"));
        // Criterion's samples and the summary's row (against the peer launched as gather
        // `peer_variant` over `gp`) for one kernel moving `bytes`.
        let mut measure = |name: &str, bytes: u64, peer_variant: usize, launch: &dyn Fn()| {
            group.throughput(Throughput::Bytes(bytes));
            group.bench_function(name, |b| {
                b.iter_custom(|iters| event_timed(&stream, iters, launch))
            });
            let seconds = median_seconds(&stream, 15, launch);
            rows_out.push(peer_row(
                &kernels,
                &stream,
                name,
                n,
                seconds,
                bytes,
                peer_variant,
                gp,
                copy_s,
                copy_bytes,
            ));
        };
        for (variant, v) in gather::VARIANTS.iter().enumerate() {
            // SAFETY: all addresses are live allocations of the sizes the params state.
            let launch = || unsafe { kernels.launch_gather(cu, variant, gp).unwrap() };
            measure(v.name, gather_bytes, variant, &launch);
        }
        for (variant, v) in dequant::VARIANTS.iter().enumerate() {
            // SAFETY: as above.
            let launch = || unsafe { kernels.launch_gather_dequant(cu, variant, dp).unwrap() };
            // The empty kernel gets the grid of the one-thread-per-chunk gather over the same rows.
            measure(v.name, dequant_bytes, 0, &launch);
        }
        group.finish();
    }

    // The access pattern alone: the same gathers at the largest n over ids 0, 1, 2, ... (each
    // warp's rows contiguous, as a copy reads), against the random ids above: where they are no
    // faster, what separates the kernels from the copy is not the random access.
    let sequential: Vec<i64> = (0..max_n as i64).collect();
    let sequential_dev = stream.clone_htod(&sequential).unwrap();
    let gp = gather_params(
        (w_addr, rows),
        sequential_dev.device_ptr(&stream).0,
        out_addr,
        check.address(),
        max_n,
    );
    let bytes = max_n * DIM * 2 + 8 * max_n;
    for (variant, v) in gather::VARIANTS.iter().enumerate() {
        // SAFETY: all addresses are live allocations of the sizes the params state.
        let launch = || unsafe { kernels.launch_gather(cu, variant, gp).unwrap() };
        rows_out.push(Row {
            what: format!("{} n={max_n} sequential ids", v.name),
            seconds: median_seconds(&stream, 15, launch),
            bytes,
            peer: "d2d copy",
            peer_seconds: copy_s,
            peer_bytes: 2 * copy_bytes,
        });
    }
    drop((copy_src, copy_dst, sequential_dev));

    // Pinned host table, read over the bus: 1 GiB, against a pinned host-to-device copy.
    let host_rows = (1u64 << 30) / DIM;
    let mut host = TableMemory::pinned_host(&gpu.ctx, (host_rows * DIM) as usize).unwrap();
    let host_addr = host.address(&stream);
    let mut group = c.benchmark_group("gather_pinned_host");
    for &n in &[4096u64, 1 << 20] {
        let host_ids: Vec<i64> = ids[..n as usize]
            .iter()
            .map(|&i| i % host_rows as i64)
            .collect();
        let host_ids_dev = stream.clone_htod(&host_ids).unwrap();
        let gp = gather_params(
            (host_addr, host_rows),
            host_ids_dev.device_ptr(&stream).0,
            out_addr,
            check.address(),
            n,
        );
        let bytes = n * DIM;
        let h2d_s = median_seconds(&stream, 10, || {
            // SAFETY: host_addr is a mapped pinned buffer of >= bytes; out holds >= bytes.
            unsafe {
                sys::cuMemcpyAsync(out_addr, host_addr, bytes as usize, cu)
                    .result()
                    .unwrap()
            }
        });
        for (variant, v) in gather::VARIANTS.iter().enumerate() {
            // SAFETY: as above.
            let launch = || unsafe { kernels.launch_gather(cu, variant, gp).unwrap() };
            group.throughput(Throughput::Bytes(bytes));
            group.bench_function(format!("{}/n={n}", v.name), |b| {
                b.iter_custom(|iters| event_timed(&stream, iters, launch))
            });
            let seconds = median_seconds(&stream, 10, launch);
            rows_out.push(Row {
                what: format!("{} pinned-host n={n}", v.name),
                seconds,
                bytes,
                peer: "pinned HtoD copy",
                peer_seconds: h2d_s,
                peer_bytes: bytes,
            });
        }
    }
    group.finish();

    println!(
        "\n{:<40} {:>10} {:>10}  {:<18} {:>10} {:>7}",
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
            "{:<40} {:>10.2} {:>10.1}  {:<18} {:>10} {:>7.3}",
            r.what,
            r.seconds * 1e6,
            bw / 1e9,
            r.peer,
            peer_value,
            ratio
        );
    }
    println!(
        "(ratio: bandwidth / copy bandwidth; for the empty-kernel peer, time / empty-kernel time)"
    );
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
    }
}

#[allow(clippy::too_many_arguments)]
fn peer_row(
    kernels: &Kernels,
    stream: &Arc<CudaStream>,
    name: &str,
    n: u64,
    seconds: f64,
    bytes: u64,
    variant: usize,
    gp: GatherParams,
    copy_s: f64,
    copy_bytes: u64,
) -> Row {
    if n <= 72 {
        // SAFETY: the empty kernel reads nothing.
        let empty = median_seconds(stream, 15, || unsafe {
            kernels
                .launch_empty(stream.cu_stream(), variant, gp)
                .unwrap()
        });
        Row {
            what: format!("{name} n={n}"),
            seconds,
            bytes,
            peer: "empty kernel",
            peer_seconds: empty,
            peer_bytes: 0,
        }
    } else {
        Row {
            what: format!("{name} n={n}"),
            seconds,
            bytes,
            peer: "d2d copy",
            peer_seconds: copy_s,
            peer_bytes: 2 * copy_bytes,
        }
    }
}

/// Random bytes in 64 MiB pieces, copied to the device. No byte is an E4M3 NaN code (0x7F,
/// 0xFF): a quantizer never writes one, and the packed dequant variant takes its slow exact path
/// for chunks holding one (the tests cover that path).
fn fill_random(stream: &Arc<CudaStream>, dst: &mut CudaSlice<u8>, rng: &mut SmallRng) {
    let mut piece = vec![0u8; 64 << 20];
    rng.fill_bytes(&mut piece);
    piece
        .iter_mut()
        .filter(|b| **b & 0x7F == 0x7F)
        .for_each(|b| *b ^= 1);
    let len = dst.len();
    let mut offset = 0;
    while offset < len {
        let take = piece.len().min(len - offset);
        stream
            .memcpy_htod(&piece[..take], &mut dst.slice_mut(offset..offset + take))
            .unwrap();
        offset += take;
    }
    stream.synchronize().unwrap();
}
