//! Backstores with no storage: writes are discarded and reads return
//! either zeros (the `null` backstore, tgtd's `--bstype null`) or the
//! no-disk pattern (`--no-disk`, the synchronized-sends paper's `gmblock-bogus`: a
//! function of the byte offset, so an initiator can verify what it got).
//! No storage I/O at all, so a benchmark measures the fabric and the
//! network alone. Benchmarks only: every write is lost.

use super::{Backstore, Extent};
use crate::datapath::source::pattern_fill;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// What reads of a storage-less store return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fill {
    /// Zeros; every block reported deallocated.
    Zeros,
    /// [`pattern_fill`] data; every block reported mapped (the pattern is
    /// never all zeros over a block, and saying so spares the SCSI core a
    /// content scan).
    Pattern,
}

/// Discards writes; reads return zeros ([`NullBackstore::new`]) or the
/// no-disk pattern ([`NullBackstore::pattern`]).
#[derive(Debug)]
pub struct NullBackstore {
    size: AtomicU64,
    fill: Fill,
    /// What it stands in for (`--check` and dry-run changes build storage
    /// this way and name what a real build would open).
    stands_for: Option<String>,
}

impl NullBackstore {
    /// A store that claims `size` bytes and reads zeros.
    pub fn new(size: u64) -> NullBackstore {
        NullBackstore {
            size: AtomicU64::new(size),
            fill: Fill::Zeros,
            stands_for: None,
        }
    }

    /// A store that claims `size` bytes and reads the no-disk pattern
    /// (`--no-disk`).
    pub fn pattern(size: u64) -> NullBackstore {
        NullBackstore {
            size: AtomicU64::new(size),
            fill: Fill::Pattern,
            stands_for: None,
        }
    }

    /// A no-disk pattern store of `size` bytes standing in for the storage
    /// `what` describes (as [`Backstore::describe`] would), which a check
    /// or a dry run does not open.
    pub fn stand_in(size: u64, what: String) -> NullBackstore {
        NullBackstore {
            stands_for: Some(what),
            ..NullBackstore::pattern(size)
        }
    }

    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size() => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "range {offset}+{len} beyond {} store of {} bytes",
                    match self.fill {
                        Fill::Zeros => "null",
                        Fill::Pattern => "no-disk",
                    },
                    self.size()
                ),
            )),
        }
    }
}

impl Backstore for NullBackstore {
    fn capabilities(&self) -> super::Capabilities {
        super::Capabilities {
            file: None,
            // The no-disk pattern is what the engine's pattern source makes.
            engine_reads: self.fill == Fill::Pattern,
            allocation_map: true,
        }
    }

    /// The no-disk pattern reads the same after a discard as before.
    fn reads_zeros_where_discarded(&self) -> bool {
        self.fill == Fill::Zeros
    }

    fn engine_source(&self) -> io::Result<Option<(crate::datapath::Source, bool)>> {
        Ok((self.fill == Fill::Pattern).then_some((crate::datapath::Source::Pattern, false)))
    }

    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn check_resize(&self, _new_size: u64) -> io::Result<()> {
        Ok(())
    }

    fn resize(&self, new_size: u64) -> io::Result<()> {
        self.size.store(new_size, Ordering::Release);
        Ok(())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        match self.fill {
            Fill::Zeros => buf.fill(0),
            Fill::Pattern => pattern_fill(offset, buf),
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.check(offset, data.len() as u64)
    }

    fn write_at_durable(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.check(offset, data.len() as u64)
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    /// Nothing is kept, so nothing can be torn: as large as any transfer.
    fn atomic_write_max(&self) -> u64 {
        super::IN_PROCESS_ATOMIC_MAX
    }

    fn write_atomic(&self, offset: u64, data: &[u8], _durable: bool) -> io::Result<()> {
        self.check(offset, data.len() as u64)
    }

    fn writes_to_memory(&self) -> bool {
        // Writes are checked against the capacity and dropped: no device.
        true
    }

    fn in_memory(&self) -> bool {
        // Zeros or the pattern, computed; no device.
        true
    }

    fn volatile_cache(&self) -> bool {
        false
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len)
    }

    fn allocation(&self, offset: u64, len: u64) -> io::Result<Option<Vec<Extent>>> {
        self.check(offset, len)?;
        Ok(Some(vec![Extent {
            offset,
            len,
            mapped: self.fill == Fill::Pattern,
        }]))
    }

    fn describe(&self) -> String {
        if let Some(what) = &self.stands_for {
            return what.clone();
        }
        match self.fill {
            Fill::Zeros => format!(
                "null ({} MiB, reads zeros, discards writes)",
                self.size() >> 20
            ),
            Fill::Pattern => format!(
                "no-disk pattern ({} MiB, benchmark only: writes are dropped)",
                self.size() >> 20
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::source::pattern_byte;

    #[test]
    fn reads_zeros_and_discards_writes() {
        let s = NullBackstore::new(1 << 20);
        s.write_at(0, &[0xaa; 4096]).unwrap();
        let mut b = [1u8; 4096];
        s.read_at(0, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0));
        assert!(s.read_at((1 << 20) - 1, &mut [0u8; 2]).is_err());
        assert!(!s.volatile_cache());
        let map = s.allocation(0, 1 << 20).unwrap().unwrap();
        assert_eq!(map.len(), 1);
        assert!(!map[0].mapped);
    }

    #[test]
    fn reads_the_offset_pattern_and_drops_writes() {
        let s = NullBackstore::pattern(1 << 20);
        let mut a = vec![0u8; 8192];
        s.read_at(4096 + 3, &mut a).unwrap();
        for (i, b) in a.iter().enumerate() {
            assert_eq!(*b, pattern_byte(4096 + 3 + i as u64), "byte {i}");
        }
        s.write_at(4096, &[0u8; 4096]).unwrap();
        let mut again = vec![0u8; 8192];
        s.read_at(4096 + 3, &mut again).unwrap();
        assert_eq!(a, again, "the write was not stored");
        assert!(s.read_at((1 << 20) - 1, &mut [0u8; 2]).is_err());
        assert!(s.write_at(1 << 20, &[0u8; 1]).is_err());
    }
}
