//! Vital product data pages (SPC-4 7.8, SBC-3 6.5) returned by INQUIRY with
//! EVPD=1.

use super::error::{need, DataError};
use super::inquiry::Peripheral;
use super::wire::{array, be16, be32, be64, bit, flag, u8_at};

/// VPD page codes this crate models.
pub mod page {
    /// Supported VPD pages.
    pub const SUPPORTED_PAGES: u8 = 0x00;
    /// Unit serial number.
    pub const UNIT_SERIAL_NUMBER: u8 = 0x80;
    /// Device identification.
    pub const DEVICE_IDENTIFICATION: u8 = 0x83;
    /// Extended INQUIRY data.
    pub const EXTENDED_INQUIRY: u8 = 0x86;
    /// Third-party Copy (SPC-4 7.8.17).
    pub const THIRD_PARTY_COPY: u8 = 0x8f;
    /// Block limits (SBC).
    pub const BLOCK_LIMITS: u8 = 0xb0;
    /// Block device characteristics (SBC).
    pub const BLOCK_DEVICE_CHARACTERISTICS: u8 = 0xb1;
    /// Logical block provisioning (SBC).
    pub const LOGICAL_BLOCK_PROVISIONING: u8 = 0xb2;
}

/// PROTOCOL IDENTIFIER of iSCSI (SPC-4 table 362).
pub const PROTOCOL_ISCSI: u8 = 0x5;

/// CODE SET of a designator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CodeSet {
    /// 1h binary.
    Binary,
    /// 2h printable ASCII.
    Ascii,
    /// 3h UTF-8.
    Utf8,
    /// Any other (reserved) value, 4 bits.
    Reserved(u8),
}

impl CodeSet {
    /// From the 4-bit field.
    pub fn from_code(v: u8) -> Self {
        match v & 0x0f {
            1 => Self::Binary,
            2 => Self::Ascii,
            3 => Self::Utf8,
            x => Self::Reserved(x),
        }
    }

    /// The 4-bit field.
    pub fn code(self) -> u8 {
        match self {
            Self::Binary => 1,
            Self::Ascii => 2,
            Self::Utf8 => 3,
            Self::Reserved(x) => x & 0x0f,
        }
    }
}

/// ASSOCIATION of a designator: what it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Association {
    /// 00b the logical unit.
    LogicalUnit,
    /// 01b the target port that received the INQUIRY.
    TargetPort,
    /// 10b the SCSI target device containing the logical unit.
    TargetDevice,
    /// 11b reserved.
    Reserved,
}

impl Association {
    fn from_code(v: u8) -> Self {
        match v & 3 {
            0 => Self::LogicalUnit,
            1 => Self::TargetPort,
            2 => Self::TargetDevice,
            _ => Self::Reserved,
        }
    }

    /// The 2-bit field.
    pub fn code(self) -> u8 {
        match self {
            Self::LogicalUnit => 0,
            Self::TargetPort => 1,
            Self::TargetDevice => 2,
            Self::Reserved => 3,
        }
    }
}

/// An NAA designator value (SPC-4 7.8.6.6).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Naa {
    /// NAA 5h, IEEE Registered: 24-bit company ID, 36-bit vendor value.
    IeeeRegistered {
        /// IEEE COMPANY_ID (24 bits).
        company_id: u32,
        /// VENDOR SPECIFIC IDENTIFIER (36 bits).
        vendor_specific: u64,
    },
    /// NAA 6h, IEEE Registered Extended: adds a 64-bit extension; the form
    /// blockwire uses for LU names.
    IeeeRegisteredExtended {
        /// IEEE COMPANY_ID (24 bits).
        company_id: u32,
        /// VENDOR SPECIFIC IDENTIFIER (36 bits).
        vendor_specific: u64,
        /// VENDOR SPECIFIC IDENTIFIER EXTENSION.
        extension: u64,
    },
    /// Any other NAA value or length, as raw bytes.
    Other(Vec<u8>),
}

impl Naa {
    fn encode(&self) -> Vec<u8> {
        const M36: u64 = (1 << 36) - 1;
        match self {
            Naa::IeeeRegistered {
                company_id,
                vendor_specific,
            } => {
                let v =
                    5u64 << 60 | u64::from(company_id & 0xff_ffff) << 36 | (vendor_specific & M36);
                v.to_be_bytes().to_vec()
            }
            Naa::IeeeRegisteredExtended {
                company_id,
                vendor_specific,
                extension,
            } => {
                let v = 6u128 << 124
                    | u128::from(company_id & 0xff_ffff) << 100
                    | u128::from(vendor_specific & M36) << 64
                    | u128::from(*extension);
                v.to_be_bytes().to_vec()
            }
            Naa::Other(b) => b.clone(),
        }
    }

