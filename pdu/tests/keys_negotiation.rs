//! Negotiation table tests for every standard key, and an in-memory login of
//! an initiator Negotiator against a target Negotiator.

use blockwire_pdu::keys::{
    encode_text, AuthMethod, Digest, LocalConfig, NegotiationError, Negotiator, Phase, Responses,
    Role, SessionParams, SessionType, TextAssembler, TextPairs, MAX_DISTINCT_KEYS,
};

fn pairs(list: &[(&str, &str)]) -> TextPairs {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn target(cfg: LocalConfig) -> Negotiator {
    Negotiator::new(Role::Target, cfg).expect("valid target config")
}

fn initiator(cfg: LocalConfig) -> Negotiator {
    Negotiator::new(Role::Initiator, cfg).expect("valid initiator config")
}

/// The target's answers to `offers` in the operational stage.
fn answers(cfg: LocalConfig, offers: &[(&str, &str)]) -> TextPairs {
    target(cfg)
        .receive(Phase::Operational, &pairs(offers))
        .expect("no protocol error")
        .answers
}

fn answer_of(cfg: LocalConfig, key: &str, value: &str) -> String {
    let a = answers(cfg, &[(key, value)]);
    assert_eq!(a.len(), 1, "{key}={value} answered once: {a:?}");
    a[0].1.clone()
}

/// Sends `pairs` through the wire codec, split into 7-byte PDUs.
fn wire(pairs: &[(String, String)]) -> TextPairs {
    let bytes = encode_text(pairs).expect("encodes");
    let mut asm = TextAssembler::default();
    let pieces: Vec<&[u8]> = bytes.chunks(7).collect();
    if pieces.is_empty() {
        return asm.push(&[], false).expect("empty").expect("final");
    }
    let mut out = None;
    for (i, p) in pieces.iter().enumerate() {
        out = asm.push(p, i + 1 < pieces.len()).expect("assembles");
    }
    out.expect("final piece")
}

/// Runs a whole login (security then operational stage) in memory and
/// returns both sides after `finish`.
fn login(icfg: LocalConfig, tcfg: LocalConfig) -> (Negotiator, Negotiator) {
    let mut ini = initiator(icfg);
    let mut tgt = target(tcfg);
    for phase in [Phase::Security, Phase::Operational] {
        let mut to_target = ini.offer(phase).expect("offer");
        for _ in 0..4 {
            if to_target.is_empty() {
                break;
            }
            let r = tgt
                .receive(phase, &wire(&to_target))
                .expect("target receives");
            let mut to_ini = r.answers;
            to_ini.extend(tgt.offer(phase).expect("target offer"));
            let r = ini
                .receive(phase, &wire(&to_ini))
                .expect("initiator receives");
            to_target = r.answers;
            to_target.extend(ini.offer(phase).expect("offer"));
        }
    }
    ini.finish().expect("initiator finishes");
    tgt.finish().expect("target finishes");
    (ini, tgt)
}

fn agree(icfg: LocalConfig, tcfg: LocalConfig) -> SessionParams {
    let (ini, tgt) = login(icfg, tcfg);
    assert_eq!(ini.params(), tgt.params());
    ini.params().clone()
}

// ---- numerical keys -------------------------------------------------------

#[test]
fn rfc_example_max_burst_length_min() {
    let t = LocalConfig {
        max_burst_length: 65536,
        first_burst_length: 65536,
        ..LocalConfig::target(1)
    };
    assert_eq!(answer_of(t.clone(), "MaxBurstLength", "262144"), "65536");
    let p = agree(LocalConfig::initiator("iqn.i", "iqn.t"), t);
    assert_eq!(p.max_burst_length, 65536);
}

#[test]
fn numeric_min_keys() {
    let t = LocalConfig {
        max_connections: 4,
        first_burst_length: 8192,
        max_outstanding_r2t: 8,
        error_recovery_level: 1,
        default_time2retain: 10,
        iscsi_protocol_level: 1,
        ..LocalConfig::target(1)
    };
    let cases = [
        ("MaxConnections", "16", "4"),
        ("MaxConnections", "2", "2"),
        ("FirstBurstLength", "65536", "8192"),
        ("FirstBurstLength", "4096", "4096"),
        ("MaxOutstandingR2T", "1", "1"),
        ("MaxOutstandingR2T", "0x20", "8"),
        ("ErrorRecoveryLevel", "2", "1"),
        ("ErrorRecoveryLevel", "0", "0"),
        ("DefaultTime2Retain", "20", "10"),
        ("DefaultTime2Retain", "0", "0"),
        ("iSCSIProtocolLevel", "31", "1"),
    ];
    for (key, offer, want) in cases {
        assert_eq!(answer_of(t.clone(), key, offer), want, "{key}={offer}");
    }
}

#[test]
fn numeric_max_key_default_time2wait() {
    let t = LocalConfig {
        default_time2wait: 10,
        ..LocalConfig::target(1)
    };
    assert_eq!(answer_of(t.clone(), "DefaultTime2Wait", "2"), "10");
    assert_eq!(answer_of(t.clone(), "DefaultTime2Wait", "3600"), "3600");
    let p = agree(
        LocalConfig {
            default_time2wait: 5,
            ..LocalConfig::initiator("iqn.i", "iqn.t")
        },
        t,
    );
    assert_eq!(p.default_time2wait, 10);
}

#[test]
fn max_outstanding_unexpected_pdus_zero_means_unlimited() {
    let t = |n| LocalConfig {
        max_outstanding_unexpected_pdus: n,
        ..LocalConfig::target(1)
    };
    assert_eq!(answer_of(t(0), "MaxOutstandingUnexpectedPDUs", "16"), "16");
    assert_eq!(answer_of(t(8), "MaxOutstandingUnexpectedPDUs", "0"), "8");
    assert_eq!(answer_of(t(8), "MaxOutstandingUnexpectedPDUs", "16"), "8");
    assert_eq!(answer_of(t(0), "MaxOutstandingUnexpectedPDUs", "0"), "0");
    assert_eq!(
        answer_of(t(8), "MaxOutstandingUnexpectedPDUs", "1"),
        "Reject"
    );
}

#[test]
fn out_of_range_or_illegal_values_are_rejected() {
    let cases = [
        ("MaxBurstLength", "511"),
        ("MaxBurstLength", "16777216"),
        ("FirstBurstLength", "abc"),
        ("MaxConnections", "0"),
        ("MaxConnections", "65536"),
        ("MaxOutstandingR2T", "0"),
        ("ErrorRecoveryLevel", "3"),
        ("DefaultTime2Wait", "3601"),
        ("DefaultTime2Retain", "-1"),
        ("iSCSIProtocolLevel", "32"),
        ("InitialR2T", "yes"),
        ("ImmediateData", "Maybe"),
        ("HeaderDigest", "MD5"),
        ("DataDigest", ""),
        ("HeaderDigest", "CRC32C,,None"),
        ("MaxRecvDataSegmentLength", "100"),
        ("SessionType", "Fancy"),
        ("InitiatorName", ""),
        ("MaxBurstLength", "99999999999999999999999"),
    ];
    for (key, value) in cases {
        assert_eq!(
            answer_of(LocalConfig::target(1), key, value),
            "Reject",
            "{key}={value}"
        );
    }
}

#[test]
fn first_burst_length_irrelevant_and_bounded() {
    // Irrelevant when InitialR2T=Yes and ImmediateData=No, even when those
    // come after FirstBurstLength in the same PDU.
    let a = answers(
        LocalConfig::target(1),
        &[
            ("FirstBurstLength", "4096"),
            ("InitialR2T", "Yes"),
            ("ImmediateData", "No"),
        ],
    );
    assert_eq!(
        a,
        pairs(&[
            ("FirstBurstLength", "Irrelevant"),
            ("InitialR2T", "Yes"),
            ("ImmediateData", "No")
        ])
    );
    // Never above MaxBurstLength.
    let a = answers(
        LocalConfig::target(1),
        &[("FirstBurstLength", "262144"), ("MaxBurstLength", "16384")],
    );
    assert_eq!(
        a,
        pairs(&[("FirstBurstLength", "16384"), ("MaxBurstLength", "16384")])
    );
    // The initiator offers no FirstBurstLength when it would be irrelevant.
    let mut i = initiator(LocalConfig {
        immediate_data: false,
        ..LocalConfig::initiator("iqn.i", "iqn.t")
    });
    let offers = i.offer(Phase::Operational).unwrap();
    assert!(!offers.iter().any(|(k, _)| k == "FirstBurstLength"));
    // finish() catches FirstBurstLength > MaxBurstLength across PDUs.
    let mut t = target(LocalConfig::target(1));
    t.receive(Phase::Operational, &pairs(&[("FirstBurstLength", "65536")]))
        .unwrap();
    t.receive(Phase::Operational, &pairs(&[("MaxBurstLength", "4096")]))
        .unwrap();
    assert_eq!(
        t.finish(),
        Err(NegotiationError::BurstOrder {
            first: 65536,
            max: 4096
        })
    );
}

/// A target whose FirstBurstLength preference (256 KiB) is above the
/// MaxBurstLength an initiator asked for (128 KiB) offers no more than
/// that as FirstBurstLength when the initiator left it out: an initiator
/// that prefers more answers the offer, and the login then broke
/// FirstBurstLength <= MaxBurstLength (RFC 7143 §13.14) and failed.
#[test]
fn a_first_burst_offer_stays_within_the_max_burst_agreed() {
    let tcfg = LocalConfig {
        first_burst_length: 256 * 1024,
        max_burst_length: 1 << 20,
        ..LocalConfig::target(1)
    };
    let mut t = target(tcfg);
    let r = t
        .receive(
            Phase::Operational,
            &pairs(&[
                ("MaxBurstLength", "131072"),
                ("InitialR2T", "No"),
                ("ImmediateData", "Yes"),
            ]),
        )
        .unwrap();
    assert!(r
        .answers
        .contains(&("MaxBurstLength".into(), "131072".into())));
    let offers = t.offer(Phase::Operational).unwrap();
    let first = offers
        .iter()
        .find(|(k, _)| k == "FirstBurstLength")
        .map(|(_, v)| v.as_str());
    assert_eq!(first, Some("131072"), "{offers:?}");
    // The initiator, preferring 256 KiB, answers the smaller of the two;
    // the login finishes.
    t.receive(
        Phase::Operational,
        &pairs(&[("FirstBurstLength", "131072")]),
    )
    .unwrap();
    t.finish().expect("FirstBurstLength within MaxBurstLength");
    assert_eq!(t.params().first_burst_length, 131072);
}

// ---- boolean keys ---------------------------------------------------------

#[test]
fn boolean_or_and_and_results() {
    let with = |b: bool| LocalConfig {
        initial_r2t: b,
        immediate_data: b,
        data_pdu_in_order: b,
        data_sequence_in_order: b,
        rdma_extensions: b,
        ..LocalConfig::target(1)
    };
    // (key, offered, target preference, answer)
    let cases = [
        ("InitialR2T", "Yes", false, "Yes"),
        ("InitialR2T", "No", false, "No"),
        ("InitialR2T", "No", true, "Yes"),
        ("DataPDUInOrder", "No", false, "No"),
        ("DataPDUInOrder", "No", true, "Yes"),
        ("DataPDUInOrder", "Yes", false, "Yes"),
        ("DataSequenceInOrder", "No", true, "Yes"),
        ("DataSequenceInOrder", "Yes", false, "Yes"),
        ("ImmediateData", "Yes", true, "Yes"),
        ("ImmediateData", "Yes", false, "No"),
        ("ImmediateData", "No", true, "No"),
        ("RDMAExtensions", "Yes", true, "Yes"),
        ("RDMAExtensions", "Yes", false, "No"),
        ("RDMAExtensions", "No", true, "No"),
    ];
    for (key, offer, pref, want) in cases {
        assert_eq!(
            answer_of(with(pref), key, offer),
            want,
            "{key}={offer} vs {pref}"
        );
    }
}

#[test]
fn boolean_outcomes_agree_after_login() {
    let i = LocalConfig {
        initial_r2t: false,
        immediate_data: true,
        data_pdu_in_order: false,
        ..LocalConfig::initiator("iqn.i", "iqn.t")
    };
    let t = LocalConfig {
        initial_r2t: false,
        immediate_data: false,
        data_pdu_in_order: true,
        ..LocalConfig::target(1)
    };
    let p = agree(i, t);
    assert!(!p.initial_r2t);
    assert!(!p.immediate_data);
    assert!(p.data_pdu_in_order);
    assert!(p.data_sequence_in_order);
}

#[test]
fn implied_boolean_answers_are_optional_but_checked() {
    let mut i = initiator(LocalConfig {
        initial_r2t: true,
        immediate_data: false,
        ..LocalConfig::initiator("iqn.i", "iqn.t")
    });
    let offers = i.offer(Phase::Operational).unwrap();
    assert!(offers.contains(&("ImmediateData".to_string(), "No".to_string())));
    // A target answering ImmediateData=Yes to an AND offer of No breaks the rule.
    let mut i2 = i.clone();
    let err = i2
        .receive(Phase::Operational, &pairs(&[("ImmediateData", "Yes")]))
        .unwrap_err();
    assert!(
        matches!(err, NegotiationError::InvalidAnswer { ref key, .. } if key == "ImmediateData")
    );
    let mut i3 = i.clone();
    let err = i3
        .receive(Phase::Operational, &pairs(&[("InitialR2T", "No")]))
        .unwrap_err();
    assert!(matches!(err, NegotiationError::InvalidAnswer { ref key, .. } if key == "InitialR2T"));
    // Omitting those two answers is fine; omitting a required one is not.
    let all_but: TextPairs = offers
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "ImmediateData" | "InitialR2T" | "MaxRecvDataSegmentLength"
            )
        })
        .cloned()
        .collect();
    let mut i4 = i.clone();
    i4.receive(Phase::Operational, &all_but).unwrap();
    assert_eq!(i4.finish(), Ok(()));
    assert!(i4.params().initial_r2t && !i4.params().immediate_data);
    let mut i5 = i.clone();
    assert_eq!(
        i5.finish(),
        Err(NegotiationError::MissingAnswer {
            key: "HeaderDigest".into()
        })
    );
}

