//! The row store against an independent read of the same files: every read path, rank ranges,
//! the cache, advise, injected failures, files that shrink, and many threads at once.
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{DIM, Reference, make, open, outputs, paths, random_ids};
use fetchahead::Error;
use fetchahead::store::layout::PAGE;
use fetchahead::store::{ReadFault, ReadPath, RowStore, StoreOptions};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, serialize_to_file};

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn store_is_send_and_sync() {
    assert_send_sync::<RowStore>();
}

#[test]
fn every_path_returns_the_files_bytes() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 5000, &[1, 14], 3, 11);
    let reference = Reference::load(dir.path());
    // O_DIRECT off as well: the fallback when a filesystem refuses it.
    for (resident_scales, direct_io) in [(true, true), (false, true), (true, false)] {
        let options = StoreOptions {
            resident_scales,
            direct_io,
            ..Default::default()
        };
        let store = open(dir.path(), options);
        if !direct_io {
            assert!(store.direct_io().is_err());
        }
        assert_eq!(store.layers(), &[1, 14]);
        assert_eq!(store.dim(), DIM);
        for path in paths(&store) {
            for &layer in &[1u32, 14] {
                for (n, seed) in [(1usize, 1u64), (72, 2), (3000, 3)] {
                    let ids = random_ids(0..5000, n, seed + u64::from(layer));
                    let (mut w, mut s) = outputs(&store, ids.len());
                    store
                        .lookup_with(path, layer, &ids, &mut w, &mut s)
                        .unwrap();
                    let (ew, es) = reference.expect(layer, &ids);
                    assert!(
                        w == ew,
                        "{path} layer {layer} n {n} resident {resident_scales} direct {direct_io}: weights differ"
                    );
                    assert!(
                        s == es,
                        "{path} layer {layer} n {n} resident {resident_scales} direct {direct_io}: scales differ"
                    );
                }
            }
        }
    }
}

/// A file whose rows do not sit on page boundaries: an odd tensor first, and 96-byte rows.
fn unaligned_file(path: &std::path::Path, rows: usize, dim: usize) {
    let pad = vec![7u8; 100];
    let weights: Vec<u8> = (0..rows * dim)
        .map(|i| (i * 31 % 251) as u8 & 0x7e)
        .collect();
    let scales: Vec<u8> = (0..rows * dim / 32).map(|i| 120 + (i % 7) as u8).collect();
    let tensors = vec![
        (
            "aaa.pad",
            TensorView::new(Dtype::U8, vec![100], &pad).unwrap(),
        ),
        (
            "layers.3.engram.embed.weight",
            TensorView::new(Dtype::F8_E4M3, vec![rows, dim], &weights).unwrap(),
        ),
        (
            "layers.3.engram.embed.scale",
            TensorView::new(Dtype::U8, vec![rows, dim / 32], &scales).unwrap(),
        ),
    ];
    serialize_to_file(tensors, None, path).unwrap();
}

#[test]
fn rows_straddling_pages_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("odd.safetensors");
    unaligned_file(&file, 3000, 96);
    let store = open(&file, StoreOptions::default());
    let span = &store.layout().layer(3).unwrap().weight;
    assert_ne!(span.offset % PAGE, 0);
    assert!(span.straddling_rows_per_period().0 > 0);
    let reference = Reference::load(&file);
    // Every row, so that every straddling row and the file's last bytes are read.
    let ids: Vec<i64> = (0..3000).rev().collect();
    for path in paths(&store) {
        let (mut w, mut s) = outputs(&store, ids.len());
        store.lookup_with(path, 3, &ids, &mut w, &mut s).unwrap();
        let (ew, es) = reference.expect(3, &ids);
        assert!(w == ew && s == es, "{path}: bytes differ");
    }
}

#[test]
fn a_rank_serves_only_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 4000, &[2], 1, 5);
    let reference = Reference::load(dir.path());
    let options = StoreOptions {
        row_start: 1000,
        num_rows: Some(1500),
        ..Default::default()
    };
    let store = open(dir.path(), options.clone());
    assert_eq!(store.row_range(), 1000..2500);
    let ids = random_ids(1000..2500, 500, 9);
    for path in paths(&store) {
        let (mut w, mut s) = outputs(&store, ids.len());
        store.lookup_with(path, 2, &ids, &mut w, &mut s).unwrap();
        assert!((w, s) == reference.expect(2, &ids), "{path}");
    }
    let reads = store.stats().reads;
    for bad in [999i64, 2500, -1, i64::MAX] {
        let ids = [1200, bad, 1300];
        let (mut w, mut s) = outputs(&store, 3);
        match store.lookup(2, &ids, &mut w, &mut s) {
            Err(Error::RowsOutOfRange {
                count: 1,
                first_index: 1,
                first_id,
                ..
            }) => assert_eq!(first_id, bad),
            other => panic!("id {bad}: {other:?}"),
        }
        assert!(matches!(
            store.advise(2, &ids),
            Err(Error::RowsOutOfRange { .. })
        ));
    }
    assert_eq!(store.stats().reads, reads, "a rejected batch must not read");
    let (mut w, mut s) = outputs(&store, 2);
    assert!(matches!(
        store.lookup(7, &[1200, 1201], &mut w, &mut s),
        Err(Error::NoSuchLayer { layer: 7, .. })
    ));
    assert!(matches!(
        store.lookup(2, &[1200], &mut w, &mut s),
        Err(Error::Invalid { .. })
    ));
    let too_far = StoreOptions {
        row_start: 3000,
        num_rows: Some(1001),
        ..Default::default()
    };
    assert!(matches!(
        RowStore::open(dir.path(), too_far),
        Err(Error::Invalid { .. })
    ));
}

