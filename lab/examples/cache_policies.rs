//! The lab's policy research: row-cache policies on the long Zipf traces of `bench-io --zipf`
//! (issue 16): each candidate's hit rate beside Belady's optimum and the static oracle (the law's
//! hottest rows pinned from the start), on the same traces, budgets and hit definition. No table is read: the traces are
//! those of bench-io's long replay on a table of `--rows` rows with ids every `--stride`-th row.
//! Prints a markdown table (hit rate, and in brackets x Belady); the whole grid takes about four
//! minutes on one core.
//!
//! ```sh
//! cargo run --release --example cache_policies -- [--zipf 0.8,1.0,1.2] [--policies shipped,moka]
//! ```
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Parser;
use fetchahead::store::belady::{HitCount, belady, replay};
use fetchahead::store::policies::Policy;
use fetchahead::store::sketch::FrequencySketch;
use fetchahead::store::zipf::ZipfRows;
use fetchahead::store::{cache_bytes_for, cache_rows, replay_row_cache};
use quick_cache::sync::Cache;
use quick_cache::{Lifecycle, OptionsBuilder, Weighter};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

#[derive(Parser)]
struct Args {
    /// Zipf exponents.
    #[arg(long, value_delimiter = ',', default_value = "0.8,1.0,1.2")]
    zipf: Vec<f64>,
    /// Cache budgets, percent of the rows drawn from.
    #[arg(long, value_delimiter = ',', default_value = "1,5,10")]
    budgets: Vec<f64>,
    /// Rows of the table (bench-io's issue-16 table: 6M).
    #[arg(long, default_value_t = 6_000_000)]
    rows: u64,
    /// Ids every STRIDE-th row (bench-io's `--stride 0` on 512-byte blocks of 256-byte rows: 2).
    #[arg(long, default_value_t = 2)]
    stride: u64,
    /// Weight bytes a row (its scales are dim / 32 more).
    #[arg(long, default_value_t = 256)]
    dim: usize,
    /// Decode batches (half warm the cache, uncounted); prefill gets this / 200.
    #[arg(long, default_value_t = 20_000)]
    replay_batches: usize,
    #[arg(long, default_value_t = 72)]
    decode_rows: usize,
    #[arg(long, default_value_t = 20_000)]
    prefill_rows: usize,
    /// bench-io's `--seed` (its long replay draws with seed ^ 0x10f6).
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Only these policies (comma-separated); all when not given.
    #[arg(long, value_delimiter = ',')]
    policies: Vec<String>,
    /// Sketch counters (bytes) per cached row, for the policies that keep a sketch. Caffeine's
    /// sizing (about 8 per row, halved every 10 x the rows) forgets too soon at s = 0.8.
    #[arg(long, default_value_t = 32)]
    sketch_counters: usize,
    /// Requests between the sketch's halvings, in cached rows (0: never).
    #[arg(long, default_value_t = 100)]
    sketch_sample: u64,
}

/// What the quick_cache candidates charge a cached row beyond its bytes (what the store charged
/// when it shipped quick_cache; its real bookkeeping was about 148).
const OVERHEAD: u64 = 48;

#[derive(Clone)]
struct RowWeight;

impl Weighter<u64, Arc<[u8]>> for RowWeight {
    fn weight(&self, _key: &u64, row: &Arc<[u8]>) -> u64 {
        row.len() as u64 + OVERHEAD
    }
}

/// The sketch's estimates of the rows quick_cache evicts from its hot queue, as a running mean
/// (x 256): the would-be victim an admission compares a candidate with.
#[derive(Clone, Default)]
struct Victims {
    sketch: Option<Arc<FrequencySketch>>,
    mean: Arc<AtomicU64>,
}

impl Lifecycle<u64, Arc<[u8]>> for Victims {
    type RequestState = ();
    fn on_evict_hot(&self, _: &mut (), key: u64, _: Arc<[u8]>) {
        if let Some(s) = &self.sketch {
            let f = u64::from(s.estimate(key)) << 8;
            let m = self.mean.load(Ordering::Relaxed);
            self.mean.store(m - m / 64 + f / 64, Ordering::Relaxed);
        }
    }
}

#[derive(Clone, Copy)]
enum Admit {
    All,
    /// Estimated frequency (this request included) at least this.
    AtLeast(u8),
    /// Estimate above the running mean of the hot queue's victims.
    BeatsVictims,
}

struct Sizes {
    bytes: u64,
    capacity: usize,
    row: Arc<[u8]>,
    counters: usize,
    sample: u64,
}

