//! Media command tests: VERIFY, WRITE AND VERIFY, COMPARE AND WRITE (also
//! under concurrency), ORWRITE, WRITE SAME, UNMAP, GET LBA STATUS,
//! PRE-FETCH, START STOP UNIT, PREVENT ALLOW, REPORT TARGET PORT GROUPS,
//! and a model-based property test of reads and writes.

use std::sync::Arc;

use blockwire_pdu::scsi::{
    Asc, Cdb, CdbSize, PrOutAction, PrOutData, PrOutParameters, Rw, SenseKey, UnmapDescriptor,
    UnmapList,
};
use proptest::prelude::*;

use super::read_write::VERIFY_PIECE;
use super::tests::*;
use super::*;

fn verify(t: &LunTable, n: &ItNexus, lba: u64, blocks: u32, bytchk: u8, data: &[u8]) -> ScsiResult {
    let cdb = c(Cdb::Verify {
        rw: rw(CdbSize::Ten, lba, blocks),
        bytchk,
    });
    run(t, n, &cdb, data, 0)
}

fn caw(t: &LunTable, n: &ItNexus, lba: u64, blocks: u8, data: &[u8]) -> ScsiResult {
    let cdb = c(Cdb::CompareAndWrite {
        lba,
        blocks,
        wrprotect: 0,
        dpo: false,
        fua: false,
        group: 0,
    });
    run(t, n, &cdb, data, 0)
}

fn write_same(
    t: &LunTable,
    n: &ItNexus,
    lba: u64,
    blocks: u32,
    unmap: bool,
    ndob: bool,
    anchor: bool,
    data: &[u8],
) -> ScsiResult {
    let cdb = c(Cdb::WriteSame {
        size: CdbSize::Sixteen,
        lba,
        blocks,
        wrprotect: 0,
        anchor,
        unmap,
        ndob,
        group: 0,
    });
    run(t, n, &cdb, data, 0)
}

fn lba_status(t: &LunTable, n: &ItNexus, lba: u64) -> Vec<(u64, u32, u8)> {
    let cdb = c(Cdb::GetLbaStatus {
        lba,
        allocation_length: 1024,
    });
    let r = run(t, n, &cdb, &[], 1024);
    assert_eq!(r.status, GOOD);
    r.data_in[8..]
        .chunks(16)
        .map(|d| {
            (
                u64::from_be_bytes(d[0..8].try_into().unwrap()),
                u32::from_be_bytes(d[8..12].try_into().unwrap()),
                d[12],
            )
        })
        .collect()
}

#[test]
fn verify_compares_and_reports_offset() {
    let t = table();
    let a = nexus("iqn.a");
    ready(&t, &a);
    let data: Vec<u8> = (0..1024).map(|i| i as u8).collect();
    assert_eq!(write(&t, &a, 4, &data).status, GOOD);
    assert_eq!(verify(&t, &a, 4, 2, 0, &[]).status, GOOD);
    assert_eq!(verify(&t, &a, 4, 2, 1, &data).status, GOOD);
    let mut bad = data.clone();
    bad[700] ^= 1;
    let s = expect_check(
        &verify(&t, &a, 4, 2, 1, &bad),
        SenseKey::Miscompare,
        Asc::MISCOMPARE_DURING_VERIFY,
    );
    assert_eq!(s.information, Some(700));
    // BYTCHK=3: one block against each block of the range.
    assert_eq!(write(&t, &a, 10, &[5; 1536]).status, GOOD);
    assert_eq!(verify(&t, &a, 10, 3, 3, &[5; 512]).status, GOOD);
    let s = expect_check(
        &verify(&t, &a, 9, 2, 3, &[5; 512]),
        SenseKey::Miscompare,
        Asc::MISCOMPARE_DURING_VERIFY,
    );
    assert_eq!(s.information, Some(0));
    expect_check(
        &verify(&t, &a, 2047, 2, 0, &[]),
        SenseKey::IllegalRequest,
        Asc::LBA_OUT_OF_RANGE,
    );
    // WRITE AND VERIFY writes.
    let cdb = c(Cdb::WriteAndVerify {
        rw: rw(CdbSize::Sixteen, 20, 1),
        bytchk: 1,
    });
    assert_eq!(run(&t, &a, &cdb, &[0x3c; 512], 0).status, GOOD);
    assert_eq!(read(&t, &a, 20, 1).data_in, vec![0x3c; 512]);
}