#[test]
fn duplicates_and_rows_sharing_a_page_share_one_read() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 4096, &[1], 1, 5);
    let reference = Reference::load(dir.path());
    let store = open(dir.path(), StoreOptions::default());
    // Rows 32..48 fill one page; each asked for twice.
    let ids: Vec<i64> = (32..48).chain((32..48).rev()).collect();
    for path in paths(&store) {
        let before = store.stats();
        let (mut w, mut s) = outputs(&store, ids.len());
        store.lookup_with(path, 1, &ids, &mut w, &mut s).unwrap();
        assert!((w, s) == reference.expect(1, &ids), "{path}");
        let after = store.stats();
        assert_eq!(after.reads - before.reads, 1, "{path}: one page, one read");
        assert_eq!(after.bytes - before.bytes, PAGE, "{path}");
    }
}

#[test]
fn cache_serves_hot_rows_and_counts() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 3000, &[1, 14], 1, 8);
    let reference = Reference::load(dir.path());
    let store = open(
        dir.path(),
        StoreOptions {
            cache_bytes: 1 << 20,
            ..Default::default()
        },
    );
    let ids = random_ids(0..3000, 72, 4);
    let unique = {
        let mut u = ids.clone();
        u.sort_unstable();
        u.dedup();
        u.len() as u64
    };
    for round in 0..3 {
        let (mut w, mut s) = outputs(&store, ids.len());
        store.lookup(14, &ids, &mut w, &mut s).unwrap();
        assert!((w, s) == reference.expect(14, &ids), "round {round}");
    }
    let stats = store.stats();
    assert_eq!(stats.misses, ids.len() as u64);
    assert_eq!(stats.hits, 2 * ids.len() as u64);
    assert_eq!(store.cached().0 as u64, unique);
    // Same rows of the other layer are other rows.
    let (mut w, mut s) = outputs(&store, ids.len());
    store.lookup(1, &ids, &mut w, &mut s).unwrap();
    assert!((w, s) == reference.expect(1, &ids));
    assert_eq!(store.stats().hits, stats.hits);
}

#[test]
fn cache_stays_within_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 20000, &[1], 1, 8);
    let budget = 64 << 10;
    let store = open(
        dir.path(),
        StoreOptions {
            cache_bytes: budget,
            ..Default::default()
        },
    );
    let ids: Vec<i64> = (0..20000).collect();
    let (mut w, mut s) = outputs(&store, ids.len());
    store.lookup(1, &ids, &mut w, &mut s).unwrap();
    let (rows, bytes) = store.cached();
    assert!(
        bytes <= budget,
        "{bytes} bytes cached over a {budget} budget"
    );
    assert!(rows > 0 && rows < 20000);
}

#[test]
fn advise_warms_the_cache_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 3000, &[1], 1, 8);
    let reference = Reference::load(dir.path());
    let store = open(
        dir.path(),
        StoreOptions {
            cache_bytes: 4 << 20,
            ..Default::default()
        },
    );
    let ids: Vec<i64> = (0..500).map(|i| i * 5).collect();
    store.advise(1, &ids).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while store.cached().0 < ids.len() {
        assert!(
            Instant::now() < deadline,
            "advise never warmed the cache: {:?}",
            store.stats()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let warmed = store.stats();
    assert_eq!((warmed.advised, warmed.misses), (ids.len() as u64, 0));
    let hits = warmed.hits;
    let (mut w, mut s) = outputs(&store, ids.len());
    store.lookup(1, &ids, &mut w, &mut s).unwrap();
    assert!((w, s) == reference.expect(1, &ids));
    assert_eq!(store.stats().hits - hits, ids.len() as u64);
}

#[test]
fn advise_without_a_cache_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 3000, &[1], 1, 8);
    let store = open(dir.path(), StoreOptions::default());
    store.advise(1, &[1, 2, 3, 2999]).unwrap();
    assert!(matches!(
        store.advise(2, &[1]),
        Err(Error::NoSuchLayer { .. })
    ));
}

/// The error of a lookup under `fault`, with the rows it names.
fn faulted(
    dir: &std::path::Path,
    path: ReadPath,
    fault: ReadFault,
    ids: &[i64],
) -> Result<(Vec<u8>, Vec<u8>), Error> {
    let store = open(dir, StoreOptions::default());
    assert!(store.inject_read_fault(fault));
    let (mut w, mut s) = outputs(&store, ids.len());
    store
        .lookup_with(path, 1, ids, &mut w, &mut s)
        .map(|()| (w, s))
}

#[test]
fn failed_reads_name_their_rows() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 4096, &[1], 1, 6);
    let store = open(dir.path(), StoreOptions::default());
    // Row 1000 shares its page with 1001; 3000 is elsewhere.
    let ids = [3000i64, 1000, 1001, 5];
    for path in paths(&store) {
        match faulted(
            dir.path(),
            path,
            ReadFault::Fail {
                row: 1000,
                errno: libc::EIO,
            },
            &ids,
        ) {
            Err(Error::RowRead {
                layer: 1,
                rows,
                source,
                ..
            }) => {
                assert_eq!(rows.0, vec![1000, 1001], "{path}");
                assert_eq!(source.raw_os_error(), Some(libc::EIO), "{path}");
            }
            other => panic!("{path}: {other:?}"),
        }
        match faulted(dir.path(), path, ReadFault::Eof { row: 3000 }, &ids) {
            Err(Error::RowRead { rows, source, .. }) => {
                assert_eq!(rows.0, vec![3000], "{path}");
                assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof, "{path}");
            }
            other => panic!("{path}: {other:?}"),
        }
    }
}

