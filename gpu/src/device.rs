//! The few device primitives the kernels need, each one PTX instruction. Inline assembly fixes
//! the exact access width and cache behaviour, which LLVM would otherwise choose.
use core::arch::asm;
use core::arch::nvptx;

/// Index of this thread in the whole grid (x dimension).
#[inline(always)]
pub fn global_thread() -> u64 {
    // SAFETY: reading special registers has no preconditions.
    unsafe {
        nvptx::_block_idx_x() as u64 * nvptx::_block_dim_x() as u64 + nvptx::_thread_idx_x() as u64
    }
}

/// Threads in the whole grid (x dimension).
#[inline(always)]
pub fn grid_threads() -> u64 {
    // SAFETY: reading special registers has no preconditions.
    unsafe { nvptx::_grid_dim_x() as u64 * nvptx::_block_dim_x() as u64 }
}

#[inline(always)]
pub fn thread_in_block() -> u32 {
    // SAFETY: reading special registers has no preconditions.
    unsafe { nvptx::_thread_idx_x() as u32 }
}

#[inline(always)]
pub fn block() -> u32 {
    // SAFETY: reading special registers has no preconditions.
    unsafe { nvptx::_block_idx_x() as u32 }
}

#[inline(always)]
pub fn blocks() -> u32 {
    // SAFETY: reading special registers has no preconditions.
    unsafe { nvptx::_grid_dim_x() as u32 }
}

#[inline(always)]
pub fn threads_in_block() -> u32 {
    // SAFETY: reading special registers has no preconditions.
    unsafe { nvptx::_block_dim_x() as u32 }
}

/// 16 bytes read once: through the non-coherent path, not kept in L1, with a 256-byte L2 fetch
/// (a 256-byte row then costs one DRAM burst however its chunks are spread over the warp).
///
/// # Safety
/// `addr` is a readable, 16-byte aligned global address that nothing writes during the kernel.
#[inline(always)]
pub unsafe fn load_stream_16(addr: u64) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees a readable, aligned, read-only address.
    unsafe {
        asm!(
            "ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {{{0}, {1}, {2}, {3}}}, [{4}];",
            out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d,
            in(reg64) addr,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    [a, b, c, d]
}

/// Cache hints for a 16-byte table read; the benches decide which pays.
pub mod hint {
    /// `ld.global.nc`, no hints.
    pub const PLAIN: u8 = 0;
    /// `.L1::no_allocate`: the line is not kept in L1.
    pub const L1_BYPASS: u8 = 1;
    /// `.L1::no_allocate.L2::256B`: not kept in L1, and L2 fetches the whole 256-byte block.
    pub const STREAM: u8 = 2;
    /// `ld.global` (the coherent path, through L1), no hints.
    pub const COHERENT: u8 = 3;
    /// `ld.global.nc.L2::128B`: L2 fetches the whole 128-byte line.
    pub const L2_128: u8 = 4;
    /// `ld.global.nc.L2::256B`: L2 fetches the whole 256-byte block; L1 as usual.
    pub const L2_256: u8 = 5;
}

/// One `v4.u32` load of 16 bytes with the given instruction (its cache qualifiers spelled out).
///
/// Expands inside an `unsafe` block whose caller guarantees a readable, 16-byte aligned address
/// that nothing writes during the kernel.
macro_rules! load_v4 {
    ($instruction:literal, $addr:expr) => {{
        let (a, b, c, d): (u32, u32, u32, u32);
        asm!(
            concat!($instruction, ".v4.u32 {{{0}, {1}, {2}, {3}}}, [{4}];"),
            out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d,
            in(reg64) $addr,
            options(pure, readonly, nostack, preserves_flags),
        );
        [a, b, c, d]
    }};
}

/// 16 bytes read through the non-coherent path with the cache hints `HINT` (see [`hint`]).
///
/// # Safety
/// As [`load_stream_16`].
#[inline(always)]
pub unsafe fn load_hinted_16<const HINT: u8>(addr: u64) -> [u32; 4] {
    // SAFETY: the caller guarantees a readable, aligned, read-only address.
    unsafe {
        match HINT {
            hint::PLAIN => load_16(addr),
            hint::L1_BYPASS => load_v4!("ld.global.nc.L1::no_allocate", addr),
            hint::COHERENT => load_v4!("ld.global", addr),
            hint::L2_128 => load_v4!("ld.global.nc.L2::128B", addr),
            hint::L2_256 => load_v4!("ld.global.nc.L2::256B", addr),
            _ => load_stream_16(addr),
        }
    }
}

/// 8 read-only bytes through the non-coherent path with the cache hints `HINT` ([`hint::PLAIN`],
/// [`hint::L1_BYPASS`] or, for any other value, `.L1::no_allocate.L2::256B`).
///
/// # Safety
/// `addr` is a readable, 8-byte aligned global address that nothing writes during the kernel.
#[inline(always)]
pub unsafe fn load_hinted_8<const HINT: u8>(addr: u64) -> [u32; 2] {
    macro_rules! load_v2 {
        ($instruction:literal) => {{
            let (a, b): (u32, u32);
            asm!(
                concat!($instruction, ".v2.u32 {{{0}, {1}}}, [{2}];"),
                out(reg32) a, out(reg32) b, in(reg64) addr,
                options(pure, readonly, nostack, preserves_flags),
            );
            [a, b]
        }};
    }
    // SAFETY: the caller guarantees a readable, aligned, read-only address.
    unsafe {
        match HINT {
            hint::PLAIN => load_v2!("ld.global.nc"),
            hint::L1_BYPASS => load_v2!("ld.global.nc.L1::no_allocate"),
            _ => load_v2!("ld.global.nc.L1::no_allocate.L2::256B"),
        }
    }
}

/// 16 bytes written with an ordinary (write-back) store.
///
/// # Safety
/// `addr` is a writable, 16-byte aligned global address no other thread writes.
#[inline(always)]
pub unsafe fn store_16(addr: u64, v: [u32; 4]) {
    // SAFETY: the caller guarantees a writable, aligned address owned by this thread.
    unsafe {
        asm!(
            "st.global.v4.u32 [{0}], {{{1}, {2}, {3}, {4}}};",
            in(reg64) addr, in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3],
            options(nostack, preserves_flags),
        );
    }
}

