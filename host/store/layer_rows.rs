//! One Engram layer of a [`RowStore`] as the prefetcher and the C ABI read rows
//! ([`RowLookup`]).
use std::sync::Arc;

use super::RowStore;
use crate::lookup::RowLookup;
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
}

impl RowLookup for LayerRows {
    fn dim(&self) -> usize {
        self.store.dim()
    }

    fn lookup(&self, ids: &[i64], weights_out: &mut [u8], scales_out: &mut [u8]) -> Result<()> {
        self.store.lookup(self.layer, ids, weights_out, scales_out)
    }
}
