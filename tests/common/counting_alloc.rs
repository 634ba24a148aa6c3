//! A global allocator that counts each thread's allocations, for the tests that check a hot path
//! allocates nothing. Included by path (`#[path = "common/counting_alloc.rs"] mod
//! counting_alloc;`) only by those tests: it replaces the test binary's global allocator.
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Forwards to the system allocator, counting.
struct Counting;

thread_local! {
    /// Allocations made by this thread (a const-initialized Cell: reading it never allocates).
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// Allocations this thread has made so far.
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
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: ptr came from System.alloc with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller's contract for realloc is passed through.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;
