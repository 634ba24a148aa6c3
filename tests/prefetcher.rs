//! The prefetcher: staging capacity rules and lookup error paths on the CPU; on a GPU, prefetched
//! output against the synchronous path and the CPU reference, eagerly and replayed from a CUDA
//! graph with new ids each replay, check mode, and injected lookup failures; the tagged gathers
//! ([`Join::Tags`]) the same ways, waiting for a slow lookup, and giving up on a stalled one.
// The self-check's CPU reference (`fetchahead::selfcheck::reference`), one source; each test
// file uses part of it.
mod common;
#[allow(dead_code)]
#[path = "../host/selfcheck/reference.rs"]
mod reference;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, sys};
use fetchahead::kernels::Kernels;
use fetchahead::kernels::gpu::Gpu;
use fetchahead::prefetch::flag_worker::FlagLane;
use fetchahead::prefetch::lookup::MemoryRows;
use fetchahead::prefetch::prefetcher::{Completion, Join, Prefetcher, PrefetcherConfig};
use fetchahead::prefetch::staging::StagingLayout;
use fetchahead::row_lookup::{RowLookup, lookup_or_zero};
use fetchahead::selfcheck;
use fetchahead::{Error, Result};
use rand::{RngExt, SeedableRng, rngs::SmallRng};

const DIM: usize = 256;

// ---------------------------------------------------------------- CPU: staging capacity rules

fn staging_capacity_rounds_up_to_a_power_of_two() {
    for (rows, want) in [(1, 1), (3, 4), (4096, 4096), (4097, 8192), (1000, 1024)] {
        let layout = StagingLayout::new(rows, DIM).unwrap();
        assert_eq!(layout.capacity(), want, "{rows} rows");
        assert_eq!(layout.weight_bytes(want), want * DIM);
        assert_eq!(layout.scale_bytes(want), want * DIM / 32);
    }
    let max = StagingLayout::MAX_CAPACITY;
    assert_eq!(StagingLayout::new(max, DIM).unwrap().capacity(), max);
}

fn staging_refuses_no_rows_too_many_rows_and_bad_dims() {
    let max = StagingLayout::MAX_CAPACITY;
    for (rows, dim) in [
        (0, DIM),
        (max + 1, DIM),
        (16, 0),
        (16, 48),
        (16, 33),
        (16, 1 << 17),
    ] {
        let err = StagingLayout::new(rows, dim).unwrap_err();
        assert!(
            matches!(err, Error::Invalid { .. }),
            "{rows} x {dim}: {err}"
        );
    }
}

