//! Feeds arbitrary bytes to every decoder of what an RDMA peer or an iSCSI peer sends
//! for the RDMA data paths: the soft provider's frame header, and RDMA-assisted iSCSI's
//! login grant and offer, the RDMA connection's bind request and the per-command buffer
//! descriptor AHS. Whatever decodes must encode back to what was decoded.
#![no_main]

use blockwire_pdu::pdu::Ahs;
use blockwire_transport::assist::{
    parse_offer, BindRequest, Descriptor, Grant, AHS_RDMA_DESCRIPTOR, MAX_CHUNKS, TOKEN_LEN,
};
use blockwire_transport::rdma::soft::fuzzing::{Header, HEADER_LEN, MAX_PAYLOAD};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Some(head) = bytes.first_chunk::<HEADER_LEN>() {
        if let Ok(h) = Header::decode(head) {
            assert!(h.len as usize <= MAX_PAYLOAD);
            let mut out = Default::default();
            h.encode(&mut out);
            assert_eq!(&out[..], &head[..], "a decoded header encodes back to its bytes");
        }
    }

    if let Ok(text) = std::str::from_utf8(bytes) {
        if let Some(g) = Grant::parse(text) {
            assert!(!g.backend.is_empty());
            assert_eq!(Grant::parse(&g.to_value()), Some(g));
        }
        for backend in parse_offer(text) {
            assert!(!backend.is_empty() && !backend.contains(','));
            assert_eq!(backend, backend.trim());
        }
    }

    if let Some(b) = BindRequest::decode(bytes) {
        let again = b.encode();
        // Byte 5 is reserved: sent as zero, ignored on receipt.
        let mut sent = bytes[..again.len()].to_vec();
        sent[5] = 0;
        assert_eq!(sent, again);
        assert!(bytes[again.len()..].iter().all(|&x| x == 0));
        assert_eq!(again.len(), 8 + TOKEN_LEN);
    }

    let ahs = [Ahs::Other {
        ahs_type: AHS_RDMA_DESCRIPTOR,
        specific: bytes.to_vec(),
    }];
    if let Ok(Some(d)) = Descriptor::from_ahs(&ahs) {
        assert!((1..=MAX_CHUNKS).contains(&d.chunks.len()));
        assert!(d.chunks.iter().all(|c| c.len <= u64::from(u32::MAX)));
        assert_eq!(Descriptor::from_ahs(&[d.to_ahs()]), Ok(Some(d)));
    }
});
