//! The soft provider's memory: registered regions, the key table, page pinning, and the
//! validated copies in and out of registered memory.
//!
//! This is the only place of the soft backend with `unsafe`: raw copies between a
//! registered region and a Rust slice. Every copy is preceded by a key, bounds and
//! permission check and runs under the region's lock (shared for reads, exclusive for
//! writes), so two provider accesses never race, and deregistration (which takes the lock
//! exclusively after removing the key from the table) waits for in-flight accesses.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::rdma::{AccessFlags, AlignedBuf, RdmaError, Result, Sge, WcStatus, PAGE_SIZE};

/// Tunables of the soft provider.
#[derive(Clone, Debug, Default)]
pub struct SoftConfig {
    /// Extra time spent per full registration (emulates an adapter's translation-table
    /// setup; 0 = only the real costs: mlock and the key table).
    pub reg_cost: Duration,
    /// Extra time per fast registration into a reserved slot.
    pub fast_reg_cost: Duration,
    /// Extra time per deregistration call (a batch pays it once).
    pub dereg_cost: Duration,
    /// Do not mlock registered pages (pinning is then only accounted).
    pub no_pin: bool,
}

fn spin(d: Duration) {
    if d.is_zero() {
        return;
    }
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Counters of one device (all protection domains).
#[derive(Debug, Default)]
pub struct DeviceCounters {
    pub registrations: AtomicU64,
    pub deregistrations: AtomicU64,
    pub pinned_pages: AtomicU64,
    pub pin_failures: AtomicU64,
}

/// Page pinning with per-page reference counts (mlock does not nest: two regions sharing a
/// page must not unpin it for each other).
#[derive(Debug, Default)]
pub(crate) struct PinTable {
    pages: Mutex<HashMap<usize, u32>>,
    warned: AtomicBool,
}

impl PinTable {
    /// Pin the pages of `addr..addr+len`. Returns false (after a one-time warning) when the
    /// kernel refuses, e.g. because RLIMIT_MEMLOCK is too small; nothing stays pinned then.
    fn pin(&self, addr: usize, len: usize, counters: &DeviceCounters) -> bool {
        if len == 0 {
            return true;
        }
        let first = addr / PAGE_SIZE;
        let last = (addr + len - 1) / PAGE_SIZE;
        let mut pages = self.pages.lock().unwrap();
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for p in first..=last {
            let c = pages.entry(p).or_insert(0);
            *c += 1;
            if *c == 1 {
                match runs.last_mut() {
                    Some((_, end)) if *end == p => *end = p + 1,
                    _ => runs.push((p, p + 1)),
                }
            }
        }
        let mut locked = 0;
        let mut ok = true;
        for (i, &(s, e)) in runs.iter().enumerate() {
            if let Err(err) = os::mlock(s * PAGE_SIZE, (e - s) * PAGE_SIZE) {
                ok = false;
                self.warn(&err);
                break;
            }
            locked = i + 1;
        }
        if !ok {
            for &(s, e) in &runs[..locked] {
                os::munlock(s * PAGE_SIZE, (e - s) * PAGE_SIZE);
            }
            for p in first..=last {
                if let Some(c) = pages.get_mut(&p) {
                    *c -= 1;
                    if *c == 0 {
                        pages.remove(&p);
                    }
                }
            }
            counters.pin_failures.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let newly: usize = runs.iter().map(|(s, e)| e - s).sum();
        counters
            .pinned_pages
            .fetch_add(newly as u64, Ordering::Relaxed);
        true
    }

    fn unpin(&self, addr: usize, len: usize, counters: &DeviceCounters) {
        if len == 0 {
            return;
        }
        let first = addr / PAGE_SIZE;
        let last = (addr + len - 1) / PAGE_SIZE;
        let mut pages = self.pages.lock().unwrap();
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for p in first..=last {
            let Some(c) = pages.get_mut(&p) else { continue };
            *c -= 1;
            if *c == 0 {
                pages.remove(&p);
                match runs.last_mut() {
                    Some((_, end)) if *end == p => *end = p + 1,
                    _ => runs.push((p, p + 1)),
                }
            }
        }
        let freed: usize = runs.iter().map(|(s, e)| e - s).sum();
        for (s, e) in runs {
            os::munlock(s * PAGE_SIZE, (e - s) * PAGE_SIZE);
        }
        counters
            .pinned_pages
            .fetch_sub(freed as u64, Ordering::Relaxed);
    }

    fn warn(&self, err: &std::io::Error) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            let limit = os::memlock_limit()
                .map(|l| format!("{l} bytes"))
                .unwrap_or_else(|| "unknown".into());
            tracing::warn!(
                "soft RDMA: mlock failed ({err}); RLIMIT_MEMLOCK is {limit}. Registered \
                 memory is NOT pinned from now on when the limit is hit (raise it with \
                 `ulimit -l` or LimitMEMLOCK= for real pinning costs)"
            );
        }
    }
}