fn staging_count_beyond_capacity_is_an_error_naming_both() {
    let layout = StagingLayout::new(100, DIM).unwrap();
    assert!(layout.check_count(0).is_ok());
    assert!(layout.check_count(128).is_ok());
    let err = layout.check_count(129).unwrap_err();
    assert!(
        matches!(
            err,
            Error::StagingFull {
                count: 129,
                capacity: 128
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("129") && err.to_string().contains("128"),
        "{err}"
    );
}

// ---------------------------------------------------------------- CPU: lookups and their errors

fn lookup(store: &dyn RowLookup, ids: &[i64]) -> (Result<()>, Vec<u8>, Vec<u8>) {
    let dim = store.dim();
    // Poisoned, so that a row the lookup leaves unwritten shows.
    let mut w = vec![0xAA; ids.len() * dim];
    let mut s = vec![0xAA; ids.len() * dim / 32];
    let r = lookup_or_zero(store, ids, &mut w, &mut s);
    (r, w, s)
}

fn memory_rows_are_deterministic_numbers_and_looked_up_in_order() {
    let a = MemoryRows::generate(1000, DIM, 7).unwrap();
    let b = MemoryRows::generate(1000, DIM, 7).unwrap();
    let c = MemoryRows::generate(1000, DIM, 8).unwrap();
    assert_eq!(a.weights(), b.weights());
    assert_eq!(a.scales(), b.scales());
    assert_ne!(a.weights(), c.weights());
    assert!(
        a.weights().iter().all(|w| w & 0x7F != 0x7F),
        "an E4M3 NaN in the table"
    );
    assert!(a.scales().iter().all(|s| (120..135).contains(s)));

    let ids = [999, 0, 5, 5, 123];
    let (r, w, s) = lookup(&a, &ids);
    r.unwrap();
    for (i, &id) in ids.iter().enumerate() {
        let id = id as usize;
        assert_eq!(
            w[i * DIM..(i + 1) * DIM],
            a.weights()[id * DIM..(id + 1) * DIM],
            "row {i}"
        );
        assert_eq!(
            s[i * 8..(i + 1) * 8],
            a.scales()[id * 8..(id + 1) * 8],
            "scales of row {i}"
        );
    }
    assert_eq!(a.lookups(), 1);
}

fn memory_rows_refuse_bad_dims_and_buffers() {
    assert!(MemoryRows::generate(10, 33, 1).is_err());
    assert!(MemoryRows::generate(10, 0, 1).is_err());
    let t = MemoryRows::generate(10, DIM, 1).unwrap();
    let mut w = vec![0; 2 * DIM];
    let mut s = vec![0; 2 * DIM / 32 - 1];
    let err = t.lookup(&[1, 2], &mut w, &mut s).unwrap_err();
    assert!(matches!(err, Error::Invalid { .. }), "{err}");
}

fn a_failed_lookup_zero_fills_every_row_and_names_the_row() {
    let t = MemoryRows::generate(100, DIM, 3).unwrap();
    let (r, w, s) = lookup(&t, &[1, 2, 100, 4]);
    assert!(
        matches!(r, Err(Error::RowOutOfRange { id: 100, rows: 100 })),
        "{r:?}"
    );
    assert!(w.iter().chain(&s).all(|&b| b == 0), "rows not zero-filled");

    let (r, _, _) = lookup(&t, &[1, -1]);
    assert!(
        matches!(r, Err(Error::RowOutOfRange { id: -1, .. })),
        "{r:?}"
    );

    t.fail_on_id(Some(7));
    let (r, w, _) = lookup(&t, &[1, 7, 9]);
    assert!(matches!(r, Err(Error::InjectedFault { id: 7 })), "{r:?}");
    assert!(w.iter().all(|&b| b == 0));
    assert!(lookup(&t, &[1, 9]).0.is_ok());
    t.fail_on_id(None);
    assert!(lookup(&t, &[7]).0.is_ok());

    t.fail_next(2);
    assert!(lookup(&t, &[1]).0.is_err());
    assert!(lookup(&t, &[1]).0.is_err());
    assert!(lookup(&t, &[1]).0.is_ok());
}

fn a_corrupted_lookup_differs_in_one_byte_without_an_error() {
    let t = MemoryRows::generate(100, DIM, 4).unwrap();
    let (_, good, _) = lookup(&t, &[3, 4]);
    t.corrupt_next(1);
    let (r, bad, _) = lookup(&t, &[3, 4]);
    r.unwrap();
    assert_eq!(good.iter().zip(&bad).filter(|(a, b)| a != b).count(), 1);
    assert_eq!(lookup(&t, &[3, 4]).1, good);
}

/// A store that panics when asked for row 13.
struct PanickingRows(MemoryRows);

impl RowLookup for PanickingRows {
    fn dim(&self) -> usize {
        self.0.dim()
    }
    fn lookup(&self, ids: &[i64], w: &mut [u8], s: &mut [u8]) -> Result<()> {
        if ids.contains(&13) {
            panic!("row 13 is cursed");
        }
        self.0.lookup(ids, w, s)
    }
}

fn a_panicking_lookup_becomes_an_error_with_zero_rows() {
    let t = PanickingRows(MemoryRows::generate(100, DIM, 5).unwrap());
    let (r, w, s) = lookup(&t, &[1, 13]);
    match r {
        Err(Error::LookupPanicked(why)) => assert!(why.contains("cursed"), "{why}"),
        other => panic!("expected LookupPanicked, got {other:?}"),
    }
    assert!(w.iter().chain(&s).all(|&b| b == 0));
}

// ---------------------------------------------------------------- GPU

struct Setup {
    kernels: Arc<Kernels>,
    main: Arc<CudaStream>,
    /// One GPU test at a time: a test's context-wide synchronize must not meet another test's
    /// graph capture.
    _serial: MutexGuard<'static, ()>,
}

static GPU_TESTS: Mutex<()> = Mutex::new(());

fn setup(what: &str) -> Result<Option<Setup>> {
    let serial = GPU_TESTS.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(gpu) = Gpu::for_test(what)? else {
        return Ok(None);
    };
    let kernels = Arc::new(Kernels::load(&gpu)?);
    // SAFETY: these tests use every cudarc slice on `main` only, synchronizing before reading;
    // graph captures must not record cudarc's tracking events.
    unsafe { gpu.ctx.disable_event_tracking() };
    let main = gpu.ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
    Ok(Some(Setup {
        kernels,
        main,
        _serial: serial,
    }))
}

fn cuda(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |source| Error::Cuda { call, source }
}

fn seeded(what: &str) -> SmallRng {
    let seed = selfcheck::fresh_seed();
    eprintln!("{what}: seed {seed}");
    SmallRng::seed_from_u64(seed)
}

fn random_ids(rng: &mut SmallRng, n: usize, rows: u64) -> Vec<i64> {
    (0..n).map(|_| rng.random_range(0..rows as i64)).collect()
}

fn addr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    s.device_ptr(stream).0
}

fn read(main: &Arc<CudaStream>, out: &CudaSlice<u16>, n: usize) -> Result<Vec<u16>> {
    main.synchronize().map_err(cuda("cuStreamSynchronize"))?;
    let all = main.clone_dtoh(out).map_err(cuda("cuMemcpyDtoH"))?;
    Ok(all[..n].to_vec())
}

fn assert_matches_reference(got: &[u16], table: &MemoryRows, ids: &[i64], what: &str) {
    let want = reference::gather_dequant(table.weights(), table.scales(), DIM, ids);
    if let Some(i) = reference::first_bf16_mismatch(got, &want) {
        panic!(
            "{what}: element {i} (row {}, id {}) differs from the reference",
            i / DIM,
            ids[i / DIM]
        );
    }
}

fn new_prefetcher(
    s: &Setup,
    table: &Arc<MemoryRows>,
    config: PrefetcherConfig,
) -> Result<Prefetcher> {
    Prefetcher::new(
        s.kernels.clone(),
        table.clone() as Arc<dyn RowLookup>,
        config,
    )
}

/// Captures one prefetch + gather of `count` ids from `ids` into `out` on `main`.
fn capture(
    s: &Setup,
    p: &mut Prefetcher,
    ids: &CudaSlice<i64>,
    count: usize,
    out: &CudaSlice<u16>,
) -> Result<cudarc::driver::CudaGraph> {
    let (ids, out) = (addr(ids, &s.main), addr(out, &s.main));
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    s.main
        .begin_capture(mode)
        .map_err(cuda("cuStreamBeginCapture"))?;
    // SAFETY: `ids` and `out` are live allocations of `count` ids and `count * DIM` bf16 that
    // outlive the graph's replays; the graph is dropped before the prefetcher.
    let enqueued = unsafe {
        p.prefetch(ids, count, s.main.cu_stream())
            .and_then(|()| p.gather_dequant(out, s.main.cu_stream()))
            .and_then(|()| p.finish(s.main.cu_stream()))
    };
    let graph = s
        .main
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .map_err(cuda("cuStreamEndCapture"))?;
    enqueued?;
    graph.ok_or_else(|| Error::Invalid {
        what: "graph",
        why: "the capture recorded nothing".into(),
    })
}

fn prefetched_output_equals_the_synchronous_path_eagerly() -> Result<()> {
    eager_equals_synchronous(Completion::HostFunction, Join::AtGather)
}

fn tagged_output_equals_the_synchronous_path_eagerly() -> Result<()> {
    eager_equals_synchronous(Completion::Flag, Join::Tags)
}

fn prefetched_output_equals_the_synchronous_path_eagerly_in_flag_mode() -> Result<()> {
    eager_equals_synchronous(Completion::Flag, Join::AtGather)
}

fn eager_equals_synchronous(completion: Completion, join: Join) -> Result<()> {
    let what = format!("eager_equals_synchronous({completion:?}, {join:?})");
    let Some(s) = setup(&what)? else {
        return Ok(());
    };
    let mut rng = seeded(&what);
    let table = Arc::new(MemoryRows::generate(1 << 14, DIM, rng.random())?);
    let mut p = new_prefetcher(
        &s,
        &table,
        PrefetcherConfig {
            capacity: 1000,
            completion,
            join,
            ..Default::default()
        },
    )?;
    assert_eq!(p.capacity(), 1024);
    let steps = 8;
    for step in 0..steps {
        let count = if step == 0 {
            1024
        } else {
            rng.random_range(1..=1024)
        };
        let ids = random_ids(&mut rng, count, table.rows());
        let ids_dev = s.main.clone_htod(&ids).map_err(cuda("cuMemcpyHtoD"))?;
        let mut out = s
            .main
            .alloc_zeros::<u16>(count * DIM)
            .map_err(cuda("cuMemAlloc"))?;
        let mut out_sync = s
            .main
            .alloc_zeros::<u16>(count * DIM)
            .map_err(cuda("cuMemAlloc"))?;
        selfcheck::poison(&s.main, &mut out)?;
        selfcheck::poison(&s.main, &mut out_sync)?;
        let (i, o, os) = (
            addr(&ids_dev, &s.main),
            addr(&out, &s.main),
            addr(&out_sync, &s.main),
        );
        let main = s.main.cu_stream();
        // SAFETY: the ids and outputs are live allocations of the sizes given, read below
        // after the stream is synchronized.
        unsafe {
            p.prefetch(i, count, main)?;
            p.gather_dequant(o, main)?;
            p.finish(main)?;
            p.gather_dequant_sync(i, count, os, main)?;
        }
        let got = read(&s.main, &out, count * DIM)?;
        let got_sync = read(&s.main, &out_sync, count * DIM)?;
        assert!(
            got == got_sync,
            "step {step}: prefetched output differs from the synchronous path"
        );
        assert_matches_reference(&got, &table, &ids, &format!("step {step}"));
    }
    let stats = p.stats();
    assert_eq!(
        (stats.prefetches, stats.gathers, stats.sync_gathers),
        (steps, steps, steps)
    );
    assert_eq!(
        (stats.lookups, stats.lookup_errors, stats.fell_back),
        (2 * steps, 0, false)
    );
    assert!(p.take_errors().is_empty());
    assert_eq!(p.late_rows()?, 0);
    Ok(())
}

fn prefetched_output_is_right_in_a_graph_replayed_with_new_ids() -> Result<()> {
    graph_replays_are_right(Completion::HostFunction, Join::AtGather)
}

fn prefetched_output_is_right_in_a_graph_replayed_with_new_ids_in_flag_mode() -> Result<()> {
    graph_replays_are_right(Completion::Flag, Join::AtGather)
}

fn tagged_output_is_right_in_a_graph_replayed_with_new_ids() -> Result<()> {
    graph_replays_are_right(Completion::Flag, Join::Tags)
}

fn graph_replays_are_right(completion: Completion, join: Join) -> Result<()> {
    let what = format!("graph_replays_are_right({completion:?}, {join:?})");
    let Some(s) = setup(&what)? else {
        return Ok(());
    };
    let mut rng = seeded(&what);
    let table = Arc::new(MemoryRows::generate(1 << 15, DIM, rng.random())?);
    let mut p = new_prefetcher(
        &s,
        &table,
        PrefetcherConfig {
            capacity: 1024,
            completion,
            join,
            ..Default::default()
        },
    )?;
    let count = 777;
    let mut ids_dev = s
        .main
        .alloc_zeros::<i64>(count)
        .map_err(cuda("cuMemAlloc"))?;
    let mut out = s
        .main
        .alloc_zeros::<u16>(count * DIM)
        .map_err(cuda("cuMemAlloc"))?;
    let mut out_sync = s
        .main
        .alloc_zeros::<u16>(count * DIM)
        .map_err(cuda("cuMemAlloc"))?;
    p.warm()?;
    let graph = capture(&s, &mut p, &ids_dev, count, &out)?;
    let before = p.stats();
    let replays = 20;
    let mut ids = random_ids(&mut rng, count, table.rows());
    for replay in 0..replays {
        // Every other replay keeps the first half of the last replay's ids in place, so that
        // tags left from the last replay already match there.
        let fresh = random_ids(&mut rng, count, table.rows());
        let keep = if replay % 2 == 1 { count / 2 } else { 0 };
        ids[keep..].copy_from_slice(&fresh[keep..]);
        s.main
            .memcpy_htod(&ids, &mut ids_dev)
            .map_err(cuda("cuMemcpyHtoD"))?;
        selfcheck::poison(&s.main, &mut out)?;
        selfcheck::poison(&s.main, &mut out_sync)?;
        graph.launch().map_err(cuda("cuGraphLaunch"))?;
        let (i, os) = (addr(&ids_dev, &s.main), addr(&out_sync, &s.main));
        // SAFETY: live allocations of `count` ids and `count * DIM` bf16.
        unsafe { p.gather_dequant_sync(i, count, os, s.main.cu_stream())? };
        let got = read(&s.main, &out, count * DIM)?;
        let got_sync = read(&s.main, &out_sync, count * DIM)?;
        assert!(
            got == got_sync,
            "replay {replay}: graph output differs from the synchronous path"
        );
        assert_matches_reference(&got, &table, &ids, &format!("replay {replay}"));
    }
    let after = p.stats();
    // Each replay ran its own lookup (and the synchronous path one more).
    assert_eq!(after.lookups - before.lookups, 2 * replays);
    assert_eq!(
        after.rows_looked_up - before.rows_looked_up,
        2 * replays * count as u64
    );
    assert_eq!(after.lookup_errors, 0);
    assert_eq!(p.late_rows()?, 0);
    drop(graph);
    Ok(())
}

/// A store whose lookups take `delay` first.
struct SlowRows {
    rows: MemoryRows,
    delay: Duration,
}

impl RowLookup for SlowRows {
    fn dim(&self) -> usize {
        self.rows.dim()
    }
    fn lookup(&self, ids: &[i64], w: &mut [u8], s: &mut [u8]) -> Result<()> {
        std::thread::sleep(self.delay);
        self.rows.lookup(ids, w, s)
    }
}

/// What [`tagged_gather_of_a_slow_lookup`] saw.
struct SlowGather {
    out: Vec<u16>,
    ids: Vec<i64>,
    table: MemoryRows,
    late: u32,
}

/// One eager tagged prefetch + gather of `count` random ids from a store that takes `delay`
/// per lookup, with `timeout` for the tags: the output, the ids and the late rows counted.
fn tagged_gather_of_a_slow_lookup(
    what: &str,
    delay: Duration,
    timeout: Duration,
) -> Result<Option<SlowGather>> {
    let Some(s) = setup(what)? else {
        return Ok(None);
    };
    let mut rng = seeded(what);
    let seed = rng.random();
    let slow = Arc::new(SlowRows {
        rows: MemoryRows::generate(1 << 12, DIM, seed)?,
        delay,
    });
    let mut p = Prefetcher::new(
        s.kernels.clone(),
        slow.clone() as Arc<dyn RowLookup>,
        PrefetcherConfig {
            capacity: 256,
            join: Join::Tags,
            tag_timeout: timeout,
            ..Default::default()
        },
    )?;
    p.warm()?;
    let count = 200;
    let ids = random_ids(&mut rng, count, 1 << 12);
    let ids_dev = s.main.clone_htod(&ids).map_err(cuda("cuMemcpyHtoD"))?;
    let mut out = s
        .main
        .alloc_zeros::<u16>(count * DIM)
        .map_err(cuda("cuMemAlloc"))?;
    selfcheck::poison(&s.main, &mut out)?;
    let main = s.main.cu_stream();
    // SAFETY: live allocations of `count` ids and `count * DIM` bf16, read after the stream is
    // synchronized.
    unsafe {
        p.prefetch(addr(&ids_dev, &s.main), count, main)?;
        p.gather_dequant(addr(&out, &s.main), main)?;
    }
    // The gather was enqueued while the lookup still slept: read its output before the side
    // stream is joined, so that only the tags ordered it.
    let got = read(&s.main, &out, count * DIM)?;
    let late = p.late_rows()?;
    // SAFETY: the stream the gather was given.
    unsafe { p.finish(main)? };
    s.main.synchronize().map_err(cuda("cuStreamSynchronize"))?;
    Ok(Some(SlowGather {
        out: got,
        ids,
        table: MemoryRows::generate(1 << 12, DIM, seed)?,
        late,
    }))
}

fn a_tagged_gather_waits_for_a_slow_lookup() -> Result<()> {
    let what = "a_tagged_gather_waits_for_a_slow_lookup";
    let Some(g) =
        tagged_gather_of_a_slow_lookup(what, Duration::from_millis(50), Duration::from_secs(5))?
    else {
        return Ok(());
    };
    assert_eq!(g.late, 0, "no row may be given up on");
    assert_matches_reference(&g.out, &g.table, &g.ids, what);
    Ok(())
}

fn a_tagged_gather_gives_up_on_a_stalled_lookup_with_zeros_and_a_count() -> Result<()> {
    let what = "a_tagged_gather_gives_up_on_a_stalled_lookup";
    let Some(g) = tagged_gather_of_a_slow_lookup(
        what,
        Duration::from_millis(500),
        Duration::from_millis(20),
    )?
    else {
        return Ok(());
    };
    assert_eq!(g.late as usize, g.ids.len(), "every row was late");
    assert!(g.out.iter().all(|&b| b == 0), "late rows come out as +0.0");
    Ok(())
}

fn a_capture_before_warm_up_is_an_error_naming_the_fix() -> Result<()> {
    let Some(s) = setup("a_capture_before_warm_up_is_an_error_naming_the_fix")? else {
        return Ok(());
    };
    let table = Arc::new(MemoryRows::generate(1024, DIM, 1)?);
    let mut p = new_prefetcher(
        &s,
        &table,
        PrefetcherConfig {
            capacity: 64,
            join: Join::AtGather,
            ..Default::default()
        },
    )?;
    let ids = s.main.alloc_zeros::<i64>(64).map_err(cuda("cuMemAlloc"))?;
    let out = s
        .main
        .alloc_zeros::<u16>(64 * DIM)
        .map_err(cuda("cuMemAlloc"))?;
    match capture(&s, &mut p, &ids, 64, &out) {
        Err(Error::NotWarmed { .. }) => {}
        Err(e) => panic!("expected NotWarmed, got {e}"),
        Ok(_) => panic!("a capture before warm-up succeeded"),
    }
    // Warm, it captures and replays.
    p.warm()?;
    let graph = capture(&s, &mut p, &ids, 64, &out)?;
    graph.launch().map_err(cuda("cuGraphLaunch"))?;
    assert_matches_reference(
        &read(&s.main, &out, 64 * DIM)?,
        &table,
        &[0; 64],
        "after warm-up",
    );
    Ok(())
}

fn check_mode_counts_no_difference_over_1000_replays() -> Result<()> {
    let Some(s) = setup("check_mode_counts_no_difference_over_1000_replays")? else {
        return Ok(());
    };
    let mut rng = seeded("check mode");
    let table = Arc::new(MemoryRows::generate(1 << 16, DIM, rng.random())?);
    let config = PrefetcherConfig {
        capacity: 512,
        check: true,
        check_log_every: Duration::ZERO,
        join: Join::AtGather,
        ..Default::default()
    };
    let mut p = new_prefetcher(&s, &table, config)?;
    let count = 512;
    let mut ids_dev = s
        .main
        .alloc_zeros::<i64>(count)
        .map_err(cuda("cuMemAlloc"))?;
    let out = s
        .main
        .alloc_zeros::<u16>(count * DIM)
        .map_err(cuda("cuMemAlloc"))?;
    p.warm()?;
    let graph = capture(&s, &mut p, &ids_dev, count, &out)?;
    let before = p.stats();
    let mut ids = Vec::new();
    for _ in 0..1000 {
        ids = random_ids(&mut rng, count, table.rows());
        s.main
            .memcpy_htod(&ids, &mut ids_dev)
            .map_err(cuda("cuMemcpyHtoD"))?;
        graph.launch().map_err(cuda("cuGraphLaunch"))?;
    }
    // Between replays the caller polls the periodic log: the first poll enqueues a snapshot,
    // a later one (after the copy) reads it.
    let main = s.main.cu_stream();
    // SAFETY: the test's own stream, not capturing.
    assert_eq!(unsafe { p.poll_check(main)? }, None);
    s.main.synchronize().map_err(cuda("cuStreamSynchronize"))?;
    // SAFETY: as above.
    assert_eq!(unsafe { p.poll_check(main)? }, Some(0));
    assert_eq!(p.check_differed()?, Some(0));
    assert_eq!(
        p.stats().lookups - before.lookups,
        2000,
        "a replay skipped a lookup"
    );
    assert_matches_reference(
        &read(&s.main, &out, count * DIM)?,
        &table,
        &ids,
        "last replay",
    );
    Ok(())
}

fn check_mode_counts_a_gather_that_differs() -> Result<()> {
    let Some(s) = setup("check_mode_counts_a_gather_that_differs")? else {
        return Ok(());
    };
    let mut rng = seeded("check mode difference");
    let table = Arc::new(MemoryRows::generate(1 << 12, DIM, rng.random())?);
    let config = PrefetcherConfig {
        capacity: 64,
        check: true,
        check_log_every: Duration::ZERO,
        join: Join::AtGather,
        ..Default::default()
    };
    let mut p = new_prefetcher(&s, &table, config)?;
    let ids = s
        .main
        .clone_htod(&random_ids(&mut rng, 64, table.rows()))
        .map_err(cuda("cuMemcpyHtoD"))?;
    let out = s
        .main
        .alloc_zeros::<u16>(64 * DIM)
        .map_err(cuda("cuMemAlloc"))?;
    let (i, o, main) = (addr(&ids, &s.main), addr(&out, &s.main), s.main.cu_stream());
    for step in 0..4 {
        // The prefetch's lookup runs first: it returns one wrong byte, the check's does not.
        if step == 1 {
            s.main.synchronize().map_err(cuda("cuStreamSynchronize"))?;
            table.corrupt_next(1);
        }
        // SAFETY: live allocations of 64 ids and 64 * DIM bf16.
        unsafe {
            p.prefetch(i, 64, main)?;
            p.gather_dequant(o, main)?;
        }
    }
    assert_eq!(p.check_differed()?, Some(1));
    assert_eq!(p.stats().lookup_errors, 0);
    // The periodic log (every gather here): the snapshot taken behind the last check holds the
    // count too, read without waiting once its copy is done.
    s.main.synchronize().map_err(cuda("cuStreamSynchronize"))?;
    // SAFETY: the test's own stream, not capturing.
    assert_eq!(unsafe { p.poll_check(main)? }, Some(1));
    assert!(p.stats().check_logs >= 1);
    Ok(())
}

fn an_injected_lookup_failure_is_reported_zeroed_and_falls_back() -> Result<()> {
    let Some(s) = setup("an_injected_lookup_failure_is_reported_zeroed_and_falls_back")? else {
        return Ok(());
    };
    let mut rng = seeded("failure");
    let table = Arc::new(MemoryRows::generate(1 << 12, DIM, rng.random())?);
    let mut p = new_prefetcher(
        &s,
        &table,
        PrefetcherConfig {
            capacity: 128,
            join: Join::AtGather,
            ..Default::default()
        },
    )?;
    let count = 100;
    let ids = random_ids(&mut rng, count, table.rows());
    let ids_dev = s.main.clone_htod(&ids).map_err(cuda("cuMemcpyHtoD"))?;
    let mut out = s
        .main
        .alloc_zeros::<u16>(count * DIM)
        .map_err(cuda("cuMemAlloc"))?;
    let (i, o, main) = (
        addr(&ids_dev, &s.main),
        addr(&out, &s.main),
        s.main.cu_stream(),
    );
    let step = |p: &mut Prefetcher, out: &mut CudaSlice<u16>| -> Result<Vec<u16>> {
        selfcheck::poison(&s.main, out)?;
        // SAFETY: live allocations of `count` ids and `count * DIM` bf16.
        unsafe {
            p.prefetch(i, count, main)?;
            p.gather_dequant(o, main)?;
        }
        read(&s.main, out, count * DIM)
    };

    table.fail_on_id(Some(ids[37]));
    let got = step(&mut p, &mut out)?;
    assert!(
        got.iter().all(|&x| x == 0),
        "the failed lookup's rows are not zeros"
    );
    let errors = p.take_errors();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].message.contains("injected"),
        "{}",
        errors[0].message
    );
    assert_eq!(errors[0].ids, ids);
    assert!(p.take_errors().is_empty(), "take_errors did not clear");
    assert_eq!(p.stats().lookup_errors, 1);

    // The next gather takes the synchronous path, and is right once the store is.
    table.fail_on_id(None);
    let got = step(&mut p, &mut out)?;
    let stats = p.stats();
    assert!(stats.fell_back);
    assert_eq!((stats.gathers, stats.sync_gathers), (1, 1));
    assert_matches_reference(&got, &table, &ids, "fallback");

    // Resumed, it prefetches again.
    p.resume();
    let got = step(&mut p, &mut out)?;
    assert_matches_reference(&got, &table, &ids, "resumed");
    assert_eq!((p.stats().gathers, p.stats().fell_back), (2, false));
    Ok(())
}

