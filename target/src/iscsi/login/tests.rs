//! In-process login tests: a `LoginMachine` driven by an initiator made of
//! the pdu crate's `Negotiator` (initiator role) and `ChapInitiator`.
//!
//! One file over the usual size: the cases share one scripted initiator
//! (`run_login`) and its catalog of targets.

use std::net::SocketAddr;
use std::sync::Arc;

use blockwire_pdu::chap::{ChapAlgorithm, ChapInitiator, Credential, InitiatorStep};
use blockwire_pdu::keys::{
    encode_text, parse_text, AuthMethod, LocalConfig, Negotiator, Phase, Role, SessionType,
    TextAssembler, TextPairs,
};
use blockwire_pdu::pdu::{LoginRequest, LoginResponse};
use blockwire_pdu::{Bhs, LoginStatus, Pdu, Stage};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

use super::{LoginMachine, LoginOutcome, LoginSettings, LoginStep};
use crate::iscsi::catalog::{Acl, AuthPolicy, Catalog, ChapSecret, PortalGroup, TargetEntry};
use crate::scsi::LunTable;

pub(crate) const OPEN: &str = "iqn.2026-01.test:open";
pub(crate) const CHAP: &str = "iqn.2026-01.test:chap";
pub(crate) const ACL: &str = "iqn.2026-01.test:acl";
pub(crate) const PERINIT: &str = "iqn.2026-01.test:perinit";
pub(crate) const HOST1: &str = "iqn.2026-01.test:host1";
pub(crate) const HOST2: &str = "iqn.2026-01.test:host2";
pub(crate) const ISID: [u8; 6] = [0x80, 0, 0x12, 0x34, 0, 1];
pub(crate) const CMD_SN: u32 = 10;
pub(crate) const WINDOW: u32 = 128;

pub(crate) fn local_addr() -> SocketAddr {
    "192.0.2.10:3260".parse().unwrap()
}

fn secret(user: &str, secret: &str) -> ChapSecret {
    ChapSecret {
        user: user.into(),
        secret: secret.into(),
    }
}

pub(crate) fn target(name: &str, acl: Acl, auth: AuthPolicy, groups: Vec<u16>) -> Arc<TargetEntry> {
    Arc::new(TargetEntry {
        name: name.into(),
        alias: Some(format!("alias of {name}")),
        portal_groups: groups,
        acl,
        auth,
        luns: Arc::new(LunTable::default()),
        data_paths: Vec::new(),
        qos: Vec::new(),
    })
}

pub(crate) fn chap_policy(algorithms: Vec<u8>) -> AuthPolicy {
    AuthPolicy {
        incoming: vec![secret("alice", "alice-secret-123")],
        per_initiator: vec![],
        outgoing: Some(secret("target", "target-secret-456")),
        algorithms,
    }
}

/// Portal group 1: 127.0.0.1:3260 and [::]:3260; group 2: 0.0.0.0:3261.
pub(crate) fn catalog() -> Catalog {
    Catalog {
        portal_groups: vec![
            PortalGroup {
                tag: 1,
                addresses: vec![
                    "127.0.0.1:3260".parse().unwrap(),
                    "[::]:3260".parse().unwrap(),
                ],
            },
            PortalGroup {
                tag: 2,
                addresses: vec!["0.0.0.0:3261".parse().unwrap()],
            },
        ],
        targets: vec![
            target(OPEN, Acl::Any, AuthPolicy::default(), vec![1, 2]),
            target(CHAP, Acl::Any, chap_policy(vec![]), vec![1]),
            target(
                ACL,
                Acl::Only(vec![HOST1.into()]),
                AuthPolicy::default(),
                vec![1],
            ),
            target(
                PERINIT,
                Acl::Any,
                AuthPolicy {
                    incoming: vec![secret("alice", "alice-secret-123")],
                    per_initiator: vec![(HOST2.into(), secret("bob", "bob-secret-4567"))],
                    outgoing: None,
                    algorithms: vec![5],
                },
                vec![1],
            ),
        ],
        discovery_auth: AuthPolicy::default(),
    }
}

pub(crate) fn machine(catalog: Catalog, seed: u64) -> LoginMachine {
    LoginMachine::with_settings(
        Arc::new(catalog),
        1,
        local_addr(),
        LoginSettings {
            cmd_window: WINDOW,
            ..LoginSettings::default()
        },
        StdRng::seed_from_u64(seed),
    )
}

/// How the test initiator logs in.
#[derive(Clone)]
pub(crate) struct Opts {
    pub name: String,
    /// `None`: discovery session.
    pub target: Option<String>,
    pub chap: Option<(Credential, Vec<ChapAlgorithm>, Option<Credential>)>,
    pub auth_methods: Vec<AuthMethod>,
    /// Start in the operational stage.
    pub skip_security: bool,
    /// From the security stage straight to full feature phase.
    pub security_to_ffp: bool,
    /// Split request text into PDUs of this many bytes (C bit).
    pub split: usize,
    /// Extra pairs in the first request.
    pub extra: TextPairs,
    pub max_recv: u32,
    pub tsih: u16,
}

pub(crate) fn opts(name: &str, target: Option<&str>) -> Opts {
    Opts {
        name: name.into(),
        target: target.map(Into::into),
        chap: None,
        auth_methods: vec![AuthMethod::None],
        skip_security: false,
        security_to_ffp: false,
        split: 8192,
        extra: vec![],
        max_recv: 8192,
        tsih: 0,
    }
}

