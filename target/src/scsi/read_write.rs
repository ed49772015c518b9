//! Media access commands (SBC-3): READ, WRITE, WRITE AND VERIFY, VERIFY,
//! ORWRITE, COMPARE AND WRITE, WRITE SAME, UNMAP, GET LBA STATUS,
//! PRE-FETCH, SYNCHRONIZE CACHE, READ CAPACITY.
//!
//! Every length from the CDB is checked against the capacity and against
//! [`MAX_TRANSFER_BYTES`] before any buffer is allocated.

use blockwire_pdu::scsi::{Asc, CdbSize, ReadCapacity10, ReadCapacity16, Rw, Sense, UnmapList};
use tracing::warn;

use super::inquiry::MAX_UNMAP_DESCRIPTORS;
use blockwire_pdu::scsi::protection::TUPLE_BYTES;
use blockwire_pdu::scsi::PiChecks;

use super::logical_unit::LogicalUnit;
use super::outcome::{
    backstore_failure, data_protect, illegal, invalid_cdb, invalid_param, lba_out_of_range,
    param_length, CmdResult, Done, Failure,
};
use super::protection::split_protected;

/// Byte offset of the TRANSFER LENGTH field for each CDB size (for the
/// INVALID FIELD IN CDB field pointer).
fn length_byte(size: CdbSize) -> u16 {
    match size {
        CdbSize::Six => 4,
        CdbSize::Ten => 7,
        CdbSize::Twelve => 6,
        CdbSize::Sixteen => 10,
    }
}

/// INVALID FIELD IN COMMAND INFORMATION UNIT: the initiator sent a partial
/// block where the command needs whole ones.
fn partial_block() -> Failure {
    illegal(Asc::INVALID_FIELD_IN_COMMAND_INFORMATION_UNIT)
}

/// Most blocks GET LBA STATUS inspects per command (it derives mapping from
/// content, so the scan is bounded to keep the command short).
const LBA_STATUS_SCAN_BYTES: u64 = 8 << 20;

/// The most of a VERIFY's range read at once: the medium is read and
/// compared a piece at a time, so that a VERIFY of the largest transfer
/// (which for BYTCHK 0 or 3 brings little or no Data-Out, and so nothing
/// a budget counts) holds no buffer of that size.
pub(crate) const VERIFY_PIECE: usize = 1 << 20;

impl LogicalUnit {
    /// LBA OUT OF RANGE unless `[lba, lba+blocks)` lies within the medium.
    pub(crate) fn check_range(&self, lba: u64, blocks: u64) -> Result<(), Failure> {
        match lba.checked_add(blocks) {
            Some(end) if end <= self.blocks() => Ok(()),
            _ => Err(lba_out_of_range()),
        }
    }

    /// Bytes for `blocks`, or INVALID FIELD IN CDB at the length field when
    /// over the advertised MAXIMUM TRANSFER LENGTH (SBC-4 6.6.4), which a
    /// protected unit counts with each block's tuple: held to the bytes
    /// alone, 64 528 blocks of 512 passed where 64 527 were advertised, and
    /// their Data-In buffer went past the bound.
    fn transfer_bytes(&self, blocks: u32, size: CdbSize) -> Result<usize, Failure> {
        if blocks > self.max_transfer_blocks() {
            return Err(invalid_cdb(length_byte(size), None));
        }
        Ok(blocks as usize * self.cfg.block_size as usize)
    }

    /// DATA PROTECT unless writes are allowed: WRITE PROTECTED for a
    /// read-only LUN, SOFTWARE WRITE PROTECTED while SWP is set.
    pub(crate) fn check_writable(&self) -> Result<(), Failure> {
        if self.cfg.read_only {
            return Err(data_protect(Asc::WRITE_PROTECTED));
        }
        if self.lock().mode.swp {
            return Err(data_protect(Asc::LU_SOFTWARE_WRITE_PROTECTED));
        }
        Ok(())
    }

    fn offset(&self, lba: u64) -> u64 {
        lba * u64::from(self.cfg.block_size)
    }

    /// Reads blocks and, on a unit formatted with protection information,
    /// checks them against their stored tuples.
    pub(crate) fn read_blocks(&self, lba: u64, buf: &mut [u8]) -> Result<(), Failure> {
        self.read_unchecked(lba, buf)?;
        self.check_stored_pi(lba, buf)
    }

