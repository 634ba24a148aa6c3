//! The lab's bound for issue 25 item 3: what a row cache reaches on a lookup trace when it ranks
//! rows by everything their past says, with each row's exact history (no sketch, no aliasing)
//! and a ranking learned from the trace itself.
//!
//! Each row's state is its exact history: the steps that asked for it (bucketed), its n-gram
//! order (rows below `--order3-from` are 2-gram rows), whether more than one request asked for
//! it, whether the last request that asked for it has finished, and its age (ids asked since its
//! last ask, four buckets an octave). The ranking is a hit density as in LHD (Beckmann, Chen and
//! Cidon, NSDI 2018): for each state, the asks a row in that state gets within a horizon
//! (`--horizon` x the cache's rows, in ids) over the ids it would hold its place meanwhile,
//! counted from states sampled every fourth step over the training steps: the warm-up half
//! (what an online cache could have learned there) or, with `--in-sample`, the whole trace
//! (knowing the half it is scored on, which no online policy can). The replay evicts the lowest
//! density of `--samples` resident rows drawn at random, and counts as `bench-io --trace
//! --replay-only` counts: the first half of the steps warms, the second is counted, a step's
//! distinct rows weighted by how often it asks for each.
//!
//! ```sh
//! cargo run --release --example ranking_bound -- give.u64 give.steps.u32 give.docs.json [--in-sample]
//! ```
use std::collections::HashMap;
use std::path::PathBuf;

use clap::Parser;
use fetchahead::store::belady::belady;
use fetchahead::store::requests::{read_requests, step_requests};
use fetchahead::store::trace::{batch_ids, read_ids, read_steps, step_batches};

#[derive(Parser)]
struct Args {
    /// The trace's row ids (`.u64` or `.u64.xz`).
    trace: PathBuf,
    /// Its steps (`.steps.u32`).
    steps: PathBuf,
    /// Its documents file (`.docs.json`): which request asked for each id.
    docs: PathBuf,
    /// The table's rows (R): the budgets of 1% and 5% of R.
    #[arg(long, default_value_t = 10_344_164)]
    rows: u64,
    /// The first 3-gram row (the table's layout: `give.json`'s first order-3 column offset).
    #[arg(long, default_value_t = 5_171_586)]
    order3_from: i64,
    /// The density's horizon, in the cache's rows of ids.
    #[arg(long, default_value_t = 4.0)]
    horizon: f64,
    /// Resident rows drawn for each eviction.
    #[arg(long, default_value_t = 64)]
    samples: usize,
    /// Learn the ranking on the whole trace, the counted half included.
    #[arg(long)]
    in_sample: bool,
    /// Leave the request features out (whether several requests asked, whether the last asker
    /// finished): the steps, the order and the age alone.
    #[arg(long)]
    without_requests: bool,
}

const IDS_PER_TOKEN: usize = 16;
const COUNT_BUCKETS: usize = 10;
const AGE_BUCKETS: usize = 100;
/// Count buckets x order x shared x asker finished.
const STATES: usize = COUNT_BUCKETS * 2 * 2 * 2;
/// States sampled at each fourth step of the training steps.
const SAMPLES_A_STEP: usize = 3000;

fn count_bucket(c: u32) -> usize {
    match c {
        0..=4 => c as usize,
        5..=6 => 5,
        7..=9 => 6,
        10..=15 => 7,
        16..=31 => 8,
        _ => 9,
    }
}

/// Four buckets an octave.
fn age_bucket(age: u64) -> usize {
    if age < 4 {
        return age as usize;
    }
    let octave = 63 - age.leading_zeros() as usize;
    let quarter = ((age >> (octave - 2)) & 3) as usize;
    (4 * (octave - 1) + quarter).min(AGE_BUCKETS - 1)
}

/// A row's exact history.
#[derive(Clone, Copy)]
struct History {
    steps: u32,
    last: u64,
    last_request: u32,
    shared: bool,
}

impl History {
    fn new(now: u64, request: u32) -> History {
        History {
            steps: 0,
            last: now,
            last_request: request,
            shared: false,
        }
    }

    fn ask(&mut self, now: u64, request: u32) {
        self.steps += 1;
        self.last = now;
        self.shared |= self.last_request != request;
        self.last_request = request;
    }

