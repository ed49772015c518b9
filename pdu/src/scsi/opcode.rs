//! SCSI operation codes (SPC-4, SBC-3) and their service actions.
//!
//! Plain `u8`/`u16` constants rather than an enum: the target must be able to
//! name and report (REPORT SUPPORTED OPERATION CODES) any byte it receives,
//! including ones it does not implement.

/// TEST UNIT READY (SPC-4 6.47).
pub const TEST_UNIT_READY: u8 = 0x00;
/// REQUEST SENSE (SPC-4 6.39).
pub const REQUEST_SENSE: u8 = 0x03;
/// FORMAT UNIT (SBC-3 5.3); listed so it can be named, not decoded.
pub const FORMAT_UNIT: u8 = 0x04;
/// READ(6) (SBC-3 5.13).
pub const READ_6: u8 = 0x08;
/// WRITE(6) (SBC-3 5.38).
pub const WRITE_6: u8 = 0x0a;
/// INQUIRY (SPC-4 6.6).
pub const INQUIRY: u8 = 0x12;
/// MODE SELECT(6) (SPC-4 6.9).
pub const MODE_SELECT_6: u8 = 0x15;
/// RESERVE(6) (SPC-2 7.21, obsolete in SPC-4 but still sent by old hosts).
pub const RESERVE_6: u8 = 0x16;
/// RELEASE(6) (SPC-2 7.17, obsolete in SPC-4 but still sent by old hosts).
pub const RELEASE_6: u8 = 0x17;
/// MODE SENSE(6) (SPC-4 6.11).
pub const MODE_SENSE_6: u8 = 0x1a;
/// START STOP UNIT (SBC-3 5.25).
pub const START_STOP_UNIT: u8 = 0x1b;
/// RECEIVE DIAGNOSTIC RESULTS (SPC-4 6.28); named only.
pub const RECEIVE_DIAGNOSTIC_RESULTS: u8 = 0x1c;
/// SEND DIAGNOSTIC (SPC-4 6.42); named only.
pub const SEND_DIAGNOSTIC: u8 = 0x1d;
/// PREVENT ALLOW MEDIUM REMOVAL (SBC-3 5.11).
pub const PREVENT_ALLOW_MEDIUM_REMOVAL: u8 = 0x1e;
/// READ CAPACITY(10) (SBC-3 5.15).
pub const READ_CAPACITY_10: u8 = 0x25;
/// READ(10) (SBC-3 5.9).
pub const READ_10: u8 = 0x28;
/// WRITE(10) (SBC-3 5.35).
pub const WRITE_10: u8 = 0x2a;
/// WRITE AND VERIFY(10) (SBC-3 5.39).
pub const WRITE_AND_VERIFY_10: u8 = 0x2e;
/// VERIFY(10) (SBC-3 5.30).
pub const VERIFY_10: u8 = 0x2f;
/// PRE-FETCH(10) (SBC-3 5.9).
pub const PRE_FETCH_10: u8 = 0x34;
/// SYNCHRONIZE CACHE(10) (SBC-3 5.26).
pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
/// WRITE BUFFER (SPC-4 6.49); named only.
pub const WRITE_BUFFER: u8 = 0x3b;
/// READ BUFFER (SPC-4 6.17); named only.
pub const READ_BUFFER: u8 = 0x3c;
/// WRITE SAME(10) (SBC-3 5.41).
pub const WRITE_SAME_10: u8 = 0x41;
/// UNMAP (SBC-3 5.28).
pub const UNMAP: u8 = 0x42;
/// LOG SELECT (SPC-4 6.7); named only.
pub const LOG_SELECT: u8 = 0x4c;
/// LOG SENSE (SPC-4 6.8); named only.
pub const LOG_SENSE: u8 = 0x4d;
/// MODE SELECT(10) (SPC-4 6.10).
pub const MODE_SELECT_10: u8 = 0x55;
/// RESERVE(10) (SPC-2 7.22).
pub const RESERVE_10: u8 = 0x56;
/// RELEASE(10) (SPC-2 7.18).
pub const RELEASE_10: u8 = 0x57;
/// MODE SENSE(10) (SPC-4 6.12).
pub const MODE_SENSE_10: u8 = 0x5a;
/// PERSISTENT RESERVE IN (SPC-4 6.13).
pub const PERSISTENT_RESERVE_IN: u8 = 0x5e;
/// PERSISTENT RESERVE OUT (SPC-4 6.14).
pub const PERSISTENT_RESERVE_OUT: u8 = 0x5f;
/// EXTENDED COPY, a.k.a. THIRD-PARTY COPY OUT (SPC-4 6.3).
pub const EXTENDED_COPY: u8 = 0x83;
/// RECEIVE COPY RESULTS, a.k.a. THIRD-PARTY COPY IN (SPC-4 6.18).
pub const RECEIVE_COPY_RESULTS: u8 = 0x84;
/// READ(16) (SBC-3 5.12).
pub const READ_16: u8 = 0x88;
/// COMPARE AND WRITE (SBC-3 5.2).
pub const COMPARE_AND_WRITE: u8 = 0x89;
/// WRITE(16) (SBC-3 5.37).
pub const WRITE_16: u8 = 0x8a;
/// ORWRITE(16) (SBC-3 5.8).
pub const ORWRITE_16: u8 = 0x8b;
/// WRITE AND VERIFY(16) (SBC-3 5.41).
pub const WRITE_AND_VERIFY_16: u8 = 0x8e;
/// VERIFY(16) (SBC-3 5.33).
pub const VERIFY_16: u8 = 0x8f;
/// PRE-FETCH(16) (SBC-3 5.10).
pub const PRE_FETCH_16: u8 = 0x90;
/// SYNCHRONIZE CACHE(16) (SBC-3 5.27).
pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
/// WRITE SAME(16) (SBC-3 5.46).
pub const WRITE_SAME_16: u8 = 0x93;
/// WRITE ATOMIC(16) (SBC-4 5.48).
pub const WRITE_ATOMIC_16: u8 = 0x9c;
/// SERVICE ACTION IN(16): READ CAPACITY(16), GET LBA STATUS (SBC-3).
pub const SERVICE_ACTION_IN_16: u8 = 0x9e;
/// REPORT LUNS (SPC-4 6.33).
pub const REPORT_LUNS: u8 = 0xa0;
/// MAINTENANCE IN: REPORT TARGET PORT GROUPS, REPORT SUPPORTED OPERATION
/// CODES, REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS (SPC-4).
pub const MAINTENANCE_IN: u8 = 0xa3;
/// MAINTENANCE OUT: SET TARGET PORT GROUPS (SPC-4 6.44).
pub const MAINTENANCE_OUT: u8 = 0xa4;
/// READ(12) (SBC-3 5.11).
pub const READ_12: u8 = 0xa8;
/// WRITE(12) (SBC-3 5.36).
pub const WRITE_12: u8 = 0xaa;
/// WRITE AND VERIFY(12) (SBC-3 5.40).
pub const WRITE_AND_VERIFY_12: u8 = 0xae;
/// VERIFY(12) (SBC-3 5.32).
pub const VERIFY_12: u8 = 0xaf;

