//! Feeds arbitrary bytes to the iSER header decoder and the stream framer under arbitrary limits and
//! digest settings. Any PDU that decodes must re-encode to bytes that decode
//! to the same PDU.
#![no_main]

use blockwire_pdu::iser::IserHeader;
use blockwire_pdu::{Digests, Frame, FrameDecoder, Pdu};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&settings, mut bytes)) = input.split_first() else {
        return;
    };
    // The iSER header that precedes a PDU on RDMA connections.
    if let Ok(h) = IserHeader::decode(bytes) {
        assert_eq!(IserHeader::decode(&h.encode()), Ok(h));
    }
    let digests = Digests {
        header: settings & 1 != 0,
        data: settings & 2 != 0,
    };
    // Small limits exercise the length checks; large ones the data paths.
    let max = [512u32, 8192, 262_144, 0x00ff_ffff][usize::from(settings >> 2) & 3];
    let framer = FrameDecoder::new(max, digests);
    while let Ok(Frame::Pdu { pdu, consumed }) = framer.decode(bytes) {
        assert!(consumed > 0 && consumed <= bytes.len());
        // The zero-copy decode of the same frame agrees with the copying one.
        let frame = bytes::Bytes::copy_from_slice(&bytes[..consumed]);
        assert_eq!(Pdu::decode_shared(&frame, digests), Ok((pdu.clone(), consumed)));
        let again = pdu.encode(digests);
        let (back, used) = Pdu::decode(&again, digests).expect("re-encoded PDU must decode");
        assert_eq!(used, again.len());
        assert_eq!(back, pdu);
        bytes = &bytes[consumed..];
    }
});