fn a_failure_or_panic_during_a_replay_is_reported_and_the_next_replay_is_right() -> Result<()> {
    let Some(s) = setup("a_failure_or_panic_during_a_replay_is_reported")? else {
        return Ok(());
    };
    let mut rng = seeded("replay failure");
    let rows = PanickingRows(MemoryRows::generate(1 << 12, DIM, rng.random())?);
    let (weights, scales) = (rows.0.weights().to_vec(), rows.0.scales().to_vec());
    let rows = Arc::new(rows);
    let config = PrefetcherConfig {
        capacity: 32,
        join: Join::AtGather,
        ..Default::default()
    };
    let mut p = Prefetcher::new(
        s.kernels.clone(),
        rows.clone() as Arc<dyn RowLookup>,
        config,
    )?;
    let count = 32;
    let mut ids_dev = s
        .main
        .alloc_zeros::<i64>(count)
        .map_err(cuda("cuMemAlloc"))?;
    let out = s
        .main
        .alloc_zeros::<u16>(count * DIM)
        .map_err(cuda("cuMemAlloc"))?;
    p.warm()?;
    let graph = capture(&s, &mut p, &ids_dev, count, &out)?;
    for replay in 0..3 {
        let mut ids = random_ids(&mut rng, count, 1 << 12);
        ids.iter_mut()
            .for_each(|id| *id = if *id == 13 { 14 } else { *id });
        match replay {
            0 => rows.0.fail_next(1),
            1 => ids[5] = 13, // PanickingRows panics on row 13
            _ => {}
        }
        s.main
            .memcpy_htod(&ids, &mut ids_dev)
            .map_err(cuda("cuMemcpyHtoD"))?;
        graph.launch().map_err(cuda("cuGraphLaunch"))?;
        let got = read(&s.main, &out, count * DIM)?;
        let errors = p.take_errors();
        if replay < 2 {
            assert!(
                got.iter().all(|&x| x == 0),
                "replay {replay}: rows not zero-filled"
            );
            assert_eq!(errors.len(), 1, "replay {replay}: {errors:?}");
            assert_eq!(errors[0].ids, ids);
        } else {
            assert!(errors.is_empty(), "{errors:?}");
            let want = reference::gather_dequant(&weights, &scales, DIM, &ids);
            assert_eq!(
                reference::first_bf16_mismatch(&got, &want),
                None,
                "replay after the failures"
            );
        }
    }
    assert_eq!(p.stats().lookup_errors, 2);
    Ok(())
}