impl Sizes {
    fn sketch(&self) -> FrequencySketch {
        FrequencySketch::new(self.counters, self.sample)
    }
}

fn quick(
    sz: &Sizes,
    hot: f64,
    ghost: f64,
    lifecycle: Victims,
) -> Cache<u64, Arc<[u8]>, RowWeight, quick_cache::DefaultHashBuilder, Victims> {
    quick_ghosts(sz, hot, ghost, 1, lifecycle)
}

/// quick_cache remembers `ghost` x its estimated items as ghosts: an estimate `ghosts` x the
/// rows held keeps that many more keys of evicted rows.
fn quick_ghosts(
    sz: &Sizes,
    hot: f64,
    ghost: f64,
    ghosts: usize,
    lifecycle: Victims,
) -> Cache<u64, Arc<[u8]>, RowWeight, quick_cache::DefaultHashBuilder, Victims> {
    let o = OptionsBuilder::new()
        .estimated_items_capacity(sz.capacity.max(1) * ghosts)
        .weight_capacity(sz.bytes)
        .hot_allocation(hot)
        .ghost_allocation(ghost)
        .build()
        .expect("options");
    Cache::with_options(o, RowWeight, Default::default(), lifecycle)
}

/// quick_cache (CLOCK-Pro) with a TinyLFU admission filter in front (or none).
fn quick_cache_policy(
    sz: &Sizes,
    hot: f64,
    ghost: f64,
    admit: Admit,
    t: &[Vec<i64>],
    from: usize,
) -> HitCount {
    let sketch = Arc::new(sz.sketch());
    let victims = Victims {
        sketch: Some(sketch.clone()),
        mean: Arc::default(),
    };
    let c = quick(sz, hot, ghost, victims.clone());
    let got = replay(
        t,
        from,
        |id| {
            sketch.record(id as u64);
            sketch.advance(1);
            c.get(&(id as u64)).is_some()
        },
        |id| {
            let f = sketch.estimate(id as u64);
            // A cache with room admits every row: only a full one has a victim to beat.
            let room = c.weight() + sz.row.len() as u64 + OVERHEAD <= sz.bytes;
            let ok = room
                || match admit {
                    Admit::All => true,
                    Admit::AtLeast(t) => f >= t,
                    Admit::BeatsVictims => u64::from(f) << 8 > victims.mean.load(Ordering::Relaxed),
                };
            if ok {
                c.insert(id as u64, sz.row.clone());
            }
        },
    );
    report_memory(&c);
    got
}

/// quick_cache's own memory beside the rows (index, and entries: resident and ghost).
fn report_memory<L: Lifecycle<u64, Arc<[u8]>> + Clone>(
    c: &Cache<u64, Arc<[u8]>, RowWeight, quick_cache::DefaultHashBuilder, L>,
) {
    let m = c.memory_used();
    eprintln!(
        "    quick_cache: index {} B, entries {} B, {} rows held",
        m.map,
        m.entries,
        c.len()
    );
}

/// moka's default policy, TinyLFU: LRU eviction with Caffeine's sketch admission (moka 0.12 has
/// no admission window: not W-TinyLFU). Its housekeeping runs when moka decides, inside the
/// calls, as it would under a lookup.
fn moka_policy(sz: &Sizes, t: &[Vec<i64>], from: usize) -> HitCount {
    let c: moka::sync::Cache<u64, Arc<[u8]>> = moka::sync::Cache::builder()
        .max_capacity(sz.bytes)
        .weigher(|_, row: &Arc<[u8]>| (row.len() as u64 + OVERHEAD) as u32)
        .build();
    replay(
        t,
        from,
        |id| c.get(&(id as u64)).is_some(),
        |id| c.insert(id as u64, sz.row.clone()),
    )
}

/// LFU over a sketch: evict the least frequent of 16 sampled resident rows, admit a row only if
/// it is more frequent than that victim (Redis's approximated LFU with TinyLFU's admission).
fn sampled_lfu(sz: &Sizes, t: &[Vec<i64>], from: usize) -> HitCount {
    let sketch = sz.sketch();
    let state = RefCell::new((
        Vec::<i64>::with_capacity(sz.capacity),
        HashMap::<i64, usize>::with_capacity(sz.capacity),
        SmallRng::seed_from_u64(3),
    ));
    replay(
        t,
        from,
        |id| {
            sketch.record(id as u64);
            sketch.advance(1);
            state.borrow().1.contains_key(&id)
        },
        |id| {
            let (slots, at, rng) = &mut *state.borrow_mut();
            if slots.len() < sz.capacity {
                at.insert(id, slots.len());
                slots.push(id);
                return;
            }
            let Some(victim) = (0..16)
                .map(|_| rng.random_range(0..slots.len()))
                .min_by_key(|&i| sketch.estimate(slots[i] as u64))
            else {
                return;
            };
            if sketch.estimate(id as u64) > sketch.estimate(slots[victim] as u64) {
                at.remove(&slots[victim]);
                slots[victim] = id;
                at.insert(id, victim);
            }
        },
    )
}

