use super::*;
use blockwire_pdu::isns::flag;
use proptest::prelude::*;
use std::net::{IpAddr, Ipv4Addr};

fn answer(code: u32, ops: Vec<Attr>) -> Message {
    let mut attrs = vec![
        Attr::u32(tag::ISCSI_NODE_TYPE, node_type::TARGET),
        Attr::empty(tag::DELIMITER),
    ];
    attrs.extend(ops);
    Message {
        function: function::DEV_ATTR_QRY | function::RESPONSE,
        flags: flag::SERVER,
        transaction: 1,
        status: Some(code),
        attrs,
    }
}

fn group(name: &str, ip: [u8; 4], port: u32, pgt: Option<u32>) -> Vec<Attr> {
    vec![
        Attr::string(tag::PG_ISCSI_NAME, name),
        Attr::ip(tag::PG_PORTAL_IP_ADDRESS, IpAddr::V4(Ipv4Addr::from(ip))),
        Attr::u32(tag::PG_PORTAL_PORT, port),
        match pgt {
            Some(t) => Attr::u32(tag::PG_TAG, t),
            None => Attr::empty(tag::PG_TAG),
        },
    ]
}

#[test]
fn the_query_asks_for_targets_and_their_portal_groups() {
    let q = targets_query("iqn.2026-12.io.blockwire:host", 9);
    assert_eq!(q.function, function::DEV_ATTR_QRY);
    assert_eq!(q.transaction, 9);
    let tags: Vec<u32> = q.attrs.iter().map(|a| a.tag).collect();
    assert_eq!(tags, [32, 33, 0, 32, 33, 48, 49, 50, 51]);
    assert_eq!(q.attrs[0].as_str(), Some("iqn.2026-12.io.blockwire:host"));
    assert_eq!(q.attrs[1].as_u32(), Some(node_type::TARGET));
    assert!(q.attrs[3..].iter().all(|a| a.value.is_empty()));
    assert!(q.encode().is_ok());
}

#[test]
fn portal_groups_with_a_tag_are_portals_and_null_ones_are_not() {
    let a = "iqn.2026-12.io.blockwire:a";
    let b = "iqn.2026-12.io.blockwire:b";
    let mut ops = vec![
        Attr::string(tag::ISCSI_NAME, a),
        Attr::u32(tag::ISCSI_NODE_TYPE, node_type::TARGET),
        Attr::string(tag::ISCSI_NAME, b),
        Attr::u32(tag::ISCSI_NODE_TYPE, node_type::TARGET),
    ];
    ops.extend(group(a, [127, 0, 0, 1], 3260, Some(1)));
    ops.extend(group(a, [127, 0, 0, 2], 3260, Some(2)));
    ops.extend(group(b, [127, 0, 0, 1], 3260, None));
    ops.extend(group(b, [127, 0, 0, 2], 3260, Some(2)));
    // The same group twice is one portal.
    ops.extend(group(b, [127, 0, 0, 2], 3260, Some(2)));
    let list = parse_targets(&answer(0, ops)).unwrap();
    let portal = |h: &str, tpgt| Portal {
        host: h.into(),
        port: 3260,
        tpgt,
    };
    assert_eq!(
        list.targets,
        [
            DiscoveredTarget {
                name: a.into(),
                portals: vec![portal("127.0.0.1", 1), portal("127.0.0.2", 2)],
            },
            DiscoveredTarget {
                name: b.into(),
                portals: vec![portal("127.0.0.2", 2)],
            },
        ]
    );
    assert!(list.refused.is_empty(), "{:?}", list.refused);
}

#[test]
fn what_cannot_be_a_node_record_is_left_out_and_said() {
    let mut ops = Vec::new();
    ops.extend(group(
        "iqn.2026-12.io.x:../../etc",
        [10, 0, 0, 1],
        3260,
        Some(1),
    ));
    ops.extend(group(
        "iqn.2026-12.io.x:t",
        [10, 0, 0, 1],
        3260,
        Some(70_000),
    ));
    ops.extend(group(
        "iqn.2026-12.io.x:t",
        [10, 0, 0, 1],
        (1 << 16) | 3260,
        Some(1),
    ));
    ops.push(Attr::u32(tag::PG_TAG, 1));
    ops.extend(group("iqn.2026-12.io.x:ok", [10, 0, 0, 1], 3261, Some(3)));
    let list = parse_targets(&answer(0, ops)).unwrap();
    assert_eq!(list.targets.len(), 1);
    assert_eq!(list.targets[0].portals[0].to_string(), "10.0.0.1:3261,3");
    assert_eq!(list.refused.len(), 4, "{:?}", list.refused);
    let e = parse_targets(&answer(6, vec![])).unwrap_err();
    assert!(e.contains("status 6 (Source Unknown)"), "{e}");
}

