//! Software prefetch hints, for loops whose next loads or stores are known but scattered: each
//! hint starts a cache line's (and its page walk's) fetch early, so that several overlap. Hints
//! never fault and change nothing the program can see; where the architecture has none they do
//! nothing.

/// The cache lines of `len` bytes from `p`, to be read soon.
#[inline(always)]
pub(crate) fn for_read(p: *const u8, len: usize) {
    for line in (0..len).step_by(64) {
        read_line(p.wrapping_add(line));
    }
}

/// The cache lines of `len` bytes from `p`, to be written soon (fetched exclusive where the
/// architecture says so).
#[inline(always)]
pub(crate) fn for_write(p: *const u8, len: usize) {
    for line in (0..len).step_by(64) {
        write_line(p.wrapping_add(line));
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn read_line(p: *const u8) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    // SAFETY: SSE is part of x86_64; PREFETCHh never faults, whatever the address.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn write_line(p: *const u8) {
    use std::arch::x86_64::{_MM_HINT_ET0, _mm_prefetch};
    // SAFETY: as `read_line`; ET0 is PREFETCHW, a no-op where the CPU lacks it.
    unsafe { _mm_prefetch::<_MM_HINT_ET0>(p.cast()) }
}

#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn read_line(p: *const u8) {
    // SAFETY: PRFM is a hint: it never faults and changes no architectural state.
    unsafe {
        std::arch::asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
    }
}

#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn write_line(p: *const u8) {
    // SAFETY: as `read_line`.
    unsafe {
        std::arch::asm!("prfm pstl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[inline(always)]
fn read_line(_: *const u8) {}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[inline(always)]
fn write_line(_: *const u8) {}
