//! What the initiator offers and how it behaves.

use std::time::Duration;

use blockwire_pdu::chap::{ChapAlgorithm, Credential};
use blockwire_pdu::keys::{AuthMethod, Digest, LocalConfig};

/// CHAP settings for a login.
#[derive(Debug, Clone)]
pub struct ChapConfig {
    /// Our user name and secret (CHAP_N, and the secret the target checks).
    pub credential: Credential,
    /// For mutual CHAP: the name and secret the target must prove.
    pub mutual: Option<Credential>,
    /// Algorithms offered, most preferred first (empty: all, strongest first).
    pub algorithms: Vec<ChapAlgorithm>,
}

impl ChapConfig {
    /// One-way CHAP with `user`/`secret`.
    pub fn new(user: impl Into<String>, secret: &str) -> ChapConfig {
        ChapConfig {
            credential: Credential::new(user, secret),
            mutual: None,
            algorithms: Vec::new(),
        }
    }

    /// Adds mutual CHAP: the target must answer as `user` with `secret`.
    pub fn with_mutual(mut self, user: impl Into<String>, secret: &str) -> ChapConfig {
        self.mutual = Some(Credential::new(user, secret));
        self
    }

    /// Restricts the algorithms offered.
    pub fn with_algorithms(mut self, algorithms: Vec<ChapAlgorithm>) -> ChapConfig {
        self.algorithms = algorithms;
        self
    }
}

/// Bounded, backed-off reconnection after a lost connection.
#[derive(Debug, Clone, Copy)]
pub struct RecoveryPolicy {
    /// Login attempts before the session is declared lost (0: no recovery).
    pub max_attempts: u32,
    /// Delay before the first attempt; doubled after each failure.
    pub initial_backoff: Duration,
    /// Upper bound of the delay.
    pub max_backoff: Duration,
}

impl Default for RecoveryPolicy {
    fn default() -> Self {
        RecoveryPolicy {
            max_attempts: 8,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }
    }
}

/// The initiator's settings. [`InitiatorConfig::new`] gives open-iscsi's
/// defaults: ImmediateData=Yes, InitialR2T=No, FirstBurstLength 256 KiB,
/// MaxBurstLength 16776192 (16 MiB - 1 KiB, the RFC maximum rounded as open-iscsi does), MaxRecvDataSegmentLength 256 KiB, no digests.
#[derive(Debug, Clone)]
pub struct InitiatorConfig {
    /// Our iSCSI name (InitiatorName).
    pub initiator_name: String,
    /// Mixed into the ISID so one host can hold several sessions to a target.
    pub isid_qualifier: u16,
    /// CHAP for normal sessions (None: AuthMethod=None).
    pub chap: Option<ChapConfig>,
    /// CHAP for discovery sessions.
    pub discovery_chap: Option<ChapConfig>,
    /// Offer HeaderDigest=CRC32C (and insist on it).
    pub header_digest: bool,
    /// Offer DataDigest=CRC32C (and insist on it).
    pub data_digest: bool,
    /// ImmediateData offered.
    pub immediate_data: bool,
    /// InitialR2T offered.
    pub initial_r2t: bool,
    /// FirstBurstLength offered.
    pub first_burst_length: u32,
    /// MaxBurstLength offered.
    pub max_burst_length: u32,
    /// MaxRecvDataSegmentLength declared.
    pub max_recv_data_segment_length: u32,
    /// DataPDUInOrder offered (default Yes). No lets the target send
    /// Data-In PDUs in any order within a sequence (each is placed by its
    /// BufferOffset); the target must answer No too for it to apply.
    pub data_pdu_in_order: bool,
    /// Commands in flight at most (also bounded by the target's CmdSN window).
    pub queue_depth: usize,
    /// Bound on connect and login.
    pub login_timeout: Duration,
    /// Idle time after which a keepalive NOP-Out is sent (None: never).
    pub nop_interval: Option<Duration>,
    /// How long a keepalive NOP-Out may wait for its NOP-In before the
    /// connection is declared dead.
    pub nop_timeout: Duration,
    /// How long a READ or WRITE may wait for its answer before it is
    /// aborted (ABORT TASK) and sent again, at most twice (None: no limit);
    /// a SYNCHRONIZE CACHE may wait twice as long. A target may end a
    /// command without a word: a LOGICAL UNIT RESET from another initiator
    /// aborts it silently (SAM-5 5.6, TAS=0). Other commands (FORMAT UNIT,
    /// SANITIZE, WRITE SAME, EXTENDED COPY, ...) may rightly run long and
    /// are never aborted. Over iSER, and for an RDMA-assisted session's
    /// offloaded commands, a command past its deadline is not aborted but
    /// gives its connection up (its buffers are the target's until it
    /// ends): an iSER session then fails; an RDMA-assisted one logs in again
    /// and sends the command again over TCP.
    pub command_timeout: Option<Duration>,
    /// How long the connection may take to accept one PDU sequence (a
    /// command with its immediate and unsolicited data, a burst of
    /// Data-Out, a NOP-Out) before it is declared dead and recovered. A
    /// target that stops reading (its process hung, its host gone with the
    /// TCP window shut) would otherwise hold the connection's writer, and
    /// every command and keepalive behind it, for good.
    pub send_timeout: Duration,
    /// Reconnection after a lost connection.
    pub recovery: RecoveryPolicy,
    /// Vendor keys (`X-...`) offered in the operational stage of normal
    /// sessions; the target's answers come back in the login outcome
    /// (e.g. `X-io.blockwire.RdmaOffload`, see `crate::rdma`).
    pub vendor_offers: Vec<(String, String)>,
}

