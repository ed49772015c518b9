//! SAM-5 LUN encoding and REPORT LUNS parameter data (SPC-4 6.33).
//!
//! blockwire uses single level LUNs: peripheral device addressing (00b)
//! below 256 and flat space addressing (01b) up to 16383, as Linux and most
//! targets do.

use super::error::{need, DataError};
use super::wire::{array, be32};

/// A single level LUN, 0..=16383.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lun(u16);

impl Lun {
    /// Largest LUN with flat space addressing.
    pub const MAX: u16 = 0x3fff;

    /// The LUN, or `None` when it does not fit 14 bits.
    pub const fn new(v: u16) -> Option<Lun> {
        if v <= Self::MAX {
            Some(Lun(v))
        } else {
            None
        }
    }

    /// The LUN number.
    pub const fn value(self) -> u16 {
        self.0
    }

    /// The 8-byte wire form: peripheral addressing for LUN < 256, flat
    /// space addressing otherwise.
    pub fn encode(self) -> [u8; 8] {
        let [hi, lo] = self.0.to_be_bytes();
        let first = if self.0 < 256 { 0 } else { 0x40 | (hi & 0x3f) };
        [first, lo, 0, 0, 0, 0, 0, 0]
    }

    /// Parses the first 8 bytes of `buf`. Accepts peripheral addressing with
    /// bus 0 and flat space addressing; anything else (hierarchical LUNs,
    /// logical unit or extended addressing) is an invalid field. Fuzz entry
    /// point.
    pub fn decode(buf: &[u8]) -> Result<Lun, DataError> {
        let b: [u8; 8] = array(need(buf, 8)?, 0).unwrap_or_default();
        let [b0, b1, rest @ ..] = b;
        if let Some(i) = rest.iter().position(|&x| x != 0) {
            return Err(DataError::InvalidField {
                byte: 2 + i,
                bit: None,
            });
        }
        match b0 >> 6 {
            0 if b0 == 0 => Ok(Lun(u16::from(b1))),
            1 => Ok(Lun(u16::from_be_bytes([b0 & 0x3f, b1]))),
            _ => Err(DataError::InvalidField {
                byte: 0,
                bit: Some(7),
            }),
        }
    }
}

impl std::fmt::Display for Lun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// REPORT LUNS parameter data: the LUN list as 8-byte entries.
///
/// Entries are kept raw so an initiator can list LUNs of targets that use
/// addressing methods [`Lun`] does not model.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ReportLuns {
    /// The 8-byte LUN entries, in order.
    pub luns: Vec<[u8; 8]>,
}

impl ReportLuns {
    /// A list of single level LUNs.
    pub fn from_luns(luns: impl IntoIterator<Item = Lun>) -> Self {
        Self {
            luns: luns.into_iter().map(Lun::encode).collect(),
        }
    }

    /// Entries decoded as [`Lun`]s, each with its own result.
    pub fn single_level(&self) -> impl Iterator<Item = Result<Lun, DataError>> + '_ {
        self.luns.iter().map(|l| Lun::decode(l))
    }

    /// Wire form: LUN LIST LENGTH, 4 reserved bytes, then the entries. The
    /// target truncates to the ALLOCATION LENGTH.
    pub fn encode(&self) -> Vec<u8> {
        let len = u32::try_from(self.luns.len().saturating_mul(8)).unwrap_or(!7);
        let mut b = Vec::with_capacity(8 + self.luns.len() * 8);
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(&[0; 4]);
        for l in &self.luns {
            b.extend_from_slice(l);
        }
        b
    }

    /// Parses the list; `Truncated` (with the length needed) when the
    /// allocation length cut it short. Fuzz entry point.
    pub fn decode(buf: &[u8]) -> Result<Self, DataError> {
        let len = be32(need(buf, 8)?, 0).unwrap_or(0) as usize;
        if len & 7 != 0 {
            return Err(DataError::InvalidField { byte: 0, bit: None });
        }
        let body = need(buf, 8usize.saturating_add(len))?
            .get(8..)
            .unwrap_or_default();
        Ok(Self {
            luns: body
                .chunks_exact(8)
                .filter_map(|c| c.try_into().ok())
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addressing_methods() {
        assert_eq!(Lun::new(0).unwrap().encode(), [0; 8]);
        assert_eq!(Lun::new(5).unwrap().encode(), [0, 5, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            Lun::new(256).unwrap().encode(),
            [0x41, 0x00, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            Lun::new(0x3fff).unwrap().encode(),
            [0x7f, 0xff, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(Lun::new(0x4000), None);
        // Flat addressing of a small LUN is accepted too.
        assert_eq!(
            Lun::decode(&[0x40, 7, 0, 0, 0, 0, 0, 0]).unwrap().value(),
            7
        );
        // Bus number != 0 with peripheral addressing is not single level 0.
        assert!(Lun::decode(&[0x01, 7, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(Lun::decode(&[0, 7, 0, 1, 0, 0, 0, 0]).is_err());
        assert!(Lun::decode(&[0xc0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(Lun::decode(&[0; 7]).is_err());
    }

    #[test]
    fn report_luns() {
        let r = ReportLuns::from_luns([0, 1, 300].into_iter().filter_map(Lun::new));
        let b = r.encode();
        assert_eq!(b.get(..8), Some(&[0, 0, 0, 24, 0, 0, 0, 0][..]));
        assert_eq!(ReportLuns::decode(&b).unwrap(), r);
        assert_eq!(
            ReportLuns::decode(b.get(..16).unwrap()),
            Err(DataError::Truncated {
                needed: 32,
                got: 16
            })
        );
        let luns: Vec<_> = r.single_level().map(|l| l.unwrap().value()).collect();
        assert_eq!(luns, vec![0, 1, 300]);
    }
}
