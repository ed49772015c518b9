//! The target's pre-registered buffer pool (PVFS-over-InfiniBand paper §5.2): aligned buffers in size classes
//! (zones), registered once at start. A request takes a buffer from the smallest class that
//! fits, else from a bigger class, else the transfer is split over several smaller buffers
//! (a transfer bigger than the largest class is always split).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::rdma::{
    AccessFlags, AlignedBuf, MemoryRegion, ProtectionDomain, RdmaError, RemoteBuf, Result, Sge,
};

/// Size classes: (buffer size, count). Sizes are rounded up to 4 KiB.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    pub classes: Vec<(usize, usize)>,
    /// What the pool's registrations allow. By default `LOCAL_WRITE`
    /// alone: a target's staging buffers are the local ends of the RDMA
    /// Writes and Reads it starts itself, and their keys, which a peer can
    /// guess, must open them to no peer (the pool is shared by every
    /// connection on the protection domain).
    pub access: AccessFlags,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            classes: vec![(4 << 10, 128), (64 << 10, 32), (256 << 10, 8), (1 << 20, 4)],
            access: AccessFlags::LOCAL_WRITE,
        }
    }
}

/// Pool counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub allocations: u64,
    /// Served from a bigger class than the best fit.
    pub bigger_class: u64,
    /// Transfers split over several buffers.
    pub splits: u64,
    /// Allocation attempts that found too few free buffers.
    pub exhausted: u64,
}

struct Class<M> {
    size: usize,
    mr: M,
    free: Mutex<Vec<u32>>,
    count: usize,
}

struct Inner<M> {
    classes: Vec<Class<M>>, // ascending size
    notify: Notify,
    allocations: AtomicU64,
    bigger_class: AtomicU64,
    splits: AtomicU64,
    exhausted: AtomicU64,
}

/// A pool of pre-registered buffers. Cheap to clone.
pub struct BufferPool<P: ProtectionDomain> {
    inner: Arc<Inner<P::Mr>>,
}

impl<P: ProtectionDomain> Clone for BufferPool<P> {
    fn clone(&self) -> Self {
        BufferPool {
            inner: self.inner.clone(),
        }
    }
}

/// A buffer from the pool, returned on drop. `len` bytes of `capacity` are in use.
pub struct PoolBuf<P: ProtectionDomain> {
    inner: Arc<Inner<P::Mr>>,
    class: usize,
    index: u32,
    len: usize,
    /// Returned by a failed allocation: do not wake waiters (they would retry and fail
    /// again, forever).
    quiet: bool,
}

impl<P: ProtectionDomain> BufferPool<P> {
    /// Allocate and register every class (one registration per class).
    pub fn new(pd: &P, cfg: &PoolConfig) -> Result<Self> {
        let mut specs: Vec<(usize, usize)> = cfg
            .classes
            .iter()
            .filter(|(s, c)| *s > 0 && *c > 0)
            .map(|&(s, c)| (s.next_multiple_of(4096), c))
            .collect();
        specs.sort_unstable();
        specs.dedup_by_key(|s| s.0);
        if specs.is_empty() {
            return Err(RdmaError::InvalidArgument("empty pool".into()));
        }
        let mut classes = Vec::with_capacity(specs.len());
        for (size, count) in specs {
            let mr = pd.register(AlignedBuf::new(size * count), cfg.access)?;
            classes.push(Class {
                size,
                mr,
                free: Mutex::new((0..count as u32).rev().collect()),
                count,
            });
        }
        Ok(BufferPool {
            inner: Arc::new(Inner {
                classes,
                notify: Notify::new(),
                allocations: AtomicU64::new(0),
                bigger_class: AtomicU64::new(0),
                splits: AtomicU64::new(0),
                exhausted: AtomicU64::new(0),
            }),
        })
    }

    /// Bytes of all the buffers together.
    pub fn total_bytes(&self) -> usize {
        self.inner.classes.iter().map(|c| c.size * c.count).sum()
    }

    /// Sizes of the classes, ascending.
    pub fn class_sizes(&self) -> Vec<usize> {
        self.inner.classes.iter().map(|c| c.size).collect()
    }

    /// Free buffers per class.
    pub fn free_counts(&self) -> Vec<usize> {
        self.inner
            .classes
            .iter()
            .map(|c| c.free.lock().unwrap().len())
            .collect()
    }

    pub fn stats(&self) -> PoolStats {
        let i = &self.inner;
        PoolStats {
            allocations: i.allocations.load(Ordering::Relaxed),
            bigger_class: i.bigger_class.load(Ordering::Relaxed),
            splits: i.splits.load(Ordering::Relaxed),
            exhausted: i.exhausted.load(Ordering::Relaxed),
        }
    }

