//! The text data segment codec: `key=value` pairs separated by NUL bytes
//! (RFC 7143 section 6.1), and the [`TextAssembler`] that joins text split
//! over several PDUs with the C (continue) bit.

use thiserror::Error;

/// A decoded text segment: `(key, value)` pairs in wire order.
pub type TextPairs = Vec<(String, String)>;

/// Longest key name (RFC 7143 6.1: "not exceed 63 bytes").
pub const MAX_KEY_LEN: usize = 63;
/// Longest ordinary value (RFC 7143 6.1: 255 bytes).
pub const MAX_VALUE_LEN: usize = 255;
/// Longest value of a key that carries a large binary value (CHAP_C, CHAP_R):
/// their hex or base64 text may run to 8192 characters.
pub const MAX_LARGE_VALUE_LEN: usize = 8192;
/// Default bound on the text of one negotiation sequence; RFC 7143 requires
/// at least 8192 bytes, we allow 64 KiB by default.
pub const DEFAULT_MAX_TEXT_LEN: usize = 64 * 1024;

/// Why a text data segment could not be decoded or encoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TextError {
    /// A pair is not valid UTF-8.
    #[error("text pair at byte {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// Byte offset of the pair in the segment.
        offset: usize,
    },
    /// A pair has no `=` separator.
    #[error("text pair at byte {offset} has no '='")]
    MissingEquals {
        /// Byte offset of the pair in the segment.
        offset: usize,
    },
    /// A pair has an empty key (`=value`).
    #[error("text pair at byte {offset} has an empty key")]
    EmptyKey {
        /// Byte offset of the pair in the segment.
        offset: usize,
    },
    /// Two NUL bytes in a row in the middle of the segment.
    #[error("empty text pair at byte {offset}")]
    EmptyPair {
        /// Byte offset of the empty pair.
        offset: usize,
    },
    /// The key is longer than [`MAX_KEY_LEN`].
    #[error("key `{key}` is {len} bytes, more than {MAX_KEY_LEN}")]
    KeyTooLong {
        /// The key, cut to its first 63 bytes' worth of characters.
        key: String,
        /// Its length in bytes.
        len: usize,
    },
    /// The key uses a character outside RFC 7143's key-name alphabet.
    #[error("key `{key}` has a character outside [A-Za-z0-9.-+@_#]")]
    InvalidKeyChar {
        /// The key.
        key: String,
    },
    /// The value is longer than the key allows.
    #[error("value of `{key}` is {len} bytes, more than {max}")]
    ValueTooLong {
        /// The key.
        key: String,
        /// The value length in bytes.
        len: usize,
        /// The limit for this key.
        max: usize,
    },
    /// A value to encode contains a NUL byte, which would split the pair.
    #[error("value of `{key}` contains a NUL byte")]
    NulInValue {
        /// The key.
        key: String,
    },
    /// The assembled text exceeds the configured bound.
    #[error("text of {len} bytes exceeds the bound of {max} bytes")]
    TooLarge {
        /// Bytes the text would have reached.
        len: usize,
        /// The configured bound.
        max: usize,
    },
}

/// Largest value length allowed for `key`.
///
/// CHAP_C and CHAP_R carry large binary values; every other key (including
/// SendTargets and TargetAddress) is bounded by 255 bytes.
pub fn max_value_len(key: &str) -> usize {
    match key {
        "CHAP_C" | "CHAP_R" => MAX_LARGE_VALUE_LEN,
        _ => MAX_VALUE_LEN,
    }
}

/// True for the characters RFC 7143 allows in key names (plus `#` for the
/// `X#` IANA-registered vendor keys).
fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+' | '@' | '_' | '#')
}

/// Checks a key name against the RFC limits.
pub fn check_key(key: &str) -> Result<(), TextError> {
    if key.is_empty() {
        return Err(TextError::EmptyKey { offset: 0 });
    }
    if key.len() > MAX_KEY_LEN {
        return Err(TextError::KeyTooLong {
            key: key.chars().take(MAX_KEY_LEN).collect(),
            len: key.len(),
        });
    }
    if !key.chars().all(is_key_char) {
        return Err(TextError::InvalidKeyChar {
            key: key.to_owned(),
        });
    }
    Ok(())
}

