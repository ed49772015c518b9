//! PDUs sent by the initiator (RFC 7143 §11.2-§11.16, opcodes 0x00-0x10).

use super::codes::{LogoutReason, SnackType, Stage, TaskAttr, TmfFunction};
use super::raw::{hi16, join16, RawBhs, FINAL_BIT};
use super::Lun;

/// NOP-Out (opcode 0x00): a ping, or the answer to a NOP-In.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NopOut {
    /// The I bit.
    pub immediate: bool,
    /// LUN, echoed by the target when answering a NOP-In.
    pub lun: Lun,
    /// 0xffffffff when answering a NOP-In; otherwise the tag the NOP-In will carry.
    pub itt: u32,
    /// The TTT of the NOP-In being answered, else 0xffffffff.
    pub ttt: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

impl NopOut {
    pub(crate) fn from_raw(r: &RawBhs) -> Self {
        NopOut {
            immediate: r.immediate,
            lun: Lun(r.lun_field),
            itt: r.itt,
            ttt: r.words[0],
            cmd_sn: r.words[1],
            exp_stat_sn: r.words[2],
        }
    }

    pub(crate) fn to_raw(self) -> RawBhs {
        RawBhs {
            opcode: 0x00,
            immediate: self.immediate,
            flags: FINAL_BIT,
            lun_field: self.lun.0,
            itt: self.itt,
            words: [self.ttt, self.cmd_sn, self.exp_stat_sn, 0, 0, 0, 0],
            ..RawBhs::default()
        }
    }
}

/// SCSI Command (opcode 0x01).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScsiCommand {
    /// The I bit.
    pub immediate: bool,
    /// F: no unsolicited Data-Out PDUs follow this command.
    pub final_bit: bool,
    /// R: data will be read from the target.
    pub read: bool,
    /// W: data will be written to the target.
    pub write: bool,
    /// Task attribute.
    pub attr: TaskAttr,
    /// Logical unit number.
    pub lun: Lun,
    /// Initiator Task Tag.
    pub itt: u32,
    /// Expected Data Transfer Length in bytes (the write length for bidirectional commands).
    pub expected_data_transfer_length: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// The first 16 bytes of the CDB; longer CDBs continue in an Extended CDB AHS.
    pub cdb: [u8; 16],
}

impl ScsiCommand {
    pub(crate) fn from_raw(r: &RawBhs) -> Self {
        let mut cdb = [0u8; 16];
        for (i, w) in r.words[3..7].iter().enumerate() {
            cdb[4 * i..4 * i + 4].copy_from_slice(&w.to_be_bytes());
        }
        ScsiCommand {
            immediate: r.immediate,
            final_bit: r.flags & FINAL_BIT != 0,
            read: r.flags & 0x40 != 0,
            write: r.flags & 0x20 != 0,
            attr: TaskAttr::from_u8(r.flags & 0x07),
            lun: Lun(r.lun_field),
            itt: r.itt,
            expected_data_transfer_length: r.words[0],
            cmd_sn: r.words[1],
            exp_stat_sn: r.words[2],
            cdb,
        }
    }

    pub(crate) fn to_raw(self) -> RawBhs {
        let word = |i: usize| {
            u32::from_be_bytes([
                self.cdb[4 * i],
                self.cdb[4 * i + 1],
                self.cdb[4 * i + 2],
                self.cdb[4 * i + 3],
            ])
        };
        RawBhs {
            opcode: 0x01,
            immediate: self.immediate,
            flags: flag(self.final_bit, FINAL_BIT)
                | flag(self.read, 0x40)
                | flag(self.write, 0x20)
                | (self.attr.to_u8() & 0x07),
            lun_field: self.lun.0,
            itt: self.itt,
            words: [
                self.expected_data_transfer_length,
                self.cmd_sn,
                self.exp_stat_sn,
                word(0),
                word(1),
                word(2),
                word(3),
            ],
            ..RawBhs::default()
        }
    }
}

/// Task Management Function Request (opcode 0x02).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskMgmtRequest {
    /// The I bit.
    pub immediate: bool,
    /// The function (7 bits).
    pub function: TmfFunction,
    /// LUN the function applies to.
    pub lun: Lun,
    /// Initiator Task Tag of this request.
    pub itt: u32,
    /// ITT of the task to abort (ABORT TASK, TASK REASSIGN), else 0xffffffff.
    pub referenced_task_tag: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// CmdSN of the referenced task (ABORT TASK).
    pub ref_cmd_sn: u32,
    /// ExpDataSN (TASK REASSIGN).
    pub exp_data_sn: u32,
}

