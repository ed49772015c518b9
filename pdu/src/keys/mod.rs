//! Login/text key=value segments and the RFC 7143 negotiation rules.
//!
//! - [`text`]: the NUL-separated `key=value` codec ([`parse_text`],
//!   [`encode_text`]) and the [`TextAssembler`] for text continued over
//!   several PDUs (C bit).
//! - [`value`]: numbers, booleans, lists and `0x`/`0b` binary values.
//! - [`rules`]: the table of standard keys (RFC 7143 section 13, RFC 7145
//!   section 6): result function, usage phase, senders, ranges, defaults.
//! - [`params`]: [`SessionParams`], the negotiated outcome with RFC defaults.
//! - [`negotiator`]: the [`Negotiator`] engine both initiator and target use.
//! - [`names`]: the syntax of iSCSI names and of a TargetAddress's host.

pub(crate) mod names;
pub(crate) mod negotiator;
pub(crate) mod params;
pub(crate) mod rules;
pub(crate) mod text;
pub(crate) mod value;

pub use names::{check_iscsi_name, check_peer_name, check_portal_host};
pub use negotiator::{
    LocalConfig, NegotiationError, Negotiator, Phase, Responses, Role, MAX_DISTINCT_KEYS,
};
pub use params::{AuthMethod, Digest, SessionParams, SessionType, TaskReporting};
pub use text::{encode_text, parse_text, TextAssembler, TextError, TextPairs};
pub use value::ValueError;
