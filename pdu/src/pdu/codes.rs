//! Small enumerated fields of iSCSI PDUs.
//!
//! Each enum keeps unknown wire values in an `Other` variant instead of
//! failing: a target must answer a reserved value with the right Reject or
//! response code, which it cannot do if decoding already threw it away.

/// Defines a `u8` wire enum with named values and an `Other` fallback.
macro_rules! wire_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $value:expr => $text:expr,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
            /// A value this crate has no name for (reserved or vendor).
            Other(u8),
        }

        impl $name {
            /// Decodes the wire value.
            pub fn from_u8(value: u8) -> Self {
                match value {
                    $($value => $name::$variant,)*
                    other => $name::Other(other),
                }
            }

            /// The wire value.
            pub fn to_u8(self) -> u8 {
                match self {
                    $($name::$variant => $value,)*
                    $name::Other(v) => v,
                }
            }

            /// The name used by RFC 7143, or "reserved" for unknown values.
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                    $name::Other(_) => "reserved",
                }
            }
        }

        impl From<u8> for $name {
            fn from(v: u8) -> Self {
                Self::from_u8(v)
            }
        }
    };
}

wire_enum!(
    /// SCSI task attribute of a SCSI Command PDU (ATTR, 3 bits).
    TaskAttr {
        /// Untagged.
        Untagged = 0 => "untagged",
        /// Simple.
        Simple = 1 => "simple",
        /// Ordered.
        Ordered = 2 => "ordered",
        /// Head of queue.
        HeadOfQueue = 3 => "head of queue",
        /// ACA.
        Aca = 4 => "ACA",
    }
);

wire_enum!(
    /// Task management function (RFC 7143 §11.5.1).
    TmfFunction {
        /// ABORT TASK.
        AbortTask = 1 => "ABORT TASK",
        /// ABORT TASK SET.
        AbortTaskSet = 2 => "ABORT TASK SET",
        /// CLEAR ACA.
        ClearAca = 3 => "CLEAR ACA",
        /// CLEAR TASK SET.
        ClearTaskSet = 4 => "CLEAR TASK SET",
        /// LOGICAL UNIT RESET.
        LogicalUnitReset = 5 => "LOGICAL UNIT RESET",
        /// TARGET WARM RESET.
        TargetWarmReset = 6 => "TARGET WARM RESET",
        /// TARGET COLD RESET.
        TargetColdReset = 7 => "TARGET COLD RESET",
        /// TASK REASSIGN.
        TaskReassign = 8 => "TASK REASSIGN",
    }
);

wire_enum!(
    /// Task management function response (RFC 7143 §11.6.1).
    TmfResponse {
        /// Function complete.
        FunctionComplete = 0 => "function complete",
        /// Task does not exist.
        TaskDoesNotExist = 1 => "task does not exist",
        /// LUN does not exist.
        LunDoesNotExist = 2 => "LUN does not exist",
        /// Task still allegiant.
        TaskStillAllegiant = 3 => "task still allegiant",
        /// Task allegiance reassignment not supported.
        ReassignmentNotSupported = 4 => "task allegiance reassignment not supported",
        /// Task management function not supported.
        NotSupported = 5 => "task management function not supported",
        /// Function authorization failed.
        AuthorizationFailed = 6 => "function authorization failed",
        /// Function rejected.
        Rejected = 255 => "function rejected",
    }
);

wire_enum!(
    /// iSCSI service response of a SCSI Response PDU (RFC 7143 §11.4.3).
    ServiceResponse {
        /// Command completed at target (the SCSI status tells how).
        CommandCompleted = 0 => "command completed at target",
        /// Target failure.
        TargetFailure = 1 => "target failure",
    }
);

wire_enum!(
    /// Reason code of a Logout Request (RFC 7143 §11.14.1).
    LogoutReason {
        /// Close the session.
        CloseSession = 0 => "close the session",
        /// Close the connection.
        CloseConnection = 1 => "close the connection",
        /// Remove the connection for recovery.
        RemoveForRecovery = 2 => "remove the connection for recovery",
    }
);

