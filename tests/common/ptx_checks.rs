//! The checks every embedded PTX module passes, the product's (`tests/ptx.rs`) and the lab's
//! (`lab/tests/lab_ptx.rs`, which includes this file by path): each arch holds exactly the
//! module's kernels it can run (each requiring the block size it declares), no panic path or
//! local stack, at most one shared buffer an entry, and the timed twins' timeline word.
use fetchahead::device_abi::{Module, all_kernels, timed_twin};
use fetchahead::kernels::ptx::{self, BuiltPtx};

/// Every kernel of `module` whose needs an arch meets is an entry of that arch's PTX, and no
/// other kernel of the list is (build.rs also refuses an entry outside the list).
pub fn exactly_the_kernels_each_arch_can_run(module: Module, built: &[BuiltPtx]) {
    assert!(!built.is_empty());
    for b in built {
        let entries: Vec<&str> = ptx::entries(b.text).collect();
        for kernel in all_kernels() {
            assert_eq!(
                entries.contains(&kernel.name),
                kernel.module == module && kernel.needs <= b.sm(),
                "{} {} module and {} ({} module, needs sm_{})",
                b.arch,
                module.name(),
                kernel.name,
                kernel.module.name(),
                kernel.needs
            );
        }
        assert!(
            b.text.contains(&format!(".target {}", b.arch)),
            "{}",
            b.arch
        );
        // An entry whose declaration fixes its block size requires it (`.reqntid`, between its
        // parameter list and its body), and no other entry requires one.
        for kernel in all_kernels().filter(|k| entries.contains(&k.name)) {
            let head = b
                .text
                .split(&format!(".entry {}(", kernel.name))
                .nth(1)
                .and_then(|rest| rest.split('{').next())
                .unwrap_or_default();
            let required = head
                .lines()
                .find_map(|line| line.trim().strip_prefix(".reqntid "))
                .map(str::to_string);
            let declared = kernel.block_threads.map(|t| format!("{t}, 1, 1"));
            assert_eq!(required, declared, "{} {}", b.arch, kernel.name);
        }
    }
}

pub fn no_panic_path_and_no_local_stack(built: &[BuiltPtx]) {
    for b in built {
        for bad in ["trap;", "panic", ".local", "__local_depot"] {
            assert!(!b.text.contains(bad), "{} PTX contains `{bad}`", b.arch);
        }
    }
}

/// `smem::shared_buffer` declares its buffer inside its asm: a kernel whose asm LLVM duplicated
/// would get two buffers, its threads splitting between them. Every entry holds at most one, and
/// at least `at_least` entries of each arch hold one.
pub fn at_most_one_shared_buffer(built: &[BuiltPtx], at_least: usize) {
    for b in built {
        let mut kernels_with_a_buffer = 0;
        for body in b.text.split(".entry ").skip(1) {
            let name = body.split('(').next().unwrap_or("?").trim();
            let declared = body.matches(".shared .align 128 .b8 fa_stage[").count();
            assert!(
                declared <= 1,
                "{} {name} declares {declared} shared buffers",
                b.arch
            );
            kernels_with_a_buffer += declared;
        }
        assert!(
            kernels_with_a_buffer >= at_least,
            "{}: {kernels_with_a_buffer} kernels with a shared buffer, want {at_least}",
            b.arch
        );
    }
}

/// The device timeline: every kernel of `module` the timeline records (all but `untimed`) has a
/// `_timed` twin that declares its timeline word exactly once (a duplicated `begin` would declare
/// it twice and fail to load) and reads `%smid`; the plain kernels, which run when the timeline
/// is off, carry none of it. `own_smid`: kernels that read `%smid` for their own work.
pub fn timed_twins_declare_their_timeline_word_once(
    module: Module,
    built: &[BuiltPtx],
    untimed: &[&str],
    own_smid: &[&str],
) {
    for b in built {
        let mut twins = 0;
        for body in b.text.split(".entry ").skip(1) {
            let name = body.split('(').next().unwrap_or("?").trim();
            let declared = body
                .matches(".shared .align 8 .b8 fa_timeline_slot[8];")
                .count();
            let timed = name.ends_with("_timed");
            assert_eq!(declared, usize::from(timed), "{} {name}", b.arch);
            if !own_smid.contains(&name) {
                assert_eq!(body.contains("%smid"), timed, "{} {name}", b.arch);
            }
            if timed {
                twins += 1;
            } else if !untimed.contains(&name) {
                let twin = timed_twin(name);
                assert_eq!(twin, Some(format!("{name}_timed").as_str()), "{}", b.arch);
            }
        }
        let plain = all_kernels()
            .filter(|k| k.module == module && k.twin_of.is_none() && b.holds(k.needs))
            .count();
        assert_eq!(
            twins,
            plain - untimed.len(),
            "{}: a twin a recorded kernel",
            b.arch
        );
    }
}
