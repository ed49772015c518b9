//! CHAP authentication for iSCSI login (RFC 1994, RFC 7143 section 12.1.3),
//! shared by the target and the initiator, with no I/O.
//!
//! - [`ChapAlgorithm`]: the CHAP_A values IANA registers for iSCSI: 5 MD5,
//!   6 SHA1, 7 SHA-256, 8 SHA3-256.
//! - [`chap_response`]: `H(identifier || secret || challenge)`.
//! - [`ChapResponder`]: the target side (authenticates the initiator, and
//!   answers the initiator's challenge for mutual CHAP).
//! - [`ChapInitiator`]: the initiator side.
//!
//! Both machines take the `CHAP_*` pairs the key engine passed through and
//! return the pairs to send. Randomness (identifiers and challenges) comes
//! from the caller through a `fill` callback, so that the machines stay
//! deterministic under test. Secrets are held in [`Secret`], whose `Debug`
//! output is redacted, and never appear in errors.
//!
//! The exchange (RFC 7143 12.1.3):
//!
//! ```text
//! I->T  CHAP_A=<A1,A2,...>
//! T->I  CHAP_A=<A>  CHAP_I=<I>  CHAP_C=<C>
//! I->T  CHAP_N=<N>  CHAP_R=<R>  [CHAP_I=<I'>  CHAP_C=<C'>]
//! T->I  [CHAP_N=<N'>  CHAP_R=<R'>]
//! ```

use md5::Md5;
use sha1::Sha1;
use sha2::{Digest, Sha256};
use sha3::Sha3_256;
use subtle::ConstantTimeEq;
use thiserror::Error;

use crate::keys::value::{decode_binary, encode_hex, parse_number_in, split_list};
use crate::keys::TextPairs;

/// Shortest challenge accepted from the peer, in bytes.
pub const MIN_CHALLENGE_LEN: usize = 16;
/// Longest challenge accepted from the peer, in bytes.
pub const MAX_CHALLENGE_LEN: usize = 1024;

/// A CHAP digest algorithm with its IANA CHAP_A number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChapAlgorithm {
    /// MD5 (CHAP_A=5).
    Md5,
    /// SHA-1 (CHAP_A=6).
    Sha1,
    /// SHA-256 (CHAP_A=7).
    Sha256,
    /// SHA3-256 (CHAP_A=8).
    Sha3_256,
}

impl ChapAlgorithm {
    /// Every algorithm, strongest first: a sensible default preference.
    pub const ALL: [ChapAlgorithm; 4] = [
        ChapAlgorithm::Sha3_256,
        ChapAlgorithm::Sha256,
        ChapAlgorithm::Sha1,
        ChapAlgorithm::Md5,
    ];

    /// The IANA CHAP_A number.
    pub fn code(self) -> u8 {
        match self {
            ChapAlgorithm::Md5 => 5,
            ChapAlgorithm::Sha1 => 6,
            ChapAlgorithm::Sha256 => 7,
            ChapAlgorithm::Sha3_256 => 8,
        }
    }

    /// The algorithm with IANA number `code`.
    pub fn from_code(code: u64) -> Option<ChapAlgorithm> {
        match code {
            5 => Some(ChapAlgorithm::Md5),
            6 => Some(ChapAlgorithm::Sha1),
            7 => Some(ChapAlgorithm::Sha256),
            8 => Some(ChapAlgorithm::Sha3_256),
            _ => None,
        }
    }

    /// Human-readable name.
    pub fn name(self) -> &'static str {
        match self {
            ChapAlgorithm::Md5 => "MD5",
            ChapAlgorithm::Sha1 => "SHA1",
            ChapAlgorithm::Sha256 => "SHA-256",
            ChapAlgorithm::Sha3_256 => "SHA3-256",
        }
    }

    /// Length of the response (the digest) in bytes.
    pub fn digest_len(self) -> usize {
        match self {
            ChapAlgorithm::Md5 => 16,
            ChapAlgorithm::Sha1 => 20,
            ChapAlgorithm::Sha256 | ChapAlgorithm::Sha3_256 => 32,
        }
    }

    /// Length of the challenges this side generates: at least
    /// [`MIN_CHALLENGE_LEN`] and at least the digest length.
    pub fn challenge_len(self) -> usize {
        self.digest_len().max(MIN_CHALLENGE_LEN)
    }

    /// Parses a CHAP_A list value (`"7,5"`), keeping the known algorithms
    /// in the sender's order and skipping unknown or malformed items.
    pub fn parse_list(value: &str) -> Vec<ChapAlgorithm> {
        let mut out = Vec::new();
        for item in split_list(value) {
            let Ok(code) = crate::keys::value::parse_number(item) else {
                continue;
            };
            if let Some(alg) = ChapAlgorithm::from_code(code) {
                if !out.contains(&alg) {
                    out.push(alg);
                }
            }
        }
        out
    }

    /// Formats a CHAP_A list value.
    pub fn format_list(algs: &[ChapAlgorithm]) -> String {
        algs.iter()
            .map(|a| a.code().to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl std::fmt::Display for ChapAlgorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.code())
    }
}

/// A CHAP secret. Its `Debug` output is redacted and equality is
/// constant-time.
#[derive(Clone, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// Wraps secret bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Secret {
        Secret(bytes.into())
    }

    /// The secret bytes (handle with care: never log them).
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Secret) -> bool {
        ct_eq(&self.0, &other.0)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Secret {
        Secret(s.as_bytes().to_vec())
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Secret {
        Secret(s.into_bytes())
    }
}

/// A CHAP user name with its secret.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Credential {
    /// CHAP_N.
    pub user: String,
    /// The shared secret.
    pub secret: Secret,
}

impl Credential {
    /// A credential from a user name and a secret.
    pub fn new(user: impl Into<String>, secret: impl Into<Secret>) -> Credential {
        Credential {
            user: user.into(),
            secret: secret.into(),
        }
    }
}

/// A CHAP_N the peer sent, as an error message shows it: escaped (a line
/// break or an escape sequence in it cannot forge a log line or drive a
/// terminal) and cut at 64 characters (it may be as long as the login's
/// text).
fn shown(name: &str) -> String {
    const SHOWN: usize = 64;
    let mut out: String = name
        .chars()
        .take(SHOWN)
        .flat_map(char::escape_debug)
        .collect();
    if name.chars().nth(SHOWN).is_some() {
        out.push_str("...");
    }
    out
}

