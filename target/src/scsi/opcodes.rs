//! REPORT SUPPORTED OPERATION CODES and REPORT SUPPORTED TASK MANAGEMENT
//! FUNCTIONS.

use blockwire_pdu::scsi::Asc;

use super::outcome::{illegal, CmdResult};

pub(crate) fn report_supported_operation_codes(
    _rctd: bool,
    _ro: u8,
    _op: u8,
    _sa: u16,
    _alloc: u32,
) -> CmdResult {
    Err(illegal(Asc::INVALID_COMMAND_OPERATION_CODE))
}

pub(crate) fn report_supported_tmfs(_repd: bool, _alloc: u32) -> CmdResult {
    Err(illegal(Asc::INVALID_COMMAND_OPERATION_CODE))
}