/// 16 bytes written with a streaming (evict-first) store: output the next kernel reads once.
///
/// # Safety
/// As [`store_16`].
#[inline(always)]
pub unsafe fn store_16_streaming(addr: u64, v: [u32; 4]) {
    // SAFETY: the caller guarantees a writable, aligned address owned by this thread.
    unsafe {
        asm!(
            "st.global.cs.v4.u32 [{0}], {{{1}, {2}, {3}, {4}}};",
            in(reg64) addr, in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3],
            options(nostack, preserves_flags),
        );
    }
}

/// The id at `addr` when `live`, 0 otherwise: one predicated read-only load, no branch, so that
/// a thread past the call's end needs none before its first load (as the Triton peer masks).
/// Like the other `_if` loads it is kept where it is written: the compiler may not sink it
/// under a branch on `live`.
///
/// # Safety
/// When `live`: as [`load_i64`]. Otherwise `addr` is not read.
#[inline(always)]
pub unsafe fn load_i64_if(addr: u64, live: bool) -> i64 {
    let v: i64;
    // SAFETY: the caller guarantees the address when `live`; nothing is read otherwise.
    unsafe {
        asm!(
            "{{ .reg .pred p; setp.ne.u32 p, {2}, 0; mov.b64 {0}, 0; @p ld.global.nc.s64 {0}, [{1}]; }}",
            out(reg64) v, in(reg64) addr, in(reg32) live as u32,
            options(readonly, nostack, preserves_flags),
        );
    }
    v
}

/// 8 read-only bytes at `addr` when `live`, zeros otherwise (one predicated load).
///
/// # Safety
/// When `live`: as [`load_hinted_8`]. Otherwise `addr` is not read.
#[inline(always)]
pub unsafe fn load_8_if(addr: u64, live: bool) -> [u32; 2] {
    let (a, b): (u32, u32);
    // SAFETY: the caller guarantees the address when `live`; nothing is read otherwise.
    unsafe {
        asm!(
            "{{ .reg .pred p; setp.ne.u32 p, {3}, 0; mov.b32 {0}, 0; mov.b32 {1}, 0;",
            "@p ld.global.nc.v2.u32 {{{0}, {1}}}, [{2}]; }}",
            out(reg32) a, out(reg32) b, in(reg64) addr, in(reg32) live as u32,
            options(readonly, nostack, preserves_flags),
        );
    }
    [a, b]
}

