//! The 48-byte Basic Header Segment as untyped words.
//!
//! Every iSCSI PDU shares the same outer shape (RFC 7143 §11.2.1): an opcode
//! byte, three opcode-specific bytes, the AHS and data segment lengths, eight
//! LUN-or-specific bytes, the Initiator Task Tag and 28 opcode-specific bytes.
//! Bytes 20..48 are 32-bit aligned in every PDU, so they are held as seven
//! big-endian words and each typed PDU picks its fields out of them. This
//! keeps the byte layout in one place and the typed PDUs free of offsets.

use nom::bytes::complete::take;
use nom::number::complete::{be_u24, be_u32, be_u8};
use nom::sequence::tuple;
use nom::IResult;

/// Length of the Basic Header Segment.
pub const BHS_LEN: usize = 48;

/// The I bit: the command is delivered for immediate execution.
pub(crate) const IMMEDIATE_BIT: u8 = 0x40;
/// The F bit of byte 1 in most PDUs.
pub(crate) const FINAL_BIT: u8 = 0x80;

/// A Basic Header Segment split into its common fields and untyped words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RawBhs {
    /// Byte 0 without the I bit (the low six bits).
    pub opcode: u8,
    /// The I bit of byte 0.
    pub immediate: bool,
    /// Byte 1: F bit and opcode-specific flags.
    pub flags: u8,
    /// Bytes 2 and 3, opcode-specific.
    pub b2: u8,
    pub b3: u8,
    /// TotalAHSLength in 4-byte words.
    pub total_ahs_words: u8,
    /// DataSegmentLength in bytes, without padding.
    pub data_segment_length: u32,
    /// Bytes 8..16: the LUN or opcode-specific bytes (ISID and TSIH in login).
    pub lun_field: [u8; 8],
    /// Bytes 16..20.
    pub itt: u32,
    /// Bytes 20..48 as seven big-endian words; `words[0]` is bytes 20..24.
    pub words: [u32; 7],
}

impl RawBhs {
    /// Parses a BHS. The slice must hold at least 48 bytes.
    pub(crate) fn parse(input: &[u8]) -> IResult<&[u8], RawBhs> {
        let (rest, (b0, flags, b2, b3, total_ahs_words, data_segment_length, lun, itt)) =
            tuple((
                be_u8,
                be_u8,
                be_u8,
                be_u8,
                be_u8,
                be_u24,
                take(8usize),
                be_u32,
            ))(input)?;
        let (rest, (w0, w1, w2, w3, w4, w5, w6)) =
            tuple((be_u32, be_u32, be_u32, be_u32, be_u32, be_u32, be_u32))(rest)?;
        let mut lun_field = [0u8; 8];
        lun_field.copy_from_slice(lun);
        Ok((
            rest,
            RawBhs {
                opcode: b0 & 0x3f,
                immediate: b0 & IMMEDIATE_BIT != 0,
                flags,
                b2,
                b3,
                total_ahs_words,
                data_segment_length,
                lun_field,
                itt,
                words: [w0, w1, w2, w3, w4, w5, w6],
            },
        ))
    }

    /// Writes the 48 header bytes.
    pub(crate) fn to_bytes(self) -> [u8; BHS_LEN] {
        let mut out = [0u8; BHS_LEN];
        out[0] = (self.opcode & 0x3f) | if self.immediate { IMMEDIATE_BIT } else { 0 };
        out[1] = self.flags;
        out[2] = self.b2;
        out[3] = self.b3;
        out[4] = self.total_ahs_words;
        let dsl = self.data_segment_length.to_be_bytes();
        out[5..8].copy_from_slice(&dsl[1..4]);
        out[8..16].copy_from_slice(&self.lun_field);
        out[16..20].copy_from_slice(&self.itt.to_be_bytes());
        for (i, w) in self.words.iter().enumerate() {
            out[20 + 4 * i..24 + 4 * i].copy_from_slice(&w.to_be_bytes());
        }
        out
    }
}

/// High 16 bits of a word.
pub(crate) fn hi16(w: u32) -> u16 {
    (w >> 16) as u16
}

/// Low 16 bits of a word.
pub(crate) fn lo16(w: u32) -> u16 {
    w as u16
}

/// Joins two 16-bit halves into one word.
pub(crate) fn join16(hi: u16, lo: u16) -> u32 {
    (u32::from(hi) << 16) | u32::from(lo)
}
