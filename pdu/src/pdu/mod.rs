//! iSCSI PDUs (RFC 7143 §11): typed headers, additional header segments,
//! data segments, and their encoding with padding and digests.

mod ahs;
pub mod codes;
mod initiator;
pub(crate) mod raw;
mod target;

use bytes::Bytes;

pub use ahs::{Ahs, AHS_BIDI_READ_LENGTH, AHS_EXTENDED_CDB};
pub use initiator::{
    DataOut, LoginRequest, LogoutRequest, NopOut, ScsiCommand, SnackRequest, TaskMgmtRequest,
    TextRequest,
};
pub use raw::BHS_LEN;
pub use target::{
    AsyncMessage, DataIn, LoginResponse, LogoutResponse, NopIn, R2t, Reject, ScsiResponse,
    TaskMgmtResponse, TextResponse, RESERVED_TAG,
};

use crate::digest::{crc32c_digest, Digests, DIGEST_LEN};
use crate::error::DecodeError;
use raw::RawBhs;

/// The eight-byte LUN field as it travels (SAM-5 encoding; see `Lun::from_index`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lun(pub [u8; 8]);

impl Lun {
    /// Encodes a LUN number with SAM peripheral addressing (below 256) or
    /// flat space addressing (below 16384), as Linux and libiscsi expect.
    pub fn from_index(index: u16) -> Lun {
        let mut b = [0u8; 8];
        if index < 256 {
            b[1] = index as u8;
        } else {
            let v = 0x4000 | (index & 0x3fff);
            b[..2].copy_from_slice(&v.to_be_bytes());
        }
        Lun(b)
    }

    /// Decodes a LUN in peripheral or flat space addressing; `None` for other
    /// addressing methods or multi-level LUNs, which blockwire does not expose.
    pub fn index(&self) -> Option<u16> {
        if self.0[2..].iter().any(|&b| b != 0) {
            return None;
        }
        match self.0[0] >> 6 {
            0 if self.0[0] == 0 => Some(u16::from(self.0[1])),
            1 => Some(u16::from_be_bytes([self.0[0] & 0x3f, self.0[1]])),
            _ => None,
        }
    }
}

/// iSCSI opcodes (RFC 7143 §11.2.1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// NOP-Out.
    NopOut = 0x00,
    /// SCSI Command.
    ScsiCommand = 0x01,
    /// Task Management Function Request.
    TaskMgmtRequest = 0x02,
    /// Login Request.
    LoginRequest = 0x03,
    /// Text Request.
    TextRequest = 0x04,
    /// SCSI Data-Out.
    DataOut = 0x05,
    /// Logout Request.
    LogoutRequest = 0x06,
    /// SNACK Request.
    SnackRequest = 0x10,
    /// NOP-In.
    NopIn = 0x20,
    /// SCSI Response.
    ScsiResponse = 0x21,
    /// Task Management Function Response.
    TaskMgmtResponse = 0x22,
    /// Login Response.
    LoginResponse = 0x23,
    /// Text Response.
    TextResponse = 0x24,
    /// SCSI Data-In.
    DataIn = 0x25,
    /// Logout Response.
    LogoutResponse = 0x26,
    /// Ready To Transfer.
    R2t = 0x31,
    /// Asynchronous Message.
    AsyncMessage = 0x32,
    /// Reject.
    Reject = 0x3f,
}

impl Opcode {
    /// Decodes the six opcode bits; `None` for reserved and vendor opcodes.
    pub fn from_u8(value: u8) -> Option<Opcode> {
        use Opcode::*;
        Some(match value & 0x3f {
            0x00 => NopOut,
            0x01 => ScsiCommand,
            0x02 => TaskMgmtRequest,
            0x03 => LoginRequest,
            0x04 => TextRequest,
            0x05 => DataOut,
            0x06 => LogoutRequest,
            0x10 => SnackRequest,
            0x20 => NopIn,
            0x21 => ScsiResponse,
            0x22 => TaskMgmtResponse,
            0x23 => LoginResponse,
            0x24 => TextResponse,
            0x25 => DataIn,
            0x26 => LogoutResponse,
            0x31 => R2t,
            0x32 => AsyncMessage,
            0x3f => Reject,
            _ => return None,
        })
    }

    /// Whether the initiator sends this opcode.
    pub fn is_initiator_opcode(self) -> bool {
        (self as u8) < 0x20
    }
}

/// A typed Basic Header Segment: one variant per PDU of RFC 7143.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Bhs {
    NopOut(NopOut),
    ScsiCommand(ScsiCommand),
    TaskMgmtRequest(TaskMgmtRequest),
    LoginRequest(LoginRequest),
    TextRequest(TextRequest),
    DataOut(DataOut),
    LogoutRequest(LogoutRequest),
    SnackRequest(SnackRequest),
    NopIn(NopIn),
    ScsiResponse(ScsiResponse),
    TaskMgmtResponse(TaskMgmtResponse),
    LoginResponse(LoginResponse),
    TextResponse(TextResponse),
    DataIn(DataIn),
    LogoutResponse(LogoutResponse),
    R2t(R2t),
    AsyncMessage(AsyncMessage),
    Reject(Reject),
}

