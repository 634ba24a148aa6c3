//! The variant tables that `variants!` emits beside the kernel entries: every name distinct (a PTX
//! entry is one symbol), every name found again by its family's `find`, and the prefetch handles
//! resolved by name. CPU only: it reads the tables, not the GPU.
use std::collections::HashSet;

use fetchahead::device_abi::l2_prefetch::{self, PrefetchVariant};
use fetchahead::device_abi::params::CHUNK_BYTES;
use fetchahead::device_abi::{all_kernels, dequant, gather, gemv};
use fetchahead::l2_plan::Replay;
use fetchahead::{DequantVariant, GatherVariant};

#[test]
fn every_kernel_name_is_distinct() {
    let mut seen = HashSet::new();
    for entry in all_kernels() {
        assert!(seen.insert(entry.name), "{} is declared twice", entry.name);
    }
    let rows = gather::VARIANTS.len()
        + dequant::VARIANTS.len()
        + l2_prefetch::VARIANTS.len()
        + gemv::VARIANTS.len();
    assert!(
        seen.len() > rows,
        "every row is an entry, with the one-off kernels besides"
    );
}

#[test]
fn find_round_trips_every_row() {
    for (i, v) in gather::VARIANTS.iter().enumerate() {
        assert_eq!(gather::find(v.name), Some(i), "{}", v.name);
    }
    for (i, v) in dequant::VARIANTS.iter().enumerate() {
        assert_eq!(dequant::find(v.name), Some(i), "{}", v.name);
    }
    for (i, v) in l2_prefetch::VARIANTS.iter().enumerate() {
        assert_eq!(l2_prefetch::find(v.name), Some(i), "{}", v.name);
        let handle = PrefetchVariant::named(v.name).expect(v.name);
        assert_eq!((handle.index(), handle.name()), (i, v.name));
        assert_eq!(handle.variant(), v);
        assert_eq!(handle.to_string(), v.name);
    }
    assert_eq!(
        PrefetchVariant::all()
            .map(PrefetchVariant::name)
            .collect::<Vec<_>>(),
        l2_prefetch::VARIANTS
            .iter()
            .map(|v| v.name)
            .collect::<Vec<_>>()
    );
    for missing in ["", "gather_chunk16 ", "l2_prefetch_nonesuch"] {
        assert_eq!(gather::find(missing), None);
        assert_eq!(dequant::find(missing), None);
        assert_eq!(PrefetchVariant::named(missing), None);
    }
}

#[test]
fn gather_and_dequant_handles_round_trip_every_row() {
    for (i, v) in gather::VARIANTS.iter().enumerate() {
        let handle = GatherVariant::named(v.name).expect(v.name);
        assert_eq!((handle.index(), handle.name()), (i, v.name));
        assert_eq!(handle.variant(), v);
        assert_eq!(handle.to_string(), v.name);
        assert_eq!(GatherVariant::at(i), Some(handle));
    }
    for (i, v) in dequant::VARIANTS.iter().enumerate() {
        let handle = DequantVariant::named(v.name).expect(v.name);
        assert_eq!((handle.index(), handle.name()), (i, v.name));
        assert_eq!(handle.variant(), v);
        assert_eq!(handle.to_string(), v.name);
        assert_eq!(DequantVariant::at(i), Some(handle));
    }
    assert_eq!(GatherVariant::all().count(), gather::VARIANTS.len());
    assert_eq!(DequantVariant::all().count(), dequant::VARIANTS.len());
    assert_eq!(GatherVariant::at(gather::VARIANTS.len()), None);
    assert_eq!(DequantVariant::at(dequant::VARIANTS.len()), None);
    const BULK: GatherVariant = GatherVariant::must("gather_bulk");
    assert_eq!(BULK.name(), "gather_bulk");
    for missing in ["", "gather_chunk16 ", "l2_prefetch"] {
        assert_eq!(GatherVariant::named(missing), None);
        assert_eq!(DequantVariant::named(missing), None);
    }
}