fn two_layers_prefetch_in_one_graph() -> Result<()> {
    two_layers_in_one_graph(Completion::HostFunction, false, Join::AtGather)
}

fn two_layers_prefetch_in_one_graph_in_flag_mode() -> Result<()> {
    two_layers_in_one_graph(Completion::Flag, false, Join::AtGather)
}

fn two_layers_prefetch_in_one_graph_sharing_a_flag_lane() -> Result<()> {
    two_layers_in_one_graph(Completion::Flag, true, Join::AtGather)
}

fn two_tagged_layers_in_one_graph_sharing_a_flag_lane() -> Result<()> {
    two_layers_in_one_graph(Completion::Flag, true, Join::Tags)
}

/// Device work between two layers' gathers, as a model's compute sits there: the product's check
/// comparison of two 256 MiB buffers, a DRAM-bound read of 512 MiB (the lab's spin kernel, which
/// stood here, is not in the product's module).
struct Compute {
    a: CudaSlice<u8>,
    b: CudaSlice<u8>,
    counter: CudaSlice<u32>,
}

impl Compute {
    const BYTES: usize = 256 << 20;

    fn new(s: &Setup) -> Result<Compute> {
        let zeros = |n| s.main.alloc_zeros::<u8>(n).map_err(cuda("cuMemAlloc"));
        Ok(Compute {
            a: zeros(Compute::BYTES)?,
            b: zeros(Compute::BYTES)?,
            counter: s.main.alloc_zeros::<u32>(4).map_err(cuda("cuMemAlloc"))?,
        })
    }