impl TaskMgmtRequest {
    pub(crate) fn from_raw(r: &RawBhs) -> Self {
        TaskMgmtRequest {
            immediate: r.immediate,
            function: TmfFunction::from_u8(r.flags & 0x7f),
            lun: Lun(r.lun_field),
            itt: r.itt,
            referenced_task_tag: r.words[0],
            cmd_sn: r.words[1],
            exp_stat_sn: r.words[2],
            ref_cmd_sn: r.words[3],
            exp_data_sn: r.words[4],
        }
    }

    pub(crate) fn to_raw(self) -> RawBhs {
        RawBhs {
            opcode: 0x02,
            immediate: self.immediate,
            flags: FINAL_BIT | (self.function.to_u8() & 0x7f),
            lun_field: self.lun.0,
            itt: self.itt,
            words: [
                self.referenced_task_tag,
                self.cmd_sn,
                self.exp_stat_sn,
                self.ref_cmd_sn,
                self.exp_data_sn,
                0,
                0,
            ],
            ..RawBhs::default()
        }
    }
}

/// Login Request (opcode 0x03; the I bit is always set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginRequest {
    /// T: the initiator is ready to move to `nsg`.
    pub transit: bool,
    /// C: the text continues in the next PDU.
    pub continue_bit: bool,
    /// Current stage.
    pub csg: Stage,
    /// Next stage (meaningful when `transit`).
    pub nsg: Stage,
    /// Version-max.
    pub version_max: u8,
    /// Version-min.
    pub version_min: u8,
    /// Initiator Session ID.
    pub isid: [u8; 6],
    /// Target Session Identifying Handle; 0 for a new session.
    pub tsih: u16,
    /// Initiator Task Tag.
    pub itt: u32,
    /// Connection ID.
    pub cid: u16,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

impl LoginRequest {
    pub(crate) fn from_raw(r: &RawBhs) -> Self {
        let (isid, tsih) = split_isid_tsih(&r.lun_field);
        LoginRequest {
            transit: r.flags & 0x80 != 0,
            continue_bit: r.flags & 0x40 != 0,
            csg: Stage::from_bits(r.flags >> 2),
            nsg: Stage::from_bits(r.flags),
            version_max: r.b2,
            version_min: r.b3,
            isid,
            tsih,
            itt: r.itt,
            cid: hi16(r.words[0]),
            cmd_sn: r.words[1],
            exp_stat_sn: r.words[2],
        }
    }

    pub(crate) fn to_raw(self) -> RawBhs {
        RawBhs {
            opcode: 0x03,
            immediate: true,
            flags: login_flags(self.transit, self.continue_bit, self.csg, self.nsg),
            b2: self.version_max,
            b3: self.version_min,
            lun_field: join_isid_tsih(&self.isid, self.tsih),
            itt: self.itt,
            words: [
                join16(self.cid, 0),
                self.cmd_sn,
                self.exp_stat_sn,
                0,
                0,
                0,
                0,
            ],
            ..RawBhs::default()
        }
    }
}

/// Text Request (opcode 0x04).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextRequest {
    /// The I bit.
    pub immediate: bool,
    /// F: the last PDU of this text request.
    pub final_bit: bool,
    /// C: the text continues in the next PDU.
    pub continue_bit: bool,
    /// LUN (reserved unless a key needs it).
    pub lun: Lun,
    /// Initiator Task Tag.
    pub itt: u32,
    /// 0xffffffff for a new request; the target's TTT when continuing one.
    pub ttt: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

impl TextRequest {
    pub(crate) fn from_raw(r: &RawBhs) -> Self {
        TextRequest {
            immediate: r.immediate,
            final_bit: r.flags & FINAL_BIT != 0,
            continue_bit: r.flags & 0x40 != 0,
            lun: Lun(r.lun_field),
            itt: r.itt,
            ttt: r.words[0],
            cmd_sn: r.words[1],
            exp_stat_sn: r.words[2],
        }
    }

    pub(crate) fn to_raw(self) -> RawBhs {
        RawBhs {
            opcode: 0x04,
            immediate: self.immediate,
            flags: flag(self.final_bit, FINAL_BIT) | flag(self.continue_bit, 0x40),
            lun_field: self.lun.0,
            itt: self.itt,
            words: [self.ttt, self.cmd_sn, self.exp_stat_sn, 0, 0, 0, 0],
            ..RawBhs::default()
        }
    }
}

/// SCSI Data-Out (opcode 0x05).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataOut {
    /// F: the last PDU of this sequence (unsolicited burst or R2T).
    pub final_bit: bool,
    /// LUN, copied from the R2T (reserved for unsolicited data).
    pub lun: Lun,
    /// ITT of the command.
    pub itt: u32,
    /// TTT of the R2T, or 0xffffffff for unsolicited data.
    pub ttt: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// DataSN, counted per R2T (or per unsolicited burst).
    pub data_sn: u32,
    /// Offset of this payload within the command's data.
    pub buffer_offset: u32,
}