/// Service actions of SERVICE ACTION IN(16) (0x9E).
pub mod sai16 {
    /// READ CAPACITY(16).
    pub const READ_CAPACITY_16: u8 = 0x10;
    /// GET LBA STATUS.
    pub const GET_LBA_STATUS: u8 = 0x12;
}

/// Service actions of MAINTENANCE IN (0xA3).
pub mod maintenance_in {
    /// REPORT TARGET PORT GROUPS.
    pub const REPORT_TARGET_PORT_GROUPS: u8 = 0x0a;
    /// REPORT SUPPORTED OPERATION CODES.
    pub const REPORT_SUPPORTED_OPERATION_CODES: u8 = 0x0c;
    /// REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS.
    pub const REPORT_SUPPORTED_TMFS: u8 = 0x0d;
}

/// Service actions of MAINTENANCE OUT (0xA4).
pub mod maintenance_out {
    /// SET TARGET PORT GROUPS.
    pub const SET_TARGET_PORT_GROUPS: u8 = 0x0a;
}

/// Service actions of PERSISTENT RESERVE IN (0x5E).
pub mod pr_in {
    /// READ KEYS.
    pub const READ_KEYS: u8 = 0x00;
    /// READ RESERVATION.
    pub const READ_RESERVATION: u8 = 0x01;
    /// REPORT CAPABILITIES.
    pub const REPORT_CAPABILITIES: u8 = 0x02;
    /// READ FULL STATUS.
    pub const READ_FULL_STATUS: u8 = 0x03;
}

