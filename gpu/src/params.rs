//! Launch parameters: one `#[repr(C)]` struct per kernel family, passed by value as the kernel's
//! only argument. Addresses are plain `u64` device addresses (device memory, or pinned host memory
//! mapped for the device) so that the structs are `Copy` and identical on both sides.

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
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GatherParams {
    /// Address of row 0: device memory or mapped pinned host memory, 16-byte aligned.
    pub table: u64,
    /// `*const i64`, `n` ids.
    pub ids: u64,
    /// `*mut u8`, `n * row_bytes` bytes, 16-byte aligned.
    pub out: u64,
    /// `*mut IdStatus`.
    pub status: u64,
    pub n: u64,
    pub rows: u64,
    /// A multiple of [`CHUNK_BYTES`].
    pub row_bytes: u32,
    pub _pad: u32,
}

/// `out[i] = bf16(e4m3(weights[ids[i]]) * 2^(scales[ids[i]] - 127))`, MX block of 32.
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
    /// `*mut IdStatus`.
    pub status: u64,
    pub n: u64,
    pub rows: u64,
    /// Elements per row, a multiple of [`MX_BLOCK`].
    pub dim: u32,
    pub _pad: u32,
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
    pub _pad: u32,
}
