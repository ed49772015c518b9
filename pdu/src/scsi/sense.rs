//! Sense data (SPC-4 4.5): sense keys, the sense-key-specific field, fixed
//! (0x70/0x71) and descriptor (0x72/0x73) formats, and the iSCSI SenseLength
//! framing of the SCSI Response data segment (RFC 7143 11.4.7.2).

use std::fmt;

use super::asc::{asc_name, Asc};
use super::wire::{array, be16, be32, be64, bit, flag, u8_at};

/// SENSE KEY (SPC-4 table 27): the broad class of a CHECK CONDITION.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SenseKey {
    /// 0h NO SENSE.
    NoSense,
    /// 1h RECOVERED ERROR.
    RecoveredError,
    /// 2h NOT READY.
    NotReady,
    /// 3h MEDIUM ERROR.
    MediumError,
    /// 4h HARDWARE ERROR.
    HardwareError,
    /// 5h ILLEGAL REQUEST.
    IllegalRequest,
    /// 6h UNIT ATTENTION.
    UnitAttention,
    /// 7h DATA PROTECT.
    DataProtect,
    /// 8h BLANK CHECK.
    BlankCheck,
    /// 9h VENDOR SPECIFIC.
    VendorSpecific,
    /// Ah COPY ABORTED.
    CopyAborted,
    /// Bh ABORTED COMMAND.
    AbortedCommand,
    /// Ch (obsolete, formerly EQUAL); kept so every nibble maps to a value.
    Reserved,
    /// Dh VOLUME OVERFLOW.
    VolumeOverflow,
    /// Eh MISCOMPARE.
    Miscompare,
    /// Fh COMPLETED.
    Completed,
}

impl SenseKey {
    /// The key carried in the low nibble of `v` (high bits are ignored, since
    /// the field is four bits wide on the wire).
    pub fn from_nibble(v: u8) -> Self {
        use SenseKey::*;
        match v & 0x0f {
            0x0 => NoSense,
            0x1 => RecoveredError,
            0x2 => NotReady,
            0x3 => MediumError,
            0x4 => HardwareError,
            0x5 => IllegalRequest,
            0x6 => UnitAttention,
            0x7 => DataProtect,
            0x8 => BlankCheck,
            0x9 => VendorSpecific,
            0xa => CopyAborted,
            0xb => AbortedCommand,
            0xc => Reserved,
            0xd => VolumeOverflow,
            0xe => Miscompare,
            _ => Completed,
        }
    }

    /// The four-bit wire value.
    pub fn code(self) -> u8 {
        use SenseKey::*;
        match self {
            NoSense => 0x0,
            RecoveredError => 0x1,
            NotReady => 0x2,
            MediumError => 0x3,
            HardwareError => 0x4,
            IllegalRequest => 0x5,
            UnitAttention => 0x6,
            DataProtect => 0x7,
            BlankCheck => 0x8,
            VendorSpecific => 0x9,
            CopyAborted => 0xa,
            AbortedCommand => 0xb,
            Reserved => 0xc,
            VolumeOverflow => 0xd,
            Miscompare => 0xe,
            Completed => 0xf,
        }
    }

    /// The standard name.
    pub fn name(self) -> &'static str {
        use SenseKey::*;
        match self {
            NoSense => "NO SENSE",
            RecoveredError => "RECOVERED ERROR",
            NotReady => "NOT READY",
            MediumError => "MEDIUM ERROR",
            HardwareError => "HARDWARE ERROR",
            IllegalRequest => "ILLEGAL REQUEST",
            UnitAttention => "UNIT ATTENTION",
            DataProtect => "DATA PROTECT",
            BlankCheck => "BLANK CHECK",
            VendorSpecific => "VENDOR SPECIFIC",
            CopyAborted => "COPY ABORTED",
            AbortedCommand => "ABORTED COMMAND",
            Reserved => "RESERVED (0Ch)",
            VolumeOverflow => "VOLUME OVERFLOW",
            Miscompare => "MISCOMPARE",
            Completed => "COMPLETED",
        }
    }
}

impl fmt::Display for SenseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where an invalid field sits (SPC-4 4.5.2.4.2), so the initiator can tell
/// exactly which byte and bit of its CDB or parameter list was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FieldPointer {
    /// C/D: true when the error is in the CDB, false when in the parameter
    /// list (Data-Out).
    pub in_cdb: bool,
    /// BPV + BIT POINTER: the left-most bit (0..=7) of the invalid field,
    /// when known.
    pub bit: Option<u8>,
    /// FIELD POINTER: the byte offset of the invalid field.
    pub byte: u16,
}

