//! Logical block provisioning thresholds end to end through the SCSI core:
//! a RAM LUN against a real (small) memory limit, and a sparse file LUN on a
//! small tmpfs, each warned as its space runs low.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use blockwire_pdu::scsi::log::{lbp_parameter, LogBody};
use blockwire_pdu::scsi::{
    Asc, Cdb, CdbSize, LogPage, ModePage, ModeParameters, PageControl, ResourceCount,
    ResourceScope, SenseKey, Vpd, VpdPage,
};

use super::tests::{c, expect_check, nexus, ready, run, rw, unmap, CHECK, GOOD};
use super::ScsiResult;
use super::*;
use crate::backstore::ram_budget::RamBudget;
use crate::backstore::{Backstore, FileBackstore, NullBackstore, RamBackstore};

const MIB: u64 = 1 << 20;

fn unit_on(store: Arc<dyn Backstore>) -> (LunTable, Arc<LogicalUnit>) {
    let unit = Arc::new(LogicalUnit::new(LuConfig::new(store)));
    (LunTable::new(vec![(0, unit.clone())]), unit)
}

/// WRITE(10)s of 1 MiB of nonzero bytes over `[from, to)` MiB; a write
/// that meets the soft threshold's unit attention is sent again, as SBC-4
/// asks of an application client (the watcher thread may notice the space
/// before the test does). Returns how many such unit attentions `n` heard.
fn write_mib(t: &LunTable, n: &ItNexus, from: u64, to: u64) -> usize {
    let data = vec![0x5au8; MIB as usize];
    let mut warned = 0;
    for m in from..to {
        let cdb = c(Cdb::Write(rw(
            CdbSize::Ten,
            m * MIB / 512,
            (MIB / 512) as u32,
        )));
        loop {
            let r = run(t, n, &cdb, &data, 0);
            if r.status == GOOD {
                break;
            }
            expect_soft_threshold(&r);
            warned += 1;
        }
    }
    warned
}

fn expect_soft_threshold(r: &ScsiResult) {
    let s = expect_check(
        r,
        SenseKey::UnitAttention,
        Asc::THIN_PROVISIONING_SOFT_THRESHOLD_REACHED,
    );
    // The threshold descriptor's offset in the mode page (SBC-4 4.7.3.7.6).
    assert_eq!(s.information, Some(16));
}

/// How many soft-threshold unit attentions `n` has pending (TEST UNIT READY
/// until GOOD).
fn warnings(t: &LunTable, n: &ItNexus) -> usize {
    let mut seen = 0;
    loop {
        let r = run(t, n, &c(Cdb::TestUnitReady), &[], 0);
        if r.status == GOOD {
            return seen;
        }
        expect_soft_threshold(&r);
        seen += 1;
    }
}

fn log_sense(t: &LunTable, n: &ItNexus, page_code: u8, pointer: u16) -> LogPage {
    let r = run(
        t,
        n,
        &c(Cdb::LogSense {
            sp: false,
            ppc: false,
            page_control: 1,
            page_code,
            subpage_code: 0,
            parameter_pointer: pointer,
            allocation_length: 512,
        }),
        &[],
        512,
    );
    assert_eq!(r.status, GOOD, "{r:?}");
    LogPage::decode(&r.data_in).unwrap()
}

fn resource(page: &LogPage, code: u16) -> ResourceCount {
    ResourceCount::from_parameter(page.parameter(code).expect("parameter present")).unwrap()
}

fn mode_pages(t: &LunTable, n: &ItNexus, page_code: u8, subpage_code: u8) -> Vec<ModePage> {
    let r = run(
        t,
        n,
        &c(Cdb::ModeSense10 {
            llbaa: false,
            dbd: true,
            page_control: PageControl::Current,
            page_code,
            subpage_code,
            allocation_length: 1024,
        }),
        &[],
        1024,
    );
    assert_eq!(r.status, GOOD, "{r:?}");
    ModeParameters::decode10(&r.data_in).unwrap().pages
}

