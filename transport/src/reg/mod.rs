//! The memory registration layer.
//!
//! One interface, [`Registrar`], four strategies:
//! * [`Dynamic`]: register before and deregister after every I/O;
//! * [`PinDownCache`]: keep registrations after release (lazy deregistration), LRU
//!   eviction at a capacity limit (PVFS-over-InfiniBand paper §5.3; MRC in the RDMA-assisted iSCSI paper);
//! * [`Fmrd`]: pre-allocated registration slots (fast registration) + cache +
//!   deregistration batched at a threshold (PVFS over InfiniBand §5.4);
//! * [`Arena`]: one registration over a pre-allocated arena, a buffer's registration is an
//!   offset computation (ZKMR, RDMA-assisted iSCSI paper §3.2.3; the key covers the arena, never all memory).
//!
//! Plus [`coalesce`] (buffer re-organization, RDMA-assisted iSCSI paper §4.3) and [`BufferPool`], the target's
//! pre-registered aligned buffers in size classes (PVFS-over-InfiniBand paper §5.2).

mod arena;
mod cache;
mod dynamic;
mod iospace;
mod pool;
mod reorg;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

pub use arena::{Arena, ArenaBuf};
pub use cache::{Fmrd, FmrdConfig, PinDownCache};
pub use dynamic::Dynamic;
pub use iospace::{IoBuf, IoSpace, RegConfig, SgRegistration};
pub use pool::{BufferPool, PoolBuf, PoolConfig, PoolStats};
pub use reorg::{coalesce, plan_ops, Chunk, RdmaOp};

use crate::rdma::{RemoteBuf, Result, Sge};

/// Which strategy a registrar implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    Dynamic,
    PinDownCache,
    Fmrd,
    Arena,
}

impl Strategy {
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Dynamic => "dynamic",
            Strategy::PinDownCache => "pin-down cache",
            Strategy::Fmrd => "FMRD",
            Strategy::Arena => "arena (ZKMR)",
        }
    }
}

/// A registered buffer: what an I/O needs to build local SGEs and a remote descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegHandle {
    pub addr: u64,
    pub len: usize,
    pub lkey: u32,
    pub rkey: u32,
    /// Strategy-private identification of the registration.
    pub(crate) key: (u64, u64),
}

impl RegHandle {
    /// A handle for memory registered outside any registrar (e.g. a pre-registered
    /// region); no registrar accepts it in `release`.
    pub fn from_parts(addr: u64, len: usize, lkey: u32, rkey: u32) -> RegHandle {
        RegHandle {
            addr,
            len,
            lkey,
            rkey,
            key: (u64::MAX, u64::MAX),
        }
    }
    /// One SGE covering the buffer (`len` must fit in u32).
    pub fn sge(&self) -> Sge {
        Sge {
            addr: self.addr,
            length: self.len as u32,
            lkey: self.lkey,
        }
    }
    /// The descriptor a peer uses to access the buffer.
    pub fn remote(&self) -> RemoteBuf {
        RemoteBuf {
            addr: self.addr,
            len: self.len as u64,
            rkey: self.rkey,
        }
    }
}

/// The registration interface shared by all strategies.
pub trait Registrar: Send + Sync {
    fn strategy(&self) -> Strategy;

    /// Register `addr..addr+len` for an I/O.
    ///
    /// # Safety
    /// The memory must stay allocated until [`flush`](Self::flush) returns or the registrar
    /// is dropped (cached strategies keep registrations after `release`), and the contract
    /// of [`ProtectionDomain::register_raw`](crate::rdma::ProtectionDomain::register_raw)
    /// holds while it is registered.
    unsafe fn register(&self, addr: *mut u8, len: usize) -> Result<RegHandle>;

    /// The I/O is done. The handle's rkey stops working (deregistration, or rkey
    /// invalidation for cached registrations where the provider supports it).
    fn release(&self, handle: RegHandle) -> Result<()>;

    /// Deregister everything not in use.
    fn flush(&self) -> Result<()>;

    fn stats(&self) -> RegStats;
}

