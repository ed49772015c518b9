//! A RAM backstore that allocates memory only for what is written.
//!
//! The default LUN is 1 GiB; allocating it up front would cost a gibibyte
//! per target even when idle, so the store is split into 1 MiB chunks that
//! come into being on first write. Unwritten chunks read as zeros.
//!
//! The table of chunks is itself sparse: a top level with one entry per
//! 4 GiB of capacity, each pointing to a leaf of chunk slots made on the
//! first write into its range. A thin LUN far larger than memory (READ
//! CAPACITY(16) past 2 TiB is worth testing) then costs memory for what is
//! written, not for its size; a dense table would hold 40 bytes per MiB of
//! capacity, gibibytes for a 100 TiB LUN.
//!
//! Each chunk also keeps which of its 512-byte sectors were written since they
//! were last discarded: the store's allocation map. GET LBA STATUS answers from
//! it without reading data (an initiator such as QEMU asks before its reads, and
//! deriving the map from content would scan megabytes per command).
//!
//! Every chunk holds a charge against a [`RamBudget`] (the process's unless
//! the store was given another) for as long as it exists: a write that needs
//! chunks the budget refuses fails whole, before it copies a byte.

use super::ram_budget::{Charge, RamBudget};
use super::{Backstore, Extent};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard};

const CHUNK: u64 = 1 << 20;
/// The allocation map's unit: the smallest logical block.
const SECTOR: u64 = 512;
const SECTORS: usize = (CHUNK / SECTOR) as usize;
/// Chunk slots in one leaf of the table: 4 GiB of capacity.
const LEAF: usize = 4096;

/// The largest RAM store: 1 PiB. Its table's top level then has 262 144
/// entries (6 MiB); beyond that the table of an empty store would itself
/// be a noticeable allocation.
pub const RAM_MAX_BYTES: u64 = 1 << 50;

/// One allocated chunk: its bytes, which sectors hold written data, and its
/// charge against the budget (given back when the chunk goes).
#[derive(Debug)]
struct Chunk {
    data: Box<[u8]>,
    written: Box<[u64; SECTORS / 64]>,
    _charge: Charge,
}

impl Chunk {
    fn new(charge: Charge) -> Chunk {
        Chunk {
            data: vec![0u8; CHUNK as usize].into_boxed_slice(),
            written: Box::new([0; SECTORS / 64]),
            _charge: charge,
        }
    }

    /// Marks every sector that bytes `at..at + n` touch.
    fn mark(&mut self, at: usize, n: usize) {
        let first = at / SECTOR as usize;
        let end = (at + n).div_ceil(SECTOR as usize);
        for s in first..end {
            self.written[s / 64] |= 1 << (s % 64);
        }
    }

    /// Clears the sectors wholly inside `at..at + n` (a partly discarded sector
    /// still holds data).
    fn clear(&mut self, at: usize, n: usize) {
        let first = at.div_ceil(SECTOR as usize);
        let end = (at + n) / SECTOR as usize;
        for s in first..end {
            self.written[s / 64] &= !(1 << (s % 64));
        }
    }

    /// No sector holds written data: the chunk's bytes are all zero.
    fn holds_nothing(&self) -> bool {
        self.written.iter().all(|&w| w == 0)
    }

    fn is_written(&self, sector: usize) -> bool {
        self.written[sector / 64] & (1 << (sector % 64)) != 0
    }
}

/// Sparse in-memory storage.
#[derive(Debug)]
pub struct RamBackstore {
    /// The capacity, as `slots` has it (read without the lock by `size()`).
    size: AtomicU64,
    /// Every access holds this shared; a resize holds it exclusive, so a
    /// range checked against the capacity stays valid while it is used.
    slots: RwLock<Slots>,
    /// What the chunks are charged to.
    budget: Arc<RamBudget>,
}

/// One chunk's place in the table: empty until its first write.
type Slot = RwLock<Option<Chunk>>;

#[derive(Debug)]
struct Slots {
    size: u64,
    /// One entry per `LEAF` chunks of capacity; a leaf holds
    /// `leaf_len(chunks, i)` slots and exists once a write reached it.
    leaves: Vec<OnceLock<Box<[Slot]>>>,
}

/// Chunks a store of `size` bytes spans.
fn chunks_of(size: u64) -> usize {
    size.div_ceil(CHUNK) as usize
}

/// Slots in leaf `i` of a table of `chunks` chunks (the last leaf is short).
fn leaf_len(chunks: usize, i: usize) -> usize {
    (chunks - i * LEAF).min(LEAF)
}