// ---- list keys ------------------------------------------------------------

#[test]
fn list_keys_first_match_in_offerers_order() {
    let t = |h: Vec<Digest>| LocalConfig {
        header_digests: h.clone(),
        data_digests: h,
        ..LocalConfig::target(1)
    };
    let both = vec![Digest::None, Digest::Crc32c];
    assert_eq!(
        answer_of(t(both.clone()), "HeaderDigest", "CRC32C,None"),
        "CRC32C"
    );
    assert_eq!(
        answer_of(t(both.clone()), "DataDigest", "None,CRC32C"),
        "None"
    );
    assert_eq!(
        answer_of(t(vec![Digest::None]), "HeaderDigest", "CRC32C,None"),
        "None"
    );
    assert_eq!(
        answer_of(t(vec![Digest::None]), "DataDigest", "CRC32C"),
        "Reject"
    );
    assert_eq!(
        answer_of(t(both), "HeaderDigest", "X-fancy,CRC32C"),
        "CRC32C"
    );
    let p = agree(
        LocalConfig {
            header_digests: vec![Digest::Crc32c, Digest::None],
            data_digests: vec![Digest::Crc32c],
            ..LocalConfig::initiator("iqn.i", "iqn.t")
        },
        LocalConfig {
            header_digests: vec![Digest::None, Digest::Crc32c],
            data_digests: vec![Digest::Crc32c, Digest::None],
            ..LocalConfig::target(1)
        },
    );
    assert_eq!(
        (p.header_digest, p.data_digest),
        (Digest::Crc32c, Digest::Crc32c)
    );
}

