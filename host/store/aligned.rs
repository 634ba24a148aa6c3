//! Page-aligned byte buffers: O_DIRECT reads land only in memory aligned to the device's blocks.
use std::alloc::{self, Layout};
use std::ptr::NonNull;

use super::layout::PAGE;

/// A zeroed, page-aligned allocation of a fixed length.
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads through `as_slice`; writes need `&mut self` or go through raw
// pointers whose users guarantee disjointness.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `len` rounded up to whole pages (at least one).
    pub fn new(len: usize) -> Self {
        let len = len.max(1).next_multiple_of(PAGE as usize);
        let Ok(layout) = Layout::from_size_align(len, PAGE as usize) else {
            alloc::handle_alloc_error(Layout::new::<u8>());
        };
        // SAFETY: layout has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(ptr) else {
            alloc::handle_alloc_error(layout);
        };
        AlignedBuf { ptr, len }
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is a live, initialized (zeroed) allocation of len bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and &mut self makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this size and alignment.
        unsafe {
            alloc::dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.len, PAGE as usize),
            )
        }
    }
}
