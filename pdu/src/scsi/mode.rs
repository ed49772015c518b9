//! Mode parameters (SPC-4 7.5): the MODE SENSE/SELECT(6/10) header, block
//! descriptors, and the read-write error recovery (01h), caching (08h),
//! control (0Ah), informational exceptions control (1Ch) and logical block
//! provisioning (1Ch/02h) pages.

use super::error::{need, DataError};
use super::wire::{be16, be32, be64, bit, flag, u8_at};

/// Mode page codes modelled here.
pub mod page {
    /// Read-write error recovery mode page (SBC-4 6.5.10).
    pub const READ_WRITE_ERROR_RECOVERY: u8 = 0x01;
    /// Caching mode page (SBC-3 6.4.5).
    pub const CACHING: u8 = 0x08;
    /// Control mode page (SPC-4 7.5.7).
    pub const CONTROL: u8 = 0x0a;
    /// Informational exceptions control mode page (SPC-4 7.5.10).
    pub const INFORMATIONAL_EXCEPTIONS: u8 = 0x1c;
    /// Logical block provisioning mode page (SBC-4 6.5.9): page 1Ch,
    /// this subpage.
    pub const LOGICAL_BLOCK_PROVISIONING_SUBPAGE: u8 = 0x02;
    /// "Return all pages" in MODE SENSE.
    pub const ALL: u8 = 0x3f;
}

/// Mode parameter header fields shared by the 6- and 10-byte forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ModeHeader {
    /// MEDIUM TYPE (00h for disks).
    pub medium_type: u8,
    /// WP: write protected (device-specific parameter, SBC).
    pub wp: bool,
    /// DPOFUA: DPO and FUA bits supported (device-specific parameter, SBC).
    pub dpofua: bool,
}

/// A direct-access block descriptor: short (8 bytes, 32-bit count) or long
/// (16 bytes, 64-bit count, MODE SENSE(10) with LONGLBA).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockDescriptor {
    /// NUMBER OF LOGICAL BLOCKS (FFFFFFFFh in a short descriptor when too big).
    pub number_of_blocks: u64,
    /// LOGICAL BLOCK LENGTH (24 bits in a short descriptor).
    pub block_length: u32,
}

/// Caching mode page (08h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CachingPage {
    /// PS: parameters savable (MODE SENSE only).
    pub ps: bool,
    /// IC: initiator control.
    pub ic: bool,
    /// ABPF: abort prefetch.
    pub abpf: bool,
    /// CAP: caching analysis permitted.
    pub cap: bool,
    /// DISC: discontinuity.
    pub disc: bool,
    /// SIZE: cache segment size in bytes.
    pub size: bool,
    /// WCE: write cache enabled (writes complete before reaching the medium).
    pub wce: bool,
    /// MF: multiplication factor.
    pub mf: bool,
    /// RCD: read cache disabled.
    pub rcd: bool,
    /// DEMAND READ RETENTION PRIORITY (4 bits).
    pub demand_read_retention_priority: u8,
    /// WRITE RETENTION PRIORITY (4 bits).
    pub write_retention_priority: u8,
    /// DISABLE PRE-FETCH TRANSFER LENGTH.
    pub disable_prefetch_transfer_length: u16,
    /// MINIMUM PRE-FETCH.
    pub minimum_prefetch: u16,
    /// MAXIMUM PRE-FETCH.
    pub maximum_prefetch: u16,
    /// MAXIMUM PRE-FETCH CEILING.
    pub maximum_prefetch_ceiling: u16,
    /// FSW: force sequential write.
    pub fsw: bool,
    /// LBCSS: logical block cache segment size.
    pub lbcss: bool,
    /// DRA: disable read-ahead.
    pub dra: bool,
    /// NV_DIS: non-volatile cache disabled.
    pub nv_dis: bool,
    /// NUMBER OF CACHE SEGMENTS.
    pub number_of_cache_segments: u8,
    /// CACHE SEGMENT SIZE.
    pub cache_segment_size: u16,
}

