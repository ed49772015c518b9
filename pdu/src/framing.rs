//! Cutting a byte stream into PDUs.
//!
//! The decoder is sans-IO: the caller appends received bytes to a buffer
//! and asks whether a whole PDU is there. It reads the declared lengths from
//! the first eight bytes and refuses a PDU whose data segment is larger than
//! this side's MaxRecvDataSegmentLength before anything is allocated for it,
//! so a hostile length can never make the receiver buffer gigabytes.

use crate::digest::Digests;
use crate::error::DecodeError;
use crate::pdu::{HeaderLengths, Pdu, BHS_LEN};

/// What the buffered bytes hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Not a whole PDU yet: at least this many more bytes are needed.
    NeedMore(usize),
    /// One PDU, which occupied the first `consumed` bytes of the buffer.
    Pdu {
        /// The decoded PDU.
        pdu: Pdu,
        /// Bytes to drop from the front of the buffer.
        consumed: usize,
    },
}

/// The size of the next PDU, known from its header before its body arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameSize {
    /// Fewer than the eight bytes holding the lengths are buffered.
    NeedHeader(usize),
    /// The whole PDU occupies this many bytes on the wire.
    Total(usize),
}

/// Splits a byte stream into PDUs under the connection's negotiated limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameDecoder {
    /// This side's MaxRecvDataSegmentLength (8192 until negotiated).
    pub max_recv_data_segment_length: u32,
    /// The digests in force on this connection.
    pub digests: Digests,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder {
            // RFC 7143 §13.12: the default, and the limit during login.
            max_recv_data_segment_length: 8192,
            digests: Digests::NONE,
        }
    }
}

impl FrameDecoder {
    /// A decoder with the given limit and digests.
    pub fn new(max_recv_data_segment_length: u32, digests: Digests) -> Self {
        FrameDecoder {
            max_recv_data_segment_length,
            digests,
        }
    }

    /// Checks the declared lengths of the PDU at the front of `buf` and says
    /// how long it is on the wire.
    pub fn frame_size(&self, buf: &[u8]) -> Result<FrameSize, DecodeError> {
        let Some(lengths) = HeaderLengths::peek(buf) else {
            return Ok(FrameSize::NeedHeader(8 - buf.len()));
        };
        if lengths.data_segment_length > self.max_recv_data_segment_length {
            return Err(DecodeError::DataSegmentTooLong {
                len: lengths.data_segment_length,
                max: self.max_recv_data_segment_length,
            });
        }
        Ok(FrameSize::Total(
            BHS_LEN + lengths.wire_len_after_bhs(self.digests),
        ))
    }

    /// Decodes the PDU at the front of `buf`, or says how many more bytes
    /// are needed.
    pub fn decode(&self, buf: &[u8]) -> Result<Frame, DecodeError> {
        let total = match self.frame_size(buf)? {
            FrameSize::NeedHeader(n) => return Ok(Frame::NeedMore(n.max(BHS_LEN - buf.len()))),
            FrameSize::Total(t) => t,
        };
        if buf.len() < total {
            return Ok(Frame::NeedMore(total - buf.len()));
        }
        let (pdu, consumed) = Pdu::decode(&buf[..total], self.digests)?;
        Ok(Frame::Pdu { pdu, consumed })
    }
}