#[test]
fn auth_method_selection() {
    let chap = LocalConfig {
        auth_methods: vec![AuthMethod::Chap],
        ..LocalConfig::target(1)
    };
    let sec = |cfg: LocalConfig, v: &str| {
        target(cfg)
            .receive(Phase::Security, &pairs(&[("AuthMethod", v)]))
            .unwrap()
    };
    assert_eq!(
        sec(chap.clone(), "KRB5,SRP,CHAP,None").answers,
        pairs(&[("AuthMethod", "CHAP")])
    );
    let r = sec(chap.clone(), "SRP,SPKM1,SPKM2,KRB5");
    assert_eq!(r.answers, pairs(&[("AuthMethod", "Reject")]));
    assert_eq!(r.rejected().collect::<Vec<_>>(), ["AuthMethod"]);
    assert_eq!(
        sec(LocalConfig::target(1), "CHAP,None").answers,
        pairs(&[("AuthMethod", "None")])
    );
    // AuthMethod outside the security stage.
    assert_eq!(answer_of(chap, "AuthMethod", "CHAP"), "Reject");
    // The initiator cannot go on when its AuthMethod offer is rejected.
    let mut i = initiator(LocalConfig {
        auth_methods: vec![AuthMethod::Chap],
        ..LocalConfig::initiator("iqn.i", "iqn.t")
    });
    i.offer(Phase::Security).unwrap();
    assert!(matches!(
        i.receive(Phase::Security, &pairs(&[("AuthMethod", "Reject")])),
        Err(NegotiationError::Rejected { .. })
    ));
    // Or when the answer is not one it offered.
    let mut i = initiator(LocalConfig {
        auth_methods: vec![AuthMethod::Chap],
        ..LocalConfig::initiator("iqn.i", "iqn.t")
    });
    i.offer(Phase::Security).unwrap();
    assert!(matches!(
        i.receive(Phase::Security, &pairs(&[("AuthMethod", "None")])),
        Err(NegotiationError::InvalidAnswer { .. })
    ));
}