#[test]
fn interrupted_and_short_reads_are_retried() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 4096, &[1], 1, 6);
    let reference = Reference::load(dir.path());
    let store = open(dir.path(), StoreOptions::default());
    let ids = random_ids(0..4096, 200, 3);
    for path in paths(&store) {
        for fault in [
            ReadFault::Interrupt { times: 5 },
            ReadFault::Short {
                row: ids[5] as u64,
                times: 2,
            },
        ] {
            let (w, s) = faulted(dir.path(), path, fault, &ids)
                .unwrap_or_else(|e| panic!("{path} {fault:?}: {e}"));
            assert!((w, s) == reference.expect(1, &ids), "{path} {fault:?}");
        }
        // More interruptions than a read tolerates reach the caller.
        let err =
            faulted(dir.path(), path, ReadFault::Interrupt { times: 1000 }, &[7]).unwrap_err();
        assert!(
            matches!(&err, Error::RowRead { rows, .. } if rows.0 == vec![7]),
            "{path}: {err}"
        );
    }
}

#[test]
fn a_file_that_shrinks_after_open_fails_with_the_lost_rows() {
    let dir = tempfile::tempdir().unwrap();
    let files = make(dir.path(), 4096, &[1], 1, 6);
    for path in [
        ReadPath::Uring,
        ReadPath::Preadv,
        ReadPath::Mmap,
        ReadPath::Buffered,
    ] {
        // The round before cut the table's file: a file changed since written is no longer
        // provably the writer's own, so writing the table again takes --force.
        let forced = fetchahead::store::make::WriteOptions {
            force: true,
            ..Default::default()
        };
        let spec = fetchahead::store::make::TableSpec {
            rows: 4096,
            layers: vec![1],
            dim: DIM,
            shards: 1,
            seed: 6,
        };
        fetchahead::store::make::write_table_with(dir.path(), &spec, &forced, |_| {}).unwrap();
        let store = open(dir.path(), StoreOptions::default());
        if path == ReadPath::Uring && store.uring().is_err() {
            continue;
        }
        let span = store.layout().layer(1).unwrap().weight.clone();
        // Cut the file in the middle of row 4000's page.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&files[0])
            .unwrap();
        f.set_len(span.row_offset(4000) + 128).unwrap();
        store.evict_page_cache().unwrap();
        let ids = [10i64, 4000, 4095, 20];
        let (mut w, mut s) = outputs(&store, ids.len());
        match store.lookup_with(path, 1, &ids, &mut w, &mut s) {
            Err(Error::RowRead { rows, .. }) => assert_eq!(rows.0, vec![4000, 4095], "{path}"),
            other => panic!("{path}: {other:?}"),
        }
        // Rows before the cut read, but the shard is not the one opened (issue 21, item 9):
        // the lookup fails saying so rather than serve a changed table.
        let (mut w, mut s) = outputs(&store, 2);
        match store.lookup_with(path, 1, &[10, 3999], &mut w, &mut s) {
            Err(Error::ShardChanged { .. }) => {}
            other => panic!("{path}: {other:?}"),
        }
    }
}

