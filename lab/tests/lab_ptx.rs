//! The embedded PTX of the lab's module (a test named apart from the product's `ptx`, so that the
//! bundled test executables do not collide): every arch built for the product holds exactly the lab
//! kernels it can run, with the checks the product's module passes (`tests/common/ptx_checks.rs`),
//! and no product kernel.
#[path = "../../tests/common/ptx_checks.rs"]
mod ptx_checks;
use fetchahead::device_abi::{BASELINE_SM, Module, all_kernels};
use fetchahead::ptx as product_ptx;
use fetchahead_lab::ptx;

#[test]
fn every_built_arch_has_exactly_the_lab_kernels_it_can_run() {
    ptx_checks::exactly_the_kernels_each_arch_can_run(Module::Lab, ptx::BUILT);
    // Built for the product's archs, so that the lab loads it at the arch the product loaded.
    let archs = |built: &[fetchahead::kernels::BuiltPtx]| -> Vec<&str> {
        built.iter().map(|b| b.arch).collect()
    };
    assert_eq!(archs(ptx::BUILT), archs(product_ptx::BUILT));
}

/// The baseline holds the GEMVs that reduce globally, the hasher, the spin and the collective;
/// the cluster GEMVs need sm_90.
#[test]
fn the_baseline_holds_all_but_the_cluster_readers() {
    let baseline = ptx::BUILT.iter().find(|b| b.arch == "sm_80");
    let Some(baseline) = baseline else {
        panic!("no sm_80 lab PTX");
    };
    assert_eq!(baseline.sm(), BASELINE_SM);
    let held: Vec<&str> = product_ptx::entries(baseline.text).collect();
    for name in ["gemv_bf16_m8", "hash_ngrams", "spin", "collective_spin"] {
        assert!(held.contains(&name), "sm_80 lacks {name}");
    }
    let cluster = all_kernels()
        .find(|k| k.name == "gemv_bf16_m8_cluster")
        .expect("the cluster GEMV in the list");
    assert_eq!((cluster.module, cluster.needs), (Module::Lab, 90));
    assert!(!held.contains(&cluster.name));
}

#[test]
fn kernels_have_no_panic_path_and_no_local_stack() {
    ptx_checks::no_panic_path_and_no_local_stack(ptx::BUILT);
}

/// The cluster GEMVs reduce through a shared buffer; the baseline has none of them.
#[test]
fn kernels_declare_at_most_one_shared_buffer() {
    ptx_checks::at_most_one_shared_buffer(ptx::BUILT, 0);
}

/// The readers, the spin and the collective record the device timeline; the hasher does not.
#[test]
fn timed_twins_declare_their_timeline_word_once_and_plain_kernels_none() {
    ptx_checks::timed_twins_declare_their_timeline_word_once(
        Module::Lab,
        ptx::BUILT,
        &["hash_ngrams"],
        &[],
    );
}
