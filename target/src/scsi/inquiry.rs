//! INQUIRY: standard data and the VPD pages (SPC-4 6.6, 7.8; SBC-3 6.5).

use blockwire_pdu::scsi::vpd::page;
use blockwire_pdu::scsi::{
    Association, BlockDeviceCharacteristics, BlockLimits, Designator, ExtendedInquiry,
    LogicalBlockProvisioning, StandardInquiry, Vpd, VpdPage,
};

use super::alua::PortGroups;
use super::identity::naa_parts;
use super::logical_unit::{LogicalUnit, MAX_TRANSFER_BYTES};
use super::outcome::{invalid_cdb, CmdResult, Done};
use super::ItNexus;

/// Most UNMAP / WRITE SAME work one command may ask for, in bytes: bounds
/// the time one command holds a backstore thread.
pub(crate) const MAX_UNMAP_BYTES: u64 = 1 << 30;

/// Most blocks one UNMAP may name, whatever the block size (libiscsi
/// calls more than 2^20 "insanely big").
pub(crate) const MAX_UNMAP_BLOCKS: u64 = 1 << 20;

/// Most UNMAP block descriptors in one parameter list.
pub(crate) const MAX_UNMAP_DESCRIPTORS: u32 = 256;

/// VPD pages this unit answers, ascending (VPD 00h lists them).
const PAGES: [u8; 8] = [
    page::SUPPORTED_PAGES,
    page::UNIT_SERIAL_NUMBER,
    page::DEVICE_IDENTIFICATION,
    page::EXTENDED_INQUIRY,
    page::THIRD_PARTY_COPY,
    page::BLOCK_LIMITS,
    page::BLOCK_DEVICE_CHARACTERISTICS,
    page::LOGICAL_BLOCK_PROVISIONING,
];

impl LogicalUnit {
    /// Standard INQUIRY data as this unit reports it.
    /// `tpgs` is the target's ALUA support (see `PortGroups::tpgs`).
    pub(crate) fn standard_inquiry(&self, tpgs: u8) -> StandardInquiry {
        let mut inq = StandardInquiry::new(&self.cfg.vendor, &self.cfg.product, &self.cfg.revision);
        // ALUA: REPORT TARGET PORT GROUPS is always answered; SET TARGET
        // PORT GROUPS only where the target allows explicit transitions.
        inq.tpgs = tpgs;
        // EXTENDED COPY (LID1) and the token-based copies within the
        // target.
        inq.three_pc = true;
        inq.rmb = self.cfg.removable;
        inq.protect = self.protected();
        inq
    }

    /// INQUIRY; `ports` are the target's port groups (TPGS; VPD 83h names
    /// the group of the port the command came through).
    pub(crate) fn inquiry(
        &self,
        nexus: &ItNexus,
        ports: &PortGroups,
        evpd: bool,
        page_code: u8,
        allocation_length: u16,
    ) -> CmdResult {
        let alloc = u32::from(allocation_length);
        if !evpd {
            return Ok(Done::data(
                self.standard_inquiry(ports.tpgs()).encode(),
                alloc,
            ));
        }
        let port_group = ports.of_port(nexus.relative_target_port).0;
        let body = match page_code {
            page::SUPPORTED_PAGES => VpdPage::SupportedPages(PAGES.to_vec()),
            page::UNIT_SERIAL_NUMBER => VpdPage::UnitSerialNumber(self.cfg.serial.clone()),
            page::DEVICE_IDENTIFICATION => {
                VpdPage::DeviceIdentification(self.designators(nexus, port_group))
            }
            page::EXTENDED_INQUIRY => VpdPage::ExtendedInquiry(ExtendedInquiry {
                // Only SIMPLE task attributes are honoured as such.
                simpsup: true,
                // The backstore has a volatile cache (WCE) that SYNCHRONIZE
                // CACHE flushes.
                v_sup: self.cfg.backstore.volatile_cache(),
                // SPT 000b: Type 1 protection; the guard and the reference
                // tag are checked, the application tag never (ATO=0: it
                // belongs to the application client).
                grd_chk: self.protected(),
                ref_chk: self.protected(),
                ..ExtendedInquiry::default()
            }),
            page::THIRD_PARTY_COPY => VpdPage::Other {
                page_code: page::THIRD_PARTY_COPY,
                data: self.third_party_copy_page(),
            },
            page::BLOCK_LIMITS => VpdPage::BlockLimits(self.block_limits()),
            page::BLOCK_DEVICE_CHARACTERISTICS => {
                VpdPage::BlockDeviceCharacteristics(BlockDeviceCharacteristics {
                    // Non-rotating medium: no seek penalty to plan around.
                    medium_rotation_rate: 1,
                    // SBC-4 6.6.2: 01b, a READ of a block a SANITIZE BLOCK
                    // ERASE deallocated completes with GOOD (zeros, LBPRZ=1);
                    // 00b where BLOCK ERASE is not offered. CRYPTO ERASE
                    // never is (WACEREQ 00b).
                    wabereq: u8::from(self.offers_block_erase()),
                    // A VERIFY with BYTCHK compares unmapped blocks as a
                    // READ returns them (zeros) rather than failing them.
                    vbuls: true,
                    ..BlockDeviceCharacteristics::default()
                })
            }
            page::LOGICAL_BLOCK_PROVISIONING => {
                VpdPage::LogicalBlockProvisioning(self.provisioning())
            }
            _ => return Err(invalid_cdb(2, None)),
        };
        Ok(Done::data(Vpd::disk(body).encode(), alloc))
    }

