//! Typed command descriptor blocks (SPC-4, SBC-3) with a decoder that reports
//! exactly which byte and bit is invalid, so the target can build ILLEGAL
//! REQUEST sense with a field pointer without re-parsing the CDB.
//!
//! Reserved bits are ignored on decode (SPC-4 allows either checking or
//! ignoring them) and written as zero on encode. The control byte's NACA
//! and LINK bits are rejected: blockwire supports neither ACA nor linked
//! commands, and SAM-5 requires ILLEGAL REQUEST for them in that case.

use super::asc::Asc;
use super::opcode::{self as op, cdb_length};
use super::sense::{FieldPointer, Sense};
use super::wire::{be16, be32, be64, bit, flag};

/// Which of the length variants of a command a CDB is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CdbSize {
    /// 6-byte CDB (group 0).
    Six,
    /// 10-byte CDB (groups 1, 2).
    Ten,
    /// 12-byte CDB (group 5).
    Twelve,
    /// 16-byte CDB (group 4).
    Sixteen,
}

impl CdbSize {
    /// CDB length in bytes.
    pub fn length(self) -> usize {
        match self {
            Self::Six => 6,
            Self::Ten => 10,
            Self::Twelve => 12,
            Self::Sixteen => 16,
        }
    }
}

/// Direction of the data phase, from the initiator's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataDirection {
    /// No data is transferred.
    None,
    /// Device to initiator (Data-In, iSCSI R bit).
    In,
    /// Initiator to device (Data-Out, iSCSI W bit).
    Out,
}

/// How much data the CDB asks to move, before multiplying by a block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransferLength {
    /// A number of logical blocks (media access commands).
    Blocks(u32),
    /// A number of bytes (allocation or parameter list lengths).
    Bytes(u32),
}

impl TransferLength {
    /// The length in bytes for a logical block size of `block_size`.
    pub fn bytes(self, block_size: u32) -> u64 {
        match self {
            Self::Blocks(n) => u64::from(n) * u64::from(block_size),
            Self::Bytes(n) => u64::from(n),
        }
    }
}

/// MODE SENSE page control (PC) field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PageControl {
    /// 00b current values.
    Current,
    /// 01b changeable values (a mask).
    Changeable,
    /// 10b default values.
    Default,
    /// 11b saved values.
    Saved,
}

impl PageControl {
    fn from_bits(v: u8) -> Self {
        match v & 3 {
            0 => Self::Current,
            1 => Self::Changeable,
            2 => Self::Default,
            _ => Self::Saved,
        }
    }

    /// Two-bit wire value.
    pub fn code(self) -> u8 {
        match self {
            Self::Current => 0,
            Self::Changeable => 1,
            Self::Default => 2,
            Self::Saved => 3,
        }
    }
}

/// PERSISTENT RESERVE IN service actions (SPC-4 6.13.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrInAction {
    /// READ KEYS.
    ReadKeys,
    /// READ RESERVATION.
    ReadReservation,
    /// REPORT CAPABILITIES.
    ReportCapabilities,
    /// READ FULL STATUS.
    ReadFullStatus,
}

impl PrInAction {
    /// The service action code.
    pub fn code(self) -> u8 {
        match self {
            Self::ReadKeys => op::pr_in::READ_KEYS,
            Self::ReadReservation => op::pr_in::READ_RESERVATION,
            Self::ReportCapabilities => op::pr_in::REPORT_CAPABILITIES,
            Self::ReadFullStatus => op::pr_in::READ_FULL_STATUS,
        }
    }

    /// The action for a code, if defined.
    pub fn from_code(v: u8) -> Option<Self> {
        Some(match v {
            op::pr_in::READ_KEYS => Self::ReadKeys,
            op::pr_in::READ_RESERVATION => Self::ReadReservation,
            op::pr_in::REPORT_CAPABILITIES => Self::ReportCapabilities,
            op::pr_in::READ_FULL_STATUS => Self::ReadFullStatus,
            _ => return None,
        })
    }
}

/// PERSISTENT RESERVE OUT service actions (SPC-4 6.14.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrOutAction {
    /// REGISTER.
    Register,
    /// RESERVE.
    Reserve,
    /// RELEASE.
    Release,
    /// CLEAR.
    Clear,
    /// PREEMPT.
    Preempt,
    /// PREEMPT AND ABORT.
    PreemptAndAbort,
    /// REGISTER AND IGNORE EXISTING KEY.
    RegisterAndIgnoreExistingKey,
    /// REGISTER AND MOVE.
    RegisterAndMove,
    /// REPLACE LOST RESERVATION.
    ReplaceLostReservation,
}

impl PrOutAction {
    /// The service action code.
    pub fn code(self) -> u8 {
        use op::pr_out::*;
        match self {
            Self::Register => REGISTER,
            Self::Reserve => RESERVE,
            Self::Release => RELEASE,
            Self::Clear => CLEAR,
            Self::Preempt => PREEMPT,
            Self::PreemptAndAbort => PREEMPT_AND_ABORT,
            Self::RegisterAndIgnoreExistingKey => REGISTER_AND_IGNORE_EXISTING_KEY,
            Self::RegisterAndMove => REGISTER_AND_MOVE,
            Self::ReplaceLostReservation => REPLACE_LOST_RESERVATION,
        }
    }

    /// The action for a code, if defined.
    pub fn from_code(v: u8) -> Option<Self> {
        use op::pr_out::*;
        Some(match v {
            REGISTER => Self::Register,
            RESERVE => Self::Reserve,
            RELEASE => Self::Release,
            CLEAR => Self::Clear,
            PREEMPT => Self::Preempt,
            PREEMPT_AND_ABORT => Self::PreemptAndAbort,
            REGISTER_AND_IGNORE_EXISTING_KEY => Self::RegisterAndIgnoreExistingKey,
            REGISTER_AND_MOVE => Self::RegisterAndMove,
            REPLACE_LOST_RESERVATION => Self::ReplaceLostReservation,
            _ => return None,
        })
    }
}

/// Persistent reservation TYPE (SPC-4 table 176). The CDB keeps the raw
/// nibble because its validity depends on the service action (REGISTER
/// ignores it); convert with [`PrType::from_code`] where it matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrType {
    /// 1h Write Exclusive.
    WriteExclusive,
    /// 3h Exclusive Access.
    ExclusiveAccess,
    /// 5h Write Exclusive - Registrants Only.
    WriteExclusiveRegistrantsOnly,
    /// 6h Exclusive Access - Registrants Only.
    ExclusiveAccessRegistrantsOnly,
    /// 7h Write Exclusive - All Registrants.
    WriteExclusiveAllRegistrants,
    /// 8h Exclusive Access - All Registrants.
    ExclusiveAccessAllRegistrants,
}

impl PrType {
    /// The four-bit TYPE code.
    pub fn code(self) -> u8 {
        match self {
            Self::WriteExclusive => 1,
            Self::ExclusiveAccess => 3,
            Self::WriteExclusiveRegistrantsOnly => 5,
            Self::ExclusiveAccessRegistrantsOnly => 6,
            Self::WriteExclusiveAllRegistrants => 7,
            Self::ExclusiveAccessAllRegistrants => 8,
        }
    }

    /// The type for a code, if defined.
    pub fn from_code(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::WriteExclusive,
            3 => Self::ExclusiveAccess,
            5 => Self::WriteExclusiveRegistrantsOnly,
            6 => Self::ExclusiveAccessRegistrantsOnly,
            7 => Self::WriteExclusiveAllRegistrants,
            8 => Self::ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }
}

/// PR SCOPE value for LU_SCOPE, the only scope SPC-4 still defines.
pub const PR_SCOPE_LU: u8 = 0;

/// Fields shared by the READ/WRITE/VERIFY family.
///
/// Field widths depend on `size`: 6-byte CDBs have a 21-bit LBA, a
/// transfer length of 1..=256 (wire 0 means 256) and none of the flags or
/// group; 10-byte CDBs a 32-bit LBA and 16-bit length; 12-byte a 32-bit LBA
/// and 32-bit length; 16-byte a 64-bit LBA and 32-bit length. Encoding
/// truncates values wider than the chosen form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rw {
    /// CDB form.
    pub size: CdbSize,
    /// LOGICAL BLOCK ADDRESS.
    pub lba: u64,
    /// TRANSFER LENGTH (or VERIFICATION LENGTH) in logical blocks.
    pub length: u32,
    /// RDPROTECT / WRPROTECT / VRPROTECT / ORPROTECT (3 bits).
    pub protect: u8,
    /// DPO: disable page out (do not keep in cache).
    pub dpo: bool,
    /// FUA: force unit access. Not part of VERIFY or WRITE AND VERIFY (which
    /// always reach the medium); ignored there.
    pub fua: bool,
    /// GROUP NUMBER (5 bits).
    pub group: u8,
}

