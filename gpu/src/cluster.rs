//! Thread-block-cluster primitives (sm_90 and later), each one PTX instruction: the cluster's
//! identity, its barrier, and stores into another block's shared memory (distributed shared
//! memory). Shared addresses are the 32-bit shared-window addresses of [`crate::smem`].
use core::arch::asm;

macro_rules! special_register {
    ($(#[$doc:meta])* $name:ident, $reg:literal) => {
        $(#[$doc])*
        #[inline(always)]
        pub fn $name() -> u32 {
            let r: u32;
            // SAFETY: reads a special register; touches no memory.
            unsafe {
                asm!(concat!("mov.u32 {0}, ", $reg, ";"), out(reg32) r,
                     options(nomem, nostack, preserves_flags, pure));
            }
            r
        }
    };
}

special_register!(
    /// This block's rank in its cluster, `0..cluster_blocks()`.
    block_rank,
    "%cluster_ctarank"
);
special_register!(
    /// Blocks in this block's cluster (1 for a launch without clusters).
    cluster_blocks,
    "%cluster_nctarank"
);
special_register!(
    /// This cluster's index along x in the grid of clusters.
    cluster_x,
    "%clusterid.x"
);

/// Arrives at the cluster barrier without ordering memory: says only "this block has started".
/// Every thread of every block of the cluster arrives, then waits ([`wait`]) before arriving
/// again.
#[inline(always)]
pub fn arrive_relaxed() {
    // SAFETY: a barrier arrival; touches no memory.
    unsafe {
        asm!(
            "barrier.cluster.arrive.relaxed;",
            options(nostack, preserves_flags)
        )
    }
}

/// Arrives at the cluster barrier, releasing this thread's earlier writes (shared memory of any
/// block of the cluster included) to the threads that wait on this phase.
#[inline(always)]
pub fn arrive_release() {
    // SAFETY: a barrier arrival with release order.
    unsafe {
        asm!(
            "barrier.cluster.arrive.release;",
            options(nostack, preserves_flags)
        )
    }
}

/// Waits until every thread of the cluster has arrived at the current phase, acquiring what
/// they released.
#[inline(always)]
pub fn wait() {
    // SAFETY: a barrier wait with acquire order.
    unsafe {
        asm!(
            "barrier.cluster.wait.acquire;",
            options(nostack, preserves_flags)
        )
    }
}

/// The address in block `rank`'s shared memory of what `addr` is in this block's.
#[inline(always)]
pub fn map_shared(addr: u32, rank: u32) -> u32 {
    let r: u32;
    // SAFETY: address arithmetic in a register; touches no memory.
    unsafe {
        asm!("mapa.shared::cluster.u32 {0}, {1}, {2};", out(reg32) r, in(reg32) addr,
             in(reg32) rank, options(nomem, nostack, preserves_flags, pure));
    }
    r
}

/// Writes `v` to a cluster shared address (from [`map_shared`]).
///
/// # Safety
/// `addr` is a 4-byte aligned address inside a live block of this cluster's shared buffer
/// (every block of the cluster has arrived at the barrier at least once since it started), and
/// nothing else accesses those bytes until a cluster barrier orders this store.
#[inline(always)]
pub unsafe fn store_shared_f32(addr: u32, v: f32) {
    // SAFETY: the caller guarantees the address and the exclusive use of its bytes.
    unsafe {
        asm!("st.shared::cluster.f32 [{0}], {1};", in(reg32) addr, in(reg32) v,
             options(nostack, preserves_flags));
    }
}
