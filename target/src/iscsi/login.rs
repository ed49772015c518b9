//! The target's login state machine (RFC 7143 sections 6, 11.12, 11.13),
//! sans-IO: it takes Login Request PDUs and returns the Login Response to
//! send, with no sockets, clocks or session table.
//!
//! One [`LoginMachine`] serves one connection's login phase:
//!
//! 1. The fabric feeds each Login Request to [`LoginMachine::on_request`]
//!    and sends what comes back: [`LoginStep::Respond`] (wait for the next
//!    request) or [`LoginStep::Fail`] (send, then close the connection).
//! 2. When the initiator may enter full feature phase the machine returns
//!    [`LoginStep::Complete`] with a [`LoginOutcome`] and sends nothing yet.
//!    The fabric, which owns the session table, then:
//!    - for `tsih_requested == 0`, reinstates any session with the same
//!      InitiatorName + ISID (and target) and allocates a new nonzero TSIH;
//!    - for a nonzero TSIH, checks that the session exists (else
//!      [`LoginMachine::reject`] with [`LoginStatus::SESSION_DOES_NOT_EXIST`])
//!      and belongs to the same initiator/ISID/target, reinstating the
//!      connection with the same CID if there is one;
//!    - calls [`LoginMachine::final_response`] with the TSIH, the StatSN
//!      (normally `outcome.stat_sn`) and the session's MaxCmdSN, sends that
//!      PDU and enters full feature phase with StatSN `stat_sn + 1` next;
//!    - or calls [`LoginMachine::reject`] (e.g. OUT_OF_RESOURCES) and closes.
//!
//! Every login response carries StatSN (starting from a random value and
//! incremented per response), ExpCmdSN (the request's CmdSN: login requests
//! are immediate) and MaxCmdSN (ExpCmdSN + window - 1).
//!
//! Admission (the first request's declarations against the catalog, CHAP,
//! the RDMA offload grant) lives in the `admission` submodule. What stays
//! here is over 600 lines on purpose: it is one state machine (RFC 7143
//! section 6 stages and transitions, the C bit in both directions, StatSN
//! and ExpCmdSN bookkeeping, the Login Response of each outcome) whose
//! steps all read and write the same [`LoginMachine`] fields; cutting it
//! further would split one transition's checks from its effects.

use std::net::SocketAddr;
use std::sync::Arc;

use blockwire_pdu::chap::ChapResponder;
use blockwire_pdu::keys::{
    encode_text, AuthMethod, LocalConfig, Negotiator, Phase, SessionParams, SessionType,
    TextAssembler, TextPairs,
};
use blockwire_pdu::pdu::{LoginRequest, LoginResponse};
use blockwire_pdu::{Bhs, LoginStatus, Pdu, Stage};
use rand::RngCore;

use super::catalog::{Catalog, TargetEntry};

mod admission;

/// Largest data segment of a Login PDU in either direction (RFC 7143
/// 6.3: during login MaxRecvDataSegmentLength is 8192 on both sides).
pub const LOGIN_MAX_DATA_SEGMENT: usize = 8192;

/// Bound on the text of one login request sequence (C bit continuation).
const MAX_LOGIN_TEXT: usize = 64 * 1024;

/// Bound on the number of login requests of one login phase.
const MAX_LOGIN_PDUS: u32 = 256;

/// How the target negotiates, beyond what the catalog says.
#[derive(Debug, Clone)]
pub struct LoginSettings {
    /// Commands the session accepts ahead: MaxCmdSN = ExpCmdSN + window - 1.
    pub cmd_window: u32,
    /// The target's negotiation preferences (MaxRecvDataSegmentLength,
    /// MaxBurstLength, digests, ...). Names, TargetPortalGroupTag,
    /// TargetAlias, AuthMethod and `leading` are set per login.
    pub negotiation: LocalConfig,
    /// RDMA offload this target grants to normal sessions that ask for it
    /// (the `X-io.blockwire.RdmaOffload` key); None: the key is not understood.
    pub rdma_offload: Option<RdmaOffer>,
}

