//! The iSER header (RFC 7145 §9).
//!
//! Every iSER message starts with a 28-byte header. For an iSCSI
//! control-type PDU it advertises the initiator's buffers: the write STag
//! and base offset (the target RDMA-Reads write data from there) and the read
//! STag and base offset (the target RDMA-Writes read data there). Hello and
//! HelloReply exchange versions and RDMA read depths.

use crate::error::DecodeError;
use nom::number::complete::{be_u16, be_u32, be_u64, be_u8};
use nom::sequence::tuple;

/// Length of the iSER header.
pub const ISER_HEADER_LEN: usize = 28;

const OPCODE_CONTROL: u8 = 0x1;
const OPCODE_HELLO: u8 = 0x2;
const OPCODE_HELLO_REPLY: u8 = 0x3;
/// Write STag valid.
const WSV: u8 = 0x08;
/// Read STag valid.
const RSV: u8 = 0x04;
/// HelloReply: the target rejects the connection.
const REJECT: u8 = 0x01;

/// A remote buffer advertised in an iSER header: its STag and base offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteBuffer {
    /// Steering tag (the rkey).
    pub stag: u32,
    /// Base offset (the virtual address of the buffer).
    pub base_offset: u64,
}

/// An iSER header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IserHeader {
    /// iSCSI control-type PDU (an iSCSI PDU follows).
    Control {
        /// Where the target RDMA-Reads write data from (WSV set when `Some`).
        write: Option<RemoteBuffer>,
        /// Where the target RDMA-Writes read data to (RSV set when `Some`).
        read: Option<RemoteBuffer>,
    },
    /// iSER Hello, from the initiator.
    Hello {
        /// Highest iSER version supported.
        max_version: u8,
        /// Lowest iSER version supported.
        min_version: u8,
        /// iSER-IRD: the initiator's inbound RDMA Read depth.
        ird: u16,
    },
    /// iSER HelloReply, from the target.
    HelloReply {
        /// The target rejects the connection.
        reject: bool,
        /// Highest iSER version supported.
        max_version: u8,
        /// Version chosen.
        current_version: u8,
        /// iSER-ORD: the target's outbound RDMA Read depth.
        ord: u16,
    },
}

impl IserHeader {
    /// Encodes the 28 header bytes.
    pub fn encode(&self) -> [u8; ISER_HEADER_LEN] {
        let mut out = [0u8; ISER_HEADER_LEN];
        match *self {
            IserHeader::Control { write, read } => {
                out[0] = (OPCODE_CONTROL << 4)
                    | if write.is_some() { WSV } else { 0 }
                    | if read.is_some() { RSV } else { 0 };
                let w = write.unwrap_or(RemoteBuffer {
                    stag: 0,
                    base_offset: 0,
                });
                let r = read.unwrap_or(RemoteBuffer {
                    stag: 0,
                    base_offset: 0,
                });
                out[4..8].copy_from_slice(&w.stag.to_be_bytes());
                out[8..16].copy_from_slice(&w.base_offset.to_be_bytes());
                out[16..20].copy_from_slice(&r.stag.to_be_bytes());
                out[20..28].copy_from_slice(&r.base_offset.to_be_bytes());
            }
            IserHeader::Hello {
                max_version,
                min_version,
                ird,
            } => {
                out[0] = OPCODE_HELLO << 4;
                out[1] = (max_version << 4) | (min_version & 0x0f);
                out[2..4].copy_from_slice(&ird.to_be_bytes());
            }
            IserHeader::HelloReply {
                reject,
                max_version,
                current_version,
                ord,
            } => {
                out[0] = (OPCODE_HELLO_REPLY << 4) | if reject { REJECT } else { 0 };
                out[1] = (max_version << 4) | (current_version & 0x0f);
                out[2..4].copy_from_slice(&ord.to_be_bytes());
            }
        }
        out
    }

    /// Decodes an iSER header from the start of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<IserHeader, DecodeError> {
        let truncated = || DecodeError::Truncated {
            need: ISER_HEADER_LEN.saturating_sub(bytes.len()),
        };
        let (_, (b0, b1, b23, wstag, wbase, rstag, rbase)) = tuple((
            be_u8::<_, nom::error::Error<&[u8]>>,
            be_u8,
            be_u16,
            be_u32,
            be_u64,
            be_u32,
            be_u64,
        ))(bytes)
        .map_err(|_| truncated())?;
        match b0 >> 4 {
            OPCODE_CONTROL => Ok(IserHeader::Control {
                write: (b0 & WSV != 0).then_some(RemoteBuffer {
                    stag: wstag,
                    base_offset: wbase,
                }),
                read: (b0 & RSV != 0).then_some(RemoteBuffer {
                    stag: rstag,
                    base_offset: rbase,
                }),
            }),
            OPCODE_HELLO => Ok(IserHeader::Hello {
                max_version: b1 >> 4,
                min_version: b1 & 0x0f,
                ird: b23,
            }),
            OPCODE_HELLO_REPLY => Ok(IserHeader::HelloReply {
                reject: b0 & REJECT != 0,
                max_version: b1 >> 4,
                current_version: b1 & 0x0f,
                ord: b23,
            }),
            other => Err(DecodeError::UnknownOpcode(other)),
        }
    }
}