pub(crate) fn with_chap(
    mut o: Opts,
    user: &str,
    pw: &str,
    algs: Vec<ChapAlgorithm>,
    mutual: Option<(&str, &str)>,
) -> Opts {
    o.chap = Some((
        Credential::new(user, pw),
        algs,
        mutual.map(|(u, s)| Credential::new(u, s)),
    ));
    o.auth_methods = vec![AuthMethod::Chap, AuthMethod::None];
    o
}

/// How a test login ended badly.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The target refused with this status.
    Status(LoginStatus),
    /// The initiator gave up (e.g. the target failed mutual CHAP).
    Initiator(String),
}

/// A finished login.
#[derive(Debug)]
pub(crate) struct Done {
    pub outcome: LoginOutcome,
    pub initiator: Negotiator,
    /// Every Login Response in order, the final one last.
    pub responses: Vec<Pdu>,
}

pub(crate) fn login_request(
    transit: bool,
    cont: bool,
    csg: Stage,
    nsg: Stage,
    tsih: u16,
    exp_stat_sn: u32,
) -> LoginRequest {
    LoginRequest {
        transit,
        continue_bit: cont,
        csg,
        nsg,
        version_max: 0,
        version_min: 0,
        isid: ISID,
        tsih,
        itt: 0x1000,
        cid: 1,
        cmd_sn: CMD_SN,
        exp_stat_sn,
    }
}

fn resp(pdu: &Pdu) -> LoginResponse {
    match pdu.bhs {
        Bhs::LoginResponse(r) => r,
        other => panic!("not a login response: {other:?}"),
    }
}

/// Runs a whole login of `o` against `m`.
pub(crate) fn run_login(m: &mut LoginMachine, o: &Opts) -> Result<Done, Failure> {
    let cfg = LocalConfig {
        initiator_alias: Some("test host".into()),
        auth_methods: o.auth_methods.clone(),
        max_recv_data_segment_length: o.max_recv,
        leading: o.tsih == 0,
        ..match &o.target {
            Some(t) => LocalConfig::initiator(&o.name, t),
            None => LocalConfig::discovery(&o.name),
        }
    };
    let mut ini = Negotiator::new(Role::Initiator, cfg).expect("initiator config");
    let mut chap = o.chap.clone().map(|(c, a, m)| ChapInitiator::new(c, a, m));
    let mut chap_started = false;
    let mut rng = StdRng::seed_from_u64(77);
    let mut stage = if o.skip_security {
        Stage::Operational
    } else {
        Stage::Security
    };
    let phase_of = |s: Stage| {
        if s == Stage::Security {
            Phase::Security
        } else {
            Phase::Operational
        }
    };
    let mut to_send = ini.offer(phase_of(stage)).expect("offer");
    to_send.extend(o.extra.iter().cloned());
    let mut responses = Vec::new();
    let mut exp_stat_sn = 0u32;
    let mut last_stat_sn: Option<u32> = None;
    for _round in 0..40 {
        let nsg = match stage {
            Stage::Security if o.security_to_ffp => Stage::FullFeature,
            Stage::Security => Stage::Operational,
            _ => Stage::FullFeature,
        };
        let text = encode_text(&to_send).expect("encodes");
        let pieces: Vec<&[u8]> = if text.is_empty() {
            vec![&[][..]]
        } else {
            text.chunks(o.split).collect()
        };
        let mut reply_text = TextAssembler::new(1 << 20);
        let mut step = None;
        for (i, piece) in pieces.iter().enumerate() {
            let last = i + 1 == pieces.len();
            let req = login_request(last, !last, stage, nsg, o.tsih, exp_stat_sn);
            let s = m.on_request(&req, piece);
            if !last {
                // Partial text is acknowledged by an empty response.
                let LoginStep::Respond(p) = &s else {
                    return Err(fail_of(s));
                };
                let r = resp(p);
                assert!(p.data.is_empty() && !r.transit && !r.continue_bit, "{r:?}");
                exp_stat_sn = r.stat_sn.wrapping_add(1);
                check_sn(&mut last_stat_sn, &r);
                responses.push(p.clone());
            } else {
                step = Some(s);
            }
        }
        // Pull the target's continued response, if any.
        let mut pdu = loop {
            let pdu = match step.take().expect("a step") {
                LoginStep::Respond(p) => p,
                LoginStep::Complete(outcome) => {
                    assert_eq!(
                        outcome.stat_sn,
                        last_stat_sn.map_or(outcome.stat_sn, |s| s.wrapping_add(1))
                    );
                    let p = m.final_response(
                        1,
                        outcome.stat_sn,
                        outcome.exp_cmd_sn.wrapping_add(WINDOW - 1),
                    );
                    responses.push(p.clone());
                    let r = resp(&p);
                    assert!(
                        r.transit && r.nsg == Stage::FullFeature && r.tsih == 1,
                        "{r:?}"
                    );
                    check_sn(&mut last_stat_sn, &r);
                    let pairs = reply_text
                        .push(&p.data, false)
                        .expect("text")
                        .expect("final");
                    let answers = ini
                        .receive(phase_of(stage), &pairs)
                        .map_err(|e| Failure::Initiator(e.to_string()))?;
                    if let Some(c) = chap.as_mut() {
                        let chap_pairs: TextPairs = answers
                            .passthrough
                            .iter()
                            .filter(|(k, _)| k.starts_with("CHAP_"))
                            .cloned()
                            .collect();
                        if !chap_pairs.is_empty() {
                            c.receive(&chap_pairs, &mut |b| rng.fill_bytes(b))
                                .map_err(|e| Failure::Initiator(e.to_string()))?;
                        }
                        if ini.params().auth_method == AuthMethod::Chap && !c.is_done() {
                            return Err(Failure::Initiator("CHAP not complete".into()));
                        }
                    }
                    ini.finish()
                        .map_err(|e| Failure::Initiator(e.to_string()))?;
                    return Ok(Done {
                        outcome: *outcome,
                        initiator: ini,
                        responses,
                    });
                }
                other => return Err(fail_of(other)),
            };
            let r = resp(&pdu);
            check_sn(&mut last_stat_sn, &r);
            exp_stat_sn = r.stat_sn.wrapping_add(1);
            responses.push(pdu.clone());
            if !r.continue_bit {
                break pdu;
            }
            assert!(!r.transit && pdu.data.len() <= 8192);
            reply_text.push(&pdu.data, true).expect("text");
            let req = login_request(false, false, stage, nsg, o.tsih, exp_stat_sn);
            step = Some(m.on_request(&req, &[]));
        };
        let r = resp(&pdu);
        let pairs = reply_text
            .push(&std::mem::take(&mut pdu.data), false)
            .expect("text")
            .expect("final");
        let answers = ini
            .receive(phase_of(stage), &pairs)
            .map_err(|e| Failure::Initiator(e.to_string()))?;
        to_send = answers.answers.clone();
        if let Some(c) = chap.as_mut() {
            let chap_pairs: TextPairs = answers
                .passthrough
                .iter()
                .filter(|(k, _)| k.starts_with("CHAP_"))
                .cloned()
                .collect();
            if !chap_pairs.is_empty() {
                match c.receive(&chap_pairs, &mut |b| rng.fill_bytes(b)) {
                    Ok(InitiatorStep::Respond(p)) => to_send.extend(p),
                    Ok(_) => {}
                    Err(e) => return Err(Failure::Initiator(e.to_string())),
                }
            }
            if !chap_started && ini.params().auth_method == AuthMethod::Chap {
                chap_started = true;
                to_send.extend(c.offer());
            }
        }
        if r.transit {
            assert_eq!(r.nsg, nsg);
            stage = r.nsg;
            to_send.extend(ini.offer(phase_of(stage)).expect("offer"));
        }
    }
    Err(Failure::Initiator("login did not finish".into()))
}