/// Control mode page (0Ah).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ControlPage {
    /// PS: parameters savable.
    pub ps: bool,
    /// TST (3 bits): task set type.
    pub tst: u8,
    /// TMF_ONLY.
    pub tmf_only: bool,
    /// DPICZ.
    pub dpicz: bool,
    /// D_SENSE: return descriptor-format sense data.
    pub d_sense: bool,
    /// GLTSD: global logging target save disable.
    pub gltsd: bool,
    /// RLEC: report log exception condition.
    pub rlec: bool,
    /// QUEUE ALGORITHM MODIFIER (4 bits).
    pub queue_algorithm_modifier: u8,
    /// NUAR: no unit attention on release.
    pub nuar: bool,
    /// QERR (2 bits).
    pub qerr: u8,
    /// RAC: report a check.
    pub rac: bool,
    /// UA_INTLCK_CTRL (2 bits).
    pub ua_intlck_ctrl: u8,
    /// SWP: software write protect.
    pub swp: bool,
    /// ATO: application tag owner.
    pub ato: bool,
    /// TAS: task aborted status.
    pub tas: bool,
    /// ATMPE: application tag mode page enabled.
    pub atmpe: bool,
    /// RWWP: reject write without protection.
    pub rwwp: bool,
    /// AUTOLOAD MODE (3 bits).
    pub autoload_mode: u8,
    /// BUSY TIMEOUT PERIOD (100 ms units).
    pub busy_timeout_period: u16,
    /// EXTENDED SELF-TEST COMPLETION TIME (seconds).
    pub extended_self_test_completion_time: u16,
}

/// Informational exceptions control mode page (1Ch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct InformationalExceptionsPage {
    /// PS: parameters savable.
    pub ps: bool,
    /// PERF: performance.
    pub perf: bool,
    /// EBF: enable background function.
    pub ebf: bool,
    /// EWASC: enable warning.
    pub ewasc: bool,
    /// DEXCPT: disable exception control.
    pub dexcpt: bool,
    /// TEST.
    pub test: bool,
    /// EBACKERR: enable background error reporting.
    pub ebackerr: bool,
    /// LOGERR: log errors.
    pub logerr: bool,
    /// MRIE (4 bits): method of reporting informational exceptions.
    pub mrie: u8,
    /// INTERVAL TIMER (100 ms units).
    pub interval_timer: u32,
    /// REPORT COUNT.
    pub report_count: u32,
}

/// Read-write error recovery mode page (01h, SBC-4 6.5.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ReadWriteErrorRecoveryPage {
    /// PS: parameters savable.
    pub ps: bool,
    /// AWRE: automatic write reallocation enabled.
    pub awre: bool,
    /// ARRE: automatic read reallocation enabled.
    pub arre: bool,
    /// TB: transfer block.
    pub tb: bool,
    /// RC: read continuous.
    pub rc: bool,
    /// EER: enable early recovery.
    pub eer: bool,
    /// PER: post error.
    pub per: bool,
    /// DTE: data terminate on error.
    pub dte: bool,
    /// DCR: disable correction.
    pub dcr: bool,
    /// READ RETRY COUNT.
    pub read_retry_count: u8,
    /// LBPERE: logical block provisioning error reporting enabled; while
    /// it is zero the device server establishes no THIN PROVISIONING SOFT
    /// THRESHOLD REACHED unit attention (SBC-4 4.7.3.7.6).
    pub lbpere: bool,
    /// The other bits of byte 7 (MWR, misaligned write reporting, and
    /// reserved bits), kept as sent (7 bits).
    pub mwr: u8,
    /// WRITE RETRY COUNT.
    pub write_retry_count: u8,
    /// RECOVERY TIME LIMIT (milliseconds).
    pub recovery_time_limit: u16,
}

