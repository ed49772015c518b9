//! Zero-copy socket sends (`MSG_ZEROCOPY`, Linux 4.14+) for large Data-In
//! payloads.
//!
//! A zero-copy `sendmsg` hands the kernel references to our pages instead of
//! copying them into socket buffers, so those pages must not change (or be
//! freed and reused) until the kernel says it is done with them: it queues
//! a completion notification on the socket's error queue (`recvmsg` with
//! `MSG_ERRQUEUE`, a `sock_extended_err` of origin `SO_EE_ORIGIN_ZEROCOPY`
//! whose `ee_info..=ee_data` is the range of send calls it completes; the
//! n-th successful zero-copy call on a socket has id n-1). Until then
//! [`ZeroCopy`] holds every buffer of the call (the header bytes too: the
//! kernel references them as well). The number of calls in flight is
//! bounded: beyond [`MAX_INFLIGHT`] the writer waits for notifications.
//!
//! When the kernel had to copy after all (loopback delivery, a device
//! without scatter-gather) the notification carries
//! `SO_EE_CODE_ZEROCOPY_COPIED`; both kinds are counted (see
//! [`crate::copies`]).

use std::collections::BTreeMap;
use std::io;
use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::copies::{self, CopyPath, Counts};
use crate::iscsi::send_stall::StallLimit;
use crate::iscsi::socket_room::{send_when_room, SocketRoom};

/// `SO_ZEROCOPY` (asm-generic/socket.h; not in the libc crate).
const SO_ZEROCOPY: libc::c_int = 60;
/// `SO_EE_ORIGIN_ZEROCOPY` (linux/errqueue.h).
const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
/// `SO_EE_CODE_ZEROCOPY_COPIED`: the kernel copied the data anyway.
const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;

/// Payloads at least this long are sent zero-copy: below it pinning pages
/// and taking a notification costs more than the copy it saves.
pub const ZC_MIN: usize = 32 * 1024;

/// Zero-copy send calls a connection may have in flight (each holds its
/// buffers); beyond it the writer waits for completions.
pub const MAX_INFLIGHT: usize = 128;

/// How long the writer waits for a completion before it gives up on the
/// connection (the peer stopped acknowledging).
const WAIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// When a writer goes away with zero-copy calls in flight, how long the
/// initiator is given to take their data before the connection is reset.
const RETIRE_GRACE: Duration = Duration::from_secs(30);

/// After that reset, how long the kernel is given to let the pages go
/// (skbs already handed to the device) before the buffers are leaked.
const AFTER_RESET: Duration = Duration::from_secs(10);

/// The memory one zero-copy call references.
#[derive(Debug)]
pub struct Held {
    /// Header bytes (and small PDUs queued before it).
    pub head: Vec<u8>,
    /// The payload.
    pub payload: Bytes,
    /// Padding and data digest.
    pub tail: Vec<u8>,
}

#[derive(Debug)]
struct Inflight {
    _held: Arc<Held>,
    payload: u64,
    path: Option<CopyPath>,
}

/// One socket's zero-copy state.
#[derive(Debug, Default)]
pub struct ZeroCopy {
    next_id: u32,
    inflight: BTreeMap<u32, Inflight>,
    /// Completion notifications received.
    pub notifications: u64,
    /// Send calls the kernel reported it copied.
    pub copied_calls: u64,
    /// Send calls the kernel reported it did not copy.
    pub zero_calls: u64,
    /// Payload bytes of completed calls.
    pub completed_bytes: u64,
}

static SETSOCKOPT_FAILED: AtomicBool = AtomicBool::new(false);