fn check_sn(last: &mut Option<u32>, r: &LoginResponse) {
    if let Some(prev) = *last {
        assert_eq!(
            r.stat_sn,
            prev.wrapping_add(1),
            "StatSN increments per response"
        );
    }
    *last = Some(r.stat_sn);
    assert_eq!(r.exp_cmd_sn, CMD_SN);
    assert_eq!(r.max_cmd_sn, CMD_SN + WINDOW - 1);
    assert_eq!(r.isid, ISID);
    assert_eq!(r.itt, 0x1000);
    assert_eq!((r.version_max, r.version_active), (0, 0));
}

fn fail_of(step: LoginStep) -> Failure {
    match step {
        LoginStep::Fail(p) => {
            let r = resp(&p);
            assert!(!r.transit && !r.continue_bit && p.data.is_empty());
            Failure::Status(r.status)
        }
        other => Failure::Initiator(format!("unexpected step {other:?}")),
    }
}

fn status(r: Result<Done, Failure>) -> LoginStatus {
    match r {
        Err(Failure::Status(s)) => s,
        other => panic!("expected a login reject, got {other:?}"),
    }
}

fn login(o: &Opts) -> Result<Done, Failure> {
    run_login(&mut machine(catalog(), 1), o)
}

fn first_text(d: &Done) -> TextPairs {
    let p = d
        .responses
        .iter()
        .find(|p| !p.data.is_empty())
        .expect("some text");
    parse_text(&p.data).unwrap()
}

fn has(pairs: &TextPairs, k: &str, v: &str) -> bool {
    pairs.iter().any(|(a, b)| a == k && b == v)
}

#[test]
fn open_target_login_declares_tpgt_alias_and_mrdsl() {
    let d = login(&opts(HOST1, Some(OPEN))).expect("login");
    let first = first_text(&d);
    assert!(has(&first, "TargetPortalGroupTag", "1"), "{first:?}");
    assert!(
        has(&first, "TargetAlias", &format!("alias of {OPEN}")),
        "{first:?}"
    );
    let all: TextPairs = d
        .responses
        .iter()
        .flat_map(|p| parse_text(&p.data).unwrap())
        .collect();
    assert!(has(&all, "MaxRecvDataSegmentLength", "262144"), "{all:?}");
    let o = &d.outcome;
    assert_eq!(o.initiator_name, HOST1);
    assert_eq!(o.initiator_alias.as_deref(), Some("test host"));
    assert_eq!(o.isid, ISID);
    assert_eq!((o.tsih_requested, o.cid, o.tpgt), (0, 1, 1));
    assert_eq!(o.target.as_ref().map(|t| t.name.as_str()), Some(OPEN));
    assert_eq!(o.session_type, SessionType::Normal);
    assert_eq!(o.exp_cmd_sn, CMD_SN);
    assert_eq!(o.chap_user, None);
    assert_eq!(&o.params, d.initiator.params());
    assert_eq!(o.params.target_max_recv_data_segment_length, 262144);
    assert_eq!(o.params.target_portal_group_tag, Some(1));
}

#[test]
fn stat_sn_starts_from_machine_choice() {
    let a = login(&opts(HOST1, Some(OPEN))).unwrap();
    let b = run_login(&mut machine(catalog(), 2), &opts(HOST1, Some(OPEN))).unwrap();
    let first = |d: &Done| resp(&d.responses[0]).stat_sn;
    assert_ne!(first(&a), first(&b));
}