/// 4 read-only bytes at `addr` when `live`, zeros otherwise (one predicated load).
///
/// # Safety
/// When `live`: `addr` is a readable, 4-byte aligned global address that nothing writes during
/// the kernel. Otherwise `addr` is not read.
#[inline(always)]
pub unsafe fn load_4_if(addr: u64, live: bool) -> u32 {
    let v: u32;
    // SAFETY: the caller guarantees the address when `live`; nothing is read otherwise.
    unsafe {
        asm!(
            "{{ .reg .pred p; setp.ne.u32 p, {2}, 0; mov.b32 {0}, 0; @p ld.global.nc.u32 {0}, [{1}]; }}",
            out(reg32) v, in(reg64) addr, in(reg32) live as u32,
            options(readonly, nostack, preserves_flags),
        );
    }
    v
}

/// The read-only byte at `addr` when `live`, `otherwise` when not (one predicated load).
///
/// # Safety
/// When `live`: as [`load_u8`]. Otherwise `addr` is not read.
#[inline(always)]
pub unsafe fn load_u8_if(addr: u64, live: bool, otherwise: u8) -> u8 {
    let v: u16;
    // SAFETY: the caller guarantees the address when `live`; nothing is read otherwise.
    unsafe {
        asm!(
            "{{ .reg .pred p; setp.ne.u32 p, {3}, 0; mov.u16 {0}, {2}; @p ld.global.nc.u8 {0}, [{1}]; }}",
            out(reg16) v, in(reg64) addr, in(reg16) otherwise as u16, in(reg32) live as u32,
            options(readonly, nostack, preserves_flags),
        );
    }
    v as u8
}

/// 16 read-only bytes at `addr` when `live`, zeros otherwise (one predicated load).
///
/// # Safety
/// When `live`: as [`load_hinted_16`]. Otherwise `addr` is not read.
#[inline(always)]
pub unsafe fn load_16_if(addr: u64, live: bool) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees the address when `live`; nothing is read otherwise.
    unsafe {
        asm!(
            "{{ .reg .pred p; setp.ne.u32 p, {5}, 0;",
            "mov.b32 {0}, 0; mov.b32 {1}, 0; mov.b32 {2}, 0; mov.b32 {3}, 0;",
            "@p ld.global.nc.v4.u32 {{{0}, {1}, {2}, {3}}}, [{4}]; }}",
            out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg64) addr,
            in(reg32) live as u32,
            options(readonly, nostack, preserves_flags),
        );
    }
    [a, b, c, d]
}

/// 8 bytes stored at `addr` when `live` (one predicated store, no branch).
///
/// # Safety
/// When `live`: as [`store_v2_u32`]. Otherwise nothing is written.
#[inline(always)]
pub unsafe fn store_8_if(addr: u64, v: [u32; 2], live: bool) {
    // SAFETY: the caller guarantees the address when `live`; nothing is written otherwise.
    unsafe {
        asm!(
            "{{ .reg .pred p; setp.ne.u32 p, {3}, 0; @p st.global.v2.u32 [{0}], {{{1}, {2}}}; }}",
            in(reg64) addr, in(reg32) v[0], in(reg32) v[1], in(reg32) live as u32,
            options(nostack, preserves_flags),
        );
    }
}

/// 16 bytes stored at `addr` when `live` (one predicated store, no branch).
///
/// # Safety
/// When `live`: as [`store_16`]. Otherwise nothing is written.
#[inline(always)]
pub unsafe fn store_16_if(addr: u64, v: [u32; 4], live: bool) {
    // SAFETY: the caller guarantees the address when `live`; nothing is written otherwise.
    unsafe {
        asm!(
            "{{ .reg .pred p; setp.ne.u32 p, {5}, 0;",
            "@p st.global.v4.u32 [{0}], {{{1}, {2}, {3}, {4}}}; }}",
            in(reg64) addr, in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3],
            in(reg32) live as u32,
            options(nostack, preserves_flags),
        );
    }
}

