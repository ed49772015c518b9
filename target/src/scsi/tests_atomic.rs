//! WRITE ATOMIC(16) and the Block Limits atomic fields: per backstore,
//! the CDB checks, REPORT SUPPORTED OPERATION CODES, and ordering against
//! overlapping writes.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use blockwire_pdu::scsi::{Asc, Cdb, SenseKey, Vpd, VpdPage};

use super::tests::*;
use super::*;
use crate::backstore::{Backstore, FileBackstore, RamBackstore};

fn atomic_cdb(lba: u64, blocks: u16) -> Cdb {
    Cdb::WriteAtomic16 {
        lba,
        boundary: 0,
        blocks,
        wrprotect: 0,
        dpo: false,
        fua: false,
        group: 0,
    }
}

/// `cdb` with ATOMIC BOUNDARY, WRPROTECT, DPO and FUA set.
fn flags(cdb: Cdb, boundary: u16, wrprotect: u8, dpo: bool, fua: bool) -> Cdb {
    let Cdb::WriteAtomic16 {
        lba, blocks, group, ..
    } = cdb
    else {
        unreachable!()
    };
    Cdb::WriteAtomic16 {
        lba,
        boundary,
        blocks,
        wrprotect,
        dpo,
        fua,
        group,
    }
}

fn atomic(t: &LunTable, n: &ItNexus, lba: u64, data: &[u8]) -> ScsiResult {
    run(
        t,
        n,
        &c(atomic_cdb(lba, (data.len() / 512) as u16)),
        data,
        0,
    )
}

fn table_on(store: Arc<dyn Backstore>, cfg: impl FnOnce(&mut LuConfig)) -> LunTable {
    let mut c = LuConfig::new(store);
    cfg(&mut c);
    LunTable::new(vec![(0, Arc::new(LogicalUnit::new(c)))])
}

fn block_limits(t: &LunTable, n: &ItNexus) -> (Vec<u8>, blockwire_pdu::scsi::BlockLimits) {
    let r = run(
        t,
        n,
        &c(Cdb::Inquiry {
            evpd: true,
            page_code: 0xb0,
            allocation_length: 255,
        }),
        &[],
        255,
    );
    assert_eq!(r.status, GOOD);
    let Ok(Vpd {
        page: VpdPage::BlockLimits(bl),
        ..
    }) = Vpd::decode(&r.data_in)
    else {
        panic!("{:?}", r.data_in)
    };
    (r.data_in, bl)
}

/// REPORT SUPPORTED OPERATION CODES for 9Ch alone: (SUPPORT, usage data).
fn rsoc_9c(t: &LunTable, n: &ItNexus) -> (u8, Vec<u8>) {
    let r = run(
        t,
        n,
        &c(Cdb::ReportSupportedOperationCodes {
            rctd: false,
            reporting_options: 1,
            requested_opcode: 0x9c,
            requested_service_action: 0,
            allocation_length: 64,
        }),
        &[],
        64,
    );
    assert_eq!(r.status, GOOD);
    (r.data_in[1] & 7, r.data_in[4..].to_vec())
}

fn all_opcodes(t: &LunTable, n: &ItNexus) -> Vec<u8> {
    let r = run(
        t,
        n,
        &c(Cdb::ReportSupportedOperationCodes {
            rctd: false,
            reporting_options: 0,
            requested_opcode: 0,
            requested_service_action: 0,
            allocation_length: 8192,
        }),
        &[],
        8192,
    );
    assert_eq!(r.status, GOOD);
    r.data_in[4..].chunks(8).map(|d| d[0]).collect()
}