/// A pinned head of `share` of the rows, filled by the first misses, then re-chosen every 10 x
/// its capacity requests as the rows (held in head or tail) of the highest estimates, beside a quick_cache tail
/// with the rest of the budget.
fn learned_head(sz: &Sizes, share: f64, t: &[Vec<i64>], from: usize) -> HitCount {
    let head_rows = (sz.capacity as f64 * share) as usize;
    let tail_sz = Sizes {
        bytes: sz.bytes - head_rows as u64 * (sz.row.len() as u64 + OVERHEAD),
        capacity: sz.capacity - head_rows,
        row: sz.row.clone(),
        counters: 0,
        sample: 0,
    };
    let tail = quick(&tail_sz, 0.99, 1.0, Victims::default());
    let sketch = sz.sketch();
    let head = RefCell::new(HashSet::<u64>::new());
    let seen = std::cell::Cell::new(0u64);
    replay(
        t,
        from,
        |id| {
            let key = id as u64;
            sketch.record(key);
            seen.set(seen.get() + 1);
            if seen.get().is_multiple_of((10 * sz.capacity as u64).max(1)) {
                // Re-choose over every row held, head and tail.
                let mut h = head.borrow_mut();
                let mut all: Vec<(u8, u64)> = h
                    .iter()
                    .copied()
                    .chain(tail.iter().map(|(k, _)| k))
                    .map(|k| (sketch.estimate(k), k))
                    .collect();
                all.sort_unstable_by(|a, b| b.cmp(a));
                let new: HashSet<u64> = all.iter().take(head_rows).map(|&(_, k)| k).collect();
                for k in h.difference(&new) {
                    tail.insert(*k, sz.row.clone());
                }
                for k in new.difference(&h) {
                    tail.remove(k);
                }
                *h = new;
            }
            sketch.advance(1);
            head.borrow().contains(&key) || tail.get(&key).is_some()
        },
        |id| {
            // The head fills first; later it changes only when re-chosen.
            let mut h = head.borrow_mut();
            if h.len() < head_rows {
                h.insert(id as u64);
            } else {
                tail.insert(id as u64, sz.row.clone());
            }
        },
    )
}

const POLICIES: &[(&str, &str)] = &[
    ("shipped", "the store's RowCache (replay_row_cache)"),
    (
        "qc-default",
        "quick_cache CLOCK-Pro, hot 0.97 ghost 0.5 (its defaults)",
    ),
    ("qc-tuned", "quick_cache CLOCK-Pro, hot 0.99 ghost 1.0"),
    (
        "qc-tlfu2",
        "qc-tuned behind TinyLFU admission: estimate >= 2",
    ),
    (
        "qc-tlfu-victim",
        "qc-tuned behind TinyLFU admission: estimate > hot victims' mean",
    ),
    ("qc-ghost2", "qc-tuned remembering 2 x its rows as ghosts"),
    ("qc-ghost4", "qc-tuned remembering 4 x its rows as ghosts"),
    (
        "moka",
        "moka 0.12 sync::Cache, TinyLFU (LRU + sketch admission), weigher",
    ),
    (
        "sampled-lfu",
        "sketch LFU, 16 sampled victims, TinyLFU admission",
    ),
    (
        "sampled-lfu-charged",
        "sampled-lfu with its sketch's bytes taken out of the budget",
    ),
    (
        "head50",
        "learned pinned head (50%, sketch top) + qc-tuned tail",
    ),
    (
        "head90",
        "learned pinned head (90%, sketch top) + qc-tuned tail",
    ),
    (
        "lfu-exact",
        "LFU on exact counts, no aging (reference, not shippable)",
    ),
    ("lru", "least recently used (store::policies)"),
    ("arc", "ARC, Megiddo and Modha (store::policies)"),
    (
        "w-tinylfu",
        "W-TinyLFU as Caffeine ships it, 1% window (store::policies)",
    ),
];

