//! The reads one lookup needs: unique rows in file order, grouped into block-aligned extents so
//! that rows sharing a block (the file's O_DIRECT alignment, 512 bytes to a 4 KiB page) or lying
//! in adjacent blocks share one read, and the copy of each read row to its outputs.
use std::io;

use super::layout::{LayerLayout, PAGE, TensorSpan};

/// The longest single read: a row of up to `MAX_DIM` bytes plus its page padding, or several
/// rows chained through shared pages.
pub(crate) const MAX_EXTENT: u64 = 4 * PAGE;
/// Consecutive EINTR/EAGAIN answers tolerated for one read before it counts as failed.
const MAX_RETRIES: u32 = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Weight,
    Scale,
}

/// One row id and the output positions that want it (`order[first..first + count]`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Unique {
    pub row: u64,
    pub first: u32,
    pub count: u32,
}

/// One aligned read covering the rows `uniques[first..first + count]` of one tensor.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Extent {
    pub kind: Kind,
    pub file: u32,
    /// Block-aligned file offset.
    pub offset: u64,
    /// Whole blocks.
    pub len: u32,
    /// Bytes from `offset` to the last covered row's end: a read may stop at end of file after it.
    pub need: u32,
    pub first: u32,
    pub count: u32,
}

/// Reused between lookups so that planning allocates nothing once warm.
#[derive(Default)]
pub(crate) struct Plan {
    /// (row, output position) of every id that missed the cache, sorted.
    pub order: Vec<(u64, u32)>,
    pub uniques: Vec<Unique>,
    pub extents: Vec<Extent>,
}

impl Plan {
    pub fn clear(&mut self) {
        self.order.clear();
        self.uniques.clear();
        self.extents.clear();
    }

    /// Sorts `order` and groups it into unique rows.
    pub fn group(&mut self) {
        // By row alone: the positions wanting one row may come in any order.
        self.order.sort_unstable_by_key(|&(row, _)| row);
        let mut i = 0;
        while i < self.order.len() {
            let row = self.order[i].0;
            let mut j = i + 1;
            while j < self.order.len() && self.order[j].0 == row {
                j += 1;
            }
            self.uniques.push(Unique {
                row,
                first: i as u32,
                count: (j - i) as u32,
            });
            i = j;
        }
    }

    /// Adds the extents reading every unique row of `span` in `block`-byte blocks (a power of
    /// two up to a page).
    pub fn add_extents(&mut self, kind: Kind, span: &TensorSpan, block: u64) {
        let rb = span.row_bytes;
        let mut current: Option<Extent> = None;
        for (u, unique) in self.uniques.iter().enumerate() {
            let start = span.row_offset(unique.row);
            let lo = start - start % block;
            let hi = (start + rb).next_multiple_of(block);
            if let Some(ext) = current.as_mut() {
                let end = ext.offset + u64::from(ext.len);
                // Rows in or right after the blocks already being read join that read, up to
                // MAX_EXTENT.
                if lo <= end && hi - ext.offset <= MAX_EXTENT {
                    ext.len = (hi - ext.offset) as u32;
                    ext.need = (start + rb - ext.offset) as u32;
                    ext.count += 1;
                    continue;
                }
                self.extents.push(*ext);
            }
            current = Some(Extent {
                kind,
                file: span.file as u32,
                offset: lo,
                len: (hi - lo) as u32,
                need: (start + rb - lo) as u32,
                first: u as u32,
                count: 1,
            });
        }
        if let Some(ext) = current {
            self.extents.push(ext);
        }
    }

    pub fn extent_uniques(&self, ext: &Extent) -> &[Unique] {
        let first = ext.first as usize;
        self.uniques
            .get(first..first + ext.count as usize)
            .unwrap_or(&[])
    }

    pub fn covers(&self, ext: &Extent, row: u64) -> bool {
        self.extent_uniques(ext).iter().any(|u| u.row == row)
    }

    /// Row ids read by the extents at `indices`, sorted and unique.
    pub fn rows_of(&self, indices: impl Iterator<Item = usize>) -> Vec<u64> {
        let mut rows: Vec<u64> = indices
            .filter_map(|i| self.extents.get(i))
            .flat_map(|e| self.extent_uniques(e).iter().map(|u| u.row))
            .collect();
        rows.sort_unstable();
        rows.dedup();
        rows
    }

    /// Asks for the output lines `ext`'s rows will be copied to, ahead of the copy: the outputs
    /// of a large batch are written in file order, which is random in the caller's buffer, and
    /// each row's first store would otherwise wait alone for its line and its page walk (two
    /// walks in a VM). A reaper that prefetches a whole batch of completions first overlaps them.
    pub fn prefetch_outputs(&self, layer: &LayerLayout, ext: &Extent, out: &OutRows) {
        let span = match ext.kind {
            Kind::Weight => &layer.weight,
            Kind::Scale => &layer.scale,
        };
        for unique in self.extent_uniques(ext) {
            let first = unique.first as usize;
            let wanting = self
                .order
                .get(first..first + unique.count as usize)
                .unwrap_or(&[]);
            for &(_, pos) in wanting {
                out.prefetch(ext.kind, pos as usize, span.row_bytes as usize);
            }
        }
    }

