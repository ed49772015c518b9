//! The negotiation engine both sides use (RFC 7143 sections 6.2-6.3, 13).
//!
//! A [`Negotiator`] holds what this side supports ([`LocalConfig`]), the
//! outcome so far ([`SessionParams`]) and the bookkeeping that enforces the
//! RFC's "each key once" rules. It is sans-IO: the caller moves the pairs.
//!
//! One loop serves both roles: [`Negotiator::offer`] yields the keys this side
//! starts (declarations and offers), [`Negotiator::receive`] takes the peer's
//! pairs — answers to our offers and the peer's own offers alike — and
//! returns our answers plus the pairs the caller must handle itself
//! (CHAP_*, SendTargets, vendor keys).

use std::collections::{BTreeMap, BTreeSet};

use thiserror::Error;

use super::params::{AuthMethod, Digest, SessionParams, SessionType, TaskReporting};
use super::rules::{self, KeyDef, KeyId, Kind, Senders, Spec, Usage};
use super::text::TextPairs;
use super::value::{format_bool, parse_bool, parse_number, split_list};

/// Answer constant: the key is unknown to the responder.
pub const NOT_UNDERSTOOD: &str = "NotUnderstood";
/// Answer constant: the key does not matter in this context.
pub const IRRELEVANT: &str = "Irrelevant";
/// Answer constant: the offered value is illegal or not acceptable.
pub const REJECT: &str = "Reject";

/// Longest iSCSI name (RFC 7143 4.2.7.1: 223 bytes).
const MAX_ISCSI_NAME_LEN: usize = 223;

/// The most distinct keys a peer may send in one negotiation (a login, or
/// one Text request/response sequence). RFC 7143 and RFC 7145 define about
/// 40 and initiators add a few X- keys of their own; each is remembered
/// for the negotiation (no key may come twice), so thousands of made-up
/// keys, each answered NotUnderstood or not at all, would otherwise be held
/// for the connection's life.
pub const MAX_DISTINCT_KEYS: usize = 1024;

/// Which end of the session this negotiator speaks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The iSCSI initiator.
    Initiator,
    /// The iSCSI target.
    Target,
}

impl Role {
    fn peer(self) -> Role {
        match self {
            Role::Initiator => Role::Target,
            Role::Target => Role::Initiator,
        }
    }
}

/// The stage the exchanged text belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Login, security negotiation stage (CSG=0).
    Security,
    /// Login, operational negotiation stage (CSG=1).
    Operational,
    /// Text requests/responses after login.
    FullFeature,
}

/// A negotiation failure: the login must fail (target: Login reject,
/// initiator: drop the connection), or the configuration is unusable.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NegotiationError {
    /// The peer sent a key a second time (RFC 7143 6.2 forbids it).
    #[error("key {key} was sent twice in one negotiation")]
    Duplicate {
        /// The key.
        key: String,
    },
    /// The peer sent more distinct keys than one negotiation may hold.
    #[error("more than {limit} distinct keys in one negotiation")]
    TooManyKeys {
        /// [`MAX_DISTINCT_KEYS`].
        limit: usize,
    },
    /// The peer answered a key we never offered, or sent an answer constant
    /// (NotUnderstood, Irrelevant, Reject) as an offer.
    #[error("unexpected answer {key}={value}: nothing of that key was offered")]
    UnexpectedAnswer {
        /// The key.
        key: String,
        /// The value received.
        value: String,
    },
    /// The peer's answer breaks the negotiation rule of the key.
    #[error("answer {key}={answer} to offer {key}={offered} is invalid: {reason}")]
    InvalidAnswer {
        /// The key.
        key: String,
        /// What we offered.
        offered: String,
        /// What came back.
        answer: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// A key needing an answer got none by the end of the negotiation.
    #[error("no answer to offered key {key}")]
    MissingAnswer {
        /// The key.
        key: String,
    },
    /// The peer rejected a key without which the login cannot go on.
    #[error("peer rejected {key}={offered}")]
    Rejected {
        /// The key (AuthMethod).
        key: String,
        /// What we offered.
        offered: String,
    },
    /// FirstBurstLength ended above MaxBurstLength (RFC 7143 13.14).
    #[error("FirstBurstLength {first} exceeds MaxBurstLength {max}")]
    BurstOrder {
        /// Negotiated FirstBurstLength.
        first: u32,
        /// Negotiated MaxBurstLength.
        max: u32,
    },
    /// The stages went backwards (e.g. operational, then security).
    #[error("negotiation went from {from:?} back to {to:?}")]
    PhaseOrder {
        /// The stage seen before.
        from: Phase,
        /// The stage asked for now.
        to: Phase,
    },
    /// The local configuration holds a value the RFC does not allow.
    #[error("configuration {key}={value} is invalid: {reason}")]
    InvalidConfig {
        /// The key.
        key: &'static str,
        /// The configured value.
        value: String,
        /// Why it is refused.
        reason: &'static str,
    },
}

