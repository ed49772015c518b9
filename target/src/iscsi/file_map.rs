//! A read-only shared mapping of a cached LUN file, for sending large
//! Data-In payloads to an initiator on the same host by copying sends
//! instead of `sendfile(2)`, when the payload's pages are in the page cache.
//!
//! Why: over the loopback interface the sender's context also runs the
//! receiving side of TCP. A `sendfile` of 1 MiB hands TCP 256 page
//! fragments, which cost per fragment on both sides, and the initiator's
//! copy then reads the LUN's cold pages. A `sendmsg` whose iovec points
//! into the mapping copies the payload once, in the target, into socket
//! buffers of large fragments that the initiator then copies while they are
//! still warm. On the 2-vCPU VM of interop/results/bench-vs-tgtd.md a bare
//! sender and receiver moved a 1 GiB tmpfs file over 127.0.0.1 at
//! 1.8-1.9 GB/s by `sendfile` (sender 484-516 us of CPU per MiB) and at
//! 4.1 GB/s by sends from a mapping (234-238 us per MiB). Over a network
//! interface `sendfile` saves that copy, so only connections from this
//! host use the mapping (see [`super::io::PduWriter::copy_local_sends`]).
//!
//! Rust code never reads the mapped bytes: WRITEs change the file under
//! the mapping at any time, so no `&[u8]` of it is ever formed. Only its
//! addresses go to the kernel, inside `sendmsg`.
//!
//! A payload goes by the mapping only if every page of its range is in
//! the page cache ([`FileMap::allocated`], by `mincore`), for two reasons:
//! a shared read fault on a hole of a tmpfs file allocates a page, where
//! `read` and `sendfile` return zeroes without one (a hole punched in
//! between costs at most the pages of one payload); and a fault on a page
//! of a file on a device that is not cached would stall the connection's
//! writer for a device read (`sendfile` takes those pages instead, on the
//! paths that may wait). A page evicted between the check and the send is
//! read in by the fault, as `sendfile` would. Pages once sent stay mapped
//! in the daemon, so its resident size counts them as shared file pages;
//! they are the page cache all the same, which the kernel writes back and
//! reclaims under memory pressure (unmapping them first).
//!
//! A file truncated below a payload makes the kernel's copy fault, which
//! `sendmsg` reports as `EFAULT` (the fault is taken inside the system
//! call, so no SIGBUS reaches the process).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;

