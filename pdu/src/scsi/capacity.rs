//! READ CAPACITY(10) and READ CAPACITY(16) parameter data (SBC-3 5.16, 5.17).

use super::error::{need, DataError};
use super::wire::{be16, be32, be64, bit, flag, u8_at};

/// READ CAPACITY(10) data: 8 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadCapacity10 {
    /// RETURNED LOGICAL BLOCK ADDRESS: the last LBA, or FFFFFFFFh when the
    /// capacity needs READ CAPACITY(16).
    pub returned_lba: u32,
    /// LOGICAL BLOCK LENGTH IN BYTES.
    pub block_length: u32,
}

impl ReadCapacity10 {
    /// Data for a medium of `blocks` logical blocks; saturates at FFFFFFFFh,
    /// which tells the initiator to use READ CAPACITY(16).
    pub fn for_capacity(blocks: u64, block_length: u32) -> Self {
        let last = blocks.saturating_sub(1);
        Self {
            returned_lba: u32::try_from(last).unwrap_or(u32::MAX),
            block_length,
        }
    }

    /// The 8 wire bytes.
    pub fn encode(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        let [a0, a1, a2, a3] = self.returned_lba.to_be_bytes();
        let [l0, l1, l2, l3] = self.block_length.to_be_bytes();
        b.copy_from_slice(&[a0, a1, a2, a3, l0, l1, l2, l3]);
        b
    }

    /// Parses 8 bytes. Fuzz entry point.
    pub fn decode(buf: &[u8]) -> Result<Self, DataError> {
        let b = need(buf, 8)?;
        Ok(Self {
            returned_lba: be32(b, 0).unwrap_or(0),
            block_length: be32(b, 4).unwrap_or(0),
        })
    }
}

/// Length of READ CAPACITY(16) data.
pub const READ_CAPACITY_16_LEN: usize = 32;

/// READ CAPACITY(16) data: 32 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadCapacity16 {
    /// RETURNED LOGICAL BLOCK ADDRESS: the last LBA.
    pub returned_lba: u64,
    /// LOGICAL BLOCK LENGTH IN BYTES.
    pub block_length: u32,
    /// RC BASIS (2 bits, SBC-4).
    pub rc_basis: u8,
    /// P_TYPE (3 bits): protection type minus one.
    pub p_type: u8,
    /// PROT_EN: protection information enabled.
    pub prot_en: bool,
    /// P_I_EXPONENT (4 bits).
    pub p_i_exponent: u8,
    /// LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT (4 bits), e.g. 3 for 512e
    /// on 4K sectors.
    pub lbppbe: u8,
    /// LBPME: logical block provisioning (thin, UNMAP) enabled.
    pub lbpme: bool,
    /// LBPRZ: unmapped blocks read as zero.
    pub lbprz: bool,
    /// LOWEST ALIGNED LOGICAL BLOCK ADDRESS (14 bits).
    pub lowest_aligned_lba: u16,
}

impl ReadCapacity16 {
    /// Plain (non-thin, unprotected) data for `blocks` logical blocks.
    pub fn for_capacity(blocks: u64, block_length: u32) -> Self {
        Self {
            returned_lba: blocks.saturating_sub(1),
            block_length,
            rc_basis: 0,
            p_type: 0,
            prot_en: false,
            p_i_exponent: 0,
            lbppbe: 0,
            lbpme: false,
            lbprz: false,
            lowest_aligned_lba: 0,
        }
    }

    /// The 32 wire bytes.
    pub fn encode(&self) -> [u8; READ_CAPACITY_16_LEN] {
        let mut b = [0u8; READ_CAPACITY_16_LEN];
        let [h, l] = (self.lowest_aligned_lba & 0x3fff).to_be_bytes();
        let flags = [
            (self.rc_basis & 3) << 4 | (self.p_type & 7) << 1 | flag(self.prot_en, 0),
            (self.p_i_exponent & 0x0f) << 4 | (self.lbppbe & 0x0f),
            flag(self.lbpme, 7) | flag(self.lbprz, 6) | h,
            l,
        ];
        for (off, src) in [
            (0, &self.returned_lba.to_be_bytes()[..]),
            (8, &self.block_length.to_be_bytes()[..]),
            (12, &flags[..]),
        ] {
            if let Some(d) = b.get_mut(off..off + src.len()) {
                d.copy_from_slice(src);
            }
        }
        b
    }

    /// Parses at least the first 12 bytes (LBA and block length); the
    /// remaining fields read as zero when an initiator asked for fewer than
    /// 32 bytes. Fuzz entry point.
    pub fn decode(buf: &[u8]) -> Result<Self, DataError> {
        let b = need(buf, 12)?;
        let at = |i| u8_at(buf, i).unwrap_or(0);
        Ok(Self {
            returned_lba: be64(b, 0).unwrap_or(0),
            block_length: be32(b, 8).unwrap_or(0),
            rc_basis: (at(12) >> 4) & 3,
            p_type: (at(12) >> 1) & 7,
            prot_en: bit(at(12), 0),
            p_i_exponent: at(13) >> 4,
            lbppbe: at(13) & 0x0f,
            lbpme: bit(at(14), 7),
            lbprz: bit(at(14), 6),
            lowest_aligned_lba: be16(buf, 14).unwrap_or(0) & 0x3fff,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rc10_saturates() {
        let d = ReadCapacity10::for_capacity(1 << 33, 512);
        assert_eq!(d.encode(), [0xff, 0xff, 0xff, 0xff, 0, 0, 2, 0]);
        let d = ReadCapacity10::for_capacity(2048, 4096);
        assert_eq!(d.encode(), [0, 0, 0x07, 0xff, 0, 0, 0x10, 0]);
        assert_eq!(ReadCapacity10::decode(&d.encode()).unwrap(), d);
        assert!(ReadCapacity10::decode(&[0; 7]).is_err());
    }

    #[test]
    fn rc16_bits() {
        let mut d = ReadCapacity16::for_capacity(1 << 33, 512);
        d.lbpme = true;
        d.lbprz = true;
        d.lbppbe = 3;
        d.lowest_aligned_lba = 0x1234;
        let b = d.encode();
        assert_eq!(b.get(..8), Some(&[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff][..]));
        assert_eq!(b.get(13..16), Some(&[0x03, 0xd2, 0x34][..]));
        assert_eq!(ReadCapacity16::decode(&b).unwrap(), d);
    }
}