fn empty_slots(n: usize) -> Box<[Slot]> {
    (0..n).map(|_| RwLock::new(None)).collect()
}

/// Why a RAM store cannot have `size` bytes, if it cannot: the one wording
/// of the limit, for the store's own errors and for configurations that ask
/// for more (which add the field and the fix).
pub fn ram_size_refusal(size: u64) -> Option<String> {
    (size > RAM_MAX_BYTES)
        .then(|| format!("a ram LUN holds at most 1 PiB ({RAM_MAX_BYTES} bytes), not {size}"))
}

fn too_large(size: u64) -> io::Error {
    let why = ram_size_refusal(size).unwrap_or_default();
    io::Error::new(io::ErrorKind::InvalidInput, why)
}

impl Slots {
    fn check(&self, offset: u64, len: usize) -> io::Result<()> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "range {offset}+{len} beyond RAM store of {} bytes",
                    self.size
                ),
            )),
        }
    }

    /// Chunk `c`'s slot, if its leaf exists (`c` within the capacity).
    fn slot(&self, c: usize) -> Option<&Slot> {
        self.leaves[c / LEAF].get().map(|leaf| &leaf[c % LEAF])
    }

    /// Whether chunk `c` holds memory now.
    #[cfg(test)]
    fn is_allocated(&self, c: usize) -> bool {
        self.slot(c)
            .is_some_and(|s| s.read().unwrap_or_else(|e| e.into_inner()).is_some())
    }

    /// Chunk `c`'s slot, making its leaf if no write reached it before.
    fn slot_or_new(&self, c: usize) -> &Slot {
        let i = c / LEAF;
        let leaf = self.leaves[i].get_or_init(|| empty_slots(leaf_len(chunks_of(self.size), i)));
        &leaf[c % LEAF]
    }

    /// Gives leaf `i`, if it exists, the length a table of `chunks` chunks
    /// has there: slots past the end go (their chunks' memory with them),
    /// new ones are empty.
    fn fit_leaf(&mut self, i: usize, chunks: usize) {
        if let Some(leaf) = self.leaves.get_mut(i).and_then(OnceLock::get_mut) {
            let len = leaf_len(chunks, i);
            if leaf.len() != len {
                let mut slots = std::mem::take(leaf).into_vec();
                slots.resize_with(len, || RwLock::new(None));
                *leaf = slots.into_boxed_slice();
            }
        }
    }
}

impl RamBackstore {
    /// A zero-filled store of `size` bytes, at most [`RAM_MAX_BYTES`]
    /// (configurations are checked against it before they get here), whose
    /// chunks count against the process's [`RamBudget`].
    pub fn new(size: u64) -> RamBackstore {
        Self::with_budget(size, RamBudget::process().clone())
    }

    /// [`RamBackstore::new`], its chunks counting against `budget`.
    pub fn with_budget(size: u64, budget: Arc<RamBudget>) -> RamBackstore {
        if let Some(why) = ram_size_refusal(size) {
            panic!("{why}");
        }
        RamBackstore {
            size: AtomicU64::new(size),
            slots: RwLock::new(Slots {
                size,
                leaves: (0..chunks_of(size).div_ceil(LEAF))
                    .map(|_| OnceLock::new())
                    .collect(),
            }),
            budget,
        }
    }

    fn slots(&self) -> RwLockReadGuard<'_, Slots> {
        self.slots.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Calls `f(chunk index, offset in chunk, range in caller's buffer)` for
    /// each chunk piece of `[offset, offset+len)`.
    fn pieces(offset: u64, len: usize, mut f: impl FnMut(usize, usize, std::ops::Range<usize>)) {
        let mut done = 0usize;
        while done < len {
            let pos = offset + done as u64;
            let in_chunk = (pos % CHUNK) as usize;
            let n = (len - done).min(CHUNK as usize - in_chunk);
            f((pos / CHUNK) as usize, in_chunk, done..done + n);
            done += n;
        }
    }