/// One threshold descriptor of the logical block provisioning mode page
/// (SBC-4 6.5.9.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ThresholdDescriptor {
    /// ENABLED.
    pub enabled: bool,
    /// THRESHOLD TYPE (3 bits): 000b soft threshold in threshold sets.
    pub threshold_type: u8,
    /// THRESHOLD ARMING (3 bits): 000b armed decreasing, 001b armed
    /// increasing.
    pub arming: u8,
    /// THRESHOLD RESOURCE: 01h available LBA mapping resources, 02h used
    /// ones (the parameter codes of the logical block provisioning log page).
    pub resource: u8,
    /// THRESHOLD COUNT: the centre of the threshold range, in threshold sets
    /// (2^THRESHOLD EXPONENT logical blocks, VPD B2h).
    pub count: u32,
}

/// Logical block provisioning mode page (1Ch/02h, SBC-4 6.5.9.1).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct LogicalBlockProvisioningPage {
    /// PS: parameters savable.
    pub ps: bool,
    /// SITUA: a crossed threshold's unit attention goes to one I_T nexus
    /// (the one of the next command) instead of every one.
    pub situa: bool,
    /// Threshold descriptors, 8 bytes each after 12 bytes of page fields.
    pub thresholds: Vec<ThresholdDescriptor>,
}

/// Bytes between the logical block provisioning page's header and its
/// first threshold descriptor (SITUA and reserved bytes 4-15).
const LBP_FIELDS_LEN: usize = 12;
/// One threshold descriptor.
const THRESHOLD_DESCRIPTOR_LEN: usize = 8;
/// The byte offset of the first threshold descriptor in the logical block
/// provisioning page: the INFORMATION of a THIN PROVISIONING SOFT THRESHOLD
/// REACHED unit attention about it (SBC-4 4.7.3.7.6).
pub const FIRST_THRESHOLD_DESCRIPTOR_OFFSET: u64 = 4 + LBP_FIELDS_LEN as u64;

/// A mode page.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ModePage {
    /// 01h.
    ReadWriteErrorRecovery(ReadWriteErrorRecoveryPage),
    /// 08h.
    Caching(CachingPage),
    /// 0Ah.
    Control(ControlPage),
    /// 1Ch.
    InformationalExceptions(InformationalExceptionsPage),
    /// 1Ch/02h.
    LogicalBlockProvisioning(LogicalBlockProvisioningPage),
    /// Any other page or subpage, raw.
    Other {
        /// PS.
        ps: bool,
        /// PAGE CODE (6 bits).
        page_code: u8,
        /// SUBPAGE CODE for the sub_page format (SPF=1); `None` for page_0.
        subpage_code: Option<u8>,
        /// Mode parameters after the page header.
        data: Vec<u8>,
    },
}

/// PAGE LENGTH of the caching page.
const CACHING_LEN: usize = 0x12;
/// PAGE LENGTH of the control and informational exceptions pages.
const CONTROL_LEN: usize = 0x0a;

/// A byte of eight one-bit fields, bit 7 first (as SPC draws them).
fn pack(bits: [bool; 8]) -> u8 {
    bits.iter().fold(0, |b, &set| b << 1 | u8::from(set))
}

/// The eight one-bit fields of a byte, bit 7 first ([`pack`] undone).
fn unpack(byte: u8) -> [bool; 8] {
    std::array::from_fn(|i| bit(byte, 7 - i as u8))
}

fn put(dst: &mut [u8], off: usize, src: &[u8]) {
    if let Some(d) = dst.get_mut(off..off + src.len()) {
        d.copy_from_slice(src);
    }
}

impl ModePage {
    /// (PAGE CODE, SUBPAGE CODE).
    pub fn code(&self) -> (u8, Option<u8>) {
        match self {
            Self::ReadWriteErrorRecovery(_) => (page::READ_WRITE_ERROR_RECOVERY, None),
            Self::Caching(_) => (page::CACHING, None),
            Self::Control(_) => (page::CONTROL, None),
            Self::InformationalExceptions(_) => (page::INFORMATIONAL_EXCEPTIONS, None),
            Self::LogicalBlockProvisioning(_) => (
                page::INFORMATIONAL_EXCEPTIONS,
                Some(page::LOGICAL_BLOCK_PROVISIONING_SUBPAGE),
            ),
            Self::Other {
                page_code,
                subpage_code,
                ..
            } => (*page_code & 0x3f, *subpage_code),
        }
    }

