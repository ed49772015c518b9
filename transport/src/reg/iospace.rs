//! I/O buffers an initiator advertises to a target, and per-command scatter-gather
//! registration through one of the four strategies.
//!
//! An [`IoSpace`] owns the memory its [`IoBuf`]s live in: heap buffers are never handed
//! back to the global allocator while the space lives (a freed buffer goes to a free list
//! by size), so registrations cached by the pin-down cache or FMRD never outlive their
//! memory, which is the contract of [`Registrar::register`]. With the arena strategy the
//! buffers are carved from the arena and registration is an offset computation.
//!
//! [`IoSpace::register_sg`] registers a command's buffers, coalesces them into the fewest
//! contiguous remote chunks (buffer re-organization) and returns an [`SgRegistration`];
//! releasing it (or dropping it) makes the command's rkeys stop working, except with the
//! arena, whose single rkey covers the whole arena for its lifetime (ZKMR's cost).

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use super::{
    coalesce, Arena, ArenaBuf, Chunk, Dynamic, Fmrd, FmrdConfig, PinDownCache, RegHandle, RegStats,
    Registrar, Strategy,
};
use crate::rdma::{
    AccessFlags, AlignedBuf, MemoryRegion, ProtectionDomain, RdmaError, RemoteBuf, Result,
};

/// Which registration strategy an [`IoSpace`] uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegConfig {
    /// Register and deregister per command.
    Dynamic,
    /// Pin-down cache with this many entries.
    PinDownCache { capacity: usize },
    /// Fast registration slots + cache + batched deregistration.
    Fmrd(FmrdConfig),
    /// One registration over an arena of this many bytes.
    Arena { bytes: usize },
}

impl RegConfig {
    pub fn strategy(&self) -> Strategy {
        match self {
            RegConfig::Dynamic => Strategy::Dynamic,
            RegConfig::PinDownCache { .. } => Strategy::PinDownCache,
            RegConfig::Fmrd(_) => Strategy::Fmrd,
            RegConfig::Arena { .. } => Strategy::Arena,
        }
    }
}

enum Backing<P: ProtectionDomain> {
    Heap {
        registrar: Box<dyn Registrar>,
        free: Mutex<BTreeMap<usize, Vec<AlignedBuf>>>,
    },
    Arena(Arena<P>),
}

struct SpaceInner<P: ProtectionDomain> {
    // Field order matters for Drop: the registrar (and its registrations) goes before
    // the free-listed memory.
    backing: Backing<P>,
}

/// Registered I/O memory of one initiator. Cheap to clone.
pub struct IoSpace<P: ProtectionDomain> {
    inner: Arc<SpaceInner<P>>,
}

impl<P: ProtectionDomain> Clone for IoSpace<P> {
    fn clone(&self) -> Self {
        IoSpace {
            inner: self.inner.clone(),
        }
    }
}

enum Mem {
    Heap(Option<AlignedBuf>),
    Arena(Option<ArenaBuf>),
}

/// A buffer of an [`IoSpace`]. Page aligned; returned to its space on drop.
pub struct IoBuf<P: ProtectionDomain> {
    space: Arc<SpaceInner<P>>,
    mem: Mem,
    len: usize,
}

impl<P: ProtectionDomain> std::fmt::Debug for IoBuf<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoBuf")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .finish()
    }
}

impl<P: ProtectionDomain> IoSpace<P> {
    /// A space registering through `cfg` in `pd` (access: local write, remote read and
    /// remote write).
    pub fn new(pd: &P, cfg: RegConfig) -> Result<Self> {
        let access = AccessFlags::ALL;
        let backing = match cfg {
            RegConfig::Dynamic => Backing::Heap {
                registrar: Box::new(Dynamic::new(pd.clone(), access)),
                free: Mutex::new(BTreeMap::new()),
            },
            RegConfig::PinDownCache { capacity } => Backing::Heap {
                registrar: Box::new(PinDownCache::new(pd.clone(), access, capacity)),
                free: Mutex::new(BTreeMap::new()),
            },
            RegConfig::Fmrd(c) => Backing::Heap {
                registrar: Box::new(Fmrd::new(pd.clone(), access, c)?),
                free: Mutex::new(BTreeMap::new()),
            },
            RegConfig::Arena { bytes } => Backing::Arena(Arena::new(pd, bytes, access)?),
        };
        Ok(IoSpace {
            inner: Arc::new(SpaceInner { backing }),
        })
    }

