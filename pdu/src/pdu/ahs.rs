//! Additional Header Segments (RFC 7143 §11.2.2).

use crate::error::DecodeError;

/// AHSType of the Extended CDB AHS.
pub const AHS_EXTENDED_CDB: u8 = 1;
/// AHSType of the Bidirectional Expected Read-Data Length AHS.
pub const AHS_BIDI_READ_LENGTH: u8 = 2;

/// One Additional Header Segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ahs {
    /// CDB bytes beyond the first 16 (CDBs longer than 16 bytes).
    ExtendedCdb(Vec<u8>),
    /// Expected read-data length of a bidirectional command.
    BidiReadDataLength(u32),
    /// An AHS type this crate does not interpret, kept whole.
    Other {
        /// AHSType.
        ahs_type: u8,
        /// The bytes after AHSType (AHSLength of them).
        specific: Vec<u8>,
    },
}

impl Ahs {
    /// Appends the AHS with its padding.
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        let (ahs_type, body): (u8, Vec<u8>) = match self {
            // A reserved byte precedes the CDB bytes.
            Ahs::ExtendedCdb(cdb) => (AHS_EXTENDED_CDB, [&[0u8][..], cdb].concat()),
            Ahs::BidiReadDataLength(len) => {
                let mut b = vec![0u8];
                b.extend_from_slice(&len.to_be_bytes());
                (AHS_BIDI_READ_LENGTH, b)
            }
            Ahs::Other { ahs_type, specific } => (*ahs_type, specific.clone()),
        };
        out.extend_from_slice(&(body.len() as u16).to_be_bytes());
        out.push(ahs_type);
        out.extend_from_slice(&body);
        while !(out.len() - start).is_multiple_of(4) {
            out.push(0);
        }
    }

    /// Decodes every AHS in the TotalAHSLength area.
    pub(crate) fn decode_all(mut area: &[u8]) -> Result<Vec<Ahs>, DecodeError> {
        let mut out = Vec::new();
        while !area.is_empty() {
            if area.len() < 4 {
                return Err(DecodeError::BadAhs("AHS shorter than its 4-byte minimum"));
            }
            let len = usize::from(u16::from_be_bytes([area[0], area[1]]));
            let ahs_type = area[2];
            let padded = (3 + len + 3) & !3;
            if padded > area.len() {
                return Err(DecodeError::BadAhs("AHSLength runs past TotalAHSLength"));
            }
            let body = &area[3..3 + len];
            out.push(match ahs_type {
                AHS_EXTENDED_CDB => {
                    if body.is_empty() {
                        return Err(DecodeError::BadAhs("empty Extended CDB AHS"));
                    }
                    Ahs::ExtendedCdb(body[1..].to_vec())
                }
                AHS_BIDI_READ_LENGTH => {
                    if len != 5 {
                        return Err(DecodeError::BadAhs(
                            "Bidirectional Read-Data Length AHS must have AHSLength 5",
                        ));
                    }
                    Ahs::BidiReadDataLength(u32::from_be_bytes([
                        body[1], body[2], body[3], body[4],
                    ]))
                }
                _ => Ahs::Other {
                    ahs_type,
                    specific: body.to_vec(),
                },
            });
            area = &area[padded..];
        }
        Ok(out)
    }
}
