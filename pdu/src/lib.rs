//! Wire formats of blockwire, with no I/O.
//!
//! This crate is deterministic: it never touches sockets, files or clocks.
//! It knows the iSCSI PDUs of RFC 7143, the iSER header of RFC 7145, the
//! login/text keys and their negotiation, and the SCSI structures (CDBs,
//! sense data, VPD pages) that a target and an initiator exchange.
#![forbid(unsafe_code)]

pub mod keys;
pub mod scsi;