impl Bhs {
    /// The opcode of this header.
    pub fn opcode(&self) -> Opcode {
        match self {
            Bhs::NopOut(_) => Opcode::NopOut,
            Bhs::ScsiCommand(_) => Opcode::ScsiCommand,
            Bhs::TaskMgmtRequest(_) => Opcode::TaskMgmtRequest,
            Bhs::LoginRequest(_) => Opcode::LoginRequest,
            Bhs::TextRequest(_) => Opcode::TextRequest,
            Bhs::DataOut(_) => Opcode::DataOut,
            Bhs::LogoutRequest(_) => Opcode::LogoutRequest,
            Bhs::SnackRequest(_) => Opcode::SnackRequest,
            Bhs::NopIn(_) => Opcode::NopIn,
            Bhs::ScsiResponse(_) => Opcode::ScsiResponse,
            Bhs::TaskMgmtResponse(_) => Opcode::TaskMgmtResponse,
            Bhs::LoginResponse(_) => Opcode::LoginResponse,
            Bhs::TextResponse(_) => Opcode::TextResponse,
            Bhs::DataIn(_) => Opcode::DataIn,
            Bhs::LogoutResponse(_) => Opcode::LogoutResponse,
            Bhs::R2t(_) => Opcode::R2t,
            Bhs::AsyncMessage(_) => Opcode::AsyncMessage,
            Bhs::Reject(_) => Opcode::Reject,
        }
    }

    /// The Initiator Task Tag (0xffffffff in unsolicited target PDUs).
    pub fn itt(&self) -> u32 {
        self.to_raw().itt
    }

    fn from_raw(raw: &RawBhs) -> Result<Bhs, DecodeError> {
        let op = Opcode::from_u8(raw.opcode).ok_or(DecodeError::UnknownOpcode(raw.opcode))?;
        Ok(match op {
            Opcode::NopOut => Bhs::NopOut(NopOut::from_raw(raw)),
            Opcode::ScsiCommand => Bhs::ScsiCommand(ScsiCommand::from_raw(raw)),
            Opcode::TaskMgmtRequest => Bhs::TaskMgmtRequest(TaskMgmtRequest::from_raw(raw)),
            Opcode::LoginRequest => Bhs::LoginRequest(LoginRequest::from_raw(raw)),
            Opcode::TextRequest => Bhs::TextRequest(TextRequest::from_raw(raw)),
            Opcode::DataOut => Bhs::DataOut(DataOut::from_raw(raw)),
            Opcode::LogoutRequest => Bhs::LogoutRequest(LogoutRequest::from_raw(raw)),
            Opcode::SnackRequest => Bhs::SnackRequest(SnackRequest::from_raw(raw)),
            Opcode::NopIn => Bhs::NopIn(NopIn::from_raw(raw)),
            Opcode::ScsiResponse => Bhs::ScsiResponse(ScsiResponse::from_raw(raw)),
            Opcode::TaskMgmtResponse => Bhs::TaskMgmtResponse(TaskMgmtResponse::from_raw(raw)),
            Opcode::LoginResponse => Bhs::LoginResponse(LoginResponse::from_raw(raw)),
            Opcode::TextResponse => Bhs::TextResponse(TextResponse::from_raw(raw)),
            Opcode::DataIn => Bhs::DataIn(DataIn::from_raw(raw)),
            Opcode::LogoutResponse => Bhs::LogoutResponse(LogoutResponse::from_raw(raw)),
            Opcode::R2t => Bhs::R2t(R2t::from_raw(raw)),
            Opcode::AsyncMessage => Bhs::AsyncMessage(AsyncMessage::from_raw(raw)),
            Opcode::Reject => Bhs::Reject(Reject::from_raw(raw)),
        })
    }

    fn to_raw(self) -> RawBhs {
        match self {
            Bhs::NopOut(p) => p.to_raw(),
            Bhs::ScsiCommand(p) => p.to_raw(),
            Bhs::TaskMgmtRequest(p) => p.to_raw(),
            Bhs::LoginRequest(p) => p.to_raw(),
            Bhs::TextRequest(p) => p.to_raw(),
            Bhs::DataOut(p) => p.to_raw(),
            Bhs::LogoutRequest(p) => p.to_raw(),
            Bhs::SnackRequest(p) => p.to_raw(),
            Bhs::NopIn(p) => p.to_raw(),
            Bhs::ScsiResponse(p) => p.to_raw(),
            Bhs::TaskMgmtResponse(p) => p.to_raw(),
            Bhs::LoginResponse(p) => p.to_raw(),
            Bhs::TextResponse(p) => p.to_raw(),
            Bhs::DataIn(p) => p.to_raw(),
            Bhs::LogoutResponse(p) => p.to_raw(),
            Bhs::R2t(p) => p.to_raw(),
            Bhs::AsyncMessage(p) => p.to_raw(),
            Bhs::Reject(p) => p.to_raw(),
        }
    }