    /// `len` bytes of blocks from `lba` in a new buffer, without looking at
    /// their protection information.
    pub(crate) fn read_unchecked_to_vec(&self, lba: u64, len: usize) -> Result<Vec<u8>, Failure> {
        self.cfg
            .backstore
            .read_to_vec(self.offset(lba), len)
            .map_err(|e| {
                warn!(lba, len, error = %e, "backstore read failed");
                backstore_failure(&e, false, lba)
            })
    }

    /// Reads blocks without looking at their protection information.
    pub(crate) fn read_unchecked(&self, lba: u64, buf: &mut [u8]) -> Result<(), Failure> {
        self.cfg
            .backstore
            .read_at(self.offset(lba), buf)
            .map_err(|e| {
                warn!(lba, len = buf.len(), error = %e, "backstore read failed");
                backstore_failure(&e, false, lba)
            })
    }

    /// Writes blocks and, on a unit formatted with protection information,
    /// the tuples it generates for them.
    pub(crate) fn write_blocks(&self, lba: u64, data: &[u8]) -> Result<(), Failure> {
        self.write_unprotected(lba, data, false)?;
        self.generate_pi(lba, data, false)
    }

    /// Writes blocks only (their tuples are the caller's business).
    fn write_unprotected(&self, lba: u64, data: &[u8], durable: bool) -> Result<(), Failure> {
        let r = if durable {
            self.cfg.backstore.write_at_durable(self.offset(lba), data)
        } else {
            self.cfg.backstore.write_at(self.offset(lba), data)
        };
        r.map_err(|e| {
            warn!(lba, len = data.len(), durable, error = %e, "backstore write failed");
            backstore_failure(&e, true, lba)
        })
    }

    /// A write that is on stable storage before it returns (FUA, or WCE
    /// off): the backstore's `write_at_durable` (RWF_DSYNC on files).
    fn write_blocks_durable(&self, lba: u64, data: &[u8]) -> Result<(), Failure> {
        self.write_unprotected(lba, data, true)?;
        self.generate_pi(lba, data, true)
    }

    /// Zeros over `len` bytes at `lba` (the backstore may do it without
    /// moving the bytes).
    pub(crate) fn zero_blocks(&self, lba: u64, len: u64) -> Result<(), Failure> {
        self.write_zeroes(lba, len)?;
        self.generate_zero_pi(lba, len / u64::from(self.cfg.block_size))
    }

    /// Zeros `len` bytes of blocks from `lba` as WRITE SAME with NDOB does:
    /// SBC-4 has the protection information of each, if any, all FFh (guard
    /// FFFFh, application tag FFFFh, reference tag FFFF_FFFFh), which no
    /// read checks.
    fn zero_blocks_without_data_out(&self, lba: u64, len: u64) -> Result<(), Failure> {
        self.write_zeroes(lba, len)?;
        self.discard_pi(lba, len / u64::from(self.cfg.block_size))
    }

    fn write_zeroes(&self, lba: u64, len: u64) -> Result<(), Failure> {
        self.cfg
            .backstore
            .write_zeroes(self.offset(lba), len)
            .map_err(|e| {
                warn!(lba, len, error = %e, "backstore write zeroes failed");
                backstore_failure(&e, true, lba)
            })
    }

    /// Deallocates `blocks` blocks from `lba` (UNMAP, WRITE SAME with
    /// UNMAP) and their tuples with them.
    fn discard_blocks(&self, lba: u64, blocks: u64) -> Result<(), Failure> {
        let bs = u64::from(self.cfg.block_size);
        self.cfg
            .backstore
            .discard(lba * bs, blocks * bs)
            .map_err(|e| {
                warn!(lba, blocks, error = %e, "backstore discard failed");
                backstore_failure(&e, true, lba)
            })?;
        self.discard_pi(lba, blocks)
    }

    /// Whether writes must be durable before status: FUA, or WCE off
    /// (then every write is write-through).
    pub(crate) fn write_through(&self, fua: bool) -> bool {
        fua || !self.lock().mode.wce
    }

    /// Makes completed writes durable when the initiator asked (FUA) or
    /// when the write cache is off.
    pub(crate) fn persist(&self, lba: u64, fua: bool) -> Result<(), Failure> {
        if self.write_through(fua) {
            self.flush().map_err(|e| {
                warn!(lba, error = %e, "backstore flush failed");
                backstore_failure(&e, true, lba)
            })?;
        }
        Ok(())
    }

