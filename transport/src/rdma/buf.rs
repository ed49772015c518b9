//! Page-aligned, zero-initialised heap buffers that memory regions can own.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// Page size assumed for alignment and pinning.
pub const PAGE_SIZE: usize = 4096;

/// A heap buffer aligned to [`PAGE_SIZE`] (or a larger power of two), zero-filled.
///
/// It is handed to [`ProtectionDomain::register`](super::ProtectionDomain::register),
/// which keeps it alive for the memory region's lifetime. Because it is addressed through a
/// raw pointer (never through a `Box`), the provider may access it while the region is
/// registered without violating Rust's aliasing rules.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: AlignedBuf uniquely owns its allocation, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only expose `&[u8]` reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocate `len` zeroed bytes aligned to a page.
    pub fn new(len: usize) -> AlignedBuf {
        AlignedBuf::with_align(len, PAGE_SIZE)
    }

    /// Allocate `len` zeroed bytes aligned to `align` (a power of two).
    pub fn with_align(len: usize, align: usize) -> AlignedBuf {
        let size = len.max(1).next_multiple_of(align);
        let layout = Layout::from_size_align(size, align).expect("valid layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len, layout }
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Start address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised (zeroed) bytes for the lifetime of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in with_align with this exact layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        let mut b = AlignedBuf::new(10_000);
        assert_eq!(b.as_ptr() as usize % PAGE_SIZE, 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.as_mut_slice()[9_999] = 7;
        assert_eq!(b.as_slice()[9_999], 7);
        let e = AlignedBuf::new(0);
        assert!(e.is_empty());
    }
}
