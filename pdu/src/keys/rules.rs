//! The table of standard keys: how each is negotiated, who may send it, when,
//! and which values it takes (RFC 7143 section 13, RFC 7145 section 6).
//!
//! The negotiator consults only this table for per-key behaviour, so adding
//! a key means adding a row here plus its field in `SessionParams`.

/// Maximum of a 24-bit length key (MaxBurstLength, FirstBurstLength, ...).
pub const MAX_24BIT: u64 = (1 << 24) - 1;

/// Identifies a standard key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)] // The variants are the RFC key names.
pub enum KeyId {
    HeaderDigest,
    DataDigest,
    AuthMethod,
    ChapA,
    ChapI,
    ChapC,
    ChapN,
    ChapR,
    MaxConnections,
    SendTargets,
    TargetName,
    InitiatorName,
    TargetAlias,
    InitiatorAlias,
    TargetAddress,
    TargetPortalGroupTag,
    InitialR2T,
    ImmediateData,
    MaxRecvDataSegmentLength,
    MaxBurstLength,
    FirstBurstLength,
    DefaultTime2Wait,
    DefaultTime2Retain,
    MaxOutstandingR2T,
    DataPduInOrder,
    DataSequenceInOrder,
    ErrorRecoveryLevel,
    SessionType,
    TaskReporting,
    IscsiProtocolLevel,
    OfMarker,
    IfMarker,
    OfMarkInt,
    IfMarkInt,
    RdmaExtensions,
    InitiatorRecvDataSegmentLength,
    TargetRecvDataSegmentLength,
    MaxOutstandingUnexpectedPdus,
}

/// How the outcome of a key is decided (RFC 7143 6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The responder picks the first value of the offered list it supports.
    List,
    /// Boolean, outcome is offer AND answer.
    And,
    /// Boolean, outcome is offer OR answer.
    Or,
    /// Number, outcome is the smaller of offer and answer.
    Min,
    /// Number, outcome is the larger of offer and answer.
    Max,
    /// Each side states its own value; no answer is sent.
    Declarative,
    /// A security exchange key (CHAP_*) handed to the caller's auth module.
    Security,
    /// A key RFC 7143 obsoleted (markers); answered with a fixed value.
    Obsolete,
}

/// When a key may be exchanged (RFC 7143 section 13 "Use", split by login
/// stage because security and operational keys may not mix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// Login security stage only (AuthMethod, CHAP_*).
    Security,
    /// Any login stage, never in full feature phase (InitiatorName, ...).
    LoginAny,
    /// Login operational stage, any connection ("IO").
    Operational,
    /// Login operational stage on the leading connection only ("LO").
    Leading,
    /// Login (any stage) and full feature phase ("ALL").
    Anywhere,
    /// Operational stage and full feature phase (MaxRecvDataSegmentLength).
    OperationalAndFfp,
    /// Full feature phase only ("FFPO": SendTargets).
    FullFeature,
}

/// Which side may send (offer or declare) a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Senders {
    /// Only the initiator.
    Initiator,
    /// Only the target.
    Target,
    /// Either side.
    Both,
}

/// The values a key accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spec {
    /// A number in `min..=max`.
    Range(u64, u64),
    /// 0 (meaning "no limit"), or a number in `min..=max`.
    ZeroOrRange(u64, u64),
    /// `Yes` or `No`.
    Bool,
    /// One of these names (for lists, each item is one of them or an
    /// unknown name the responder skips).
    Names(&'static [&'static str]),
    /// Free text (names, aliases, addresses, CHAP values).
    Text,
}

/// One row of the key table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDef {
    /// The key name on the wire.
    pub name: &'static str,
    /// The key.
    pub id: KeyId,
    /// How the outcome is decided.
    pub kind: Kind,
    /// When it may be sent.
    pub usage: Usage,
    /// Who may send it.
    pub senders: Senders,
    /// Accepted values.
    pub spec: Spec,
    /// RFC default, as it would be written on the wire ("" when none).
    pub default: &'static str,
    /// Answered `Irrelevant` in a discovery session.
    pub irrelevant_in_discovery: bool,
}