mod os {
    #[cfg(not(miri))]
    pub fn mlock(addr: usize, len: usize) -> std::io::Result<()> {
        // SAFETY: mlock only changes residency of the given pages; it never touches memory
        // contents and fails cleanly on unmapped ranges.
        let rc = unsafe { libc::mlock(addr as *const libc::c_void, len) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
    #[cfg(not(miri))]
    pub fn munlock(addr: usize, len: usize) {
        // SAFETY: as mlock.
        unsafe { libc::munlock(addr as *const libc::c_void, len) };
    }
    #[cfg(not(miri))]
    pub fn raise_memlock_limit(bytes: u64) -> Option<u64> {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit read and write the struct we pass.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) != 0 {
                return None;
            }
            if rl.rlim_cur < bytes as libc::rlim_t {
                let want = libc::rlimit {
                    rlim_cur: bytes as libc::rlim_t,
                    rlim_max: rl.rlim_max.max(bytes as libc::rlim_t),
                };
                if libc::setrlimit(libc::RLIMIT_MEMLOCK, &want) != 0 {
                    // Without privilege: up to the hard limit.
                    let capped = libc::rlimit {
                        rlim_cur: rl.rlim_max,
                        rlim_max: rl.rlim_max,
                    };
                    libc::setrlimit(libc::RLIMIT_MEMLOCK, &capped);
                }
            }
        }
        memlock_limit()
    }
    #[cfg(not(miri))]
    pub fn memlock_limit() -> Option<u64> {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we pass.
        let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) };
        (rc == 0).then_some(rl.rlim_cur)
    }
    // Miri cannot run these system calls: pinning is only accounted there.
    #[cfg(miri)]
    pub fn mlock(_: usize, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    #[cfg(miri)]
    pub fn munlock(_: usize, _: usize) {}
    #[cfg(miri)]
    pub fn memlock_limit() -> Option<u64> {
        None
    }
    #[cfg(miri)]
    pub fn raise_memlock_limit(_: u64) -> Option<u64> {
        None
    }
}

/// Try to raise RLIMIT_MEMLOCK to at least `bytes` (needs privilege beyond the hard
/// limit); returns the resulting soft limit.
pub fn raise_memlock_limit(bytes: u64) -> Option<u64> {
    os::raise_memlock_limit(bytes)
}

/// The current RLIMIT_MEMLOCK soft limit in bytes, if known.
pub fn memlock_limit() -> Option<u64> {
    os::memlock_limit()
}

/// One registered region.
pub(crate) struct Region {
    /// Start of the region, with the provenance of the registered memory.
    base: *mut u8,
    addr: usize,
    len: usize,
    access: AccessFlags,
    lkey: u32,
    rkey: AtomicU32,
    /// The slot's key generations, shared with the slot: a new rkey takes the next one,
    /// so no key the slot gave out before comes back within 256 issues.
    generations: Arc<Generations>,
    /// `true` while registered. Provider accesses hold it shared (reads) or exclusive
    /// (writes); deregistration and rkey invalidation hold it exclusive.
    live: RwLock<bool>,
    pinned: bool,
    /// Keeps an owned buffer alive (None for caller memory).
    _owned: Option<AlignedBuf>,
}