    fn decode(v: &[u8]) -> Naa {
        const M36: u64 = (1 << 36) - 1;
        match (v.first().map(|b| b >> 4), v.len()) {
            (Some(5), 8) => {
                let x = be64(v, 0).unwrap_or(0);
                Naa::IeeeRegistered {
                    company_id: ((x >> 36) & 0xff_ffff) as u32,
                    vendor_specific: x & M36,
                }
            }
            (Some(6), 16) => {
                let x = array::<16>(v, 0).map_or(0, u128::from_be_bytes);
                Naa::IeeeRegisteredExtended {
                    company_id: ((x >> 100) & 0xff_ffff) as u32,
                    vendor_specific: ((x >> 64) as u64) & M36,
                    extension: x as u64,
                }
            }
            _ => Naa::Other(v.to_vec()),
        }
    }
}

/// The DESIGNATOR TYPE and value of an identification descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DesignatorId {
    /// 0h vendor specific.
    VendorSpecific(Vec<u8>),
    /// 1h T10 vendor ID based: 8-byte vendor ID plus vendor specific data.
    T10VendorId {
        /// T10 VENDOR IDENTIFICATION.
        vendor: [u8; 8],
        /// VENDOR SPECIFIC IDENTIFIER.
        specific: Vec<u8>,
    },
    /// 2h EUI-64 based (8, 12 or 16 bytes).
    Eui64(Vec<u8>),
    /// 3h NAA.
    Naa(Naa),
    /// 4h relative target port identifier.
    RelativeTargetPort(u16),
    /// 5h target port group.
    TargetPortGroup(u16),
    /// 6h logical unit group.
    LogicalUnitGroup(u16),
    /// 8h SCSI name string (e.g. an iSCSI name, with ",t,0x<tpgt>" for a
    /// port); NUL terminated and padded to 4 bytes on the wire.
    ScsiName(String),
    /// Any other type (7h MD5, 9h protocol specific, reserved) or a value of
    /// the wrong length for its type.
    Other {
        /// DESIGNATOR TYPE (4 bits).
        designator_type: u8,
        /// DESIGNATOR bytes.
        value: Vec<u8>,
    },
}

impl DesignatorId {
    /// The 4-bit DESIGNATOR TYPE.
    pub fn designator_type(&self) -> u8 {
        match self {
            Self::VendorSpecific(_) => 0,
            Self::T10VendorId { .. } => 1,
            Self::Eui64(_) => 2,
            Self::Naa(_) => 3,
            Self::RelativeTargetPort(_) => 4,
            Self::TargetPortGroup(_) => 5,
            Self::LogicalUnitGroup(_) => 6,
            Self::ScsiName(_) => 8,
            Self::Other {
                designator_type, ..
            } => designator_type & 0x0f,
        }
    }

    fn value(&self) -> Vec<u8> {
        let port = |v: u16| {
            let [h, l] = v.to_be_bytes();
            vec![0, 0, h, l]
        };
        match self {
            Self::VendorSpecific(v) | Self::Eui64(v) | Self::Other { value: v, .. } => v.clone(),
            Self::T10VendorId { vendor, specific } => {
                let mut v = vendor.to_vec();
                v.extend_from_slice(specific);
                v
            }
            Self::Naa(n) => n.encode(),
            Self::RelativeTargetPort(p) | Self::TargetPortGroup(p) | Self::LogicalUnitGroup(p) => {
                port(*p)
            }
            Self::ScsiName(s) => {
                let mut v: Vec<u8> = s.bytes().take(255).collect();
                v.push(0);
                while v.len() & 3 != 0 {
                    v.push(0);
                }
                v
            }
        }
    }

    fn decode(kind: u8, v: &[u8]) -> Self {
        let port = || match v {
            [_, _, h, l] => Some(u16::from_be_bytes([*h, *l])),
            _ => None,
        };
        let other = || Self::Other {
            designator_type: kind,
            value: v.to_vec(),
        };
        match kind {
            0 => Self::VendorSpecific(v.to_vec()),
            1 => match array::<8>(v, 0) {
                Some(vendor) => Self::T10VendorId {
                    vendor,
                    specific: v.get(8..).unwrap_or_default().to_vec(),
                },
                None => other(),
            },
            2 => Self::Eui64(v.to_vec()),
            3 => Self::Naa(Naa::decode(v)),
            4 => port().map_or_else(other, Self::RelativeTargetPort),
            5 => port().map_or_else(other, Self::TargetPortGroup),
            6 => port().map_or_else(other, Self::LogicalUnitGroup),
            8 => {
                let end = v.iter().position(|&c| c == 0).unwrap_or(v.len());
                Self::ScsiName(
                    String::from_utf8_lossy(v.get(..end).unwrap_or_default()).into_owned(),
                )
            }
            _ => other(),
        }
    }
}