    /// Appends the page (header included) to `out`. Oversized `Other` data
    /// is truncated to what its length field can express.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let (code, ps, body) = match self {
            Self::ReadWriteErrorRecovery(p) => {
                let mut v = vec![0u8; CONTROL_LEN];
                put(
                    &mut v,
                    0,
                    &[
                        pack([p.awre, p.arre, p.tb, p.rc, p.eer, p.per, p.dte, p.dcr]),
                        p.read_retry_count,
                    ],
                );
                put(
                    &mut v,
                    5,
                    &[flag(p.lbpere, 7) | (p.mwr & 0x7f), p.write_retry_count],
                );
                put(&mut v, 8, &p.recovery_time_limit.to_be_bytes());
                (page::READ_WRITE_ERROR_RECOVERY, p.ps, v)
            }
            Self::LogicalBlockProvisioning(p) => {
                // A page length is 16 bits: at most this many descriptors.
                let most = (usize::from(u16::MAX) - LBP_FIELDS_LEN) / THRESHOLD_DESCRIPTOR_LEN;
                let n = p.thresholds.len().min(most);
                let len = LBP_FIELDS_LEN + n * THRESHOLD_DESCRIPTOR_LEN;
                out.push(flag(p.ps, 7) | 0x40 | page::INFORMATIONAL_EXCEPTIONS);
                out.push(page::LOGICAL_BLOCK_PROVISIONING_SUBPAGE);
                out.extend_from_slice(&(len as u16).to_be_bytes());
                let mut fields = [0u8; LBP_FIELDS_LEN];
                fields[0] = flag(p.situa, 0);
                out.extend_from_slice(&fields);
                for t in p.thresholds.iter().take(n) {
                    out.push(flag(t.enabled, 7) | (t.threshold_type & 7) << 3 | (t.arming & 7));
                    out.push(t.resource);
                    out.extend_from_slice(&[0, 0]);
                    out.extend_from_slice(&t.count.to_be_bytes());
                }
                return;
            }
            Self::Caching(c) => {
                let mut v = vec![0u8; CACHING_LEN];
                put(
                    &mut v,
                    0,
                    &[
                        pack([c.ic, c.abpf, c.cap, c.disc, c.size, c.wce, c.mf, c.rcd]),
                        (c.demand_read_retention_priority & 0x0f) << 4
                            | (c.write_retention_priority & 0x0f),
                    ],
                );
                put(&mut v, 2, &c.disable_prefetch_transfer_length.to_be_bytes());
                put(&mut v, 4, &c.minimum_prefetch.to_be_bytes());
                put(&mut v, 6, &c.maximum_prefetch.to_be_bytes());
                put(&mut v, 8, &c.maximum_prefetch_ceiling.to_be_bytes());
                put(
                    &mut v,
                    10,
                    &[
                        flag(c.fsw, 7) | flag(c.lbcss, 6) | flag(c.dra, 5) | flag(c.nv_dis, 0),
                        c.number_of_cache_segments,
                    ],
                );
                put(&mut v, 12, &c.cache_segment_size.to_be_bytes());
                (page::CACHING, c.ps, v)
            }
            Self::Control(c) => {
                let mut v = vec![0u8; CONTROL_LEN];
                put(
                    &mut v,
                    0,
                    &[
                        (c.tst & 7) << 5
                            | flag(c.tmf_only, 4)
                            | flag(c.dpicz, 3)
                            | flag(c.d_sense, 2)
                            | flag(c.gltsd, 1)
                            | flag(c.rlec, 0),
                        (c.queue_algorithm_modifier & 0x0f) << 4
                            | flag(c.nuar, 3)
                            | (c.qerr & 3) << 1,
                        flag(c.rac, 6) | (c.ua_intlck_ctrl & 3) << 4 | flag(c.swp, 3),
                        flag(c.ato, 7)
                            | flag(c.tas, 6)
                            | flag(c.atmpe, 5)
                            | flag(c.rwwp, 4)
                            | (c.autoload_mode & 7),
                    ],
                );
                put(&mut v, 6, &c.busy_timeout_period.to_be_bytes());
                put(
                    &mut v,
                    8,
                    &c.extended_self_test_completion_time.to_be_bytes(),
                );
                (page::CONTROL, c.ps, v)
            }
            Self::InformationalExceptions(p) => {
                let mut v = vec![0u8; CONTROL_LEN];
                put(
                    &mut v,
                    0,
                    &[
                        flag(p.perf, 7)
                            | flag(p.ebf, 5)
                            | flag(p.ewasc, 4)
                            | flag(p.dexcpt, 3)
                            | flag(p.test, 2)
                            | flag(p.ebackerr, 1)
                            | flag(p.logerr, 0),
                        p.mrie & 0x0f,
                    ],
                );
                put(&mut v, 2, &p.interval_timer.to_be_bytes());
                put(&mut v, 6, &p.report_count.to_be_bytes());
                (page::INFORMATIONAL_EXCEPTIONS, p.ps, v)
            }
            Self::Other {
                ps,
                page_code,
                subpage_code,
                data,
            } => {
                let code = page_code & 0x3f;
                if let Some(sub) = subpage_code {
                    let n = data.len().min(usize::from(u16::MAX));
                    out.push(flag(*ps, 7) | 0x40 | code);
                    out.push(*sub);
                    out.extend_from_slice(&(n as u16).to_be_bytes());
                    out.extend_from_slice(data.get(..n).unwrap_or_default());
                    return;
                }
                (code, *ps, data.iter().copied().take(255).collect())
            }
        };
        out.push(flag(ps, 7) | code);
        out.push(body.len() as u8);
        out.extend_from_slice(&body);
    }

    /// Parses one page at the start of `b`; returns it and its total length.
    /// Offsets in errors are relative to `b`.
    pub fn decode(b: &[u8]) -> Result<(ModePage, usize), DataError> {
        let b0 = u8_at(need(b, 2)?, 0).unwrap_or(0);
        let ps = bit(b0, 7);
        let code = b0 & 0x3f;
        if bit(b0, 6) {
            let h = need(b, 4)?;
            let len = usize::from(be16(h, 2).unwrap_or(0));
            let data = need(b, 4 + len)?.get(4..).unwrap_or_default().to_vec();
            let sub = u8_at(h, 1).unwrap_or(0);
            if code == page::INFORMATIONAL_EXCEPTIONS
                && sub == page::LOGICAL_BLOCK_PROVISIONING_SUBPAGE
            {
                return Ok((decode_lbp(ps, &data)?, 4 + len));
            }
            let page = ModePage::Other {
                ps,
                page_code: code,
                subpage_code: u8_at(h, 1),
                data,
            };
            return Ok((page, 4 + len));
        }
        let len = usize::from(u8_at(b, 1).unwrap_or(0));
        let d = need(b, 2 + len)?.get(2..).unwrap_or_default();
        let at = |i| u8_at(d, i).unwrap_or(0);
        let b16 = |i| be16(d, i).unwrap_or(0);
        let b32 = |i| be32(d, i).unwrap_or(0);
        let expect = |n: usize| {
            if len == n {
                Ok(())
            } else {
                Err(DataError::InvalidField { byte: 1, bit: None })
            }
        };
        let page = match code {
            page::READ_WRITE_ERROR_RECOVERY => {
                expect(CONTROL_LEN)?;
                let [awre, arre, tb, rc, eer, per, dte, dcr] = unpack(at(0));
                ModePage::ReadWriteErrorRecovery(ReadWriteErrorRecoveryPage {
                    ps,
                    awre,
                    arre,
                    tb,
                    rc,
                    eer,
                    per,
                    dte,
                    dcr,
                    read_retry_count: at(1),
                    lbpere: bit(at(5), 7),
                    mwr: at(5) & 0x7f,
                    write_retry_count: at(6),
                    recovery_time_limit: b16(8),
                })
            }
            page::CACHING => {
                expect(CACHING_LEN)?;
                let [ic, abpf, cap, disc, size, wce, mf, rcd] = unpack(at(0));
                ModePage::Caching(CachingPage {
                    ps,
                    ic,
                    abpf,
                    cap,
                    disc,
                    size,
                    wce,
                    mf,
                    rcd,
                    demand_read_retention_priority: at(1) >> 4,
                    write_retention_priority: at(1) & 0x0f,
                    disable_prefetch_transfer_length: b16(2),
                    minimum_prefetch: b16(4),
                    maximum_prefetch: b16(6),
                    maximum_prefetch_ceiling: b16(8),
                    fsw: bit(at(10), 7),
                    lbcss: bit(at(10), 6),
                    dra: bit(at(10), 5),
                    nv_dis: bit(at(10), 0),
                    number_of_cache_segments: at(11),
                    cache_segment_size: b16(12),
                })
            }
            page::CONTROL => {
                expect(CONTROL_LEN)?;
                ModePage::Control(ControlPage {
                    ps,
                    tst: at(0) >> 5,
                    tmf_only: bit(at(0), 4),
                    dpicz: bit(at(0), 3),
                    d_sense: bit(at(0), 2),
                    gltsd: bit(at(0), 1),
                    rlec: bit(at(0), 0),
                    queue_algorithm_modifier: at(1) >> 4,
                    nuar: bit(at(1), 3),
                    qerr: (at(1) >> 1) & 3,
                    rac: bit(at(2), 6),
                    ua_intlck_ctrl: (at(2) >> 4) & 3,
                    swp: bit(at(2), 3),
                    ato: bit(at(3), 7),
                    tas: bit(at(3), 6),
                    atmpe: bit(at(3), 5),
                    rwwp: bit(at(3), 4),
                    autoload_mode: at(3) & 7,
                    busy_timeout_period: b16(6),
                    extended_self_test_completion_time: b16(8),
                })
            }
            page::INFORMATIONAL_EXCEPTIONS => {
                expect(CONTROL_LEN)?;
                ModePage::InformationalExceptions(InformationalExceptionsPage {
                    ps,
                    perf: bit(at(0), 7),
                    ebf: bit(at(0), 5),
                    ewasc: bit(at(0), 4),
                    dexcpt: bit(at(0), 3),
                    test: bit(at(0), 2),
                    ebackerr: bit(at(0), 1),
                    logerr: bit(at(0), 0),
                    mrie: at(1) & 0x0f,
                    interval_timer: b32(2),
                    report_count: b32(6),
                })
            }
            _ => ModePage::Other {
                ps,
                page_code: code,
                subpage_code: None,
                data: d.to_vec(),
            },
        };
        Ok((page, 2 + len))
    }
}

