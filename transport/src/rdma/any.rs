//! One provider type for every backend, chosen at run time: the soft provider (RDMA over
//! TCP) or, with the `verbs` feature, libibverbs + librdmacm. Users that pick the backend
//! from configuration (the target's RDMA-assisted listener, the initiator's offload flag)
//! hold an [`AnyProvider`] and get matching protection domains, regions, CQs and QPs;
//! objects of one backend handed to the other are refused, never mixed.

use std::net::SocketAddr;

use super::soft::{SoftConnectRequest, SoftCq, SoftListener, SoftMr, SoftPd, SoftProvider, SoftQp};
#[cfg(feature = "verbs")]
use super::verbs::{
    VerbsConnectRequest, VerbsCq, VerbsListener, VerbsMr, VerbsPd, VerbsProvider, VerbsQp,
};
use super::{
    AccessFlags, AlignedBuf, Completion, CompletionQueue, ConnectRequest, MemoryRegion,
    ProtectionDomain, QpInit, QueuePair, RdmaError, RdmaListener, RdmaProvider, RecvWr, Result,
    SendWr,
};

/// Which backend, by the name configuration uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// RDMA semantics over TCP (always available).
    Soft,
    /// libibverbs + librdmacm: RDMA NICs, Soft-RoCE (`rdma_rxe`), siw.
    Verbs,
}

impl Backend {
    /// `"soft"` or `"verbs"`.
    pub fn parse(name: &str) -> Option<Backend> {
        match name {
            "soft" => Some(Backend::Soft),
            "verbs" => Some(Backend::Verbs),
            _ => None,
        }
    }

    /// The configuration name.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Soft => "soft",
            Backend::Verbs => "verbs",
        }
    }
}

/// A provider of either backend.
#[derive(Clone)]
pub enum AnyProvider {
    Soft(SoftProvider),
    #[cfg(feature = "verbs")]
    Verbs(VerbsProvider),
}

impl AnyProvider {
    /// Opens `backend`: the soft provider always; verbs on `device` (or the first device)
    /// when built with the `verbs` feature, else an error saying how to get it.
    pub fn open(backend: Backend, device: Option<&str>) -> Result<AnyProvider> {
        match backend {
            Backend::Soft => Ok(AnyProvider::Soft(SoftProvider::default())),
            #[cfg(feature = "verbs")]
            Backend::Verbs => VerbsProvider::open(device).map(AnyProvider::Verbs),
            #[cfg(not(feature = "verbs"))]
            Backend::Verbs => {
                let _ = device;
                Err(RdmaError::NoDevice {
                    missing: "this build has no verbs backend (rebuild with --features verbs)"
                        .into(),
                })
            }
        }
    }
}

impl std::fmt::Debug for AnyProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AnyProvider({})", self.name())
    }
}

fn mixed() -> RdmaError {
    RdmaError::InvalidArgument("objects of different RDMA backends mixed".into())
}

/// Runs `$body` with `$v` bound to the inner value of whichever variant `$e` is.
macro_rules! each {
    ($ty:ident, $e:expr, $v:ident => $body:expr) => {
        match $e {
            $ty::Soft($v) => $body,
            #[cfg(feature = "verbs")]
            $ty::Verbs($v) => $body,
        }
    };
}

#[derive(Clone)]
pub enum AnyPd {
    Soft(SoftPd),
    #[cfg(feature = "verbs")]
    Verbs(VerbsPd),
}

pub enum AnyMr {
    Soft(SoftMr),
    #[cfg(feature = "verbs")]
    Verbs(VerbsMr),
}

#[derive(Clone)]
pub enum AnyCq {
    Soft(SoftCq),
    #[cfg(feature = "verbs")]
    Verbs(VerbsCq),
}

pub enum AnyQp {
    Soft(SoftQp),
    #[cfg(feature = "verbs")]
    Verbs(VerbsQp),
}

pub enum AnyListener {
    Soft(SoftListener),
    #[cfg(feature = "verbs")]
    Verbs(VerbsListener),
}

pub enum AnyConnectRequest {
    Soft(SoftConnectRequest),
    #[cfg(feature = "verbs")]
    Verbs(VerbsConnectRequest),
}

impl ProtectionDomain for AnyPd {
    type Mr = AnyMr;