/// One identification descriptor of the device identification page.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Designator {
    /// PROTOCOL IDENTIFIER (4 bits; meaningful when `piv` is set).
    pub protocol_identifier: u8,
    /// CODE SET.
    pub code_set: CodeSet,
    /// PIV: the protocol identifier is valid.
    pub piv: bool,
    /// ASSOCIATION.
    pub association: Association,
    /// DESIGNATOR TYPE and value.
    pub id: DesignatorId,
}

impl Designator {
    /// NAA IEEE Registered Extended name of the logical unit.
    pub fn naa_registered_extended(company_id: u32, vendor_specific: u64, extension: u64) -> Self {
        Self {
            protocol_identifier: 0,
            code_set: CodeSet::Binary,
            piv: false,
            association: Association::LogicalUnit,
            id: DesignatorId::Naa(Naa::IeeeRegisteredExtended {
                company_id,
                vendor_specific,
                extension,
            }),
        }
    }

    /// T10 vendor ID based name of the logical unit (vendor padded to 8).
    pub fn t10_vendor_id(vendor: &str, specific: &[u8]) -> Self {
        Self {
            protocol_identifier: 0,
            code_set: CodeSet::Ascii,
            piv: false,
            association: Association::LogicalUnit,
            id: DesignatorId::T10VendorId {
                vendor: super::wire::ascii_field(vendor),
                specific: specific.to_vec(),
            },
        }
    }

    /// Relative target port identifier of the iSCSI port that was asked.
    pub fn relative_target_port(port: u16) -> Self {
        Self::iscsi_port_binary(DesignatorId::RelativeTargetPort(port))
    }

    /// Target port group of the iSCSI port that was asked (ALUA).
    pub fn target_port_group(group: u16) -> Self {
        Self::iscsi_port_binary(DesignatorId::TargetPortGroup(group))
    }

    fn iscsi_port_binary(id: DesignatorId) -> Self {
        Self {
            protocol_identifier: PROTOCOL_ISCSI,
            code_set: CodeSet::Binary,
            piv: true,
            association: Association::TargetPort,
            id,
        }
    }

    /// iSCSI name as a SCSI name string: the target name with
    /// `Association::TargetDevice`, or "name,t,0x<tpgt>" with
    /// `Association::TargetPort`.
    pub fn iscsi_name(name: &str, association: Association) -> Self {
        Self {
            protocol_identifier: PROTOCOL_ISCSI,
            code_set: CodeSet::Utf8,
            piv: true,
            association,
            id: DesignatorId::ScsiName(name.to_owned()),
        }
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        let mut v = self.id.value();
        v.truncate(255);
        out.push((self.protocol_identifier & 0x0f) << 4 | self.code_set.code());
        out.push(flag(self.piv, 7) | self.association.code() << 4 | self.id.designator_type());
        out.push(0);
        out.push(v.len() as u8);
        out.extend_from_slice(&v);
    }

    /// Encodes one descriptor (4-byte header + designator).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode_into(&mut v);
        v
    }

    /// Parses one descriptor at the start of `b`, returning it and its
    /// length.
    pub fn decode(b: &[u8]) -> Result<(Designator, usize), DataError> {
        let h = need(b, 4)?;
        let (b0, b1, len) = (
            u8_at(h, 0).unwrap_or(0),
            u8_at(h, 1).unwrap_or(0),
            usize::from(u8_at(h, 3).unwrap_or(0)),
        );
        let v = need(b, 4 + len)?.get(4..).unwrap_or_default();
        Ok((
            Designator {
                protocol_identifier: b0 >> 4,
                code_set: CodeSet::from_code(b0),
                piv: bit(b1, 7),
                association: Association::from_code(b1 >> 4),
                id: DesignatorId::decode(b1 & 0x0f, v),
            },
            4 + len,
        ))
    }
}

