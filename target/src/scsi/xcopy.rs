//! EXTENDED COPY (LID1) between logical units of the same target, and
//! RECEIVE COPY RESULTS (SPC-4 6.4, 6.18).
//!
//! Supported: identification CSCD descriptors (E4h) naming a unit by the
//! NAA designator of its VPD 83h page, and block-to-block segment
//! descriptors (02h). Copies run to completion inside the command (no
//! background operations), so RECEIVE COPY STATUS always reports them
//! finished; the data moves in 1 MiB pieces, never the whole segment at
//! once.

use std::collections::VecDeque;
use std::sync::Arc;

use blockwire_pdu::scsi::{Asc, Cdb, CdbSize, Designator, DesignatorId, Rw, Sense, SenseKey};
use tracing::{info, warn};

use super::identity::naa_parts;
use super::logical_unit::LogicalUnit;
use super::outcome::{illegal, invalid_cdb, invalid_param, param_length, CmdResult, Done, Failure};
use super::param_bytes::{be16, be32, be64};
use super::{ItNexus, LunTable};

/// Limits advertised in RECEIVE COPY OPERATING PARAMETERS.
pub(crate) const MAX_CSCD_DESCRIPTORS: usize = 16;
pub(crate) const MAX_SEGMENT_DESCRIPTORS: usize = 64;
pub(crate) const MAX_LIST_LENGTH: usize =
    16 + MAX_CSCD_DESCRIPTORS * 32 + MAX_SEGMENT_DESCRIPTORS * 28;
/// Largest segment, in bytes (the 16-bit block count at 4 KiB blocks).
pub(crate) const MAX_SEGMENT_BYTES: u32 = 256 << 20;
/// Bytes moved per read/write step.
const CHUNK: usize = 1 << 20;
/// Finished operations remembered per unit for RECEIVE COPY RESULTS.
const MAX_RESULTS: usize = 64;

/// Outcome of one finished copy.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CopyStatus {
    ok: bool,
    segments: u16,
    bytes: u64,
}

/// Results of finished copy operations, by nexus and LIST IDENTIFIER (one
/// byte for EXTENDED COPY (LID1), four for the token commands): the last
/// [`MAX_RESULTS`] per unit, a list identifier used again replacing its
/// result.
#[derive(Debug)]
pub(crate) struct ListResults<Id, R> {
    done: VecDeque<(ItNexus, Id, R)>,
}

impl<Id, R> Default for ListResults<Id, R> {
    fn default() -> Self {
        ListResults {
            done: VecDeque::new(),
        }
    }
}

impl<Id: PartialEq + Copy, R> ListResults<Id, R> {
    pub(crate) fn record(&mut self, nexus: &ItNexus, id: Id, r: R) {
        self.done.retain(|(n, i, _)| !(n == nexus && *i == id));
        if self.done.len() == MAX_RESULTS {
            self.done.pop_front();
        }
        self.done.push_back((nexus.clone(), id, r));
    }

    pub(crate) fn get(&self, nexus: &ItNexus, id: Id) -> Option<&R> {
        self.done
            .iter()
            .find(|(n, i, _)| n == nexus && *i == id)
            .map(|(_, _, r)| r)
    }
}

/// EXTENDED COPY (LID1) results.
pub(crate) type CopyResults = ListResults<u8, CopyStatus>;

/// UNREACHABLE COPY TARGET (08h/04h).
const UNREACHABLE_COPY_TARGET: Asc = Asc::new(0x08, 0x04);

/// COPY ABORTED with the given ASC.
fn copy_aborted(code: Asc) -> Failure {
    Failure::Check(Sense::new(SenseKey::CopyAborted, code))
}

/// `f` as COPY ABORTED: its additional sense code and INFORMATION kept,
/// so the initiator learns which check failed at which LBA.
fn copy_aborted_keeping_code(f: Failure) -> Failure {
    match f {
        Failure::Check(mut s) => {
            s.key = SenseKey::CopyAborted;
            Failure::Check(s)
        }
        other => other,
    }
}

impl LogicalUnit {
    /// The NAA designator this unit reports in VPD 83h.
    pub(crate) fn naa_designator(&self) -> DesignatorId {
        self.naa_designator_full().id
    }

    /// The NAA designation descriptor itself.
    pub(crate) fn naa_designator_full(&self) -> Designator {
        let (vs, ext) = naa_parts(self.cfg.naa_id);
        Designator::naa_registered_extended(self.cfg.company_id, vs, ext)
    }