    /// Copies each row `data` (the bytes read at `ext.offset`) holds to its output positions,
    /// and to its place in the cache's fill rows when there are any. False when `data` is
    /// shorter than the plan says, which the readers rule out.
    pub fn deliver(&self, layer: &LayerLayout, ext: &Extent, data: &[u8], out: &OutRows) -> bool {
        let span = match ext.kind {
            Kind::Weight => &layer.weight,
            Kind::Scale => &layer.scale,
        };
        let rb = span.row_bytes as usize;
        for (i, unique) in self.extent_uniques(ext).iter().enumerate() {
            let start = (span.row_offset(unique.row) - ext.offset) as usize;
            let Some(src) = data.get(start..start + rb) else {
                return false;
            };
            let first = unique.first as usize;
            let wanting = self
                .order
                .get(first..first + unique.count as usize)
                .unwrap_or(&[]);
            for &(_, pos) in wanting {
                out.write(ext.kind, pos as usize, src);
            }
            out.fill(ext.kind, ext.first as usize + i, src);
        }
        true
    }
}

/// The caller's output slices, written from several threads at disjoint positions; and the rows
/// the cache will take, copied from the read buffers too, so that filling the cache never reads
/// the caller's output back (in the prefetcher that is write-combined memory, read uncached).
pub(crate) struct OutRows {
    weights: *mut u8,
    weights_len: usize,
    scales: *mut u8,
    scales_len: usize,
    /// One row per unique row of the plan: `dim` weight bytes then the scales; null when no
    /// cache takes the rows.
    fill: *mut u8,
    fill_len: usize,
    dim: usize,
}

// SAFETY: OutRows is a pair of borrowed slices; every position is written by exactly one reader
// (each output position belongs to one unique row, each unique row to one extent per kind), and
// the lookup that made it waits for all readers before its borrows end.
unsafe impl Send for OutRows {}
// SAFETY: as for Send.
unsafe impl Sync for OutRows {}

impl OutRows {
    /// `fill`: `(rows, dim)`, the cache's fill rows of `dim + dim / 32` bytes each.
    pub fn new(weights: &mut [u8], scales: &mut [u8], fill: Option<(&mut [u8], usize)>) -> Self {
        let (fill, fill_len, dim) = match fill {
            Some((f, dim)) => (f.as_mut_ptr(), f.len(), dim),
            None => (std::ptr::null_mut(), 0, 0),
        };
        OutRows {
            weights: weights.as_mut_ptr(),
            weights_len: weights.len(),
            scales: scales.as_mut_ptr(),
            scales_len: scales.len(),
            fill,
            fill_len,
            dim,
        }
    }

    /// Copies `src`, unique row `u`'s weights or scales, into its fill row.
    fn fill(&self, kind: Kind, u: usize, src: &[u8]) {
        if self.fill.is_null() {
            return;
        }
        let stride = self.dim + self.dim / super::layout::MX_BLOCK;
        let at = u * stride
            + match kind {
                Kind::Weight => 0,
                Kind::Scale => self.dim,
            };
        if at + src.len() <= self.fill_len && src.len() <= stride {
            // SAFETY: in bounds of the live fill slice (checked above); unique row `u` is
            // delivered by exactly one extent per kind, so no other writer touches this range.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.fill.add(at), src.len()) }
        }
    }

    /// Prefetches, for writing, the `len` bytes output `pos` of `kind` will take.
    fn prefetch(&self, kind: Kind, pos: usize, len: usize) {
        let base = match kind {
            Kind::Weight => self.weights,
            Kind::Scale => self.scales,
        };
        super::prefetch::for_write(base.wrapping_add(pos * len), len);
    }

    fn write(&self, kind: Kind, pos: usize, src: &[u8]) {
        let (base, len) = match kind {
            Kind::Weight => (self.weights, self.weights_len),
            Kind::Scale => (self.scales, self.scales_len),
        };
        let at = pos * src.len();
        if at + src.len() <= len {
            // SAFETY: in bounds (checked above) of a live slice; no other writer touches
            // `at..at + src.len()` (see the Send impl); src is a different allocation.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), base.add(at), src.len()) }
        }
    }
}

/// What to do after one read of an extent returned `res` (bytes, or a negative errno).
pub(crate) enum Step {
    Done,
    /// Read again from `done` bytes into the extent.
    Again {
        done: u32,
    },
    Failed(io::Error),
}

/// Retries what can be retried: EINTR, EAGAIN, and short reads that made progress. `direct`
/// reads restart at a 512-byte boundary (asked only for a short read). Inline: the io_uring
/// reaper calls it per completion, where the whole extent arriving is the common case.
#[inline]
pub(crate) fn step(
    ext: &Extent,
    direct: impl FnOnce() -> bool,
    done: u32,
    res: i64,
    attempts: &mut u32,
) -> Step {
    if res < 0 {
        let errno = (-res) as i32;
        if (errno == libc::EINTR || errno == libc::EAGAIN) && *attempts < MAX_RETRIES {
            *attempts += 1;
            return Step::Again { done };
        }
        return Step::Failed(io::Error::from_raw_os_error(errno));
    }
    let total = u64::from(done) + res as u64;
    if total >= u64::from(ext.need) {
        return Step::Done;
    }
    let next = if direct() { total & !511 } else { total };
    // A direct read that ended inside its first block made no aligned progress: read that
    // block again, a bounded number of times.
    if res > 0 && next <= u64::from(done) && *attempts < MAX_RETRIES {
        *attempts += 1;
        return Step::Again { done };
    }
    if next > u64::from(done) {
        *attempts = 0;
    }
    if res == 0 || next <= u64::from(done) {
        return Step::Failed(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "short read: {total} of the {} bytes from byte {} that the rows need",
                ext.need, ext.offset
            ),
        ));
    }
    Step::Again { done: next as u32 }
}