/// Why a CHAP exchange failed. Never carries a secret; values received from
/// the peer are only named by key.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ChapError {
    /// None of the offered CHAP_A values is acceptable.
    #[error("no acceptable CHAP algorithm in CHAP_A={offered}")]
    NoCommonAlgorithm {
        /// The CHAP_A value received.
        offered: String,
    },
    /// The target chose an algorithm the initiator did not offer.
    #[error("target chose CHAP_A={chosen}, which was not offered")]
    UnexpectedAlgorithm {
        /// The CHAP_A value received.
        chosen: String,
    },
    /// A key needed at this step is missing.
    #[error("{key} is missing")]
    MissingKey {
        /// The key.
        key: &'static str,
    },
    /// A key's value is malformed.
    #[error("{key} is malformed: {reason}")]
    BadValue {
        /// The key.
        key: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// A challenge is shorter than [`MIN_CHALLENGE_LEN`] or longer than
    /// [`MAX_CHALLENGE_LEN`].
    #[error("CHAP challenge of {len} bytes is outside {MIN_CHALLENGE_LEN}..={MAX_CHALLENGE_LEN}")]
    ChallengeLength {
        /// The challenge length received.
        len: usize,
    },
    /// The peer sent back our own challenge (reflection attack).
    #[error("the peer's CHAP challenge repeats ours (reflection refused)")]
    Reflection,
    /// The target's mutual CHAP response is the one this side would give
    /// for the same challenge with its own secret (RFC 7143 §9.2.1): one
    /// secret in both directions, or our own answer played back.
    #[error(
        "the target's CHAP response is the one our own secret gives (one secret in both \
         directions, or our answer played back): refused; give the target's mutual CHAP \
         its own secret"
    )]
    OwnResponse,
    /// No credential is configured for this CHAP_N.
    #[error("unknown CHAP user `{}`", shown(user))]
    UnknownUser {
        /// The CHAP_N received.
        user: String,
    },
    /// The response does not prove knowledge of the secret.
    #[error("wrong CHAP response for user `{}`", shown(user))]
    WrongResponse {
        /// The CHAP_N received.
        user: String,
    },
    /// The initiator asked for mutual CHAP and the target has no credential
    /// of its own to answer with.
    #[error("mutual CHAP requested but no outgoing credential is configured")]
    MutualNotConfigured,
    /// The target's outgoing secret equals the initiator's secret, which
    /// RFC 7143 12.1.3 forbids (it would allow reflection).
    #[error("the mutual CHAP secret equals the initiator's secret; configure different secrets")]
    SecretReused,
    /// The initiator expected mutual CHAP and the target did not answer.
    #[error("target did not answer the mutual CHAP challenge")]
    MutualMissing,
    /// The target answered mutual CHAP with a different user name.
    #[error(
        "target answered mutual CHAP as `{}`, expected `{expected}`",
        shown(got)
    )]
    WrongTargetName {
        /// The name configured.
        expected: String,
        /// The CHAP_N received.
        got: String,
    },
    /// The target's mutual response is wrong.
    #[error("wrong mutual CHAP response from the target")]
    WrongTargetResponse,
    /// A CHAP key arrived at the wrong step.
    #[error("{key} was not expected at this step of CHAP")]
    OutOfOrder {
        /// The key.
        key: String,
    },
    /// The exchange already finished or failed.
    #[error("the CHAP exchange is already over")]
    Finished,
}

/// `H(identifier || secret || challenge)` with the algorithm's hash.
pub fn chap_response(
    alg: ChapAlgorithm,
    identifier: u8,
    secret: &[u8],
    challenge: &[u8],
) -> Vec<u8> {
    fn run<D: Digest>(id: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
        let mut h = D::new();
        h.update([id]);
        h.update(secret);
        h.update(challenge);
        h.finalize().to_vec()
    }
    match alg {
        ChapAlgorithm::Md5 => run::<Md5>(identifier, secret, challenge),
        ChapAlgorithm::Sha1 => run::<Sha1>(identifier, secret, challenge),
        ChapAlgorithm::Sha256 => run::<Sha256>(identifier, secret, challenge),
        ChapAlgorithm::Sha3_256 => run::<Sha3_256>(identifier, secret, challenge),
    }
}

/// Constant-time equality of two byte strings (the lengths are not secret).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// Decodes a CHAP binary value (`0x` hex or `0b` base64).
pub fn decode_value(key: &'static str, value: &str) -> Result<Vec<u8>, ChapError> {
    decode_binary(value).map_err(|_| ChapError::BadValue {
        key,
        reason: "not a 0x-hex or 0b-base64 binary value",
    })
}

/// Checks a received challenge's length.
pub fn check_challenge(challenge: &[u8]) -> Result<(), ChapError> {
    if (MIN_CHALLENGE_LEN..=MAX_CHALLENGE_LEN).contains(&challenge.len()) {
        Ok(())
    } else {
        Err(ChapError::ChallengeLength {
            len: challenge.len(),
        })
    }
}

fn parse_identifier(value: &str) -> Result<u8, ChapError> {
    parse_number_in(value, 0, 255)
        .map(|n| n as u8)
        .map_err(|_| ChapError::BadValue {
            key: "CHAP_I",
            reason: "not a number in 0..=255",
        })
}

/// The CHAP keys of one received batch.
#[derive(Default)]
struct ChapKeys<'a> {
    a: Option<&'a str>,
    i: Option<&'a str>,
    c: Option<&'a str>,
    n: Option<&'a str>,
    r: Option<&'a str>,
}