#[test]
fn ram_lun_offers_atomic_writes() {
    let t = table();
    let a = nexus("iqn.a");
    ready(&t, &a);
    let (raw, bl) = block_limits(&t, &a);
    // Page length 3Ch: the SBC-4 page with the atomic fields.
    assert_eq!(raw.len(), 64);
    assert_eq!(&raw[2..4], &[0, 0x3c]);
    // 1 MiB RAM store: the in-process limit (1 MiB) in 512-byte blocks.
    assert_eq!(bl.max_atomic_transfer_length, 2048);
    assert_eq!(&raw[44..48], &2048u32.to_be_bytes());
    assert!(bl.max_atomic_transfer_length <= bl.max_transfer_length);
    assert_eq!(bl.atomic_alignment, 0);
    assert_eq!(bl.atomic_transfer_length_granularity, 0);
    assert_eq!(bl.max_atomic_transfer_length_with_boundary, 0);
    assert_eq!(bl.max_atomic_boundary_size, 0);

    let data: Vec<u8> = (0..32 * 512).map(|i| (i / 512) as u8 ^ 0x5a).collect();
    assert_eq!(atomic(&t, &a, 100, &data).status, GOOD);
    assert_eq!(read(&t, &a, 100, 32).data_in, data);

    let (support, usage) = rsoc_9c(&t, &a);
    assert_eq!(support, 3, "supported as the standard says");
    assert_eq!(usage.len(), 16);
    assert_eq!(usage[0], 0x9c);
    // DPO and FUA honoured (the caching page says DPOFUA=1).
    assert_eq!(usage[1] & 0x18, 0x18);
    assert!(all_opcodes(&t, &a).contains(&0x9c));
    // FUA and DPO are accepted.
    let cdb = flags(atomic_cdb(0, 1), 0, 0, true, true);
    assert_eq!(run(&t, &a, &c(cdb), &[7; 512], 0).status, GOOD);
    assert_eq!(read(&t, &a, 0, 1).data_in, vec![7; 512]);
}

