//! Launch parameters: one `#[repr(C)]` struct per kernel family, passed by value as the kernel's
//! only argument. Addresses are plain `u64` device addresses (device memory, or pinned host memory
//! mapped for the device) so that the structs are `Copy` and identical on both sides. The kernels that
//! the device timeline records end theirs with a [`TimelineParams`].

pub use crate::timeline::TimelineParams;

/// Bytes every gather moves per vector access; row widths are multiples of it.
pub const CHUNK_BYTES: u32 = 16;

/// FP8 elements that share one E8M0 scale (OCP MX block size).
pub const MX_BLOCK: u32 = 32;

/// Where a launch records ids outside `0..rows`: how many, and the smallest position holding one.
/// The host resets it to [`IdStatus::CLEAN`] before first use and after reading it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdStatus {
    /// Number of ids outside `0..rows` (saturates at `u32::MAX` only in theory: n < 2^32).
    pub bad: u32,
    pub _pad: u32,
    /// Smallest position `i` with `ids[i]` outside `0..rows`; `u64::MAX` when there is none.
    pub first_index: u64,
}

impl IdStatus {
    pub const CLEAN: IdStatus = IdStatus {
        bad: 0,
        _pad: 0,
        first_index: u64::MAX,
    };
}

/// `out[i] = table[ids[i]]`, rows of `row_bytes` bytes.
///
/// The fields a launch reads on its way to the first row fill the first 48 bytes: a kernel's
/// parameters start 16 bytes into a 64-byte line of its constant bank, and on the H200 a launch
/// replayed from a graph whose kernel reads one more line takes 0.03 us longer at 72 rows and 0.05
/// us at 4096 (`benches/cuda/param_block_probe.cu`). `status` is written only for a bad id, and
/// `timeline` only by the recording entries, so they come after.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GatherParams {
    /// Address of row 0: device memory or mapped pinned host memory, 16-byte aligned.
    pub table: u64,
    /// `*const i64`, `n` ids.
    pub ids: u64,
    /// `*mut u8`, `n * row_bytes` bytes, 16-byte aligned.
    pub out: u64,
    pub n: u64,
    pub rows: u64,
    /// A multiple of [`CHUNK_BYTES`].
    pub row_bytes: u32,
    pub _pad: u32,
    /// `*mut IdStatus`.
    pub status: u64,
    /// The device timeline (`TimelineParams::OFF`: not recorded).
    pub timeline: TimelineParams,
}

/// `out[i] = bf16(e4m3(weights[ids[i]]) * 2^(scales[ids[i]] - 127))`, MX block of 32.
///
/// As in [`GatherParams`], what a launch reads before its first row fills the first 48 bytes,
/// which is why `n` is 32 bits here (the host refuses calls of 2^32 rows or more).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DequantParams {
    /// `[rows, dim]` FP8-E4M3 bytes, 16-byte aligned rows.
    pub weights: u64,
    /// `[rows, dim / 32]` E8M0 bytes.
    pub scales: u64,
    /// `*const i64`, `n` ids.
    pub ids: u64,
    /// `[n, dim]` bf16, 16-byte aligned.
    pub out: u64,
    pub rows: u64,
    pub n: u32,
    /// Elements per row, a multiple of [`MX_BLOCK`].
    pub dim: u32,
    /// `*mut IdStatus`.
    pub status: u64,
    /// The device timeline (`TimelineParams::OFF`: not recorded).
    pub timeline: TimelineParams,
}

