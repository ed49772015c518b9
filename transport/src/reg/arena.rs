//! Arena registration (ZKMR, RDMA-assisted iSCSI paper §3.2.3): one registration covers a pre-allocated arena that
//! I/O buffers are carved from; registering a buffer is a bounds check and an offset
//! computation. The rkey covers the whole arena (ZKMR's security cost), never memory
//! outside it, and cannot be invalidated per I/O.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use super::{Counters, RegHandle, RegStats, Registrar, Strategy};
use crate::rdma::{
    AccessFlags, AlignedBuf, MemoryRegion, ProtectionDomain, RdmaError, Result, PAGE_SIZE,
};

/// A buffer carved from an [`Arena`]; give it back with [`Arena::free`].
#[derive(Debug, PartialEq, Eq)]
pub struct ArenaBuf {
    offset: usize,
    len: usize,
    addr: u64,
}

impl ArenaBuf {
    pub fn offset(&self) -> usize {
        self.offset
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Pointer for [`Registrar::register`].
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr as usize as *mut u8
    }
}

pub struct Arena<P: ProtectionDomain> {
    mr: P::Mr,
    /// Free extents: offset -> length (page granular, coalesced).
    free: Mutex<BTreeMap<usize, usize>>,
    counters: Counters,
}

impl<P: ProtectionDomain> Arena<P> {
    /// Allocate and register an arena of `size` bytes (rounded up to pages).
    pub fn new(pd: &P, size: usize, access: AccessFlags) -> Result<Self> {
        let size = size.max(PAGE_SIZE).next_multiple_of(PAGE_SIZE);
        let counters = Counters::default();
        let t0 = Instant::now();
        let mr = pd.register(AlignedBuf::new(size), access)?;
        counters.registered(size, t0);
        let mut free = BTreeMap::new();
        free.insert(0, size);
        Ok(Arena {
            mr,
            free: Mutex::new(free),
            counters,
        })
    }

    /// The arena's memory region (CPU access to buffers goes through it).
    pub fn mr(&self) -> &P::Mr {
        &self.mr
    }

    /// Carve `len` bytes (page aligned, first fit).
    pub fn alloc(&self, len: usize) -> Option<ArenaBuf> {
        let want = len.max(1).next_multiple_of(PAGE_SIZE);
        let mut free = self.free.lock().unwrap();
        let (&off, &flen) = free.iter().find(|(_, &l)| l >= want)?;
        free.remove(&off);
        if flen > want {
            free.insert(off + want, flen - want);
        }
        Some(ArenaBuf {
            offset: off,
            len,
            addr: self.mr.addr() + off as u64,
        })
    }

    /// Return a buffer.
    pub fn free(&self, buf: ArenaBuf) {
        let len = buf.len.max(1).next_multiple_of(PAGE_SIZE);
        let mut free = self.free.lock().unwrap();
        let mut off = buf.offset;
        let mut len = len;
        if let Some((&poff, &plen)) = free.range(..off).next_back() {
            if poff + plen == off {
                free.remove(&poff);
                off = poff;
                len += plen;
            }
        }
        if let Some(&nlen) = free.get(&(off + len)) {
            free.remove(&(off + len));
            len += nlen;
        }
        free.insert(off, len);
    }

    /// Bytes not allocated.
    pub fn free_bytes(&self) -> usize {
        self.free.lock().unwrap().values().sum()
    }
}

impl<P: ProtectionDomain> Registrar for Arena<P> {
    fn strategy(&self) -> Strategy {
        Strategy::Arena
    }

    unsafe fn register(&self, addr: *mut u8, len: usize) -> Result<RegHandle> {
        let a = addr as u64;
        let base = self.mr.addr();
        let inside = a >= base
            && a.checked_add(len as u64)
                .is_some_and(|e| e <= base + self.mr.len() as u64);
        if !inside {
            self.counters.miss();
            return Err(RdmaError::InvalidArgument(format!(
                "{len} bytes at {a:#x} are not inside the registered arena"
            )));
        }
        self.counters.hit();
        Ok(RegHandle {
            addr: a,
            len,
            lkey: self.mr.lkey(),
            rkey: self.mr.rkey(),
            key: (a - base, 0),
        })
    }

    fn release(&self, _handle: RegHandle) -> Result<()> {
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn stats(&self) -> RegStats {
        self.counters.snapshot()
    }
}