    fn cell(&self, row: i64, now: u64, a: &Args, finished: &[bool]) -> usize {
        let requests = !a.without_requests;
        let state = ((count_bucket(self.steps) * 2 + usize::from(row >= a.order3_from)) * 2
            + usize::from(requests && self.shared))
            * 2
            + usize::from(requests && finished[self.last_request as usize]);
        state * AGE_BUCKETS + age_bucket(now - self.last)
    }
}

/// xorshift64: the state samples and the eviction draws.
struct Draw(u64);

impl Draw {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// A step's distinct rows: (row, asks in the step, the request of its first ask).
type Asks = Vec<(i64, u64, u32)>;

/// A sampled state: its cell, the ids until the row's next ask (`u64::MAX`: none) and that
/// ask's weight.
type Sample = (usize, u64, u64);

fn main() -> fetchahead::Result<()> {
    let a = Args::parse();
    let ids = read_ids(&a.trace)?;
    let steps = read_steps(&a.steps)?;
    let batches = batch_ids(
        &ids,
        &step_batches(ids.len(), Some(&steps), IDS_PER_TOKEN, 1)?,
    );
    let requests = read_requests(&a.docs)?;
    let by_request = step_requests(&steps, &requests, IDS_PER_TOKEN)?;
    let mut asks: Vec<Asks> = Vec::with_capacity(batches.len());
    for (batch, step) in batches.iter().zip(&by_request) {
        let mut asker = vec![0u32; batch.len()];
        for span in &step.spans {
            asker[span.ids.clone()].fill(span.request);
        }
        let mut sorted: Vec<(i64, u32)> = batch.iter().copied().zip(asker).collect();
        sorted.sort_unstable();
        let mut distinct: Asks = Vec::new();
        for (row, request) in sorted {
            match distinct.last_mut() {
                Some(last) if last.0 == row => last.1 += 1,
                _ => distinct.push((row, 1, request)),
            }
        }
        asks.push(distinct);
    }
    // Time is the distinct asks before a step; every ask of a step happens at its start.
    let starts: Vec<u64> = asks
        .iter()
        .scan(0u64, |t, s| {
            let at = *t;
            *t += s.len() as u64;
            Some(at)
        })
        .collect();
    // Each ask's next ask of the same row: (step, weight), or none.
    let mut next: Vec<Vec<Option<(usize, u64)>>> =
        asks.iter().map(|s| vec![None; s.len()]).collect();
    let mut later: HashMap<i64, (usize, u64)> = HashMap::new();
    for (b, step) in asks.iter().enumerate().rev() {
        for (j, &(row, m, _)) in step.iter().enumerate() {
            next[b][j] = later.insert(row, (b, m));
        }
    }
    let half = asks.len() / 2;
    let samples = sample_states(&a, &asks, &starts, &next, &by_request, requests.len());
    let distinct = later.len() as u64;
    println!(
        "{}: {} ids, {} steps (counted from {half}), {distinct} distinct rows; {} states sampled \
         over the {} ({} steps)",
        a.trace.display(),
        ids.len(),
        asks.len(),
        samples.len(),
        if a.in_sample {
            "whole trace"
        } else {
            "warm-up half"
        },
        if a.in_sample { asks.len() } else { half },
    );
    println!("| budget | rows | learned ranking | Belady | x Belady |");
    println!("| --- | --- | --- | --- | --- |");
    let budgets = [
        ("1% of distinct", distinct / 100),
        ("5% of distinct", distinct * 5 / 100),
        ("1% of R", a.rows / 100),
        ("5% of R", a.rows * 5 / 100),
    ];
    for (label, rows) in budgets {
        let rows = rows as usize;
        let density = densities(&samples, a.horizon * rows as f64);
        let hit = replay(
            &a,
            &asks,
            &starts,
            &by_request,
            requests.len(),
            &density,
            rows,
        );
        let best = belady(&batches, rows, half).rate();
        println!(
            "| {label} | {rows} | {hit:.4} | {best:.4} | {:.3} |",
            hit / best
        );
    }
    Ok(())
}

/// States of rows seen so far, drawn every fourth step of the training steps, with the ids
/// until each row's next ask.
fn sample_states(
    a: &Args,
    asks: &[Asks],
    starts: &[u64],
    next: &[Vec<Option<(usize, u64)>>],
    by_request: &[fetchahead::store::requests::StepRequests],
    requests: usize,
) -> Vec<Sample> {
    let train = if a.in_sample {
        asks.len()
    } else {
        asks.len() / 2
    };
    let mut history: HashMap<i64, (History, usize, usize)> = HashMap::new();
    let mut seen: Vec<i64> = Vec::new();
    let mut finished = vec![false; requests];
    let mut draw = Draw(77);
    let mut out = Vec::new();
    for b in 0..train {
        let now = starts[b];
        if b % 4 == 0 && !seen.is_empty() {
            for _ in 0..SAMPLES_A_STEP {
                let row = seen[draw.below(seen.len())];
                let (h, step, j) = history[&row];
                let cell = h.cell(row, now, a, &finished);
                out.push(match next[step][j] {
                    Some((s, m)) => (cell, starts[s] - now, m),
                    None => (cell, u64::MAX, 0),
                });
            }
        }
        for (j, &(row, _, request)) in asks[b].iter().enumerate() {
            let e = history.entry(row).or_insert_with(|| {
                seen.push(row);
                (History::new(now, request), b, j)
            });
            e.0.ask(now, request);
            (e.1, e.2) = (b, j);
        }
        for &r in &by_request[b].finished {
            finished[r as usize] = true;
        }
    }
    out
}

/// Each cell's hit density: the asks within `horizon` ids over the ids held meanwhile; a cell
/// never sampled takes its younger neighbour's.
fn densities(samples: &[Sample], horizon: f64) -> Vec<f64> {
    let horizon = horizon as u64;
    let mut asks = vec![0f64; STATES * AGE_BUCKETS];
    let mut held = vec![0f64; STATES * AGE_BUCKETS];
    for &(cell, gap, weight) in samples {
        if gap <= horizon {
            asks[cell] += weight as f64;
        }
        held[cell] += gap.min(horizon).max(1) as f64;
    }
    let mut out = vec![0f64; STATES * AGE_BUCKETS];
    for s in 0..STATES {
        let mut young = 0.0;
        for age in 0..AGE_BUCKETS {
            let c = s * AGE_BUCKETS + age;
            if held[c] > 0.0 {
                young = asks[c] / held[c];
            }
            out[c] = young;
        }
    }
    out
}

/// The hit rate over the counted half of a cache of `rows` rows ranking by `density`.
fn replay(
    a: &Args,
    asks: &[Asks],
    starts: &[u64],
    by_request: &[fetchahead::store::requests::StepRequests],
    requests: usize,
    density: &[f64],
    rows: usize,
) -> f64 {
    let half = asks.len() / 2;
    let mut held: Vec<i64> = Vec::with_capacity(rows);
    let mut slot: HashMap<i64, usize> = HashMap::with_capacity(2 * rows);
    let mut history: HashMap<i64, History> = HashMap::new();
    let mut finished = vec![false; requests];
    let mut draw = Draw(0x9e37_79b9_7f4a_7c15);
    let (mut hits, mut total) = (0u64, 0u64);
    let mut missed = Vec::new();
    for (b, step) in asks.iter().enumerate() {
        let now = starts[b];
        missed.clear();
        for &(row, m, request) in step {
            let cached = slot.contains_key(&row);
            if b >= half {
                total += m;
                hits += if cached { m } else { 0 };
            }
            if !cached {
                missed.push(row);
            }
            history
                .entry(row)
                .or_insert_with(|| History::new(now, request))
                .ask(now, request);
        }
        let after = now + step.len() as u64;
        for &row in &missed {
            if held.len() < rows {
                slot.insert(row, held.len());
                held.push(row);
                continue;
            }
            let mut victim = 0;
            let mut lowest = f64::INFINITY;
            for _ in 0..a.samples {
                let s = draw.below(held.len());
                let d = density[history[&held[s]].cell(held[s], after, a, &finished)];
                if d < lowest {
                    (victim, lowest) = (s, d);
                }
            }
            slot.remove(&held[victim]);
            held[victim] = row;
            slot.insert(row, victim);
        }
        for &r in &by_request[b].finished {
            finished[r as usize] = true;
        }
    }
    hits as f64 / total.max(1) as f64
}