wire_enum!(
    /// Response of a Logout Response (RFC 7143 §11.15.1).
    LogoutResponseCode {
        /// Connection or session closed successfully.
        Closed = 0 => "closed successfully",
        /// CID not found.
        CidNotFound = 1 => "CID not found",
        /// Connection recovery is not supported.
        RecoveryNotSupported = 2 => "connection recovery is not supported",
        /// Cleanup failed for various reasons.
        CleanupFailed = 3 => "cleanup failed",
    }
);

wire_enum!(
    /// SNACK type (RFC 7143 §11.16.1).
    SnackType {
        /// Data/R2T SNACK.
        DataR2t = 0 => "Data/R2T SNACK",
        /// Status SNACK.
        Status = 1 => "Status SNACK",
        /// DataACK.
        DataAck = 2 => "DataACK",
        /// R-Data SNACK.
        RData = 3 => "R-Data SNACK",
    }
);

wire_enum!(
    /// Reject reason (RFC 7143 §11.17.1).
    RejectReason {
        /// Data (payload) digest error.
        DataDigestError = 0x02 => "data digest error",
        /// SNACK reject.
        SnackReject = 0x03 => "SNACK reject",
        /// Protocol error.
        ProtocolError = 0x04 => "protocol error",
        /// Command not supported.
        CommandNotSupported = 0x05 => "command not supported",
        /// Immediate command reject: too many immediate commands.
        ImmediateCommandReject = 0x06 => "immediate command reject",
        /// Task in progress.
        TaskInProgress = 0x07 => "task in progress",
        /// Invalid data ack.
        InvalidDataAck = 0x08 => "invalid data ack",
        /// Invalid PDU field.
        InvalidPduField = 0x09 => "invalid PDU field",
        /// Long operation reject: cannot generate a Target Transfer Tag, out of resources.
        LongOperationReject = 0x0a => "long op reject",
        /// Deprecated (negotiation reset).
        NegotiationReset = 0x0b => "negotiation reset",
        /// Waiting for logout.
        WaitingForLogout = 0x0c => "waiting for logout",
    }
);

wire_enum!(
    /// Asynchronous event (RFC 7143 §11.9.1).
    AsyncEvent {
        /// A SCSI asynchronous event, reported in the sense data.
        ScsiEvent = 0 => "SCSI asynchronous event",
        /// The target requests a logout.
        LogoutRequest = 1 => "logout request",
        /// The target will drop a connection.
        ConnectionDrop = 2 => "connection drop",
        /// The target will drop all connections of the session.
        SessionDrop = 3 => "session drop",
        /// The target requests parameter negotiation.
        NegotiationRequest = 4 => "negotiation request",
        /// All active tasks for a LU with a matching LUN are being terminated.
        TaskTermination = 5 => "task termination",
        /// Vendor-specific event.
        Vendor = 255 => "vendor-specific",
    }
);

/// Login stage (CSG/NSG, RFC 7143 §11.12.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// SecurityNegotiation.
    Security,
    /// LoginOperationalNegotiation.
    Operational,
    /// The reserved value 2.
    Reserved,
    /// FullFeaturePhase.
    FullFeature,
}

impl Stage {
    /// Decodes the two-bit stage value.
    pub fn from_bits(bits: u8) -> Stage {
        match bits & 3 {
            0 => Stage::Security,
            1 => Stage::Operational,
            2 => Stage::Reserved,
            _ => Stage::FullFeature,
        }
    }

    /// The two-bit stage value.
    pub fn bits(self) -> u8 {
        match self {
            Stage::Security => 0,
            Stage::Operational => 1,
            Stage::Reserved => 2,
            Stage::FullFeature => 3,
        }
    }
}

/// Login status class and detail (RFC 7143 §11.13.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LoginStatus {
    /// Status-Class: 0 success, 1 redirection, 2 initiator error, 3 target error.
    pub class: u8,
    /// Status-Detail within the class.
    pub detail: u8,
}

