//! Fitting each window's prefetch into its window.
//!
//! A prefetch still issuing when the window's reader starts competes with it for the memory
//! system (on the H200 a 32 MiB prefetch takes 22 us to issue; after a 5 us collective it made
//! an M = 16 GEMV 2.5-4.5 us slower). So the plan measures, in eager forwards, how long each
//! window lasted and how long its prefetch took from the same start, and caps the window's bytes
//! at what fits: `issued * (1 + TAIL) * window / prefetch`. The cap moves toward the bytes whose
//! prefetch ends [`TAIL`] of a window after the window does, from either side (with a fixed
//! cost `f` per prefetch and a rate `r`, the fixed point is `((1 + TAIL) window - f) / r`,
//! approached by a factor `f / ((1 + TAIL) window)` per measurement), and never drops below one
//! segment. A short tail costs the reader little: on the H200 an M = 16 GEMV after a 5 us
//! window stayed within the run-to-run spread with a 10.4 MiB prefetch running about 60% past
//! the window, and was 4.5 us slower with the whole 32 MiB (about 300% past).
use std::collections::HashMap;

use crate::l2_plan::Signature;

/// The share of its window a prefetch may run past the window's end.
pub const TAIL: f64 = 0.25;

/// Measurements a window gets before its cap is kept as it is: measuring costs the main stream
/// two timing events (about 1.3 us each on the H200), so only the first eager forwards pay it.
pub const MEASURES: u32 = 3;

/// The learned byte caps of every (signature, window).
#[derive(Debug, Default)]
pub struct WindowFit {
    /// (cap, measurements so far).
    caps: HashMap<(Signature, usize), (u64, u32)>,
}

impl WindowFit {
    /// Whether window `k` of `signature` still wants measuring.
    pub fn wants_measure(&self, signature: Signature, k: usize) -> bool {
        self.caps
            .get(&(signature, k))
            .is_none_or(|(_, measured)| *measured < MEASURES)
    }

    /// The cap of window `k` of `signature`, if one was measured.
    pub fn cap(&self, signature: Signature, k: usize) -> Option<u64> {
        self.caps.get(&(signature, k)).map(|(cap, _)| *cap)
    }

    /// A prefetch of `issued` bytes for window `k` ended `prefetch_ns` after the window began;
    /// the window ended after `window_ns`. `floor` is the least cap (the window's first
    /// segment). Returns the new cap.
    pub fn observe(
        &mut self,
        signature: Signature,
        k: usize,
        issued: u64,
        window_ns: f64,
        prefetch_ns: f64,
        floor: u64,
    ) -> u64 {
        let fits = if prefetch_ns > 0.0 && window_ns.is_finite() {
            (issued as f64 * ((1.0 + TAIL) * window_ns.max(0.0) / prefetch_ns)) as u64
        } else {
            u64::MAX
        };
        let cap = (fits & !15).max(floor);
        let entry = self.caps.entry((signature, k)).or_insert((cap, 0));
        *entry = (cap, entry.1 + 1);
        cap
    }

    /// How many of `segments` (sizes, in order) a window prefetches under `cap`: the longest
    /// prefix that fits, and at least one.
    pub fn prefix_within(segments: impl IntoIterator<Item = u64>, cap: u64) -> usize {
        let mut total = 0u64;
        let mut n = 0;
        for bytes in segments {
            total = total.saturating_add(bytes);
            if n > 0 && total > cap {
                break;
            }
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIG: Signature = Signature(3);

    #[test]
    fn a_prefetch_longer_than_its_window_is_cut_in_proportion() {
        let mut fit = WindowFit::default();
        assert_eq!(fit.cap(SIG, 0), None);
        // 32 MiB took 22 us; the window lasted 4.4 us, 5.5 us with its tail: a quarter fits.
        let cap = fit.observe(SIG, 0, 32 << 20, 4_400.0, 22_000.0, 512 << 10);
        assert_eq!(cap, 8 << 20);
        assert_eq!(fit.cap(SIG, 0), Some(8 << 20));
        assert_eq!(fit.cap(SIG, 1), None);
        assert_eq!(fit.cap(Signature(4), 0), None);
    }

    #[test]
    fn measures_each_window_a_few_times() {
        let mut fit = WindowFit::default();
        for _ in 0..MEASURES {
            assert!(fit.wants_measure(SIG, 1));
            fit.observe(SIG, 1, 1 << 20, 1600.0, 4000.0, 16);
        }
        assert!(!fit.wants_measure(SIG, 1));
        assert!(fit.wants_measure(SIG, 0));
        assert_eq!(fit.cap(SIG, 1), Some(1 << 19));
    }

    #[test]
    fn a_prefetch_that_ended_early_may_grow() {
        let mut fit = WindowFit::default();
        let cap = fit.observe(SIG, 2, 4 << 20, 16_000.0, 10_000.0, 512 << 10);
        assert_eq!(cap, 8 << 20);
    }

    #[test]
    fn converges_to_what_fits_with_a_fixed_cost() {
        // A prefetch costs 4 us plus 0.6 us a MiB; the window lasts 8 us, 10 us with its tail:
        // 10 MiB fit.
        let took = |bytes: u64| 4_000.0 + 600.0 * bytes as f64 / (1 << 20) as f64;
        let mut fit = WindowFit::default();
        let mut issued = 32u64 << 20;
        for _ in 0..12 {
            issued = fit.observe(SIG, 0, issued, 8_000.0, took(issued), 512 << 10);
        }
        let mib = issued as f64 / (1 << 20) as f64;
        assert!((mib - 10.0).abs() < 0.05, "{mib} MiB");
    }

    #[test]
    fn never_below_the_floor_and_always_16_byte_multiples() {
        let mut fit = WindowFit::default();
        assert_eq!(
            fit.observe(SIG, 0, 1 << 20, 10.0, 50_000.0, 512 << 10),
            512 << 10
        );
        assert_eq!(fit.observe(SIG, 0, 1000, 1000.0, 999.0, 16) % 16, 0);
        assert_eq!(fit.observe(SIG, 0, 1 << 20, f64::NAN, 1000.0, 16), !15u64);
    }

    #[test]
    fn keeps_the_longest_prefix_under_the_cap_and_at_least_one() {
        let pieces = [512u64 << 10, 512 << 10, 512 << 10, 256 << 10];
        assert_eq!(WindowFit::prefix_within(pieces, u64::MAX), 4);
        assert_eq!(WindowFit::prefix_within(pieces, 1 << 20), 2);
        assert_eq!(WindowFit::prefix_within(pieces, (1 << 20) + 1), 2);
        assert_eq!(WindowFit::prefix_within(pieces, 16), 1);
        assert_eq!(WindowFit::prefix_within([], 16), 0);
    }
}