#[test]
fn concurrent_lookups_match_one_thread() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 20000, &[1, 14], 2, 21);
    let reference = Arc::new(Reference::load(dir.path()));
    for cache_bytes in [0, 2 << 20] {
        let store = Arc::new(open(
            dir.path(),
            StoreOptions {
                cache_bytes,
                ..Default::default()
            },
        ));
        let all = paths(&store);
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let (store, reference, all) = (store.clone(), reference.clone(), all.clone());
                std::thread::spawn(move || {
                    for i in 0..30u64 {
                        let path = all[((t + i) % all.len() as u64) as usize];
                        let layer = if (t + i) % 2 == 0 { 1 } else { 14 };
                        let ids = random_ids(
                            0..20000,
                            1 + ((t * 37 + i * 101) % 700) as usize,
                            t * 1000 + i,
                        );
                        let (mut w, mut s) = outputs(&store, ids.len());
                        store
                            .lookup_with(path, layer, &ids, &mut w, &mut s)
                            .unwrap();
                        assert!(
                            (w, s) == reference.expect(layer, &ids),
                            "thread {t} batch {i} {path}"
                        );
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}

#[test]
fn make_table_is_deterministic_for_a_seed() {
    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let fa = make(a.path(), 3000, &[1, 14], 2, 77);
    let fb = make(b.path(), 3000, &[1, 14], 2, 77);
    let fc = make(c.path(), 3000, &[1, 14], 2, 78);
    for ((x, y), z) in fa.iter().zip(&fb).zip(&fc) {
        let (x, y, z) = (
            std::fs::read(x).unwrap(),
            std::fs::read(y).unwrap(),
            std::fs::read(z).unwrap(),
        );
        assert_eq!(x, y);
        if x.len() > 8192 {
            assert_ne!(x, z, "another seed, other bytes");
        }
    }
    // FP8 weights hold no NaN.
    let reference = Reference::load(a.path());
    for r in 0..3000 {
        assert!(
            reference
                .row("layers.1.engram.embed.weight", r)
                .iter()
                .all(|b| b & 0x7f != 0x7f)
        );
    }
}

#[test]
fn tuning_is_kept_beside_the_table_and_picks_by_batch() {
    use fetchahead::store::Tuning;
    use fetchahead::store::tune::{TunedRange, tune_file};
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 3000, &[1], 1, 2);
    let reference = Reference::load(dir.path());
    let tuning = Tuning {
        ranges: vec![
            TunedRange {
                max_batch: 500,
                path: ReadPath::Mmap,
                p50_us: 10.0,
            },
            TunedRange {
                max_batch: u64::MAX,
                path: ReadPath::Preadv,
                p50_us: 20.0,
            },
        ],
    };
    tuning.save(&tune_file(dir.path())).unwrap();
    let store = open(dir.path(), StoreOptions::default());
    assert_eq!(store.tuning(), &tuning);
    // Auto never takes mmap (SIGBUS on a truncated shard): its range falls back to the default.
    let default = if store.uring().is_ok() {
        ReadPath::Uring
    } else {
        ReadPath::Preadv
    };
    assert_eq!(store.auto_path(72), default);
    assert_eq!(store.auto_path(501), ReadPath::Preadv);
    let ids = random_ids(0..3000, 600, 1);
    let (mut w, mut s) = outputs(&store, ids.len());
    let before = store.stats().reads;
    store.lookup(1, &ids, &mut w, &mut s).unwrap();
    assert!((w, s) == reference.expect(1, &ids));
    assert!(store.stats().reads > before);
    std::fs::write(
        tune_file(dir.path()),
        b"{\"ranges\": [{\"max_batch\": 1, \"path\": \"floppy\"}]}",
    )
    .unwrap();
    // A tune file that does not parse is a hint ignored with a warning (issue 21, item 10).
    let store = RowStore::open(dir.path(), StoreOptions::default()).unwrap();
    assert!(store.tuning().ranges.is_empty());
}

#[test]
fn tune_measures_every_path() {
    use fetchahead::store::tune::measure;
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 20000, &[1], 1, 2);
    let store = open(dir.path(), StoreOptions::default());
    let mut seen = Vec::new();
    let tuning = measure(&store, 1, 3, |s| seen.push((s.batch, s.path))).unwrap();
    for path in paths(&store).into_iter().filter(|&p| p != ReadPath::Auto) {
        assert!(seen.contains(&(72, path)), "{path} not measured");
    }
    assert!(!tuning.ranges.is_empty());
    assert_eq!(tuning.ranges.last().unwrap().max_batch, u64::MAX);
    assert!(
        tuning
            .ranges
            .windows(2)
            .all(|w| w[0].max_batch < w[1].max_batch)
    );
}

#[test]
fn many_advised_batches_all_land_or_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 20000, &[1], 1, 8);
    let store = open(
        dir.path(),
        StoreOptions {
            cache_bytes: 16 << 20,
            ..Default::default()
        },
    );
    let batches = 200u64;
    for b in 0..batches {
        let ids: Vec<i64> = (0..100).map(|i| (b * 100 + i) as i64).collect();
        store.advise(1, &ids).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stats = store.stats();
        // Every batch was either warmed (its 100 distinct rows read) or dropped.
        if stats.advised / 100 + stats.advise_dropped == batches {
            assert_eq!(stats.advise_failed, 0);
            assert_eq!(
                (stats.hits, stats.misses),
                (0, 0),
                "advise is not the caller's traffic"
            );
            assert_eq!(store.cached().0 as u64, stats.advised);
            break;
        }
        assert!(Instant::now() < deadline, "{stats:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn cache_fills_never_read_the_callers_output() {
    // The outputs are scribbled over once the reads land and before the cache takes the rows: a
    // store that filled its cache by reading them back (write-combined memory in the
    // prefetcher) would then serve the scribble from the cache.
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 3000, &[1], 1, 8);
    let reference = Reference::load(dir.path());
    let ids = [7i64, 1500, 7, 2999, 12, 13];
    for resident_scales in [true, false] {
        let probe = open(dir.path(), StoreOptions::default());
        for path in paths(&probe) {
            let store = open(
                dir.path(),
                StoreOptions {
                    cache_bytes: 1 << 20,
                    resident_scales,
                    ..Default::default()
                },
            );
            assert!(store.inject_read_fault(ReadFault::ScribbleOutput { byte: 0xa5 }));
            let (mut w, mut s) = outputs(&store, ids.len());
            store.lookup_with(path, 1, &ids, &mut w, &mut s).unwrap();
            assert!(w.iter().all(|&b| b == 0xa5), "{path}: the fault scribbles");
            let (mut w, mut s) = outputs(&store, ids.len());
            store.lookup_with(path, 1, &ids, &mut w, &mut s).unwrap();
            assert_eq!(store.stats().hits, ids.len() as u64, "{path}: all hits");
            assert!(
                (w, s) == reference.expect(1, &ids),
                "{path} (resident scales {resident_scales}): the cache holds the file's bytes"
            );
        }
    }
}

#[test]
fn uring_rings_report_what_the_kernel_gave() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 3000, &[1], 1, 8);
    let store = open(dir.path(), StoreOptions::default());
    if let Err(why) = store.uring() {
        eprintln!("SKIP uring_rings_report_what_the_kernel_gave: {why}");
        return;
    }
    assert!(store.ring_features().is_none());
    let reference = Reference::load(dir.path());
    let ids = random_ids(0..3000, 300, 2);
    // Lookups from several threads: each gets its own single-issuer ring.
    std::thread::scope(|scope| {
        for _ in 0..3 {
            scope.spawn(|| {
                for _ in 0..3 {
                    let (mut w, mut s) = outputs(&store, ids.len());
                    store
                        .lookup_with(ReadPath::Uring, 1, &ids, &mut w, &mut s)
                        .unwrap();
                    assert!((w, s) == reference.expect(1, &ids));
                }
            });
        }
    });
    let f = store.ring_features().expect("a ring was set up");
    eprintln!("io_uring features: {f:?}");
    assert!(["single_issuer+defer_taskrun", "coop_taskrun", "none"].contains(&f.task_run));
    assert_eq!(
        f.fallbacks.is_empty(),
        f.task_run == "single_issuer+defer_taskrun"
            && f.no_sqarray
            && f.registered_buffers
            && f.registered_files
            && f.registered_ring_fd
            && f.noatime_reads,
        "{f:?}"
    );
}