/// Service actions of PERSISTENT RESERVE OUT (0x5F).
pub mod pr_out {
    /// REGISTER.
    pub const REGISTER: u8 = 0x00;
    /// RESERVE.
    pub const RESERVE: u8 = 0x01;
    /// RELEASE.
    pub const RELEASE: u8 = 0x02;
    /// CLEAR.
    pub const CLEAR: u8 = 0x03;
    /// PREEMPT.
    pub const PREEMPT: u8 = 0x04;
    /// PREEMPT AND ABORT.
    pub const PREEMPT_AND_ABORT: u8 = 0x05;
    /// REGISTER AND IGNORE EXISTING KEY.
    pub const REGISTER_AND_IGNORE_EXISTING_KEY: u8 = 0x06;
    /// REGISTER AND MOVE.
    pub const REGISTER_AND_MOVE: u8 = 0x07;
    /// REPLACE LOST RESERVATION.
    pub const REPLACE_LOST_RESERVATION: u8 = 0x08;
}

/// Service actions of EXTENDED COPY / THIRD-PARTY COPY OUT (0x83).
pub mod copy_out {
    /// EXTENDED COPY(LID1).
    pub const EXTENDED_COPY_LID1: u8 = 0x00;
    /// EXTENDED COPY(LID4).
    pub const EXTENDED_COPY_LID4: u8 = 0x01;
    /// POPULATE TOKEN.
    pub const POPULATE_TOKEN: u8 = 0x10;
    /// WRITE USING TOKEN.
    pub const WRITE_USING_TOKEN: u8 = 0x11;
    /// COPY OPERATION ABORT.
    pub const COPY_OPERATION_ABORT: u8 = 0x1c;
}

/// Service actions of RECEIVE COPY RESULTS / THIRD-PARTY COPY IN (0x84).
pub mod copy_in {
    /// RECEIVE COPY STATUS(LID1).
    pub const RECEIVE_COPY_STATUS_LID1: u8 = 0x00;
    /// RECEIVE COPY DATA(LID1).
    pub const RECEIVE_COPY_DATA_LID1: u8 = 0x01;
    /// RECEIVE COPY OPERATING PARAMETERS.
    pub const RECEIVE_COPY_OPERATING_PARAMETERS: u8 = 0x03;
    /// RECEIVE COPY FAILURE DETAILS(LID1).
    pub const RECEIVE_COPY_FAILURE_DETAILS_LID1: u8 = 0x04;
    /// RECEIVE COPY STATUS(LID4).
    pub const RECEIVE_COPY_STATUS_LID4: u8 = 0x05;
    /// RECEIVE COPY DATA(LID4).
    pub const RECEIVE_COPY_DATA_LID4: u8 = 0x06;
    /// RECEIVE ROD TOKEN INFORMATION.
    pub const RECEIVE_ROD_TOKEN_INFORMATION: u8 = 0x07;
    /// REPORT ALL ROD TOKENS.
    pub const REPORT_ALL_ROD_TOKENS: u8 = 0x08;
}

