//! Connection establishment through librdmacm (event channel driven by tokio) and the
//! verbs RC queue pair.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rdma_sys as sys;
use tokio::io::unix::AsyncFd;

use super::cq::{register_fd, require_runtime, set_nonblocking, Fd};
use super::{rc_err, Context, VerbsProvider};
use crate::rdma::{
    check_private_data, ConnectRequest, QpCaps, QpInit, QueuePair, RdmaError, RdmaListener, RecvWr,
    Result, SendOp, SendWr,
};

const RESOLVE_TIMEOUT_MS: i32 = 2000;

/// `SocketAddr` → `sockaddr_storage` (+ length).
pub(crate) fn to_sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all-zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// `sockaddr_storage` → `SocketAddr`.
pub(crate) fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// An rdma_cm event channel driven by tokio.
struct Channel {
    ch: *mut sys::rdma_event_channel,
    fd: Option<AsyncFd<Fd>>,
}

// SAFETY: librdmacm event channels may be used from any thread.
unsafe impl Send for Channel {}
// SAFETY: as above; rdma_get_cm_event is thread-safe.
unsafe impl Sync for Channel {}

struct Event {
    kind: sys::rdma_cm_event_type::Type,
    status: i32,
    id: IdPtr,
    private: Vec<u8>,
}

/// An rdma_cm id pointer carried out of an event.
struct IdPtr(*mut sys::rdma_cm_id);
// SAFETY: rdma_cm ids may be used from any thread.
unsafe impl Send for IdPtr {}

impl Channel {
    fn new() -> Result<Channel> {
        require_runtime()?;
        // SAFETY: plain constructor; NULL on failure.
        let ch = unsafe { sys::rdma_create_event_channel() };
        if ch.is_null() {
            return Err(RdmaError::NoDevice {
                missing: format!(
                    "rdma_create_event_channel failed ({}): /dev/infiniband/rdma_cm is missing",
                    std::io::Error::last_os_error()
                ),
            });
        }
        // SAFETY: ch is valid; read its fd.
        let raw = unsafe { (*ch).fd };
        let mut c = Channel { ch, fd: None };
        set_nonblocking(raw)?;
        c.fd = Some(register_fd(raw)?);
        Ok(c)
    }

    async fn next_event(&self) -> Result<Event> {
        let fd = self.fd.as_ref().expect("fd set at creation");
        loop {
            if let Some(ev) = self.try_event()? {
                return Ok(ev);
            }
            fd.readable().await?.clear_ready();
        }
    }