    /// # Safety
    /// `main` is a stream of `s`'s context.
    unsafe fn launch(&self, s: &Setup, main: sys::CUstream) -> Result<()> {
        let p = fetchahead::device_abi::params::CheckParams {
            a: addr(&self.a, &s.main),
            b: addr(&self.b, &s.main),
            chunks: (Compute::BYTES / 16) as u64,
            counter: addr(&self.counter, &s.main),
        };
        // SAFETY: both buffers hold `chunks * 16` bytes nothing writes; the counter is this
        // one's alone.
        unsafe { s.kernels.launch_check_equal(main, p) }
    }
}

/// Two Engram layers, each with its own prefetcher and ids, both prefetched at the start of the
/// captured forward and gathered at different points, with compute between; with `shared_lane`
/// both prefetchers' lookups run on a flag lane of the test's, ranked in gather order; without,
/// each is made by `Prefetcher::new` (in flag mode: on the device's default lane, both rank 0).
fn two_layers_in_one_graph(completion: Completion, shared_lane: bool, join: Join) -> Result<()> {
    let what =
        format!("two_layers_in_one_graph({completion:?}, shared lane {shared_lane}, {join:?})");
    let Some(s) = setup(&what)? else {
        return Ok(());
    };
    let mut rng = seeded(&what);
    let table = Arc::new(MemoryRows::generate(1 << 14, DIM, rng.random())?);
    let config = PrefetcherConfig {
        capacity: 256,
        completion,
        join,
        ..Default::default()
    };
    let mut layers = if shared_lane {
        let lane = FlagLane::start("test-lane".into())?;
        let store = table.clone() as Arc<dyn RowLookup>;
        let host_fn = PrefetcherConfig {
            completion: Completion::HostFunction,
            ..config
        };
        assert!(
            matches!(
                Prefetcher::in_lane(s.kernels.clone(), store.clone(), host_fn, &lane, 0),
                Err(Error::Invalid { .. })
            ),
            "a flag lane refuses a host-function prefetcher"
        );
        [
            Prefetcher::in_lane(s.kernels.clone(), store.clone(), config, &lane, 0)?,
            Prefetcher::in_lane(s.kernels.clone(), store, config, &lane, 1)?,
        ]
    } else {
        [
            new_prefetcher(&s, &table, config)?,
            new_prefetcher(&s, &table, config)?,
        ]
    };
    let counts = [256, 100];
    let mut ids = Vec::new();
    let mut outs = Vec::new();
    for (p, &n) in layers.iter_mut().zip(&counts) {
        p.warm()?;
        ids.push(s.main.alloc_zeros::<i64>(n).map_err(cuda("cuMemAlloc"))?);
        outs.push(
            s.main
                .alloc_zeros::<u16>(n * DIM)
                .map_err(cuda("cuMemAlloc"))?,
        );
    }
    let main = s.main.cu_stream();
    let compute = Compute::new(&s)?;
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    s.main
        .begin_capture(mode)
        .map_err(cuda("cuStreamBeginCapture"))?;
    // SAFETY: the ids and outputs are live allocations of the counts given, alive past the
    // graph, which is dropped before the prefetchers.
    let enqueued = (|| unsafe {
        for (k, p) in layers.iter_mut().enumerate() {
            p.prefetch(addr(&ids[k], &s.main), counts[k], main)?;
        }
        compute.launch(&s, main)?;
        layers[0].gather_dequant(addr(&outs[0], &s.main), main)?;
        compute.launch(&s, main)?;
        layers[1].gather_dequant(addr(&outs[1], &s.main), main)?;
        for p in layers.iter_mut() {
            p.finish(main)?;
        }
        Ok::<(), Error>(())
    })();
    let graph = s
        .main
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .map_err(cuda("cuStreamEndCapture"))?;
    enqueued?;
    let graph = graph.expect("the capture recorded nodes");
    for replay in 0..5 {
        let mut step_ids = Vec::new();
        for (k, &n) in counts.iter().enumerate() {
            let layer_ids = random_ids(&mut rng, n, table.rows());
            s.main
                .memcpy_htod(&layer_ids, &mut ids[k])
                .map_err(cuda("cuMemcpyHtoD"))?;
            selfcheck::poison(&s.main, &mut outs[k])?;
            step_ids.push(layer_ids);
        }
        graph.launch().map_err(cuda("cuGraphLaunch"))?;
        for (k, &n) in counts.iter().enumerate() {
            let got = read(&s.main, &outs[k], n * DIM)?;
            assert_matches_reference(
                &got,
                &table,
                &step_ids[k],
                &format!("replay {replay}, layer {k}"),
            );
        }
    }
    drop(graph);
    Ok(())
}