    /// Every write but one within a single chunk that exists: across chunks,
    /// or one that may bring a chunk into being. It holds every chunk slot it
    /// writes exclusively (in ascending order, so two such writes cannot
    /// deadlock) while it counts the new chunks, charges them at once and
    /// copies. Counted under the locks, the count is exact: writers racing
    /// into one new chunk charge it once, so a budget with room for that
    /// chunk refuses none of them; and a chunk a discard frees meanwhile is
    /// counted too, so a refused write changes nothing, whatever races it.
    fn write_holding_chunks(&self, slots: &Slots, offset: u64, data: &[u8]) -> io::Result<()> {
        let zeros = |range: &std::ops::Range<usize>| data[range.clone()].iter().all(|&b| b == 0);
        // Zeros into a chunk that does not exist need no chunk (it already
        // reads so): such a piece is neither held nor written. Each piece's
        // bytes are scanned for zeros at most once.
        let mut held = Vec::new();
        Self::pieces(offset, data.len(), |c, at, range| {
            let mut zero = None;
            // Zeros into a leaf no write reached: no lock to take either.
            if slots.slot(c).is_none() && *zero.insert(zeros(&range)) {
                return;
            }
            let chunk = slots
                .slot_or_new(c)
                .write()
                .unwrap_or_else(|e| e.into_inner());
            if chunk.is_none() && zero.unwrap_or_else(|| zeros(&range)) {
                return;
            }
            held.push((chunk, at, range));
        });
        let wanted = held.iter().filter(|(chunk, _, _)| chunk.is_none()).count();
        let mut charges = self.budget.charge(wanted as u64, CHUNK)?;
        for (chunk, at, range) in &mut held {
            if chunk.is_none() {
                let charge = charges.take().expect("counted under the same locks");
                **chunk = Some(Chunk::new(charge));
            }
            let n = range.len();
            let store = chunk.as_mut().expect("allocated above");
            store.data[*at..*at + n].copy_from_slice(&data[range.clone()]);
            store.mark(*at, n);
        }
        Ok(())
    }
}

impl Backstore for RamBackstore {
    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn check_resize(&self, new_size: u64) -> io::Result<()> {
        match ram_size_refusal(new_size) {
            Some(_) => Err(too_large(new_size)),
            None => Ok(()),
        }
    }