/// What the target answers an RDMA offload offer with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaOffer {
    /// The RDMA backend ("soft", "verbs").
    pub backend: String,
    /// Where the target's RDMA listener accepts connections.
    pub endpoint: SocketAddr,
}

impl Default for LoginSettings {
    fn default() -> Self {
        LoginSettings {
            cmd_window: 128,
            negotiation: LocalConfig {
                max_recv_data_segment_length: 262_144,
                ..LocalConfig::default()
            },
            rdma_offload: None,
        }
    }
}

/// What to do with a login request's answer.
#[derive(Debug, Clone)]
pub enum LoginStep {
    /// Send this Login Response and wait for the next request.
    Respond(Pdu),
    /// Send this Login Response (a login reject) and close the connection.
    Fail(Pdu),
    /// The login succeeded: the fabric allocates or checks the TSIH and
    /// sends [`LoginMachine::final_response`] (or [`LoginMachine::reject`]).
    Complete(Box<LoginOutcome>),
}

/// The result of a successful login phase.
#[derive(Debug, Clone)]
pub struct LoginOutcome {
    /// InitiatorName.
    pub initiator_name: String,
    /// InitiatorAlias, if declared.
    pub initiator_alias: Option<String>,
    /// ISID.
    pub isid: [u8; 6],
    /// TSIH of the request: 0 for a new session, else the session to join.
    pub tsih_requested: u16,
    /// Connection ID.
    pub cid: u16,
    /// ITT of the last Login Request (the final response echoes it).
    pub itt: u32,
    /// The target logged into; `None` for a discovery session.
    pub target: Option<Arc<TargetEntry>>,
    /// Normal or discovery.
    pub session_type: SessionType,
    /// The target portal group of the connection.
    pub tpgt: u16,
    /// The negotiated parameters.
    pub params: SessionParams,
    /// The login's key engine, to carry on with Text negotiation in full
    /// feature phase (see `discovery::TextExchange`).
    pub negotiator: Negotiator,
    /// CHAP_N the initiator authenticated as, if CHAP was used.
    pub chap_user: Option<String>,
    /// CmdSN of the last Login Request: the session's ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// ExpStatSN of the last Login Request.
    pub exp_stat_sn: u32,
    /// StatSN the final Login Response should carry; the connection's next
    /// StatSN is this + 1.
    pub stat_sn: u32,
    /// The token granted with RDMA offload, if the initiator asked for it and
    /// the target agreed (the connection binds it to the session).
    pub rdma_token: Option<[u8; blockwire_transport::assist::TOKEN_LEN]>,
}

/// What the login has established from the first request's keys.
#[derive(Debug)]
struct Context {
    initiator_name: String,
    session_type: SessionType,
    target: Option<Arc<TargetEntry>>,
    auth_required: bool,
}

/// Text waiting to go out over several responses (C bit).
#[derive(Debug)]
struct Outgoing {
    remaining: Vec<u8>,
    /// T bit and NSG for the last piece.
    transit: bool,
    nsg: Stage,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    /// `Complete` was returned: waiting for `final_response`/`reject`.
    AwaitFinal,
    Done,
    Failed,
}

/// One connection's login phase on the target.
pub struct LoginMachine {
    catalog: Arc<Catalog>,
    tpgt: u16,
    local_addr: SocketAddr,
    settings: LoginSettings,
    rng: Box<dyn RngCore + Send>,
    state: State,
    /// The first request: ISID, TSIH and CID must not change.
    first: Option<LoginRequest>,
    /// The stage requests must be in (CSG).
    stage: Stage,
    assembler: TextAssembler,
    outgoing: Option<Outgoing>,
    ctx: Option<Context>,
    negotiator: Option<Negotiator>,
    chap: Option<ChapResponder>,
    chap_user: Option<String>,
    auth_done: bool,
    stat_sn: u32,
    exp_cmd_sn: u32,
    exp_stat_sn: u32,
    last_itt: u32,
    pdus: u32,
    final_text: Vec<u8>,
    rdma_token: Option<[u8; blockwire_transport::assist::TOKEN_LEN]>,
}

