//! FORMAT UNIT (SBC-4 5.4): the unit is formatted in the format it has.
//!
//! A virtual unit's block size and protection type are set by its
//! configuration, so the command may ask only for those: FMTPINFO and
//! PROTECTION FIELD USAGE naming the unit's own protection (none, or Type 1
//! with its tuples), no protection interval, no defect list (a virtual
//! medium has no defects), no initialization pattern and no fast format.
//! Anything else is refused as an invalid field, pointing at it.
//!
//! What the format does to the medium: a thin provisioned unit deallocates
//! every block (a READ returns zeros, LBPRZ=1) and every protection tuple,
//! as a disk that supports logical block provisioning unmaps its LBAs when
//! formatted; a fully provisioned unit keeps its data, which SBC-4 leaves
//! unspecified after a format without an initialization pattern. Either
//! way the format holds the whole medium, so writes already running finish
//! first and none runs beside it, and ends durable (flushed).

use super::logical_unit::LogicalUnit;
use super::outcome::{
    backstore_failure, invalid_cdb, invalid_param, param_length, CmdResult, Done,
};

/// FORMAT UNIT opcode (SBC-4 5.4).
pub(crate) const FORMAT_UNIT: u8 = 0x04;

/// The fields of a FORMAT UNIT CDB and its parameter list header that
/// decide what is formatted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FormatRequest {
    /// FMTPINFO (2 bits).
    pub fmtpinfo: u8,
    /// PROTECTION FIELD USAGE (3 bits; 0 without a parameter list).
    pub protection_field_usage: u8,
}

/// Checks a FORMAT UNIT CDB and, with FMTDATA=1, its parameter list
/// header (`data_out`): what the request asks for, or the field that
/// cannot be done.
pub(crate) fn parse(cdb: &[u8], data_out: &[u8]) -> Result<FormatRequest, super::outcome::Failure> {
    if cdb.len() < 6 {
        return Err(invalid_cdb(0, None));
    }
    let fmtpinfo = cdb[1] >> 6;
    let longlist = cdb[1] & 0x20 != 0;
    let fmtdata = cdb[1] & 0x10 != 0;
    let defect_list_format = cdb[1] & 0x07;
    // FFMT (fast format, SBC-4 5.4.1): not offered.
    if cdb[4] & 0x03 != 0 {
        return Err(invalid_cdb(4, Some(1)));
    }
    if !fmtdata {
        // No parameter list: the device server's own defaults. A defect
        // list format names the format of a list that is not sent.
        if defect_list_format != 0 {
            return Err(invalid_cdb(1, Some(2)));
        }
        return Ok(FormatRequest {
            fmtpinfo,
            protection_field_usage: 0,
        });
    }
    // Reserved defect list formats (SBC-4 table 39), as READ DEFECT DATA
    // refuses them.
    if matches!(defect_list_format, 1 | 2 | 7) {
        return Err(invalid_cdb(1, Some(2)));
    }
    let header_len = if longlist { 8 } else { 4 };
    let Some(h) = data_out.get(..header_len) else {
        return Err(param_length());
    };
    let fov = h[1] & 0x80 != 0;
    // DPRY, DCRT, STPF and IP apply only with FOV=1 (SBC-4 5.4.2.2).
    if !fov {
        if let Some(bit) = [6u8, 5, 4, 3].into_iter().find(|b| h[1] & (1 << b) != 0) {
            return Err(invalid_param(1, Some(bit)));
        }
    }
    // An initialization pattern would follow the defect list: the medium
    // is not written with one.
    if h[1] & 0x08 != 0 {
        return Err(invalid_param(1, Some(3)));
    }
    let (defect_list_length, at) = if longlist {
        // P_I_INFORMATION and PROTECTION INTERVAL EXPONENT: only the
        // protection the unit has, one interval per logical block.
        if h[3] != 0 {
            return Err(invalid_param(3, None));
        }
        (u32::from_be_bytes([h[4], h[5], h[6], h[7]]), 4)
    } else {
        (u32::from(u16::from_be_bytes([h[2], h[3]])), 2)
    };
    if defect_list_length != 0 {
        return Err(invalid_param(at, None));
    }
    Ok(FormatRequest {
        fmtpinfo,
        protection_field_usage: h[0] & 0x07,
    })
}

