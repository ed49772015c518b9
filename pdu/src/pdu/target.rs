//! PDUs sent by the target (RFC 7143 §11, opcodes 0x20-0x3f).

use super::codes::{
    AsyncEvent, LoginStatus, LogoutResponseCode, RejectReason, ServiceResponse, Stage, TmfResponse,
};
use super::initiator::{flag, join_isid_tsih, login_flags, split_isid_tsih};
use super::raw::{hi16, join16, lo16, RawBhs, FINAL_BIT};
use super::Lun;

/// The reserved Initiator Task Tag value of unsolicited target PDUs.
pub const RESERVED_TAG: u32 = 0xffff_ffff;

/// NOP-In (opcode 0x20): the answer to a NOP-Out, or a ping from the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NopIn {
    /// LUN.
    pub lun: Lun,
    /// ITT of the NOP-Out answered, or 0xffffffff for a target ping.
    pub itt: u32,
    /// TTT the initiator must echo, or 0xffffffff when no answer is wanted.
    pub ttt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
}

impl NopIn {
    pub(crate) fn from_raw(r: &RawBhs) -> Self {
        NopIn {
            lun: Lun(r.lun_field),
            itt: r.itt,
            ttt: r.words[0],
            stat_sn: r.words[1],
            exp_cmd_sn: r.words[2],
            max_cmd_sn: r.words[3],
        }
    }

    pub(crate) fn to_raw(self) -> RawBhs {
        RawBhs {
            opcode: 0x20,
            flags: FINAL_BIT,
            lun_field: self.lun.0,
            itt: self.itt,
            words: [
                self.ttt,
                self.stat_sn,
                self.exp_cmd_sn,
                self.max_cmd_sn,
                0,
                0,
                0,
            ],
            ..RawBhs::default()
        }
    }
}

/// SCSI Response (opcode 0x21).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScsiResponse {
    /// o: bidirectional read residual overflow.
    pub bidi_read_overflow: bool,
    /// u: bidirectional read residual underflow.
    pub bidi_read_underflow: bool,
    /// O: residual overflow.
    pub overflow: bool,
    /// U: residual underflow.
    pub underflow: bool,
    /// iSCSI service response.
    pub response: ServiceResponse,
    /// SCSI status (valid when the command completed at the target).
    pub status: u8,
    /// ITT of the command.
    pub itt: u32,
    /// SNACK Tag (0 unless answering an R-Data SNACK).
    pub snack_tag: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// ExpDataSN: the number of Data-In (and R2T) PDUs sent for the command.
    pub exp_data_sn: u32,
    /// Bidirectional read residual count.
    pub bidi_read_residual_count: u32,
    /// Residual count.
    pub residual_count: u32,
}

impl ScsiResponse {
    pub(crate) fn from_raw(r: &RawBhs) -> Self {
        ScsiResponse {
            bidi_read_overflow: r.flags & 0x10 != 0,
            bidi_read_underflow: r.flags & 0x08 != 0,
            overflow: r.flags & 0x04 != 0,
            underflow: r.flags & 0x02 != 0,
            response: ServiceResponse::from_u8(r.b2),
            status: r.b3,
            itt: r.itt,
            snack_tag: r.words[0],
            stat_sn: r.words[1],
            exp_cmd_sn: r.words[2],
            max_cmd_sn: r.words[3],
            exp_data_sn: r.words[4],
            bidi_read_residual_count: r.words[5],
            residual_count: r.words[6],
        }
    }

    pub(crate) fn to_raw(self) -> RawBhs {
        RawBhs {
            opcode: 0x21,
            flags: FINAL_BIT
                | flag(self.bidi_read_overflow, 0x10)
                | flag(self.bidi_read_underflow, 0x08)
                | flag(self.overflow, 0x04)
                | flag(self.underflow, 0x02),
            b2: self.response.to_u8(),
            b3: self.status,
            itt: self.itt,
            words: [
                self.snack_tag,
                self.stat_sn,
                self.exp_cmd_sn,
                self.max_cmd_sn,
                self.exp_data_sn,
                self.bidi_read_residual_count,
                self.residual_count,
            ],
            ..RawBhs::default()
        }
    }
}