#[test]
fn skip_security_and_security_straight_to_ffp() {
    let mut o = opts(HOST1, Some(OPEN));
    o.skip_security = true;
    let d = login(&o).expect("operational first");
    assert!(has(&first_text(&d), "TargetPortalGroupTag", "1"));
    let mut o = opts(HOST1, Some(OPEN));
    o.security_to_ffp = true;
    let d = login(&o).expect("security to ffp");
    let last = resp(d.responses.last().unwrap());
    assert_eq!((last.csg, last.nsg), (Stage::Security, Stage::FullFeature));
}

/// AuthMethod in a login that starts in the operational stage, where the
/// key has no place (RFC 7143 §6.3), is answered Reject and the login
/// goes on to a target that requires no authentication, where it was
/// refused as an AUTHENTICATION FAILURE; a target that requires CHAP
/// still refuses a login that skipped the security stage.
#[test]
fn auth_method_in_the_operational_stage_is_answered_reject() {
    let mut m = machine(catalog(), 1);
    let req = login_request(true, false, Stage::Operational, Stage::FullFeature, 0, 0);
    let step = one(
        &mut m,
        &req,
        &[
            ("InitiatorName", HOST1),
            ("TargetName", OPEN),
            ("SessionType", "Normal"),
            ("AuthMethod", "None"),
        ],
    );
    let LoginStep::Complete(_) = step else {
        panic!("{step:?}")
    };
    let p = m.final_response(1, 100, 200);
    let pairs = parse_text(&p.data).unwrap();
    assert!(has(&pairs, "AuthMethod", "Reject"), "{pairs:?}");
}

#[test]
fn discovery_login_has_no_tpgt() {
    let d = login(&opts(HOST1, None)).expect("discovery");
    assert!(d.outcome.target.is_none());
    assert_eq!(d.outcome.session_type, SessionType::Discovery);
    let all: TextPairs = d
        .responses
        .iter()
        .flat_map(|p| parse_text(&p.data).unwrap())
        .collect();
    assert!(
        !all.iter().any(|(k, _)| k == "TargetPortalGroupTag"),
        "{all:?}"
    );
}

#[test]
fn status_not_found_missing_parameter_authorization() {
    assert_eq!(
        status(login(&opts(HOST1, Some("iqn.2026-01.test:nope")))),
        LoginStatus::NOT_FOUND
    );
    // Case-insensitive names.
    assert!(login(&opts(HOST1, Some(&OPEN.to_uppercase()))).is_ok());
    assert_eq!(
        status(login(&opts(HOST2, Some(ACL)))),
        LoginStatus::AUTHORIZATION_FAILURE
    );
    assert!(login(&opts(HOST1, Some(ACL))).is_ok());
    // A target not on this portal group.
    let mut c = catalog();
    c.targets.push(target(
        "iqn.2026-01.test:elsewhere",
        Acl::Any,
        AuthPolicy::default(),
        vec![2],
    ));
    assert_eq!(
        status(run_login(
            &mut machine(c, 1),
            &opts(HOST1, Some("iqn.2026-01.test:elsewhere"))
        )),
        LoginStatus::NOT_FOUND
    );
}

fn one(m: &mut LoginMachine, req: &LoginRequest, pairs: &[(&str, &str)]) -> LoginStep {
    let text = encode_text(pairs).unwrap();
    m.on_request(req, &text)
}

fn fail_status(step: LoginStep) -> LoginStatus {
    match step {
        LoginStep::Fail(p) => resp(&p).status,
        other => panic!("expected Fail, got {other:?}"),
    }
}

fn sec_req() -> LoginRequest {
    login_request(true, false, Stage::Security, Stage::Operational, 0, 0)
}

#[test]
fn status_missing_initiator_name_and_target_name() {
    let mut m = machine(catalog(), 1);
    let s = one(
        &mut m,
        &sec_req(),
        &[
            ("SessionType", "Normal"),
            ("TargetName", OPEN),
            ("AuthMethod", "None"),
        ],
    );
    assert_eq!(fail_status(s), LoginStatus::MISSING_PARAMETER);
    // Any later request fails too.
    assert_eq!(
        fail_status(one(&mut m, &sec_req(), &[])),
        LoginStatus::INITIATOR_ERROR
    );
    let mut m = machine(catalog(), 1);
    let s = one(
        &mut m,
        &sec_req(),
        &[("InitiatorName", HOST1), ("AuthMethod", "None")],
    );
    assert_eq!(fail_status(s), LoginStatus::MISSING_PARAMETER);
    let mut m = machine(catalog(), 1);
    let s = one(
        &mut m,
        &sec_req(),
        &[("InitiatorName", HOST1), ("SessionType", "Weird")],
    );
    assert_eq!(fail_status(s), LoginStatus::SESSION_TYPE_NOT_SUPPORTED);
}

/// The first request decides the session's type; a later SessionType naming
/// another is an initiator error, not a session negotiated as one type and
/// run as the other.
#[test]
fn a_session_type_declared_after_the_first_request_must_agree() {
    let mut m = machine(catalog(), 1);
    let first = one(
        &mut m,
        &login_request(false, false, Stage::Security, Stage::Operational, 0, 0),
        &[("InitiatorName", HOST1), ("TargetName", OPEN)],
    );
    assert!(matches!(first, LoginStep::Respond(_)), "{first:?}");
    assert_eq!(
        fail_status(one(&mut m, &sec_req(), &[("SessionType", "Discovery")])),
        LoginStatus::INITIATOR_ERROR
    );
    // The type it has, said again, is no change.
    let mut m = machine(catalog(), 1);
    let first = one(
        &mut m,
        &login_request(false, false, Stage::Security, Stage::Operational, 0, 0),
        &[("InitiatorName", HOST1), ("TargetName", OPEN)],
    );
    assert!(matches!(first, LoginStep::Respond(_)), "{first:?}");
    let again = one(&mut m, &sec_req(), &[("SessionType", "Normal")]);
    assert!(matches!(again, LoginStep::Respond(_)), "{again:?}");
}

