//! L2 prefetch: `cp.async.bulk.prefetch.L2.global` over a table of {address, bytes} segments.
//!
//! Blocks stride over segments and threads over `chunk`-byte pieces of a segment, each thread
//! issuing one bulk prefetch per piece (or, in `l2_prefetch_lines`, one `prefetch.global.L2`
//! per 128-byte line of the piece). The instruction only hints the cache: nothing is written,
//! so results elsewhere stay bit-identical.
//!
//! `l2_prefetch_loads` reads the bytes instead, with the load a weight-bound kernel uses
//! (`ld.global.nc`): the block's threads load a segment's 16-byte words in order,
//! [`LOADS_IN_FLIGHT`] a thread a round. The values are folded by XOR into one shared-memory
//! slot a thread, which nothing reads: `ptxas` deletes loads whose values go unused (strong
//! ones too), and the fold puts each round's loads in distinct registers (ptxas folds the first
//! four before it issues the last four). The values are dropped, so a weight written meanwhile
//! can only make the read useless, never change a result. On the H200 a GEMV found lines an SM
//! had read faster than lines a prefetch instruction had brought in, for windows up to 16 MiB of
//! its 60 MiB L2 (`FETCHAHEAD_L2_BENCH=gap`, BENCHMARKS.md).

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
    /// Every 16-byte word loaded (and dropped); `chunk` is unused.
    Loads,
    /// Every byte copied into shared memory by bulk copies (`cp.async.bulk`, [`COPY_BYTES`]
    /// each, [`COPY_SLOTS`] in flight a block of one warp) and dropped: read as `Loads` reads,
    /// without a register per byte in flight; `chunk` is unused.
    Copies,
}

/// 16-byte loads a thread of `l2_prefetch_loads` has in flight.
pub const LOADS_IN_FLIGHT: u32 = 8;
/// Threads per block for `l2_prefetch_loads` (each holds [`LOADS_IN_FLIGHT`] loads in flight,
/// 128 KiB a block; a bulk prefetch holds nothing, so 64 suffice there).
pub const LOADS_THREADS: u32 = 1024;
/// Blocks of `l2_prefetch_loads` the host launches per segment (up to one block an SM): a
/// 512 KiB piece is then one round of loads.
pub const LOADS_BLOCKS_PER_SEGMENT: u32 = 4;
/// Bytes of one bulk copy of `l2_prefetch_copies`.
pub const COPY_BYTES: u32 = 8 << 10;
/// Bulk copies a block of `l2_prefetch_copies` keeps in flight: its shared buffer, 40 KiB (a
/// static buffer holds at most 48 KiB, the timeline's and the mbarriers' words included).
pub const COPY_SLOTS: u32 = 5;
/// Threads per block of `l2_prefetch_copies`: one warp, whose first lane issues every copy.
pub const COPIES_THREADS: u32 = 32;
/// Blocks of `l2_prefetch_copies` the host launches per SM it may use.
pub const COPIES_BLOCKS_PER_SM: u32 = 2;
/// Jobs of [`LOADS_JOB`] bytes in a segment of at most 512 KiB, as the partitioned reads count
/// them (job `j` is segment `j / JOBS_PER_SEGMENT`, part `j % JOBS_PER_SEGMENT`).
pub const JOBS_PER_SEGMENT: u64 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    pub name: &'static str,
    pub priority: Priority,
    pub method: Method,
    pub about: &'static str,
}

/// The row of a variant: `bulk`/`lines` take the prefetch's priority, `loads` nothing.
macro_rules! l2_row {
    ($name:expr, $about:expr, bulk { priority: $pr:ident }) => {
        Variant {
            name: $name,
            priority: Priority::$pr,
            method: Method::Bulk,
            about: $about,
        }
    };
    ($name:expr, $about:expr, lines { priority: $pr:ident }) => {
        Variant {
            name: $name,
            priority: Priority::$pr,
            method: Method::Lines,
            about: $about,
        }
    };
    ($name:expr, $about:expr, loads {}) => {
        Variant {
            name: $name,
            priority: Priority::Normal,
            method: Method::Loads,
            about: $about,
        }
    };
    ($name:expr, $about:expr, copies {}) => {
        Variant {
            name: $name,
            priority: Priority::Normal,
            method: Method::Copies,
            about: $about,
        }
    };
}