    fn register(&self, buf: AlignedBuf, access: AccessFlags) -> Result<AnyMr> {
        match self {
            AnyPd::Soft(pd) => pd.register(buf, access).map(AnyMr::Soft),
            #[cfg(feature = "verbs")]
            AnyPd::Verbs(pd) => pd.register(buf, access).map(AnyMr::Verbs),
        }
    }

    unsafe fn register_raw(&self, addr: *mut u8, len: usize, access: AccessFlags) -> Result<AnyMr> {
        match self {
            // SAFETY: the caller's contract is forwarded unchanged.
            AnyPd::Soft(pd) => unsafe { pd.register_raw(addr, len, access) }.map(AnyMr::Soft),
            #[cfg(feature = "verbs")]
            // SAFETY: as above.
            AnyPd::Verbs(pd) => unsafe { pd.register_raw(addr, len, access) }.map(AnyMr::Verbs),
        }
    }

    fn reserve_slots(&self, n: usize) -> Result<()> {
        each!(AnyPd, self, pd => pd.reserve_slots(n))
    }

    unsafe fn register_fast(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<AnyMr> {
        match self {
            // SAFETY: the caller's contract is forwarded unchanged.
            AnyPd::Soft(pd) => unsafe { pd.register_fast(addr, len, access) }.map(AnyMr::Soft),
            #[cfg(feature = "verbs")]
            // SAFETY: as above.
            AnyPd::Verbs(pd) => unsafe { pd.register_fast(addr, len, access) }.map(AnyMr::Verbs),
        }
    }

    fn deregister_batch(&self, mrs: Vec<AnyMr>) -> Result<()> {
        match self {
            AnyPd::Soft(pd) => {
                let mut own = Vec::with_capacity(mrs.len());
                for mr in mrs {
                    match mr {
                        AnyMr::Soft(m) => own.push(m),
                        #[cfg(feature = "verbs")]
                        AnyMr::Verbs(_) => return Err(mixed()),
                    }
                }
                pd.deregister_batch(own)
            }
            #[cfg(feature = "verbs")]
            AnyPd::Verbs(pd) => {
                let mut own = Vec::with_capacity(mrs.len());
                for mr in mrs {
                    match mr {
                        AnyMr::Verbs(m) => own.push(m),
                        AnyMr::Soft(_) => return Err(mixed()),
                    }
                }
                pd.deregister_batch(own)
            }
        }
    }
}

impl MemoryRegion for AnyMr {
    fn addr(&self) -> u64 {
        each!(AnyMr, self, m => m.addr())
    }
    fn len(&self) -> usize {
        each!(AnyMr, self, m => m.len())
    }
    fn lkey(&self) -> u32 {
        each!(AnyMr, self, m => m.lkey())
    }
    fn rkey(&self) -> u32 {
        each!(AnyMr, self, m => m.rkey())
    }
    fn access(&self) -> AccessFlags {
        each!(AnyMr, self, m => m.access())
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        each!(AnyMr, self, m => m.read_at(offset, dst))
    }
    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        each!(AnyMr, self, m => m.write_at(offset, src))
    }
    fn fence(&self) {
        each!(AnyMr, self, m => m.fence())
    }
    fn invalidate_rkey(&self) -> Result<u32> {
        each!(AnyMr, self, m => m.invalidate_rkey())
    }
    fn deregister(self) -> Result<()> {
        each!(AnyMr, self, m => m.deregister())
    }
}

impl CompletionQueue for AnyCq {
    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        each!(AnyCq, self, cq => cq.poll(out, max))
    }
    async fn next(&self) -> Result<Completion> {
        each!(AnyCq, self, cq => cq.next().await)
    }
}

impl QueuePair for AnyQp {
    fn post_send(&self, wr: SendWr) -> Result<()> {
        each!(AnyQp, self, qp => qp.post_send(wr))
    }
    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        each!(AnyQp, self, qp => qp.post_recv(wr))
    }
    fn peer_private_data(&self) -> &[u8] {
        each!(AnyQp, self, qp => qp.peer_private_data())
    }
    fn peer_addr(&self) -> SocketAddr {
        each!(AnyQp, self, qp => qp.peer_addr())
    }
    fn is_error(&self) -> bool {
        each!(AnyQp, self, qp => qp.is_error())
    }
    fn disconnect(&self) {
        each!(AnyQp, self, qp => qp.disconnect())
    }
}