#[test]
fn chap_keys_pass_through_in_security_stage_only() {
    let mut t = target(LocalConfig {
        auth_methods: vec![AuthMethod::Chap],
        ..LocalConfig::target(1)
    });
    let r = t
        .receive(
            Phase::Security,
            &pairs(&[("AuthMethod", "CHAP"), ("CHAP_A", "5")]),
        )
        .unwrap();
    assert_eq!(r.answers, pairs(&[("AuthMethod", "CHAP")]));
    assert_eq!(r.passthrough, pairs(&[("CHAP_A", "5")]));
    let r = t
        .receive(
            Phase::Security,
            &pairs(&[("CHAP_N", "user"), ("CHAP_R", "0x0102")]),
        )
        .unwrap();
    assert_eq!(r.passthrough.len(), 2);
    assert_eq!(answer_of(LocalConfig::target(1), "CHAP_A", "5"), "Reject");
    assert_eq!(t.params().auth_method, AuthMethod::Chap);
}

#[test]
fn task_reporting_list() {
    let t = LocalConfig {
        task_reporting: vec![
            blockwire_pdu::keys::TaskReporting::ResponseFence,
            blockwire_pdu::keys::TaskReporting::Rfc3720,
        ],
        ..LocalConfig::target(1)
    };
    assert_eq!(
        answer_of(
            t.clone(),
            "TaskReporting",
            "FastAbort,ResponseFence,RFC3720"
        ),
        "ResponseFence"
    );
    assert_eq!(answer_of(t, "TaskReporting", "FastAbort"), "Reject");
}

// ---- declarative keys -----------------------------------------------------

#[test]
fn declarations_are_recorded_and_not_answered() {
    let mut t = target(LocalConfig::target(7));
    let r = t
        .receive(
            Phase::Security,
            &pairs(&[
                ("InitiatorName", "iqn.2026-01.org.example:i"),
                ("InitiatorAlias", "host α"),
                ("SessionType", "Normal"),
                ("TargetName", "iqn.t"),
            ]),
        )
        .unwrap();
    assert!(r.answers.is_empty() && r.passthrough.is_empty());
    let decl = t.offer(Phase::Security).unwrap();
    assert_eq!(decl, pairs(&[("TargetPortalGroupTag", "7")]));
    let r = t
        .receive(
            Phase::Operational,
            &pairs(&[
                ("MaxRecvDataSegmentLength", "0x10000"),
                ("InitiatorRecvDataSegmentLength", "262144"),
            ]),
        )
        .unwrap();
    assert!(r.answers.is_empty());
    let p = t.params();
    assert_eq!(
        p.initiator_name.as_deref(),
        Some("iqn.2026-01.org.example:i")
    );
    assert_eq!(p.initiator_alias.as_deref(), Some("host α"));
    assert_eq!(p.target_name.as_deref(), Some("iqn.t"));
    assert_eq!(p.target_portal_group_tag, Some(7));
    assert_eq!(p.initiator_max_recv_data_segment_length, 65536);
    assert_eq!(p.target_max_recv_data_segment_length, 8192);
    assert_eq!(p.initiator_recv_data_segment_length, 262144);
}

#[test]
fn senders_are_enforced() {
    // Keys only the target may send, offered by an initiator.
    for (k, v) in [
        ("TargetAlias", "x"),
        ("TargetPortalGroupTag", "1"),
        ("TargetAddress", "10.0.0.1:3260,1"),
        ("TargetRecvDataSegmentLength", "8192"),
    ] {
        assert_eq!(answer_of(LocalConfig::target(1), k, v), "Reject", "{k}");
    }
    // Keys only the initiator may send, offered by a target.
    let mut i = initiator(LocalConfig::initiator("iqn.i", "iqn.t"));
    let r = i
        .receive(
            Phase::Operational,
            &pairs(&[
                ("InitiatorName", "iqn.x"),
                ("SessionType", "Normal"),
                ("TargetPortalGroupTag", "3"),
            ]),
        )
        .unwrap();
    assert_eq!(
        r.answers,
        pairs(&[("InitiatorName", "Reject"), ("SessionType", "Reject")])
    );
    assert_eq!(i.params().target_portal_group_tag, Some(3));
}