proptest! {
    #[test]
    fn any_answer_is_read_or_refused_without_panicking(
        code in 0u32..3,
        ops in prop::collection::vec((prop::sample::select(vec![0u32, 32, 33, 48, 49, 50, 51]), prop::collection::vec(any::<u8>(), 0..20)), 0..30),
    ) {
        let ops = ops.into_iter().map(|(tag, value)| Attr { tag, value }).collect();
        if let Ok(list) = parse_targets(&answer(code, ops)) {
            for t in &list.targets {
                prop_assert!(!t.portals.is_empty());
                prop_assert!(check_peer_name(&t.name).is_ok());
            }
        }
    }
}

/// A server that answers only registered sources (as Microsoft's iSNS
/// server is reported to): the initiator registers, asks again, and
/// deregisters. Scripted on loopback: no such server runs here.
#[tokio::test]
async fn a_server_that_wants_the_source_registered_gets_it_for_the_query() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut reader = MessageReader::new();
        let mut buf = [0u8; 4096];
        let mut seen = Vec::new();
        let mut registered = false;
        while seen.len() < 4 {
            let m = loop {
                if let Some(m) = reader.next_message().unwrap() {
                    break m;
                }
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0, "closed after {seen:?}");
                reader.feed(&buf[..n]);
            };
            seen.push(m.function);
            let answer = match m.function {
                function::DEV_ATTR_QRY if !registered => answer(6, vec![]),
                function::DEV_ATTR_QRY => answer(
                    0,
                    group("iqn.2026-12.io.x:t", [127, 0, 0, 1], 3260, Some(1)),
                ),
                function::DEV_ATTR_REG => {
                    assert_eq!(
                        m.attr(tag::ISCSI_NODE_TYPE).and_then(Attr::as_u32),
                        Some(node_type::INITIATOR)
                    );
                    registered = true;
                    answer(0, vec![])
                }
                function::DEV_DEREG => answer(0, vec![]),
                other => panic!("unexpected {other:#x}"),
            };
            let answer = Message {
                function: m.function | function::RESPONSE,
                transaction: m.transaction,
                ..answer
            };
            s.write_all(&answer.encode().unwrap()).await.unwrap();
        }
        seen
    });
    let config = InitiatorConfig::new("iqn.2026-12.io.blockwire:host");
    let list = discover_isns(&config, &addr).await.unwrap();
    assert_eq!(list.targets.len(), 1);
    assert_eq!(list.targets[0].portals[0].to_string(), "127.0.0.1:3260,1");
    assert_eq!(
        server.await.unwrap(),
        [
            function::DEV_ATTR_QRY,
            function::DEV_ATTR_REG,
            function::DEV_ATTR_QRY,
            function::DEV_DEREG
        ]
    );
}

#[test]
fn the_walk_asks_for_the_next_target_and_then_its_portal_groups() {
    let first = next_target_query("iqn.2026-12.io.blockwire:host", None, 3);
    assert_eq!(first.function, function::DEV_GET_NEXT);
    let tags: Vec<u32> = first.attrs.iter().map(|a| a.tag).collect();
    assert_eq!(tags, [32, 32, 0, 33]);
    assert!(
        first.attrs[1].value.is_empty(),
        "the first asks from no node"
    );
    assert_eq!(first.attrs[3].as_u32(), Some(node_type::TARGET));
    let next = next_target_query(
        "iqn.2026-12.io.blockwire:host",
        Some("iqn.2026-12.io.x:t"),
        4,
    );
    assert_eq!(next.attrs[1].as_str(), Some("iqn.2026-12.io.x:t"));
    let q = portal_groups_query("iqn.2026-12.io.blockwire:host", "iqn.2026-12.io.x:t", 5);
    let tags: Vec<u32> = q.attrs.iter().map(|a| a.tag).collect();
    assert_eq!(tags, [32, 32, 0, 48, 49, 50, 51]);
    // The node an answer names, and whether it is a target.
    let mut a = answer(0, vec![]);
    a.attrs = vec![
        Attr::string(tag::ISCSI_NAME, "iqn.2026-12.io.x:i"),
        Attr::empty(tag::DELIMITER),
        Attr::u32(tag::ISCSI_NODE_TYPE, node_type::INITIATOR),
    ];
    assert_eq!(next_node(&a), Some(("iqn.2026-12.io.x:i".into(), false)));
    a.attrs.truncate(2);
    assert_eq!(next_node(&a), Some(("iqn.2026-12.io.x:i".into(), true)));
    a.attrs.clear();
    assert_eq!(next_node(&a), None);
}
