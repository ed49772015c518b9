//! A RAM backstore that allocates memory only for what is written.
//!
//! The default LUN is 1 GiB; allocating it up front would cost a gibibyte
//! per target even when idle, so the store is split into 1 MiB chunks that
//! come into being on first write. Unwritten chunks read as zeros.

use super::Backstore;
use std::io;
use std::sync::RwLock;

const CHUNK: u64 = 1 << 20;

/// Sparse in-memory storage.
#[derive(Debug)]
pub struct RamBackstore {
    size: u64,
    chunks: Vec<RwLock<Option<Box<[u8]>>>>,
}

impl RamBackstore {
    /// A zero-filled store of `size` bytes.
    pub fn new(size: u64) -> RamBackstore {
        let n = size.div_ceil(CHUNK) as usize;
        RamBackstore {
            size,
            chunks: (0..n).map(|_| RwLock::new(None)).collect(),
        }
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

impl Backstore for RamBackstore {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(offset, buf.len())?;
        Self::pieces(offset, buf.len(), |c, at, range| {
            let chunk = self.chunks[c].read().unwrap_or_else(|e| e.into_inner());
            let n = range.len();
            match chunk.as_ref() {
                Some(data) => {
                    buf[range].copy_from_slice(&data[at..at + n]);
                    crate::copies::note_user_copy(n);
                }
                None => buf[range].fill(0),
            }
        });
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.check(offset, data.len())?;
        Self::pieces(offset, data.len(), |c, at, range| {
            let mut chunk = self.chunks[c].write().unwrap_or_else(|e| e.into_inner());
            let n = range.len();
            if chunk.is_none() && data[range.clone()].iter().all(|&b| b == 0) {
                // Zeros into an unallocated chunk: it already reads so.
                return;
            }
            let store = chunk.get_or_insert_with(|| vec![0u8; CHUNK as usize].into_boxed_slice());
            store[at..at + n].copy_from_slice(&data[range]);
        });
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len as usize)?;
        Self::pieces(offset, len as usize, |c, at, range| {
            let mut chunk = self.chunks[c].write().unwrap_or_else(|e| e.into_inner());
            if at == 0 && range.len() == CHUNK as usize {
                // A whole chunk: give the memory back.
                *chunk = None;
            } else if let Some(store) = chunk.as_mut() {
                store[at..at + range.len()].fill(0);
            }
        });
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        // Freed chunks and zero-filled ones read the same.
        self.discard(offset, len)
    }

    fn describe(&self) -> String {
        format!("ram ({} MiB, allocated on write)", self.size >> 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