// SAFETY: `base` is only dereferenced in copy_in/copy_out under the `live` lock, which
// serialises writers against every other access; the memory itself is owned by the region
// or guaranteed by the registrant (register_raw's contract), not by a thread.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    pub fn addr(&self) -> u64 {
        self.addr as u64
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn access(&self) -> AccessFlags {
        self.access
    }
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
    pub fn rkey(&self) -> u32 {
        self.rkey.load(Ordering::Acquire)
    }
    pub fn pinned(&self) -> bool {
        self.pinned
    }

    /// Offset of `addr..addr+len` inside the region, if it lies inside.
    fn offset_of(&self, addr: u64, len: usize) -> Option<usize> {
        let off = addr.checked_sub(self.addr as u64)? as usize;
        let end = off.checked_add(len)?;
        (end <= self.len).then_some(off)
    }

    /// Copy `dst.len()` bytes from region offset `off` (bounds already checked, lock held).
    fn copy_out(&self, off: usize, dst: &mut [u8]) {
        debug_assert!(off + dst.len() <= self.len);
        // SAFETY: the region was registered with the guarantee that addr..addr+len stays
        // allocated while registered; the caller holds the `live` lock (shared or
        // exclusive) and saw `true`, so the region is still registered; the bounds were
        // checked; `dst` is a distinct Rust slice, so the ranges do not overlap unless the
        // caller aliases registered memory, which register_raw's contract forbids.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.base.add(off) as *const u8,
                dst.as_mut_ptr(),
                dst.len(),
            )
        }
    }

    /// Copy `src` into the region at `off` (bounds checked, exclusive lock held).
    fn copy_in(&self, off: usize, src: &[u8]) {
        debug_assert!(off + src.len() <= self.len);
        // SAFETY: as copy_out; the caller holds the `live` lock exclusively, so no other
        // provider access to the region runs concurrently.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.base.add(off), src.len()) }
    }

    /// CPU read of the region (MemoryRegion::read_at).
    pub fn local_read(&self, off: usize, dst: &mut [u8]) -> Result<()> {
        let live = self.live.read().unwrap();
        if !*live {
            return Err(RdmaError::InvalidArgument("region deregistered".into()));
        }
        let end = off.checked_add(dst.len()).filter(|&e| e <= self.len);
        if end.is_none() {
            return Err(RdmaError::InvalidArgument(format!(
                "read of {} bytes at {off} outside region of {}",
                dst.len(),
                self.len
            )));
        }
        self.copy_out(off, dst);
        Ok(())
    }

    /// CPU write of the region (MemoryRegion::write_at).
    pub fn local_write(&self, off: usize, src: &[u8]) -> Result<()> {
        // Exclusive, though `live` is only read: placing bytes through the shared
        // region must not overlap another placement or a reader's copy.
        #[allow(clippy::readonly_write_lock)]
        let live = self.live.write().unwrap();
        if !*live {
            return Err(RdmaError::InvalidArgument("region deregistered".into()));
        }
        let end = off.checked_add(src.len()).filter(|&e| e <= self.len);
        if end.is_none() {
            return Err(RdmaError::InvalidArgument(format!(
                "write of {} bytes at {off} outside region of {}",
                src.len(),
                self.len
            )));
        }
        self.copy_in(off, src);
        Ok(())
    }

    pub fn fence(&self) {
        drop(self.live.write().unwrap());
    }

    /// Replace the rkey; returns the new one. Waits for in-flight accesses.
    pub fn invalidate_rkey(&self) -> u32 {
        let _g = self.live.write().unwrap();
        let index = self.lkey >> 8;
        let mut new = self.generations.issue(index);
        // Keep the rkey distinct from the lkey so neither can stand for the other.
        if new == self.lkey {
            new = self.generations.issue(index);
        }
        self.rkey.store(new, Ordering::Release);
        new
    }
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("access", &self.access)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .finish()
    }
}

/// Which direction a remote access goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteAccess {
    Read,
    Write,
}

