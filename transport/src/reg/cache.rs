//! Registration caches: the pin-down cache (lazy deregistration, LRU, capacity limit) and
//! FMRD (fast registration into pre-allocated slots + cache + batched deregistration).
//!
//! Both keep a registration after `release` so a later I/O on the same buffer (or on a
//! sub-range of it) hits. When the last user releases an entry its rkey is invalidated
//! where the provider supports it, so a completed command's key cannot be replayed.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use super::{Counters, RegHandle, RegStats, Registrar, Strategy};
use crate::rdma::{AccessFlags, MemoryRegion, ProtectionDomain, RdmaError, Result};

type Key = (u64, u64); // (start, end)

struct Entry<M> {
    mr: M,
    refs: u32,
    tick: u64,
}

struct State<M> {
    entries: BTreeMap<Key, Entry<M>>,
    lru: BTreeMap<u64, Key>,
    tick: u64,
    /// FMRD: evicted registrations waiting for the batched deregistration.
    dereg_list: Vec<M>,
}

#[derive(Clone, Copy)]
enum Mode {
    PinDown,
    Fmrd { threshold: usize },
}

struct Core<P: ProtectionDomain> {
    pd: P,
    access: AccessFlags,
    capacity: usize,
    mode: Mode,
    counters: Counters,
    state: Mutex<State<P::Mr>>,
}

/// How far back a lookup scans for an entry covering a sub-range.
const COVER_SCAN: usize = 16;

impl<P: ProtectionDomain> Core<P> {
    fn new(pd: P, access: AccessFlags, capacity: usize, mode: Mode) -> Self {
        Core {
            pd,
            access,
            capacity: capacity.max(1),
            mode,
            counters: Counters::default(),
            state: Mutex::new(State {
                entries: BTreeMap::new(),
                lru: BTreeMap::new(),
                tick: 0,
                dereg_list: Vec::new(),
            }),
        }
    }

    fn handle(mr: &P::Mr, key: Key, addr: u64, len: usize) -> RegHandle {
        RegHandle {
            addr,
            len,
            lkey: mr.lkey(),
            rkey: mr.rkey(),
            key,
        }
    }

    /// # Safety
    /// See `Registrar::register`.
    unsafe fn register(&self, ptr: *mut u8, len: usize) -> Result<RegHandle> {
        let addr = ptr as u64;
        let end = addr
            .checked_add(len as u64)
            .ok_or_else(|| RdmaError::InvalidArgument("range wraps".into()))?;
        let mut st = self.state.lock().unwrap();
        st.tick += 1;
        let tick = st.tick;
        let hit = st
            .entries
            .range(..=(addr, u64::MAX))
            .rev()
            .take(COVER_SCAN)
            .find(|(k, _)| k.1 >= end)
            .map(|(k, _)| *k);
        if let Some(key) = hit {
            let e = st.entries.get_mut(&key).unwrap();
            e.refs += 1;
            let old = std::mem::replace(&mut e.tick, tick);
            let h = Self::handle(&e.mr, key, addr, len);
            st.lru.remove(&old);
            st.lru.insert(tick, key);
            self.counters.hit();
            return Ok(h);
        }
        self.counters.miss();
        if st.entries.len() >= self.capacity {
            self.evict_one(&mut st)?;
        }
        let t0 = Instant::now();
        // SAFETY: forwarded contract: the memory stays allocated until flush/drop, which
        // deregister every cached region.
        let mr = unsafe {
            match self.mode {
                Mode::PinDown => self.pd.register_raw(ptr, len, self.access),
                Mode::Fmrd { .. } => self.pd.register_fast(ptr, len, self.access),
            }
        }?;
        self.counters.registered(len, t0);
        let key = (addr, end);
        let h = Self::handle(&mr, key, addr, len);
        st.entries.insert(key, Entry { mr, refs: 1, tick });
        st.lru.insert(tick, key);
        Ok(h)
    }

    /// Evict the least recently used entry nobody is using (if any).
    fn evict_one(&self, st: &mut State<P::Mr>) -> Result<()> {
        let victim = st
            .lru
            .iter()
            .find(|(_, k)| st.entries[k].refs == 0)
            .map(|(t, k)| (*t, *k));
        let Some((tick, key)) = victim else {
            return Ok(()); // everything in use: run over capacity until releases
        };
        st.lru.remove(&tick);
        let e = st.entries.remove(&key).unwrap();
        self.counters.evicted();
        self.retire(st, vec![e.mr])
    }

    /// Deregister now (pin-down cache) or queue for the batch (FMRD).
    fn retire(&self, st: &mut State<P::Mr>, mrs: Vec<P::Mr>) -> Result<()> {
        match self.mode {
            Mode::PinDown => {
                for mr in mrs {
                    let t0 = Instant::now();
                    let bytes = mr.len() as u64;
                    mr.deregister()?;
                    self.counters.deregistered(1, bytes, t0);
                }
                Ok(())
            }
            Mode::Fmrd { threshold } => {
                st.dereg_list.extend(mrs);
                if st.dereg_list.len() >= threshold {
                    self.deregister_batch(st)?;
                }
                Ok(())
            }
        }
    }

