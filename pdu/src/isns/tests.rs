use super::*;
use proptest::prelude::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// tgtd 1.0.85's DevAttrReg of one target on 127.0.0.1:3260, captured on
/// loopback with tshark.
const TGTD_DEV_ATTR_REG: &str = "0001000100c09c0000010000000000200000001c69716e2e323032362d31322e696f2e746573743a7467743100000000000000010000000c3132372e302e302e310000000000000000000000000000010000000c3132372e302e302e31000000000000020000000400000002000000100000001000000000000000000000ffff7f000001000000110000000400000cbc000000170000000400009c43000000200000001c69716e2e323032362d31322e696f2e746573743a7467743100000000000000210000000400000001";

/// open-isns 0.101's (isnsd) answer to it.
const ISNSD_DEV_ATTR_REG_RSP: &str = "0001800100b84c000001000000000000000000010000000c3132372e302e302e310000000000000000000000000000010000000c3132372e302e302e31000000000000020000000400000002000000060000000400000258000000100000001000000000000000000000ffff7f000001000000110000000400000cbc000000170000000400009c43000000160000000400000002000000200000001c69716e2e323032362d31322e696f2e746573743a7467743100000000000000210000000400000001";

#[test]
fn server_addresses_get_the_isns_port() {
    assert_eq!(server_address("192.0.2.7").unwrap(), "192.0.2.7:3205");
    assert_eq!(server_address("192.0.2.7:4000").unwrap(), "192.0.2.7:4000");
    assert_eq!(server_address("isns.example").unwrap(), "isns.example:3205");
    assert_eq!(
        server_address("isns.example:13205").unwrap(),
        "isns.example:13205"
    );
    assert_eq!(server_address("[::1]").unwrap(), "[::1]:3205");
    assert_eq!(server_address("[::1]:9").unwrap(), "[::1]:9");
    assert_eq!(server_address("::1").unwrap(), "[::1]:3205");
    for bad in ["", "host:0", "host:x", "a b", "[zz]", ":3205"] {
        assert!(server_address(bad).is_err(), "{bad:?} taken");
    }
}

fn read_one(bytes: &[u8]) -> Message {
    let mut r = MessageReader::new();
    r.feed(bytes);
    let m = r.next_message().unwrap().expect("a whole message");
    assert_eq!(r.buffered(), 0);
    m
}

#[test]
fn a_real_registration_and_its_answer_decode_and_encode_byte_for_byte() {
    let bytes = hex(TGTD_DEV_ATTR_REG);
    let reg = read_one(&bytes);
    assert_eq!(reg.function, function::DEV_ATTR_REG);
    assert_eq!(reg.flags, flag::CLIENT | flag::REPLACE);
    assert_eq!(reg.status, None);
    let tags: Vec<u32> = reg.attrs.iter().map(|a| a.tag).collect();
    assert_eq!(tags, [32, 1, 0, 1, 2, 16, 17, 23, 32, 33]);
    assert_eq!(reg.attrs[0].as_str(), Some("iqn.2026-12.io.test:tgt1"));
    assert_eq!(reg.attrs[1].as_str(), Some("127.0.0.1"));
    assert_eq!(reg.attrs[4].as_u32(), Some(ENTITY_PROTOCOL_ISCSI));
    assert_eq!(
        reg.attrs[5].as_ip(),
        Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)))
    );
    assert_eq!(reg.attrs[6].as_port(), Some((3260, false)));
    assert_eq!(reg.attrs[9].as_u32(), Some(node_type::TARGET));
    assert_eq!(reg.encode().unwrap(), bytes);

    let bytes = hex(ISNSD_DEV_ATTR_REG_RSP);
    let rsp = read_one(&bytes);
    assert!(rsp.is_response());
    assert_eq!(rsp.function, function::DEV_ATTR_REG | function::RESPONSE);
    assert_eq!(rsp.flags, flag::SERVER);
    assert_eq!(rsp.status, Some(status::SUCCESSFUL));
    assert_eq!(
        rsp.attr(tag::REGISTRATION_PERIOD).and_then(Attr::as_u32),
        Some(600)
    );
    assert_eq!(rsp.attr(tag::PORTAL_INDEX).and_then(Attr::as_u32), Some(2));
    assert_eq!(rsp.encode().unwrap(), bytes);
}

#[test]
fn values_are_built_as_the_rfc_lays_them_out() {
    // NUL-terminated and padded to four bytes.
    assert_eq!(Attr::string(32, "abc").value, b"abc\0");
    assert_eq!(Attr::string(32, "abcd").value, b"abcd\0\0\0\0");
    assert_eq!(Attr::string(32, "").value, b"\0\0\0\0");
    // IPv4 mapped into IPv6, and back.
    let a = Attr::ip(16, IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)));
    assert_eq!(a.value[..12], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
    assert_eq!(a.value[12..], [10, 1, 2, 3]);
    assert_eq!(a.as_ip(), Some(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3))));
    let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
    assert_eq!(Attr::ip(16, v6).as_ip(), Some(v6));
    // The UDP flag is the low bit of the word's upper half.
    assert_eq!(Attr::tcp_port(17, 3260).value, [0, 0, 0x0c, 0xbc]);
    let udp = Attr::u32(17, (1 << 16) | 3205);
    assert_eq!(udp.as_port(), Some((3205, true)));
    // Wrong sizes are not read as numbers or addresses.
    assert_eq!(
        Attr::string(6, "x").as_u32(),
        Some(u32::from_be_bytes(*b"x\0\0\0"))
    );
    assert_eq!(Attr::empty(51).as_u32(), None);
    assert_eq!(Attr::u32(16, 1).as_ip(), None);
}