/// AuthMethod names RFC 7143 registers (we implement only CHAP and None).
pub const AUTH_METHOD_NAMES: &[&str] = &["KRB5", "SPKM1", "SPKM2", "SRP", "CHAP", "None"];
/// Digest names.
pub const DIGEST_NAMES: &[&str] = &["CRC32C", "None"];
/// TaskReporting names (RFC 7143 13.23).
pub const TASK_REPORTING_NAMES: &[&str] = &["RFC3720", "ResponseFence", "FastAbort"];
/// SessionType names.
pub const SESSION_TYPE_NAMES: &[&str] = &["Discovery", "Normal"];

// One argument per table column keeps each row of `KEYS` on one line.
#[allow(clippy::too_many_arguments)]
const fn def(
    name: &'static str,
    id: KeyId,
    kind: Kind,
    usage: Usage,
    senders: Senders,
    spec: Spec,
    default: &'static str,
    irrelevant_in_discovery: bool,
) -> KeyDef {
    KeyDef {
        name,
        id,
        kind,
        usage,
        senders,
        spec,
        default,
        irrelevant_in_discovery,
    }
}

use Kind::*;
use Senders::{Both, Initiator as Ini, Target as Tgt};

/// Every standard key this engine knows.
#[rustfmt::skip]
pub const KEYS: &[KeyDef] = &[
    def("HeaderDigest", KeyId::HeaderDigest, List, Usage::Operational, Both, Spec::Names(DIGEST_NAMES), "None", false),
    def("DataDigest", KeyId::DataDigest, List, Usage::Operational, Both, Spec::Names(DIGEST_NAMES), "None", false),
    def("AuthMethod", KeyId::AuthMethod, List, Usage::Security, Both, Spec::Names(AUTH_METHOD_NAMES), "None", false),
    def("CHAP_A", KeyId::ChapA, Security, Usage::Security, Both, Spec::Text, "", false),
    def("CHAP_I", KeyId::ChapI, Security, Usage::Security, Both, Spec::Text, "", false),
    def("CHAP_C", KeyId::ChapC, Security, Usage::Security, Both, Spec::Text, "", false),
    def("CHAP_N", KeyId::ChapN, Security, Usage::Security, Both, Spec::Text, "", false),
    def("CHAP_R", KeyId::ChapR, Security, Usage::Security, Both, Spec::Text, "", false),
    def("MaxConnections", KeyId::MaxConnections, Min, Usage::Leading, Both, Spec::Range(1, 65535), "1", true),
    def("SendTargets", KeyId::SendTargets, Declarative, Usage::FullFeature, Ini, Spec::Text, "", false),
    // TargetName is sent by the initiator at login and by the target in
    // SendTargets responses; the negotiator special-cases the phase.
    def("TargetName", KeyId::TargetName, Declarative, Usage::Anywhere, Both, Spec::Text, "", false),
    def("InitiatorName", KeyId::InitiatorName, Declarative, Usage::LoginAny, Ini, Spec::Text, "", false),
    def("TargetAlias", KeyId::TargetAlias, Declarative, Usage::Anywhere, Tgt, Spec::Text, "", false),
    def("InitiatorAlias", KeyId::InitiatorAlias, Declarative, Usage::Anywhere, Ini, Spec::Text, "", false),
    def("TargetAddress", KeyId::TargetAddress, Declarative, Usage::Anywhere, Tgt, Spec::Text, "", false),
    def("TargetPortalGroupTag", KeyId::TargetPortalGroupTag, Declarative, Usage::LoginAny, Tgt, Spec::Range(0, 65535), "", false),
    def("InitialR2T", KeyId::InitialR2T, Or, Usage::Leading, Both, Spec::Bool, "Yes", true),
    def("ImmediateData", KeyId::ImmediateData, And, Usage::Leading, Both, Spec::Bool, "Yes", true),
    def("MaxRecvDataSegmentLength", KeyId::MaxRecvDataSegmentLength, Declarative, Usage::OperationalAndFfp, Both, Spec::Range(512, MAX_24BIT), "8192", false),
    def("MaxBurstLength", KeyId::MaxBurstLength, Min, Usage::Leading, Both, Spec::Range(512, MAX_24BIT), "262144", true),
    def("FirstBurstLength", KeyId::FirstBurstLength, Min, Usage::Leading, Both, Spec::Range(512, MAX_24BIT), "65536", true),
    def("DefaultTime2Wait", KeyId::DefaultTime2Wait, Max, Usage::Leading, Both, Spec::Range(0, 3600), "2", false),
    def("DefaultTime2Retain", KeyId::DefaultTime2Retain, Min, Usage::Leading, Both, Spec::Range(0, 3600), "20", false),
    def("MaxOutstandingR2T", KeyId::MaxOutstandingR2T, Min, Usage::Leading, Both, Spec::Range(1, 65535), "1", true),
    def("DataPDUInOrder", KeyId::DataPduInOrder, Or, Usage::Leading, Both, Spec::Bool, "Yes", true),
    def("DataSequenceInOrder", KeyId::DataSequenceInOrder, Or, Usage::Leading, Both, Spec::Bool, "Yes", true),
    def("ErrorRecoveryLevel", KeyId::ErrorRecoveryLevel, Min, Usage::Leading, Both, Spec::Range(0, 2), "0", false),
    def("SessionType", KeyId::SessionType, Declarative, Usage::LoginAny, Ini, Spec::Names(SESSION_TYPE_NAMES), "Normal", false),
    def("TaskReporting", KeyId::TaskReporting, List, Usage::Leading, Both, Spec::Names(TASK_REPORTING_NAMES), "RFC3720", true),
    def("iSCSIProtocolLevel", KeyId::IscsiProtocolLevel, Min, Usage::Leading, Both, Spec::Range(0, 31), "1", true),
    def("OFMarker", KeyId::OfMarker, Obsolete, Usage::Operational, Both, Spec::Text, "No", false),
    def("IFMarker", KeyId::IfMarker, Obsolete, Usage::Operational, Both, Spec::Text, "No", false),
    def("OFMarkInt", KeyId::OfMarkInt, Obsolete, Usage::Operational, Both, Spec::Text, "", false),
    def("IFMarkInt", KeyId::IfMarkInt, Obsolete, Usage::Operational, Both, Spec::Text, "", false),
    def("RDMAExtensions", KeyId::RdmaExtensions, And, Usage::Leading, Both, Spec::Bool, "No", true),
    def("InitiatorRecvDataSegmentLength", KeyId::InitiatorRecvDataSegmentLength, Declarative, Usage::Operational, Ini, Spec::Range(512, MAX_24BIT), "8192", false),
    def("TargetRecvDataSegmentLength", KeyId::TargetRecvDataSegmentLength, Declarative, Usage::Operational, Tgt, Spec::Range(512, MAX_24BIT), "8192", false),
    def("MaxOutstandingUnexpectedPDUs", KeyId::MaxOutstandingUnexpectedPdus, Min, Usage::Leading, Both, Spec::ZeroOrRange(2, u32::MAX as u64), "0", true),
];