/// A decoded CDB.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Cdb {
    /// TEST UNIT READY.
    TestUnitReady,
    /// REQUEST SENSE.
    RequestSense {
        /// DESC: descriptor-format sense wanted.
        desc: bool,
        /// ALLOCATION LENGTH.
        allocation_length: u8,
    },
    /// INQUIRY (standard data when `evpd` is false, else a VPD page).
    Inquiry {
        /// EVPD.
        evpd: bool,
        /// PAGE CODE (must be 0 when `evpd` is false).
        page_code: u8,
        /// ALLOCATION LENGTH.
        allocation_length: u16,
    },
    /// MODE SENSE(6).
    ModeSense6 {
        /// DBD: disable block descriptors.
        dbd: bool,
        /// PC.
        page_control: PageControl,
        /// PAGE CODE (6 bits; 3Fh = all pages).
        page_code: u8,
        /// SUBPAGE CODE.
        subpage_code: u8,
        /// ALLOCATION LENGTH.
        allocation_length: u8,
    },
    /// MODE SENSE(10).
    ModeSense10 {
        /// LLBAA: long LBA block descriptors accepted.
        llbaa: bool,
        /// DBD: disable block descriptors.
        dbd: bool,
        /// PC.
        page_control: PageControl,
        /// PAGE CODE (6 bits).
        page_code: u8,
        /// SUBPAGE CODE.
        subpage_code: u8,
        /// ALLOCATION LENGTH.
        allocation_length: u16,
    },
    /// LOG SENSE (SPC-4 6.6).
    LogSense {
        /// SP: save parameters (obsolete in SPC-5).
        sp: bool,
        /// PPC: parameter pointer control.
        ppc: bool,
        /// PC (2 bits): 00b threshold, 01b cumulative, 10b default
        /// threshold, 11b default cumulative values.
        page_control: u8,
        /// PAGE CODE (6 bits).
        page_code: u8,
        /// SUBPAGE CODE.
        subpage_code: u8,
        /// PARAMETER POINTER: the first parameter code returned.
        parameter_pointer: u16,
        /// ALLOCATION LENGTH.
        allocation_length: u16,
    },
    /// MODE SELECT(6).
    ModeSelect6 {
        /// PF: page format.
        pf: bool,
        /// SP: save pages.
        sp: bool,
        /// PARAMETER LIST LENGTH.
        parameter_list_length: u8,
    },
    /// MODE SELECT(10).
    ModeSelect10 {
        /// PF: page format.
        pf: bool,
        /// SP: save pages.
        sp: bool,
        /// PARAMETER LIST LENGTH.
        parameter_list_length: u16,
    },
    /// READ(6/10/12/16).
    Read {
        /// Common fields.
        rw: Rw,
        /// RARC: rebuild assist recovery control (10/12/16 only).
        rarc: bool,
    },
    /// WRITE(6/10/12/16).
    Write(Rw),
    /// WRITE AND VERIFY(10/12/16).
    WriteAndVerify {
        /// Common fields (`fua` unused).
        rw: Rw,
        /// BYTCHK (2 bits; 0 or 1 are valid).
        bytchk: u8,
    },
    /// VERIFY(10/12/16).
    Verify {
        /// Common fields (`length` is VERIFICATION LENGTH, `fua` unused).
        rw: Rw,
        /// BYTCHK: 0 medium check only, 1 compare `length` blocks, 3 compare
        /// one block against every block.
        bytchk: u8,
    },
    /// ORWRITE(16).
    OrWrite16(Rw),
    /// WRITE SAME(10/16).
    WriteSame {
        /// CDB form (Ten or Sixteen).
        size: CdbSize,
        /// LOGICAL BLOCK ADDRESS.
        lba: u64,
        /// NUMBER OF LOGICAL BLOCKS (0: to the end of the medium when the
        /// block limits page has WSNZ=0).
        blocks: u32,
        /// WRPROTECT.
        wrprotect: u8,
        /// ANCHOR.
        anchor: bool,
        /// UNMAP: deallocate instead of writing when possible.
        unmap: bool,
        /// NDOB: no Data-Out buffer (16-byte form only).
        ndob: bool,
        /// GROUP NUMBER.
        group: u8,
    },
    /// UNMAP.
    Unmap {
        /// ANCHOR.
        anchor: bool,
        /// GROUP NUMBER.
        group: u8,
        /// PARAMETER LIST LENGTH.
        parameter_list_length: u16,
    },
    /// COMPARE AND WRITE (Data-Out holds 2 x `blocks` blocks: verify, then write).
    CompareAndWrite {
        /// LOGICAL BLOCK ADDRESS.
        lba: u64,
        /// NUMBER OF LOGICAL BLOCKS.
        blocks: u8,
        /// WRPROTECT.
        wrprotect: u8,
        /// DPO.
        dpo: bool,
        /// FUA.
        fua: bool,
        /// GROUP NUMBER.
        group: u8,
    },
    /// WRITE ATOMIC(16) (SBC-4 5.48): the blocks are written whole or not
    /// at all.
    WriteAtomic16 {
        /// LOGICAL BLOCK ADDRESS.
        lba: u64,
        /// ATOMIC BOUNDARY in blocks (0: the whole transfer is one atomic
        /// unit).
        boundary: u16,
        /// TRANSFER LENGTH in blocks.
        blocks: u16,
        /// WRPROTECT.
        wrprotect: u8,
        /// DPO.
        dpo: bool,
        /// FUA.
        fua: bool,
        /// GROUP NUMBER.
        group: u8,
    },
    /// PRE-FETCH(10/16).
    PreFetch {
        /// CDB form (Ten or Sixteen).
        size: CdbSize,
        /// IMMED: return status before the prefetch is done.
        immed: bool,
        /// LOGICAL BLOCK ADDRESS.
        lba: u64,
        /// PREFETCH LENGTH in blocks.
        blocks: u32,
        /// GROUP NUMBER.
        group: u8,
    },
    /// SYNCHRONIZE CACHE(10/16).
    SynchronizeCache {
        /// CDB form (Ten or Sixteen).
        size: CdbSize,
        /// IMMED: return status before the flush is done.
        immed: bool,
        /// LOGICAL BLOCK ADDRESS.
        lba: u64,
        /// NUMBER OF LOGICAL BLOCKS (0: to the end of the medium).
        blocks: u32,
        /// GROUP NUMBER.
        group: u8,
    },
    /// READ CAPACITY(10).
    ReadCapacity10 {
        /// LOGICAL BLOCK ADDRESS (obsolete with PMI).
        lba: u32,
        /// PMI (obsolete).
        pmi: bool,
    },
    /// READ CAPACITY(16) (SERVICE ACTION IN(16), 10h).
    ReadCapacity16 {
        /// LOGICAL BLOCK ADDRESS (obsolete with PMI).
        lba: u64,
        /// ALLOCATION LENGTH.
        allocation_length: u32,
        /// PMI (obsolete).
        pmi: bool,
    },
    /// GET LBA STATUS (SERVICE ACTION IN(16), 12h).
    GetLbaStatus {
        /// STARTING LOGICAL BLOCK ADDRESS.
        lba: u64,
        /// ALLOCATION LENGTH.
        allocation_length: u32,
    },
    /// REPORT LUNS.
    ReportLuns {
        /// SELECT REPORT (00h all addressable, 01h well known, 02h all).
        select_report: u8,
        /// ALLOCATION LENGTH.
        allocation_length: u32,
    },
    /// REPORT TARGET PORT GROUPS (MAINTENANCE IN, 0Ah).
    ReportTargetPortGroups {
        /// PARAMETER DATA FORMAT (3 bits: 000b length only, 001b extended).
        parameter_data_format: u8,
        /// ALLOCATION LENGTH.
        allocation_length: u32,
    },
    /// REPORT SUPPORTED OPERATION CODES (MAINTENANCE IN, 0Ch).
    ReportSupportedOperationCodes {
        /// RCTD: return command timeouts descriptor.
        rctd: bool,
        /// REPORTING OPTIONS (3 bits).
        reporting_options: u8,
        /// REQUESTED OPERATION CODE.
        requested_opcode: u8,
        /// REQUESTED SERVICE ACTION.
        requested_service_action: u16,
        /// ALLOCATION LENGTH.
        allocation_length: u32,
    },
    /// REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS (MAINTENANCE IN, 0Dh).
    ReportSupportedTmfs {
        /// REPD: return extended parameter data.
        repd: bool,
        /// ALLOCATION LENGTH.
        allocation_length: u32,
    },
    /// SET TARGET PORT GROUPS (MAINTENANCE OUT, 0Ah).
    SetTargetPortGroups {
        /// PARAMETER LIST LENGTH.
        parameter_list_length: u32,
    },
    /// START STOP UNIT.
    StartStopUnit {
        /// IMMED.
        immed: bool,
        /// POWER CONDITION MODIFIER (4 bits).
        power_condition_modifier: u8,
        /// POWER CONDITION (4 bits).
        power_condition: u8,
        /// NO_FLUSH.
        no_flush: bool,
        /// LOEJ: load/eject.
        loej: bool,
        /// START.
        start: bool,
    },
    /// PREVENT ALLOW MEDIUM REMOVAL.
    PreventAllowMediumRemoval {
        /// PREVENT (2 bits).
        prevent: u8,
    },
    /// RESERVE(6).
    Reserve6,
    /// RELEASE(6).
    Release6,
    /// RESERVE(10).
    Reserve10 {
        /// 3RDPTY.
        third_party: bool,
        /// LONGID.
        long_id: bool,
        /// THIRD-PARTY DEVICE ID.
        third_party_device_id: u8,
        /// PARAMETER LIST LENGTH.
        parameter_list_length: u16,
    },
    /// RELEASE(10).
    Release10 {
        /// 3RDPTY.
        third_party: bool,
        /// LONGID.
        long_id: bool,
        /// THIRD-PARTY DEVICE ID.
        third_party_device_id: u8,
        /// PARAMETER LIST LENGTH.
        parameter_list_length: u16,
    },
    /// EXTENDED COPY (LID1 or LID4).
    ExtendedCopy {
        /// SERVICE ACTION (00h LID1, 01h LID4).
        service_action: u8,
        /// PARAMETER LIST LENGTH.
        parameter_list_length: u32,
    },
    /// POPULATE TOKEN (10h) or WRITE USING TOKEN (11h), the token-based
    /// copy service actions of THIRD-PARTY COPY OUT (SBC-3 5.10, 5.31).
    TokenCopy {
        /// SERVICE ACTION (see [`op::copy_out`]).
        service_action: u8,
        /// LIST IDENTIFIER: names the operation for RECEIVE ROD TOKEN
        /// INFORMATION.
        list_identifier: u32,
        /// PARAMETER LIST LENGTH.
        parameter_list_length: u32,
        /// GROUP NUMBER.
        group: u8,
    },
    /// RECEIVE COPY RESULTS (THIRD-PARTY COPY IN).
    ReceiveCopyResults {
        /// SERVICE ACTION (see [`op::copy_in`]).
        service_action: u8,
        /// LIST IDENTIFIER (1 byte for LID1 actions, 4 for LID4 ones, 0 for
        /// actions without one).
        list_identifier: u32,
        /// ALLOCATION LENGTH.
        allocation_length: u32,
    },
    /// PERSISTENT RESERVE IN.
    PersistentReserveIn {
        /// SERVICE ACTION.
        service_action: PrInAction,
        /// ALLOCATION LENGTH.
        allocation_length: u16,
    },
    /// PERSISTENT RESERVE OUT.
    PersistentReserveOut {
        /// SERVICE ACTION.
        service_action: PrOutAction,
        /// SCOPE (4 bits).
        scope: u8,
        /// TYPE (4 bits; see [`PrType`]).
        pr_type: u8,
        /// PARAMETER LIST LENGTH.
        parameter_list_length: u32,
    },
    /// Any opcode this crate does not decode; `bytes` is the whole CDB
    /// (opcode first) as received.
    Unknown {
        /// OPERATION CODE.
        opcode: u8,
        /// The CDB bytes.
        bytes: Vec<u8>,
    },
}