#[test]
fn target_address_redirect_passes_through() {
    let mut i = initiator(LocalConfig::initiator("iqn.i", "iqn.t"));
    let r = i
        .receive(
            Phase::Security,
            &pairs(&[
                ("TargetAddress", "192.0.2.1:3260,1"),
                ("TargetAddress", "[2001:db8::1]:3260,1"),
            ]),
        )
        .unwrap();
    assert_eq!(r.passthrough.len(), 2);
}

// ---- phases, discovery, leading-only ---------------------------------------

#[test]
fn wrong_phase_is_rejected() {
    let mut t = target(LocalConfig::target(1));
    let r = t
        .receive(
            Phase::Security,
            &pairs(&[
                ("HeaderDigest", "None"),
                ("MaxBurstLength", "512"),
                ("SendTargets", "All"),
            ]),
        )
        .unwrap();
    assert_eq!(
        r.answers,
        pairs(&[
            ("HeaderDigest", "Reject"),
            ("MaxBurstLength", "Reject"),
            ("SendTargets", "Reject")
        ])
    );
    let mut t = target(LocalConfig::target(1));
    let r = t
        .receive(
            Phase::FullFeature,
            &pairs(&[
                ("MaxConnections", "2"),
                ("TargetName", "iqn.t"),
                ("InitiatorName", "iqn.i"),
                ("HeaderDigest", "None"),
                ("SendTargets", "All"),
                ("MaxRecvDataSegmentLength", "16384"),
            ]),
        )
        .unwrap();
    assert_eq!(
        r.answers,
        pairs(&[
            ("MaxConnections", "Reject"),
            ("TargetName", "Reject"),
            ("InitiatorName", "Reject"),
            ("HeaderDigest", "Reject")
        ])
    );
    assert_eq!(r.passthrough, pairs(&[("SendTargets", "All")]));
    assert_eq!(t.params().initiator_max_recv_data_segment_length, 16384);
    // Stages never go backwards.
    assert!(matches!(
        t.receive(Phase::Operational, &[]),
        Err(NegotiationError::PhaseOrder { .. })
    ));
}

#[test]
fn send_targets_response_passes_through_repeated_names() {
    let mut i = initiator(LocalConfig::discovery("iqn.i"));
    let r = i
        .receive(
            Phase::FullFeature,
            &pairs(&[
                ("TargetName", "iqn.a"),
                ("TargetAddress", "192.0.2.1:3260,1"),
                ("TargetName", "iqn.b"),
                ("TargetAddress", "192.0.2.2:3260,1"),
                ("TargetAddress", "192.0.2.3:3260,2"),
            ]),
        )
        .unwrap();
    assert!(r.answers.is_empty());
    assert_eq!(r.passthrough.len(), 5);
}

#[test]
fn discovery_session_makes_operational_keys_irrelevant() {
    let offers = [
        ("SessionType", "Discovery"),
        ("MaxConnections", "2"),
        ("InitialR2T", "No"),
        ("ImmediateData", "Yes"),
        ("MaxBurstLength", "512"),
        ("FirstBurstLength", "512"),
        ("MaxOutstandingR2T", "2"),
        ("DataPDUInOrder", "No"),
        ("DataSequenceInOrder", "No"),
        ("RDMAExtensions", "Yes"),
        ("ErrorRecoveryLevel", "0"),
        ("DefaultTime2Wait", "2"),
        ("HeaderDigest", "None"),
    ];
    let mut t = target(LocalConfig::target(1));
    let r = t.receive(Phase::Operational, &pairs(&offers)).unwrap();
    let want = pairs(&[
        ("MaxConnections", "Irrelevant"),
        ("InitialR2T", "Irrelevant"),
        ("ImmediateData", "Irrelevant"),
        ("MaxBurstLength", "Irrelevant"),
        ("FirstBurstLength", "Irrelevant"),
        ("MaxOutstandingR2T", "Irrelevant"),
        ("DataPDUInOrder", "Irrelevant"),
        ("DataSequenceInOrder", "Irrelevant"),
        ("RDMAExtensions", "Irrelevant"),
        ("ErrorRecoveryLevel", "0"),
        ("DefaultTime2Wait", "2"),
        ("HeaderDigest", "None"),
    ]);
    assert_eq!(r.answers, want);
    assert_eq!(t.params().session_type, SessionType::Discovery);
    // A discovery initiator does not offer them, and both sides agree.
    let p = agree(LocalConfig::discovery("iqn.i"), LocalConfig::target(1));
    assert_eq!(p.session_type, SessionType::Discovery);
    assert_eq!(p.target_name, None);
}

#[test]
fn leading_only_keys_on_a_second_connection_are_irrelevant() {
    let t = LocalConfig {
        leading: false,
        ..LocalConfig::target(1)
    };
    assert_eq!(answer_of(t.clone(), "MaxBurstLength", "4096"), "Irrelevant");
    assert_eq!(answer_of(t, "HeaderDigest", "None"), "None");
}

// ---- unknown, vendor, obsolete keys ------------------------------------------

