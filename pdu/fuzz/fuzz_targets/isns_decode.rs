//! Feeds arbitrary bytes to the iSNS message reader, in pieces cut where the
//! first byte says: every message it hands out must encode again (when it
//! fits one PDU) to bytes that read back as the same message, and a stream
//! it refuses stays refused without a panic.
#![no_main]

use blockwire_pdu::isns::{MessageReader, MAX_PDU_PAYLOAD};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&cut, bytes)) = input.split_first() else {
        return;
    };
    let step = usize::from(cut).max(1);
    let mut reader = MessageReader::new();
    for piece in bytes.chunks(step) {
        reader.feed(piece);
        loop {
            match reader.next_message() {
                Ok(Some(m)) => {
                    assert!(m.payload_len() <= bytes.len());
                    if m.payload_len() <= MAX_PDU_PAYLOAD {
                        let again = m.encode().expect("a message that fits one PDU encodes");
                        let mut check = MessageReader::new();
                        check.feed(&again);
                        assert_eq!(check.next_message(), Ok(Some(m)));
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
});