    /// Common READ/WRITE/VERIFY checks: protection field, readiness,
    /// transfer size, range. Returns the byte length of the user data and
    /// the checks of the tuples the command moves (None: it moves none).
    fn media_checks(&self, rw: &Rw) -> Result<(usize, Option<PiChecks>), Failure> {
        let checks = self.protect_field(rw.protect)?;
        let bytes = self.transfer_bytes(rw.length, rw.size)?;
        self.check_range(rw.lba, u64::from(rw.length))?;
        Ok((bytes, checks))
    }

    /// [`Self::media_checks`] for a command whose protection field this
    /// device server does not take even on a protected unit (ORPROTECT):
    /// any non-zero value is INVALID FIELD IN CDB.
    fn media_checks_without_pi(&self, rw: &Rw) -> Result<usize, Failure> {
        if rw.protect != 0 {
            return Err(invalid_cdb(1, Some(7)));
        }
        Ok(self.media_checks(rw)?.0)
    }

    /// READ of `rw` for an initiator that takes at most `capacity` bytes
    /// (its Expected Data Transfer Length). Only the blocks it takes are
    /// read: the rest of what the CDB asks would be cut before it is sent
    /// (RFC 7143 §11.4.5.2, residual overflow), and reading it would let a
    /// READ of one byte hold a buffer of the largest transfer outside the
    /// fabric's READ budget, which counts what the initiator takes. The
    /// transfer length stays the CDB's, for the residual.
    pub(crate) fn read(&self, rw: &Rw, capacity: u32) -> CmdResult {
        let (bytes, checks) = self.media_checks(rw)?;
        if rw.length == 0 {
            // Nothing to read, nothing to hold: the fabric's planning probe
            // (see read_plan) runs here on a thread that must not wait.
            return Ok(Done::media(Vec::new()));
        }
        // A READ with RDPROTECT carries each block's 8-byte tuple after it
        // (SBC-4 4.22.2): those bytes count in what the initiator takes and
        // in the transfer, as they did when the whole READ was read.
        let per_block = if checks.is_some() {
            self.protected_block_bytes()
        } else {
            bytes / rw.length as usize
        }
        .max(1);
        let blocks = blocks_taken(capacity, per_block, rw.length as usize);
        let transfer_length = super::outcome::clamp32(per_block as u64 * u64::from(rw.length));
        if blocks == 0 {
            return Ok(Done {
                transfer_length,
                ..Done::media(Vec::new())
            });
        }
        let _hold = self.hold_for_read(rw.lba, rw.lba + blocks as u64);
        let data = if let Some(checks) = checks {
            self.read_with_pi(rw.lba, blocks, checks)?
        } else {
            let buf = self.read_unchecked_to_vec(rw.lba, blocks * per_block)?;
            self.check_stored_pi(rw.lba, &buf)?;
            buf
        };
        Ok(Done {
            transfer_length,
            ..Done::media(data)
        })
    }

