//! The outcome of a negotiation: every session/connection parameter with its
//! RFC 7143 (and RFC 7145) default.
//!
//! Fields are named by who they belong to (initiator/target), not by "local"
//! and "peer", so that the initiator's and the target's copies of a finished
//! negotiation compare equal.

/// Digest chosen for headers or data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Digest {
    /// No digest (the default).
    #[default]
    None,
    /// CRC32C (Castagnoli).
    Crc32c,
}

impl Digest {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Digest::None => "None",
            Digest::Crc32c => "CRC32C",
        }
    }

    /// Parses a wire name.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "None" => Some(Digest::None),
            "CRC32C" => Some(Digest::Crc32c),
            _ => None,
        }
    }
}

/// Authentication method (RFC 7143 13.1 / 12.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthMethod {
    /// No authentication (the default).
    #[default]
    None,
    /// CHAP (RFC 1994), the one method the target's auth module implements.
    Chap,
    /// Kerberos V5: recognised, never selected by this engine unless configured.
    Krb5,
    /// SRP: recognised, never selected unless configured.
    Srp,
    /// SPKM1: recognised, never selected unless configured.
    Spkm1,
    /// SPKM2: recognised, never selected unless configured.
    Spkm2,
}

impl AuthMethod {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthMethod::None => "None",
            AuthMethod::Chap => "CHAP",
            AuthMethod::Krb5 => "KRB5",
            AuthMethod::Srp => "SRP",
            AuthMethod::Spkm1 => "SPKM1",
            AuthMethod::Spkm2 => "SPKM2",
        }
    }

    /// Parses a wire name.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "None" => AuthMethod::None,
            "CHAP" => AuthMethod::Chap,
            "KRB5" => AuthMethod::Krb5,
            "SRP" => AuthMethod::Srp,
            "SPKM1" => AuthMethod::Spkm1,
            "SPKM2" => AuthMethod::Spkm2,
            _ => return None,
        })
    }
}

/// Session type (RFC 7143 13.21).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionType {
    /// A normal session with LUNs (the default).
    #[default]
    Normal,
    /// A discovery session: SendTargets only; most operational keys are
    /// irrelevant.
    Discovery,
}

impl SessionType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionType::Normal => "Normal",
            SessionType::Discovery => "Discovery",
        }
    }

    /// Parses a wire name.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "Normal" => Some(SessionType::Normal),
            "Discovery" => Some(SessionType::Discovery),
            _ => None,
        }
    }
}

/// Task reporting mode (RFC 7143 13.23).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskReporting {
    /// RFC 3720 semantics (the default).
    #[default]
    Rfc3720,
    /// Response fence semantics.
    ResponseFence,
    /// Fast abort semantics.
    FastAbort,
}

impl TaskReporting {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskReporting::Rfc3720 => "RFC3720",
            TaskReporting::ResponseFence => "ResponseFence",
            TaskReporting::FastAbort => "FastAbort",
        }
    }

    /// Parses a wire name.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "RFC3720" => Some(TaskReporting::Rfc3720),
            "ResponseFence" => Some(TaskReporting::ResponseFence),
            "FastAbort" => Some(TaskReporting::FastAbort),
            _ => None,
        }
    }
}

/// All negotiated parameters of a session and its connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionParams {
    /// SessionType (Normal).
    pub session_type: SessionType,
    /// InitiatorName as declared by the initiator.
    pub initiator_name: Option<String>,
    /// TargetName as declared by the initiator at login.
    pub target_name: Option<String>,
    /// InitiatorAlias.
    pub initiator_alias: Option<String>,
    /// TargetAlias.
    pub target_alias: Option<String>,
    /// TargetPortalGroupTag declared by the target.
    pub target_portal_group_tag: Option<u16>,
    /// AuthMethod (None).
    pub auth_method: AuthMethod,
    /// HeaderDigest (None).
    pub header_digest: Digest,
    /// DataDigest (None).
    pub data_digest: Digest,
    /// MaxConnections (1).
    pub max_connections: u32,
    /// InitialR2T (Yes).
    pub initial_r2t: bool,
    /// ImmediateData (Yes).
    pub immediate_data: bool,
    /// MaxRecvDataSegmentLength the initiator declared: the most the target
    /// may put in one PDU to the initiator (8192).
    pub initiator_max_recv_data_segment_length: u32,
    /// MaxRecvDataSegmentLength the target declared: the most the initiator
    /// may put in one PDU to the target (8192).
    pub target_max_recv_data_segment_length: u32,
    /// MaxBurstLength (262144).
    pub max_burst_length: u32,
    /// FirstBurstLength (65536).
    pub first_burst_length: u32,
    /// DefaultTime2Wait in seconds (2).
    pub default_time2wait: u32,
    /// DefaultTime2Retain in seconds (20).
    pub default_time2retain: u32,
    /// MaxOutstandingR2T (1).
    pub max_outstanding_r2t: u32,
    /// DataPDUInOrder (Yes).
    pub data_pdu_in_order: bool,
    /// DataSequenceInOrder (Yes).
    pub data_sequence_in_order: bool,
    /// ErrorRecoveryLevel (0).
    pub error_recovery_level: u8,
    /// TaskReporting (RFC3720).
    pub task_reporting: TaskReporting,
    /// iSCSIProtocolLevel (1).
    pub iscsi_protocol_level: u32,
    /// iSER RDMAExtensions (No).
    pub rdma_extensions: bool,
    /// iSER InitiatorRecvDataSegmentLength (8192).
    pub initiator_recv_data_segment_length: u32,
    /// iSER TargetRecvDataSegmentLength (8192).
    pub target_recv_data_segment_length: u32,
    /// iSER MaxOutstandingUnexpectedPDUs; 0 means no limit (0).
    pub max_outstanding_unexpected_pdus: u32,
}

impl Default for SessionParams {
    fn default() -> Self {
        Self {
            session_type: SessionType::Normal,
            initiator_name: None,
            target_name: None,
            initiator_alias: None,
            target_alias: None,
            target_portal_group_tag: None,
            auth_method: AuthMethod::None,
            header_digest: Digest::None,
            data_digest: Digest::None,
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            initiator_max_recv_data_segment_length: 8192,
            target_max_recv_data_segment_length: 8192,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
            task_reporting: TaskReporting::Rfc3720,
            iscsi_protocol_level: 1,
            rdma_extensions: false,
            initiator_recv_data_segment_length: 8192,
            target_recv_data_segment_length: 8192,
            max_outstanding_unexpected_pdus: 0,
        }
    }
}

impl SessionParams {
    /// True when FirstBurstLength matters: RFC 7143 13.14 makes it irrelevant
    /// when InitialR2T=Yes and ImmediateData=No (no unsolicited data at all).
    pub fn first_burst_relevant(&self) -> bool {
        !self.initial_r2t || self.immediate_data
    }
}