/// Extended INQUIRY data VPD page (86h) fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ExtendedInquiry {
    /// ACTIVATE MICROCODE (2 bits).
    pub activate_microcode: u8,
    /// SPT: supported protection types (3 bits).
    pub spt: u8,
    /// GRD_CHK.
    pub grd_chk: bool,
    /// APP_CHK.
    pub app_chk: bool,
    /// REF_CHK.
    pub ref_chk: bool,
    /// UASK_SUP: unit attention sense key specific data supported.
    pub uask_sup: bool,
    /// GROUP_SUP: group number supported.
    pub group_sup: bool,
    /// PRIOR_SUP: command priority supported.
    pub prior_sup: bool,
    /// HEADSUP: head of queue task attribute supported.
    pub headsup: bool,
    /// ORDSUP: ordered task attribute supported.
    pub ordsup: bool,
    /// SIMPSUP: simple task attribute supported.
    pub simpsup: bool,
    /// WU_SUP: write uncorrectable supported.
    pub wu_sup: bool,
    /// CRD_SUP: correction disable supported.
    pub crd_sup: bool,
    /// NV_SUP: non-volatile cache.
    pub nv_sup: bool,
    /// V_SUP: volatile cache.
    pub v_sup: bool,
    /// P_I_I_SUP: protection information interval supported.
    pub p_i_i_sup: bool,
    /// LUICLR: unit attentions cleared per I_T nexus.
    pub luiclr: bool,
    /// R_SUP: referrals supported.
    pub r_sup: bool,
    /// CBCS: capability-based command security.
    pub cbcs: bool,
    /// MULTI I_T NEXUS MICROCODE DOWNLOAD (4 bits).
    pub multi_it_nexus_microcode_download: u8,
    /// EXTENDED SELF-TEST COMPLETION MINUTES.
    pub extended_self_test_minutes: u16,
    /// POA_SUP: power on activation supported.
    pub poa_sup: bool,
    /// HRA_SUP: hard reset activation supported.
    pub hra_sup: bool,
    /// VSA_SUP: vendor specific activation supported.
    pub vsa_sup: bool,
    /// MAXIMUM SUPPORTED SENSE DATA LENGTH.
    pub max_sense_length: u8,
}

/// Block limits VPD page (B0h) fields (SBC-3 6.5.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BlockLimits {
    /// WSNZ: WRITE SAME with 0 blocks is rejected.
    pub wsnz: bool,
    /// MAXIMUM COMPARE AND WRITE LENGTH in blocks (0: unsupported).
    pub max_compare_and_write_length: u8,
    /// OPTIMAL TRANSFER LENGTH GRANULARITY in blocks.
    pub optimal_transfer_length_granularity: u16,
    /// MAXIMUM TRANSFER LENGTH in blocks (0: no limit).
    pub max_transfer_length: u32,
    /// OPTIMAL TRANSFER LENGTH in blocks.
    pub optimal_transfer_length: u32,
    /// MAXIMUM PREFETCH LENGTH in blocks.
    pub max_prefetch_length: u32,
    /// MAXIMUM UNMAP LBA COUNT (0: UNMAP unsupported).
    pub max_unmap_lba_count: u32,
    /// MAXIMUM UNMAP BLOCK DESCRIPTOR COUNT.
    pub max_unmap_block_descriptor_count: u32,
    /// OPTIMAL UNMAP GRANULARITY in blocks.
    pub optimal_unmap_granularity: u32,
    /// UNMAP GRANULARITY ALIGNMENT (31 bits) when UGAVALID is set.
    pub unmap_granularity_alignment: Option<u32>,
    /// MAXIMUM WRITE SAME LENGTH in blocks.
    pub max_write_same_length: u64,
    /// MAXIMUM ATOMIC TRANSFER LENGTH in blocks (SBC-4; 0: WRITE ATOMIC
    /// is not supported).
    pub max_atomic_transfer_length: u32,
    /// ATOMIC ALIGNMENT in blocks (0: no alignment requirement).
    pub atomic_alignment: u32,
    /// ATOMIC TRANSFER LENGTH GRANULARITY in blocks (0: none).
    pub atomic_transfer_length_granularity: u32,
    /// MAXIMUM ATOMIC TRANSFER LENGTH WITH ATOMIC BOUNDARY in blocks (0:
    /// a non-zero ATOMIC BOUNDARY is not supported).
    pub max_atomic_transfer_length_with_boundary: u32,
    /// MAXIMUM ATOMIC BOUNDARY SIZE in blocks.
    pub max_atomic_boundary_size: u32,
}

/// Block device characteristics VPD page (B1h) fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BlockDeviceCharacteristics {
    /// MEDIUM ROTATION RATE (1: non-rotating, i.e. SSD).
    pub medium_rotation_rate: u16,
    /// PRODUCT TYPE.
    pub product_type: u8,
    /// WABEREQ (2 bits).
    pub wabereq: u8,
    /// WACEREQ (2 bits).
    pub wacereq: u8,
    /// NOMINAL FORM FACTOR (4 bits).
    pub nominal_form_factor: u8,
    /// ZONED (2 bits, SBC-4).
    pub zoned: u8,
    /// FUAB: FUA on SYNCHRONIZE CACHE semantics honoured.
    pub fuab: bool,
    /// VBULS: verify byte check unmapped LBA supported.
    pub vbuls: bool,
}

