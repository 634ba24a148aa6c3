//! Shared-memory primitives, each one PTX instruction: a kernel's one static shared buffer,
//! asynchronous copies into it (`cp.async`, `cp.async.bulk`), the mbarriers that say when bulk
//! copies have landed, and bulk stores out of it. Shared addresses are 32-bit shared-window
//! addresses, as `mov` of a `.shared` symbol gives them.
use core::arch::asm;

/// The kernel's shared buffer of `BYTES` bytes, 128-byte aligned: its shared-window address.
///
/// Each expansion of this asm declares a buffer of its own, so a kernel calls it exactly once,
/// unconditionally, at the top of its body. The asm is volatile (not `pure`), so LLVM does not
/// merge it; `tests/ptx.rs` checks that no kernel ended up with two.
#[inline(always)]
pub fn shared_buffer<const BYTES: u32>() -> u32 {
    let addr: u32;
    // SAFETY: declares a block-scoped `.shared` array and reads its address; touches no memory.
    unsafe {
        asm!(
            "{{ .shared .align 128 .b8 fa_stage[{n}]; mov.u32 {r}, fa_stage; }}",
            n = const BYTES,
            r = out(reg32) addr,
            options(nomem, nostack, preserves_flags),
        );
    }
    addr
}

/// 16 bytes written to shared memory.
///
/// # Safety
/// `addr` is a 16-byte aligned address inside this kernel's shared buffer.
#[inline(always)]
pub unsafe fn store_shared_16(addr: u32, v: [u32; 4]) {
    // SAFETY: the caller guarantees an aligned address inside the shared buffer.
    unsafe {
        asm!(
            "st.shared.v4.u32 [{0}], {{{1}, {2}, {3}, {4}}};",
            in(reg32) addr, in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3],
            options(nostack, preserves_flags),
        );
    }
}

/// 16 bytes read from shared memory. Volatile, so it stays ordered with the async copies that
/// fill the same bytes.
///
/// # Safety
/// `addr` is a 16-byte aligned address inside this kernel's shared buffer.
#[inline(always)]
pub unsafe fn load_shared_16(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees an aligned address inside the shared buffer.
    unsafe {
        asm!(
            "ld.shared.v4.u32 {{{0}, {1}, {2}, {3}}}, [{4}];",
            out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d,
            in(reg32) addr,
            options(nostack, preserves_flags),
        );
    }
    [a, b, c, d]
}

/// One f32 read from shared memory.
///
/// # Safety
/// `addr` is a 4-byte aligned address inside this kernel's shared buffer.
#[inline(always)]
pub unsafe fn load_shared_f32(addr: u32) -> f32 {
    let v: f32;
    // SAFETY: the caller guarantees an aligned address inside the shared buffer.
    unsafe {
        asm!("ld.shared.f32 {0}, [{1}];", out(reg32) v, in(reg32) addr,
             options(nostack, preserves_flags));
    }
    v
}

/// Starts copying 16 bytes from global `src` to shared `dst` (`cp.async.cg`: through L2 only),
/// into this thread's current `cp.async` group.
///
/// # Safety
/// `src` is a readable, 16-byte aligned global address nothing writes during the kernel; `dst`
/// is 16-byte aligned inside the shared buffer, and nothing reads or writes it until this
/// thread has waited for the group.
#[inline(always)]
pub unsafe fn copy_async_16(dst: u32, src: u64) {
    // SAFETY: the caller guarantees both addresses and the exclusive use of `dst`.
    unsafe {
        asm!(
            "cp.async.cg.shared.global [{0}], [{1}], 16;",
            in(reg32) dst, in(reg64) src,
            options(nostack, preserves_flags),
        );
    }
}

/// Closes this thread's current `cp.async` group (an empty group is allowed).
#[inline(always)]
pub fn commit_async() {
    // SAFETY: bookkeeping of this thread's own async copies.
    unsafe { asm!("cp.async.commit_group;", options(nostack, preserves_flags)) }
}

/// Waits until at most `PENDING` of this thread's `cp.async` groups are outstanding; the
/// completed groups' bytes are then visible to this thread.
#[inline(always)]
pub fn wait_async<const PENDING: u32>() {
    // SAFETY: waits on this thread's own async copies.
    unsafe {
        asm!("cp.async.wait_group {n};", n = const PENDING, options(nostack, preserves_flags))
    }
}

/// Waits until the oldest of this thread's last `GROUPS` `cp.async` groups has completed (at most
/// `GROUPS - 1` outstanding), as a ring of `GROUPS` slots consumes its oldest.
#[inline(always)]
pub fn wait_async_oldest<const GROUPS: u32>() {
    // SAFETY: waits on this thread's own async copies.
    unsafe {
        asm!(
            "cp.async.wait_group {n};",
            n = const GROUPS - 1,
            options(nostack, preserves_flags),
        )
    }
}

/// Sets up the mbarrier at `bar` for `count` arrivals per phase, phase 0 in progress.
///
/// # Safety
/// `bar` is 8-byte aligned inside the shared buffer, used by nothing else, and no thread uses the
/// barrier before [`fence_mbarrier_init`] and a barrier synchronizing with the users.
#[inline(always)]
pub unsafe fn mbarrier_init(bar: u32, count: u32) {
    // SAFETY: the caller guarantees an aligned, unused barrier word.
    unsafe {
        asm!(
            "mbarrier.init.shared.b64 [{0}], {1};",
            in(reg32) bar, in(reg32) count,
            options(nostack, preserves_flags),
        );
    }
}