/// What this side supports and prefers. Lists are in preference order; a
/// responder accepts exactly the values in its lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalConfig {
    /// True on the session's first (leading) connection; "leading only" keys
    /// are answered Irrelevant elsewhere.
    pub leading: bool,
    /// SessionType the initiator declares.
    pub session_type: SessionType,
    /// InitiatorName (the initiator declares it).
    pub initiator_name: Option<String>,
    /// InitiatorAlias (the initiator declares it).
    pub initiator_alias: Option<String>,
    /// TargetName the initiator logs into.
    pub target_name: Option<String>,
    /// TargetAlias (the target declares it).
    pub target_alias: Option<String>,
    /// TargetPortalGroupTag (the target declares it).
    pub target_portal_group_tag: Option<u16>,
    /// AuthMethod values supported.
    pub auth_methods: Vec<AuthMethod>,
    /// HeaderDigest values supported.
    pub header_digests: Vec<Digest>,
    /// DataDigest values supported.
    pub data_digests: Vec<Digest>,
    /// TaskReporting values supported.
    pub task_reporting: Vec<TaskReporting>,
    /// MaxConnections preference.
    pub max_connections: u32,
    /// InitialR2T preference.
    pub initial_r2t: bool,
    /// ImmediateData preference.
    pub immediate_data: bool,
    /// MaxRecvDataSegmentLength this side declares.
    pub max_recv_data_segment_length: u32,
    /// MaxBurstLength preference.
    pub max_burst_length: u32,
    /// FirstBurstLength preference (at most `max_burst_length`).
    pub first_burst_length: u32,
    /// DefaultTime2Wait preference.
    pub default_time2wait: u32,
    /// DefaultTime2Retain preference.
    pub default_time2retain: u32,
    /// MaxOutstandingR2T preference.
    pub max_outstanding_r2t: u32,
    /// DataPDUInOrder preference.
    pub data_pdu_in_order: bool,
    /// DataSequenceInOrder preference.
    pub data_sequence_in_order: bool,
    /// ErrorRecoveryLevel preference.
    pub error_recovery_level: u8,
    /// iSCSIProtocolLevel preference.
    pub iscsi_protocol_level: u32,
    /// iSER RDMAExtensions support.
    pub rdma_extensions: bool,
    /// iSER Initiator-/TargetRecvDataSegmentLength this side declares.
    pub rdma_recv_data_segment_length: u32,
    /// iSER MaxOutstandingUnexpectedPDUs preference (0 = no limit).
    pub max_outstanding_unexpected_pdus: u32,
    /// Vendor keys (`X-...`, `X#...`) the caller handles; they are passed
    /// through. Other vendor keys are answered NotUnderstood.
    pub vendor_keys: Vec<String>,
}

impl Default for LocalConfig {
    /// RFC 7143 defaults everywhere, no names, no authentication, no digests.
    fn default() -> Self {
        let d = SessionParams::default();
        Self {
            leading: true,
            session_type: SessionType::Normal,
            initiator_name: None,
            initiator_alias: None,
            target_name: None,
            target_alias: None,
            target_portal_group_tag: None,
            auth_methods: vec![AuthMethod::None],
            header_digests: vec![Digest::None],
            data_digests: vec![Digest::None],
            task_reporting: vec![TaskReporting::Rfc3720],
            max_connections: d.max_connections,
            initial_r2t: d.initial_r2t,
            immediate_data: d.immediate_data,
            max_recv_data_segment_length: d.initiator_max_recv_data_segment_length,
            max_burst_length: d.max_burst_length,
            first_burst_length: d.first_burst_length,
            default_time2wait: d.default_time2wait,
            default_time2retain: d.default_time2retain,
            max_outstanding_r2t: d.max_outstanding_r2t,
            data_pdu_in_order: d.data_pdu_in_order,
            data_sequence_in_order: d.data_sequence_in_order,
            error_recovery_level: d.error_recovery_level,
            iscsi_protocol_level: d.iscsi_protocol_level,
            rdma_extensions: false,
            rdma_recv_data_segment_length: d.initiator_recv_data_segment_length,
            max_outstanding_unexpected_pdus: 0,
            vendor_keys: Vec::new(),
        }
    }
}

impl LocalConfig {
    /// An initiator logging `initiator_name` into `target_name` (a normal
    /// session), RFC defaults otherwise.
    pub fn initiator(initiator_name: &str, target_name: &str) -> Self {
        Self {
            initiator_name: Some(initiator_name.to_owned()),
            target_name: Some(target_name.to_owned()),
            ..Self::default()
        }
    }

    /// An initiator opening a discovery session.
    pub fn discovery(initiator_name: &str) -> Self {
        Self {
            initiator_name: Some(initiator_name.to_owned()),
            session_type: SessionType::Discovery,
            ..Self::default()
        }
    }

    /// A target portal group `tpgt`, RFC defaults otherwise.
    pub fn target(tpgt: u16) -> Self {
        Self {
            target_portal_group_tag: Some(tpgt),
            ..Self::default()
        }
    }