/// Looks a key up by its wire name (case-sensitive, as RFC 7143 requires).
pub fn lookup(name: &str) -> Option<&'static KeyDef> {
    KEYS.iter().find(|d| d.name == name)
}

/// Looks a key up by id.
pub fn def_of(id: KeyId) -> &'static KeyDef {
    // Every KeyId has a row; the test `every_id_has_a_row` guards this, and
    // the fallback keeps this total without a panic path.
    KEYS.iter().find(|d| d.id == id).unwrap_or(&KEYS[0])
}

/// True for vendor keys: `X-` private and `X#` IANA-registered extensions.
pub fn is_vendor_key(name: &str) -> bool {
    name.starts_with("X-") || name.starts_with("X#")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_valid() {
        for (i, a) in KEYS.iter().enumerate() {
            assert!(crate::keys::text::check_key(a.name).is_ok(), "{}", a.name);
            for b in KEYS.iter().skip(i + 1) {
                assert_ne!(a.name, b.name);
                assert_ne!(a.id, b.id);
            }
            assert_eq!(lookup(a.name).map(|d| d.id), Some(a.id));
            assert_eq!(def_of(a.id).name, a.name);
        }
        assert!(lookup("maxburstlength").is_none());
        assert!(is_vendor_key("X-com.example.Foo"));
        assert!(is_vendor_key("X#org.example"));
        assert!(!is_vendor_key("Xfoo"));
    }
}
