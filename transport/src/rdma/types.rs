//! Plain data types of the verbs-shaped interface: access flags, scatter-gather
//! entries, work requests, completions, queue-pair capabilities and the error type.

use std::fmt;

/// Memory-region access rights (the values of `IBV_ACCESS_*`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AccessFlags(u32);

impl AccessFlags {
    /// No access beyond local reads (always allowed).
    pub const NONE: AccessFlags = AccessFlags(0);
    /// The local adapter may write the region (RECV targets, RDMA READ sinks).
    pub const LOCAL_WRITE: AccessFlags = AccessFlags(1);
    /// Peers may RDMA WRITE into the region (requires `LOCAL_WRITE` in verbs).
    pub const REMOTE_WRITE: AccessFlags = AccessFlags(2);
    /// Peers may RDMA READ from the region.
    pub const REMOTE_READ: AccessFlags = AccessFlags(4);
    /// All of the above.
    pub const ALL: AccessFlags = AccessFlags(7);

    /// Raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }
    /// Build from raw bits, keeping only known flags.
    pub const fn from_bits_truncate(bits: u32) -> AccessFlags {
        AccessFlags(bits & 7)
    }
    /// Whether every flag of `other` is set in `self`.
    pub const fn contains(self, other: AccessFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for AccessFlags {
    type Output = AccessFlags;
    fn bitor(self, rhs: AccessFlags) -> AccessFlags {
        AccessFlags(self.0 | rhs.0)
    }
}

impl fmt::Debug for AccessFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if self.contains(Self::LOCAL_WRITE) {
            parts.push("LOCAL_WRITE");
        }
        if self.contains(Self::REMOTE_WRITE) {
            parts.push("REMOTE_WRITE");
        }
        if self.contains(Self::REMOTE_READ) {
            parts.push("REMOTE_READ");
        }
        if parts.is_empty() {
            parts.push("NONE");
        }
        write!(f, "{}", parts.join("|"))
    }
}

/// One local scatter-gather entry: `length` bytes at `addr`, covered by the memory region
/// whose local key is `lkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// A remote buffer descriptor as advertised to a peer: `len` bytes at `addr` under `rkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteBuf {
    pub addr: u64,
    pub len: u64,
    pub rkey: u32,
}

/// What a send-queue work request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// Two-sided send, consumed by a receive posted at the peer.
    Send,
    /// One-sided write of the local SGL into `remote_addr..` under `rkey`.
    RdmaWrite { remote_addr: u64, rkey: u32 },
    /// One-sided read of `remote_addr..` (SGL total length) into the local SGL.
    RdmaRead { remote_addr: u64, rkey: u32 },
}

/// A send-queue work request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub op: SendOp,
    pub sgl: Vec<Sge>,
    /// Signalled requests produce a completion on success; unsignalled ones only on error.
    pub signaled: bool,
}

/// A receive-queue work request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sgl: Vec<Sge>,
}

/// Operation a completion reports on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    Recv,
}

impl From<SendOp> for WcOpcode {
    fn from(op: SendOp) -> WcOpcode {
        match op {
            SendOp::Send => WcOpcode::Send,
            SendOp::RdmaWrite { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
        }
    }
}

/// Completion status (the subset of `ibv_wc_status` an RC queue pair produces).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcStatus {
    Success,
    /// A receive buffer was too small for the incoming message (receiver side).
    LocalLengthError,
    /// A local SGE named an invalid lkey, lay outside its region or lacked LOCAL_WRITE.
    LocalProtectionError,
    /// The peer refused the access: bad rkey, range outside the region, missing permission.
    RemoteAccessError,
    /// The peer could not accept the request (e.g. its receive buffer was too small).
    RemoteInvalidRequest,
    /// The peer failed while executing the request.
    RemoteOperationError,
    /// The queue pair was in the error state; the request was not executed.
    WrFlushError,
    /// The transport failed (connection lost).
    TransportError,
}

impl WcStatus {
    pub fn is_ok(self) -> bool {
        self == WcStatus::Success
    }
    /// Compact wire code (soft backend).
    pub(crate) fn code(self) -> u8 {
        match self {
            WcStatus::Success => 0,
            WcStatus::LocalLengthError => 1,
            WcStatus::LocalProtectionError => 2,
            WcStatus::RemoteAccessError => 3,
            WcStatus::RemoteInvalidRequest => 4,
            WcStatus::RemoteOperationError => 5,
            WcStatus::WrFlushError => 6,
            WcStatus::TransportError => 7,
        }
    }
    pub(crate) fn from_code(c: u8) -> Option<WcStatus> {
        Some(match c {
            0 => WcStatus::Success,
            1 => WcStatus::LocalLengthError,
            2 => WcStatus::LocalProtectionError,
            3 => WcStatus::RemoteAccessError,
            4 => WcStatus::RemoteInvalidRequest,
            5 => WcStatus::RemoteOperationError,
            6 => WcStatus::WrFlushError,
            7 => WcStatus::TransportError,
            _ => return None,
        })
    }
}

/// A work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    /// Bytes transferred (for RECV: the message length).
    pub byte_len: u32,
}

/// Queue-pair sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_sge: u32,
}

impl Default for QpCaps {
    fn default() -> QpCaps {
        QpCaps {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_sge: 16,
        }
    }
}

/// Errors of the RDMA interface (as opposed to completion statuses, which report the
/// outcome of individual work requests).
#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    /// No usable RDMA device. `missing` names what was not found; the message says how to
    /// fall back.
    #[error(
        "no RDMA device: {missing}; load rdma_rxe/siw (`rdma link add`) or install an RDMA NIC, \
         or use the soft RDMA backend (RDMA over TCP); iSCSI sessions fall back to plain TCP"
    )]
    NoDevice { missing: String },
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("{queue} queue full ({depth} outstanding work requests)")]
    QueueFull { queue: &'static str, depth: u32 },
    #[error("queue pair is in the error state")]
    QpError,
    #[error("connection rejected by peer ({} bytes of private data)", private_data.len())]
    Rejected { private_data: Vec<u8> },
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("memory registration failed: {0}")]
    Registration(String),
    #[error("not supported by this backend: {0}")]
    Unsupported(&'static str),
    #[error("{call} failed: {source}")]
    Verbs {
        call: &'static str,
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, RdmaError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_flags() {
        let f = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
        assert!(f.contains(AccessFlags::LOCAL_WRITE));
        assert!(!f.contains(AccessFlags::REMOTE_WRITE));
        assert_eq!(format!("{f:?}"), "LOCAL_WRITE|REMOTE_READ");
        assert_eq!(AccessFlags::from_bits_truncate(0xff), AccessFlags::ALL);
    }

    #[test]
    fn status_codes_roundtrip() {
        for c in 0..=7u8 {
            assert_eq!(WcStatus::from_code(c).unwrap().code(), c);
        }
        assert!(WcStatus::from_code(8).is_none());
    }

    #[test]
    fn no_device_message_names_fallback() {
        let e = RdmaError::NoDevice {
            missing: "ibv_get_device_list returned 0 devices".into(),
        };
        let s = e.to_string();
        assert!(s.starts_with("no RDMA device"));
        assert!(s.contains("soft RDMA backend"));
        assert!(s.contains("plain TCP"));
    }
}