/// A VERIFY reads and compares its range a piece at a time: for BYTCHK 0
/// (no Data-Out) and 3 (one block of it) the largest VERIFY brings nothing
/// a budget counts, and its whole range was read into one buffer. A
/// miscompare in a later piece still names its byte in the whole range,
/// and a short BYTCHK 1 Data-Out is refused before the medium is read.
#[test]
fn a_verify_reads_its_range_a_piece_at_a_time() {
    use std::sync::atomic::Ordering::SeqCst;
    let whole = MAX_TRANSFER_BYTES as usize;
    let blocks = (whole / 512) as u32;
    let store = Arc::new(CountedReads::new(whole as u64 + (1 << 20)));
    let t = LunTable::new(vec![(
        0,
        Arc::new(LogicalUnit::new(LuConfig::new(store.clone()))),
    )]);
    let a = nexus("iqn.a");
    ready(&t, &a);
    let verify16 = |bytchk: u8, length: u32, out: &[u8]| {
        let cdb = c(Cdb::Verify {
            rw: rw(CdbSize::Sixteen, 0, length),
            bytchk,
        });
        run(&t, &a, &cdb, out, 0)
    };
    let reads = |f: &dyn Fn() -> ScsiResult| {
        let before = store.read.load(SeqCst);
        store.largest.store(0, SeqCst);
        let r = f();
        (
            r,
            store.read.load(SeqCst) - before,
            store.largest.load(SeqCst),
        )
    };
    for (bytchk, out) in [(0u8, vec![]), (3, vec![0u8; 512])] {
        let (r, read, largest) = reads(&|| verify16(bytchk, blocks, &out));
        assert_eq!(r.status, GOOD, "BYTCHK {bytchk}: {r:?}");
        assert_eq!(
            (read, largest),
            (whole as u64, VERIFY_PIECE as u64),
            "BYTCHK {bytchk}"
        );
    }
    // A block three pieces in differs: its byte in the range is reported.
    let at = 3 * VERIFY_PIECE + 5 * 512;
    assert_eq!(write(&t, &a, (at / 512) as u64, &[9; 512]).status, GOOD);
    let (r, _, largest) = reads(&|| verify16(3, blocks, &[0u8; 512]));
    let s = expect_check(&r, SenseKey::Miscompare, Asc::MISCOMPARE_DURING_VERIFY);
    assert_eq!(
        (s.information, largest),
        (Some(at as u64), VERIFY_PIECE as u64)
    );
    let mut out = vec![0u8; 4 * VERIFY_PIECE];
    out[at..at + 512].fill(9);
    out[at + 700] = 1;
    let (r, _, _) = reads(&|| verify16(1, (out.len() / 512) as u32, &out));
    let s = expect_check(&r, SenseKey::Miscompare, Asc::MISCOMPARE_DURING_VERIFY);
    assert_eq!(s.information, Some(at as u64 + 700));
    // A Data-Out one block short is refused before any block is read.
    let (r, read, _) = reads(&|| verify16(1, blocks, &vec![0u8; whole - 512]));
    assert_ne!(r.status, GOOD);
    assert_eq!(
        read, 0,
        "blocks read for a VERIFY whose Data-Out came short"
    );
}

/// A VERIFY with BYTCHK of unmapped blocks compares them as a READ returns
/// them (zeros, LBPRZ=1), and the unit says so by VBULS=1 in the Block
/// Device Characteristics page (SBC-4 6.6.2, 5.30): with VBULS=0, as it
/// said, such a VERIFY must end MISCOMPARE VERIFY OF UNMAPPED LBA instead.
#[test]
fn verify_of_unmapped_blocks_compares_zeros_as_vbuls_says() {
    let t = table();
    let a = nexus("iqn.a");
    ready(&t, &a);
    assert_eq!(verify(&t, &a, 100, 2, 1, &[0; 1024]).status, GOOD);
    let s = expect_check(
        &verify(&t, &a, 100, 1, 1, &[0xaa; 512]),
        SenseKey::Miscompare,
        Asc::MISCOMPARE_DURING_VERIFY,
    );
    assert_eq!(s.information, Some(0));
    let bdc = super::tests::vpd_page(&t, &a, 0xb1);
    assert_eq!(bdc.data_in[8] & 1, 1, "VBULS");
}