#[test]
fn the_named_prefetch_handles_are_their_rows() {
    assert_eq!(l2_prefetch::BULK_VARIANT.name(), "l2_prefetch");
    assert_eq!(l2_prefetch::LOADS_VARIANT.name(), "l2_prefetch_loads");
    assert_eq!(
        l2_prefetch::LOADS_VARIANT.variant().method,
        l2_prefetch::Method::Loads
    );
    assert_eq!(
        Replay::named("l2_prefetch_loads").unwrap(),
        Replay::Prefetch {
            variant: l2_prefetch::LOADS_VARIANT
        }
    );
    assert_eq!(Replay::named("auto").unwrap(), Replay::Auto);
    assert_eq!(
        Replay::named("access_policy").unwrap(),
        Replay::AccessPolicy
    );
    let e = Replay::named("bulk").unwrap_err().to_string();
    assert!(e.contains("l2_prefetch_evict_last"), "{e}");
    assert!(fetchahead::prefetch_variant_named("l2_prefetch_lines").is_ok());
}

/// The shapes the host sizes grids with come from the same declaration as the kernels' const
/// generics; spot-check that the declarations kept the shapes they had.
#[test]
fn declared_shapes_are_the_launch_shapes() {
    let g = |name| gather::VARIANTS[gather::find(name).unwrap()].shape;
    assert_eq!(
        g("gather_chunk16_nohint_x2"),
        gather::Shape::ChunkPerThread {
            unroll: 2,
            block_threads: gather::BLOCK_THREADS
        }
    );
    assert_eq!(
        g("gather_span8_b1"),
        gather::Shape::WarpSpan {
            unroll: 8,
            blocks_per_sm: 1
        }
    );
    assert_eq!(
        g("gather_bulk"),
        gather::Shape::TilePerBlock {
            block_threads: 32,
            tile_bytes: gather::BULK_TILE_BYTES
        }
    );
    assert_eq!(g("gather_warp_row"), gather::Shape::WarpPerRow);
    assert_eq!(
        g("gather_words8_pass"),
        gather::Shape::WordsOnePass { word_bytes: 8 }
    );
    assert_eq!(
        g("gather_rows2_w2"),
        gather::Shape::RowsTile { rows: 2, warps: 2 }
    );
    // Rows are whole 16-byte chunks, so a words variant's rows are whole words.
    for v in gather::VARIANTS {
        if let gather::Shape::WordsOnePass { word_bytes } = v.shape {
            assert!(
                word_bytes > 0 && CHUNK_BYTES.is_multiple_of(word_bytes),
                "{}",
                v.name
            );
        }
    }
    let d = |name| {
        let v = &dequant::VARIANTS[dequant::find(name).unwrap()];
        (v.conversion, v.shape)
    };
    assert_eq!(
        d("gather_dequant_u8_packed_x2_pass"),
        (
            dequant::Conversion::Packed,
            dequant::Shape::Units8 {
                unroll: 2,
                one_pass: true,
                block_threads: gather::BLOCK_THREADS
            }
        )
    );
    assert_eq!(
        d("gather_dequant_chunk_pass_cvt_b64"),
        (
            dequant::Conversion::Hardware,
            dequant::Shape::ChunkPass { block_threads: 64 }
        )
    );
    assert_eq!(
        d("gather_dequant_quad_pass_cvt_b256"),
        (
            dequant::Conversion::Hardware,
            dequant::Shape::QuadPass { block_threads: 256 }
        )
    );
    assert_eq!(
        d("gather_dequant_unit_pass_cvt_b128"),
        (
            dequant::Conversion::Hardware,
            dequant::Shape::Units8 {
                unroll: 1,
                one_pass: true,
                block_threads: 128
            }
        )
    );
    assert_eq!(
        d("gather_dequant_rows4_w1"),
        (
            dequant::Conversion::Packed,
            dequant::Shape::RowsTile { rows: 4, warps: 1 }
        )
    );
    let p = PrefetchVariant::named("l2_prefetch_evict_last")
        .unwrap()
        .variant();
    assert_eq!(
        (p.priority, p.method),
        (l2_prefetch::Priority::EvictLast, l2_prefetch::Method::Bulk)
    );
}