    /// One non-blocking `rdma_get_cm_event`.
    fn try_event(&self) -> Result<Option<Event>> {
        {
            let mut ev = std::ptr::null_mut();
            // SAFETY: channel valid and non-blocking; ev is an out-pointer.
            let rc = unsafe { sys::rdma_get_cm_event(self.ch, &mut ev) };
            if rc == 0 {
                // SAFETY: ev is a valid event until acked; the connection parameters are
                // the active union member for connection events, and private_data points
                // to private_data_len bytes (or is NULL).
                let out = unsafe {
                    let e = &*ev;
                    let conn = &e.param.conn;
                    let private = if conn.private_data.is_null() {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(
                            conn.private_data as *const u8,
                            conn.private_data_len as usize,
                        )
                        .to_vec()
                    };
                    let out = Event {
                        kind: e.event,
                        status: e.status,
                        id: IdPtr(e.id),
                        private,
                    };
                    sys::rdma_ack_cm_event(ev);
                    out
                };
                return Ok(Some(out));
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::WouldBlock {
                return Err(RdmaError::Verbs {
                    call: "rdma_get_cm_event",
                    source: err,
                });
            }
            Ok(None)
        }
    }

    async fn expect(&self, kind: sys::rdma_cm_event_type::Type, what: &str) -> Result<Event> {
        let ev = self.next_event().await?;
        if ev.kind == sys::rdma_cm_event_type::RDMA_CM_EVENT_REJECTED {
            return Err(RdmaError::Rejected {
                private_data: ev.private,
            });
        }
        if ev.kind != kind {
            return Err(RdmaError::Protocol(format!(
                "{what}: unexpected rdma_cm event {} (status {})",
                ev.kind, ev.status
            )));
        }
        Ok(ev)
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        drop(self.fd.take());
        // SAFETY: every id on this channel was destroyed before (the owners drop ids
        // first); the channel is destroyed once.
        unsafe { sys::rdma_destroy_event_channel(self.ch) };
    }
}

fn qp_init_attr(init: &QpInit<VerbsProvider>) -> sys::ibv_qp_init_attr {
    // SAFETY: ibv_qp_init_attr is plain data; zero is a valid start.
    let mut a: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    a.send_cq = init.send_cq.raw();
    a.recv_cq = init.recv_cq.raw();
    a.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
    a.sq_sig_all = 0;
    a.cap.max_send_wr = init.caps.max_send_wr;
    a.cap.max_recv_wr = init.caps.max_recv_wr;
    a.cap.max_send_sge = init.caps.max_sge;
    a.cap.max_recv_sge = init.caps.max_sge;
    a
}

fn conn_param(private_data: &[u8]) -> sys::rdma_conn_param {
    // SAFETY: plain data.
    let mut p: sys::rdma_conn_param = unsafe { std::mem::zeroed() };
    p.private_data = private_data.as_ptr().cast();
    p.private_data_len = private_data.len() as u8;
    p.responder_resources = 16;
    p.initiator_depth = 16;
    p.retry_count = 7;
    p.rnr_retry_count = 7;
    p
}

/// Owns an rdma_cm id (and its QP once created) plus the channel its events arrive on.
struct Id {
    id: *mut sys::rdma_cm_id,
    has_qp: bool,
    channel: Channel,
}

// SAFETY: rdma_cm ids and QPs are thread-safe librdmacm/libibverbs objects.
unsafe impl Send for Id {}
// SAFETY: as above.
unsafe impl Sync for Id {}

impl Drop for Id {
    fn drop(&mut self) {
        // SAFETY: id is valid and destroyed once, its QP first; `channel` drops after.
        unsafe {
            if self.has_qp {
                sys::rdma_disconnect(self.id);
                sys::rdma_destroy_qp(self.id);
            }
            sys::rdma_destroy_id(self.id);
        }
    }
}

impl Id {
    fn create(channel: Channel) -> Result<Id> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: channel valid; raw is an out-pointer.
        let rc = unsafe {
            sys::rdma_create_id(
                channel.ch,
                &mut raw,
                std::ptr::null_mut(),
                sys::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if rc != 0 {
            return Err(rc_err("rdma_create_id", rc));
        }
        Ok(Id {
            id: raw,
            has_qp: false,
            channel,
        })
    }

    fn resolve_addr(&self, addr: SocketAddr) -> Result<()> {
        let (mut ss, _) = to_sockaddr(addr);
        // SAFETY: id valid; ss holds a sockaddr of the right family.
        let rc = unsafe {
            sys::rdma_resolve_addr(
                self.id,
                std::ptr::null_mut(),
                &mut ss as *mut _ as *mut libc::sockaddr,
                RESOLVE_TIMEOUT_MS,
            )
        };
        if rc != 0 {
            return Err(rc_err("rdma_resolve_addr", rc));
        }
        Ok(())
    }

    fn resolve_route(&self) -> Result<()> {
        // SAFETY: id valid, address resolved.
        let rc = unsafe { sys::rdma_resolve_route(self.id, RESOLVE_TIMEOUT_MS) };
        if rc != 0 {
            return Err(rc_err("rdma_resolve_route", rc));
        }
        Ok(())
    }

    fn connect(&self, private_data: &[u8]) -> Result<()> {
        let mut param = conn_param(private_data);
        // SAFETY: id has a QP; param points to private_data, alive across the call.
        let rc = unsafe { sys::rdma_connect(self.id, &mut param) };
        if rc != 0 {
            return Err(rc_err("rdma_connect", rc));
        }
        Ok(())
    }

    fn accept(&self, private_data: &[u8]) -> Result<()> {
        let mut param = conn_param(private_data);
        // SAFETY: id has a QP; param's private data outlives the call.
        let rc = unsafe { sys::rdma_accept(self.id, &mut param) };
        if rc != 0 {
            return Err(rc_err("rdma_accept", rc));
        }
        Ok(())
    }

    fn create_qp(&mut self, init: &QpInit<VerbsProvider>) -> Result<()> {
        // SAFETY: id valid; its verbs context was set by address resolution/connect request.
        let verbs = unsafe { (*self.id).verbs };
        if verbs != init.pd.context() {
            return Err(RdmaError::InvalidArgument(
                "the route to the peer goes through another RDMA device than the one this \
                 provider opened (open the device that owns the local address)"
                    .into(),
            ));
        }
        let mut attr = qp_init_attr(init);
        // SAFETY: id, pd and CQs are valid; attr is initialised.
        let rc = unsafe { sys::rdma_create_qp(self.id, init.pd.raw(), &mut attr) };
        if rc != 0 {
            return Err(rc_err("rdma_create_qp", rc));
        }
        self.has_qp = true;
        Ok(())
    }
}

pub(super) async fn connect(
    _ctx: Arc<Context>,
    addr: SocketAddr,
    init: QpInit<VerbsProvider>,
    private_data: &[u8],
) -> Result<VerbsQp> {
    check_private_data(private_data)?;
    let mut id = Id::create(Channel::new()?)?;
    id.resolve_addr(addr)?;
    id.channel
        .expect(
            sys::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED,
            "resolve address",
        )
        .await?;
    id.resolve_route()?;
    id.channel
        .expect(
            sys::rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED,
            "resolve route",
        )
        .await?;
    id.create_qp(&init)?;
    id.connect(private_data)?;
    let ev = id
        .channel
        .expect(
            sys::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED,
            "connect",
        )
        .await?;
    Ok(VerbsQp::new(id, init, ev.private, addr))
}

/// Passive side.
pub struct VerbsListener {
    id: Id,
    _ctx: Arc<Context>,
}

impl VerbsListener {
    pub(super) fn bind(ctx: Arc<Context>, addr: SocketAddr) -> Result<VerbsListener> {
        let id = Id::create(Channel::new()?)?;
        let (mut ss, _) = to_sockaddr(addr);
        // SAFETY: id valid; ss is a sockaddr of the right family.
        let rc = unsafe { sys::rdma_bind_addr(id.id, &mut ss as *mut _ as *mut libc::sockaddr) };
        if rc != 0 {
            return Err(rc_err("rdma_bind_addr", rc));
        }
        // SAFETY: id bound.
        let rc = unsafe { sys::rdma_listen(id.id, 128) };
        if rc != 0 {
            return Err(rc_err("rdma_listen", rc));
        }
        Ok(VerbsListener { id, _ctx: ctx })
    }
}

fn id_addr(id: *mut sys::rdma_cm_id, peer: bool) -> Option<SocketAddr> {
    // SAFETY: id valid; route.addr holds the resolved source/destination addresses as
    // sockaddr_storage-sized unions.
    unsafe {
        let a = &(*id).route.addr;
        let ss = if peer {
            &a.dst_addr_union.dst_storage
        } else {
            &a.src_addr_union.src_storage
        };
        from_sockaddr(ss)
    }
}

impl RdmaListener for VerbsListener {
    type Provider = VerbsProvider;
    type Request = VerbsConnectRequest;