/// Task Management Function Response (opcode 0x22).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskMgmtResponse {
    /// Response code.
    pub response: TmfResponse,
    /// ITT of the TMF request.
    pub itt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
}

impl TaskMgmtResponse {
    pub(crate) fn from_raw(r: &RawBhs) -> Self {
        TaskMgmtResponse {
            response: TmfResponse::from_u8(r.b2),
            itt: r.itt,
            stat_sn: r.words[1],
            exp_cmd_sn: r.words[2],
            max_cmd_sn: r.words[3],
        }
    }

    pub(crate) fn to_raw(self) -> RawBhs {
        RawBhs {
            opcode: 0x22,
            flags: FINAL_BIT,
            b2: self.response.to_u8(),
            itt: self.itt,
            words: [0, self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn, 0, 0, 0],
            ..RawBhs::default()
        }
    }
}

/// Login Response (opcode 0x23).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginResponse {
    /// T: the target agrees to move to `nsg`.
    pub transit: bool,
    /// C: the text continues in the next PDU.
    pub continue_bit: bool,
    /// Current stage.
    pub csg: Stage,
    /// Next stage.
    pub nsg: Stage,
    /// Version-max.
    pub version_max: u8,
    /// Version-active.
    pub version_active: u8,
    /// ISID echoed from the request.
    pub isid: [u8; 6],
    /// TSIH; set by the target in the final response of a new session.
    pub tsih: u16,
    /// ITT echoed from the request.
    pub itt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// Status-Class and Status-Detail.
    pub status: LoginStatus,
}

impl LoginResponse {
    pub(crate) fn from_raw(r: &RawBhs) -> Self {
        let (isid, tsih) = split_isid_tsih(&r.lun_field);
        LoginResponse {
            transit: r.flags & 0x80 != 0,
            continue_bit: r.flags & 0x40 != 0,
            csg: Stage::from_bits(r.flags >> 2),
            nsg: Stage::from_bits(r.flags),
            version_max: r.b2,
            version_active: r.b3,
            isid,
            tsih,
            itt: r.itt,
            stat_sn: r.words[1],
            exp_cmd_sn: r.words[2],
            max_cmd_sn: r.words[3],
            status: LoginStatus::new((r.words[4] >> 24) as u8, (r.words[4] >> 16) as u8),
        }
    }

    pub(crate) fn to_raw(self) -> RawBhs {
        RawBhs {
            opcode: 0x23,
            flags: login_flags(self.transit, self.continue_bit, self.csg, self.nsg),
            b2: self.version_max,
            b3: self.version_active,
            lun_field: join_isid_tsih(&self.isid, self.tsih),
            itt: self.itt,
            words: [
                0,
                self.stat_sn,
                self.exp_cmd_sn,
                self.max_cmd_sn,
                (u32::from(self.status.class) << 24) | (u32::from(self.status.detail) << 16),
                0,
                0,
            ],
            ..RawBhs::default()
        }
    }
}

/// Text Response (opcode 0x24).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextResponse {
    /// F: the last PDU of the response.
    pub final_bit: bool,
    /// C: the text continues in the next PDU.
    pub continue_bit: bool,
    /// LUN.
    pub lun: Lun,
    /// ITT echoed from the request.
    pub itt: u32,
    /// TTT: 0xffffffff when final, else a tag the initiator echoes to continue.
    pub ttt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
}

impl TextResponse {
    pub(crate) fn from_raw(r: &RawBhs) -> Self {
        TextResponse {
            final_bit: r.flags & FINAL_BIT != 0,
            continue_bit: r.flags & 0x40 != 0,
            lun: Lun(r.lun_field),
            itt: r.itt,
            ttt: r.words[0],
            stat_sn: r.words[1],
            exp_cmd_sn: r.words[2],
            max_cmd_sn: r.words[3],
        }
    }