/// The body of a variant, from the same tokens as its row.
#[cfg(target_arch = "nvptx64")]
macro_rules! l2_body {
    ($p:ident, bulk { priority: $pr:ident }) => {
        super::kernels::prefetch::<
            { matches!(super::Priority::$pr, super::Priority::EvictLast) },
            false,
        >(&$p)
    };
    ($p:ident, lines { priority: $pr:ident }) => {
        super::kernels::prefetch::<
            { matches!(super::Priority::$pr, super::Priority::EvictLast) },
            true,
        >(&$p)
    };
    ($p:ident, loads {}) => {
        super::kernels::read_segments(&$p)
    };
    ($p:ident, copies {}) => {
        super::kernels::copy_segments(&$p)
    };
}

/// The arch tier a variant's instructions need: `cp.async.bulk.prefetch.L2` and bulk copies
/// need sm_90; line prefetches and loads sm_80.
macro_rules! l2_needs {
    ($then:ident!($($pre:tt)*) bulk { $($arg:tt)* }) => {
        $then! { $($pre)* sm_90 }
    };
    ($then:ident!($($pre:tt)*) copies { $($arg:tt)* }) => {
        $then! { $($pre)* sm_90 }
    };
    ($then:ident!($($pre:tt)*) $($kind:tt)*) => {
        $then! { $($pre)* sm_80 }
    };
}

variants! {
    params: PrefetchParams, row: l2_row, body: l2_body, needs: l2_needs;
    l2_prefetch: bulk { priority: Normal } => "bulk L2 prefetch, normal priority";
    l2_prefetch_evict_last: bulk { priority: EvictLast }
        => "bulk L2 prefetch with an evict_last cache policy";
    l2_prefetch_lines: lines { priority: Normal }
        => "L2 prefetch of each 128-byte line (prefetch.global.L2), normal priority";
    l2_prefetch_loads: loads {}
        => "every 16-byte word read by the SMs and dropped (lines enter L2 as a read's)";
    l2_prefetch_copies: copies {}
        => "every byte bulk-copied into shared memory by one-warp blocks and dropped (lines enter L2 as a read's)";
}

variant_handle!(PrefetchVariant, "l2_prefetch");

/// The L2 partition probe's entry (`PartitionProbeParams`): how far each SM is from the lines
/// SM 0 read, so that the host can tell the L2 partitions apart.
pub const PARTITION_PROBE_KERNEL: &str = "l2_partition_probe";

/// Bytes a job of a partitioned `l2_prefetch_loads` reads: one round of a block's loads.
pub const LOADS_JOB: u64 = LOADS_THREADS as u64 * 16 * LOADS_IN_FLIGHT as u64;

/// The plain bulk prefetch, `l2_prefetch`.
pub const BULK_VARIANT: PrefetchVariant = PrefetchVariant::must("l2_prefetch");
/// The SMs' read, `l2_prefetch_loads`.
pub const LOADS_VARIANT: PrefetchVariant = PrefetchVariant::must("l2_prefetch_loads");
/// The SMs' read by bulk copies, `l2_prefetch_copies`.
pub const COPIES_VARIANT: PrefetchVariant = PrefetchVariant::must("l2_prefetch_copies");
const _: () = assert!(matches!(BULK_VARIANT.variant().method, Method::Bulk));
const _: () = assert!(matches!(LOADS_VARIANT.variant().method, Method::Loads));
const _: () = assert!(matches!(COPIES_VARIANT.variant().method, Method::Copies));