impl FieldPointer {
    /// A pointer into the CDB.
    pub fn cdb(byte: u16, bit: Option<u8>) -> Self {
        Self {
            in_cdb: true,
            bit,
            byte,
        }
    }

    /// A pointer into the parameter list.
    pub fn parameter(byte: u16, bit: Option<u8>) -> Self {
        Self {
            in_cdb: false,
            bit,
            byte,
        }
    }
}

/// SENSE KEY SPECIFIC field (SPC-4 4.5.2.4); its meaning depends on the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SenseKeySpecific {
    /// ILLEGAL REQUEST: the offending field.
    FieldPointer(FieldPointer),
    /// RECOVERED / MEDIUM / HARDWARE ERROR: ACTUAL RETRY COUNT.
    ActualRetryCount(u16),
    /// NO SENSE / NOT READY: PROGRESS INDICATION (fraction of 65536 done).
    Progress(u16),
    /// COPY ABORTED: SEGMENT POINTER.
    SegmentPointer {
        /// SD: the pointer is into the segment descriptor (true) or the
        /// parameter list (false).
        segment_descriptor: bool,
        /// BPV + BIT POINTER.
        bit: Option<u8>,
        /// FIELD POINTER byte offset.
        byte: u16,
    },
    /// UNIT ATTENTION: OVERFLOW bit (the unit attention queue overflowed).
    UnitAttentionQueueOverflow(bool),
    /// Any other key: the three bytes as sent, with SKSV (bit 7 of the first
    /// byte) cleared.
    Other([u8; 3]),
}

impl SenseKeySpecific {
    /// The three wire bytes, with SKSV set.
    pub fn to_bytes(self) -> [u8; 3] {
        let bp = |b: Option<u8>| b.map_or(0, |b| 0x08 | (b & 7));
        let [b0, b1, b2] = match self {
            Self::FieldPointer(p) => {
                let [h, l] = p.byte.to_be_bytes();
                [flag(p.in_cdb, 6) | bp(p.bit), h, l]
            }
            Self::ActualRetryCount(n) | Self::Progress(n) => {
                let [h, l] = n.to_be_bytes();
                [0, h, l]
            }
            Self::SegmentPointer {
                segment_descriptor,
                bit,
                byte,
            } => {
                let [h, l] = byte.to_be_bytes();
                [flag(segment_descriptor, 5) | bp(bit), h, l]
            }
            Self::UnitAttentionQueueOverflow(o) => [flag(o, 0), 0, 0],
            Self::Other(b) => b,
        };
        [0x80 | b0, b1, b2]
    }

    /// Interprets three wire bytes for `key`; `None` when SKSV is clear.
    pub fn from_bytes(key: SenseKey, b: [u8; 3]) -> Option<Self> {
        let [b0, b1, b2] = b;
        if !bit(b0, 7) {
            return None;
        }
        let field = u16::from_be_bytes([b1, b2]);
        let bitp = if bit(b0, 3) { Some(b0 & 7) } else { None };
        Some(match key {
            SenseKey::IllegalRequest => Self::FieldPointer(FieldPointer {
                in_cdb: bit(b0, 6),
                bit: bitp,
                byte: field,
            }),
            SenseKey::RecoveredError | SenseKey::MediumError | SenseKey::HardwareError => {
                Self::ActualRetryCount(field)
            }
            SenseKey::NoSense | SenseKey::NotReady => Self::Progress(field),
            SenseKey::CopyAborted => Self::SegmentPointer {
                segment_descriptor: bit(b0, 5),
                bit: bitp,
                byte: field,
            },
            SenseKey::UnitAttention => Self::UnitAttentionQueueOverflow(bit(b0, 0)),
            _ => Self::Other([b0 & 0x7f, b1, b2]),
        })
    }
}

/// Which sense data format to produce (SPC-4 4.5.1). The target picks it from
/// the control mode page D_SENSE bit or the REQUEST SENSE DESC bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SenseFormat {
    /// Response codes 70h/71h, 18 bytes, 32-bit INFORMATION.
    Fixed,
    /// Response codes 72h/73h, 64-bit INFORMATION in descriptors.
    Descriptor,
}

