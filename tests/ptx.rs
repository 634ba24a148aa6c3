//! The embedded PTX of the product's module: every arch built, each holding exactly the kernels
//! its arch can run, and the device-to-arch choice. `lab/tests/ptx.rs` checks the lab's module
//! with the same checks (`tests/common/ptx_checks.rs`).
#[path = "common/ptx_checks.rs"]
mod ptx_checks;
use fetchahead::device_abi::{BASELINE_SM, Module, all_kernels, defaults, width_builds};
use fetchahead::kernels::ptx::{BuiltPtx, Reason, choose};
use fetchahead::{DequantVariant, Error, GatherVariant, ptx};

#[test]
fn every_built_arch_has_exactly_the_kernels_it_can_run() {
    ptx_checks::exactly_the_kernels_each_arch_can_run(Module::Product, ptx::BUILT);
}

/// The default build embeds the baseline, and it holds the gathers, the packed dequant and the
/// kernels every part of fetchahead launches; only the hardware FP8 conversion, the bulk
/// copies and prefetches and the clusters need more.
#[test]
fn the_baseline_ptx_holds_the_gathers_and_the_packed_dequant() {
    let Ok(baseline) = ptx::for_arch("sm_80") else {
        panic!("no sm_80 PTX in {}", ptx::built_archs());
    };
    assert_eq!(baseline.sm(), BASELINE_SM);
    let held: Vec<&str> = ptx::entries(baseline.text).collect();
    for name in [
        "gather_chunk16_nohint_x2",
        "gather_span8_b2",
        "gather_cp_async",
        "gather_warp_row",
        "gather_dequant_packed",
        "gather_dequant_u8_packed_x2",
        "staged_dequant_tagged",
        "check_equal",
        "l2_prefetch_lines",
    ] {
        assert!(held.contains(&name), "sm_80 lacks {name}");
    }
    let newer: Vec<(&str, u32)> = all_kernels()
        .filter(|k| k.needs > BASELINE_SM && !k.name.ends_with("_timed"))
        .map(|k| (k.name, k.needs))
        .collect();
    assert!(newer.contains(&("gather_bulk", 90)), "{newer:?}");
    assert!(newer.contains(&("gather_dequant_cvt", 89)), "{newer:?}");
    assert!(newer.contains(&("l2_prefetch", 90)), "{newer:?}");
    assert!(newer.iter().all(|(name, _)| !held.contains(name)));
    // A device's defaults are kernels its PTX holds, on every arch built (an arch without its
    // own defaults gets the first entry's).
    for built in ptx::BUILT {
        let d = defaults::for_arch(built.arch);
        let gathers = d.gather.buckets().iter().map(|(_, v)| v.name());
        for name in gathers.chain(d.dequant.buckets().iter().map(|(_, v)| v.name())) {
            assert!(
                ptx::entries(built.text).any(|e| e == name),
                "{}'s default {name} is not in its PTX",
                built.arch
            );
        }
    }
}

/// The body of entry `name` in a PTX text.
fn entry_body<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.split(".entry ")
        .skip(1)
        .find(|body| body.split('(').next() == Some(name))
}

/// Each width build is in every PTX its variant is, and splits a thread's index into row and
/// word with no division, where its variant, whose width comes from the parameters, needs one
/// for widths that are no power of two; neither reads the block size (`%ntid`): the shapes fix
/// it, and the build declares it (its PTX requires it: `.reqntid`), the block its variant's
/// launches use.
#[test]
fn a_width_build_splits_its_index_without_a_division() {
    let divides = |body: &str| body.contains("div.") || body.contains("rem.");
    for built in ptx::BUILT {
        for build in width_builds() {
            let Some(variant) = entry_body(built.text, build.of) else {
                continue;
            };
            let body = entry_body(built.text, build.name)
                .unwrap_or_else(|| panic!("{}: {} but no {}", built.arch, build.of, build.name));
            assert!(divides(variant), "{} {}", built.arch, build.of);
            assert!(!divides(body), "{} {}", built.arch, build.name);
            assert!(!variant.contains("%ntid") && !body.contains("%ntid"));
        }
    }
    for build in width_builds() {
        let declared = all_kernels().find(|k| k.name == build.name).unwrap();
        let launched = if let Some(v) = GatherVariant::named(build.of) {
            v.variant().shape.block_threads()
        } else {
            DequantVariant::named(build.of)
                .unwrap()
                .variant()
                .shape
                .block_threads()
        };
        assert_eq!(declared.block_threads, Some(launched), "{}", build.name);
    }
    let names: Vec<&str> = width_builds().map(|b| b.of).collect();
    for default in ["gather_words8_pass", "gather_dequant_unit_pass_b128"] {
        assert!(names.contains(&default), "{default} has no width build");
    }
}

static FAKE: [BuiltPtx; 3] = [
    BuiltPtx {
        arch: "sm_121a",
        text: "",
    },
    BuiltPtx {
        arch: "sm_90",
        text: "",
    },
    BuiltPtx {
        arch: "sm_80",
        text: "",
    },
];