    pub(crate) fn to_raw(self) -> RawBhs {
        RawBhs {
            opcode: 0x24,
            flags: flag(self.final_bit, FINAL_BIT) | flag(self.continue_bit, 0x40),
            lun_field: self.lun.0,
            itt: self.itt,
            words: [
                self.ttt,
                self.stat_sn,
                self.exp_cmd_sn,
                self.max_cmd_sn,
                0,
                0,
                0,
            ],
            ..RawBhs::default()
        }
    }
}

/// SCSI Data-In (opcode 0x25).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataIn {
    /// F: the last PDU of the sequence.
    pub final_bit: bool,
    /// A: the target asks for a DataACK (ERL > 0).
    pub acknowledge: bool,
    /// O: residual overflow (valid with status).
    pub overflow: bool,
    /// U: residual underflow (valid with status).
    pub underflow: bool,
    /// The S bit and SCSI status: `Some` when this PDU carries the command's status
    /// (phase collapse).
    pub status: Option<u8>,
    /// LUN (when A is set), else reserved.
    pub lun: Lun,
    /// ITT of the command.
    pub itt: u32,
    /// TTT (when A is set), else 0xffffffff.
    pub ttt: u32,
    /// StatSN (valid with status).
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// DataSN.
    pub data_sn: u32,
    /// Offset of this payload within the command's data.
    pub buffer_offset: u32,
    /// Residual count (valid with status).
    pub residual_count: u32,
}

impl DataIn {
    pub(crate) fn from_raw(r: &RawBhs) -> Self {
        DataIn {
            final_bit: r.flags & FINAL_BIT != 0,
            acknowledge: r.flags & 0x40 != 0,
            overflow: r.flags & 0x04 != 0,
            underflow: r.flags & 0x02 != 0,
            status: (r.flags & 0x01 != 0).then_some(r.b3),
            lun: Lun(r.lun_field),
            itt: r.itt,
            ttt: r.words[0],
            stat_sn: r.words[1],
            exp_cmd_sn: r.words[2],
            max_cmd_sn: r.words[3],
            data_sn: r.words[4],
            buffer_offset: r.words[5],
            residual_count: r.words[6],
        }
    }

    pub(crate) fn to_raw(self) -> RawBhs {
        RawBhs {
            opcode: 0x25,
            flags: flag(self.final_bit, FINAL_BIT)
                | flag(self.acknowledge, 0x40)
                | flag(self.overflow, 0x04)
                | flag(self.underflow, 0x02)
                | flag(self.status.is_some(), 0x01),
            b3: self.status.unwrap_or(0),
            lun_field: self.lun.0,
            itt: self.itt,
            words: [
                self.ttt,
                self.stat_sn,
                self.exp_cmd_sn,
                self.max_cmd_sn,
                self.data_sn,
                self.buffer_offset,
                self.residual_count,
            ],
            ..RawBhs::default()
        }
    }
}

/// Logout Response (opcode 0x26).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogoutResponse {
    /// Response code.
    pub response: LogoutResponseCode,
    /// ITT echoed from the request.
    pub itt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// Time2Wait in seconds.
    pub time2wait: u16,
    /// Time2Retain in seconds.
    pub time2retain: u16,
}

impl LogoutResponse {
    pub(crate) fn from_raw(r: &RawBhs) -> Self {
        LogoutResponse {
            response: LogoutResponseCode::from_u8(r.b2),
            itt: r.itt,
            stat_sn: r.words[1],
            exp_cmd_sn: r.words[2],
            max_cmd_sn: r.words[3],
            time2wait: hi16(r.words[5]),
            time2retain: lo16(r.words[5]),
        }
    }

    pub(crate) fn to_raw(self) -> RawBhs {
        RawBhs {
            opcode: 0x26,
            flags: FINAL_BIT,
            b2: self.response.to_u8(),
            itt: self.itt,
            words: [
                0,
                self.stat_sn,
                self.exp_cmd_sn,
                self.max_cmd_sn,
                0,
                join16(self.time2wait, self.time2retain),
                0,
            ],
            ..RawBhs::default()
        }
    }
}

