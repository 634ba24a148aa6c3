//! Belady's offline optimum for the row cache: on a trace of lookup batches, what hit rate any
//! cache of a given size could get, knowing the future (evict the row used furthest ahead).
//!
//! Hits are counted as `RowStore::lookup` counts them: a request is one id of a batch, duplicates
//! included, and it hits when its row was cached when the batch began; rows read for a batch
//! enter the cache after it.
use std::collections::{BTreeSet, HashMap};

/// Requests and hits over the counted part of a trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HitCount {
    pub hits: u64,
    pub requests: u64,
}

impl HitCount {
    pub fn rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.hits as f64 / self.requests as f64
        }
    }
}

const NEVER: u32 = u32::MAX;

/// Each batch's distinct rows with how often the batch asks for them.
fn distinct(batch: &[i64], out: &mut Vec<(i64, u64)>) {
    out.clear();
    let mut sorted = batch.to_vec();
    sorted.sort_unstable();
    for id in sorted {
        match out.last_mut() {
            Some((row, n)) if *row == id => *n += 1,
            _ => out.push((id, 1)),
        }
    }
}

/// Belady's MIN with bypass: after each batch the cache keeps the `capacity` rows, of those it
/// held and those just read, whose next use comes soonest. Counts batches `counted_from..`.
pub fn belady(batches: &[Vec<i64>], capacity: usize, counted_from: usize) -> HitCount {
    let mut rows: Vec<Vec<(i64, u64)>> = Vec::with_capacity(batches.len());
    for b in batches {
        let mut d = Vec::new();
        distinct(b, &mut d);
        rows.push(d);
    }
    // next[b][j]: the batch after b that asks for rows[b][j] again.
    let mut next: Vec<Vec<u32>> = rows.iter().map(|r| vec![NEVER; r.len()]).collect();
    let mut seen: HashMap<i64, u32> = HashMap::new();
    for (b, batch) in rows.iter().enumerate().rev() {
        for (j, &(row, _)) in batch.iter().enumerate() {
            if let Some(&n) = seen.get(&row) {
                next[b][j] = n;
            }
            seen.insert(row, b as u32);
        }
    }
    let mut held: HashMap<i64, u32> = HashMap::with_capacity(capacity + 1);
    let mut by_next: BTreeSet<(u32, i64)> = BTreeSet::new();
    let mut count = HitCount::default();
    for (b, batch) in rows.iter().enumerate() {
        let counted = b >= counted_from;
        for (j, &(row, n)) in batch.iter().enumerate() {
            let nu = next[b][j];
            if counted {
                count.requests += n;
            }
            if let Some(old) = held.insert(row, nu) {
                by_next.remove(&(old, row));
                if counted {
                    count.hits += n;
                }
            }
            by_next.insert((nu, row));
        }
        while held.len() > capacity {
            let Some((_, row)) = by_next.pop_last() else {
                break;
            };
            held.remove(&row);
        }
    }
    count
}

/// Replays `batches` against a cache the way a lookup uses it: every id is looked up, then the
/// distinct rows that missed are inserted. Counts batches `counted_from..`.
pub fn replay(
    batches: &[Vec<i64>],
    counted_from: usize,
    contains: impl FnMut(i64) -> bool,
    insert: impl FnMut(i64),
) -> HitCount {
    replay_batches(batches, counted_from, contains, insert, |_| {})
}

/// [`replay`], telling `batch_done` how many ids each batch asked once its misses are in.
pub fn replay_batches(
    batches: &[Vec<i64>],
    counted_from: usize,
    mut contains: impl FnMut(i64) -> bool,
    mut insert: impl FnMut(i64),
    mut batch_done: impl FnMut(usize),
) -> HitCount {
    let mut count = HitCount::default();
    let mut missed = Vec::new();
    for (b, batch) in batches.iter().enumerate() {
        missed.clear();
        let mut hits = 0;
        for &id in batch {
            if contains(id) {
                hits += 1;
            } else {
                missed.push(id);
            }
        }
        missed.sort_unstable();
        missed.dedup();
        for &id in &missed {
            insert(id);
        }
        batch_done(batch.len());
        if b >= counted_from {
            count.hits += hits;
            count.requests += batch.len() as u64;
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_checked_traces() {
        // Capacity 1: [1] [2] [1] [1]: MIN keeps 1 (next use sooner) over 2 -> hits at 3rd, 4th.
        let t = vec![vec![1], vec![2], vec![1], vec![1]];
        assert_eq!(
            belady(&t, 1, 0),
            HitCount {
                hits: 2,
                requests: 4
            }
        );
        // Capacity 2, one batch per id: 1 2 3 1 2 3. Evict the furthest: after 3, keep 1 and 2
        // (3 is next used last) -> 1 hits, 2 hits; then 3 misses; 6 requests, 2 hits.
        let t: Vec<Vec<i64>> = [1, 2, 3, 1, 2, 3].iter().map(|&x| vec![x]).collect();
        assert_eq!(belady(&t, 2, 0).hits, 2);
        // Duplicates in a batch count each time, and hit only if held when the batch began.
        let t = vec![vec![5, 5, 5], vec![5, 5]];
        assert_eq!(
            belady(&t, 1, 0),
            HitCount {
                hits: 2,
                requests: 5
            }
        );
        // Capacity 0 never hits; counting from batch 1 skips batch 0.
        assert_eq!(belady(&t, 0, 0).hits, 0);
        assert_eq!(belady(&t, 1, 1).requests, 2);
    }

    #[test]
    fn replay_counts_like_a_lookup() {
        // An unbounded cache: each row misses in the first batch that asks for it, duplicates
        // included (1 twice in batch 0), and hits after.
        let t = vec![vec![1, 1, 2], vec![1, 2, 3]];
        let mut held = std::collections::HashSet::new();
        let cell = std::cell::RefCell::new(&mut held);
        let c = replay(
            &t,
            0,
            |id| cell.borrow().contains(&id),
            |id| {
                cell.borrow_mut().insert(id);
            },
        );
        assert_eq!(
            c,
            HitCount {
                hits: 2,
                requests: 6
            }
        );
    }

    #[test]
    fn min_is_never_beaten_by_lru_on_random_traces() {
        use rand::rngs::SmallRng;
        use rand::{RngExt, SeedableRng};
        let mut rng = SmallRng::seed_from_u64(1);
        for _ in 0..20 {
            let t: Vec<Vec<i64>> = (0..200)
                .map(|_| (0..3).map(|_| rng.random_range(0..20)).collect())
                .collect();
            let cap = rng.random_range(1..10usize);
            let mut lru: Vec<i64> = Vec::new();
            let lru_cell = std::cell::RefCell::new(&mut lru);
            let l = replay(
                &t,
                0,
                |id| {
                    let mut v = lru_cell.borrow_mut();
                    if let Some(p) = v.iter().position(|&x| x == id) {
                        let x = v.remove(p);
                        v.push(x);
                        true
                    } else {
                        false
                    }
                },
                |id| {
                    let mut v = lru_cell.borrow_mut();
                    v.push(id);
                    if v.len() > cap {
                        v.remove(0);
                    }
                },
            );
            assert!(belady(&t, cap, 0).hits >= l.hits);
        }
    }
}