    /// Encodes the 48 header bytes with the given AHS and data segment lengths.
    pub fn encode(&self, total_ahs_words: u8, data_segment_length: u32) -> [u8; BHS_LEN] {
        let mut raw = self.to_raw();
        raw.total_ahs_words = total_ahs_words;
        raw.data_segment_length = data_segment_length & 0x00ff_ffff;
        raw.to_bytes()
    }

    /// Decodes 48 header bytes.
    pub fn decode(bytes: &[u8]) -> Result<(Bhs, HeaderLengths), DecodeError> {
        let (_, raw) = RawBhs::parse(bytes).map_err(|_| DecodeError::Truncated {
            need: BHS_LEN.saturating_sub(bytes.len()),
        })?;
        let lengths = HeaderLengths {
            ahs_len: usize::from(raw.total_ahs_words) * 4,
            data_segment_length: raw.data_segment_length,
        };
        Ok((Bhs::from_raw(&raw)?, lengths))
    }
}

/// The lengths a BHS declares for what follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderLengths {
    /// Bytes of additional header segments (TotalAHSLength × 4).
    pub ahs_len: usize,
    /// DataSegmentLength, without padding.
    pub data_segment_length: u32,
}

impl HeaderLengths {
    /// Reads the lengths straight from the first 8 header bytes, before any
    /// other parsing: the framing layer bounds the PDU with this.
    pub fn peek(bytes: &[u8]) -> Option<HeaderLengths> {
        let b = bytes.get(..8)?;
        Some(HeaderLengths {
            ahs_len: usize::from(b[4]) * 4,
            data_segment_length: u32::from_be_bytes([0, b[5], b[6], b[7]]),
        })
    }

    /// Bytes on the wire after the BHS: AHS, header digest, padded data, data digest.
    pub fn wire_len_after_bhs(&self, digests: Digests) -> usize {
        let data = self.data_segment_length as usize;
        self.ahs_len
            + if digests.header { DIGEST_LEN } else { 0 }
            + padded_len(data)
            + if digests.data && data > 0 {
                DIGEST_LEN
            } else {
                0
            }
    }
}

/// `len` rounded up to a multiple of 4 (RFC 7143 §11.2.3: segments are padded).
pub fn padded_len(len: usize) -> usize {
    (len + 3) & !3
}

/// A whole PDU: header, additional header segments and data segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pdu {
    /// The typed Basic Header Segment.
    pub bhs: Bhs,
    /// Additional header segments, in wire order.
    pub ahs: Vec<Ahs>,
    /// The data segment without padding.
    pub data: Bytes,
}

impl Pdu {
    /// A PDU with no AHS and no data.
    pub fn new(bhs: Bhs) -> Pdu {
        Pdu {
            bhs,
            ahs: Vec::new(),
            data: Bytes::new(),
        }
    }

    /// A PDU with a data segment.
    pub fn with_data(bhs: Bhs, data: impl Into<Bytes>) -> Pdu {
        Pdu {
            bhs,
            ahs: Vec::new(),
            data: data.into(),
        }
    }

    /// Encodes the PDU onto the end of `out`.
    ///
    /// Panics if the data segment exceeds 2^24-1 bytes, which no negotiated
    /// MaxRecvDataSegmentLength allows: that is a bug in the caller.
    pub fn encode_into(&self, out: &mut Vec<u8>, digests: Digests) {
        assert!(
            self.data.len() <= 0x00ff_ffff,
            "data segment of {} bytes exceeds the 24-bit DataSegmentLength",
            self.data.len()
        );
        out.extend_from_slice(&encode_header(
            &self.bhs,
            &self.ahs,
            self.data.len() as u32,
            digests,
        ));
        if !self.data.is_empty() {
            out.extend_from_slice(&self.data);
            let pad = padded_len(self.data.len()) - self.data.len();
            out.extend_from_slice(&[0u8; 3][..pad]);
            if digests.data {
                out.extend_from_slice(&data_digest(&self.data));
            }
        }
    }