impl ZeroCopy {
    /// Turns `SO_ZEROCOPY` on for `fd`; None (logged once per process)
    /// when the kernel refuses: the writer then uses plain sends.
    pub fn enable(fd: RawFd) -> Option<ZeroCopy> {
        let one: libc::c_int = 1;
        // SAFETY: a valid socket fd and a pointer to an int of the given size.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                SO_ZEROCOPY,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            let e = io::Error::last_os_error();
            if !SETSOCKOPT_FAILED.swap(true, Ordering::Relaxed) {
                tracing::warn!(error = %e, "SO_ZEROCOPY refused by the kernel: Data-In payloads are sent with plain (copying) writes");
            }
            return None;
        }
        Some(ZeroCopy::default())
    }

    /// Zero-copy calls whose buffers are still held.
    pub fn inflight(&self) -> usize {
        self.inflight.len()
    }

    /// For a writer going away while the kernel may still send from the
    /// buffers of its zero-copy calls (the initiator has not acknowledged
    /// their data): freed now, those buffers would go back to their pool
    /// (see [`crate::payload_buffers`]) or to malloc, the next READ would
    /// fill them, and the socket would send that READ's data in place of
    /// this one's, under the GOOD status queued behind it. So a thread
    /// keeps them, and a duplicate of `socket`'s descriptor so the socket
    /// and its notifications live on, until the kernel has let every call
    /// go: first while the initiator takes the data (up to
    /// [`RETIRE_GRACE`]), then after resetting the connection
    /// (`connect(AF_UNSPEC)` discards the unsent data; the initiator
    /// recovers those commands as after any lost connection). Buffers the
    /// kernel still holds after [`AFTER_RESET`] more are leaked, never
    /// reused. None when nothing was in flight.
    pub fn retire(self, socket: impl AsFd) -> Option<std::thread::JoinHandle<()>> {
        self.retire_within(socket, RETIRE_GRACE, AFTER_RESET)
    }

    /// [`ZeroCopy::retire`] for a connection cut on purpose (as if the
    /// network went away): reset at once, no grace for the initiator.
    pub fn retire_cut(self, socket: impl AsFd) -> Option<std::thread::JoinHandle<()>> {
        self.retire_within(socket, Duration::ZERO, AFTER_RESET)
    }

    pub(in crate::iscsi) fn retire_within(
        mut self,
        socket: impl AsFd,
        grace: Duration,
        after_reset: Duration,
    ) -> Option<std::thread::JoinHandle<()>> {
        if self.inflight.is_empty() {
            return None;
        }
        let calls = self.inflight.len();
        let fd = match rustix::io::fcntl_dupfd_cloexec(socket, 0) {
            Ok(fd) => fd,
            Err(e) => {
                tracing::error!(error = %e, calls, "cannot keep the socket of zero-copy sends in flight: their buffers are leaked, not reused");
                self.leak();
                return None;
            }
        };
        // Shared with the thread so a failed spawn can still leak them.
        let kept = Arc::new(std::sync::Mutex::new(Some(self)));
        let theirs = kept.clone();
        let spawned = std::thread::Builder::new()
            .name("zero-copy-retire".into())
            .spawn(move || {
                let mut guard = theirs.lock().unwrap_or_else(|e| e.into_inner());
                let Some(mut zc) = guard.take() else { return };
                drop(guard);
                let raw = fd.as_raw_fd();
                if !zc.settle(raw, grace) {
                    if !grace.is_zero() {
                        tracing::warn!(
                            calls = zc.inflight.len(),
                            "zero-copy sends still unacknowledged {}s after the connection ended: resetting it",
                            grace.as_secs()
                        );
                    }
                    if let Err(e) = rustix::net::connect_unspec(&fd) {
                        tracing::warn!(error = %e, "resetting the connection");
                    }
                    if !zc.settle(raw, after_reset) {
                        tracing::error!(
                            calls = zc.inflight.len(),
                            "the kernel still holds zero-copy buffers after the connection's reset: leaked, not reused"
                        );
                        zc.leak();
                    }
                }
                drop(fd);
            });
        match spawned {
            Ok(handle) => Some(handle),
            Err(e) => {
                tracing::error!(error = %e, calls, "no thread to keep zero-copy buffers in flight: leaked, not reused");
                if let Some(mut zc) = kept.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    zc.leak();
                }
                None
            }
        }
    }

    /// Reads notifications until nothing is in flight (true) or `within`
    /// has passed (false).
    fn settle(&mut self, fd: RawFd, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while !self.inflight.is_empty() {
            match self.drain(fd) {
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    tracing::debug!(error = %e, "reading zero-copy notifications");
                }
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// Gives up the buffers still in flight without freeing them.
    fn leak(&mut self) {
        for (_, f) in std::mem::take(&mut self.inflight) {
            std::mem::forget(f);
        }
    }

    /// Records a successful zero-copy call that sent `payload` payload
    /// bytes of `held`.
    fn sent(&mut self, held: &Arc<Held>, payload: u64, path: Option<CopyPath>) {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        self.inflight.insert(
            id,
            Inflight {
                _held: held.clone(),
                payload,
                path,
            },
        );
    }

    /// The kernel completed calls `lo..=hi` (ids wrap).
    fn complete(&mut self, lo: u32, hi: u32, copied: bool) {
        self.notifications += 1;
        let span = hi.wrapping_sub(lo);
        let done: Vec<u32> = self
            .inflight
            .keys()
            .copied()
            .filter(|id| id.wrapping_sub(lo) <= span)
            .collect();
        for id in done {
            let Some(f) = self.inflight.remove(&id) else {
                continue;
            };
            self.completed_bytes += f.payload;
            if copied {
                self.copied_calls += 1;
            } else {
                self.zero_calls += 1;
            }
            if let Some(path) = f.path {
                let c = if copied {
                    Counts {
                        zc_copied: f.payload,
                        ..Counts::default()
                    }
                } else {
                    Counts {
                        zc_zero: f.payload,
                        ..Counts::default()
                    }
                };
                copies::add(path, &c);
            }
        }
    }

    /// Reads every notification queued on `fd`; WouldBlock when there was
    /// none.
    pub fn drain(&mut self, fd: RawFd) -> io::Result<usize> {
        let mut n = 0;
        loop {
            match recv_notification(fd) {
                Ok(Some((lo, hi, copied))) => {
                    self.complete(lo, hi, copied);
                    n += 1;
                }
                Ok(None) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return if n == 0 { Err(e) } else { Ok(n) };
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits for the next completion notification, at most the writer's
    /// stall limit (one comes once the initiator has taken the data), and
    /// releases what it covers, counting it as the initiator's progress.
    /// Cancel-safe (a notification is consumed only inside the synchronous
    /// drain).
    pub async fn reap(
        &mut self,
        stream: &tokio::net::TcpStream,
        fd: RawFd,
        stall: &StallLimit,
    ) -> io::Result<()> {
        let before = self.completed_bytes;
        let reaped = stall.wait(stream.async_io(tokio::io::Interest::ERROR, || self.drain(fd)));
        reaped.await?;
        stall.count(self.completed_bytes - before);
        Ok(())
    }

    /// Waits until fewer than `below` calls are in flight, each wait for a
    /// notification as [`ZeroCopy::reap`]'s; with no stall limit, at most
    /// [`WAIT_LIMIT`] in all.
    pub async fn wait_below(
        &mut self,
        stream: &tokio::net::TcpStream,
        fd: RawFd,
        below: usize,
        stall: &StallLimit,
    ) -> io::Result<()> {
        let deadline = tokio::time::Instant::now()
            + if stall.is_limited() {
                Duration::from_secs(365 * 86_400)
            } else {
                WAIT_LIMIT
            };
        while self.inflight.len() >= below.max(1) {
            let wait = self.reap(stream, fd, stall);
            match tokio::time::timeout_at(deadline, wait).await {
                Ok(r) => {
                    r?;
                }
                Err(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "{} zero-copy sends not completed within {}s (the initiator stopped acknowledging)",
                            self.inflight.len(),
                            WAIT_LIMIT.as_secs()
                        ),
                    ))
                }
            }
        }
        Ok(())
    }

    /// Sends `held` (head, payload, tail) with `MSG_ZEROCOPY`, resuming
    /// partial sends; waits for completions when too many are in flight.
    /// Returns (zero-copy payload bytes, payload bytes that had to go by a
    /// copying send because the kernel ran out of option memory, syscalls).
    pub async fn send(
        &mut self,
        stream: &tokio::net::TcpStream,
        fd: RawFd,
        held: Arc<Held>,
        path: Option<CopyPath>,
        stall: &StallLimit,
        room: Option<&SocketRoom>,
    ) -> io::Result<(u64, u64, u64)> {
        let parts = [&held.head[..], &held.payload[..], &held.tail[..]];
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let payload_at = held.head.len()..held.head.len() + held.payload.len();
        let (mut done, mut zc_bytes, mut copied_bytes, mut calls) = (0usize, 0u64, 0u64, 0u64);
        while done < total {
            if self.inflight.len() >= MAX_INFLIGHT {
                self.wait_below(stream, fd, MAX_INFLIGHT / 2, stall).await?;
            }
            let r = stall
                .send(send_when_room(stream, room, || {
                    sendmsg(fd, &slices_from(&parts, done), libc::MSG_ZEROCOPY)
                }))
                .await;
            calls += 1;
            let in_payload = |n: usize| overlap(done..done + n, payload_at.clone()) as u64;
            match r {
                Ok(n) => {
                    self.sent(&held, in_payload(n), path);
                    zc_bytes += in_payload(n);
                    done += n;
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    // Out of option memory for notifications: this call
                    // goes the copying way.
                    tracing::debug!("MSG_ZEROCOPY: ENOBUFS, copying send");
                    let n = stall
                        .send(send_when_room(stream, room, || {
                            sendmsg(fd, &slices_from(&parts, done), 0)
                        }))
                        .await?;
                    copied_bytes += in_payload(n);
                    done += n;
                }
                Err(e) => return Err(e),
            }
            match self.drain(fd) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok((zc_bytes, copied_bytes, calls))
    }
}

/// How many bytes of `a` lie in `b`.
pub fn overlap(a: std::ops::Range<usize>, b: std::ops::Range<usize>) -> usize {
    a.end.min(b.end).saturating_sub(a.start.max(b.start))
}

/// The unsent rest of `parts` once `done` bytes went out.
pub fn slices_from<'a>(parts: &[&'a [u8]], mut done: usize) -> Vec<IoSlice<'a>> {
    let mut out = Vec::with_capacity(parts.len());
    for p in parts {
        if done >= p.len() {
            done -= p.len();
            continue;
        }
        out.push(IoSlice::new(&p[done..]));
        done = 0;
    }
    out
}

