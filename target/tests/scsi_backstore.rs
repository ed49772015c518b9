//! The SCSI core over backstores that fail, fill up, refuse writes or
//! count what reaches stable storage: backstore errors become sense data
//! (never a panic), read-only LUNs answer DATA PROTECT, FUA and
//! SYNCHRONIZE CACHE reach the backstore's durable paths before status,
//! and WCE follows the backstore.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use blockwire_pdu::pdu::codes::TaskAttr;
use blockwire_pdu::scsi::{Asc, Sense, SenseKey};
use blockwire_target::backstore::{Backstore, FileBackstore, NullBackstore, RamBackstore};
use blockwire_target::scsi::{ItNexus, LogicalUnit, LuConfig, LunTable, ScsiRequest, ScsiResult};

const GOOD: u8 = 0x00;
const CHECK: u8 = 0x02;

/// A RAM store that fails the way it is told, and counts durable calls.
#[derive(Debug)]
struct Faulty {
    inner: RamBackstore,
    /// Byte range [from, to) that fails with `errno`.
    bad: (u64, u64),
    errno: i32,
    durable_writes: AtomicUsize,
    flushes: AtomicUsize,
}

impl Faulty {
    fn new(bad: (u64, u64), errno: i32) -> Faulty {
        Faulty {
            inner: RamBackstore::new(1 << 20),
            bad,
            errno,
            durable_writes: AtomicUsize::new(0),
            flushes: AtomicUsize::new(0),
        }
    }

    fn check(&self, offset: u64, len: usize) -> io::Result<()> {
        if offset < self.bad.1 && offset + len as u64 > self.bad.0 {
            return Err(io::Error::from_raw_os_error(self.errno));
        }
        Ok(())
    }
}

impl Backstore for Faulty {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(offset, buf.len())?;
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.check(offset, data.len())?;
        self.inner.write_at(offset, data)
    }
    fn write_at_durable(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.durable_writes.fetch_add(1, Ordering::SeqCst);
        self.write_at(offset, data)
    }
    fn flush(&self) -> io::Result<()> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn describe(&self) -> String {
        "faulty".into()
    }
}

fn table(cfg: LuConfig) -> LunTable {
    LunTable::new(vec![(0, Arc::new(LogicalUnit::new(cfg)))])
}

fn nexus() -> ItNexus {
    ItNexus::iscsi(
        "iqn.2026-11.io.blockwire:test",
        [0x40, 0, 0, 0, 0, 1],
        "iqn.t",
        1,
    )
}

fn run(t: &LunTable, cdb: &[u8], data_out: &[u8], capacity: u32) -> ScsiResult {
    let n = nexus();
    t.execute(&ScsiRequest {
        lun: 0,
        cdb,
        nexus: &n,
        task_tag: 1,
        attr: TaskAttr::Simple,
        data_out,
        data_in_capacity: capacity,
        initiator_stats: None,
    })
}

/// TEST UNIT READY until the power-on unit attention is gone.
fn ready(t: &LunTable) {
    for _ in 0..4 {
        if run(t, &[0; 6], &[], 0).status == GOOD {
            return;
        }
    }
    panic!("unit never became ready");
}