/// Lookups many ring depths long register the ring's descriptor for their enters (and give it
/// back): the bytes are right, from several threads, and nothing is lost to a late refusal.
#[test]
fn long_uring_lookups_read_right_through_a_registered_ring() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 6000, &[1], 1, 9);
    let store = open(
        dir.path(),
        StoreOptions {
            uring_depth: 8,
            ..Default::default()
        },
    );
    if let Err(why) = store.uring() {
        eprintln!("SKIP long_uring_lookups_read_right_through_a_registered_ring: {why}");
        return;
    }
    let reference = Reference::load(dir.path());
    std::thread::scope(|scope| {
        for t in 0..2u64 {
            let (store, reference) = (&store, &reference);
            scope.spawn(move || {
                for k in 0..4 {
                    // Far more than the 2 x 8 reads a lookup needs to register the ring.
                    let ids = random_ids(0..6000, 1500, 40 + t * 10 + k);
                    let (mut w, mut s) = outputs(store, ids.len());
                    store
                        .lookup_with(ReadPath::Uring, 1, &ids, &mut w, &mut s)
                        .unwrap();
                    assert!(
                        (w, s) == reference.expect(1, &ids),
                        "thread {t}, lookup {k}"
                    );
                }
            });
        }
    });
    let f = store.ring_features().expect("a ring was set up");
    eprintln!("io_uring features: {f:?}");
    assert_eq!(
        f.registered_ring_fd,
        !f.fallbacks.iter().any(|w| w.contains("RING_FDS")),
        "{f:?}"
    );
}

#[test]
fn a_lone_row_costs_one_block_of_the_files_dio_alignment() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 4096, &[1], 1, 5);
    let reference = Reference::load(dir.path());
    let store = open(dir.path(), StoreOptions::default());
    let (block, why) = store.read_block();
    eprintln!("read block {block} bytes ({})", why.unwrap_or("from statx"));
    assert!(block.is_power_of_two() && (512..=PAGE).contains(&block));
    if store.direct_io().is_ok() && why.is_none() {
        // 256-byte rows from a page-aligned offset: rows 100 and 3000 each lie in one block.
        let ids = [100i64, 3000];
        for path in paths(&store) {
            let before = store.stats();
            let (mut w, mut s) = outputs(&store, ids.len());
            store.lookup_with(path, 1, &ids, &mut w, &mut s).unwrap();
            assert!((w, s) == reference.expect(1, &ids), "{path}");
            let after = store.stats();
            assert_eq!(after.rows_read - before.rows_read, 2, "{path}");
            assert_eq!(after.bytes - before.bytes, 2 * block, "{path}");
        }
    }
}

#[test]
fn two_layers_and_an_advise_at_once_match_one_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 20000, &[1, 14], 2, 23);
    let store = open(
        dir.path(),
        StoreOptions {
            cache_bytes: 1 << 20,
            ..Default::default()
        },
    );
    // Zipf ids with duplicates, as decode and prefill batches.
    let mut z = fetchahead::store::zipf::ZipfRows::new(0..20000, 1, 1.0, 3).unwrap();
    let batches: Vec<Vec<i64>> = (0..12)
        .map(|i| z.batch(if i % 4 == 0 { 3000 } else { 72 }))
        .collect();
    // One at a time first: the answers.
    let alone: Vec<[(Vec<u8>, Vec<u8>); 2]> = batches
        .iter()
        .map(|ids| {
            [1u32, 14].map(|layer| {
                let (mut w, mut s) = outputs(&store, ids.len());
                store.lookup(layer, ids, &mut w, &mut s).unwrap();
                (w, s)
            })
        })
        .collect();
    let fresh = open(
        dir.path(),
        StoreOptions {
            cache_bytes: 1 << 20,
            ..Default::default()
        },
    );
    for (k, ids) in batches.iter().enumerate() {
        let next = &batches[(k + 1) % batches.len()];
        let got = std::thread::scope(|scope| {
            let lookups = [1u32, 14].map(|layer| {
                let fresh = &fresh;
                scope.spawn(move || {
                    let (mut w, mut s) = outputs(fresh, ids.len());
                    fresh.lookup(layer, ids, &mut w, &mut s).unwrap();
                    (w, s)
                })
            });
            fresh.advise(1, next).unwrap();
            fresh.advise(14, next).unwrap();
            lookups.map(|h| h.join().unwrap())
        });
        assert!(got == alone[k], "batch {k}: concurrent bytes differ");
    }
}

