//! Backstores: where a logical unit's blocks live.
//!
//! The SCSI core sees only this trait. Calls block (a file backstore does
//! pread/pwrite), so the fabric runs SCSI commands on a blocking thread pool.
//!
//! | backstore | reads | writes | UNMAP | durability |
//! |---|---|---|---|---|
//! | [`RamBackstore`] | memory | memory, allocated on first write | frees whole chunks, zeroes the rest | none (volatile by nature) |
//! | [`FileBackstore`] cached | page cache | page cache | `fallocate(PUNCH_HOLE)` | `fdatasync` / `RWF_DSYNC` |
//! | [`FileBackstore`] direct | `O_DIRECT` via aligned bounce buffers | same | same | same |
//! | [`NullBackstore`] | zeros | discarded | nothing to do | nothing to keep |
//! | [`NullBackstore::pattern`] (`--no-disk`) | offset pattern | discarded | nothing to do | nothing to keep |
//! | [`StripedBackstore`] | RAID0 over [`FileBackstore`] members, large requests one thread per member | same, per member | per member | every member |
//!
//! WRITE ATOMIC(16) (SBC-4 4.29: every block or none, also across a crash)
//! is offered only where the store can keep that promise
//! ([`Backstore::atomic_write_max`]):
//!
//! | backstore | atomic writes |
//! |---|---|
//! | [`RamBackstore`] | in process: the SCSI core holds the range exclusively while the bytes are copied (a RAM disk does not outlive its process anyway) |
//! | [`NullBackstore`] | trivially (nothing is kept) |
//! | [`FileBackstore`] | with a write-ahead journal ([`journal`], a sidecar file; [`FileBackstore::with_atomic_journal`]); none without one |
//! | [`StripedBackstore`] | none (a write may span members) |
//!
//! Errors are `std::io::Error`s; the SCSI core turns them into MEDIUM
//! ERROR (EIO, with the LBA), DATA PROTECT (ENOSPC on a thin LUN: SPACE
//! ALLOCATION FAILED WRITE PROTECT) or HARDWARE ERROR (anything else).

pub mod device_atomic;
mod file;
pub mod journal;
mod null;
mod ram;
pub mod ram_budget;
pub mod striped;

pub use file::{lives_in_memory, unusable_kind, FileBackstore, FileMode};
pub use null::NullBackstore;
pub use ram::{ram_size_refusal, RamBackstore, RAM_MAX_BYTES};
pub use striped::StripedBackstore;

use std::io;
use std::path::PathBuf;

use crate::datapath::Source;

/// Largest atomic write of the stores that make one atomic in process
/// (RAM, null), in bytes: 256 blocks of 4 KiB, what libiscsi's WRITE
/// ATOMIC tests send at most.
pub const IN_PROCESS_ATOMIC_MAX: u64 = 1 << 20;

/// A store's one file, for the data paths that reach it by descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreFile {
    /// Where it is.
    pub path: PathBuf,
    /// It runs `O_DIRECT` (engine ranges must then be 4 KiB aligned);
    /// false: through the page cache.
    pub direct: bool,
}

/// What a store can do besides reading and writing blocks, so that the
/// fabric picks a LUN's data paths from its storage (see
/// `iscsi::Fabric::start_data_paths`) rather than from per-path lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// The store is this one file at the LUN's byte offsets: the I/O engine
    /// can write it by descriptor (double-buffered WRITEs) and, when it
    /// runs through the page cache, READ payloads can leave it by
    /// `sendfile(2)`.
    pub file: Option<StoreFile>,
    /// The I/O engine can read the store into registered buffers
    /// ([`Backstore::engine_source`]): a file, striped members (one stream
    /// each), or the no-disk pattern.
    pub engine_reads: bool,
    /// [`Backstore::allocation`] reports what is mapped (holes, UNMAP),
    /// not a guess from the data.
    pub allocation_map: bool,
}

/// One run of an allocation map: `len` bytes from `offset`, mapped or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Byte offset.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Backed by storage (false: a hole that reads as zeros).
    pub mapped: bool,
}

