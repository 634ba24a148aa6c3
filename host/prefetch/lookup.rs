//! The prefetcher's in-memory table: [`MemoryRows`] (a generated table held in RAM, with fault
//! injection), a [`RowLookup`] beside the row store's.
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use fetchahead_gpu::params::MX_BLOCK;
use rand::{Rng, RngExt, SeedableRng, rngs::SmallRng};

// The trait's home is `crate::row_lookup`; named here too for the simulation (`host/sim/`, bound
// for the lab package), until it imports `fetchahead::row_lookup`.
#[doc(hidden)]
pub use crate::row_lookup::RowLookup;
use crate::row_lookup::check_lookup_sizes;
use crate::{Error, Result};

/// No id fault armed.
const NO_FAULT_ID: i64 = i64::MIN;

/// A generated MXFP8 table held in RAM, deterministic from its seed: weights are random E4M3
/// codes other than NaN, scales random in 2^-7..2^7. Faults can be injected for the failure paths.
#[derive(Debug)]
pub struct MemoryRows {
    rows: u64,
    dim: usize,
    weights: Vec<u8>,
    scales: Vec<u8>,
    fail_on_id: AtomicI64,
    fail_next: AtomicU32,
    corrupt_next: AtomicU32,
    latency_ns: AtomicU64,
    lookups: AtomicU64,
}

impl MemoryRows {
    /// A table of `rows` rows of `dim` elements generated from `seed`.
    pub fn generate(rows: u64, dim: usize, seed: u64) -> Result<MemoryRows> {
        // The store's limits: a table in memory takes the rows a table on disk could hold.
        crate::store::layout::check_dim(dim as u64).map_err(|why| Error::invalid("dim", why))?;
        crate::store::layout::check_rows(rows).map_err(|why| Error::invalid("rows", why))?;
        let bytes = usize::try_from(rows)
            .ok()
            .and_then(|r| r.checked_mul(dim))
            .filter(|&b| b < isize::MAX as usize)
            .ok_or_else(|| Error::invalid("table", format!("{rows} rows of dim {dim}")))?;
        let what = format!("an in-memory table of {rows} rows of dim {dim}");
        // Weights and scales together, checked against the memory there is before allocating.
        crate::memory::check_fits((bytes + bytes / MX_BLOCK as usize) as u64, &what)?;
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut weights = crate::memory::zeroed(bytes as u64, &what)?;
        rng.fill_bytes(&mut weights);
        // 0x7F and 0xFF are E4M3 NaN; the table holds numbers only.
        for w in &mut weights {
            if *w & 0x7F == 0x7F {
                *w ^= 1;
            }
        }
        let mut scales = crate::memory::bytes_with_capacity(bytes / MX_BLOCK as usize, &what)?;
        scales.extend((0..bytes / MX_BLOCK as usize).map(|_| rng.random_range(120u8..135)));
        Ok(MemoryRows {
            rows,
            dim,
            weights,
            scales,
            fail_on_id: AtomicI64::new(NO_FAULT_ID),
            fail_next: AtomicU32::new(0),
            corrupt_next: AtomicU32::new(0),
            latency_ns: AtomicU64::new(0),
            lookups: AtomicU64::new(0),
        })
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// `[rows, dim]` E4M3 bytes.
    pub fn weights(&self) -> &[u8] {
        &self.weights
    }

    /// `[rows, dim / 32]` E8M0 bytes.
    pub fn scales(&self) -> &[u8] {
        &self.scales
    }

    /// Lookups served (failed ones included).
    pub fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::Relaxed)
    }

    /// Every lookup that includes row `id` fails (`None` disarms).
    pub fn fail_on_id(&self, id: Option<i64>) {
        self.fail_on_id
            .store(id.unwrap_or(NO_FAULT_ID), Ordering::Relaxed);
    }

    /// The next `lookups` lookups fail.
    pub fn fail_next(&self, lookups: u32) {
        self.fail_next.store(lookups, Ordering::Relaxed);
    }

    /// The next `lookups` lookups return one wrong byte and no error: what check mode must catch.
    pub fn corrupt_next(&self, lookups: u32) {
        self.corrupt_next.store(lookups, Ordering::Relaxed);
    }

    /// Each lookup blocks its thread this long first, as a storage read would.
    pub fn set_latency(&self, latency: Duration) {
        self.latency_ns
            .store(latency.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Takes one from `counter` if it is positive.
    fn take_one(counter: &AtomicU32) -> bool {
        counter
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }
}

impl RowLookup for MemoryRows {
    fn dim(&self) -> usize {
        self.dim
    }

    fn lookup(&self, ids: &[i64], weights_out: &mut [u8], scales_out: &mut [u8]) -> Result<()> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        check_lookup_sizes(self.dim, ids.len(), weights_out.len(), scales_out.len())?;
        let latency = self.latency_ns.load(Ordering::Relaxed);
        if latency > 0 {
            std::thread::sleep(Duration::from_nanos(latency));
        }
        if Self::take_one(&self.fail_next) {
            return Err(Error::InjectedFault {
                id: ids.first().copied().unwrap_or(-1),
            });
        }
        let fail_on = self.fail_on_id.load(Ordering::Relaxed);
        let (dim, blocks) = (self.dim, self.dim / MX_BLOCK as usize);
        let rows = weights_out
            .chunks_exact_mut(dim)
            .zip(scales_out.chunks_exact_mut(blocks));
        for (&id, (w, s)) in ids.iter().zip(rows) {
            if id == fail_on {
                return Err(Error::InjectedFault { id });
            }
            if !(0..self.rows as i64).contains(&id) {
                return Err(Error::RowOutOfRange {
                    id,
                    rows: self.rows,
                });
            }
            let r = id as usize;
            w.copy_from_slice(&self.weights[r * dim..(r + 1) * dim]);
            s.copy_from_slice(&self.scales[r * blocks..(r + 1) * blocks]);
        }
        if let Some(first) = weights_out.first_mut()
            && Self::take_one(&self.corrupt_next)
        {
            *first ^= 1;
        }
        Ok(())
    }
}
