//! The io_uring engine: every pool buffer is registered with the ring, reads
//! and writes are READ_FIXED/WRITE_FIXED, a batch is one `io_uring_enter`.
//!
//! Submitters push SQEs under a lock; a reaper thread sleeps on an eventfd
//! registered with the ring (the kernel signals it when CQEs are posted),
//! drains the completion queue and sends each completion on its channel.
//! Short transfers are resubmitted for the remainder; a zero-byte result
//! ends the op early (end of file).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use io_uring::{opcode, types, IoUring};

use super::buffer::BufferPool;
use super::engine::{Completion, CompletionTx, Engine, EngineKind, IoOp, OpKind};

struct Pending {
    op: IoOp,
    done: usize,
    tx: CompletionTx,
}

#[derive(Default)]
struct Slab {
    entries: Vec<Option<Pending>>,
    free: Vec<usize>,
    live: usize,
}

impl Slab {
    fn insert(&mut self, p: Pending) -> usize {
        self.live += 1;
        if let Some(i) = self.free.pop() {
            self.entries[i] = Some(p);
            i
        } else {
            self.entries.push(Some(p));
            self.entries.len() - 1
        }
    }
    fn remove(&mut self, i: usize) -> Option<Pending> {
        let p = self.entries.get_mut(i)?.take()?;
        self.free.push(i);
        self.live -= 1;
        Some(p)
    }
}

struct Shared {
    ring: IoUring,
    /// Serializes SQ pushes and the pending table.
    state: Mutex<Slab>,
    efd: OwnedFd,
    stop: AtomicBool,
    pool: BufferPool,
    entries: u32,
}

/// io_uring with registered buffers.
pub struct UringEngine {
    shared: Arc<Shared>,
    reaper: Option<JoinHandle<()>>,
}

impl UringEngine {
    /// A ring of `entries` SQEs with every buffer of `pool` registered.
    /// Fails when io_uring is unavailable (old kernel, seccomp, sysctl
    /// `kernel.io_uring_disabled`) or registration is refused.
    pub fn new(pool: BufferPool, entries: u32) -> io::Result<UringEngine> {
        let ring = IoUring::builder()
            .setup_cqsize(entries.saturating_mul(8).max(4096))
            .build(entries)?;
        let iovecs = pool.iovecs();
        if !iovecs.is_empty() {
            // SAFETY: the iovecs point at pool memory that outlives the ring
            // (the pool is kept in `Shared`, dropped after the ring).
            unsafe { ring.submitter().register_buffers(&iovecs)? };
        }
        // SAFETY: plain eventfd(2).
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh fd we own.
        let efd = unsafe { OwnedFd::from_raw_fd(raw) };
        ring.submitter().register_eventfd(efd.as_raw_fd())?;
        let shared = Arc::new(Shared {
            ring,
            state: Mutex::new(Slab::default()),
            efd,
            stop: AtomicBool::new(false),
            pool,
            entries,
        });
        let s = shared.clone();
        let reaper = std::thread::Builder::new()
            .name("bw-uring-reaper".into())
            .spawn(move || reap(&s))?;
        Ok(UringEngine {
            shared,
            reaper: Some(reaper),
        })
    }
}

fn sqe_for(op: &IoOp, done: usize, user_data: u64) -> io_uring::squeue::Entry {
    let fd = types::Fd(op.file.as_raw_fd());
    // SAFETY: `buf_offset + done` stays within the registered buffer: the op
    // was checked in `submit` (`buf_offset + len <= capacity`) and a short
    // transfer is resubmitted with `done < len`.
    let ptr = unsafe { op.buf.as_ptr().add(op.buf_offset + done) };
    let len = (op.len - done) as u32;
    let off = op.file_offset + done as u64;
    match op.kind {
        OpKind::Read => opcode::ReadFixed::new(fd, ptr, len, op.buf.slot())
            .offset(off)
            .build(),
        OpKind::Write => opcode::WriteFixed::new(fd, ptr, len, op.buf.slot())
            .offset(off)
            .build(),
    }
    .user_data(user_data)
}

