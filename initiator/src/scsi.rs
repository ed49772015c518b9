//! SCSI conveniences on a [`Session`]: INQUIRY, READ CAPACITY, REPORT
//! LUNS, TEST UNIT READY, SYNCHRONIZE CACHE. CDBs and parameter data are
//! `blockwire_pdu::scsi`'s.

use blockwire_pdu::scsi::{
    Cdb, CdbSize, Lun as ScsiLun, ReadCapacity10, ReadCapacity16, ReportLuns, Rw, StandardInquiry,
    Vpd, VpdPage,
};

use crate::error::{Error, Result};
use crate::session::{DataDir, Session};
use blockwire_pdu::scsi::SenseKey;

/// READ(16) or WRITE(16) CDB bytes.
pub fn rw16(write: bool, lba: u64, blocks: u32, fua: bool) -> Vec<u8> {
    let rw = Rw {
        size: CdbSize::Sixteen,
        lba,
        length: blocks,
        protect: 0,
        dpo: false,
        fua,
        group: 0,
    };
    if write {
        Cdb::Write(rw).encode()
    } else {
        Cdb::Read { rw, rarc: false }.encode()
    }
}

/// A LUN's capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Number of logical blocks.
    pub blocks: u64,
    /// Logical block length in bytes.
    pub block_size: u32,
}

/// The largest logical block length taken from a target: readers allocate
/// a block at a time, and no disk has blocks near this.
pub const MAX_BLOCK_LENGTH: u32 = 1 << 20;

impl Capacity {
    /// Size in bytes.
    pub fn bytes(&self) -> u64 {
        self.blocks.saturating_mul(u64::from(self.block_size))
    }

    /// The answer of READ CAPACITY(10): a RETURNED LOGICAL BLOCK ADDRESS of
    /// FFFFFFFFh says the medium is too large for it (SBC-4 5.16.2), and is
    /// no size: taken as one, a 3 TiB LUN was served as 2 TiB.
    pub fn from_answer_10(returned_lba: u32, block_length: u32) -> Result<Capacity> {
        if returned_lba == u32::MAX {
            return Err(Error::Protocol(
                "the LUN is too large for READ CAPACITY(10) (RETURNED LOGICAL BLOCK ADDRESS \
                 FFFFFFFFh), and the target refused READ CAPACITY(16): its size cannot be known"
                    .into(),
            ));
        }
        Self::from_answer("READ CAPACITY(10)", u64::from(returned_lba), block_length)
    }

    /// The capacity a READ CAPACITY answer gives: RETURNED LOGICAL BLOCK
    /// ADDRESS is the last block's, so there is one block more. A block
    /// length of zero or above [`MAX_BLOCK_LENGTH`], or a size that does not
    /// fit in 64 bits, is malformed (every reader divides by the block
    /// length and allocates blocks).
    pub fn from_answer(what: &str, returned_lba: u64, block_length: u32) -> Result<Capacity> {
        if block_length == 0 || block_length > MAX_BLOCK_LENGTH {
            return Err(bad_data(
                what,
                format!("a logical block length of {block_length} bytes (1 to {MAX_BLOCK_LENGTH} taken)"),
            ));
        }
        let blocks = returned_lba
            .checked_add(1)
            .filter(|b| b.checked_mul(u64::from(block_length)).is_some())
            .ok_or_else(|| {
                bad_data(
                    what,
                    format!(
                        "a last LBA of {returned_lba} with {block_length}-byte blocks is more bytes than 64 bits count"
                    ),
                )
            })?;
        Ok(Capacity {
            blocks,
            block_size: block_length,
        })
    }
}

fn bad_data(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Protocol(format!("malformed {what} data from the target: {e}"))
}

impl Session {
    /// TEST UNIT READY.
    pub async fn test_unit_ready(&self, lun: u16) -> Result<()> {
        self.execute(lun, &Cdb::TestUnitReady.encode(), DataDir::None)
            .await
            .map(|_| ())
    }

    /// Standard INQUIRY data.
    pub async fn inquiry(&self, lun: u16) -> Result<StandardInquiry> {
        let mut buf = vec![0u8; 255];
        let cdb = Cdb::Inquiry {
            evpd: false,
            page_code: 0,
            allocation_length: 255,
        };
        self.execute(lun, &cdb.encode(), DataDir::Read(&mut buf))
            .await?;
        StandardInquiry::decode(&buf).map_err(|e| bad_data("INQUIRY", e))
    }

    /// A VPD page (INQUIRY with EVPD).
    pub async fn vpd(&self, lun: u16, page: u8) -> Result<Vpd> {
        let mut buf = vec![0u8; 4096];
        let cdb = Cdb::Inquiry {
            evpd: true,
            page_code: page,
            allocation_length: 4096,
        };
        self.execute(lun, &cdb.encode(), DataDir::Read(&mut buf))
            .await?;
        Vpd::decode(&buf).map_err(|e| bad_data("VPD", e))
    }

