//! L2 prefetch: `cp.async.bulk.prefetch.L2.global` over a table of {address, bytes} segments.
//!
//! Blocks stride over segments and threads over `chunk`-byte pieces of a segment, each thread
//! issuing one bulk prefetch per piece (or, in `l2_prefetch_lines`, one `prefetch.global.L2`
//! per 128-byte line of the piece). The instruction only hints the cache: nothing is written,
//! so results elsewhere stay bit-identical.

/// Default bytes per prefetch instruction.
pub const DEFAULT_CHUNK: u32 = 16 << 10;
/// Default threads per block; blocks default to `min(segments, DEFAULT_MAX_BLOCKS)`.
pub const DEFAULT_THREADS: u32 = 64;
pub const DEFAULT_MAX_BLOCKS: u32 = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// The plain prefetch: lines enter L2 with normal priority.
    Normal,
    /// `.L2::cache_hint` with a `createpolicy` evict_last policy.
    EvictLast,
}

/// The instruction a variant prefetches with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// One `cp.async.bulk.prefetch.L2.global` per piece.
    Bulk,
    /// One `prefetch.global.L2` per 128-byte line of a piece.
    Lines,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    pub name: &'static str,
    pub priority: Priority,
    pub method: Method,
    pub about: &'static str,
}

pub const VARIANTS: &[Variant] = &[
    Variant {
        name: "l2_prefetch",
        priority: Priority::Normal,
        method: Method::Bulk,
        about: "bulk L2 prefetch, normal priority",
    },
    Variant {
        name: "l2_prefetch_evict_last",
        priority: Priority::EvictLast,
        method: Method::Bulk,
        about: "bulk L2 prefetch with an evict_last cache policy",
    },
    Variant {
        name: "l2_prefetch_lines",
        priority: Priority::Normal,
        method: Method::Lines,
        about: "L2 prefetch of each 128-byte line (prefetch.global.L2), normal priority",
    },
];

#[cfg(target_arch = "nvptx64")]
mod kernels {
    use crate::device::{
        block, blocks, evict_last_policy, load_i64, prefetch_l2, prefetch_l2_evict_last,
        prefetch_line_l2, thread_in_block, threads_in_block,
    };
    use crate::params::PrefetchParams;

    /// Bytes between the `prefetch.global.L2` of `l2_prefetch_lines`: one L2 line.
    const LINE: u64 = 128;

    #[inline(always)]
    unsafe fn prefetch<const EVICT_LAST: bool, const LINES: bool>(p: &PrefetchParams) {
        let policy = if EVICT_LAST { evict_last_policy() } else { 0 };
        let chunk = p.chunk as u64;
        let mut s = block() as u64;
        while s < p.n {
            // SAFETY: s < n, so segment s lies in the table the host validated.
            let (address, bytes) = unsafe {
                (
                    load_i64(p.segments + 16 * s) as u64,
                    load_i64(p.segments + 16 * s + 8) as u64,
                )
            };
            let mut offset = thread_in_block() as u64 * chunk;
            while offset < bytes {
                let size = if bytes - offset < chunk {
                    bytes - offset
                } else {
                    chunk
                } as u32;
                // SAFETY: the host checked that the segment is 16-byte aligned and sized; every
                // line prefetch names an address inside the piece.
                unsafe {
                    if LINES {
                        let mut line = 0;
                        while line < size as u64 {
                            prefetch_line_l2(address + offset + line);
                            line += LINE;
                        }
                    } else if EVICT_LAST {
                        prefetch_l2_evict_last(address + offset, size, policy);
                    } else {
                        prefetch_l2(address + offset, size);
                    }
                }
                offset += threads_in_block() as u64 * chunk;
            }
            s += blocks() as u64;
        }
    }

    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn l2_prefetch(p: PrefetchParams) {
        unsafe { prefetch::<false, false>(&p) }
    }

    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn l2_prefetch_evict_last(p: PrefetchParams) {
        unsafe { prefetch::<true, false>(&p) }
    }

    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn l2_prefetch_lines(p: PrefetchParams) {
        unsafe { prefetch::<false, true>(&p) }
    }
}
