//! Errors of the initiator library.

use blockwire_pdu::chap::ChapError;
use blockwire_pdu::keys::{NegotiationError, TextError};
use blockwire_pdu::pdu::codes::TmfResponse;
use blockwire_pdu::scsi::{ScsiStatus, Sense};
use blockwire_pdu::{DecodeError, LoginStatus};

/// A SCSI command that completed with a status other than GOOD.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", describe(self))]
pub struct ScsiError {
    /// The LUN the command addressed.
    pub lun: u16,
    /// The CDB's operation code.
    pub opcode: u8,
    /// The SCSI status.
    pub status: ScsiStatus,
    /// Sense data, when the target sent any (CHECK CONDITION).
    pub sense: Option<Sense>,
}

impl ScsiError {
    /// The sense key, ASC and ASCQ, when there is sense data.
    pub fn sense_code(&self) -> Option<(blockwire_pdu::scsi::SenseKey, u8, u8)> {
        self.sense.as_ref().map(|s| (s.key, s.asc, s.ascq))
    }
}

fn describe(e: &ScsiError) -> String {
    let status = e
        .status
        .name()
        .map(str::to_owned)
        .unwrap_or_else(|| format!("status {:#04x}", e.status.0));
    let mut s = format!(
        "SCSI command {:#04x} on LUN {} failed with {}",
        e.opcode, e.lun, status
    );
    if let Some(sense) = &e.sense {
        let asc = blockwire_pdu::scsi::asc_name(sense.asc, sense.ascq).unwrap_or("unknown ASC");
        s.push_str(&format!(
            ": sense key {} ({:#x}), ASC/ASCQ {:02x}h/{:02x}h {}",
            sense.key.name(),
            sense.key.code(),
            sense.asc,
            sense.ascq,
            asc
        ));
    }
    s
}