#[test]
fn cdb_fields_are_checked_before_anything_is_written() {
    let t = table();
    let a = nexus("iqn.a");
    ready(&t, &a);
    let blocks = 2048u64;
    // WRPROTECT without protection information.
    let cdb = flags(atomic_cdb(0, 1), 0, 1, false, false);
    let s = expect_check(
        &run(&t, &a, &c(cdb), &[1; 512], 0),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
    assert_eq!(s.field_pointer().unwrap().byte, 1);
    // A non-zero ATOMIC BOUNDARY: no boundaries are offered.
    let cdb = flags(atomic_cdb(0, 2), 1, 0, false, false);
    let s = expect_check(
        &run(&t, &a, &c(cdb), &[1; 1024], 0),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
    assert_eq!(s.field_pointer().unwrap().byte, 10);
    // Beyond the end, and wrapping around.
    for (lba, n) in [
        (blocks - 1, 2u16),
        (blocks + 1, 0),
        (u64::MAX, 1),
        (1 << 63, 0),
    ] {
        let r = run(
            &t,
            &a,
            &c(atomic_cdb(lba, n)),
            &vec![1; 512 * n as usize],
            0,
        );
        expect_check(&r, SenseKey::IllegalRequest, Asc::LBA_OUT_OF_RANGE);
    }
    // Zero blocks: nothing to do.
    assert_eq!(run(&t, &a, &c(atomic_cdb(0, 0)), &[], 0).status, GOOD);
    assert_eq!(run(&t, &a, &c(atomic_cdb(blocks, 0)), &[], 0).status, GOOD);
    // Less Data-Out than the CDB asks for: refused whole, nothing written
    // (a plain WRITE would write the blocks that came).
    let r = run(&t, &a, &c(atomic_cdb(8, 4)), &[9; 3 * 512], 0);
    expect_check(
        &r,
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_COMMAND_INFORMATION_UNIT,
    );
    assert_eq!(read(&t, &a, 8, 4).data_in, vec![0; 4 * 512]);
}

#[test]
fn longer_than_the_maximum_is_an_invalid_field() {
    // A file LUN's journal takes 128 KiB: 256 blocks of 512 bytes.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun.img");
    let fb = FileBackstore::open(&path, Some(4 << 20), false).unwrap();
    let (fb, replayed) = fb
        .with_atomic_journal(&FileBackstore::default_journal_path(&path))
        .unwrap();
    assert_eq!(replayed, 0);
    let t = table_on(Arc::new(fb), |_| {});
    let a = nexus("iqn.a");
    ready(&t, &a);
    assert_eq!(block_limits(&t, &a).1.max_atomic_transfer_length, 256);
    let r = atomic(&t, &a, 0, &[3; 257 * 512]);
    let s = expect_check(&r, SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB);
    assert_eq!(s.field_pointer().unwrap().byte, 12);
    assert_eq!(read(&t, &a, 0, 1).data_in, vec![0; 512]);
    let data = vec![4; 256 * 512];
    assert_eq!(atomic(&t, &a, 1, &data).status, GOOD);
    assert_eq!(read(&t, &a, 1, 256).data_in, data);
    // With 4 KiB blocks the same journal takes 32 blocks.
    let store = t.get(0).unwrap().config().backstore.clone();
    let t4 = table_on(store, |c| c.block_size = 4096);
    ready(&t4, &a);
    assert_eq!(block_limits(&t4, &a).1.max_atomic_transfer_length, 32);
}

/// A store whose atomic writes are one size at offsets aligned to it, as
/// the kernel's untorn writes are (RAM underneath); it records each atomic
/// write it is asked for.
#[derive(Debug)]
struct OneSize {
    ram: RamBackstore,
    unit: u64,
    asked: std::sync::Mutex<Vec<(u64, usize)>>,
}

impl Backstore for OneSize {
    fn size(&self) -> u64 {
        self.ram.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.ram.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.ram.write_at(offset, data)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn atomic_write_max(&self) -> u64 {
        self.unit
    }
    fn atomic_write_unit(&self) -> u64 {
        self.unit
    }
    fn write_atomic(&self, offset: u64, data: &[u8], _durable: bool) -> io::Result<()> {
        self.asked.lock().unwrap().push((offset, data.len()));
        self.ram.write_at(offset, data)
    }
    fn describe(&self) -> String {
        "one-size atomic ram".into()
    }
}

#[test]
fn a_store_of_one_atomic_size_has_the_unit_take_only_that_size_aligned() {
    let store = Arc::new(OneSize {
        ram: RamBackstore::new(1 << 20),
        unit: 8 << 10,
        asked: Default::default(),
    });
    let t = table_on(store.clone(), |_| {});
    let a = nexus("iqn.a");
    ready(&t, &a);
    // 8 KiB = 16 blocks: alignment, granularity and maximum alike, so the
    // only valid atomic write is 16 blocks at a multiple of 16.
    let (raw, bl) = block_limits(&t, &a);
    assert_eq!(bl.max_atomic_transfer_length, 16);
    assert_eq!(bl.atomic_alignment, 16);
    assert_eq!(bl.atomic_transfer_length_granularity, 16);
    assert_eq!(&raw[48..52], &16u32.to_be_bytes());
    assert_eq!(bl.max_atomic_transfer_length_with_boundary, 0);
    let data: Vec<u8> = (0..16 * 512).map(|i| (i / 512) as u8 ^ 0xa5).collect();
    assert_eq!(atomic(&t, &a, 32, &data).status, GOOD);
    assert_eq!(read(&t, &a, 32, 16).data_in, data);
    // An LBA off the alignment: INVALID FIELD IN CDB at the LBA (byte 2).
    let s = expect_check(
        &atomic(&t, &a, 8, &data),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
    assert_eq!(s.field_pointer().unwrap().byte, 2);
    // Off the granularity (8 blocks) or past the maximum (32): at the
    // TRANSFER LENGTH (byte 12).
    for blocks in [8usize, 32] {
        let s = expect_check(
            &atomic(&t, &a, 64, &vec![1; blocks * 512]),
            SenseKey::IllegalRequest,
            Asc::INVALID_FIELD_IN_CDB,
        );
        assert_eq!(s.field_pointer().unwrap().byte, 12, "{blocks} blocks");
    }
    assert_eq!(read(&t, &a, 64, 32).data_in, vec![0; 32 * 512]);
    // Only the valid one reached the store.
    assert_eq!(*store.asked.lock().unwrap(), vec![(32 * 512, 8 << 10)]);
    // With 4 KiB blocks the same size is 2 blocks; a size that is not whole
    // blocks offers nothing.
    let t4 = table_on(store.clone(), |c| c.block_size = 4096);
    ready(&t4, &a);
    let bl = block_limits(&t4, &a).1;
    assert_eq!(
        (
            bl.max_atomic_transfer_length,
            bl.atomic_alignment,
            bl.atomic_transfer_length_granularity
        ),
        (2, 2, 2)
    );
    let odd = Arc::new(OneSize {
        ram: RamBackstore::new(1 << 20),
        unit: 2048,
        asked: Default::default(),
    });
    assert_not_offered(&table_on(odd, |c| c.block_size = 4096));
}

/// A unit that cannot (or may not) write atomically says so everywhere:
/// zeros in the Block Limits atomic fields, 9Ch absent from REPORT
/// SUPPORTED OPERATION CODES, INVALID COMMAND OPERATION CODE.
fn assert_not_offered(t: &LunTable) {
    let a = nexus("iqn.a");
    ready(t, &a);
    let (raw, bl) = block_limits(t, &a);
    assert_eq!(bl.max_atomic_transfer_length, 0);
    assert_eq!(bl.atomic_alignment, 0);
    assert_eq!(bl.atomic_transfer_length_granularity, 0);
    assert!(raw[44..64].iter().all(|&b| b == 0));
    assert_eq!(rsoc_9c(t, &a).0, 1, "not supported");
    assert!(!all_opcodes(t, &a).contains(&0x9c));
    expect_check(
        &atomic(t, &a, 0, &[1; 512]),
        SenseKey::IllegalRequest,
        Asc::INVALID_COMMAND_OPERATION_CODE,
    );
    assert_eq!(read(t, &a, 0, 1).data_in, vec![0; 512]);
}

#[test]
fn not_offered_where_the_store_cannot_or_the_lun_says_no() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plain.img");
    // A file without a journal.
    let fb = FileBackstore::open(&path, Some(1 << 20), false).unwrap();
    assert_not_offered(&table_on(Arc::new(fb), |_| {}));
    // A RAM LUN configured with atomic_writes = false.
    assert_not_offered(&table_with(|c| c.atomic_writes = false));
    // A striped LUN (a write may span members).
    let members: Vec<_> = (0..2).map(|i| dir.path().join(format!("m{i}"))).collect();
    let sb = crate::backstore::StripedBackstore::open(
        &members,
        64 << 10,
        Some(1 << 20),
        false,
        crate::backstore::FileMode::Cached,
    )
    .unwrap();
    assert_not_offered(&table_on(Arc::new(sb), |_| {}));
}

#[test]
fn read_only_lun_refuses_with_data_protect() {
    let t = table_with(|c| c.read_only = true);
    let a = nexus("iqn.a");
    ready(&t, &a);
    expect_check(
        &atomic(&t, &a, 0, &[1; 512]),
        SenseKey::DataProtect,
        Asc::WRITE_PROTECTED,
    );
}

/// RAM that notices when a write runs while an atomic write is in
/// progress (every write in these tests overlaps every other), pausing
/// between blocks so that unordered writes do overlap in time.
#[derive(Debug, Default)]
struct Watch {
    ram: Option<RamBackstore>,
    plain: AtomicUsize,
    atomic: AtomicUsize,
    overlaps: AtomicUsize,
}

impl Watch {
    fn new() -> Watch {
        Watch {
            ram: Some(RamBackstore::new(1 << 20)),
            ..Watch::default()
        }
    }

    fn ram(&self) -> &RamBackstore {
        self.ram.as_ref().expect("built by Watch::new")
    }

    fn slow_write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        for (i, b) in data.chunks(512).enumerate() {
            self.ram().write_at(offset + (i * 512) as u64, b)?;
            std::thread::yield_now();
        }
        Ok(())
    }
}

impl Backstore for Watch {
    fn size(&self) -> u64 {
        self.ram().size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.ram().read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.plain.fetch_add(1, SeqCst);
        if self.atomic.load(SeqCst) > 0 {
            self.overlaps.fetch_add(1, SeqCst);
        }
        let r = self.slow_write(offset, data);
        self.plain.fetch_sub(1, SeqCst);
        r
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn atomic_write_max(&self) -> u64 {
        1 << 20
    }
    fn write_atomic(&self, offset: u64, data: &[u8], _durable: bool) -> io::Result<()> {
        if self.atomic.fetch_add(1, SeqCst) > 0 || self.plain.load(SeqCst) > 0 {
            self.overlaps.fetch_add(1, SeqCst);
        }
        let r = self.slow_write(offset, data);
        self.atomic.fetch_sub(1, SeqCst);
        r
    }
    fn describe(&self) -> String {
        "watched ram".into()
    }
}

/// Atomic writes of the same 64 blocks by `atomic_writers` threads and
/// plain writes of 16 of them by `plain_writers`: no write runs while an
/// atomic write of the same blocks does, and the range ends as one
/// atomic write left it (with, inside, one plain write's blocks or not).
fn overlapping(atomic_writers: u8, plain_writers: u8) {
    let store = Arc::new(Watch::new());
    let t = Arc::new(table_on(store.clone(), |_| {}));
    let a = nexus("iqn.a");
    ready(&t, &a);
    let threads: Vec<_> = (0..atomic_writers + plain_writers)
        .map(|w| {
            let t = t.clone();
            let a = a.clone();
            std::thread::spawn(move || {
                for round in 0..40u8 {
                    let fill = w * 50 + round + 1;
                    if w < atomic_writers {
                        assert_eq!(atomic(&t, &a, 16, &vec![fill; 64 * 512]).status, GOOD);
                    } else {
                        assert_eq!(write(&t, &a, 32, &vec![fill; 16 * 512]).status, GOOD);
                    }
                }
            })
        })
        .collect();
    for h in threads {
        h.join().unwrap();
    }
    assert_eq!(
        store.overlaps.load(SeqCst),
        0,
        "a write overlapped an atomic write"
    );
    let got = read(&t, &a, 16, 64).data_in;
    let outside: Vec<u8> = got[..16 * 512]
        .iter()
        .chain(&got[32 * 512..])
        .copied()
        .collect();
    assert!(
        outside.iter().all(|&b| b == outside[0]),
        "torn atomic write"
    );
    // Inside, the last atomic write's fill, or plain writes' after it.
    // Plain writes of the same blocks share their range and may interleave
    // block by block (SBC-4 promises them nothing more), so two of them
    // can leave a mix of their fills; never of an atomic write's.
    let inside = &got[16 * 512..32 * 512];
    let plain = |b: u8| u16::from(b) > u16::from(atomic_writers) * 50;
    assert!(
        inside.iter().all(|&b| b == outside[0]) || inside.iter().all(|&b| plain(b)),
        "an atomic write's blocks mixed with others"
    );
}

#[test]
fn overlapping_plain_writes_wait_for_an_atomic_write() {
    overlapping(1, 2);
}

#[test]
fn atomic_writes_exclude_each_other() {
    overlapping(3, 0);
}

/// SANITIZE leaves no written data anywhere the unit keeps it (SBC-4
/// 4.11.1), and the atomic-write journal keeps a copy of every atomic
/// write in its slot after the write is done: an OVERWRITE and a BLOCK
/// ERASE both leave the journal with no byte of it, and atomic writes go
/// on working afterwards, also after the store is opened again.
#[test]
fn sanitize_leaves_no_copy_of_an_atomic_write_in_the_journal() {
    for service_action in [1u8, 2] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lun.img");
        let journal = FileBackstore::default_journal_path(&path);
        let open = || {
            FileBackstore::open(&path, Some(4 << 20), false)
                .unwrap()
                .with_atomic_journal(&journal)
                .unwrap()
        };
        let t = table_on(Arc::new(open().0), |c| c.thin_provisioning = true);
        let a = nexus("iqn.a");
        ready(&t, &a);
        let secret = b"blockwire secret".repeat(4 * 512 / 16);
        assert_eq!(atomic(&t, &a, 8, &secret).status, GOOD);
        let holds_secret = || {
            let bytes = std::fs::read(&journal).unwrap();
            bytes.windows(16).any(|w| w == b"blockwire secret")
        };
        assert!(holds_secret(), "a done record keeps its data");
        let params = [1u8, 0, 0, 4, 0xde, 0xad, 0xbe, 0xef];
        let (cdb, data): (Vec<u8>, &[u8]) = match service_action {
            1 => (vec![0x48, 1, 0, 0, 0, 0, 0, 0, 8, 0], &params),
            _ => (vec![0x48, 2, 0, 0, 0, 0, 0, 0, 0, 0], &[]),
        };
        let done = run(&t, &a, &cdb, data, 0);
        assert_eq!(done.status, GOOD, "{:?}", done.sense);
        assert!(
            !holds_secret(),
            "service action {service_action:#x}: the journal still holds the atomic write after SANITIZE"
        );
        // The journal still journals.
        let again = vec![7u8; 2 * 512];
        assert_eq!(atomic(&t, &a, 100, &again).status, GOOD);
        assert_eq!(read(&t, &a, 100, 2).data_in, again);
        drop(t);
        let (reopened, replayed) = open();
        assert_eq!(replayed, 0);
        let mut got = vec![0u8; 2 * 512];
        reopened.read_at(100 * 512, &mut got).unwrap();
        assert_eq!(got, again);
    }
}
