//! The demo's hasher: n-gram hashes of a token stream into row ids, one id per (token, head), the
//! way an Engram layer turns the tokens it sees into the rows it needs.
//!
//! Per thread: one (token, head) pair, reading the `ngram` tokens that end at that token (4-byte
//! loads, a few per thread, all hitting L1/L2 after the first warp) and writing one int64 id.
//! The scalar steps below are shared with the host, which hashes the same way without a GPU.
use core::num::NonZeroU64;

/// The hash kernel's entry.
pub const KERNEL: &str = "hash_ngrams";

/// The state a (seed, head) pair starts from.
#[inline(always)]
pub fn start(seed: u64, head: u32) -> u64 {
    mix(seed ^ (head as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// Folds one token into the state.
#[inline(always)]
pub fn fold(state: u64, token: u32) -> u64 {
    mix(state ^ (token as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93))
}

/// The row id of a finished state: `row_start + state % rows`.
#[inline(always)]
pub fn finish(state: u64, row_start: u64, rows: NonZeroU64) -> i64 {
    row_start.wrapping_add(state % rows) as i64
}

/// `rows` as a divisor, a zero read as one.
#[inline(always)]
pub fn divisor(rows: u64) -> NonZeroU64 {
    NonZeroU64::new(rows).unwrap_or(NonZeroU64::MIN)
}

/// The splitmix64 finalizer.
#[inline(always)]
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(target_arch = "nvptx64")]
mod kernels {
    use core::num::NonZeroU64;

    use super::{divisor, finish, fold, start};
    use crate::device::{global_thread, grid_threads, load_u32, store_i64};
    use crate::params::{HashParams, MAX_NGRAM};

    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn hash_ngrams(p: HashParams) {
        let heads = NonZeroU64::new(p.heads as u64).unwrap_or(NonZeroU64::MIN);
        let rows = divisor(p.rows);
        let ngram = if p.ngram > MAX_NGRAM {
            MAX_NGRAM
        } else {
            p.ngram
        } as u64;
        let total = p.n_tokens * heads.get();
        let stride = grid_threads();
        let mut i = global_thread();
        while i < total {
            let (t, h) = (i / heads, i % heads);
            let mut state = start(p.seed, h as u32);
            let mut k = 0;
            while k < ngram {
                // SAFETY: t - k < n_tokens, so the read lies in the token array.
                let token = if k <= t {
                    unsafe { load_u32(p.tokens + 4 * (t - k)) }
                } else {
                    0
                };
                state = fold(state, token);
                k += 1;
            }
            // SAFETY: i < n_tokens * heads, the length of the ids array.
            unsafe { store_i64(p.ids + 8 * i, finish(state, p.row_start, rows)) };
            i += stride;
        }
    }
}