    pub(crate) fn extended_copy(
        &self,
        nexus: &ItNexus,
        table: &LunTable,
        service_action: u8,
        parameter_list_length: u32,
        data_out: &[u8],
    ) -> CmdResult {
        if service_action != 0 {
            // LID4 is not implemented.
            return Err(invalid_cdb(1, Some(4)));
        }
        let len = parameter_list_length as usize;
        if len == 0 {
            return Ok(Done::none());
        }
        if len > MAX_LIST_LENGTH {
            return Err(param_length());
        }
        let p = data_out.get(..len).ok_or_else(param_length)?;
        if p.len() < 16 {
            return Err(param_length());
        }
        let list_id = p[0];
        let list_id_usage = (p[1] >> 3) & 3;
        let cscd_len = be16(p, 2);
        let seg_len = be32(p, 8) as usize;
        let inline_len = be32(p, 12);
        if inline_len != 0 {
            return Err(illegal(Asc::INLINE_DATA_LENGTH_EXCEEDED));
        }
        if 16 + cscd_len + seg_len != len {
            return Err(param_length());
        }
        if !cscd_len.is_multiple_of(32) {
            return Err(invalid_param(2, None));
        }
        if cscd_len / 32 > MAX_CSCD_DESCRIPTORS {
            return Err(illegal(Asc::TOO_MANY_TARGET_DESCRIPTORS));
        }
        // Resolve every CSCD descriptor to a unit of this target.
        let mut units: Vec<Arc<LogicalUnit>> = Vec::new();
        for (i, d) in p[16..16 + cscd_len].chunks(32).enumerate() {
            let off = 16 + i * 32;
            if d[0] != 0xe4 {
                return Err(illegal(Asc::UNSUPPORTED_TARGET_DESCRIPTOR_TYPE_CODE));
            }
            // LU ID TYPE: 00b names the unit by the designator that follows;
            // 01b (a proxy token) is not supported. The reserved codes 10b
            // and 11b are ignored (the designator still names the unit):
            // libiscsi 1.19's ExtendedCopy.ValidTgtDescr sends 10b and
            // expects the copy to succeed, as it does on LIO.
            if d[1] >> 6 == 1 {
                return Err(invalid_param((off + 1) as u16, Some(7)));
            }
            // Not NUL, a direct-access device.
            if d[1] & 0x20 != 0 || d[1] & 0x1f != 0 {
                return Err(invalid_param((off + 1) as u16, None));
            }
            let Ok((des, _)) = Designator::decode(&d[4..24]) else {
                return Err(invalid_param((off + 4) as u16, None));
            };
            let Some(lu) = table
                .units()
                .into_iter()
                .map(|(_, u)| u)
                .find(|u| u.naa_designator() == des.id)
            else {
                return Err(copy_aborted(Asc::COPY_TARGET_DEVICE_NOT_REACHABLE));
            };
            let dbl = be32(d, 28) & 0x00ff_ffff;
            if dbl != 0 && dbl != lu.cfg.block_size {
                return Err(invalid_param((off + 29) as u16, None));
            }
            units.push(lu.clone());
        }
        // Parse and validate every segment before moving a byte.
        let mut segs = Vec::new();
        let mut off = 16 + cscd_len;
        while off < len {
            let d = &p[off..];
            if d.len() < 4 {
                return Err(param_length());
            }
            if d[0] != 0x02 {
                return Err(illegal(Asc::UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE_CODE));
            }
            let dlen = be16(d, 2);
            if dlen != 0x18 || d.len() < 28 {
                return Err(invalid_param((off + 2) as u16, None));
            }
            let (si, di) = (be16(d, 4), be16(d, 6));
            let (Some(src), Some(dst)) = (units.get(si), units.get(di)) else {
                // An index past the CSCD descriptor list names a copy
                // target that cannot be reached.
                return Err(copy_aborted(UNREACHABLE_COPY_TARGET));
            };
            let blocks = be16(d, 10) as u64;
            let (slba, dlba) = (be64(d, 12), be64(d, 20));
            if src.cfg.block_size != dst.cfg.block_size {
                return Err(copy_aborted(Asc::COPY_SEGMENT_GRANULARITY_VIOLATION));
            }
            if blocks * u64::from(src.cfg.block_size) > u64::from(MAX_SEGMENT_BYTES) {
                return Err(invalid_param((off + 10) as u16, None));
            }
            segs.push((src.clone(), dst.clone(), slba, dlba, blocks));
            off += 4 + dlen;
            if segs.len() > MAX_SEGMENT_DESCRIPTORS {
                return Err(illegal(Asc::TOO_MANY_SEGMENT_DESCRIPTORS));
            }
        }
        let mut status = CopyStatus {
            ok: true,
            segments: 0,
            bytes: 0,
        };
        let result = segs.iter().try_for_each(|(src, dst, slba, dlba, blocks)| {
            copy_segment(nexus, src, dst, *slba, *dlba, *blocks)?;
            status.segments += 1;
            status.bytes += blocks * u64::from(src.cfg.block_size);
            Ok(())
        });
        status.ok = result.is_ok();
        if list_id_usage != 3 {
            self.lock().copies.record(nexus, list_id, status);
        }
        info!(initiator = %nexus.initiator_port, list_id, segments = status.segments, bytes = status.bytes, ok = status.ok, "extended copy");
        result.map(|()| Done::out(len as u64))
    }

