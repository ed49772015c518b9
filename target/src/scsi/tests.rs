//! Command-level tests of the SCSI core over RAM backstores.

use std::sync::Arc;

use blockwire_pdu::pdu::codes::TaskAttr;
use blockwire_pdu::scsi::{
    Asc, Association, Cdb, CdbSize, DesignatorId, ModePage, ModeParameters, PageControl,
    ReadCapacity10, ReadCapacity16, Rw, Sense, SenseKey, StandardInquiry, Vpd, VpdPage,
};

use super::*;
use crate::backstore::RamBackstore;

pub(crate) const GOOD: u8 = 0;
pub(crate) const CHECK: u8 = 2;
pub(crate) const CONFLICT: u8 = 0x18;

pub(crate) fn nexus(name: &str) -> ItNexus {
    ItNexus::iscsi(name, [0x40, 0, 0, 0, 0, 1], "iqn.2024-01.test:tgt", 1)
}

pub(crate) fn table_with(cfg: impl FnOnce(&mut LuConfig)) -> LunTable {
    let mut c = LuConfig::new(Arc::new(RamBackstore::new(1 << 20)));
    cfg(&mut c);
    LunTable::new(vec![(0, Arc::new(LogicalUnit::new(c)))])
}

pub(crate) fn table() -> LunTable {
    table_with(|_| {})
}

pub(crate) fn run(t: &LunTable, n: &ItNexus, cdb: &[u8], out: &[u8], cap: u32) -> ScsiResult {
    on(t, n, 0, cdb, out, cap)
}

/// `cdb` to LUN `lun` of `t` from nexus `n`.
pub(crate) fn on(
    t: &LunTable,
    n: &ItNexus,
    lun: u16,
    cdb: &[u8],
    out: &[u8],
    cap: u32,
) -> ScsiResult {
    t.execute(&ScsiRequest {
        lun,
        cdb,
        nexus: n,
        task_tag: 1,
        attr: TaskAttr::Simple,
        data_out: out,
        data_in_capacity: cap,
        initiator_stats: None,
    })
}

/// INQUIRY of VPD page `page` (64 bytes at most) through `n`.
pub(crate) fn vpd_page(t: &LunTable, n: &ItNexus, page: u8) -> ScsiResult {
    let cdb = c(Cdb::Inquiry {
        evpd: true,
        page_code: page,
        allocation_length: 64,
    });
    run(t, n, &cdb, &[], 64)
}

pub(crate) fn c(cdb: Cdb) -> Vec<u8> {
    cdb.encode()
}

/// Sends TEST UNIT READY until the power-on unit attention is consumed.
pub(crate) fn ready(t: &LunTable, n: &ItNexus) {
    for _ in 0..8 {
        if run(t, n, &c(Cdb::TestUnitReady), &[], 0).status == GOOD {
            return;
        }
    }
    panic!("unit attentions never cleared");
}

pub(crate) fn sense(r: &ScsiResult) -> Sense {
    Sense::decode(r.sense.as_deref().expect("sense data")).expect("valid sense")
}

pub(crate) fn expect_check(r: &ScsiResult, key: SenseKey, asc: Asc) -> Sense {
    assert_eq!(r.status, CHECK, "{r:?}");
    let s = sense(r);
    assert_eq!((s.key, s.code()), (key, asc), "{s:?}");
    s
}

pub(crate) fn rw(size: CdbSize, lba: u64, length: u32) -> Rw {
    Rw {
        size,
        lba,
        length,
        protect: 0,
        dpo: false,
        fua: false,
        group: 0,
    }
}

pub(crate) fn write(t: &LunTable, n: &ItNexus, lba: u64, data: &[u8]) -> ScsiResult {
    let cdb = c(Cdb::Write(rw(
        CdbSize::Sixteen,
        lba,
        (data.len() / 512) as u32,
    )));
    run(t, n, &cdb, data, 0)
}

pub(crate) fn read(t: &LunTable, n: &ItNexus, lba: u64, blocks: u32) -> ScsiResult {
    let cdb = c(Cdb::Read {
        rw: rw(CdbSize::Ten, lba, blocks),
        rarc: false,
    });
    run(t, n, &cdb, &[], blocks * 512)
}