impl<'a> ChapKeys<'a> {
    fn collect(pairs: &'a [(String, String)]) -> Result<ChapKeys<'a>, ChapError> {
        let mut k = ChapKeys::default();
        for (key, value) in pairs {
            let slot = match key.as_str() {
                "CHAP_A" => &mut k.a,
                "CHAP_I" => &mut k.i,
                "CHAP_C" => &mut k.c,
                "CHAP_N" => &mut k.n,
                "CHAP_R" => &mut k.r,
                _ => continue,
            };
            if slot.is_some() {
                return Err(ChapError::OutOfOrder { key: key.clone() });
            }
            *slot = Some(value.as_str());
        }
        Ok(k)
    }

    fn is_empty(&self) -> bool {
        self.a.is_none()
            && self.i.is_none()
            && self.c.is_none()
            && self.n.is_none()
            && self.r.is_none()
    }
}

fn pair(k: &str, v: impl Into<String>) -> (String, String) {
    (k.to_owned(), v.into())
}

/// Where the target's side of the exchange stands.
#[derive(Debug, Clone)]
enum ResponderState {
    AwaitAlgorithms,
    AwaitResponse {
        alg: ChapAlgorithm,
        id: u8,
        challenge: Vec<u8>,
    },
    Done,
    Failed,
}

/// What a [`ChapResponder`] step produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponderStep {
    /// Nothing CHAP-related yet (no CHAP keys in the batch): wait.
    Wait,
    /// Send these pairs (CHAP_A, CHAP_I, CHAP_C) and wait for the response.
    Challenge(TextPairs),
    /// The initiator is authenticated as `user`; send `answers` (the
    /// target's CHAP_N and CHAP_R when mutual CHAP was asked, else empty).
    Authenticated {
        /// The CHAP_N the initiator proved.
        user: String,
        /// Whether the target answered a mutual challenge.
        mutual: bool,
        /// Pairs to send.
        answers: TextPairs,
    },
}

/// The target's side of CHAP.
#[derive(Debug, Clone)]
pub struct ChapResponder {
    algorithms: Vec<ChapAlgorithm>,
    credentials: Vec<Credential>,
    outgoing: Option<Credential>,
    state: ResponderState,
}

impl ChapResponder {
    /// A responder accepting `algorithms` (empty: all four), verifying
    /// initiators against `credentials`, and answering mutual challenges
    /// with `outgoing`.
    pub fn new(
        algorithms: Vec<ChapAlgorithm>,
        credentials: Vec<Credential>,
        outgoing: Option<Credential>,
    ) -> ChapResponder {
        let algorithms = if algorithms.is_empty() {
            ChapAlgorithm::ALL.to_vec()
        } else {
            algorithms
        };
        ChapResponder {
            algorithms,
            credentials,
            outgoing,
            state: ResponderState::AwaitAlgorithms,
        }
    }

    /// True once the initiator is authenticated.
    pub fn is_done(&self) -> bool {
        matches!(self.state, ResponderState::Done)
    }

    /// The algorithm chosen, once chosen.
    pub fn algorithm(&self) -> Option<ChapAlgorithm> {
        match &self.state {
            ResponderState::AwaitResponse { alg, .. } => Some(*alg),
            _ => None,
        }
    }

    /// The first algorithm of the initiator's list (its preference order)
    /// that this target allows.
    pub fn choose(&self, offered: &str) -> Option<ChapAlgorithm> {
        ChapAlgorithm::parse_list(offered)
            .into_iter()
            .find(|a| self.algorithms.contains(a))
    }