#[test]
fn unknown_vendor_and_obsolete_keys() {
    let vendor = LocalConfig {
        vendor_keys: vec!["X-com.blockwire.RdmaOffload".into()],
        ..LocalConfig::target(1)
    };
    let mut t = target(vendor);
    let r = t
        .receive(
            Phase::Operational,
            &pairs(&[
                ("FancyKey", "1"),
                ("X-org.other.Thing", "Yes"),
                ("X#org.example.reg", "1"),
                ("X-com.blockwire.RdmaOffload", "Yes"),
                ("OFMarker", "Yes"),
                ("IFMarker", "No"),
                ("OFMarkInt", "2048~8192"),
                ("IFMarkInt", "2048"),
            ]),
        )
        .unwrap();
    assert_eq!(
        r.answers,
        pairs(&[
            ("FancyKey", "NotUnderstood"),
            ("X-org.other.Thing", "NotUnderstood"),
            ("X#org.example.reg", "NotUnderstood"),
            ("OFMarker", "No"),
            ("IFMarker", "No"),
            ("OFMarkInt", "Reject"),
            ("IFMarkInt", "Reject"),
        ])
    );
    assert_eq!(
        r.passthrough,
        pairs(&[("X-com.blockwire.RdmaOffload", "Yes")])
    );
}

#[test]
fn initiator_keeps_defaults_on_not_understood_irrelevant_reject() {
    let mut i = initiator(LocalConfig {
        max_burst_length: 1 << 20,
        error_recovery_level: 2,
        data_sequence_in_order: false,
        ..LocalConfig::initiator("iqn.i", "iqn.t")
    });
    let offers = i.offer(Phase::Operational).unwrap();
    let replies: TextPairs = offers
        .iter()
        .filter(|(k, _)| {
            k != "MaxRecvDataSegmentLength"
                && k != "InitiatorName"
                && k != "SessionType"
                && k != "TargetName"
        })
        .map(|(k, _)| {
            let v = match k.as_str() {
                "MaxBurstLength" => "NotUnderstood",
                "ErrorRecoveryLevel" => "Reject",
                _ => "Irrelevant",
            };
            (k.clone(), v.to_string())
        })
        .collect();
    i.receive(Phase::Operational, &replies).unwrap();
    i.finish().unwrap();
    assert_eq!(i.params().max_burst_length, 262144);
    assert_eq!(i.params().error_recovery_level, 0);
}

// ---- each key exactly once ----------------------------------------------------

/// LIO's iSER target repeats TargetRecvDataSegmentLength (and echoes
/// InitiatorRecvDataSegmentLength) in every operational Login Response: an
/// initiator takes the repeated declaration; other keys stay once only.
#[test]
fn iser_data_segment_lengths_may_be_declared_again_by_the_target() {
    let mut cfg = LocalConfig::initiator("iqn.i", "iqn.t");
    cfg.rdma_extensions = true;
    let mut i = initiator(cfg);
    i.offer(Phase::Operational).unwrap();
    for _ in 0..2 {
        i.receive(
            Phase::Operational,
            &pairs(&[
                ("TargetRecvDataSegmentLength", "8192"),
                ("InitiatorRecvDataSegmentLength", "8192"),
            ]),
        )
        .unwrap();
    }
    assert!(matches!(
        i.receive(
            Phase::Operational,
            &pairs(&[
                ("MaxRecvDataSegmentLength", "8192"),
                ("MaxRecvDataSegmentLength", "8192")
            ])
        ),
        Err(NegotiationError::Duplicate { .. })
    ));
    // The initiator sends TargetRecvDataSegmentLength back (LIO waits for it), and a
    // target takes that echo of its own declaration silently.
    let mut cfg = LocalConfig::initiator("iqn.i", "iqn.t");
    cfg.rdma_extensions = true;
    let mut i = initiator(cfg);
    i.offer(Phase::Operational).unwrap();
    let r = i
        .receive(
            Phase::Operational,
            &pairs(&[("TargetRecvDataSegmentLength", "4096")]),
        )
        .unwrap();
    assert_eq!(
        r.answers,
        pairs(&[("TargetRecvDataSegmentLength", "4096")]),
        "echoed"
    );
    assert_eq!(i.params().target_recv_data_segment_length, 4096);
    let mut tcfg = LocalConfig::target(1);
    tcfg.rdma_extensions = true;
    let mut t = target(tcfg);
    let declared = t.offer(Phase::Operational).unwrap();
    assert!(declared
        .iter()
        .any(|(k, _)| k == "TargetRecvDataSegmentLength"));
    let r = t
        .receive(
            Phase::Operational,
            &pairs(&[("TargetRecvDataSegmentLength", "8192")]),
        )
        .unwrap();
    assert!(r.answers.is_empty(), "{:?}", r.answers);
    // A target may say it did not understand our declaration: nothing to answer.
    let mut cfg = LocalConfig::initiator("iqn.i", "iqn.t");
    cfg.rdma_extensions = true;
    let mut i = initiator(cfg);
    i.offer(Phase::Operational).unwrap();
    i.receive(
        Phase::Operational,
        &pairs(&[("InitiatorRecvDataSegmentLength", "NotUnderstood")]),
    )
    .unwrap();
    // NotUnderstood for a key nobody declared or offered is still a protocol error.
    let mut i = initiator(LocalConfig::initiator("iqn.i", "iqn.t"));
    i.offer(Phase::Operational).unwrap();
    assert!(matches!(
        i.receive(
            Phase::Operational,
            &pairs(&[("InitiatorRecvDataSegmentLength", "NotUnderstood")])
        ),
        Err(NegotiationError::UnexpectedAnswer { .. })
    ));
}

