//! SCSI status codes (SAM-5 5.3).

use std::fmt;

/// The status byte of a completed SCSI command.
///
/// A newtype rather than an enum so that any byte received from a peer is
/// representable (and printable) without a lossy conversion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScsiStatus(pub u8);

impl ScsiStatus {
    /// GOOD: the command completed successfully.
    pub const GOOD: Self = Self(0x00);
    /// CHECK CONDITION: sense data describes what went wrong.
    pub const CHECK_CONDITION: Self = Self(0x02);
    /// CONDITION MET: PRE-FETCH found room in the cache.
    pub const CONDITION_MET: Self = Self(0x04);
    /// BUSY: the logical unit cannot accept the command now; retry later.
    pub const BUSY: Self = Self(0x08);
    /// INTERMEDIATE (obsolete; linked commands).
    pub const INTERMEDIATE: Self = Self(0x10);
    /// INTERMEDIATE-CONDITION MET (obsolete; linked commands).
    pub const INTERMEDIATE_CONDITION_MET: Self = Self(0x14);
    /// RESERVATION CONFLICT: another I_T nexus holds a conflicting reservation.
    pub const RESERVATION_CONFLICT: Self = Self(0x18);
    /// COMMAND TERMINATED (obsolete).
    pub const COMMAND_TERMINATED: Self = Self(0x22);
    /// TASK SET FULL: the task set has no room for this command.
    pub const TASK_SET_FULL: Self = Self(0x28);
    /// ACA ACTIVE: an auto contingent allegiance is in effect.
    pub const ACA_ACTIVE: Self = Self(0x30);
    /// TASK ABORTED: another I_T nexus aborted the command (TAS=1).
    pub const TASK_ABORTED: Self = Self(0x40);

    /// The standard name of this status, if it is a defined code.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::GOOD => "GOOD",
            Self::CHECK_CONDITION => "CHECK CONDITION",
            Self::CONDITION_MET => "CONDITION MET",
            Self::BUSY => "BUSY",
            Self::INTERMEDIATE => "INTERMEDIATE",
            Self::INTERMEDIATE_CONDITION_MET => "INTERMEDIATE-CONDITION MET",
            Self::RESERVATION_CONFLICT => "RESERVATION CONFLICT",
            Self::COMMAND_TERMINATED => "COMMAND TERMINATED",
            Self::TASK_SET_FULL => "TASK SET FULL",
            Self::ACA_ACTIVE => "ACA ACTIVE",
            Self::TASK_ABORTED => "TASK ABORTED",
            _ => return None,
        })
    }

    /// Whether the command succeeded (GOOD or CONDITION MET).
    pub fn is_success(self) -> bool {
        matches!(self, Self::GOOD | Self::CONDITION_MET)
    }
}

impl From<u8> for ScsiStatus {
    fn from(v: u8) -> Self {
        Self(v)
    }
}

impl From<ScsiStatus> for u8 {
    fn from(s: ScsiStatus) -> u8 {
        s.0
    }
}

impl fmt::Display for ScsiStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "status {:#04x}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_display() {
        assert_eq!(ScsiStatus(0x02).name(), Some("CHECK CONDITION"));
        assert_eq!(ScsiStatus::TASK_ABORTED.0, 0x40);
        assert_eq!(ScsiStatus(0x7e).to_string(), "status 0x7e");
        assert!(ScsiStatus::CONDITION_MET.is_success());
        assert!(!ScsiStatus::BUSY.is_success());
    }
}