#[test]
fn a_ram_lun_warns_every_initiator_once_as_the_ram_limit_nears() {
    let budget = RamBudget::with_limit(16 * MIB);
    let (t, unit) = unit_on(Arc::new(RamBackstore::with_budget(64 * MIB, budget)));
    let (a, b) = (nexus("iqn.a"), nexus("iqn.b"));
    ready(&t, &a);
    ready(&t, &b);
    unit.set_low_space_threshold(Some(8 * MIB)).unwrap();
    // The threshold descriptor of the mode page changed outside MODE
    // SELECT: each nexus hears it once (SBC-4 6.5.9.1).
    for n in [&a, &b] {
        let r = run(&t, n, &c(Cdb::TestUnitReady), &[], 0);
        expect_check(&r, SenseKey::UnitAttention, Asc::MODE_PARAMETERS_CHANGED);
        assert_eq!(run(&t, n, &c(Cdb::TestUnitReady), &[], 0).status, GOOD);
    }
    // Set again to the same value: nothing changed, nothing to hear.
    unit.set_low_space_threshold(Some(8 * MIB)).unwrap();
    assert_eq!(run(&t, &a, &c(Cdb::TestUnitReady), &[], 0).status, GOOD);

    // What the unit says about its space and its threshold.
    let Vpd {
        page: VpdPage::LogicalBlockProvisioning(lbp),
        ..
    } = Vpd::decode(
        &run(
            &t,
            &a,
            &c(Cdb::Inquiry {
                evpd: true,
                page_code: 0xb2,
                allocation_length: 64,
            }),
            &[],
            64,
        )
        .data_in,
    )
    .unwrap()
    else {
        panic!("not VPD B2h");
    };
    assert_eq!(lbp.threshold_exponent, 11, "1 MiB of 512-byte blocks");
    let [ModePage::LogicalBlockProvisioning(page)] = &mode_pages(&t, &a, 0x1c, 0x02)[..] else {
        panic!("no logical block provisioning mode page");
    };
    let d = page.thresholds[0];
    assert!(d.enabled && !page.situa);
    // Page 3Fh with subpage 02h, which this unit has for page 1Ch: a
    // reserved combination (SPC-4 mode page code usage), refused.
    let r = run(&t, &a, &[0x1a, 0x08, 0x3f, 0x02, 0xff, 0], &[], 255);
    expect_check(&r, SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB);
    assert_eq!(
        (d.threshold_type, d.arming, d.resource, d.count),
        (0, 0, 1, 8)
    );
    let [ModePage::ReadWriteErrorRecovery(er)] = &mode_pages(&t, &a, 0x01, 0)[..] else {
        panic!("no read-write error recovery page");
    };
    assert!(er.lbpere);
    let supported = log_sense(&t, &a, 0, 0);
    assert_eq!(supported.body, LogBody::SupportedPages(vec![0x00, 0x0c]));

    // 4 MiB written, 12 left: no warning.
    assert_eq!(write_mib(&t, &a, 0, 4), 0);
    unit.check_space().unwrap();
    assert_eq!((warnings(&t, &a), warnings(&t, &b)), (0, 0));
    let lp = log_sense(&t, &a, 0x0c, 0);
    assert_eq!(
        resource(&lp, lbp_parameter::AVAILABLE),
        ResourceCount {
            count: 12,
            scope: ResourceScope::Shared
        }
    );
    assert_eq!(resource(&lp, lbp_parameter::USED).count, 4);

    // 9 written, 7 left: below the threshold's range (7.5 to 8.5 MiB).
    let heard = write_mib(&t, &a, 4, 9);
    unit.check_space().unwrap();
    assert_eq!(heard + warnings(&t, &a), 1);
    assert_eq!(warnings(&t, &b), 1);
    // Lower still: no second warning.
    assert_eq!(write_mib(&t, &b, 9, 12), 0);
    unit.check_space().unwrap();
    assert_eq!((warnings(&t, &a), warnings(&t, &b)), (0, 0));
    let lp = log_sense(&t, &b, 0x0c, 2);
    assert_eq!(
        lp.body,
        LogBody::Parameters(vec![ResourceCount {
            count: 12,
            scope: ResourceScope::Dedicated
        }
        .to_parameter(lbp_parameter::USED)])
    );

    // MODE SELECT may restate the page, not change it.
    let mut list = ModeParameters {
        pages: vec![ModePage::LogicalBlockProvisioning(page.clone())],
        ..ModeParameters::default()
    };
    let select = |list: &ModeParameters| {
        let bytes = list.encode10();
        let cdb = c(Cdb::ModeSelect10 {
            pf: true,
            sp: false,
            parameter_list_length: bytes.len() as u16,
        });
        run(&t, &a, &cdb, &bytes, 0)
    };
    assert_eq!(select(&list).status, GOOD);
    if let ModePage::LogicalBlockProvisioning(p) = &mut list.pages[0] {
        p.thresholds[0].count = 100;
    }
    let r = select(&list);
    let s = expect_check(
        &r,
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
    );
    // The first byte of THRESHOLD COUNT that differs: header 8, page
    // fields 16, descriptor byte 7.
    assert_eq!(s.field_pointer().unwrap().byte, 8 + 16 + 7);
}