    fn local_addr(&self) -> SocketAddr {
        id_addr(self.id.id, false).unwrap_or_else(|| ([0, 0, 0, 0], 0).into())
    }

    async fn accept(&mut self) -> Result<VerbsConnectRequest> {
        loop {
            let ev = self.id.channel.next_event().await?;
            if ev.kind == sys::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST {
                // Give the new id its own channel so its events do not mix with ours.
                let channel = Channel::new()?;
                // SAFETY: ev.id is the new connection's id, valid until destroyed.
                let rc = unsafe { sys::rdma_migrate_id(ev.id.0, channel.ch) };
                if rc != 0 {
                    // SAFETY: reject and drop the request's id.
                    unsafe {
                        sys::rdma_reject(ev.id.0, std::ptr::null(), 0);
                        sys::rdma_destroy_id(ev.id.0);
                    }
                    return Err(rc_err("rdma_migrate_id", rc));
                }
                let peer = id_addr(ev.id.0, true).unwrap_or_else(|| ([0, 0, 0, 0], 0).into());
                return Ok(VerbsConnectRequest {
                    id: Id {
                        id: ev.id.0,
                        has_qp: false,
                        channel,
                    },
                    private_data: ev.private,
                    peer,
                });
            }
            tracing::debug!("verbs listener: ignoring rdma_cm event {}", ev.kind);
        }
    }
}

pub struct VerbsConnectRequest {
    id: Id,
    private_data: Vec<u8>,
    peer: SocketAddr,
}

impl ConnectRequest for VerbsConnectRequest {
    type Provider = VerbsProvider;

