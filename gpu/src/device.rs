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

/// Orders this thread's earlier global writes before its later ones, as seen by the whole device.
#[inline(always)]
pub fn fence_device() {
    // SAFETY: a memory fence has no preconditions.
    unsafe { asm!("membar.gl;", options(nostack, preserves_flags)) }
}

/// The device's nanosecond clock.
#[inline(always)]
pub fn global_timer_ns() -> u64 {
    let t: u64;
    // SAFETY: reading a special register has no preconditions.
    unsafe {
        asm!("mov.u64 {0}, %globaltimer;", out(reg64) t, options(nomem, nostack, preserves_flags))
    }
    t
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
