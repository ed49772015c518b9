//! A discovery target's SendTargets answer (RFC 7143 Appendix C), as arbitrary text
//! and as arbitrary TargetAddress values. Whatever a target lists, the names and hosts
//! kept are ones that can name a file (the CLI's node database keeps
//! `nodes/<TargetName>/<host>,<port>,<tpgt>`), every name left out is said, and a kept
//! portal reads back from its own `HOST:PORT,TPGT` form.
#![no_main]

use blockwire_initiator::{parse_send_targets, parse_target_address, Portal};
use blockwire_pdu::keys::{check_peer_name, check_portal_host, parse_text};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let discovery = Portal {
        host: "127.0.0.1".into(),
        port: 3260,
        tpgt: 1,
    };
    if let Ok(text) = std::str::from_utf8(bytes) {
        if let Ok(p) = parse_target_address(text, &discovery) {
            check_portal_host(&p.host).expect("a kept host is a host");
            assert_eq!(parse_target_address(&p.to_string(), &discovery), Ok(p));
        }
    }
    let Ok(pairs) = parse_text(bytes) else { return };
    let list = parse_send_targets(&pairs, &discovery);
    let names = pairs.iter().filter(|(k, _)| k == "TargetName").count();
    assert!(list.targets.len() <= names);
    assert!(list.targets.len() + list.refused.len() >= names, "a name left out unsaid");
    for t in &list.targets {
        check_peer_name(&t.name).expect("a kept name names a file");
        assert!(!t.portals.is_empty());
        for p in &t.portals {
            check_portal_host(&p.host).expect("a kept host is a host");
            assert_eq!(parse_target_address(&p.to_string(), &discovery).as_ref(), Ok(p));
        }
    }
});