    fn private_data(&self) -> &[u8] {
        &self.private_data
    }
    fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    async fn accept(mut self, init: QpInit<VerbsProvider>, private_data: &[u8]) -> Result<VerbsQp> {
        check_private_data(private_data)?;
        self.id.create_qp(&init)?;
        self.id.accept(private_data)?;
        self.id
            .channel
            .expect(sys::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED, "accept")
            .await?;
        Ok(VerbsQp::new(self.id, init, self.private_data, self.peer))
    }

    async fn reject(self, private_data: &[u8]) -> Result<()> {
        check_private_data(private_data)?;
        // SAFETY: id valid; private data outlives the call.
        let rc = unsafe {
            sys::rdma_reject(
                self.id.id,
                private_data.as_ptr().cast(),
                private_data.len() as u8,
            )
        };
        if rc != 0 {
            return Err(rc_err("rdma_reject", rc));
        }
        Ok(())
    }
}

/// A verbs RC queue pair (owned by its rdma_cm id).
///
/// A watcher task reads the id's connection events: when the peer disconnects
/// (RDMA_CM_EVENT_DISCONNECTED) it completes the disconnection, which moves the QP to the
/// error state so posted work requests flush, as they do when the peer of a soft QP goes
/// away. The watcher also owns the id and the PD and CQs the QP uses, and releases them in
/// that order once the `VerbsQp` is dropped.
pub struct VerbsQp {
    id: Arc<Id>,
    error: Arc<AtomicBool>,
    caps: QpCaps,
    peer_private: Vec<u8>,
    peer: SocketAddr,
    /// Dropping it ends the watcher, which then destroys the QP and its id.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl VerbsQp {
    fn new(id: Id, init: QpInit<VerbsProvider>, peer_private: Vec<u8>, peer: SocketAddr) -> Self {
        let id = Arc::new(id);
        let error = Arc::new(AtomicBool::new(false));
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let (watched, flag) = (id.clone(), error.clone());
        // The QP's PD and CQs outlive it: released after the id (and its QP) below.
        let keep = (init.pd, init.send_cq, init.recv_cq);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    ev = watched.channel.next_event() => match ev {
                        Ok(ev) if ev.kind == sys::rdma_cm_event_type::RDMA_CM_EVENT_DISCONNECTED => {
                            flag.store(true, Ordering::Relaxed);
                            // SAFETY: the id is valid (we hold it); disconnecting moves the QP
                            // to the error state and flushes its queues.
                            unsafe { sys::rdma_disconnect(watched.id) };
                        }
                        Ok(ev) => tracing::debug!("verbs QP: rdma_cm event {}", ev.kind),
                        Err(e) => {
                            tracing::debug!("verbs QP: event channel: {e}");
                            let _ = (&mut stopped).await;
                            break;
                        }
                    },
                }
            }
            drop(watched);
            drop(keep);
        });
        VerbsQp {
            id,
            error,
            caps: init.caps,
            peer_private,
            peer,
            _stop: stop,
        }
    }

    fn qp(&self) -> *mut sys::ibv_qp {
        // SAFETY: the id has a QP for the lifetime of VerbsQp.
        unsafe { (*self.id.id).qp }
    }

    fn sges(&self, sgl: &[crate::rdma::Sge]) -> Result<Vec<sys::ibv_sge>> {
        if sgl.len() > self.caps.max_sge as usize {
            return Err(RdmaError::InvalidArgument("too many SGEs".into()));
        }
        Ok(sgl
            .iter()
            .map(|s| sys::ibv_sge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey,
            })
            .collect())
    }
}

