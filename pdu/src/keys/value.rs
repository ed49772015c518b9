//! Value encodings of RFC 7143 section 6.1: numbers, booleans, lists and
//! binary values (`0x` hex, `0b` base64).
//!
//! Every function here takes untrusted text and returns a typed error rather
//! than panicking; lengths are checked before anything is allocated from them.

use thiserror::Error;

/// Largest binary value we decode, in bytes. RFC 7143 lets CHAP challenges be
/// large binary values; 8192 encoded characters bound the decoded size well
/// below this, so the bound only guards callers who pass longer text.
pub const MAX_BINARY_LEN: usize = 8192;

/// Why a key's value could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ValueError {
    /// The value was empty where a number, boolean or binary was needed.
    #[error("empty value")]
    Empty,
    /// The text is not a decimal or `0x` hexadecimal number.
    #[error("`{0}` is not a decimal or 0x-hex number")]
    NotANumber(String),
    /// The number does not fit in 64 bits (RFC 7143: always less than 2^64).
    #[error("number `{0}` does not fit in 64 bits")]
    Overflow(String),
    /// The number is outside the range the key allows.
    #[error("{value} is outside {min}..={max}")]
    OutOfRange {
        /// The parsed number.
        value: u64,
        /// Smallest allowed value.
        min: u64,
        /// Largest allowed value.
        max: u64,
    },
    /// Booleans are exactly `Yes` or `No` (case-sensitive, RFC 7143 6.1).
    #[error("`{0}` is not Yes or No")]
    NotABoolean(String),
    /// The text is not a `0x` hex or `0b` base64 constant.
    #[error("`{0}` is not a 0x-hex or 0b-base64 binary value")]
    NotBinary(String),
    /// The binary value decodes to more than [`MAX_BINARY_LEN`] bytes.
    #[error("binary value longer than {MAX_BINARY_LEN} bytes")]
    BinaryTooLong,
}

/// Parses a numerical value: a decimal constant or a `0x`/`0X` hex constant
/// (RFC 7143 6.1). Leading zeros in decimal are tolerated because some peers
/// send them and they are unambiguous here (no octal in iSCSI).
pub fn parse_number(text: &str) -> Result<u64, ValueError> {
    if text.is_empty() {
        return Err(ValueError::Empty);
    }
    let (digits, radix) = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None => (text, 10),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(ValueError::NotANumber(text.to_owned()));
    }
    // Only digits remain, so the only possible failure is overflow.
    u64::from_str_radix(digits, radix).map_err(|_| ValueError::Overflow(text.to_owned()))
}

/// Parses a numerical value and checks it lies in `min..=max`.
pub fn parse_number_in(text: &str, min: u64, max: u64) -> Result<u64, ValueError> {
    let value = parse_number(text)?;
    if value < min || value > max {
        return Err(ValueError::OutOfRange { value, min, max });
    }
    Ok(value)
}

/// Parses `Yes` or `No`.
pub fn parse_bool(text: &str) -> Result<bool, ValueError> {
    match text {
        "Yes" => Ok(true),
        "No" => Ok(false),
        other => Err(ValueError::NotABoolean(other.to_owned())),
    }
}

/// Formats a boolean the way RFC 7143 spells it.
pub fn format_bool(value: bool) -> &'static str {
    if value {
        "Yes"
    } else {
        "No"
    }
}

/// Splits a list value (`a,b,c`) into its items. An empty value is an empty
/// list; empty items are kept so that the caller can reject them.
pub fn split_list(text: &str) -> impl Iterator<Item = &str> {
    let empty = text.is_empty();
    text.split(',').filter(move |_| !empty)
}

/// Decodes a binary value: `0x`/`0X` followed by hex digits, or `0b`/`0B`
/// followed by base64 (RFC 4648 alphabet, `=` padding optional).
///
/// An odd number of hex digits is read as if a leading `0` nibble were
/// present, as a number would be.
pub fn decode_binary(text: &str) -> Result<Vec<u8>, ValueError> {
    let bad = || ValueError::NotBinary(text.to_owned());
    if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        if hex.is_empty() {
            return Err(bad());
        }
        if hex.len() / 2 > MAX_BINARY_LEN {
            return Err(ValueError::BinaryTooLong);
        }
        let mut out = Vec::with_capacity(hex.len().div_ceil(2));
        let mut nibbles = hex.chars().map(|c| c.to_digit(16));
        if hex.len() % 2 == 1 {
            let low = nibbles.next().flatten().ok_or_else(bad)?;
            out.push(low as u8);
        }
        while let Some(high) = nibbles.next() {
            let high = high.ok_or_else(bad)?;
            let low = nibbles.next().flatten().ok_or_else(bad)?;
            out.push(((high << 4) | low) as u8);
        }
        return Ok(out);
    }
    if let Some(b64) = text.strip_prefix("0b").or_else(|| text.strip_prefix("0B")) {
        return decode_base64(b64).ok_or_else(bad);
    }
    Err(bad())
}