/// The space a thin store takes and the space its writes may still take
/// (SBC-4 4.7.3.7: used and available LBA mapping resources).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// Bytes the store holds now (a sparse file's allocated blocks, a RAM
    /// store's chunks).
    pub used: u64,
    /// Bytes new allocations may still take before a write fails for want
    /// of space: the free space of the file system under a file (for an
    /// unprivileged writer), or what the RAM LUNs' common limit still
    /// allows. Other files and LUNs draw on it too.
    pub available: u64,
}

/// Storage behind one logical unit, addressed in bytes.
pub trait Backstore: Send + Sync + std::fmt::Debug {
    /// Capacity in bytes (a multiple of the block size).
    fn size(&self) -> u64;
    /// Changes the capacity to `new_size` bytes (a multiple of the block
    /// size) while the store serves; the logical unit reports CAPACITY DATA
    /// HAS CHANGED on its next command. Stores that cannot, say why.
    fn resize(&self, new_size: u64) -> io::Result<()> {
        self.check_resize(new_size)
    }
    /// Why [`Backstore::resize`] to `new_size` would be refused for what it
    /// asks (a shrink the store cannot make, a size it cannot take),
    /// changing nothing: a live change checks each resize it makes before
    /// it makes the first, so a refused one leaves none made. (An I/O
    /// error may still fail the resize itself.)
    fn check_resize(&self, new_size: u64) -> io::Result<()> {
        let _ = new_size;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{} cannot be resized while it serves", self.describe()),
        ))
    }
    /// Reads `buf.len()` bytes at `offset`; the range lies within `size()`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `data` at `offset`; the range lies within `size()`.
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Writes `data` at `offset` and returns only once it is on stable
    /// storage (FUA, or every write while WCE is off). The default writes,
    /// then flushes everything.
    fn write_at_durable(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.write_at(offset, data)?;
        self.flush()
    }
    /// Makes every completed write durable (SYNCHRONIZE CACHE, FUA, shutdown).
    fn flush(&self) -> io::Result<()>;
    /// Largest write, in bytes, that [`Backstore::write_atomic`] makes
    /// whole-or-nothing; 0 (the default) when the store cannot, and then
    /// the unit advertises no atomic writes and refuses WRITE ATOMIC(16).
    fn atomic_write_max(&self) -> u64 {
        0
    }
    /// The one size, in bytes, every atomic write of this store must have,
    /// at an offset that is a multiple of it; 0 (the default): any whole
    /// blocks at any offset, up to [`Backstore::atomic_write_max`]. A store
    /// whose atomic writes are the kernel's (`RWF_ATOMIC`, one power of two
    /// at an offset aligned to it) says which size it takes, and the unit
    /// advertises it as ATOMIC ALIGNMENT and ATOMIC TRANSFER LENGTH
    /// GRANULARITY (SBC-4 6.6.4), so that no valid WRITE ATOMIC(16) needs a
    /// shape the kernel refuses.
    fn atomic_write_unit(&self) -> u64 {
        0
    }
    /// Writes all of `data` at `offset` or none of it: after an error, a
    /// crash of the process or a power loss, a later read finds every byte
    /// old or every byte new (SBC-4 4.29). `durable`: on stable storage
    /// before returning (FUA, or WCE off). The caller holds the range
    /// exclusively, so no other write of it runs meanwhile; `data` is at
    /// most [`Backstore::atomic_write_max`] bytes.
    fn write_atomic(&self, offset: u64, data: &[u8], durable: bool) -> io::Result<()> {
        let _ = (offset, data, durable);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{} cannot write atomically", self.describe()),
        ))
    }

    /// Whether a small plain (not durable) [`Backstore::write_at`] is a copy
    /// into memory that returns without waiting for a device: RAM, or the
    /// page cache of a file opened without O_DIRECT (there a write waits
    /// only when the kernel throttles a writer with too many dirty pages).
    /// The fabric then writes small WRITEs on the connection's task instead
    /// of handing each to a blocking thread and back. False unless a store
    /// says so: a store that may sleep (O_DIRECT, members on disks, fault
    /// injection) keeps its writes on blocking threads.
    fn writes_to_memory(&self) -> bool {
        false
    }
    /// Whether reads, writes and [`Backstore::allocation`] are operations on
    /// this process's memory that never wait for a device or a file (RAM,
    /// the null store). The fabric then answers small READs and GET LBA
    /// STATUS on the connection's task. False unless a store says so.
    fn in_memory(&self) -> bool {
        false
    }
    /// Reads `len` bytes at `offset` into a new buffer. The default reads
    /// with [`Backstore::read_at`] into zeros; a store that can read into
    /// memory not yet written skips zeroing it first (a protected unit's
    /// 1 MiB READ spent a tenth of its time in that memset).
    fn read_to_vec(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut v = crate::payload_buffers::take(len);
        v.resize(len, 0);
        self.read_at(offset, &mut v)?;
        Ok(v)
    }
    /// Reads like [`Backstore::read_at`] if it can without waiting for a
    /// device: `Ok(true)` with `buf` filled, `Ok(false)` when part of the
    /// range is not in memory (`buf` then holds nothing usable) and the
    /// caller reads it where waiting is allowed. The fabric reads a
    /// protected unit's small READs this way on the connection's task. The
    /// default reads stores [`Backstore::in_memory`] and declines for the
    /// rest.
    fn read_at_without_waiting(&self, offset: u64, buf: &mut [u8]) -> io::Result<bool> {
        if self.in_memory() {
            self.read_at(offset, buf).map(|()| true)
        } else {
            Ok(false)
        }
    }
    /// Whether completed writes may still sit in a volatile cache until
    /// [`Backstore::flush`] (the caching mode page reports WCE from this).
    fn volatile_cache(&self) -> bool {
        true
    }
    /// Whether a range [`Backstore::discard`] took reads as zeros after it,
    /// as a thin provisioned unit promises its initiators (LBPRZ=1): a unit
    /// on a store that cannot is fully provisioned.
    fn reads_zeros_where_discarded(&self) -> bool {
        true
    }
    /// Refuses a write of `[offset, offset+len)` the store's own rules
    /// forbid before any byte moves, for a writer that puts the bytes on
    /// the medium without this store (the fabric's pipelined WRITEs, which
    /// the I/O engine writes to the file itself). Default: none.
    fn check_write(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    /// Erases every copy of written data the store keeps apart from its
    /// blocks (a file LUN's atomic-write journal), so that SANITIZE leaves
    /// none behind (SBC-4 4.11.1). Default: the store keeps none.
    fn erase_copies(&self) -> io::Result<()> {
        Ok(())
    }
    /// Deallocates a range (UNMAP); the range must then read as zeros.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.write_zeroes(offset, len)
    }
    /// Writes zeros over a range (WRITE SAME of a zero block without UNMAP).
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        static ZEROS: [u8; 65536] = [0; 65536];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(ZEROS.len() as u64) as usize;
            self.write_at(offset + done, &ZEROS[..n])?;
            done += n as u64;
        }
        Ok(())
    }
    /// The allocation map of `[offset, offset+len)`, in order and covering
    /// the range, or `None` when the store keeps none (the SCSI core then
    /// treats all-zero blocks as deallocated, which LBPRZ makes truthful).
    fn allocation(&self, offset: u64, len: u64) -> io::Result<Option<Vec<Extent>>> {
        let _ = (offset, len);
        Ok(None)
    }
    /// The space the store takes and may still take, for stores that
    /// allocate as they are written (a sparse file, RAM); `None` for
    /// stores whose space is all theirs from the start (a block device,
    /// the null store), which then have no provisioning thresholds.
    fn space(&self) -> io::Result<Option<Space>> {
        Ok(None)
    }

    /// What the store can do besides reading and writing blocks.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    /// What the I/O engine reads, opened now, and whether it is
    /// `O_DIRECT`; `None` when [`Capabilities::engine_reads`] is false.
    fn engine_source(&self) -> io::Result<Option<(Source, bool)>> {
        Ok(None)
    }
    /// A short description for logs and the start-up banner.
    fn describe(&self) -> String;
}