/// Logical block provisioning VPD page (B2h) fields.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct LogicalBlockProvisioning {
    /// THRESHOLD EXPONENT.
    pub threshold_exponent: u8,
    /// LBPU: UNMAP supported.
    pub lbpu: bool,
    /// LBPWS: WRITE SAME(16) with UNMAP supported.
    pub lbpws: bool,
    /// LBPWS10: WRITE SAME(10) with UNMAP supported.
    pub lbpws10: bool,
    /// LBPRZ (3 bits; 1 = unmapped blocks read as zero).
    pub lbprz: u8,
    /// ANC_SUP: ANCHOR supported.
    pub anc_sup: bool,
    /// MINIMUM PERCENTAGE (5 bits).
    pub minimum_percentage: u8,
    /// PROVISIONING TYPE (3 bits): 0 full, 1 resource, 2 thin.
    pub provisioning_type: u8,
    /// THRESHOLD PERCENTAGE.
    pub threshold_percentage: u8,
    /// PROVISIONING GROUP DESCRIPTOR; its presence is the DP bit.
    pub provisioning_group: Option<Designator>,
}

/// The body of a VPD page.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum VpdPage {
    /// 00h: list of supported page codes, ascending.
    SupportedPages(Vec<u8>),
    /// 80h: PRODUCT SERIAL NUMBER (ASCII).
    UnitSerialNumber(String),
    /// 83h: identification descriptors.
    DeviceIdentification(Vec<Designator>),
    /// 86h.
    ExtendedInquiry(ExtendedInquiry),
    /// B0h.
    BlockLimits(BlockLimits),
    /// B1h.
    BlockDeviceCharacteristics(BlockDeviceCharacteristics),
    /// B2h.
    LogicalBlockProvisioning(LogicalBlockProvisioning),
    /// Any other page, raw.
    Other {
        /// PAGE CODE.
        page_code: u8,
        /// Page bytes after the 4-byte header.
        data: Vec<u8>,
    },
}

/// A VPD page with the peripheral byte that heads it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Vpd {
    /// Peripheral qualifier and device type.
    pub peripheral: Peripheral,
    /// The page.
    pub page: VpdPage,
}

/// PAGE LENGTH of the fixed-size 86h, B0h and B1h pages.
const LONG_PAGE_LEN: usize = 0x3c;

impl VpdPage {
    /// The PAGE CODE.
    pub fn page_code(&self) -> u8 {
        match self {
            Self::SupportedPages(_) => page::SUPPORTED_PAGES,
            Self::UnitSerialNumber(_) => page::UNIT_SERIAL_NUMBER,
            Self::DeviceIdentification(_) => page::DEVICE_IDENTIFICATION,
            Self::ExtendedInquiry(_) => page::EXTENDED_INQUIRY,
            Self::BlockLimits(_) => page::BLOCK_LIMITS,
            Self::BlockDeviceCharacteristics(_) => page::BLOCK_DEVICE_CHARACTERISTICS,
            Self::LogicalBlockProvisioning(_) => page::LOGICAL_BLOCK_PROVISIONING,
            Self::Other { page_code, .. } => *page_code,
        }
    }