#[test]
fn duplicate_keys_are_protocol_errors() {
    let mut t = target(LocalConfig::target(1));
    assert_eq!(
        t.receive(
            Phase::Operational,
            &pairs(&[("MaxBurstLength", "4096"), ("MaxBurstLength", "8192")])
        ),
        Err(NegotiationError::Duplicate {
            key: "MaxBurstLength".into()
        })
    );
    let mut t = target(LocalConfig::target(1));
    t.receive(Phase::Security, &pairs(&[("InitiatorName", "iqn.i")]))
        .unwrap();
    assert_eq!(
        t.receive(Phase::Operational, &pairs(&[("InitiatorName", "iqn.i")])),
        Err(NegotiationError::Duplicate {
            key: "InitiatorName".into()
        })
    );
    // An answer may not come twice either.
    let mut i = initiator(LocalConfig::initiator("iqn.i", "iqn.t"));
    i.offer(Phase::Operational).unwrap();
    i.receive(Phase::Operational, &pairs(&[("MaxBurstLength", "4096")]))
        .unwrap();
    assert!(matches!(
        i.receive(Phase::Operational, &pairs(&[("MaxBurstLength", "4096")])),
        Err(NegotiationError::Duplicate { .. })
    ));
    // Full feature text exchanges are separate negotiations.
    let mut t = target(LocalConfig::target(1));
    t.receive(
        Phase::FullFeature,
        &pairs(&[("MaxRecvDataSegmentLength", "16384")]),
    )
    .unwrap();
    t.start_text_exchange();
    t.receive(
        Phase::FullFeature,
        &pairs(&[("MaxRecvDataSegmentLength", "32768")]),
    )
    .unwrap();
    assert_eq!(t.params().initiator_max_recv_data_segment_length, 32768);
}

/// Every distinct key a peer sends is remembered for the negotiation (no
/// key may come twice): past MAX_DISTINCT_KEYS made-up ones, spread over
/// requests as a login's continued text is, the negotiation fails, where
/// each was kept for the connection's life. A new text exchange starts
/// counting afresh, and a SendTargets answer's repeated TargetName and
/// TargetAddress keys are not counted.
#[test]
fn a_negotiation_holds_no_more_than_max_distinct_keys() {
    let made_up: Vec<(String, String)> = (0..MAX_DISTINCT_KEYS + 1)
        .map(|k| (format!("X-made.up.{k}"), "Reject".to_owned()))
        .collect();
    let mut t = target(LocalConfig::target(1));
    t.receive(Phase::Operational, &made_up[..MAX_DISTINCT_KEYS / 2])
        .unwrap();
    t.receive(
        Phase::Operational,
        &made_up[MAX_DISTINCT_KEYS / 2..MAX_DISTINCT_KEYS],
    )
    .unwrap();
    assert_eq!(
        t.receive(Phase::Operational, &made_up[MAX_DISTINCT_KEYS..]),
        Err(NegotiationError::TooManyKeys {
            limit: MAX_DISTINCT_KEYS
        })
    );
    t.start_text_exchange();
    t.receive(Phase::FullFeature, &made_up[..MAX_DISTINCT_KEYS])
        .unwrap();
    // An initiator reading a SendTargets answer of many targets.
    let mut i = initiator(LocalConfig::initiator("iqn.i", "iqn.t"));
    i.offer(Phase::Operational).unwrap();
    i.start_text_exchange();
    let listing: Vec<(String, String)> = (0..2 * MAX_DISTINCT_KEYS)
        .flat_map(|k| {
            [
                ("TargetName".to_owned(), format!("iqn.2026-12.test:t{k}")),
                ("TargetAddress".to_owned(), format!("127.0.0.1:3260,{k}")),
            ]
        })
        .collect();
    i.receive(Phase::FullFeature, &listing).unwrap();
}

#[test]
fn answers_are_sent_once_and_offers_not_repeated() {
    let mut t = target(LocalConfig {
        immediate_data: false,
        ..LocalConfig::target(1)
    });
    let r = t
        .receive(Phase::Operational, &pairs(&[("ImmediateData", "Yes")]))
        .unwrap();
    assert_eq!(r.answers, pairs(&[("ImmediateData", "No")]));
    // The target does not also offer ImmediateData, and declares MRDSL once.
    let o = t.offer(Phase::Operational).unwrap();
    assert!(!o.iter().any(|(k, _)| k == "ImmediateData"));
    assert!(o.iter().any(|(k, _)| k == "MaxRecvDataSegmentLength"));
    assert!(t.offer(Phase::Operational).unwrap().is_empty());
}

#[test]
fn initiator_checks_numeric_answers() {
    let mut base = initiator(LocalConfig {
        max_burst_length: 65536,
        default_time2wait: 10,
        ..LocalConfig::initiator("iqn.i", "iqn.t")
    });
    base.offer(Phase::Operational).unwrap();
    let bad = [
        ("MaxBurstLength", "262144"),
        ("MaxBurstLength", "100"),
        ("MaxBurstLength", "x"),
        ("DefaultTime2Wait", "5"),
        ("ErrorRecoveryLevel", "1"),
        ("HeaderDigest", "CRC32C"),
        ("DataPDUInOrder", "Maybe"),
    ];
    for (k, v) in bad {
        let mut i = base.clone();
        assert!(
            matches!(
                i.receive(Phase::Operational, &pairs(&[(k, v)])),
                Err(NegotiationError::InvalidAnswer { .. })
            ),
            "{k}={v}"
        );
    }
    let mut i = base.clone();
    i.receive(
        Phase::Operational,
        &pairs(&[("MaxBurstLength", "4096"), ("DefaultTime2Wait", "20")]),
    )
    .unwrap();
    assert_eq!(
        (i.params().max_burst_length, i.params().default_time2wait),
        (4096, 20)
    );
    // An answer constant for a key never offered is a protocol error.
    let mut t = target(LocalConfig::target(1));
    assert!(matches!(
        t.receive(Phase::Operational, &pairs(&[("MaxConnections", "Reject")])),
        Err(NegotiationError::UnexpectedAnswer { .. })
    ));
}