#[test]
fn compare_and_write_semantics() {
    let t = table();
    let a = nexus("iqn.a");
    ready(&t, &a);
    assert_eq!(write(&t, &a, 3, &[1; 1024]).status, GOOD);
    let mut d = vec![1u8; 1024];
    d.extend_from_slice(&[2; 1024]);
    assert_eq!(caw(&t, &a, 3, 2, &d).status, GOOD);
    assert_eq!(read(&t, &a, 3, 2).data_in, vec![2; 1024]);
    // Now the compare half no longer matches, at byte 0.
    let s = expect_check(
        &caw(&t, &a, 3, 2, &d),
        SenseKey::Miscompare,
        Asc::MISCOMPARE_DURING_VERIFY,
    );
    assert_eq!(s.information, Some(0));
    let mut d2 = vec![2u8; 1024];
    d2[600] = 9;
    d2.extend_from_slice(&[3; 1024]);
    let s = expect_check(
        &caw(&t, &a, 3, 2, &d2),
        SenseKey::Miscompare,
        Asc::MISCOMPARE_DURING_VERIFY,
    );
    assert_eq!(s.information, Some(600));
    assert_eq!(read(&t, &a, 3, 2).data_in, vec![2; 1024]);
    expect_check(
        &caw(&t, &a, 2047, 2, &[0; 2048]),
        SenseKey::IllegalRequest,
        Asc::LBA_OUT_OF_RANGE,
    );
    assert_eq!(caw(&t, &a, 0, 0, &[]).status, GOOD);
}

#[test]
fn compare_and_write_is_atomic_across_threads() {
    let t = Arc::new(table());
    let n = nexus("iqn.a");
    ready(&t, &n);
    assert_eq!(write(&t, &n, 0, &[0; 512]).status, GOOD);
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let t = t.clone();
            let n = nexus(&format!("iqn.t{i}"));
            std::thread::spawn(move || {
                ready(&t, &n);
                let mut wins = 0u64;
                for _ in 0..100 {
                    let cur = read(&t, &n, 0, 1).data_in;
                    let v = u64::from_be_bytes(cur[..8].try_into().unwrap());
                    let mut d = cur.clone();
                    d.extend_from_slice(&cur);
                    d[512..520].copy_from_slice(&(v + 1).to_be_bytes());
                    if caw(&t, &n, 0, 1, &d).status == GOOD {
                        wins += 1;
                    }
                    // Plain writes elsewhere run alongside.
                    assert_eq!(write(&t, &n, 1 + i, &[i as u8; 512]).status, GOOD);
                }
                wins
            })
        })
        .collect();
    let wins: u64 = threads.into_iter().map(|h| h.join().unwrap()).sum();
    let cur = read(&t, &n, 0, 1).data_in;
    assert_eq!(u64::from_be_bytes(cur[..8].try_into().unwrap()), wins);
}

#[test]
fn orwrite_ors_in() {
    let t = table();
    let a = nexus("iqn.a");
    ready(&t, &a);
    assert_eq!(write(&t, &a, 0, &[0x0f; 512]).status, GOOD);
    let cdb = c(Cdb::OrWrite16(rw(CdbSize::Sixteen, 0, 1)));
    assert_eq!(run(&t, &a, &cdb, &[0xf0; 512], 0).status, GOOD);
    assert_eq!(read(&t, &a, 0, 1).data_in, vec![0xff; 512]);
}

/// WRITE SAME with UNMAP deallocates the range whatever block is sent:
/// SBC-4 lets the device server either write the block or unmap each LBA,
/// and with LBPRZ=1 an unmapped LBA reads as zeros. libiscsi's
/// WriteSame10.UnmapUntilEnd sends its 0xFF data block with UNMAP and
/// expects zeros back; LIO answers the same way.
#[test]
fn write_same_with_unmap_deallocates_whatever_block_is_sent() {
    let t = table();
    let a = nexus("iqn.a");
    ready(&t, &a);
    let block = [0xffu8; 512];
    for (lba, blocks) in [(8, 16), (2000, 0)] {
        let n = if blocks == 0 {
            2048 - lba as u32
        } else {
            blocks
        };
        assert_eq!(write(&t, &a, lba, &block.repeat(n as usize)).status, GOOD);
        assert_eq!(
            write_same(&t, &a, lba, blocks, true, false, false, &block).status,
            GOOD
        );
        assert_eq!(read(&t, &a, lba, n).data_in, vec![0; n as usize * 512]);
        let (start, len, status) = lba_status(&t, &a, lba)[0];
        assert!(
            start == lba && len >= n && status == 1,
            "deallocated: {start} {len} {status}"
        );
    }
}

