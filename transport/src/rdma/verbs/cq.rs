//! Verbs completion queue with a completion channel whose fd tokio waits on.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use rdma_sys as sys;
use tokio::io::unix::AsyncFd;

use super::{last_err, rc_err, wc_opcode, wc_status, Context};
use crate::rdma::{Completion, CompletionQueue, RdmaError, Result};

pub(crate) struct Fd(pub RawFd);
impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Make a library-owned fd non-blocking so tokio can drive it.
pub(crate) fn set_nonblocking(fd: RawFd) -> Result<()> {
    // SAFETY: fcntl on a valid fd owned by libibverbs/librdmacm; only flags change.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(RdmaError::Io(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Register a library-owned fd with tokio (read interest).
pub(crate) fn register_fd(raw: RawFd) -> Result<AsyncFd<Fd>> {
    // SAFETY: `raw` is the open fd of a completion or event channel; each owner drops the
    // AsyncFd before destroying the channel, so the fd stays open and the same for the
    // AsyncFd's whole life.
    let fd = unsafe { AsyncFd::register_with_interest(Fd(raw), tokio::io::Interest::READABLE) };
    fd.map_err(|e| RdmaError::Io(e.into()))
}

pub(crate) fn require_runtime() -> Result<()> {
    tokio::runtime::Handle::try_current()
        .map(|_| ())
        .map_err(|_| RdmaError::InvalidArgument("verbs objects need a tokio runtime".into()))
}

struct Inner {
    cq: *mut sys::ibv_cq,
    channel: *mut sys::ibv_comp_channel,
    fd: Option<AsyncFd<Fd>>,
    _ctx: Arc<Context>,
}

// SAFETY: CQs and completion channels are thread-safe verbs objects; polling is
// serialised by libibverbs' provider locks.
unsafe impl Send for Inner {}
// SAFETY: as above.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // Deregister from tokio before libibverbs closes the fd.
        drop(self.fd.take());
        // SAFETY: QPs using this CQ hold a clone of the Arc<Inner>, so none is left; the
        // channel is destroyed after its last CQ.
        unsafe {
            sys::ibv_destroy_cq(self.cq);
            sys::ibv_destroy_comp_channel(self.channel);
        }
    }
}

#[derive(Clone)]
pub struct VerbsCq {
    inner: Arc<Inner>,
}

impl VerbsCq {
    pub(super) fn new(ctx: Arc<Context>, depth: usize) -> Result<VerbsCq> {
        require_runtime()?;
        // SAFETY: ctx is an open device context.
        let channel = unsafe { sys::ibv_create_comp_channel(ctx.ctx) };
        if channel.is_null() {
            return Err(last_err("ibv_create_comp_channel"));
        }
        // SAFETY: channel is valid; cq_context may be NULL.
        let cq = unsafe {
            sys::ibv_create_cq(
                ctx.ctx,
                depth.clamp(1, i32::MAX as usize) as i32,
                std::ptr::null_mut(),
                channel,
                0,
            )
        };
        if cq.is_null() {
            let e = last_err("ibv_create_cq");
            // SAFETY: channel is valid and unused.
            unsafe { sys::ibv_destroy_comp_channel(channel) };
            return Err(e);
        }
        // SAFETY: channel is valid; we read its fd field.
        let raw = unsafe { (*channel).fd };
        let mut inner = Inner {
            cq,
            channel,
            fd: None,
            _ctx: ctx,
        };
        set_nonblocking(raw)?;
        inner.fd = Some(register_fd(raw)?);
        // SAFETY: cq is valid; arm the first notification.
        let rc = unsafe { sys::ibv_req_notify_cq(cq, 0) };
        if rc != 0 {
            return Err(rc_err("ibv_req_notify_cq", rc));
        }
        Ok(VerbsCq {
            inner: Arc::new(inner),
        })
    }

    pub(crate) fn raw(&self) -> *mut sys::ibv_cq {
        self.inner.cq
    }

    fn poll_into(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        let mut n = 0;
        while n < max {
            // SAFETY: ibv_wc is plain data; zeroed is a valid value.
            let mut wc: sys::ibv_wc = unsafe { std::mem::zeroed() };
            // SAFETY: cq valid; wc points to one writable entry.
            let got = unsafe { sys::ibv_poll_cq(self.inner.cq, 1, &mut wc) };
            if got <= 0 {
                break;
            }
            out.push(Completion {
                wr_id: wc.wr_id,
                status: wc_status(wc.status),
                opcode: wc_opcode(wc.opcode),
                byte_len: wc.byte_len,
            });
            n += 1;
        }
        n
    }
}

impl CompletionQueue for VerbsCq {
    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        self.poll_into(out, max)
    }

    async fn next(&self) -> Result<Completion> {
        let fd = self.inner.fd.as_ref().expect("fd set at creation");
        loop {
            let mut v = Vec::with_capacity(1);
            if self.poll_into(&mut v, 1) == 1 {
                return Ok(v[0]);
            }
            let mut guard = fd.readable().await?;
            let mut cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: channel valid and non-blocking; out-pointers are valid.
            let rc = unsafe { sys::ibv_get_cq_event(self.inner.channel, &mut cq, &mut ctx) };
            if rc == 0 {
                // SAFETY: one event received for this CQ; re-arm, then poll again (loop)
                // so completions that raced with the re-arm are not missed.
                unsafe {
                    sys::ibv_ack_cq_events(cq, 1);
                    sys::ibv_req_notify_cq(cq, 0);
                }
            } else {
                guard.clear_ready();
            }
        }
    }
}
