//! The `--no-disk` backstore (issue 7 item 4, P1's `gmblock-bogus`): reads
//! return [`pattern_fill`] data, a function of the byte offset (so an
//! initiator can verify what it got), writes are dropped. No storage I/O
//! at all, so a benchmark measures the fabric and the network alone.
//! Benchmarks only: every write is lost.

use super::{Backstore, Extent};
use crate::datapath::source::pattern_fill;
use std::io;

/// Serves the no-disk pattern, drops writes.
#[derive(Debug)]
pub struct PatternBackstore {
    size: u64,
}

impl PatternBackstore {
    /// A store that claims `size` bytes.
    pub fn new(size: u64) -> PatternBackstore {
        PatternBackstore { size }
    }

    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "range {offset}+{len} beyond no-disk store of {} bytes",
                    self.size
                ),
            )),
        }
    }
}

impl Backstore for PatternBackstore {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        pattern_fill(offset, buf);
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

    fn volatile_cache(&self) -> bool {
        false
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len)
    }

    /// Everything is mapped: the pattern is never all zeros over a block,
    /// and saying so spares the SCSI core a content scan.
    fn allocation(&self, offset: u64, len: u64) -> io::Result<Option<Vec<Extent>>> {
        self.check(offset, len)?;
        Ok(Some(vec![Extent {
            offset,
            len,
            mapped: true,
        }]))
    }

    fn describe(&self) -> String {
        format!(
            "no-disk pattern ({} MiB, benchmark only: writes are dropped)",
            self.size >> 20
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::source::pattern_byte;

    #[test]
    fn reads_the_offset_pattern_and_drops_writes() {
        let s = PatternBackstore::new(1 << 20);
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