    fn body(&self) -> Vec<u8> {
        match self {
            Self::SupportedPages(p) => p.clone(),
            Self::UnitSerialNumber(s) => s.as_bytes().to_vec(),
            Self::DeviceIdentification(ds) => {
                let mut v = Vec::new();
                for d in ds {
                    d.encode_into(&mut v);
                }
                v
            }
            Self::ExtendedInquiry(e) => {
                let mut v = vec![0u8; LONG_PAGE_LEN];
                let [m0, m1] = e.extended_self_test_minutes.to_be_bytes();
                let bytes = [
                    (e.activate_microcode & 3) << 6
                        | (e.spt & 7) << 3
                        | flag(e.grd_chk, 2)
                        | flag(e.app_chk, 1)
                        | flag(e.ref_chk, 0),
                    flag(e.uask_sup, 5)
                        | flag(e.group_sup, 4)
                        | flag(e.prior_sup, 3)
                        | flag(e.headsup, 2)
                        | flag(e.ordsup, 1)
                        | flag(e.simpsup, 0),
                    flag(e.wu_sup, 3) | flag(e.crd_sup, 2) | flag(e.nv_sup, 1) | flag(e.v_sup, 0),
                    flag(e.p_i_i_sup, 4) | flag(e.luiclr, 0),
                    flag(e.r_sup, 4) | flag(e.cbcs, 0),
                    e.multi_it_nexus_microcode_download & 0x0f,
                    m0,
                    m1,
                    flag(e.poa_sup, 7) | flag(e.hra_sup, 6) | flag(e.vsa_sup, 5),
                    e.max_sense_length,
                ];
                put(&mut v, 0, &bytes);
                v
            }
            Self::BlockLimits(l) => {
                let mut v = vec![0u8; LONG_PAGE_LEN];
                put(
                    &mut v,
                    0,
                    &[flag(l.wsnz, 0), l.max_compare_and_write_length],
                );
                put(
                    &mut v,
                    2,
                    &l.optimal_transfer_length_granularity.to_be_bytes(),
                );
                put(&mut v, 4, &l.max_transfer_length.to_be_bytes());
                put(&mut v, 8, &l.optimal_transfer_length.to_be_bytes());
                put(&mut v, 12, &l.max_prefetch_length.to_be_bytes());
                put(&mut v, 16, &l.max_unmap_lba_count.to_be_bytes());
                put(
                    &mut v,
                    20,
                    &l.max_unmap_block_descriptor_count.to_be_bytes(),
                );
                put(&mut v, 24, &l.optimal_unmap_granularity.to_be_bytes());
                let uga = l
                    .unmap_granularity_alignment
                    .map_or(0, |a| 0x8000_0000 | (a & 0x7fff_ffff));
                put(&mut v, 28, &uga.to_be_bytes());
                put(&mut v, 32, &l.max_write_same_length.to_be_bytes());
                put(&mut v, 40, &l.max_atomic_transfer_length.to_be_bytes());
                put(&mut v, 44, &l.atomic_alignment.to_be_bytes());
                put(
                    &mut v,
                    48,
                    &l.atomic_transfer_length_granularity.to_be_bytes(),
                );
                put(
                    &mut v,
                    52,
                    &l.max_atomic_transfer_length_with_boundary.to_be_bytes(),
                );
                put(&mut v, 56, &l.max_atomic_boundary_size.to_be_bytes());
                v
            }
            Self::BlockDeviceCharacteristics(c) => {
                let mut v = vec![0u8; LONG_PAGE_LEN];
                put(&mut v, 0, &c.medium_rotation_rate.to_be_bytes());
                put(
                    &mut v,
                    2,
                    &[
                        c.product_type,
                        (c.wabereq & 3) << 6
                            | (c.wacereq & 3) << 4
                            | (c.nominal_form_factor & 0x0f),
                        (c.zoned & 3) << 4 | flag(c.fuab, 1) | flag(c.vbuls, 0),
                    ],
                );
                v
            }
            Self::LogicalBlockProvisioning(p) => {
                let mut v = vec![
                    p.threshold_exponent,
                    flag(p.lbpu, 7)
                        | flag(p.lbpws, 6)
                        | flag(p.lbpws10, 5)
                        | (p.lbprz & 7) << 2
                        | flag(p.anc_sup, 1)
                        | flag(p.provisioning_group.is_some(), 0),
                    (p.minimum_percentage & 0x1f) << 3 | (p.provisioning_type & 7),
                    p.threshold_percentage,
                ];
                if let Some(d) = &p.provisioning_group {
                    d.encode_into(&mut v);
                }
                v
            }
            Self::Other { data, .. } => data.clone(),
        }
    }
}

fn put(dst: &mut [u8], off: usize, src: &[u8]) {
    if let Some(d) = dst.get_mut(off..off + src.len()) {
        d.copy_from_slice(src);
    }
}

impl Vpd {
    /// A page of a direct-access device.
    pub fn disk(page: VpdPage) -> Self {
        Self {
            peripheral: Peripheral::DIRECT_ACCESS,
            page,
        }
    }