fn zero_rows_and_misuse_are_errors_not_crashes() -> Result<()> {
    let Some(s) = setup("zero_rows_and_misuse_are_errors_not_crashes")? else {
        return Ok(());
    };
    let table = Arc::new(MemoryRows::generate(1024, DIM, 3)?);
    let config = PrefetcherConfig {
        capacity: 16,
        join: Join::AtGather,
        ..Default::default()
    };
    let mut p = new_prefetcher(&s, &table, config)?;
    let ids = s
        .main
        .clone_htod(&[1i64, 2, 3])
        .map_err(cuda("cuMemcpyHtoD"))?;
    let out = s
        .main
        .alloc_zeros::<u16>(3 * DIM)
        .map_err(cuda("cuMemAlloc"))?;
    let (i, o, main) = (addr(&ids, &s.main), addr(&out, &s.main), s.main.cu_stream());
    // SAFETY: `ids` and `out` hold 3 ids and 3 rows; the null addresses go with zero rows.
    unsafe {
        p.prefetch(0, 0, main)?;
        p.gather_dequant(0, main)?;
        assert!(matches!(
            p.gather_dequant(o, main),
            Err(Error::PrefetchOrder(_))
        ));
        assert!(matches!(
            p.prefetch(i, 17, main),
            Err(Error::StagingFull { .. })
        ));
        assert!(matches!(
            p.prefetch(i + 4, 3, main),
            Err(Error::Invalid { .. })
        ));
        p.prefetch(i, 3, main)?;
        assert!(matches!(
            p.prefetch(i, 3, main),
            Err(Error::PrefetchOrder(_))
        ));
        // A misaligned output is refused and the prefetch stays pending for a good one.
        assert!(matches!(
            p.gather_dequant(o + 8, main),
            Err(Error::Invalid { .. })
        ));
        p.gather_dequant(o, main)?;
    }
    assert_matches_reference(
        &read(&s.main, &out, 3 * DIM)?,
        &table,
        &[1, 2, 3],
        "after misuse",
    );
    let stats = p.stats();
    assert_eq!((stats.prefetches, stats.gathers, stats.lookups), (2, 2, 1));
    Ok(())
}