/// The prefetcher's gather of staged rows that waits for them (`staged::KERNEL`): staged row `i`
/// (`weights`/`scales` as in [`DequantParams`], rows `0..n`) is the row of id `ids[i]` once
/// `tags[i] == ids[i]`; the side stream writes the tags after the rows.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StagedParams {
    /// `[n, dim]` FP8-E4M3 bytes, 16-byte aligned rows.
    pub weights: u64,
    /// `[n, dim / 32]` E8M0 bytes.
    pub scales: u64,
    /// `*const i64`, the id each staged row holds, written after the rows.
    pub tags: u64,
    /// `*const i64`, the `n` ids asked for.
    pub ids: u64,
    /// `[n, dim]` bf16, 16-byte aligned.
    pub out: u64,
    /// `*mut IdStatus`: the rows whose tag did not arrive within `timeout_ns` (written as zeros).
    pub late: u64,
    pub n: u64,
    /// Nanoseconds a row waits for its tag before it is given up.
    pub timeout_ns: u64,
    /// Elements per row, a multiple of [`MX_BLOCK`].
    pub dim: u32,
    pub _pad: u32,
    /// The device timeline (`TimelineParams::OFF`: not recorded).
    pub timeline: TimelineParams,
}

/// One span of memory to pull into L2: `bytes` from `address`, both multiples of 16.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub address: u64,
    pub bytes: u64,
}

/// `segments[0..n]` prefetched in chunks of `chunk` bytes (a multiple of 16).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PrefetchParams {
    /// `*const Segment`.
    pub segments: u64,
    pub n: u64,
    pub chunk: u32,
    /// With `partitions`: the last `once_jobs` jobs (`LOADS_JOB` bytes of a segment each) are
    /// read by one partition's blocks only, the rest by both's. 0: every byte by both.
    pub once_jobs: u32,
    /// `l2_prefetch_loads` only: the device address of a [`SmPartitions`] map, one byte per SM
    /// naming its L2 partition (0 or 1); each partition's blocks then read every byte but the
    /// `once_jobs` tail, so that both partitions hold the lines. 0: no map, each byte read once.
    pub partitions: u64,
    /// With `partitions`: the device address of the launch's [`PrefetchClaims`] (zero before
    /// the first launch; the launch's last block zeroes it again).
    pub claims: u64,
    /// The device timeline (`TimelineParams::OFF`: not recorded).
    pub timeline: TimelineParams,
}

/// Bytes of a partition map (one per SM, SMs up to this many).
pub const MAX_SMS: usize = 256;

/// The L2 partition of each SM, as `l2_prefetch_loads` reads it ([`PrefetchParams::partitions`]).
pub type SmPartitions = [u8; MAX_SMS];

/// A partitioned `l2_prefetch_loads` launch's work counters: the next job of each partition's
/// blocks, and the blocks that finished.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefetchClaims {
    pub next: [u32; 2],
    pub done: u32,
    /// The next of the jobs read once (`PrefetchParams::once_jobs`), whichever partition claims it.
    pub next_once: u32,
}

/// The L2 partition probe (`l2_partition_probe`): lines `LINE_STRIDE` bytes apart at `lines`,
/// `per_sm` of them for each SM. Mode 0: the block that claims SM 0 reads every line. Mode 1:
/// the first block on each SM `s` chases its own `per_sm` lines (each load's address depends
/// on the one before through `mask`, which the host sets to 0) and stores the mean cycles a hop
/// at `out[s]` (u32).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PartitionProbeParams {
    pub lines: u64,
    pub out: u64,
    /// One u32 per SM, zero before the launch: which SMs a block has claimed.
    pub claims: u64,
    pub per_sm: u32,
    pub sms: u32,
    pub mode: u32,
    pub mask: u32,
}

/// Bytes between the probe's lines.
pub const PROBE_LINE_STRIDE: u64 = 1024;

/// The device record of a check-mode comparison: how many compared pairs of buffers differed.
/// The host zeroes it once; launches keep `mismatch` and `blocks_done` at zero between them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckCounter {
    /// Launches whose two buffers differed (what the host reads).
    pub differed: u32,
    /// Set by any block of the running launch that saw a difference.
    pub mismatch: u32,
    /// Blocks of the running launch that finished; the last one folds `mismatch` into `differed`.
    pub blocks_done: u32,
    pub _pad: u32,
}

