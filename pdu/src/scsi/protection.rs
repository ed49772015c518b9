//! T10 protection information (SBC-3 4.18): the 8 bytes that follow each
//! logical block of a unit formatted with protection, and the checks the
//! RDPROTECT, WRPROTECT and VRPROTECT fields ask for.
//!
//! A tuple is LOGICAL BLOCK GUARD (CRC-16 T10-DIF of the block's user data),
//! LOGICAL BLOCK APPLICATION TAG and LOGICAL BLOCK REFERENCE TAG (for Type 1
//! protection the low 32 bits of the block's LBA), all big-endian. Where
//! protection information travels with the data, each block's user data is
//! followed directly by its tuple.

/// Bytes of protection information per logical block.
pub const TUPLE_BYTES: usize = 8;

/// An application tag of FFFFh tells the device server not to check the
/// block at all (Type 1 and 2: SBC-3 4.18.4); unwritten and unmapped blocks
/// carry it.
pub const ESCAPE_APP_TAG: u16 = 0xFFFF;

/// CRC-16 T10-DIF (polynomial 8BB7h, initial value 0, no reflection, no
/// final XOR) over one block: the LOGICAL BLOCK GUARD.
///
/// Sixteen bytes per step ("slicing by 16"): every block a protected unit
/// reads or writes goes through here, and one table lookup per byte held
/// a 1 MiB READ to a fraction of the rate of an unprotected one.
pub fn crc16_t10dif(data: &[u8]) -> u16 {
    let mut crc = 0u16;
    let mut chunks = data.chunks_exact(SLICES);
    for c in &mut chunks {
        // The register's two bytes meet the first two data bytes; each
        // byte's contribution is its CRC followed by as many zero bytes as
        // come after it in the chunk (table SLICES - 1 - its position).
        let mut next = CRC_TABLES[SLICES - 1][usize::from((crc >> 8) as u8 ^ c[0])]
            ^ CRC_TABLES[SLICES - 2][usize::from(crc as u8 ^ c[1])];
        for (k, &b) in c.iter().enumerate().skip(2) {
            next ^= CRC_TABLES[SLICES - 1 - k][usize::from(b)];
        }
        crc = next;
    }
    for &b in chunks.remainder() {
        crc = (crc << 8) ^ CRC_TABLES[0][usize::from((crc >> 8) as u8 ^ b)];
    }
    crc
}

const POLY: u16 = 0x8BB7;

/// Bytes [`crc16_t10dif`] takes per step.
const SLICES: usize = 16;

/// `CRC_TABLES[0][b]`: the CRC of the byte `b`; `CRC_TABLES[k][b]`: the CRC
/// of `b` followed by `k` zero bytes.
const CRC_TABLES: [[u16; 256]; SLICES] = {
    let mut tables = [[0u16; 256]; SLICES];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ POLY
            } else {
                crc << 1
            };
            bit += 1;
        }
        tables[0][i] = crc;
        i += 1;
    }
    let mut k = 1;
    while k < SLICES {
        let mut i = 0;
        while i < 256 {
            let prev = tables[k - 1][i];
            tables[k][i] = (prev << 8) ^ tables[0][(prev >> 8) as usize];
            i += 1;
        }
        k += 1;
    }
    tables
};

/// One block's protection information.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PiTuple {
    /// LOGICAL BLOCK GUARD: CRC-16 T10-DIF of the user data.
    pub guard: u16,
    /// LOGICAL BLOCK APPLICATION TAG: owned by the application client.
    pub app_tag: u16,
    /// LOGICAL BLOCK REFERENCE TAG: for Type 1, the LBA's low 32 bits.
    pub ref_tag: u32,
}

impl PiTuple {
    /// The tuple a device server generates for `block` at `lba` (Type 1,
    /// application tag 0): what a write without protection information
    /// stores.
    pub fn generate(block: &[u8], lba: u64) -> PiTuple {
        PiTuple {
            guard: crc16_t10dif(block),
            app_tag: 0,
            ref_tag: lba as u32,
        }
    }

    /// The tuple of a block nobody wrote: every byte FFh (its application
    /// tag is the escape, so it is never checked).
    pub const UNWRITTEN: PiTuple = PiTuple {
        guard: 0xFFFF,
        app_tag: ESCAPE_APP_TAG,
        ref_tag: 0xFFFF_FFFF,
    };

    /// The 8 wire bytes.
    pub fn encode(&self) -> [u8; TUPLE_BYTES] {
        let mut b = [0u8; TUPLE_BYTES];
        b[..2].copy_from_slice(&self.guard.to_be_bytes());
        b[2..4].copy_from_slice(&self.app_tag.to_be_bytes());
        b[4..].copy_from_slice(&self.ref_tag.to_be_bytes());
        b
    }

    /// The tuple in 8 wire bytes.
    pub fn decode(b: &[u8; TUPLE_BYTES]) -> PiTuple {
        PiTuple {
            guard: u16::from_be_bytes([b[0], b[1]]),
            app_tag: u16::from_be_bytes([b[2], b[3]]),
            ref_tag: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
        }
    }

    /// The first check of `checks` this tuple fails for `block` at `lba`,
    /// if any. A tuple with the escape application tag passes every check.
    pub fn check(&self, block: &[u8], lba: u64, checks: PiChecks) -> Option<PiCheckFailure> {
        self.check_with(|| crc16_t10dif(block), lba, checks)
    }

