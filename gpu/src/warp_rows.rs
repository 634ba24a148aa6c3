//! A warp's tile of consecutive rows, the rows-tile shapes of the gather and the dequant
//! (`gather::Shape::RowsTile`, `dequant::Shape::RowsTile`): warp `w` of block `b` takes rows
//! `ROWS (WARPS b + w) ..`, its lanes across each row. The warp's `ROWS` ids come in one load
//! (lane `l` loads id `l % ROWS`) and reach every lane by shuffles: one round trip however many
//! rows, and no arithmetic on the row's width before it, as the Triton peer's tile loads them.
//!
//! (Loaded by every lane from the same addresses instead, the ids went to the uniform datapath,
//! where ptxas computed the rows' addresses one instruction at a time; or, with the warp's index
//! in the addresses, ptxas issued the later rows' ids after the first rows' stores: two round
//! trips.)
#[cfg(target_arch = "nvptx64")]
use crate::device::{block, load_i64_if, record_bad_id, shuffle_i64, thread_in_block};

/// Threads a rows-tile launch over `n` rows needs: whole blocks of `warps` warps, `rows` rows a
/// warp (a warp's rows past the last write nothing). The host sizes both families' grids with it.
pub const fn threads(n: u64, rows: u32, warps: u32) -> u64 {
    n.div_ceil(rows as u64 * warps as u64) * 32 * warps as u64
}

/// The ids of one warp's rows and what the warp may read and write of them.
#[cfg(target_arch = "nvptx64")]
#[derive(Clone, Copy)]
pub(crate) struct WarpRows<const ROWS: usize> {
    /// The warp's first row (output position).
    pub first: u64,
    /// This thread's lane.
    pub lane: u32,
    /// `ids[k]`: the id of row `first + k` (0 past the call's end).
    pub ids: [i64; ROWS],
    /// Rows in the call.
    n: u64,
    /// Rows in the table.
    rows: u64,
}

#[cfg(target_arch = "nvptx64")]
impl<const ROWS: usize> WarpRows<ROWS> {
    /// The calling warp's rows of a launch of `WARPS` warps a block over `n` ids at `ids`, in a
    /// table of `rows` rows. Every lane of the warp calls it (the shuffles need them all).
    ///
    /// # Safety
    /// `ids` holds `n` readable, 8-byte aligned ids that nothing writes during the kernel.
    #[inline(always)]
    pub(crate) unsafe fn load<const WARPS: u32>(ids: u64, n: u64, rows: u64) -> Self {
        let warp = block() * WARPS + thread_in_block() / 32;
        let first = warp as u64 * ROWS as u64;
        let lane = thread_in_block() % 32;
        let mine = first + (lane as usize % ROWS) as u64;
        // SAFETY: read only when mine < n, inside the ids array (the caller's guarantee).
        let my_id = unsafe { load_i64_if(ids + 8 * mine, mine < n) };
        let mut all = [0i64; ROWS];
        for (k, id) in all.iter_mut().enumerate() {
            *id = shuffle_i64(my_id, k as u32);
        }
        WarpRows {
            first,
            lane,
            ids: all,
            n,
            rows,
        }
    }

    /// Whether row `first + k` is in the call.
    #[inline(always)]
    pub(crate) fn live(&self, k: usize) -> bool {
        self.first + (k as u64) < self.n
    }

    /// Whether row `first + k` is in the call and its id in the table: one unsigned compare, a
    /// negative id reads as above 2^63. (`&`, not `&&`, here and in the callers' predicates: a
    /// short circuit becomes a branch that splits the rows' loads.)
    #[inline(always)]
    pub(crate) fn found(&self, k: usize) -> bool {
        self.live(k) & ((self.ids[k] as u64) < self.rows)
    }

    /// Runs `part(c)` for this lane's parts `c = lane, lane + 32, ...` of a row of `per_row`
    /// parts, and once more for a lane past the row's end (`c >= per_row`: `part` predicates
    /// it off): straight-line at rows of 32 parts and below, a loop over the rest of wider rows.
    #[inline(always)]
    pub(crate) fn each_part(&self, per_row: u32, mut part: impl FnMut(u32)) {
        part(self.lane);
        // The guard is the row's width, the same in every lane; without it ptxas laid the first
        // pass out otherwise.
        if per_row > 32 {
            let mut c = self.lane + 32;
            while c < per_row {
                part(c);
                c += 32;
            }
        }
    }

    /// Records the warp's rows whose ids are outside the table (lane 0).
    ///
    /// # Safety
    /// `status` is the address of a writable `IdStatus`.
    #[inline(always)]
    pub(crate) unsafe fn record_bad_ids(&self, status: u64) {
        for k in 0..ROWS {
            if self.lane == 0 && self.live(k) && !self.found(k) {
                // SAFETY: the caller's guarantee.
                unsafe { record_bad_id(status, self.first + k as u64) };
            }
        }
    }
}