    fn resize(&self, new_size: u64) -> io::Result<()> {
        self.check_resize(new_size)?;
        let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
        let n = chunks_of(new_size);
        if new_size < slots.size {
            // Bytes past the new end must read as zeros if the store grows
            // again: clear the tail of the last kept chunk.
            let tail = new_size % CHUNK;
            if tail != 0 {
                let last = n - 1;
                if let Some(ch) = slots.leaves[last / LEAF].get_mut().and_then(|leaf| {
                    leaf[last % LEAF]
                        .get_mut()
                        .unwrap_or_else(|e| e.into_inner())
                        .as_mut()
                }) {
                    ch.data[tail as usize..].fill(0);
                    ch.clear(tail as usize, (CHUNK - tail) as usize);
                }
            }
        }
        // The leaf that held the old end and the one that holds the new end
        // change length; leaves wholly past the new end go.
        let old_last = slots.leaves.len().checked_sub(1);
        slots.leaves.truncate(n.div_ceil(LEAF));
        slots.leaves.resize_with(n.div_ceil(LEAF), OnceLock::new);
        if let Some(i) = old_last {
            slots.fit_leaf(i, n);
        }
        if let Some(i) = n.div_ceil(LEAF).checked_sub(1) {
            slots.fit_leaf(i, n);
        }
        slots.size = new_size;
        self.size.store(new_size, Ordering::Release);
        Ok(())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let slots = self.slots();
        slots.check(offset, buf.len())?;
        Self::pieces(offset, buf.len(), |c, at, range| {
            let Some(slot) = slots.slot(c) else {
                buf[range].fill(0);
                return;
            };
            let chunk = slot.read().unwrap_or_else(|e| e.into_inner());
            let n = range.len();
            match chunk.as_ref() {
                Some(c) => {
                    buf[range].copy_from_slice(&c.data[at..at + n]);
                    crate::copies::note_user_copy(n);
                }
                None => buf[range].fill(0),
            }
        });
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let slots = self.slots();
        slots.check(offset, data.len())?;
        // The common case: bytes within one chunk that exists. Copied under
        // that chunk's lock, it needs no charge and cannot be refused.
        let at = (offset % CHUNK) as usize;
        if !data.is_empty() && at + data.len() <= CHUNK as usize {
            if let Some(slot) = slots.slot((offset / CHUNK) as usize) {
                let mut chunk = slot.write().unwrap_or_else(|e| e.into_inner());
                if let Some(store) = chunk.as_mut() {
                    store.data[at..at + data.len()].copy_from_slice(data);
                    store.mark(at, data.len());
                    return Ok(());
                }
            }
        }
        self.write_holding_chunks(&slots, offset, data)
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    /// A RAM disk has no crash to survive: the SCSI core holds the range
    /// exclusively, so the copy lands whole before any other write of it.
    fn atomic_write_max(&self) -> u64 {
        super::IN_PROCESS_ATOMIC_MAX
    }

    fn write_atomic(&self, offset: u64, data: &[u8], _durable: bool) -> io::Result<()> {
        self.write_at(offset, data)
    }

    fn writes_to_memory(&self) -> bool {
        true
    }

    fn in_memory(&self) -> bool {
        true
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let slots = self.slots();
        slots.check(offset, len as usize)?;
        Self::pieces(offset, len as usize, |c, at, range| {
            let Some(slot) = slots.slot(c) else {
                // Never written: nothing to give back.
                return;
            };
            let mut chunk = slot.write().unwrap_or_else(|e| e.into_inner());
            if at == 0 && range.len() == CHUNK as usize {
                // A whole chunk: give the memory back.
                *chunk = None;
            } else if let Some(store) = chunk.as_mut() {
                store.data[at..at + range.len()].fill(0);
                store.clear(at, range.len());
                // Pieces discarded one UNMAP descriptor at a time can leave a
                // chunk with no written sector: every byte is zero, so it
                // gives its memory back like a chunk discarded whole.
                if store.holds_nothing() {
                    *chunk = None;
                }
            }
        });
        Ok(())
    }

    fn space(&self) -> io::Result<Option<super::Space>> {
        // Leaves no write reached hold no chunk: only the others are looked at.
        let used = {
            let slots = self.slots();
            let chunks: usize = slots
                .leaves
                .iter()
                .filter_map(OnceLock::get)
                .map(|leaf| {
                    leaf.iter()
                        .filter(|s| s.read().unwrap_or_else(|e| e.into_inner()).is_some())
                        .count()
                })
                .sum();
            chunks as u64 * CHUNK
        };
        Ok(Some(super::Space {
            used,
            available: self.budget.limit().saturating_sub(self.budget.held()),
        }))
    }

    fn allocation(&self, offset: u64, len: u64) -> io::Result<Option<Vec<Extent>>> {
        let slots = self.slots();
        slots.check(offset, len as usize)?;
        let mut map: Vec<Extent> = Vec::new();
        let mut push = |offset: u64, len: u64, mapped: bool| match map.last_mut() {
            Some(last) if last.mapped == mapped && last.offset + last.len == offset => {
                last.len += len;
            }
            _ => map.push(Extent {
                offset,
                len,
                mapped,
            }),
        };
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let c = (pos / CHUNK) as usize;
            let Some(slot) = slots.slot(c) else {
                // A leaf no write reached: its whole range is unmapped, and
                // a GET LBA STATUS over a large thin LUN skips it in one step.
                let leaf_end = ((c / LEAF + 1) * LEAF) as u64 * CHUNK;
                let next = leaf_end.min(end);
                push(pos, next - pos, false);
                pos = next;
                continue;
            };
            let chunk_end = ((c as u64 + 1) * CHUNK).min(end);
            let chunk = slot.read().unwrap_or_else(|e| e.into_inner());
            match chunk.as_ref() {
                None => push(pos, chunk_end - pos, false),
                Some(ch) => {
                    while pos < chunk_end {
                        let sector = ((pos % CHUNK) / SECTOR) as usize;
                        let next = ((pos / SECTOR + 1) * SECTOR).min(chunk_end);
                        push(pos, next - pos, ch.is_written(sector));
                        pos = next;
                    }
                }
            }
            pos = chunk_end;
        }
        Ok(Some(map))
    }