#[test]
fn lengths_from_the_wire_are_checked_before_use() {
    // An attribute claiming more bytes than its message has.
    let mut bytes = Message::request(function::DEV_ATTR_QRY, 7, vec![Attr::u32(6, 1)])
        .encode()
        .unwrap();
    bytes[HEADER_LEN + 7] = 200;
    let mut r = MessageReader::new();
    r.feed(&bytes);
    assert_eq!(
        r.next_message(),
        Err(IsnsError::AttrOverrun {
            tag: 6,
            len: 200,
            left: 4
        })
    );
    // A response too short for its status.
    let h = Header {
        version: VERSION,
        function: function::DEV_DEREG | function::RESPONSE,
        length: 2,
        flags: flag::SERVER | flag::FIRST_PDU | flag::LAST_PDU,
        transaction: 1,
        sequence: 0,
    };
    let mut bytes = h.encode().to_vec();
    bytes.extend_from_slice(&[0, 0]);
    let mut r = MessageReader::new();
    r.feed(&bytes);
    assert_eq!(r.next_message(), Err(IsnsError::NoStatus("DevDereg")));
    // Another version.
    let mut r = MessageReader::new();
    r.feed(&[0, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(r.next_message(), Err(IsnsError::Version(2)));
    // A message signed by the server is refused, not misread.
    let mut bytes = Message::request(function::ESI, 1, vec![]).encode().unwrap();
    bytes[6] |= (flag::AUTH >> 8) as u8;
    let mut r = MessageReader::new();
    r.feed(&bytes);
    assert_eq!(r.next_message(), Err(IsnsError::Authenticated));
    // Nothing longer than one PDU is encoded.
    let big = Message::request(
        function::DEV_ATTR_REG,
        1,
        vec![Attr {
            tag: 32,
            value: vec![0; MAX_PDU_PAYLOAD],
        }],
    );
    assert!(matches!(big.encode(), Err(IsnsError::TooLong(_))));
}

/// Splits `m`'s payload into PDUs of at most `chunk` bytes.
fn as_pdus(m: &Message, chunk: usize) -> Vec<u8> {
    let one = m.encode().unwrap();
    let payload = &one[HEADER_LEN..];
    let pieces: Vec<&[u8]> = if payload.is_empty() {
        vec![payload]
    } else {
        payload.chunks(chunk).collect()
    };
    let mut out = Vec::new();
    for (i, p) in pieces.iter().enumerate() {
        let mut flags = m.flags;
        if i == 0 {
            flags |= flag::FIRST_PDU;
        }
        if i + 1 == pieces.len() {
            flags |= flag::LAST_PDU;
        }
        let h = Header {
            version: VERSION,
            function: m.function,
            length: p.len() as u16,
            flags,
            transaction: m.transaction,
            sequence: i as u16,
        };
        out.extend_from_slice(&h.encode());
        out.extend_from_slice(p);
    }
    out
}

#[test]
fn multi_pdu_messages_are_put_together_and_strays_refused() {
    let rsp = read_one(&hex(ISNSD_DEV_ATTR_REG_RSP));
    let split = as_pdus(&rsp, 20);
    assert_eq!(read_one(&split), rsp);
    // Fed a byte at a time.
    let mut r = MessageReader::new();
    let mut got = None;
    for b in &split {
        r.feed(std::slice::from_ref(b));
        if let Some(m) = r.next_message().unwrap() {
            got = Some(m);
        }
    }
    assert_eq!(got, Some(rsp.clone()));
    // A PDU of another transaction in the middle.
    let other = Message::request(function::ESI, 99, vec![])
        .encode()
        .unwrap();
    let first_pdu_len = HEADER_LEN + 20;
    let mut bytes = split[..first_pdu_len].to_vec();
    bytes.extend_from_slice(&other);
    let mut r = MessageReader::new();
    r.feed(&bytes);
    assert!(matches!(r.next_message(), Err(IsnsError::Sequence(_))));
    // A continuation with nothing before it.
    let mut r = MessageReader::new();
    r.feed(&split[first_pdu_len..]);
    assert!(matches!(r.next_message(), Err(IsnsError::Sequence(_))));
}

fn any_attr() -> impl Strategy<Value = Attr> {
    (0u32..3000, prop::collection::vec(any::<u8>(), 0..64))
        .prop_map(|(tag, value)| Attr { tag, value })
}

fn any_message() -> impl Strategy<Value = Message> {
    (
        any::<u16>(),
        any::<u16>(),
        any::<u16>(),
        any::<u32>(),
        prop::collection::vec(any_attr(), 0..12),
    )
        .prop_map(|(function, flags, transaction, status, attrs)| Message {
            function,
            flags: flags & !(flag::AUTH | flag::FIRST_PDU | flag::LAST_PDU),
            transaction,
            status: (function & function::RESPONSE != 0).then_some(status),
            attrs,
        })
}

proptest! {
    #[test]
    fn messages_survive_encoding_and_splitting(m in any_message(), chunk in 1usize..200) {
        let one = m.encode().unwrap();
        prop_assert_eq!(read_one(&one), m.clone());
        prop_assert_eq!(read_one(&as_pdus(&m, chunk)), m);
    }

    #[test]
    fn any_bytes_decode_or_fail_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let mut r = MessageReader::new();
        r.feed(&bytes);
        for _ in 0..64 {
            match r.next_message() {
                Ok(Some(m)) => prop_assert!(m.payload_len() <= bytes.len()),
                Ok(None) | Err(_) => break,
            }
        }
    }

    #[test]
    fn strings_read_back(s in "[a-z0-9.:-]{0,80}") {
        let a = Attr::string(32, &s);
        prop_assert_eq!(a.value.len() % 4, 0);
        prop_assert!(a.value.len() > s.len());
        prop_assert_eq!(a.as_str(), Some(s.as_str()));
    }
}