/// The logical block provisioning page's fields after its 4-byte header:
/// 12 bytes of page fields, then whole 8-byte threshold descriptors (a
/// length that leaves part of one is refused, pointing at PAGE LENGTH).
fn decode_lbp(ps: bool, d: &[u8]) -> Result<ModePage, DataError> {
    let Some(descriptors) = d.get(LBP_FIELDS_LEN..) else {
        return Err(DataError::InvalidField { byte: 2, bit: None });
    };
    if descriptors.len() % THRESHOLD_DESCRIPTOR_LEN != 0 {
        return Err(DataError::InvalidField { byte: 2, bit: None });
    }
    let thresholds = descriptors
        .chunks_exact(THRESHOLD_DESCRIPTOR_LEN)
        .map(|t| {
            let b0 = u8_at(t, 0).unwrap_or(0);
            ThresholdDescriptor {
                enabled: bit(b0, 7),
                threshold_type: (b0 >> 3) & 7,
                arming: b0 & 7,
                resource: u8_at(t, 1).unwrap_or(0),
                count: be32(t, 4).unwrap_or(0),
            }
        })
        .collect();
    Ok(ModePage::LogicalBlockProvisioning(
        LogicalBlockProvisioningPage {
            ps,
            situa: bit(u8_at(d, 0).unwrap_or(0), 0),
            thresholds,
        },
    ))
}

