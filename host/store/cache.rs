//! The DRAM row cache: hot rows (weights and scales together) under a byte budget.
//! quick_cache (CLOCK-Pro, sharded locks) rather than a hand-written map: `benches/row_store.rs`
//! measures its 72-row hit path against a plain locked HashMap, and `bench-io --zipf` its hit
//! rate against Belady's optimum on Zipf traces. `examples/cache_policies` replays the other
//! candidates (TinyLFU admission in front of it, more ghosts, moka, a sampled LFU, a learned pinned
//! head): none was better at every Zipf exponent and budget within the same memory
//! (docs/benchmarks-log.md, issue 16).
use std::sync::Arc;

use quick_cache::Weighter;
use quick_cache::sync::Cache;

/// Bytes a cached row costs beyond its own: the Arc header and the cache's entry.
const ENTRY_OVERHEAD: u64 = 48;

/// The cache's share for rows seen more than once (quick_cache's `hot_allocation`).
const HOT_SHARE: f64 = 0.99;
/// Keys remembered after eviction, as a share of the resident rows (`ghost_allocation`).
const GHOST_SHARE: f64 = 1.0;

#[derive(Clone)]
struct RowWeight;

impl Weighter<u64, Arc<[u8]>> for RowWeight {
    fn weight(&self, _key: &u64, row: &Arc<[u8]>) -> u64 {
        row.len() as u64 + ENTRY_OVERHEAD
    }
}

/// What one cached row of `row_bytes` costs the budget.
pub(crate) fn entry_bytes(row_bytes: usize) -> u64 {
    row_bytes as u64 + ENTRY_OVERHEAD
}

/// Rows of `row_bytes` a budget holds.
pub(crate) fn rows_in(budget_bytes: u64, row_bytes: usize) -> usize {
    (budget_bytes / (row_bytes as u64 + ENTRY_OVERHEAD)) as usize
}

pub(crate) struct RowCache {
    rows: Cache<u64, Arc<[u8]>, RowWeight>,
}

impl RowCache {
    pub fn new(budget_bytes: u64, row_bytes: usize) -> Self {
        let items = rows_in(budget_bytes, row_bytes).max(1);
        // Zipf lookups reward frequency over recency: a larger hot share and a full-size ghost
        // list (rows seen once, re-admitted as hot when seen again) gained 1-2 points of hit rate
        // over quick_cache's defaults (0.97, 0.5) at s = 0.8 (BENCHMARKS.md, issue 16).
        let options = quick_cache::OptionsBuilder::new()
            .estimated_items_capacity(items)
            .weight_capacity(budget_bytes)
            .hot_allocation(HOT_SHARE)
            .ghost_allocation(GHOST_SHARE)
            .build();
        let rows = match options {
            Ok(o) => Cache::with_options(o, RowWeight, Default::default(), Default::default()),
            Err(_) => Cache::with_weighter(items, budget_bytes, RowWeight),
        };
        RowCache { rows }
    }

    /// Rows are below 2^48 (safetensors files of 2^48 rows do not exist); layers get the top bits.
    fn key(layer_index: usize, row: u64) -> u64 {
        ((layer_index as u64) << 48) | (row & ((1 << 48) - 1))
    }

    /// The row's weights followed by its scales.
    pub fn get(&self, layer_index: usize, row: u64) -> Option<Arc<[u8]>> {
        self.rows.get(&Self::key(layer_index, row))
    }

    pub fn insert(&self, layer_index: usize, row: u64, weights: &[u8], scales: &[u8]) {
        let mut bytes = Vec::with_capacity(weights.len() + scales.len());
        bytes.extend_from_slice(weights);
        bytes.extend_from_slice(scales);
        self.rows
            .insert(Self::key(layer_index, row), Arc::from(bytes));
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn weight(&self) -> u64 {
        self.rows.weight()
    }
}