/// Counters per strategy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegStats {
    /// Calls into the provider's register (full or fast).
    pub registrations: u64,
    pub deregistrations: u64,
    /// Deregistration calls (a batch counts once).
    pub dereg_calls: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Bytes currently registered (pinned) by this registrar.
    pub bytes_pinned: u64,
    pub peak_bytes_pinned: u64,
    /// Time spent inside the provider's register / deregister calls.
    pub reg_ns: u64,
    pub dereg_ns: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    registrations: AtomicU64,
    deregistrations: AtomicU64,
    dereg_calls: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    bytes_pinned: AtomicU64,
    peak_bytes_pinned: AtomicU64,
    reg_ns: AtomicU64,
    dereg_ns: AtomicU64,
}

impl Counters {
    pub(crate) fn registered(&self, bytes: usize, t0: Instant) {
        self.reg_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.registrations.fetch_add(1, Ordering::Relaxed);
        let now = self.bytes_pinned.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
        self.peak_bytes_pinned.fetch_max(now, Ordering::Relaxed);
    }
    pub(crate) fn deregistered(&self, count: u64, bytes: u64, t0: Instant) {
        self.dereg_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.deregistrations.fetch_add(count, Ordering::Relaxed);
        self.dereg_calls.fetch_add(1, Ordering::Relaxed);
        self.bytes_pinned.fetch_sub(bytes, Ordering::Relaxed);
    }
    pub(crate) fn hit(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn miss(&self) {
        self.misses.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn evicted(&self) {
        self.evictions.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn snapshot(&self) -> RegStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RegStats {
            registrations: l(&self.registrations),
            deregistrations: l(&self.deregistrations),
            dereg_calls: l(&self.dereg_calls),
            hits: l(&self.hits),
            misses: l(&self.misses),
            evictions: l(&self.evictions),
            bytes_pinned: l(&self.bytes_pinned),
            peak_bytes_pinned: l(&self.peak_bytes_pinned),
            reg_ns: l(&self.reg_ns),
            dereg_ns: l(&self.dereg_ns),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdma::soft::SoftProvider;
    use crate::rdma::{AccessFlags, AlignedBuf, RdmaProvider};

    /// Threads share one registrar of each kind over a few buffers; afterwards the counters
    /// add up and everything is deregistered. (Run under Miri for data-race checking.)
    #[test]
    fn concurrent_register_release() {
        let p = SoftProvider::default();
        let pd = p.alloc_pd().unwrap();
        let bufs: Vec<AlignedBuf> = (0..6).map(|_| AlignedBuf::new(4096)).collect();
        let ptrs: Vec<usize> = bufs.iter().map(|b| b.as_ptr() as usize).collect();
        let regs: Vec<Box<dyn Registrar>> = vec![
            Box::new(Dynamic::new(pd.clone(), AccessFlags::ALL)),
            Box::new(PinDownCache::new(pd.clone(), AccessFlags::ALL, 3)),
            Box::new(
                Fmrd::new(
                    pd.clone(),
                    AccessFlags::ALL,
                    FmrdConfig {
                        capacity: 3,
                        slots: 4,
                        dereg_threshold: 2,
                    },
                )
                .unwrap(),
            ),
        ];
        let per_thread = if cfg!(miri) { 12 } else { 500 };
        for r in &regs {
            std::thread::scope(|s| {
                for t in 0..3usize {
                    let r = &**r;
                    let ptrs = &ptrs;
                    s.spawn(move || {
                        for i in 0..per_thread {
                            let p = ptrs[(i * 7 + t) % ptrs.len()] as *mut u8;
                            // SAFETY: `bufs` outlives the registrars' use (flushed below).
                            let h = unsafe { r.register(p, 4096) }.unwrap();
                            assert_eq!(h.addr, p as u64);
                            r.release(h).unwrap();
                        }
                    });
                }
            });
            r.flush().unwrap();
            let st = r.stats();
            assert_eq!(
                st.hits + st.misses,
                3 * per_thread as u64,
                "{:?}",
                r.strategy()
            );
            assert_eq!(st.registrations, st.deregistrations, "{:?}", r.strategy());
            assert_eq!(st.bytes_pinned, 0);
        }
        drop(regs);
        drop(bufs);
    }
}
