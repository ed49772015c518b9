//! SANITIZE and removable-medium tests: OVERWRITE (patterns, INVERT,
//! count), BLOCK ERASE, the refused CRYPTO ERASE, EXIT FAILURE MODE and
//! sanitize failure mode, NOT READY while a sanitize runs (progress in
//! REQUEST SENSE, surviving resets, nexus loss and a task abort),
//! reservations and write protection; INQUIRY RMB, START STOP UNIT eject
//! and load, PREVENT ALLOW MEDIUM REMOVAL per nexus, NOT READY, MEDIUM NOT
//! PRESENT; and property tests of OVERWRITE.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_pdu::scsi::{Asc, Cdb, CdbSize, SenseKey, SenseKeySpecific, StandardInquiry};
use proptest::prelude::*;

use super::tests::*;
use super::*;
use crate::backstore::{Backstore, RamBackstore};

const BLOCKS: u64 = 2048;

fn sanitize_cdb(immed: bool, ause: bool, sa: u8, len: u16) -> Vec<u8> {
    let [h, l] = len.to_be_bytes();
    let b1 = u8::from(immed) << 7 | u8::from(ause) << 5 | sa;
    vec![0x48, b1, 0, 0, 0, 0, 0, h, l, 0]
}

/// An OVERWRITE parameter list.
fn overwrite_params(invert: bool, count: u8, pattern: &[u8]) -> Vec<u8> {
    let mut p = vec![u8::from(invert) << 7 | count, 0];
    p.extend_from_slice(&(pattern.len() as u16).to_be_bytes());
    p.extend_from_slice(pattern);
    p
}

fn overwrite(t: &LunTable, n: &ItNexus, immed: bool, params: &[u8]) -> ScsiResult {
    let cdb = sanitize_cdb(immed, false, 1, params.len() as u16);
    run(t, n, &cdb, params, 0)
}

fn block_erase(t: &LunTable, n: &ItNexus, immed: bool) -> ScsiResult {
    run(t, n, &sanitize_cdb(immed, false, 2, 0), &[], 0)
}

fn tur(t: &LunTable, n: &ItNexus) -> ScsiResult {
    run(t, n, &c(Cdb::TestUnitReady), &[], 0)
}

fn request_sense(t: &LunTable, n: &ItNexus) -> blockwire_pdu::scsi::Sense {
    let r = run(
        t,
        n,
        &c(Cdb::RequestSense {
            desc: false,
            allocation_length: 252,
        }),
        &[],
        252,
    );
    assert_eq!(r.status, GOOD);
    blockwire_pdu::scsi::Sense::decode(&r.data_in).unwrap()
}

fn slow_table(min: Duration) -> LunTable {
    table_with(|c| c.sanitize_min_duration = min)
}