/// One non-blocking `sendmsg` of `iov` with `flags`.
pub(super) fn sendmsg(fd: RawFd, iov: &[IoSlice<'_>], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: IoSlice is ABI-compatible with iovec on Unix; the msghdr
    // points at `iov`, which outlives the call; no control data.
    let r = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = iov.len() as _;
        libc::sendmsg(fd, &msg, flags | libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// One message off the error queue: Some((lo, hi, copied)) for a zero-copy
/// completion, None for anything else, WouldBlock when the queue is empty.
fn recv_notification(fd: RawFd) -> io::Result<Option<(u32, u32, bool)>> {
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut control = [0u64; 16];
    // SAFETY: the msghdr points at `control`, which outlives the call; the
    // CMSG macros walk only within msg_controllen bytes the kernel filled,
    // and sock_extended_err is read unaligned from within that buffer.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        let r = libc::recvmsg(fd, &mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT);
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            let c = &*cmsg;
            let recverr = (c.cmsg_level == libc::SOL_IP && c.cmsg_type == libc::IP_RECVERR)
                || (c.cmsg_level == libc::SOL_IPV6 && c.cmsg_type == libc::IPV6_RECVERR);
            if recverr
                && c.cmsg_len as usize
                    >= libc::CMSG_LEN(std::mem::size_of::<libc::sock_extended_err>() as u32)
                        as usize
            {
                let ee: libc::sock_extended_err =
                    std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
                if ee.ee_errno == 0 && ee.ee_origin == SO_EE_ORIGIN_ZEROCOPY {
                    let copied = ee.ee_code & SO_EE_CODE_ZEROCOPY_COPIED != 0;
                    return Ok(Some((ee.ee_info, ee.ee_data, copied)));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_resume_after_partial_sends() {
        let parts: [&[u8]; 3] = [b"head", b"payload", b"t"];
        let s = slices_from(&parts, 6);
        let v: Vec<&[u8]> = s.iter().map(|s| &s[..]).collect();
        assert_eq!(v, vec![&b"yload"[..], &b"t"[..]]);
        assert!(slices_from(&parts, 12).is_empty());
        assert_eq!(overlap(2..8, 4..11), 4);
        assert_eq!(overlap(0..4, 4..11), 0);
    }

    #[test]
    fn completion_ranges_wrap() {
        let mut z = ZeroCopy {
            next_id: u32::MAX - 1,
            ..ZeroCopy::default()
        };
        let held = Arc::new(Held {
            head: vec![],
            payload: Bytes::from_static(b"x"),
            tail: vec![],
        });
        for _ in 0..4 {
            z.sent(&held, 1, None);
        }
        assert_eq!(z.inflight(), 4);
        z.complete(u32::MAX, 0, true);
        assert_eq!(z.inflight(), 2, "ids MAX and 0 done");
        z.complete(u32::MAX - 1, 1, false);
        assert_eq!(z.inflight(), 0);
        assert_eq!((z.copied_calls, z.zero_calls), (2, 2));
        assert_eq!(Arc::strong_count(&held), 1, "buffers released");
    }
}