/// Blocks and threads of a launch of `variant` over `segments` segments on a device of
/// `sms` multiprocessors. The loads variant holds its bytes in registers until they land: blocks
/// of [`LOADS_THREADS`], [`LOADS_BLOCKS_PER_SEGMENT`] a segment, up to one an SM. The copies
/// variant holds them in shared memory: blocks of [`COPIES_THREADS`], one a job, up to
/// [`COPIES_BLOCKS_PER_SM`] an SM. The others hold nothing: `min(segments, max_blocks)` blocks
/// of `threads`, as configured.
pub fn launch_shape(
    variant: PrefetchVariant,
    segments: u32,
    sms: u32,
    max_blocks: u32,
    threads: u32,
) -> (u32, u32) {
    match variant.variant().method {
        Method::Loads => (
            segments.saturating_mul(LOADS_BLOCKS_PER_SEGMENT).min(sms),
            LOADS_THREADS,
        ),
        Method::Copies => (
            segments
                .saturating_mul(JOBS_PER_SEGMENT as u32)
                .min(sms.saturating_mul(COPIES_BLOCKS_PER_SM)),
            COPIES_THREADS,
        ),
        _ => (segments.min(max_blocks), threads),
    }
}

#[cfg(target_arch = "nvptx64")]
mod kernels {
    use core::num::NonZeroU64;

    use super::{COPY_BYTES, COPY_SLOTS, JOBS_PER_SEGMENT, LOADS_IN_FLIGHT, LOADS_JOB};
    use crate::device::{
        atomic_add_u32, atomic_exch_u32, block, block_sync, blocks, evict_last_policy, fence_gpu,
        load_16, load_i64, load_l2_8, load_u8, prefetch_l2, prefetch_l2_evict_last,
        prefetch_line_l2, sm_id, store_v2_u32, thread_in_block, threads_in_block,
    };
    use crate::params::{MAX_SMS, PROBE_LINE_STRIDE, PartitionProbeParams, PrefetchParams};
    use crate::smem::{
        bulk_load, fence_mbarrier_init, load_shared_16, mbarrier_arrive, mbarrier_expect_tx,
        mbarrier_init, mbarrier_wait, shared_buffer, store_shared_16,
    };

    /// Bytes between the `prefetch.global.L2` of `l2_prefetch_lines`: one L2 line.
    const LINE: u64 = 128;

