//! The initiator's side of login (RFC 7143 §6), without I/O.
//!
//! [`LoginMachine::start`] yields the first Login Request; each Login
//! Response goes to [`LoginMachine::receive`], which answers with the next
//! request or ends with the negotiated [`LoginOutcome`]. Keys are negotiated
//! by `blockwire_pdu::keys::Negotiator`, CHAP by
//! `blockwire_pdu::chap::ChapInitiator` (mutual CHAP verifies the target).
//!
//! Without authentication the first request declares AuthMethod=None and
//! asks to move on to the operational stage at once, as open-iscsi does.

use blockwire_pdu::chap::{ChapInitiator, InitiatorStep};
use blockwire_pdu::keys::{
    encode_text, parse_text, AuthMethod, Negotiator, Phase, Role, SessionParams, TextAssembler,
    TextPairs,
};
use blockwire_pdu::pdu::{LoginRequest, LoginResponse};
use blockwire_pdu::{Bhs, Pdu, Stage};

use crate::config::{ChapConfig, InitiatorConfig};
use crate::error::{Error, Result};

/// A source of random bytes (CHAP identifiers and challenges).
pub type Fill = Box<dyn FnMut(&mut [u8]) + Send>;

/// What a finished login established.
#[derive(Debug, Clone)]
pub struct LoginOutcome {
    /// The negotiated parameters.
    pub params: SessionParams,
    /// The session handle the target assigned.
    pub tsih: u16,
    /// StatSN of the final Login Response.
    pub stat_sn: u32,
    /// ExpCmdSN of the final Login Response.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN of the final Login Response.
    pub max_cmd_sn: u32,
    /// The target's answers to our vendor key offers.
    pub vendor: TextPairs,
}

/// What to do after a Login Response.
#[derive(Debug)]
pub enum LoginStep {
    /// Send this Login Request and wait for the next response.
    Send(Pdu),
    /// The session is in the full feature phase.
    Done(Box<LoginOutcome>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChapPhase {
    /// Waiting for the target to accept AuthMethod=CHAP.
    Method,
    /// CHAP_A sent, waiting for the challenge.
    Challenge,
    /// Response sent; waiting for the stage change (and the target's proof).
    Result,
    /// Over.
    Done,
}

/// One connection's login, driven by the caller.
pub struct LoginMachine {
    label: String,
    negotiator: Negotiator,
    chap: Option<(ChapInitiator, bool)>,
    chap_phase: ChapPhase,
    target_verified: bool,
    stage: Stage,
    isid: [u8; 6],
    tsih: u16,
    itt: u32,
    cmd_sn: u32,
    exp_stat_sn: u32,
    assembler: TextAssembler,
    fill: Fill,
    vendor_offers: TextPairs,
    vendor_answers: TextPairs,
    /// HeaderDigest and DataDigest offered as CRC32C alone: the login
    /// fails rather than run without them (see [`Self::finish`]).
    insisted_digests: (bool, bool),
    /// The T bit of the last Login Request, which the response may not
    /// set unless it was (RFC 7143 §11.13.1).
    sent_transit: bool,
}

impl std::fmt::Debug for LoginMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginMachine")
            .field("target", &self.label)
            .field("stage", &self.stage)
            .field("chap_phase", &self.chap_phase)
            .finish()
    }
}

impl LoginMachine {
    /// A login of `config`'s initiator into `target` (None: a discovery
    /// session) with `isid`/`tsih` (0 for a new session or a reinstatement),
    /// starting at `cmd_sn`. `fill` supplies random bytes (CHAP challenges).
    pub fn new(
        config: &InitiatorConfig,
        target: Option<&str>,
        isid: [u8; 6],
        tsih: u16,
        cmd_sn: u32,
        fill: Fill,
    ) -> Result<LoginMachine> {
        let local = config.local_config(target, Self::chap_of(config, target).is_some());
        Self::with_local(config, target, local, isid, tsih, cmd_sn, fill)
    }

