//! The memory registration layer.
//!
//! One interface, [`Registrar`], four strategies:
//! * [`Dynamic`]: register before and deregister after every I/O;
//! * [`PinDownCache`]: keep registrations after release (lazy deregistration), LRU
//!   eviction at a capacity limit (P2 §5.3, P3 MRC);
//! * [`Fmrd`]: pre-allocated registration slots (fast registration) + cache +
//!   deregistration batched at a threshold (PVFS over InfiniBand §5.4);
//! * [`Arena`]: one registration over a pre-allocated arena, a buffer's registration is an
//!   offset computation (ZKMR, P3 §3.2.3; the key covers the arena, never all memory).
//!
//! Plus [`coalesce`] (buffer re-organization, P3 §4.3) and [`BufferPool`], the target's
//! pre-registered aligned buffers in size classes (P2 §5.2).

mod arena;
mod cache;
mod dynamic;
mod pool;
mod reorg;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

pub use arena::{Arena, ArenaBuf};
pub use cache::{Fmrd, FmrdConfig, PinDownCache};
pub use dynamic::Dynamic;
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
