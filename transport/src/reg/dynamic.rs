//! Dynamic registration: register before and deregister after every I/O.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use super::{Counters, RegHandle, RegStats, Registrar, Strategy};
use crate::rdma::{AccessFlags, MemoryRegion, ProtectionDomain, RdmaError, Result};

pub struct Dynamic<P: ProtectionDomain> {
    pd: P,
    access: AccessFlags,
    live: Mutex<HashMap<u64, P::Mr>>,
    next: AtomicU64,
    counters: Counters,
}

impl<P: ProtectionDomain> Dynamic<P> {
    pub fn new(pd: P, access: AccessFlags) -> Self {
        Dynamic {
            pd,
            access,
            live: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            counters: Counters::default(),
        }
    }
}

impl<P: ProtectionDomain> Registrar for Dynamic<P> {
    fn strategy(&self) -> Strategy {
        Strategy::Dynamic
    }

    unsafe fn register(&self, addr: *mut u8, len: usize) -> Result<RegHandle> {
        let t0 = Instant::now();
        // SAFETY: forwarded contract; the region is deregistered in release/flush/drop,
        // before the caller may free the memory.
        let mr = unsafe { self.pd.register_raw(addr, len, self.access) }?;
        self.counters.registered(len, t0);
        self.counters.miss();
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let h = RegHandle {
            addr: mr.addr(),
            len,
            lkey: mr.lkey(),
            rkey: mr.rkey(),
            key: (id, 0),
        };
        self.live.lock().unwrap().insert(id, mr);
        Ok(h)
    }

    fn release(&self, handle: RegHandle) -> Result<()> {
        let mr = self
            .live
            .lock()
            .unwrap()
            .remove(&handle.key.0)
            .ok_or_else(|| RdmaError::InvalidArgument("unknown registration handle".into()))?;
        let t0 = Instant::now();
        let bytes = mr.len() as u64;
        mr.deregister()?;
        self.counters.deregistered(1, bytes, t0);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn stats(&self) -> RegStats {
        self.counters.snapshot()
    }
}