fn rw16(op: u8, lba: u64, blocks: u32, fua: bool) -> Vec<u8> {
    let mut c = vec![op, if fua { 0x08 } else { 0 }];
    c.extend_from_slice(&lba.to_be_bytes());
    c.extend_from_slice(&blocks.to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    c
}

fn sense(r: &ScsiResult) -> Sense {
    assert_eq!(r.status, CHECK, "{r:?}");
    Sense::decode(r.sense.as_deref().expect("sense")).unwrap()
}

#[test]
fn eio_is_medium_error_with_the_lba() {
    // Block 100 fails.
    let store = Arc::new(Faulty::new((100 * 512, 101 * 512), libc_eio()));
    let t = table(LuConfig::new(store));
    ready(&t);
    let r = run(&t, &rw16(0x88, 96, 8, false), &[], 4096);
    let s = sense(&r);
    assert_eq!(
        (s.key, s.code()),
        (SenseKey::MediumError, Asc::UNRECOVERED_READ_ERROR)
    );
    assert_eq!(s.information, Some(96));
    let r = run(&t, &rw16(0x8a, 100, 1, false), &[7; 512], 0);
    let s = sense(&r);
    assert_eq!((s.key, s.code()), (SenseKey::MediumError, Asc::WRITE_ERROR));
    assert_eq!(s.information, Some(100));
    // Elsewhere the unit keeps working.
    assert_eq!(run(&t, &rw16(0x8a, 0, 1, false), &[7; 512], 0).status, GOOD);
    assert_eq!(
        run(&t, &rw16(0x88, 0, 1, false), &[], 512).data_in,
        vec![7; 512]
    );
}

#[test]
fn enospc_is_space_allocation_failed_and_other_errors_hardware_error() {
    let store = Arc::new(Faulty::new((0, 1 << 20), 28 /* ENOSPC */));
    let t = table(LuConfig::new(store));
    ready(&t);
    let s = sense(&run(&t, &rw16(0x8a, 5, 1, false), &[1; 512], 0));
    assert_eq!(
        (s.key, s.code()),
        (
            SenseKey::DataProtect,
            Asc::SPACE_ALLOCATION_FAILED_WRITE_PROTECT
        )
    );
    assert_eq!(s.information, Some(5));
    let store = Arc::new(Faulty::new((0, 1 << 20), 9 /* EBADF */));
    let t = table(LuConfig::new(store));
    ready(&t);
    let s = sense(&run(&t, &rw16(0x88, 7, 1, false), &[], 512));
    assert_eq!(
        (s.key, s.code()),
        (SenseKey::HardwareError, Asc::INTERNAL_TARGET_FAILURE)
    );
    assert_eq!(s.information, Some(7));
}

fn libc_eio() -> i32 {
    5
}

#[test]
fn read_only_luns_answer_data_protect() {
    let mut cfg = LuConfig::new(Arc::new(RamBackstore::new(1 << 20)));
    cfg.read_only = true;
    let t = table(cfg);
    ready(&t);
    for cdb in [
        rw16(0x8a, 0, 1, false),
        // WRITE SAME(16) with UNMAP, UNMAP, SYNCHRONIZE CACHE is allowed.
        {
            let mut c = rw16(0x93, 0, 1, false);
            c[1] = 0x08;
            c
        },
    ] {
        let s = sense(&run(&t, &cdb, &[0; 512], 0));
        assert_eq!(
            (s.key, s.code()),
            (SenseKey::DataProtect, Asc::WRITE_PROTECTED)
        );
    }
    assert_eq!(run(&t, &rw16(0x88, 0, 1, false), &[], 512).status, GOOD);
}

#[test]
fn fua_and_synchronize_cache_reach_stable_storage_and_wce_follows_the_store() {
    let store = Arc::new(Faulty::new((u64::MAX - 1, u64::MAX), 5));
    let t = table(LuConfig::new(store.clone()));
    ready(&t);
    // WCE=1 (the store has a volatile cache): a plain write is not durable.
    assert_eq!(run(&t, &rw16(0x8a, 0, 1, false), &[1; 512], 0).status, GOOD);
    assert_eq!(store.durable_writes.load(Ordering::SeqCst), 0);
    // FUA: durable before status.
    assert_eq!(run(&t, &rw16(0x8a, 1, 1, true), &[2; 512], 0).status, GOOD);
    assert_eq!(store.durable_writes.load(Ordering::SeqCst), 1);
    // SYNCHRONIZE CACHE (10) and (16) flush.
    let before = store.flushes.load(Ordering::SeqCst);
    assert_eq!(
        run(&t, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0).status,
        GOOD
    );
    assert_eq!(
        run(
            &t,
            &[0x91, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            &[],
            0
        )
        .status,
        GOOD
    );
    assert_eq!(store.flushes.load(Ordering::SeqCst), before + 2);
    // Caching mode page (MODE SENSE(6) page 08h): WCE set.
    let r = run(&t, &[0x1a, 0x08, 0x08, 0, 0xff, 0], &[], 255);
    assert_eq!(r.status, GOOD);
    let page = &r.data_in[4..];
    assert_eq!(page[0] & 0x3f, 0x08);
    assert_ne!(
        page[2] & 0x04,
        0,
        "WCE set for a store with a volatile cache"
    );

    // A store without a volatile cache (null) reports WCE=0 and V_SUP=0.
    let t = table(LuConfig::new(Arc::new(NullBackstore::new(1 << 20))));
    ready(&t);
    let r = run(&t, &[0x1a, 0x08, 0x08, 0, 0xff, 0], &[], 255);
    assert_eq!(r.data_in[4 + 2] & 0x04, 0, "WCE clear for the null store");
    // The null store reads zeros and reports everything deallocated.
    assert_eq!(run(&t, &rw16(0x8a, 3, 1, true), &[9; 512], 0).status, GOOD);
    assert_eq!(
        run(&t, &rw16(0x88, 3, 1, false), &[], 512).data_in,
        vec![0; 512]
    );
    let mut gls = vec![0x9e, 0x12];
    gls.extend_from_slice(&0u64.to_be_bytes());
    gls.extend_from_slice(&[0, 0, 0, 24, 0, 0]);
    let r = run(&t, &gls, &[], 24);
    assert_eq!(r.status, GOOD);
    assert_eq!(r.data_in[8 + 12] & 0x0f, 1, "deallocated");
}

/// A file LUN: UNMAP punches a hole that GET LBA STATUS reports, FUA
/// writes are readable through a second handle at once.
#[test]
fn file_lun_unmap_and_get_lba_status() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun.img");
    let store = Arc::new(FileBackstore::open(&path, Some(8 << 20), false).unwrap());
    let t = table(LuConfig::new(store));
    ready(&t);
    // Write 4 MiB (8192 blocks) in 1 MiB pieces, FUA.
    for i in 0..4u64 {
        let r = run(
            &t,
            &rw16(0x8a, i * 2048, 2048, true),
            &vec![0xa5; 1 << 20],
            0,
        );
        assert_eq!(r.status, GOOD);
    }
    // UNMAP blocks 2048..4096 (1 MiB at 1 MiB).
    let mut list = vec![0, 22, 0, 16, 0, 0, 0, 0];
    list.extend_from_slice(&2048u64.to_be_bytes());
    list.extend_from_slice(&2048u32.to_be_bytes());
    list.extend_from_slice(&[0; 4]);
    let r = run(&t, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &list, 0);
    assert_eq!(r.status, GOOD, "{r:?}");
    let mut gls = vec![0x9e, 0x12];
    gls.extend_from_slice(&0u64.to_be_bytes());
    gls.extend_from_slice(&[0, 0, 0, 72, 0, 0]);
    let r = run(&t, &gls, &[], 72);
    assert_eq!(r.status, GOOD);
    let desc = |i: usize| {
        let d = &r.data_in[8 + 16 * i..8 + 16 * (i + 1)];
        (
            u64::from_be_bytes(d[0..8].try_into().unwrap()),
            u32::from_be_bytes(d[8..12].try_into().unwrap()),
            d[12] & 0x0f,
        )
    };
    assert_eq!(desc(0), (0, 2048, 0));
    assert_eq!(desc(1), (2048, 2048, 1));
    assert_eq!(desc(2), (4096, 4096, 0));
    assert_eq!(desc(3), (8192, 8192, 1));
    let on_disk = std::fs::read(&path).unwrap();
    assert!(on_disk[..1 << 20].iter().all(|&b| b == 0xa5));
    assert!(on_disk[1 << 20..2 << 20].iter().all(|&b| b == 0));
}