#[test]
fn write_same_unmap_and_lba_status() {
    let t = table();
    let a = nexus("iqn.a");
    ready(&t, &a);
    assert_eq!(
        write_same(&t, &a, 8, 16, false, false, false, &[0xab; 512]).status,
        GOOD
    );
    assert_eq!(read(&t, &a, 8, 16).data_in, vec![0xab; 16 * 512]);
    crate::copies::take_thread();
    assert_eq!(
        lba_status(&t, &a, 0)[..3],
        [(0, 8, 1), (8, 16, 0), (24, 2024, 1)]
    );
    assert_eq!(
        crate::copies::take_thread().user_copied,
        0,
        "GET LBA STATUS answers from the RAM store's allocation map, reading no data"
    );
    // UNMAP with a zero block deallocates.
    assert_eq!(
        write_same(&t, &a, 8, 4, true, false, false, &[0; 512]).status,
        GOOD
    );
    assert_eq!(lba_status(&t, &a, 8)[0], (8, 4, 1));
    // NDOB writes zeros.
    assert_eq!(
        write_same(&t, &a, 12, 2, false, true, false, &[]).status,
        GOOD
    );
    assert_eq!(read(&t, &a, 12, 2).data_in, vec![0; 1024]);
    // Without UNMAP the zeros are written: the blocks stay mapped, their
    // memory held (SBC-4: UNMAP=0 unmaps nothing), where the RAM store used
    // to free it, and GET LBA STATUS said deallocated. Initiators zero this
    // way when the space must stay theirs (`fallocate -z`).
    assert_eq!(
        write_same(&t, &a, 100, 8, false, false, false, &[0; 512]).status,
        GOOD
    );
    assert_eq!(lba_status(&t, &a, 100)[0], (100, 8, 0));
    assert_eq!(read(&t, &a, 100, 8).data_in, vec![0; 8 * 512]);
    // ANCHOR is refused; past the end too.
    let s = expect_check(
        &write_same(&t, &a, 0, 1, true, false, true, &[0; 512]),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
    assert_eq!(s.field_pointer().unwrap().byte, 1);
    // Zero blocks (WSNZ=0) reaches the end of the medium.
    assert_eq!(
        write_same(&t, &a, 2040, 0, false, false, false, &[0x5a; 512]).status,
        GOOD
    );
    assert_eq!(read(&t, &a, 2040, 8).data_in, vec![0x5a; 8 * 512]);
    expect_check(
        &write_same(&t, &a, 2049, 0, false, false, false, &[0; 512]),
        SenseKey::IllegalRequest,
        Asc::LBA_OUT_OF_RANGE,
    );
    // The Data-Out must be exactly one block.
    expect_check(
        &write_same(&t, &a, 0, 1, false, false, false, &[0; 1024]),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
    expect_check(
        &write_same(&t, &a, 0, 1, false, false, false, &[0; 256]),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
    expect_check(
        &write_same(&t, &a, 2047, 2, false, false, false, &[0; 512]),
        SenseKey::IllegalRequest,
        Asc::LBA_OUT_OF_RANGE,
    );
    // UNMAP.
    let list = UnmapList {
        descriptors: vec![
            UnmapDescriptor {
                lba: 14,
                blocks: 10,
            },
            UnmapDescriptor {
                lba: 100,
                blocks: 0,
            },
        ],
    }
    .encode();
    let cdb = c(Cdb::Unmap {
        anchor: false,
        group: 0,
        parameter_list_length: list.len() as u16,
    });
    assert_eq!(run(&t, &a, &cdb, &list, 0).status, GOOD);
    assert_eq!(read(&t, &a, 14, 10).data_in, vec![0; 5120]);
    let bad = UnmapList {
        descriptors: vec![UnmapDescriptor {
            lba: 2040,
            blocks: 9,
        }],
    }
    .encode();
    let cdb = c(Cdb::Unmap {
        anchor: false,
        group: 0,
        parameter_list_length: bad.len() as u16,
    });
    expect_check(
        &run(&t, &a, &cdb, &bad, 0),
        SenseKey::IllegalRequest,
        Asc::LBA_OUT_OF_RANGE,
    );
    expect_check(
        &run(
            &t,
            &a,
            &c(Cdb::GetLbaStatus {
                lba: 2048,
                allocation_length: 64,
            }),
            &[],
            64,
        ),
        SenseKey::IllegalRequest,
        Asc::LBA_OUT_OF_RANGE,
    );

    // A fully provisioned unit has no UNMAP.
    let full = table_with(|c| c.thin_provisioning = false);
    ready(&full, &a);
    expect_check(
        &run(&full, &a, &cdb, &bad, 0),
        SenseKey::IllegalRequest,
        Asc::INVALID_COMMAND_OPERATION_CODE,
    );
    expect_check(
        &write_same(&full, &a, 0, 1, true, false, false, &[0; 512]),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
    assert_eq!(lba_status(&full, &a, 0), vec![(0, 2048, 0)]);
}

#[test]
fn prefetch_start_stop_prevent_rtpg() {
    let t = table();
    let a = nexus("iqn.a");
    ready(&t, &a);
    let pf = |lba, blocks| {
        c(Cdb::PreFetch {
            size: CdbSize::Ten,
            immed: false,
            lba,
            blocks,
            group: 0,
        })
    };
    assert_eq!(run(&t, &a, &pf(0, 10), &[], 0).status, GOOD);
    expect_check(
        &run(&t, &a, &pf(2047, 2), &[], 0),
        SenseKey::IllegalRequest,
        Asc::LBA_OUT_OF_RANGE,
    );
    let ssu = |loej, start| {
        c(Cdb::StartStopUnit {
            immed: false,
            power_condition_modifier: 0,
            power_condition: 0,
            no_flush: false,
            loej,
            start,
        })
    };
    assert_eq!(run(&t, &a, &ssu(false, false), &[], 0).status, GOOD);
    assert_eq!(run(&t, &a, &ssu(false, true), &[], 0).status, GOOD);
    expect_check(
        &run(&t, &a, &ssu(true, false), &[], 0),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
    let pa = |prevent| c(Cdb::PreventAllowMediumRemoval { prevent });
    assert_eq!(run(&t, &a, &pa(1), &[], 0).status, GOOD);
    expect_check(
        &run(&t, &a, &ssu(true, false), &[], 0),
        SenseKey::IllegalRequest,
        Asc::MEDIUM_REMOVAL_PREVENTED,
    );
    t.nexus_lost(&a);
    ready(&t, &a);
    expect_check(
        &run(&t, &a, &ssu(true, false), &[], 0),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
    let cdb = c(Cdb::ReportTargetPortGroups {
        parameter_data_format: 0,
        allocation_length: 64,
    });
    let r = run(&t, &a, &cdb, &[], 64);
    assert_eq!(r.status, GOOD);
    assert_eq!(&r.data_in[..4], &[0, 0, 0, 12]);
    assert_eq!(&r.data_in[6..8], &[0, 1]);
    assert_eq!(&r.data_in[14..16], &[0, 1]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Random WRITE/READ/WRITE SAME/UNMAP sequences give the same bytes as
    /// a plain Vec<u8> model of the disk.
    #[test]
    fn media_matches_model(ops in proptest::collection::vec((0u8..4, 0u64..2048, 1u32..40, any::<u8>()), 1..40)) {
        let t = table();
        let a = nexus("iqn.a");
        ready(&t, &a);
        let mut model = vec![0u8; 1 << 20];
        for (kind, lba, blocks, fill) in ops {
            let blocks = blocks.min((2048 - lba) as u32);
            let range = (lba as usize * 512)..((lba as usize + blocks as usize) * 512);
            match kind {
                0 => {
                    let data: Vec<u8> = (0..blocks as usize * 512).map(|i| fill.wrapping_add(i as u8)).collect();
                    prop_assert_eq!(write(&t, &a, lba, &data).status, GOOD);
                    model[range].copy_from_slice(&data);
                }
                1 => {
                    let r = read(&t, &a, lba, blocks);
                    prop_assert_eq!(&r.data_in[..], &model[range]);
                }
                2 => {
                    prop_assert_eq!(write_same(&t, &a, lba, blocks, false, false, false, &[fill; 512]).status, GOOD);
                    model[range].fill(fill);
                }
                _ => {
                    let list = UnmapList { descriptors: vec![UnmapDescriptor { lba, blocks }] }.encode();
                    let cdb = c(Cdb::Unmap { anchor: false, group: 0, parameter_list_length: list.len() as u16 });
                    prop_assert_eq!(run(&t, &a, &cdb, &list, 0).status, GOOD);
                    model[range].fill(0);
                }
            }
        }
        let whole = (0..2048u64).step_by(64).flat_map(|l| read(&t, &a, l, 64).data_in).collect::<Vec<u8>>();
        prop_assert!(whole == model);
        let _ = Rw { size: CdbSize::Ten, lba: 0, length: 0, protect: 0, dpo: false, fua: false, group: 0 };
    }
}

/// A copy within one unit onto an overlapping range, later or earlier than
/// its source, leaves the destination holding the source's blocks as they
/// were before the copy, across the 1 MiB pieces it moves them in. Before,
/// a copy onto a later range overwrote source pieces before reading them.
#[test]
fn a_copy_onto_an_overlapping_range_of_its_own_unit_copies_the_blocks_as_they_were() {
    let blocks = 4096u64;
    let stamp = |lba: u64| (lba as u32).to_be_bytes().repeat(128);
    for (slba, dlba) in [(0u64, 1000u64), (1000, 0), (0, 2047), (10, 11)] {
        let t =
            table_with(|c| c.backstore = Arc::new(crate::backstore::RamBackstore::new(8 << 20)));
        let a = nexus("iqn.a");
        ready(&t, &a);
        let before: Vec<u8> = (0..6000).flat_map(stamp).collect();
        assert_eq!(write(&t, &a, 0, &before).status, GOOD);
        let unit = t.get(0).unwrap();
        super::xcopy::copy_segment(&a, &unit, &unit, slba, dlba, blocks).unwrap();
        let got = read(&t, &a, dlba, blocks as u32).data_in;
        for i in 0..blocks {
            let at = (i * 512) as usize;
            assert!(
                got[at..at + 512] == stamp(slba + i)[..],
                "{slba} -> {dlba}: destination block {} holds source block {}",
                dlba + i,
                u32::from_be_bytes(got[at..at + 4].try_into().unwrap())
            );
        }
    }
}

#[test]
fn extended_copy_between_units() {
    use blockwire_pdu::scsi::{Vpd, VpdPage};
    let mk = || {
        Arc::new(LogicalUnit::new({
            let mut c = LuConfig::new(Arc::new(crate::backstore::RamBackstore::new(1 << 20)));
            let (serial, naa) = stable_identity("iqn.t", 0);
            c.serial = serial;
            c.naa_id = naa;
            c
        }))
    };
    let u0 = mk();
    let u1 = Arc::new(LogicalUnit::new({
        let mut c = LuConfig::new(Arc::new(crate::backstore::RamBackstore::new(1 << 20)));
        let (serial, naa) = stable_identity("iqn.t", 1);
        c.serial = serial;
        c.naa_id = naa;
        c
    }));
    let t = LunTable::new(vec![(0, u0), (1, u1)]);
    let a = nexus("iqn.a");
    let on = |lun: u16, cdb: &[u8], out: &[u8], cap: u32| {
        t.execute(&ScsiRequest {
            lun,
            cdb,
            nexus: &a,
            task_tag: 1,
            attr: blockwire_pdu::pdu::codes::TaskAttr::Simple,
            data_out: out,
            data_in_capacity: cap,
            initiator_stats: None,
        })
    };
    for lun in [0, 1] {
        while on(lun, &c(Cdb::TestUnitReady), &[], 0).status != GOOD {}
    }
    let naa_of = |lun| {
        let r = on(
            lun,
            &c(Cdb::Inquiry {
                evpd: true,
                page_code: 0x83,
                allocation_length: 512,
            }),
            &[],
            512,
        );
        let VpdPage::DeviceIdentification(ds) = Vpd::decode(&r.data_in).unwrap().page else {
            panic!()
        };
        let mut d = ds[0].encode();
        d.resize(20, 0);
        d
    };
    let data: Vec<u8> = (0..8 * 512).map(|i| (i * 7) as u8).collect();
    assert_eq!(write(&t, &a, 100, &data).status, GOOD);
    let mut list = vec![0u8; 16];
    list[0] = 5; // list identifier
    list[2..4].copy_from_slice(&64u16.to_be_bytes());
    list[8..12].copy_from_slice(&28u32.to_be_bytes());
    for lun in [0, 1] {
        let mut cscd = vec![0xe4, 0, 0, 0];
        cscd.extend_from_slice(&naa_of(lun));
        cscd.extend_from_slice(&[0, 0, 0, 0, 0, 0, 2, 0]);
        list.extend_from_slice(&cscd);
    }
    let mut seg = vec![0x02, 0, 0, 0x18, 0, 0, 0, 1, 0, 0, 0, 8];
    seg.extend_from_slice(&100u64.to_be_bytes());
    seg.extend_from_slice(&7u64.to_be_bytes());
    list.extend_from_slice(&seg);
    let xc = c(Cdb::ExtendedCopy {
        service_action: 0,
        parameter_list_length: list.len() as u32,
    });
    let r = on(0, &xc, &list, 0);
    assert_eq!(r.status, GOOD, "{:?}", r.sense.as_ref().map(|_| sense(&r)));
    let back = on(
        1,
        &c(Cdb::Read {
            rw: rw(CdbSize::Ten, 7, 8),
            rarc: false,
        }),
        &[],
        4096,
    );
    assert_eq!(back.data_in, data);
    let st = on(
        0,
        &c(Cdb::ReceiveCopyResults {
            service_action: 0,
            list_identifier: 5,
            allocation_length: 64,
        }),
        &[],
        64,
    );
    assert_eq!(st.status, GOOD);
    assert_eq!(st.data_in[4], 1);
    assert_eq!(&st.data_in[8..12], &4096u32.to_be_bytes());
    let op = on(
        0,
        &c(Cdb::ReceiveCopyResults {
            service_action: 3,
            list_identifier: 0,
            allocation_length: 64,
        }),
        &[],
        64,
    );
    assert_eq!(op.status, GOOD);
    assert_eq!(&op.data_in[8..10], &16u16.to_be_bytes());
    // Past the end of the destination: COPY ABORTED.
    let n = list.len();
    list[n - 8..].copy_from_slice(&2045u64.to_be_bytes());
    let r = on(0, &xc, &list, 0);
    let s = expect_check(&r, SenseKey::CopyAborted, Asc::NO_ADDITIONAL_SENSE);
    // The copy target's reason travels in COMMAND-SPECIFIC INFORMATION.
    assert_eq!(s.command_specific, Some(0x2100));
    // An unknown unit.
    list[20] ^= 0xff;
    list[27] ^= 0xff;
    let r = on(0, &xc, &list, 0);
    assert_eq!(r.status, CHECK);
    // REPORT SUPPORTED OPERATION CODES lists it.
    let r = on(
        0,
        &c(Cdb::ReportSupportedOperationCodes {
            rctd: false,
            reporting_options: 2,
            requested_opcode: 0x83,
            requested_service_action: 0,
            allocation_length: 64,
        }),
        &[],
        64,
    );
    assert_eq!(r.data_in[1] & 7, 3);
}

#[test]
fn lba_status_from_the_map_spans_windows_and_stops_at_the_room_given() {
    // 8 MiB of RAM: runs longer than the first 1 MiB window the map is asked
    // about, so descriptors are carried across windows.
    let t = LunTable::new(vec![(
        0,
        Arc::new(LogicalUnit::new(LuConfig::new(Arc::new(
            crate::backstore::RamBackstore::new(8 << 20),
        )))),
    )]);
    let a = nexus("iqn.a");
    ready(&t, &a);
    for lba in [0u64, 2048, 4096] {
        assert_eq!(write(&t, &a, lba, &vec![7; 1 << 20]).status, GOOD);
    }
    assert_eq!(write(&t, &a, 12288, &[9; 512]).status, GOOD);
    assert_eq!(
        lba_status(&t, &a, 0),
        vec![
            (0, 6144, 0),
            (6144, 6144, 1),
            (12288, 1, 0),
            (12289, 4095, 1)
        ]
    );
    assert_eq!(
        lba_status(&t, &a, 6200),
        vec![(6200, 6088, 1), (12288, 1, 0), (12289, 4095, 1)]
    );
    // Room for one descriptor (as QEMU asks before a read): the run the LBA is in.
    let one = |lba| {
        let r = run(
            &t,
            &a,
            &c(Cdb::GetLbaStatus {
                lba,
                allocation_length: 24,
            }),
            &[],
            24,
        );
        assert_eq!(r.status, GOOD);
        (
            u64::from_be_bytes(r.data_in[8..16].try_into().unwrap()),
            u32::from_be_bytes(r.data_in[16..20].try_into().unwrap()),
            r.data_in[20],
        )
    };
    assert_eq!(one(100), (100, 6044, 0));
    assert_eq!(one(12288), (12288, 1, 0));
    assert_eq!(one(12289), (12289, 4095, 1));
}

#[test]
fn reads_and_lba_status_from_memory_are_the_normal_answers() {
    let t = table();
    let a = nexus("iqn.a");
    ready(&t, &a);
    assert_eq!(write(&t, &a, 8, &[3; 1024]).status, GOOD);
    let req = |n: &'static str, cdb: Vec<u8>, cap: u32| (nexus(n), cdb, cap);
    let here = |(n, cdb, cap): &(ItNexus, Vec<u8>, u32), max: u64| {
        t.execute_from_memory(
            &ScsiRequest {
                lun: 0,
                cdb,
                nexus: n,
                task_tag: 1,
                attr: blockwire_pdu::pdu::codes::TaskAttr::Simple,
                data_out: &[],
                data_in_capacity: *cap,
                initiator_stats: None,
            },
            max,
        )
    };
    let read = req(
        "iqn.a",
        c(Cdb::Read {
            rw: rw(CdbSize::Ten, 8, 2),
            rarc: false,
        }),
        1024,
    );
    let r = here(&read, 64 << 10).expect("answered at once");
    assert_eq!(
        r,
        run(&t, &a, &read.1, &[], 1024),
        "the normal path's answer"
    );
    assert_eq!(r.data_in, vec![3; 1024]);
    let gls = req(
        "iqn.a",
        c(Cdb::GetLbaStatus {
            lba: 8,
            allocation_length: 24,
        }),
        24,
    );
    let r = here(&gls, 64 << 10).expect("answered at once");
    assert_eq!(r, run(&t, &a, &gls.1, &[], 24));
    // Over the bound, another command, a stalled unit: left for a blocking thread.
    assert!(here(&read, 512).is_none());
    assert!(here(&req("iqn.a", c(Cdb::TestUnitReady), 0), 64 << 10).is_none());
    let lu = t.get(0).unwrap().clone();
    lu.set_stalled(true);
    assert!(here(&read, 64 << 10).is_none());
    lu.set_stalled(false);
    // A pending unit attention is the answer, as on the normal path.
    let fresh = req("iqn.b", read.1.clone(), 1024);
    let r = here(&fresh, 64 << 10).expect("answered at once");
    assert_eq!(sense(&r).key, SenseKey::UnitAttention);
}

/// RAM whose writes wait at a gate: each tells `entered`, then waits for
/// `go`.
#[derive(Debug)]
struct GatedWrites {
    ram: crate::backstore::RamBackstore,
    entered: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
    go: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl crate::backstore::Backstore for GatedWrites {
    fn size(&self) -> u64 {
        self.ram.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.ram.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let _ = self.entered.lock().unwrap().send(());
        let _ = self.go.lock().unwrap().recv();
        self.ram.write_at(offset, data)
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn describe(&self) -> String {
        "gated RAM".into()
    }
}

/// An EXTENDED COPY or WRITE USING TOKEN writing another unit counts there
/// as a command of its nexus in flight, as a WRITE it sent there would, so
/// a PREEMPT AND ABORT or LOGICAL UNIT RESET of that unit waits for the
/// piece being written; and once the nexus's registration is preempted the
/// copy writes no further piece there. Before, the copy was counted only on
/// the unit it was sent to, and a preemption of the destination answered
/// GOOD while the copy went on writing it.
#[test]
fn a_copy_into_another_unit_counts_there_and_stops_once_preempted() {
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel();
    let src = Arc::new(LogicalUnit::new(LuConfig::new(Arc::new(
        crate::backstore::RamBackstore::new(4 << 20),
    ))));
    let dst = Arc::new(LogicalUnit::new(LuConfig::new(Arc::new(GatedWrites {
        ram: crate::backstore::RamBackstore::new(4 << 20),
        entered: std::sync::Mutex::new(entered_tx),
        go: std::sync::Mutex::new(go_rx),
    }))));
    let a = nexus("iqn.copier");
    let copy = std::thread::spawn({
        let (src, dst, a) = (src.clone(), dst.clone(), a.clone());
        // Two 1 MiB pieces.
        move || super::xcopy::copy_segment(&a, &src, &dst, 0, 0, 4096)
    });
    entered.recv().unwrap();
    assert!(
        !dst.in_flight
            .wait_idle(&a, std::time::Duration::from_millis(20)),
        "the copy writing the destination is not counted there"
    );
    // The copier's nexus loses its access to the destination: a WRITE
    // EXCLUSIVE reservation of another nexus it is not registered for.
    let holder = nexus("iqn.holder");
    {
        let t = LunTable::new(vec![(0, dst.clone())]);
        ready(&t, &holder);
        let reg = PrOutData::Basic(PrOutParameters {
            service_action_key: 7,
            ..PrOutParameters::default()
        })
        .encode();
        let prout = |sa, ty: u8, data: &[u8]| {
            c(Cdb::PersistentReserveOut {
                service_action: sa,
                scope: 0,
                pr_type: ty,
                parameter_list_length: data.len() as u32,
            })
        };
        let r = run(&t, &holder, &prout(PrOutAction::Register, 0, &reg), &reg, 0);
        assert_eq!(r.status, GOOD);
        let resv = PrOutData::Basic(PrOutParameters {
            reservation_key: 7,
            ..PrOutParameters::default()
        })
        .encode();
        let r = run(
            &t,
            &holder,
            &prout(PrOutAction::Reserve, 1, &resv),
            &resv,
            0,
        );
        assert_eq!(r.status, GOOD);
    }
    go.send(()).unwrap();
    let done = copy.join().unwrap();
    assert_eq!(
        done,
        Err(super::outcome::Failure::Conflict),
        "the copy went on writing a unit it had lost"
    );
    assert!(
        entered.try_recv().is_err(),
        "a second piece was written after the reservation"
    );
    assert!(dst
        .in_flight
        .wait_idle(&a, std::time::Duration::from_secs(1)));
}