/// Why a CDB was rejected, with what the target needs for sense data.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub enum CdbError {
    /// No bytes at all.
    #[error("empty CDB")]
    Empty,
    /// Fewer bytes than the command's CDB length.
    #[error("CDB for opcode {opcode:#04x} needs {needed} bytes, got {got}")]
    TooShort {
        /// OPERATION CODE.
        opcode: u8,
        /// Required length.
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// The operation code is not supported (for the target to raise when it
    /// meets [`Cdb::Unknown`]).
    #[error("operation code {opcode:#04x} is not supported")]
    UnsupportedOpcode {
        /// OPERATION CODE.
        opcode: u8,
    },
    /// A known opcode with a service action this crate does not decode.
    #[error("service action {service_action:#04x} of opcode {opcode:#04x} is not supported")]
    UnsupportedServiceAction {
        /// OPERATION CODE.
        opcode: u8,
        /// SERVICE ACTION.
        service_action: u8,
    },
    /// A field holds an invalid value.
    #[error("invalid field in CDB (opcode {opcode:#04x}) at byte {byte}, bit {bit:?}")]
    InvalidField {
        /// OPERATION CODE.
        opcode: u8,
        /// Byte offset of the field.
        byte: u8,
        /// Left-most bit of the field, when the field is not a whole byte.
        bit: Option<u8>,
    },
}

impl CdbError {
    /// The ASC/ASCQ SPC-4 prescribes for this error.
    pub fn asc(&self) -> Asc {
        match self {
            Self::Empty | Self::UnsupportedOpcode { .. } => Asc::INVALID_COMMAND_OPERATION_CODE,
            _ => Asc::INVALID_FIELD_IN_CDB,
        }
    }

    /// The sense-key-specific field pointer, when the error has one.
    pub fn field_pointer(&self) -> Option<FieldPointer> {
        match *self {
            Self::InvalidField { byte, bit, .. } => Some(FieldPointer::cdb(u16::from(byte), bit)),
            // SERVICE ACTION sits in byte 1, bits 4..0 for every opcode here.
            Self::UnsupportedServiceAction { .. } => Some(FieldPointer::cdb(1, Some(4))),
            _ => None,
        }
    }

    /// ILLEGAL REQUEST sense data describing this error.
    pub fn to_sense(&self) -> Sense {
        Sense::illegal_request(self.asc(), self.field_pointer())
    }
}

/// A CDB image padded to 16 bytes; const indices into it cannot panic.
type Image = [u8; 16];

fn lba_len(c: &Image, size: CdbSize) -> (u64, u32, u8) {
    let (lba, len, group) = match size {
        CdbSize::Six => {
            let lba = (u32::from(c[1] & 0x1f) << 16) | u32::from(be16(c, 2).unwrap_or(0));
            let len = if c[4] == 0 { 256 } else { u32::from(c[4]) };
            return (u64::from(lba), len, 0);
        }
        CdbSize::Ten => (be32(c, 2).map(u64::from), be16(c, 7).map(u32::from), c[6]),
        CdbSize::Twelve => (be32(c, 2).map(u64::from), be32(c, 6), c[10]),
        CdbSize::Sixteen => (be64(c, 2), be32(c, 10), c[14]),
    };
    (lba.unwrap_or(0), len.unwrap_or(0), group & 0x1f)
}

fn put(c: &mut Image, off: usize, src: &[u8]) {
    if let Some(d) = c.get_mut(off..off + src.len()) {
        d.copy_from_slice(src);
    }
}

fn put_lba_len(c: &mut Image, size: CdbSize, lba: u64, len: u32, group: u8) {
    let g = group & 0x1f;
    match size {
        CdbSize::Six => {
            c[1] = ((lba >> 16) & 0x1f) as u8;
            put(c, 2, &(lba as u16).to_be_bytes());
            c[4] = len as u8; // 256 wraps to 0, which means 256
        }
        CdbSize::Ten => {
            put(c, 2, &(lba as u32).to_be_bytes());
            c[6] = g;
            put(c, 7, &(len as u16).to_be_bytes());
        }
        CdbSize::Twelve => {
            put(c, 2, &(lba as u32).to_be_bytes());
            put(c, 6, &len.to_be_bytes());
            c[10] = g;
        }
        CdbSize::Sixteen => {
            put(c, 2, &lba.to_be_bytes());
            put(c, 10, &len.to_be_bytes());
            c[14] = g;
        }
    }
}

fn rw_size(opcode: u8) -> CdbSize {
    match cdb_length(opcode) {
        Some(6) => CdbSize::Six,
        Some(10) => CdbSize::Ten,
        Some(12) => CdbSize::Twelve,
        _ => CdbSize::Sixteen,
    }
}

fn decode_rw(c: &Image, opcode: u8) -> Rw {
    let size = rw_size(opcode);
    let (lba, length, group) = lba_len(c, size);
    let six = size == CdbSize::Six;
    Rw {
        size,
        lba,
        length,
        protect: if six { 0 } else { c[1] >> 5 },
        dpo: !six && bit(c[1], 4),
        fua: !six && bit(c[1], 3),
        group,
    }
}