    /// The whole blocks of `data_out` a write may use. libiscsi's residual
    /// tests define the behaviour when the initiator sends less than the
    /// CDB asks: the blocks that did arrive are written and the status is
    /// GOOD (the fabric reports the shortfall as residual overflow); a
    /// trailing partial block is INVALID FIELD IN COMMAND INFORMATION UNIT.
    /// With protection information the blocks are `block_size` + 8 bytes.
    fn write_payload<'d>(
        &self,
        data_out: &'d [u8],
        bytes: usize,
        unit: usize,
    ) -> Result<&'d [u8], Failure> {
        if data_out.len() >= bytes {
            return Ok(data_out.get(..bytes).unwrap_or_default());
        }
        if !data_out.len().is_multiple_of(unit) {
            return Err(partial_block());
        }
        Ok(data_out)
    }

    pub(crate) fn write(&self, rw: &Rw, data_out: &[u8]) -> CmdResult {
        let (bytes, checks) = self.media_checks(rw)?;
        self.check_writable()?;
        if let Some(checks) = checks {
            let durable = self.write_through(rw.fua);
            return self.write_with_pi(rw, checks, data_out, durable);
        }
        let bs = self.cfg.block_size as usize;
        let data = self.write_payload(data_out, bytes, bs)?;
        if !data.is_empty() {
            let blocks = (data.len() / self.cfg.block_size as usize) as u64;
            let _g = self.hold_for_write(rw.lba, rw.lba + blocks);
            if self.write_through(rw.fua) {
                self.write_blocks_durable(rw.lba, data)?;
            } else {
                self.write_blocks(rw.lba, data)?;
            }
        }
        Ok(Done::out(bytes as u64))
    }

    pub(crate) fn write_and_verify(&self, rw: &Rw, _bytchk: u8, data_out: &[u8]) -> CmdResult {
        let (bytes, checks) = self.media_checks(rw)?;
        self.check_writable()?;
        if let Some(checks) = checks {
            return self.write_with_pi(rw, checks, data_out, true);
        }
        let data = self.write_payload(data_out, bytes, self.cfg.block_size as usize)?;
        if !data.is_empty() {
            let blocks = (data.len() / self.cfg.block_size as usize) as u64;
            let _g = self.hold_for_write(rw.lba, rw.lba + blocks);
            self.write_blocks(rw.lba, data)?;
        }
        // Verification means the data is on the medium, not in a cache.
        self.persist(rw.lba, true)?;
        Ok(Done::out(bytes as u64))
    }

    /// VERIFY: BYTCHK 0 checks the medium can be read, 1 compares the
    /// Data-Out with the medium, 3 compares one block against every block
    /// of the range. A difference is MISCOMPARE with the byte offset.
    ///
    /// With VRPROTECT on a protected unit, BYTCHK 0 checks the stored
    /// tuples as the field says; BYTCHK 1 and 3 take each block of the
    /// Data-Out with its tuple, check those tuples as the field says and
    /// compare the user data with the medium (whose own tuples are then
    /// checked in full).
    pub(crate) fn verify(&self, rw: &Rw, bytchk: u8, data_out: &[u8]) -> CmdResult {
        let (bytes, checks) = self.media_checks(rw)?;
        let bs = self.cfg.block_size as usize;
        let unit = if checks.is_some() {
            bs + TUPLE_BYTES
        } else {
            bs
        };
        let sent_blocks = match bytchk {
            0 => 0,
            1 => bytes / bs,
            _ => usize::from(bytes > 0),
        };
        let sent = sent_blocks * unit;
        // The Data-Out is taken and its tuples checked before the medium
        // is read: a short one fails without reading the range.
        let expect = if bytchk == 0 {
            None
        } else {
            let wire = data_out.get(..sent).ok_or_else(partial_block)?;
            Some(match checks {
                Some(checks) => {
                    let (data, tuples) = split_protected(wire, bs);
                    // A single block (BYTCHK 3) stands for every LBA of the
                    // range; its reference tag is that of the first.
                    self.check_tuples(data.chunks(bs), &tuples, rw.lba, checks)?;
                    std::borrow::Cow::Owned(data)
                }
                None => std::borrow::Cow::Borrowed(wire),
            })
        };
        let compare = |first_block: usize, medium: &[u8]| -> Option<u64> {
            let expect = expect.as_deref()?;
            if bytchk == 1 {
                let at = first_block * bs;
                let off = first_difference(&expect[at..at + medium.len()], medium)? + at as u64;
                // INFORMATION is an offset into the Data-Out Buffer (SBC-4
                // 5.31), which carries each block's tuple after it.
                Some(match checks {
                    Some(_) => off / bs as u64 * (bs as u64 + 8) + off % bs as u64,
                    None => off,
                })
            } else {
                medium.chunks(bs).enumerate().find_map(|(i, blk)| {
                    first_difference(expect, blk).map(|o| o + ((first_block + i) * bs) as u64)
                })
            }
        };
        if bytes > 0 {
            let _hold = self.hold_for_read(rw.lba, rw.lba + u64::from(rw.length));
            let blocks = bytes / bs;
            let piece_blocks = (VERIFY_PIECE / bs).max(1);
            let mut medium = vec![0u8; piece_blocks.min(blocks) * bs];
            let mut done = 0;
            while done < blocks {
                let n = piece_blocks.min(blocks - done);
                let piece = &mut medium[..n * bs];
                let lba = rw.lba + done as u64;
                match (checks, bytchk) {
                    (Some(checks), 0) => {
                        self.read_unchecked(lba, piece)?;
                        let tuples = self.load_pi(lba, n)?;
                        self.check_tuples(piece.chunks(bs), &tuples, lba, checks)?;
                    }
                    _ => self.read_blocks(lba, piece)?,
                }
                if let Some(off) = compare(done, piece) {
                    return Err(Failure::Check(Sense::miscompare(off)));
                }
                done += n;
            }
        }
        if bytchk == 0 {
            return Ok(Done::none());
        }
        Ok(Done::out(sent as u64))
    }

    /// ORWRITE(16): reads, ORs in the Data-Out and writes back, with the
    /// range held exclusively so no other write lands in between.
    pub(crate) fn orwrite(&self, rw: &Rw, data_out: &[u8]) -> CmdResult {
        let bytes = self.media_checks_without_pi(rw)?;
        self.check_writable()?;
        let data = self.write_payload(data_out, bytes, self.cfg.block_size as usize)?;
        if !data.is_empty() {
            let blocks = (data.len() / self.cfg.block_size as usize) as u64;
            let _g = self.ranges.exclusive(rw.lba, rw.lba + blocks);
            let mut cur = vec![0u8; data.len()];
            self.read_blocks(rw.lba, &mut cur)?;
            for (c, d) in cur.iter_mut().zip(data) {
                *c |= d;
            }
            self.write_blocks(rw.lba, &cur)?;
        }
        self.persist(rw.lba, rw.fua)?;
        Ok(Done::out(bytes as u64))
    }

    /// COMPARE AND WRITE: atomic against every other writer of the unit
    /// (its range is held exclusively; plain writes hold theirs shared).
    pub(crate) fn compare_and_write(
        &self,
        lba: u64,
        blocks: u8,
        wrprotect: u8,
        fua: bool,
        data_out: &[u8],
    ) -> CmdResult {
        if wrprotect != 0 {
            return Err(invalid_cdb(1, Some(7)));
        }
        let max = self.block_limits().max_compare_and_write_length;
        if blocks > max {
            return Err(invalid_cdb(13, None));
        }
        self.check_range(lba, u64::from(blocks))?;
        self.check_writable()?;
        let half = usize::from(blocks) * self.cfg.block_size as usize;
        // The Data-Out must be exactly the verify and the write instances:
        // anything else means the CDB and the transfer disagree (libiscsi's
        // CompareAndWrite tests send 256 blocks, which NUMBER OF LOGICAL
        // BLOCKS cannot express and wraps to 0, and expect this error).
        if data_out.len() != 2 * half {
            return Err(invalid_cdb(13, None));
        }
        if blocks == 0 {
            return Ok(Done::none());
        }
        let (expect, new) = data_out.split_at(half);
        {
            let _g = self.ranges.exclusive(lba, lba + u64::from(blocks));
            let mut cur = vec![0u8; half];
            self.read_blocks(lba, &mut cur)?;
            if let Some(off) = first_difference(expect, &cur) {
                return Err(Failure::Check(Sense::miscompare(off)));
            }
            self.write_blocks(lba, new)?;
        }
        self.persist(lba, fua)?;
        Ok(Done::out(2 * half as u64))
    }

    /// WRITE SAME(10/16): one block (or zeros with NDOB) repeated over the
    /// range; with UNMAP the range is deallocated instead, whatever the
    /// block holds (SBC-3 lets the device server unmap; it then reads as
    /// zeros, LBPRZ=1; LIO does the same and libiscsi's UnmapUntilEnd
    /// expects it). ANCHOR is refused (ANC_SUP=0).
    /// NUMBER OF LOGICAL BLOCKS 0 means "to the end of the medium" (WSNZ=0),
    /// within MAXIMUM WRITE SAME LENGTH. The Data-Out must be exactly one
    /// block (none with NDOB).
    pub(crate) fn write_same(&self, cdb: &blockwire_pdu::scsi::Cdb, data_out: &[u8]) -> CmdResult {
        let blockwire_pdu::scsi::Cdb::WriteSame {
            size,
            lba,
            blocks,
            wrprotect,
            anchor,
            unmap,
            ndob,
            ..
        } = *cdb
        else {
            return Err(invalid_cdb(0, None));
        };
        if wrprotect != 0 {
            return Err(invalid_cdb(1, Some(7)));
        }
        if anchor {
            return Err(invalid_cdb(1, Some(4)));
        }
        if unmap && !self.cfg.thin_provisioning {
            return Err(invalid_cdb(1, Some(3)));
        }
        let limits = self.block_limits();
        let cap = self.blocks();
        // WSNZ=0: zero blocks means from LBA to the end of the medium.
        let blocks: u64 = if blocks == 0 {
            if lba > cap {
                return Err(lba_out_of_range());
            }
            cap - lba
        } else {
            u64::from(blocks)
        };
        if blocks > limits.max_write_same_length {
            return Err(invalid_cdb(length_byte(size), None));
        }
        self.check_range(lba, blocks)?;
        self.check_writable()?;
        let bs = self.cfg.block_size as usize;
        let expected = if ndob { 0 } else { bs };
        if data_out.len() != expected {
            return Err(illegal(Asc::INVALID_FIELD_IN_CDB));
        }
        if blocks == 0 {
            return Ok(Done::out(expected as u64));
        }
        let zero_block = vec![0u8; bs];
        let block: &[u8] = if ndob { &zero_block } else { data_out };
        let end = lba + blocks;
        let _g = self.hold_for_write(lba, end);
        if unmap {
            self.discard_blocks(lba, blocks)?;
        } else {
            // Write in runs of up to 1 MiB of repeated blocks.
            let per_run = ((1usize << 20) / bs).max(1);
            let run: Vec<u8> = block.repeat(per_run.min(blocks as usize));
            let all_zero = block.iter().all(|&b| b == 0);
            let mut at = lba;
            while at < end {
                let n = (end - at).min((run.len() / bs) as u64) as usize;
                let piece = run.get(..n * bs).unwrap_or_default();
                if ndob {
                    self.zero_blocks_without_data_out(at, piece.len() as u64)?;
                } else if all_zero {
                    self.zero_blocks(at, piece.len() as u64)?;
                } else {
                    self.write_blocks(at, piece)?;
                }
                at += n as u64;
            }
        }
        self.persist(lba, false)?;
        Ok(Done::out(if ndob { 0 } else { bs as u64 }))
    }

    /// UNMAP: every descriptor is validated before any range is
    /// deallocated, so a bad list changes nothing.
    pub(crate) fn unmap(
        &self,
        anchor: bool,
        parameter_list_length: u16,
        data_out: &[u8],
    ) -> CmdResult {
        if !self.cfg.thin_provisioning {
            return Err(illegal(Asc::INVALID_COMMAND_OPERATION_CODE));
        }
        if anchor {
            return Err(invalid_cdb(1, Some(0)));
        }
        self.check_writable()?;
        let len = usize::from(parameter_list_length);
        if len == 0 {
            return Ok(Done::none());
        }
        if len < 8 {
            return Err(param_length());
        }
        let buf = data_out.get(..len).ok_or_else(param_length)?;
        let list = UnmapList::decode(buf).map_err(|e| Failure::Check(e.to_sense()))?;
        if list.descriptors.len() > MAX_UNMAP_DESCRIPTORS as usize {
            return Err(invalid_param(2, None));
        }
        let max_blocks = u64::from(self.block_limits().max_unmap_lba_count);
        let mut total = 0u64;
        for (i, d) in list.descriptors.iter().enumerate() {
            self.check_range(d.lba, u64::from(d.blocks))?;
            total += u64::from(d.blocks);
            if total > max_blocks {
                return Err(invalid_param((8 + i * 16 + 8) as u16, None));
            }
        }
        let mut first = None;
        for d in list.descriptors.iter().filter(|d| d.blocks > 0) {
            let _g = self.hold_for_write(d.lba, d.lba + u64::from(d.blocks));
            self.discard_blocks(d.lba, u64::from(d.blocks))?;
            first.get_or_insert(d.lba);
        }
        // Write-through (WCE=0): the deallocation is durable when GOOD is
        // sent, as a WRITE's data is; the initiator sends no flush.
        if let Some(lba) = first {
            self.persist(lba, false)?;
        }
        Ok(Done::out(len as u64))
    }

    /// GET LBA STATUS: from the backstore's allocation map when it keeps
    /// one (file holes); otherwise mapping is derived from content: with
    /// LBPRZ=1 a deallocated block reads as zeros, and an all-zero block
    /// is reported deallocated. The content scan reads at most
    /// [`LBA_STATUS_SCAN_BYTES`] per command; the initiator asks again
    /// from the last reported LBA.
    pub(crate) fn get_lba_status(&self, lba: u64, allocation_length: u32) -> CmdResult {
        let cap = self.blocks();
        if lba >= cap {
            return Err(lba_out_of_range());
        }
        let bs = self.cfg.block_size as usize;
        let scan_blocks = (LBA_STATUS_SCAN_BYTES / bs as u64).min(cap - lba);
        // (start, count, deallocated)
        let mut runs: Vec<(u64, u32, bool)> = Vec::new();
        let max_desc = (allocation_length.saturating_sub(8) / 16).clamp(1, 1024) as usize;
        // A backstore that keeps an allocation map (files: SEEK_DATA /
        // SEEK_HOLE; RAM: written sectors) is asked about windows that
        // double from 1 MiB until the descriptors the initiator has room for
        // are found or the medium ends: an initiator asking about one block
        // (QEMU asks for one descriptor before each read of 32 KiB or more)
        // costs a look at that block's neighbourhood, not a walk over the
        // whole rest of the medium.
        let mut from_map = false;
        if self.cfg.thin_provisioning {
            let end = lba + (cap - lba).min(u64::from(u32::MAX));
            let mut at = lba;
            let mut window = ((1u64 << 20) / bs as u64).max(1);
            'windows: while at < end {
                let n = window.min(end - at);
                let Some(extents) = self
                    .cfg
                    .backstore
                    .allocation(self.offset(at), n * bs as u64)
                    .map_err(|e| {
                        warn!(lba, error = %e, "backstore allocation map failed");
                        backstore_failure(&e, false, lba)
                    })?
                else {
                    break;
                };
                from_map = true;
                for x in extents {
                    // A block partly backed by data is mapped: mapped extents
                    // round outward, holes inward.
                    let (first, end) = if x.mapped {
                        (x.offset / bs as u64, (x.offset + x.len).div_ceil(bs as u64))
                    } else {
                        (x.offset.div_ceil(bs as u64), (x.offset + x.len) / bs as u64)
                    };
                    let first = match runs.last() {
                        Some(&(s, c, _)) => first.max(s + u64::from(c)),
                        None => first,
                    };
                    if end <= first {
                        continue;
                    }
                    let dealloc = !x.mapped;
                    let n = end - first;
                    match runs.last_mut() {
                        Some((_, cnt, d))
                            if *d == dealloc && u64::from(*cnt) + n <= u64::from(u32::MAX) =>
                        {
                            *cnt += n as u32;
                        }
                        _ => {
                            if runs.len() == max_desc {
                                break 'windows;
                            }
                            runs.push((first, u32::try_from(n).unwrap_or(u32::MAX), dealloc));
                        }
                    }
                }
                at += n;
                window = window.saturating_mul(2);
            }
        }
        if !from_map && self.cfg.thin_provisioning {
            let chunk_blocks = ((256usize << 10) / bs) as u64;
            let mut buf = vec![0u8; chunk_blocks as usize * bs];
            let mut at = lba;
            'scan: while at < lba + scan_blocks {
                let n = (lba + scan_blocks - at).min(chunk_blocks) as usize;
                let part = buf.get_mut(..n * bs).unwrap_or_default();
                {
                    let _hold = self.hold_for_read(at, at + n as u64);
                    self.read_blocks(at, part)?;
                }
                for (i, blk) in part.chunks(bs).enumerate() {
                    let dealloc = blk.iter().all(|&b| b == 0);
                    let this = at + i as u64;
                    match runs.last_mut() {
                        Some((_, cnt, d)) if *d == dealloc && *cnt < u32::MAX => *cnt += 1,
                        _ => {
                            if runs.len() == max_desc {
                                break 'scan;
                            }
                            runs.push((this, 1, dealloc));
                        }
                    }
                }
                at += n as u64;
            }
        } else if !from_map {
            let n = u32::try_from(cap - lba).unwrap_or(u32::MAX);
            runs.push((lba, n, false));
        }
        let mut data = Vec::with_capacity(8 + runs.len() * 16);
        data.extend_from_slice(&((4 + runs.len() * 16) as u32).to_be_bytes());
        data.extend_from_slice(&[0; 4]);
        for (start, count, dealloc) in runs {
            data.extend_from_slice(&start.to_be_bytes());
            data.extend_from_slice(&count.to_be_bytes());
            data.extend_from_slice(&[u8::from(dealloc), 0, 0, 0]);
        }
        Ok(Done::data(data, allocation_length))
    }

    /// PRE-FETCH: nothing is cached on behalf of the initiator, so after
    /// the range check the answer is GOOD (SBC-3: GOOD when the blocks
    /// were not put in a cache).
    pub(crate) fn prefetch(&self, lba: u64, blocks: u32) -> CmdResult {
        self.check_range(lba, u64::from(blocks))?;
        Ok(Done::none())
    }

    /// SYNCHRONIZE CACHE: flushes the whole backstore (a range flush is
    /// not available from the backstore, and flushing more is allowed).
    pub(crate) fn synchronize_cache(&self, lba: u64, blocks: u32) -> CmdResult {
        self.check_range(lba, u64::from(blocks))?;
        self.flush().map_err(|e| {
            warn!(lba, error = %e, "backstore flush failed");
            backstore_failure(&e, true, lba)
        })?;
        Ok(Done::none())
    }

    pub(crate) fn read_capacity10(&self, lba: u32, pmi: bool) -> CmdResult {
        if !pmi && lba != 0 {
            return Err(invalid_cdb(2, None));
        }
        let d = ReadCapacity10::for_capacity(self.blocks(), self.cfg.block_size);
        Ok(Done::data(d.encode().to_vec(), 8))
    }

    pub(crate) fn read_capacity16(&self, lba: u64, allocation_length: u32, pmi: bool) -> CmdResult {
        if !pmi && lba != 0 {
            return Err(invalid_cdb(2, None));
        }
        Ok(Done::data(
            self.capacity16().encode().to_vec(),
            allocation_length,
        ))
    }

    /// READ CAPACITY (16) parameter data (also the device type specific
    /// data of a ROD token).
    pub(crate) fn capacity16(&self) -> ReadCapacity16 {
        let mut d = ReadCapacity16::for_capacity(self.blocks(), self.cfg.block_size);
        d.lbpme = self.cfg.thin_provisioning;
        d.lbprz = self.cfg.thin_provisioning;
        // Configurable (LuConfig::physical_block_exponent); 0 by default.
        d.lbppbe = self.cfg.physical_block_exponent;
        // Type 1 protection (P_TYPE 000b), one tuple per logical block.
        d.prot_en = self.protected();
        d
    }

    /// WRITE and WRITE AND VERIFY with WRPROTECT 001b-101b: each block of
    /// the Data-Out is followed by its tuple; every tuple is checked as
    /// `checks` says before a byte is written, then blocks and tuples are
    /// stored as sent. Fewer whole blocks than the CDB asks for are written
    /// as with a plain WRITE.
    fn write_with_pi(
        &self,
        rw: &Rw,
        checks: PiChecks,
        data_out: &[u8],
        durable: bool,
    ) -> CmdResult {
        let unit = self.protected_block_bytes();
        let bytes = rw.length as usize * unit;
        let wire = self.write_payload(data_out, bytes, unit)?;
        if !wire.is_empty() {
            let bs = self.cfg.block_size as usize;
            let (data, tuples) = split_protected(wire, bs);
            self.check_tuples(data.chunks(bs), &tuples, rw.lba, checks)?;
            let blocks = tuples.len() as u64;
            let _g = self.hold_for_write(rw.lba, rw.lba + blocks);
            self.write_unprotected(rw.lba, &data, durable)?;
            self.store_pi(rw.lba, &tuples, durable)?;
        }
        Ok(Done::out(bytes as u64))
    }
}

/// How many of a READ's `blocks` an initiator that takes `capacity` bytes
/// (its Expected Data Transfer Length) receives in part or whole, each block
/// moving `per_block` bytes: only those need be read, the rest being cut
/// before it is sent (RFC 7143 §11.4.5.2, residual overflow).
pub(crate) fn blocks_taken(capacity: u32, per_block: usize, blocks: usize) -> usize {
    (capacity as usize).div_ceil(per_block.max(1)).min(blocks)
}

/// Offset of the first byte where `a` and `b` differ.
fn first_difference(a: &[u8], b: &[u8]) -> Option<u64> {
    a.iter().zip(b).position(|(x, y)| x != y).map(|p| p as u64)
}