/// An InitiatorName names the initiator in ACLs, logs, reservation records
/// and the saved reservation file: one with a space, a line break or a '/'
/// (no iSCSI name has them, RFC 7143 §4.2.7) is refused with an initiator
/// error before anything else is looked at.
#[test]
fn status_initiator_name_that_is_no_name() {
    for name in [
        "iqn.2026-11.io.x:a b",
        "iqn.2026-11.io.x:a\nresv 3 0",
        "iqn.2026-11.io.x:a/b",
        "iqn.2026-11.io.x:a\tb",
    ] {
        let mut m = machine(catalog(), 1);
        let s = one(
            &mut m,
            &sec_req(),
            &[
                ("InitiatorName", name),
                ("TargetName", OPEN),
                ("AuthMethod", "None"),
            ],
        );
        assert_eq!(fail_status(s), LoginStatus::INITIATOR_ERROR, "{name:?}");
    }
    // Names the RFC does not allow but that hold nothing of the kind still log in.
    let mut m = machine(catalog(), 1);
    let s = one(
        &mut m,
        &sec_req(),
        &[
            ("InitiatorName", "iqn.1991-05.com.microsoft:my_host"),
            ("TargetName", OPEN),
        ],
    );
    assert!(!matches!(s, LoginStep::Fail(_)), "{s:?}");
}

#[test]
fn status_unsupported_version() {
    let mut m = machine(catalog(), 1);
    let req = LoginRequest {
        version_min: 1,
        version_max: 1,
        ..sec_req()
    };
    let s = one(
        &mut m,
        &req,
        &[("InitiatorName", HOST1), ("TargetName", OPEN)],
    );
    assert_eq!(fail_status(s), LoginStatus::UNSUPPORTED_VERSION);
    assert_eq!(LoginStatus::UNSUPPORTED_VERSION, LoginStatus::new(2, 5));
}

#[test]
fn status_session_does_not_exist_and_out_of_resources() {
    for (st, class, detail) in [
        (LoginStatus::SESSION_DOES_NOT_EXIST, 2, 0x0a),
        (LoginStatus::OUT_OF_RESOURCES, 3, 2),
    ] {
        let mut m = machine(catalog(), 1);
        // Drive the login until Complete, then refuse as the session layer.
        let mut req = login_request(true, false, Stage::Operational, Stage::FullFeature, 0x55, 0);
        req.tsih = 0x55;
        let step = one(
            &mut m,
            &req,
            &[("InitiatorName", HOST1), ("TargetName", OPEN)],
        );
        let LoginStep::Complete(outcome) = step else {
            panic!("{step:?}")
        };
        assert_eq!(outcome.tsih_requested, 0x55);
        assert!(outcome.params.initiator_name.is_some());
        let p = m.reject(st);
        let r = resp(&p);
        assert_eq!((r.status.class, r.status.detail), (class, detail));
        assert_eq!(r.tsih, 0x55);
        assert_eq!(r.isid, ISID);
        assert!(m.is_failed());
    }
}

#[test]
fn non_leading_connection_answers_leading_keys_irrelevant() {
    let mut m = machine(catalog(), 1);
    let req = login_request(true, false, Stage::Operational, Stage::FullFeature, 7, 0);
    let step = one(
        &mut m,
        &req,
        &[
            ("InitiatorName", HOST1),
            ("TargetName", OPEN),
            ("MaxBurstLength", "4096"),
        ],
    );
    let LoginStep::Complete(_) = step else {
        panic!("{step:?}")
    };
    let p = m.final_response(7, 100, 200);
    let pairs = parse_text(&p.data).unwrap();
    assert!(has(&pairs, "MaxBurstLength", "Irrelevant"), "{pairs:?}");
    let r = resp(&p);
    assert_eq!(
        (r.tsih, r.stat_sn, r.max_cmd_sn, r.exp_cmd_sn),
        (7, 100, 200, CMD_SN)
    );
}