fn encode_rw(c: &mut Image, rw: &Rw, fua_allowed: bool) {
    put_lba_len(c, rw.size, rw.lba, rw.length, rw.group);
    if rw.size != CdbSize::Six {
        c[1] = (rw.protect & 7) << 5 | flag(rw.dpo, 4) | flag(rw.fua && fua_allowed, 3);
    }
}

fn pick(size: CdbSize, six: u8, ten: u8, twelve: u8, sixteen: u8) -> u8 {
    match size {
        CdbSize::Six => six,
        CdbSize::Ten => ten,
        CdbSize::Twelve => twelve,
        CdbSize::Sixteen => sixteen,
    }
}

impl Cdb {
    /// Decodes a CDB. Fuzz entry point: never panics.
    ///
    /// Trailing bytes past the command's CDB length are ignored, because
    /// iSCSI carries every CDB in a zero-padded 16-byte field.
    pub fn decode(bytes: &[u8]) -> Result<Cdb, CdbError> {
        let opcode = *bytes.first().ok_or(CdbError::Empty)?;
        let Some(needed) = cdb_length(opcode) else {
            return Ok(Cdb::Unknown {
                opcode,
                bytes: bytes.to_vec(),
            });
        };
        if !is_known(opcode) {
            let n = needed.min(bytes.len());
            return Ok(Cdb::Unknown {
                opcode,
                bytes: bytes.get(..n).unwrap_or(bytes).to_vec(),
            });
        }
        let src = bytes.get(..needed).ok_or(CdbError::TooShort {
            opcode,
            needed,
            got: bytes.len(),
        })?;
        let mut c: Image = [0; 16];
        put(&mut c, 0, src);
        let invalid = |byte: usize, bit: Option<u8>| CdbError::InvalidField {
            opcode,
            byte: byte as u8,
            bit,
        };
        let control = c.get(needed - 1).copied().unwrap_or(0);
        if bit(control, 2) {
            return Err(invalid(needed - 1, Some(2)));
        }
        if bit(control, 0) {
            return Err(invalid(needed - 1, Some(0)));
        }
        let sa = c[1] & 0x1f;
        let bad_sa = CdbError::UnsupportedServiceAction {
            opcode,
            service_action: sa,
        };
        let b16 = |o| be16(&c, o).unwrap_or(0);
        let b32 = |o| be32(&c, o).unwrap_or(0);
        let b64 = |o| be64(&c, o).unwrap_or(0);
        Ok(match opcode {
            op::TEST_UNIT_READY => Cdb::TestUnitReady,
            op::REQUEST_SENSE => Cdb::RequestSense {
                desc: bit(c[1], 0),
                allocation_length: c[4],
            },
            op::INQUIRY => {
                let evpd = bit(c[1], 0);
                if !evpd && c[2] != 0 {
                    return Err(invalid(2, Some(7)));
                }
                Cdb::Inquiry {
                    evpd,
                    page_code: c[2],
                    allocation_length: b16(3),
                }
            }
            op::MODE_SENSE_6 => Cdb::ModeSense6 {
                dbd: bit(c[1], 3),
                page_control: PageControl::from_bits(c[2] >> 6),
                page_code: c[2] & 0x3f,
                subpage_code: c[3],
                allocation_length: c[4],
            },
            op::MODE_SENSE_10 => Cdb::ModeSense10 {
                llbaa: bit(c[1], 4),
                dbd: bit(c[1], 3),
                page_control: PageControl::from_bits(c[2] >> 6),
                page_code: c[2] & 0x3f,
                subpage_code: c[3],
                allocation_length: b16(7),
            },
            op::LOG_SENSE => Cdb::LogSense {
                sp: bit(c[1], 0),
                ppc: bit(c[1], 1),
                page_control: c[2] >> 6,
                page_code: c[2] & 0x3f,
                subpage_code: c[3],
                parameter_pointer: b16(5),
                allocation_length: b16(7),
            },
            op::MODE_SELECT_6 => Cdb::ModeSelect6 {
                pf: bit(c[1], 4),
                sp: bit(c[1], 0),
                parameter_list_length: c[4],
            },
            op::MODE_SELECT_10 => Cdb::ModeSelect10 {
                pf: bit(c[1], 4),
                sp: bit(c[1], 0),
                parameter_list_length: b16(7),
            },
            op::READ_6 | op::READ_10 | op::READ_12 | op::READ_16 => {
                let rw = decode_rw(&c, opcode);
                Cdb::Read {
                    rarc: rw.size != CdbSize::Six && bit(c[1], 2),
                    rw,
                }
            }
            op::WRITE_6 | op::WRITE_10 | op::WRITE_12 | op::WRITE_16 => {
                Cdb::Write(decode_rw(&c, opcode))
            }
            op::WRITE_AND_VERIFY_10 | op::WRITE_AND_VERIFY_12 | op::WRITE_AND_VERIFY_16 => {
                let bytchk = (c[1] >> 1) & 3;
                if bytchk > 1 {
                    return Err(invalid(1, Some(2)));
                }
                let mut rw = decode_rw(&c, opcode);
                rw.fua = false;
                Cdb::WriteAndVerify { rw, bytchk }
            }
            op::VERIFY_10 | op::VERIFY_12 | op::VERIFY_16 => {
                let bytchk = (c[1] >> 1) & 3;
                if bytchk == 2 {
                    return Err(invalid(1, Some(2)));
                }
                let mut rw = decode_rw(&c, opcode);
                rw.fua = false;
                Cdb::Verify { rw, bytchk }
            }
            op::ORWRITE_16 => Cdb::OrWrite16(decode_rw(&c, opcode)),
            op::WRITE_SAME_10 | op::WRITE_SAME_16 => {
                let size = rw_size(opcode);
                let (lba, blocks, group) = lba_len(&c, size);
                Cdb::WriteSame {
                    size,
                    lba,
                    blocks,
                    wrprotect: c[1] >> 5,
                    anchor: bit(c[1], 4),
                    unmap: bit(c[1], 3),
                    ndob: size == CdbSize::Sixteen && bit(c[1], 0),
                    group,
                }
            }
            op::UNMAP => Cdb::Unmap {
                anchor: bit(c[1], 0),
                group: c[6] & 0x1f,
                parameter_list_length: b16(7),
            },
            op::COMPARE_AND_WRITE => Cdb::CompareAndWrite {
                lba: b64(2),
                blocks: c[13],
                wrprotect: c[1] >> 5,
                dpo: bit(c[1], 4),
                fua: bit(c[1], 3),
                group: c[14] & 0x1f,
            },
            op::WRITE_ATOMIC_16 => Cdb::WriteAtomic16 {
                lba: b64(2),
                boundary: b16(10),
                blocks: b16(12),
                wrprotect: c[1] >> 5,
                dpo: bit(c[1], 4),
                fua: bit(c[1], 3),
                group: c[14] & 0x3f,
            },
            op::PRE_FETCH_10 | op::PRE_FETCH_16 => {
                let size = rw_size(opcode);
                let (lba, blocks, group) = lba_len(&c, size);
                Cdb::PreFetch {
                    size,
                    immed: bit(c[1], 1),
                    lba,
                    blocks,
                    group,
                }
            }
            op::SYNCHRONIZE_CACHE_10 | op::SYNCHRONIZE_CACHE_16 => {
                let size = rw_size(opcode);
                let (lba, blocks, group) = lba_len(&c, size);
                Cdb::SynchronizeCache {
                    size,
                    immed: bit(c[1], 1),
                    lba,
                    blocks,
                    group,
                }
            }
            op::READ_CAPACITY_10 => Cdb::ReadCapacity10 {
                lba: b32(2),
                pmi: bit(c[8], 0),
            },
            op::SERVICE_ACTION_IN_16 => match sa {
                op::sai16::READ_CAPACITY_16 => Cdb::ReadCapacity16 {
                    lba: b64(2),
                    allocation_length: b32(10),
                    pmi: bit(c[14], 0),
                },
                op::sai16::GET_LBA_STATUS => Cdb::GetLbaStatus {
                    lba: b64(2),
                    allocation_length: b32(10),
                },
                _ => return Err(bad_sa),
            },
            op::REPORT_LUNS => Cdb::ReportLuns {
                select_report: c[2],
                allocation_length: b32(6),
            },
            op::MAINTENANCE_IN => match sa {
                op::maintenance_in::REPORT_TARGET_PORT_GROUPS => Cdb::ReportTargetPortGroups {
                    parameter_data_format: c[1] >> 5,
                    allocation_length: b32(6),
                },
                op::maintenance_in::REPORT_SUPPORTED_OPERATION_CODES => {
                    Cdb::ReportSupportedOperationCodes {
                        rctd: bit(c[2], 7),
                        reporting_options: c[2] & 7,
                        requested_opcode: c[3],
                        requested_service_action: b16(4),
                        allocation_length: b32(6),
                    }
                }
                op::maintenance_in::REPORT_SUPPORTED_TMFS => Cdb::ReportSupportedTmfs {
                    repd: bit(c[2], 7),
                    allocation_length: b32(6),
                },
                _ => return Err(bad_sa),
            },
            op::MAINTENANCE_OUT => match sa {
                op::maintenance_out::SET_TARGET_PORT_GROUPS => Cdb::SetTargetPortGroups {
                    parameter_list_length: b32(6),
                },
                _ => return Err(bad_sa),
            },
            op::START_STOP_UNIT => Cdb::StartStopUnit {
                immed: bit(c[1], 0),
                power_condition_modifier: c[3] & 0x0f,
                power_condition: c[4] >> 4,
                no_flush: bit(c[4], 2),
                loej: bit(c[4], 1),
                start: bit(c[4], 0),
            },
            op::PREVENT_ALLOW_MEDIUM_REMOVAL => {
                Cdb::PreventAllowMediumRemoval { prevent: c[4] & 3 }
            }
            op::RESERVE_6 => Cdb::Reserve6,
            op::RELEASE_6 => Cdb::Release6,
            op::RESERVE_10 | op::RELEASE_10 => {
                let third_party = bit(c[1], 4);
                let long_id = bit(c[1], 1);
                let third_party_device_id = c[3];
                let parameter_list_length = b16(7);
                if opcode == op::RESERVE_10 {
                    Cdb::Reserve10 {
                        third_party,
                        long_id,
                        third_party_device_id,
                        parameter_list_length,
                    }
                } else {
                    Cdb::Release10 {
                        third_party,
                        long_id,
                        third_party_device_id,
                        parameter_list_length,
                    }
                }
            }
            op::EXTENDED_COPY => match sa {
                op::copy_out::EXTENDED_COPY_LID1 | op::copy_out::EXTENDED_COPY_LID4 => {
                    Cdb::ExtendedCopy {
                        service_action: sa,
                        parameter_list_length: b32(10),
                    }
                }
                op::copy_out::POPULATE_TOKEN | op::copy_out::WRITE_USING_TOKEN => Cdb::TokenCopy {
                    service_action: sa,
                    list_identifier: b32(6),
                    parameter_list_length: b32(10),
                    group: c[14] & 0x1f,
                },
                _ => return Err(bad_sa),
            },
            op::RECEIVE_COPY_RESULTS => {
                let list_identifier = match copy_in_list_id_width(sa) {
                    Some(1) => u32::from(c[2]),
                    Some(4) => b32(2),
                    Some(_) => 0,
                    None => return Err(bad_sa),
                };
                Cdb::ReceiveCopyResults {
                    service_action: sa,
                    list_identifier,
                    allocation_length: b32(10),
                }
            }
            op::PERSISTENT_RESERVE_IN => Cdb::PersistentReserveIn {
                service_action: PrInAction::from_code(sa).ok_or(bad_sa)?,
                allocation_length: b16(7),
            },
            op::PERSISTENT_RESERVE_OUT => Cdb::PersistentReserveOut {
                service_action: PrOutAction::from_code(sa).ok_or(bad_sa)?,
                scope: c[2] >> 4,
                pr_type: c[2] & 0x0f,
                parameter_list_length: b32(5),
            },
            _ => Cdb::Unknown {
                opcode,
                bytes: src.to_vec(),
            },
        })
    }