    /// VPD 83h: the logical unit's NAA and T10 vendor names, then the
    /// target port the command came through (SCSI name string, relative
    /// port, and `port_group`, the target port group it belongs to) and the
    /// target device's name.
    fn designators(&self, nexus: &ItNexus, port_group: u16) -> Vec<Designator> {
        let (vendor_specific, extension) = naa_parts(self.cfg.naa_id);
        let mut v = vec![
            Designator::naa_registered_extended(self.cfg.company_id, vendor_specific, extension),
            Designator::t10_vendor_id(&self.cfg.vendor, self.cfg.serial.as_bytes()),
            Designator::iscsi_name(&nexus.target_port, Association::TargetPort),
            Designator::relative_target_port(nexus.relative_target_port),
            Designator::target_port_group(port_group),
        ];
        if let Some((target, _)) = nexus.target_port.split_once(",t,") {
            v.push(Designator::iscsi_name(target, Association::TargetDevice));
        }
        v
    }

    /// The bytes a block takes on the wire at most: with its tuple on a
    /// protected unit.
    fn wire_block_bytes(&self) -> u32 {
        if self.protected() {
            self.protected_block_bytes() as u32
        } else {
            self.cfg.block_size
        }
    }

    /// MAXIMUM TRANSFER LENGTH in blocks (VPD B0h), which every READ and
    /// WRITE is held to: a protected unit's Data-In and Data-Out carry each
    /// block's tuple too, and a command of this many blocks must fit the
    /// target's buffers with them.
    pub(crate) fn max_transfer_blocks(&self) -> u32 {
        MAX_TRANSFER_BYTES / self.wire_block_bytes()
    }

    /// VPD B0h.
    pub(crate) fn block_limits(&self) -> BlockLimits {
        let bs = self.cfg.block_size;
        let per_4k = (4096 / bs).max(1);
        let thin = self.cfg.thin_provisioning;
        let mut l = BlockLimits {
            // WRITE SAME of 0 blocks means "to the end of the medium",
            // bounded like any other by MAXIMUM WRITE SAME LENGTH.
            wsnz: false,
            max_compare_and_write_length: 255,
            optimal_transfer_length_granularity: per_4k as u16,
            max_transfer_length: self.max_transfer_blocks(),
            optimal_transfer_length: (1 << 20) / bs,
            max_prefetch_length: MAX_TRANSFER_BYTES / bs,
            max_unmap_lba_count: if thin {
                (MAX_UNMAP_BYTES / u64::from(bs)).min(MAX_UNMAP_BLOCKS) as u32
            } else {
                0
            },
            max_unmap_block_descriptor_count: if thin { MAX_UNMAP_DESCRIPTORS } else { 0 },
            optimal_unmap_granularity: if thin { per_4k } else { 0 },
            unmap_granularity_alignment: thin.then_some(0),
            max_write_same_length: MAX_UNMAP_BYTES / u64::from(bs),
            ..BlockLimits::default()
        };
        self.atomic_limits(&mut l);
        l
    }

    /// VPD B2h.
    fn provisioning(&self) -> LogicalBlockProvisioning {
        let thin = self.cfg.thin_provisioning;
        LogicalBlockProvisioning {
            lbpu: thin,
            lbpws: thin,
            lbpws10: thin,
            // Backstore::discard guarantees deallocated blocks read as zero.
            lbprz: u8::from(thin),
            provisioning_type: if thin { 2 } else { 0 },
            // Threshold sets of 1 MiB where the unit reports its space
            // (the Logical Block Provisioning log and mode pages).
            threshold_exponent: if self.reports_space() {
                super::provisioning::threshold_exponent(self.cfg.block_size)
            } else {
                0
            },
            ..LogicalBlockProvisioning::default()
        }
    }
}