    /// Encodes header and page; bodies over 65535 bytes are truncated. The
    /// target truncates the result to the ALLOCATION LENGTH.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = self.page.body();
        body.truncate(usize::from(u16::MAX));
        let mut v = Vec::with_capacity(4 + body.len());
        v.push(self.peripheral.to_byte());
        v.push(self.page.page_code());
        v.extend_from_slice(&(body.len() as u16).to_be_bytes());
        v.extend_from_slice(&body);
        v
    }

    /// Parses a page; `Truncated` (with the size needed) when the allocation
    /// length cut it short. Fixed-size pages shorter than SBC-3's length
    /// (older devices) read missing fields as zero. Fuzz entry point.
    pub fn decode(buf: &[u8]) -> Result<Self, DataError> {
        let h = need(buf, 4)?;
        let len = usize::from(be16(h, 2).unwrap_or(0));
        let body = need(buf, 4 + len)?.get(4..).unwrap_or_default();
        let code = u8_at(h, 1).unwrap_or(0);
        let at = |i| u8_at(body, i).unwrap_or(0);
        let b32 = |i| be32(body, i).unwrap_or(0);
        let page = match code {
            page::SUPPORTED_PAGES => VpdPage::SupportedPages(body.to_vec()),
            page::UNIT_SERIAL_NUMBER => {
                VpdPage::UnitSerialNumber(String::from_utf8_lossy(body).into_owned())
            }
            page::DEVICE_IDENTIFICATION => {
                let mut ds = Vec::new();
                let mut off = 0;
                while off < body.len() {
                    let rest = body.get(off..).unwrap_or_default();
                    let (d, n) = Designator::decode(rest).map_err(|e| shift(e, 4 + off))?;
                    ds.push(d);
                    off += n;
                }
                VpdPage::DeviceIdentification(ds)
            }
            page::EXTENDED_INQUIRY => VpdPage::ExtendedInquiry(ExtendedInquiry {
                activate_microcode: at(0) >> 6,
                spt: (at(0) >> 3) & 7,
                grd_chk: bit(at(0), 2),
                app_chk: bit(at(0), 1),
                ref_chk: bit(at(0), 0),
                uask_sup: bit(at(1), 5),
                group_sup: bit(at(1), 4),
                prior_sup: bit(at(1), 3),
                headsup: bit(at(1), 2),
                ordsup: bit(at(1), 1),
                simpsup: bit(at(1), 0),
                wu_sup: bit(at(2), 3),
                crd_sup: bit(at(2), 2),
                nv_sup: bit(at(2), 1),
                v_sup: bit(at(2), 0),
                p_i_i_sup: bit(at(3), 4),
                luiclr: bit(at(3), 0),
                r_sup: bit(at(4), 4),
                cbcs: bit(at(4), 0),
                multi_it_nexus_microcode_download: at(5) & 0x0f,
                extended_self_test_minutes: be16(body, 6).unwrap_or(0),
                poa_sup: bit(at(8), 7),
                hra_sup: bit(at(8), 6),
                vsa_sup: bit(at(8), 5),
                max_sense_length: at(9),
            }),
            page::BLOCK_LIMITS => {
                let uga = b32(28);
                VpdPage::BlockLimits(BlockLimits {
                    wsnz: bit(at(0), 0),
                    max_compare_and_write_length: at(1),
                    optimal_transfer_length_granularity: be16(body, 2).unwrap_or(0),
                    max_transfer_length: b32(4),
                    optimal_transfer_length: b32(8),
                    max_prefetch_length: b32(12),
                    max_unmap_lba_count: b32(16),
                    max_unmap_block_descriptor_count: b32(20),
                    optimal_unmap_granularity: b32(24),
                    unmap_granularity_alignment: (uga & 0x8000_0000 != 0)
                        .then_some(uga & 0x7fff_ffff),
                    max_write_same_length: be64(body, 32).unwrap_or(0),
                    max_atomic_transfer_length: b32(40),
                    atomic_alignment: b32(44),
                    atomic_transfer_length_granularity: b32(48),
                    max_atomic_transfer_length_with_boundary: b32(52),
                    max_atomic_boundary_size: b32(56),
                })
            }
            page::BLOCK_DEVICE_CHARACTERISTICS => {
                VpdPage::BlockDeviceCharacteristics(BlockDeviceCharacteristics {
                    medium_rotation_rate: be16(body, 0).unwrap_or(0),
                    product_type: at(2),
                    wabereq: at(3) >> 6,
                    wacereq: (at(3) >> 4) & 3,
                    nominal_form_factor: at(3) & 0x0f,
                    zoned: (at(4) >> 4) & 3,
                    fuab: bit(at(4), 1),
                    vbuls: bit(at(4), 0),
                })
            }
            page::LOGICAL_BLOCK_PROVISIONING => {
                let provisioning_group = if bit(at(1), 0) {
                    let rest = body.get(4..).unwrap_or_default();
                    Some(Designator::decode(rest).map_err(|e| shift(e, 8))?.0)
                } else {
                    None
                };
                VpdPage::LogicalBlockProvisioning(LogicalBlockProvisioning {
                    threshold_exponent: at(0),
                    lbpu: bit(at(1), 7),
                    lbpws: bit(at(1), 6),
                    lbpws10: bit(at(1), 5),
                    lbprz: (at(1) >> 2) & 7,
                    anc_sup: bit(at(1), 1),
                    minimum_percentage: at(2) >> 3,
                    provisioning_type: at(2) & 7,
                    threshold_percentage: at(3),
                    provisioning_group,
                })
            }
            _ => VpdPage::Other {
                page_code: code,
                data: body.to_vec(),
            },
        };
        Ok(Vpd {
            peripheral: Peripheral::from_byte(u8_at(h, 0).unwrap_or(0)),
            page,
        })
    }
}

