//! Serial number arithmetic (RFC 1982 with SERIAL_BITS = 32), which iSCSI
//! uses for CmdSN, StatSN, DataSN and R2TSN comparisons (RFC 7143 §4.2.2.1).

/// `a < b` in serial number arithmetic.
pub fn sn_lt(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < 0x8000_0000
}

/// `a > b` in serial number arithmetic.
pub fn sn_gt(a: u32, b: u32) -> bool {
    sn_lt(b, a)
}

/// `a <= b` in serial number arithmetic.
pub fn sn_le(a: u32, b: u32) -> bool {
    a == b || sn_lt(a, b)
}

/// Whether a non-immediate command's CmdSN lies in the window
/// `[exp_cmd_sn, max_cmd_sn]` that the target advertised.
pub fn cmd_sn_in_window(cmd_sn: u32, exp_cmd_sn: u32, max_cmd_sn: u32) -> bool {
    sn_le(exp_cmd_sn, cmd_sn) && sn_le(cmd_sn, max_cmd_sn)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps_around() {
        assert!(sn_lt(0xffff_fffe, 1));
        assert!(sn_gt(1, 0xffff_fffe));
        assert!(cmd_sn_in_window(0, 0xffff_fff0, 0x10));
        assert!(!cmd_sn_in_window(0x11, 0xffff_fff0, 0x10));
    }

    proptest! {
        #[test]
        fn successor_is_greater(a: u32, d in 1u32..0x7fff_ffff) {
            prop_assert!(sn_lt(a, a.wrapping_add(d)));
            prop_assert!(!sn_lt(a.wrapping_add(d), a));
            prop_assert!(sn_le(a, a));
        }
    }
}