    /// Takes the CHAP_* pairs of one login request. `fill` supplies random
    /// bytes for the identifier and the challenge.
    pub fn receive(
        &mut self,
        pairs: &[(String, String)],
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<ResponderStep, ChapError> {
        let result = self.step(pairs, fill);
        if result.is_err() {
            self.state = ResponderState::Failed;
        }
        result
    }

    fn step(
        &mut self,
        pairs: &[(String, String)],
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<ResponderStep, ChapError> {
        let keys = ChapKeys::collect(pairs)?;
        if keys.is_empty() {
            return match self.state {
                ResponderState::Done | ResponderState::Failed => Err(ChapError::Finished),
                _ => Ok(ResponderStep::Wait),
            };
        }
        match std::mem::replace(&mut self.state, ResponderState::Failed) {
            ResponderState::AwaitAlgorithms => {
                let offered = keys.a.ok_or(ChapError::MissingKey { key: "CHAP_A" })?;
                if let Some((k, _)) = pairs
                    .iter()
                    .find(|(k, _)| k.starts_with("CHAP_") && k != "CHAP_A")
                {
                    return Err(ChapError::OutOfOrder { key: k.clone() });
                }
                let alg = self
                    .choose(offered)
                    .ok_or_else(|| ChapError::NoCommonAlgorithm {
                        offered: offered.chars().take(64).collect(),
                    })?;
                let mut id = [0u8; 1];
                fill(&mut id);
                let mut challenge = vec![0u8; alg.challenge_len()];
                fill(&mut challenge);
                let out = vec![
                    pair("CHAP_A", alg.code().to_string()),
                    pair("CHAP_I", id[0].to_string()),
                    pair("CHAP_C", encode_hex(&challenge)),
                ];
                self.state = ResponderState::AwaitResponse {
                    alg,
                    id: id[0],
                    challenge,
                };
                Ok(ResponderStep::Challenge(out))
            }
            ResponderState::AwaitResponse { alg, id, challenge } => {
                if keys.a.is_some() {
                    return Err(ChapError::OutOfOrder {
                        key: "CHAP_A".into(),
                    });
                }
                let user = keys.n.ok_or(ChapError::MissingKey { key: "CHAP_N" })?;
                let response = decode_value(
                    "CHAP_R",
                    keys.r.ok_or(ChapError::MissingKey { key: "CHAP_R" })?,
                )?;
                // The initiator's own challenge, checked before its response
                // so that a reflection attempt learns nothing.
                let mutual = match (keys.i, keys.c) {
                    (None, None) => None,
                    (Some(_), None) => return Err(ChapError::MissingKey { key: "CHAP_C" }),
                    (None, Some(_)) => return Err(ChapError::MissingKey { key: "CHAP_I" }),
                    (Some(i), Some(c)) => {
                        let their_id = parse_identifier(i)?;
                        let their_challenge = decode_value("CHAP_C", c)?;
                        check_challenge(&their_challenge)?;
                        if ct_eq(&their_challenge, &challenge) {
                            return Err(ChapError::Reflection);
                        }
                        Some((their_id, their_challenge))
                    }
                };
                if response.len() != alg.digest_len() {
                    return Err(ChapError::BadValue {
                        key: "CHAP_R",
                        reason: "length differs from the digest length",
                    });
                }
                let mut matched: Option<&Credential> = None;
                let mut known = false;
                for cred in &self.credentials {
                    if cred.user != user {
                        continue;
                    }
                    known = true;
                    let expected = chap_response(alg, id, cred.secret.expose(), &challenge);
                    // Check every candidate so timing does not reveal which matched.
                    if ct_eq(&expected, &response) && matched.is_none() {
                        matched = Some(cred);
                    }
                }
                let Some(cred) = matched else {
                    return Err(if known {
                        ChapError::WrongResponse {
                            user: user.to_owned(),
                        }
                    } else {
                        ChapError::UnknownUser {
                            user: user.to_owned(),
                        }
                    });
                };
                let mut answers = TextPairs::new();
                if let Some((their_id, their_challenge)) = &mutual {
                    let out = self
                        .outgoing
                        .as_ref()
                        .ok_or(ChapError::MutualNotConfigured)?;
                    if out.secret == cred.secret {
                        return Err(ChapError::SecretReused);
                    }
                    let r = chap_response(alg, *their_id, out.secret.expose(), their_challenge);
                    answers.push(pair("CHAP_N", out.user.clone()));
                    answers.push(pair("CHAP_R", encode_hex(&r)));
                }
                self.state = ResponderState::Done;
                Ok(ResponderStep::Authenticated {
                    user: user.to_owned(),
                    mutual: mutual.is_some(),
                    answers,
                })
            }
            ResponderState::Done | ResponderState::Failed => Err(ChapError::Finished),
        }
    }
}

/// Where the initiator's side of the exchange stands.
#[derive(Debug, Clone)]
enum InitiatorState {
    Start,
    Offered,
    AwaitMutual {
        alg: ChapAlgorithm,
        id: u8,
        challenge: Vec<u8>,
    },
    Done,
    Failed,
}

/// What a [`ChapInitiator`] step produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitiatorStep {
    /// No CHAP keys in the batch: wait.
    Wait,
    /// Send these pairs (CHAP_N, CHAP_R and, for mutual CHAP, CHAP_I,
    /// CHAP_C). Without mutual CHAP the exchange is then complete.
    Respond(TextPairs),
    /// The target proved its identity (mutual CHAP): the exchange is over.
    TargetVerified,
}

/// The initiator's side of CHAP.
#[derive(Debug, Clone)]
pub struct ChapInitiator {
    credential: Credential,
    algorithms: Vec<ChapAlgorithm>,
    mutual: Option<Credential>,
    state: InitiatorState,
}

impl ChapInitiator {
    /// An initiator proving `credential`, offering `algorithms` in its
    /// order of preference (empty: [`ChapAlgorithm::ALL`]), and, when
    /// `mutual` is set, challenging the target to prove that credential.
    pub fn new(
        credential: Credential,
        algorithms: Vec<ChapAlgorithm>,
        mutual: Option<Credential>,
    ) -> ChapInitiator {
        let algorithms = if algorithms.is_empty() {
            ChapAlgorithm::ALL.to_vec()
        } else {
            algorithms
        };
        ChapInitiator {
            credential,
            algorithms,
            mutual,
            state: InitiatorState::Start,
        }
    }

    /// True once the exchange is over on this side: the response was sent
    /// (one-way), or the target's answer verified (mutual).
    pub fn is_done(&self) -> bool {
        matches!(self.state, InitiatorState::Done)
    }

    /// The first message: `CHAP_A=<list>`.
    pub fn offer(&mut self) -> TextPairs {
        self.state = InitiatorState::Offered;
        vec![pair("CHAP_A", ChapAlgorithm::format_list(&self.algorithms))]
    }

