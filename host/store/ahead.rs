//! Read-ahead of known future lookups: the chunks [`RowStore::advise_future`] hands over, kept
//! by the lookup they are due at, and read into the row cache while the lookup before them
//! runs (an engine knows a prompt's later prefill chunks when its request arrives).
//!
//! [`RowStore::advise_future`]: super::RowStore::advise_future
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Rows of the chunks due at a lookup read ahead of it: at most this share of the cache's rows,
/// the chunks' most asked rows first. On the real Engram trace (`bench-io --trace
/// --read-ahead-share`, 2026-12-03) 0.5 and 1.0 gave the same hit rates except at the smallest
/// budget, where a full prefill chunk's rows outnumber the cache's and 1.0 did best (0.883
/// against 0.876 x Belady).
pub const READ_AHEAD_SHARE: f64 = 1.0;

/// A chunk is read ahead once its lookup is at most this many lookups away, the next one
/// counted: 2 reads a chunk while the lookup before it runs and the step before that computes,
/// so that lookup finds the rows it shares with the chunk (a prompt's adjacent chunks share
/// many n-grams). On the real Engram trace 2 gave 0.876-0.894 x Belady at the four budgets
/// against 0.839-0.883 for 1 (`bench-io --trace --read-ahead-lookups`, 2026-12-03).
pub const READ_AHEAD_LOOKUPS: u32 = 2;

/// The chunks handed over and not yet read, per layer (index as the store's layers) by the
/// lookup number (of that layer, counted from 1) they are due at.
pub(crate) struct ReadAhead {
    due: Mutex<Vec<BTreeMap<u64, Vec<i64>>>>,
}

impl ReadAhead {
    pub fn new(layers: usize) -> Self {
        ReadAhead {
            due: Mutex::new(vec![BTreeMap::new(); layers]),
        }
    }

    /// Keeps `rows` until the lookup numbered `due` of layer `li` is next.
    pub fn hand_over(&self, li: usize, due: u64, rows: impl IntoIterator<Item = i64>) {
        let mut all = self.due.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(layer) = all.get_mut(li) {
            layer.entry(due).or_default().extend(rows);
        }
    }

    /// The rows due at or before lookup `next` of layer `li`, taken out: most asked first, at
    /// most `most` distinct rows (empty when none are due).
    pub fn take_due(&self, li: usize, next: u64, most: usize) -> Vec<i64> {
        let mut all = self.due.lock().unwrap_or_else(|e| e.into_inner());
        let Some(layer) = all.get_mut(li) else {
            return Vec::new();
        };
        let later = layer.split_off(&(next + 1));
        let mut rows: Vec<i64> = std::mem::replace(layer, later)
            .into_values()
            .flatten()
            .collect();
        drop(all);
        most_asked_first(&mut rows, most);
        rows
    }
}

/// The distinct rows of `rows` (a coming lookup's, repeats included), most asked first (ties by
/// row), at most `most` of them, in place.
pub(crate) fn most_asked_first(rows: &mut Vec<i64>, most: usize) {
    rows.sort_unstable();
    let mut runs: Vec<(usize, i64)> = rows
        .chunk_by(|a, b| a == b)
        .map(|run| (run.len(), run[0]))
        .collect();
    runs.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    runs.truncate(most);
    rows.clear();
    rows.extend(runs.iter().map(|&(_, row)| row));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_asked_rows_come_first_and_are_capped() {
        let mut rows = vec![5, 3, 5, 9, 3, 5, 1];
        most_asked_first(&mut rows, 3);
        assert_eq!(rows, vec![5, 3, 1]);
        let mut none = vec![4, 4];
        most_asked_first(&mut none, 0);
        assert!(none.is_empty());
    }

    #[test]
    fn chunks_are_taken_when_due_and_only_once() {
        let ahead = ReadAhead::new(2);
        ahead.hand_over(0, 3, [7, 8]);
        ahead.hand_over(0, 5, [9]);
        ahead.hand_over(1, 3, [1]);
        assert!(ahead.take_due(0, 2, usize::MAX).is_empty());
        assert_eq!(ahead.take_due(0, 3, usize::MAX), vec![7, 8]);
        assert!(ahead.take_due(0, 3, usize::MAX).is_empty());
        // A lookup skipped (a layer looked up less often): everything due by then comes out.
        assert_eq!(ahead.take_due(0, 9, usize::MAX), vec![9]);
        assert_eq!(ahead.take_due(1, 4, usize::MAX), vec![1]);
        // A layer index the store does not have holds nothing.
        ahead.hand_over(5, 1, [1]);
        assert!(ahead.take_due(5, 1, usize::MAX).is_empty());
    }
}