/// Why sense data could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SenseError {
    /// The buffer ended before the 8-byte header every format has.
    #[error("sense data too short: {len} bytes, need at least 8")]
    TooShort {
        /// Bytes available.
        len: usize,
    },
    /// RESPONSE CODE is not 70h-73h.
    #[error("unsupported sense response code {0:#04x}")]
    ResponseCode(u8),
    /// The iSCSI data segment is shorter than its SenseLength says.
    #[error("iSCSI sense segment: SenseLength {declared} exceeds the {available} bytes present")]
    SegmentLength {
        /// SenseLength from the segment.
        declared: usize,
        /// Bytes after the SenseLength field.
        available: usize,
    },
}

/// Sense data, independent of format.
///
/// INFORMATION carries e.g. the first bad LBA or, for MISCOMPARE, the offset
/// of the first differing byte. In fixed format it is 32 bits wide; a larger
/// value is sent with VALID=0 as SPC-4 requires.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Sense {
    /// Deferred error (71h/73h) rather than current (70h/72h).
    pub deferred: bool,
    /// SENSE KEY.
    pub key: SenseKey,
    /// ADDITIONAL SENSE CODE.
    pub asc: u8,
    /// ADDITIONAL SENSE CODE QUALIFIER.
    pub ascq: u8,
    /// INFORMATION, when valid.
    pub information: Option<u64>,
    /// COMMAND-SPECIFIC INFORMATION (fixed format: 0 reads back as `None`,
    /// since that format has no validity bit for it).
    pub command_specific: Option<u64>,
    /// SENSE KEY SPECIFIC, when SKSV is set.
    pub sks: Option<SenseKeySpecific>,
    /// FIELD REPLACEABLE UNIT CODE (0: none).
    pub fru: u8,
    /// FILEMARK (stream devices).
    pub filemark: bool,
    /// EOM (stream devices).
    pub eom: bool,
    /// ILI: incorrect length indicator.
    pub ili: bool,
    /// SDAT_OVFL: the sense data was truncated to fit.
    pub sdat_ovfl: bool,
}

/// Length of fixed-format sense data this crate writes.
pub const FIXED_SENSE_LEN: usize = 18;

impl Sense {
    /// Current sense with the given key and ASC/ASCQ, no other fields.
    pub fn new(key: SenseKey, code: Asc) -> Self {
        Self {
            deferred: false,
            key,
            asc: code.asc,
            ascq: code.ascq,
            information: None,
            command_specific: None,
            sks: None,
            fru: 0,
            filemark: false,
            eom: false,
            ili: false,
            sdat_ovfl: false,
        }
    }

    /// ILLEGAL REQUEST with a field pointer: the common "your CDB/parameter
    /// list is wrong here" answer.
    pub fn illegal_request(code: Asc, pointer: Option<FieldPointer>) -> Self {
        let mut s = Self::new(SenseKey::IllegalRequest, code);
        s.sks = pointer.map(SenseKeySpecific::FieldPointer);
        s
    }

    /// UNIT ATTENTION with the given ASC/ASCQ.
    pub fn unit_attention(code: Asc) -> Self {
        Self::new(SenseKey::UnitAttention, code)
    }

    /// MISCOMPARE DURING VERIFY OPERATION with the offset of the first
    /// differing byte in INFORMATION (SBC-3 COMPARE AND WRITE).
    pub fn miscompare(offset: u64) -> Self {
        let mut s = Self::new(SenseKey::Miscompare, Asc::MISCOMPARE_DURING_VERIFY);
        s.information = Some(offset);
        s
    }

    /// The ASC/ASCQ pair.
    pub fn code(&self) -> Asc {
        Asc::new(self.asc, self.ascq)
    }

    /// The field pointer, if the sense-key-specific field holds one.
    pub fn field_pointer(&self) -> Option<FieldPointer> {
        match self.sks {
            Some(SenseKeySpecific::FieldPointer(p)) => Some(p),
            _ => None,
        }
    }

    /// Encodes in `format`. Never panics; fields too wide for the fixed
    /// format are marked invalid rather than truncated.
    pub fn encode(&self, format: SenseFormat) -> Vec<u8> {
        match format {
            SenseFormat::Fixed => self.encode_fixed().to_vec(),
            SenseFormat::Descriptor => self.encode_descriptor(),
        }
    }