/// One read-only 8-byte load (ids), through the non-coherent path.
///
/// # Safety
/// `addr` is a readable, 8-byte aligned global address that nothing writes during the kernel.
#[inline(always)]
pub unsafe fn load_i64(addr: u64) -> i64 {
    let v: i64;
    // SAFETY: the caller guarantees a readable, aligned, read-only address.
    unsafe {
        asm!("ld.global.nc.s64 {0}, [{1}];", out(reg64) v, in(reg64) addr,
             options(pure, readonly, nostack, preserves_flags));
    }
    v
}

/// As [`load_i64`], but kept where it is written: the compiler may not sink it to its first
/// use, so a load meant to overlap other work is issued early.
///
/// # Safety
/// As [`load_i64`].
#[inline(always)]
pub unsafe fn load_i64_early(addr: u64) -> i64 {
    let v: i64;
    // SAFETY: the caller guarantees a readable, aligned, read-only address.
    unsafe {
        asm!("ld.global.nc.s64 {0}, [{1}];", out(reg64) v, in(reg64) addr,
             options(readonly, nostack, preserves_flags));
    }
    v
}

/// `v` of lane `src` of this warp; every lane of the warp must execute it together.
#[inline(always)]
pub fn shuffle_i64(v: i64, src: u32) -> i64 {
    let (lo, hi): (u32, u32);
    // SAFETY: a register exchange among the warp's lanes, all of which execute it (the callers
    // call it unconditionally in warp-uniform control flow).
    unsafe {
        asm!(
            "shfl.sync.idx.b32 {0}, {2}, {4}, 31, -1;",
            "shfl.sync.idx.b32 {1}, {3}, {4}, 31, -1;",
            out(reg32) lo, out(reg32) hi,
            in(reg32) v as u32, in(reg32) (v >> 32) as u32, in(reg32) src,
            options(nomem, nostack, preserves_flags),
        );
    }
    (lo as u64 | (hi as u64) << 32) as i64
}

/// One read-only 8-byte load (ids) through the path `HINT` picks: the coherent `ld.global`
/// for [`hint::COHERENT`], the non-coherent one ([`load_i64`]) for any other.
///
/// # Safety
/// As [`load_i64`].
#[inline(always)]
pub unsafe fn load_i64_hinted<const HINT: u8>(addr: u64) -> i64 {
    if HINT != hint::COHERENT {
        // SAFETY: the caller's guarantee, passed on.
        return unsafe { load_i64(addr) };
    }
    let v: i64;
    // SAFETY: the caller guarantees a readable, aligned, read-only address.
    unsafe {
        asm!("ld.global.s64 {0}, [{1}];", out(reg64) v, in(reg64) addr,
             options(pure, readonly, nostack, preserves_flags));
    }
    v
}

/// One read-only byte (an E8M0 scale), through the non-coherent path.
///
/// # Safety
/// `addr` is a readable global address that nothing writes during the kernel.
#[inline(always)]
pub unsafe fn load_u8(addr: u64) -> u8 {
    let v: u16;
    // SAFETY: the caller guarantees a readable, read-only address.
    unsafe {
        asm!("ld.global.nc.u8 {0}, [{1}];", out(reg16) v, in(reg64) addr,
             options(pure, readonly, nostack, preserves_flags));
    }
    v as u8
}

/// Records that position `index` held an id outside `0..rows`.
///
/// # Safety
/// `status` is the address of a writable `IdStatus`.
#[inline(always)]
pub unsafe fn record_bad_id(status: u64, index: u64) {
    // SAFETY: `status` points at an IdStatus: `bad` at +0 (u32), `first_index` at +8 (u64).
    unsafe {
        asm!(
            "red.global.add.u32 [{0}], 1;",
            "red.global.min.u64 [{0}+8], {1};",
            in(reg64) status, in(reg64) index,
            options(nostack, preserves_flags),
        );
    }
}

/// Asks L2 to fetch `bytes` (a multiple of 16) from the 16-byte aligned global `addr`.
///
/// # Safety
/// `addr..addr + bytes` lies in one valid global allocation.
#[inline(always)]
pub unsafe fn prefetch_l2(addr: u64, bytes: u32) {
    // SAFETY: the caller guarantees the span is valid; a prefetch never writes.
    unsafe {
        asm!("cp.async.bulk.prefetch.L2.global [{0}], {1};", in(reg64) addr, in(reg32) bytes,
             options(nostack, preserves_flags));
    }
}