/// Compares `a` and `b`, `chunks` 16-byte chunks each, bit for bit, and counts one difference per
/// launch into the `CheckCounter` at `counter`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CheckParams {
    /// 16-byte aligned.
    pub a: u64,
    /// 16-byte aligned.
    pub b: u64,
    pub chunks: u64,
    /// `*mut CheckCounter`.
    pub counter: u64,
}

/// `ids[t * heads + h] = row_start + hash(seed, h, tokens[t + 1 - ngram ..= t]) % rows`, tokens
/// before the start of the stream read as 0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HashParams {
    /// `*const u32`, `n_tokens` tokens.
    pub tokens: u64,
    /// `*mut i64`, `n_tokens * heads` ids.
    pub ids: u64,
    pub n_tokens: u64,
    pub seed: u64,
    /// First row of this layer's slice of the table.
    pub row_start: u64,
    /// Rows in this layer's slice (a zero is read as one).
    pub rows: u64,
    pub heads: u32,
    /// Tokens hashed per id, 1 to [`MAX_NGRAM`].
    pub ngram: u32,
}

/// The longest n-gram the hash kernel reads.
pub const MAX_NGRAM: u32 = 8;

/// Keeps every thread of the grid busy for `nanos` nanoseconds of the device clock: stands in for
/// the model's compute between Engram layers.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SpinParams {
    pub nanos: u64,
    /// The device timeline (`TimelineParams::OFF`: not recorded).
    pub timeline: TimelineParams,
}

/// `y[m, n] = sum_k x[m, k] * w[n, k]` (bf16 in, f32 accumulate and out), for `m <= 16`.
///
/// With `splits > 1` each split of K writes `partial[s, m, n]`; the last warp of a row group to
/// finish (counted in `counters`) sums its splits in split order into `y` and resets its counter,
/// so the result is deterministic and one launch does it all. With one split the product goes
/// straight to `y`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GemvParams {
    /// `[m, k]` bf16, 16-byte aligned.
    pub x: u64,
    /// `[n, k]` bf16, 16-byte aligned: the weights, read once.
    pub w: u64,
    /// `[splits, m, n]` f32 (unused with one split).
    pub partial: u64,
    /// `[m, n]` f32.
    pub y: u64,
    /// `[n / 16]` u32, zero before the first launch; each launch leaves them zero again
    /// (unused with one split).
    pub counters: u64,
    /// Rows of `x`, 1..=16.
    pub m: u32,
    /// Rows of `w`, a multiple of [`GEMV_ROWS_PER_WARP`].
    pub n: u32,
    /// A multiple of `GEMV_K_STEP * splits`.
    pub k: u32,
    pub splits: u32,
    /// The device timeline (`TimelineParams::OFF`: not recorded).
    pub timeline: TimelineParams,
}

/// Weight rows one warp's tensor-core tile covers.
pub const GEMV_ROWS_PER_WARP: u32 = 16;
/// Elements of K one warp consumes per step (4 lanes x 8 bf16 per weight row).
pub const GEMV_K_STEP: u32 = 32;

/// A stand-in for a communication collective: `blocks` CTAs whose thread 0 polls `flag` until
/// `ns` nanoseconds of the global timer have passed, leaving the rest of the GPU idle; then,
/// as an all-reduce ends by writing its result where the next kernel reads it, every thread
/// rewrites its share of `out_bytes` at `out` in place (same values).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CollectiveParams {
    pub ns: u64,
    /// `*const u32` polled every iteration (0: poll nothing, just the timer).
    pub flag: u64,
    /// The collective's output (16-byte aligned; 0 with `out_bytes` 0: nothing written).
    pub out: u64,
    /// A multiple of 16.
    pub out_bytes: u64,
    /// The device timeline (`TimelineParams::OFF`: not recorded).
    pub timeline: TimelineParams,
}