    /// Encodes the CDB (control byte 0). Fields wider than their wire field
    /// are truncated; `Unknown` is returned verbatim.
    pub fn encode(&self) -> Vec<u8> {
        if let Cdb::Unknown { bytes, .. } = self {
            return bytes.clone();
        }
        let mut c: Image = [0; 16];
        let opcode = self.opcode();
        c[0] = opcode;
        match self {
            Cdb::TestUnitReady | Cdb::Reserve6 | Cdb::Release6 | Cdb::Unknown { .. } => {}
            Cdb::RequestSense {
                desc,
                allocation_length,
            } => {
                c[1] = flag(*desc, 0);
                c[4] = *allocation_length;
            }
            Cdb::Inquiry {
                evpd,
                page_code,
                allocation_length,
            } => {
                c[1] = flag(*evpd, 0);
                c[2] = *page_code;
                put(&mut c, 3, &allocation_length.to_be_bytes());
            }
            Cdb::ModeSense6 {
                dbd,
                page_control,
                page_code,
                subpage_code,
                allocation_length,
            } => {
                c[1] = flag(*dbd, 3);
                c[2] = page_control.code() << 6 | (page_code & 0x3f);
                c[3] = *subpage_code;
                c[4] = *allocation_length;
            }
            Cdb::ModeSense10 {
                llbaa,
                dbd,
                page_control,
                page_code,
                subpage_code,
                allocation_length,
            } => {
                c[1] = flag(*llbaa, 4) | flag(*dbd, 3);
                c[2] = page_control.code() << 6 | (page_code & 0x3f);
                c[3] = *subpage_code;
                put(&mut c, 7, &allocation_length.to_be_bytes());
            }
            Cdb::LogSense {
                sp,
                ppc,
                page_control,
                page_code,
                subpage_code,
                parameter_pointer,
                allocation_length,
            } => {
                c[1] = flag(*ppc, 1) | flag(*sp, 0);
                c[2] = (page_control & 3) << 6 | (page_code & 0x3f);
                c[3] = *subpage_code;
                put(&mut c, 5, &parameter_pointer.to_be_bytes());
                put(&mut c, 7, &allocation_length.to_be_bytes());
            }
            Cdb::ModeSelect6 {
                pf,
                sp,
                parameter_list_length,
            } => {
                c[1] = flag(*pf, 4) | flag(*sp, 0);
                c[4] = *parameter_list_length;
            }
            Cdb::ModeSelect10 {
                pf,
                sp,
                parameter_list_length,
            } => {
                c[1] = flag(*pf, 4) | flag(*sp, 0);
                put(&mut c, 7, &parameter_list_length.to_be_bytes());
            }
            Cdb::Read { rw, rarc } => {
                encode_rw(&mut c, rw, true);
                if rw.size != CdbSize::Six {
                    c[1] |= flag(*rarc, 2);
                }
            }
            Cdb::Write(rw) | Cdb::OrWrite16(rw) => encode_rw(&mut c, rw, true),
            Cdb::WriteAndVerify { rw, bytchk } | Cdb::Verify { rw, bytchk } => {
                encode_rw(&mut c, rw, false);
                c[1] |= (bytchk & 3) << 1;
            }
            Cdb::WriteSame {
                size,
                lba,
                blocks,
                wrprotect,
                anchor,
                unmap,
                ndob,
                group,
            } => {
                put_lba_len(&mut c, *size, *lba, *blocks, *group);
                c[1] = (wrprotect & 7) << 5
                    | flag(*anchor, 4)
                    | flag(*unmap, 3)
                    | flag(*ndob && *size == CdbSize::Sixteen, 0);
            }
            Cdb::Unmap {
                anchor,
                group,
                parameter_list_length,
            } => {
                c[1] = flag(*anchor, 0);
                c[6] = group & 0x1f;
                put(&mut c, 7, &parameter_list_length.to_be_bytes());
            }
            Cdb::CompareAndWrite {
                lba,
                blocks,
                wrprotect,
                dpo,
                fua,
                group,
            } => {
                c[1] = (wrprotect & 7) << 5 | flag(*dpo, 4) | flag(*fua, 3);
                put(&mut c, 2, &lba.to_be_bytes());
                c[13] = *blocks;
                c[14] = group & 0x1f;
            }
            Cdb::WriteAtomic16 {
                lba,
                boundary,
                blocks,
                wrprotect,
                dpo,
                fua,
                group,
            } => {
                c[1] = (wrprotect & 7) << 5 | flag(*dpo, 4) | flag(*fua, 3);
                put(&mut c, 2, &lba.to_be_bytes());
                put(&mut c, 10, &boundary.to_be_bytes());
                put(&mut c, 12, &blocks.to_be_bytes());
                c[14] = group & 0x3f;
            }
            Cdb::PreFetch {
                size,
                immed,
                lba,
                blocks,
                group,
            }
            | Cdb::SynchronizeCache {
                size,
                immed,
                lba,
                blocks,
                group,
            } => {
                put_lba_len(&mut c, *size, *lba, *blocks, *group);
                c[1] = flag(*immed, 1);
            }
            Cdb::ReadCapacity10 { lba, pmi } => {
                put(&mut c, 2, &lba.to_be_bytes());
                c[8] = flag(*pmi, 0);
            }
            Cdb::ReadCapacity16 {
                lba,
                allocation_length,
                pmi,
            } => {
                c[1] = op::sai16::READ_CAPACITY_16;
                put(&mut c, 2, &lba.to_be_bytes());
                put(&mut c, 10, &allocation_length.to_be_bytes());
                c[14] = flag(*pmi, 0);
            }
            Cdb::GetLbaStatus {
                lba,
                allocation_length,
            } => {
                c[1] = op::sai16::GET_LBA_STATUS;
                put(&mut c, 2, &lba.to_be_bytes());
                put(&mut c, 10, &allocation_length.to_be_bytes());
            }
            Cdb::ReportLuns {
                select_report,
                allocation_length,
            } => {
                c[2] = *select_report;
                put(&mut c, 6, &allocation_length.to_be_bytes());
            }
            Cdb::ReportTargetPortGroups {
                parameter_data_format,
                allocation_length,
            } => {
                c[1] = (parameter_data_format & 7) << 5
                    | op::maintenance_in::REPORT_TARGET_PORT_GROUPS;
                put(&mut c, 6, &allocation_length.to_be_bytes());
            }
            Cdb::ReportSupportedOperationCodes {
                rctd,
                reporting_options,
                requested_opcode,
                requested_service_action,
                allocation_length,
            } => {
                c[1] = op::maintenance_in::REPORT_SUPPORTED_OPERATION_CODES;
                c[2] = flag(*rctd, 7) | (reporting_options & 7);
                c[3] = *requested_opcode;
                put(&mut c, 4, &requested_service_action.to_be_bytes());
                put(&mut c, 6, &allocation_length.to_be_bytes());
            }
            Cdb::ReportSupportedTmfs {
                repd,
                allocation_length,
            } => {
                c[1] = op::maintenance_in::REPORT_SUPPORTED_TMFS;
                c[2] = flag(*repd, 7);
                put(&mut c, 6, &allocation_length.to_be_bytes());
            }
            Cdb::SetTargetPortGroups {
                parameter_list_length,
            } => {
                c[1] = op::maintenance_out::SET_TARGET_PORT_GROUPS;
                put(&mut c, 6, &parameter_list_length.to_be_bytes());
            }
            Cdb::StartStopUnit {
                immed,
                power_condition_modifier,
                power_condition,
                no_flush,
                loej,
                start,
            } => {
                c[1] = flag(*immed, 0);
                c[3] = power_condition_modifier & 0x0f;
                c[4] = (power_condition & 0x0f) << 4
                    | flag(*no_flush, 2)
                    | flag(*loej, 1)
                    | flag(*start, 0);
            }
            Cdb::PreventAllowMediumRemoval { prevent } => c[4] = prevent & 3,
            Cdb::Reserve10 {
                third_party,
                long_id,
                third_party_device_id,
                parameter_list_length,
            }
            | Cdb::Release10 {
                third_party,
                long_id,
                third_party_device_id,
                parameter_list_length,
            } => {
                c[1] = flag(*third_party, 4) | flag(*long_id, 1);
                c[3] = *third_party_device_id;
                put(&mut c, 7, &parameter_list_length.to_be_bytes());
            }
            Cdb::ExtendedCopy {
                service_action,
                parameter_list_length,
            } => {
                c[1] = service_action & 0x1f;
                put(&mut c, 10, &parameter_list_length.to_be_bytes());
            }
            Cdb::TokenCopy {
                service_action,
                list_identifier,
                parameter_list_length,
                group,
            } => {
                c[1] = service_action & 0x1f;
                put(&mut c, 6, &list_identifier.to_be_bytes());
                put(&mut c, 10, &parameter_list_length.to_be_bytes());
                c[14] = group & 0x1f;
            }
            Cdb::ReceiveCopyResults {
                service_action,
                list_identifier,
                allocation_length,
            } => {
                let sa = service_action & 0x1f;
                c[1] = sa;
                match copy_in_list_id_width(sa) {
                    Some(1) => c[2] = *list_identifier as u8,
                    Some(4) => put(&mut c, 2, &list_identifier.to_be_bytes()),
                    _ => {}
                }
                put(&mut c, 10, &allocation_length.to_be_bytes());
            }
            Cdb::PersistentReserveIn {
                service_action,
                allocation_length,
            } => {
                c[1] = service_action.code();
                put(&mut c, 7, &allocation_length.to_be_bytes());
            }
            Cdb::PersistentReserveOut {
                service_action,
                scope,
                pr_type,
                parameter_list_length,
            } => {
                c[1] = service_action.code();
                c[2] = (scope & 0x0f) << 4 | (pr_type & 0x0f);
                put(&mut c, 5, &parameter_list_length.to_be_bytes());
            }
        }
        let n = cdb_length(opcode).unwrap_or(16);
        c.get(..n).unwrap_or(&c).to_vec()
    }

