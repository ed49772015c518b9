//! A stable ISID per initiator name.
//!
//! RFC 7143 §11.12.5: the ISID, with the initiator name, names the I_T
//! nexus. Deriving it from the name (instead of drawing it at random) keeps
//! it equal across reconnects and restarts, so that a new login reinstates
//! the old session and SCSI reservations held by the nexus survive.

/// The 6-byte ISID for `initiator_name` and a `qualifier` that lets one host
/// run several sessions to the same target (0 for the first).
///
/// Format: type 10b "random" (T=2, A=0), then 40 bits of an FNV-1a hash of
/// the name and the qualifier.
pub fn isid_for(initiator_name: &str, qualifier: u16) -> [u8; 6] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in initiator_name
        .as_bytes()
        .iter()
        .chain(qualifier.to_be_bytes().iter())
    {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let b = h.to_be_bytes();
    [0x80, b[3], b[4], b[5], b[6], b[7]]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_and_distinct() {
        let a = isid_for("iqn.2026-11.io.blockwire:host1", 0);
        assert_eq!(a, isid_for("iqn.2026-11.io.blockwire:host1", 0));
        assert_eq!(a[0] >> 6, 2, "random type");
        assert_ne!(a, isid_for("iqn.2026-11.io.blockwire:host2", 0));
        assert_ne!(a, isid_for("iqn.2026-11.io.blockwire:host1", 1));
    }
}