/// The key table of one protection domain, plus the device-wide pin table.
///
/// Keys are `index << 8 | generation`: the index names a table slot, the 8-bit generation
/// changes every time a slot is reused or an rkey is invalidated, so stale keys miss.
pub(crate) struct KeyTable {
    slots: RwLock<Vec<Slot>>,
    free: Mutex<Vec<u32>>,
    reserved: Mutex<Vec<u32>>,
    pins: Arc<PinTable>,
    counters: Arc<DeviceCounters>,
    config: SoftConfig,
}

#[derive(Default)]
struct Slot {
    region: Option<Arc<Region>>,
    generations: Arc<Generations>,
}

/// The 8-bit generations of one key-table slot. Every key the slot issues (a
/// registration's lkey and rkey, each rkey invalidation) takes the next one, so a key
/// stays stale until the slot has issued 256 more: a peer holding an invalidated rkey,
/// or one of a deregistered region, cannot reach the region registered there next.
#[derive(Default)]
struct Generations(AtomicU8);

impl Generations {
    /// The next key for slot `index`.
    fn issue(&self, index: u32) -> u32 {
        (index << 8) | u32::from(self.0.fetch_add(1, Ordering::AcqRel).wrapping_add(1))
    }
}

impl KeyTable {
    pub fn new(pins: Arc<PinTable>, counters: Arc<DeviceCounters>, config: SoftConfig) -> Self {
        KeyTable {
            // Slot 0 is never used, so key 0 is always invalid.
            slots: RwLock::new(vec![Slot::default()]),
            free: Mutex::new(Vec::new()),
            reserved: Mutex::new(Vec::new()),
            pins,
            counters,
            config,
        }
    }

    pub fn counters(&self) -> &DeviceCounters {
        &self.counters
    }

    fn alloc_index(&self) -> u32 {
        if let Some(i) = self.free.lock().unwrap().pop() {
            return i;
        }
        let mut slots = self.slots.write().unwrap();
        slots.push(Slot::default());
        (slots.len() - 1) as u32
    }