/// MODE SENSE data or a MODE SELECT parameter list.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ModeParameters {
    /// Header fields.
    pub header: ModeHeader,
    /// Block descriptors (usually zero or one).
    pub block_descriptors: Vec<BlockDescriptor>,
    /// Use 16-byte block descriptors (LONGLBA; 10-byte form only).
    pub long_lba: bool,
    /// Mode pages in order.
    pub pages: Vec<ModePage>,
}

impl ModeParameters {
    fn descriptors(&self, long: bool) -> Vec<u8> {
        let mut v = Vec::new();
        for d in &self.block_descriptors {
            if long {
                v.extend_from_slice(&d.number_of_blocks.to_be_bytes());
                v.extend_from_slice(&[0; 4]);
                v.extend_from_slice(&d.block_length.to_be_bytes());
            } else {
                let n = u32::try_from(d.number_of_blocks).unwrap_or(u32::MAX);
                v.extend_from_slice(&n.to_be_bytes());
                v.extend_from_slice(&(d.block_length & 0xff_ffff).to_be_bytes());
            }
        }
        v
    }

    fn device_specific(&self) -> u8 {
        flag(self.header.wp, 7) | flag(self.header.dpofua, 4)
    }

    fn pages_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        for p in &self.pages {
            p.encode_into(&mut v);
        }
        v
    }

    /// MODE SENSE(6)/MODE SELECT(6) form: 4-byte header, short block
    /// descriptors. MODE DATA LENGTH saturates at 255; the caller keeps the
    /// data within the 6-byte form's limits.
    pub fn encode6(&self) -> Vec<u8> {
        let bd = self.descriptors(false);
        let pages = self.pages_bytes();
        let total = 4 + bd.len() + pages.len();
        let mut v = vec![
            u8::try_from(total - 1).unwrap_or(u8::MAX),
            self.header.medium_type,
            self.device_specific(),
            u8::try_from(bd.len()).unwrap_or(u8::MAX),
        ];
        v.extend_from_slice(&bd);
        v.extend_from_slice(&pages);
        v
    }

    /// MODE SENSE(10)/MODE SELECT(10) form: 8-byte header, long block
    /// descriptors when `long_lba` is set.
    pub fn encode10(&self) -> Vec<u8> {
        let bd = self.descriptors(self.long_lba);
        let pages = self.pages_bytes();
        let total = 8 + bd.len() + pages.len();
        let mut v = Vec::with_capacity(total);
        v.extend_from_slice(&u16::try_from(total - 2).unwrap_or(u16::MAX).to_be_bytes());
        v.extend_from_slice(&[
            self.header.medium_type,
            self.device_specific(),
            flag(self.long_lba, 0),
            0,
        ]);
        v.extend_from_slice(&u16::try_from(bd.len()).unwrap_or(u16::MAX).to_be_bytes());
        v.extend_from_slice(&bd);
        v.extend_from_slice(&pages);
        v
    }

    /// Parses the 6-byte form. MODE DATA LENGTH is ignored (it is reserved
    /// in MODE SELECT); the whole buffer is parsed, so an initiator passes
    /// exactly the bytes it received. Fuzz entry point.
    pub fn decode6(buf: &[u8]) -> Result<Self, DataError> {
        let h = need(buf, 4)?;
        let at = |i| u8_at(h, i).unwrap_or(0);
        Self::decode_common(buf, 4, at(1), at(2), false, usize::from(at(3)), 3)
    }

    /// Parses the 10-byte form (see [`ModeParameters::decode6`]). Fuzz entry
    /// point.
    pub fn decode10(buf: &[u8]) -> Result<Self, DataError> {
        let h = need(buf, 8)?;
        let at = |i| u8_at(h, i).unwrap_or(0);
        let bdl = usize::from(be16(h, 6).unwrap_or(0));
        Self::decode_common(buf, 8, at(2), at(3), bit(at(4), 0), bdl, 6)
    }

    fn decode_common(
        buf: &[u8],
        hlen: usize,
        medium_type: u8,
        dsp: u8,
        long_lba: bool,
        bdl: usize,
        bdl_offset: usize,
    ) -> Result<Self, DataError> {
        let unit = if long_lba { 16 } else { 8 };
        if bdl & (unit - 1) != 0 {
            return Err(DataError::InvalidField {
                byte: bdl_offset,
                bit: None,
            });
        }
        let bd = need(buf, hlen + bdl)?.get(hlen..).unwrap_or_default();
        let block_descriptors = bd
            .chunks_exact(unit)
            .map(|c| {
                if long_lba {
                    BlockDescriptor {
                        number_of_blocks: be64(c, 0).unwrap_or(0),
                        block_length: be32(c, 12).unwrap_or(0),
                    }
                } else {
                    BlockDescriptor {
                        number_of_blocks: u64::from(be32(c, 0).unwrap_or(0)),
                        block_length: be32(c, 4).unwrap_or(0) & 0xff_ffff,
                    }
                }
            })
            .collect();
        let mut pages = Vec::new();
        let mut off = hlen + bdl;
        while off < buf.len() {
            let rest = buf.get(off..).unwrap_or_default();
            let (p, n) = ModePage::decode(rest).map_err(|e| match e {
                DataError::Truncated { needed, got } => DataError::Truncated {
                    needed: needed + off,
                    got: got + off,
                },
                DataError::InvalidField { byte, bit } => DataError::InvalidField {
                    byte: byte + off,
                    bit,
                },
                other => other,
            })?;
            pages.push(p);
            off += n;
        }
        Ok(Self {
            header: ModeHeader {
                medium_type,
                wp: bit(dsp, 7),
                dpofua: bit(dsp, 4),
            },
            block_descriptors,
            long_lba,
            pages,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_sense6_caching() {
        let m = ModeParameters {
            header: ModeHeader {
                dpofua: true,
                ..Default::default()
            },
            block_descriptors: vec![BlockDescriptor {
                number_of_blocks: 0x1000,
                block_length: 512,
            }],
            long_lba: false,
            pages: vec![ModePage::Caching(CachingPage {
                wce: true,
                ..Default::default()
            })],
        };
        let b = m.encode6();
        assert_eq!(b.len(), 4 + 8 + 20);
        assert_eq!(b.get(..4), Some(&[31, 0, 0x10, 8][..]));
        assert_eq!(b.get(4..12), Some(&[0, 0, 0x10, 0, 0, 0, 2, 0][..]));
        assert_eq!(b.get(12..15), Some(&[0x08, 0x12, 0x04][..]));
        assert_eq!(ModeParameters::decode6(&b).unwrap(), m);
        // Wrong page length for the caching page: pointer at its length byte.
        let mut bad = b.clone();
        if let Some(x) = bad.get_mut(13) {
            *x = 0x11;
        }
        bad.pop();
        assert_eq!(
            ModeParameters::decode6(&bad),
            Err(DataError::InvalidField {
                byte: 13,
                bit: None
            })
        );
    }

    #[test]
    fn mode_sense10_long_lba_control_iec() {
        let m = ModeParameters {
            header: ModeHeader::default(),
            block_descriptors: vec![BlockDescriptor {
                number_of_blocks: 1 << 40,
                block_length: 4096,
            }],
            long_lba: true,
            pages: vec![
                ModePage::Control(ControlPage {
                    d_sense: true,
                    qerr: 0,
                    tas: true,
                    busy_timeout_period: 0xffff,
                    ..Default::default()
                }),
                ModePage::InformationalExceptions(InformationalExceptionsPage {
                    dexcpt: true,
                    mrie: 6,
                    ..Default::default()
                }),
                ModePage::Other {
                    ps: false,
                    page_code: 0x0a,
                    subpage_code: Some(1),
                    data: vec![1, 2, 3],
                },
            ],
        };
        let b = m.encode10();
        assert_eq!(b.get(..8), Some(&[0, 53, 0, 0, 1, 0, 0, 16][..]));
        assert_eq!(ModeParameters::decode10(&b).unwrap(), m);
        assert!(ModeParameters::decode10(b.get(..30).unwrap()).is_err());
    }
}