impl InitiatorConfig {
    /// open-iscsi's defaults for `initiator_name`.
    pub fn new(initiator_name: impl Into<String>) -> InitiatorConfig {
        InitiatorConfig {
            initiator_name: initiator_name.into(),
            isid_qualifier: 0,
            chap: None,
            discovery_chap: None,
            header_digest: false,
            data_digest: false,
            immediate_data: true,
            initial_r2t: false,
            first_burst_length: 256 * 1024,
            max_burst_length: 16_776_192,
            max_recv_data_segment_length: 256 * 1024,
            data_pdu_in_order: true,
            queue_depth: 32,
            login_timeout: Duration::from_secs(15),
            nop_interval: Some(Duration::from_secs(5)),
            nop_timeout: Duration::from_secs(10),
            command_timeout: Some(Duration::from_secs(60)),
            send_timeout: Duration::from_secs(60),
            recovery: RecoveryPolicy::default(),
            vendor_offers: Vec::new(),
        }
    }

    /// Turns both digests on or off.
    pub fn with_digests(mut self, header: bool, data: bool) -> InitiatorConfig {
        self.header_digest = header;
        self.data_digest = data;
        self
    }

    /// Sets CHAP for normal sessions.
    pub fn with_chap(mut self, chap: ChapConfig) -> InitiatorConfig {
        self.chap = Some(chap);
        self
    }

    /// Offers DataPDUInOrder=Yes (`true`, the default) or No.
    pub fn with_data_pdu_in_order(mut self, in_order: bool) -> InitiatorConfig {
        self.data_pdu_in_order = in_order;
        self
    }

    /// Sets the command timeout (see [`InitiatorConfig::command_timeout`]).
    pub fn with_command_timeout(mut self, timeout: Option<Duration>) -> InitiatorConfig {
        self.command_timeout = timeout;
        self
    }

    /// Sets the queue depth.
    pub fn with_queue_depth(mut self, depth: usize) -> InitiatorConfig {
        self.queue_depth = depth.max(1);
        self
    }

    /// The key-engine configuration for a login to `target` (None:
    /// discovery), with or without CHAP.
    pub(crate) fn local_config(&self, target: Option<&str>, chap: bool) -> LocalConfig {
        let base = match target {
            Some(t) => LocalConfig::initiator(&self.initiator_name, t),
            None => LocalConfig::discovery(&self.initiator_name),
        };
        let digest = |on: bool| {
            if on {
                vec![Digest::Crc32c]
            } else {
                vec![Digest::None]
            }
        };
        LocalConfig {
            auth_methods: if chap {
                vec![AuthMethod::Chap]
            } else {
                vec![AuthMethod::None]
            },
            header_digests: digest(self.header_digest),
            data_digests: digest(self.data_digest && target.is_some()),
            immediate_data: self.immediate_data,
            initial_r2t: self.initial_r2t,
            first_burst_length: self.first_burst_length.min(self.max_burst_length),
            max_burst_length: self.max_burst_length,
            max_recv_data_segment_length: self.max_recv_data_segment_length,
            // Only normal sessions carry data.
            data_pdu_in_order: self.data_pdu_in_order || target.is_none(),
            // The wait before a login after a lost connection is the
            // target's to ask for (the key's result is the larger value,
            // RFC 7143 §13.15); we need none of our own.
            default_time2wait: 0,
            vendor_keys: if target.is_some() {
                self.vendor_offers.iter().map(|(k, _)| k.clone()).collect()
            } else {
                Vec::new()
            },
            ..base
        }
    }
}
