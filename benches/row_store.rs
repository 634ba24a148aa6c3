//! The row store's read paths on one table, cold (pages evicted before each batch), beside raw
//! io_uring O_DIRECT 4 KiB random reads of the same file at QD64 measured in the same run; the
//! DRAM cache's 72-row hit path beside a hand-written locked HashMap; and Zipf decode batches
//! through the cache, its hit rate printed beside Belady's optimum on the same trace.
//!
//! FETCHAHEAD_BENCH_TABLE=DIR benches an existing table (e.g. one from `fetchahead make-table`);
//! without it a 1 GiB table is generated in a temporary directory.
use std::cell::Cell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use fetchahead::store::belady::belady;
use fetchahead::store::make::{TableSpec, write_table};
use fetchahead::store::measure::{raw_random_reads, unique_rows};
use fetchahead::store::zipf::ZipfRows;
use fetchahead::store::{ReadPath, RowStore, StoreOptions, cache_bytes_for, cache_rows};

struct Bench {
    dir: PathBuf,
    store: RowStore,
    layer: u32,
    baseline_iops: Option<f64>,
    _tmp: Option<tempfile::TempDir>,
}

fn setup() -> Bench {
    let (dir, tmp) = match std::env::var_os("FETCHAHEAD_BENCH_TABLE") {
        Some(dir) => (PathBuf::from(dir), None),
        None => {
            let tmp = tempfile::tempdir().expect("temp dir");
            let spec = TableSpec {
                rows: 1 << 22,
                layers: vec![1],
                dim: 256,
                shards: 1,
                seed: 5,
            };
            write_table(tmp.path(), &spec, |_| {}).expect("write table");
            (tmp.path().to_path_buf(), Some(tmp))
        }
    };
    let store = RowStore::open(&dir, StoreOptions::default()).expect("open table");
    let layer = store.layers()[0];
    let weight = store.layout().layer(layer).expect("layer").weight.clone();
    let file = store.layout().path(weight.file).to_path_buf();
    let baseline_iops = match store.direct_io() {
        Ok(()) => {
            let raw = raw_random_reads(
                &file,
                weight.offset..weight.offset + weight.len(),
                64,
                100_000,
                3,
            )
            .expect("raw reads");
            println!(
                "raw io_uring O_DIRECT 4 KiB random reads of {} at QD64: {:.0} IOPS (p50 {:.0} us)",
                file.display(),
                raw.iops,
                raw.p50_us
            );
            Some(raw.iops)
        }
        Err(why) => {
            println!("SKIP raw baseline: O_DIRECT unsupported here ({why})");
            None
        }
    };
    Bench {
        dir,
        store,
        layer,
        baseline_iops,
        _tmp: tmp,
    }
}

/// Times cold lookups of fresh batches of `n` rows on `path`, keeping rows and seconds.
fn cold_lookups(
    b: &Bench,
    path: ReadPath,
    n: usize,
    totals: &Cell<(u64, f64)>,
    iters: u64,
) -> Duration {
    let dim = b.store.dim();
    let (mut w, mut s) = (vec![0u8; n * dim], vec![0u8; n * dim / 32]);
    let mut spent = Duration::ZERO;
    for i in 0..iters {
        let ids = unique_rows(
            b.store.row_range(),
            n,
            i ^ (n as u64) << 20 ^ totals.get().0,
        );
        b.store.evict_page_cache().expect("evict");
        let t = Instant::now();
        b.store
            .lookup_with(path, b.layer, &ids, &mut w, &mut s)
            .expect("lookup");
        spent += t.elapsed();
    }
    let (rows, secs) = totals.get();
    totals.set((rows + iters * n as u64, secs + spent.as_secs_f64()));
    spent
}

fn report(b: &Bench, what: &str, totals: (u64, f64)) {
    let rows_per_s = totals.0 as f64 / totals.1;
    match b.baseline_iops {
        Some(base) => println!(
            "{what}: {rows_per_s:.0} rows/s = {:.2} x raw QD64 IOPS {base:.0}",
            rows_per_s / base
        ),
        None => println!("{what}: {rows_per_s:.0} rows/s"),
    }
}

fn row_store(c: &mut Criterion) {
    let b = setup();
    read_paths(c, &b);
    cache_hits(c, &b);
    zipf_decode(c, &b);
}

