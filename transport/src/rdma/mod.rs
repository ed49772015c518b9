//! The verbs-shaped RDMA interface and its backends.
//!
//! The shape follows libibverbs + librdmacm: a provider (device) hands out protection
//! domains and completion queues; a protection domain registers memory regions (lkey,
//! rkey, address, length, access flags); a reliable-connection queue pair is created by
//! connection establishment (listener / connector with private data) and takes SEND,
//! RECV, RDMA WRITE and RDMA READ work requests with scatter-gather lists; completions
//! (wr_id, status, opcode, byte_len) arrive on completion queues, awaited with tokio.
//!
//! Backends: [`soft`] (user-space RDMA over TCP with one-sided semantics enforced by the
//! memory owner's provider) and, with the `verbs` feature, `verbs` (real hardware).

use std::future::Future;
use std::net::SocketAddr;

pub mod any;
mod buf;
pub mod conformance;
pub mod soft;
mod types;
#[cfg(feature = "verbs")]
pub mod verbs;

pub use buf::{AlignedBuf, PAGE_SIZE};
pub use types::{
    AccessFlags, Completion, QpCaps, RdmaError, RecvWr, RemoteBuf, Result, SendOp, SendWr, Sge,
    WcOpcode, WcStatus,
};

/// Largest connection private data every backend accepts (the InfiniBand RC limit through
/// rdma_cm; iWARP and the soft backend could carry more, portable users must not).
pub const MAX_PRIVATE_DATA: usize = 56;

/// A protection domain: the scope of memory regions and queue pairs.
pub trait ProtectionDomain: Clone + Send + Sync + 'static {
    type Mr: MemoryRegion;

    /// Register an owned buffer; the region keeps it alive until deregistration.
    fn register(&self, buf: AlignedBuf, access: AccessFlags) -> Result<Self::Mr>;

    /// Register caller memory.
    ///
    /// # Safety
    /// `addr..addr+len` must stay allocated until the region is deregistered (or dropped).
    /// While the region grants remote access and a peer holds a valid key, the provider may
    /// read or write that memory at any time (as a DMA engine would): the caller must not
    /// hold Rust references to it across such windows and should access it through
    /// [`MemoryRegion::read_at`]/[`MemoryRegion::write_at`], or after
    /// [`MemoryRegion::fence`]/deregistration.
    unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Self::Mr>;

    /// Fast-registration step 1 (FMR/FRWR-style): pre-allocate `n` registration slots
    /// (key-table entries, translation resources) off the critical path. The default does
    /// nothing.
    fn reserve_slots(&self, _n: usize) -> Result<()> {
        Ok(())
    }

    /// Fast-registration step 2: register using a reserved slot when one is left,
    /// otherwise like [`register_raw`](Self::register_raw).
    ///
    /// # Safety
    /// As [`register_raw`](Self::register_raw).
    unsafe fn register_fast(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Self::Mr> {
        // SAFETY: same contract, forwarded.
        unsafe { self.register_raw(addr, len, access) }
    }

    /// Deregister many regions at once (batched deregistration, as in FMRD).
    fn deregister_batch(&self, mrs: Vec<Self::Mr>) -> Result<()> {
        for mr in mrs {
            mr.deregister()?;
        }
        Ok(())
    }
}

/// A registered memory region.
pub trait MemoryRegion: Send + Sync + 'static {
    fn addr(&self) -> u64;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn lkey(&self) -> u32;
    fn rkey(&self) -> u32;
    fn access(&self) -> AccessFlags;

    /// The descriptor a peer needs to access the whole region.
    fn remote_buf(&self) -> RemoteBuf {
        RemoteBuf {
            addr: self.addr(),
            len: self.len() as u64,
            rkey: self.rkey(),
        }
    }

    /// A local SGE for `len` bytes at `offset`, or `None` when out of range.
    fn sge(&self, offset: usize, len: usize) -> Option<Sge> {
        let end = offset.checked_add(len)?;
        if end > self.len() || len > u32::MAX as usize {
            return None;
        }
        Some(Sge {
            addr: self.addr() + offset as u64,
            length: len as u32,
            lkey: self.lkey(),
        })
    }

    /// Copy out of the region (CPU access, ordered against the provider's accesses).
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()>;
    /// Copy into the region (CPU access, ordered against the provider's accesses).
    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()>;

    /// Wait until no provider access to the region is in flight; everything the provider
    /// wrote before is then visible to this thread.
    fn fence(&self) {}

    /// Make the current rkey invalid and return a fresh one (a late or forged access with
    /// the old key then fails). Backends without the ability return `Unsupported`.
    fn invalidate_rkey(&self) -> Result<u32> {
        Err(RdmaError::Unsupported("rkey invalidation"))
    }

    /// Deregister: the keys become invalid; in-flight operations touching the region
    /// complete first (the call waits for them).
    fn deregister(self) -> Result<()>
    where
        Self: Sized;
}