    fn registrar(&self) -> &dyn Registrar {
        match &self.inner.backing {
            Backing::Heap { registrar, .. } => &**registrar,
            Backing::Arena(a) => a,
        }
    }

    pub fn strategy(&self) -> Strategy {
        self.registrar().strategy()
    }

    pub fn stats(&self) -> RegStats {
        self.registrar().stats()
    }

    /// A zeroed buffer of `len` bytes (capacity rounded up to 4 KiB).
    pub fn alloc(&self, len: usize) -> Result<IoBuf<P>> {
        let cap = len.max(1).next_multiple_of(crate::rdma::PAGE_SIZE);
        let mem = match &self.inner.backing {
            Backing::Heap { free, .. } => {
                let reused = free.lock().unwrap().get_mut(&cap).and_then(Vec::pop);
                Mem::Heap(Some(match reused {
                    Some(mut b) => {
                        b.as_mut_slice().fill(0);
                        b
                    }
                    None => AlignedBuf::new(cap),
                }))
            }
            Backing::Arena(a) => {
                let b = a.alloc(cap).ok_or_else(|| {
                    RdmaError::Registration(format!(
                        "arena exhausted ({} bytes free, {cap} wanted)",
                        a.free_bytes()
                    ))
                })?;
                a.mr().write_at(b.offset(), &vec![0u8; cap])?;
                Mem::Arena(Some(b))
            }
        };
        Ok(IoBuf {
            space: self.inner.clone(),
            mem,
            len,
        })
    }

    /// Registers `bufs` (each for its whole length, in transfer order) for one command
    /// and coalesces them into contiguous chunks of at most `max_chunk` bytes.
    pub fn register_sg<'b>(
        &self,
        bufs: impl IntoIterator<Item = &'b IoBuf<P>>,
        max_chunk: u64,
    ) -> Result<SgRegistration<'b, P>> {
        let mut reg = SgRegistration {
            space: self.clone(),
            handles: Vec::new(),
            chunks: Vec::new(),
            _bufs: PhantomData,
        };
        for b in bufs {
            if !Arc::ptr_eq(&b.space, &self.inner) {
                return Err(RdmaError::InvalidArgument(
                    "buffer belongs to another I/O space".into(),
                ));
            }
            if b.len == 0 {
                continue;
            }
            // SAFETY: the memory belongs to this space, which keeps it allocated (free
            // list or arena) as long as the registrar lives; while registered, the
            // caller's borrow of the buffer ('b) keeps safe code from touching it except
            // through `IoBuf`'s copying accessors.
            let h = unsafe { self.registrar().register(b.ptr(), b.len) }?;
            reg.handles.push(h);
        }
        let remote: Vec<RemoteBuf> = reg.handles.iter().map(RegHandle::remote).collect();
        reg.chunks = coalesce(&remote, max_chunk);
        Ok(reg)
    }

    /// Deregisters everything cached and not in use.
    pub fn flush(&self) -> Result<()> {
        self.registrar().flush()
    }
}

/// The registrations of one command's buffers; released on drop.
pub struct SgRegistration<'b, P: ProtectionDomain> {
    space: IoSpace<P>,
    handles: Vec<RegHandle>,
    chunks: Vec<Chunk>,
    _bufs: PhantomData<&'b ()>,
}

impl<P: ProtectionDomain> SgRegistration<'_, P> {
    /// The contiguous remote chunks to advertise, in transfer order.
    pub fn chunks(&self) -> &[Chunk] {
        &self.chunks
    }
    /// The chunks as remote buffer descriptors.
    pub fn remote(&self) -> Vec<RemoteBuf> {
        self.chunks.iter().map(|c| c.remote).collect()
    }
    /// Registrations made (one per non-empty buffer).
    pub fn registrations(&self) -> usize {
        self.handles.len()
    }
    /// Ends the command's registrations: their rkeys stop working (deregistration or
    /// invalidation; the arena's key stays valid).
    pub fn release(mut self) -> Result<()> {
        self.release_all()
    }
    fn release_all(&mut self) -> Result<()> {
        let mut first = Ok(());
        for h in self.handles.drain(..) {
            if let Err(e) = self.space.registrar().release(h) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}

impl<P: ProtectionDomain> Drop for SgRegistration<'_, P> {
    fn drop(&mut self) {
        let _ = self.release_all();
    }
}

