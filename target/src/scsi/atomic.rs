//! WRITE ATOMIC(16) (SBC-4 5.48) and the atomic fields of the Block Limits
//! VPD page (SBC-4 6.6.4).
//!
//! An atomic write changes every block it names or none of them (SBC-4
//! 4.29). The unit offers it only where its backstore can keep that promise
//! ([`crate::backstore::Backstore::atomic_write_max`]: RAM and null in
//! process, a file through its write-ahead journal) and the LUN's
//! configuration allows it; elsewhere the Block Limits page reports 0 in
//! every atomic field, REPORT SUPPORTED OPERATION CODES leaves 9Ch out and
//! the command ends with INVALID COMMAND OPERATION CODE.
//!
//! Against other writers: the range is held exclusively (plain writes hold
//! theirs shared, as for COMPARE AND WRITE), so an overlapping WRITE, UNMAP
//! or second atomic write lands wholly before or wholly after it. READs take
//! no range lock: one that overlaps an atomic write still in progress may
//! see part of it, as on a disk whose atomicity guarantee is about the
//! medium's state after a failure.
//!
//! The advertised limits: no alignment and no granularity requirement
//! (ATOMIC ALIGNMENT and ATOMIC TRANSFER LENGTH GRANULARITY 0: the journal
//! and the in-process copy take any whole blocks), MAXIMUM ATOMIC TRANSFER
//! LENGTH the store's limit in blocks (within MAXIMUM TRANSFER LENGTH), and
//! no atomic boundaries (MAXIMUM ATOMIC TRANSFER LENGTH WITH ATOMIC
//! BOUNDARY and MAXIMUM ATOMIC BOUNDARY SIZE 0). Linux's sd then uses
//! WRITE ATOMIC(16) with ATOMIC BOUNDARY 0 for its atomic writes, with a
//! unit from one physical block to the largest power of two within the
//! maximum.

use blockwire_pdu::scsi::{Asc, BlockLimits};
use tracing::warn;

use super::logical_unit::{LogicalUnit, MAX_TRANSFER_BYTES};
use super::outcome::{backstore_failure, illegal, invalid_cdb, CmdResult, Done, Failure};

/// The CDB fields of a WRITE ATOMIC(16).
#[derive(Debug, Clone, Copy)]
pub(crate) struct AtomicWrite {
    pub lba: u64,
    pub boundary: u16,
    pub blocks: u16,
    pub wrprotect: u8,
    pub fua: bool,
}

impl LogicalUnit {
    /// Largest atomic write in blocks; 0 when the unit offers none.
    pub(crate) fn atomic_max_blocks(&self) -> u32 {
        // The tuples of a protected unit are written beside the data, not
        // in the same atomic write, so the pair could tear: no atomics.
        if !self.cfg.atomic_writes || self.protected() {
            return 0;
        }
        let bs = u64::from(self.cfg.block_size);
        let unit = self.cfg.backstore.atomic_write_unit();
        if unit != 0 {
            // One size only: whole blocks, within one transfer.
            let fits = unit.is_multiple_of(bs)
                && unit <= u64::from(MAX_TRANSFER_BYTES)
                && unit / bs <= u64::from(u16::MAX);
            return if fits { (unit / bs) as u32 } else { 0 };
        }
        let bytes = self
            .cfg
            .backstore
            .atomic_write_max()
            .min(u64::from(MAX_TRANSFER_BYTES));
        // The transfer length field is 16 bits.
        (bytes / bs).min(u64::from(u16::MAX)) as u32
    }

    /// The blocks every atomic write must be a multiple of, at an LBA that
    /// is a multiple of them; 0: no such requirement. A store whose atomic
    /// writes are one size (the kernel's untorn writes) has them all of
    /// that size: ATOMIC ALIGNMENT = ATOMIC TRANSFER LENGTH GRANULARITY =
    /// MAXIMUM ATOMIC TRANSFER LENGTH.
    fn atomic_unit_blocks(&self) -> u32 {
        if self.cfg.backstore.atomic_write_unit() == 0 {
            0
        } else {
            self.atomic_max_blocks()
        }
    }

    /// The atomic fields of VPD B0h onto `l`.
    pub(crate) fn atomic_limits(&self, l: &mut BlockLimits) {
        l.max_atomic_transfer_length = self.atomic_max_blocks();
        let unit = self.atomic_unit_blocks();
        l.atomic_alignment = unit;
        l.atomic_transfer_length_granularity = unit;
        l.max_atomic_transfer_length_with_boundary = 0;
        l.max_atomic_boundary_size = 0;
    }

    /// WRITE ATOMIC(16).
    pub(crate) fn write_atomic(&self, c: &AtomicWrite, data_out: &[u8]) -> CmdResult {
        let max = self.atomic_max_blocks();
        if max == 0 {
            return Err(illegal(Asc::INVALID_COMMAND_OPERATION_CODE));
        }
        // No protection information (SBC-4 5.48: WRPROTECT as for WRITE).
        if c.wrprotect != 0 {
            return Err(invalid_cdb(1, Some(7)));
        }
        // No atomic boundaries are offered (MAXIMUM ATOMIC TRANSFER LENGTH
        // WITH ATOMIC BOUNDARY is 0): a non-zero ATOMIC BOUNDARY is invalid.
        if c.boundary != 0 {
            return Err(invalid_cdb(10, None));
        }
        self.check_range(c.lba, u64::from(c.blocks))?;
        if u32::from(c.blocks) > max {
            return Err(invalid_cdb(12, None));
        }
        // SBC-4 5.48.2: an LBA off the ATOMIC ALIGNMENT, or a TRANSFER
        // LENGTH off the ATOMIC TRANSFER LENGTH GRANULARITY, is invalid.
        let unit = self.atomic_unit_blocks();
        if unit != 0 {
            if !c.lba.is_multiple_of(u64::from(unit)) {
                return Err(invalid_cdb(2, None));
            }
            if !u32::from(c.blocks).is_multiple_of(unit) {
                return Err(invalid_cdb(12, None));
            }
        }
        self.check_writable()?;
        let bytes = usize::from(c.blocks) * self.cfg.block_size as usize;
        if bytes == 0 {
            return Ok(Done::none());
        }
        // All of it or nothing: a Data-Out shorter than the CDB asks for
        // cannot be written atomically (a plain WRITE writes what came).
        let data = data_out
            .get(..bytes)
            .ok_or_else(|| illegal(Asc::INVALID_FIELD_IN_COMMAND_INFORMATION_UNIT))?;
        let durable = self.write_through(c.fua);
        let offset = c.lba * u64::from(self.cfg.block_size);
        // The backstore makes it durable itself when asked (FUA, WCE off).
        let _g = self.ranges.exclusive(c.lba, c.lba + u64::from(c.blocks));
        self.cfg
            .backstore
            .write_atomic(offset, data, durable)
            .map_err(|e| atomic_failure(&e, c.lba, bytes))?;
        Ok(Done::out(bytes as u64))
    }
}

fn atomic_failure(e: &std::io::Error, lba: u64, len: usize) -> Failure {
    warn!(lba, len, error = %e, "backstore atomic write failed");
    backstore_failure(e, true, lba)
}
