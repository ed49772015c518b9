//! blockwire's iSCSI target.
//!
//! Three layers, as in LIO and SPDK: `scsi` emulates SCSI block devices and
//! knows nothing of iSCSI; `backstore` stores blocks; `iscsi` is the fabric
//! (portals, login, authentication, discovery, sessions, the command
//! lifecycle). `scsi` never imports from `iscsi`.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod backstore;
pub mod copies;
pub mod datapath;
pub mod events;
pub mod iscsi;
pub mod payload_buffers;
pub mod scsi;