#[test]
fn a_batch_spread_over_several_rings_returns_the_files_bytes() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 160_000, &[1], 1, 31);
    let reference = Reference::load(dir.path());
    let options = StoreOptions {
        uring_rings: 3,
        ..Default::default()
    };
    let store = open(dir.path(), options.clone());
    if let Err(why) = store.uring() {
        eprintln!("SKIP a_batch_spread_over_several_rings_returns_the_files_bytes: {why}");
        return;
    }
    // One row every 2 KiB: no two rows share or neighbour a block, so 20000 reads, 3 rings.
    let ids: Vec<i64> = (0..20_000i64).rev().map(|i| i * 8).collect();
    let (mut w, mut s) = outputs(&store, ids.len());
    store
        .lookup_with(ReadPath::Uring, 1, &ids, &mut w, &mut s)
        .unwrap();
    assert!((w, s) == reference.expect(1, &ids));
    assert!(store.stats().reads >= 16_384);
    // A failed read on one of the rings still names its row.
    let faulty = open(dir.path(), options);
    assert!(faulty.inject_read_fault(ReadFault::Fail {
        row: 8 * 777,
        errno: libc::EIO
    }));
    let (mut w, mut s) = outputs(&faulty, ids.len());
    let err = faulty
        .lookup_with(ReadPath::Uring, 1, &ids, &mut w, &mut s)
        .unwrap_err();
    assert!(
        matches!(&err, Error::RowRead { rows, .. } if rows.0 == vec![8 * 777]),
        "{err}"
    );
}

#[test]
fn the_row_cache_nears_the_optimum_on_zipf_traces() {
    use fetchahead::store::belady::belady;
    use fetchahead::store::zipf::ZipfRows;
    use fetchahead::store::{cache_bytes_for, cache_rows, replay_row_cache};
    // The store's own cache, replayed on decode batches: near Belady at s >= 1 (BENCHMARKS.md,
    // issue 16, has the figures at production-like sizes), below it but useful at s = 0.8.
    for (s, floor) in [(1.2, 0.93), (1.0, 0.88), (0.8, 0.72)] {
        let mut z = ZipfRows::new(0..200_000, 1, s, 5).unwrap();
        let trace = z.batches(6000, 72);
        let bytes = cache_bytes_for(10_000, DIM);
        let cap = cache_rows(bytes, DIM);
        // At least the rows asked for (the budget's allocation rounding may fit a few more).
        assert!((10_000..10_100).contains(&cap), "{cap}");
        let opt = belady(&trace, cap, 3000);
        let got = replay_row_cache(bytes, DIM, &trace, 3000);
        assert_eq!(got.requests, opt.requests);
        let ratio = got.rate() / opt.rate();
        eprintln!(
            "s={s}: {:.3} = {ratio:.3} x Belady {:.3}",
            got.rate(),
            opt.rate()
        );
        assert!(ratio >= floor, "s={s}: {ratio:.3} x Belady");
    }
}

// Issue 25: real lookup traces, the policies beside the row cache, and look-ahead.

#[test]
fn a_trace_reads_the_same_from_u64_and_xz_and_its_steps_cut_it() {
    use fetchahead::store::trace::{Step, batch_ids, read_ids, read_steps, step_batches};
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<i64> = (0..4800i64).map(|i| (i * 7919) % 100_003).collect();
    let bytes: Vec<u8> = ids.iter().flat_map(|&i| (i as u64).to_le_bytes()).collect();
    let raw = dir.path().join("t.u64");
    std::fs::write(&raw, &bytes).unwrap();
    let xz = dir.path().join("t.u64.xz");
    let mut packed = Vec::new();
    lzma_rs::xz_compress(&mut &bytes[..], &mut packed).unwrap();
    std::fs::File::create(&xz)
        .unwrap()
        .write_all(&packed)
        .unwrap();
    assert_eq!(read_ids(&raw).unwrap(), ids);
    assert_eq!(read_ids(&xz).unwrap(), ids);
    // A torn file and a corrupt .xz are errors naming the file.
    let torn = dir.path().join("torn.u64");
    std::fs::write(&torn, &bytes[..bytes.len() - 3]).unwrap();
    let err = read_ids(&torn).unwrap_err().to_string();
    assert!(
        err.contains("torn.u64") && err.contains("whole number"),
        "{err}"
    );
    let bad = dir.path().join("bad.u64.xz");
    std::fs::write(&bad, &bytes[..64]).unwrap();
    let err = read_ids(&bad).unwrap_err().to_string();
    assert!(err.contains("bad.u64.xz"), "{err}");
    // Steps: (decode, prefill) token pairs, 16 ids a token.
    let steps = [(0u32, 200u32), (16, 0), (4, 80)];
    let sbytes: Vec<u8> = steps
        .iter()
        .flat_map(|&(d, p)| [d.to_le_bytes(), p.to_le_bytes()].concat())
        .collect();
    let sf = dir.path().join("t.steps.u32");
    std::fs::write(&sf, &sbytes).unwrap();
    let read = read_steps(&sf).unwrap();
    assert_eq!(
        read[1],
        Step {
            decode: 16,
            prefill: 0
        }
    );
    let cut = step_batches(ids.len(), Some(&read), 16, 2048).unwrap();
    let batches = batch_ids(&ids, &cut);
    assert_eq!(
        batches.iter().map(Vec::len).collect::<Vec<_>>(),
        [3200, 256, 1344]
    );
    assert_eq!(
        cut.iter().map(|b| b.prefill).collect::<Vec<_>>(),
        [true, false, true]
    );
    assert_eq!(batches[1][0], ids[3200]);
    // Steps that do not account for the trace are refused.
    assert!(step_batches(ids.len() + 16, Some(&read), 16, 2048).is_err());
}

