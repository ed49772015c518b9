//! `soft`: a user-space RDMA provider over TCP with one-sided semantics.
//!
//! Each connection has a responder task on both sides. It serves the peer's RDMA READ
//! requests from registered memory and applies RDMA WRITEs to it after validating the
//! rkey, the bounds and the access flags, without calling the upper layer. A refused
//! access completes the requester's work request with `RemoteAccessError` and changes no
//! byte; the requester's queue pair then enters the error state, as an RC queue pair does.
//! Registration pins pages with mlock (reference-counted per page) and updates a key
//! table; deregistration removes the key and then waits for in-flight accesses.

mod cq;
mod memory;
mod qp;
pub(crate) mod wire;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub use cq::SoftCq;
pub use memory::{memlock_limit, raise_memlock_limit, DeviceCounters, SoftConfig};
pub use qp::{SoftConnectRequest, SoftListener, SoftQp};

use memory::{KeyTable, PinTable, Region};

use super::{
    AccessFlags, AlignedBuf, MemoryRegion, ProtectionDomain, QpInit, RdmaProvider, Result,
};

/// The soft "device". Cheap to clone.
#[derive(Clone)]
pub struct SoftProvider {
    pins: Arc<PinTable>,
    counters: Arc<DeviceCounters>,
    config: SoftConfig,
}

impl Default for SoftProvider {
    fn default() -> Self {
        SoftProvider::new(SoftConfig::default())
    }
}

impl SoftProvider {
    pub fn new(config: SoftConfig) -> SoftProvider {
        SoftProvider {
            pins: Arc::new(PinTable::default()),
            counters: Arc::new(DeviceCounters::default()),
            config,
        }
    }
    /// Device-wide counters (registrations, deregistrations, pinned pages, pin failures).
    pub fn counters(&self) -> &DeviceCounters {
        &self.counters
    }
}

impl RdmaProvider for SoftProvider {
    type Pd = SoftPd;
    type Cq = SoftCq;
    type Qp = SoftQp;
    type Listener = SoftListener;

    fn name(&self) -> &'static str {
        "soft"
    }

    fn alloc_pd(&self) -> Result<SoftPd> {
        Ok(SoftPd {
            keys: Arc::new(KeyTable::new(
                self.pins.clone(),
                self.counters.clone(),
                self.config.clone(),
            )),
        })
    }

    fn create_cq(&self, depth: usize) -> Result<SoftCq> {
        Ok(SoftCq::new(depth))
    }

    async fn listen(&self, addr: SocketAddr) -> Result<SoftListener> {
        SoftListener::bind(addr).await
    }

    async fn connect(
        &self,
        addr: SocketAddr,
        init: QpInit<Self>,
        private_data: &[u8],
    ) -> Result<SoftQp> {
        qp::connect(addr, init, private_data).await
    }
}

/// A soft protection domain: its own key table.
#[derive(Clone)]
pub struct SoftPd {
    keys: Arc<KeyTable>,
}

impl SoftPd {
    pub fn counters(&self) -> &DeviceCounters {
        self.keys.counters()
    }
}

impl ProtectionDomain for SoftPd {
    type Mr = SoftMr;

    fn register(&self, buf: AlignedBuf, access: AccessFlags) -> Result<SoftMr> {
        let (p, len) = (buf.as_ptr(), buf.len());
        // SAFETY: the region takes ownership of the buffer, so the memory lives as long as
        // the region does.
        let region = unsafe { self.keys.register(p, len, access, Some(buf), false) }?;
        Ok(SoftMr::new(self, region))
    }

    unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<SoftMr> {
        // SAFETY: forwarded contract of ProtectionDomain::register_raw.
        let region = unsafe { self.keys.register(addr, len, access, None, false) }?;
        Ok(SoftMr::new(self, region))
    }

    fn reserve_slots(&self, n: usize) -> Result<()> {
        self.keys.reserve(n);
        Ok(())
    }

    unsafe fn register_fast(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<SoftMr> {
        // SAFETY: forwarded contract of ProtectionDomain::register_raw.
        let region = unsafe { self.keys.register(addr, len, access, None, true) }?;
        Ok(SoftMr::new(self, region))
    }

    fn deregister_batch(&self, mrs: Vec<SoftMr>) -> Result<()> {
        let regions: Vec<Arc<Region>> = mrs.iter().map(|m| m.region.clone()).collect();
        self.keys.deregister_batch(&regions);
        // Their Drop now finds them already deregistered.
        drop(mrs);
        Ok(())
    }
}

/// A soft memory region. Dropping it deregisters it.
pub struct SoftMr {
    keys: Arc<KeyTable>,
    region: Arc<Region>,
}

impl SoftMr {
    fn new(pd: &SoftPd, region: Arc<Region>) -> SoftMr {
        SoftMr {
            keys: pd.keys.clone(),
            region,
        }
    }
    /// Whether the pages are really pinned (false when RLIMIT_MEMLOCK refused).
    pub fn is_pinned(&self) -> bool {
        self.region.pinned()
    }
}

impl std::fmt::Debug for SoftMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.region.fmt(f)
    }
}

impl MemoryRegion for SoftMr {
    fn addr(&self) -> u64 {
        self.region.addr()
    }
    fn len(&self) -> usize {
        self.region.len()
    }
    fn lkey(&self) -> u32 {
        self.region.lkey()
    }
    fn rkey(&self) -> u32 {
        self.region.rkey()
    }
    fn access(&self) -> AccessFlags {
        self.region.access()
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.region.local_read(offset, dst)
    }
    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.region.local_write(offset, src)
    }
    fn fence(&self) {
        self.region.fence()
    }
    fn invalidate_rkey(&self) -> Result<u32> {
        Ok(self.region.invalidate_rkey())
    }
    fn deregister(self) -> Result<()> {
        self.keys.deregister(&self.region);
        Ok(())
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        self.keys.deregister(&self.region);
    }
}

/// What `transport/fuzz` drives without a socket: the frame header's decoder and the
/// responder's side of a peer's RDMA READ and WRITE, the checks that stand between a
/// peer's (rkey, address, length) and this side's memory.
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    pub use super::wire::{Header, Kind, HEADER_LEN, MAX_PAYLOAD};
    use super::SoftPd;
    use crate::rdma::WcStatus;

    /// Serves a peer's RDMA WRITE into `pd`'s memory, as a connection's responder does.
    pub fn remote_write(pd: &SoftPd, rkey: u32, addr: u64, data: &[u8]) -> WcStatus {
        pd.keys.remote_write(rkey, addr, data)
    }

    /// Whether a peer's RDMA WRITE would be placed, as a connection's reader asks when the
    /// WRITE's header arrives, before its payload.
    pub fn remote_write_allowed(pd: &SoftPd, rkey: u32, addr: u64, len: usize) -> bool {
        pd.keys.remote_write_allowed(rkey, addr, len)
    }

    /// Serves a peer's RDMA READ of `out.len()` bytes from `pd`'s memory.
    pub fn remote_read(pd: &SoftPd, rkey: u32, addr: u64, out: &mut [u8]) -> WcStatus {
        pd.keys.remote_read(rkey, addr, out)
    }
}

/// Total pages currently pinned by a provider.
pub fn pinned_pages(p: &SoftProvider) -> u64 {
    p.counters.pinned_pages.load(Ordering::Relaxed)
}
