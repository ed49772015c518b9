//! Aligned I/O buffers in size classes.
//!
//! Every buffer is allocated once, aligned to [`ALIGN`] (so O_DIRECT accepts
//! it), and lives as long as the pool. An engine registers all of them with
//! the kernel at start-up (io_uring `register_buffers`); a buffer's *slot*
//! is its index in that registration. A [`BufLease`] hands one buffer out and
//! gives it back when dropped.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::{Arc, Condvar, Mutex};

/// Alignment of every buffer: the page size, which covers the logical block
/// size O_DIRECT asks for on any device.
pub const ALIGN: usize = 4096;

/// The default size classes: (buffer size, how many).
pub const DEFAULT_CLASSES: &[(usize, usize)] =
    &[(64 << 10, 64), (256 << 10, 32), (1 << 20, 16), (4 << 20, 8)];

struct Slot {
    ptr: *mut u8,
    cap: usize,
}

// SAFETY: a slot's pointer is an allocation the pool owns for its whole life
// and frees only on drop; the bytes are reached only through a lease, which
// one holder has at a time, so moving the slot to another thread is sound.
unsafe impl Send for Slot {}
// SAFETY: `&Slot` exposes only the pointer value and capacity (plain data);
// access to the bytes goes through leases, never through a shared `&Slot`.
unsafe impl Sync for Slot {}

struct Class {
    size: usize,
    free: Mutex<Vec<u16>>,
}

struct PoolInner {
    slots: Vec<Slot>,
    classes: Vec<Class>,
    returned: Condvar,
    wait_lock: Mutex<()>,
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        for s in &self.slots {
            // SAFETY: allocated in `BufferPool::new` with this layout.
            unsafe { dealloc(s.ptr, Layout::from_size_align(s.cap, ALIGN).unwrap()) };
        }
    }
}

/// A fixed set of aligned buffers in size classes. Cheap to clone.
#[derive(Clone)]
pub struct BufferPool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let classes: Vec<(usize, usize)> = self
            .inner
            .classes
            .iter()
            .map(|c| (c.size, c.free.lock().unwrap().len()))
            .collect();
        f.debug_struct("BufferPool")
            .field("slots", &self.inner.slots.len())
            .field("free_by_class", &classes)
            .finish()
    }
}

impl BufferPool {
    /// A pool with `count` buffers of `size` bytes for each `(size, count)`.
    /// Sizes are rounded up to [`ALIGN`]; at most 65536 buffers in all.
    pub fn new(classes: &[(usize, usize)]) -> BufferPool {
        let mut sorted: Vec<(usize, usize)> = classes
            .iter()
            .map(|&(s, n)| (s.max(1).div_ceil(ALIGN) * ALIGN, n))
            .collect();
        sorted.sort();
        let mut slots = Vec::new();
        let mut out = Vec::new();
        for (size, count) in sorted {
            let mut free = Vec::new();
            for _ in 0..count {
                let layout = Layout::from_size_align(size, ALIGN).expect("buffer layout");
                // SAFETY: non-zero size.
                let ptr = unsafe { alloc_zeroed(layout) };
                assert!(
                    !ptr.is_null(),
                    "out of memory allocating a {size}-byte I/O buffer"
                );
                assert!(slots.len() < u16::MAX as usize, "too many I/O buffers");
                free.push(slots.len() as u16);
                slots.push(Slot { ptr, cap: size });
            }
            free.reverse();
            out.push(Class {
                size,
                free: Mutex::new(free),
            });
        }
        BufferPool {
            inner: Arc::new(PoolInner {
                slots,
                classes: out,
                returned: Condvar::new(),
                wait_lock: Mutex::new(()),
            }),
        }
    }

    /// A pool with [`DEFAULT_CLASSES`] (60 MiB).
    pub fn with_defaults() -> BufferPool {
        BufferPool::new(DEFAULT_CLASSES)
    }

    /// The largest buffer this pool can lend.
    pub fn max_len(&self) -> usize {
        self.inner.classes.iter().map(|c| c.size).max().unwrap_or(0)
    }

    /// Number of buffers (registered slots).
    pub fn slots(&self) -> usize {
        self.inner.slots.len()
    }

    /// Every buffer as an iovec, indexed by slot: what `register_buffers` takes.
    pub fn iovecs(&self) -> Vec<libc::iovec> {
        self.inner
            .slots
            .iter()
            .map(|s| libc::iovec {
                iov_base: s.ptr as *mut libc::c_void,
                iov_len: s.cap,
            })
            .collect()
    }