/// Waits until TEST UNIT READY stops reporting SANITIZE IN PROGRESS.
fn wait_sanitized(t: &LunTable, n: &ItNexus) -> ScsiResult {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let r = tur(t, n);
        let busy = r.status == CHECK && sense(&r).code() == Asc::LU_NOT_READY_SANITIZE_IN_PROGRESS;
        if !busy || Instant::now() > until {
            return r;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn expect_invalid_cdb(r: &ScsiResult) {
    expect_check(r, SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB);
}

#[test]
fn overwrite_writes_the_pattern_to_every_block() {
    let t = table();
    let a = nexus("iqn.a");
    ready(&t, &a);
    assert_eq!(write(&t, &a, 0, &[b'a'; 512 * 4]).status, GOOD);
    // One full block of 0xaa.
    assert_eq!(
        overwrite(&t, &a, false, &overwrite_params(false, 1, &[0xaa; 512])).status,
        GOOD
    );
    assert_eq!(read(&t, &a, 0, 4).data_in, vec![0xaa; 2048]);
    assert_eq!(read(&t, &a, BLOCKS - 1, 1).data_in, vec![0xaa; 512]);
    // A 3-byte pattern starts again at every block; INVERT with an even
    // count leaves the inverted pattern.
    let r = overwrite(&t, &a, false, &overwrite_params(true, 2, &[1, 2, 3]));
    assert_eq!(r.status, GOOD);
    let block: Vec<u8> = [1u8, 2, 3].iter().cycle().take(512).map(|b| !b).collect();
    for lba in [0, 1, 1000, BLOCKS - 1] {
        assert_eq!(read(&t, &a, lba, 1).data_in, block, "lba {lba}");
    }
    // Odd count: the pattern itself.
    let r = overwrite(&t, &a, false, &overwrite_params(true, 3, &[9, 8]));
    assert_eq!(r.status, GOOD);
    assert_eq!(&read(&t, &a, 7, 1).data_in[..4], &[9, 8, 9, 8]);
}

#[test]
fn overwrite_parameter_checks() {
    let t = table();
    let a = nexus("iqn.a");
    ready(&t, &a);
    let good = overwrite_params(false, 1, &[0xaa; 512]);
    for len in 0..5u16 {
        expect_invalid_cdb(&run(&t, &a, &sanitize_cdb(false, false, 1, len), &good, 0));
    }
    let mut long = good.clone();
    long.push(0);
    expect_invalid_cdb(&run(&t, &a, &sanitize_cdb(false, false, 1, 517), &long, 0));
    let param = |r: &ScsiResult| {
        expect_check(
            r,
            SenseKey::IllegalRequest,
            Asc::INVALID_FIELD_IN_PARAMETER_LIST,
        )
    };
    param(&overwrite(
        &t,
        &a,
        false,
        &overwrite_params(false, 0, &[1; 512]),
    ));
    let mut no_pattern = overwrite_params(false, 1, &[1; 512]);
    no_pattern[2..4].copy_from_slice(&[0, 0]);
    param(&overwrite(&t, &a, false, &no_pattern));
    let mut too_long = overwrite_params(false, 1, &[1; 512]);
    too_long[2..4].copy_from_slice(&516u16.to_be_bytes());
    param(&overwrite(&t, &a, false, &too_long));
    // Nothing was written by the refused ones.
    assert_eq!(read(&t, &a, 0, 1).data_in, vec![0; 512]);
}

#[test]
fn cdb_checks_crypto_erase_and_exit_failure_mode() {
    let t = table();
    let a = nexus("iqn.a");
    ready(&t, &a);
    let params = overwrite_params(false, 1, &[0xaa; 512]);
    for sa in [1u8, 2, 3] {
        let data: &[u8] = if sa == 1 { &params } else { &[] };
        let mut cdb = sanitize_cdb(false, false, sa, data.len() as u16);
        cdb[1] |= 0x40;
        expect_invalid_cdb(&run(&t, &a, &cdb, data, 0));
        for i in 2..7 {
            let mut cdb = sanitize_cdb(false, false, sa, data.len() as u16);
            cdb[i] = i as u8;
            expect_invalid_cdb(&run(&t, &a, &cdb, data, 0));
        }
    }
    for sa in (0..0x20u8).filter(|sa| ![1, 2, 3, 0x1f].contains(sa)) {
        expect_invalid_cdb(&run(&t, &a, &sanitize_cdb(false, false, sa, 0), &[], 0));
    }
    // CRYPTO ERASE: no encryption, refused; never listed.
    expect_invalid_cdb(&run(&t, &a, &sanitize_cdb(false, false, 3, 0), &[], 0));
    // BLOCK ERASE and EXIT FAILURE MODE take no parameter list.
    for sa in [2u8, 0x1f] {
        expect_invalid_cdb(&run(&t, &a, &sanitize_cdb(false, false, sa, 8), &[0; 8], 0));
    }
    // Outside failure mode there is nothing to exit.
    assert_eq!(
        run(&t, &a, &sanitize_cdb(false, false, 0x1f, 0), &[], 0).status,
        GOOD
    );
    // REPORT SUPPORTED OPERATION CODES lists OVERWRITE, BLOCK ERASE and
    // EXIT FAILURE MODE, not CRYPTO ERASE.
    let one = |sa: u16| {
        let cdb = c(Cdb::ReportSupportedOperationCodes {
            rctd: false,
            reporting_options: 2,
            requested_opcode: 0x48,
            requested_service_action: sa,
            allocation_length: 64,
        });
        run(&t, &a, &cdb, &[], 64).data_in[1] & 7
    };
    assert_eq!((one(1), one(2), one(3), one(0x1f)), (3, 3, 1, 3));
}

#[test]
fn block_erase_deallocates_and_reads_zeros() {
    let t = table();
    let a = nexus("iqn.a");
    ready(&t, &a);
    assert_eq!(write(&t, &a, 0, &[b'a'; 512 * 256]).status, GOOD);
    assert_eq!(write(&t, &a, BLOCKS - 256, &[b'a'; 512 * 256]).status, GOOD);
    assert_eq!(block_erase(&t, &a, false).status, GOOD);
    assert_eq!(read(&t, &a, 0, 256).data_in, vec![0; 512 * 256]);
    assert_eq!(read(&t, &a, BLOCKS - 256, 256).data_in, vec![0; 512 * 256]);
    let cdb = c(Cdb::GetLbaStatus {
        lba: 0,
        allocation_length: 256,
    });
    let r = run(&t, &a, &cdb, &[], 256);
    assert_eq!(r.status, GOOD);
    // One descriptor: the whole medium, deallocated.
    assert_eq!(&r.data_in[..4], &[0, 0, 0, 20]);
    assert_eq!(
        u32::from_be_bytes(r.data_in[16..20].try_into().unwrap()),
        BLOCKS as u32
    );
    assert_eq!(r.data_in[20] & 0x0f, 1);
    // Block device characteristics: WABEREQ 01b, WACEREQ 00b.
    let bdc = super::tests::vpd_page(&t, &a, 0xb1);
    assert_eq!(bdc.data_in[7] >> 4, 0b0100);
}

#[test]
fn block_erase_is_not_offered_without_thin_provisioning() {
    let t = table_with(|c| c.thin_provisioning = false);
    let a = nexus("iqn.a");
    ready(&t, &a);
    expect_invalid_cdb(&block_erase(&t, &a, false));
    let cdb = c(Cdb::ReportSupportedOperationCodes {
        rctd: false,
        reporting_options: 2,
        requested_opcode: 0x48,
        requested_service_action: 2,
        allocation_length: 64,
    });
    assert_eq!(run(&t, &a, &cdb, &[], 64).data_in, vec![0, 1, 0, 0]);
    let bdc = super::tests::vpd_page(&t, &a, 0xb1);
    assert_eq!(bdc.data_in[7] >> 4, 0);
}

#[test]
fn write_protection_and_reservations_refuse_sanitize() {
    let params = overwrite_params(false, 1, &[0xaa; 512]);
    let ro = table_with(|c| c.read_only = true);
    let a = nexus("iqn.a");
    ready(&ro, &a);
    expect_check(
        &overwrite(&ro, &a, false, &params),
        SenseKey::DataProtect,
        Asc::WRITE_PROTECTED,
    );
    expect_check(
        &block_erase(&ro, &a, false),
        SenseKey::DataProtect,
        Asc::WRITE_PROTECTED,
    );

    let t = table();
    ready(&t, &a);
    t.get(0).unwrap().lock().mode.swp = true;
    expect_check(
        &block_erase(&t, &a, false),
        SenseKey::DataProtect,
        Asc::LU_SOFTWARE_WRITE_PROTECTED,
    );
    t.get(0).unwrap().lock().mode.swp = false;

    let b = nexus("iqn.b");
    ready(&t, &b);
    assert_eq!(run(&t, &b, &c(Cdb::Reserve6), &[], 0).status, GOOD);
    assert_eq!(overwrite(&t, &a, false, &params).status, CONFLICT);
    assert_eq!(block_erase(&t, &a, false).status, CONFLICT);
    // The holder may.
    assert_eq!(overwrite(&t, &b, false, &params).status, GOOD);
}

#[test]
fn not_ready_while_sanitizing_with_progress() {
    let t = slow_table(Duration::from_millis(400));
    let a = nexus("iqn.a");
    ready(&t, &a);
    let started = Instant::now();
    assert_eq!(
        overwrite(&t, &a, true, &overwrite_params(false, 1, &[0x5a])).status,
        GOOD
    );
    let s = expect_check(
        &tur(&t, &a),
        SenseKey::NotReady,
        Asc::LU_NOT_READY_SANITIZE_IN_PROGRESS,
    );
    assert!(
        matches!(s.sks, Some(SenseKeySpecific::Progress(_))),
        "{s:?}"
    );
    for cdb in [
        c(Cdb::Read {
            rw: rw(CdbSize::Ten, 0, 1),
            rarc: false,
        }),
        c(Cdb::ReadCapacity10 { lba: 0, pmi: false }),
        c(Cdb::StartStopUnit {
            immed: true,
            power_condition_modifier: 0,
            power_condition: 0,
            no_flush: false,
            loej: false,
            start: true,
        }),
        c(Cdb::PreventAllowMediumRemoval { prevent: 1 }),
        sanitize_cdb(false, false, 2, 0),
    ] {
        expect_check(
            &run(&t, &a, &cdb, &[], 512),
            SenseKey::NotReady,
            Asc::LU_NOT_READY_SANITIZE_IN_PROGRESS,
        );
    }
    // INQUIRY, REPORT LUNS and REQUEST SENSE are answered.
    let inq = c(Cdb::Inquiry {
        evpd: false,
        page_code: 0,
        allocation_length: 96,
    });
    assert_eq!(run(&t, &a, &inq, &[], 96).status, GOOD);
    let rl = c(Cdb::ReportLuns {
        select_report: 0,
        allocation_length: 64,
    });
    assert_eq!(run(&t, &a, &rl, &[], 64).status, GOOD);
    let s = request_sense(&t, &a);
    assert_eq!(
        (s.key, s.code()),
        (SenseKey::NotReady, Asc::LU_NOT_READY_SANITIZE_IN_PROGRESS)
    );
    let Some(SenseKeySpecific::Progress(p1)) = s.sks else {
        panic!("no progress: {s:?}")
    };
    std::thread::sleep(Duration::from_millis(150));
    let Some(SenseKeySpecific::Progress(p2)) = request_sense(&t, &a).sks else {
        panic!("no progress")
    };
    assert!(p2 > p1, "{p1} then {p2}");
    assert_eq!(wait_sanitized(&t, &a).status, GOOD);
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert_eq!(read(&t, &a, 100, 1).data_in, vec![0x5a; 512]);
    assert_eq!(request_sense(&t, &a).key, SenseKey::NoSense);
}

#[test]
fn sanitize_survives_resets_nexus_loss_and_task_abort() {
    let t = slow_table(Duration::from_millis(500));
    let a = nexus("iqn.a");
    ready(&t, &a);
    let aborted = Arc::new(AtomicBool::new(false));
    let waiting = {
        let (t, a, aborted) = (Arc::new(t), a.clone(), aborted.clone());
        let t2 = t.clone();
        let h = std::thread::spawn(move || {
            abortable(&aborted, || {
                overwrite(&t2, &a, false, &overwrite_params(false, 1, &[0x77]))
            })
        });
        (t, h)
    };
    let (t, h) = waiting;
    std::thread::sleep(Duration::from_millis(50));
    aborted.store(true, Ordering::SeqCst);
    let r = h.join().unwrap();
    assert_eq!(r.status, blockwire_pdu::scsi::ScsiStatus::TASK_ABORTED.0);
    let _ = t.reset_lun(0, &a);
    let _ = t.reset_target(&a);
    t.nexus_lost(&a);
    // The unit attentions of the resets come first, then NOT READY.
    let until = Instant::now() + Duration::from_secs(5);
    let r = loop {
        let r = tur(&t, &a);
        if sense(&r).key != SenseKey::UnitAttention || Instant::now() > until {
            break r;
        }
    };
    expect_check(
        &r,
        SenseKey::NotReady,
        Asc::LU_NOT_READY_SANITIZE_IN_PROGRESS,
    );
    assert_eq!(wait_sanitized(&t, &a).status, GOOD);
    assert_eq!(read(&t, &a, 5, 1).data_in, vec![0x77; 512]);
}

/// A RAM store whose writes can be made to fail (EIO).
#[derive(Debug)]
struct Flaky {
    ram: RamBackstore,
    fail: AtomicBool,
}

impl Backstore for Flaky {
    fn size(&self) -> u64 {
        self.ram.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.ram.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(5));
        }
        self.ram.write_at(offset, data)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn describe(&self) -> String {
        "flaky".into()
    }
}

#[test]
fn failed_sanitize_enters_failure_mode_until_exit_or_success() {
    let store = Arc::new(Flaky {
        ram: RamBackstore::new(1 << 20),
        fail: AtomicBool::new(true),
    });
    let t = LunTable::new(vec![(
        0,
        Arc::new(LogicalUnit::new(LuConfig::new(store.clone()))),
    )]);
    let a = nexus("iqn.a");
    ready(&t, &a);
    let params = overwrite_params(false, 1, &[1]);
    // AUSE=0: EXIT FAILURE MODE may not end it.
    let cdb = sanitize_cdb(false, false, 1, params.len() as u16);
    expect_check(
        &run(&t, &a, &cdb, &params, 0),
        SenseKey::MediumError,
        Asc::WRITE_ERROR,
    );
    expect_check(
        &read(&t, &a, 0, 1),
        SenseKey::MediumError,
        Asc::SANITIZE_COMMAND_FAILED,
    );
    assert_eq!(tur(&t, &a).status, GOOD);
    expect_invalid_cdb(&run(&t, &a, &sanitize_cdb(false, false, 0x1f, 0), &[], 0));
    // A successful sanitize ends it.
    store.fail.store(false, Ordering::SeqCst);
    assert_eq!(run(&t, &a, &cdb, &params, 0).status, GOOD);
    assert_eq!(read(&t, &a, 0, 1).data_in, vec![1; 512]);
    // AUSE=1: EXIT FAILURE MODE ends it.
    store.fail.store(true, Ordering::SeqCst);
    let cdb = sanitize_cdb(false, true, 1, params.len() as u16);
    assert_eq!(run(&t, &a, &cdb, &params, 0).status, CHECK);
    expect_check(
        &read(&t, &a, 0, 1),
        SenseKey::MediumError,
        Asc::SANITIZE_COMMAND_FAILED,
    );
    assert_eq!(
        run(&t, &a, &sanitize_cdb(false, false, 0x1f, 0), &[], 0).status,
        GOOD
    );
    assert_eq!(read(&t, &a, 0, 1).status, GOOD);
}

fn ssu(loej: bool, start: bool) -> Vec<u8> {
    ssu_pc(0, loej, start)
}

fn ssu_pc(power_condition: u8, loej: bool, start: bool) -> Vec<u8> {
    c(Cdb::StartStopUnit {
        immed: false,
        power_condition_modifier: 0,
        power_condition,
        no_flush: false,
        loej,
        start,
    })
}

fn pa(prevent: u8) -> Vec<u8> {
    c(Cdb::PreventAllowMediumRemoval { prevent })
}

fn removable() -> LunTable {
    table_with(|c| c.removable = true)
}

fn expect_no_medium(r: &ScsiResult) {
    expect_check(r, SenseKey::NotReady, Asc::MEDIUM_NOT_PRESENT);
}

#[test]
fn removable_medium_ejects_and_loads() {
    let t = removable();
    let a = nexus("iqn.a");
    let b = nexus("iqn.b");
    ready(&t, &a);
    ready(&t, &b);
    let inq = c(Cdb::Inquiry {
        evpd: false,
        page_code: 0,
        allocation_length: 96,
    });
    let std_inq = StandardInquiry::decode(&run(&t, &a, &inq, &[], 96).data_in).unwrap();
    assert!(std_inq.rmb);
    assert_eq!(write(&t, &a, 3, &[7; 512]).status, GOOD);
    assert_eq!(run(&t, &a, &ssu(true, false), &[], 0).status, GOOD);
    expect_no_medium(&tur(&t, &a));
    expect_no_medium(&tur(&t, &b));
    for cdb in [
        c(Cdb::Read {
            rw: rw(CdbSize::Sixteen, 0, 1),
            rarc: false,
        }),
        c(Cdb::Write(rw(CdbSize::Ten, 0, 1))),
        c(Cdb::ReadCapacity10 { lba: 0, pmi: false }),
        c(Cdb::ReadCapacity16 {
            lba: 0,
            allocation_length: 32,
            pmi: false,
        }),
        c(Cdb::SynchronizeCache {
            size: CdbSize::Ten,
            immed: false,
            lba: 0,
            blocks: 1,
            group: 0,
        }),
        c(Cdb::GetLbaStatus {
            lba: 0,
            allocation_length: 24,
        }),
        sanitize_cdb(false, false, 2, 0),
    ] {
        expect_no_medium(&run(&t, &a, &cdb, &[0; 512], 512));
    }
    // What needs no medium is answered.
    assert_eq!(run(&t, &a, &inq, &[], 96).status, GOOD);
    let ms = c(Cdb::ModeSense6 {
        dbd: false,
        page_control: blockwire_pdu::scsi::PageControl::Current,
        page_code: 0x3f,
        subpage_code: 0,
        allocation_length: 255,
    });
    assert_eq!(run(&t, &a, &ms, &[], 255).status, GOOD);
    let s = request_sense(&t, &a);
    assert_eq!(
        (s.key, s.code()),
        (SenseKey::NotReady, Asc::MEDIUM_NOT_PRESENT)
    );
    // Ejecting again is fine; PREVENT works without a medium.
    assert_eq!(run(&t, &a, &ssu(true, false), &[], 0).status, GOOD);
    assert_eq!(run(&t, &a, &pa(1), &[], 0).status, GOOD);
    assert_eq!(run(&t, &a, &pa(0), &[], 0).status, GOOD);
    // Load: the loading nexus is ready at once, the other hears the change.
    assert_eq!(run(&t, &a, &ssu(true, true), &[], 0).status, GOOD);
    assert_eq!(tur(&t, &a).status, GOOD);
    expect_check(
        &tur(&t, &b),
        SenseKey::UnitAttention,
        Asc::NOT_READY_TO_READY_CHANGE,
    );
    assert_eq!(tur(&t, &b).status, GOOD);
    assert_eq!(read(&t, &b, 3, 1).data_in, vec![7; 512]);
    // LOEJ=0 changes nothing; a non-zero power condition ignores LOEJ.
    for (loej, start) in [(false, false), (false, true)] {
        assert_eq!(run(&t, &a, &ssu(loej, start), &[], 0).status, GOOD);
        assert_eq!(tur(&t, &a).status, GOOD);
    }
    for pc in 1..16 {
        assert_eq!(
            run(&t, &a, &ssu_pc(pc, true, false), &[], 0).status,
            GOOD,
            "pc {pc}"
        );
        assert_eq!(tur(&t, &a).status, GOOD);
    }
}

#[test]
fn prevent_blocks_eject_and_load_per_nexus() {
    let t = removable();
    let a = nexus("iqn.a");
    let b = nexus("iqn.b");
    ready(&t, &a);
    ready(&t, &b);
    assert_eq!(run(&t, &a, &pa(1), &[], 0).status, GOOD);
    for n in [&a, &b] {
        expect_check(
            &run(&t, n, &ssu(true, false), &[], 0),
            SenseKey::IllegalRequest,
            Asc::MEDIUM_REMOVAL_PREVENTED,
        );
    }
    assert_eq!(tur(&t, &a).status, GOOD);
    expect_invalid_cdb(&run(&t, &a, &pa(2), &[], 0));
    assert_eq!(run(&t, &a, &pa(0), &[], 0).status, GOOD);
    assert_eq!(run(&t, &a, &ssu(true, false), &[], 0).status, GOOD);
    expect_no_medium(&tur(&t, &a));
    // Loading is refused too while prevented.
    assert_eq!(run(&t, &b, &pa(1), &[], 0).status, GOOD);
    expect_check(
        &run(&t, &a, &ssu(true, true), &[], 0),
        SenseKey::IllegalRequest,
        Asc::MEDIUM_REMOVAL_PREVENTED,
    );
    // Nexus loss (logout, connection loss) clears that nexus's prevent.
    t.nexus_lost(&b);
    assert_eq!(run(&t, &a, &ssu(true, true), &[], 0).status, GOOD);
    assert_eq!(tur(&t, &a).status, GOOD);
    // Logical unit and target resets clear every prevent.
    for reset in [
        |t: &LunTable, n: &ItNexus| t.reset_lun(0, n),
        |t: &LunTable, n: &ItNexus| t.reset_target(n),
    ] {
        assert_eq!(run(&t, &a, &pa(1), &[], 0).status, GOOD);
        let _ = reset(&t, &a);
        ready(&t, &a);
        assert_eq!(run(&t, &a, &ssu(true, false), &[], 0).status, GOOD);
        expect_no_medium(&tur(&t, &a));
        assert_eq!(run(&t, &a, &ssu(true, true), &[], 0).status, GOOD);
        assert_eq!(tur(&t, &a).status, GOOD);
    }
}

#[test]
fn fixed_medium_is_unchanged() {
    let t = table();
    let a = nexus("iqn.a");
    ready(&t, &a);
    expect_invalid_cdb(&run(&t, &a, &ssu(true, false), &[], 0));
    assert_eq!(run(&t, &a, &ssu(true, true), &[], 0).status, GOOD);
    expect_invalid_cdb(&run(&t, &a, &ssu_pc(4, true, false), &[], 0));
    assert_eq!(tur(&t, &a).status, GOOD);
}

/// The contents a sequence of OVERWRITE passes leaves in one block.
fn model_block(pattern: &[u8], invert: bool, count: u8) -> Vec<u8> {
    let flip = if invert && count.is_multiple_of(2) {
        0xff
    } else {
        0
    };
    pattern.iter().cycle().take(512).map(|b| b ^ flip).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Whatever was written before, an OVERWRITE leaves every block equal
    /// to the pattern repeated over it (inverted when INVERT and the count
    /// is even), and a refused parameter list changes nothing.
    #[test]
    fn overwrite_matches_model(
        writes in proptest::collection::vec((0u64..BLOCKS, any::<u8>()), 0..8),
        pattern in proptest::collection::vec(any::<u8>(), 1..=512),
        invert in any::<bool>(),
        count in 1u8..4,
        probes in proptest::collection::vec(0u64..BLOCKS, 1..6),
    ) {
        let t = table();
        let a = nexus("iqn.a");
        ready(&t, &a);
        for (lba, fill) in writes {
            prop_assert_eq!(write(&t, &a, lba, &[fill; 512]).status, GOOD);
        }
        let r = overwrite(&t, &a, false, &overwrite_params(invert, count, &pattern));
        prop_assert_eq!(r.status, GOOD);
        let want = model_block(&pattern, invert, count);
        for lba in probes {
            prop_assert_eq!(&read(&t, &a, lba, 1).data_in, &want);
        }
    }

    /// Arbitrary OVERWRITE parameter lists never panic and are accepted
    /// exactly when SBC-4's rules allow them.
    #[test]
    fn overwrite_parameter_lists(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
        len in 0u16..600,
    ) {
        let t = table();
        let a = nexus("iqn.a");
        ready(&t, &a);
        let r = run(&t, &a, &sanitize_cdb(false, false, 1, len), &bytes, 0);
        let l = usize::from(len);
        let ok = (5..=516).contains(&l)
            && bytes.len() >= l
            && bytes[0] & 0x1f != 0
            && bytes[0] & 0x60 == 0
            && {
                let p = usize::from(u16::from_be_bytes([bytes[2], bytes[3]]));
                (1..=512).contains(&p) && p + 4 <= l
            };
        prop_assert_eq!(r.status == GOOD, ok, "{:?}", r);
        if !ok {
            prop_assert_eq!(r.status, CHECK);
            prop_assert_eq!(sense(&r).key, SenseKey::IllegalRequest);
        }
    }
}

/// FORMAT UNIT with `byte1` (FMTPINFO, LONGLIST, FMTDATA, CMPLST, DEFECT
/// LIST FORMAT) and parameter list `params`.
fn format_unit(t: &LunTable, n: &ItNexus, byte1: u8, params: &[u8]) -> ScsiResult {
    run(t, n, &[0x04, byte1, 0, 0, 0, 0], params, 0)
}

/// FORMAT UNIT (SBC-4 5.4, mandatory) formats the unit in the format it
/// has: a thin provisioned unit deallocates every block, as a disk with
/// logical block provisioning unmaps its LBAs when formatted; a fully
/// provisioned one keeps its data. It was refused as an unknown command.
#[test]
fn format_unit_deallocates_a_thin_unit_and_keeps_a_full_ones_data() {
    let a = nexus("iqn.a");
    let thin = table();
    ready(&thin, &a);
    assert_eq!(write(&thin, &a, 7, &[b'f'; 512 * 16]).status, GOOD);
    assert_eq!(format_unit(&thin, &a, 0, &[]).status, GOOD);
    assert_eq!(read(&thin, &a, 7, 16).data_in, vec![0; 512 * 16]);
    let cdb = c(Cdb::GetLbaStatus {
        lba: 0,
        allocation_length: 256,
    });
    let r = run(&thin, &a, &cdb, &[], 256);
    assert_eq!((r.status, r.data_in[20] & 0x0f), (GOOD, 1), "deallocated");

    let full = table_with(|c| c.thin_provisioning = false);
    ready(&full, &a);
    assert_eq!(write(&full, &a, 7, &[b'f'; 512 * 16]).status, GOOD);
    // A short parameter list header, no defects, FOV=0.
    assert_eq!(format_unit(&full, &a, 0x10, &[0, 0, 0, 0]).status, GOOD);
    assert_eq!(read(&full, &a, 7, 16).data_in, vec![b'f'; 512 * 16]);
    // Listed among the supported commands (SUPPORT 011b).
    let cdb = c(Cdb::ReportSupportedOperationCodes {
        rctd: false,
        reporting_options: 1,
        requested_opcode: 0x04,
        requested_service_action: 0,
        allocation_length: 64,
    });
    let r = run(&full, &a, &cdb, &[], 64);
    assert_eq!((r.status, r.data_in[1] & 0x07), (GOOD, 3), "{r:?}");
}

/// A format the unit cannot have is refused, naming the field: another
/// protection type, a defect list, a header cut short; and a format is a
/// write of the whole medium to write protection and reservations.
#[test]
fn format_unit_refuses_what_the_unit_cannot_be_and_who_may_not_write() {
    let a = nexus("iqn.a");
    let t = table();
    ready(&t, &a);
    assert_eq!(write(&t, &a, 0, &[b'k'; 512]).status, GOOD);
    // FMTPINFO 10b: Type 1 protection, which this unit has not.
    let s = expect_check(
        &format_unit(&t, &a, 0x80, &[]),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
    assert_eq!(
        s.sks,
        Some(SenseKeySpecific::FieldPointer(
            blockwire_pdu::scsi::FieldPointer::cdb(1, Some(7))
        ))
    );
    // A defect list of one entry (short block format, 8 bytes).
    expect_check(
        &format_unit(&t, &a, 0x10, &[0, 0, 0, 8, 0, 0, 0, 9, 0, 0, 0, 0]),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
    );
    // LONGLIST with a 4-byte header.
    expect_check(
        &format_unit(&t, &a, 0x30, &[0, 0, 0, 0]),
        SenseKey::IllegalRequest,
        Asc::PARAMETER_LIST_LENGTH_ERROR,
    );
    assert_eq!(
        read(&t, &a, 0, 1).data_in,
        vec![b'k'; 512],
        "refused: nothing formatted"
    );

    let ro = table_with(|c| c.read_only = true);
    ready(&ro, &a);
    expect_check(
        &format_unit(&ro, &a, 0, &[]),
        SenseKey::DataProtect,
        Asc::WRITE_PROTECTED,
    );
    let b = nexus("iqn.b");
    ready(&t, &b);
    assert_eq!(run(&t, &b, &c(Cdb::Reserve6), &[], 0).status, GOOD);
    assert_eq!(format_unit(&t, &a, 0, &[]).status, CONFLICT);
    assert_eq!(read(&t, &b, 0, 1).data_in, vec![b'k'; 512]);
    assert_eq!(format_unit(&t, &b, 0, &[]).status, GOOD, "the holder may");
}
