//! Property tests of the text codec and the TextAssembler.

use blockwire_pdu::keys::{encode_text, parse_text, TextAssembler};
use proptest::prelude::*;

fn pair() -> impl Strategy<Value = (String, String)> {
    ("[A-Za-z][A-Za-z0-9.+@_#-]{0,62}", "[^\u{0}]{0,60}")
}

proptest! {
    #[test]
    fn encode_then_parse_is_identity(pairs in proptest::collection::vec(pair(), 0..20)) {
        let bytes = encode_text(&pairs).expect("valid pairs encode");
        prop_assert_eq!(parse_text(&bytes).expect("own encoding parses"), pairs);
    }

    #[test]
    fn split_across_pdus_reassembles(
        pairs in proptest::collection::vec(pair(), 1..20),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let bytes = encode_text(&pairs).expect("valid pairs encode");
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
        points.push(0);
        points.push(bytes.len());
        points.sort_unstable();
        points.dedup();
        let mut asm = TextAssembler::default();
        let mut result = None;
        let pieces: Vec<&[u8]> = points.windows(2).map(|w| &bytes[w[0]..w[1]]).collect();
        for (i, piece) in pieces.iter().enumerate() {
            let last = i + 1 == pieces.len();
            result = asm.push(piece, !last).expect("within bound");
            prop_assert_eq!(result.is_some(), last);
        }
        prop_assert_eq!(result, Some(pairs));
    }

    #[test]
    fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = parse_text(&bytes);
    }

    #[test]
    fn parse_never_panics_on_texty_input(s in "[a-zA-Z=\u{0},0-9_\u{e9}]{0,300}") {
        if let Ok(pairs) = parse_text(s.as_bytes()) {
            // Whatever parses re-encodes and parses to the same pairs.
            let again = encode_text(&pairs).expect("parsed pairs are valid");
            prop_assert_eq!(parse_text(&again).expect("reparses"), pairs);
        }
    }

    #[test]
    fn assembler_bound_is_enforced(chunks in proptest::collection::vec(proptest::collection::vec(1u8..=255, 0..100), 1..10), max in 0usize..400) {
        let mut asm = TextAssembler::new(max);
        let mut total = 0usize;
        for chunk in &chunks {
            total += chunk.len();
            let r = asm.push(chunk, true);
            if total > max {
                prop_assert!(r.is_err());
                break;
            }
            prop_assert!(asm.len() <= max);
        }
    }
}