#[test]
fn invalid_config_is_refused() {
    for cfg in [
        LocalConfig {
            max_burst_length: 100,
            ..LocalConfig::default()
        },
        LocalConfig {
            first_burst_length: 300_000,
            ..LocalConfig::default()
        },
        LocalConfig {
            error_recovery_level: 3,
            ..LocalConfig::default()
        },
        LocalConfig {
            max_outstanding_unexpected_pdus: 1,
            ..LocalConfig::default()
        },
        LocalConfig {
            header_digests: vec![],
            ..LocalConfig::default()
        },
        LocalConfig {
            initiator_name: Some(String::new()),
            ..LocalConfig::default()
        },
    ] {
        assert!(matches!(
            Negotiator::new(Role::Initiator, cfg),
            Err(NegotiationError::InvalidConfig { .. })
        ));
    }
}

// ---- whole logins -------------------------------------------------------------

#[test]
fn default_login_gives_rfc_defaults_plus_names() {
    let p = agree(
        LocalConfig::initiator("iqn.i", "iqn.t"),
        LocalConfig::target(1),
    );
    let want = SessionParams {
        initiator_name: Some("iqn.i".into()),
        target_name: Some("iqn.t".into()),
        target_portal_group_tag: Some(1),
        ..SessionParams::default()
    };
    assert_eq!(p, want);
}

#[test]
fn full_login_with_chap_digests_and_iser() {
    let i = LocalConfig {
        initiator_alias: Some("host".into()),
        auth_methods: vec![AuthMethod::Chap, AuthMethod::None],
        header_digests: vec![Digest::Crc32c, Digest::None],
        data_digests: vec![Digest::None],
        max_connections: 8,
        initial_r2t: false,
        max_recv_data_segment_length: 262144,
        max_burst_length: 1 << 20,
        first_burst_length: 1 << 18,
        default_time2retain: 0,
        max_outstanding_r2t: 4,
        error_recovery_level: 2,
        rdma_extensions: true,
        rdma_recv_data_segment_length: 1 << 17,
        max_outstanding_unexpected_pdus: 32,
        ..LocalConfig::initiator(
            "iqn.2026-01.org.example:init",
            "iqn.2026-01.org.example:tgt",
        )
    };
    let t = LocalConfig {
        target_alias: Some("disk".into()),
        auth_methods: vec![AuthMethod::Chap],
        header_digests: vec![Digest::None, Digest::Crc32c],
        data_digests: vec![Digest::None, Digest::Crc32c],
        max_connections: 4,
        initial_r2t: false,
        max_recv_data_segment_length: 65536,
        max_burst_length: 1 << 19,
        first_burst_length: 1 << 16,
        default_time2wait: 4,
        max_outstanding_r2t: 16,
        error_recovery_level: 1,
        iscsi_protocol_level: 0,
        rdma_extensions: true,
        rdma_recv_data_segment_length: 1 << 16,
        ..LocalConfig::target(3)
    };
    let p = agree(i, t);
    assert_eq!(p.auth_method, AuthMethod::Chap);
    assert_eq!(
        (p.header_digest, p.data_digest),
        (Digest::Crc32c, Digest::None)
    );
    assert_eq!(p.max_connections, 4);
    assert!(!p.initial_r2t && p.immediate_data);
    assert_eq!(p.initiator_max_recv_data_segment_length, 262144);
    assert_eq!(p.target_max_recv_data_segment_length, 65536);
    assert_eq!(
        (p.max_burst_length, p.first_burst_length),
        (1 << 19, 1 << 16)
    );
    assert_eq!((p.default_time2wait, p.default_time2retain), (4, 0));
    assert_eq!((p.max_outstanding_r2t, p.error_recovery_level), (4, 1));
    // Target-initiated offer of a key the initiator left at its default.
    assert_eq!(p.iscsi_protocol_level, 0);
    assert!(p.rdma_extensions);
    assert_eq!(
        (
            p.initiator_recv_data_segment_length,
            p.target_recv_data_segment_length
        ),
        (1 << 17, 1 << 16)
    );
    assert_eq!(p.max_outstanding_unexpected_pdus, 32);
    assert_eq!(p.target_alias.as_deref(), Some("disk"));
    assert_eq!(p.initiator_alias.as_deref(), Some("host"));
    assert_eq!(p.target_portal_group_tag, Some(3));
}

#[test]
fn target_initiated_offer_is_answered_by_initiator() {
    // The initiator does not support iSER; the target offers it anyway.
    let t = LocalConfig {
        rdma_extensions: true,
        ..LocalConfig::target(1)
    };
    let (ini, tgt) = login(LocalConfig::initiator("iqn.i", "iqn.t"), t);
    assert!(!ini.params().rdma_extensions);
    assert_eq!(ini.params(), tgt.params());
}

#[test]
fn responses_helper() {
    let r = Responses::default();
    assert_eq!(r.rejected().count(), 0);
}
