//! Wire formats of blockwire, with no I/O.
//!
//! This crate is deterministic: it never touches sockets, files or clocks.
//! It knows the iSCSI PDUs of RFC 7143, the iSER header of RFC 7145, the
//! login/text keys and their negotiation, the iSNS messages of RFC 4171, and
//! the SCSI structures (CDBs, sense data, VPD pages) that a target and an
//! initiator exchange.
//!
//! Decoding never panics on any input, and every length read from the wire
//! is checked against the buffer and the negotiated limits before use.
#![forbid(unsafe_code)]

pub mod chap;
pub mod coverage;
pub mod digest;
mod error;
pub(crate) mod framing;
pub mod iser;
pub mod isns;
pub mod keys;
pub mod pdu;
pub mod scsi;
pub mod serial;

pub use digest::Digests;
pub use error::DecodeError;
pub use framing::{Frame, FrameDecoder, FrameSize};
pub use pdu::codes::{LoginStatus, Stage};
pub use pdu::{Ahs, Bhs, Lun, Opcode, Pdu};