impl std::fmt::Debug for LoginMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginMachine")
            .field("tpgt", &self.tpgt)
            .field("local_addr", &self.local_addr)
            .field("state", &self.state)
            .field("stage", &self.stage)
            .field("ctx", &self.ctx)
            .field("auth_done", &self.auth_done)
            .field("stat_sn", &self.stat_sn)
            .finish_non_exhaustive()
    }
}

fn isid_hex(isid: &[u8; 6]) -> String {
    isid.iter().map(|b| format!("{b:02x}")).collect()
}

/// The value of `key` in `pairs`, if present.
fn value<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Why the machine fails the login.
struct Refusal {
    status: LoginStatus,
    why: String,
}

fn refuse(status: LoginStatus, why: impl Into<String>) -> Refusal {
    Refusal {
        status,
        why: why.into(),
    }
}

impl LoginMachine {
    /// A machine for a connection accepted on portal group `tpgt` at
    /// `local_addr`, with default [`LoginSettings`].
    pub fn new<R: RngCore + Send + 'static>(
        catalog: Arc<Catalog>,
        tpgt: u16,
        local_addr: SocketAddr,
        rng: R,
    ) -> LoginMachine {
        Self::with_settings(catalog, tpgt, local_addr, LoginSettings::default(), rng)
    }

    /// A machine with explicit settings.
    pub fn with_settings<R: RngCore + Send + 'static>(
        catalog: Arc<Catalog>,
        tpgt: u16,
        local_addr: SocketAddr,
        settings: LoginSettings,
        rng: R,
    ) -> LoginMachine {
        let mut rng: Box<dyn RngCore + Send> = Box::new(rng);
        let stat_sn = rng.next_u32();
        LoginMachine {
            catalog,
            tpgt,
            local_addr,
            settings,
            rng,
            state: State::Running,
            first: None,
            stage: Stage::Security,
            assembler: TextAssembler::new(MAX_LOGIN_TEXT),
            outgoing: None,
            ctx: None,
            negotiator: None,
            chap: None,
            chap_user: None,
            auth_done: false,
            stat_sn,
            exp_cmd_sn: 0,
            exp_stat_sn: 0,
            last_itt: 0,
            pdus: 0,
            final_text: Vec::new(),
            rdma_token: None,
        }
    }

    /// The address the connection was accepted on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// True once the machine has failed (a `Fail` was returned).
    pub fn is_failed(&self) -> bool {
        self.state == State::Failed
    }

    /// Handles one Login Request with its data segment.
    pub fn on_request(&mut self, req: &LoginRequest, data: &[u8]) -> LoginStep {
        if self.state != State::Running {
            let pdu = self.fail_pdu(
                req,
                refuse(
                    LoginStatus::INITIATOR_ERROR,
                    "login request after the login phase ended",
                ),
            );
            return LoginStep::Fail(pdu);
        }
        self.exp_cmd_sn = req.cmd_sn;
        self.exp_stat_sn = req.exp_stat_sn;
        self.last_itt = req.itt;
        match self.step(req, data) {
            Ok(step) => step,
            Err(refusal) => LoginStep::Fail(self.fail_pdu(req, refusal)),
        }
    }

    /// The final Login Response of a successful login (T=1, NSG=full
    /// feature), carrying the TSIH the fabric allocated (or the existing
    /// session's), `stat_sn` (normally `outcome.stat_sn`) and the session's
    /// `max_cmd_sn`. ExpCmdSN is the last request's CmdSN.
    pub fn final_response(&mut self, tsih: u16, stat_sn: u32, max_cmd_sn: u32) -> Pdu {
        let first = self.first.unwrap_or_else(|| empty_request(self.last_itt));
        let bhs = LoginResponse {
            transit: true,
            continue_bit: false,
            csg: self.stage,
            nsg: Stage::FullFeature,
            version_max: 0,
            version_active: 0,
            isid: first.isid,
            tsih,
            itt: self.last_itt,
            stat_sn,
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn,
            status: LoginStatus::SUCCESS,
        };
        self.state = State::Done;
        self.stat_sn = stat_sn.wrapping_add(1);
        let (target, initiator) = self.names();
        tracing::info!(
            target = %target,
            initiator = %initiator,
            isid = %isid_hex(&first.isid),
            tsih,
            "login complete"
        );
        Pdu::with_data(
            Bhs::LoginResponse(bhs),
            std::mem::take(&mut self.final_text),
        )
    }

    /// A login reject with `status`, for when the session layer refuses the
    /// login after `Complete` (SESSION_DOES_NOT_EXIST, OUT_OF_RESOURCES,
    /// TOO_MANY_CONNECTIONS, ...). Send it and close the connection.
    pub fn reject(&mut self, status: LoginStatus) -> Pdu {
        let req = self.first.unwrap_or_else(|| empty_request(self.last_itt));
        let req = LoginRequest {
            itt: self.last_itt,
            csg: self.stage,
            ..req
        };
        self.fail_pdu(&req, refuse(status, "refused by the session layer"))
    }

    /// A login reject for bytes that did not decode as a PDU (a data
    /// segment past the login phase's 8192 bytes, a reserved opcode, a bad
    /// field): the initiator hears why before the connection closes
    /// instead of seeing it drop. A Login Request that did not decode is an
    /// initiator error (RFC 7143 §11.13.5, status 0200h), answered with its
    /// own ISID, TSIH, ITT and CmdSN from `header`; any other PDU is
    /// invalid during login (020Bh, §6.2). Send it and close the
    /// connection: the stream's framing can no longer be trusted.
    pub fn refuse_undecodable(&mut self, header: Option<&[u8; 48]>, why: &str) -> Pdu {
        let mut req = self.first.unwrap_or_else(|| empty_request(self.last_itt));
        req.itt = self.last_itt;
        req.csg = self.stage;
        let login_request = blockwire_pdu::pdu::Opcode::LoginRequest as u8;
        let status = match header {
            Some(h) if h[0] & 0x3f != login_request => LoginStatus::INVALID_DURING_LOGIN,
            Some(h) => {
                let word = |at: usize| u32::from_be_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
                req.isid.copy_from_slice(&h[8..14]);
                req.tsih = u16::from_be_bytes([h[14], h[15]]);
                req.itt = word(16);
                req.cmd_sn = word(24);
                LoginStatus::INITIATOR_ERROR
            }
            None => LoginStatus::INITIATOR_ERROR,
        };
        self.fail_pdu(&req, refuse(status, format!("undecodable PDU: {why}")))
    }

    fn names(&self) -> (String, String) {
        match &self.ctx {
            Some(c) => (
                c.target
                    .as_ref()
                    .map_or_else(|| "(discovery)".to_owned(), |t| t.name.clone()),
                c.initiator_name.clone(),
            ),
            None => ("(unknown)".to_owned(), "(unknown)".to_owned()),
        }
    }

    fn fail_pdu(&mut self, req: &LoginRequest, refusal: Refusal) -> Pdu {
        self.state = State::Failed;
        let (target, initiator) = self.names();
        tracing::warn!(
            target = %target,
            initiator = %initiator,
            isid = %isid_hex(&req.isid),
            status = %refusal.status,
            reason = %refusal.why,
            "login refused"
        );
        let bhs = LoginResponse {
            transit: false,
            continue_bit: false,
            csg: req.csg,
            nsg: Stage::Security,
            version_max: 0,
            version_active: 0,
            isid: req.isid,
            tsih: req.tsih,
            itt: req.itt,
            stat_sn: self.stat_sn,
            exp_cmd_sn: req.cmd_sn,
            max_cmd_sn: self.max_cmd_sn(req.cmd_sn),
            status: refusal.status,
        };
        Pdu::new(Bhs::LoginResponse(bhs))
    }

    fn max_cmd_sn(&self, exp_cmd_sn: u32) -> u32 {
        exp_cmd_sn.wrapping_add(self.settings.cmd_window.max(1) - 1)
    }

    /// A success response to `req` carrying `data`.
    fn respond(
        &mut self,
        req: &LoginRequest,
        transit: bool,
        cont: bool,
        nsg: Stage,
        data: Vec<u8>,
    ) -> LoginStep {
        let bhs = LoginResponse {
            transit,
            continue_bit: cont,
            csg: req.csg,
            nsg,
            version_max: 0,
            version_active: 0,
            isid: req.isid,
            tsih: req.tsih,
            itt: req.itt,
            stat_sn: self.stat_sn,
            exp_cmd_sn: req.cmd_sn,
            max_cmd_sn: self.max_cmd_sn(req.cmd_sn),
            status: LoginStatus::SUCCESS,
        };
        self.stat_sn = self.stat_sn.wrapping_add(1);
        if transit {
            self.stage = nsg;
        }
        LoginStep::Respond(Pdu::with_data(Bhs::LoginResponse(bhs), data))
    }

    fn check_header(&mut self, req: &LoginRequest, data: &[u8]) -> Result<(), Refusal> {
        self.pdus += 1;
        if self.pdus > MAX_LOGIN_PDUS {
            return Err(refuse(
                LoginStatus::INITIATOR_ERROR,
                "too many login requests",
            ));
        }
        match &self.first {
            None => {
                if req.version_min > 0 {
                    return Err(refuse(
                        LoginStatus::UNSUPPORTED_VERSION,
                        format!(
                            "Version-min {} (only version 0 is supported)",
                            req.version_min
                        ),
                    ));
                }
                if !matches!(req.csg, Stage::Security | Stage::Operational) {
                    return Err(refuse(
                        LoginStatus::INITIATOR_ERROR,
                        "first login request not in a negotiation stage",
                    ));
                }
                self.stage = req.csg;
                self.first = Some(*req);
            }
            Some(first) => {
                if first.isid != req.isid || first.tsih != req.tsih {
                    return Err(refuse(
                        LoginStatus::INITIATOR_ERROR,
                        "ISID or TSIH changed during login",
                    ));
                }
                if first.cid != req.cid {
                    return Err(refuse(
                        LoginStatus::INITIATOR_ERROR,
                        "CID changed during login",
                    ));
                }
            }
        }
        if req.csg != self.stage {
            return Err(refuse(
                LoginStatus::INITIATOR_ERROR,
                format!(
                    "CSG {:?} while the login is in stage {:?}",
                    req.csg, self.stage
                ),
            ));
        }
        if req.transit && req.continue_bit {
            return Err(refuse(
                LoginStatus::INITIATOR_ERROR,
                "T and C bits both set",
            ));
        }
        if req.transit && (req.nsg == Stage::Reserved || req.nsg.bits() <= req.csg.bits()) {
            return Err(refuse(
                LoginStatus::INITIATOR_ERROR,
                format!("invalid transition {:?} -> {:?}", req.csg, req.nsg),
            ));
        }
        if data.len() > LOGIN_MAX_DATA_SEGMENT {
            return Err(refuse(
                LoginStatus::INITIATOR_ERROR,
                "login data segment longer than 8192 bytes",
            ));
        }
        Ok(())
    }

    fn step(&mut self, req: &LoginRequest, data: &[u8]) -> Result<LoginStep, Refusal> {
        self.check_header(req, data)?;
        // We owe the initiator more of a long response: it asks for the next
        // piece with an empty request.
        if self.outgoing.is_some() {
            if !data.is_empty() || req.continue_bit {
                return Err(refuse(
                    LoginStatus::INITIATOR_ERROR,
                    "text sent while the target's response was continuing",
                ));
            }
            return Ok(self.send_text(req, Vec::new(), None));
        }
        let pairs = match self.assembler.push(data, req.continue_bit) {
            Err(e) => {
                return Err(refuse(
                    LoginStatus::INITIATOR_ERROR,
                    format!("login text: {e}"),
                ))
            }
            // RFC 7143 6.3: text continued by the initiator is acknowledged
            // with an empty Login Response.
            Ok(None) => return Ok(self.respond(req, false, false, req.nsg, Vec::new())),
            Ok(Some(pairs)) => pairs,
        };
        match &self.ctx {
            None => self.establish(req, &pairs)?,
            // The first request's SessionType (Normal when it has none)
            // decided the target, the authentication and which keys count
            // (RFC 7143 §6.3, §13.21); a later one naming another type would
            // have the rest negotiated as for that type, under this one.
            Some(c) => {
                if let Some(v) = value(&pairs, "SessionType") {
                    if SessionType::from_name(v) != Some(c.session_type) {
                        return Err(refuse(
                            LoginStatus::INITIATOR_ERROR,
                            format!(
                                "SessionType={v} after the first login request, which began a \
                                 {} session",
                                c.session_type.as_str()
                            ),
                        ));
                    }
                }
            }
        }
        let phase = match req.csg {
            Stage::Security => Phase::Security,
            _ => Phase::Operational,
        };
        let required = self.ctx.as_ref().is_some_and(|c| c.auth_required);
        if phase == Phase::Operational && required && !self.auth_done {
            return Err(refuse(
                LoginStatus::AUTHENTICATION_FAILURE,
                "CHAP is required but the initiator skipped the security stage",
            ));
        }
        let Some(negotiator) = self.negotiator.as_mut() else {
            return Err(refuse(LoginStatus::TARGET_ERROR, "no negotiator"));
        };
        let responses = negotiator
            .receive(phase, &pairs)
            .map_err(|e| refuse(LoginStatus::INITIATOR_ERROR, format!("negotiation: {e}")))?;
        // In the security stage a rejected AuthMethod is a failed
        // authentication; in the operational stage, where the key has no
        // place (RFC 7143 §6.3), its Reject answer goes back and the
        // stage goes on (a target that requires CHAP refused above).
        if phase == Phase::Security && responses.rejected().any(|k| k == "AuthMethod") {
            return Err(refuse(
                LoginStatus::AUTHENTICATION_FAILURE,
                "no acceptable AuthMethod (CHAP required, or CHAP offered without credentials)",
            ));
        }
        let mut answers = responses.answers;
        let auth_method = negotiator.params().auth_method;
        let data_digest = negotiator.params().data_digest;
        for (key, value) in &responses.passthrough {
            if key == blockwire_transport::assist::OFFLOAD_KEY {
                let answer = self.rdma_answer(value, data_digest);
                answers.push((key.clone(), answer));
            }
        }
        if phase == Phase::Security {
            let chap_pairs: TextPairs = responses
                .passthrough
                .iter()
                .filter(|(k, _)| k.starts_with("CHAP_"))
                .cloned()
                .collect();
            if auth_method == AuthMethod::Chap {
                self.run_chap(&chap_pairs, &mut answers)?;
            } else {
                answers.extend(
                    chap_pairs
                        .into_iter()
                        .map(|(k, _)| (k, "Irrelevant".to_owned())),
                );
            }
        }
        let Some(negotiator) = self.negotiator.as_mut() else {
            return Err(refuse(LoginStatus::TARGET_ERROR, "no negotiator"));
        };
        let pending_before = negotiator.pending().len();
        let offers = negotiator
            .offer(phase)
            .map_err(|e| refuse(LoginStatus::TARGET_ERROR, format!("negotiation: {e}")))?;
        let new_proposals = negotiator.pending().len() > pending_before;
        answers.extend(offers);

        if phase == Phase::Security && !self.auth_done {
            match auth_method {
                AuthMethod::None if !required => self.auth_done = true,
                AuthMethod::Chap => {}
                _ if req.transit => {
                    return Err(refuse(
                        LoginStatus::AUTHENTICATION_FAILURE,
                        "CHAP is required but was not negotiated",
                    ))
                }
                _ => {}
            }
        }
        let transit =
            req.transit && !new_proposals && (phase == Phase::Operational || self.auth_done);
        if transit && req.nsg == Stage::FullFeature {
            if let Some(n) = self.negotiator.as_mut() {
                n.finish().map_err(|e| {
                    refuse(LoginStatus::INITIATOR_ERROR, format!("negotiation: {e}"))
                })?;
            }
        }
        let text = encode_text(&answers).map_err(|e| {
            refuse(
                LoginStatus::TARGET_ERROR,
                format!("encoding the response: {e}"),
            )
        })?;
        Ok(self.send_text(req, text, Some((transit, req.nsg))))
    }

    /// Sends `text` (or, with `None`, the next piece of the pending text)
    /// in one response, continuing with the C bit when longer than 8192
    /// bytes. Completes the login when the last piece moves to full feature.
    fn send_text(
        &mut self,
        req: &LoginRequest,
        text: Vec<u8>,
        fresh: Option<(bool, Stage)>,
    ) -> LoginStep {
        // The target moves on only in a response to a request that asks
        // to, to no later stage than it asks for (RFC 7143 §6.3): each
        // request pulling a long response asks afresh. One that does not
        // (T=0, or another NSG) holds the stage for its own piece only; the
        // decision made when the text was built stands for the next pull.
        let (mut out, asked) = match fresh {
            Some((transit, nsg)) => (
                Outgoing {
                    remaining: text,
                    transit,
                    nsg,
                },
                true,
            ),
            None => match self.outgoing.take() {
                Some(o) => {
                    let asked = req.transit && req.nsg == o.nsg;
                    (o, asked)
                }
                None => (
                    Outgoing {
                        remaining: Vec::new(),
                        transit: false,
                        nsg: req.nsg,
                    },
                    false,
                ),
            },
        };
        if out.remaining.len() > LOGIN_MAX_DATA_SEGMENT {
            let rest = out.remaining.split_off(LOGIN_MAX_DATA_SEGMENT);
            let piece = std::mem::replace(&mut out.remaining, rest);
            let nsg = out.nsg;
            self.outgoing = Some(out);
            return self.respond(req, false, true, nsg, piece);
        }
        let transit = out.transit && asked;
        if transit && out.nsg == Stage::FullFeature {
            return self.complete(req, out.remaining);
        }
        self.respond(req, transit, false, out.nsg, out.remaining)
    }

    fn complete(&mut self, req: &LoginRequest, text: Vec<u8>) -> LoginStep {
        self.final_text = text;
        self.state = State::AwaitFinal;
        let Some(negotiator) = self.negotiator.clone() else {
            let refusal = refuse(
                LoginStatus::TARGET_ERROR,
                "login completed without negotiation",
            );
            return LoginStep::Fail(self.fail_pdu(req, refusal));
        };
        let ctx = self.ctx.as_ref();
        let params = negotiator.params().clone();
        LoginStep::Complete(Box::new(LoginOutcome {
            initiator_name: ctx.map(|c| c.initiator_name.clone()).unwrap_or_default(),
            initiator_alias: params.initiator_alias.clone(),
            isid: req.isid,
            tsih_requested: req.tsih,
            cid: req.cid,
            itt: req.itt,
            target: ctx.and_then(|c| c.target.clone()),
            session_type: ctx.map_or(SessionType::Normal, |c| c.session_type),
            tpgt: self.tpgt,
            params,
            negotiator,
            chap_user: self.chap_user.clone(),
            exp_cmd_sn: req.cmd_sn,
            exp_stat_sn: req.exp_stat_sn,
            stat_sn: self.stat_sn,
            rdma_token: self.rdma_token,
        }))
    }
}

/// A placeholder request for responses built without one.
fn empty_request(itt: u32) -> LoginRequest {
    LoginRequest {
        transit: false,
        continue_bit: false,
        csg: Stage::Security,
        nsg: Stage::Security,
        version_max: 0,
        version_min: 0,
        isid: [0; 6],
        tsih: 0,
        itt,
        cid: 0,
        cmd_sn: 0,
        exp_stat_sn: 0,
    }
}

#[cfg(test)]
pub(crate) mod tests;