/// How many times a submitter calls `io_uring_enter` again when it fails
/// for want of a resource (EAGAIN, EBUSY: CQEs waiting to be reaped;
/// EINTR) before leaving the entries to the reaper's next tick.
const ENTER_TRIES: usize = 3;

/// How often the reaper looks for entries left in the SQ by a failed
/// submission, when no completion wakes it first.
const REAPER_TICK_MS: libc::c_int = 50;

#[cfg(test)]
thread_local! {
    /// Calls of `io_uring_enter` by this thread that fail (EAGAIN) before
    /// reaching the kernel: to test what a failed submission leaves.
    pub(super) static FAILING_ENTERS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl Shared {
    /// One `io_uring_enter` submitting what the SQ holds.
    fn enter(&self) -> io::Result<usize> {
        #[cfg(test)]
        if FAILING_ENTERS.with(|n| n.replace(n.get().saturating_sub(1))) > 0 {
            return Err(io::Error::from_raw_os_error(libc::EAGAIN));
        }
        self.ring.submit()
    }

    /// [`Shared::enter`], called again on the errors that say "later".
    fn enter_retrying(&self) -> io::Result<usize> {
        let mut tries = 0;
        loop {
            match self.enter() {
                Err(e)
                    if tries + 1 < ENTER_TRIES
                        && matches!(
                            e.raw_os_error(),
                            Some(libc::EAGAIN | libc::EBUSY | libc::EINTR)
                        ) =>
                {
                    tries += 1;
                }
                r => return r,
            }
        }
    }

    /// Pushes one SQE, submitting to make room when the SQ is full. Called
    /// with the state lock held. An error leaves the SQE out of the SQ.
    fn push(&self, sqe: &io_uring::squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: the state lock serializes every SQ access.
            let mut sq = unsafe { self.ring.submission_shared() };
            // SAFETY: the op's buffer and file stay alive in the pending
            // table until its completion is reaped.
            if unsafe { sq.push(sqe) }.is_ok() {
                return Ok(());
            }
            drop(sq);
            self.enter_retrying()?;
        }
    }

    /// Whether the SQ holds entries not yet submitted. State lock held.
    fn unsubmitted(&self) -> bool {
        // SAFETY: the state lock serializes every SQ access.
        !unsafe { self.ring.submission_shared() }.is_empty()
    }
}

impl Engine for UringEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::IoUring
    }
    fn describe(&self) -> String {
        format!(
            "io_uring ({} SQEs, {} registered buffers, READ_FIXED/WRITE_FIXED)",
            self.shared.entries,
            self.shared.pool.slots()
        )
    }
    fn pool(&self) -> &BufferPool {
        &self.shared.pool
    }
    /// Never fails: an op whose SQE cannot be queued (the SQ full and the
    /// kernel refusing entries) completes at once with that error, and
    /// so does every op after it; SQEs queued before stay in the pending
    /// table and complete as usual, whether this call's `io_uring_enter`
    /// takes them or (after it failed) the reaper's next tick. An error
    /// here must not tell the caller that queued writes ended: they may
    /// still land, after it answered and let its block range go.
    fn submit(&self, ops: Vec<IoOp>, done: &CompletionTx) -> io::Result<()> {
        let mut st = self.shared.state.lock().unwrap();
        let mut refused: Option<io::Error> = None;
        for op in ops {
            // Each op that completes here drops its clone of the buffer
            // before its owner hears (the engine contract); an op beyond
            // its buffer is the caller's bug, answered as an error rather
            // than a panic with the state locked, which would leave every
            // op in flight on every LUN unanswered.
            let early = if op
                .buf_offset
                .checked_add(op.len)
                .is_none_or(|end| end > op.buf.capacity())
            {
                Some(Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "I/O op beyond its buffer",
                )))
            } else if let Some(e) = &refused {
                Some(Err(io::Error::new(e.kind(), format!("not submitted: {e}"))))
            } else if op.len == 0 {
                Some(Ok(0))
            } else {
                None
            };
            if let Some(result) = early {
                let tag = op.tag;
                drop(op);
                let _ = done.send(Completion { tag, result });
                continue;
            }
            let sqe = sqe_for(&op, 0, 0);
            let id = st.insert(Pending {
                op,
                done: 0,
                tx: done.clone(),
            });
            if let Err(e) = self.shared.push(&sqe.user_data(id as u64)) {
                let p = st.remove(id).expect("just inserted");
                let tag = p.op.tag;
                drop(p.op); // the buffer goes back before its owner hears
                let _ = done.send(Completion {
                    tag,
                    result: Err(io::Error::new(e.kind(), format!("not submitted: {e}"))),
                });
                refused = Some(e);
            }
        }
        if self.shared.unsubmitted() {
            if let Err(e) = self.shared.enter_retrying() {
                tracing::warn!(error = %e, "io_uring submission failed: the reaper submits the queued entries on its next tick");
            }
        }
        Ok(())
    }
}