#[test]
fn power_on_unit_attention_once_per_nexus() {
    let t = table();
    let a = nexus("iqn.a");
    // INQUIRY neither reports nor clears it.
    let inq = c(Cdb::Inquiry {
        evpd: false,
        page_code: 0,
        allocation_length: 96,
    });
    assert_eq!(run(&t, &a, &inq, &[], 96).status, GOOD);
    let r = run(&t, &a, &c(Cdb::TestUnitReady), &[], 0);
    expect_check(
        &r,
        SenseKey::UnitAttention,
        Asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET,
    );
    assert_eq!(run(&t, &a, &c(Cdb::TestUnitReady), &[], 0).status, GOOD);
    // A second nexus gets its own.
    let b = nexus("iqn.b");
    let rs = c(Cdb::RequestSense {
        desc: false,
        allocation_length: 252,
    });
    let r = run(&t, &b, &rs, &[], 252);
    assert_eq!(r.status, GOOD);
    let s = Sense::decode(&r.data_in).unwrap();
    assert_eq!(s.code(), Asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET);
    assert_eq!(run(&t, &b, &c(Cdb::TestUnitReady), &[], 0).status, GOOD);
    let r = run(&t, &b, &rs, &[], 252);
    assert_eq!(Sense::decode(&r.data_in).unwrap().key, SenseKey::NoSense);
}

#[test]
fn inquiry_standard_and_vpd() {
    let t = table();
    let a = nexus("iqn.a");
    let r = run(
        &t,
        &a,
        &c(Cdb::Inquiry {
            evpd: false,
            page_code: 0,
            allocation_length: 255,
        }),
        &[],
        255,
    );
    assert_eq!(r.data_in.len(), 96);
    assert_eq!(r.transfer_length, 96);
    let inq = StandardInquiry::decode(&r.data_in).unwrap();
    assert_eq!(inq.vendor_str(), "BLOCKWIR");
    assert!(inq.version_descriptors.contains(&0x04c0));
    // Truncation to the allocation length, then to the capacity.
    let r = run(
        &t,
        &a,
        &c(Cdb::Inquiry {
            evpd: false,
            page_code: 0,
            allocation_length: 36,
        }),
        &[],
        20,
    );
    assert_eq!((r.data_in.len(), r.transfer_length), (20, 36));

    let vpd = |page: u8| {
        let r = run(
            &t,
            &a,
            &c(Cdb::Inquiry {
                evpd: true,
                page_code: page,
                allocation_length: 1024,
            }),
            &[],
            1024,
        );
        assert_eq!(r.status, GOOD, "page {page:#x}");
        Vpd::decode(&r.data_in).unwrap().page
    };
    let VpdPage::SupportedPages(p) = vpd(0) else {
        panic!()
    };
    for page in &p {
        vpd(*page);
    }
    assert!(p.windows(2).all(|w| w[0] < w[1]));
    let VpdPage::UnitSerialNumber(s) = vpd(0x80) else {
        panic!()
    };
    assert_eq!(s.len(), 16);
    let VpdPage::DeviceIdentification(ds) = vpd(0x83) else {
        panic!()
    };
    assert!(matches!(ds[0].id, DesignatorId::Naa(_)));
    assert!(matches!(ds[1].id, DesignatorId::T10VendorId { .. }));
    assert!(ds.iter().any(|d| d.association == Association::TargetPort
        && d.id == DesignatorId::ScsiName("iqn.2024-01.test:tgt,t,0x0001".into())));
    assert!(ds
        .iter()
        .any(|d| d.id == DesignatorId::RelativeTargetPort(1)));
    let VpdPage::BlockLimits(bl) = vpd(0xb0) else {
        panic!()
    };
    assert_eq!(bl.max_transfer_length, MAX_TRANSFER_BYTES / 512);

    let r = run(
        &t,
        &a,
        &c(Cdb::Inquiry {
            evpd: true,
            page_code: 0x99,
            allocation_length: 255,
        }),
        &[],
        255,
    );
    let s = expect_check(&r, SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB);
    assert_eq!(s.field_pointer().unwrap().byte, 2);
}

#[test]
fn missing_lun() {
    let t = table();
    let a = nexus("iqn.a");
    let req = |cdb: &[u8], cap| {
        t.execute(&ScsiRequest {
            lun: 7,
            cdb,
            nexus: &a,
            task_tag: 1,
            attr: TaskAttr::Simple,
            data_out: &[],
            data_in_capacity: cap,
            initiator_stats: None,
        })
    };
    let r = req(
        &c(Cdb::Inquiry {
            evpd: false,
            page_code: 0,
            allocation_length: 96,
        }),
        96,
    );
    assert_eq!(r.status, GOOD);
    assert_eq!(r.data_in[0], 0x7f);
    let r = req(
        &c(Cdb::ReportLuns {
            select_report: 0,
            allocation_length: 64,
        }),
        64,
    );
    assert_eq!(r.status, GOOD);
    assert_eq!(&r.data_in[..4], &[0, 0, 0, 8]);
    let r = req(&c(Cdb::TestUnitReady), 0);
    expect_check(&r, SenseKey::IllegalRequest, Asc::LU_NOT_SUPPORTED);
    assert!(!t.has_lun(7));
    assert_eq!(t.lun_ids(), vec![0]);
}