    fn encode_fixed(&self) -> [u8; FIXED_SENSE_LEN] {
        let mut b = [0u8; FIXED_SENSE_LEN];
        let info = self.information.and_then(|i| u32::try_from(i).ok());
        let code = if self.deferred { 0x71 } else { 0x70 };
        put(&mut b, 0, &[flag(info.is_some(), 7) | code]);
        put(
            &mut b,
            2,
            &[flag(self.filemark, 7)
                | flag(self.eom, 6)
                | flag(self.ili, 5)
                | flag(self.sdat_ovfl, 4)
                | self.key.code()],
        );
        put(&mut b, 3, &info.unwrap_or(0).to_be_bytes());
        put(&mut b, 7, &[(FIXED_SENSE_LEN - 8) as u8]);
        let csi = self.command_specific.and_then(|c| u32::try_from(c).ok());
        put(&mut b, 8, &csi.unwrap_or(0).to_be_bytes());
        put(&mut b, 12, &[self.asc, self.ascq, self.fru]);
        put(
            &mut b,
            15,
            &self.sks.map_or([0; 3], SenseKeySpecific::to_bytes),
        );
        b
    }

    fn encode_descriptor(&self) -> Vec<u8> {
        let code = if self.deferred { 0x73 } else { 0x72 };
        let sdat = flag(self.sdat_ovfl, 7);
        let mut b = vec![code, self.key.code(), self.asc, self.ascq, sdat, 0, 0, 0];
        if let Some(info) = self.information {
            b.extend_from_slice(&[0x00, 0x0a, 0x80, 0]);
            b.extend_from_slice(&info.to_be_bytes());
        }
        if let Some(csi) = self.command_specific {
            b.extend_from_slice(&[0x01, 0x0a, 0, 0]);
            b.extend_from_slice(&csi.to_be_bytes());
        }
        if let Some(sks) = self.sks {
            b.extend_from_slice(&[0x02, 0x06, 0, 0]);
            b.extend_from_slice(&sks.to_bytes());
            b.push(0);
        }
        if self.fru != 0 {
            b.extend_from_slice(&[0x03, 0x02, 0, self.fru]);
        }
        if self.filemark || self.eom {
            // Stream commands descriptor carries all three stream flags.
            let f = flag(self.filemark, 7) | flag(self.eom, 6) | flag(self.ili, 5);
            b.extend_from_slice(&[0x04, 0x02, 0, f]);
        } else if self.ili {
            // Block commands descriptor: ILI only.
            b.extend_from_slice(&[0x05, 0x02, 0, 0x20]);
        }
        let addl = b.len().saturating_sub(8).min(255) as u8;
        if let Some(l) = b.get_mut(7) {
            *l = addl;
        }
        b
    }

    /// Which format a sense buffer uses, from its response code.
    pub fn format_of(buf: &[u8]) -> Result<SenseFormat, SenseError> {
        match u8_at(buf, 0).map(|c| c & 0x7f) {
            Some(0x70 | 0x71) => Ok(SenseFormat::Fixed),
            Some(0x72 | 0x73) => Ok(SenseFormat::Descriptor),
            Some(c) => Err(SenseError::ResponseCode(c)),
            None => Err(SenseError::TooShort { len: 0 }),
        }
    }

    /// Parses sense data of either format. Fuzz entry point: never panics.
    ///
    /// Lenient where real devices are sloppy: fields beyond the buffer or the
    /// ADDITIONAL SENSE LENGTH read as zero, and truncated or unknown
    /// descriptors are skipped.
    pub fn decode(buf: &[u8]) -> Result<Sense, SenseError> {
        let format = Self::format_of(buf)?;
        if buf.len() < 8 {
            return Err(SenseError::TooShort { len: buf.len() });
        }
        let code = u8_at(buf, 0).unwrap_or(0);
        let addl = usize::from(u8_at(buf, 7).unwrap_or(0));
        let end = buf.len().min(8 + addl);
        let body = buf.get(..end).unwrap_or(buf);
        let deferred = code & 0x7f == 0x71 || code & 0x7f == 0x73;
        match format {
            SenseFormat::Fixed => Ok(Self::decode_fixed(body, deferred)),
            SenseFormat::Descriptor => Ok(Self::decode_descriptor(body, deferred)),
        }
    }

