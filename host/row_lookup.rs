//! The row lookup: the [`RowLookup`] trait through which the prefetcher and the C ABI read rows
//! (the row store implements it per layer, [`crate::store::LayerRows`]; the prefetcher's
//! in-memory table too), and [`lookup_or_zero`], the one call every lookup path makes.
//!
//! A module of its own, below both the store and the prefetcher: the store implements the trait
//! without depending on the GPU pipeline that calls it. May depend on: [`crate::error`],
//! [`crate::nvtx`].
use std::panic::{AssertUnwindSafe, catch_unwind};

use fetchahead_gpu::params::MX_BLOCK;

use crate::{Error, Result};

/// A table of MXFP8 rows that copies the rows of `ids` into caller buffers.
pub trait RowLookup: Send + Sync {
    /// FP8 elements per row (a multiple of 32).
    fn dim(&self) -> usize;

    /// Copies row `ids[i]` into `weights_out[i * dim..]` (FP8-E4M3) and its scales into
    /// `scales_out[i * dim / 32..]` (E8M0). `weights_out` is `ids.len() * dim` bytes and
    /// `scales_out` `ids.len() * dim / 32` bytes.
    fn lookup(&self, ids: &[i64], weights_out: &mut [u8], scales_out: &mut [u8]) -> Result<()>;

    /// Hands over ids that one of the next `steps_ahead` lookups asks for (a prompt's later
    /// prefill chunks), so that a cache can keep them; returns how many were noted. A lookup
    /// without a cache notes none.
    fn advise_future(&self, ids: &[i64], steps_ahead: u32) -> Result<usize> {
        let _ = (ids, steps_ahead);
        Ok(0)
    }
}

/// Runs `store.lookup`, turning a panic into an error; on any error the output rows are all
/// zero-filled (FP8 zero at scale 2^-127: bf16 zeros), so that the gather reads defined bytes.
pub fn lookup_or_zero(
    store: &dyn RowLookup,
    ids: &[i64],
    weights_out: &mut [u8],
    scales_out: &mut [u8],
) -> Result<()> {
    let _nvtx = crate::nvtx::range(c"fetchahead.lookup");
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        store.lookup(ids, weights_out, scales_out)
    }))
    .unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string payload".to_string());
        Err(Error::LookupPanicked(why))
    });
    if outcome.is_err() {
        weights_out.fill(0);
        scales_out.fill(0);
    }
    outcome
}

/// Checks the output buffers' sizes for `n` rows of `dim`.
pub fn check_lookup_sizes(dim: usize, n: usize, weights: usize, scales: usize) -> Result<()> {
    let want = n.checked_mul(dim);
    if want != Some(weights) || Some(scales) != want.map(|w| w / MX_BLOCK as usize) {
        return Err(Error::invalid(
            "lookup buffers",
            format!("{weights} weight and {scales} scale bytes for {n} rows of dim {dim}"),
        ));
    }
    Ok(())
}