    pub(crate) fn receive_copy_results(
        &self,
        nexus: &ItNexus,
        service_action: u8,
        list_identifier: u32,
        allocation_length: u32,
    ) -> CmdResult {
        let mut d = Vec::new();
        match service_action {
            // RECEIVE COPY STATUS (LID1).
            0x00 => {
                let Some(st) = self
                    .lock()
                    .copies
                    .get(nexus, list_identifier as u8)
                    .copied()
                else {
                    return Err(invalid_cdb(2, None));
                };
                d.extend_from_slice(&8u32.to_be_bytes());
                d.push(if st.ok { 0x01 } else { 0x02 });
                d.extend_from_slice(&st.segments.to_be_bytes());
                // TRANSFER COUNT UNITS 0 = bytes; saturate the 32-bit count.
                d.push(0);
                d.extend_from_slice(&u32::try_from(st.bytes).unwrap_or(u32::MAX).to_be_bytes());
            }
            // RECEIVE COPY OPERATING PARAMETERS.
            0x03 => {
                d.extend_from_slice(&[0; 4]);
                d.extend_from_slice(&[0x01, 0, 0, 0]); // SNLID: no list id needed
                d.extend_from_slice(&(MAX_CSCD_DESCRIPTORS as u16).to_be_bytes());
                d.extend_from_slice(&(MAX_SEGMENT_DESCRIPTORS as u16).to_be_bytes());
                d.extend_from_slice(&(MAX_LIST_LENGTH as u32).to_be_bytes());
                d.extend_from_slice(&MAX_SEGMENT_BYTES.to_be_bytes());
                d.extend_from_slice(&0u32.to_be_bytes()); // inline data
                d.extend_from_slice(&0u32.to_be_bytes()); // held data
                d.extend_from_slice(&0u32.to_be_bytes()); // stream transfer
                d.extend_from_slice(&[0, 0]);
                d.extend_from_slice(&1u16.to_be_bytes()); // total concurrent copies
                d.push(1); // maximum concurrent copies
                           // DATA SEGMENT GRANULARITY: a block of this unit, as the
                           // third-party copy VPD page's General Copy Operations say.
                d.push(self.cfg.block_size.trailing_zeros() as u8);
                d.push(0);
                d.push(0);
                d.extend_from_slice(&[0, 0, 0]);
                d.push(2);
                d.extend_from_slice(&[0x02, 0xe4]);
                let avail = (d.len() - 4) as u32;
                d[..4].copy_from_slice(&avail.to_be_bytes());
            }
            _ => return Err(invalid_cdb(1, Some(4))),
        }
        Ok(Done::data(d, allocation_length))
    }
}

