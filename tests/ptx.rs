//! The embedded PTX: every arch built, every kernel present, and the device-to-arch choice.
use fetchahead::device_abi::all_kernels;
use fetchahead::{Error, ptx};

#[test]
fn every_built_arch_has_every_kernel() {
    assert!(!ptx::BUILT.is_empty());
    for built in ptx::BUILT {
        let entries: Vec<&str> = ptx::entries(built.text).collect();
        for kernel in all_kernels() {
            assert!(
                entries.contains(&kernel.name),
                "{} lacks {}",
                built.arch,
                kernel.name
            );
        }
        assert!(
            built.text.contains(&format!(".target {}", built.arch)),
            "{}",
            built.arch
        );
    }
}

#[test]
fn devices_get_the_ptx_of_their_compute_capability() {
    let built = ptx::built_archs();
    if built.split(',').any(|a| a == "sm_90") {
        assert_eq!(
            ptx::for_compute_capability("H200", 9, 0).unwrap().arch,
            "sm_90"
        );
    }
    if built.split(',').any(|a| a == "sm_121a") {
        assert_eq!(
            ptx::for_compute_capability("GB10", 12, 1).unwrap().arch,
            "sm_121a"
        );
    }
    match ptx::for_compute_capability("old card", 7, 5) {
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
    for built in ptx::BUILT {
        for bad in ["trap;", "panic", ".local", "__local_depot"] {
            assert!(
                !built.text.contains(bad),
                "{} PTX contains `{bad}`",
                built.arch
            );
        }
    }
}

/// `smem::shared_buffer` declares its buffer inside its asm: a kernel whose asm LLVM duplicated
/// would get two buffers, its threads splitting between them. Every entry holds at most one.
#[test]
fn kernels_declare_at_most_one_shared_buffer() {
    for built in ptx::BUILT {
        let mut kernels_with_a_buffer = 0;
        for body in built.text.split(".entry ").skip(1) {
            let name = body.split('(').next().unwrap_or("?").trim();
            let declared = body.matches(".shared .align 128 .b8 fa_stage[").count();
            assert!(
                declared <= 1,
                "{} {name} declares {declared} shared buffers",
                built.arch
            );
            kernels_with_a_buffer += declared;
        }
        assert!(
            kernels_with_a_buffer >= 3,
            "{}: {kernels_with_a_buffer} kernels with a shared buffer (gather_bulk and the \
             cp.async gathers have one each)",
            built.arch
        );
    }
}

/// The device timeline: every kernel the timeline records (L2 prefetches, gathers, the
/// simulation's collective, readers and spin) has a `_timed` twin that declares its timeline word
/// exactly once (a duplicated `begin` would declare it twice and fail to load) and reads
/// `%smid`; the plain kernels, which run when the timeline is off, carry none of it.
#[test]
fn timed_twins_declare_their_timeline_word_once_and_plain_kernels_none() {
    let untimed = ["gather_empty", "hash_ngrams", "check_equal"];
    for built in ptx::BUILT {
        let mut twins = 0;
        for body in built.text.split(".entry ").skip(1) {
            let name = body.split('(').next().unwrap_or("?").trim();
            let declared = body
                .matches(".shared .align 8 .b8 fa_timeline_slot[8];")
                .count();
            let timed = name.ends_with("_timed");
            assert_eq!(declared, usize::from(timed), "{} {name}", built.arch);
            assert_eq!(body.contains("%smid"), timed, "{} {name}", built.arch);
            if timed {
                twins += 1;
            } else if !untimed.contains(&name) {
                let twin = fetchahead::device_abi::timed_twin(name);
                assert_eq!(
                    twin,
                    Some(format!("{name}_timed").as_str()),
                    "{}",
                    built.arch
                );
            }
        }
        let plain = all_kernels()
            .filter(|k| !k.name.ends_with("_timed"))
            .count();
        assert_eq!(
            twins,
            plain - untimed.len(),
            "{}: a twin a recorded kernel",
            built.arch
        );
    }
}