#[test]
fn read_write_round_trip_and_range() {
    let t = table();
    let a = nexus("iqn.a");
    ready(&t, &a);
    let data: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
    let r = write(&t, &a, 10, &data);
    assert_eq!((r.status, r.transfer_length), (GOOD, 4096));
    let r = read(&t, &a, 10, 8);
    assert_eq!(r.status, GOOD);
    assert_eq!(r.data_in, data);
    // Past the end: 2048 blocks of 512 in 1 MiB.
    let r = read(&t, &a, 2047, 2);
    expect_check(&r, SenseKey::IllegalRequest, Asc::LBA_OUT_OF_RANGE);
    let r = read(&t, &a, 2048, 0);
    assert_eq!(r.status, GOOD);
    let r = read(&t, &a, 2049, 0);
    expect_check(&r, SenseKey::IllegalRequest, Asc::LBA_OUT_OF_RANGE);
    // Every CDB size.
    for size in [
        CdbSize::Six,
        CdbSize::Ten,
        CdbSize::Twelve,
        CdbSize::Sixteen,
    ] {
        let r = run(
            &t,
            &a,
            &c(Cdb::Write(rw(size, 3, 1))),
            &[size as u8 + 1; 512],
            0,
        );
        assert_eq!(r.status, GOOD);
        let r = run(
            &t,
            &a,
            &c(Cdb::Read {
                rw: rw(size, 3, 1),
                rarc: false,
            }),
            &[],
            512,
        );
        assert_eq!(r.data_in, vec![size as u8 + 1; 512]);
    }
    // RDPROTECT is refused (no protection information).
    let mut cdb = c(Cdb::Read {
        rw: rw(CdbSize::Ten, 0, 1),
        rarc: false,
    });
    cdb[1] |= 0x20;
    let s = expect_check(
        &run(&t, &a, &cdb, &[], 512),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
    assert_eq!(s.field_pointer().unwrap().byte, 1);
    // FUA and DPO are accepted.
    let mut w = rw(CdbSize::Ten, 0, 1);
    w.fua = true;
    w.dpo = true;
    assert_eq!(run(&t, &a, &c(Cdb::Write(w)), &[9; 512], 0).status, GOOD);
}

#[test]
fn transfer_larger_than_maximum_is_refused_before_allocating() {
    let big = LuConfig::new(Arc::new(RamBackstore::new(1 << 40)));
    let t = LunTable::new(vec![(0, Arc::new(LogicalUnit::new(big)))]);
    let a = nexus("iqn.a");
    ready(&t, &a);
    let cdb = c(Cdb::Read {
        rw: rw(CdbSize::Sixteen, 0, u32::MAX),
        rarc: false,
    });
    let s = expect_check(
        &run(&t, &a, &cdb, &[], 0),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
    assert_eq!(s.field_pointer().unwrap().byte, 10);
}

#[test]
fn short_write_data_follows_libiscsi_residual_tests() {
    let t = table();
    let a = nexus("iqn.a");
    ready(&t, &a);
    assert_eq!(write(&t, &a, 0, &[b'a'; 1024]).status, GOOD);
    // Two blocks in the CDB, one block of data: the block is written,
    // GOOD, and the transfer length is the CDB's (residual overflow).
    let cdb = c(Cdb::Write(rw(CdbSize::Ten, 0, 2)));
    let r = run(&t, &a, &cdb, &[b'b'; 512], 0);
    assert_eq!((r.status, r.transfer_length), (GOOD, 1024));
    let back = read(&t, &a, 0, 2).data_in;
    assert!(back[..512].iter().all(|&b| b == b'b'));
    assert!(back[512..].iter().all(|&b| b == b'a'));
    // More data than the CDB asks for: only the CDB's length is written.
    let cdb = c(Cdb::Write(rw(CdbSize::Ten, 0, 1)));
    let r = run(&t, &a, &cdb, &[b'c'; 1024], 0);
    assert_eq!((r.status, r.transfer_length), (GOOD, 512));
    assert!(read(&t, &a, 1, 1).data_in.iter().all(|&b| b == b'a'));
    // A partial block is refused.
    let r = run(&t, &a, &cdb, &[0; 200], 0);
    expect_check(
        &r,
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_COMMAND_INFORMATION_UNIT,
    );
    assert_eq!(r.transfer_length, 512);
    // Zero bytes: nothing written, GOOD.
    assert_eq!(run(&t, &a, &cdb, &[], 0).status, GOOD);
}

#[test]
fn read_only_lun_is_write_protected() {
    let t = table_with(|c| c.read_only = true);
    let a = nexus("iqn.a");
    ready(&t, &a);
    let r = write(&t, &a, 0, &[1; 512]);
    expect_check(&r, SenseKey::DataProtect, Asc::WRITE_PROTECTED);
    assert_eq!(read(&t, &a, 0, 1).status, GOOD);
    // MODE SENSE reports WP.
    let r = run(
        &t,
        &a,
        &c(Cdb::ModeSense6 {
            dbd: true,
            page_control: PageControl::Current,
            page_code: 0x3f,
            subpage_code: 0,
            allocation_length: 255,
        }),
        &[],
        255,
    );
    assert_eq!(r.data_in[2] & 0x80, 0x80);
}

#[test]
fn read_capacity() {
    let t = table_with(|c| c.block_size = 4096);
    let a = nexus("iqn.a");
    ready(&t, &a);
    let r = run(
        &t,
        &a,
        &c(Cdb::ReadCapacity10 { lba: 0, pmi: false }),
        &[],
        8,
    );
    let d = ReadCapacity10::decode(&r.data_in).unwrap();
    assert_eq!((d.returned_lba, d.block_length), (255, 4096));
    let r = run(
        &t,
        &a,
        &c(Cdb::ReadCapacity16 {
            lba: 0,
            allocation_length: 32,
            pmi: false,
        }),
        &[],
        32,
    );
    let d = ReadCapacity16::decode(&r.data_in).unwrap();
    assert_eq!(
        (d.returned_lba, d.block_length, d.lbpme, d.lbprz),
        (255, 4096, true, true)
    );
    let r = run(
        &t,
        &a,
        &c(Cdb::ReadCapacity10 { lba: 5, pmi: false }),
        &[],
        8,
    );
    expect_check(&r, SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB);
}

#[test]
fn unknown_opcode_and_bad_cdb() {
    let t = table();
    let a = nexus("iqn.a");
    ready(&t, &a);
    let r = run(&t, &a, &[0xc7, 0, 0, 0, 0, 0], &[], 0);
    expect_check(
        &r,
        SenseKey::IllegalRequest,
        Asc::INVALID_COMMAND_OPERATION_CODE,
    );
    // NACA in the control byte.
    let r = run(&t, &a, &[0x00, 0, 0, 0, 0, 0x04], &[], 0);
    let s = expect_check(&r, SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB);
    assert_eq!(s.field_pointer().unwrap().byte, 5);
}

#[test]
fn mode_sense_pages_and_select() {
    let t = table();
    let a = nexus("iqn.a");
    let b = nexus("iqn.b");
    ready(&t, &a);
    ready(&t, &b);
    let sense10 = |pc, page| {
        c(Cdb::ModeSense10 {
            llbaa: false,
            dbd: false,
            page_control: pc,
            page_code: page,
            subpage_code: 0,
            allocation_length: 1024,
        })
    };
    let r = run(&t, &a, &sense10(PageControl::Current, 0x3f), &[], 1024);
    assert_eq!(r.status, GOOD);
    let m = ModeParameters::decode10(&r.data_in).unwrap();
    // Read-write error recovery, caching, control, informational exceptions
    // (subpages only with subpage FFh).
    assert_eq!(m.pages.len(), 4);
    assert_eq!(m.block_descriptors[0].number_of_blocks, 2048);
    assert!(m.header.dpofua);
    let r = run(&t, &a, &sense10(PageControl::Changeable, 0x0a), &[], 1024);
    let m = ModeParameters::decode10(&r.data_in).unwrap();
    let ModePage::Control(cp) = &m.pages[0] else {
        panic!()
    };
    assert!(cp.d_sense && cp.swp);
    let r = run(&t, &a, &sense10(PageControl::Saved, 0x08), &[], 1024);
    expect_check(
        &r,
        SenseKey::IllegalRequest,
        Asc::SAVING_PARAMETERS_NOT_SUPPORTED,
    );
    let r = run(&t, &a, &sense10(PageControl::Current, 0x19), &[], 1024);
    expect_check(&r, SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB);
    // MODE SELECT with SP=1 and no saved pages: INVALID FIELD IN CDB
    // (SPC-4 6.13), pointing at SP.
    let r = run(&t, &a, &[0x15, 0x11, 0, 0, 0, 0], &[], 0);
    let s = expect_check(&r, SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB);
    assert_eq!(
        s.sks,
        Some(blockwire_pdu::scsi::SenseKeySpecific::FieldPointer(
            blockwire_pdu::scsi::FieldPointer::cdb(1, Some(0))
        ))
    );

    // Turn D_SENSE on with MODE SELECT(6): the page as read, bit flipped.
    let r = run(
        &t,
        &a,
        &c(Cdb::ModeSense6 {
            dbd: true,
            page_control: PageControl::Current,
            page_code: 0x0a,
            subpage_code: 0,
            allocation_length: 255,
        }),
        &[],
        255,
    );
    let mut m = ModeParameters::decode6(&r.data_in).unwrap();
    let ModePage::Control(cp) = &mut m.pages[0] else {
        panic!()
    };
    cp.d_sense = true;
    let r = mode_select6(&t, &a, &m);
    assert_eq!(
        r.status,
        GOOD,
        "{:?}",
        r.sense.as_ref().map(|s| Sense::decode(s))
    );
    // Errors now come in descriptor format.
    let r = read(&t, &a, 4000, 1);
    assert_eq!(r.sense.as_ref().unwrap()[0] & 0x7f, 0x72);
    // The other nexus is told.
    let r = run(&t, &b, &c(Cdb::TestUnitReady), &[], 0);
    expect_check(&r, SenseKey::UnitAttention, Asc::MODE_PARAMETERS_CHANGED);
    // A non-changeable field is refused with a parameter pointer.
    let ModePage::Control(cp) = &mut m.pages[0] else {
        panic!()
    };
    cp.tst = 1;
    let r = mode_select6(&t, &a, &m);
    let s = expect_check(
        &r,
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
    );
    assert_eq!(s.field_pointer().unwrap().byte, 6);
}

/// UNMAP of `blocks` blocks at `lba` from nexus `n`.
pub(crate) fn unmap(t: &LunTable, n: &ItNexus, lba: u64, blocks: u32) -> ScsiResult {
    use blockwire_pdu::scsi::{UnmapDescriptor, UnmapList};
    let list = UnmapList {
        descriptors: vec![UnmapDescriptor { lba, blocks }],
    }
    .encode();
    let cdb = c(Cdb::Unmap {
        anchor: false,
        group: 0,
        parameter_list_length: list.len() as u16,
    });
    run(t, n, &cdb, &list, 0)
}

/// MODE SELECT(6) of `m`'s pages (its header cleared, as a MODE SELECT
/// sends it) from nexus `n`.
pub(crate) fn mode_select6(t: &LunTable, n: &ItNexus, m: &ModeParameters) -> ScsiResult {
    let mut m = m.clone();
    m.header = Default::default();
    let list = m.encode6();
    let cdb = c(Cdb::ModeSelect6 {
        pf: true,
        sp: false,
        parameter_list_length: list.len() as u8,
    });
    run(t, n, &cdb, &list, 0)
}

/// A RAM store that counts its flushes, and fails them with EIO when
/// `fails`.
#[derive(Debug)]
struct CountsFlushes {
    ram: RamBackstore,
    flushes: std::sync::atomic::AtomicUsize,
    fails: bool,
}

impl CountsFlushes {
    fn new(fails: bool) -> Arc<CountsFlushes> {
        Arc::new(CountsFlushes {
            ram: RamBackstore::new(1 << 20),
            flushes: Default::default(),
            fails,
        })
    }
}

impl crate::backstore::Backstore for CountsFlushes {
    fn size(&self) -> u64 {
        self.ram.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.ram.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.ram.write_at(offset, data)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.flushes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.fails {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }
    fn describe(&self) -> String {
        "counts flushes".into()
    }
}

#[test]
fn turning_the_write_cache_off_flushes_what_it_held() {
    let store = CountsFlushes::new(false);
    let flushes = || store.flushes.load(std::sync::atomic::Ordering::SeqCst);
    let t = table_with(|cfg| {
        cfg.backstore = store.clone();
        cfg.write_cache = true;
    });
    let a = nexus("iqn.2024-01.test:a");
    ready(&t, &a);
    assert_eq!(write(&t, &a, 8, &[0x5a; 512]).status, GOOD);
    // The caching page with its block descriptor, as read: WCE set.
    let sensed = run(
        &t,
        &a,
        &c(Cdb::ModeSense6 {
            dbd: false,
            page_control: PageControl::Current,
            page_code: 0x08,
            subpage_code: 0,
            allocation_length: 255,
        }),
        &[],
        255,
    );
    let mut m = ModeParameters::decode6(&sensed.data_in).unwrap();
    let select = |m: &mut ModeParameters, wce: bool| {
        let ModePage::Caching(cp) = &mut m.pages[0] else {
            panic!("not the caching page: {:?}", m.pages)
        };
        cp.wce = wce;
        let r = mode_select6(&t, &a, m);
        assert_eq!(
            r.status,
            GOOD,
            "{:?}",
            r.sense.as_ref().map(|s| Sense::decode(s))
        );
    };
    let before = flushes();
    select(&mut m, false);
    assert_eq!(flushes(), before + 1, "WCE 1 -> 0 left the cache unflushed");
    // Restating write-through, or turning the cache on, flushes nothing.
    select(&mut m, false);
    select(&mut m, true);
    assert_eq!(flushes(), before + 1);
    // The descriptor's block count is ignored (SBC-4 §6.5.2): one that is not
    // the capacity, as a short descriptor of a unit past 2^32 blocks says
    // FFFFFFFFh, changes nothing and fails nothing.
    m.block_descriptors[0].number_of_blocks = 0xffff_ffff;
    select(&mut m, true);
    let r = run(
        &t,
        &a,
        &c(Cdb::ReadCapacity10 { lba: 0, pmi: false }),
        &[],
        8,
    );
    assert_eq!(
        ReadCapacity10::decode(&r.data_in).unwrap().returned_lba,
        2047
    );
}

/// A MODE SELECT that turns the write cache off fails when the cache
/// cannot be flushed, and the cache stays off: write-through is the safe
/// side of that disagreement. The initiator, told the command failed, goes
/// on sending SYNCHRONIZE CACHE, which costs nothing; a cache turned back
/// on could hold writes another initiator made meanwhile believing them
/// on the medium.
#[test]
fn a_write_cache_that_cannot_be_flushed_is_turned_off_all_the_same() {
    let t = table_with(|cfg| {
        cfg.backstore = CountsFlushes::new(true);
        cfg.write_cache = true;
    });
    let a = nexus("iqn.2024-01.test:a");
    ready(&t, &a);
    let sense = c(Cdb::ModeSense6 {
        dbd: true,
        page_control: PageControl::Current,
        page_code: 0x08,
        subpage_code: 0,
        allocation_length: 255,
    });
    let wce = |t: &LunTable| {
        let m = ModeParameters::decode6(&run(t, &a, &sense, &[], 255).data_in).unwrap();
        let ModePage::Caching(cp) = &m.pages[0] else {
            panic!("not the caching page: {:?}", m.pages)
        };
        cp.wce
    };
    assert!(wce(&t));
    let mut m = ModeParameters::decode6(&run(&t, &a, &sense, &[], 255).data_in).unwrap();
    let ModePage::Caching(cp) = &mut m.pages[0] else {
        panic!()
    };
    cp.wce = false;
    let r = mode_select6(&t, &a, &m);
    assert_eq!(r.status, 0x02, "the flush failed");
    assert!(!wce(&t), "the write cache went back on");
}

/// With the write cache off (WCE=0) a command's effect is durable when it
/// ends GOOD, and an initiator sends no SYNCHRONIZE CACHE: an UNMAP's
/// deallocation is flushed as WRITE SAME's is, or a power loss could bring
/// the unmapped data back on a unit that reports LBPRZ=1.
#[test]
fn an_unmap_with_the_write_cache_off_is_flushed() {
    let store = CountsFlushes::new(false);
    let flushes = || store.flushes.load(std::sync::atomic::Ordering::SeqCst);
    let t = table_with(|cfg| {
        cfg.backstore = store.clone();
        cfg.write_cache = false;
        cfg.thin_provisioning = true;
    });
    let a = nexus("iqn.2024-01.test:a");
    ready(&t, &a);
    assert_eq!(write(&t, &a, 8, &[0x5a; 512]).status, GOOD);
    let before = flushes();
    assert_eq!(unmap(&t, &a, 8, 1).status, GOOD);
    assert_eq!(flushes(), before + 1, "the UNMAP ended GOOD unflushed");
    assert_eq!(read(&t, &a, 8, 1).data_in, vec![0; 512]);
}

/// Two initiators change different mode pages at once, round after round:
/// each change holds, whatever the other did between its snapshot and its
/// write.
#[test]
fn mode_selects_of_different_pages_at_once_both_hold() {
    let t = Arc::new(table_with(|cfg| cfg.write_cache = true));
    let sensed = |n: &ItNexus, page: u8| {
        let cdb = c(Cdb::ModeSense6 {
            dbd: true,
            page_control: PageControl::Current,
            page_code: page,
            subpage_code: 0,
            allocation_length: 255,
        });
        // A unit attention of the other's change comes first.
        let r = (0..3)
            .map(|_| run(&t, n, &cdb, &[], 255))
            .find(|r| r.status == GOOD)
            .expect("MODE SENSE answered");
        let mut m = ModeParameters::decode6(&r.data_in).unwrap();
        m.header = Default::default();
        m
    };
    let (a, b) = (nexus("iqn.2024-01.test:a"), nexus("iqn.2024-01.test:b"));
    ready(&t, &a);
    ready(&t, &b);
    let (caching, control) = (sensed(&a, 0x08), sensed(&b, 0x0a));
    let select = |n: &ItNexus, mut m: ModeParameters, on: bool| {
        match &mut m.pages[0] {
            ModePage::Caching(p) => p.wce = on,
            ModePage::Control(p) => p.d_sense = on,
            other => panic!("{other:?}"),
        }
        // The other's change is a unit attention to this one: taken, then done.
        for _ in 0..3 {
            if mode_select6(&t, n, &m).status == GOOD {
                return;
            }
        }
        panic!("MODE SELECT refused");
    };
    let rounds = 10_000;
    let barrier = std::sync::Barrier::new(2);
    let lost = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            for r in 0..rounds {
                barrier.wait();
                select(&b, control.clone(), r % 2 == 1);
                barrier.wait();
            }
        });
        for r in 0..rounds {
            barrier.wait();
            select(&a, caching.clone(), r % 2 == 1);
            barrier.wait();
            let on = r % 2 == 1;
            let (caching_now, control_now) = (sensed(&a, 0x08), sensed(&a, 0x0a));
            let (ModePage::Caching(cp), ModePage::Control(ct)) =
                (&caching_now.pages[0], &control_now.pages[0])
            else {
                panic!("pages")
            };
            if cp.wce != on || ct.d_sense != on {
                lost.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    });
    assert_eq!(
        lost.into_inner(),
        0,
        "rounds whose change of one page undid the other's"
    );
}

#[test]
fn unmap_is_listed_only_where_it_is_served() {
    for thin in [false, true] {
        let t = table_with(|cfg| cfg.thin_provisioning = thin);
        let a = nexus("iqn.2024-01.test:a");
        ready(&t, &a);
        let rsoc = |options: u8| {
            let cdb = c(Cdb::ReportSupportedOperationCodes {
                rctd: false,
                reporting_options: options,
                requested_opcode: 0x42,
                requested_service_action: 0,
                allocation_length: 65536,
            });
            let r = run(&t, &a, &cdb, &[], 65536);
            assert_eq!(r.status, GOOD);
            r.data_in
        };
        let all = rsoc(0);
        let listed = all[4..].chunks(8).any(|d| d[0] == 0x42);
        let support = rsoc(1)[1] & 0x07;
        let unmap = run(
            &t,
            &a,
            &c(Cdb::Unmap {
                anchor: false,
                group: 0,
                parameter_list_length: 0,
            }),
            &[],
            0,
        );
        assert_eq!(unmap.status == GOOD, thin, "UNMAP served (thin {thin})");
        assert_eq!(listed, thin, "UNMAP listed (thin {thin})");
        assert_eq!(support, if thin { 3 } else { 1 }, "SUPPORT (thin {thin})");
    }
}

#[test]
fn report_luns_and_sync_cache() {
    let mk = || {
        Arc::new(LogicalUnit::new(LuConfig::new(Arc::new(
            RamBackstore::new(1 << 20),
        ))))
    };
    let t = LunTable::new(vec![(3, mk()), (0, mk()), (300, mk())]);
    let a = nexus("iqn.a");
    let r = t.execute(&ScsiRequest {
        lun: 0,
        cdb: &c(Cdb::ReportLuns {
            select_report: 0,
            allocation_length: 256,
        }),
        nexus: &a,
        task_tag: 1,
        attr: TaskAttr::Simple,
        data_out: &[],
        data_in_capacity: 256,
        initiator_stats: None,
    });
    assert_eq!(r.status, GOOD);
    assert_eq!(r.data_in.len(), 8 + 24);
    assert_eq!(&r.data_in[8..10], &[0, 0]);
    assert_eq!(&r.data_in[16..18], &[0, 3]);
    assert_eq!(&r.data_in[24..26], &[0x41, 0x2c]);
    ready(&t, &a);
    let sc = |lba, blocks| {
        c(Cdb::SynchronizeCache {
            size: CdbSize::Ten,
            immed: false,
            lba,
            blocks,
            group: 0,
        })
    };
    assert_eq!(run(&t, &a, &sc(0, 0), &[], 0).status, GOOD);
    let r = run(&t, &a, &sc(2040, 10), &[], 0);
    expect_check(&r, SenseKey::IllegalRequest, Asc::LBA_OUT_OF_RANGE);
    assert!(t.flush_all().is_ok());
}

/// A MODE SELECT whose second block descriptor asks for another block
/// length is refused with the field pointer on that descriptor's LOGICAL
/// BLOCK LENGTH (SPC-4 4.5.2.4.2: the byte in error), where it named the
/// first descriptor's, which was right.
#[test]
fn a_wrong_block_length_is_named_in_its_own_descriptor() {
    let t = table_with(|_| {});
    let a = nexus("iqn.2024-01.test:a");
    ready(&t, &a);
    let descriptor = |block_length| blockwire_pdu::scsi::BlockDescriptor {
        number_of_blocks: 0,
        block_length,
    };
    let m = ModeParameters {
        block_descriptors: vec![descriptor(512), descriptor(1024)],
        ..Default::default()
    };
    let s = expect_check(
        &mode_select6(&t, &a, &m),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
    );
    // A 4-byte header, then 8-byte descriptors with the length at byte 5.
    assert_eq!(
        s.sks,
        Some(blockwire_pdu::scsi::SenseKeySpecific::FieldPointer(
            blockwire_pdu::scsi::FieldPointer::parameter(4 + 8 + 5, None)
        ))
    );
}

/// RECEIVE COPY OPERATING PARAMETERS and the third-party copy VPD page's
/// General Copy Operations descriptor (8001h) say the same DATA SEGMENT
/// GRANULARITY: the unit's block, 2^12 on a 4096-byte unit, where the
/// former said 2^9 on every unit.
#[test]
fn both_copy_parameter_reports_give_the_blocks_granularity() {
    for (block_size, log2) in [(512u32, 9u8), (4096, 12)] {
        let t = table_with(|c| c.block_size = block_size);
        let a = nexus("iqn.2024-01.test:a");
        ready(&t, &a);
        let cdb = c(Cdb::ReceiveCopyResults {
            service_action: 0x03,
            list_identifier: 0,
            allocation_length: 64,
        });
        let r = run(&t, &a, &cdb, &[], 64);
        assert_eq!(r.status, GOOD);
        assert_eq!(r.data_in[37], log2, "RECEIVE COPY OPERATING PARAMETERS");
        let cdb = c(Cdb::Inquiry {
            evpd: true,
            page_code: 0x8f,
            allocation_length: 4096,
        });
        let page = run(&t, &a, &cdb, &[], 4096).data_in;
        let mut at = 4;
        let general = loop {
            assert!(
                at + 4 <= page.len(),
                "no General Copy Operations descriptor"
            );
            let kind = u16::from_be_bytes([page[at], page[at + 1]]);
            let len = usize::from(u16::from_be_bytes([page[at + 2], page[at + 3]]));
            if kind == 0x8001 {
                break &page[at + 4..at + 4 + len];
            }
            at += 4 + len;
        };
        // TOTAL and MAXIMUM IDENTIFIED CONCURRENT COPIES, MAXIMUM SEGMENT
        // LENGTH, then DATA SEGMENT GRANULARITY.
        assert_eq!(general[12], log2, "VPD 8Fh, block size {block_size}");
    }
}

/// A RAM store that counts the bytes read from it, and the largest read.
#[derive(Debug)]
pub(super) struct CountedReads {
    ram: RamBackstore,
    /// Bytes read so far.
    pub(super) read: std::sync::atomic::AtomicU64,
    /// The most bytes one read has asked for.
    pub(super) largest: std::sync::atomic::AtomicU64,
}

impl CountedReads {
    pub(super) fn new(size: u64) -> CountedReads {
        CountedReads {
            ram: RamBackstore::new(size),
            read: Default::default(),
            largest: Default::default(),
        }
    }
}

impl crate::backstore::Backstore for CountedReads {
    fn size(&self) -> u64 {
        self.ram.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        self.read.fetch_add(buf.len() as u64, SeqCst);
        self.largest.fetch_max(buf.len() as u64, SeqCst);
        self.ram.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.ram.write_at(offset, data)
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn describe(&self) -> String {
        "counted ram".into()
    }
}

/// A READ whose initiator takes less than its CDB asks (an Expected Data
/// Transfer Length below the transfer length) reads only the blocks it
/// takes, and the residual still counts the CDB's whole transfer. Before,
/// the core read and held the whole transfer, up to the largest a READ may
/// ask, for a READ whose initiator takes one byte.
#[test]
fn a_read_reads_only_the_blocks_its_initiator_takes() {
    use std::sync::atomic::Ordering::SeqCst;
    let store = Arc::new(CountedReads::new(1 << 20));
    let t = LunTable::new(vec![(
        0,
        Arc::new(LogicalUnit::new(LuConfig::new(store.clone()))),
    )]);
    let a = nexus("iqn.a");
    ready(&t, &a);
    assert_eq!(write(&t, &a, 0, &[7u8; 2048]).status, GOOD);
    for (taken, blocks_read) in [(1u32, 1u64), (512, 1), (513, 2), (0, 0), (1 << 20, 1024)] {
        let before = store.read.load(SeqCst);
        let cdb = c(Cdb::Read {
            rw: rw(CdbSize::Sixteen, 0, 1024),
            rarc: false,
        });
        let r = run(&t, &a, &cdb, &[], taken);
        assert_eq!(r.status, GOOD, "{taken}: {r:?}");
        assert_eq!(r.transfer_length, 1024 * 512, "{taken}: the CDB's transfer");
        assert_eq!(r.data_in.len(), (taken as usize).min(1024 * 512));
        assert!(r.data_in.iter().take(2048).all(|&b| b == 7));
        assert_eq!(
            store.read.load(SeqCst) - before,
            blocks_read * 512,
            "{taken} bytes taken"
        );
    }
}