#[test]
fn header_consistency_and_stage_rules() {
    let start = |m: &mut LoginMachine| {
        let req = login_request(false, false, Stage::Security, Stage::Operational, 0, 0);
        let s = one(
            m,
            &req,
            &[
                ("InitiatorName", HOST1),
                ("TargetName", OPEN),
                ("AuthMethod", "None"),
            ],
        );
        assert!(matches!(s, LoginStep::Respond(_)), "{s:?}");
    };
    let cases: Vec<(&str, LoginRequest)> = vec![
        (
            "isid",
            LoginRequest {
                isid: [1; 6],
                ..sec_req()
            },
        ),
        (
            "tsih",
            LoginRequest {
                tsih: 9,
                ..sec_req()
            },
        ),
        (
            "cid",
            LoginRequest {
                cid: 9,
                ..sec_req()
            },
        ),
        (
            "csg",
            login_request(true, false, Stage::Operational, Stage::FullFeature, 0, 0),
        ),
        (
            "backwards",
            login_request(true, false, Stage::Security, Stage::Security, 0, 0),
        ),
        (
            "reserved nsg",
            login_request(true, false, Stage::Security, Stage::Reserved, 0, 0),
        ),
        (
            "reserved csg",
            login_request(false, false, Stage::Reserved, Stage::Reserved, 0, 0),
        ),
        (
            "T and C",
            login_request(true, true, Stage::Security, Stage::Operational, 0, 0),
        ),
    ];
    for (what, req) in cases {
        let mut m = machine(catalog(), 1);
        start(&mut m);
        assert_eq!(
            fail_status(m.on_request(&req, &[])),
            LoginStatus::INITIATOR_ERROR,
            "{what}"
        );
    }
    // The ITT may change between login requests (libiscsi does that).
    let mut m = machine(catalog(), 1);
    start(&mut m);
    let req = LoginRequest {
        itt: 77,
        ..sec_req()
    };
    let LoginStep::Respond(p) = m.on_request(&req, &[]) else {
        panic!()
    };
    assert_eq!(resp(&p).itt, 77);
    // First request in full feature stage.
    let mut m = machine(catalog(), 1);
    let req = login_request(false, false, Stage::FullFeature, Stage::FullFeature, 0, 0);
    assert_eq!(
        fail_status(m.on_request(&req, &[])),
        LoginStatus::INITIATOR_ERROR
    );
    // Oversized data segment.
    let mut m = machine(catalog(), 1);
    assert_eq!(
        fail_status(m.on_request(&sec_req(), &[b'a'; 8193])),
        LoginStatus::INITIATOR_ERROR
    );
    // Malformed text.
    let mut m = machine(catalog(), 1);
    assert_eq!(
        fail_status(m.on_request(&sec_req(), b"novalue\0")),
        LoginStatus::INITIATOR_ERROR
    );
    // Duplicate key.
    let mut m = machine(catalog(), 1);
    let s = one(
        &mut m,
        &sec_req(),
        &[
            ("InitiatorName", HOST1),
            ("TargetName", OPEN),
            ("AuthMethod", "None"),
            ("AuthMethod", "None"),
        ],
    );
    assert_eq!(fail_status(s), LoginStatus::INITIATOR_ERROR);
}

#[test]
fn c_bit_requests_are_acknowledged_and_joined() {
    let mut o = opts(HOST1, Some(OPEN));
    o.split = 7;
    let d = login(&o).expect("login with split text");
    assert_eq!(d.outcome.initiator_name, HOST1);
    assert!(d.responses.len() > 20);
}

#[test]
fn long_login_response_is_split_at_8192_bytes() {
    let mut o = opts(HOST1, Some(OPEN));
    o.extra = (0..500)
        .map(|i| {
            (
                format!("X-com.example.key-number-{i:04}"),
                "value".to_owned(),
            )
        })
        .collect();
    o.split = 8192;
    let d = login(&o).expect("login with long text");
    let continued: Vec<&Pdu> = d
        .responses
        .iter()
        .filter(|p| resp(p).continue_bit)
        .collect();
    assert!(!continued.is_empty());
    assert!(continued.iter().all(|p| p.data.len() == 8192));
    let all: TextPairs = {
        let mut asm = TextAssembler::new(1 << 20);
        let mut out = TextPairs::new();
        for p in d.responses.iter().filter(|p| !p.data.is_empty()) {
            if let Some(x) = asm.push(&p.data, resp(p).continue_bit).unwrap() {
                out.extend(x);
            }
        }
        out
    };
    assert_eq!(
        all.iter().filter(|(_, v)| v == "NotUnderstood").count(),
        500
    );
}

/// A normal login's first request to the open target with `keys`, each
/// set to `value`: keys no target knows, each answered NotUnderstood.
fn with_unknown_keys(keys: impl Iterator<Item = String>, value: &str) -> Vec<u8> {
    let mut pairs = vec![
        ("InitiatorName".to_owned(), HOST1.to_owned()),
        ("TargetName".to_owned(), OPEN.to_owned()),
    ];
    pairs.extend(keys.map(|k| (k, value.to_owned())));
    encode_text(&pairs).unwrap()
}

/// The last piece of a long response moves to full feature phase only when
/// the request that pulls it asks to (T=1): a pull with T=0 gets the rest of
/// the text and the stage held, and the login completes when the initiator
/// asks again.
#[test]
fn a_long_response_moves_on_only_when_its_last_pull_asks_to() {
    let mut m = machine(catalog(), 1);
    let text = with_unknown_keys(
        (0..200).map(|i| format!("X-com.example.key-number-{i:04}")),
        "value",
    );
    let asks = |t| login_request(t, false, Stage::Operational, Stage::FullFeature, 0, 0);
    let mut step = m.on_request(&asks(true), &text);
    let mut pieces = 0;
    loop {
        let LoginStep::Respond(p) = &step else {
            panic!("piece {pieces}: {step:?}")
        };
        pieces += 1;
        if !resp(p).continue_bit {
            assert!(!resp(p).transit, "moved on answering a pull with T=0");
            break;
        }
        step = m.on_request(&asks(false), &[]);
    }
    assert!(pieces > 1, "the response came in pieces");
    let done = m.on_request(&asks(true), &[]);
    assert!(matches!(done, LoginStep::Complete(_)), "{done:?}");
}

/// A pull with T=0 holds the stage for its own piece only: when the request
/// pulling the last piece asks to move on, the login completes with it.
#[test]
fn a_long_response_moves_on_when_its_last_pull_asks_after_one_that_did_not() {
    let mut m = machine(catalog(), 1);
    // Short keys answered NotUnderstood: a request within 8192 bytes whose
    // answer needs three pieces.
    let text = with_unknown_keys((0..750).map(|i| format!("X-k{i:04}")), "v");
    let asks = |t| login_request(t, false, Stage::Operational, Stage::FullFeature, 0, 0);
    let mut step = m.on_request(&asks(true), &text);
    let mut pulls = 0;
    while let LoginStep::Respond(p) = &step {
        assert!(
            resp(p).continue_bit,
            "pull {pulls} ended the text without moving on: {p:?}"
        );
        // The first pull asks to stay; every later one asks to move on.
        step = m.on_request(&asks(pulls > 0), &[]);
        pulls += 1;
    }
    assert!(
        pulls > 1,
        "the response came in more than two pieces: {step:?}"
    );
    assert!(matches!(step, LoginStep::Complete(_)), "{step:?}");
}

