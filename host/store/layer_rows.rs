//! One Engram layer of a [`RowStore`] as the prefetcher and the C ABI read rows
//! ([`RowLookup`]).
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::RowStore;
use crate::row_lookup::RowLookup;
use crate::{Error, Result};

/// A store and one of its layers; lookups go through the store's read path and cache.
#[derive(Clone)]
pub struct LayerRows {
    store: Arc<RowStore>,
    layer: u32,
}

impl LayerRows {
    /// Fails when the table has no such layer.
    pub fn new(store: Arc<RowStore>, layer: u32) -> Result<Self> {
        if !store.layers().contains(&layer) {
            return Err(Error::NoSuchLayer {
                layer,
                have: store.layers().to_vec(),
            });
        }
        Ok(LayerRows { store, layer })
    }

    pub fn store(&self) -> &Arc<RowStore> {
        &self.store
    }

    pub fn layer(&self) -> u32 {
        self.layer
    }

    /// The layer's rows `0..row_range().end` as `[rows, dim]` E4M3 and `[rows, dim / 32]` E8M0
    /// bytes, read straight from the shard files: no cache, no counters (for a resident copy
    /// beside the lookups, and for checking them).
    pub fn read_all(&self) -> Result<(Vec<u8>, Vec<u8>)> {
        let layout = self.store.layout();
        let spans = layout
            .layer(self.layer)
            .map(|l| [&l.weight, &l.scale])
            .ok_or_else(|| Error::NoSuchLayer {
                layer: self.layer,
                have: self.store.layers().to_vec(),
            })?;
        let rows = self.store.row_range().end;
        let [weights, scales] = spans.map(|span| {
            let path = layout.path(span.file);
            let len = crate::memory::product(rows, span.row_bytes, &span.name)?;
            let mut bytes = crate::memory::zeroed(len, &format!("a copy of {}", span.name))?;
            super::file::open_regular(path, 0)?
                .read_exact_at(&mut bytes, span.row_offset(0))
                .map_err(|e| Error::io(path, "read a whole layer", e))?;
            Ok::<_, Error>(bytes)
        });
        Ok((weights?, scales?))
    }
}

impl RowLookup for LayerRows {
    fn dim(&self) -> usize {
        self.store.dim()
    }

    fn advise_future(&self, ids: &[i64], steps_ahead: u32) -> Result<usize> {
        self.store.advise_future(self.layer, ids, steps_ahead)
    }

    fn lookup(&self, ids: &[i64], weights_out: &mut [u8], scales_out: &mut [u8]) -> Result<()> {
        self.store.lookup(self.layer, ids, weights_out, scales_out)
    }
}