/// A completion queue. Cheap to clone (shared handle).
pub trait CompletionQueue: Clone + Send + Sync + 'static {
    /// Move up to `max` completions into `out`; returns how many.
    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> usize;
    /// Wait for the next completion.
    fn next(&self) -> impl Future<Output = Result<Completion>> + Send + '_;
}

/// A reliable-connection queue pair.
pub trait QueuePair: Send + Sync + 'static {
    /// Post a send-queue work request (SEND, RDMA WRITE, RDMA READ). Never blocks.
    fn post_send(&self, wr: SendWr) -> Result<()>;
    /// Post a receive buffer for an incoming SEND. Never blocks.
    fn post_recv(&self, wr: RecvWr) -> Result<()>;
    /// Private data the peer sent when the connection was established.
    fn peer_private_data(&self) -> &[u8];
    fn peer_addr(&self) -> SocketAddr;
    /// Whether the queue pair entered the error state (all further requests flush).
    fn is_error(&self) -> bool;
    /// Tear the connection down; outstanding requests complete with `WrFlushError`.
    fn disconnect(&self);
}

/// Everything a new queue pair is created with.
pub struct QpInit<P: RdmaProvider> {
    pub pd: P::Pd,
    pub send_cq: P::Cq,
    pub recv_cq: P::Cq,
    pub caps: QpCaps,
}

impl<P: RdmaProvider> Clone for QpInit<P> {
    fn clone(&self) -> Self {
        QpInit {
            pd: self.pd.clone(),
            send_cq: self.send_cq.clone(),
            recv_cq: self.recv_cq.clone(),
            caps: self.caps,
        }
    }
}

/// A device / provider: the entry point of a backend.
pub trait RdmaProvider: Send + Sync + Sized + 'static {
    type Pd: ProtectionDomain;
    type Cq: CompletionQueue;
    type Qp: QueuePair;
    type Listener: RdmaListener<Provider = Self>;

    /// Short backend name ("soft", "verbs").
    fn name(&self) -> &'static str;
    fn alloc_pd(&self) -> Result<Self::Pd>;
    fn create_cq(&self, depth: usize) -> Result<Self::Cq>;
    /// Listen for connections on `addr` (port 0: any free port).
    fn listen(&self, addr: SocketAddr) -> impl Future<Output = Result<Self::Listener>> + Send;
    /// Connect to a listener, sending `private_data`; on acceptance returns the queue pair
    /// (its [`QueuePair::peer_private_data`] holds the acceptor's private data).
    fn connect(
        &self,
        addr: SocketAddr,
        init: QpInit<Self>,
        private_data: &[u8],
    ) -> impl Future<Output = Result<Self::Qp>> + Send;
}

/// Passive side of connection establishment.
pub trait RdmaListener: Send + 'static {
    type Provider: RdmaProvider;
    type Request: ConnectRequest<Provider = Self::Provider>;
    fn local_addr(&self) -> SocketAddr;
    fn accept(&mut self) -> impl Future<Output = Result<Self::Request>> + Send;
}

/// An incoming connection request, to be accepted or rejected.
pub trait ConnectRequest: Send + 'static {
    type Provider: RdmaProvider;
    fn private_data(&self) -> &[u8];
    fn peer_addr(&self) -> SocketAddr;
    fn accept(
        self,
        init: QpInit<Self::Provider>,
        private_data: &[u8],
    ) -> impl Future<Output = Result<<Self::Provider as RdmaProvider>::Qp>> + Send;
    fn reject(self, private_data: &[u8]) -> impl Future<Output = Result<()>> + Send;
}

/// Check connection private data against [`MAX_PRIVATE_DATA`].
pub(crate) fn check_private_data(data: &[u8]) -> Result<()> {
    if data.len() > MAX_PRIVATE_DATA {
        return Err(RdmaError::InvalidArgument(format!(
            "private data of {} bytes exceeds {MAX_PRIVATE_DATA}",
            data.len()
        )));
    }
    Ok(())
}