/// A read-only `MAP_SHARED` mapping of a whole file, as long as the file
/// was when mapped.
#[derive(Debug)]
pub struct FileMap {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is read-only and owned by this value alone (unmapped
// in Drop); no Rust reference into it is ever formed, only addresses handed
// to the kernel, so sharing it between threads races with nothing.
unsafe impl Send for FileMap {}
// SAFETY: as for Send: every method takes &self and reads no mapped byte.
unsafe impl Sync for FileMap {}

impl FileMap {
    /// Maps `file` read-only; None for an empty file (nothing to map).
    pub fn new(file: &File) -> io::Result<Option<FileMap>> {
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| io::Error::other("file larger than the address space"))?;
        if len == 0 {
            return Ok(None);
        }
        // SAFETY: a fresh mapping chosen by the kernel (no fixed address),
        // of an open file descriptor, length checked non-zero; the result is
        // checked against MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Some(FileMap { base, len }))
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether `[offset, offset + len)` lies in the mapping and every page
    /// of it is in the page cache (`mincore`), so a read fault of it neither
    /// allocates (a hole) nor waits (a page swapped out). `SEEK_HOLE` would
    /// say the same of holes, but it scans from `offset` to the first hole,
    /// to the end of a fully written file: milliseconds per call on 1 GiB.
    pub fn allocated(&self, offset: u64, len: usize) -> bool {
        let Some(end) = offset.checked_add(len as u64) else {
            return false;
        };
        if end > self.len as u64 || len == 0 {
            return false;
        }
        let page = rustix::param::page_size();
        let first = (offset as usize) / page * page;
        let end = end as usize;
        let mut vec = [0u8; 256];
        let mut at = first;
        while at < end {
            let span = (end - at).min(vec.len() * page);
            let pages = span.div_ceil(page);
            // SAFETY: [at, at + span) lies within the mapping (end <= len,
            // `at` page-aligned from a page-aligned base), and `vec` has a
            // byte for each of its `pages` pages.
            let r =
                unsafe { libc::mincore(self.base.as_ptr().add(at).cast(), span, vec.as_mut_ptr()) };
            if r != 0 || vec[..pages].iter().any(|v| v & 1 == 0) {
                return false;
            }
            at += span;
        }
        true
    }

    /// One `sendmsg` on `fd` of the unsent rest, after `done` bytes, of
    /// `head`, then the mapped bytes `[offset, offset + len)`; it waits for
    /// room only if the socket is a blocking one (the target's are not).
    /// Returns the bytes sent; `EFAULT` when the file shrank below the
    /// range. Panics if the range is outside the mapping.
    pub fn send(
        &self,
        fd: RawFd,
        head: &[u8],
        offset: u64,
        len: usize,
        done: usize,
    ) -> io::Result<usize> {
        self.send_parts(fd, &[MappedPart { head, offset, len }], done)
    }

    /// One `sendmsg` on `fd` of the unsent rest, after `done` bytes, of
    /// `parts` one after the other, each its head and then its mapped range:
    /// several PDUs in one call, so that TCP fills its segments across them
    /// (see [`MAX_PARTS`]). As [`FileMap::send`] otherwise; panics if a
    /// range is outside the mapping or there are more than [`MAX_PARTS`].
    pub fn send_parts(
        &self,
        fd: RawFd,
        parts: &[MappedPart<'_>],
        done: usize,
    ) -> io::Result<usize> {
        assert!(parts.len() <= MAX_PARTS, "at most {MAX_PARTS} parts a send");
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2 * MAX_PARTS];
        let mut n = 0;
        let mut skip = done;
        for part in parts {
            let start = usize::try_from(part.offset).expect("offset within the mapping");
            assert!(
                start
                    .checked_add(part.len)
                    .is_some_and(|end| end <= self.len),
                "payload outside the mapping"
            );
            if skip < part.head.len() {
                iov[n] = libc::iovec {
                    iov_base: part.head[skip..].as_ptr() as *mut libc::c_void,
                    iov_len: part.head.len() - skip,
                };
                n += 1;
                skip = 0;
            } else {
                skip -= part.head.len();
            }
            if skip < part.len {
                iov[n] = libc::iovec {
                    // SAFETY: start + skip < start + len <= self.len
                    // (asserted above), so the address stays inside the
                    // mapping.
                    iov_base: unsafe { self.base.as_ptr().add(start + skip) }.cast(),
                    iov_len: part.len - skip,
                };
                n += 1;
                skip = 0;
            } else {
                skip -= part.len;
            }
        }
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: the msghdr points at `iov`, which outlives the call, with
        // `n` entries filled; they point into the heads (borrowed for the
        // call) and into the mapping (alive while &self is); the kernel
        // only reads them; no control data.
        let r = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = iov.as_mut_ptr();
            msg.msg_iovlen = n as _;
            libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL)
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }
}

/// Most PDUs that [`FileMap::send_parts`] sends in one call.
pub const MAX_PARTS: usize = 8;

/// One PDU for [`FileMap::send_parts`]: its header (and anything else that
/// precedes its payload), then `len` bytes of the mapping at `offset`.
#[derive(Debug, Clone, Copy)]
pub struct MappedPart<'a> {
    pub head: &'a [u8],
    pub offset: u64,
    pub len: usize,
}

impl Drop for FileMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in new(); nothing refers
        // into it once its owner is dropped (sends borrow &self).
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests;
