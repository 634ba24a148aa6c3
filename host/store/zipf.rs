//! Zipf-distributed row ids, the way Engram lookups arrive: a few hot rows asked again and again,
//! duplicates within a batch, the hot rows scattered over the table by a seeded permutation.
use std::ops::Range;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Zipf};

use crate::{Error, Result};

/// Draws batches of row ids whose popularity ranks follow Zipf's law with exponent `s`.
///
/// Rank `k` (1 = hottest) maps to row `start + perm[k - 1] * stride`: a seeded permutation
/// spreads the hot rows over the table, and `stride > 1` uses one row per block only, so that
/// the rows of a batch rarely share a block (production tables have ~384M rows a layer).
pub struct ZipfRows {
    start: u64,
    stride: u64,
    perm: Vec<u32>,
    law: Zipf<f64>,
    rng: SmallRng,
}

impl ZipfRows {
    /// Ids over `rows`, every `stride`-th row, exponent `s` (> 0), deterministic per `seed`.
    pub fn new(rows: Range<u64>, stride: u64, s: f64, seed: u64) -> Result<Self> {
        let stride = stride.max(1);
        let population = rows.end.saturating_sub(rows.start) / stride;
        if population == 0 || population > u64::from(u32::MAX) {
            return Err(Error::invalid(
                "zipf population",
                format!(
                    "{population} rows (rows {}..{} every {stride}); want 1..=2^32-1",
                    rows.start, rows.end
                ),
            ));
        }
        let law = Zipf::new(population as f64, s)
            .map_err(|e| Error::invalid("zipf exponent", format!("{s}: {e}")))?;
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut perm: Vec<u32> = (0..population as u32).collect();
        for i in (1..perm.len()).rev() {
            let j = rng.random_range(0..=i);
            perm.swap(i, j);
        }
        Ok(ZipfRows {
            start: rows.start,
            stride,
            perm,
            law,
            rng: SmallRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15),
        })
    }

    /// Distinct rows the law draws from.
    pub fn population(&self) -> u64 {
        self.perm.len() as u64
    }

    /// The row of popularity rank `rank` (0 = hottest).
    pub fn row_of_rank(&self, rank: u64) -> Option<i64> {
        let p = *self.perm.get(rank as usize)?;
        Some((self.start + u64::from(p) * self.stride) as i64)
    }

    /// One draw: a row id.
    pub fn draw(&mut self) -> i64 {
        let k = self.law.sample(&mut self.rng);
        // The law returns 1..=population; clamp guards float rounding at the top.
        let rank = (k as u64).clamp(1, self.population()) - 1;
        self.row_of_rank(rank).unwrap_or(self.start as i64)
    }

    /// A batch of `n` draws (duplicates kept, in draw order).
    pub fn batch(&mut self, n: usize) -> Vec<i64> {
        (0..n).map(|_| self.draw()).collect()
    }

    /// `count` batches of `n` draws.
    pub fn batches(&mut self, count: usize, n: usize) -> Vec<Vec<i64>> {
        (0..count).map(|_| self.batch(n)).collect()
    }
}

/// Of the distinct rows of `ids`, the fraction whose `block`-byte block (rows of `row_bytes`
/// from `offset`) holds another distinct row of the batch.
pub fn block_sharing(ids: &[i64], offset: u64, row_bytes: u64, block: u64) -> f64 {
    let mut rows: Vec<i64> = ids.to_vec();
    rows.sort_unstable();
    rows.dedup();
    if rows.len() < 2 {
        return 0.0;
    }
    // Each row covers blocks [lo, hi]; sharing = touching a block another row touches.
    let span = |r: i64| {
        let start = offset + r as u64 * row_bytes;
        (start / block, (start + row_bytes - 1) / block)
    };
    let mut shared = 0usize;
    for (i, &r) in rows.iter().enumerate() {
        let (lo, hi) = span(r);
        let before = i > 0 && span(rows[i - 1]).1 >= lo;
        let after = i + 1 < rows.len() && span(rows[i + 1]).0 <= hi;
        if before || after {
            shared += 1;
        }
    }
    shared as f64 / rows.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_per_seed() {
        let a = ZipfRows::new(0..10_000, 1, 1.0, 3).unwrap().batches(4, 72);
        let b = ZipfRows::new(0..10_000, 1, 1.0, 3).unwrap().batches(4, 72);
        let c = ZipfRows::new(0..10_000, 1, 1.0, 4).unwrap().batches(4, 72);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn ranks_follow_the_law_and_rows_stay_in_range() {
        let (n, s) = (1000u64, 1.0f64);
        let mut z = ZipfRows::new(500..500 + 2 * n, 2, s, 11).unwrap();
        assert_eq!(z.population(), n);
        let draws = 400_000;
        let mut counts = std::collections::HashMap::new();
        for _ in 0..draws {
            let id = z.draw();
            assert!((500..500 + 2 * n as i64).contains(&id) && (id - 500) % 2 == 0);
            *counts.entry(id).or_insert(0u64) += 1;
        }
        let h: f64 = (1..=n).map(|k| (k as f64).powf(-s)).sum();
        for rank in [0u64, 1, 9] {
            let want = ((rank + 1) as f64).powf(-s) / h;
            let got = counts[&z.row_of_rank(rank).unwrap()] as f64 / draws as f64;
            assert!(
                (got - want).abs() < 0.1 * want,
                "rank {rank}: {got} vs {want}"
            );
        }
        // The hottest row is not row 0 or the first row: the permutation scatters ranks.
        let hot: Vec<i64> = (0..8).map(|r| z.row_of_rank(r).unwrap()).collect();
        assert!(hot.windows(2).any(|w| (w[1] - w[0]).abs() > 2));
    }

    #[test]
    fn bad_parameters_are_errors() {
        assert!(ZipfRows::new(0..0, 1, 1.0, 1).is_err());
        assert!(ZipfRows::new(0..100, 1, -1.0, 1).is_err());
    }

    #[test]
    fn block_sharing_counts_rows_touching_a_shared_block() {
        // 256-byte rows, 512-byte blocks: rows 0 and 1 share block 0; row 10 is alone.
        assert_eq!(block_sharing(&[0, 1, 10, 10], 0, 256, 512), 2.0 / 3.0);
        assert_eq!(block_sharing(&[0, 2, 4], 0, 256, 512), 0.0);
    }
}