    #[inline(always)]
    pub(super) unsafe fn prefetch<const EVICT_LAST: bool, const LINES: bool>(p: &PrefetchParams) {
        let policy = if EVICT_LAST { evict_last_policy() } else { 0 };
        let chunk = p.chunk as u64;
        let mut s = block() as u64;
        while s < p.n {
            // SAFETY: s < n, so segment s lies in the table the host validated.
            let (address, bytes) = unsafe { segment(p, s) };
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

    /// Reads every 16-byte word of every segment: blocks over segments (several a segment when
    /// the grid has more blocks than segments), a block's threads over consecutive words,
    /// [`LOADS_IN_FLIGHT`] words a thread before the next round. The sink
    /// has a slot for each of the 1024 threads a block can have.
    #[inline(always)]
    pub(super) unsafe fn read_segments(p: &PrefetchParams) {
        // One buffer for both paths, declared once above their branch: a declaration on each
        // path is two buffers once LLVM does not merge them.
        let sink = shared_buffer::<{ 1024 * 16 + 16 }>();
        if p.partitions != 0 {
            // SAFETY: the host's map and claims, as `read_by_partition` requires.
            return unsafe { read_by_partition(p, sink) };
        }
        let mut fold = [0u32; 4];
        let word = 16u64;
        // With more blocks than segments, `parts` blocks share each segment, interleaved by
        // block-wide strides.
        let grid = blocks() as u64;
        let parts = NonZeroU64::new(grid / p.n.max(1)).unwrap_or(NonZeroU64::MIN);
        let stride = threads_in_block() as u64 * word * parts.get();
        let round = stride * LOADS_IN_FLIGHT as u64;
        let mut job = block() as u64;
        while job < p.n * parts.get() {
            let (s, part) = (job / parts, job % parts);
            // SAFETY: s < n, so segment s lies in the table the host validated.
            let (address, bytes) = unsafe { segment(p, s) };
            let mut base = (part * threads_in_block() as u64 + thread_in_block() as u64) * word;
            // Whole rounds: every load unconditional, so all are in flight before the fold.
            while base + (LOADS_IN_FLIGHT as u64 - 1) * stride < bytes {
                let mut words = [[0u32; 4]; LOADS_IN_FLIGHT as usize];
                for j in 0..LOADS_IN_FLIGHT as usize {
                    // SAFETY: the host checked that the segment is 16-byte aligned and sized,
                    // inside a live allocation; base + j * stride < bytes.
                    words[j] = unsafe { load_16(address + base + j as u64 * stride) };
                }
                for j in 0..LOADS_IN_FLIGHT as usize {
                    fold = xor(fold, words[j]);
                }
                base += round;
            }
            while base < bytes {
                // SAFETY: as above; base < bytes.
                fold = xor(fold, unsafe { load_16(address + base) });
                base += stride;
            }
            job += grid;
        }
        // SAFETY: this thread's own 16-byte slot of the sink (a block has at most 1024 threads).
        unsafe { store_shared_16(sink + thread_in_block() * 16, fold) };
    }

    /// `read_segments` with a partition map: each partition's blocks take [`LOADS_JOB`]-byte
    /// jobs (segment `j / 4`, quarter `j % 4`) from their own counter until every job is read,
    /// so that every byte is read by an SM of each partition that has a block. The launch's last
    /// block zeroes the counters for the next launch on the stream.
    ///
    /// # Safety
    /// As `read_segments`; `p.partitions` holds `MAX_SMS` bytes and `p.claims` is a zeroed,
    /// writable `PrefetchClaims` no other running launch uses; segments are at most 512 KiB;
    /// `sink` is the block's shared buffer of `1024 * 16 + 16` bytes.
    #[inline(always)]
    unsafe fn read_by_partition(p: &PrefetchParams, sink: u32) {
        let slot = sink + 1024 * 16;
        // SAFETY: the host's map, as this function requires.
        let part = unsafe { partition(p) };
        let jobs = p.n * JOBS_PER_SEGMENT;
        // Jobs below `twice` are read by each partition's blocks, the rest by one block only.
        let twice = jobs - (p.once_jobs as u64).min(jobs);
        let mut fold = [0u32; 4];
        loop {
            if thread_in_block() == 0 {
                // SAFETY: the caller's claims, as `claim` requires.
                let job = unsafe { claim(p, part, twice) };
                // SAFETY: the block's slot after the sink.
                unsafe { store_shared_16(slot, [job, 0, 0, 0]) };
            }
            block_sync();
            // SAFETY: written above, before the barrier.
            let job = unsafe { load_shared_16(slot) }[0] as u64;
            block_sync();
            if job >= jobs {
                break;
            }
            let s = job / JOBS_PER_SEGMENT;
            // SAFETY: s < n, so segment s lies in the table the host validated.
            let (address, bytes) = unsafe { segment(p, s) };
            let lo = (job % JOBS_PER_SEGMENT) * LOADS_JOB;
            let hi = bytes.min(lo + LOADS_JOB);
            let stride = threads_in_block() as u64 * 16;
            let mut at = lo + thread_in_block() as u64 * 16;
            if lo + LOADS_JOB <= bytes && threads_in_block() == 1024 {
                // A whole job: every load unconditional, all in flight before the fold.
                let mut words = [[0u32; 4]; LOADS_IN_FLIGHT as usize];
                for j in 0..LOADS_IN_FLIGHT as usize {
                    // SAFETY: inside the segment (a whole job of it), 16-byte aligned.
                    words[j] = unsafe { load_16(address + at + j as u64 * stride) };
                }
                for j in 0..LOADS_IN_FLIGHT as usize {
                    fold = xor(fold, words[j]);
                }
            } else {
                while at < hi {
                    // SAFETY: at < hi <= bytes, 16-byte aligned.
                    fold = xor(fold, unsafe { load_16(address + at) });
                    at += stride;
                }
            }
        }
        // SAFETY: this thread's own 16-byte slot of the sink.
        unsafe { store_shared_16(sink + thread_in_block() * 16, fold) };
        if thread_in_block() == 0 {
            // SAFETY: the caller's claims, once a block, after its last claim.
            unsafe { release_claims(p) };
        }
    }

    /// Segment `s` of the table: its address and bytes.
    ///
    /// # Safety
    /// `s < p.n`, inside the table the host validated.
    #[inline(always)]
    unsafe fn segment(p: &PrefetchParams, s: u64) -> (u64, u64) {
        // SAFETY: the caller's segment, 16 bytes of the table.
        unsafe {
            (
                load_i64(p.segments + 16 * s) as u64,
                load_i64(p.segments + 16 * s + 8) as u64,
            )
        }
    }

    /// The L2 partition (0 or 1) of the SM this block runs on, from the host's map.
    ///
    /// # Safety
    /// `p.partitions` is the host's map of `MAX_SMS` bytes.
    #[inline(always)]
    unsafe fn partition(p: &PrefetchParams) -> u64 {
        let sm = (sm_id() as usize).min(MAX_SMS - 1) as u64;
        // SAFETY: the map holds MAX_SMS bytes.
        (unsafe { load_u8(p.partitions + sm) } & 1) as u64
    }

    /// The next job of partition `part`'s blocks: below `twice` from the partition's own
    /// counter, then from the shared counter of the jobs read once.
    ///
    /// # Safety
    /// `p.claims` is the launch's writable, 4-byte aligned `PrefetchClaims`.
    #[inline(always)]
    unsafe fn claim(p: &PrefetchParams, part: u64, twice: u64) -> u32 {
        // SAFETY: the caller's claims.
        let job = unsafe { atomic_add_u32(p.claims + 4 * part, 1) };
        if (job as u64) < twice {
            return job;
        }
        // SAFETY: as above; the fourth word counts the jobs read once.
        twice as u32 + unsafe { atomic_add_u32(p.claims + 12, 1) }
    }

    /// Counts this block done; the launch's last block zeroes the claims for the next launch.
    ///
    /// # Safety
    /// As [`claim`]; called once by one thread of each block, after the block's last claim.
    #[inline(always)]
    unsafe fn release_claims(p: &PrefetchParams) {
        fence_gpu();
        // SAFETY: the caller's claims; only the last block to finish writes them back.
        unsafe {
            if atomic_add_u32(p.claims + 8, 1) == blocks() - 1 {
                atomic_exch_u32(p.claims, 0);
                atomic_exch_u32(p.claims + 4, 0);
                atomic_exch_u32(p.claims + 8, 0);
                atomic_exch_u32(p.claims + 12, 0);
            }
        }
    }

    /// Bulk-copies every byte of every segment into the block's shared buffer and drops it, the
    /// first thread issuing each copy, [`COPY_SLOTS`] in flight, an mbarrier a slot. With a
    /// partition map, jobs as in `read_by_partition` (claimed by each partition's blocks); else
    /// block b copies segments b, b + blocks, ... whole.
    ///
    /// # Safety
    /// As `read_segments`; with `p.partitions`, as `read_by_partition`.
    #[inline(always)]
    pub(super) unsafe fn copy_segments(p: &PrefetchParams) {
        const SLOT_BYTES: u32 = COPY_SLOTS * COPY_BYTES;
        let buf = shared_buffer::<{ SLOT_BYTES + 8 * COPY_SLOTS }>();
        if thread_in_block() != 0 {
            return;
        }
        let bars = buf + SLOT_BYTES;
        for s in 0..COPY_SLOTS {
            // SAFETY: the slot's own 8-byte word after the copies' slots, used by this thread
            // alone.
            unsafe { mbarrier_init(bars + 8 * s, 1) };
        }
        fence_mbarrier_init();
        let jobs = p.n * JOBS_PER_SEGMENT;
        let partitioned = p.partitions != 0;
        let part = if partitioned {
            // SAFETY: the host's map, as this function requires.
            unsafe { partition(p) }
        } else {
            0
        };
        let twice = jobs - (p.once_jobs as u64).min(jobs);
        let mut next = block() as u64;
        let mut issued = 0u32;
        loop {
            // Partitioned: a job of `LOADS_JOB` bytes claimed by the partition's blocks (the
            // plan's segments are at most 512 KiB). Else a whole segment of any size, block b
            // taking segments b, b + blocks, ...
            let (s, mut at, end) = if partitioned {
                // SAFETY: the host's claims, as this function requires.
                let job = unsafe { claim(p, part, twice) as u64 };
                if job >= jobs {
                    break;
                }
                let lo = (job % JOBS_PER_SEGMENT) * LOADS_JOB;
                (job / JOBS_PER_SEGMENT, lo, lo + LOADS_JOB)
            } else {
                if next >= p.n {
                    break;
                }
                next += blocks() as u64;
                (next - blocks() as u64, 0, u64::MAX)
            };
            // SAFETY: s < n, so segment s lies in the table the host validated.
            let (address, bytes) = unsafe { segment(p, s) };
            let end = bytes.min(end);
            while at < end {
                let size = (end - at).min(COPY_BYTES as u64) as u32;
                let slot = issued % COPY_SLOTS;
                let bar = bars + 8 * slot;
                // SAFETY: the slot's mbarrier and bytes: its previous copy (phase
                // issued / COPY_SLOTS - 1) is awaited before the slot is reused; the segment
                // is 16-byte aligned and sized (the host's), so are `at` and `size`.
                unsafe {
                    if issued >= COPY_SLOTS {
                        mbarrier_wait(bar, (issued / COPY_SLOTS - 1) % 2);
                    }
                    mbarrier_expect_tx(bar, size);
                    bulk_load(buf + slot * COPY_BYTES, address + at, size, bar);
                    mbarrier_arrive(bar);
                }
                issued += 1;
                at += size as u64;
            }
        }
        // The copies still in flight land before the block (and its shared buffer) ends.
        for k in issued.saturating_sub(COPY_SLOTS)..issued {
            // SAFETY: the phase of slot k % COPY_SLOTS that copy k completes.
            unsafe { mbarrier_wait(bars + 8 * (k % COPY_SLOTS), (k / COPY_SLOTS) % 2) };
        }
        if partitioned {
            // SAFETY: the host's claims; this block's last claim is behind it.
            unsafe { release_claims(p) };
        }
    }

    /// The L2 partition probe; see `PartitionProbeParams`.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn l2_partition_probe(p: PartitionProbeParams) {
        if thread_in_block() != 0 {
            return;
        }
        let sm = sm_id();
        if sm >= p.sms {
            return;
        }
        let me = if p.mode == 0 { 0 } else { sm };
        if p.mode == 0 && sm != 0 {
            return;
        }
        // SAFETY: the claims hold one u32 per SM (`sms` of them).
        if unsafe { atomic_exch_u32(p.claims + 4 * me as u64, 1) } != 0 {
            return;
        }
        let (first, count) = if p.mode == 0 {
            (0, p.per_sm as u64 * p.sms as u64)
        } else {
            (sm as u64 * p.per_sm as u64, p.per_sm as u64)
        };
        let mut carry = 0u64;
        let t0 = clock();
        for i in first..first + count {
            // SAFETY: line i < per_sm * sms lies in the host's buffer; `carry` is 0 (mask 0)
            // at run time, so the address stays the line's while depending on the last load.
            let v = unsafe { load_l2_8(p.lines + i * PROBE_LINE_STRIDE + carry) };
            carry = (v[0] & p.mask) as u64;
        }
        let cycles = (clock() - t0) / count.max(1) + carry;
        if p.mode == 1 {
            // SAFETY: out holds two u32 per SM; this block alone claimed SM `sm`.
            unsafe { store_v2_u32(p.out + 8 * sm as u64, [cycles as u32, 1]) };
        }
    }

    /// The SM's cycle counter (`%clock64`).
    #[inline(always)]
    fn clock() -> u64 {
        let c: u64;
        // SAFETY: reading a special register has no preconditions.
        unsafe {
            core::arch::asm!("mov.u64 {0}, %clock64;", out(reg64) c,
                options(nomem, nostack, preserves_flags));
        }
        c
    }

    #[inline(always)]
    fn xor(a: [u32; 4], b: [u32; 4]) -> [u32; 4] {
        [a[0] ^ b[0], a[1] ^ b[1], a[2] ^ b[2], a[3] ^ b[3]]
    }
}
