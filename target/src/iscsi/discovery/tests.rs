//! SendTargets and Text exchange tests, including a whole discovery login
//! followed by SendTargets=All.

use std::sync::Arc;

use blockwire_pdu::keys::{encode_text, parse_text, Negotiator, Phase, TextAssembler, TextPairs};
use blockwire_pdu::pdu::codes::RejectReason;
use blockwire_pdu::pdu::{TextRequest, TextResponse, RESERVED_TAG};
use blockwire_pdu::{Bhs, Lun, Pdu};
use proptest::prelude::*;

use super::{send_targets, target_address, TextExchange, TextStep};
use crate::iscsi::catalog::{Acl, AuthPolicy, Catalog};
use crate::iscsi::login::tests::{
    catalog, chap_policy, local_addr, opts, run_login, target, with_chap, Done, ACL, CHAP, HOST1,
    HOST2, OPEN, PERINIT,
};

fn pairs(list: &[(&str, &str)]) -> TextPairs {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn target_address_formats() {
    let local = local_addr();
    let at = |portal: &str, tag, local, dual_stack| {
        target_address(portal.parse().unwrap(), tag, local, dual_stack)
    };
    for dual_stack in [false, true] {
        assert_eq!(
            at("127.0.0.1:3260", 1, local, dual_stack).as_deref(),
            Some("127.0.0.1:3260,1")
        );
        assert_eq!(
            at("0.0.0.0:3261", 2, local, dual_stack).as_deref(),
            Some("192.0.2.10:3261,2")
        );
        assert_eq!(
            at("[2001:db8::1]:3260", 3, local, dual_stack).as_deref(),
            Some("[2001:db8::1]:3260,3")
        );
        let v6local = "[2001:db8::9]:3260".parse().unwrap();
        assert_eq!(
            at("[::]:3262", 4, v6local, dual_stack).as_deref(),
            Some("[2001:db8::9]:3262,4")
        );
        let mapped = "[::ffff:198.51.100.7]:3260".parse().unwrap();
        assert_eq!(
            at("[::]:3260", 1, mapped, dual_stack).as_deref(),
            Some("198.51.100.7:3260,1")
        );
        // An IPv4 wildcard asked about over IPv6 has no address to give:
        // the connection's own (IPv6) one reaches no IPv4-only socket.
        assert_eq!(at("0.0.0.0:3260", 1, v6local, dual_stack), None);
        // An IPv4-mapped portal address is its IPv4 address.
        assert_eq!(
            at("[::ffff:192.0.2.20]:3260", 1, local, dual_stack).as_deref(),
            Some("192.0.2.20:3260,1")
        );
    }
    // An IPv6 wildcard asked about over IPv4 reaches it only where it is
    // bound dual-stack.
    assert_eq!(
        at("[::]:3263", 5, local, true).as_deref(),
        Some("192.0.2.10:3263,5")
    );
    assert_eq!(at("[::]:3263", 5, local, false), None);
}

#[test]
fn send_targets_all_hides_acl_targets() {
    let c = catalog();
    let all = send_targets(&c, HOST2, "All", None, local_addr());
    let names: Vec<&str> = all
        .iter()
        .filter(|(k, _)| k == "TargetName")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(names, [OPEN, CHAP, PERINIT]);
    // TargetName then every address of its groups, wildcards resolved.
    assert_eq!(
        &all[..5],
        &pairs(&[
            ("TargetName", OPEN),
            ("TargetAddress", "127.0.0.1:3260,1"),
            ("TargetAddress", "192.0.2.10:3260,1"),
            ("TargetAddress", "192.0.2.10:3261,2"),
            ("TargetName", CHAP),
        ])[..]
    );
    let all = send_targets(&c, HOST1, "All", None, local_addr());
    assert!(all.contains(&("TargetName".into(), ACL.into())));
    // By name, hidden by ACL, unknown, current.
    assert_eq!(send_targets(&c, HOST2, ACL, None, local_addr()), vec![]);
    assert_eq!(send_targets(&c, HOST1, ACL, None, local_addr())[0].1, ACL);
    assert_eq!(
        send_targets(&c, HOST1, "iqn.none", None, local_addr()),
        vec![]
    );
    let cur = c.target(CHAP).unwrap();
    assert_eq!(
        send_targets(&c, HOST1, "", Some(cur), local_addr())[0].1,
        CHAP
    );
    assert_eq!(send_targets(&c, HOST1, "", None, local_addr()), vec![]);
}

fn text_req(itt: u32, ttt: u32, fin: bool, cont: bool) -> TextRequest {
    TextRequest {
        immediate: true,
        final_bit: fin,
        continue_bit: cont,
        lun: Lun::default(),
        itt,
        ttt,
        cmd_sn: 11,
        exp_stat_sn: 0,
    }
}

fn text_resp(step: &TextStep) -> (TextResponse, &Pdu) {
    match step {
        TextStep::Respond(p) => match p.bhs {
            Bhs::TextResponse(r) => (r, p),
            other => panic!("{other:?}"),
        },
        TextStep::Reject(p) => panic!("rejected: {p:?}"),
    }
}

/// Sends `request` (split into `split`-byte PDUs) and pulls the whole
/// answer, checking the C/F/TTT rules on the way. Returns the answer
/// and the number of response PDUs.
fn exchange(
    x: &mut TextExchange,
    itt: u32,
    request: &[(&str, &str)],
    split: usize,
    max: usize,
) -> (TextPairs, usize) {
    let text = encode_text(request).unwrap();
    let mut pieces: Vec<&[u8]> = text.chunks(split).collect();
    if pieces.is_empty() {
        pieces.push(&[]);
    }
    let mut ttt = RESERVED_TAG;
    let mut step = None;
    for (i, p) in pieces.iter().enumerate() {
        let last = i + 1 == pieces.len();
        let s = x.on_request(&text_req(itt, ttt, last, !last), p);
        if !last {
            let (r, pdu) = text_resp(&s);
            assert!(!r.final_bit && !r.continue_bit && pdu.data.is_empty());
            assert_ne!(r.ttt, RESERVED_TAG);
            ttt = r.ttt;
        } else {
            step = Some(s);
        }
    }
    let mut asm = TextAssembler::new(1 << 22);
    let mut n = 0;
    let mut s = step.unwrap();
    loop {
        n += 1;
        let (r, pdu) = text_resp(&s);
        assert_eq!(r.itt, itt);
        assert!(pdu.data.len() <= max, "{} > {max}", pdu.data.len());
        assert_eq!((r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn), (0, 0, 0));
        if r.final_bit {
            assert!(!r.continue_bit);
            assert_eq!(r.ttt, RESERVED_TAG);
            return (asm.push(&pdu.data, false).unwrap().unwrap(), n);
        }
        assert!(r.continue_bit);
        assert_ne!(r.ttt, RESERVED_TAG);
        assert_eq!(pdu.data.len(), max);
        asm.push(&pdu.data, true).unwrap();
        s = x.on_request(&text_req(itt, r.ttt, true, false), &[]);
    }
}

fn discovery_session(c: Catalog, initiator: &str, max_recv: u32) -> (Arc<Catalog>, Done) {
    let c = Arc::new(c);
    let mut m = crate::iscsi::login::LoginMachine::new(
        Arc::clone(&c),
        1,
        local_addr(),
        rand::rngs::mock::StepRng::new(3, 7),
    );
    let mut o = opts(initiator, None);
    o.max_recv = max_recv;
    let d = run_login(&mut m, &o).expect("discovery login");
    (c, d)
}

#[test]
fn discovery_login_then_send_targets_all() {
    let (c, d) = discovery_session(catalog(), HOST2, 8192);
    let mut x = TextExchange::from_outcome(c, &d.outcome, local_addr());
    let (answer, n) = exchange(&mut x, 5, &[("SendTargets", "All")], 8192, 8192);
    assert_eq!(n, 1);
    assert_eq!(
        answer,
        send_targets(&catalog(), HOST2, "All", None, local_addr())
    );
    assert!(!answer.iter().any(|(_, v)| v == ACL));
    // The initiator's engine accepts the answer.
    let mut ini = d.initiator;
    ini.start_text_exchange();
    let r = ini
        .receive(Phase::FullFeature, &answer)
        .expect("initiator takes the list");
    assert_eq!(r.passthrough.len(), answer.len());
    // By name, in a discovery session.
    let (answer, _) = exchange(&mut x, 6, &[("SendTargets", OPEN)], 8192, 8192);
    assert_eq!(answer[0], ("TargetName".into(), OPEN.into()));
}

#[test]
fn discovery_with_chap_then_send_targets() {
    let mut c = catalog();
    c.discovery_auth = chap_policy(vec![]);
    let c = Arc::new(c);
    let mut m = crate::iscsi::login::LoginMachine::new(
        Arc::clone(&c),
        1,
        local_addr(),
        rand::rngs::mock::StepRng::new(1, 1),
    );
    let o = with_chap(
        opts(HOST1, None),
        "alice",
        "alice-secret-123",
        vec![],
        Some(("target", "target-secret-456")),
    );
    let d = run_login(&mut m, &o).expect("login");
    let mut x = TextExchange::from_outcome(c, &d.outcome, local_addr());
    let (answer, _) = exchange(&mut x, 1, &[("SendTargets", "All")], 8192, 8192);
    assert!(answer.contains(&("TargetName".into(), ACL.into())));
}

#[test]
fn long_send_targets_is_split_by_max_recv_data_segment_length() {
    let mut c = catalog();
    for i in 0..60 {
        c.targets.push(target(
            &format!("iqn.2026-01.test:many-{i:03}-{}", "x".repeat(60)),
            Acl::Any,
            AuthPolicy::default(),
            vec![1, 2],
        ));
    }
    let want = send_targets(&c, HOST1, "All", None, local_addr());
    let (c, d) = discovery_session(c, HOST1, 512);
    assert_eq!(d.outcome.params.initiator_max_recv_data_segment_length, 512);
    let mut x = TextExchange::from_outcome(c, &d.outcome, local_addr());
    // The request itself is also sent in pieces with the C bit.
    let (answer, n) = exchange(&mut x, 9, &[("SendTargets", "All")], 5, 512);
    assert!(n > 20, "{n} pieces");
    assert_eq!(answer, want);
    assert!(encode_text(&want).unwrap().len() > 512 * 20);
    // A second request afterwards works normally.
    let (answer, _) = exchange(&mut x, 10, &[("SendTargets", OPEN)], 8192, 512);
    assert_eq!(answer[0].1, OPEN);
}

#[test]
fn abandoned_long_answer_and_bad_ttt() {
    let mut c = catalog();
    for i in 0..40 {
        c.targets.push(target(
            &format!("iqn.2026-01.test:t{i:03}"),
            Acl::Any,
            AuthPolicy::default(),
            vec![1],
        ));
    }
    let (c, d) = discovery_session(c, HOST1, 512);
    let mut x = TextExchange::from_outcome(c, &d.outcome, local_addr());
    let s = x.on_request(
        &text_req(1, RESERVED_TAG, true, false),
        &encode_text(&pairs(&[("SendTargets", "All")])).unwrap(),
    );
    let (r, _) = text_resp(&s);
    assert!(r.continue_bit && !r.final_bit);
    // A wrong TTT is rejected with the request's header.
    let bad = text_req(1, r.ttt.wrapping_add(5), true, false);
    match x.on_request(&bad, &[]) {
        TextStep::Reject(p) => {
            let Bhs::Reject(rj) = p.bhs else { panic!() };
            assert_eq!(rj.reason, RejectReason::InvalidPduField);
            assert_eq!(p.data.len(), 48);
            assert_eq!(p.data[0] & 0x3f, 0x04);
        }
        other => panic!("{other:?}"),
    }
    // A new request (new ITT, reserved TTT) starts afresh.
    let (answer, _) = exchange(&mut x, 2, &[("SendTargets", OPEN)], 8192, 512);
    assert_eq!(answer[0].1, OPEN);
    // F and C together.
    assert!(matches!(
        x.on_request(&text_req(3, RESERVED_TAG, true, true), &[]),
        TextStep::Reject(_)
    ));
}

/// The Text exchange of a normal session of HOST1 to OPEN.
fn normal_session_text() -> TextExchange {
    let c = Arc::new(catalog());
    let mut m = crate::iscsi::login::LoginMachine::new(
        Arc::clone(&c),
        1,
        local_addr(),
        rand::rngs::mock::StepRng::new(3, 7),
    );
    let d = run_login(&mut m, &opts(HOST1, Some(OPEN))).expect("login");
    TextExchange::from_outcome(c, &d.outcome, local_addr())
}

/// A request under the ITT of one whose text was still coming (C bit),
/// with TTT 0xffffffff, is a new request (RFC 7143 §11.10.4): its text is
/// not appended to the abandoned piece. It was, and `SendTargets=A` then
/// `SendTargets=All` asked for a target named `ASendTargets=All`.
#[test]
fn a_new_request_under_the_itt_of_a_continued_one_starts_afresh() {
    let (c, d) = discovery_session(catalog(), HOST1, 8192);
    let mut x = TextExchange::from_outcome(c, &d.outcome, local_addr());
    let s = x.on_request(&text_req(7, RESERVED_TAG, false, true), b"SendTargets=A");
    let (r, _) = text_resp(&s);
    assert_ne!(r.ttt, RESERVED_TAG, "a continued request is acknowledged");
    let (answer, _) = exchange(&mut x, 7, &[("SendTargets", OPEN)], 8192, 8192);
    assert_eq!(
        answer.first().map(|p| p.1.as_str()),
        Some(OPEN),
        "{answer:?}"
    );
}

#[test]
fn normal_session_send_targets_and_other_keys() {
    let mut x = normal_session_text();
    let (answer, _) = exchange(&mut x, 1, &[("SendTargets", "")], 8192, 8192);
    assert_eq!(answer[0], ("TargetName".into(), OPEN.into()));
    let (answer, _) = exchange(&mut x, 2, &[("SendTargets", "All")], 8192, 8192);
    assert_eq!(answer, pairs(&[("SendTargets", "Reject")]));
    let (answer, _) = exchange(&mut x, 3, &[("SendTargets", ACL)], 8192, 8192);
    assert_eq!(answer[0].1, ACL);
    // Keys through the negotiator: a new MaxRecvDataSegmentLength applies.
    let (answer, _) = exchange(
        &mut x,
        4,
        &[
            ("MaxRecvDataSegmentLength", "1024"),
            ("X-org.example.foo", "1"),
            ("HeaderDigest", "None"),
        ],
        8192,
        8192,
    );
    assert_eq!(
        answer,
        pairs(&[
            ("X-org.example.foo", "NotUnderstood"),
            ("HeaderDigest", "Reject")
        ])
    );
    assert_eq!(x.params().initiator_max_recv_data_segment_length, 1024);
    // An empty request gets an empty final answer.
    let (answer, _) = exchange(&mut x, 5, &[], 8192, 8192);
    assert!(answer.is_empty());
}

/// A Text Request the target rejects changes nothing (RFC 7143 §11.17): a
/// MaxRecvDataSegmentLength before the key that failed it was taken all the
/// same, and Data-In went out in segments the initiator never agreed to.
#[test]
fn a_rejected_request_changes_no_parameter() {
    let mut x = normal_session_text();
    let before = x.params().initiator_max_recv_data_segment_length;
    let text = encode_text(&pairs(&[
        ("MaxRecvDataSegmentLength", "1024"),
        ("HeaderDigest", "Reject"),
    ]))
    .unwrap();
    let step = x.on_request(&text_req(1, RESERVED_TAG, true, false), &text);
    assert!(matches!(step, TextStep::Reject(_)), "{step:?}");
    assert_ne!(before, 1024);
    assert_eq!(x.params().initiator_max_recv_data_segment_length, before);
}

#[test]
fn a_request_saying_more_follows_is_not_answered_final() {
    let (c, d) = discovery_session(catalog(), HOST2, 8192);
    let mut x = TextExchange::from_outcome(c, &d.outcome, local_addr());
    // F=0 and C=0: this request is whole, but the initiator has more to send under
    // its ITT (RFC 7143 §11.10.1).
    let text = encode_text(&[("SendTargets", "All")]).unwrap();
    let s = x.on_request(&text_req(7, RESERVED_TAG, false, false), &text);
    let (r, pdu) = text_resp(&s);
    assert!(
        !r.final_bit && !r.continue_bit,
        "F=1 answering a request with F=0: {r:?}"
    );
    assert_ne!(
        r.ttt, RESERVED_TAG,
        "a response with F=0 carries a tag to echo"
    );
    let mut asm = TextAssembler::new(1 << 22);
    assert_eq!(
        asm.push(&pdu.data, false).unwrap().unwrap(),
        send_targets(&catalog(), HOST2, "All", None, local_addr())
    );
    // The next request, with F=1, ends the exchange.
    let s = x.on_request(&text_req(7, r.ttt, true, false), &[]);
    let (end, pdu) = text_resp(&s);
    assert!(end.final_bit && !end.continue_bit);
    assert_eq!(end.ttt, RESERVED_TAG);
    assert!(pdu.data.is_empty());
    // A new exchange after it starts afresh.
    let (answer, n) = exchange(&mut x, 8, &[("SendTargets", OPEN)], 8192, 8192);
    assert_eq!((n, &answer[0]), (1, &("TargetName".into(), OPEN.into())));
}

/// A key may be negotiated once in a negotiation (RFC 7143 §6.2), which
/// runs over all the requests of one exchange (F=0 answered F=0, the next
/// request echoing the tag): the same key again in the request that
/// continues it is rejected and changes nothing, where each request was
/// taken as a fresh negotiation and the second value silently won.
#[test]
fn a_key_given_again_in_a_continuing_request_is_rejected() {
    let mut x = normal_session_text();
    let first = encode_text(&pairs(&[("MaxRecvDataSegmentLength", "65536")])).unwrap();
    let s = x.on_request(&text_req(9, RESERVED_TAG, false, false), &first);
    let (r, _) = text_resp(&s);
    assert!(!r.final_bit);
    assert_eq!(x.params().initiator_max_recv_data_segment_length, 65536);
    let again = encode_text(&pairs(&[("MaxRecvDataSegmentLength", "4096")])).unwrap();
    let s = x.on_request(&text_req(9, r.ttt, true, false), &again);
    assert!(matches!(s, TextStep::Reject(_)), "{s:?}");
    assert_eq!(x.params().initiator_max_recv_data_segment_length, 65536);
    // A new exchange may name it again.
    let (answer, _) = exchange(
        &mut x,
        10,
        &[("MaxRecvDataSegmentLength", "4096")],
        8192,
        8192,
    );
    assert!(answer.is_empty(), "{answer:?}");
    assert_eq!(x.params().initiator_max_recv_data_segment_length, 4096);
}

#[test]
fn text_exchange_without_login_outcome() {
    let neg = Negotiator::new(
        blockwire_pdu::keys::Role::Target,
        blockwire_pdu::keys::LocalConfig::target(1),
    )
    .unwrap();
    let mut x = TextExchange::new(
        Arc::new(catalog()),
        HOST1.into(),
        blockwire_pdu::keys::SessionType::Discovery,
        None,
        local_addr(),
        neg,
    );
    let (answer, _) = exchange(&mut x, 1, &[("SendTargets", "All")], 8192, 8192);
    assert!(!answer.is_empty());
    let parsed = parse_text(&encode_text(&answer).unwrap()).unwrap();
    assert_eq!(parsed, answer);
}

proptest! {
    #[test]
    fn arbitrary_text_requests_never_panic(
        seq in prop::collection::vec(
            (0u32..3, prop_oneof![Just(RESERVED_TAG), 0u32..4], any::<bool>(), any::<bool>(),
             prop_oneof![
                 Just(b"SendTargets=All\0".to_vec()),
                 Just(b"SendTargets=\0".to_vec()),
                 Just(b"MaxRecvDataSegmentLength=512\0".to_vec()),
                 Just(b"SendTar".to_vec()),
                 prop::collection::vec(any::<u8>(), 0..40),
             ]),
            1..12,
        ),
        discovery in any::<bool>(),
    ) {
        let mut c = catalog();
        for i in 0..20 {
            c.targets.push(target(&format!("iqn.2026-01.test:p{i:03}"), Acl::Any, AuthPolicy::default(), vec![1, 2]));
        }
        let st = if discovery { blockwire_pdu::keys::SessionType::Discovery } else { blockwire_pdu::keys::SessionType::Normal };
        let cur = if discovery { None } else { c.target(OPEN).cloned() };
        let neg = Negotiator::new(blockwire_pdu::keys::Role::Target, blockwire_pdu::keys::LocalConfig::target(1)).unwrap();
        let mut x = TextExchange::new(Arc::new(c), HOST1.into(), st, cur, local_addr(), neg);
        for (itt, ttt, f, cbit, data) in seq {
            match x.on_request(&text_req(itt, ttt, f, cbit), &data) {
                TextStep::Respond(p) => {
                    let Bhs::TextResponse(r) = p.bhs else { panic!() };
                    prop_assert!(!(r.final_bit && r.continue_bit));
                    prop_assert!(p.data.len() <= x.params().initiator_max_recv_data_segment_length as usize);
                    prop_assert_eq!(r.itt, itt);
                }
                TextStep::Reject(p) => prop_assert_eq!(p.data.len(), 48),
            }
        }
    }
}