fn check_value(key: &str, value: &str) -> Result<(), TextError> {
    let max = max_value_len(key);
    if value.len() > max {
        return Err(TextError::ValueTooLong {
            key: key.to_owned(),
            len: value.len(),
            max,
        });
    }
    Ok(())
}

/// Decodes a text data segment into `(key, value)` pairs.
///
/// The last pair may or may not end with its NUL, and trailing NULs (padding
/// some peers include in the data segment length) are ignored. An empty pair
/// between two others, a pair without `=`, an empty key, non-UTF-8 text or an
/// over-long key or value is an error. Values may be empty; whether an empty
/// value is legal is the negotiation engine's business.
///
/// This is the entry point for fuzzing: it never panics.
pub fn parse_text(data: &[u8]) -> Result<TextPairs, TextError> {
    // Ignore trailing NUL padding so that "k=v\0\0\0" is one pair.
    let end = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let body = data.get(..end).unwrap_or_default();
    let mut pairs = Vec::new();
    if body.is_empty() {
        return Ok(pairs);
    }
    let mut offset = 0usize;
    for raw in body.split(|&b| b == 0) {
        if raw.is_empty() {
            return Err(TextError::EmptyPair { offset });
        }
        let text = std::str::from_utf8(raw).map_err(|_| TextError::InvalidUtf8 { offset })?;
        let (key, value) = text
            .split_once('=')
            .ok_or(TextError::MissingEquals { offset })?;
        if key.is_empty() {
            return Err(TextError::EmptyKey { offset });
        }
        check_key(key)?;
        check_value(key, value)?;
        pairs.push((key.to_owned(), value.to_owned()));
        offset = offset.saturating_add(raw.len()).saturating_add(1);
    }
    Ok(pairs)
}

/// Encodes pairs as a text data segment, each pair ending with a NUL.
///
/// The same limits as [`parse_text`] apply, so what this produces always
/// parses back to the same pairs.
pub fn encode_text<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Result<Vec<u8>, TextError> {
    let mut out = Vec::new();
    for (key, value) in pairs {
        let (key, value) = (key.as_ref(), value.as_ref());
        check_key(key)?;
        check_value(key, value)?;
        if value.contains('\0') {
            return Err(TextError::NulInValue {
                key: key.to_owned(),
            });
        }
        out.extend_from_slice(key.as_bytes());
        out.push(b'=');
        out.extend_from_slice(value.as_bytes());
        out.push(0);
    }
    Ok(out)
}

/// Joins text that arrives over several Login or Text PDUs.
///
/// Feed each PDU's data segment with its C bit; when a PDU with C=0 arrives
/// the whole text is parsed and returned. The total is bounded so that a peer
/// cannot make us buffer without limit.
#[derive(Debug, Clone)]
pub struct TextAssembler {
    buf: Vec<u8>,
    max: usize,
}

impl Default for TextAssembler {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_TEXT_LEN)
    }
}

impl TextAssembler {
    /// An empty assembler that refuses more than `max_total` bytes in total.
    pub fn new(max_total: usize) -> Self {
        Self {
            buf: Vec::new(),
            max: max_total,
        }
    }

    /// Bytes buffered so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True when nothing is buffered.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Drops any partial text (e.g. after a protocol error).
    pub fn reset(&mut self) {
        self.buf.clear();
    }

