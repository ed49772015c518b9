//! Stable logical unit identity: the unit serial number (VPD 80h) and the
//! NAA name (VPD 83h) of a LUN, derived without randomness.
//!
//! Clusters and multipath merge paths by these values, so they must be the
//! same after every restart and on every portal. FNV-1a is used because it
//! is fixed by its definition (no per-process seed, unlike std's hasher).

/// IEEE company ID placed in the NAA IEEE Registered Extended designator
/// when the configuration gives none.
///
/// blockwire has no IEEE OUI of its own: a deployment that owns one sets
/// `LuConfig::company_id`. Uniqueness otherwise rests on the 100
/// vendor-specific bits (a hash of target name and LUN).
pub const DEFAULT_COMPANY_ID: u32 = 0x00_0b_77;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// 64-bit FNV-1a of `bytes`, continuing from `seed`.
pub fn fnv1a64(seed: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(seed, |h, &b| (h ^ u64::from(b)).wrapping_mul(FNV_PRIME))
}

/// The identity of LUN `lun` of target `target_name`: a 16-hex-digit unit
/// serial number and a 64-bit NAA identifier. Same inputs, same outputs,
/// forever; the caller stores or derives `target_name` from configuration.
pub fn stable_identity(target_name: &str, lun: u16) -> (String, u64) {
    let mut key = target_name.as_bytes().to_vec();
    key.push(0);
    key.extend_from_slice(&lun.to_be_bytes());
    let serial_hash = fnv1a64(FNV_OFFSET, &key);
    // A second, differently seeded hash so serial and NAA are independent.
    let naa = fnv1a64(fnv1a64(FNV_OFFSET, b"blockwire-naa"), &key);
    (format!("{serial_hash:016x}"), naa)
}

/// Parses a UUID written as 32 hex digits, with or without the usual
/// dashes (8-4-4-4-12) and in either case.
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let t = text.trim();
    let digits: String = t.chars().filter(|&c| c != '-').collect();
    let dashed_ok = !t.contains('-') || t.split('-').map(str::len).eq([8usize, 4, 4, 4, 12]);
    if digits.len() != 32 || !dashed_ok || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&digits[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// The identity of a LUN configured with a UUID (the `uuid` field of a
/// `[[target.lun]]`): the unit serial number is the UUID's 32 lower-case
/// hex digits (as LIO reports it), the NAA identifier a hash of its 16
/// bytes. It follows the LUN wherever the configuration moves it (another
/// target name, another LUN number), which the name-derived identity of
/// [`stable_identity`] does not. `None` if `uuid` is not a UUID.
pub fn identity_from_uuid(uuid: &str) -> Option<(String, u64)> {
    let bytes = parse_uuid(uuid)?;
    let serial: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let naa = fnv1a64(fnv1a64(FNV_OFFSET, b"blockwire-naa-uuid"), &bytes);
    Some((serial, naa))
}

/// The 36-bit VENDOR SPECIFIC IDENTIFIER and 64-bit extension of the NAA 6h
/// designator for `naa_id`: the extension is `naa_id` itself, the 36 bits a
/// further hash of it, so the 100 bits still depend only on `naa_id`.
pub(crate) fn naa_parts(naa_id: u64) -> (u64, u64) {
    let hi = fnv1a64(FNV_OFFSET, &naa_id.to_be_bytes()) & ((1 << 36) - 1);
    (hi, naa_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A UUID in any of its usual spellings (dashed or not, either
        /// case) parses to its bytes; any other text parses or not without
        /// panicking, and what parses spells the same bytes again.
        #[test]
        fn uuids_parse_in_every_spelling(bytes in any::<[u8; 16]>(), upper: bool, dashed: bool, text in "(?s).{0,40}") {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            let hex = if upper { hex.to_uppercase() } else { hex };
            let spelled = if dashed {
                format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
            } else {
                hex
            };
            prop_assert_eq!(parse_uuid(&spelled), Some(bytes));
            prop_assert_eq!(parse_uuid(&format!(" {spelled}\n")), Some(bytes));
            if let Some(b) = parse_uuid(&text) {
                let again: String = b.iter().map(|x| format!("{x:02x}")).collect();
                prop_assert_eq!(parse_uuid(&again), Some(b));
                prop_assert_eq!(text.trim().replace('-', "").to_lowercase(), again);
            }
        }
    }

    #[test]
    fn fnv1a_known_vectors() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a64(FNV_OFFSET, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(FNV_OFFSET, b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn uuid_identity() {
        let a = identity_from_uuid("3F2504E0-4F89-11D3-9A0C-0305E82C3301").unwrap();
        assert_eq!(a.0, "3f2504e04f8911d39a0c0305e82c3301");
        assert_eq!(
            Some(a.clone()),
            identity_from_uuid("3f2504e04f8911d39a0c0305e82c3301")
        );
        assert_ne!(
            a.1,
            identity_from_uuid("3f2504e0-4f89-11d3-9a0c-0305e82c3302")
                .unwrap()
                .1
        );
        assert!(identity_from_uuid("3f2504e0-4f89-11d3-9a0c").is_none());
        assert!(identity_from_uuid("3f2504e04-f89-11d3-9a0c-0305e82c3301").is_none());
        assert!(identity_from_uuid("zz2504e04f8911d39a0c0305e82c3301").is_none());
    }

    #[test]
    fn identity_is_stable_and_distinct() {
        let a = stable_identity("iqn.2024-01.org.example:disk", 0);
        assert_eq!(a, stable_identity("iqn.2024-01.org.example:disk", 0));
        assert_ne!(a, stable_identity("iqn.2024-01.org.example:disk", 1));
        assert_ne!(a, stable_identity("iqn.2024-01.org.example:disk2", 0));
        assert_eq!(a.0.len(), 16);
        assert_ne!(naa_parts(a.1), naa_parts(a.1 ^ 1));
    }
}