impl QueuePair for VerbsQp {
    fn post_send(&self, wr: SendWr) -> Result<()> {
        let mut sges = self.sges(&wr.sgl)?;
        // SAFETY: ibv_send_wr is plain data (pointers and unions of integers); zero is valid.
        let mut w: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        w.wr_id = wr.wr_id;
        w.sg_list = sges.as_mut_ptr();
        w.num_sge = sges.len() as i32;
        w.send_flags = if wr.signaled {
            sys::ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        };
        match wr.op {
            SendOp::Send => w.opcode = sys::ibv_wr_opcode::IBV_WR_SEND,
            SendOp::RdmaWrite { remote_addr, rkey } | SendOp::RdmaRead { remote_addr, rkey } => {
                w.opcode = if matches!(wr.op, SendOp::RdmaWrite { .. }) {
                    sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE
                } else {
                    sys::ibv_wr_opcode::IBV_WR_RDMA_READ
                };
                w.wr.rdma = sys::rdma_t { remote_addr, rkey };
            }
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: qp valid; w and the SGE array live across the call (the adapter copies
        // the descriptors during post).
        let rc = unsafe { sys::ibv_post_send(self.qp(), &mut w, &mut bad) };
        if rc != 0 {
            return Err(rc_err("ibv_post_send", rc));
        }
        Ok(())
    }

    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        let mut sges = self.sges(&wr.sgl)?;
        let mut w = sys::ibv_recv_wr {
            wr_id: wr.wr_id,
            next: std::ptr::null_mut(),
            sg_list: sges.as_mut_ptr(),
            num_sge: sges.len() as i32,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: as post_send.
        let rc = unsafe { sys::ibv_post_recv(self.qp(), &mut w, &mut bad) };
        if rc != 0 {
            return Err(rc_err("ibv_post_recv", rc));
        }
        Ok(())
    }

    fn peer_private_data(&self) -> &[u8] {
        &self.peer_private
    }
    fn peer_addr(&self) -> SocketAddr {
        self.peer
    }
    fn is_error(&self) -> bool {
        if self.error.load(Ordering::Relaxed) {
            return true;
        }
        // A failed work request moves the QP to the error state in the adapter;
        // ask it (IBV_QP_STATE only).
        // SAFETY: plain data, zero is valid.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the QP is valid for the lifetime of self; attr and init are out-params.
        let rc = unsafe {
            sys::ibv_query_qp(
                self.qp(),
                &mut attr,
                sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as libc::c_int,
                &mut init,
            )
        };
        let failed = rc != 0 || attr.qp_state == sys::ibv_qp_state::IBV_QPS_ERR;
        if failed {
            self.error.store(true, Ordering::Relaxed);
        }
        failed
    }
    fn disconnect(&self) {
        self.error.store(true, Ordering::Relaxed);
        // SAFETY: id valid; disconnecting moves the QP to error and flushes its queues.
        unsafe { sys::rdma_disconnect(self.id.id) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddr_roundtrip() {
        for a in ["127.0.0.1:3260", "[::1]:860", "10.1.2.3:0"] {
            let a: SocketAddr = a.parse().unwrap();
            let (ss, len) = to_sockaddr(a);
            assert!(len > 0);
            assert_eq!(from_sockaddr(&ss), Some(a));
        }
        // SAFETY: plain data.
        let z: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        assert_eq!(from_sockaddr(&z), None);
    }

    #[test]
    fn conn_param_carries_private_data() {
        let p = conn_param(b"token");
        assert_eq!(p.private_data_len, 5);
        assert_eq!(p.rnr_retry_count, 7);
    }

    #[tokio::test]
    async fn event_channel_without_device() {
        // Without /dev/infiniband librdmacm cannot open its device: the error
        // says so. With it, the channel opens.
        if std::path::Path::new("/dev/infiniband/rdma_cm").exists() {
            if let Err(e) = Channel::new() {
                panic!("/dev/infiniband/rdma_cm exists, yet no event channel: {e}");
            }
            return;
        }
        match Channel::new() {
            Err(RdmaError::NoDevice { missing }) => assert!(missing.contains("rdma_cm")),
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("an event channel without /dev/infiniband/rdma_cm"),
        }
    }
}