#[test]
fn advise_future_admits_a_coming_row_over_more_frequent_ones_until_its_lookup() {
    use fetchahead::store::cache_bytes_for;
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 4000, &[1], 1, 3);
    let options = |lookahead| StoreOptions {
        cache_bytes: cache_bytes_for(64, DIM),
        lookahead,
        ..Default::default()
    };
    // A store whose cache is full of 200 rows asked five times each (rows of count 5).
    let hot_store = |lookahead| {
        let store = open(dir.path(), options(lookahead));
        let hot: Vec<i64> = (0..200).collect();
        for _ in 0..5 {
            let (mut w, mut s) = outputs(&store, hot.len());
            store.lookup(1, &hot, &mut w, &mut s).unwrap();
        }
        store
    };
    for lookahead in [false, true] {
        let store = hot_store(lookahead);
        let noted = store.advise_future(1, &[3000], 2).unwrap();
        assert_eq!(noted, usize::from(lookahead), "lookahead {lookahead}");
        let (mut w, mut s) = outputs(&store, 1);
        store.lookup(1, &[3000], &mut w, &mut s).unwrap();
        let before = store.stats().hits;
        store.lookup(1, &[3000], &mut w, &mut s).unwrap();
        let hit = store.stats().hits > before;
        // Asked once, row 3000 is not admitted over rows asked five times, unless a coming
        // lookup was said to want it.
        assert_eq!(hit, lookahead, "lookahead {lookahead}");
    }
    // Rows handed over for the third lookup from now are read into the cache when the next
    // lookup ends (two lookups before theirs, not sooner), so that their own lookup finds
    // them; without look-ahead nothing is.
    for lookahead in [false, true] {
        let store = hot_store(lookahead);
        let coming = [3001i64, 3002, 3001];
        store.advise_future(1, &coming, 3).unwrap();
        store.wait_advised();
        assert_eq!(store.stats().advised, 0, "read before the lookup before it");
        let (mut w, mut s) = outputs(&store, 1);
        store.lookup(1, &[7], &mut w, &mut s).unwrap();
        store.wait_advised();
        let want = if lookahead { 2 } else { 0 };
        assert_eq!(store.stats().advised, want, "lookahead {lookahead}");
        let (mut w, mut s) = outputs(&store, 1);
        store.lookup(1, &[8], &mut w, &mut s).unwrap();
        let before = store.stats();
        let (mut w, mut s) = outputs(&store, coming.len());
        store.lookup(1, &coming, &mut w, &mut s).unwrap();
        let after = store.stats();
        assert_eq!(after.hits - before.hits, if lookahead { 3 } else { 0 });
        // What was read ahead is the rows themselves.
        let plain = open(dir.path(), StoreOptions::default());
        let (mut ww, mut ws) = outputs(&plain, coming.len());
        plain.lookup(1, &coming, &mut ww, &mut ws).unwrap();
        assert_eq!((w, s), (ww, ws));
    }
    let store = open(dir.path(), options(true));
    // Bad ids and layers fail; no cache notes nothing.
    assert!(store.advise_future(1, &[4000], 1).is_err());
    assert!(store.advise_future(9, &[1], 1).is_err());
    let plain = open(dir.path(), StoreOptions::default());
    assert_eq!(plain.advise_future(1, &[1, 2], 1).unwrap(), 0);
}

#[test]
fn the_row_cache_keeps_up_with_lru_arc_w_tinylfu_and_exact_lfu_on_zipf() {
    use fetchahead::store::belady::belady;
    use fetchahead::store::policies::Policy;
    use fetchahead::store::zipf::ZipfRows;
    use fetchahead::store::{cache_bytes_for, cache_rows, replay_row_cache};
    // Independent draws, where frequency is all there is to learn (bursts: the next test).
    for s in [0.8, 1.0] {
        let trace = ZipfRows::new(0..300_000, 1, s, 9)
            .unwrap()
            .batches(3000, 256);
        let from = trace.len() / 2;
        for rows in [3_000u64, 15_000] {
            let bytes = cache_bytes_for(rows, DIM);
            let cap = cache_rows(bytes, DIM);
            let opt = belady(&trace, cap, from).rate();
            let shipped = replay_row_cache(bytes, DIM, &trace, from).rate();
            let peers: Vec<(Policy, f64)> = Policy::ALL
                .iter()
                .map(|&p| (p, p.replay(&trace, cap, from).rate()))
                .collect();
            let best = peers.iter().map(|p| p.1).fold(0.0, f64::max);
            eprintln!("s={s} {cap} rows: shipped {shipped:.3}, Belady {opt:.3}, {peers:?}");
            assert!(peers.iter().all(|p| p.1 <= opt + 1e-12));
            assert!(
                shipped >= 0.97 * best,
                "s={s} {cap} rows: {shipped:.3} vs {peers:?}"
            );
        }
    }
}

