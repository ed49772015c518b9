//! A backstore with no storage: reads return zeros, writes are discarded.
//! For benchmarks of the fabric and the data path without disk or memcpy
//! costs (tgtd's `--bstype null`).

use super::{Backstore, Extent};
use std::io;

/// Reads zeros, discards writes, reports every block deallocated.
#[derive(Debug)]
pub struct NullBackstore {
    size: u64,
}

impl NullBackstore {
    /// A store that claims `size` bytes.
    pub fn new(size: u64) -> NullBackstore {
        NullBackstore { size }
    }

    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "range {offset}+{len} beyond null store of {} bytes",
                    self.size
                ),
            )),
        }
    }
}

impl Backstore for NullBackstore {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        buf.fill(0);
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

    fn allocation(&self, offset: u64, len: u64) -> io::Result<Option<Vec<Extent>>> {
        self.check(offset, len)?;
        Ok(Some(vec![Extent {
            offset,
            len,
            mapped: false,
        }]))
    }

    fn describe(&self) -> String {
        format!(
            "null ({} MiB, reads zeros, discards writes)",
            self.size >> 20
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
