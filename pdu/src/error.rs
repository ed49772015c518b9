//! Errors of PDU decoding.

/// Why bytes could not be decoded as a PDU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// More bytes are needed; `need` is how many at least.
    #[error("truncated PDU: {need} more bytes needed")]
    Truncated {
        /// Bytes still missing.
        need: usize,
    },
    /// The opcode is reserved or vendor-specific.
    #[error("unknown iSCSI opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// The data segment is longer than this side's MaxRecvDataSegmentLength.
    #[error(
        "data segment of {len} bytes exceeds MaxRecvDataSegmentLength {max}; \
         the peer ignored the negotiated limit"
    )]
    DataSegmentTooLong {
        /// DataSegmentLength of the PDU.
        len: u32,
        /// The negotiated limit.
        max: u32,
    },
    /// An additional header segment is malformed.
    #[error("malformed additional header segment: {0}")]
    BadAhs(&'static str),
    /// The header digest does not match.
    #[error("header digest mismatch: computed {expected:#010x}, received {got:#010x}")]
    HeaderDigest {
        /// CRC32C computed over the header.
        expected: u32,
        /// The digest received.
        got: u32,
    },
    /// The data digest does not match; the header was sound, so the caller
    /// may skip `pdu_len` bytes and answer as its error recovery level says.
    #[error("data digest mismatch: computed {expected:#010x}, received {got:#010x}")]
    DataDigest {
        /// CRC32C computed over the data and padding.
        expected: u32,
        /// The digest received.
        got: u32,
        /// The whole PDU's length on the wire.
        pdu_len: usize,
    },
}