    /// Adds one PDU's data segment. Returns `Ok(None)` while `continues` (the
    /// C bit) is set, and the parsed pairs once the final piece arrives. On
    /// any error the assembler is reset.
    pub fn push(&mut self, data: &[u8], continues: bool) -> Result<Option<TextPairs>, TextError> {
        let len = self.buf.len().saturating_add(data.len());
        if len > self.max {
            self.buf.clear();
            return Err(TextError::TooLarge { len, max: self.max });
        }
        self.buf.extend_from_slice(data);
        if continues {
            return Ok(None);
        }
        let text = std::mem::take(&mut self.buf);
        parse_text(&text).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> TextPairs {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_with_and_without_final_nul() {
        let want = pairs(&[
            ("HeaderDigest", "CRC32C,None"),
            ("MaxBurstLength", "262144"),
        ]);
        assert_eq!(
            parse_text(b"HeaderDigest=CRC32C,None\0MaxBurstLength=262144\0"),
            Ok(want.clone())
        );
        assert_eq!(
            parse_text(b"HeaderDigest=CRC32C,None\0MaxBurstLength=262144"),
            Ok(want.clone())
        );
        assert_eq!(
            parse_text(b"HeaderDigest=CRC32C,None\0MaxBurstLength=262144\0\0\0"),
            Ok(want)
        );
        assert_eq!(parse_text(b""), Ok(vec![]));
        assert_eq!(parse_text(b"\0\0"), Ok(vec![]));
    }

    #[test]
    fn value_may_contain_equals_and_be_empty() {
        assert_eq!(parse_text(b"X-a=b=c\0"), Ok(pairs(&[("X-a", "b=c")])));
        assert_eq!(
            parse_text(b"TargetAlias=\0"),
            Ok(pairs(&[("TargetAlias", "")]))
        );
    }

    #[test]
    fn typed_errors() {
        assert_eq!(
            parse_text(b"a=1\0\0b=2"),
            Err(TextError::EmptyPair { offset: 4 })
        );
        assert_eq!(
            parse_text(b"a=1\0novalue\0"),
            Err(TextError::MissingEquals { offset: 4 })
        );
        assert_eq!(parse_text(b"=v\0"), Err(TextError::EmptyKey { offset: 0 }));
        assert_eq!(
            parse_text(b"a=\xff\0"),
            Err(TextError::InvalidUtf8 { offset: 0 })
        );
        assert!(matches!(
            parse_text(b"a b=1"),
            Err(TextError::InvalidKeyChar { .. })
        ));
        let long_key = format!("{}=1", "K".repeat(64));
        assert!(matches!(
            parse_text(long_key.as_bytes()),
            Err(TextError::KeyTooLong { len: 64, .. })
        ));
        let ok_key = format!("{}=1", "K".repeat(63));
        assert!(parse_text(ok_key.as_bytes()).is_ok());
        let long_val = format!("TargetAlias={}", "v".repeat(256));
        assert!(matches!(
            parse_text(long_val.as_bytes()),
            Err(TextError::ValueTooLong { max: 255, .. })
        ));
        let chap = format!("CHAP_C=0x{}", "a".repeat(8190));
        assert!(parse_text(chap.as_bytes()).is_ok());
        let chap = format!("CHAP_C=0x{}", "a".repeat(8191));
        assert!(matches!(
            parse_text(chap.as_bytes()),
            Err(TextError::ValueTooLong { max: 8192, .. })
        ));
    }

    #[test]
    fn encode_checks() {
        assert_eq!(
            encode_text(&[("a", "1"), ("b", "")]),
            Ok(b"a=1\0b=\0".to_vec())
        );
        assert!(matches!(
            encode_text(&[("a", "x\0y")]),
            Err(TextError::NulInValue { .. })
        ));
        assert!(matches!(
            encode_text(&[("a=b", "1")]),
            Err(TextError::InvalidKeyChar { .. })
        ));
        assert!(matches!(
            encode_text(&[("", "1")]),
            Err(TextError::EmptyKey { .. })
        ));
    }

    #[test]
    fn assembler_joins_split_pair_and_bounds_total() {
        let mut asm = TextAssembler::new(32);
        assert_eq!(asm.push(b"MaxBurst", true), Ok(None));
        assert_eq!(asm.push(b"Length=5", true), Ok(None));
        assert_eq!(
            asm.push(b"12\0", false),
            Ok(Some(pairs(&[("MaxBurstLength", "512")])))
        );
        assert!(asm.is_empty());
        assert_eq!(asm.push(&[b'a'; 30], true), Ok(None));
        assert_eq!(
            asm.push(b"=123", true),
            Err(TextError::TooLarge { len: 34, max: 32 })
        );
        assert!(asm.is_empty());
    }
}
