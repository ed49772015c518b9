//! Standard INQUIRY data (SPC-4 6.6.2).

use super::error::{need, DataError};
use super::wire::{ascii_field, be16, bit, flag, trim_ascii, u8_at};

/// The PERIPHERAL QUALIFIER / PERIPHERAL DEVICE TYPE byte that opens INQUIRY
/// data and every VPD page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Peripheral {
    /// PERIPHERAL QUALIFIER (3 bits): 0 connected, 1 not connected, 3 no
    /// logical unit possible.
    pub qualifier: u8,
    /// PERIPHERAL DEVICE TYPE (5 bits): 00h direct access block device.
    pub device_type: u8,
}

impl Peripheral {
    /// A connected direct-access block device (disk): byte 00h.
    pub const DIRECT_ACCESS: Self = Self {
        qualifier: 0,
        device_type: 0,
    };
    /// No logical unit at this LUN: byte 7Fh, as SPC-4 requires for INQUIRY
    /// to an unsupported LUN.
    pub const NO_LUN: Self = Self {
        qualifier: 3,
        device_type: 0x1f,
    };

    /// Splits the wire byte.
    pub fn from_byte(b: u8) -> Self {
        Self {
            qualifier: b >> 5,
            device_type: b & 0x1f,
        }
    }

    /// Joins into the wire byte (fields masked to width).
    pub fn to_byte(self) -> u8 {
        (self.qualifier & 7) << 5 | (self.device_type & 0x1f)
    }
}

/// Version descriptor values (SPC-4 table 148) a disk target claims.
pub mod version_descriptor {
    /// SAM-5 (no version claimed).
    pub const SAM_5: u16 = 0x00a0;
    /// SPC-4 (no version claimed).
    pub const SPC_4: u16 = 0x0460;
    /// SBC-3 (no version claimed).
    pub const SBC_3: u16 = 0x04c0;
    /// iSCSI (no version claimed).
    pub const ISCSI: u16 = 0x0960;
}

/// VERSION value claiming SPC-4.
pub const VERSION_SPC4: u8 = 0x06;
/// Length of standard INQUIRY data this crate writes.
pub const STANDARD_INQUIRY_LEN: usize = 96;
/// Shortest standard INQUIRY data SPC-4 allows a device to return.
pub const STANDARD_INQUIRY_MIN_LEN: usize = 36;

/// Standard INQUIRY data.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StandardInquiry {
    /// Peripheral qualifier and device type.
    pub peripheral: Peripheral,
    /// RMB: removable medium.
    pub rmb: bool,
    /// VERSION (06h = SPC-4).
    pub version: u8,
    /// NORMACA: supports NACA=1 in the control byte.
    pub normaca: bool,
    /// HISUP: hierarchical LUN addressing.
    pub hisup: bool,
    /// RESPONSE DATA FORMAT (4 bits; always 2).
    pub response_data_format: u8,
    /// SCCS: embedded storage array controller.
    pub sccs: bool,
    /// ACC: access controls coordinator.
    pub acc: bool,
    /// TPGS (2 bits): 01b implicit ALUA, 10b explicit, 11b both.
    pub tpgs: u8,
    /// 3PC: third-party copy (EXTENDED COPY) supported.
    pub three_pc: bool,
    /// PROTECT: protection information supported.
    pub protect: bool,
    /// ENCSERV: embedded enclosure services.
    pub encserv: bool,
    /// MULTIP: multiple SCSI ports.
    pub multip: bool,
    /// CMDQUE: full task management model (command queuing).
    pub cmdque: bool,
    /// T10 VENDOR IDENTIFICATION, space padded ASCII.
    pub vendor: [u8; 8],
    /// PRODUCT IDENTIFICATION, space padded ASCII.
    pub product: [u8; 16],
    /// PRODUCT REVISION LEVEL, space padded ASCII.
    pub revision: [u8; 4],
    /// VERSION DESCRIPTORs (at most 8; zero entries are dropped on decode).
    pub version_descriptors: Vec<u16>,
}

impl StandardInquiry {
    /// A disk as blockwire presents it: SPC-4, response data format 2,
    /// HiSup, CmdQue, with identification strings space padded (and
    /// truncated) to their field sizes.
    pub fn new(vendor: &str, product: &str, revision: &str) -> Self {
        Self {
            peripheral: Peripheral::DIRECT_ACCESS,
            rmb: false,
            version: VERSION_SPC4,
            normaca: false,
            hisup: true,
            response_data_format: 2,
            sccs: false,
            acc: false,
            tpgs: 0,
            three_pc: false,
            protect: false,
            encserv: false,
            multip: false,
            cmdque: true,
            vendor: ascii_field(vendor),
            product: ascii_field(product),
            revision: ascii_field(revision),
            version_descriptors: vec![
                version_descriptor::SAM_5,
                version_descriptor::ISCSI,
                version_descriptor::SPC_4,
                version_descriptor::SBC_3,
            ],
        }
    }