/// Encodes bytes as a `0x` hex binary value.
pub fn encode_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 + bytes.len() * 2);
    out.push_str("0x");
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// Encodes bytes as a `0b` base64 binary value (with `=` padding): the
/// tests' way to write binary values as peers that prefer base64 do.
#[cfg(test)]
pub fn encode_base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(2 + bytes.len().div_ceil(3) * 4);
    out.push_str("0b");
    for chunk in bytes.chunks(3) {
        let b0 = chunk.first().copied().unwrap_or(0);
        let b1 = chunk.get(1).copied().unwrap_or(0);
        let b2 = chunk.get(2).copied().unwrap_or(0);
        let n = (u32::from(b0) << 16) | (u32::from(b1) << 8) | u32::from(b2);
        // Indices are masked to 6 bits, so they are always < 64.
        let sextet = |shift: u32| char::from(ALPHABET[((n >> shift) & 0x3f) as usize]);
        out.push(sextet(18));
        out.push(sextet(12));
        out.push(if chunk.len() > 1 { sextet(6) } else { '=' });
        out.push(if chunk.len() > 2 { sextet(0) } else { '=' });
    }
    out
}

fn base64_sextet(c: u8) -> Option<u32> {
    let v = match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return None,
    };
    Some(u32::from(v))
}

fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let body = text.trim_end_matches('=');
    let padding = text.len() - body.len();
    if body.is_empty() || padding > 2 || body.len() % 4 == 1 {
        return None;
    }
    // Padding, when present, must complete the last quantum.
    let partial_quantum = text.len() % 4;
    if padding > 0 && partial_quantum != 0 {
        return None;
    }
    if body.len() / 4 * 3 > MAX_BINARY_LEN {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() / 4 * 3 + 2);
    for chunk in body.as_bytes().chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= base64_sextet(*c)? << (18 - 6 * i as u32);
        }
        // A chunk of k sextets carries k-1 whole bytes.
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend(bytes.iter().take(chunk.len().saturating_sub(1)));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn numbers() {
        assert_eq!(parse_number("0"), Ok(0));
        assert_eq!(parse_number("262144"), Ok(262_144));
        assert_eq!(parse_number("0x40000"), Ok(262_144));
        assert_eq!(parse_number("0XfF"), Ok(255));
        assert_eq!(parse_number("18446744073709551615"), Ok(u64::MAX));
        assert!(matches!(
            parse_number("18446744073709551616"),
            Err(ValueError::Overflow(_))
        ));
        assert!(matches!(parse_number("0x"), Err(ValueError::NotANumber(_))));
        assert!(matches!(parse_number("-1"), Err(ValueError::NotANumber(_))));
        assert!(matches!(parse_number("+1"), Err(ValueError::NotANumber(_))));
        assert!(matches!(parse_number(" 1"), Err(ValueError::NotANumber(_))));
        assert_eq!(parse_number(""), Err(ValueError::Empty));
        assert_eq!(
            parse_number_in("511", 512, 16_777_215),
            Err(ValueError::OutOfRange {
                value: 511,
                min: 512,
                max: 16_777_215
            })
        );
        assert_eq!(parse_number_in("512", 512, 16_777_215), Ok(512));
    }

    #[test]
    fn booleans() {
        assert_eq!(parse_bool("Yes"), Ok(true));
        assert_eq!(parse_bool("No"), Ok(false));
        assert!(parse_bool("yes").is_err());
        assert_eq!(format_bool(true), "Yes");
    }

    #[test]
    fn lists() {
        assert_eq!(
            split_list("CRC32C,None").collect::<Vec<_>>(),
            ["CRC32C", "None"]
        );
        assert_eq!(split_list("").count(), 0);
        assert_eq!(split_list("a,,b").collect::<Vec<_>>(), ["a", "", "b"]);
    }

    #[test]
    fn binary_known_values() {
        assert_eq!(decode_binary("0x0102ff"), Ok(vec![1, 2, 255]));
        assert_eq!(decode_binary("0xabc"), Ok(vec![0x0a, 0xbc]));
        assert_eq!(decode_binary("0bAQL/"), Ok(vec![1, 2, 255]));
        assert_eq!(decode_binary("0bAQ=="), Ok(vec![1]));
        assert_eq!(decode_binary("0bAQ"), Ok(vec![1]));
        assert_eq!(decode_binary("0bAQI="), Ok(vec![1, 2]));
        assert!(decode_binary("0x").is_err());
        assert!(decode_binary("0xg0").is_err());
        assert!(decode_binary("0b").is_err());
        assert!(decode_binary("0bA").is_err());
        assert!(decode_binary("0bAQ=").is_err());
        assert!(decode_binary("0b====").is_err());
        assert!(decode_binary("1234").is_err());
        assert_eq!(encode_base64(&[1, 2, 255]), "0bAQL/");
        assert_eq!(encode_hex(&[1, 2, 255]), "0x0102ff");
    }

    proptest! {
        #[test]
        fn binary_round_trips(bytes in proptest::collection::vec(any::<u8>(), 1..200)) {
            prop_assert_eq!(decode_binary(&encode_hex(&bytes)), Ok(bytes.clone()));
            prop_assert_eq!(decode_binary(&encode_base64(&bytes)), Ok(bytes));
        }

        #[test]
        fn number_round_trips(n in any::<u64>()) {
            prop_assert_eq!(parse_number(&n.to_string()), Ok(n));
            prop_assert_eq!(parse_number(&format!("0x{n:x}")), Ok(n));
        }

        #[test]
        fn value_parsers_never_panic(s in "\\PC{0,40}") {
            let _ = parse_number(&s);
            let _ = decode_binary(&s);
            let _ = parse_bool(&s);
        }
    }
}