/// Everything that can go wrong in the initiator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A socket operation failed.
    #[error("{context}: {cause}")]
    Io {
        /// What was being done (names the portal).
        context: String,
        /// The OS error.
        cause: std::io::Error,
    },
    /// A bounded wait ran out.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The target sent bytes that are not a valid PDU.
    #[error("malformed PDU from the target: {0}")]
    Decode(#[from] DecodeError),
    /// The target broke the protocol (unexpected PDU, bad sequence, ...).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The target refused the login.
    #[error(
        "login to {target} at {portal} refused: {status}{hint}",
        hint = login_hint(*status)
    )]
    LoginRejected {
        /// Target name (or "discovery").
        target: String,
        /// The portal.
        portal: String,
        /// Status class and detail from the Login Response.
        status: LoginStatus,
    },
    /// The target moved (login status class 1, RFC 7143 §11.13.5): log in
    /// at `to` instead. [`crate::Session::connect`] and discovery follow it
    /// themselves, a few times at most.
    #[error(
        "login to {target} at {portal} redirected to {to} ({})",
        if *permanent { "moved permanently" } else { "moved temporarily" }
    )]
    Redirected {
        /// Target name (or "discovery").
        target: String,
        /// The portal that answered.
        portal: String,
        /// `host:port` the target named in its TargetAddress.
        to: String,
        /// 0102h (moved permanently) rather than 0101h (temporarily).
        permanent: bool,
    },
    /// Login key negotiation failed.
    #[error("login negotiation with {target} failed: {cause}")]
    Negotiation {
        /// Target name (or "discovery").
        target: String,
        /// The rule that broke.
        cause: NegotiationError,
    },
    /// A text segment could not be parsed.
    #[error("bad key=value text from the target: {0}")]
    Text(#[from] TextError),
    /// CHAP failed on our side (e.g. the target's mutual answer is wrong).
    #[error("CHAP authentication with {target} failed: {cause}; check the user names and secrets")]
    Chap {
        /// Target name (or "discovery").
        target: String,
        /// What failed.
        cause: ChapError,
    },
    /// The configuration cannot be used.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A SCSI command failed (CHECK CONDITION and friends).
    #[error(transparent)]
    Scsi(#[from] ScsiError),
    /// The target answered with a non-zero iSCSI service response.
    #[error("target failure executing the command on LUN {lun} (iSCSI response {response:#04x})")]
    TargetFailure {
        /// LUN.
        lun: u16,
        /// The iSCSI Response field.
        response: u8,
    },
    /// The command was aborted by task management before it completed.
    #[error("command aborted by task management on LUN {lun}")]
    Aborted {
        /// LUN.
        lun: u16,
    },
    /// A task management function was not carried out.
    #[error("task management {function} on LUN {lun} failed: {}", response.name())]
    Tmf {
        /// The function's name.
        function: &'static str,
        /// LUN.
        lun: u16,
        /// The target's answer.
        response: TmfResponse,
    },
    /// The connection is gone and recovery gave up.
    #[error("session with {target} lost and not recovered after {attempts} attempts: {reason}")]
    SessionLost {
        /// Target name.
        target: String,
        /// Login attempts made.
        attempts: u32,
        /// The last failure.
        reason: String,
    },
    /// An offloaded (RDMA-assisted) command ended without an answer on the
    /// login it was sent for: the session logged in again (its RDMA binding
    /// is stale), its connection was lost, or it went unanswered past its
    /// deadline and the connection was given up. Its buffers were the
    /// target's until then; the command may run again over TCP.
    #[error("offloaded command interrupted: {0}")]
    OffloadInterrupted(String),
    /// The session was logged out or closed.
    #[error("session is closed")]
    Closed,
}

fn login_hint(status: LoginStatus) -> &'static str {
    match (status.class, status.detail) {
        (2, 1) => "; check the CHAP user name, secret and algorithm",
        (2, 2) => "; the target's ACL does not allow this initiator name",
        (2, 3) => "; the target name is unknown at this portal (run discovery)",
        (3, 1) | (3, 2) => "; retry later",
        _ => "",
    }
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, cause: std::io::Error) -> Error {
        Error::Io {
            context: context.into(),
            cause,
        }
    }

    /// A login error of [`crate::login::LoginMachine`], which knows no
    /// portal, with the portal that answered filled in.
    pub(crate) fn at_portal(self, at: &str) -> Error {
        match self {
            Error::LoginRejected { target, status, .. } => Error::LoginRejected {
                target,
                portal: at.to_owned(),
                status,
            },
            Error::Redirected {
                target,
                to,
                permanent,
                ..
            } => Error::Redirected {
                target,
                portal: at.to_owned(),
                to,
                permanent,
            },
            other => other,
        }
    }

    /// The errno a block device reports for this failure, as Linux's
    /// block layer maps a SCSI disk's (`blk_status_to_errno`): a thin LUN
    /// out of space (DATA PROTECT, SPACE ALLOCATION FAILED WRITE PROTECT)
    /// is ENOSPC, another DATA PROTECT EROFS (write protected), ILLEGAL
    /// REQUEST EINVAL, anything else EIO.
    pub fn errno(&self) -> i32 {
        use blockwire_pdu::scsi::SenseKey;
        let Error::Scsi(e) = self else {
            return libc::EIO;
        };
        match e.sense_code() {
            Some((SenseKey::DataProtect, 0x27, 0x07)) => libc::ENOSPC,
            Some((SenseKey::DataProtect, ..)) => libc::EROFS,
            Some((SenseKey::IllegalRequest, ..)) => libc::EINVAL,
            _ => libc::EIO,
        }
    }

    /// True for errors after which a new login may succeed (lost connection,
    /// timeouts, target temporarily unavailable).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Io { .. }
            | Error::Timeout(_)
            | Error::Decode(_)
            | Error::Protocol(_)
            | Error::OffloadInterrupted(_) => true,
            Error::LoginRejected { status, .. } => status.class == 3 || status.class == 1,
            _ => false,
        }
    }
}

/// Result with the initiator's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use blockwire_pdu::scsi::{Asc, SenseKey};

    fn failed(key: SenseKey, asc: Asc) -> Error {
        Error::Scsi(ScsiError {
            lun: 0,
            opcode: 0x8a,
            status: ScsiStatus::CHECK_CONDITION,
            sense: Some(Sense::new(key, asc)),
        })
    }

    /// A thin LUN out of space is ENOSPC to the file system above, as on a
    /// Linux SCSI disk, not a read-only device or an I/O error.
    #[test]
    fn errnos_follow_the_block_layer() {
        let cases = [
            (
                failed(
                    SenseKey::DataProtect,
                    Asc::SPACE_ALLOCATION_FAILED_WRITE_PROTECT,
                ),
                libc::ENOSPC,
            ),
            (
                failed(SenseKey::DataProtect, Asc::WRITE_PROTECTED),
                libc::EROFS,
            ),
            (
                failed(SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB),
                libc::EINVAL,
            ),
            (
                failed(SenseKey::MediumError, Asc::UNRECOVERED_READ_ERROR),
                libc::EIO,
            ),
            (Error::Closed, libc::EIO),
        ];
        for (e, errno) in cases {
            assert_eq!(e.errno(), errno, "{e}");
        }
    }
}
