//! The C ABI called as C would: status codes, the last-error message, the host-function entry
//! `fetchahead_lookup`, and (on a GPU) a prefetch and gather through raw pointers and streams.
// The self-check's CPU reference (`fetchahead::selfcheck::reference`), one source; each test
// file uses part of it.
mod common;
#[allow(dead_code)]
#[path = "../host/selfcheck/reference.rs"]
mod reference;
use std::ffi::{CStr, c_char};
use std::ptr;

use cudarc::driver::DevicePtr;
use fetchahead::ffi::*;
use fetchahead::kernels::gpu::Gpu;
use fetchahead::prefetch::lookup::MemoryRows;
use fetchahead::row_lookup::RowLookup;

const DIM: usize = 256;

fn last_error() -> String {
    let mut buf = [0 as c_char; 512];
    // SAFETY: `buf` is writable for its length.
    let len = unsafe { fetchahead_last_error(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: fetchahead_last_error NUL-terminates what it writes.
    let s = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    assert_eq!(len, s.len(), "length of {s:?}");
    s
}

fn open(rows: u64, seed: u64) -> *mut TableHandle {
    let mut table = ptr::null_mut();
    // SAFETY: `table` is writable.
    let rc = unsafe { fetchahead_open_memory_table(rows, DIM as u32, seed, &mut table) };
    assert_eq!(rc, FETCHAHEAD_OK, "{}", last_error());
    table
}

fn struct_layouts_match_the_header() {
    // The sizes include/fetchahead.h asserts.
    assert_eq!(size_of::<Work>(), 48);
    assert_eq!(size_of::<FfiPrefetcherConfig>(), 40);
    assert_eq!(size_of::<FfiCounters>(), 56);
    assert_eq!(size_of::<FfiLookupError>(), 24 + FETCHAHEAD_MESSAGE_BYTES);
}

fn bad_arguments_return_codes_and_a_message() {
    // SAFETY: null `out` is what is being refused.
    let rc = unsafe { fetchahead_open_memory_table(10, DIM as u32, 1, ptr::null_mut()) };
    assert_eq!(rc, FETCHAHEAD_ERR_INVALID);
    assert!(last_error().contains("out"), "{}", last_error());

    let mut table = ptr::null_mut();
    // SAFETY: `table` is writable.
    let rc = unsafe { fetchahead_open_memory_table(10, 33, 1, &mut table) };
    assert_eq!(rc, FETCHAHEAD_ERR_INVALID);
    assert!(last_error().contains("33"), "{}", last_error());
    assert!(table.is_null());

    let table = open(10, 1);
    // SAFETY: `table` is open.
    unsafe {
        assert_eq!(fetchahead_table_dim(table), DIM as u32);
        assert_eq!(
            fetchahead_table_inject(table, 99, 0),
            FETCHAHEAD_ERR_INVALID
        );
        assert!(last_error().contains("99"));
        assert_eq!(
            fetchahead_prefetch(ptr::null_mut(), ptr::null(), 0, ptr::null_mut()),
            FETCHAHEAD_ERR_INVALID
        );
        assert_eq!(
            fetchahead_gather_dequant(ptr::null_mut(), ptr::null_mut(), ptr::null_mut()),
            FETCHAHEAD_ERR_INVALID
        );
        assert!(last_error().contains("prefetcher"), "{}", last_error());
        fetchahead_table_close(table);
        fetchahead_table_close(ptr::null_mut());
        fetchahead_prefetcher_close(ptr::null_mut());
    }
}

fn the_host_function_entry_looks_up_and_zero_fills_on_failure() {
    let table = open(1000, 42);
    let same = MemoryRows::generate(1000, DIM, 42).unwrap();
    let ids = [5i64, 999, 0, 5];
    let mut weights = vec![0xAAu8; ids.len() * DIM];
    let mut scales = vec![0xAAu8; ids.len() * DIM / 32];
    let mut work = Work {
        table,
        ids: ids.as_ptr(),
        weights: weights.as_mut_ptr(),
        scales: scales.as_mut_ptr(),
        count: ids.len() as u64,
        status: -1,
    };
    // SAFETY: `work` names an open table and buffers of `count` rows.
    unsafe { fetchahead_lookup(ptr::from_mut(&mut work).cast()) };
    assert_eq!(work.status, FETCHAHEAD_OK);
    let mut want_w = vec![0; weights.len()];
    let mut want_s = vec![0; scales.len()];
    same.lookup(&ids, &mut want_w, &mut want_s).unwrap();
    assert!(weights == want_w && scales == want_s);

    // SAFETY: `table` is open.
    let rc = unsafe { fetchahead_table_inject(table, FETCHAHEAD_FAULT_FAIL_ON_ID, 999) };
    assert_eq!(rc, FETCHAHEAD_OK);
    // SAFETY: as above.
    unsafe { fetchahead_lookup(ptr::from_mut(&mut work).cast()) };
    assert_eq!(work.status, FETCHAHEAD_ERR_LOOKUP);
    assert!(
        weights.iter().chain(&scales).all(|&b| b == 0),
        "rows not zero-filled"
    );
    let mut buf = [0 as c_char; 256];
    // SAFETY: `table` is open and `buf` writable.
    let len = unsafe { fetchahead_table_lookup_error(table, buf.as_mut_ptr(), buf.len()) };
    // SAFETY: NUL-terminated by the call.
    let message = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
    assert!(len > 0 && message.contains("999"), "{message}");

    // A bad id is a lookup error too; a null table is refused.
    // SAFETY: `table` is open.
    unsafe { fetchahead_table_inject(table, FETCHAHEAD_FAULT_NONE, 0) };
    let bad = [1000i64];
    work.ids = bad.as_ptr();
    work.count = 1;
    // SAFETY: as above.
    unsafe { fetchahead_lookup(ptr::from_mut(&mut work).cast()) };
    assert_eq!(work.status, FETCHAHEAD_ERR_LOOKUP);
    work.table = ptr::null();
    // SAFETY: a null table is refused before anything is read.
    unsafe { fetchahead_lookup(ptr::from_mut(&mut work).cast()) };
    assert_eq!(work.status, FETCHAHEAD_ERR_INVALID);
    // SAFETY: null work is ignored; `table` is closed once.
    unsafe {
        fetchahead_lookup(ptr::null_mut());
        fetchahead_table_close(table);
    }
}

fn prefetch_and_gather_through_the_abi() {
    let table = open(1 << 12, 7);
    let config = FfiPrefetcherConfig {
        capacity: 256,
        variant: ptr::null(),
        check: 1,
        fallback_on_error: 1,
        completion: FETCHAHEAD_COMPLETION_HOST_FUNCTION,
        check_log_ms: 0,
        join: FETCHAHEAD_JOIN_AT_GATHER,
    };
    let mut p = ptr::null_mut();
    // SAFETY: `table` is open, `config` readable, `p` writable.
    let rc = unsafe { fetchahead_prefetcher_create(table, 0, &config, &mut p) };
    let gpu = match Gpu::for_test("prefetch_and_gather_through_the_abi") {
        Ok(Some(gpu)) => gpu,
        Ok(None) => {
            assert_eq!(rc, FETCHAHEAD_ERR_NO_DEVICE, "{}", last_error());
            // SAFETY: `table` is open.
            unsafe { fetchahead_table_close(table) };
            return;
        }
        Err(e) => panic!("{e}"),
    };
    assert_eq!(rc, FETCHAHEAD_OK, "{}", last_error());
    let stream = gpu.ctx.new_stream().unwrap();
    let ids: Vec<i64> = (0..200).map(|i| (i * 37 % (1 << 12)) as i64).collect();
    let ids_dev = stream.clone_htod(&ids).unwrap();
    let out = stream.alloc_zeros::<u16>(ids.len() * DIM).unwrap();
    let (i, o) = (ids_dev.device_ptr(&stream).0, out.device_ptr(&stream).0);
    let s = stream.cu_stream();
    // SAFETY: live allocations of 200 ids and 200 * DIM bf16 on the stream's device.
    unsafe {
        assert_eq!(
            fetchahead_prefetcher_warm(p),
            FETCHAHEAD_OK,
            "{}",
            last_error()
        );
        assert_eq!(
            fetchahead_gather_dequant(p, o as *mut u16, s),
            FETCHAHEAD_ERR_ORDER
        );
        assert_eq!(
            fetchahead_prefetch(p, i as *const i64, 257, s),
            FETCHAHEAD_ERR_STAGING_FULL
        );
        assert_eq!(
            fetchahead_prefetch(p, i as *const i64, 200, s),
            FETCHAHEAD_OK,
            "{}",
            last_error()
        );
        assert_eq!(
            fetchahead_gather_dequant(p, o as *mut u16, s),
            FETCHAHEAD_OK,
            "{}",
            last_error()
        );
    }
    stream.synchronize().unwrap();
    let got = stream.clone_dtoh(&out).unwrap();
    let rows = MemoryRows::generate(1 << 12, DIM, 7).unwrap();
    let want = reference::gather_dequant(rows.weights(), rows.scales(), DIM, &ids);
    assert_eq!(reference::first_bf16_mismatch(&got, &want), None);

    let mut counters = FfiCounters::default();
    // SAFETY: `p` is live; `counters` writable.
    let rc = unsafe { fetchahead_read_counters(p, &mut counters) };
    assert_eq!(rc, FETCHAHEAD_OK);
    assert_eq!(
        (
            counters.gathers,
            counters.check_differed,
            counters.lookup_errors
        ),
        (1, 0, 0)
    );

    // An injected failure comes back through take_errors with its ids.
    // SAFETY: as above.
    unsafe {
        fetchahead_table_inject(table, FETCHAHEAD_FAULT_FAIL_NEXT, 1);
        assert_eq!(
            fetchahead_prefetch(p, i as *const i64, 200, s),
            FETCHAHEAD_OK
        );
        assert_eq!(
            fetchahead_gather_dequant(p, o as *mut u16, s),
            FETCHAHEAD_OK
        );
    }
    stream.synchronize().unwrap();
    let mut records = [FfiLookupError {
        id_count: 0,
        ids_offset: 0,
        ids_copied: 0,
        message: [0; FETCHAHEAD_MESSAGE_BYTES],
    }; 4];
    let mut failed_ids = vec![0i64; 1000];
    let mut taken = 0u32;
    // SAFETY: the buffers are writable for the lengths given.
    let rc = unsafe {
        fetchahead_take_errors(
            p,
            records.as_mut_ptr(),
            4,
            failed_ids.as_mut_ptr(),
            1000,
            &mut taken,
        )
    };
    assert_eq!((rc, taken), (FETCHAHEAD_OK, 1));
    assert_eq!((records[0].id_count, records[0].ids_copied), (200, 200));
    assert_eq!(failed_ids[..200], ids[..]);
    // SAFETY: the message is NUL-terminated.
    let message = unsafe { CStr::from_ptr(records[0].message.as_ptr()) }.to_string_lossy();
    assert!(message.contains("injected"), "{message}");
    // SAFETY: `p` and `table` are live and closed once.
    unsafe {
        fetchahead_prefetcher_close(p);
        fetchahead_table_close(table);
    }
}

fn two_prefetchers_share_a_flag_lane_through_the_abi() {
    let table = open(1 << 12, 11);
    let mut lane = ptr::null_mut();
    // SAFETY: `lane` is writable.
    let rc = unsafe { fetchahead_flag_lane_create(&mut lane) };
    assert_eq!(rc, FETCHAHEAD_OK, "{}", last_error());
    let config = |completion| FfiPrefetcherConfig {
        capacity: 256,
        variant: ptr::null(),
        check: 1,
        fallback_on_error: 1,
        completion,
        check_log_ms: 1,
        join: FETCHAHEAD_JOIN_AT_GATHER,
    };
    let flag = config(FETCHAHEAD_COMPLETION_FLAG);
    let mut layers = [ptr::null_mut(); 2];
    for (rank, p) in layers.iter_mut().enumerate() {
        // SAFETY: `table` and `lane` are open, `flag` readable, `p` writable.
        let rc =
            unsafe { fetchahead_prefetcher_create_in_lane(table, 0, &flag, lane, rank as u32, p) };
        if rc == FETCHAHEAD_ERR_NO_DEVICE {
            let gpu = Gpu::for_test("two_prefetchers_share_a_flag_lane_through_the_abi");
            assert!(matches!(gpu, Ok(None)), "no device, yet {gpu:?}");
            // SAFETY: open handles, closed once.
            unsafe {
                fetchahead_flag_lane_close(lane);
                fetchahead_table_close(table);
            }
            return;
        }
        assert_eq!(rc, FETCHAHEAD_OK, "{}", last_error());
    }
    // A host-function prefetcher cannot join a lane.
    let host_fn = config(FETCHAHEAD_COMPLETION_HOST_FUNCTION);
    let mut refused = ptr::null_mut();
    // SAFETY: as above.
    let rc =
        unsafe { fetchahead_prefetcher_create_in_lane(table, 0, &host_fn, lane, 2, &mut refused) };
    assert_eq!(rc, FETCHAHEAD_ERR_INVALID);
    assert!(last_error().contains("lane"), "{}", last_error());
    // SAFETY: the lane stays alive through its prefetchers.
    unsafe { fetchahead_flag_lane_close(lane) };

    let gpu = Gpu::for_test("two_prefetchers_share_a_flag_lane_through_the_abi")
        .unwrap()
        .expect("a device: the prefetchers were created");
    let stream = gpu.ctx.new_stream().unwrap();
    let ids: [Vec<i64>; 2] = [
        (0..200).map(|i| (i * 37 % (1 << 12)) as i64).collect(),
        (0..100).map(|i| (i * 101 % (1 << 12)) as i64).collect(),
    ];
    let ids_dev = ids.each_ref().map(|v| stream.clone_htod(v).unwrap());
    let outs = ids
        .each_ref()
        .map(|v| stream.alloc_zeros::<u16>(v.len() * DIM).unwrap());
    let s = stream.cu_stream();
    for step in 0..3 {
        // SAFETY: live allocations of the ids and their outputs on the stream's device; the
        // layers prefetch in gather order, then gather.
        unsafe {
            for (k, p) in layers.iter().enumerate() {
                if step == 0 {
                    assert_eq!(
                        fetchahead_prefetcher_warm(*p),
                        FETCHAHEAD_OK,
                        "{}",
                        last_error()
                    );
                }
                let i = ids_dev[k].device_ptr(&stream).0 as *const i64;
                let rc = fetchahead_prefetch(*p, i, ids[k].len() as u64, s);
                assert_eq!(rc, FETCHAHEAD_OK, "{}", last_error());
            }
            for (k, p) in layers.iter().enumerate() {
                let o = outs[k].device_ptr(&stream).0 as *mut u16;
                assert_eq!(
                    fetchahead_gather_dequant(*p, o, s),
                    FETCHAHEAD_OK,
                    "{}",
                    last_error()
                );
            }
        }
    }
    stream.synchronize().unwrap();
    let rows = MemoryRows::generate(1 << 12, DIM, 11).unwrap();
    for k in 0..2 {
        let got = stream.clone_dtoh(&outs[k]).unwrap();
        let want = reference::gather_dequant(rows.weights(), rows.scales(), DIM, &ids[k]);
        assert_eq!(
            reference::first_bf16_mismatch(&got, &want),
            None,
            "layer {k}"
        );
    }
    // The check count's log (every 1 ms here): a poll reads a snapshot that has landed, or
    // enqueues the next; within three polls a stream synchronization apart, one is read.
    let mut read = Vec::new();
    for _ in 0..5 {
        let mut differed = -2;
        // SAFETY: live prefetcher and stream; `differed` writable.
        let rc = unsafe { fetchahead_poll_check(layers[0], s, &mut differed) };
        assert_eq!(rc, FETCHAHEAD_OK, "{}", last_error());
        read.push(differed);
        if differed >= 0 {
            break;
        }
        stream.synchronize().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert_eq!(read.last(), Some(&0), "polls returned {read:?}");
    for p in layers {
        // SAFETY: live prefetchers, closed once; then the table.
        unsafe { fetchahead_prefetcher_close(p) };
    }
    // SAFETY: as above.
    unsafe { fetchahead_table_close(table) };
}

common::harness::tests! {
    cpu: [
        struct_layouts_match_the_header,
        bad_arguments_return_codes_and_a_message,
        the_host_function_entry_looks_up_and_zero_fills_on_failure,
    ],
    gpu: [
        prefetch_and_gather_through_the_abi,
        two_prefetchers_share_a_flag_lane_through_the_abi,
    ],
}