impl DataOut {
    pub(crate) fn from_raw(r: &RawBhs) -> Self {
        DataOut {
            final_bit: r.flags & FINAL_BIT != 0,
            lun: Lun(r.lun_field),
            itt: r.itt,
            ttt: r.words[0],
            exp_stat_sn: r.words[2],
            data_sn: r.words[4],
            buffer_offset: r.words[5],
        }
    }

    pub(crate) fn to_raw(self) -> RawBhs {
        RawBhs {
            opcode: 0x05,
            flags: flag(self.final_bit, FINAL_BIT),
            lun_field: self.lun.0,
            itt: self.itt,
            words: [
                self.ttt,
                0,
                self.exp_stat_sn,
                0,
                self.data_sn,
                self.buffer_offset,
                0,
            ],
            ..RawBhs::default()
        }
    }
}

/// Logout Request (opcode 0x06).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogoutRequest {
    /// The I bit.
    pub immediate: bool,
    /// Reason code (7 bits).
    pub reason: LogoutReason,
    /// Initiator Task Tag.
    pub itt: u32,
    /// CID of the connection to close (reserved when closing the session).
    pub cid: u16,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

impl LogoutRequest {
    pub(crate) fn from_raw(r: &RawBhs) -> Self {
        LogoutRequest {
            immediate: r.immediate,
            reason: LogoutReason::from_u8(r.flags & 0x7f),
            itt: r.itt,
            cid: hi16(r.words[0]),
            cmd_sn: r.words[1],
            exp_stat_sn: r.words[2],
        }
    }

    pub(crate) fn to_raw(self) -> RawBhs {
        RawBhs {
            opcode: 0x06,
            immediate: self.immediate,
            flags: FINAL_BIT | (self.reason.to_u8() & 0x7f),
            itt: self.itt,
            words: [
                join16(self.cid, 0),
                self.cmd_sn,
                self.exp_stat_sn,
                0,
                0,
                0,
                0,
            ],
            ..RawBhs::default()
        }
    }
}

/// SNACK Request (opcode 0x10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnackRequest {
    /// SNACK type (4 bits).
    pub snack_type: SnackType,
    /// LUN (DataACK).
    pub lun: Lun,
    /// ITT of the task, or 0xffffffff for Status SNACK.
    pub itt: u32,
    /// TTT (DataACK) or SNACK Tag (R-Data SNACK).
    pub ttt_or_snack_tag: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// First missed DataSN, R2TSN or StatSN.
    pub beg_run: u32,
    /// Number of missed PDUs; 0 means all from `beg_run` on.
    pub run_length: u32,
}

impl SnackRequest {
    pub(crate) fn from_raw(r: &RawBhs) -> Self {
        SnackRequest {
            snack_type: SnackType::from_u8(r.flags & 0x0f),
            lun: Lun(r.lun_field),
            itt: r.itt,
            ttt_or_snack_tag: r.words[0],
            exp_stat_sn: r.words[2],
            beg_run: r.words[5],
            run_length: r.words[6],
        }
    }

    pub(crate) fn to_raw(self) -> RawBhs {
        RawBhs {
            opcode: 0x10,
            flags: FINAL_BIT | (self.snack_type.to_u8() & 0x0f),
            lun_field: self.lun.0,
            itt: self.itt,
            words: [
                self.ttt_or_snack_tag,
                0,
                self.exp_stat_sn,
                0,
                0,
                self.beg_run,
                self.run_length,
            ],
            ..RawBhs::default()
        }
    }
}

/// Sets `bit` when `on`.
pub(crate) fn flag(on: bool, bit: u8) -> u8 {
    if on {
        bit
    } else {
        0
    }
}

/// Byte 1 of Login Request and Response.
pub(crate) fn login_flags(transit: bool, cont: bool, csg: Stage, nsg: Stage) -> u8 {
    flag(transit, 0x80) | flag(cont, 0x40) | (csg.bits() << 2) | nsg.bits()
}

/// Splits bytes 8..16 of a login PDU into ISID and TSIH.
pub(crate) fn split_isid_tsih(field: &[u8; 8]) -> ([u8; 6], u16) {
    let mut isid = [0u8; 6];
    isid.copy_from_slice(&field[..6]);
    (isid, u16::from_be_bytes([field[6], field[7]]))
}

/// Joins ISID and TSIH into bytes 8..16 of a login PDU.
pub(crate) fn join_isid_tsih(isid: &[u8; 6], tsih: u16) -> [u8; 8] {
    let mut field = [0u8; 8];
    field[..6].copy_from_slice(isid);
    field[6..].copy_from_slice(&tsih.to_be_bytes());
    field
}
