//! Feeds arbitrary bytes to the login/text key parser, whole and through the
//! continuation assembler split at an arbitrary point; what parses must
//! re-encode to text that parses to the same pairs.
#![no_main]

use blockwire_pdu::keys::{encode_text, parse_text, TextAssembler};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&cut, bytes)) = input.split_first() else {
        return;
    };
    let whole = parse_text(bytes);
    if let Ok(pairs) = &whole {
        let again = encode_text(pairs).expect("parsed pairs must encode");
        assert_eq!(&parse_text(&again).expect("re-encoded text must parse"), pairs);
    }
    let at = usize::from(cut).min(bytes.len());
    let mut assembler = TextAssembler::default();
    if let Ok(None) = assembler.push(&bytes[..at], true) {
        let _ = assembler.push(&bytes[at..], false);
    }
});
