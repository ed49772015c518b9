//! EXTENDED COPY (LID1) and RECEIVE COPY RESULTS.

use blockwire_pdu::scsi::Asc;

use super::logical_unit::LogicalUnit;
use super::outcome::{illegal, CmdResult};

/// Results of finished copy operations, by list identifier.
#[derive(Debug, Default)]
pub(crate) struct CopyResults {}

impl LogicalUnit {
    pub(crate) fn extended_copy(&self, _sa: u8, _len: u32, _data: &[u8]) -> CmdResult {
        Err(illegal(Asc::INVALID_COMMAND_OPERATION_CODE))
    }

    pub(crate) fn receive_copy_results(&self, _sa: u8, _id: u32, _alloc: u32) -> CmdResult {
        Err(illegal(Asc::INVALID_COMMAND_OPERATION_CODE))
    }
}