impl LogicalUnit {
    /// FORMAT UNIT (see the module docs); the unit is known to be ready.
    pub(crate) fn format_unit(&self, cdb: &[u8], data_out: &[u8]) -> CmdResult {
        let req = parse(cdb, data_out)?;
        // SBC-4 table 37: FMTPINFO 00b with usage 000b is no protection
        // information; 10b with 000b is Type 1. Other types cannot be had.
        let own = if self.protected() { (2, 0) } else { (0, 0) };
        if req.fmtpinfo != own.0 {
            return Err(invalid_cdb(1, Some(7)));
        }
        if req.protection_field_usage != own.1 {
            return Err(invalid_param(0, Some(2)));
        }
        self.check_writable()?;
        let _whole = self.ranges.exclusive(0, u64::MAX);
        let deallocate = self.offers_block_erase();
        if deallocate {
            super::sanitize::deallocate_all(
                &*self.cfg.backstore,
                self.cfg.pi_store.as_ref(),
                self.cfg.block_size,
            )?;
        } else {
            self.cfg
                .backstore
                .flush()
                .map_err(|e| backstore_failure(&e, true, 0))?;
        }
        tracing::info!(deallocated = deallocate, "FORMAT UNIT done");
        Ok(Done::none())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cdb(byte1: u8) -> [u8; 6] {
        [FORMAT_UNIT, byte1, 0, 0, 0, 0]
    }

    #[test]
    fn without_a_parameter_list_only_fmtpinfo_counts() {
        assert_eq!(
            parse(&cdb(0x80), &[]).unwrap(),
            FormatRequest {
                fmtpinfo: 2,
                protection_field_usage: 0
            }
        );
        assert!(parse(&cdb(0x01), &[]).is_err(), "a defect list format");
        let mut fast = cdb(0);
        fast[4] = 1;
        assert!(parse(&fast, &[]).is_err(), "fast format");
        assert!(parse(&[FORMAT_UNIT, 0], &[]).is_err(), "short CDB");
    }

    #[test]
    fn parameter_list_headers_short_and_long() {
        // Short header: PROTECTION FIELD USAGE 0, FOV=0, no defects.
        assert!(parse(&cdb(0x10), &[0, 0, 0, 0]).is_ok());
        assert!(parse(&cdb(0x10), &[0, 0, 0]).is_err(), "header cut short");
        assert!(parse(&cdb(0x10), &[0, 0, 0, 8]).is_err(), "a defect list");
        assert!(
            parse(&cdb(0x10), &[0, 0x40, 0, 0]).is_err(),
            "DPRY without FOV"
        );
        assert!(parse(&cdb(0x10), &[0, 0xc0, 0, 0]).is_ok(), "DPRY with FOV");
        assert!(
            parse(&cdb(0x10), &[0, 0x88, 0, 0]).is_err(),
            "an initialization pattern"
        );
        assert_eq!(
            parse(&cdb(0x10), &[1, 0, 0, 0])
                .unwrap()
                .protection_field_usage,
            1
        );
        // Long header: the defect list length is 4 bytes; P_I_INFORMATION
        // and the interval exponent must be 0.
        assert!(parse(&cdb(0x30), &[0, 0, 0, 0, 0, 0, 0, 0]).is_ok());
        assert!(
            parse(&cdb(0x30), &[0, 0, 0, 0]).is_err(),
            "short header for LONGLIST"
        );
        assert!(parse(&cdb(0x30), &[0, 0, 0, 0x10, 0, 0, 0, 0]).is_err());
        assert!(parse(&cdb(0x30), &[0, 0, 0, 0, 0, 0, 1, 0]).is_err());
        assert!(
            parse(&cdb(0x12), &[0, 0, 0, 0]).is_err(),
            "reserved list format"
        );
    }

    proptest::proptest! {
        /// Any CDB and parameter bytes are answered without a panic, and
        /// whatever is accepted asks for no defect list.
        #[test]
        fn any_request_is_checked_without_panicking(
            cdb in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..8),
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..12),
        ) {
            if parse(&cdb, &data).is_ok() && cdb.get(1).is_some_and(|b| b & 0x10 != 0) {
                let long = cdb[1] & 0x20 != 0;
                let len = if long { &data[4..8] } else { &data[2..4] };
                proptest::prop_assert!(len.iter().all(|&b| b == 0));
            }
        }
    }
}