impl LoginStatus {
    /// Login is proceeding OK.
    pub const SUCCESS: LoginStatus = LoginStatus::new(0x00, 0x00);
    /// The target has moved temporarily.
    pub const TARGET_MOVED_TEMPORARILY: LoginStatus = LoginStatus::new(0x01, 0x01);
    /// The target has moved permanently.
    pub const TARGET_MOVED_PERMANENTLY: LoginStatus = LoginStatus::new(0x01, 0x02);
    /// Miscellaneous initiator error.
    pub const INITIATOR_ERROR: LoginStatus = LoginStatus::new(0x02, 0x00);
    /// The initiator could not be authenticated.
    pub const AUTHENTICATION_FAILURE: LoginStatus = LoginStatus::new(0x02, 0x01);
    /// The initiator is not allowed access to the target.
    pub const AUTHORIZATION_FAILURE: LoginStatus = LoginStatus::new(0x02, 0x02);
    /// The requested target name does not exist here.
    pub const NOT_FOUND: LoginStatus = LoginStatus::new(0x02, 0x03);
    /// The target has been removed.
    pub const TARGET_REMOVED: LoginStatus = LoginStatus::new(0x02, 0x04);
    /// The requested iSCSI version range is not supported.
    pub const UNSUPPORTED_VERSION: LoginStatus = LoginStatus::new(0x02, 0x05);
    /// Too many connections on this session.
    pub const TOO_MANY_CONNECTIONS: LoginStatus = LoginStatus::new(0x02, 0x06);
    /// A required parameter is missing.
    pub const MISSING_PARAMETER: LoginStatus = LoginStatus::new(0x02, 0x07);
    /// The target does not support session spanning to this connection.
    pub const CANT_INCLUDE_IN_SESSION: LoginStatus = LoginStatus::new(0x02, 0x08);
    /// The session type is not supported.
    pub const SESSION_TYPE_NOT_SUPPORTED: LoginStatus = LoginStatus::new(0x02, 0x09);
    /// An attempt to add a connection to a nonexistent session.
    pub const SESSION_DOES_NOT_EXIST: LoginStatus = LoginStatus::new(0x02, 0x0a);
    /// A non-login request was sent during login.
    pub const INVALID_DURING_LOGIN: LoginStatus = LoginStatus::new(0x02, 0x0b);
    /// Target hardware or software error.
    pub const TARGET_ERROR: LoginStatus = LoginStatus::new(0x03, 0x00);
    /// The iSCSI service or target is not currently operational.
    pub const SERVICE_UNAVAILABLE: LoginStatus = LoginStatus::new(0x03, 0x01);
    /// The target has insufficient session, connection or other resources.
    pub const OUT_OF_RESOURCES: LoginStatus = LoginStatus::new(0x03, 0x02);

    /// A status from its class and detail bytes.
    pub const fn new(class: u8, detail: u8) -> LoginStatus {
        LoginStatus { class, detail }
    }

    /// Whether the login may proceed.
    pub fn is_success(self) -> bool {
        self.class == 0
    }

    /// RFC 7143's description of this status.
    pub fn name(self) -> &'static str {
        match (self.class, self.detail) {
            (0, 0) => "success",
            (1, 1) => "target moved temporarily",
            (1, 2) => "target moved permanently",
            (2, 0) => "initiator error",
            (2, 1) => "authentication failure",
            (2, 2) => "authorization failure",
            (2, 3) => "target not found",
            (2, 4) => "target removed",
            (2, 5) => "unsupported version",
            (2, 6) => "too many connections",
            (2, 7) => "missing parameter",
            (2, 8) => "can't include in session",
            (2, 9) => "session type not supported",
            (2, 0x0a) => "session does not exist",
            (2, 0x0b) => "invalid request during login",
            (3, 0) => "target error",
            (3, 1) => "service unavailable",
            (3, 2) => "out of resources",
            _ => "unknown login status",
        }
    }
}

impl std::fmt::Display for LoginStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({:#04x}/{:#04x})",
            self.name(),
            self.class,
            self.detail
        )
    }
}