/// Makes this thread's mbarrier initializations visible to the other threads (after a thread
/// barrier) and to the async proxy that completes bulk copies on them.
#[inline(always)]
pub fn fence_mbarrier_init() {
    // SAFETY: fences have no operands.
    unsafe {
        asm!(
            "fence.mbarrier_init.release.cluster;",
            "fence.proxy.async.shared::cta;",
            options(nostack, preserves_flags),
        )
    }
}

/// Raises the current phase's expected transaction count of `bar` by `bytes`, without arriving.
///
/// # Safety
/// `bar` is an initialized mbarrier in the shared buffer, and this thread arrives on the current
/// phase only after this call.
#[inline(always)]
pub unsafe fn mbarrier_expect_tx(bar: u32, bytes: u32) {
    // SAFETY: the caller guarantees an initialized barrier.
    unsafe {
        asm!(
            "mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [{0}], {1};",
            in(reg32) bar, in(reg32) bytes,
            options(nostack, preserves_flags),
        );
    }
}

/// Arrives once on the current phase of `bar` (release: this thread's earlier shared writes are
/// visible to threads that see the phase complete).
///
/// # Safety
/// `bar` is an initialized mbarrier in the shared buffer, whose phase still expects this arrival.
#[inline(always)]
pub unsafe fn mbarrier_arrive(bar: u32) {
    // SAFETY: the caller guarantees an initialized barrier expecting this arrival.
    unsafe {
        asm!(
            "{{",
            ".reg .b64 %fa_state;",
            "mbarrier.arrive.shared.b64 %fa_state, [{0}];",
            "}}",
            in(reg32) bar,
            options(nostack, preserves_flags),
        );
    }
}

/// Waits (acquire) until the phase of `bar` with parity `parity` has completed: its arrivals all
/// arrived and its expected bytes all landed.
///
/// # Safety
/// `bar` is an initialized mbarrier in the shared buffer, and the awaited phase will complete.
#[inline(always)]
pub unsafe fn mbarrier_wait(bar: u32, parity: u32) {
    loop {
        let done: u32;
        // SAFETY: the caller guarantees an initialized barrier; `try_wait` only reads it.
        unsafe {
            asm!(
                "{{",
                ".reg .pred %fa_done;",
                "mbarrier.try_wait.parity.shared::cta.b64 %fa_done, [{1}], {2};",
                "selp.u32 {0}, 1, 0, %fa_done;",
                "}}",
                out(reg32) done, in(reg32) bar, in(reg32) parity,
                options(nostack, preserves_flags),
            );
        }
        if done != 0 {
            return;
        }
    }
}

/// Starts a bulk copy of `bytes` from global `src` to shared `dst`, completing `bytes`
/// transactions on the mbarrier `bar` when they land.
///
/// # Safety
/// `src..src + bytes` is readable global memory nothing writes during the kernel; `dst` lies
/// with its `bytes` inside the shared buffer and nothing else touches it until the phase of `bar`
/// completes; both 16-byte aligned, `bytes` a multiple of 16; the current phase of `bar` expects
/// these bytes.
#[inline(always)]
pub unsafe fn bulk_load(dst: u32, src: u64, bytes: u32, bar: u32) {
    // SAFETY: the caller guarantees the spans, their alignment and the barrier's accounting.
    unsafe {
        asm!(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{0}], [{1}], {2}, [{3}];",
            in(reg32) dst, in(reg64) src, in(reg32) bytes, in(reg32) bar,
            options(nostack, preserves_flags),
        );
    }
}

/// Starts a bulk store of `bytes` from shared `src` to global `dst`, into this thread's current
/// bulk async-group.
///
/// # Safety
/// `dst..dst + bytes` is writable global memory nothing else touches during the kernel;
/// `src..src + bytes` lies in the shared buffer and is not written until this thread's
/// [`bulk_wait_read`] covers the group; both 16-byte aligned, `bytes` a multiple of 16; the
/// async proxy sees the source bytes (after [`fence_proxy_async`] where threads wrote them).
#[inline(always)]
pub unsafe fn bulk_store(dst: u64, src: u32, bytes: u32) {
    // SAFETY: the caller guarantees the spans and their alignment.
    unsafe {
        asm!(
            "cp.async.bulk.global.shared::cta.bulk_group [{0}], [{1}], {2};",
            in(reg64) dst, in(reg32) src, in(reg32) bytes,
            options(nostack, preserves_flags),
        );
    }
}

/// Closes this thread's current bulk async-group.
#[inline(always)]
pub fn bulk_commit() {
    // SAFETY: bookkeeping of this thread's own bulk copies.
    unsafe {
        asm!(
            "cp.async.bulk.commit_group;",
            options(nostack, preserves_flags)
        )
    }
}

/// Waits until at most `PENDING` of this thread's bulk groups still read their sources: the
/// shared bytes of the others may be overwritten.
#[inline(always)]
pub fn bulk_wait_read<const PENDING: u32>() {
    // SAFETY: waits on this thread's own bulk copies.
    unsafe {
        asm!(
            "cp.async.bulk.wait_group.read {n};",
            n = const PENDING,
            options(nostack, preserves_flags),
        )
    }
}

/// Waits until at most `PENDING` of this thread's bulk groups are incomplete.
#[inline(always)]
pub fn bulk_wait<const PENDING: u32>() {
    // SAFETY: waits on this thread's own bulk copies.
    unsafe {
        asm!(
            "cp.async.bulk.wait_group {n};",
            n = const PENDING,
            options(nostack, preserves_flags),
        )
    }
}

/// Orders this thread's shared-memory accesses through the generic proxy (ordinary loads and
/// stores) with later ones through the async proxy (bulk copies), and the other way around.
#[inline(always)]
pub fn fence_proxy_async() {
    // SAFETY: a fence has no operands.
    unsafe {
        asm!(
            "fence.proxy.async.shared::cta;",
            options(nostack, preserves_flags)
        )
    }
}
