//! Backstores: where a logical unit's blocks live.
//!
//! The SCSI core sees only this trait. Calls block (a file backstore does
//! pread/pwrite), so the fabric runs SCSI commands on a blocking thread pool.

mod file;
mod ram;

pub use file::FileBackstore;
pub use ram::RamBackstore;

use std::io;

/// Storage behind one logical unit, addressed in bytes.
pub trait Backstore: Send + Sync + std::fmt::Debug {
    /// Capacity in bytes (a multiple of the block size).
    fn size(&self) -> u64;
    /// Reads `buf.len()` bytes at `offset`; the range lies within `size()`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `data` at `offset`; the range lies within `size()`.
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Makes every completed write durable (SYNCHRONIZE CACHE, FUA, shutdown).
    fn flush(&self) -> io::Result<()>;
    /// Deallocates a range (UNMAP); the range must then read as zeros.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        const ZEROS: [u8; 65536] = [0; 65536];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(ZEROS.len() as u64) as usize;
            self.write_at(offset + done, &ZEROS[..n])?;
            done += n as u64;
        }
        Ok(())
    }
    /// A short description for logs and the start-up banner.
    fn describe(&self) -> String;
}