    /// The OPERATION CODE this CDB encodes to.
    pub fn opcode(&self) -> u8 {
        match self {
            Cdb::TestUnitReady => op::TEST_UNIT_READY,
            Cdb::RequestSense { .. } => op::REQUEST_SENSE,
            Cdb::Inquiry { .. } => op::INQUIRY,
            Cdb::ModeSense6 { .. } => op::MODE_SENSE_6,
            Cdb::ModeSense10 { .. } => op::MODE_SENSE_10,
            Cdb::LogSense { .. } => op::LOG_SENSE,
            Cdb::ModeSelect6 { .. } => op::MODE_SELECT_6,
            Cdb::ModeSelect10 { .. } => op::MODE_SELECT_10,
            Cdb::Read { rw, .. } => {
                pick(rw.size, op::READ_6, op::READ_10, op::READ_12, op::READ_16)
            }
            Cdb::Write(rw) => pick(
                rw.size,
                op::WRITE_6,
                op::WRITE_10,
                op::WRITE_12,
                op::WRITE_16,
            ),
            Cdb::WriteAndVerify { rw, .. } => pick(
                rw.size,
                op::WRITE_AND_VERIFY_10,
                op::WRITE_AND_VERIFY_10,
                op::WRITE_AND_VERIFY_12,
                op::WRITE_AND_VERIFY_16,
            ),
            Cdb::Verify { rw, .. } => pick(
                rw.size,
                op::VERIFY_10,
                op::VERIFY_10,
                op::VERIFY_12,
                op::VERIFY_16,
            ),
            Cdb::OrWrite16(_) => op::ORWRITE_16,
            Cdb::WriteSame { size, .. } => pick(
                *size,
                op::WRITE_SAME_10,
                op::WRITE_SAME_10,
                op::WRITE_SAME_16,
                op::WRITE_SAME_16,
            ),
            Cdb::Unmap { .. } => op::UNMAP,
            Cdb::CompareAndWrite { .. } => op::COMPARE_AND_WRITE,
            Cdb::WriteAtomic16 { .. } => op::WRITE_ATOMIC_16,
            Cdb::PreFetch { size, .. } => pick(
                *size,
                op::PRE_FETCH_10,
                op::PRE_FETCH_10,
                op::PRE_FETCH_16,
                op::PRE_FETCH_16,
            ),
            Cdb::SynchronizeCache { size, .. } => pick(
                *size,
                op::SYNCHRONIZE_CACHE_10,
                op::SYNCHRONIZE_CACHE_10,
                op::SYNCHRONIZE_CACHE_16,
                op::SYNCHRONIZE_CACHE_16,
            ),
            Cdb::ReadCapacity10 { .. } => op::READ_CAPACITY_10,
            Cdb::ReadCapacity16 { .. } | Cdb::GetLbaStatus { .. } => op::SERVICE_ACTION_IN_16,
            Cdb::ReportLuns { .. } => op::REPORT_LUNS,
            Cdb::ReportTargetPortGroups { .. }
            | Cdb::ReportSupportedOperationCodes { .. }
            | Cdb::ReportSupportedTmfs { .. } => op::MAINTENANCE_IN,
            Cdb::SetTargetPortGroups { .. } => op::MAINTENANCE_OUT,
            Cdb::StartStopUnit { .. } => op::START_STOP_UNIT,
            Cdb::PreventAllowMediumRemoval { .. } => op::PREVENT_ALLOW_MEDIUM_REMOVAL,
            Cdb::Reserve6 => op::RESERVE_6,
            Cdb::Release6 => op::RELEASE_6,
            Cdb::Reserve10 { .. } => op::RESERVE_10,
            Cdb::Release10 { .. } => op::RELEASE_10,
            Cdb::ExtendedCopy { .. } | Cdb::TokenCopy { .. } => op::EXTENDED_COPY,
            Cdb::ReceiveCopyResults { .. } => op::RECEIVE_COPY_RESULTS,
            Cdb::PersistentReserveIn { .. } => op::PERSISTENT_RESERVE_IN,
            Cdb::PersistentReserveOut { .. } => op::PERSISTENT_RESERVE_OUT,
            Cdb::Unknown { opcode, .. } => *opcode,
        }
    }