/// The soft half of an [`AnyProvider`] queue pair's objects, or an error if any is not soft.
fn soft_init(init: QpInit<AnyProvider>) -> Result<QpInit<SoftProvider>> {
    match (init.pd, init.send_cq, init.recv_cq) {
        (AnyPd::Soft(pd), AnyCq::Soft(send_cq), AnyCq::Soft(recv_cq)) => Ok(QpInit {
            pd,
            send_cq,
            recv_cq,
            caps: init.caps,
        }),
        #[allow(unreachable_patterns)]
        _ => Err(mixed()),
    }
}

/// The verbs half of an [`AnyProvider`] queue pair's objects, or an error if any is not verbs.
#[cfg(feature = "verbs")]
fn verbs_init(init: QpInit<AnyProvider>) -> Result<QpInit<VerbsProvider>> {
    match (init.pd, init.send_cq, init.recv_cq) {
        (AnyPd::Verbs(pd), AnyCq::Verbs(send_cq), AnyCq::Verbs(recv_cq)) => Ok(QpInit {
            pd,
            send_cq,
            recv_cq,
            caps: init.caps,
        }),
        _ => Err(mixed()),
    }
}

impl RdmaProvider for AnyProvider {
    type Pd = AnyPd;
    type Cq = AnyCq;
    type Qp = AnyQp;
    type Listener = AnyListener;

    fn name(&self) -> &'static str {
        each!(AnyProvider, self, p => p.name())
    }

    fn alloc_pd(&self) -> Result<AnyPd> {
        match self {
            AnyProvider::Soft(p) => p.alloc_pd().map(AnyPd::Soft),
            #[cfg(feature = "verbs")]
            AnyProvider::Verbs(p) => p.alloc_pd().map(AnyPd::Verbs),
        }
    }

    fn create_cq(&self, depth: usize) -> Result<AnyCq> {
        match self {
            AnyProvider::Soft(p) => p.create_cq(depth).map(AnyCq::Soft),
            #[cfg(feature = "verbs")]
            AnyProvider::Verbs(p) => p.create_cq(depth).map(AnyCq::Verbs),
        }
    }

    async fn listen(&self, addr: SocketAddr) -> Result<AnyListener> {
        match self {
            AnyProvider::Soft(p) => p.listen(addr).await.map(AnyListener::Soft),
            #[cfg(feature = "verbs")]
            AnyProvider::Verbs(p) => p.listen(addr).await.map(AnyListener::Verbs),
        }
    }

    async fn connect(
        &self,
        addr: SocketAddr,
        init: QpInit<AnyProvider>,
        private_data: &[u8],
    ) -> Result<AnyQp> {
        match self {
            AnyProvider::Soft(p) => p
                .connect(addr, soft_init(init)?, private_data)
                .await
                .map(AnyQp::Soft),
            #[cfg(feature = "verbs")]
            AnyProvider::Verbs(p) => p
                .connect(addr, verbs_init(init)?, private_data)
                .await
                .map(AnyQp::Verbs),
        }
    }
}

impl RdmaListener for AnyListener {
    type Provider = AnyProvider;
    type Request = AnyConnectRequest;

    fn local_addr(&self) -> SocketAddr {
        each!(AnyListener, self, l => l.local_addr())
    }

    async fn accept(&mut self) -> Result<AnyConnectRequest> {
        match self {
            AnyListener::Soft(l) => l.accept().await.map(AnyConnectRequest::Soft),
            #[cfg(feature = "verbs")]
            AnyListener::Verbs(l) => l.accept().await.map(AnyConnectRequest::Verbs),
        }
    }
}

impl ConnectRequest for AnyConnectRequest {
    type Provider = AnyProvider;

    fn private_data(&self) -> &[u8] {
        each!(AnyConnectRequest, self, r => r.private_data())
    }

    fn peer_addr(&self) -> SocketAddr {
        each!(AnyConnectRequest, self, r => r.peer_addr())
    }

    async fn accept(self, init: QpInit<AnyProvider>, private_data: &[u8]) -> Result<AnyQp> {
        match self {
            AnyConnectRequest::Soft(r) => r
                .accept(soft_init(init)?, private_data)
                .await
                .map(AnyQp::Soft),
            #[cfg(feature = "verbs")]
            AnyConnectRequest::Verbs(r) => r
                .accept(verbs_init(init)?, private_data)
                .await
                .map(AnyQp::Verbs),
        }
    }

    async fn reject(self, private_data: &[u8]) -> Result<()> {
        each!(AnyConnectRequest, self, r => r.reject(private_data).await)
    }
}