impl<P: ProtectionDomain> IoBuf<P> {
    fn ptr(&self) -> *mut u8 {
        match &self.mem {
            Mem::Heap(Some(b)) => b.as_ptr(),
            Mem::Arena(Some(b)) => b.as_ptr(),
            _ => unreachable!("memory present until drop"),
        }
    }
    pub fn addr(&self) -> u64 {
        self.ptr() as u64
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `src` into the buffer at `off`.
    pub fn write_at(&mut self, off: usize, src: &[u8]) -> Result<()> {
        self.check(off, src.len())?;
        match (&mut self.mem, &self.space.backing) {
            (Mem::Heap(Some(b)), _) => {
                b.as_mut_slice()[off..off + src.len()].copy_from_slice(src);
                Ok(())
            }
            // The arena's rkey stays valid: go through the region, which orders CPU
            // accesses against the provider's.
            (Mem::Arena(Some(b)), Backing::Arena(a)) => a.mr().write_at(b.offset() + off, src),
            _ => unreachable!(),
        }
    }

    /// Copies from the buffer at `off` into `dst`.
    pub fn read_at(&self, off: usize, dst: &mut [u8]) -> Result<()> {
        self.check(off, dst.len())?;
        match (&self.mem, &self.space.backing) {
            (Mem::Heap(Some(b)), _) => {
                dst.copy_from_slice(&b.as_slice()[off..off + dst.len()]);
                Ok(())
            }
            (Mem::Arena(Some(b)), Backing::Arena(a)) => a.mr().read_at(b.offset() + off, dst),
            _ => unreachable!(),
        }
    }

    /// The contents as a vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        self.read_at(0, &mut v).expect("in bounds");
        v
    }

    fn check(&self, off: usize, n: usize) -> Result<()> {
        if off.checked_add(n).is_none_or(|e| e > self.len) {
            return Err(RdmaError::InvalidArgument(format!(
                "{n} bytes at {off} outside a buffer of {}",
                self.len
            )));
        }
        Ok(())
    }
}

impl<P: ProtectionDomain> Drop for IoBuf<P> {
    fn drop(&mut self) {
        match (&mut self.mem, &self.space.backing) {
            (Mem::Heap(b), Backing::Heap { free, .. }) => {
                if let Some(b) = b.take() {
                    let cap = b.len();
                    free.lock().unwrap().entry(cap).or_default().push(b);
                }
            }
            (Mem::Arena(b), Backing::Arena(a)) => {
                if let Some(b) = b.take() {
                    a.free(b);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdma::soft::SoftProvider;
    use crate::rdma::RdmaProvider;

    fn configs() -> Vec<RegConfig> {
        vec![
            RegConfig::Dynamic,
            RegConfig::PinDownCache { capacity: 4 },
            RegConfig::Fmrd(FmrdConfig {
                capacity: 4,
                slots: 8,
                dereg_threshold: 2,
            }),
            RegConfig::Arena { bytes: 1 << 20 },
        ]
    }

    #[test]
    fn alloc_register_release_every_strategy() {
        let p = SoftProvider::default();
        let pd = p.alloc_pd().unwrap();
        for cfg in configs() {
            let space = IoSpace::new(&pd, cfg).unwrap();
            let mut a = space.alloc(5000).unwrap();
            let b = space.alloc(4096).unwrap();
            a.write_at(4999, &[9]).unwrap();
            assert_eq!(a.to_vec()[4999], 9);
            assert!(a.write_at(5000, &[1]).is_err());
            let reg = space.register_sg([&a, &b], u64::MAX).unwrap();
            assert_eq!(reg.registrations(), 2);
            let total: u64 = reg.chunks().iter().map(|c| c.remote.len).sum();
            assert_eq!(total, 9096);
            reg.release().unwrap();
            drop((a, b));
            // Freed buffers come back zeroed.
            let c = space.alloc(5000).unwrap();
            assert!(c.to_vec().iter().all(|&x| x == 0), "{cfg:?}");
            drop(c);
            space.flush().unwrap();
            if cfg != (RegConfig::Arena { bytes: 1 << 20 }) {
                assert_eq!(space.stats().bytes_pinned, 0, "{cfg:?}");
            }
        }
    }

    #[test]
    fn arena_neighbours_coalesce() {
        let p = SoftProvider::default();
        let pd = p.alloc_pd().unwrap();
        let space = IoSpace::new(&pd, RegConfig::Arena { bytes: 1 << 20 }).unwrap();
        let bufs: Vec<_> = (0..4).map(|_| space.alloc(4096).unwrap()).collect();
        let reg = space.register_sg(bufs.iter(), u64::MAX).unwrap();
        assert_eq!(
            reg.chunks().len(),
            1,
            "RDMA-assisted iSCSI paper Fig. 9: four buffers, one op"
        );
    }
}