/// Each variant's `NEEDS` comes from its declaration's tokens: the hardware FP8 conversion needs
/// sm_89, bulk copies and prefetches (the prefetch by bulk copies too) and clusters sm_90, everything else the sm_80 baseline;
/// every kernel entry (twins included) carries its variant's.
#[test]
fn each_variant_needs_the_arch_its_declaration_implies() {
    use fetchahead::device_abi::BASELINE_SM;
    assert_eq!(gather::NEEDS.len(), gather::VARIANTS.len());
    assert_eq!(dequant::NEEDS.len(), dequant::VARIANTS.len());
    assert_eq!(l2_prefetch::NEEDS.len(), l2_prefetch::VARIANTS.len());
    assert_eq!(gemv::NEEDS.len(), gemv::VARIANTS.len());
    for (v, &needs) in gather::VARIANTS.iter().zip(gather::NEEDS) {
        let bulk = matches!(v.shape, gather::Shape::TilePerBlock { .. });
        let want = if bulk || v.name == "gather_chunk16_ahead" {
            90
        } else {
            BASELINE_SM
        };
        assert_eq!(needs, want, "{}", v.name);
    }
    for (v, &needs) in dequant::VARIANTS.iter().zip(dequant::NEEDS) {
        let want = match v.conversion {
            dequant::Conversion::Hardware => 89,
            dequant::Conversion::Packed if v.name.ends_with("_ahead") => 90,
            dequant::Conversion::Packed => BASELINE_SM,
        };
        assert_eq!(needs, want, "{}", v.name);
    }
    for (v, &needs) in l2_prefetch::VARIANTS.iter().zip(l2_prefetch::NEEDS) {
        let want = if matches!(
            v.method,
            l2_prefetch::Method::Bulk | l2_prefetch::Method::Copies
        ) {
            90
        } else {
            BASELINE_SM
        };
        assert_eq!(needs, want, "{}", v.name);
    }
    for (v, &needs) in gemv::VARIANTS.iter().zip(gemv::NEEDS) {
        let want = if v.reduce == gemv::Reduce::Cluster {
            90
        } else {
            BASELINE_SM
        };
        assert_eq!(needs, want, "{}", v.name);
    }
    for entry in all_kernels() {
        let plain = entry.name.strip_suffix("_timed").unwrap_or(entry.name);
        // A width build needs what its variant needs.
        let plain = fetchahead::device_abi::width_builds()
            .find(|b| b.name == plain)
            .map_or(plain, |b| b.of);
        let family_needs = [
            (gather::find(plain), gather::NEEDS),
            (dequant::find(plain), dequant::NEEDS),
            (l2_prefetch::find(plain), l2_prefetch::NEEDS),
            (
                gemv::VARIANTS.iter().position(|v| v.name == plain),
                gemv::NEEDS,
            ),
        ]
        .into_iter()
        .find_map(|(i, needs)| i.map(|i| needs[i]));
        assert_eq!(
            entry.needs,
            family_needs.unwrap_or(BASELINE_SM),
            "{}",
            entry.name
        );
    }
}

/// `FETCHAHEAD_PTX_ARCH` is a setting fetchahead reads: set, it draws no typo warning, and a
/// misspelling of it does.
#[test]
fn the_ptx_arch_setting_is_known() {
    assert_eq!(
        fetchahead::settings::unknown_env_names(
            ["FETCHAHEAD_PTX_ARCH", "FETCHAHEAD_PTX_ARC"].map(String::from)
        ),
        vec!["FETCHAHEAD_PTX_ARC".to_string()]
    );
    assert_eq!(
        fetchahead::kernels::ptx::PTX_ARCH_ENV,
        "FETCHAHEAD_PTX_ARCH"
    );
}