#[test]
fn log_sense_refuses_what_it_does_not_keep() {
    let (t, _unit) = unit_on(Arc::new(RamBackstore::new(4 * MIB)));
    let a = nexus("iqn.a");
    ready(&t, &a);
    let ask = |sp, ppc, page_code, subpage_code, pointer| {
        run(
            &t,
            &a,
            &c(Cdb::LogSense {
                sp,
                ppc,
                page_control: 1,
                page_code,
                subpage_code,
                parameter_pointer: pointer,
                allocation_length: 64,
            }),
            &[],
            64,
        )
    };
    for (r, byte) in [
        (ask(true, false, 0x0c, 0, 0), 1),
        (ask(false, true, 0x0c, 0, 0), 1),
        (ask(false, false, 0x0d, 0, 0), 2),
        (ask(false, false, 0x0c, 1, 0), 3),
        (ask(false, false, 0x0c, 0, 3), 5),
    ] {
        let s = expect_check(&r, SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB);
        assert_eq!(s.field_pointer().unwrap().byte, byte);
    }
    // Without a threshold, the page is there and disabled, and LBPERE is 0.
    let [ModePage::LogicalBlockProvisioning(p)] = &mode_pages(&t, &a, 0x1c, 0x02)[..] else {
        panic!()
    };
    assert!(!p.thresholds[0].enabled);
    let [ModePage::ReadWriteErrorRecovery(er)] = &mode_pages(&t, &a, 0x01, 0)[..] else {
        panic!()
    };
    assert!(!er.lbpere);
    // All pages and subpages: the provisioning page comes last, after the
    // informational exceptions page it is a subpage of.
    let codes: Vec<_> = mode_pages(&t, &a, 0x3f, 0xff)
        .iter()
        .map(ModePage::code)
        .collect();
    assert_eq!(
        codes,
        [
            (0x01, None),
            (0x08, None),
            (0x0a, None),
            (0x1c, None),
            (0x1c, Some(0x02))
        ]
    );
}

#[test]
fn a_store_that_does_not_grow_has_no_threshold() {
    let (t, unit) = unit_on(Arc::new(NullBackstore::new(4 * MIB)));
    let a = nexus("iqn.a");
    ready(&t, &a);
    let e = unit.set_low_space_threshold(Some(MIB)).unwrap_err();
    assert!(e.to_string().contains("no low-space threshold"), "{e}");
    assert_eq!(
        log_sense(&t, &a, 0, 0).body,
        LogBody::SupportedPages(vec![0])
    );
    let r = run(
        &t,
        &a,
        &c(Cdb::ModeSense10 {
            llbaa: false,
            dbd: true,
            page_control: PageControl::Current,
            page_code: 0x1c,
            subpage_code: 0x02,
            allocation_length: 255,
        }),
        &[],
        255,
    );
    assert_eq!(r.status, CHECK);
    expect_check(&r, SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB);
}

/// A tmpfs of `mib` MiB mounted on a fresh directory, unmounted when
/// dropped. Needs root (as the CI runs).
struct SmallFs(PathBuf);