/// Re-bases an error from a sub-slice starting at `base` onto the page.
fn shift(e: DataError, base: usize) -> DataError {
    match e {
        DataError::Truncated { needed, got } => DataError::Truncated {
            needed: needed + base,
            got: got + base,
        },
        DataError::Length { expected, got } => DataError::Length {
            expected: expected + base,
            got: got + base,
        },
        DataError::InvalidField { byte, bit } => DataError::InvalidField {
            byte: byte + base,
            bit,
        },
        e @ DataError::TooManyTransportIds { .. } => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_identification_bytes() {
        let page = Vpd::disk(VpdPage::DeviceIdentification(vec![
            Designator::naa_registered_extended(0x001405, 0x1_2345_6789, 0xdead_beef_0000_0001),
            Designator::relative_target_port(1),
            Designator::target_port_group(0x10),
            Designator::iscsi_name("iqn.x", Association::TargetDevice),
        ]));
        let b = page.encode();
        let expected: Vec<u8> = [
            &[0x00, 0x83, 0x00, 0x30][..],
            // NAA 6: binary, LU, type 3, 16 bytes.
            &[0x01, 0x03, 0x00, 0x10],
            &[0x60, 0x01, 0x40, 0x51, 0x23, 0x45, 0x67, 0x89],
            &[0xde, 0xad, 0xbe, 0xef, 0x00, 0x00, 0x00, 0x01],
            // Relative target port: iSCSI, binary, PIV, port, type 4.
            &[0x51, 0x94, 0x00, 0x04, 0, 0, 0, 1],
            // Target port group: type 5.
            &[0x51, 0x95, 0x00, 0x04, 0, 0, 0, 0x10],
            // SCSI name string: UTF-8, PIV, target device, type 8.
            &[0x53, 0xa8, 0x00, 0x08],
            b"iqn.x\0\0\0",
        ]
        .concat();
        assert_eq!(b, expected);
        assert_eq!(Vpd::decode(&b).unwrap(), page);
        assert_eq!(
            Vpd::decode(b.get(..20).unwrap()),
            Err(DataError::Truncated {
                needed: 52,
                got: 20
            })
        );
    }

    #[test]
    fn block_limits_and_lbp() {
        let bl = BlockLimits {
            max_transfer_length: 2048,
            max_unmap_lba_count: 0xffff_ffff,
            unmap_granularity_alignment: Some(0),
            max_write_same_length: 1 << 20,
            ..Default::default()
        };
        let v = Vpd::disk(VpdPage::BlockLimits(bl));
        let b = v.encode();
        assert_eq!(b.len(), 64);
        assert_eq!(b.get(8..12), Some(&[0, 0, 8, 0][..]));
        assert_eq!(b.get(32..36), Some(&[0x80, 0, 0, 0][..]));
        assert_eq!(Vpd::decode(&b).unwrap(), v);
        // SBC-4 atomic fields: page bytes 44..64.
        let atomic = BlockLimits {
            max_atomic_transfer_length: 256,
            atomic_alignment: 8,
            atomic_transfer_length_granularity: 8,
            max_atomic_transfer_length_with_boundary: 0,
            max_atomic_boundary_size: 0,
            ..bl
        };
        let b = Vpd::disk(VpdPage::BlockLimits(atomic)).encode();
        assert_eq!(
            b.get(44..56),
            Some(&[0, 0, 1, 0, 0, 0, 0, 8, 0, 0, 0, 8][..])
        );
        assert_eq!(
            Vpd::decode(&b).unwrap(),
            Vpd::disk(VpdPage::BlockLimits(atomic))
        );
        // An SBC-2 era page of length 0x10 still decodes.
        let mut short = b.get(..20).unwrap().to_vec();
        if let Some(l) = short.get_mut(3) {
            *l = 0x10;
        }
        assert!(Vpd::decode(&short).is_ok());

        let lbp = Vpd::disk(VpdPage::LogicalBlockProvisioning(
            LogicalBlockProvisioning {
                lbpu: true,
                lbpws: true,
                lbprz: 1,
                provisioning_type: 2,
                ..Default::default()
            },
        ));
        let b = lbp.encode();
        assert_eq!(b, vec![0, 0xb2, 0, 4, 0, 0xc4, 0x02, 0]);
        assert_eq!(Vpd::decode(&b).unwrap(), lbp);
    }
}