    /// [`PiTuple::check`] with the block's guard from `guard`, called only
    /// when the guard is checked: for a caller with a CRC of its own (the
    /// target's folds on CPUs that multiply without carries).
    pub fn check_with(
        &self,
        guard: impl FnOnce() -> u16,
        lba: u64,
        checks: PiChecks,
    ) -> Option<PiCheckFailure> {
        if self.app_tag == ESCAPE_APP_TAG {
            return None;
        }
        if checks.guard && self.guard != guard() {
            return Some(PiCheckFailure::Guard);
        }
        if checks.reference && self.ref_tag != lba as u32 {
            return Some(PiCheckFailure::ReferenceTag);
        }
        None
    }
}

/// Which parts of a tuple a command has checked (SBC-3 tables for
/// RDPROTECT, WRPROTECT and VRPROTECT, Type 1, ATO=0: the application tag
/// belongs to the application client and is never checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PiChecks {
    /// LOGICAL BLOCK GUARD against the user data.
    pub guard: bool,
    /// LOGICAL BLOCK REFERENCE TAG against the LBA.
    pub reference: bool,
}

impl PiChecks {
    /// Everything: what a device server does with the tuples it keeps
    /// when the command carries none (a *PROTECT field of 000b).
    pub const ALL: PiChecks = PiChecks {
        guard: true,
        reference: true,
    };

    /// The checks for a RDPROTECT, WRPROTECT or VRPROTECT value on a unit
    /// formatted with Type 1 protection; `None` for the reserved values
    /// (110b, 111b), which are INVALID FIELD IN CDB. 000b is [`Self::ALL`]
    /// (the device server's own tuples, none transferred).
    pub fn for_field(protect: u8) -> Option<PiChecks> {
        let (guard, reference) = match protect {
            0 | 1 | 5 => (true, true),
            2 => (false, true),
            3 => (false, false),
            4 => (true, false),
            _ => return None,
        };
        Some(PiChecks { guard, reference })
    }
}

/// The check a tuple failed: the additional sense code of the ABORTED
/// COMMAND that reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PiCheckFailure {
    /// LOGICAL BLOCK GUARD CHECK FAILED (10h/01h).
    Guard,
    /// LOGICAL BLOCK REFERENCE TAG CHECK FAILED (10h/03h).
    ReferenceTag,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The CRC computed one bit at a time, as SBC-3 defines it.
    fn crc_bitwise(data: &[u8]) -> u16 {
        let mut crc = 0u16;
        for &b in data {
            crc ^= u16::from(b) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ POLY
                } else {
                    crc << 1
                };
            }
        }
        crc
    }

    #[test]
    fn guard_of_the_catalogue_check_string() {
        // CRC-16/T10-DIF's check value in the CRC catalogue.
        assert_eq!(crc16_t10dif(b"123456789"), 0xD0DB);
        assert_eq!(crc16_t10dif(&[0u8; 512]), 0);
    }

    #[test]
    fn sixteen_bytes_a_step_agree_with_one_at_a_time_at_every_length() {
        let data: Vec<u8> = (0..4200u32).map(|i| (i * 131 + i / 7) as u8).collect();
        for len in (0..64).chain([511, 512, 513, 4095, 4096, 4200]) {
            assert_eq!(
                crc16_t10dif(&data[..len]),
                crc_bitwise(&data[..len]),
                "{len} bytes"
            );
        }
    }

    #[test]
    fn reserved_protect_values_have_no_checks() {
        assert_eq!(PiChecks::for_field(6), None);
        assert_eq!(PiChecks::for_field(7), None);
        assert_eq!(PiChecks::for_field(0), Some(PiChecks::ALL));
    }

    #[test]
    fn unwritten_tuple_is_all_ff_and_never_fails() {
        assert_eq!(PiTuple::UNWRITTEN.encode(), [0xFF; 8]);
        assert_eq!(PiTuple::UNWRITTEN.check(&[1; 512], 7, PiChecks::ALL), None);
    }

    proptest! {
        #[test]
        fn table_crc_matches_the_bitwise_definition(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
            prop_assert_eq!(crc16_t10dif(&data), crc_bitwise(&data));
        }

        #[test]
        fn tuple_round_trips(guard: u16, app_tag: u16, ref_tag: u32) {
            let t = PiTuple { guard, app_tag, ref_tag };
            prop_assert_eq!(PiTuple::decode(&t.encode()), t);
        }

        #[test]
        fn generated_tuple_passes_and_one_flipped_bit_fails_the_guard(
            block in proptest::collection::vec(any::<u8>(), 512),
            lba: u64,
            bit in 0usize..4096,
        ) {
            let t = PiTuple::generate(&block, lba);
            prop_assert_eq!(t.check(&block, lba, PiChecks::ALL), None);
            let mut bad = block.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            // CRC-16 detects every single-bit error.
            prop_assert_eq!(t.check(&bad, lba, PiChecks::ALL), Some(PiCheckFailure::Guard));
            prop_assert_eq!(
                t.check(&block, lba.wrapping_add(1), PiChecks::ALL),
                Some(PiCheckFailure::ReferenceTag)
            );
            prop_assert_eq!(t.check(&bad, lba.wrapping_add(1), PiChecks::for_field(3).unwrap()), None);
        }
    }
}