    fn decode_fixed(b: &[u8], deferred: bool) -> Sense {
        let at = |i| u8_at(b, i).unwrap_or(0);
        let b2 = at(2);
        let key = SenseKey::from_nibble(b2);
        let valid = bit(at(0), 7);
        let csi = be32(b, 8).unwrap_or(0);
        Sense {
            deferred,
            key,
            asc: at(12),
            ascq: at(13),
            information: if valid {
                be32(b, 3).map(u64::from)
            } else {
                None
            },
            command_specific: (csi != 0).then_some(u64::from(csi)),
            sks: array::<3>(b, 15).and_then(|s| SenseKeySpecific::from_bytes(key, s)),
            fru: at(14),
            filemark: bit(b2, 7),
            eom: bit(b2, 6),
            ili: bit(b2, 5),
            sdat_ovfl: bit(b2, 4),
        }
    }

    fn decode_descriptor(b: &[u8], deferred: bool) -> Sense {
        let at = |i| u8_at(b, i).unwrap_or(0);
        let key = SenseKey::from_nibble(at(1));
        let mut s = Sense::new(key, Asc::new(at(2), at(3)));
        s.deferred = deferred;
        s.sdat_ovfl = bit(at(4), 7);
        let mut off = 8usize;
        while let (Some(kind), Some(len)) = (u8_at(b, off), u8_at(b, off + 1)) {
            let Some(d) = b.get(off..off + 2 + usize::from(len)) else {
                break; // truncated descriptor: ignore the rest
            };
            match (kind, len) {
                (0x00, 0x0a) if bit(u8_at(d, 2).unwrap_or(0), 7) => s.information = be64(d, 4),
                (0x01, 0x0a) => s.command_specific = be64(d, 4),
                (0x02, 0x06) => {
                    s.sks = array::<3>(d, 4).and_then(|x| SenseKeySpecific::from_bytes(key, x))
                }
                (0x03, 0x02) => s.fru = u8_at(d, 3).unwrap_or(0),
                (0x04, 0x02) => {
                    let f = u8_at(d, 3).unwrap_or(0);
                    s.filemark = bit(f, 7);
                    s.eom = bit(f, 6);
                    s.ili = bit(f, 5);
                }
                (0x05, 0x02) => s.ili = bit(u8_at(d, 3).unwrap_or(0), 5),
                _ => {}
            }
            off += 2 + usize::from(len);
        }
        s
    }
}

impl fmt::Display for Sense {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.key)?;
        match asc_name(self.asc, self.ascq) {
            Some(n) => write!(f, ": {n}")?,
            None => write!(f, ": ASC/ASCQ {:02X}/{:02X}", self.asc, self.ascq)?,
        }
        if let Some(i) = self.information {
            write!(f, " (information {i:#x})")?;
        }
        Ok(())
    }
}

/// Copies `src` into `dst` at `off` when it fits (always, for the fixed
/// layouts this is used with); never panics.
fn put(dst: &mut [u8], off: usize, src: &[u8]) {
    if let Some(d) = dst.get_mut(off..off + src.len()) {
        d.copy_from_slice(src);
    }
}

/// Frames sense data for an iSCSI SCSI Response data segment: a 2-byte
/// big-endian SenseLength followed by the sense bytes (RFC 7143 11.4.7.2).
/// Padding to a 4-byte boundary is the PDU layer's job.
pub fn sense_segment(sense: &Sense, format: SenseFormat) -> Vec<u8> {
    let data = sense.encode(format);
    let mut out = Vec::with_capacity(2 + data.len());
    let len = u16::try_from(data.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&data);
    out
}

/// Splits an iSCSI SCSI Response data segment into the sense bytes and any
/// response data that follows them. An empty segment yields two empty
/// slices.
pub fn split_sense_segment(seg: &[u8]) -> Result<(&[u8], &[u8]), SenseError> {
    if seg.is_empty() {
        return Ok((&[], &[]));
    }
    let declared = usize::from(be16(seg, 0).ok_or(SenseError::TooShort { len: seg.len() })?);
    let rest = seg.get(2..).unwrap_or_default();
    if declared > rest.len() {
        return Err(SenseError::SegmentLength {
            declared,
            available: rest.len(),
        });
    }
    Ok(rest.split_at(declared))
}