    /// Encodes the PDU into a new buffer.
    pub fn encode(&self, digests: Digests) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(BHS_LEN + 8 + padded_len(self.data.len()) + 2 * DIGEST_LEN);
        self.encode_into(&mut out, digests);
        out
    }

    /// Decodes one complete PDU that starts at the beginning of `bytes`,
    /// returning it and the number of bytes it occupied. Use
    /// [`crate::FrameDecoder`] on a stream: it bounds lengths first.
    pub fn decode(bytes: &[u8], digests: Digests) -> Result<(Pdu, usize), DecodeError> {
        let (bhs, ahs, data, total) = Self::parse(bytes, digests)?;
        let data = Bytes::copy_from_slice(&bytes[data]);
        Ok((Pdu { bhs, ahs, data }, total))
    }

    /// Like [`Pdu::decode`], but the data segment shares `bytes`' memory
    /// instead of being copied: a receiver that reads a whole PDU into a
    /// buffer hands its payload on without another copy.
    pub fn decode_shared(bytes: &Bytes, digests: Digests) -> Result<(Pdu, usize), DecodeError> {
        let (bhs, ahs, data, total) = Self::parse(bytes, digests)?;
        Ok((
            Pdu {
                bhs,
                ahs,
                data: bytes.slice(data),
            },
            total,
        ))
    }

    /// Checks lengths and digests and decodes the headers; returns where the
    /// data segment lies and the PDU's length on the wire.
    fn parse(
        bytes: &[u8],
        digests: Digests,
    ) -> Result<(Bhs, Vec<Ahs>, std::ops::Range<usize>, usize), DecodeError> {
        let lengths = HeaderLengths::peek(bytes).ok_or(DecodeError::Truncated {
            need: BHS_LEN.saturating_sub(bytes.len()),
        })?;
        let total = BHS_LEN + lengths.wire_len_after_bhs(digests);
        if bytes.len() < total {
            return Err(DecodeError::Truncated {
                need: total - bytes.len(),
            });
        }
        let header_end = BHS_LEN + lengths.ahs_len;
        let mut at = header_end;
        if digests.header {
            let expected = crc32c_digest(&bytes[..header_end]);
            let got = read_digest(&bytes[at..at + DIGEST_LEN]);
            if expected != got {
                return Err(DecodeError::HeaderDigest { expected, got });
            }
            at += DIGEST_LEN;
        }
        let data_len = lengths.data_segment_length as usize;
        let data = at..at + data_len;
        at += padded_len(data_len);
        if digests.data && data_len > 0 {
            let expected = crc32c_digest(&bytes[at - padded_len(data_len)..at]);
            let got = read_digest(&bytes[at..at + DIGEST_LEN]);
            if expected != got {
                return Err(DecodeError::DataDigest {
                    expected,
                    got,
                    pdu_len: total,
                });
            }
            at += DIGEST_LEN;
        }
        debug_assert_eq!(at, total);
        let (bhs, _) = Bhs::decode(&bytes[..BHS_LEN])?;
        let ahs = Ahs::decode_all(&bytes[BHS_LEN..header_end])?;
        Ok((bhs, ahs, data, total))
    }

    /// The full CDB of a SCSI Command: the 16 header bytes followed by the
    /// Extended CDB AHS, if any.
    pub fn full_cdb(&self) -> Option<Vec<u8>> {
        let Bhs::ScsiCommand(cmd) = &self.bhs else {
            return None;
        };
        let mut cdb = cmd.cdb.to_vec();
        for ahs in &self.ahs {
            if let Ahs::ExtendedCdb(rest) = ahs {
                cdb.extend_from_slice(rest);
            }
        }
        Some(cdb)
    }
}

/// Encodes BHS, AHS and (if negotiated) the header digest for a PDU whose
/// data segment of `data_len` bytes the caller sends separately, e.g. straight
/// from a file or a registered buffer.
pub fn encode_header(bhs: &Bhs, ahs: &[Ahs], data_len: u32, digests: Digests) -> Vec<u8> {
    let mut out = Vec::with_capacity(BHS_LEN + 8 + DIGEST_LEN);
    out.extend_from_slice(&[0u8; BHS_LEN]);
    for a in ahs {
        a.encode_into(&mut out);
    }
    let ahs_words = (out.len() - BHS_LEN) / 4;
    assert!(
        ahs_words <= 255,
        "AHS of {ahs_words} words exceeds TotalAHSLength"
    );
    let header = bhs.encode(ahs_words as u8, data_len);
    out[..BHS_LEN].copy_from_slice(&header);
    if digests.header {
        let d = crc32c_digest(&out);
        out.extend_from_slice(&d.to_le_bytes());
    }
    out
}

/// The data digest bytes of a data segment (covering its padding).
pub fn data_digest(data: &[u8]) -> [u8; DIGEST_LEN] {
    let pad = padded_len(data.len()) - data.len();
    let mut crc = crc32c::crc32c(data);
    crc = crc32c::crc32c_append(crc, &[0u8; 3][..pad]);
    crc.to_le_bytes()
}

fn read_digest(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}
