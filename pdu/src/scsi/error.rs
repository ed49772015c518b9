//! The error type of every parameter/data structure decoder in this module.

use super::asc::Asc;
use super::sense::{FieldPointer, Sense};

/// Why a parameter list (Data-Out) or returned data (Data-In) was rejected.
///
/// Target-side decoders of parameter lists (MODE SELECT, UNMAP, PERSISTENT
/// RESERVE OUT) turn this straight into sense with [`DataError::to_sense`];
/// initiator-side decoders use `Truncated::needed` to retry with a larger
/// allocation length.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub enum DataError {
    /// The buffer ends before a length field says it should.
    #[error("data truncated: need {needed} bytes, have {got}")]
    Truncated {
        /// Bytes the structure needs.
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// The buffer's length is wrong for the structure (not merely short).
    #[error("wrong data length: expected {expected} bytes, got {got}")]
    Length {
        /// Length the structure requires.
        expected: usize,
        /// Bytes present.
        got: usize,
    },
    /// A field holds an invalid value.
    #[error("invalid field at byte {byte}, bit {bit:?}")]
    InvalidField {
        /// Byte offset of the field within the buffer.
        byte: usize,
        /// Left-most bit of the field, when not a whole byte.
        bit: Option<u8>,
    },
    /// A PERSISTENT RESERVE OUT list names more initiator ports than the
    /// device server can register.
    #[error("more than {limit} TransportIDs listed")]
    TooManyTransportIds {
        /// The most the device server registers.
        limit: usize,
    },
}

impl DataError {
    /// ILLEGAL REQUEST sense for a bad parameter list: PARAMETER LIST
    /// LENGTH ERROR, or INVALID FIELD IN PARAMETER LIST with a field pointer
    /// (C/D = 0).
    pub fn to_sense(&self) -> Sense {
        match *self {
            Self::Truncated { .. } | Self::Length { .. } => {
                Sense::illegal_request(Asc::PARAMETER_LIST_LENGTH_ERROR, None)
            }
            // SPC-4 5.12.7: a list the device server has no room to
            // register.
            Self::TooManyTransportIds { .. } => {
                Sense::illegal_request(Asc::INSUFFICIENT_REGISTRATION_RESOURCES, None)
            }
            Self::InvalidField { byte, bit } => Sense::illegal_request(
                Asc::INVALID_FIELD_IN_PARAMETER_LIST,
                Some(FieldPointer::parameter(
                    u16::try_from(byte).unwrap_or(u16::MAX),
                    bit,
                )),
            ),
        }
    }
}

/// `buf[..n]`, or `Truncated` when `buf` is shorter.
pub(crate) fn need(buf: &[u8], n: usize) -> Result<&[u8], DataError> {
    buf.get(..n).ok_or(DataError::Truncated {
        needed: n,
        got: buf.len(),
    })
}