/// Parses the sense carried by an iSCSI SCSI Response data segment;
/// `Ok(None)` when the segment is empty or SenseLength is 0. Fuzz entry
/// point: never panics.
pub fn parse_sense_segment(seg: &[u8]) -> Result<Option<Sense>, SenseError> {
    let (sense, _) = split_sense_segment(seg)?;
    if sense.is_empty() {
        return Ok(None);
    }
    Sense::decode(sense).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_target_fixed_sense() {
        let b = [
            0x70, 0, 0x05, 0, 0, 0, 0, 0x0a, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0,
        ];
        let s = Sense::decode(&b).unwrap();
        assert_eq!(s.key, SenseKey::IllegalRequest);
        assert_eq!(s.code(), Asc::INVALID_FIELD_IN_CDB);
        assert_eq!(s.information, None);
        assert_eq!(s.sks, None);
        assert_eq!(s.to_string(), "ILLEGAL REQUEST: INVALID FIELD IN CDB");
        assert_eq!(s.encode(SenseFormat::Fixed), b.to_vec());
    }

    #[test]
    fn field_pointer_bytes() {
        // Byte 1, bit 4 of the CDB: C/D=1, BPV=1, bit pointer 4.
        let s = Sense::illegal_request(
            Asc::INVALID_FIELD_IN_CDB,
            Some(FieldPointer::cdb(1, Some(4))),
        );
        let b = s.encode(SenseFormat::Fixed);
        assert_eq!(b.get(15..18), Some(&[0xcc, 0x00, 0x01][..]));
        let d = s.encode(SenseFormat::Descriptor);
        assert_eq!(
            d,
            vec![0x72, 5, 0x24, 0, 0, 0, 0, 8, 0x02, 0x06, 0, 0, 0xcc, 0, 1, 0]
        );
        assert_eq!(Sense::decode(&d).unwrap(), s);
    }

    #[test]
    fn miscompare_info_and_large_info_in_fixed() {
        let s = Sense::miscompare(0x1234);
        let f = s.encode(SenseFormat::Fixed);
        assert_eq!(f.first(), Some(&0xf0));
        assert_eq!(Sense::decode(&f).unwrap().information, Some(0x1234));
        let mut big = s.clone();
        big.information = Some(1 << 40);
        let f = big.encode(SenseFormat::Fixed);
        assert_eq!(Sense::decode(&f).unwrap().information, None);
        let d = big.encode(SenseFormat::Descriptor);
        assert_eq!(Sense::decode(&d).unwrap().information, Some(1 << 40));
    }

    #[test]
    fn short_and_bad_buffers() {
        assert!(Sense::decode(&[]).is_err());
        assert_eq!(
            Sense::decode(&[0x70, 0, 6]),
            Err(SenseError::TooShort { len: 3 })
        );
        assert_eq!(Sense::decode(&[0x00; 8]), Err(SenseError::ResponseCode(0)));
        // Truncated to 8 bytes: ASC reads as 0.
        let s = Sense::decode(&[0x70, 0, 6, 0, 0, 0, 0, 10]).unwrap();
        assert_eq!(s.key, SenseKey::UnitAttention);
        assert_eq!(s.asc, 0);
        // Truncated descriptor is skipped.
        let s = Sense::decode(&[0x72, 3, 0x11, 0, 0, 0, 0, 4, 0, 10, 0x80, 0]).unwrap();
        assert_eq!(s.information, None);
        assert_eq!(s.code(), Asc::UNRECOVERED_READ_ERROR);
    }

    #[test]
    fn iscsi_segment() {
        let s = Sense::unit_attention(Asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET);
        let seg = sense_segment(&s, SenseFormat::Fixed);
        assert_eq!(seg.get(..2), Some(&[0, 18][..]));
        assert_eq!(parse_sense_segment(&seg).unwrap(), Some(s));
        assert_eq!(parse_sense_segment(&[]).unwrap(), None);
        assert_eq!(parse_sense_segment(&[0, 0]).unwrap(), None);
        assert!(matches!(
            parse_sense_segment(&[0, 5, 0x70]),
            Err(SenseError::SegmentLength {
                declared: 5,
                available: 1
            })
        ));
        assert!(parse_sense_segment(&[0]).is_err());
        let mut with_resp = seg.clone();
        with_resp.extend_from_slice(&[1, 2, 3]);
        let (sense, resp) = split_sense_segment(&with_resp).unwrap();
        assert_eq!(sense.len(), 18);
        assert_eq!(resp, &[1, 2, 3]);
    }

    #[test]
    fn sense_key_nibbles_round_trip() {
        for v in 0..16u8 {
            assert_eq!(SenseKey::from_nibble(v).code(), v);
        }
    }
}