    /// The SERVICE ACTION, for opcodes that have one.
    pub fn service_action(&self) -> Option<u8> {
        Some(match self {
            Cdb::ReadCapacity16 { .. } => op::sai16::READ_CAPACITY_16,
            Cdb::GetLbaStatus { .. } => op::sai16::GET_LBA_STATUS,
            Cdb::ReportTargetPortGroups { .. } => op::maintenance_in::REPORT_TARGET_PORT_GROUPS,
            Cdb::ReportSupportedOperationCodes { .. } => {
                op::maintenance_in::REPORT_SUPPORTED_OPERATION_CODES
            }
            Cdb::ReportSupportedTmfs { .. } => op::maintenance_in::REPORT_SUPPORTED_TMFS,
            Cdb::SetTargetPortGroups { .. } => op::maintenance_out::SET_TARGET_PORT_GROUPS,
            Cdb::ExtendedCopy { service_action, .. }
            | Cdb::TokenCopy { service_action, .. }
            | Cdb::ReceiveCopyResults { service_action, .. } => *service_action,
            Cdb::PersistentReserveIn { service_action, .. } => service_action.code(),
            Cdb::PersistentReserveOut { service_action, .. } => service_action.code(),
            _ => return None,
        })
    }

    /// How much data the command moves, as its CDB states it; `None` for
    /// commands without a data phase (and for `Unknown`). A VERIFY with
    /// BYTCHK=0 or a WRITE SAME with NDOB reports zero blocks.
    pub fn transfer_length(&self) -> Option<TransferLength> {
        use TransferLength::{Blocks, Bytes};
        Some(match self {
            Cdb::RequestSense {
                allocation_length, ..
            }
            | Cdb::ModeSense6 {
                allocation_length, ..
            } => Bytes(u32::from(*allocation_length)),
            Cdb::ModeSelect6 {
                parameter_list_length,
                ..
            } => Bytes(u32::from(*parameter_list_length)),
            Cdb::Inquiry {
                allocation_length, ..
            }
            | Cdb::ModeSense10 {
                allocation_length, ..
            }
            | Cdb::LogSense {
                allocation_length, ..
            }
            | Cdb::PersistentReserveIn {
                allocation_length, ..
            } => Bytes(u32::from(*allocation_length)),
            Cdb::ModeSelect10 {
                parameter_list_length,
                ..
            }
            | Cdb::Unmap {
                parameter_list_length,
                ..
            }
            | Cdb::Reserve10 {
                parameter_list_length,
                ..
            }
            | Cdb::Release10 {
                parameter_list_length,
                ..
            } => Bytes(u32::from(*parameter_list_length)),
            Cdb::ReadCapacity16 {
                allocation_length, ..
            }
            | Cdb::GetLbaStatus {
                allocation_length, ..
            }
            | Cdb::ReportLuns {
                allocation_length, ..
            }
            | Cdb::ReportTargetPortGroups {
                allocation_length, ..
            }
            | Cdb::ReportSupportedOperationCodes {
                allocation_length, ..
            }
            | Cdb::ReportSupportedTmfs {
                allocation_length, ..
            }
            | Cdb::ReceiveCopyResults {
                allocation_length, ..
            } => Bytes(*allocation_length),
            Cdb::SetTargetPortGroups {
                parameter_list_length,
            }
            | Cdb::ExtendedCopy {
                parameter_list_length,
                ..
            }
            | Cdb::TokenCopy {
                parameter_list_length,
                ..
            }
            | Cdb::PersistentReserveOut {
                parameter_list_length,
                ..
            } => Bytes(*parameter_list_length),
            Cdb::ReadCapacity10 { .. } => Bytes(8),
            Cdb::Read { rw, .. }
            | Cdb::Write(rw)
            | Cdb::OrWrite16(rw)
            | Cdb::WriteAndVerify { rw, .. } => Blocks(rw.length),
            Cdb::Verify { rw, bytchk } => Blocks(match bytchk {
                0 => 0,
                1 => rw.length,
                _ => 1,
            }),
            Cdb::WriteSame { ndob, .. } => Blocks(if *ndob { 0 } else { 1 }),
            Cdb::CompareAndWrite { blocks, .. } => Blocks(2 * u32::from(*blocks)),
            Cdb::WriteAtomic16 { blocks, .. } => Blocks(u32::from(*blocks)),
            Cdb::TestUnitReady
            | Cdb::PreFetch { .. }
            | Cdb::SynchronizeCache { .. }
            | Cdb::StartStopUnit { .. }
            | Cdb::PreventAllowMediumRemoval { .. }
            | Cdb::Reserve6
            | Cdb::Release6
            | Cdb::Unknown { .. } => return None,
        })
    }

    /// Direction of the data phase; `None` when the CDB's lengths are zero.
    /// `Unknown` CDBs report `None`: the fabric must take the direction from
    /// the transport (iSCSI R/W bits).
    pub fn data_direction(&self) -> DataDirection {
        let Some(len) = self.transfer_length() else {
            return DataDirection::None;
        };
        if len.bytes(1) == 0 {
            return DataDirection::None;
        }
        match self {
            Cdb::ModeSelect6 { .. }
            | Cdb::ModeSelect10 { .. }
            | Cdb::Write(_)
            | Cdb::WriteAndVerify { .. }
            | Cdb::Verify { .. }
            | Cdb::OrWrite16(_)
            | Cdb::WriteSame { .. }
            | Cdb::Unmap { .. }
            | Cdb::CompareAndWrite { .. }
            | Cdb::WriteAtomic16 { .. }
            | Cdb::SetTargetPortGroups { .. }
            | Cdb::Reserve10 { .. }
            | Cdb::Release10 { .. }
            | Cdb::ExtendedCopy { .. }
            | Cdb::TokenCopy { .. }
            | Cdb::PersistentReserveOut { .. } => DataDirection::Out,
            _ => DataDirection::In,
        }
    }

    /// The logical block range `(lba, blocks)` the command addresses, for the
    /// LBA OUT OF RANGE check. `blocks` is 0 where that means "to the end"
    /// (WRITE SAME, SYNCHRONIZE CACHE) or "none" (READ(10) of 0 blocks).
    pub fn lba_range(&self) -> Option<(u64, u32)> {
        match self {
            Cdb::Read { rw, .. }
            | Cdb::Write(rw)
            | Cdb::OrWrite16(rw)
            | Cdb::WriteAndVerify { rw, .. }
            | Cdb::Verify { rw, .. } => Some((rw.lba, rw.length)),
            Cdb::WriteSame { lba, blocks, .. }
            | Cdb::PreFetch { lba, blocks, .. }
            | Cdb::SynchronizeCache { lba, blocks, .. } => Some((*lba, *blocks)),
            Cdb::CompareAndWrite { lba, blocks, .. } => Some((*lba, u32::from(*blocks))),
            Cdb::WriteAtomic16 { lba, blocks, .. } => Some((*lba, u32::from(*blocks))),
            _ => None,
        }
    }
}

/// Width in bytes of the LIST IDENTIFIER of a RECEIVE COPY RESULTS service
/// action (0 when it has none); `None` for undefined actions.
fn copy_in_list_id_width(sa: u8) -> Option<u8> {
    use op::copy_in::*;
    match sa {
        RECEIVE_COPY_STATUS_LID1 | RECEIVE_COPY_DATA_LID1 | RECEIVE_COPY_FAILURE_DETAILS_LID1 => {
            Some(1)
        }
        RECEIVE_COPY_STATUS_LID4 | RECEIVE_COPY_DATA_LID4 | RECEIVE_ROD_TOKEN_INFORMATION => {
            Some(4)
        }
        RECEIVE_COPY_OPERATING_PARAMETERS | REPORT_ALL_ROD_TOKENS => Some(0),
        _ => None,
    }
}