/// Decode batches of 72 Zipf ids (one row per 512-byte block, hot rows scattered) through a
/// cache of 5% of the rows drawn from, warmed by the first half of the trace.
fn zipf_decode(c: &mut Criterion, b: &Bench) {
    let dim = b.store.dim();
    let row_bytes = dim as u64;
    let stride = 512u64.div_ceil(row_bytes).max(1);
    let mut group = c.benchmark_group("row_store/zipf_decode_72");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(5));
    for s_exp in [0.8, 1.0, 1.2] {
        let mut z = ZipfRows::new(b.store.row_range(), stride, s_exp, 17).expect("zipf");
        let trace = z.batches(40_000, 72);
        let from = 4000;
        let cache_bytes = cache_bytes_for(z.population() / 20, dim);
        let store = RowStore::open(
            &b.dir,
            StoreOptions {
                cache_bytes,
                ..StoreOptions::default()
            },
        )
        .expect("open");
        let (mut w, mut s) = (vec![0u8; 72 * dim], vec![0u8; 72 * dim / 32]);
        for ids in &trace[..from] {
            store.lookup(b.layer, ids, &mut w, &mut s).expect("warm");
        }
        let before = store.stats();
        let next = Cell::new(from);
        let wrapped = Cell::new(false);
        group.bench_function(format!("s{s_exp}"), |bench| {
            bench.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    let k = next.get();
                    if k + 1 < trace.len() {
                        next.set(k + 1);
                    } else {
                        next.set(from);
                        wrapped.set(true);
                    }
                    let t = Instant::now();
                    store
                        .lookup(b.layer, &trace[k], &mut w, &mut s)
                        .expect("lookup");
                    spent += t.elapsed();
                }
                spent
            })
        });
        let after = store.stats();
        let (hits, misses) = (after.hits - before.hits, after.misses - before.misses);
        let hit_rate = hits as f64 / (hits + misses).max(1) as f64;
        let used = if wrapped.get() {
            trace.len()
        } else {
            next.get()
        };
        let opt = belady(&trace[..used], cache_rows(cache_bytes, dim), from).rate();
        println!(
            "zipf s={s_exp} decode, cache 5%: hit rate {hit_rate:.3} = {:.3} x Belady {opt:.3} over {} batches{}",
            hit_rate / opt.max(1e-12),
            used - from,
            if wrapped.get() {
                " (the trace wrapped: Belady is of one pass)"
            } else {
                ""
            }
        );
    }
    group.finish();
}

fn read_paths(c: &mut Criterion, b: &Bench) {
    for (n, paths, samples) in [
        (72usize, &ReadPath::ALL[..], 50usize),
        (4096, &ReadPath::ALL[..], 10),
        (
            100_000,
            &[ReadPath::Uring, ReadPath::Preadv, ReadPath::Mmap][..],
            10,
        ),
    ] {
        let mut group = c.benchmark_group(format!("row_store/cold_{n}"));
        group
            .sample_size(samples)
            .sampling_mode(SamplingMode::Flat)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(if n > 10_000 { 20 } else { 5 }));
        for &path in paths {
            if path == ReadPath::Uring && b.store.uring().is_err() {
                println!("SKIP uring: {}", b.store.uring().err().unwrap_or(""));
                continue;
            }
            let totals = Cell::new((0u64, 0f64));
            group.bench_function(path.name(), |bench| {
                bench.iter_custom(|iters| cold_lookups(b, path, n, &totals, iters))
            });
            report(b, &format!("cold {n} rows via {path}"), totals.get());
        }
        group.finish();
    }
}

fn cache_hits(c: &mut Criterion, b: &Bench) {
    let dim = b.store.dim();
    let ids = unique_rows(b.store.row_range(), 72, 9);
    let cached = RowStore::open(
        &b.dir,
        StoreOptions {
            cache_bytes: 1 << 20,
            ..StoreOptions::default()
        },
    )
    .expect("open");
    let (mut w, mut s) = (vec![0u8; 72 * dim], vec![0u8; 72 * dim / 32]);
    cached.lookup(b.layer, &ids, &mut w, &mut s).expect("fill");
    // The hand-written alternative: a locked HashMap of the same rows.
    let map: RwLock<HashMap<u64, Arc<[u8]>>> = RwLock::new(
        ids.iter()
            .enumerate()
            .map(|(i, &id)| {
                let mut row = w[i * dim..(i + 1) * dim].to_vec();
                row.extend_from_slice(&s[i * dim / 32..(i + 1) * dim / 32]);
                (id as u64, Arc::from(row))
            })
            .collect(),
    );
    let mut group = c.benchmark_group("row_store/cache_72");
    group.bench_function("store_lookup_quick_cache", |bench| {
        bench.iter(|| {
            cached
                .lookup(b.layer, &ids, &mut w, &mut s)
                .expect("lookup")
        })
    });
    group.bench_function("rwlock_hashmap_copy", |bench| {
        bench.iter(|| {
            let map = map.read().expect("lock");
            for (i, id) in ids.iter().enumerate() {
                let row = map.get(&(*id as u64)).expect("row");
                w[i * dim..(i + 1) * dim].copy_from_slice(&row[..dim]);
                s[i * dim / 32..(i + 1) * dim / 32].copy_from_slice(&row[dim..]);
            }
        })
    });
    group.finish();
    let stats = cached.stats();
    println!("cache: {} hits, {} misses", stats.hits, stats.misses);
}

criterion_group!(benches, row_store);
criterion_main!(benches);