/// CDB length implied by the operation code's group code (SAM-5 5.2), or
/// `None` for the reserved and vendor-specific groups whose length the
/// opcode alone does not tell.
pub fn cdb_length(opcode: u8) -> Option<usize> {
    match opcode >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

/// Human-readable command name for logs and REPORT SUPPORTED OPERATION CODES
/// debugging. `service_action` is ignored for opcodes without one.
pub fn opcode_name(opcode: u8, service_action: Option<u8>) -> Option<&'static str> {
    let sa = service_action.unwrap_or(0);
    Some(match opcode {
        TEST_UNIT_READY => "TEST UNIT READY",
        REQUEST_SENSE => "REQUEST SENSE",
        FORMAT_UNIT => "FORMAT UNIT",
        READ_6 => "READ(6)",
        WRITE_6 => "WRITE(6)",
        INQUIRY => "INQUIRY",
        MODE_SELECT_6 => "MODE SELECT(6)",
        RESERVE_6 => "RESERVE(6)",
        RELEASE_6 => "RELEASE(6)",
        MODE_SENSE_6 => "MODE SENSE(6)",
        START_STOP_UNIT => "START STOP UNIT",
        RECEIVE_DIAGNOSTIC_RESULTS => "RECEIVE DIAGNOSTIC RESULTS",
        SEND_DIAGNOSTIC => "SEND DIAGNOSTIC",
        PREVENT_ALLOW_MEDIUM_REMOVAL => "PREVENT ALLOW MEDIUM REMOVAL",
        READ_CAPACITY_10 => "READ CAPACITY(10)",
        READ_10 => "READ(10)",
        WRITE_10 => "WRITE(10)",
        WRITE_AND_VERIFY_10 => "WRITE AND VERIFY(10)",
        VERIFY_10 => "VERIFY(10)",
        PRE_FETCH_10 => "PRE-FETCH(10)",
        SYNCHRONIZE_CACHE_10 => "SYNCHRONIZE CACHE(10)",
        WRITE_BUFFER => "WRITE BUFFER",
        READ_BUFFER => "READ BUFFER",
        WRITE_SAME_10 => "WRITE SAME(10)",
        UNMAP => "UNMAP",
        LOG_SELECT => "LOG SELECT",
        LOG_SENSE => "LOG SENSE",
        MODE_SELECT_10 => "MODE SELECT(10)",
        RESERVE_10 => "RESERVE(10)",
        RELEASE_10 => "RELEASE(10)",
        MODE_SENSE_10 => "MODE SENSE(10)",
        PERSISTENT_RESERVE_IN => "PERSISTENT RESERVE IN",
        PERSISTENT_RESERVE_OUT => "PERSISTENT RESERVE OUT",
        EXTENDED_COPY => match sa {
            copy_out::EXTENDED_COPY_LID4 => "EXTENDED COPY(LID4)",
            copy_out::POPULATE_TOKEN => "POPULATE TOKEN",
            copy_out::WRITE_USING_TOKEN => "WRITE USING TOKEN",
            copy_out::COPY_OPERATION_ABORT => "COPY OPERATION ABORT",
            _ => "EXTENDED COPY",
        },
        RECEIVE_COPY_RESULTS => match sa {
            copy_in::RECEIVE_COPY_OPERATING_PARAMETERS => "RECEIVE COPY OPERATING PARAMETERS",
            copy_in::RECEIVE_ROD_TOKEN_INFORMATION => "RECEIVE ROD TOKEN INFORMATION",
            _ => "RECEIVE COPY RESULTS",
        },
        READ_16 => "READ(16)",
        COMPARE_AND_WRITE => "COMPARE AND WRITE",
        WRITE_16 => "WRITE(16)",
        ORWRITE_16 => "ORWRITE(16)",
        WRITE_AND_VERIFY_16 => "WRITE AND VERIFY(16)",
        VERIFY_16 => "VERIFY(16)",
        PRE_FETCH_16 => "PRE-FETCH(16)",
        SYNCHRONIZE_CACHE_16 => "SYNCHRONIZE CACHE(16)",
        WRITE_SAME_16 => "WRITE SAME(16)",
        WRITE_ATOMIC_16 => "WRITE ATOMIC(16)",
        SERVICE_ACTION_IN_16 => match sa {
            sai16::READ_CAPACITY_16 => "READ CAPACITY(16)",
            sai16::GET_LBA_STATUS => "GET LBA STATUS",
            _ => "SERVICE ACTION IN(16)",
        },
        REPORT_LUNS => "REPORT LUNS",
        MAINTENANCE_IN => match sa {
            maintenance_in::REPORT_TARGET_PORT_GROUPS => "REPORT TARGET PORT GROUPS",
            maintenance_in::REPORT_SUPPORTED_OPERATION_CODES => "REPORT SUPPORTED OPERATION CODES",
            maintenance_in::REPORT_SUPPORTED_TMFS => "REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS",
            _ => "MAINTENANCE IN",
        },
        MAINTENANCE_OUT => match sa {
            maintenance_out::SET_TARGET_PORT_GROUPS => "SET TARGET PORT GROUPS",
            _ => "MAINTENANCE OUT",
        },
        READ_12 => "READ(12)",
        WRITE_12 => "WRITE(12)",
        WRITE_AND_VERIFY_12 => "WRITE AND VERIFY(12)",
        VERIFY_12 => "VERIFY(12)",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_code_lengths() {
        assert_eq!(cdb_length(READ_6), Some(6));
        assert_eq!(cdb_length(READ_10), Some(10));
        assert_eq!(cdb_length(MODE_SENSE_10), Some(10));
        assert_eq!(cdb_length(READ_16), Some(16));
        assert_eq!(cdb_length(REPORT_LUNS), Some(12));
        assert_eq!(cdb_length(0x7f), None);
        assert_eq!(cdb_length(0xc0), None);
    }

    #[test]
    fn names() {
        assert_eq!(opcode_name(0x28, None), Some("READ(10)"));
        assert_eq!(
            opcode_name(SERVICE_ACTION_IN_16, Some(sai16::READ_CAPACITY_16)),
            Some("READ CAPACITY(16)")
        );
        assert_eq!(opcode_name(0xff, None), None);
    }
}