    fn take(&self, class: usize, len: usize) -> Option<PoolBuf<P>> {
        let index = self.inner.classes[class].free.lock().unwrap().pop()?;
        Some(PoolBuf {
            inner: self.inner.clone(),
            class,
            index,
            len,
            quiet: false,
        })
    }

    /// Buffers for a `len`-byte transfer (in transfer order), or `None` when too few are
    /// free right now. Zero-length transfers get no buffers.
    pub fn try_alloc(&self, len: usize) -> Option<Vec<PoolBuf<P>>> {
        if len == 0 {
            return Some(Vec::new());
        }
        let classes = &self.inner.classes;
        let fit = classes.iter().position(|c| c.size >= len);
        if let Some(fit) = fit {
            for ci in fit..classes.len() {
                if let Some(b) = self.take(ci, len) {
                    self.inner.allocations.fetch_add(1, Ordering::Relaxed);
                    if ci != fit {
                        self.inner.bigger_class.fetch_add(1, Ordering::Relaxed);
                    }
                    return Some(vec![b]);
                }
            }
        }
        // Split: largest free buffers first, the tail into the smallest class that holds it.
        let mut got: Vec<PoolBuf<P>> = Vec::new();
        let mut left = len;
        while left > 0 {
            let tail = classes
                .iter()
                .enumerate()
                .filter(|(_, c)| c.size >= left)
                .find_map(|(ci, _)| self.take(ci, left));
            if let Some(b) = tail {
                got.push(b);
                left = 0;
                break;
            }
            let piece = (0..classes.len())
                .rev()
                .filter(|&ci| classes[ci].size < left)
                .find_map(|ci| self.take(ci, classes[ci].size));
            match piece {
                Some(b) => {
                    left -= b.len;
                    got.push(b);
                }
                None => break,
            }
        }
        if left > 0 {
            self.inner.exhausted.fetch_add(1, Ordering::Relaxed);
            for b in &mut got {
                b.quiet = true;
            }
            return None; // `got` returns to the pool on drop
        }
        self.inner.allocations.fetch_add(1, Ordering::Relaxed);
        self.inner.splits.fetch_add(1, Ordering::Relaxed);
        Some(got)
    }

    /// Like [`try_alloc`](Self::try_alloc) but waits for buffers to come back. Fails if
    /// the pool is too small for `len` even when completely free.
    pub async fn alloc(&self, len: usize) -> Result<Vec<PoolBuf<P>>> {
        let total = self.total_bytes();
        if len > total {
            return Err(RdmaError::InvalidArgument(format!(
                "{len} bytes exceed the whole pool ({total})"
            )));
        }
        loop {
            let returned = self.inner.notify.notified();
            if let Some(v) = self.try_alloc(len) {
                return Ok(v);
            }
            returned.await;
        }
    }
}

impl<P: ProtectionDomain> PoolBuf<P> {
    fn class(&self) -> &Class<P::Mr> {
        &self.inner.classes[self.class]
    }
    fn offset(&self) -> usize {
        self.index as usize * self.class().size
    }
    /// Bytes of the transfer this buffer carries.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Size of the buffer's class.
    pub fn capacity(&self) -> usize {
        self.class().size
    }
    pub fn addr(&self) -> u64 {
        self.class().mr.addr() + self.offset() as u64
    }
    pub fn lkey(&self) -> u32 {
        self.class().mr.lkey()
    }
    /// SGE over the used bytes.
    pub fn sge(&self) -> Sge {
        Sge {
            addr: self.addr(),
            length: self.len as u32,
            lkey: self.lkey(),
        }
    }
    /// Descriptor over the used bytes (for a peer-initiated transfer).
    pub fn remote(&self) -> RemoteBuf {
        RemoteBuf {
            addr: self.addr(),
            len: self.len as u64,
            rkey: self.class().mr.rkey(),
        }
    }
    /// CPU read of the buffer at `off` (bounded by `len`).
    pub fn read_at(&self, off: usize, dst: &mut [u8]) -> Result<()> {
        if off.checked_add(dst.len()).is_none_or(|e| e > self.len) {
            return Err(RdmaError::InvalidArgument("read past the buffer".into()));
        }
        self.class().mr.read_at(self.offset() + off, dst)
    }
    /// CPU write of the buffer at `off` (bounded by `len`).
    pub fn write_at(&self, off: usize, src: &[u8]) -> Result<()> {
        if off.checked_add(src.len()).is_none_or(|e| e > self.len) {
            return Err(RdmaError::InvalidArgument("write past the buffer".into()));
        }
        self.class().mr.write_at(self.offset() + off, src)
    }
}

impl<P: ProtectionDomain> Drop for PoolBuf<P> {
    fn drop(&mut self) {
        self.inner.classes[self.class]
            .free
            .lock()
            .unwrap()
            .push(self.index);
        if !self.quiet {
            self.inner.notify.notify_waiters();
        }
    }
}
