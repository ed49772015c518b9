//! An iSNS server's answer to the initiator's portal-group query (RFC 4171
//! DevAttrQry), as arbitrary attributes: the portal groups' node names,
//! addresses, ports and tags in any order, lengths and values, with or
//! without the delimiter and with any status. Whatever the server sends,
//! the targets kept have names that can name a file and hosts that are
//! hosts, each with at least one portal and none twice, no more portals
//! than tagged groups, and every tagged group is kept or said to be left
//! out. An answer with a failing status is refused as a whole.
#![no_main]

use blockwire_initiator::isns::parse_targets;
use blockwire_pdu::isns::{function, status, tag, Attr, Message};
use blockwire_pdu::keys::{check_peer_name, check_portal_host};
use libfuzzer_sys::fuzz_target;

/// The tags the reader looks at, the delimiter, and one it ignores.
const TAGS: [u32; 6] = [
    tag::PG_ISCSI_NAME,
    tag::PG_PORTAL_IP_ADDRESS,
    tag::PG_PORTAL_PORT,
    tag::PG_TAG,
    tag::DELIMITER,
    tag::PG_INDEX,
];

fuzz_target!(|input: &[u8]| {
    let Some((&code, mut rest)) = input.split_first() else {
        return;
    };
    // Status 0 (successful) most of the time; now and then another.
    let code = if code < 0xf0 {
        status::SUCCESSFUL
    } else {
        u32::from(code & 0x0f)
    };
    let mut attrs = Vec::new();
    // Each attribute: a tag choice, a value length, the value's bytes.
    while let [pick, len, tail @ ..] = rest {
        let len = usize::from(*len).min(tail.len());
        let (value, after) = tail.split_at(len);
        attrs.push(Attr {
            tag: TAGS[usize::from(*pick) % TAGS.len()],
            value: value.to_vec(),
        });
        rest = after;
    }
    let tagged = attrs
        .iter()
        .position(|a| a.tag == tag::DELIMITER)
        .map_or(&attrs[..], |i| &attrs[i + 1..])
        .iter()
        .filter(|a| a.tag == tag::PG_TAG && a.as_u32().is_some())
        .count();
    let answer = Message {
        function: function::DEV_ATTR_QRY | function::RESPONSE,
        flags: 0,
        transaction: 1,
        status: Some(code),
        attrs,
    };
    let list = match parse_targets(&answer) {
        Ok(list) => list,
        Err(why) => {
            assert_ne!(
                code,
                status::SUCCESSFUL,
                "a successful answer refused: {why}"
            );
            return;
        }
    };
    assert_eq!(code, status::SUCCESSFUL, "status {code} read as a list");
    let portals: usize = list.targets.iter().map(|t| t.portals.len()).sum();
    assert!(
        portals <= tagged,
        "{portals} portals from {tagged} tagged groups"
    );
    assert!(list.refused.len() <= tagged);
    assert!(
        tagged == 0 || portals + list.refused.len() > 0,
        "tagged groups neither kept nor said"
    );
    for (i, t) in list.targets.iter().enumerate() {
        check_peer_name(&t.name).expect("a kept name names a file");
        assert!(
            !list.targets[..i].iter().any(|o| o.name == t.name),
            "{} listed twice",
            t.name
        );
        assert!(!t.portals.is_empty());
        for (j, p) in t.portals.iter().enumerate() {
            check_portal_host(&p.host).expect("a kept host is a host");
            assert!(
                !t.portals[..j].contains(p),
                "portal {p} of {} twice",
                t.name
            );
        }
    }
});