    /// Vendor identification without padding.
    pub fn vendor_str(&self) -> String {
        trim_ascii(&self.vendor)
    }

    /// Product identification without padding.
    pub fn product_str(&self) -> String {
        trim_ascii(&self.product)
    }

    /// Product revision without padding.
    pub fn revision_str(&self) -> String {
        trim_ascii(&self.revision)
    }

    /// Encodes the full 96-byte form; the target truncates to the
    /// ALLOCATION LENGTH. Only the first 8 version descriptors are sent.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; STANDARD_INQUIRY_LEN];
        let head = [
            self.peripheral.to_byte(),
            flag(self.rmb, 7),
            self.version,
            flag(self.normaca, 5) | flag(self.hisup, 4) | (self.response_data_format & 0x0f),
            (STANDARD_INQUIRY_LEN - 5) as u8,
            flag(self.sccs, 7)
                | flag(self.acc, 6)
                | (self.tpgs & 3) << 4
                | flag(self.three_pc, 3)
                | flag(self.protect, 0),
            flag(self.encserv, 6) | flag(self.multip, 4),
            flag(self.cmdque, 1),
        ];
        let mut descs = [0u8; 16];
        for (dst, d) in descs.chunks_exact_mut(2).zip(&self.version_descriptors) {
            dst.copy_from_slice(&d.to_be_bytes());
        }
        for (off, src) in [
            (0, &head[..]),
            (8, &self.vendor[..]),
            (16, &self.product[..]),
            (32, &self.revision[..]),
            (58, &descs[..]),
        ] {
            if let Some(d) = b.get_mut(off..off + src.len()) {
                d.copy_from_slice(src);
            }
        }
        b
    }

    /// Parses standard INQUIRY data of at least 36 bytes. Fuzz entry point.
    pub fn decode(buf: &[u8]) -> Result<Self, DataError> {
        let b = need(buf, STANDARD_INQUIRY_MIN_LEN)?;
        let at = |i| u8_at(b, i).unwrap_or(0);
        let mut vendor = [0u8; 8];
        let mut product = [0u8; 16];
        let mut revision = [0u8; 4];
        for (dst, off) in [
            (&mut vendor[..], 8),
            (&mut product[..], 16),
            (&mut revision[..], 32),
        ] {
            if let Some(src) = b.get(off..off + dst.len()) {
                dst.copy_from_slice(src);
            }
        }
        // Version descriptors only count within ADDITIONAL LENGTH.
        let end = buf.len().min(5 + usize::from(at(4)));
        let version_descriptors = (0..8)
            .filter_map(|i| {
                let off = 58 + 2 * i;
                if off + 2 > end {
                    return None;
                }
                be16(buf, off).filter(|&d| d != 0)
            })
            .collect();
        Ok(Self {
            peripheral: Peripheral::from_byte(at(0)),
            rmb: bit(at(1), 7),
            version: at(2),
            normaca: bit(at(3), 5),
            hisup: bit(at(3), 4),
            response_data_format: at(3) & 0x0f,
            sccs: bit(at(5), 7),
            acc: bit(at(5), 6),
            tpgs: (at(5) >> 4) & 3,
            three_pc: bit(at(5), 3),
            protect: bit(at(5), 0),
            encserv: bit(at(6), 6),
            multip: bit(at(6), 4),
            cmdque: bit(at(7), 1),
            vendor,
            product,
            revision,
            version_descriptors,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blockwire_disk() {
        let inq = StandardInquiry::new("BLOCKWRE", "disk", "0.1");
        let b = inq.encode();
        assert_eq!(b.len(), 96);
        assert_eq!(b.get(..8), Some(&[0, 0, 6, 0x12, 91, 0, 0, 2][..]));
        assert_eq!(b.get(8..16), Some(&b"BLOCKWRE"[..]));
        assert_eq!(b.get(16..32), Some(&b"disk            "[..]));
        assert_eq!(b.get(32..36), Some(&b"0.1 "[..]));
        assert_eq!(b.get(58..60), Some(&[0x00, 0xa0][..]));
        let d = StandardInquiry::decode(&b).unwrap();
        assert_eq!(d, inq);
        assert_eq!(d.product_str(), "disk");
        // A 36-byte answer (allocation length 36) still decodes.
        let short = StandardInquiry::decode(b.get(..36).unwrap()).unwrap();
        assert!(short.version_descriptors.is_empty());
        assert_eq!(
            StandardInquiry::decode(&b[..35]),
            Err(DataError::Truncated {
                needed: 36,
                got: 35
            })
        );
    }

    #[test]
    fn peripheral_byte() {
        assert_eq!(Peripheral::NO_LUN.to_byte(), 0x7f);
        assert_eq!(Peripheral::from_byte(0x7f), Peripheral::NO_LUN);
    }
}