    /// A new session's login to `target` over iSER (RFC 7145 §6): RDMAExtensions=Yes,
    /// InitiatorRecvDataSegmentLength = `recv_data_segment_length` (what one posted
    /// receive holds), no digests (the RDMA fabric checks the data), and every WRITE
    /// byte solicited (ImmediateData=No, InitialR2T=Yes): the target RDMA-Reads it from
    /// the buffer the command advertises. No vendor keys.
    pub fn new_iser(
        config: &InitiatorConfig,
        target: &str,
        isid: [u8; 6],
        recv_data_segment_length: u32,
        fill: Fill,
    ) -> Result<LoginMachine> {
        let mut local =
            config.local_config(Some(target), Self::chap_of(config, Some(target)).is_some());
        local.rdma_extensions = true;
        local.rdma_recv_data_segment_length = recv_data_segment_length;
        local.header_digests = vec![blockwire_pdu::keys::Digest::None];
        local.data_digests = vec![blockwire_pdu::keys::Digest::None];
        local.immediate_data = false;
        local.initial_r2t = true;
        local.vendor_keys.clear();
        let mut m = Self::with_local(config, Some(target), local, isid, 0, 1, fill)?;
        m.vendor_offers.clear();
        Ok(m)
    }

    fn chap_of<'a>(config: &'a InitiatorConfig, target: Option<&str>) -> Option<&'a ChapConfig> {
        if target.is_some() {
            config.chap.as_ref()
        } else {
            config.discovery_chap.as_ref()
        }
    }

    fn with_local(
        config: &InitiatorConfig,
        target: Option<&str>,
        local: blockwire_pdu::keys::LocalConfig,
        isid: [u8; 6],
        tsih: u16,
        cmd_sn: u32,
        fill: Fill,
    ) -> Result<LoginMachine> {
        let label = target.unwrap_or("discovery").to_owned();
        let chap_cfg = Self::chap_of(config, target);
        let only_crc = |offered: &[blockwire_pdu::keys::Digest]| {
            !offered.is_empty() && !offered.contains(&blockwire_pdu::keys::Digest::None)
        };
        let insisted_digests = (
            only_crc(&local.header_digests),
            only_crc(&local.data_digests),
        );
        let negotiator =
            Negotiator::new(Role::Initiator, local).map_err(|cause| Error::Negotiation {
                target: label.clone(),
                cause,
            })?;
        let chap = chap_cfg.map(|c| {
            (
                ChapInitiator::new(c.credential.clone(), c.algorithms.clone(), c.mutual.clone()),
                c.mutual.is_some(),
            )
        });
        Ok(LoginMachine {
            label,
            negotiator,
            chap,
            chap_phase: ChapPhase::Method,
            target_verified: false,
            stage: Stage::Security,
            isid,
            tsih,
            itt: 0,
            cmd_sn,
            exp_stat_sn: 0,
            assembler: TextAssembler::default(),
            fill,
            vendor_offers: if target.is_some() {
                config.vendor_offers.clone()
            } else {
                Vec::new()
            },
            vendor_answers: Vec::new(),
            insisted_digests,
            sent_transit: false,
        })
    }

    fn neg_err(&self, cause: blockwire_pdu::keys::NegotiationError) -> Error {
        Error::Negotiation {
            target: self.label.clone(),
            cause,
        }
    }

    fn request(&mut self, transit: bool, nsg: Stage, pairs: &TextPairs) -> Result<Pdu> {
        self.sent_transit = transit;
        let data = encode_text(pairs)?;
        if data.len() > 8192 {
            return Err(Error::Protocol(format!(
                "login text of {} bytes exceeds 8192",
                data.len()
            )));
        }
        Ok(Pdu::with_data(
            Bhs::LoginRequest(LoginRequest {
                transit,
                continue_bit: false,
                csg: self.stage,
                nsg: if transit { nsg } else { Stage::Security },
                version_max: 0,
                version_min: 0,
                isid: self.isid,
                tsih: self.tsih,
                itt: self.itt,
                cid: 0,
                cmd_sn: self.cmd_sn,
                exp_stat_sn: self.exp_stat_sn,
            }),
            data,
        ))
    }

    /// The first Login Request.
    pub fn start(&mut self) -> Result<Pdu> {
        let pairs = self
            .negotiator
            .offer(Phase::Security)
            .map_err(|e| self.neg_err(e))?;
        let with_chap = self.chap.is_some();
        // Without CHAP, go straight on to the operational stage.
        self.request(!with_chap, Stage::Operational, &pairs)
    }

    /// Takes one Login Response.
    pub fn receive(&mut self, pdu: Pdu) -> Result<LoginStep> {
        let Bhs::LoginResponse(r) = pdu.bhs else {
            return Err(Error::Protocol(format!(
                "expected a Login Response during login to {}, got {:?}",
                self.label,
                pdu.bhs.opcode()
            )));
        };
        if r.status.class == 1 {
            // Redirection (RFC 7143 §11.13.5): the response carries the
            // TargetAddress to log in at; without one it is only a refusal.
            let to = parse_text(&pdu.data).ok().and_then(|pairs| {
                let (_, value) = pairs.into_iter().find(|(k, _)| k == "TargetAddress")?;
                let here = crate::discovery::Portal {
                    host: String::new(),
                    port: 3260,
                    tpgt: 1,
                };
                crate::discovery::parse_target_address(&value, &here).ok()
            });
            if let Some(to) = to {
                return Err(Error::Redirected {
                    target: self.label.clone(),
                    portal: String::new(),
                    to: to.address(),
                    permanent: r.status.detail == 2,
                });
            }
        }
        if !r.status.is_success() {
            return Err(Error::LoginRejected {
                target: self.label.clone(),
                portal: String::new(),
                status: r.status,
            });
        }
        self.check_response(&r)?;
        self.exp_stat_sn = r.stat_sn.wrapping_add(1);
        if r.tsih != 0 {
            self.tsih = r.tsih;
        }
        let Some(pairs) = self.assembler.push(&pdu.data, r.continue_bit)? else {
            // More text follows: ask for it with an empty request.
            return self
                .request(false, Stage::Security, &Vec::new())
                .map(LoginStep::Send);
        };
        match self.stage {
            Stage::Security => self.security(r, pairs),
            Stage::Operational => self.operational(r, pairs),
            _ => Err(Error::Protocol(
                "login response after the login ended".into(),
            )),
        }
    }

    /// What a successful Login Response must keep of the request it
    /// answers (RFC 7143 §11.13): the ISID and the Initiator Task Tag
    /// echoed, the current stage ours, no T bit unless we set it, and the
    /// session's TSIH, once known, never another. A target that breaks
    /// them has lost track of this login; going on could join the wrong
    /// session or skip a stage's negotiation.
    fn check_response(&self, r: &LoginResponse) -> Result<()> {
        let broke = |what: String| {
            Err(Error::Protocol(format!(
                "{}'s Login Response breaks RFC 7143 (11.13): {what}",
                self.label
            )))
        };
        if r.isid != self.isid {
            return broke(format!(
                "it names ISID {:02x?} where the request named {:02x?}",
                r.isid, self.isid
            ));
        }
        if r.itt != self.itt {
            return broke(format!(
                "it answers task tag {:#x}, not the request's {:#x}",
                r.itt, self.itt
            ));
        }
        if r.csg != self.stage {
            return broke(format!(
                "its current stage is {:?} where the request's was {:?}",
                r.csg, self.stage
            ));
        }
        if r.transit && !self.sent_transit {
            return broke("it sets the T bit answering a request without it".into());
        }
        if r.tsih != 0 && self.tsih != 0 && r.tsih != self.tsih {
            return broke(format!(
                "it gives TSIH {:#06x} to a session whose TSIH is {:#06x}",
                r.tsih, self.tsih
            ));
        }
        Ok(())
    }

    fn security(&mut self, r: LoginResponse, pairs: TextPairs) -> Result<LoginStep> {
        let got = self
            .negotiator
            .receive(Phase::Security, &pairs)
            .map_err(|e| self.neg_err(e))?;
        let mut out = got.answers;
        let chap_pairs: TextPairs = got
            .passthrough
            .into_iter()
            .filter(|(k, _)| k.starts_with("CHAP_"))
            .collect();
        if let Some((chap, mutual)) = self.chap.as_mut() {
            let mutual = *mutual;
            let label = self.label.clone();
            let chap_err = |cause| Error::Chap {
                target: label.clone(),
                cause,
            };
            match self.chap_phase {
                ChapPhase::Method => {
                    if self.negotiator.params().auth_method != AuthMethod::Chap {
                        return Err(Error::Protocol(format!(
                            "{} did not accept AuthMethod=CHAP",
                            self.label
                        )));
                    }
                    out.extend(chap.offer());
                    self.chap_phase = ChapPhase::Challenge;
                    return self
                        .request(false, Stage::Operational, &out)
                        .map(LoginStep::Send);
                }
                ChapPhase::Challenge => match chap.receive(&chap_pairs, &mut *self.fill) {
                    Ok(InitiatorStep::Respond(resp)) => {
                        out.extend(resp);
                        self.chap_phase = ChapPhase::Result;
                        return self
                            .request(true, Stage::Operational, &out)
                            .map(LoginStep::Send);
                    }
                    Ok(_) => {
                        return Err(Error::Protocol(format!(
                            "{} sent no CHAP challenge",
                            self.label
                        )))
                    }
                    Err(e) => return Err(chap_err(e)),
                },
                ChapPhase::Result => {
                    if mutual {
                        match chap.receive(&chap_pairs, &mut *self.fill) {
                            Ok(InitiatorStep::TargetVerified) => self.target_verified = true,
                            Ok(_) => {
                                return Err(chap_err(blockwire_pdu::chap::ChapError::MutualMissing))
                            }
                            Err(e) => return Err(chap_err(e)),
                        }
                    }
                    self.chap_phase = ChapPhase::Done;
                }
                ChapPhase::Done => {}
            }
        }
        if !(r.transit && r.nsg != Stage::Security) {
            // The target wants more security negotiation than we have.
            return self
                .request(true, Stage::Operational, &out)
                .map(LoginStep::Send);
        }
        if r.nsg == Stage::FullFeature {
            return self.finish(r);
        }
        self.stage = Stage::Operational;
        out.extend(
            self.negotiator
                .offer(Phase::Operational)
                .map_err(|e| self.neg_err(e))?,
        );
        out.extend(std::mem::take(&mut self.vendor_offers));
        self.request(true, Stage::FullFeature, &out)
            .map(LoginStep::Send)
    }

    fn operational(&mut self, r: LoginResponse, pairs: TextPairs) -> Result<LoginStep> {
        let got = self
            .negotiator
            .receive(Phase::Operational, &pairs)
            .map_err(|e| self.neg_err(e))?;
        self.vendor_answers.extend(
            got.passthrough
                .iter()
                .filter(|(k, _)| k.starts_with("X"))
                .cloned(),
        );
        // The final response ends the login even when it declares
        // TargetRecvDataSegmentLength: its echo (for targets that wait for it in
        // earlier rounds, see the negotiator) has nothing left to answer.
        let only_echoes = got
            .answers
            .iter()
            .all(|(k, _)| k == "TargetRecvDataSegmentLength");
        if r.transit && r.nsg == Stage::FullFeature && only_echoes {
            return self.finish(r);
        }
        let mut out = got.answers;
        out.extend(
            self.negotiator
                .offer(Phase::Operational)
                .map_err(|e| self.neg_err(e))?,
        );
        self.request(true, Stage::FullFeature, &out)
            .map(LoginStep::Send)
    }

    fn finish(&mut self, r: LoginResponse) -> Result<LoginStep> {
        self.negotiator.finish().map_err(|e| self.neg_err(e))?;
        // A digest offered alone that the target answered Reject or
        // NotUnderstood leaves its default, None (RFC 7143 §13.1): the
        // user asked for digests, so the session does not run without.
        let params = self.negotiator.params();
        for (insisted, key, got) in [
            (
                self.insisted_digests.0,
                "HeaderDigest",
                params.header_digest,
            ),
            (self.insisted_digests.1, "DataDigest", params.data_digest),
        ] {
            if insisted && got == blockwire_pdu::keys::Digest::None {
                return Err(Error::Protocol(format!(
                    "{} did not take {key}=CRC32C, which this login insists on: \
                     enable digests on the target, or log in without them",
                    self.label
                )));
            }
        }
        if let Some((_, true)) = &self.chap {
            if !self.target_verified {
                return Err(Error::Chap {
                    target: self.label.clone(),
                    cause: blockwire_pdu::chap::ChapError::MutualMissing,
                });
            }
        }
        Ok(LoginStep::Done(Box::new(LoginOutcome {
            params: self.negotiator.params().clone(),
            tsih: self.tsih,
            stat_sn: r.stat_sn,
            exp_cmd_sn: r.exp_cmd_sn,
            max_cmd_sn: r.max_cmd_sn,
            vendor: std::mem::take(&mut self.vendor_answers),
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockwire_pdu::LoginStatus;

    const TARGET: &str = "iqn.2026-12.io.blockwire:t";
    const ISID: [u8; 6] = [0x80, 0, 0, 0, 0, 1];

    /// A login of a plain (or, `chap`, CHAP) initiator with TSIH `tsih`,
    /// and its first Login Request.
    fn started(chap: bool, tsih: u16) -> (LoginMachine, LoginRequest) {
        let mut config = InitiatorConfig::new("iqn.2026-12.io.blockwire:i");
        if chap {
            config.chap = Some(ChapConfig::new("user", "a secret of sixteen"));
        }
        let mut m = LoginMachine::new(
            &config,
            Some(TARGET),
            ISID,
            tsih,
            1,
            Box::new(|b| b.fill(7)),
        )
        .unwrap();
        let Bhs::LoginRequest(r) = m.start().unwrap().bhs else {
            panic!("the login starts with a Login Request")
        };
        (m, r)
    }

    /// A successful answer to `r` that moves on as it asks, changed by
    /// `bend`.
    fn answer(r: &LoginRequest, bend: impl FnOnce(&mut LoginResponse)) -> Pdu {
        let mut resp = LoginResponse {
            transit: r.transit,
            continue_bit: false,
            csg: r.csg,
            nsg: if r.transit { r.nsg } else { r.csg },
            version_max: 0,
            version_active: 0,
            isid: r.isid,
            tsih: r.tsih,
            itt: r.itt,
            stat_sn: 1,
            exp_cmd_sn: r.cmd_sn,
            max_cmd_sn: r.cmd_sn.wrapping_add(8),
            status: LoginStatus::SUCCESS,
        };
        bend(&mut resp);
        Pdu::new(Bhs::LoginResponse(resp))
    }

    fn refusal(m: &mut LoginMachine, pdu: Pdu) -> String {
        match m.receive(pdu) {
            Err(Error::Protocol(why)) => why,
            other => panic!("expected a protocol error, got {other:?}"),
        }
    }

    #[test]
    fn a_response_that_keeps_the_rules_moves_the_login_on() {
        let (mut m, r) = started(false, 0);
        assert!(matches!(
            m.receive(answer(&r, |_| {})),
            Ok(LoginStep::Send(_))
        ));
        // Joining a session: the target answers with its TSIH.
        let (mut m, r) = started(false, 0x1234);
        assert!(matches!(
            m.receive(answer(&r, |a| a.tsih = 0x1234)),
            Ok(LoginStep::Send(_))
        ));
    }

    /// A Login Response that does not answer the request it follows (RFC
    /// 7143 §11.13) ends the login, saying what it broke; each was taken
    /// as if it did.
    #[test]
    fn a_response_that_breaks_the_rules_ends_the_login() {
        let (mut m, r) = started(false, 0);
        let why = refusal(&mut m, answer(&r, |a| a.isid[5] = 2));
        assert!(why.contains("ISID"), "{why}");

        let (mut m, r) = started(false, 0);
        let why = refusal(&mut m, answer(&r, |a| a.itt = r.itt.wrapping_add(1)));
        assert!(why.contains("task tag"), "{why}");

        let (mut m, r) = started(false, 0);
        let why = refusal(&mut m, answer(&r, |a| a.csg = Stage::Operational));
        assert!(why.contains("current stage"), "{why}");

        // CHAP starts without the T bit: the target may not set it.
        let (mut m, r) = started(true, 0);
        assert!(!r.transit);
        let why = refusal(
            &mut m,
            answer(&r, |a| {
                a.transit = true;
                a.nsg = Stage::Operational;
            }),
        );
        assert!(why.contains("T bit"), "{why}");

        let (mut m, r) = started(false, 0x1234);
        let why = refusal(&mut m, answer(&r, |a| a.tsih = 0x4321));
        assert!(
            why.contains("TSIH 0x4321") && why.contains("0x1234"),
            "{why}"
        );
    }

    /// A new session learns its TSIH from a response; a later response of
    /// the same login may not give another.
    #[test]
    fn a_tsih_once_given_stays() {
        let (mut m, r) = started(false, 0);
        let Ok(LoginStep::Send(next)) = m.receive(answer(&r, |a| a.tsih = 7)) else {
            panic!("the login goes on")
        };
        let Bhs::LoginRequest(r2) = next.bhs else {
            panic!("a Login Request follows")
        };
        assert_eq!(r2.tsih, 7);
        let why = refusal(&mut m, answer(&r2, |a| a.tsih = 8));
        assert!(why.contains("TSIH 0x0008"), "{why}");
    }
}