/// The rule, on the default build's three archs: the device's own arch (its `a` build first),
/// else the newest plain PTX older than the device; an `a` PTX never on another arch; a forced
/// arch when it runs there; each choice saying why.
#[test]
fn a_device_gets_the_newest_ptx_not_newer_than_it() {
    let cases = [
        ((8, 0), "sm_80", Reason::Exact, "A100"),
        ((8, 6), "sm_80", Reason::NewestNotNewer, "A10"),
        ((8, 9), "sm_80", Reason::NewestNotNewer, "L40S"),
        ((9, 0), "sm_90", Reason::Exact, "H200"),
        ((10, 0), "sm_90", Reason::NewestNotNewer, "B200"),
        ((10, 3), "sm_90", Reason::NewestNotNewer, "B300"),
        ((12, 0), "sm_90", Reason::NewestNotNewer, "RTX 5090"),
        ((12, 1), "sm_121a", Reason::Exact, "GB10"),
        ((13, 0), "sm_90", Reason::NewestNotNewer, "a future part"),
    ];
    for (cc, arch, reason, device) in cases {
        let choice = choose(&FAKE, device, cc, None).unwrap();
        assert_eq!((choice.ptx.arch, choice.reason), (arch, reason), "{device}");
    }
    let why = choose(&FAKE, "B200", (10, 0), None).unwrap().to_string();
    assert_eq!(
        why,
        "sm_90 PTX for a 10.0 device: the newest embedded PTX not newer than the device (the \
         driver compiles it forward)"
    );
    let why = choose(&FAKE, "H200", (9, 0), None).unwrap().to_string();
    assert_eq!(
        why,
        "sm_90 PTX for a 9.0 device: built for exactly this arch"
    );

    // Forced: any built plain PTX not newer than the device, the `a` one only on its chip.
    let forced = choose(&FAKE, "H200", (9, 0), Some("sm_80")).unwrap();
    assert_eq!((forced.ptx.arch, forced.reason), ("sm_80", Reason::Forced));
    assert_eq!(
        forced.to_string(),
        "sm_80 PTX for a 9.0 device: forced by FETCHAHEAD_PTX_ARCH=sm_80"
    );
    let forced = choose(&FAKE, "GB10", (12, 1), Some("sm_90")).unwrap();
    assert_eq!(forced.ptx.arch, "sm_90");
    // An empty setting is no setting.
    assert_eq!(
        choose(&FAKE, "H200", (9, 0), Some("")).unwrap().reason,
        Reason::Exact
    );
    for (cc, arch) in [((9, 0), "sm_121a"), ((8, 0), "sm_90"), ((12, 0), "sm_121a")] {
        match choose(&FAKE, "dev", cc, Some(arch)) {
            Err(e @ Error::Invalid { .. }) => {
                let m = e.to_string();
                assert!(m.contains("FETCHAHEAD_PTX_ARCH") && m.contains(arch), "{m}");
            }
            other => panic!("{arch} forced on {cc:?}: {other:?}"),
        }
    }
    match choose(&FAKE, "H200", (9, 0), Some("sm_8O")) {
        Err(e @ Error::UnknownArch { .. }) => {
            let m = e.to_string();
            assert!(
                m.contains("sm_8O") && m.contains("sm_121a,sm_90,sm_80"),
                "{m}"
            );
        }
        other => panic!("a misspelt arch: {other:?}"),
    }
    // Without the baseline, an Ampere part has none; a 7.5 part never has one.
    match choose(&FAKE[..2], "A100", (8, 0), None) {
        Err(Error::NoPtxForDevice { wanted, .. }) => assert_eq!(wanted, "sm_80"),
        other => panic!("expected NoPtxForDevice, got {other:?}"),
    }
}

#[test]
fn devices_get_the_ptx_of_their_compute_capability() {
    let built = ptx::built_archs();
    let chosen = |cc| choose(ptx::BUILT, "dev", cc, None).unwrap().ptx.arch;
    if built.split(',').any(|a| a == "sm_90") {
        assert_eq!(chosen((9, 0)), "sm_90");
        assert_eq!(chosen((10, 0)), "sm_90");
    }
    if built.split(',').any(|a| a == "sm_121a") {
        assert_eq!(chosen((12, 1)), "sm_121a");
    }
    match choose(ptx::BUILT, "old card", (7, 5), None) {
        Err(e @ Error::NoPtxForDevice { .. }) => {
            let message = e.to_string();
            assert!(
                message.contains("sm_75") && message.contains("FETCHAHEAD_ARCHS"),
                "{message}"
            );
        }
        other => panic!("expected NoPtxForDevice, got {other:?}"),
    }
    assert!(matches!(
        ptx::for_arch("sm_1"),
        Err(Error::UnknownArch { .. })
    ));
}

#[test]
fn kernels_have_no_panic_path_and_no_local_stack() {
    ptx_checks::no_panic_path_and_no_local_stack(ptx::BUILT);
}

/// gather_bulk and the cp.async gathers have a shared buffer each.
#[test]
fn kernels_declare_at_most_one_shared_buffer() {
    ptx_checks::at_most_one_shared_buffer(ptx::BUILT, 3);
}

/// The L2 prefetches and the gathers record the device timeline; the empty gather, the check
/// comparison and the partition probe do not. The partition probe and the loads and copies
/// prefetches (whose blocks pick their L2 partition's jobs) read `%smid` for their own work.
#[test]
fn timed_twins_declare_their_timeline_word_once_and_plain_kernels_none() {
    ptx_checks::timed_twins_declare_their_timeline_word_once(
        Module::Product,
        ptx::BUILT,
        &["gather_empty", "check_equal", "l2_partition_probe"],
        &[
            "l2_partition_probe",
            "l2_prefetch_loads",
            "l2_prefetch_loads_timed",
            "l2_prefetch_copies",
            "l2_prefetch_copies_timed",
        ],
    );
}