#[test]
fn the_row_cache_keeps_up_with_lru_arc_w_tinylfu_and_exact_lfu_on_document_bursts() {
    use fetchahead::store::policies::Policy;
    use fetchahead::store::zipf::ZipfRows;
    use fetchahead::store::{cache_bytes_for, cache_rows, replay_row_cache};
    // Real lookups are not independent draws: a document repeats its own rows for a while.
    // Half of each batch from a flat law over the table, half from the current document's
    // 3,000 rows (a law of its own), a new document every 12 batches.
    let mut common = ZipfRows::new(0..400_000, 1, 0.8, 4).unwrap();
    let mut local = ZipfRows::new(0..3_000, 1, 1.0, 5).unwrap();
    let trace: Vec<Vec<i64>> = (0..3000u64)
        .map(|b| {
            let doc = 1_000_000 + (b / 12) * 3_000;
            let mut ids = common.batch(128);
            ids.extend(local.batch(128).into_iter().map(|r| doc as i64 + r));
            ids
        })
        .collect();
    let from = trace.len() / 2;
    for rows in [4_000u64, 20_000] {
        let bytes = cache_bytes_for(rows, DIM);
        let cap = cache_rows(bytes, DIM);
        let shipped = replay_row_cache(bytes, DIM, &trace, from).rate();
        let peers: Vec<(Policy, f64)> = Policy::ALL
            .iter()
            .map(|&p| (p, p.replay(&trace, cap, from).rate()))
            .collect();
        let best = peers.iter().map(|p| p.1).fold(0.0, f64::max);
        eprintln!("{cap} rows: shipped {shipped:.3}, {peers:?}");
        // ARC leads at 4,000 rows (0.410 against 0.396 when this was written); before its
        // window the cache reached 0.282 there, below LRU's 0.385.
        assert!(
            shipped >= 0.95 * best,
            "{cap} rows: {shipped:.3} vs {peers:?}"
        );
    }
}

#[test]
fn a_finished_requests_own_rows_give_way_to_a_live_requests() {
    use fetchahead::store::cache_bytes_for;
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 4000, &[1], 1, 3);
    let options = StoreOptions {
        cache_bytes: cache_bytes_for(64, DIM),
        ..Default::default()
    };
    for finish in [false, true] {
        let store = open(dir.path(), options.clone());
        // Request 1 asks for 200 rows five times each: the cache fills with rows of count 5.
        let hot: Vec<i64> = (0..200).collect();
        for _ in 0..5 {
            let (mut w, mut s) = outputs(&store, hot.len());
            store.lookup(1, &hot, &mut w, &mut s).unwrap();
            store.asked_by(1, 1, &hot).unwrap();
        }
        if finish {
            store.request_finished(1);
        }
        // Request 2 asks for row 3000 in four lookups: over request 1's rows once they count
        // half (2), never over them while request 1 runs (5).
        let (mut w, mut s) = outputs(&store, 1);
        for _ in 0..4 {
            store.lookup(1, &[3000], &mut w, &mut s).unwrap();
            store.asked_by(1, 2, &[3000]).unwrap();
        }
        let before = store.stats().hits;
        store.lookup(1, &[3000], &mut w, &mut s).unwrap();
        assert_eq!(store.stats().hits > before, finish, "finished {finish}");
    }
    // Bad ids and layers fail; without a cache it is accepted.
    let store = open(dir.path(), options);
    assert!(store.asked_by(1, 1, &[4000]).is_err());
    assert!(store.asked_by(9, 1, &[1]).is_err());
    let plain = open(dir.path(), StoreOptions::default());
    plain.asked_by(1, 1, &[1, 2]).unwrap();
    plain.request_finished(1);
}

#[test]
fn request_ends_help_the_row_cache_on_document_bursts_where_documents_crowd_it() {
    use fetchahead::store::requests::{RequestSpan, StepRequests};
    use fetchahead::store::zipf::ZipfRows;
    use fetchahead::store::{cache_bytes_for, replay_row_cache, replay_row_cache_requests};
    // Four documents at a time, each its own request: a quarter of each batch per document,
    // half of that from a flat law over the table, half from the document's 3,000 rows (a law of
    // its own). A document runs 48 batches; they start 12 batches apart.
    let mut common = ZipfRows::new(0..400_000, 1, 0.8, 4).unwrap();
    let mut local = ZipfRows::new(0..3_000, 1, 1.0, 5).unwrap();
    let (mut trace, mut requests) = (Vec::new(), Vec::new());
    for b in 0..3000u64 {
        let mut ids = Vec::new();
        let mut step = StepRequests::default();
        for lane in 0..4 {
            let doc = (b + 12 * lane) / 48 * 4 + lane;
            let at = ids.len();
            ids.extend(common.batch(32));
            ids.extend(
                local
                    .batch(32)
                    .into_iter()
                    .map(|r| (1_000_000 + doc * 3_000) as i64 + r),
            );
            step.spans.push(RequestSpan {
                request: doc as u32,
                ids: at..ids.len(),
            });
            if (b + 12 * lane + 1) % 48 == 0 {
                step.finished.push(doc as u32);
            }
        }
        trace.push(ids);
        requests.push(step);
    }
    let from = trace.len() / 2;
    let rate = |rows: u64, told: bool| {
        let bytes = cache_bytes_for(rows, DIM);
        match told {
            true => replay_row_cache_requests(bytes, DIM, &trace, from, &requests).rate(),
            false => replay_row_cache(bytes, DIM, &trace, from).rate(),
        }
    };
    // 4,000 rows hold a third of the four live documents' rows: a finished document's rows
    // (asked for by no later request) are what should go (0.359 -> 0.392 when this was written).
    let (plain, told) = (rate(4_000, false), rate(4_000, true));
    assert!(
        told >= 1.05 * plain,
        "{told:.4} with requests, {plain:.4} without"
    );
    // 20,000 rows hold them all: a finished document's rows, halved, still count more than the
    // flat law's rows that a request's end halves too (a guess, not measured row by row; 0.480
    // -> 0.460). Halving them to 0 would win here (0.516) but loses on the real trace at 5% of
    // R, where rows only one finished request asked for are asked again by later ones.
    let (plain, told) = (rate(20_000, false), rate(20_000, true));
    assert!(
        told >= 0.95 * plain,
        "{told:.4} with requests, {plain:.4} without"
    );
}
