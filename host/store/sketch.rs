//! How often each row was asked for, approximately: TinyLFU's count-min sketch (Einziger, Friedman
//! and Manes, 2017): a cache's memory of frequency beyond the rows it holds. The row cache
//! admits and evicts by it; the W-TinyLFU peer replay keeps one too.
//!
//! Four one-byte counters a key, all in one 64-byte block (one cache line a record); a record
//! raises only the smallest of them (conservative update), and every `sample` requests all
//! counters are halved, so that the estimate follows a law that moves. Counters are relaxed
//! atomics read and written separately: a record racing another may be lost, which costs an
//! estimate one count and never a lock.
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

/// Counters a block holds: one cache line.
const BLOCK: usize = 64;
/// Counters per key, one in each quarter of its block.
const DEPTH: usize = 4;

#[repr(align(64))]
struct Block([AtomicU8; BLOCK]);

pub struct FrequencySketch {
    blocks: Box<[Block]>,
    mask: u64,
    sample: u64,
    requests: AtomicU64,
}

/// splitmix64's finalizer: row ids are dense, their hashes must not be.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl FrequencySketch {
    /// A sketch of `counters` one-byte counters (rounded up to a power of two, at least one
    /// block), halved every `sample` requests (0: never).
    pub fn new(counters: usize, sample: u64) -> Self {
        let blocks = counters.div_ceil(BLOCK).next_power_of_two().max(1);
        FrequencySketch {
            blocks: (0..blocks)
                .map(|_| Block(std::array::from_fn(|_| AtomicU8::new(0))))
                .collect(),
            mask: blocks as u64 - 1,
            sample,
            requests: AtomicU64::new(0),
        }
    }

    /// The block and the four counters of `key`.
    fn slots(&self, key: u64) -> (&Block, [usize; DEPTH]) {
        let h = mix(key);
        let block = &self.blocks[(h & self.mask) as usize];
        let quarter = BLOCK / DEPTH;
        let at = std::array::from_fn(|i| i * quarter + ((h >> (32 + 8 * i)) as usize % quarter));
        (block, at)
    }

    /// Counts one request for `key`.
    pub fn record(&self, key: u64) {
        self.record_times(key, 1);
    }

    /// Counts `n` requests for `key` at once: the estimate rises by `n` (saturating), and no
    /// counter rises above it (conservative update). Returns the estimate before.
    pub fn record_times(&self, key: u64, n: u8) -> u8 {
        let (block, at) = self.slots(key);
        let counts = at.map(|i| block.0[i].load(Ordering::Relaxed));
        let least = counts.iter().copied().min().unwrap_or(0);
        let raised = least.saturating_add(n);
        for (i, c) in at.into_iter().zip(counts) {
            if c < raised {
                block.0[i].store(raised, Ordering::Relaxed);
            }
        }
        least
    }

    /// Requests for `key` since the sketch began, halved at each aging (saturating at 255).
    pub fn estimate(&self, key: u64) -> u8 {
        let (block, at) = self.slots(key);
        at.iter()
            .map(|&i| block.0[i].load(Ordering::Relaxed))
            .min()
            .unwrap_or(0)
    }

    /// Notes that `n` requests were recorded; halves every counter when a `sample` is complete.
    /// Callers count a batch at once, so that threads do not share a counter per request.
    pub fn advance(&self, n: u64) {
        if self.sample == 0 {
            return;
        }
        let before = self.requests.fetch_add(n, Ordering::Relaxed);
        if (before + n) / self.sample > before / self.sample {
            self.halve();
        }
    }

    fn halve(&self) {
        for block in self.blocks.iter() {
            for c in &block.0 {
                c.store(c.load(Ordering::Relaxed) >> 1, Ordering::Relaxed);
            }
        }
    }

    /// Bytes a sketch of `counters` counters takes (what [`FrequencySketch::new`] rounds to).
    pub fn bytes_for(counters: usize) -> usize {
        counters.div_ceil(BLOCK).next_power_of_two().max(1) * BLOCK
    }

    /// Bytes the counters take.
    pub fn bytes(&self) -> usize {
        self.blocks.len() * BLOCK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_count_requests_and_never_undercount_alone() {
        let s = FrequencySketch::new(1 << 12, 0);
        for k in 0..200u64 {
            for _ in 0..(k % 7) {
                s.record(k);
            }
        }
        for k in 0..200u64 {
            let e = u64::from(s.estimate(k));
            // Count-min never undercounts without lost races; 200 keys in 4096 counters rarely
            // collide on all four.
            assert!(e >= k % 7, "key {k}: {e}");
        }
        let exact = (0..200u64).filter(|&k| u64::from(s.estimate(k)) == k % 7);
        assert!(exact.count() >= 190);
        assert_eq!(s.estimate(1 << 40), 0);
    }

    #[test]
    fn counters_saturate_and_halve_each_sample() {
        let s = FrequencySketch::new(64, 100);
        for _ in 0..300 {
            s.record(9);
        }
        assert_eq!(s.estimate(9), 255);
        s.advance(99);
        assert_eq!(s.estimate(9), 255);
        s.advance(1);
        assert_eq!(s.estimate(9), 127);
        // A batch that crosses a sample boundary halves once.
        s.advance(150);
        assert_eq!(s.estimate(9), 63);
        assert_eq!(s.bytes(), 64);
    }

    #[test]
    fn a_weighted_record_raises_the_estimate_by_its_weight_only() {
        let s = FrequencySketch::new(1 << 12, 0);
        s.record_times(5, 3);
        assert_eq!(s.estimate(5), 3);
        // Conservative: a key asked once that shares a counter with 5 leaves it at 3 (it raises
        // its own least counter to 1 only), so 5's estimate is exactly 3 + 2 after.
        for k in 6..200u64 {
            s.record_times(k, 1);
        }
        s.record_times(5, 2);
        assert_eq!(s.estimate(5), 5);
        s.record_times(7, 250);
        s.record_times(7, 250);
        assert_eq!(s.estimate(7), 255);
    }
}