/// Copies one segment: checks reservations, write protection and ranges of
/// both units as if the nexus had sent the READ and WRITE itself.
pub(crate) fn copy_segment(
    nexus: &ItNexus,
    src: &LogicalUnit,
    dst: &LogicalUnit,
    slba: u64,
    dlba: u64,
    blocks: u64,
) -> Result<(), Failure> {
    src.reservation_check(nexus, &read_cdb(slba))?;
    dst.reservation_check(nexus, &write_cdb(dlba))?;
    // A copy target not ready (sanitize, medium out), or a range or
    // protection problem of one, aborts the copy
    // (SPC-4 6.4.5): COPY ABORTED; the copy target's own reason (LBA OUT OF
    // RANGE, WRITE PROTECTED) goes in the COMMAND-SPECIFIC INFORMATION
    // field as ASC/ASCQ, the outer code is NO ADDITIONAL SENSE INFORMATION.
    let abort_with = |f: Failure| match f {
        Failure::Check(s) => {
            let code = s.code();
            let mut out = Sense::new(SenseKey::CopyAborted, Asc::NO_ADDITIONAL_SENSE);
            out.command_specific = Some((u64::from(code.asc) << 8) | u64::from(code.ascq));
            Failure::Check(out)
        }
        other => other,
    };
    src.ready_for_copy().map_err(abort_with)?;
    dst.ready_for_copy().map_err(abort_with)?;
    src.check_range(slba, blocks).map_err(abort_with)?;
    dst.check_range(dlba, blocks).map_err(abort_with)?;
    dst.check_writable().map_err(abort_with)?;
    // While the copy writes the destination it is one of the nexus's
    // commands there, as a WRITE it sent there would be: a PREEMPT AND
    // ABORT or LOGICAL UNIT RESET of that unit waits for the piece being
    // written (the copy may have been sent to another unit, where alone it
    // was counted).
    let _writing = dst.in_flight.enter(nexus);
    let bs = u64::from(src.cfg.block_size);
    let per = (CHUNK as u64 / bs).max(1);
    let mut buf = vec![0u8; (per.min(blocks.max(1)) * bs) as usize];
    // The destination reads as a copy of the source as it was (SPC-4
    // 6.4.6.3). Onto a later, overlapping range of the same unit, pieces
    // copied first to last would overwrite source blocks not yet read:
    // there they go last to first.
    let onto_its_own_tail =
        std::ptr::eq(src, dst) && slba < dlba && dlba < slba.saturating_add(blocks);
    let pieces = blocks.div_ceil(per);
    for i in 0..pieces {
        let piece = if onto_its_own_tail { pieces - 1 - i } else { i };
        let done = piece * per;
        let n = (blocks - done).min(per);
        let part = buf.get_mut(..(n * bs) as usize).unwrap_or_default();
        let read_hold = src.hold_for_read(slba + done, slba + done + n);
        src.cfg
            .backstore
            .read_at((slba + done) * bs, part)
            .map_err(|e| {
                warn!(lba = slba + done, error = %e, "extended copy read failed");
                copy_aborted(Asc::UNRECOVERED_READ_ERROR)
            })?;
        // A protected source's blocks are checked before they are copied;
        // a protected destination gets tuples generated for them. A block
        // that fails its check aborts the copy with the check's own code
        // and LBA (SPC-4 6.4.5: errors while processing a segment end the
        // command as COPY ABORTED).
        src.check_stored_pi(slba + done, part)
            .map_err(copy_aborted_keeping_code)?;
        // Released before the destination is held: the two ranges may
        // overlap on one unit.
        drop(read_hold);
        // A nexus preempted meanwhile writes no further piece: after a
        // PREEMPT AND ABORT ends, nothing of the preempted nexus may change
        // the medium (SPC-4, preempting).
        dst.reservation_check(nexus, &write_cdb(dlba + done))?;
        let _g = dst.hold_for_write(dlba + done, dlba + done + n);
        dst.cfg
            .backstore
            .write_at((dlba + done) * bs, part)
            .map_err(|e| {
                warn!(lba = dlba + done, error = %e, "extended copy write failed");
                copy_aborted(Asc::WRITE_ERROR)
            })?;
        dst.generate_pi(dlba + done, part, false)
            .map_err(copy_aborted_keeping_code)?;
    }
    dst.persist(dlba, false)?;
    Ok(())
}

/// A READ of one block at `lba`: what a copy's source range is checked
/// against reservations as.
pub(crate) fn read_cdb(lba: u64) -> Cdb {
    Cdb::Read {
        rw: one_block(lba),
        rarc: false,
    }
}

/// A WRITE of one block at `lba`, for a copy's destination range.
pub(crate) fn write_cdb(lba: u64) -> Cdb {
    Cdb::Write(one_block(lba))
}

fn one_block(lba: u64) -> Rw {
    Rw {
        size: CdbSize::Sixteen,
        lba,
        length: 1,
        protect: 0,
        dpo: false,
        fua: false,
        group: 0,
    }
}