#[test]
fn chap_required_refuses_auth_none_and_skipped_security() {
    assert_eq!(
        status(login(&opts(HOST1, Some(CHAP)))),
        LoginStatus::AUTHENTICATION_FAILURE
    );
    let mut o = opts(HOST1, Some(CHAP));
    o.skip_security = true;
    assert_eq!(status(login(&o)), LoginStatus::AUTHENTICATION_FAILURE);
    // CHAP offered to a target without credentials.
    let o = with_chap(
        opts(HOST1, Some(OPEN)),
        "alice",
        "alice-secret-123",
        vec![],
        None,
    );
    let mut o2 = o.clone();
    o2.auth_methods = vec![AuthMethod::Chap];
    assert_eq!(status(login(&o2)), LoginStatus::AUTHENTICATION_FAILURE);
    // CHAP,None to an open target settles on None.
    let d = login(&o).expect("falls back to None");
    assert_eq!(d.outcome.params.auth_method, AuthMethod::None);
}

#[test]
fn chap_one_way_mutual_and_wrong_secret_for_every_algorithm() {
    for alg in ChapAlgorithm::ALL {
        let o = with_chap(
            opts(HOST1, Some(CHAP)),
            "alice",
            "alice-secret-123",
            vec![alg],
            None,
        );
        let d = login(&o).unwrap_or_else(|e| panic!("{alg}: {e:?}"));
        assert_eq!(d.outcome.chap_user.as_deref(), Some("alice"));
        assert_eq!(d.outcome.params.auth_method, AuthMethod::Chap);
        let all: TextPairs = d
            .responses
            .iter()
            .flat_map(|p| parse_text(&p.data).unwrap())
            .collect();
        assert!(has(&all, "CHAP_A", &alg.code().to_string()));

        let o = with_chap(
            opts(HOST1, Some(CHAP)),
            "alice",
            "alice-secret-123",
            vec![alg],
            Some(("target", "target-secret-456")),
        );
        let d = login(&o).unwrap_or_else(|e| panic!("{alg} mutual: {e:?}"));
        assert_eq!(d.outcome.chap_user.as_deref(), Some("alice"));

        let o = with_chap(
            opts(HOST1, Some(CHAP)),
            "alice",
            "wrong-secret-123",
            vec![alg],
            None,
        );
        assert_eq!(
            status(login(&o)),
            LoginStatus::AUTHENTICATION_FAILURE,
            "{alg}"
        );
        let o = with_chap(
            opts(HOST1, Some(CHAP)),
            "mallory",
            "alice-secret-123",
            vec![alg],
            None,
        );
        assert_eq!(
            status(login(&o)),
            LoginStatus::AUTHENTICATION_FAILURE,
            "{alg}"
        );

        // The initiator refuses a target that does not know the mutual secret.
        let o = with_chap(
            opts(HOST1, Some(CHAP)),
            "alice",
            "alice-secret-123",
            vec![alg],
            Some(("target", "other-secret-789")),
        );
        assert!(matches!(login(&o), Err(Failure::Initiator(_))), "{alg}");
    }
}

#[test]
fn chap_algorithm_follows_initiator_preference_within_target_policy() {
    let mut c = catalog();
    c.targets.push(target(
        "iqn.2026-01.test:md5sha256",
        Acl::Any,
        chap_policy(vec![7, 5]),
        vec![1],
    ));
    for (offer, want) in [
        (vec![ChapAlgorithm::Md5, ChapAlgorithm::Sha256], "5"),
        (
            vec![
                ChapAlgorithm::Sha3_256,
                ChapAlgorithm::Sha256,
                ChapAlgorithm::Md5,
            ],
            "7",
        ),
    ] {
        let o = with_chap(
            opts(HOST1, Some("iqn.2026-01.test:md5sha256")),
            "alice",
            "alice-secret-123",
            offer,
            None,
        );
        let d = run_login(&mut machine(catalog_with(&c), 1), &o).expect("login");
        let all: TextPairs = d
            .responses
            .iter()
            .flat_map(|p| parse_text(&p.data).unwrap())
            .collect();
        assert!(has(&all, "CHAP_A", want), "{all:?}");
    }
    let o = with_chap(
        opts(HOST1, Some("iqn.2026-01.test:md5sha256")),
        "alice",
        "alice-secret-123",
        vec![ChapAlgorithm::Sha1],
        None,
    );
    assert_eq!(
        status(run_login(&mut machine(catalog_with(&c), 1), &o)),
        LoginStatus::AUTHENTICATION_FAILURE
    );
}

fn catalog_with(c: &Catalog) -> Catalog {
    Catalog {
        portal_groups: c.portal_groups.clone(),
        targets: c.targets.clone(),
        discovery_auth: c.discovery_auth.clone(),
    }
}

