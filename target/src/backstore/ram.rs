//! A RAM backstore that allocates memory only for what is written.
//!
//! The default LUN is 1 GiB; allocating it up front would cost a gibibyte
//! per target even when idle, so the store is split into 1 MiB chunks that
//! come into being on first write. Unwritten chunks read as zeros.
//!
//! Each chunk also keeps which of its 512-byte sectors were written since they
//! were last discarded: the store's allocation map. GET LBA STATUS answers from
//! it without reading data (an initiator such as QEMU asks before its reads, and
//! deriving the map from content would scan megabytes per command).

use super::{Backstore, Extent};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard};

const CHUNK: u64 = 1 << 20;
/// The allocation map's unit: the smallest logical block.
const SECTOR: u64 = 512;
const SECTORS: usize = (CHUNK / SECTOR) as usize;

/// One allocated chunk: its bytes and which sectors hold written data.
#[derive(Debug)]
struct Chunk {
    data: Box<[u8]>,
    written: Box<[u64; SECTORS / 64]>,
}

impl Chunk {
    fn new() -> Chunk {
        Chunk {
            data: vec![0u8; CHUNK as usize].into_boxed_slice(),
            written: Box::new([0; SECTORS / 64]),
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
}

#[derive(Debug)]
struct Slots {
    size: u64,
    chunks: Vec<RwLock<Option<Chunk>>>,
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
}

impl RamBackstore {
    /// A zero-filled store of `size` bytes.
    pub fn new(size: u64) -> RamBackstore {
        let n = size.div_ceil(CHUNK) as usize;
        RamBackstore {
            size: AtomicU64::new(size),
            slots: RwLock::new(Slots {
                size,
                chunks: (0..n).map(|_| RwLock::new(None)).collect(),
            }),
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
}

impl Backstore for RamBackstore {
    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn resize(&self, new_size: u64) -> io::Result<()> {
        let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
        let n = new_size.div_ceil(CHUNK) as usize;
        if new_size < slots.size {
            // Bytes past the new end must read as zeros if the store grows
            // again: clear the tail of the last kept chunk.
            let tail = new_size % CHUNK;
            if tail != 0 {
                if let Some(ch) = slots.chunks[n - 1]
                    .get_mut()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_mut()
                {
                    ch.data[tail as usize..].fill(0);
                    ch.clear(tail as usize, (CHUNK - tail) as usize);
                }
            }
        }
        slots.chunks.resize_with(n, || RwLock::new(None));
        slots.size = new_size;
        self.size.store(new_size, Ordering::Release);
        Ok(())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let slots = self.slots();
        slots.check(offset, buf.len())?;
        Self::pieces(offset, buf.len(), |c, at, range| {
            let chunk = slots.chunks[c].read().unwrap_or_else(|e| e.into_inner());
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
        Self::pieces(offset, data.len(), |c, at, range| {
            let mut chunk = slots.chunks[c].write().unwrap_or_else(|e| e.into_inner());
            let n = range.len();
            if chunk.is_none() && data[range.clone()].iter().all(|&b| b == 0) {
                // Zeros into an unallocated chunk: it already reads so.
                return;
            }
            let store = chunk.get_or_insert_with(Chunk::new);
            store.data[at..at + n].copy_from_slice(&data[range]);
            store.mark(at, n);
        });
        Ok(())
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
            let mut chunk = slots.chunks[c].write().unwrap_or_else(|e| e.into_inner());
            if at == 0 && range.len() == CHUNK as usize {
                // A whole chunk: give the memory back.
                *chunk = None;
            } else if let Some(store) = chunk.as_mut() {
                store.data[at..at + range.len()].fill(0);
                store.clear(at, range.len());
            }
        });
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        // Freed chunks and zero-filled ones read the same.
        self.discard(offset, len)
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
            let chunk_end = ((c as u64 + 1) * CHUNK).min(end);
            let chunk = slots.chunks[c].read().unwrap_or_else(|e| e.into_inner());
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
}