    /// Takes the CHAP_* pairs of one login response. `fill` supplies random
    /// bytes for the mutual identifier and challenge.
    pub fn receive(
        &mut self,
        pairs: &[(String, String)],
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<InitiatorStep, ChapError> {
        let result = self.step(pairs, fill);
        if result.is_err() {
            self.state = InitiatorState::Failed;
        }
        result
    }

    fn step(
        &mut self,
        pairs: &[(String, String)],
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<InitiatorStep, ChapError> {
        let keys = ChapKeys::collect(pairs)?;
        match std::mem::replace(&mut self.state, InitiatorState::Failed) {
            InitiatorState::Start | InitiatorState::Offered if keys.is_empty() => {
                self.state = InitiatorState::Offered;
                Ok(InitiatorStep::Wait)
            }
            InitiatorState::Start | InitiatorState::Offered => {
                let a = keys.a.ok_or(ChapError::MissingKey { key: "CHAP_A" })?;
                let alg = crate::keys::value::parse_number(a)
                    .ok()
                    .and_then(ChapAlgorithm::from_code)
                    .filter(|alg| self.algorithms.contains(alg))
                    .ok_or_else(|| ChapError::UnexpectedAlgorithm {
                        chosen: a.chars().take(64).collect(),
                    })?;
                let id = parse_identifier(keys.i.ok_or(ChapError::MissingKey { key: "CHAP_I" })?)?;
                let challenge = decode_value(
                    "CHAP_C",
                    keys.c.ok_or(ChapError::MissingKey { key: "CHAP_C" })?,
                )?;
                check_challenge(&challenge)?;
                if let Some(k) = keys.n.map(|_| "CHAP_N").or(keys.r.map(|_| "CHAP_R")) {
                    return Err(ChapError::OutOfOrder { key: k.into() });
                }
                let r = chap_response(alg, id, self.credential.secret.expose(), &challenge);
                let mut out = vec![
                    pair("CHAP_N", self.credential.user.clone()),
                    pair("CHAP_R", encode_hex(&r)),
                ];
                if self.mutual.is_some() {
                    let mut my_id = [0u8; 1];
                    fill(&mut my_id);
                    let mut my_challenge = vec![0u8; alg.challenge_len()];
                    fill(&mut my_challenge);
                    if my_challenge == challenge {
                        return Err(ChapError::Reflection);
                    }
                    out.push(pair("CHAP_I", my_id[0].to_string()));
                    out.push(pair("CHAP_C", encode_hex(&my_challenge)));
                    self.state = InitiatorState::AwaitMutual {
                        alg,
                        id: my_id[0],
                        challenge: my_challenge,
                    };
                } else {
                    self.state = InitiatorState::Done;
                }
                Ok(InitiatorStep::Respond(out))
            }
            InitiatorState::AwaitMutual { alg, id, challenge } => {
                let Some(mutual) = &self.mutual else {
                    return Err(ChapError::MutualMissing);
                };
                if keys.is_empty() {
                    return Err(ChapError::MutualMissing);
                }
                if let Some(k) = [("CHAP_A", keys.a), ("CHAP_I", keys.i), ("CHAP_C", keys.c)]
                    .into_iter()
                    .find_map(|(k, v)| v.map(|_| k))
                {
                    return Err(ChapError::OutOfOrder { key: k.into() });
                }
                let name = keys.n.ok_or(ChapError::MissingKey { key: "CHAP_N" })?;
                let response = decode_value(
                    "CHAP_R",
                    keys.r.ok_or(ChapError::MissingKey { key: "CHAP_R" })?,
                )?;
                if name != mutual.user {
                    return Err(ChapError::WrongTargetName {
                        expected: mutual.user.clone(),
                        got: name.to_owned(),
                    });
                }
                // RFC 7143 §9.2.1: a response this side would have
                // generated itself for the same challenge is a failure;
                // otherwise a target holding no secret could answer with
                // ours, taken from another login of ours it challenged.
                let own = chap_response(alg, id, self.credential.secret.expose(), &challenge);
                if ct_eq(&own, &response) {
                    return Err(ChapError::OwnResponse);
                }
                let expected = chap_response(alg, id, mutual.secret.expose(), &challenge);
                if !ct_eq(&expected, &response) {
                    return Err(ChapError::WrongTargetResponse);
                }
                self.state = InitiatorState::Done;
                Ok(InitiatorStep::TargetVerified)
            }
            InitiatorState::Done if keys.is_empty() => {
                self.state = InitiatorState::Done;
                Ok(InitiatorStep::Wait)
            }
            InitiatorState::Done | InitiatorState::Failed => Err(ChapError::Finished),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn unhex(s: &str) -> Vec<u8> {
        decode_binary(&format!("0x{s}")).unwrap()
    }

    /// A deterministic byte source for tests.
    fn counter(seed: u8) -> impl FnMut(&mut [u8]) {
        let mut n = seed;
        move |buf: &mut [u8]| {
            for b in buf {
                *b = n;
                n = n.wrapping_mul(31).wrapping_add(7);
            }
        }
    }

    // Expected values computed independently with Python's hashlib, for
    // H in md5, sha1, sha256, sha3_256:
    //   python3 -c "import hashlib; print(hashlib.H(bytes([1]) + b'secret-0123456789' + bytes(range(16))).hexdigest())"
    #[test]
    fn chap_known_answers_md5() {
        let r = chap_response(
            ChapAlgorithm::Md5,
            1,
            b"secret-0123456789",
            &(0u8..16).collect::<Vec<_>>(),
        );
        assert_eq!(r, unhex(KAT_MD5));
    }

    #[test]
    fn chap_known_answers_sha1() {
        let r = chap_response(
            ChapAlgorithm::Sha1,
            1,
            b"secret-0123456789",
            &(0u8..16).collect::<Vec<_>>(),
        );
        assert_eq!(r, unhex(KAT_SHA1));
    }

    #[test]
    fn chap_known_answers_sha256() {
        let r = chap_response(
            ChapAlgorithm::Sha256,
            1,
            b"secret-0123456789",
            &(0u8..16).collect::<Vec<_>>(),
        );
        assert_eq!(r, unhex(KAT_SHA256));
    }

    #[test]
    fn chap_known_answers_sha3_256() {
        let r = chap_response(
            ChapAlgorithm::Sha3_256,
            1,
            b"secret-0123456789",
            &(0u8..16).collect::<Vec<_>>(),
        );
        assert_eq!(r, unhex(KAT_SHA3_256));
    }

    // python3 -c "import hashlib; print(hashlib.md5(bytes([0xb7]) + b'abc' + bytes.fromhex('00'*16)).hexdigest())"
    #[test]
    fn chap_known_answer_other_identifier() {
        let r = chap_response(ChapAlgorithm::Md5, 0xb7, b"abc", &[0u8; 16]);
        assert_eq!(r, unhex(KAT_MD5_B7));
    }

    const KAT_MD5: &str = "c149dc09bc335e08ffbb3846957d4d21";
    const KAT_SHA1: &str = "14865c049f7fe58cbe6bea41e3cfcdeae3419456";
    const KAT_SHA256: &str = "3a16d96e66a3852cbb67e0d13093884fcbcfc7c93593338e388b589e8283f07c";
    const KAT_SHA3_256: &str = "8298e61dbe9645b57fddcfdda8a422c773cbdb6a825bc1773b674c3732165f7c";
    const KAT_MD5_B7: &str = "8306c2cc286187219aab7d407992a387";

    #[test]
    fn chap_iana_numbers() {
        assert_eq!(ChapAlgorithm::Md5.code(), 5);
        assert_eq!(ChapAlgorithm::Sha1.code(), 6);
        assert_eq!(ChapAlgorithm::Sha256.code(), 7);
        assert_eq!(ChapAlgorithm::Sha3_256.code(), 8);
        for a in ChapAlgorithm::ALL {
            assert_eq!(ChapAlgorithm::from_code(a.code().into()), Some(a));
            assert_eq!(chap_response(a, 0, b"", b"").len(), a.digest_len());
        }
        assert_eq!(ChapAlgorithm::from_code(4), None);
        assert_eq!(
            ChapAlgorithm::parse_list("9,7,x,5,7,0x06"),
            vec![
                ChapAlgorithm::Sha256,
                ChapAlgorithm::Md5,
                ChapAlgorithm::Sha1
            ]
        );
    }

    #[test]
    fn chap_secrets_are_redacted() {
        let c = Credential::new("alice", "topsecret-value");
        let r = ChapResponder::new(
            vec![],
            vec![c.clone()],
            Some(Credential::new("tgt", "othersecret")),
        );
        let i = ChapInitiator::new(c.clone(), vec![], None);
        for text in [format!("{c:?}"), format!("{r:?}"), format!("{i:?}")] {
            assert!(!text.contains("topsecret"), "{text}");
            assert!(!text.contains("othersecret"), "{text}");
        }
    }

    #[test]
    fn chap_ct_eq() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
        assert_eq!(Secret::from("x"), Secret::from("x"));
        assert_ne!(Secret::from("x"), Secret::from("y"));
    }

    fn p(list: &[(&str, &str)]) -> TextPairs {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn responder(algs: Vec<ChapAlgorithm>) -> ChapResponder {
        ChapResponder::new(
            algs,
            vec![Credential::new("alice", "alice-secret-123")],
            Some(Credential::new("target", "target-secret-456")),
        )
    }

    #[test]
    fn chap_responder_honours_initiator_preference() {
        let r = responder(vec![ChapAlgorithm::Md5, ChapAlgorithm::Sha256]);
        assert_eq!(r.choose("7,5"), Some(ChapAlgorithm::Sha256));
        assert_eq!(r.choose("5,7"), Some(ChapAlgorithm::Md5));
        assert_eq!(r.choose("8,6"), None);
        let mut r = responder(vec![ChapAlgorithm::Md5]);
        assert!(matches!(
            r.receive(&p(&[("CHAP_A", "6,7")]), &mut counter(1)),
            Err(ChapError::NoCommonAlgorithm { .. })
        ));
        let mut r = responder(vec![]);
        let Ok(ResponderStep::Challenge(out)) =
            r.receive(&p(&[("CHAP_A", "8,5")]), &mut counter(1))
        else {
            panic!()
        };
        assert_eq!(out[0], ("CHAP_A".to_string(), "8".to_string()));
        assert_eq!(decode_binary(&out[2].1).unwrap().len(), 32);
    }

    /// Runs a whole exchange; returns the responder's and the initiator's results.
    fn run(
        alg: ChapAlgorithm,
        ini_secret: &str,
        mutual: Option<Credential>,
        seed: u8,
    ) -> Result<(String, bool), ChapError> {
        let mut r = responder(vec![]);
        let mut i = ChapInitiator::new(
            Credential::new("alice", ini_secret),
            vec![alg],
            mutual.clone(),
        );
        let offer = i.offer();
        let ResponderStep::Challenge(ch) = r.receive(&offer, &mut counter(seed))? else {
            panic!("expected a challenge")
        };
        let InitiatorStep::Respond(resp) = i.receive(&ch, &mut counter(seed.wrapping_add(100)))?
        else {
            panic!("expected a response")
        };
        let ResponderStep::Authenticated {
            user,
            mutual: m,
            answers,
        } = r.receive(&resp, &mut counter(0))?
        else {
            panic!("expected authentication")
        };
        assert!(r.is_done());
        if mutual.is_some() {
            assert_eq!(
                i.receive(&answers, &mut counter(0))?,
                InitiatorStep::TargetVerified
            );
        } else {
            assert!(answers.is_empty());
        }
        assert!(i.is_done());
        Ok((user, m))
    }

    #[test]
    fn chap_one_way_and_mutual_for_every_algorithm() {
        for alg in ChapAlgorithm::ALL {
            assert_eq!(
                run(alg, "alice-secret-123", None, 3),
                Ok(("alice".into(), false))
            );
            let m = Some(Credential::new("target", "target-secret-456"));
            assert_eq!(
                run(alg, "alice-secret-123", m, 3),
                Ok(("alice".into(), true))
            );
            assert_eq!(
                run(alg, "wrong-secret-123", None, 3),
                Err(ChapError::WrongResponse {
                    user: "alice".into()
                })
            );
            let bad_mutual = Some(Credential::new("target", "not-the-target-secret"));
            assert_eq!(
                run(alg, "alice-secret-123", bad_mutual, 3),
                Err(ChapError::WrongTargetResponse)
            );
            let bad_name = Some(Credential::new("other", "target-secret-456"));
            assert!(matches!(
                run(alg, "alice-secret-123", bad_name, 3),
                Err(ChapError::WrongTargetName { .. })
            ));
        }
    }

    /// RFC 7143 §9.2.1: the target's mutual response must not be the one
    /// the initiator's own secret gives for that challenge. A rogue target
    /// that holds no secret can get exactly that answer by sending the
    /// initiator's challenge, from another login of the same initiator, as
    /// its own challenge there; with one secret in both directions the
    /// initiator took it as proof.
    #[test]
    fn chap_initiator_refuses_its_own_response_from_the_target() {
        let secret = "one-secret-both-ways";
        let mut i = ChapInitiator::new(
            Credential::new("alice", secret),
            vec![ChapAlgorithm::Md5],
            Some(Credential::new("target", secret)),
        );
        let _ = i.offer();
        let theirs = p(&[
            ("CHAP_A", "5"),
            ("CHAP_I", "7"),
            ("CHAP_C", &encode_hex(&[0x5a; 16])),
        ]);
        let Ok(InitiatorStep::Respond(out)) = i.receive(&theirs, &mut counter(40)) else {
            panic!("expected a response")
        };
        let value = |k: &str| out.iter().find(|(key, _)| key == k).unwrap().1.clone();
        let my_id: u8 = value("CHAP_I").parse().unwrap();
        let my_challenge = decode_binary(&value("CHAP_C")).unwrap();
        let own = chap_response(ChapAlgorithm::Md5, my_id, secret.as_bytes(), &my_challenge);
        assert_eq!(
            i.receive(
                &p(&[("CHAP_N", "target"), ("CHAP_R", &encode_hex(&own))]),
                &mut counter(0)
            ),
            Err(ChapError::OwnResponse)
        );
    }

    fn challenged(alg: &str) -> (ChapResponder, u8, Vec<u8>) {
        let mut r = responder(vec![]);
        let Ok(ResponderStep::Challenge(ch)) = r.receive(&p(&[("CHAP_A", alg)]), &mut counter(9))
        else {
            panic!()
        };
        let id: u8 = ch[1].1.parse().unwrap();
        let c = decode_binary(&ch[2].1).unwrap();
        (r, id, c)
    }

    #[test]
    fn chap_responder_refuses_reflection_and_bad_challenges() {
        let (mut r, id, c) = challenged("5");
        let resp = encode_hex(&chap_response(
            ChapAlgorithm::Md5,
            id,
            b"alice-secret-123",
            &c,
        ));
        let reflected = p(&[
            ("CHAP_N", "alice"),
            ("CHAP_R", &resp),
            ("CHAP_I", "3"),
            ("CHAP_C", &encode_hex(&c)),
        ]);
        assert_eq!(
            r.receive(&reflected, &mut counter(0)),
            Err(ChapError::Reflection)
        );
        // Base64 form of the same reflected challenge.
        let (mut r, id, c) = challenged("5");
        let resp = encode_hex(&chap_response(
            ChapAlgorithm::Md5,
            id,
            b"alice-secret-123",
            &c,
        ));
        let b64 = crate::keys::value::encode_base64(&c);
        let reflected = p(&[
            ("CHAP_N", "alice"),
            ("CHAP_R", &resp),
            ("CHAP_I", "3"),
            ("CHAP_C", &b64),
        ]);
        assert_eq!(
            r.receive(&reflected, &mut counter(0)),
            Err(ChapError::Reflection)
        );
        for len in [15usize, 1025] {
            let (mut r, id, c) = challenged("5");
            let resp = encode_hex(&chap_response(
                ChapAlgorithm::Md5,
                id,
                b"alice-secret-123",
                &c,
            ));
            let short = encode_hex(&vec![0xaa; len]);
            let msg = p(&[
                ("CHAP_N", "alice"),
                ("CHAP_R", &resp),
                ("CHAP_I", "3"),
                ("CHAP_C", &short),
            ]);
            assert_eq!(
                r.receive(&msg, &mut counter(0)),
                Err(ChapError::ChallengeLength { len })
            );
        }
        // Mutual asked, none configured.
        let mut r = ChapResponder::new(
            vec![],
            vec![Credential::new("alice", "alice-secret-123")],
            None,
        );
        let Ok(ResponderStep::Challenge(ch)) = r.receive(&p(&[("CHAP_A", "5")]), &mut counter(9))
        else {
            panic!()
        };
        let id: u8 = ch[1].1.parse().unwrap();
        let c = decode_binary(&ch[2].1).unwrap();
        let resp = encode_hex(&chap_response(
            ChapAlgorithm::Md5,
            id,
            b"alice-secret-123",
            &c,
        ));
        let msg = p(&[
            ("CHAP_N", "alice"),
            ("CHAP_R", &resp),
            ("CHAP_I", "3"),
            ("CHAP_C", &encode_hex(&[1; 16])),
        ]);
        assert_eq!(
            r.receive(&msg, &mut counter(0)),
            Err(ChapError::MutualNotConfigured)
        );
    }

    /// A CHAP_N is the peer's text: an error that names it (logged by the
    /// target for every failed login) shows it escaped and bounded.
    #[test]
    fn a_peers_chap_name_is_shown_escaped_and_bounded() {
        let forged = ChapError::UnknownUser {
            user: "bob\n2026-12-06T00:00:00Z INFO login succeeded\u{1b}[2J".into(),
        };
        let text = forged.to_string();
        assert!(!text.contains('\n') && !text.contains('\u{1b}'), "{text}");
        assert!(text.contains("bob\\n2026"), "{text}");
        let long = ChapError::WrongResponse {
            user: "u".repeat(8000),
        };
        assert!(long.to_string().len() < 120, "{}", long.to_string().len());
        assert_eq!(
            ChapError::UnknownUser { user: "bob".into() }.to_string(),
            "unknown CHAP user `bob`"
        );
    }

    #[test]
    fn chap_responder_errors() {
        let (mut r, _, _) = challenged("5");
        assert_eq!(
            r.receive(
                &p(&[("CHAP_N", "bob"), ("CHAP_R", &encode_hex(&[0; 16]))]),
                &mut counter(0)
            ),
            Err(ChapError::UnknownUser { user: "bob".into() })
        );
        assert_eq!(
            r.receive(&p(&[("CHAP_N", "x")]), &mut counter(0)),
            Err(ChapError::Finished)
        );
        let (mut r, _, _) = challenged("5");
        assert!(matches!(
            r.receive(
                &p(&[("CHAP_N", "alice"), ("CHAP_R", "0x0102")]),
                &mut counter(0)
            ),
            Err(ChapError::BadValue { key: "CHAP_R", .. })
        ));
        let (mut r, _, _) = challenged("5");
        assert_eq!(
            r.receive(&p(&[("CHAP_R", "0x0102")]), &mut counter(0)),
            Err(ChapError::MissingKey { key: "CHAP_N" })
        );
        let (mut r, _, _) = challenged("5");
        assert!(matches!(
            r.receive(&p(&[("CHAP_A", "5")]), &mut counter(0)),
            Err(ChapError::OutOfOrder { .. })
        ));
        let mut r = responder(vec![]);
        assert!(matches!(
            r.receive(&p(&[("CHAP_N", "alice")]), &mut counter(0)),
            Err(ChapError::MissingKey { key: "CHAP_A" })
        ));
        let mut r = responder(vec![]);
        assert_eq!(
            r.receive(&p(&[("AuthMethod", "CHAP")]), &mut counter(0)),
            Ok(ResponderStep::Wait)
        );
        // The same secret both ways is refused.
        let mut r = ChapResponder::new(
            vec![],
            vec![Credential::new("alice", "same-secret-1234")],
            Some(Credential::new("target", "same-secret-1234")),
        );
        let mut i = ChapInitiator::new(
            Credential::new("alice", "same-secret-1234"),
            vec![ChapAlgorithm::Sha256],
            Some(Credential::new("target", "same-secret-1234")),
        );
        let Ok(ResponderStep::Challenge(ch)) = r.receive(&i.offer(), &mut counter(1)) else {
            panic!()
        };
        let Ok(InitiatorStep::Respond(resp)) = i.receive(&ch, &mut counter(2)) else {
            panic!()
        };
        assert_eq!(
            r.receive(&resp, &mut counter(0)),
            Err(ChapError::SecretReused)
        );
    }

    #[test]
    fn chap_per_user_credentials() {
        let mut r = ChapResponder::new(
            vec![],
            vec![
                Credential::new("alice", "alice-secret-123"),
                Credential::new("bob", "bob-secret-4567"),
            ],
            None,
        );
        let mut i = ChapInitiator::new(Credential::new("bob", "bob-secret-4567"), vec![], None);
        let Ok(ResponderStep::Challenge(ch)) = r.receive(&i.offer(), &mut counter(1)) else {
            panic!()
        };
        let Ok(InitiatorStep::Respond(resp)) = i.receive(&ch, &mut counter(2)) else {
            panic!()
        };
        assert!(matches!(
            r.receive(&resp, &mut counter(0)),
            Ok(ResponderStep::Authenticated { user, .. }) if user == "bob"
        ));
    }

    #[test]
    fn chap_initiator_checks() {
        let mk = || {
            ChapInitiator::new(
                Credential::new("a", "secret-secret-12"),
                vec![ChapAlgorithm::Sha256],
                None,
            )
        };
        let c16 = encode_hex(&[7; 16]);
        let mut i = mk();
        i.offer();
        assert!(matches!(
            i.receive(
                &p(&[("CHAP_A", "5"), ("CHAP_I", "1"), ("CHAP_C", &c16)]),
                &mut counter(0)
            ),
            Err(ChapError::UnexpectedAlgorithm { .. })
        ));
        let mut i = mk();
        i.offer();
        assert!(matches!(
            i.receive(
                &p(&[("CHAP_A", "7"), ("CHAP_I", "256"), ("CHAP_C", &c16)]),
                &mut counter(0)
            ),
            Err(ChapError::BadValue { key: "CHAP_I", .. })
        ));
        let mut i = mk();
        i.offer();
        assert_eq!(
            i.receive(
                &p(&[("CHAP_A", "7"), ("CHAP_I", "1"), ("CHAP_C", "0x0102")]),
                &mut counter(0)
            ),
            Err(ChapError::ChallengeLength { len: 2 })
        );
        let mut i = mk();
        i.offer();
        // 0b base64 challenges are accepted.
        let b64 = crate::keys::value::encode_base64(&[7; 16]);
        assert!(matches!(
            i.receive(
                &p(&[("CHAP_A", "7"), ("CHAP_I", "0x10"), ("CHAP_C", &b64)]),
                &mut counter(0)
            ),
            Ok(InitiatorStep::Respond(_))
        ));
        assert!(i.is_done());
        // Mutual expected, target silent.
        let mut i = ChapInitiator::new(
            Credential::new("a", "secret-secret-12"),
            vec![ChapAlgorithm::Sha256],
            Some(Credential::new("t", "target-secret-12")),
        );
        i.offer();
        assert!(matches!(
            i.receive(&p(&[("CHAP_A", "7"), ("CHAP_I", "1"), ("CHAP_C", &c16)]), &mut counter(0)),
            Ok(InitiatorStep::Respond(v)) if v.len() == 4
        ));
        assert_eq!(
            i.receive(&[], &mut counter(0)),
            Err(ChapError::MutualMissing)
        );
    }

    fn alg_strategy() -> impl Strategy<Value = ChapAlgorithm> {
        prop::sample::select(ChapAlgorithm::ALL.to_vec())
    }

    proptest! {
        #[test]
        fn chap_round_trips(
            alg in alg_strategy(),
            mutual in any::<bool>(),
            seed in any::<u8>(),
            user in "[a-z][a-z0-9.:-]{0,30}",
            secret in prop::collection::vec(any::<u8>(), 12..40),
            tsecret in prop::collection::vec(any::<u8>(), 12..40),
            wrong in any::<bool>(),
        ) {
            prop_assume!(secret != tsecret);
            let mut r = ChapResponder::new(
                vec![alg],
                vec![Credential { user: user.clone(), secret: Secret::new(secret.clone()) }],
                Some(Credential { user: "tgt".into(), secret: Secret::new(tsecret.clone()) }),
            );
            let mut isecret = secret.clone();
            if wrong {
                isecret[0] ^= 1;
            }
            let mut i = ChapInitiator::new(
                Credential { user: user.clone(), secret: Secret::new(isecret) },
                ChapAlgorithm::ALL.to_vec(),
                mutual.then(|| Credential { user: "tgt".into(), secret: Secret::new(tsecret.clone()) }),
            );
            let ch = match r.receive(&i.offer(), &mut counter(seed)) {
                Ok(ResponderStep::Challenge(ch)) => ch,
                other => panic!("{other:?}"),
            };
            prop_assert_eq!(&ch[0].1, &alg.code().to_string());
            let resp = match i.receive(&ch, &mut counter(seed ^ 0x5a)) {
                Ok(InitiatorStep::Respond(resp)) => resp,
                other => panic!("{other:?}"),
            };
            let got = r.receive(&resp, &mut counter(0));
            if wrong {
                prop_assert_eq!(got, Err(ChapError::WrongResponse { user }));
            } else {
                let Ok(ResponderStep::Authenticated { user: u, mutual: m, answers }) = got else {
                    panic!("{got:?}")
                };
                prop_assert_eq!(u, user);
                prop_assert_eq!(m, mutual);
                if mutual {
                    prop_assert_eq!(i.receive(&answers, &mut counter(0)), Ok(InitiatorStep::TargetVerified));
                }
                prop_assert!(i.is_done());
            }
        }

        #[test]
        fn chap_responder_never_panics(pairs in prop::collection::vec(
            (prop::sample::select(vec!["CHAP_A", "CHAP_I", "CHAP_C", "CHAP_N", "CHAP_R", "X"]), "[0-9a-fx,b=A-Z]{0,40}"),
            0..6,
        )) {
            let pairs: TextPairs = pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            let mut r = responder(vec![]);
            let _ = r.receive(&pairs, &mut counter(1));
            let _ = r.receive(&pairs, &mut counter(1));
            let mut i = ChapInitiator::new(Credential::new("a", "b"), vec![], Some(Credential::new("c", "d")));
            let _ = i.receive(&pairs, &mut counter(1));
            let _ = i.receive(&pairs, &mut counter(1));
        }
    }
}