/// Whether [`Cdb::decode`] has a typed variant for `opcode`.
fn is_known(opcode: u8) -> bool {
    matches!(
        opcode,
        op::TEST_UNIT_READY
            | op::REQUEST_SENSE
            | op::INQUIRY
            | op::MODE_SENSE_6
            | op::MODE_SENSE_10
            | op::MODE_SELECT_6
            | op::MODE_SELECT_10
            | op::LOG_SENSE
            | op::READ_6
            | op::READ_10
            | op::READ_12
            | op::READ_16
            | op::WRITE_6
            | op::WRITE_10
            | op::WRITE_12
            | op::WRITE_16
            | op::WRITE_AND_VERIFY_10
            | op::WRITE_AND_VERIFY_12
            | op::WRITE_AND_VERIFY_16
            | op::VERIFY_10
            | op::VERIFY_12
            | op::VERIFY_16
            | op::ORWRITE_16
            | op::WRITE_SAME_10
            | op::WRITE_SAME_16
            | op::UNMAP
            | op::COMPARE_AND_WRITE
            | op::WRITE_ATOMIC_16
            | op::PRE_FETCH_10
            | op::PRE_FETCH_16
            | op::SYNCHRONIZE_CACHE_10
            | op::SYNCHRONIZE_CACHE_16
            | op::READ_CAPACITY_10
            | op::SERVICE_ACTION_IN_16
            | op::REPORT_LUNS
            | op::MAINTENANCE_IN
            | op::MAINTENANCE_OUT
            | op::START_STOP_UNIT
            | op::PREVENT_ALLOW_MEDIUM_REMOVAL
            | op::RESERVE_6
            | op::RELEASE_6
            | op::RESERVE_10
            | op::RELEASE_10
            | op::EXTENDED_COPY
            | op::RECEIVE_COPY_RESULTS
            | op::PERSISTENT_RESERVE_IN
            | op::PERSISTENT_RESERVE_OUT
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scsi::sense::SenseKey;

    #[test]
    fn read10_known_bytes() {
        let b = [0x28, 0, 0, 0, 0x10, 0, 0, 0, 8, 0];
        let c = Cdb::decode(&b).unwrap();
        let Cdb::Read { rw, rarc } = &c else {
            panic!("not a READ: {c:?}");
        };
        assert_eq!(
            (rw.lba, rw.length, rw.size, *rarc),
            (0x1000, 8, CdbSize::Ten, false)
        );
        assert_eq!(c.data_direction(), DataDirection::In);
        assert_eq!(c.transfer_length(), Some(TransferLength::Blocks(8)));
        assert_eq!(c.transfer_length().map(|t| t.bytes(512)), Some(4096));
        assert_eq!(c.lba_range(), Some((0x1000, 8)));
        assert_eq!(c.encode(), b.to_vec());
        // iSCSI pads CDBs to 16 bytes: trailing zeros are ignored.
        let mut padded = [0u8; 16];
        padded[..10].copy_from_slice(&b);
        assert_eq!(Cdb::decode(&padded).unwrap(), c);
    }

    #[test]
    fn read6_zero_means_256() {
        let c = Cdb::decode(&[0x08, 0x1f, 0xff, 0xff, 0, 0]).unwrap();
        let Cdb::Read { rw, .. } = &c else {
            panic!("not a READ");
        };
        assert_eq!((rw.lba, rw.length), (0x1f_ffff, 256));
        assert_eq!(c.encode(), vec![0x08, 0x1f, 0xff, 0xff, 0, 0]);
        let w = Cdb::decode(&[0x0a, 0, 0, 1, 0, 0]).unwrap();
        assert_eq!(w.transfer_length(), Some(TransferLength::Blocks(256)));
        assert_eq!(w.data_direction(), DataDirection::Out);
    }

    #[test]
    fn write16_flags() {
        let b = [0x8a, 0x18, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0x80, 0x03, 0];
        let c = Cdb::decode(&b).unwrap();
        assert_eq!(
            c,
            Cdb::Write(Rw {
                size: CdbSize::Sixteen,
                lba: 1 << 32,
                length: 128,
                protect: 0,
                dpo: true,
                fua: true,
                group: 3,
            })
        );
        assert_eq!(c.encode(), b.to_vec());
    }

    #[test]
    fn errors_carry_field_pointers() {
        assert_eq!(Cdb::decode(&[]), Err(CdbError::Empty));
        assert_eq!(
            Cdb::decode(&[0x28, 0, 0]),
            Err(CdbError::TooShort {
                opcode: 0x28,
                needed: 10,
                got: 3
            })
        );
        // INQUIRY with EVPD=0 and a page code.
        let e = Cdb::decode(&[0x12, 0, 0x80, 0, 0xff, 0]).unwrap_err();
        assert_eq!(e.field_pointer(), Some(FieldPointer::cdb(2, Some(7))));
        let s = e.to_sense();
        assert_eq!(s.key, SenseKey::IllegalRequest);
        assert_eq!(s.code(), Asc::INVALID_FIELD_IN_CDB);
        // NACA set in the control byte of a READ(10).
        let e = Cdb::decode(&[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0x04]).unwrap_err();
        assert_eq!(e.field_pointer(), Some(FieldPointer::cdb(9, Some(2))));
        // Unknown SERVICE ACTION IN(16) action.
        let mut sai = [0u8; 16];
        sai[0] = 0x9e;
        sai[1] = 0x1f;
        let e = Cdb::decode(&sai).unwrap_err();
        assert_eq!(e.field_pointer(), Some(FieldPointer::cdb(1, Some(4))));
        // VERIFY with reserved BYTCHK 10b.
        let e = Cdb::decode(&[0x2f, 0x04, 0, 0, 0, 0, 0, 0, 1, 0]).unwrap_err();
        assert_eq!(e.field_pointer(), Some(FieldPointer::cdb(1, Some(2))));
        let e = CdbError::UnsupportedOpcode { opcode: 0xc0 };
        assert_eq!(e.to_sense().code(), Asc::INVALID_COMMAND_OPERATION_CODE);
    }

    #[test]
    fn unknown_opcodes_are_kept() {
        // LOG SELECT.
        let c = Cdb::decode(&[0x4c, 0, 0x40, 0, 0, 0, 0, 0, 0xfc, 0, 9, 9]).unwrap();
        assert_eq!(
            c,
            Cdb::Unknown {
                opcode: 0x4c,
                bytes: vec![0x4c, 0, 0x40, 0, 0, 0, 0, 0, 0xfc, 0]
            }
        );
        assert_eq!(c.data_direction(), DataDirection::None);
        let v = Cdb::decode(&[0xc5, 1, 2]).unwrap();
        assert_eq!(v.encode(), vec![0xc5, 1, 2]);
    }

    #[test]
    fn service_action_commands() {
        let rc16 = Cdb::ReadCapacity16 {
            lba: 0,
            allocation_length: 32,
            pmi: false,
        };
        let b = rc16.encode();
        assert_eq!(
            b,
            vec![0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0]
        );
        assert_eq!(rc16.service_action(), Some(0x10));
        let rl = Cdb::decode(&[0xa0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0]).unwrap();
        assert_eq!(
            rl,
            Cdb::ReportLuns {
                select_report: 0,
                allocation_length: 0x1000
            }
        );
        let pr = Cdb::decode(&[0x5f, 0x01, 0x03, 0, 0, 0, 0, 0, 24, 0]).unwrap();
        assert_eq!(
            pr,
            Cdb::PersistentReserveOut {
                service_action: PrOutAction::Reserve,
                scope: PR_SCOPE_LU,
                pr_type: PrType::ExclusiveAccess.code(),
                parameter_list_length: 24
            }
        );
        assert_eq!(pr.data_direction(), DataDirection::Out);
        let caw = Cdb::CompareAndWrite {
            lba: 5,
            blocks: 1,
            wrprotect: 0,
            dpo: false,
            fua: true,
            group: 0,
        };
        assert_eq!(caw.transfer_length(), Some(TransferLength::Blocks(2)));
    }

    #[test]
    fn write_atomic16_known_bytes() {
        // LBA 0x1020, ATOMIC BOUNDARY 0, TRANSFER LENGTH 32, FUA.
        let b = [0x9c, 0x08, 0, 0, 0, 0, 0, 0, 0x10, 0x20, 0, 0, 0, 32, 0, 0];
        let c = Cdb::decode(&b).unwrap();
        assert_eq!(
            c,
            Cdb::WriteAtomic16 {
                lba: 0x1020,
                boundary: 0,
                blocks: 32,
                wrprotect: 0,
                dpo: false,
                fua: true,
                group: 0,
            }
        );
        assert_eq!(c.opcode(), op::WRITE_ATOMIC_16);
        assert_eq!(c.data_direction(), DataDirection::Out);
        assert_eq!(c.transfer_length(), Some(TransferLength::Blocks(32)));
        assert_eq!(c.lba_range(), Some((0x1020, 32)));
        assert_eq!(c.encode(), b.to_vec());
        // NACA in the control byte is refused like on every command.
        let mut naca = b;
        naca[15] = 0x04;
        assert!(Cdb::decode(&naca).is_err());
    }
}