    /// Pre-allocate `n` slots for fast registration.
    pub fn reserve(&self, n: usize) {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.alloc_index());
        }
        self.reserved.lock().unwrap().extend(v);
    }

    /// Register `addr..addr+len`.
    ///
    /// # Safety
    /// The memory must stay allocated until the region is removed with [`Self::deregister`]
    /// or [`Self::deregister_batch`] (see `ProtectionDomain::register_raw`).
    pub unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
        owned: Option<AlignedBuf>,
        fast: bool,
    ) -> Result<Arc<Region>> {
        if addr.is_null() && len > 0 {
            return Err(RdmaError::InvalidArgument("null address".into()));
        }
        if (addr as usize).checked_add(len).is_none() {
            return Err(RdmaError::InvalidArgument("range wraps".into()));
        }
        if access.contains(AccessFlags::REMOTE_WRITE) && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(RdmaError::InvalidArgument(
                "REMOTE_WRITE requires LOCAL_WRITE".into(),
            ));
        }
        let reserved = if fast {
            self.reserved.lock().unwrap().pop()
        } else {
            None
        };
        spin(if reserved.is_some() {
            self.config.fast_reg_cost
        } else {
            self.config.reg_cost
        });
        let index = match reserved {
            Some(i) => i,
            None => self.alloc_index(),
        };
        if index >= 1 << 24 {
            self.free.lock().unwrap().push(index);
            return Err(RdmaError::Registration("key table full".into()));
        }
        let pinned = !self.config.no_pin && self.pins.pin(addr as usize, len, &self.counters);
        let mut slots = self.slots.write().unwrap();
        let slot = &mut slots[index as usize];
        let generations = slot.generations.clone();
        let lkey = generations.issue(index);
        let rkey = generations.issue(index);
        let region = Arc::new(Region {
            base: addr,
            addr: addr as usize,
            len,
            access,
            lkey,
            rkey: AtomicU32::new(rkey),
            generations,
            live: RwLock::new(true),
            pinned,
            _owned: owned,
        });
        slot.region = Some(region.clone());
        self.counters.registrations.fetch_add(1, Ordering::Relaxed);
        Ok(region)
    }

    fn remove_slot(&self, slots: &mut [Slot], region: &Region) -> bool {
        let index = (region.lkey >> 8) as usize;
        match slots.get_mut(index) {
            Some(slot)
                if slot
                    .region
                    .as_ref()
                    .is_some_and(|r| std::ptr::eq(&**r, region)) =>
            {
                slot.region = None;
                true
            }
            _ => false,
        }
    }

    fn retire(&self, region: &Region) {
        // Exclusive lock: waits for every in-flight access, and later ones see `false`.
        *region.live.write().unwrap() = false;
        if region.pinned {
            self.pins.unpin(region.addr, region.len, &self.counters);
        }
        self.counters
            .deregistrations
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Deregister one region (idempotent).
    pub fn deregister(&self, region: &Region) {
        spin(self.config.dereg_cost);
        let removed = self.remove_slot(&mut self.slots.write().unwrap(), region);
        if removed {
            self.retire(region);
            self.free.lock().unwrap().push(region.lkey >> 8);
        }
    }

    /// Deregister many regions with one key-table update.
    pub fn deregister_batch(&self, regions: &[Arc<Region>]) {
        spin(self.config.dereg_cost);
        let mut removed = Vec::with_capacity(regions.len());
        {
            let mut slots = self.slots.write().unwrap();
            for r in regions {
                if self.remove_slot(&mut slots, r) {
                    removed.push(r);
                }
            }
        }
        for r in &removed {
            self.retire(r);
        }
        self.free
            .lock()
            .unwrap()
            .extend(removed.iter().map(|r| r.lkey >> 8));
    }

    fn lookup(&self, key: u32) -> Option<Arc<Region>> {
        let slots = self.slots.read().unwrap();
        slots.get((key >> 8) as usize)?.region.clone()
    }

    /// Responder side of RDMA WRITE: validate rkey, bounds, REMOTE_WRITE and place `data`
    /// at `addr`. On any failure no byte changes and `RemoteAccessError` is returned.
    pub fn remote_write(&self, rkey: u32, addr: u64, data: &[u8]) -> WcStatus {
        let Some(region) = self.lookup(rkey) else {
            return WcStatus::RemoteAccessError;
        };
        // Exclusive, though `live` is only read: placing bytes through the shared
        // region must not overlap another placement or a reader's copy.
        #[allow(clippy::readonly_write_lock)]
        let live = region.live.write().unwrap();
        match self.check_remote(&region, *live, rkey, addr, data.len(), RemoteAccess::Write) {
            Some(off) => {
                region.copy_in(off, data);
                WcStatus::Success
            }
            None => WcStatus::RemoteAccessError,
        }
    }

    /// Whether an RDMA WRITE of `len` bytes at `addr` under `rkey` would be placed now
    /// (the checks of [`KeyTable::remote_write`], nothing written). The responder asks this
    /// as the request's header arrives: a WRITE that fails it is refused without its payload
    /// ever being held. One that passes is checked again when placed, since the region may
    /// be deregistered in between.
    pub fn remote_write_allowed(&self, rkey: u32, addr: u64, len: usize) -> bool {
        let Some(region) = self.lookup(rkey) else {
            return false;
        };
        let live = *region.live.read().unwrap();
        self.check_remote(&region, live, rkey, addr, len, RemoteAccess::Write)
            .is_some()
    }

    /// Responder side of RDMA READ: validate and copy `len` bytes at `addr` into `out`.
    pub fn remote_read(&self, rkey: u32, addr: u64, out: &mut [u8]) -> WcStatus {
        let Some(region) = self.lookup(rkey) else {
            return WcStatus::RemoteAccessError;
        };
        let live = region.live.read().unwrap();
        match self.check_remote(&region, *live, rkey, addr, out.len(), RemoteAccess::Read) {
            Some(off) => {
                region.copy_out(off, out);
                WcStatus::Success
            }
            None => WcStatus::RemoteAccessError,
        }
    }

    fn check_remote(
        &self,
        region: &Region,
        live: bool,
        rkey: u32,
        addr: u64,
        len: usize,
        dir: RemoteAccess,
    ) -> Option<usize> {
        if !live || region.rkey() != rkey {
            return None;
        }
        let need = match dir {
            RemoteAccess::Read => AccessFlags::REMOTE_READ,
            RemoteAccess::Write => AccessFlags::REMOTE_WRITE,
        };
        if !region.access.contains(need) {
            return None;
        }
        region.offset_of(addr, len)
    }

    /// Check that every SGE names a live region by lkey and lies inside it (and that the
    /// region allows local writes when `write` is set). Returns the total length.
    pub fn check_local(&self, sgl: &[Sge], write: bool) -> std::result::Result<usize, WcStatus> {
        let mut total = 0usize;
        for sge in sgl {
            let region = self
                .lookup(sge.lkey)
                .ok_or(WcStatus::LocalProtectionError)?;
            if region.lkey != sge.lkey
                || (write && !region.access.contains(AccessFlags::LOCAL_WRITE))
                || region.offset_of(sge.addr, sge.length as usize).is_none()
                || !*region.live.read().unwrap()
            {
                return Err(WcStatus::LocalProtectionError);
            }
            total += sge.length as usize;
        }
        Ok(total)
    }

    /// Gather the bytes of a local SGL (lkeys checked).
    pub fn gather(&self, sgl: &[Sge], out: &mut Vec<u8>) -> std::result::Result<(), WcStatus> {
        for sge in sgl {
            let region = self
                .lookup(sge.lkey)
                .ok_or(WcStatus::LocalProtectionError)?;
            let live = region.live.read().unwrap();
            if !*live || region.lkey != sge.lkey {
                return Err(WcStatus::LocalProtectionError);
            }
            let off = region
                .offset_of(sge.addr, sge.length as usize)
                .ok_or(WcStatus::LocalProtectionError)?;
            let start = out.len();
            out.resize(start + sge.length as usize, 0);
            region.copy_out(off, &mut out[start..]);
        }
        Ok(())
    }

    /// Scatter `data` into a local SGL that must allow local writes. `data` may be shorter
    /// than the SGL (RECV); longer gives `LocalLengthError`. Validates everything before
    /// changing any byte.
    pub fn scatter(&self, sgl: &[Sge], data: &[u8]) -> std::result::Result<(), WcStatus> {
        let cap = self.check_local(sgl, true)?;
        if data.len() > cap {
            return Err(WcStatus::LocalLengthError);
        }
        let mut rest = data;
        for sge in sgl {
            if rest.is_empty() {
                break;
            }
            let region = self
                .lookup(sge.lkey)
                .ok_or(WcStatus::LocalProtectionError)?;
            // Exclusive, though `live` is only read: placing bytes through the shared
            // region must not overlap another placement or a reader's copy.
            #[allow(clippy::readonly_write_lock)]
            let live = region.live.write().unwrap();
            if !*live || region.lkey != sge.lkey {
                return Err(WcStatus::LocalProtectionError);
            }
            let n = rest.len().min(sge.length as usize);
            let off = region
                .offset_of(sge.addr, n)
                .ok_or(WcStatus::LocalProtectionError)?;
            region.copy_in(off, &rest[..n]);
            rest = &rest[n..];
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> KeyTable {
        KeyTable::new(
            Arc::new(PinTable::default()),
            Arc::new(DeviceCounters::default()),
            SoftConfig::default(),
        )
    }

    fn reg(t: &KeyTable, len: usize, access: AccessFlags) -> Arc<Region> {
        let buf = AlignedBuf::new(len);
        let p = buf.as_ptr();
        // SAFETY: the region owns the buffer.
        unsafe { t.register(p, len, access, Some(buf), false) }.unwrap()
    }

    #[test]
    fn remote_write_read_and_refusals() {
        let t = table();
        let r = reg(&t, 8192, AccessFlags::ALL);
        let ro = reg(&t, 4096, AccessFlags::REMOTE_READ);
        assert_eq!(
            t.remote_write(r.rkey(), r.addr() + 10, b"hello"),
            WcStatus::Success
        );
        let mut out = [0u8; 5];
        assert_eq!(
            t.remote_read(r.rkey(), r.addr() + 10, &mut out),
            WcStatus::Success
        );
        assert_eq!(&out, b"hello");
        // bad key, lkey used as rkey, out of range, missing permission
        assert_eq!(
            t.remote_write(r.rkey() ^ 1, r.addr(), b"x"),
            WcStatus::RemoteAccessError
        );
        assert_eq!(
            t.remote_write(r.lkey(), r.addr(), b"x"),
            WcStatus::RemoteAccessError
        );
        assert_eq!(
            t.remote_write(r.rkey(), r.addr() + 8190, b"xyz"),
            WcStatus::RemoteAccessError
        );
        assert_eq!(
            t.remote_write(r.rkey(), r.addr() - 1, b"x"),
            WcStatus::RemoteAccessError
        );
        assert_eq!(
            t.remote_write(ro.rkey(), ro.addr(), b"x"),
            WcStatus::RemoteAccessError
        );
        assert_eq!(t.remote_write(0, 0, b""), WcStatus::RemoteAccessError);
        // The check a WRITE's header gets, before its payload, agrees case by case.
        assert!(t.remote_write_allowed(r.rkey(), r.addr() + 10, 5));
        for (key, addr, len) in [
            (r.rkey() ^ 1, r.addr(), 1),
            (r.lkey(), r.addr(), 1),
            (r.rkey(), r.addr() + 8190, 3),
            (r.rkey(), r.addr() - 1, 1),
            (ro.rkey(), ro.addr(), 1),
            (0, 0, 0),
        ] {
            assert!(
                !t.remote_write_allowed(key, addr, len),
                "{key:#x} at {addr:#x}+{len}"
            );
        }
        let mut all = vec![0u8; 8192];
        r.local_read(0, &mut all).unwrap();
        assert_eq!(&all[10..15], b"hello");
        assert_eq!(all.iter().filter(|&&b| b != 0).count(), 5);
    }

    #[test]
    fn dereg_and_invalidate_make_keys_stale() {
        let t = table();
        let r = reg(&t, 4096, AccessFlags::ALL);
        let old = r.rkey();
        let new = r.invalidate_rkey();
        assert_ne!(old, new);
        assert_ne!(new, r.lkey());
        assert_eq!(
            t.remote_write(old, r.addr(), b"x"),
            WcStatus::RemoteAccessError
        );
        assert_eq!(t.remote_write(new, r.addr(), b"x"), WcStatus::Success);
        t.deregister(&r);
        assert_eq!(
            t.remote_write(new, r.addr(), b"x"),
            WcStatus::RemoteAccessError
        );
        assert!(r.local_read(0, &mut [0u8; 1]).is_err());
        // the slot is reused with another generation: old keys still miss
        let r2 = reg(&t, 4096, AccessFlags::ALL);
        assert_eq!(r2.lkey() >> 8, r.lkey() >> 8);
        assert_ne!(r2.rkey(), new);
        assert_eq!(
            t.remote_write(new, r2.addr(), b"x"),
            WcStatus::RemoteAccessError
        );
        assert_eq!(t.counters().deregistrations.load(Ordering::Relaxed), 1);
    }

    /// The registration cache invalidates a region's rkey each time its last I/O
    /// releases it. A key the region held, stale since, must not open the next region
    /// registered in the same slot: a peer's late RDMA WRITE with it (after the command
    /// was aborted, say) would land in another I/O's buffer.
    #[test]
    fn stale_keys_miss_the_slots_next_regions() {
        let t = table();
        let mut stale = Vec::new();
        for round in 0..8 {
            let r = reg(&t, 4096, AccessFlags::ALL);
            for _ in 0..round % 4 {
                stale.push(r.rkey());
                r.invalidate_rkey();
            }
            for &key in &stale {
                assert_eq!(
                    t.remote_write(key, r.addr(), b"x"),
                    WcStatus::RemoteAccessError,
                    "stale key {key:#x} opened region {r:?} (round {round})"
                );
            }
            assert_eq!(t.remote_write(r.rkey(), r.addr(), b"x"), WcStatus::Success);
            stale.extend([r.rkey(), r.lkey()]);
            t.deregister(&r);
        }
    }

    #[test]
    fn scatter_gather_validate_first() {
        let t = table();
        let a = reg(&t, 4096, AccessFlags::LOCAL_WRITE);
        let ro = reg(&t, 4096, AccessFlags::NONE);
        let sgl = [
            Sge {
                addr: a.addr(),
                length: 4,
                lkey: a.lkey(),
            },
            Sge {
                addr: ro.addr(),
                length: 4,
                lkey: ro.lkey(),
            },
        ];
        assert_eq!(
            t.scatter(&sgl, b"abcdefgh"),
            Err(WcStatus::LocalProtectionError)
        );
        let mut b = [0u8; 4];
        a.local_read(0, &mut b).unwrap();
        assert_eq!(b, [0; 4], "nothing written on a refused scatter");
        let sgl2 = [Sge {
            addr: a.addr(),
            length: 4,
            lkey: a.lkey(),
        }];
        assert_eq!(t.scatter(&sgl2, b"abcde"), Err(WcStatus::LocalLengthError));
        t.scatter(&sgl2, b"ab").unwrap();
        let mut g = Vec::new();
        t.gather(&sgl, &mut g).unwrap();
        assert_eq!(&g, b"ab\0\0\0\0\0\0");
    }

    #[test]
    fn pinning_is_refcounted_per_page() {
        let pins = PinTable::default();
        let c = DeviceCounters::default();
        let buf = AlignedBuf::new(3 * PAGE_SIZE);
        let a = buf.as_ptr() as usize;
        let ok1 = pins.pin(a, 2 * PAGE_SIZE, &c);
        let ok2 = pins.pin(a + PAGE_SIZE, 2 * PAGE_SIZE, &c);
        if ok1 && ok2 {
            assert_eq!(c.pinned_pages.load(Ordering::Relaxed), 3);
            pins.unpin(a, 2 * PAGE_SIZE, &c);
            assert_eq!(c.pinned_pages.load(Ordering::Relaxed), 2);
            pins.unpin(a + PAGE_SIZE, 2 * PAGE_SIZE, &c);
        }
        assert_eq!(c.pinned_pages.load(Ordering::Relaxed), 0);
        assert!(pins.pages.lock().unwrap().is_empty());
    }

    /// Many threads write, read and deregister concurrently: no torn state, and after
    /// deregistration no access succeeds. (Run under Miri for data-race checking.)
    #[test]
    fn concurrent_access_and_dereg() {
        let t = Arc::new(table());
        let regions: Vec<_> = (0..4).map(|_| reg(&t, 256, AccessFlags::ALL)).collect();
        let iters = if cfg!(miri) { 20 } else { 2000 };
        std::thread::scope(|s| {
            for w in 0..4u8 {
                let t = t.clone();
                let regions = regions.clone();
                s.spawn(move || {
                    for i in 0..iters {
                        let r = &regions[(i + w as usize) % regions.len()];
                        let st = t.remote_write(r.rkey(), r.addr(), &[w; 64]);
                        let mut out = [0u8; 64];
                        let st2 = t.remote_read(r.rkey(), r.addr(), &mut out);
                        if st.is_ok() && st2.is_ok() {
                            // a write is atomic with respect to other provider accesses
                            assert!(out.iter().all(|&b| b == out[0]));
                        }
                    }
                });
            }
            let t2 = t.clone();
            let victim = regions[0].clone();
            s.spawn(move || {
                t2.deregister(&victim);
                assert_eq!(
                    t2.remote_write(victim.rkey(), victim.addr(), b"late"),
                    WcStatus::RemoteAccessError
                );
            });
        });
    }
}