    fn deregister_batch(&self, st: &mut State<P::Mr>) -> Result<()> {
        if st.dereg_list.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut st.dereg_list);
        let n = batch.len();
        let bytes: u64 = batch.iter().map(|m| m.len() as u64).sum();
        let t0 = Instant::now();
        self.pd.deregister_batch(batch)?;
        // The freed slots go back to the pre-allocated pool.
        self.pd.reserve_slots(n)?;
        self.counters.deregistered(n as u64, bytes, t0);
        Ok(())
    }

    fn release(&self, h: RegHandle) -> Result<()> {
        let mut st = self.state.lock().unwrap();
        let e = st
            .entries
            .get_mut(&h.key)
            .ok_or_else(|| RdmaError::InvalidArgument("unknown registration handle".into()))?;
        if e.refs == 0 {
            return Err(RdmaError::InvalidArgument("handle released twice".into()));
        }
        e.refs -= 1;
        if e.refs == 0 {
            match e.mr.invalidate_rkey() {
                Ok(_) | Err(RdmaError::Unsupported(_)) => {}
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        let mut st = self.state.lock().unwrap();
        let idle: Vec<Key> = st
            .entries
            .iter()
            .filter(|(_, e)| e.refs == 0)
            .map(|(k, _)| *k)
            .collect();
        let mut mrs = Vec::with_capacity(idle.len());
        for k in idle {
            let e = st.entries.remove(&k).unwrap();
            st.lru.remove(&e.tick);
            mrs.push(e.mr);
        }
        self.retire(&mut st, mrs)?;
        if let Mode::Fmrd { .. } = self.mode {
            self.deregister_batch(&mut st)?;
        }
        Ok(())
    }

    fn cached(&self) -> usize {
        self.state.lock().unwrap().entries.len()
    }
}

/// Pin-down cache: lazy deregistration, LRU eviction at `capacity` entries.
pub struct PinDownCache<P: ProtectionDomain> {
    core: Core<P>,
}

impl<P: ProtectionDomain> PinDownCache<P> {
    pub fn new(pd: P, access: AccessFlags, capacity: usize) -> Self {
        PinDownCache {
            core: Core::new(pd, access, capacity, Mode::PinDown),
        }
    }
    /// Registrations currently cached.
    pub fn cached(&self) -> usize {
        self.core.cached()
    }
}

impl<P: ProtectionDomain> Registrar for PinDownCache<P> {
    fn strategy(&self) -> Strategy {
        Strategy::PinDownCache
    }
    unsafe fn register(&self, addr: *mut u8, len: usize) -> Result<RegHandle> {
        // SAFETY: forwarded contract.
        unsafe { self.core.register(addr, len) }
    }
    fn release(&self, handle: RegHandle) -> Result<()> {
        self.core.release(handle)
    }
    fn flush(&self) -> Result<()> {
        self.core.flush()
    }
    fn stats(&self) -> RegStats {
        self.core.counters.snapshot()
    }
}

/// FMRD parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FmrdConfig {
    /// Cache capacity (entries).
    pub capacity: usize,
    /// Registration slots pre-allocated at start (fast registration, step 1).
    pub slots: usize,
    /// Evicted registrations are deregistered together when this many are queued.
    pub dereg_threshold: usize,
}

impl Default for FmrdConfig {
    fn default() -> Self {
        FmrdConfig {
            capacity: 100,
            slots: 128,
            dereg_threshold: 16,
        }
    }
}

/// FMRD: fast registration + cache + batched deregistration.
pub struct Fmrd<P: ProtectionDomain> {
    core: Core<P>,
}

impl<P: ProtectionDomain> Fmrd<P> {
    pub fn new(pd: P, access: AccessFlags, cfg: FmrdConfig) -> Result<Self> {
        pd.reserve_slots(cfg.slots)?;
        Ok(Fmrd {
            core: Core::new(
                pd,
                access,
                cfg.capacity,
                Mode::Fmrd {
                    threshold: cfg.dereg_threshold.max(1),
                },
            ),
        })
    }
    pub fn cached(&self) -> usize {
        self.core.cached()
    }
    /// Evicted registrations waiting for the batch.
    pub fn pending_deregistrations(&self) -> usize {
        self.core.state.lock().unwrap().dereg_list.len()
    }
}

impl<P: ProtectionDomain> Registrar for Fmrd<P> {
    fn strategy(&self) -> Strategy {
        Strategy::Fmrd
    }
    unsafe fn register(&self, addr: *mut u8, len: usize) -> Result<RegHandle> {
        // SAFETY: forwarded contract.
        unsafe { self.core.register(addr, len) }
    }
    fn release(&self, handle: RegHandle) -> Result<()> {
        self.core.release(handle)
    }
    fn flush(&self) -> Result<()> {
        self.core.flush()
    }
    fn stats(&self) -> RegStats {
        self.core.counters.snapshot()
    }
}