    fn validate(&self) -> Result<(), NegotiationError> {
        let checks: [(KeyId, u64); 10] = [
            (KeyId::MaxConnections, self.max_connections.into()),
            (
                KeyId::MaxRecvDataSegmentLength,
                self.max_recv_data_segment_length.into(),
            ),
            (KeyId::MaxBurstLength, self.max_burst_length.into()),
            (KeyId::FirstBurstLength, self.first_burst_length.into()),
            (KeyId::DefaultTime2Wait, self.default_time2wait.into()),
            (KeyId::DefaultTime2Retain, self.default_time2retain.into()),
            (KeyId::MaxOutstandingR2T, self.max_outstanding_r2t.into()),
            (KeyId::ErrorRecoveryLevel, self.error_recovery_level.into()),
            (KeyId::IscsiProtocolLevel, self.iscsi_protocol_level.into()),
            (
                KeyId::InitiatorRecvDataSegmentLength,
                self.rdma_recv_data_segment_length.into(),
            ),
        ];
        let moup = (
            KeyId::MaxOutstandingUnexpectedPdus,
            self.max_outstanding_unexpected_pdus.into(),
        );
        for (id, value) in checks.into_iter().chain(std::iter::once(moup)) {
            let def = rules::def_of(id);
            if !in_spec(def.spec, value) {
                return Err(config_err(def.name, value, "out of the RFC range"));
            }
        }
        if self.first_burst_length > self.max_burst_length {
            return Err(config_err(
                "FirstBurstLength",
                self.first_burst_length,
                "exceeds MaxBurstLength",
            ));
        }
        if self.auth_methods.is_empty()
            || self.header_digests.is_empty()
            || self.data_digests.is_empty()
            || self.task_reporting.is_empty()
        {
            return Err(config_err(
                "AuthMethod/HeaderDigest/DataDigest/TaskReporting",
                "",
                "empty list",
            ));
        }
        for name in [&self.initiator_name, &self.target_name]
            .into_iter()
            .flatten()
        {
            if name.is_empty() || name.len() > MAX_ISCSI_NAME_LEN {
                return Err(config_err(
                    "InitiatorName/TargetName",
                    name,
                    "must be 1..=223 bytes",
                ));
            }
        }
        Ok(())
    }
}

fn config_err(key: &'static str, value: impl ToString, reason: &'static str) -> NegotiationError {
    NegotiationError::InvalidConfig {
        key,
        value: value.to_string(),
        reason,
    }
}

fn in_spec(spec: Spec, value: u64) -> bool {
    match spec {
        Spec::Range(min, max) => (min..=max).contains(&value),
        Spec::ZeroOrRange(min, max) => value == 0 || (min..=max).contains(&value),
        _ => true,
    }
}

/// What [`Negotiator::receive`] produced for one batch of peer pairs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Responses {
    /// Our answers, in the order the peer's keys came; send them back.
    pub answers: TextPairs,
    /// Pairs for the caller: CHAP_*, SendTargets, configured vendor keys, and
    /// (on the initiator) TargetAddress/TargetName/TargetAlias of redirects or
    /// SendTargets responses. The caller answers these itself if needed.
    pub passthrough: TextPairs,
}

impl Responses {
    /// Keys we answered with Reject (e.g. AuthMethod with no common method:
    /// the target then fails the login with an authentication error).
    pub fn rejected(&self) -> impl Iterator<Item = &str> {
        self.answers
            .iter()
            .filter(|(_, v)| v == REJECT)
            .map(|(k, _)| k.as_str())
    }
}

/// An offer of ours that awaits an answer.
#[derive(Debug, Clone)]
struct Pending {
    value: String,
    /// False for the Boolean cases where RFC 7143 6.2.1 makes the answer
    /// optional (AND offered No, OR offered Yes): the outcome is already known.
    required: bool,
}

/// What to do with one received offer.
enum Action {
    Answer(String),
    Silent,
    Pass,
}

/// The negotiation engine of one connection, for either role.
#[derive(Debug, Clone)]
pub struct Negotiator {
    role: Role,
    config: LocalConfig,
    params: SessionParams,
    phase: Option<Phase>,
    /// Our offers awaiting answers.
    awaiting: BTreeMap<KeyId, Pending>,
    /// Keys the peer has sent in this negotiation (duplicate detection).
    received: BTreeSet<String>,
    /// Keys we have sent in this negotiation (never send one twice).
    sent: BTreeSet<String>,
}

impl Negotiator {
    /// A negotiator for `role` with `config`; fails if the configuration has
    /// values outside the RFC ranges.
    pub fn new(role: Role, config: LocalConfig) -> Result<Self, NegotiationError> {
        config.validate()?;
        Ok(Self {
            role,
            config,
            params: SessionParams::default(),
            phase: None,
            awaiting: BTreeMap::new(),
            received: BTreeSet::new(),
            sent: BTreeSet::new(),
        })
    }

    /// The role this negotiator plays.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The outcome so far (RFC defaults for keys not negotiated).
    pub fn params(&self) -> &SessionParams {
        &self.params
    }

