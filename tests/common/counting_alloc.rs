//! A global allocator that counts each thread's allocations, for the tests that check a hot path
//! allocates nothing. Included by path (`#[path = "common/counting_alloc.rs"] mod
//! counting_alloc;`) only by those tests: it replaces the test binary's global allocator. It also
//! keeps each thread's live heap bytes as the allocator really holds them (usable size plus the
//! chunk header), for the tests that measure what a structure keeps resident.
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Forwards to the system allocator, counting.
struct Counting;

thread_local! {
    /// Allocations made by this thread (a const-initialized Cell: reading it never allocates).
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    /// Bytes this thread's live allocations occupy (frees of memory another thread allocated
    /// count against the freeing thread).
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

/// A heap chunk's header beside its usable bytes (glibc: one word).
const CHUNK_HEADER: usize = std::mem::size_of::<usize>();

/// Heap bytes this thread's allocations occupy now, headers and rounding included.
#[allow(dead_code)]
pub fn live_bytes() -> i64 {
    LIVE.with(Cell::get)
}

/// What the allocator really holds for the block at `ptr`.
fn held(ptr: *mut u8) -> i64 {
    if ptr.is_null() {
        return 0;
    }
    // SAFETY: ptr is a live block from the system allocator (malloc, realloc or
    // posix_memalign), which is what malloc_usable_size takes.
    let usable = unsafe { libc::malloc_usable_size(ptr.cast()) };
    (usable + CHUNK_HEADER) as i64
}

fn live(delta: i64) {
    let _ = LIVE.try_with(|n| n.set(n.get() + delta));
}

/// Allocations this thread has made so far.
#[allow(dead_code)]
pub fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

fn count() {
    // try_with: during thread teardown the slot may be gone; not counting then is fine.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract for alloc is passed through.
        let p = unsafe { System.alloc(layout) };
        live(held(p));
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        live(-held(ptr));
        // SAFETY: ptr came from System.alloc with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        let before = held(ptr);
        // SAFETY: the caller's contract for realloc is passed through.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            live(held(p) - before);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;