/// Asks L2 for the 128-byte line holding `addr` (no size or alignment rule).
///
/// # Safety
/// `addr` lies in a valid global allocation.
#[inline(always)]
pub unsafe fn prefetch_line_l2(addr: u64) {
    // SAFETY: the caller guarantees the address is valid; a prefetch never writes.
    unsafe {
        asm!("prefetch.global.L2 [{0}];", in(reg64) addr, options(nostack, preserves_flags));
    }
}

/// The same prefetch, asking L2 to keep the lines with evict_last priority.
///
/// # Safety
/// As [`prefetch_l2`]; `policy` comes from [`evict_last_policy`].
#[inline(always)]
pub unsafe fn prefetch_l2_evict_last(addr: u64, bytes: u32, policy: u64) {
    // SAFETY: the caller guarantees the span is valid; a prefetch never writes.
    unsafe {
        asm!("cp.async.bulk.prefetch.L2.global.L2::cache_hint [{0}], {1}, {2};",
             in(reg64) addr, in(reg32) bytes, in(reg64) policy,
             options(nostack, preserves_flags));
    }
}

/// A cache policy that marks every line it covers evict_last.
#[inline(always)]
pub fn evict_last_policy() -> u64 {
    let p: u64;
    // SAFETY: createpolicy only computes a value.
    unsafe {
        asm!("createpolicy.fractional.L2::evict_last.b64 {0}, 1.0;", out(reg64) p,
             options(pure, nomem, nostack, preserves_flags));
    }
    p
}

/// Two E4M3 bytes (low byte first) to two f16 (low half from the low byte), exactly.
#[inline(always)]
pub fn e4m3x2_to_f16x2(pair: u16) -> u32 {
    let r: u32;
    // SAFETY: a pure register conversion (sm_89 and later).
    unsafe {
        asm!("cvt.rn.f16x2.e4m3x2 {0}, {1};", out(reg32) r, in(reg16) pair,
             options(pure, nomem, nostack, preserves_flags));
    }
    r
}

/// f16 bits to f32, exactly.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let r: f32;
    // SAFETY: a pure register conversion.
    unsafe {
        asm!("cvt.f32.f16 {0}, {1};", out(reg32) r, in(reg16) h,
             options(pure, nomem, nostack, preserves_flags));
    }
    r
}

/// Byte permute: bytes of `a` (0..4) and `b` (4..8) picked by the nibbles of `selector`.
#[inline(always)]
pub fn permute_bytes(a: u32, b: u32, selector: u32) -> u32 {
    let r: u32;
    // SAFETY: a pure register operation.
    unsafe {
        asm!("prmt.b32 {0}, {1}, {2}, {3};", out(reg32) r, in(reg32) a, in(reg32) b, in(reg32) selector,
             options(pure, nomem, nostack, preserves_flags));
    }
    r
}

/// Packed bf16 multiply, one rounding to nearest even, subnormals kept: `mul.rn.bf16x2` on
/// sm_90 and later; before, `fma.rn.bf16x2` adding -0 (sm_80), which gives the same bits: the
/// exact product rounded once, and `x + -0 = x` for every x, zeros' signs included.
#[inline(always)]
pub fn mul_bf16x2(a: u32, b: u32) -> u32 {
    let r: u32;
    // SAFETY: a pure register operation.
    #[cfg(fetchahead_sm90)]
    unsafe {
        asm!("mul.rn.bf16x2 {0}, {1}, {2};", out(reg32) r, in(reg32) a, in(reg32) b,
             options(pure, nomem, nostack, preserves_flags));
    }
    // SAFETY: a pure register operation.
    #[cfg(not(fetchahead_sm90))]
    unsafe {
        asm!("fma.rn.bf16x2 {0}, {1}, {2}, {3};", out(reg32) r, in(reg32) a, in(reg32) b,
             in(reg32) NEG_ZERO_BF16X2, options(pure, nomem, nostack, preserves_flags));
    }
    r
}

