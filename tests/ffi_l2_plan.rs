//! The L2 plan's C ABI and the recommended prefetcher configuration, called as C would.
mod common;
use std::ffi::{CStr, c_char};
use std::ptr;

use cudarc::driver::DevicePtr;
use fetchahead::ffi::*;
use fetchahead::kernels::gpu::Gpu;

fn last_error() -> String {
    let mut buf = [0 as c_char; 512];
    // SAFETY: `buf` is writable for its length.
    unsafe { fetchahead_last_error(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: fetchahead_last_error NUL-terminates what it writes.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn struct_layouts_match_the_header() {
    assert_eq!(size_of::<FfiForwardSummary>(), 32);
    assert_eq!(size_of::<FfiL2Counters>(), 56);
}

fn the_default_config_is_the_measured_best() {
    let mut config = FfiPrefetcherConfig {
        capacity: 0,
        variant: c"gather_dequant_cvt".as_ptr(),
        check: 9,
        fallback_on_error: 9,
        completion: 9,
        check_log_ms: 9,
        join: 9,
    };
    // SAFETY: `config` is writable.
    let rc = unsafe { fetchahead_prefetcher_config_default(&mut config) };
    assert_eq!(rc, FETCHAHEAD_OK);
    assert_eq!(config.completion, FETCHAHEAD_COMPLETION_FLAG);
    assert_eq!(config.join, FETCHAHEAD_JOIN_TAGS);
    // The same as Rust's default, field by field (the demo's and Python's are checked against
    // that one, by python/tests/test_package.py).
    let rust = fetchahead::PrefetcherConfig::default();
    assert_eq!(rust.completion, fetchahead::Completion::Flag);
    assert_eq!(rust.join, fetchahead::prefetch::prefetcher::Join::Tags);
    assert!(
        rust.variant.is_none() && config.variant.is_null(),
        "the arch's default variant"
    );
    assert_eq!(
        (config.capacity, config.check, config.fallback_on_error),
        (
            rust.capacity as u64,
            rust.check as u32,
            rust.fallback_on_error as u32
        )
    );
    assert_eq!(
        (config.capacity, config.check, config.fallback_on_error),
        (4096, 0, 1)
    );
    // SAFETY: null is what is refused.
    let rc = unsafe { fetchahead_prefetcher_config_default(ptr::null_mut()) };
    assert_eq!(rc, FETCHAHEAD_ERR_INVALID);
}

fn null_plans_and_outputs_are_refused_with_a_message() {
    // SAFETY: every pointer is null, which is what is being refused.
    unsafe {
        assert_eq!(
            fetchahead_l2_plan_create(0, ptr::null_mut(), 0, ptr::null_mut()),
            FETCHAHEAD_ERR_INVALID
        );
        assert!(last_error().contains("out"), "{}", last_error());
        assert_eq!(
            fetchahead_l2_plan_begin_forward(ptr::null_mut(), 1, ptr::null_mut()),
            FETCHAHEAD_ERR_INVALID
        );
        assert!(last_error().contains("plan"), "{}", last_error());
        assert_eq!(
            fetchahead_l2_plan_collective(ptr::null_mut()),
            FETCHAHEAD_ERR_INVALID
        );
        assert_eq!(
            fetchahead_l2_plan_consume(ptr::null_mut(), 0, 0),
            FETCHAHEAD_ERR_INVALID
        );
        assert_eq!(
            fetchahead_l2_plan_end_forward(ptr::null_mut(), ptr::null_mut()),
            FETCHAHEAD_ERR_INVALID
        );
        assert_eq!(
            fetchahead_l2_plan_counters(ptr::null_mut(), ptr::null_mut()),
            FETCHAHEAD_ERR_INVALID
        );
        fetchahead_l2_plan_close(ptr::null_mut());
    }
}

/// A replay is named; an unknown name is refused with the names, before any device work.
fn an_unknown_replay_name_is_refused_with_the_names() {
    let mut plan = ptr::null_mut();
    // SAFETY: the replay name is a NUL-terminated string; `plan` is writable.
    let rc = unsafe {
        fetchahead_l2_plan_create_with_replay(
            0,
            ptr::null_mut(),
            0,
            c"l2_prefetch_nonesuch".as_ptr(),
            &mut plan,
        )
    };
    assert_eq!(rc, FETCHAHEAD_ERR_INVALID);
    let message = last_error();
    for name in [
        "l2_prefetch_nonesuch",
        "auto",
        "access_policy",
        "l2_prefetch_loads",
    ] {
        assert!(message.contains(name), "{message}");
    }
    assert!(plan.is_null());
    for name in ["auto", "access_policy", "l2_prefetch", "l2_prefetch_loads"] {
        assert!(fetchahead::l2_plan::Replay::named(name).is_ok(), "{name}");
    }
}

fn a_plan_learns_and_replays_through_the_abi() {
    let gpu = match Gpu::for_test("a_plan_learns_and_replays_through_the_abi") {
        Ok(Some(gpu)) => gpu,
        Ok(None) => return,
        Err(e) => panic!("{e}"),
    };
    let stream = gpu.ctx.new_stream().unwrap();
    let weights: Vec<_> = (0..3)
        .map(|_| stream.alloc_zeros::<u8>(1 << 20).unwrap())
        .collect();
    let addresses: Vec<u64> = weights.iter().map(|w| w.device_ptr(&stream).0).collect();
    let mut plan = ptr::null_mut();
    // SAFETY: the stream is a live stream of device 0's primary context; `plan` is writable.
    let rc = unsafe { fetchahead_l2_plan_create(0, stream.cu_stream(), 0, &mut plan) };
    assert_eq!(rc, FETCHAHEAD_OK, "{}", last_error());
    let mut learned = Vec::new();
    for _ in 0..4 {
        let mut summary = FfiForwardSummary::default();
        // SAFETY: `plan` is live, the stream too, the weights stay allocated meanwhile.
        unsafe {
            assert_eq!(
                fetchahead_l2_plan_begin_forward(plan, 7, stream.cu_stream()),
                FETCHAHEAD_OK,
                "{}",
                last_error()
            );
            for &a in &addresses {
                assert_eq!(fetchahead_l2_plan_collective(plan), FETCHAHEAD_OK);
                assert_eq!(fetchahead_l2_plan_consume(plan, a, 1 << 20), FETCHAHEAD_OK);
            }
            assert_eq!(
                fetchahead_l2_plan_end_forward(plan, &mut summary),
                FETCHAHEAD_OK,
                "{}",
                last_error()
            );
        }
        assert_eq!((summary.signature, summary.collectives), (7, 3));
        learned.push(summary.learned);
    }
    assert_eq!(learned[0], FETCHAHEAD_LEARNED_NEW);
    assert_eq!(learned[3], FETCHAHEAD_LEARNED_UNCHANGED);
    let mut counters = FfiL2Counters::default();
    // SAFETY: `plan` is live; `counters` writable.
    unsafe {
        assert_eq!(
            fetchahead_l2_plan_counters(plan, &mut counters),
            FETCHAHEAD_OK
        );
        // A second begin inside a forward is refused.
        assert_eq!(
            fetchahead_l2_plan_begin_forward(plan, 7, stream.cu_stream()),
            FETCHAHEAD_OK
        );
        assert_ne!(
            fetchahead_l2_plan_begin_forward(plan, 8, stream.cu_stream()),
            FETCHAHEAD_OK
        );
        assert_eq!(
            fetchahead_l2_plan_end_forward(plan, ptr::null_mut()),
            FETCHAHEAD_OK
        );
    }
    assert_eq!((counters.forwards, counters.signatures), (4, 1));
    // Every planned window of the last three forwards was warmed or, with the GPU caught up
    // with this loop, left cold for the host's sake.
    assert!(
        counters.windows_prefetched + counters.windows_host_bound >= 9,
        "{counters:?}"
    );
    // With the host pace off, every window is warmed however far ahead this loop is.
    let mut after = FfiL2Counters::default();
    // SAFETY: `plan` is live, the stream too, the weights stay allocated meanwhile.
    unsafe {
        assert_eq!(fetchahead_l2_plan_set_host_pace(plan, 0), FETCHAHEAD_OK);
        assert_eq!(
            fetchahead_l2_plan_begin_forward(plan, 7, stream.cu_stream()),
            FETCHAHEAD_OK
        );
        for &a in &addresses {
            assert_eq!(fetchahead_l2_plan_collective(plan), FETCHAHEAD_OK);
            assert_eq!(fetchahead_l2_plan_consume(plan, a, 1 << 20), FETCHAHEAD_OK);
        }
        assert_eq!(
            fetchahead_l2_plan_end_forward(plan, ptr::null_mut()),
            FETCHAHEAD_OK
        );
        assert_eq!(fetchahead_l2_plan_counters(plan, &mut after), FETCHAHEAD_OK);
    }
    assert_eq!(
        after.windows_prefetched - counters.windows_prefetched,
        3,
        "{after:?}"
    );
    assert_eq!(after.windows_host_bound, counters.windows_host_bound);
    stream.synchronize().unwrap();
    // SAFETY: no graph captured it; closed once.
    unsafe { fetchahead_l2_plan_close(plan) };
}

fn the_c_library_installs_a_stderr_logger_at_fetchahead_log_or_warn() {
    let mut counters = FfiL2Counters::default();
    // SAFETY: a null plan is refused; the call installs the logger on the way.
    let rc = unsafe { fetchahead_l2_plan_counters(ptr::null_mut(), &mut counters) };
    assert_eq!(rc, FETCHAHEAD_ERR_INVALID);
    let want = match std::env::var(fetchahead::logging::LOG_ENV) {
        Ok(level) => level.parse().unwrap_or(log::LevelFilter::Warn),
        Err(_) => log::LevelFilter::Warn,
    };
    assert_eq!(log::max_level(), want);
}

common::harness::tests! {
    cpu: [
        struct_layouts_match_the_header,
        the_default_config_is_the_measured_best,
        null_plans_and_outputs_are_refused_with_a_message,
        the_c_library_installs_a_stderr_logger_at_fetchahead_log_or_warn,
        an_unknown_replay_name_is_refused_with_the_names,
    ],
    gpu: [
        a_plan_learns_and_replays_through_the_abi,
    ],
}