/// Ready To Transfer (opcode 0x31).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct R2t {
    /// LUN.
    pub lun: Lun,
    /// ITT of the command.
    pub itt: u32,
    /// Target Transfer Tag the Data-Out PDUs must carry.
    pub ttt: u32,
    /// StatSN (the next StatSN, not advanced by the R2T).
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// R2TSN, counted per command.
    pub r2t_sn: u32,
    /// Offset of the requested data.
    pub buffer_offset: u32,
    /// Desired Data Transfer Length (at most MaxBurstLength).
    pub desired_data_transfer_length: u32,
}

impl R2t {
    pub(crate) fn from_raw(r: &RawBhs) -> Self {
        R2t {
            lun: Lun(r.lun_field),
            itt: r.itt,
            ttt: r.words[0],
            stat_sn: r.words[1],
            exp_cmd_sn: r.words[2],
            max_cmd_sn: r.words[3],
            r2t_sn: r.words[4],
            buffer_offset: r.words[5],
            desired_data_transfer_length: r.words[6],
        }
    }

    pub(crate) fn to_raw(self) -> RawBhs {
        RawBhs {
            opcode: 0x31,
            flags: FINAL_BIT,
            lun_field: self.lun.0,
            itt: self.itt,
            words: [
                self.ttt,
                self.stat_sn,
                self.exp_cmd_sn,
                self.max_cmd_sn,
                self.r2t_sn,
                self.buffer_offset,
                self.desired_data_transfer_length,
            ],
            ..RawBhs::default()
        }
    }
}

/// Asynchronous Message (opcode 0x32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncMessage {
    /// LUN the event concerns (SCSI events).
    pub lun: Lun,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// AsyncEvent.
    pub event: AsyncEvent,
    /// AsyncVCode (vendor code).
    pub vcode: u8,
    /// Parameter1 (e.g. the CID for a connection drop, or Time2Wait... per event).
    pub parameter1: u16,
    /// Parameter2.
    pub parameter2: u16,
    /// Parameter3.
    pub parameter3: u16,
}

impl AsyncMessage {
    pub(crate) fn from_raw(r: &RawBhs) -> Self {
        AsyncMessage {
            lun: Lun(r.lun_field),
            stat_sn: r.words[1],
            exp_cmd_sn: r.words[2],
            max_cmd_sn: r.words[3],
            event: AsyncEvent::from_u8((r.words[4] >> 24) as u8),
            vcode: (r.words[4] >> 16) as u8,
            parameter1: lo16(r.words[4]),
            parameter2: hi16(r.words[5]),
            parameter3: lo16(r.words[5]),
        }
    }

    pub(crate) fn to_raw(self) -> RawBhs {
        RawBhs {
            opcode: 0x32,
            flags: FINAL_BIT,
            lun_field: self.lun.0,
            itt: RESERVED_TAG,
            words: [
                0,
                self.stat_sn,
                self.exp_cmd_sn,
                self.max_cmd_sn,
                (u32::from(self.event.to_u8()) << 24)
                    | (u32::from(self.vcode) << 16)
                    | u32::from(self.parameter1),
                join16(self.parameter2, self.parameter3),
                0,
            ],
            ..RawBhs::default()
        }
    }
}

/// Reject (opcode 0x3f). The data segment carries the rejected PDU's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reject {
    /// Reason.
    pub reason: RejectReason,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// DataSN/R2TSN (SNACK reject), else 0.
    pub data_sn_or_r2t_sn: u32,
}

impl Reject {
    pub(crate) fn from_raw(r: &RawBhs) -> Self {
        Reject {
            reason: RejectReason::from_u8(r.b2),
            stat_sn: r.words[1],
            exp_cmd_sn: r.words[2],
            max_cmd_sn: r.words[3],
            data_sn_or_r2t_sn: r.words[4],
        }
    }

    pub(crate) fn to_raw(self) -> RawBhs {
        RawBhs {
            opcode: 0x3f,
            flags: FINAL_BIT,
            b2: self.reason.to_u8(),
            itt: RESERVED_TAG,
            words: [
                0,
                self.stat_sn,
                self.exp_cmd_sn,
                self.max_cmd_sn,
                self.data_sn_or_r2t_sn,
                0,
                0,
            ],
            ..RawBhs::default()
        }
    }
}