common::harness::tests! {
    cpu: [
        staging_capacity_rounds_up_to_a_power_of_two,
        staging_refuses_no_rows_too_many_rows_and_bad_dims,
        staging_count_beyond_capacity_is_an_error_naming_both,
        memory_rows_are_deterministic_numbers_and_looked_up_in_order,
        memory_rows_refuse_bad_dims_and_buffers,
        a_failed_lookup_zero_fills_every_row_and_names_the_row,
        a_corrupted_lookup_differs_in_one_byte_without_an_error,
        a_panicking_lookup_becomes_an_error_with_zero_rows,
    ],
    gpu: [
        prefetched_output_equals_the_synchronous_path_eagerly,
        prefetched_output_equals_the_synchronous_path_eagerly_in_flag_mode,
        prefetched_output_is_right_in_a_graph_replayed_with_new_ids,
        prefetched_output_is_right_in_a_graph_replayed_with_new_ids_in_flag_mode,
        tagged_output_equals_the_synchronous_path_eagerly,
        tagged_output_is_right_in_a_graph_replayed_with_new_ids,
        a_tagged_gather_waits_for_a_slow_lookup,
        a_tagged_gather_gives_up_on_a_stalled_lookup_with_zeros_and_a_count,
        a_capture_before_warm_up_is_an_error_naming_the_fix,
        check_mode_counts_no_difference_over_1000_replays,
        check_mode_counts_a_gather_that_differs,
        an_injected_lookup_failure_is_reported_zeroed_and_falls_back,
        a_failure_or_panic_during_a_replay_is_reported_and_the_next_replay_is_right,
        two_layers_prefetch_in_one_graph,
        two_layers_prefetch_in_one_graph_in_flag_mode,
        two_layers_prefetch_in_one_graph_sharing_a_flag_lane,
        two_tagged_layers_in_one_graph_sharing_a_flag_lane,
        zero_rows_and_misuse_are_errors_not_crashes,
    ],
}