    /// Keys we offered that still await an answer.
    pub fn pending(&self) -> Vec<&'static str> {
        self.awaiting
            .keys()
            .map(|id| rules::def_of(*id).name)
            .collect()
    }

    /// Starts a new full-feature-phase text negotiation: forgets which keys
    /// were exchanged, since each Text request/response sequence is its own
    /// negotiation. Entering [`Phase::FullFeature`] does this once by itself.
    pub fn start_text_exchange(&mut self) {
        self.awaiting.clear();
        self.received.clear();
        self.sent.clear();
    }

    fn enter(&mut self, phase: Phase) -> Result<(), NegotiationError> {
        match self.phase {
            Some(from) if phase < from => {
                return Err(NegotiationError::PhaseOrder { from, to: phase })
            }
            Some(from) if from != Phase::FullFeature && phase == Phase::FullFeature => {
                self.start_text_exchange()
            }
            _ => {}
        }
        self.phase = Some(phase);
        Ok(())
    }

    /// The keys this side starts in `phase`: declarations (names,
    /// TargetPortalGroupTag, MaxRecvDataSegmentLength, ...) and offers.
    ///
    /// The initiator offers every operational key that applies (leading
    /// connection, session type, iSER). The target offers the leading keys
    /// whose preference differs from the RFC default and that the initiator
    /// did not offer, so that, e.g., a target wanting ImmediateData=No gets it.
    /// A key is never sent twice; calling again yields only what is new.
    pub fn offer(&mut self, phase: Phase) -> Result<TextPairs, NegotiationError> {
        self.enter(phase)?;
        let mut out = TextPairs::new();
        if phase == Phase::FullFeature {
            return Ok(out);
        }
        let c = self.config.clone();
        match self.role {
            Role::Initiator => {
                if let Some(name) = &c.initiator_name {
                    self.declare(&mut out, KeyId::InitiatorName, name.clone());
                }
                if let Some(alias) = &c.initiator_alias {
                    self.declare(&mut out, KeyId::InitiatorAlias, alias.clone());
                }
                self.declare(
                    &mut out,
                    KeyId::SessionType,
                    c.session_type.as_str().to_owned(),
                );
                if c.session_type == SessionType::Normal {
                    if let Some(name) = &c.target_name {
                        self.declare(&mut out, KeyId::TargetName, name.clone());
                    }
                }
                if phase == Phase::Security {
                    self.propose(&mut out, KeyId::AuthMethod);
                    return Ok(out);
                }
                self.propose(&mut out, KeyId::HeaderDigest);
                self.propose(&mut out, KeyId::DataDigest);
                self.declare(
                    &mut out,
                    KeyId::MaxRecvDataSegmentLength,
                    c.max_recv_data_segment_length.to_string(),
                );
                if !c.leading {
                    return Ok(out);
                }
                let discovery = c.session_type == SessionType::Discovery;
                for def in rules::KEYS.iter().filter(|d| d.usage == Usage::Leading) {
                    if discovery && def.irrelevant_in_discovery {
                        continue;
                    }
                    let wanted = match def.id {
                        // Irrelevant when InitialR2T=Yes and ImmediateData=No.
                        KeyId::FirstBurstLength => !c.initial_r2t || c.immediate_data,
                        KeyId::RdmaExtensions => c.rdma_extensions,
                        // Only when it says something: the default (0, no limit) needs
                        // no offer, and LIO does not know the key at all.
                        KeyId::MaxOutstandingUnexpectedPdus => {
                            c.rdma_extensions && !self.is_default(def)
                        }
                        KeyId::TaskReporting | KeyId::IscsiProtocolLevel => !self.is_default(def),
                        _ => true,
                    };
                    if wanted {
                        self.propose(&mut out, def.id);
                    }
                }
                if c.rdma_extensions && !discovery {
                    self.declare(
                        &mut out,
                        KeyId::InitiatorRecvDataSegmentLength,
                        c.rdma_recv_data_segment_length.to_string(),
                    );
                }
            }
            Role::Target => {
                if let Some(tpgt) = c.target_portal_group_tag {
                    self.declare(&mut out, KeyId::TargetPortalGroupTag, tpgt.to_string());
                }
                if let Some(alias) = &c.target_alias {
                    self.declare(&mut out, KeyId::TargetAlias, alias.clone());
                }
                if phase == Phase::Security {
                    return Ok(out);
                }
                self.declare(
                    &mut out,
                    KeyId::MaxRecvDataSegmentLength,
                    c.max_recv_data_segment_length.to_string(),
                );
                // An iSER target (one configured for RDMAExtensions) declares it at once:
                // initiators size their unsolicited data from it (open-iscsi takes its
                // MaxXmitDataSegmentLength from it and sends nothing without it).
                if self.params.rdma_extensions || c.rdma_extensions {
                    self.declare(
                        &mut out,
                        KeyId::TargetRecvDataSegmentLength,
                        c.rdma_recv_data_segment_length.to_string(),
                    );
                }
                if !c.leading {
                    return Ok(out);
                }
                let discovery = self.params.session_type == SessionType::Discovery;
                for def in rules::KEYS
                    .iter()
                    .filter(|d| d.usage == Usage::Leading && d.kind != Kind::List)
                {
                    let relevant = !(discovery && def.irrelevant_in_discovery)
                        && (def.id != KeyId::FirstBurstLength
                            || self.params.first_burst_relevant());
                    if relevant && !self.is_default(def) {
                        self.propose(&mut out, def.id);
                    }
                }
            }
        }
        Ok(out)
    }

    /// True when our preference for `def` equals the RFC default, so that
    /// offering it would change nothing.
    fn is_default(&self, def: &KeyDef) -> bool {
        match def.kind {
            Kind::List => self.local_list(def.id).first().copied() == Some(def.default),
            Kind::And | Kind::Or => format_bool(self.local_bool(def.id)) == def.default,
            Kind::Min | Kind::Max => self.local_num(def.id).to_string() == def.default,
            _ => true,
        }
    }

    fn unsent(&self, key: &str) -> bool {
        !self.sent.contains(key) && !self.received.contains(key)
    }

    fn declare(&mut self, out: &mut TextPairs, id: KeyId, value: String) {
        let def = rules::def_of(id);
        // Both sides declare their own value of a declarative key
        // (MaxRecvDataSegmentLength), so only our own sending counts here.
        if self.sent.contains(def.name) {
            return;
        }
        self.sent.insert(def.name.to_owned());
        self.store_declaration(id, self.role, &value);
        out.push((def.name.to_owned(), value));
    }

    fn propose(&mut self, out: &mut TextPairs, id: KeyId) {
        let def = rules::def_of(id);
        if !self.unsent(def.name) {
            return;
        }
        let value = match def.kind {
            Kind::List => self.local_list(id).join(","),
            Kind::And | Kind::Or => format_bool(self.local_bool(id)).to_owned(),
            // FirstBurstLength must not exceed MaxBurstLength (RFC 7143
            // §13.14): an offer above the MaxBurstLength agreed (or, before
            // that, above our own) would have the peer's answer break it.
            Kind::Min | Kind::Max if id == KeyId::FirstBurstLength => self
                .local_num(id)
                .min(self.local_num(KeyId::MaxBurstLength))
                .min(self.params.max_burst_length.into())
                .to_string(),
            Kind::Min | Kind::Max => self.local_num(id).to_string(),
            _ => return,
        };
        // The outcome is fixed by the offer alone in these two cases.
        let implied = match def.kind {
            Kind::And => !self.local_bool(id),
            Kind::Or => self.local_bool(id),
            _ => false,
        };
        if implied {
            self.set_bool(id, self.local_bool(id));
        }
        self.sent.insert(def.name.to_owned());
        self.awaiting.insert(
            id,
            Pending {
                value: value.clone(),
                required: !implied,
            },
        );
        out.push((def.name.to_owned(), value));
    }

    /// Takes the peer's pairs for `phase`: answers to our offers are checked
    /// and applied, the peer's offers are answered, declarations recorded.
    ///
    /// Errors (duplicate key, answer breaking the rules, ...) mean the login
    /// must fail. Illegal offered values are not errors: they are answered
    /// Reject, unknown keys NotUnderstood, keys that do not apply Irrelevant.
    pub fn receive(
        &mut self,
        phase: Phase,
        pairs: &[(String, String)],
    ) -> Result<Responses, NegotiationError> {
        self.enter(phase)?;
        for (key, _) in pairs {
            if self.may_repeat(key, phase) {
                continue;
            }
            if self.received.contains(key) {
                return Err(NegotiationError::Duplicate { key: key.clone() });
            }
            if self.received.len() >= MAX_DISTINCT_KEYS {
                return Err(NegotiationError::TooManyKeys {
                    limit: MAX_DISTINCT_KEYS,
                });
            }
            self.received.insert(key.clone());
        }
        // Keys others depend on go first (SessionType decides relevance,
        // InitialR2T/ImmediateData decide FirstBurstLength, MaxBurstLength
        // bounds it); answers still go out in the peer's order.
        let mut order: Vec<usize> = (0..pairs.len()).collect();
        order.sort_by_key(|&i| pairs.get(i).map_or(9, |(k, _)| priority(k)));
        let mut actions: Vec<Option<(String, Action)>> = (0..pairs.len()).map(|_| None).collect();
        for i in order {
            let Some((key, value)) = pairs.get(i) else {
                continue;
            };
            let action = self.handle(phase, key, value)?;
            if let Some(slot) = actions.get_mut(i) {
                *slot = Some((key.clone(), action));
            }
        }
        let mut out = Responses::default();
        for ((key, action), (_, value)) in actions.into_iter().flatten().zip(pairs.iter()) {
            match action {
                Action::Answer(answer) => {
                    self.sent.insert(key.clone());
                    out.answers.push((key, answer));
                }
                Action::Pass => out.passthrough.push((key, value.clone())),
                Action::Silent => {}
            }
        }
        Ok(out)
    }

    /// Ends the login negotiation: every offer needing an answer must have
    /// had one, and FirstBurstLength must not exceed MaxBurstLength.
    pub fn finish(&mut self) -> Result<(), NegotiationError> {
        if let Some((id, _)) = self.awaiting.iter().find(|(_, p)| p.required) {
            return Err(NegotiationError::MissingAnswer {
                key: rules::def_of(*id).name.to_owned(),
            });
        }
        self.awaiting.clear();
        let p = &self.params;
        if p.first_burst_relevant() && p.first_burst_length > p.max_burst_length {
            return Err(NegotiationError::BurstOrder {
                first: p.first_burst_length,
                max: p.max_burst_length,
            });
        }
        Ok(())
    }

    fn may_repeat(&self, key: &str, phase: Phase) -> bool {
        // SendTargets responses list many targets, each with addresses.
        key == "TargetAddress"
            || (phase == Phase::FullFeature
                && self.role == Role::Initiator
                && matches!(key, "TargetName" | "TargetAlias"))
            // LIO's iSER target repeats the iSER data segment lengths (RFC 7145 §6.3)
            // in each Login Response of the operational stage. They are declarations:
            // taking the repeat as a new declaration changes nothing but the value.
            || (self.role == Role::Initiator
                && matches!(
                    key,
                    "InitiatorRecvDataSegmentLength" | "TargetRecvDataSegmentLength"
                ))
    }

    fn handle(&mut self, phase: Phase, key: &str, value: &str) -> Result<Action, NegotiationError> {
        let Some(def) = rules::lookup(key) else {
            if rules::is_vendor_key(key) && self.config.vendor_keys.iter().any(|k| k == key) {
                return Ok(Action::Pass);
            }
            // Never answer an answer: a constant here is a reply to an offer
            // of the caller's that it did not register; stay silent.
            if is_answer_constant(value) {
                return Ok(Action::Silent);
            }
            return Ok(Action::Answer(NOT_UNDERSTOOD.to_owned()));
        };
        if let Some(pending) = self.awaiting.remove(&def.id) {
            self.check_answer(def, &pending.value, value)?;
            return Ok(Action::Silent);
        }
        // A declaration needs no answer, but a peer that does not know the key may
        // say so (LIO's iSER target answers InitiatorRecvDataSegmentLength with
        // NotUnderstood in its second operational response). Our declared value then
        // binds nobody; the peer's default stands, which for the iSER lengths is
        // RFC 7145's 8192.
        if value == NOT_UNDERSTOOD && def.kind == Kind::Declarative && self.sent.contains(def.name)
        {
            return Ok(Action::Silent);
        }
        if is_answer_constant(value) {
            return Err(NegotiationError::UnexpectedAnswer {
                key: key.to_owned(),
                value: value.to_owned(),
            });
        }
        Ok(self.answer(phase, def, value))
    }

    /// What to do with the peer's offer or declaration `def=value`.
    fn answer(&mut self, phase: Phase, def: &KeyDef, value: &str) -> Action {
        let from = self.role.peer();
        let sender_ok = match (def.id, phase) {
            (KeyId::TargetName, Phase::FullFeature) => from == Role::Target,
            (KeyId::TargetName, _) => from == Role::Initiator,
            _ => matches!(
                (def.senders, from),
                (Senders::Both, _)
                    | (Senders::Initiator, Role::Initiator)
                    | (Senders::Target, Role::Target)
            ),
        };
        // A declarative key only we may send, coming back: the peer echoes our
        // declaration (open-iscsi and LIO do so for the iSER data segment lengths).
        // It declares nothing of the peer's; take it silently.
        if !sender_ok && def.kind == Kind::Declarative && self.sent.contains(def.name) {
            return Action::Silent;
        }
        if !sender_ok || !usage_allows(def.usage, phase) {
            return say(REJECT);
        }
        if def.usage == Usage::Leading && !self.config.leading {
            return say(IRRELEVANT);
        }
        if def.irrelevant_in_discovery && self.params.session_type == SessionType::Discovery {
            return say(IRRELEVANT);
        }
        match def.kind {
            Kind::Security => Action::Pass,
            Kind::Obsolete => match def.id {
                // RFC 7143 13.26: markers may be answered No; the intervals
                // must be answered Reject.
                KeyId::OfMarker | KeyId::IfMarker => say("No"),
                _ => say(REJECT),
            },
            Kind::Declarative => self.receive_declaration(def, value),
            Kind::List => {
                let supported = self.local_list(def.id);
                let items: Vec<&str> = split_list(value).collect();
                if items.is_empty() || items.iter().any(|i| i.is_empty()) {
                    return say(REJECT);
                }
                match items.into_iter().find(|i| supported.contains(i)) {
                    Some(choice) => {
                        self.set_name(def.id, choice);
                        say(choice)
                    }
                    None => say(REJECT),
                }
            }
            Kind::And | Kind::Or => {
                let Ok(offered) = parse_bool(value) else {
                    return say(REJECT);
                };
                let own = self.local_bool(def.id);
                let result = if def.kind == Kind::And {
                    offered && own
                } else {
                    offered || own
                };
                self.set_bool(def.id, result);
                say(format_bool(result))
            }
            Kind::Min | Kind::Max => {
                let Some(offered) = parse_number(value).ok().filter(|n| in_spec(def.spec, *n))
                else {
                    return say(REJECT);
                };
                if def.id == KeyId::FirstBurstLength && !self.params.first_burst_relevant() {
                    return say(IRRELEVANT);
                }
                let own = self.local_num(def.id);
                let mut result = match (def.kind, def.spec) {
                    (Kind::Max, _) => offered.max(own),
                    // 0 means "no limit", so it loses every minimum.
                    (_, Spec::ZeroOrRange(..)) if offered == 0 || own == 0 => offered.max(own),
                    _ => offered.min(own),
                };
                if def.id == KeyId::FirstBurstLength {
                    result = result.min(self.params.max_burst_length.into());
                }
                self.set_num(def.id, result);
                Action::Answer(result.to_string())
            }
        }
    }

    fn receive_declaration(&mut self, def: &KeyDef, value: &str) -> Action {
        let ok = match def.spec {
            Spec::Range(..) | Spec::ZeroOrRange(..) => {
                parse_number(value).is_ok_and(|n| in_spec(def.spec, n))
            }
            Spec::Names(names) => names.contains(&value),
            Spec::Bool => parse_bool(value).is_ok(),
            Spec::Text => match def.id {
                KeyId::InitiatorName | KeyId::TargetName => {
                    !value.is_empty() && value.len() <= MAX_ISCSI_NAME_LEN
                }
                KeyId::TargetAddress => !value.is_empty(),
                _ => true,
            },
        };
        if !ok {
            return say(REJECT);
        }
        let from = self.role.peer();
        match def.id {
            KeyId::SendTargets | KeyId::TargetAddress => Action::Pass,
            KeyId::TargetName | KeyId::TargetAlias if self.phase == Some(Phase::FullFeature) => {
                Action::Pass
            }
            // LIO's iSER target proposes TargetRecvDataSegmentLength and fails the login
            // ("No response for proposed key") unless the initiator sends it back, as
            // open-iscsi does. RFC 7145 §6.3 makes it a declaration; the echo repeats
            // the target's own value and binds nothing new.
            KeyId::TargetRecvDataSegmentLength if self.role == Role::Initiator => {
                self.store_declaration(def.id, from, value);
                Action::Answer(value.to_owned())
            }
            _ => {
                self.store_declaration(def.id, from, value);
                Action::Silent
            }
        }
    }

    fn check_answer(
        &mut self,
        def: &KeyDef,
        offered: &str,
        answer: &str,
    ) -> Result<(), NegotiationError> {
        let invalid = |reason| NegotiationError::InvalidAnswer {
            key: def.name.to_owned(),
            offered: offered.to_owned(),
            answer: answer.to_owned(),
            reason,
        };
        match answer {
            // The key keeps its default (or the outcome our offer implied).
            NOT_UNDERSTOOD | IRRELEVANT => return Ok(()),
            REJECT if def.id == KeyId::AuthMethod => {
                return Err(NegotiationError::Rejected {
                    key: def.name.to_owned(),
                    offered: offered.to_owned(),
                })
            }
            REJECT => return Ok(()),
            _ => {}
        }
        match def.kind {
            Kind::List => {
                if !split_list(offered).any(|o| o == answer) {
                    return Err(invalid("not one of the offered values"));
                }
                self.set_name(def.id, answer);
            }
            Kind::And | Kind::Or => {
                let got = parse_bool(answer).map_err(|_| invalid("not Yes or No"))?;
                let offered_bool = parse_bool(offered).unwrap_or(false);
                if def.kind == Kind::And && !offered_bool && got {
                    return Err(invalid("AND key offered No must stay No"));
                }
                if def.kind == Kind::Or && offered_bool && !got {
                    return Err(invalid("OR key offered Yes must stay Yes"));
                }
                self.set_bool(def.id, got);
            }
            Kind::Min | Kind::Max => {
                let got = parse_number(answer).map_err(|_| invalid("not a number"))?;
                if !in_spec(def.spec, got) {
                    return Err(invalid("out of the key's range"));
                }
                let offered_num = parse_number(offered).unwrap_or(0);
                let unlimited = matches!(def.spec, Spec::ZeroOrRange(..));
                let bad = match def.kind {
                    Kind::Max => got < offered_num,
                    _ if unlimited => offered_num != 0 && (got == 0 || got > offered_num),
                    _ => got > offered_num,
                };
                if bad {
                    return Err(invalid(if def.kind == Kind::Max {
                        "below the offered maximum"
                    } else {
                        "above the offered minimum"
                    }));
                }
                self.set_num(def.id, got);
            }
            // We never offer these, so they never await an answer.
            Kind::Declarative | Kind::Security | Kind::Obsolete => {
                return Err(invalid("key takes no answer"))
            }
        }
        Ok(())
    }

    fn local_list(&self, id: KeyId) -> Vec<&'static str> {
        let c = &self.config;
        match id {
            KeyId::HeaderDigest => c.header_digests.iter().map(|d| d.as_str()).collect(),
            KeyId::DataDigest => c.data_digests.iter().map(|d| d.as_str()).collect(),
            KeyId::AuthMethod => c.auth_methods.iter().map(|a| a.as_str()).collect(),
            KeyId::TaskReporting => c.task_reporting.iter().map(|t| t.as_str()).collect(),
            _ => Vec::new(),
        }
    }

    fn local_bool(&self, id: KeyId) -> bool {
        let c = &self.config;
        match id {
            KeyId::InitialR2T => c.initial_r2t,
            KeyId::ImmediateData => c.immediate_data,
            KeyId::DataPduInOrder => c.data_pdu_in_order,
            KeyId::DataSequenceInOrder => c.data_sequence_in_order,
            KeyId::RdmaExtensions => c.rdma_extensions,
            _ => false,
        }
    }

    fn local_num(&self, id: KeyId) -> u64 {
        let c = &self.config;
        u64::from(match id {
            KeyId::MaxConnections => c.max_connections,
            KeyId::MaxBurstLength => c.max_burst_length,
            KeyId::FirstBurstLength => c.first_burst_length,
            KeyId::DefaultTime2Wait => c.default_time2wait,
            KeyId::DefaultTime2Retain => c.default_time2retain,
            KeyId::MaxOutstandingR2T => c.max_outstanding_r2t,
            KeyId::ErrorRecoveryLevel => c.error_recovery_level.into(),
            KeyId::IscsiProtocolLevel => c.iscsi_protocol_level,
            KeyId::MaxOutstandingUnexpectedPdus => c.max_outstanding_unexpected_pdus,
            _ => 0,
        })
    }

    fn set_name(&mut self, id: KeyId, name: &str) {
        let p = &mut self.params;
        match id {
            KeyId::HeaderDigest => p.header_digest = Digest::from_name(name).unwrap_or_default(),
            KeyId::DataDigest => p.data_digest = Digest::from_name(name).unwrap_or_default(),
            KeyId::AuthMethod => p.auth_method = AuthMethod::from_name(name).unwrap_or_default(),
            KeyId::TaskReporting => {
                p.task_reporting = TaskReporting::from_name(name).unwrap_or_default()
            }
            KeyId::SessionType => p.session_type = SessionType::from_name(name).unwrap_or_default(),
            _ => {}
        }
    }

    fn set_bool(&mut self, id: KeyId, value: bool) {
        let p = &mut self.params;
        match id {
            KeyId::InitialR2T => p.initial_r2t = value,
            KeyId::ImmediateData => p.immediate_data = value,
            KeyId::DataPduInOrder => p.data_pdu_in_order = value,
            KeyId::DataSequenceInOrder => p.data_sequence_in_order = value,
            KeyId::RdmaExtensions => p.rdma_extensions = value,
            _ => {}
        }
    }

    fn set_num(&mut self, id: KeyId, value: u64) {
        // Callers range-check against the key table first, and every range
        // fits in u32; saturate rather than wrap should that ever change.
        let v = u32::try_from(value).unwrap_or(u32::MAX);
        let p = &mut self.params;
        match id {
            KeyId::MaxConnections => p.max_connections = v,
            KeyId::MaxBurstLength => p.max_burst_length = v,
            KeyId::FirstBurstLength => p.first_burst_length = v,
            KeyId::DefaultTime2Wait => p.default_time2wait = v,
            KeyId::DefaultTime2Retain => p.default_time2retain = v,
            KeyId::MaxOutstandingR2T => p.max_outstanding_r2t = v,
            KeyId::ErrorRecoveryLevel => {
                p.error_recovery_level = u8::try_from(v).unwrap_or(u8::MAX)
            }
            KeyId::IscsiProtocolLevel => p.iscsi_protocol_level = v,
            KeyId::MaxOutstandingUnexpectedPdus => p.max_outstanding_unexpected_pdus = v,
            KeyId::TargetPortalGroupTag => p.target_portal_group_tag = u16::try_from(v).ok(),
            _ => {}
        }
    }

    /// Records a declaration made by `by` (ourselves or the peer).
    fn store_declaration(&mut self, id: KeyId, by: Role, value: &str) {
        let num = || parse_number(value).ok().and_then(|n| u32::try_from(n).ok());
        let p = &mut self.params;
        match id {
            KeyId::InitiatorName => p.initiator_name = Some(value.to_owned()),
            KeyId::TargetName => p.target_name = Some(value.to_owned()),
            KeyId::InitiatorAlias => p.initiator_alias = Some(value.to_owned()),
            KeyId::TargetAlias => p.target_alias = Some(value.to_owned()),
            KeyId::TargetPortalGroupTag => {
                p.target_portal_group_tag = num().and_then(|n| u16::try_from(n).ok())
            }
            KeyId::SessionType => {
                p.session_type = SessionType::from_name(value).unwrap_or_default()
            }
            KeyId::MaxRecvDataSegmentLength => {
                let n = num().unwrap_or(8192);
                match by {
                    Role::Initiator => p.initiator_max_recv_data_segment_length = n,
                    Role::Target => p.target_max_recv_data_segment_length = n,
                }
            }
            KeyId::InitiatorRecvDataSegmentLength => {
                p.initiator_recv_data_segment_length = num().unwrap_or(8192)
            }
            KeyId::TargetRecvDataSegmentLength => {
                p.target_recv_data_segment_length = num().unwrap_or(8192)
            }
            _ => {}
        }
    }
}

fn say(value: &str) -> Action {
    Action::Answer(value.to_owned())
}

fn is_answer_constant(value: &str) -> bool {
    matches!(value, NOT_UNDERSTOOD | IRRELEVANT | REJECT)
}

fn priority(key: &str) -> u8 {
    match key {
        "SessionType" => 0,
        "InitialR2T" | "ImmediateData" | "RDMAExtensions" => 1,
        "MaxBurstLength" => 2,
        _ => 3,
    }
}

fn usage_allows(usage: Usage, phase: Phase) -> bool {
    match phase {
        Phase::Security => matches!(usage, Usage::Security | Usage::LoginAny | Usage::Anywhere),
        Phase::Operational => !matches!(usage, Usage::Security | Usage::FullFeature),
        Phase::FullFeature => matches!(
            usage,
            Usage::Anywhere | Usage::OperationalAndFfp | Usage::FullFeature
        ),
    }
}