impl SmallFs {
    fn mount(mib: u64) -> SmallFs {
        let dir = std::env::temp_dir().join(format!(
            "blockwire-lbp-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(&dir)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mounting a {mib} MiB tmpfs on {} needs root: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        SmallFs(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A durable write that finds no space fails on its own: nothing written
/// before was lost, so the flushes after it still work (where any error of
/// a write-through write used to fail every later SYNCHRONIZE CACHE, as a
/// lost write-back does).
#[test]
fn a_durable_write_without_space_leaves_flushes_working() {
    let fs = SmallFs::mount(1);
    let store =
        crate::backstore::FileBackstore::open(&fs.path().join("lun.img"), Some(8 << 20), false)
            .unwrap();
    let full = (0..8u64)
        .map(|i| store.write_at_durable(i << 20, &vec![0x5a; 1 << 20]))
        .find_map(Result::err)
        .expect("8 MiB do not fit a 1 MiB file system");
    assert_eq!(full.raw_os_error(), Some(libc::ENOSPC), "{full}");
    store
        .flush()
        .expect("a flush after a write that found no space");
}

#[test]
fn a_sparse_file_lun_warns_before_its_file_system_fills_and_then_fails_writes_cleanly() {
    let fs = SmallFs::mount(32);
    let path = fs.path().join("lun0.img");
    let store = FileBackstore::open(&path, Some(64 * MIB), false).unwrap();
    let (t, unit) = unit_on(Arc::new(store));
    let a = nexus("iqn.a");
    ready(&t, &a);
    unit.set_low_space_threshold(Some(12 * MIB)).unwrap();
    let r = run(&t, &a, &c(Cdb::TestUnitReady), &[], 0);
    expect_check(&r, SenseKey::UnitAttention, Asc::MODE_PARAMETERS_CHANGED);
    assert_eq!(run(&t, &a, &c(Cdb::TestUnitReady), &[], 0).status, GOOD);

    assert_eq!(write_mib(&t, &a, 0, 8), 0);
    unit.check_space().unwrap();
    assert_eq!(warnings(&t, &a), 0);
    let lp = log_sense(&t, &a, 0x0c, 0);
    let available = resource(&lp, lbp_parameter::AVAILABLE).count;
    assert!((22..=24).contains(&available), "{available} MiB left of 32");
    assert_eq!(resource(&lp, lbp_parameter::USED).count, 8);

    // 24 MiB taken, about 8 left: warned.
    let heard = write_mib(&t, &a, 8, 24);
    unit.check_space().unwrap();
    assert_eq!(heard + warnings(&t, &a), 1);

    // On until the file system is full: the write that finds no space is
    // DATA PROTECT, SPACE ALLOCATION FAILED WRITE PROTECT, not a medium error.
    let data = vec![0x5au8; MIB as usize];
    let mut refused = None;
    for m in 24..64 {
        let cdb = c(Cdb::Write(rw(
            CdbSize::Ten,
            m * MIB / 512,
            (MIB / 512) as u32,
        )));
        let r = run(&t, &a, &cdb, &data, 0);
        if r.status != GOOD {
            refused = Some((m, r));
            break;
        }
    }
    let (m, r) = refused.expect("a 32 MiB file system took 64 MiB");
    assert!(m < 33, "the write of MiB {m} was the first refused");
    expect_check(
        &r,
        SenseKey::DataProtect,
        Asc::SPACE_ALLOCATION_FAILED_WRITE_PROTECT,
    );
}

/// A unit on the no-disk pattern store is fully provisioned: a discarded
/// range would read as the pattern still, not as the zeros a thin unit
/// promises (LBPRZ=1). It said LBPME=1, LBPRZ=1, took UNMAP with GOOD and
/// went on returning the pattern. A unit on the null store (zeros) stays
/// thin.
#[test]
fn a_unit_whose_store_reads_discarded_ranges_as_data_is_not_thin() {
    let a = nexus("iqn.a");
    for (store, thin) in [
        (NullBackstore::pattern(1 << 20), false),
        (NullBackstore::new(1 << 20), true),
    ] {
        let (t, _) = unit_on(Arc::new(store));
        ready(&t, &a);
        let cdb = c(Cdb::ReadCapacity16 {
            lba: 0,
            pmi: false,
            allocation_length: 32,
        });
        let r = run(&t, &a, &cdb, &[], 32);
        assert_eq!(r.status, GOOD);
        let rc = blockwire_pdu::scsi::ReadCapacity16::decode(&r.data_in).unwrap();
        assert_eq!((rc.lbpme, rc.lbprz), (thin, thin));
        let r = unmap(&t, &a, 0, 8);
        if thin {
            assert_eq!(r.status, GOOD);
        } else {
            expect_check(
                &r,
                SenseKey::IllegalRequest,
                Asc::INVALID_COMMAND_OPERATION_CODE,
            );
        }
    }
}