/// Two bf16 -0.
#[cfg(not(fetchahead_sm90))]
const NEG_ZERO_BF16X2: u32 = 0x8000_8000;

/// Two f32 to packed bf16, round to nearest even, subnormals kept: `lo` in bits 0..16.
#[inline(always)]
pub fn f32x2_to_bf16x2(lo: f32, hi: f32) -> u32 {
    let r: u32;
    // SAFETY: a pure register conversion (sm_80 and later).
    unsafe {
        asm!("cvt.rn.bf16x2.f32 {0}, {1}, {2};", out(reg32) r, in(reg32) hi, in(reg32) lo,
             options(pure, nomem, nostack, preserves_flags));
    }
    r
}

/// 16 read-only bytes through the non-coherent path, kept in L1: for small operands every warp
/// re-reads (a GEMV's activations).
///
/// # Safety
/// `addr` is a readable, 16-byte aligned global address that nothing writes during the kernel.
#[inline(always)]
pub unsafe fn load_16(addr: u64) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees a readable, aligned, read-only address.
    unsafe {
        asm!(
            "ld.global.nc.v4.u32 {{{0}, {1}, {2}, {3}}}, [{4}];",
            out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d,
            in(reg64) addr,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    [a, b, c, d]
}

/// One f32 written with an ordinary store.
///
/// # Safety
/// `addr` is a writable, 4-byte aligned global address no other thread writes.
#[inline(always)]
pub unsafe fn store_f32(addr: u64, v: f32) {
    // SAFETY: the caller guarantees a writable, aligned address owned by this thread.
    unsafe {
        asm!("st.global.f32 [{0}], {1};", in(reg64) addr, in(reg32) v,
             options(nostack, preserves_flags));
    }
}

/// `d = a * b + c` for one warp: A 16x16 bf16 (row), B 16x8 bf16 (col), C and D 16x8 f32.
/// Fragments in the PTX ISA's m16n8k16 layout; every lane of the warp must execute it.
#[inline(always)]
pub fn mma_16x8x16_bf16(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    let (d0, d1, d2, d3): (f32, f32, f32, f32);
    // SAFETY: a register-only warp instruction (sm_80 and later); callers keep the warp converged.
    unsafe {
        asm!(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 \
             {{{0}, {1}, {2}, {3}}}, {{{4}, {5}, {6}, {7}}}, {{{8}, {9}}}, {{{10}, {11}, {12}, {13}}};",
            out(reg32) d0, out(reg32) d1, out(reg32) d2, out(reg32) d3,
            in(reg32) a[0], in(reg32) a[1], in(reg32) a[2], in(reg32) a[3],
            in(reg32) b[0], in(reg32) b[1],
            in(reg32) c[0], in(reg32) c[1], in(reg32) c[2], in(reg32) c[3],
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    [d0, d1, d2, d3]
}

/// The global nanosecond timer.
#[inline(always)]
pub fn global_timer_ns() -> u64 {
    let t: u64;
    // SAFETY: reading a special register; volatile (no `pure`) so that every read happens.
    unsafe {
        asm!("mov.u64 {0}, %globaltimer;", out(reg64) t, options(nomem, nostack, preserves_flags));
    }
    t
}

/// One 4-byte load that bypasses L1, as a collective polls a flag another agent writes.
///
/// # Safety
/// `addr` is a readable, 4-byte aligned global address.
#[inline(always)]
pub unsafe fn load_volatile_u32(addr: u64) -> u32 {
    let v: u32;
    // SAFETY: the caller guarantees a readable, aligned address.
    unsafe {
        asm!("ld.volatile.global.u32 {0}, [{1}];", out(reg32) v, in(reg64) addr,
             options(readonly, nostack, preserves_flags));
    }
    v
}

/// An 8-byte load at GPU scope, relaxed: it reads the coherent value (never a stale L1 line),
/// as a kernel polls a word another agent writes, and loads of one thread may overlap.
///
/// # Safety
/// `addr` is a readable, 8-byte aligned global address.
#[inline(always)]
pub unsafe fn load_relaxed_i64(addr: u64) -> i64 {
    let v: i64;
    // SAFETY: the caller guarantees a readable, aligned address.
    unsafe {
        asm!("ld.relaxed.gpu.global.s64 {0}, [{1}];", out(reg64) v, in(reg64) addr,
             options(nostack, preserves_flags));
    }
    v
}

/// An 8-byte load cached in L2 only, for memory written during the kernel by another agent.
///
/// # Safety
/// `addr` is a readable, 8-byte aligned global address.
#[inline(always)]
pub unsafe fn load_l2_8(addr: u64) -> [u32; 2] {
    let (a, b): (u32, u32);
    // SAFETY: the caller guarantees a readable, aligned address.
    unsafe {
        asm!("ld.global.cg.v2.u32 {{{0}, {1}}}, [{2}];", out(reg32) a, out(reg32) b,
             in(reg64) addr, options(readonly, nostack, preserves_flags));
    }
    [a, b]
}

/// A byte load cached in L2 only, as [`load_l2_8`].
///
/// # Safety
/// `addr` is a readable global address.
#[inline(always)]
pub unsafe fn load_l2_u8(addr: u64) -> u8 {
    let v: u16;
    // SAFETY: the caller guarantees a readable address.
    unsafe {
        asm!("ld.global.cg.u8 {0}, [{1}];", out(reg16) v, in(reg64) addr,
             options(readonly, nostack, preserves_flags));
    }
    v as u8
}

/// Orders this thread's earlier memory operations before its later ones for the whole GPU
/// (release and acquire at once).
#[inline(always)]
pub fn fence_gpu() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.acq_rel.gpu;", options(nostack, preserves_flags)) }
}

/// Waits for every lane of the warp, ordering their memory operations (`bar.warp.sync`).
/// Every lane of the warp must execute it.
#[inline(always)]
pub fn warp_sync() {
    // SAFETY: a warp barrier over all 32 lanes; callers keep the warp converged.
    unsafe {
        asm!(
            "bar.warp.sync 0xffffffff;",
            options(nostack, preserves_flags)
        )
    }
}

/// Waits for every thread of the block, ordering their shared and global memory operations
/// (`bar.sync 0`). Every thread of the block must execute it.
#[inline(always)]
pub fn block_sync() {
    // SAFETY: a block barrier; callers reach it from every thread.
    unsafe { asm!("bar.sync 0;", options(nostack, preserves_flags)) }
}

/// Lane 0's `v`, in every lane. Every lane of the warp must execute it.
#[inline(always)]
pub fn warp_broadcast_lane0(v: u32) -> u32 {
    let r: u32;
    // SAFETY: a register-only warp shuffle over all 32 lanes; callers keep the warp converged.
    unsafe {
        asm!("shfl.sync.idx.b32 {0}, {1}, 0, 0x1f, 0xffffffff;", out(reg32) r, in(reg32) v,
             options(nomem, nostack, preserves_flags));
    }
    r
}

/// `*addr += 1` at GPU scope with acquire-release order; returns the old value.
///
/// # Safety
/// `addr` is a writable, 4-byte aligned global address.
#[inline(always)]
pub unsafe fn atomic_inc_acq_rel(addr: u64) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees a writable, aligned address.
    unsafe {
        asm!("atom.acq_rel.gpu.global.add.u32 {0}, [{1}], 1;", out(reg32) old, in(reg64) addr,
             options(nostack, preserves_flags));
    }
    old
}

/// A coherent f32 load at GPU scope (from L2, never a stale L1 line): for data other blocks
/// wrote during this kernel.
///
/// # Safety
/// `addr` is a readable, 4-byte aligned global address.
#[inline(always)]
pub unsafe fn load_relaxed_f32(addr: u64) -> f32 {
    let v: f32;
    // SAFETY: the caller guarantees a readable, aligned address.
    unsafe {
        asm!("ld.relaxed.gpu.global.f32 {0}, [{1}];", out(reg32) v, in(reg64) addr,
             options(readonly, nostack, preserves_flags));
    }
    v
}

/// A u32 store at GPU scope.
///
/// # Safety
/// `addr` is a writable, 4-byte aligned global address.
#[inline(always)]
pub unsafe fn store_relaxed_u32(addr: u64, v: u32) {
    // SAFETY: the caller guarantees a writable, aligned address.
    unsafe {
        asm!("st.relaxed.gpu.global.u32 [{0}], {1};", in(reg64) addr, in(reg32) v,
             options(nostack, preserves_flags));
    }
}

/// Whether `pred` holds in any thread of the block. Every thread of the block must call it.
#[inline(always)]
pub fn block_any(pred: bool) -> bool {
    let r: u32;
    // SAFETY: a block-wide barrier with a reduction; callers reach it from every thread.
    unsafe {
        asm!(
            "{{",
            ".reg .pred %p_in, %p_out;",
            "setp.ne.u32 %p_in, {0}, 0;",
            "bar.red.or.pred %p_out, 0, %p_in;",
            "selp.u32 {1}, 1, 0, %p_out;",
            "}}",
            in(reg32) pred as u32, out(reg32) r,
            options(nostack, preserves_flags),
        );
    }
    r != 0
}

/// `*addr += v` at device scope, returning the old value.
///
/// # Safety
/// `addr` is a writable, 4-byte aligned global address.
#[inline(always)]
pub unsafe fn atomic_add_u32(addr: u64, v: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees a writable, aligned address.
    unsafe {
        asm!("atom.global.add.u32 {0}, [{1}], {2};", out(reg32) old, in(reg64) addr, in(reg32) v,
             options(nostack, preserves_flags));
    }
    old
}

/// `*addr = v` at device scope, returning the old value.
///
/// # Safety
/// `addr` is a writable, 4-byte aligned global address.
#[inline(always)]
pub unsafe fn atomic_exch_u32(addr: u64, v: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees a writable, aligned address.
    unsafe {
        asm!("atom.global.exch.b32 {0}, [{1}], {2};", out(reg32) old, in(reg64) addr, in(reg32) v,
             options(nostack, preserves_flags));
    }
    old
}

/// One read-only 4-byte load (a token), through the non-coherent path.
///
/// # Safety
/// `addr` is a readable, 4-byte aligned global address that nothing writes during the kernel.
#[inline(always)]
pub unsafe fn load_u32(addr: u64) -> u32 {
    let v: u32;
    // SAFETY: the caller guarantees a readable, aligned, read-only address.
    unsafe {
        asm!("ld.global.nc.u32 {0}, [{1}];", out(reg32) v, in(reg64) addr,
             options(pure, readonly, nostack, preserves_flags));
    }
    v
}

/// One 8-byte store.
///
/// # Safety
/// `addr` is a writable, 8-byte aligned global address no other thread writes.
#[inline(always)]
pub unsafe fn store_i64(addr: u64, v: i64) {
    // SAFETY: the caller guarantees a writable, aligned address owned by this thread.
    unsafe {
        asm!("st.global.s64 [{0}], {1};", in(reg64) addr, in(reg64) v,
             options(nostack, preserves_flags));
    }
}

/// `*addr += v` at device scope on a u64, returning the old value.
///
/// # Safety
/// `addr` is a writable, 8-byte aligned global address.
#[inline(always)]
pub unsafe fn atomic_add_u64(addr: u64, v: u64) -> u64 {
    let old: u64;
    // SAFETY: the caller guarantees a writable, aligned address.
    unsafe {
        asm!("atom.global.add.u64 {0}, [{1}], {2};", out(reg64) old, in(reg64) addr, in(reg64) v,
             options(nostack, preserves_flags));
    }
    old
}

/// Two u32 stored as one 8-byte access.
///
/// # Safety
/// `addr` is a writable, 8-byte aligned global address no other thread writes.
#[inline(always)]
pub unsafe fn store_v2_u32(addr: u64, v: [u32; 2]) {
    // SAFETY: the caller guarantees a writable, aligned address owned by this thread.
    unsafe {
        asm!("st.global.v2.u32 [{0}], {{{1}, {2}}};", in(reg64) addr, in(reg32) v[0],
             in(reg32) v[1], options(nostack, preserves_flags));
    }
}

/// The multiprocessor this thread runs on (`%smid`).
#[inline(always)]
pub fn sm_id() -> u32 {
    let sm: u32;
    // SAFETY: reading a special register has no preconditions.
    unsafe {
        asm!("mov.u32 {0}, %smid;", out(reg32) sm, options(nomem, nostack, preserves_flags));
    }
    sm
}
