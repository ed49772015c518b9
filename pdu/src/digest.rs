//! CRC32C header and data digests (RFC 7143 §12.1, Appendix B examples).
//!
//! The digest is the CRC32C of the covered bytes; it travels least
//! significant byte first, which is what Linux and libiscsi send.

/// Bytes of one digest on the wire.
pub const DIGEST_LEN: usize = 4;

/// Which digests a connection negotiated (HeaderDigest, DataDigest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Digests {
    /// HeaderDigest=CRC32C.
    pub header: bool,
    /// DataDigest=CRC32C.
    pub data: bool,
}

impl Digests {
    /// No digests: the state during login and the default.
    pub const NONE: Digests = Digests {
        header: false,
        data: false,
    };
    /// Both digests on.
    pub const BOTH: Digests = Digests {
        header: true,
        data: true,
    };
}

/// The CRC32C of `bytes` as the value whose little-endian bytes are the digest.
pub fn crc32c_digest(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 7143 Appendix B.4 ("CRC examples"): the digest bytes as sent.
    #[test]
    fn rfc_examples() {
        assert_eq!(
            crc32c_digest(&[0u8; 32]).to_le_bytes(),
            [0xaa, 0x36, 0x91, 0x8a]
        );
        assert_eq!(
            crc32c_digest(&[0xffu8; 32]).to_le_bytes(),
            [0x43, 0xab, 0xa8, 0x62]
        );
        let inc: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c_digest(&inc).to_le_bytes(), [0x4e, 0x79, 0xdd, 0x46]);
        let dec: Vec<u8> = (0u8..32).rev().collect();
        assert_eq!(crc32c_digest(&dec).to_le_bytes(), [0x5c, 0xdb, 0x3f, 0x11]);
    }
}