    /// The MAXIMUM TRANSFER LENGTH of the Block Limits VPD page (B0h), in
    /// blocks: the most one READ or WRITE may ask for (SBC-4 6.6.4); a
    /// longer one the device server refuses with ILLEGAL REQUEST. None when
    /// the unit sets no limit (0) or has no such page (the command ends in
    /// CHECK CONDITION, as tgtd's and older targets' do).
    pub async fn max_transfer_blocks(&self, lun: u16) -> Result<Option<std::num::NonZeroU32>> {
        match self.vpd(lun, 0xb0).await {
            Ok(Vpd {
                page: VpdPage::BlockLimits(limits),
                ..
            }) => Ok(std::num::NonZeroU32::new(limits.max_transfer_length)),
            Ok(_) => Ok(None),
            // No such page: ILLEGAL REQUEST. Any other failure (BUSY past
            // its retries, an ABORTED COMMAND, a lost connection) says
            // nothing about the limit, and is the caller's to see.
            Err(Error::Scsi(s))
                if s.sense
                    .as_ref()
                    .is_some_and(|k| k.key == SenseKey::IllegalRequest) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether LUN `lun` takes the FUA bit of a WRITE: DPOFUA in the mode
    /// parameter header (SBC-4 6.5.1). A device server without it may
    /// ignore FUA, so a write that must be durable then needs a
    /// SYNCHRONIZE CACHE after it; a LUN that does not answer MODE SENSE
    /// counts as one without.
    pub async fn takes_fua(&self, lun: u16) -> bool {
        // The header alone: DBD, the caching page, 4 bytes.
        let mut buf = vec![0u8; 4];
        let cdb = Cdb::ModeSense6 {
            dbd: true,
            page_control: blockwire_pdu::scsi::PageControl::Current,
            page_code: 0x08,
            subpage_code: 0,
            allocation_length: 4,
        };
        match self
            .execute(lun, &cdb.encode(), DataDir::Read(&mut buf))
            .await
        {
            Ok(_) => {
                blockwire_pdu::scsi::ModeParameters::decode6(&buf).is_ok_and(|m| m.header.dpofua)
            }
            Err(_) => false,
        }
    }

    /// READ CAPACITY(16), falling back to READ CAPACITY(10) where the
    /// device server does not take it ([`takes_read_capacity_10`]).
    pub async fn read_capacity(&self, lun: u16) -> Result<Capacity> {
        let mut buf = vec![0u8; 32];
        let cdb = Cdb::ReadCapacity16 {
            lba: 0,
            allocation_length: 32,
            pmi: false,
        };
        match self
            .execute(lun, &cdb.encode(), DataDir::Read(&mut buf))
            .await
        {
            Ok(_) => {
                let rc =
                    ReadCapacity16::decode(&buf).map_err(|e| bad_data("READ CAPACITY(16)", e))?;
                Capacity::from_answer("READ CAPACITY(16)", rc.returned_lba, rc.block_length)
            }
            Err(e) if takes_read_capacity_10(&e) => {
                let mut buf = vec![0u8; 8];
                let cdb = Cdb::ReadCapacity10 { lba: 0, pmi: false };
                self.execute(lun, &cdb.encode(), DataDir::Read(&mut buf))
                    .await?;
                let rc =
                    ReadCapacity10::decode(&buf).map_err(|e| bad_data("READ CAPACITY(10)", e))?;
                Capacity::from_answer_10(rc.returned_lba, rc.block_length)
            }
            Err(e) => Err(e),
        }
    }

    /// REPORT LUNS (LUN 0 addressed): the single-level LUNs.
    pub async fn report_luns(&self) -> Result<Vec<u16>> {
        let mut buf = vec![0u8; 16 + 8 * 1024];
        let cdb = Cdb::ReportLuns {
            select_report: 0,
            allocation_length: buf.len() as u32,
        };
        self.execute(0, &cdb.encode(), DataDir::Read(&mut buf))
            .await?;
        let rl = ReportLuns::decode(&buf).map_err(|e| bad_data("REPORT LUNS", e))?;
        Ok(rl
            .single_level()
            .filter_map(|l| l.ok().map(ScsiLun::value))
            .collect())
    }

    /// SYNCHRONIZE CACHE(10) of the whole LUN. A device server that does
    /// not implement the command has no volatile cache to write back, so
    /// its refusal of it is success (as Linux's sd takes it). A flush that
    /// held still fails with a deferred error the session heard from the
    /// unit since the last flush (an acknowledged WRITE that failed
    /// later), once: what the caller wrote is not all on the medium.
    pub async fn synchronize_cache(&self, lun: u16) -> Result<()> {
        let cdb = Cdb::SynchronizeCache {
            size: CdbSize::Ten,
            immed: false,
            lba: 0,
            blocks: 0,
            group: 0,
        };
        match self.execute(lun, &cdb.encode(), DataDir::None).await {
            Ok(_) => {}
            Err(e) if lacks_synchronize_cache(&e) => {}
            Err(e) => return Err(e),
        }
        match self.take_deferred_error(lun) {
            Some(deferred) => Err(Error::Scsi(deferred)),
            None => Ok(()),
        }
    }
}

/// Whether a SYNCHRONIZE CACHE that failed with `e` was refused as a
/// command the device server does not implement (ILLEGAL REQUEST, INVALID
/// COMMAND OPERATION CODE): SBC-4 makes the command optional, and a unit
/// without it writes through, so what it acknowledged is on its medium.
/// Any other failure (a WRITE ERROR, INVALID FIELD IN CDB, a lost
/// connection) leaves the cache's state unknown and is the caller's.
fn lacks_synchronize_cache(e: &Error) -> bool {
    matches!(e, Error::Scsi(s) if s.sense_code().is_some_and(
        |(key, asc, ascq)| key == SenseKey::IllegalRequest
            && blockwire_pdu::scsi::Asc::new(asc, ascq)
                == blockwire_pdu::scsi::Asc::INVALID_COMMAND_OPERATION_CODE
    ))
}

/// The unit serial number (VPD 80h) as text, when the page is there.
pub fn serial_of(vpd: &Vpd) -> Option<String> {
    match &vpd.page {
        VpdPage::UnitSerialNumber(s) => Some(s.trim().to_owned()),
        _ => None,
    }
}

/// Whether a READ CAPACITY(16) that failed with `e` is asked again as
/// READ CAPACITY(10): only when the device server refuses the command
/// (ILLEGAL REQUEST, as Linux's sd falls back), not when it is becoming
/// ready or busy, whose answer to READ CAPACITY(10) would be no better.
fn takes_read_capacity_10(e: &Error) -> bool {
    matches!(e, Error::Scsi(s) if s.sense_code().is_some_and(
        |(key, _, _)| key == blockwire_pdu::scsi::SenseKey::IllegalRequest
    ))
}

#[cfg(test)]
mod capacity_tests {
    use super::*;

    /// READ CAPACITY(10) is asked only when READ CAPACITY(16) is refused
    /// as a command (ILLEGAL REQUEST), and its FFFFFFFFh is no size: any
    /// failure fell back to it (NOT READY just after a target's restart),
    /// and FFFFFFFFh made a 3 TiB LUN of 512-byte blocks 2 TiB.
    #[test]
    fn read_capacity_10_stands_in_only_where_it_can() {
        use blockwire_pdu::scsi::{Asc, Sense, SenseKey};
        let failed = |key, asc| {
            Error::Scsi(crate::ScsiError {
                lun: 0,
                opcode: 0x9e,
                status: blockwire_pdu::scsi::ScsiStatus::CHECK_CONDITION,
                sense: Some(Sense::new(key, asc)),
            })
        };
        assert!(takes_read_capacity_10(&failed(
            SenseKey::IllegalRequest,
            Asc::INVALID_COMMAND_OPERATION_CODE
        )));
        assert!(!takes_read_capacity_10(&failed(
            SenseKey::NotReady,
            Asc::LU_BECOMING_READY
        )));
        assert!(!takes_read_capacity_10(&Error::Timeout("x".into())));
        assert!(Capacity::from_answer_10(u32::MAX, 512).is_err());
        let c = Capacity::from_answer_10(2047, 512).unwrap();
        assert_eq!(c.blocks, 2048);
    }

    /// Every reader divides by the block length and allocates a block at a
    /// time: a zero, a huge length or a size past 64 bits from a target is
    /// an error naming the answer, never a division by zero or an overflow.
    #[test]
    fn a_capacity_answer_is_checked_before_it_is_used() {
        let ok = Capacity::from_answer("READ CAPACITY(16)", 2047, 512).unwrap();
        assert_eq!((ok.blocks, ok.bytes()), (2048, 1 << 20));
        for (lba, len) in [
            (2047, 0),
            (2047, MAX_BLOCK_LENGTH + 1),
            (u64::MAX, 512),
            (u64::MAX / 512, 512),
        ] {
            let e = Capacity::from_answer("READ CAPACITY(16)", lba, len).unwrap_err();
            assert!(
                e.to_string().contains("READ CAPACITY(16)"),
                "{lba} {len}: {e}"
            );
        }
        let last = Capacity::from_answer("READ CAPACITY(16)", u64::MAX / 512 - 1, 512).unwrap();
        assert_eq!(last.bytes(), (u64::MAX / 512) * 512);
    }
}
