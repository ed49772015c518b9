//! Buffers for READ and WRITE payloads, kept from one command to the next.
//!
//! A READ the SCSI core answers whole (any READ of a unit formatted with
//! protection information, whose blocks the core must see to check them; a
//! RAM unit's large READs; any READ the fabric does not send from the file
//! itself) is read into a buffer that the connection frees once its
//! Data-In PDUs are written; a WRITE's Data-Out payloads are gathered into
//! a buffer freed once the core has written it. glibc's malloc hands a
//! freed buffer of a megabyte back to the kernel (a block that large is its
//! own mapping, or the top of a thread's heap, which it trims with
//! `MADV_DONTNEED`), so the next command's copy into a new buffer takes a
//! page fault, and a page the kernel zeroes, for every 4 KiB of it.
//! `perf record` of the target found that in about a tenth of its samples
//! under 1 MiB READs of a protected file LUN in /dev/shm, and in about a
//! sixth under 1 MiB WRITEs of a plain one (`exc_page_fault`,
//! `clear_page_erms`, the page allocator, `madvise`). Buffers kept here
//! stay mapped and faulted in.
//!
//! Bounded: only buffers whose capacity is a power of two from
//! [`SMALLEST`] to [`LARGEST`] are kept (smaller ones come from malloc's
//! heap without faults; larger ones are rare), and at most [`KEPT_BYTES`]
//! of them in all: a buffer given back beyond that is freed. A buffer is
//! handed out empty (length 0): what an earlier command left in it is never
//! readable through it, only overwritten by the next read into its spare
//! capacity or the next payload copied in.
//!
//! Not the RDMA paths' `blockwire_transport::reg::BufferPool`: its buffers
//! are registered with a protection domain and handed out as its own type,
//! where the SCSI core's answers and the WRITE collector hold plain `Vec`s.

use std::sync::Mutex;

/// The smallest buffer kept: below it, malloc serves payload buffers from
/// its heap without returning their pages to the kernel.
pub const SMALLEST: usize = 128 << 10;
/// The largest buffer kept.
pub const LARGEST: usize = 16 << 20;
/// Bytes kept in all, over every size.
pub const KEPT_BYTES: usize = 32 << 20;

/// One list per power of two from [`SMALLEST`] to [`LARGEST`].
const SIZES: usize = (LARGEST.trailing_zeros() - SMALLEST.trailing_zeros() + 1) as usize;

struct Kept {
    by_size: [Vec<Vec<u8>>; SIZES],
    bytes: usize,
}

static KEPT: Mutex<Kept> = Mutex::new(Kept {
    by_size: [const { Vec::new() }; SIZES],
    bytes: 0,
});

/// Which list holds buffers of `capacity` bytes; None if none does.
fn size_index(capacity: usize) -> Option<usize> {
    (capacity.is_power_of_two() && (SMALLEST..=LARGEST).contains(&capacity))
        .then(|| (capacity.trailing_zeros() - SMALLEST.trailing_zeros()) as usize)
}

/// An empty buffer with room for at least `len` bytes: one kept, if a
/// command gave one of the right size back, else a new one.
pub fn take(len: usize) -> Vec<u8> {
    if !(SMALLEST / 2..=LARGEST).contains(&len) {
        return Vec::with_capacity(len);
    }
    let size = len.next_power_of_two().max(SMALLEST);
    let index = size_index(size).expect("a power of two from SMALLEST to LARGEST");
    let kept = {
        let mut k = KEPT.lock().unwrap_or_else(|p| p.into_inner());
        let v = k.by_size[index].pop();
        if let Some(v) = &v {
            k.bytes -= v.capacity();
        }
        v
    };
    kept.unwrap_or_else(|| Vec::with_capacity(size))
}

/// Keeps `buf` for a later [`take`] if it is of a kept size and there is
/// room; frees it if not.
pub fn give_back(mut buf: Vec<u8>) {
    let capacity = buf.capacity();
    let Some(index) = size_index(capacity) else {
        return;
    };
    buf.clear();
    let mut k = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    if k.bytes + capacity <= KEPT_BYTES {
        k.bytes += capacity;
        k.by_size[index].push(buf);
    }
}

/// Bytes kept now.
pub fn kept_bytes() -> usize {
    KEPT.lock().unwrap_or_else(|p| p.into_inner()).bytes
}

/// A payload that goes back to the kept buffers when dropped (READ data:
/// the owner of a `bytes::Bytes` whose slices are the Data-In payloads).
#[derive(Debug)]
pub struct Returning(pub Vec<u8>);

impl AsRef<[u8]> for Returning {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        give_back(std::mem::take(&mut self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The kept buffers are one static: these tests use sizes no other test
    // of this crate reads with, so their counts are their own.

    #[test]
    fn a_buffer_given_back_is_taken_again_empty() {
        let mut v = take(3 << 20);
        assert_eq!(v.capacity(), 4 << 20);
        v.extend_from_slice(&[7; 3 << 20]);
        let at = v.as_ptr();
        give_back(v);
        let again = take((4 << 20) - 1);
        assert_eq!(again.as_ptr(), at, "the same buffer, still mapped");
        assert!(again.is_empty(), "nothing of the last READ readable");
        assert_eq!(again.capacity(), 4 << 20);
    }

    #[test]
    fn small_large_and_odd_buffers_are_not_kept() {
        assert_eq!(take(4096).capacity(), 4096);
        assert_eq!(take(LARGEST + 1).capacity(), LARGEST + 1);
        assert_eq!(size_index(SMALLEST - 1), None);
        assert_eq!(size_index(3 << 20), None);
        assert_eq!(size_index(LARGEST * 2), None);
        assert_eq!(size_index(SMALLEST), Some(0));
        assert_eq!(size_index(LARGEST), Some(SIZES - 1));
    }

    #[test]
    fn no_more_than_the_bound_is_kept() {
        // 16 MiB buffers: two fill the bound, a third is freed.
        let bufs: Vec<Vec<u8>> = (0..3).map(|_| Vec::with_capacity(LARGEST)).collect();
        for b in bufs {
            give_back(b);
            assert!(kept_bytes() <= KEPT_BYTES);
        }
        let taken: Vec<Vec<u8>> = (0..3).map(|_| take(LARGEST)).collect();
        assert!(taken.iter().all(|b| b.capacity() == LARGEST));
        assert!(kept_bytes() <= KEPT_BYTES);
    }

    #[test]
    fn returning_data_goes_back_when_its_last_slice_is_dropped() {
        let mut v = take(6 << 20);
        v.resize(6 << 20, 1);
        let at = v.as_ptr();
        let whole = bytes::Bytes::from_owner(Returning(v));
        let piece = whole.slice(4096..8192);
        drop(whole);
        assert_eq!(piece[0], 1);
        drop(piece);
        let again = take(5 << 20);
        assert_eq!(again.as_ptr(), at);
    }
}