    fn describe(&self) -> String {
        format!("ram ({} MiB, allocated on write)", self.size() >> 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapped(s: &RamBackstore, offset: u64, len: u64) -> Vec<(u64, u64, bool)> {
        s.allocation(offset, len)
            .unwrap()
            .unwrap()
            .into_iter()
            .map(|x| (x.offset, x.len, x.mapped))
            .collect()
    }

    #[test]
    fn the_allocation_map_follows_writes_and_discards_by_sector() {
        let s = RamBackstore::new(4 * CHUNK);
        assert_eq!(mapped(&s, 0, 4 * CHUNK), vec![(0, 4 * CHUNK, false)]);
        // A write touching part of two sectors maps both.
        s.write_at(CHUNK + 700, &[1u8; 400]).unwrap();
        assert_eq!(
            mapped(&s, 0, 4 * CHUNK),
            vec![
                (0, CHUNK + 512, false),
                (CHUNK + 512, 1024, true),
                (CHUNK + 1536, 3 * CHUNK - 1536, false)
            ]
        );
        // Discarding one whole sector unmaps it; half a sector stays mapped.
        s.discard(CHUNK + 512, 512 + 256).unwrap();
        assert_eq!(
            mapped(&s, CHUNK, 2048),
            vec![
                (CHUNK, 1024, false),
                (CHUNK + 1024, 512, true),
                (CHUNK + 1536, 512, false)
            ]
        );
        // Zeros into a chunk never written allocate nothing.
        s.write_at(3 * CHUNK, &[0u8; 4096]).unwrap();
        assert_eq!(
            mapped(&s, 3 * CHUNK, CHUNK),
            vec![(3 * CHUNK, CHUNK, false)]
        );
        // A range that is not sector aligned is answered for exactly that range.
        assert_eq!(
            mapped(&s, CHUNK + 1100, 100),
            vec![(CHUNK + 1100, 100, true)]
        );
        assert!(s.allocation(4 * CHUNK - 1, 2).is_err());
    }

    #[test]
    fn reads_what_was_written_across_chunks() {
        let s = RamBackstore::new(4 * CHUNK);
        let data: Vec<u8> = (0..3 * CHUNK as usize / 2)
            .map(|i| (i % 251) as u8)
            .collect();
        s.write_at(CHUNK / 2 + 7, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        s.read_at(CHUNK / 2 + 7, &mut back).unwrap();
        assert_eq!(back, data);
        let mut zeros = vec![1u8; 16];
        s.read_at(3 * CHUNK, &mut zeros).unwrap();
        assert!(zeros.iter().all(|&b| b == 0));
        assert!(s.read_at(4 * CHUNK - 1, &mut [0u8; 2]).is_err());
        s.discard(0, 4 * CHUNK).unwrap();
        s.read_at(CHUNK / 2 + 7, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
    }

    /// Leaves of the table that a write has reached.
    fn leaves_made(s: &RamBackstore) -> usize {
        s.slots()
            .leaves
            .iter()
            .filter(|l| l.get().is_some())
            .count()
    }

    #[test]
    fn a_thin_pebibyte_store_makes_a_leaf_only_where_written() {
        let s = RamBackstore::new(RAM_MAX_BYTES);
        assert_eq!(s.slots().leaves.len(), 262_144);
        assert_eq!(leaves_made(&s), 0);
        // Zeros anywhere, reads and discards make nothing.
        s.write_at(RAM_MAX_BYTES / 2, &[0u8; 4096]).unwrap();
        s.read_at(RAM_MAX_BYTES / 3, &mut [7u8; 512]).unwrap();
        s.discard(0, 64 * CHUNK).unwrap();
        assert_eq!(leaves_made(&s), 0);
        let end = RAM_MAX_BYTES - 4096;
        s.write_at(end, &[9u8; 4096]).unwrap();
        assert_eq!(leaves_made(&s), 1);
        let mut back = [0u8; 4096];
        s.read_at(end, &mut back).unwrap();
        assert_eq!(back, [9u8; 4096]);
        // The whole capacity's map in three extents, leaf by leaf.
        assert_eq!(
            mapped(&s, 0, RAM_MAX_BYTES),
            vec![(0, end, false), (end, 4096, true)]
        );
        assert!(s.resize(RAM_MAX_BYTES + 512).is_err());
        assert_eq!(s.size(), RAM_MAX_BYTES);
    }

    /// Chunks holding memory in `s`.
    fn allocated(s: &RamBackstore) -> u64 {
        let slots = s.slots();
        (0..chunks_of(slots.size))
            .filter(|&c| slots.is_allocated(c))
            .count() as u64
    }

    #[test]
    fn a_write_past_the_budget_fails_whole_and_freed_chunks_make_room() {
        let budget = RamBudget::with_limit(3 * CHUNK);
        let s = RamBackstore::with_budget(8 * CHUNK, budget.clone());
        s.write_at(0, &vec![1u8; 2 * CHUNK as usize]).unwrap();
        // Zeros into chunks that do not exist take nothing.
        s.write_at(4 * CHUNK, &vec![0u8; CHUNK as usize]).unwrap();
        assert_eq!(budget.held(), 2 * CHUNK);
        // This one needs chunks 2 and 3 with room for one: nothing lands.
        let e = s
            .write_at(2 * CHUNK + 10, &vec![2u8; CHUNK as usize])
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
        assert!(e.to_string().contains("ram_limit"), "{e}");
        assert_eq!(budget.held(), 2 * CHUNK);
        assert_eq!(allocated(&s), 2);
        let mut back = vec![9u8; CHUNK as usize];
        s.read_at(2 * CHUNK + 10, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        // Writes into chunks it holds take nothing more.
        s.write_at(100, &[3u8; 1000]).unwrap();
        assert_eq!(budget.held(), 2 * CHUNK);
        // A discarded chunk gives its memory back, and the write fits.
        s.discard(0, CHUNK).unwrap();
        assert_eq!(budget.held(), CHUNK);
        s.write_at(2 * CHUNK + 10, &vec![2u8; CHUNK as usize])
            .unwrap();
        assert_eq!(budget.held(), 3 * CHUNK);
        // A shrink gives back the chunks it cuts off; the store, the rest.
        s.resize(2 * CHUNK).unwrap();
        assert_eq!((allocated(&s), budget.held()), (1, CHUNK));
        drop(s);
        assert_eq!(budget.held(), 0);
    }

    /// A chunk discarded in pieces (an UNMAP list whose descriptors each
    /// cover part of it) gives its memory back once no written sector is
    /// left; a piece still written keeps it, and its data.
    #[test]
    fn a_chunk_discarded_piece_by_piece_gives_its_memory_back() {
        let budget = RamBudget::with_limit(4 * CHUNK);
        let s = RamBackstore::with_budget(4 * CHUNK, budget.clone());
        s.write_at(CHUNK, &vec![7u8; CHUNK as usize]).unwrap();
        let half = CHUNK / 2;
        s.discard(CHUNK, half).unwrap();
        assert_eq!(
            (allocated(&s), budget.held()),
            (1, CHUNK),
            "half still written"
        );
        let mut back = vec![0u8; 4096];
        s.read_at(CHUNK + half, &mut back).unwrap();
        assert!(
            back.iter().all(|&b| b == 7),
            "the written half keeps its data"
        );
        // A discard reaching across the chunk's end into an unwritten one.
        s.discard(CHUNK + half, CHUNK).unwrap();
        assert_eq!(
            (allocated(&s), budget.held()),
            (0, 0),
            "a chunk with nothing written left still holds memory"
        );
        s.read_at(CHUNK + half, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
    }

    /// Writers racing into one new chunk with room for exactly that chunk:
    /// the chunk is charged once, so none of them is refused.
    #[test]
    fn writes_racing_into_one_new_chunk_at_the_limit_all_land() {
        const WRITERS: usize = 4;
        const ROUNDS: u64 = 200;
        let budget = RamBudget::with_limit(CHUNK);
        let s = RamBackstore::with_budget(ROUNDS * CHUNK, budget.clone());
        for round in 0..ROUNDS {
            let start = std::sync::Barrier::new(WRITERS);
            std::thread::scope(|scope| {
                for w in 0..WRITERS {
                    let (s, start) = (&s, &start);
                    scope.spawn(move || {
                        let at = round * CHUNK + w as u64 * 4096;
                        start.wait();
                        s.write_at(at, &[w as u8 + 1; 4096])
                            .unwrap_or_else(|e| panic!("round {round}, writer {w}: {e}"));
                    });
                }
            });
            assert_eq!(budget.held(), CHUNK);
            let mut back = vec![0u8; WRITERS * 4096];
            s.read_at(round * CHUNK, &mut back).unwrap();
            for (w, piece) in back.chunks(4096).enumerate() {
                assert!(piece.iter().all(|&b| b == w as u8 + 1), "round {round}");
            }
            s.discard(round * CHUNK, CHUNK).unwrap();
            assert_eq!(budget.held(), 0);
        }
    }

    /// Writers and discarders racing over a few chunks with room for all of
    /// them: no write is refused, and afterwards the budget holds exactly
    /// the chunks that exist (no charge lost or taken twice).
    #[test]
    fn racing_writes_and_discards_keep_the_budget_exact() {
        const CHUNKS: u64 = 4;
        let budget = RamBudget::with_limit(CHUNKS * CHUNK);
        let s = RamBackstore::with_budget(CHUNKS * CHUNK, budget.clone());
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let s = &s;
                scope.spawn(move || {
                    let mut x = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                    for _ in 0..2000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let c = x % CHUNKS;
                        if t % 2 == 0 {
                            // Across a chunk boundary now and then.
                            let at = c * CHUNK + (x >> 8) % CHUNK;
                            let len = (4096).min(CHUNKS * CHUNK - at) as usize;
                            s.write_at(at, &vec![t as u8 + 1; len]).unwrap();
                        } else {
                            s.discard(c * CHUNK, CHUNK).unwrap();
                        }
                    }
                });
            }
        });
        assert_eq!(budget.held(), allocated(&s) * CHUNK);
        drop(s);
        assert_eq!(budget.held(), 0);
    }

    /// A write across two chunks while a discard frees the second and
    /// another write takes the memory it gave back: the write lands whole or
    /// is refused with none of its bytes written.
    #[test]
    fn a_write_refused_in_a_race_with_a_discard_writes_nothing() {
        const ROUNDS: u8 = 250;
        // Room for chunks 0 and 1, which every round begins with: the one
        // the discard gives back goes to the write or to the other writer.
        let budget = RamBudget::with_limit(2 * CHUNK);
        let s = RamBackstore::with_budget(4 * CHUNK, budget.clone());
        // The write's span: the last 4 KiB of chunk 0 and the first of chunk 1.
        let (at, len) = (CHUNK - 4096, 8192);
        let mut refusals = 0;
        for _ in 0..60 {
            s.write_at(0, &[9; 4096]).unwrap();
            s.write_at(at, &[0; 4096]).unwrap();
            let mut last = 0u8;
            for k in 1..=ROUNDS {
                s.write_at(CHUNK, &[9; 4096]).unwrap();
                let go = std::sync::Barrier::new(3);
                let written = std::thread::scope(|scope| {
                    let w = scope.spawn(|| {
                        go.wait();
                        s.write_at(at, &vec![k; len])
                    });
                    scope.spawn(|| {
                        go.wait();
                        s.discard(CHUNK, CHUNK).unwrap();
                    });
                    scope.spawn(|| {
                        go.wait();
                        // Takes the memory the discard gives back, if it can.
                        let _ = s.write_at(2 * CHUNK, &[7; 4096]);
                    });
                    w.join().unwrap()
                });
                let mut tail = vec![0u8; 4096];
                s.read_at(at, &mut tail).unwrap();
                match written {
                    Ok(()) => last = k,
                    Err(e) => {
                        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
                        refusals += 1;
                    }
                }
                // Chunk 0 changes only by this write: its tail holds the last
                // value that landed, never one of a refused write.
                assert!(
                    tail.iter().all(|&b| b == last),
                    "round {k}: {:?}",
                    &tail[..4]
                );
                s.discard(2 * CHUNK, CHUNK).unwrap();
            }
        }
        // Both outcomes must have been seen for the test to mean anything.
        assert!(refusals > 0, "no write was refused");
    }

    #[test]
    #[should_panic(expected = "at most")]
    fn a_store_past_the_largest_is_refused() {
        RamBackstore::new(RAM_MAX_BYTES + 1);
    }

    #[test]
    fn resizing_across_leaves_keeps_what_stays_and_zeros_what_went() {
        let leaf = LEAF as u64 * CHUNK;
        let s = RamBackstore::new(leaf + 2 * CHUNK);
        s.write_at(leaf - 100, &[1u8; 200]).unwrap();
        s.write_at(leaf + 2 * CHUNK - 10, &[2u8; 10]).unwrap();
        assert_eq!(leaves_made(&s), 2);
        // Shrink into the first leaf: the second goes, the first keeps its head.
        s.resize(leaf - 50).unwrap();
        assert_eq!(s.slots().leaves.len(), 1);
        s.resize(3 * leaf).unwrap();
        let mut back = [0u8; 200];
        s.read_at(leaf - 100, &mut back).unwrap();
        assert_eq!(&back[..50], &[1u8; 50]);
        assert!(back[50..].iter().all(|&b| b == 0));
        let mut tail = [5u8; 10];
        s.read_at(leaf + 2 * CHUNK - 10, &mut tail).unwrap();
        assert_eq!(tail, [0u8; 10]);
        // The first leaf, short before, now has a full leaf's slots.
        s.write_at(leaf - 1, &[3u8; 2]).unwrap();
        s.write_at(3 * leaf - 1, &[4u8]).unwrap();
        let mut b = [0u8; 2];
        s.read_at(leaf - 1, &mut b).unwrap();
        assert_eq!(b, [3, 3]);
        assert_eq!(mapped(&s, leaf - 512, 1024), vec![(leaf - 512, 1024, true)]);
    }

    mod model {
        use super::*;
        use proptest::prelude::*;
        use std::collections::BTreeMap;

        const LEAF_BYTES: u64 = LEAF as u64 * CHUNK;

        #[derive(Debug, Clone)]
        enum Op {
            /// `head` bytes of zeros, then `byte` (zero too at times) to `len`.
            Write {
                at: u64,
                len: usize,
                head: usize,
                byte: u8,
            },
            Discard {
                at: u64,
                len: u64,
            },
            Resize {
                size: u64,
            },
            Read {
                at: u64,
                len: usize,
            },
        }

        /// Places where the table's structure changes: chunk and leaf edges.
        fn place() -> impl Strategy<Value = u64> {
            let edges = prop::sample::select(vec![
                0,
                CHUNK,
                LEAF_BYTES - CHUNK,
                LEAF_BYTES,
                LEAF_BYTES + CHUNK,
                2 * LEAF_BYTES,
            ]);
            (edges, -5000i64..5000).prop_map(|(e, d)| e.saturating_add_signed(d))
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (place(), 1usize..9000, 0usize..9000, any::<u8>()).prop_map(
                    |(at, len, head, byte)| Op::Write {
                        at,
                        len,
                        head: head.min(len),
                        byte
                    }
                ),
                (place(), 1u64..3 * CHUNK).prop_map(|(at, len)| Op::Discard { at, len }),
                place().prop_map(|size| Op::Resize { size: size.max(1) }),
                (place(), 1usize..9000).prop_map(|(at, len)| Op::Read { at, len }),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(48))]
            /// The store against a map of the bytes written, over writes,
            /// discards, reads and resizes at chunk and leaf edges: reads
            /// match, every byte that holds data is mapped, out-of-range
            /// requests fail and change nothing.
            #[test]
            fn the_store_reads_as_a_plain_byte_map(ops in prop::collection::vec(op(), 1..40)) {
                let mut size = LEAF_BYTES + 2 * CHUNK;
                let budget = RamBudget::with_limit(u64::MAX);
                let s = RamBackstore::with_budget(size, budget.clone());
                let mut model: BTreeMap<u64, u8> = BTreeMap::new();
                for op in ops {
                    match op {
                        Op::Write { at, len, head, byte } => {
                            let mut data = vec![byte; len];
                            data[..head].fill(0);
                            let r = s.write_at(at, &data);
                            prop_assert_eq!(r.is_ok(), at + len as u64 <= size);
                            if r.is_ok() {
                                for (o, &b) in (at..).zip(&data) {
                                    model.insert(o, b);
                                }
                            }
                        }
                        Op::Discard { at, len } => {
                            let r = s.discard(at, len);
                            prop_assert_eq!(r.is_ok(), at + len <= size);
                            if r.is_ok() {
                                let gone: Vec<u64> = model.range(at..at + len).map(|(&o, _)| o).collect();
                                for o in gone {
                                    model.remove(&o);
                                }
                            }
                        }
                        Op::Resize { size: new } => {
                            s.resize(new).unwrap();
                            size = new;
                            model.retain(|&o, _| o < size);
                        }
                        Op::Read { at, len } => {
                            let mut buf = vec![0xa5u8; len];
                            let r = s.read_at(at, &mut buf);
                            prop_assert_eq!(r.is_ok(), at + len as u64 <= size);
                            if r.is_ok() {
                                for (i, &b) in buf.iter().enumerate() {
                                    let want = model.get(&(at + i as u64)).copied().unwrap_or(0);
                                    prop_assert_eq!(b, want, "byte {}", at + i as u64);
                                }
                            }
                        }
                    }
                }
                prop_assert_eq!(s.size(), size);
                let map = s.allocation(0, size).unwrap().unwrap();
                prop_assert_eq!(map.iter().map(|e| e.len).sum::<u64>(), size);
                for (&o, _) in model.iter().filter(|(_, &b)| b != 0) {
                    let e = map.iter().find(|e| e.offset <= o && o < e.offset + e.len).unwrap();
                    prop_assert!(e.mapped, "byte {} holds data but is unmapped", o);
                }
                // The budget holds exactly the chunks that exist, and all
                // of it comes back with the store.
                prop_assert_eq!(budget.held(), allocated(&s) * CHUNK);
                drop(s);
                prop_assert_eq!(budget.held(), 0);
            }
        }
    }
}