#[test]
fn chap_per_initiator_credentials() {
    // host2 has its own credential: only that one works for it.
    let o = with_chap(
        opts(HOST2, Some(PERINIT)),
        "bob",
        "bob-secret-4567",
        vec![],
        None,
    );
    assert_eq!(
        login(&o).expect("bob").outcome.chap_user.as_deref(),
        Some("bob")
    );
    let o = with_chap(
        opts(HOST2, Some(PERINIT)),
        "alice",
        "alice-secret-123",
        vec![],
        None,
    );
    assert_eq!(status(login(&o)), LoginStatus::AUTHENTICATION_FAILURE);
    // The same host however it writes its name (iSCSI names compare
    // without case): still only bob's credential, never the shared one.
    let shouted = HOST2.to_ascii_uppercase();
    let o = with_chap(
        opts(&shouted, Some(PERINIT)),
        "alice",
        "alice-secret-123",
        vec![],
        None,
    );
    assert_eq!(status(login(&o)), LoginStatus::AUTHENTICATION_FAILURE);
    let o = with_chap(
        opts(&shouted, Some(PERINIT)),
        "bob",
        "bob-secret-4567",
        vec![],
        None,
    );
    assert!(login(&o).is_ok());
    // Others use the target-wide credential, not bob's.
    let o = with_chap(
        opts(HOST1, Some(PERINIT)),
        "alice",
        "alice-secret-123",
        vec![],
        None,
    );
    assert!(login(&o).is_ok());
    let o = with_chap(
        opts(HOST1, Some(PERINIT)),
        "bob",
        "bob-secret-4567",
        vec![],
        None,
    );
    assert_eq!(status(login(&o)), LoginStatus::AUTHENTICATION_FAILURE);
    // Mutual asked of a target without an outgoing credential.
    let o = with_chap(
        opts(HOST1, Some(PERINIT)),
        "alice",
        "alice-secret-123",
        vec![],
        Some(("target", "x-secret-0000000")),
    );
    assert_eq!(status(login(&o)), LoginStatus::AUTHENTICATION_FAILURE);
}

#[test]
fn chap_for_discovery_sessions() {
    let mut c = catalog();
    c.discovery_auth = chap_policy(vec![]);
    assert_eq!(
        status(run_login(
            &mut machine(catalog_with(&c), 1),
            &opts(HOST1, None)
        )),
        LoginStatus::AUTHENTICATION_FAILURE
    );
    let o = with_chap(
        opts(HOST1, None),
        "alice",
        "alice-secret-123",
        vec![ChapAlgorithm::Sha256],
        Some(("target", "target-secret-456")),
    );
    let d = run_login(&mut machine(catalog_with(&c), 1), &o).expect("discovery with mutual CHAP");
    assert_eq!(d.outcome.session_type, SessionType::Discovery);
    let o = with_chap(opts(HOST1, None), "alice", "bad-secret-00000", vec![], None);
    assert_eq!(
        status(run_login(&mut machine(c, 1), &o)),
        LoginStatus::AUTHENTICATION_FAILURE
    );
}

#[test]
fn secrets_never_in_debug_output() {
    let mut m = machine(catalog(), 1);
    let o = with_chap(
        opts(HOST1, Some(CHAP)),
        "alice",
        "alice-secret-123",
        vec![],
        Some(("target", "target-secret-456")),
    );
    let d = run_login(&mut m, &o).unwrap();
    for text in [
        format!("{m:?}"),
        format!("{:?}", d.outcome),
        format!("{:?}", catalog()),
    ] {
        assert!(!text.contains("alice-secret"), "{text}");
        assert!(!text.contains("target-secret"), "{text}");
    }
}

fn arb_stage() -> impl Strategy<Value = Stage> {
    (0u8..4).prop_map(Stage::from_bits)
}

fn arb_text() -> impl Strategy<Value = Vec<u8>> {
    let pair = prop_oneof![
        Just(format!("InitiatorName={HOST1}")),
        Just(format!("TargetName={OPEN}")),
        Just(format!("TargetName={CHAP}")),
        Just("SessionType=Discovery".to_owned()),
        Just("AuthMethod=CHAP,None".to_owned()),
        Just("AuthMethod=None".to_owned()),
        Just("CHAP_A=5,7".to_owned()),
        Just("CHAP_N=alice".to_owned()),
        Just("CHAP_R=0x00112233445566778899aabbccddeeff".to_owned()),
        Just("CHAP_I=1".to_owned()),
        Just("CHAP_C=0x00112233445566778899aabbccddeeff".to_owned()),
        Just("MaxBurstLength=4096".to_owned()),
        Just("HeaderDigest=CRC32C,None".to_owned()),
        "[ -~]{0,20}",
    ];
    prop::collection::vec(pair, 0..6).prop_map(|v| {
        let mut out = Vec::new();
        for p in v {
            out.extend_from_slice(p.as_bytes());
            out.push(0);
        }
        out
    })
}

proptest! {
    #[test]
    fn arbitrary_login_sequences_never_panic(
        seq in prop::collection::vec(
            (any::<bool>(), any::<bool>(), arb_stage(), arb_stage(), 0u8..2, any::<u16>(), 0u16..2, arb_text()),
            1..8,
        ),
        seed in any::<u64>(),
    ) {
        let mut m = machine(catalog(), seed);
        let mut done = false;
        for (t, c, csg, nsg, vmin, tsih, cid, text) in seq {
            let req = LoginRequest {
                transit: t,
                continue_bit: c,
                csg,
                nsg,
                version_max: 0,
                version_min: vmin,
                isid: ISID,
                tsih: tsih % 3,
                itt: 1,
                cid,
                cmd_sn: 5,
                exp_stat_sn: 0,
            };
            let step = m.on_request(&req, &text);
            match step {
                LoginStep::Respond(p) | LoginStep::Fail(p) => {
                    let r = resp(&p);
                    prop_assert!(p.data.len() <= 8192);
                    prop_assert!(!(r.transit && r.continue_bit));
                    if done {
                        prop_assert!(!r.status.is_success());
                    }
                    if !r.status.is_success() {
                        done = true;
                    }
                }
                LoginStep::Complete(_) => {
                    let p = m.final_response(1, 1, 1);
                    prop_assert!(resp(&p).transit);
                    done = true;
                }
            }
        }
    }
}