fn reap(s: &Shared) {
    let mut counter = [0u8; 8];
    let mut stop_deadline: Option<Instant> = None;
    loop {
        // Sleep until the kernel posts CQEs (or Drop wakes us), or a tick
        // passes (entries a failed submission left in the SQ go then).
        let mut pfd = libc::pollfd {
            fd: s.efd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd that outlives the call.
        let ready = unsafe { libc::poll(&mut pfd, 1, REAPER_TICK_MS) };
        if ready > 0 {
            // SAFETY: reading 8 bytes from our eventfd, which poll found
            // readable (so the read does not block).
            let n = unsafe { libc::read(s.efd.as_raw_fd(), counter.as_mut_ptr().cast(), 8) };
            if n < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                std::thread::sleep(Duration::from_millis(1));
            }
        } else if ready < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut finished = Vec::new();
        {
            let mut st = s.state.lock().unwrap();
            let mut cqes: Vec<(u64, i32)> = Vec::new();
            loop {
                // SAFETY: only this thread touches the CQ.
                let cq = unsafe { s.ring.completion_shared() };
                cqes.extend(cq.map(|c| (c.user_data(), c.result())));
                // CQEs that overflowed the ring wait in the kernel until an
                // io_uring_enter(GETEVENTS) flushes them: `submit` does that
                // when the overflow flag is up. The state lock guards the SQ.
                // SAFETY: state lock held.
                let overflow = unsafe { s.ring.submission_shared() }.cq_overflow();
                if !overflow {
                    break;
                }
                let _ = s.enter();
            }
            let mut resubmit = false;
            for (ud, res) in cqes {
                let id = ud as usize;
                let Some(mut p) = st.remove(id) else { continue };
                if res == -libc::EAGAIN
                    || res == -libc::EINTR
                    || (res > 0 && p.done + (res as usize) < p.op.len)
                {
                    if res > 0 {
                        p.done += res as usize;
                    }
                    let sqe = sqe_for(&p.op, p.done, 0);
                    let nid = st.insert(p);
                    if s.push(&sqe.user_data(nid as u64)).is_ok() {
                        resubmit = true;
                        continue;
                    }
                    p = st.remove(nid).unwrap();
                    finished.push((p, Err(io::Error::other("io_uring resubmission failed"))));
                    continue;
                }
                let result = if res < 0 {
                    Err(io::Error::from_raw_os_error(-res))
                } else {
                    Ok(p.done + res as usize)
                };
                finished.push((p, result));
            }
            if resubmit || s.unsubmitted() {
                let _ = s.enter();
            }
        }
        for (p, result) in finished {
            let Pending { op, tx, .. } = p;
            let tag = op.tag;
            drop(op); // release the buffer before the owner hears about it
            let _ = tx.send(Completion { tag, result });
        }
        if s.stop.load(Ordering::Acquire) {
            // Ops still in flight are reaped (the eventfd fires) for at most
            // 10 s from the first look after the stop.
            let deadline =
                *stop_deadline.get_or_insert_with(|| Instant::now() + Duration::from_secs(10));
            let live = s.state.lock().unwrap().live;
            if live == 0 || Instant::now() > deadline {
                return;
            }
        }
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { libc::write(self.shared.efd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if let Some(h) = self.reaper.take() {
            let _ = h.join();
        }
    }
}