fn run_policy(name: &str, sz: &Sizes, dim: usize, t: &[Vec<i64>], from: usize) -> HitCount {
    match name {
        "shipped" => replay_row_cache(sz.bytes, dim, t, from),
        "qc-default" => quick_cache_policy(sz, 0.97, 0.5, Admit::All, t, from),
        "qc-tuned" => quick_cache_policy(sz, 0.99, 1.0, Admit::All, t, from),
        "qc-tlfu2" => quick_cache_policy(sz, 0.99, 1.0, Admit::AtLeast(2), t, from),
        "qc-tlfu-victim" => quick_cache_policy(sz, 0.99, 1.0, Admit::BeatsVictims, t, from),
        "moka" => moka_policy(sz, t, from),
        "qc-ghost2" | "qc-ghost4" => {
            let k = if name == "qc-ghost2" { 2 } else { 4 };
            let c = quick_ghosts(sz, 0.99, 1.0, k, Victims::default());
            let got = replay(
                t,
                from,
                |id| c.get(&(id as u64)).is_some(),
                |id| c.insert(id as u64, sz.row.clone()),
            );
            report_memory(&c);
            got
        }
        "sampled-lfu" => sampled_lfu(sz, t, from),
        "sampled-lfu-charged" => {
            // The sketch's bytes taken out of the budget: the rows it displaces.
            let entry = sz.row.len() as u64 + OVERHEAD;
            let held = (sz.bytes.saturating_sub(sz.counters as u64) / entry) as usize;
            let charged = Sizes {
                bytes: held as u64 * entry,
                capacity: held,
                row: sz.row.clone(),
                counters: sz.counters,
                sample: sz.sample,
            };
            sampled_lfu(&charged, t, from)
        }
        "head50" => learned_head(sz, 0.5, t, from),
        "head90" => learned_head(sz, 0.9, t, from),
        "lfu-exact" => Policy::ExactLfu.replay(t, sz.capacity, from),
        "lru" => Policy::Lru.replay(t, sz.capacity, from),
        "arc" => Policy::Arc.replay(t, sz.capacity, from),
        "w-tinylfu" => Policy::WTinyLfu.replay(t, sz.capacity, from),
        _ => HitCount::default(),
    }
}

fn main() -> fetchahead::Result<()> {
    let args = Args::parse();
    let names: Vec<&str> = POLICIES
        .iter()
        .map(|&(n, _)| n)
        .filter(|n| args.policies.is_empty() || args.policies.iter().any(|p| p == n))
        .collect();
    for &(n, what) in POLICIES.iter().filter(|(n, _)| names.contains(n)) {
        println!("{n}: {what}");
    }
    println!(
        "\n| S | batch | budget (rows) | Belady | pinned oracle (x) | {} |",
        names.join(" | ")
    );
    println!("|---|---|---|---:|---:|{}", "---:|".repeat(names.len()));
    let row_bytes = args.dim + args.dim / 32;
    for &s in &args.zipf {
        for (kind, n, count) in [
            ("decode", args.decode_rows, args.replay_batches),
            ("prefill", args.prefill_rows, args.replay_batches / 200),
        ] {
            let mut z = ZipfRows::new(0..args.rows, args.stride, s, args.seed ^ 0x10f6)?;
            let trace = z.batches(count, n);
            let from = count / 2;
            for &pct in &args.budgets {
                let want = (z.population() as f64 * pct / 100.0).round() as u64;
                let bytes = cache_bytes_for(want.max(1), args.dim);
                let capacity = cache_rows(bytes, args.dim);
                let sz = Sizes {
                    bytes,
                    capacity,
                    row: Arc::from(vec![0u8; row_bytes]),
                    counters: capacity * args.sketch_counters,
                    sample: capacity as u64 * args.sketch_sample,
                };
                let opt = belady(&trace, capacity, from).rate().max(1e-12);
                let head: HashSet<i64> = (0..capacity as u64)
                    .filter_map(|r| z.row_of_rank(r))
                    .collect();
                let oracle = replay(&trace, from, |id| head.contains(&id), |_| {}).rate();
                let mut cells = Vec::new();
                for name in &names {
                    let t0 = Instant::now();
                    let got = run_policy(name, &sz, args.dim, &trace, from).rate();
                    eprintln!(
                        "s={s} {kind} {pct}% {name}: {got:.3} ({:.1} s)",
                        t0.elapsed().as_secs_f64()
                    );
                    cells.push(format!("{got:.3} ({:.3})", got / opt));
                }
                println!(
                    "| {s} | {kind} {n} | {pct}% ({capacity}) | {opt:.3} | {oracle:.3} ({:.3}) | {} |",
                    oracle / opt,
                    cells.join(" | ")
                );
            }
        }
    }
    Ok(())
}