    /// A free buffer of at least `len` bytes from the smallest class that has
    /// one, or `None` when every fitting buffer is lent out or `len` is larger
    /// than [`BufferPool::max_len`].
    pub fn try_acquire(&self, len: usize) -> Option<BufLease> {
        for class in &self.inner.classes {
            if class.size < len {
                continue;
            }
            if let Some(slot) = class.free.lock().unwrap().pop() {
                return Some(BufLease {
                    pool: self.inner.clone(),
                    slot,
                    len,
                });
            }
        }
        None
    }

    /// Like [`BufferPool::try_acquire`] but waits for a buffer to come back.
    /// Returns `None` only when `len` exceeds [`BufferPool::max_len`].
    pub fn acquire(&self, len: usize) -> Option<BufLease> {
        if len > self.max_len() {
            return None;
        }
        loop {
            if let Some(l) = self.try_acquire(len) {
                return Some(l);
            }
            let g = self.inner.wait_lock.lock().unwrap();
            let _ = self
                .inner
                .returned
                .wait_timeout(g, std::time::Duration::from_millis(5))
                .unwrap();
        }
    }
}

/// One lent buffer. Dropping it returns the buffer to the pool.
///
/// Engines hold an `Arc<BufLease>` clone while an operation is in flight, so
/// `Arc::get_mut` succeeding proves no I/O is pending on it.
pub struct BufLease {
    pool: Arc<PoolInner>,
    slot: u16,
    len: usize,
}

impl std::fmt::Debug for BufLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufLease")
            .field("slot", &self.slot)
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl BufLease {
    /// The registered-buffer index (io_uring `buf_index`).
    pub fn slot(&self) -> u16 {
        self.slot
    }
    /// The length asked for.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the length asked for is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The buffer's real size (its class).
    pub fn capacity(&self) -> usize {
        self.pool.slots[self.slot as usize].cap
    }
    /// Start of the buffer.
    pub fn as_ptr(&self) -> *mut u8 {
        self.pool.slots[self.slot as usize].ptr
    }
    /// The first `len()` bytes, mutably: safe because `&mut self` means no
    /// engine holds a clone, hence no I/O is in flight.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: exclusive access, in bounds.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len) }
    }
    /// The first `len()` bytes when no I/O is pending (`&mut` proves it).
    pub fn as_slice_exclusive(&mut self) -> &[u8] {
        self.as_mut_slice()
    }
    /// `range` of the buffer.
    ///
    /// # Safety
    /// No I/O may be writing `range` while the slice lives: the caller has
    /// seen the completion of every read into it (or submitted none).
    pub unsafe fn slice(&self, range: std::ops::Range<usize>) -> &[u8] {
        assert!(range.start <= range.end && range.end <= self.capacity());
        // SAFETY: the assert keeps `range` inside this lease's allocation of
        // `capacity()` bytes; the caller promises no I/O writes it meanwhile.
        unsafe {
            std::slice::from_raw_parts(self.as_ptr().add(range.start), range.end - range.start)
        }
    }
}

impl Drop for BufLease {
    fn drop(&mut self) {
        let cap = self.capacity();
        if let Some(class) = self.pool.classes.iter().find(|c| c.size == cap) {
            class.free.lock().unwrap().push(self.slot);
        }
        let _g = self.pool.wait_lock.lock().unwrap();
        self.pool.returned.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_alignment_and_return() {
        let pool = BufferPool::new(&[(4096, 2), (65536, 1)]);
        assert_eq!(pool.slots(), 3);
        let a = pool.try_acquire(100).unwrap();
        assert_eq!(a.capacity(), 4096);
        assert_eq!(a.as_ptr() as usize % ALIGN, 0);
        let b = pool.try_acquire(4096).unwrap();
        // Small class empty: falls through to the 64 KiB class.
        let c = pool.try_acquire(10).unwrap();
        assert_eq!(c.capacity(), 65536);
        assert!(pool.try_acquire(1).is_none());
        assert!(pool.try_acquire(1 << 20).is_none());
        let slot = b.slot();
        drop(b);
        assert_eq!(pool.try_acquire(1).unwrap().slot(), slot);
        drop((a, c));
        assert_eq!(pool.iovecs().len(), 3);
    }
}
