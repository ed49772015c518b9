//! T10 protection information (Type 1) through the SCSI core: what a
//! protected unit reports, the tuples it generates, keeps and moves, the
//! checks RDPROTECT, WRPROTECT and VRPROTECT ask for, and corruption behind
//! the unit's back found on the next read.

use std::sync::Arc;

use blockwire_pdu::scsi::{
    crc16_t10dif, Asc, Cdb, CdbSize, PiTuple, ReadCapacity16, Rw, SenseKey, StandardInquiry, Vpd,
    VpdPage,
};

use super::read_plan::ReadPlan;
use super::stats::Direction;
use super::tests::{c, expect_check, nexus, ready, run, rw, unmap, write, CHECK, GOOD};
use super::*;
use crate::backstore::{Backstore, RamBackstore};

const BLOCKS: u64 = 2048;

/// A 1 MiB RAM unit formatted with Type 1 protection, and its data store.
fn protected() -> (LunTable, Arc<dyn Backstore>) {
    let store: Arc<dyn Backstore> = Arc::new(RamBackstore::new(BLOCKS * 512));
    let mut cfg = LuConfig::new(store.clone());
    cfg.pi_store = Some(Arc::new(RamBackstore::new(BLOCKS * 8)));
    let t = LunTable::new(vec![(0, Arc::new(LogicalUnit::new(cfg)))]);
    (t, store)
}

fn block(fill: u8) -> Vec<u8> {
    (0..512).map(|i| fill ^ (i as u8)).collect()
}

/// Blocks each followed by its tuple.
fn with_tuples(blocks: &[(Vec<u8>, PiTuple)]) -> Vec<u8> {
    blocks
        .iter()
        .flat_map(|(b, t)| b.iter().copied().chain(t.encode()))
        .collect()
}

fn read_p(t: &LunTable, n: &ItNexus, lba: u64, blocks: u32, protect: u8) -> ScsiResult {
    let cdb = c(Cdb::Read {
        rw: Rw {
            protect,
            ..rw(CdbSize::Sixteen, lba, blocks)
        },
        rarc: false,
    });
    run(t, n, &cdb, &[], blocks * 520)
}

fn write_p(t: &LunTable, n: &ItNexus, lba: u64, protect: u8, wire: &[u8]) -> ScsiResult {
    let cdb = c(Cdb::Write(Rw {
        protect,
        ..rw(CdbSize::Ten, lba, (wire.len() / 520) as u32)
    }));
    run(t, n, &cdb, wire, 0)
}

fn verify_p(
    t: &LunTable,
    n: &ItNexus,
    lba: u64,
    blocks: u32,
    protect: u8,
    bytchk: u8,
    out: &[u8],
) -> ScsiResult {
    let cdb = c(Cdb::Verify {
        rw: Rw {
            protect,
            ..rw(CdbSize::Sixteen, lba, blocks)
        },
        bytchk,
    });
    run(t, n, &cdb, out, 0)
}

/// The tuples of `blocks` blocks from `lba`, as RDPROTECT 011b (no
/// checks) returns them.
fn tuples(t: &LunTable, n: &ItNexus, lba: u64, blocks: u32) -> Vec<PiTuple> {
    let r = read_p(t, n, lba, blocks, 3);
    assert_eq!(r.status, GOOD, "{r:?}");
    r.data_in
        .chunks(520)
        .map(|u| PiTuple::decode(u[512..].try_into().unwrap()))
        .collect()
}

fn aborted_at(r: &ScsiResult, asc: Asc, lba: u64) {
    let s = expect_check(r, SenseKey::AbortedCommand, asc);
    assert_eq!(s.information, Some(lba), "{s:?}");
}

#[test]
fn a_protected_unit_says_so_where_initiators_look() {
    let (t, _) = protected();
    let a = nexus("iqn.a");
    ready(&t, &a);
    let inq = c(Cdb::Inquiry {
        evpd: false,
        page_code: 0,
        allocation_length: 96,
    });
    assert!(
        StandardInquiry::decode(&run(&t, &a, &inq, &[], 96).data_in)
            .unwrap()
            .protect
    );
    let rc = c(Cdb::ReadCapacity16 {
        lba: 0,
        allocation_length: 32,
        pmi: false,
    });
    let d = ReadCapacity16::decode(&run(&t, &a, &rc, &[], 32).data_in).unwrap();
    assert!(d.prot_en);
    assert_eq!((d.p_type, d.p_i_exponent, d.block_length), (0, 0, 512));
    let vpd = c(Cdb::Inquiry {
        evpd: true,
        page_code: 0x86,
        allocation_length: 64,
    });
    let VpdPage::ExtendedInquiry(x) = Vpd::decode(&run(&t, &a, &vpd, &[], 64).data_in)
        .unwrap()
        .page
    else {
        panic!("not the extended INQUIRY page");
    };
    assert_eq!(
        (x.spt, x.grd_chk, x.app_chk, x.ref_chk),
        (0, true, false, true)
    );
    // No atomic writes: data and tuples are two writes.
    let unit = t.get(0).unwrap();
    assert_eq!(unit.block_limits().max_atomic_transfer_length, 0);
    // The longest transfer it advertises fits the target's buffers (and the
    // fabric's largest command, of as many bytes) with the tuples.
    let most = u64::from(unit.block_limits().max_transfer_length);
    assert!(most * 520 <= u64::from(crate::scsi::logical_unit::MAX_TRANSFER_BYTES));
    assert_eq!(
        crate::iscsi::FabricSettings::default().max_io_bytes,
        crate::scsi::logical_unit::MAX_TRANSFER_BYTES
    );

    // An unprotected unit refuses every protection field and says none.
    let plain = super::tests::table();
    ready(&plain, &a);
    assert!(
        !StandardInquiry::decode(&run(&plain, &a, &inq, &[], 96).data_in)
            .unwrap()
            .protect
    );
    let r = read_p(&plain, &a, 0, 1, 1);
    expect_check(&r, SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB);
}

/// A READ or WRITE longer than the MAXIMUM TRANSFER LENGTH the unit
/// advertises is refused (SBC-4 6.6.4), counted with the tuples as
/// advertised: the bound held the bytes without them, so 64 528 blocks of
/// 512 passed where 64 527 were advertised.
#[test]
fn a_transfer_past_the_advertised_maximum_is_refused() {
    let (t, _) = protected();
    let a = nexus("iqn.a");
    ready(&t, &a);
    let most = t.get(0).unwrap().block_limits().max_transfer_length;
    for protect in [0, 1] {
        let r = read_p(&t, &a, 0, most + 1, protect);
        expect_check(&r, SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB);
    }
    // Within it, the range decides (this unit is 1 MiB).
    let r = read_p(&t, &a, 0, most, 1);
    expect_check(&r, SenseKey::IllegalRequest, Asc::LBA_OUT_OF_RANGE);
}

/// A failed command's transfer length, from which the residual is
/// reckoned, counts each block's tuple when the CDB asks for them, as a
/// good command's does: a failed WRITE(10) with WRPROTECT of one block and
/// an Expected Data Transfer Length of 520 had a residual of 8.
#[test]
fn a_failed_commands_transfer_length_counts_the_tuples() {
    let (t, _) = protected();
    let a = nexus("iqn.a");
    ready(&t, &a);
    let wire = with_tuples(&[(block(1), PiTuple::decode(&[0; 8]))]);
    let r = write_p(&t, &a, BLOCKS, 1, &wire);
    expect_check(&r, SenseKey::IllegalRequest, Asc::LBA_OUT_OF_RANGE);
    assert_eq!(r.transfer_length, 520);
    let r = read_p(&t, &a, BLOCKS, 2, 1);
    expect_check(&r, SenseKey::IllegalRequest, Asc::LBA_OUT_OF_RANGE);
    assert_eq!(r.transfer_length, 1040);
    // Without tuples asked for, blocks alone.
    let r = read_p(&t, &a, BLOCKS, 2, 0);
    assert_eq!(r.transfer_length, 1024);
}

#[test]
fn writes_without_tuples_get_generated_ones_and_unwritten_blocks_read_ff() {
    let (t, _) = protected();
    let a = nexus("iqn.a");
    ready(&t, &a);
    let data: Vec<u8> = [block(1), block(2)].concat();
    assert_eq!(write(&t, &a, 40, &data).status, GOOD);
    let r = read_p(&t, &a, 39, 4, 1);
    assert_eq!(r.status, GOOD, "{r:?}");
    assert_eq!(r.data_in.len(), 4 * 520);
    let got: Vec<PiTuple> = r
        .data_in
        .chunks(520)
        .map(|u| PiTuple::decode(u[512..].try_into().unwrap()))
        .collect();
    assert_eq!(got[0], PiTuple::UNWRITTEN);
    assert_eq!(
        got[1],
        PiTuple {
            guard: crc16_t10dif(&block(1)),
            app_tag: 0,
            ref_tag: 40
        }
    );
    assert_eq!(
        got[2],
        PiTuple {
            guard: crc16_t10dif(&block(2)),
            app_tag: 0,
            ref_tag: 41
        }
    );
    assert_eq!(got[3], PiTuple::UNWRITTEN);
    assert_eq!(&r.data_in[520..1032], &block(1)[..]);
    // RDPROTECT 000b: the user data alone, checked.
    let plain = super::tests::read(&t, &a, 40, 2);
    assert_eq!((plain.status, &plain.data_in[..]), (GOOD, &data[..]));
    // Every reserved RDPROTECT value is refused.
    for p in [6, 7] {
        expect_check(
            &read_p(&t, &a, 40, 1, p),
            SenseKey::IllegalRequest,
            Asc::INVALID_FIELD_IN_CDB,
        );
    }
}

#[test]
fn written_tuples_are_checked_first_then_kept_as_sent() {
    let (t, _) = protected();
    let a = nexus("iqn.a");
    ready(&t, &a);
    let good = |fill: u8, lba: u64| {
        let b = block(fill);
        let tuple = PiTuple {
            guard: crc16_t10dif(&b),
            app_tag: 0x1234,
            ref_tag: lba as u32,
        };
        (b, tuple)
    };
    // Application tags are the initiator's and come back unchanged.
    let wire = with_tuples(&[good(7, 100), good(8, 101)]);
    assert_eq!(write_p(&t, &a, 100, 1, &wire).status, GOOD);
    assert_eq!(tuples(&t, &a, 100, 2), vec![good(7, 100).1, good(8, 101).1]);

    // A bad guard in the second block: nothing of the command is written.
    let mut bad = good(9, 201);
    bad.1.guard ^= 1;
    let r = write_p(&t, &a, 200, 1, &with_tuples(&[good(9, 200), bad.clone()]));
    aborted_at(&r, Asc::LOGICAL_BLOCK_GUARD_CHECK_FAILED, 201);
    assert_eq!(tuples(&t, &a, 200, 2), vec![PiTuple::UNWRITTEN; 2]);
    assert!(super::tests::read(&t, &a, 200, 2)
        .data_in
        .iter()
        .all(|&b| b == 0));
    // A reference tag that is not the LBA.
    let r = write_p(&t, &a, 300, 1, &with_tuples(&[good(9, 301)]));
    aborted_at(&r, Asc::LOGICAL_BLOCK_REFERENCE_TAG_CHECK_FAILED, 300);
    // WRPROTECT 010b leaves the guard alone, 100b the reference tag.
    assert_eq!(
        write_p(&t, &a, 200, 2, &with_tuples(&[good(9, 200), bad.clone()])).status,
        GOOD
    );
    assert_eq!(
        write_p(&t, &a, 300, 4, &with_tuples(&[good(9, 301)])).status,
        GOOD
    );
    // What was kept unchecked is checked by the next plain READ.
    aborted_at(
        &super::tests::read(&t, &a, 200, 2),
        Asc::LOGICAL_BLOCK_GUARD_CHECK_FAILED,
        201,
    );
    aborted_at(
        &super::tests::read(&t, &a, 300, 1),
        Asc::LOGICAL_BLOCK_REFERENCE_TAG_CHECK_FAILED,
        300,
    );
    // The application tag escape turns the checks off.
    let escaped = (
        block(3),
        PiTuple {
            guard: 0,
            app_tag: 0xFFFF,
            ref_tag: 0,
        },
    );
    assert_eq!(
        write_p(&t, &a, 400, 1, &with_tuples(&[escaped])).status,
        GOOD
    );
    assert_eq!(super::tests::read(&t, &a, 400, 1).status, GOOD);
    // A Data-Out cut inside a block and its tuple.
    let r = write_p(&t, &a, 100, 1, &wire[..600]);
    let cdb = c(Cdb::Write(Rw {
        protect: 1,
        ..rw(CdbSize::Ten, 100, 2)
    }));
    let cut = run(&t, &a, &cdb, &wire[..600], 0);
    assert_eq!(r.status, GOOD, "one whole block and tuple arrived: {r:?}");
    expect_check(
        &cut,
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_COMMAND_INFORMATION_UNIT,
    );
}

/// A READ with RDPROTECT moves 520 bytes a block, the tuple after the
/// data (SBC-4 4.22.2): its transfer length counts them, whether the
/// initiator takes all of it or part, and the blocks it takes are read
/// whole with their tuples. Counted at 512 bytes a block, the transfer
/// was cut 8 bytes a block short, the last block's tuple lost.
#[test]
fn a_protected_reads_transfer_counts_each_blocks_tuple() {
    let (t, _) = protected();
    let a = nexus("iqn.a");
    ready(&t, &a);
    let data: Vec<u8> = [block(1), block(2), block(3)].concat();
    assert_eq!(write(&t, &a, 20, &data).status, GOOD);
    let whole = read_p(&t, &a, 20, 3, 1);
    assert_eq!(whole.status, GOOD, "{whole:?}");
    assert_eq!(whole.transfer_length, 3 * 520);
    assert_eq!(whole.data_in.len(), 3 * 520);
    let cdb = c(Cdb::Read {
        rw: Rw {
            protect: 1,
            ..rw(CdbSize::Sixteen, 20, 3)
        },
        rarc: false,
    });
    let part = run(&t, &a, &cdb, &[], 520 + 1);
    assert_eq!(part.status, GOOD, "{part:?}");
    assert_eq!(part.transfer_length, 3 * 520, "the CDB's whole transfer");
    assert_eq!(part.data_in.len(), 520 + 1);
    assert_eq!(part.data_in[..520], whole.data_in[..520]);
}

#[test]
fn a_block_changed_behind_the_unit_fails_its_guard_check_on_read() {
    let (t, store) = protected();
    let a = nexus("iqn.a");
    ready(&t, &a);
    let data: Vec<u8> = [block(4), block(5), block(6)].concat();
    assert_eq!(write(&t, &a, 10, &data).status, GOOD);
    // One bit flipped on the medium, not through the unit.
    let mut b = [0u8; 1];
    store.read_at(11 * 512 + 100, &mut b).unwrap();
    store.write_at(11 * 512 + 100, &[b[0] ^ 0x10]).unwrap();
    aborted_at(
        &super::tests::read(&t, &a, 10, 3),
        Asc::LOGICAL_BLOCK_GUARD_CHECK_FAILED,
        11,
    );
    aborted_at(
        &read_p(&t, &a, 10, 3, 1),
        Asc::LOGICAL_BLOCK_GUARD_CHECK_FAILED,
        11,
    );
    // VERIFY finds it too, with and without a compare.
    aborted_at(
        &verify_p(&t, &a, 10, 3, 0, 0, &[]),
        Asc::LOGICAL_BLOCK_GUARD_CHECK_FAILED,
        11,
    );
    aborted_at(
        &verify_p(&t, &a, 10, 3, 0, 1, &data),
        Asc::LOGICAL_BLOCK_GUARD_CHECK_FAILED,
        11,
    );
    // RDPROTECT 010b and 011b do not check the guard: the data as it is.
    for p in [2, 3] {
        let r = read_p(&t, &a, 10, 3, p);
        assert_eq!(r.status, GOOD, "RDPROTECT {p}: {r:?}");
        assert_ne!(&r.data_in[520..1032], &block(5)[..]);
    }
    assert_eq!(verify_p(&t, &a, 10, 3, 3, 0, &[]).status, GOOD);
    // Blocks around it still read.
    assert_eq!(super::tests::read(&t, &a, 10, 1).status, GOOD);
    assert_eq!(super::tests::read(&t, &a, 12, 1).status, GOOD);
    // COMPARE AND WRITE reads through the same checks.
    let caw = c(Cdb::CompareAndWrite {
        lba: 11,
        blocks: 1,
        wrprotect: 0,
        dpo: false,
        fua: false,
        group: 0,
    });
    let r = run(
        &t,
        &a,
        &caw,
        &[data[512..1024].to_vec(), block(9)].concat(),
        0,
    );
    aborted_at(&r, Asc::LOGICAL_BLOCK_GUARD_CHECK_FAILED, 11);
    // Rewriting the block heals it.
    assert_eq!(write(&t, &a, 11, &block(5)).status, GOOD);
    assert_eq!(super::tests::read(&t, &a, 10, 3).status, GOOD);
}

#[test]
fn verify_with_tuples_checks_the_sent_ones_and_compares_the_data() {
    let (t, _) = protected();
    let a = nexus("iqn.a");
    ready(&t, &a);
    assert_eq!(
        write(&t, &a, 60, &[block(1), block(2)].concat()).status,
        GOOD
    );
    let sent = |g: u16| {
        with_tuples(&[
            (block(1), PiTuple::generate(&block(1), 60)),
            (
                block(2),
                PiTuple {
                    guard: g,
                    app_tag: 0,
                    ref_tag: 61,
                },
            ),
        ])
    };
    let right = crc16_t10dif(&block(2));
    assert_eq!(verify_p(&t, &a, 60, 2, 1, 1, &sent(right)).status, GOOD);
    aborted_at(
        &verify_p(&t, &a, 60, 2, 1, 1, &sent(right ^ 4)),
        Asc::LOGICAL_BLOCK_GUARD_CHECK_FAILED,
        61,
    );
    // VRPROTECT 011b checks nothing sent; the data still compare.
    assert_eq!(verify_p(&t, &a, 60, 2, 3, 1, &sent(right ^ 4)).status, GOOD);
    let mut other = sent(right);
    other[520 + 7] ^= 1;
    let r = verify_p(&t, &a, 60, 2, 3, 1, &other);
    assert_eq!(r.status, CHECK);
    let s = super::tests::sense(&r);
    assert_eq!(s.key, SenseKey::Miscompare);
    // The offset of the differing byte in the Data-Out Buffer, tuples
    // counted (it was 519, as if they were not there).
    assert_eq!(s.information, Some(527));
}

#[test]
fn unmap_and_write_same_keep_tuples_with_their_blocks() {
    let (t, _) = protected();
    let a = nexus("iqn.a");
    ready(&t, &a);
    assert_eq!(write(&t, &a, 0, &vec![0x33; 8 * 512]).status, GOOD);
    assert_eq!(unmap(&t, &a, 2, 2).status, GOOD);
    let got = tuples(&t, &a, 1, 4);
    assert_eq!(got[0].ref_tag, 1);
    assert_eq!(&got[1..3], &[PiTuple::UNWRITTEN; 2]);
    assert_eq!(got[3].ref_tag, 4);
    let same = |lba: u64, blocks: u32, data: &[u8], wrprotect: u8| {
        let cdb = c(Cdb::WriteSame {
            size: CdbSize::Sixteen,
            lba,
            blocks,
            wrprotect,
            anchor: false,
            unmap: false,
            ndob: false,
            group: 0,
        });
        run(&t, &a, &cdb, data, 0)
    };
    // Zeros (written without moving bytes) and a pattern: tuples for each.
    assert_eq!(same(100, 3, &[0; 512], 0).status, GOOD);
    assert_eq!(same(200, 3, &block(7), 0).status, GOOD);
    for (lba, b) in [(100, [0u8; 512].to_vec()), (200, block(7))] {
        let got = tuples(&t, &a, lba, 3);
        for (i, g) in got.iter().enumerate() {
            assert_eq!(*g, PiTuple::generate(&b, lba + i as u64));
        }
    }
    assert_eq!(super::tests::read(&t, &a, 100, 3).status, GOOD);
    // Without a Data-Out (NDOB) the blocks are zeros whose protection
    // information is all FFh (SBC-4 WRITE SAME(16)), over what was there.
    assert_eq!(write(&t, &a, 300, &vec![0x44; 4 * 512]).status, GOOD);
    let cdb = c(Cdb::WriteSame {
        size: CdbSize::Sixteen,
        lba: 300,
        blocks: 4,
        wrprotect: 0,
        anchor: false,
        unmap: false,
        ndob: true,
        group: 0,
    });
    assert_eq!(run(&t, &a, &cdb, &[], 0).status, GOOD);
    assert_eq!(tuples(&t, &a, 300, 4), [PiTuple::UNWRITTEN; 4]);
    assert_eq!(super::tests::read(&t, &a, 300, 4).data_in, vec![0; 4 * 512]);
    // WRITE SAME's WRPROTECT is not taken (documented): refused, not ignored.
    expect_check(
        &same(300, 1, &block(7), 1),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
}

/// A command of `n` to LUN 0.
fn request<'a>(
    n: &'a ItNexus,
    cdb: &'a [u8],
    data_out: &'a [u8],
    capacity: u32,
) -> ScsiRequest<'a> {
    ScsiRequest {
        lun: 0,
        cdb,
        nexus: n,
        task_tag: 1,
        attr: blockwire_pdu::pdu::codes::TaskAttr::Simple,
        data_out,
        data_in_capacity: capacity,
        initiator_stats: None,
    }
}

/// The planned READ of blocks `lba..lba + blocks` with RDPROTECT
/// `protect`, as the fabric asks for it.
fn plan(t: &LunTable, n: &ItNexus, lba: u64, blocks: u32, protect: u8) -> ReadPlan {
    let cdb = c(Cdb::Read {
        rw: Rw {
            protect,
            ..rw(CdbSize::Ten, lba, blocks)
        },
        rarc: false,
    });
    let req = request(n, &cdb, &[], blocks * 520);
    t.plan_read(&req)
}

#[test]
fn the_fabric_gets_a_protected_units_reads_only_to_have_the_core_check_them() {
    let (t, store) = protected();
    let a = nexus("iqn.a");
    ready(&t, &a);
    let data: Vec<u8> = (0..8u8).flat_map(block).collect();
    assert_eq!(write(&t, &a, 16, &data).status, GOOD);
    let ReadPlan::Checked(p) = plan(&t, &a, 16, 8, 0) else {
        panic!("a protected unit's READ is planned as checked, never as a plain read");
    };
    let here =
        p.lu.read_checked_without_waiting(&p, 4096)
            .expect("RAM never waits");
    let normal = super::tests::read(&t, &a, 16, 8);
    assert_eq!((here.status, &here.data_in), (GOOD, &data));
    assert_eq!(
        (
            here.status,
            &here.sense,
            &here.data_in,
            here.transfer_length
        ),
        (
            normal.status,
            &normal.sense,
            &normal.data_in,
            normal.transfer_length
        )
    );
    // At most the initiator's buffer, the length the CDB asked for.
    let short = p.lu.read_checked(&p, 1000);
    assert_eq!((short.data_in.len(), short.transfer_length), (1000, 4096));
    drop(p);
    // A READ that moves tuples is the core's whole.
    assert!(matches!(plan(&t, &a, 16, 8, 3), ReadPlan::NotPlanned));

    // A block changed behind the unit: the check the normal path makes.
    let mut b = [0u8; 1];
    store.read_at(19 * 512 + 7, &mut b).unwrap();
    store.write_at(19 * 512 + 7, &[b[0] ^ 1]).unwrap();
    let before = t.get(0).unwrap().pi_check_failures().guard;
    let ReadPlan::Checked(p) = plan(&t, &a, 16, 8, 0) else {
        panic!("planned as checked");
    };
    let here = p.lu.read_checked_without_waiting(&p, 4096).unwrap();
    aborted_at(&here, Asc::LOGICAL_BLOCK_GUARD_CHECK_FAILED, 19);
    assert!(here.data_in.is_empty());
    assert_eq!(here.sense, super::tests::read(&t, &a, 16, 8).sense);
    assert_eq!(t.get(0).unwrap().pi_check_failures().guard, before + 2);
}

/// A planned READ of a protected unit, answered by the core's check,
/// reads only the blocks its initiator takes, as the core's own READ does:
/// the fabric's READ budget share for it counts those bytes, and the rest
/// of the CDB's transfer would be cut before it is sent.
#[test]
fn a_planned_protected_read_reads_only_the_blocks_its_initiator_takes() {
    use std::sync::atomic::Ordering::SeqCst;
    let store = Arc::new(super::tests::CountedReads::new(BLOCKS * 512));
    let mut cfg = LuConfig::new(store.clone());
    cfg.pi_store = Some(Arc::new(RamBackstore::new(BLOCKS * 8)));
    let t = LunTable::new(vec![(0, Arc::new(LogicalUnit::new(cfg)))]);
    let a = nexus("iqn.a");
    ready(&t, &a);
    let data: Vec<u8> = (0..4u8).flat_map(block).collect();
    assert_eq!(write(&t, &a, 0, &data).status, GOOD);
    for (taken, blocks_read) in [(1u32, 1u64), (512, 1), (513, 2), (0, 0), (1024 * 512, 1024)] {
        let ReadPlan::Checked(p) = plan(&t, &a, 0, 1024, 0) else {
            panic!("a protected unit's READ is planned as checked");
        };
        let before = store.read.load(SeqCst);
        let r = p.lu.read_checked(&p, taken);
        assert_eq!(r.status, GOOD, "{taken}: {r:?}");
        assert_eq!(r.transfer_length, 1024 * 512, "{taken}: the CDB's transfer");
        assert_eq!(r.data_in.len(), taken as usize);
        let written = (taken as usize).min(data.len());
        assert_eq!(r.data_in[..written], data[..written]);
        assert_eq!(
            store.read.load(SeqCst) - before,
            blocks_read * 512,
            "{taken} bytes taken"
        );
    }
}

#[test]
fn a_ram_units_reads_are_answered_from_memory_with_their_checks() {
    let (t, store) = protected();
    let a = nexus("iqn.a");
    ready(&t, &a);
    let data: Vec<u8> = (0..4u8).flat_map(block).collect();
    assert_eq!(write(&t, &a, 0, &data).status, GOOD);
    store.write_at(2 * 512, &[0xa5]).unwrap();
    let cdb = c(Cdb::Read {
        rw: rw(CdbSize::Ten, 0, 4),
        rarc: false,
    });
    let req = request(&a, &cdb, &[], 2048);
    let here = t
        .execute_from_memory(&req, 1 << 20)
        .expect("tuples in memory too");
    aborted_at(&here, Asc::LOGICAL_BLOCK_GUARD_CHECK_FAILED, 2);
}

#[test]
fn a_file_units_reads_are_answered_at_once_only_from_the_page_cache() {
    use crate::backstore::FileBackstore;
    use std::sync::atomic::Ordering::Relaxed;
    // A device's file system (Debian never mounts /var/tmp in memory).
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let (data_path, tuples_path) = (dir.path().join("lun"), dir.path().join("lun.protection"));
    let store: Arc<dyn Backstore> =
        Arc::new(FileBackstore::open(&data_path, Some(BLOCKS * 512), false).unwrap());
    let mut cfg = LuConfig::new(store.clone());
    cfg.pi_store = Some(Arc::new(
        FileBackstore::open(&tuples_path, Some(BLOCKS * 8), false).unwrap(),
    ));
    let t = LunTable::new(vec![(0, Arc::new(LogicalUnit::new(cfg)))]);
    let a = nexus("iqn.a");
    ready(&t, &a);
    let data: Vec<u8> = (0..8u8).flat_map(block).collect();
    assert_eq!(write(&t, &a, 64, &data).status, GOOD);
    let cdb = c(Cdb::Read {
        rw: rw(CdbSize::Ten, 64, 8),
        rarc: false,
    });
    let req = request(&a, &cdb, &[], 4096);
    let reads = || {
        t.get(0)
            .unwrap()
            .stats
            .direction(Direction::Read)
            .commands
            .load(Relaxed)
    };
    // Just written, so cached; a page the flusher holds locked for writeback
    // makes a non-blocking read give up for the moment, so ask a few times.
    let here = (0..50)
        .find_map(|_| {
            t.execute_from_memory(&req, 64 << 10).or_else(|| {
                std::thread::sleep(std::time::Duration::from_millis(20));
                None
            })
        })
        .expect("just written: cached");
    assert_eq!((here.status, &here.data_in), (GOOD, &data));
    assert_eq!(reads(), 1);
    // Larger than the caller takes at once.
    assert!(t.execute_from_memory(&req, 2048).is_none());
    // Out of the page cache: left to a thread that may wait, counted by it.
    store.flush().unwrap();
    let unit = t.get(0).unwrap();
    unit.config().pi_store.as_ref().unwrap().flush().unwrap();
    for path in [&data_path, &tuples_path] {
        rustix::fs::fadvise(
            std::fs::File::open(path).unwrap(),
            0,
            None,
            rustix::fs::Advice::DontNeed,
        )
        .unwrap();
    }
    assert!(t.execute_from_memory(&req, 64 << 10).is_none());
    assert_eq!(reads(), 1, "a READ given up is not counted");
    assert_eq!(t.execute(&req).data_in, data);
    assert_eq!(reads(), 2);
}

#[test]
fn small_writes_done_without_waiting_generate_their_tuples() {
    let (t, _) = protected();
    let a = nexus("iqn.a");
    ready(&t, &a);
    let data: Vec<u8> = (0..4u8).flat_map(|i| block(i + 40)).collect();
    let attempt = |protect: u8, data: &[u8]| {
        let cdb = c(Cdb::Write(Rw {
            protect,
            ..rw(CdbSize::Ten, 100, 4)
        }));
        let req = request(&a, &cdb, data, 0);
        t.write_without_waiting(&req, 64 << 10)
    };
    assert_eq!(
        attempt(0, &data).expect("RAM takes it at once").status,
        GOOD
    );
    let generated: Vec<PiTuple> = data
        .chunks(512)
        .enumerate()
        .map(|(i, b)| PiTuple::generate(b, 100 + i as u64))
        .collect();
    assert_eq!(tuples(&t, &a, 100, 4), generated);
    assert_eq!(super::tests::read(&t, &a, 100, 4).data_in, data);
    // Tuples sent with the blocks are checked by the core.
    let sent = with_tuples(
        &data
            .chunks(512)
            .zip(&generated)
            .map(|(b, t)| (b.to_vec(), *t))
            .collect::<Vec<_>>(),
    );
    assert!(attempt(1, &sent).is_none());
}

#[test]
fn a_read_beside_a_write_of_the_same_blocks_never_fails_its_checks() {
    // SBC-4 leaves the data of overlapping commands to their order, but
    // each block with its tuple is one unit: a READ that ran between a
    // WRITE's blocks and its tuples would report a guard check failure
    // that no medium holds.
    let (t, _) = protected();
    let t = Arc::new(t);
    let a = nexus("iqn.a");
    ready(&t, &a);
    let (one, two): (Vec<u8>, Vec<u8>) = (
        (0..8u8).flat_map(block).collect(),
        (0..8u8).flat_map(|i| block(i + 100)).collect(),
    );
    assert_eq!(write(&t, &a, 0, &one).status, GOOD);
    let three: Vec<u8> = (0..8u8).flat_map(|i| block(i + 200)).collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Two writers of the same blocks: neither may leave its blocks with
    // the other's tuples.
    let writers: Vec<_> = [vec![two.clone(), one.clone()], vec![three.clone()]]
        .into_iter()
        .map(|datas| {
            let (t, a, stop) = (t.clone(), a.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for d in &datas {
                        assert_eq!(write(&t, &a, 0, d).status, GOOD);
                    }
                }
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let mut reads = 0u32;
    while std::time::Instant::now() < deadline {
        let r = super::tests::read(&t, &a, 0, 8);
        assert_eq!(
            r.status, GOOD,
            "READ {reads} beside the WRITEs: {:?}",
            r.sense
        );
        assert!([&one, &two, &three].contains(&&r.data_in));
        reads += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    let last = super::tests::read(&t, &a, 0, 8);
    assert_eq!(last.status, GOOD, "after the WRITEs: {:?}", last.sense);
}

#[test]
fn resizing_grows_the_tuples_with_the_blocks() {
    let (t, _) = protected();
    let a = nexus("iqn.a");
    ready(&t, &a);
    let unit = t.get(0).unwrap();
    unit.resize(2 * BLOCKS * 512).unwrap();
    let pi = unit.config().pi_store.clone().unwrap();
    assert_eq!(pi.size(), 2 * BLOCKS * 8);
    let last = 2 * BLOCKS - 1;
    super::tests::run(&t, &a, &c(Cdb::TestUnitReady), &[], 0);
    assert_eq!(write(&t, &a, last, &block(1)).status, GOOD);
    assert_eq!(
        tuples(&t, &a, last, 1)[0],
        PiTuple::generate(&block(1), last)
    );
}

/// An EXTENDED COPY (LID1) parameter list copying `blocks` blocks from
/// `slba` to `dlba` within the unit whose VPD 83h NAA designator is `naa`.
fn copy_within(naa: &[u8], slba: u64, dlba: u64, blocks: u16) -> Vec<u8> {
    let mut list = vec![0u8; 16];
    list[0] = 9; // list identifier
    list[2..4].copy_from_slice(&64u16.to_be_bytes()); // two CSCDs
    list[8..12].copy_from_slice(&28u32.to_be_bytes()); // one segment
    for _ in 0..2 {
        let mut cscd = vec![0xe4, 0, 0, 0];
        let mut d = naa.to_vec();
        d.resize(20, 0);
        cscd.extend_from_slice(&d);
        cscd.extend_from_slice(&[0, 0, 0, 0, 0, 0, 2, 0]); // 512-byte blocks
        list.extend_from_slice(&cscd);
    }
    // Block to block (02h), source CSCD 0, destination CSCD 1.
    let mut seg = vec![0x02, 0, 0, 0x18, 0, 0, 0, 1, 0, 0];
    seg.extend_from_slice(&blocks.to_be_bytes());
    seg.extend_from_slice(&slba.to_be_bytes());
    seg.extend_from_slice(&dlba.to_be_bytes());
    list.extend_from_slice(&seg);
    list
}

#[test]
fn extended_copy_checks_the_source_and_generates_the_destinations_tuples() {
    let (t, store) = protected();
    let a = nexus("iqn.a");
    ready(&t, &a);
    // The designator VPD 83h reports, which the copy's CSCDs name.
    let naa = t.get(0).expect("LUN 0").naa_designator_full().encode();
    let data: Vec<u8> = (0..4).flat_map(|i| block(0x40 + i)).collect();
    assert_eq!(write(&t, &a, 20, &data).status, GOOD);
    let xcopy = |list: &[u8]| {
        let cdb = c(Cdb::ExtendedCopy {
            service_action: 0,
            parameter_list_length: list.len() as u32,
        });
        run(&t, &a, &cdb, list, 0)
    };
    // A clean copy: the destination's tuples name the destination's LBAs.
    let r = xcopy(&copy_within(&naa, 20, 300, 4));
    assert_eq!(r.status, GOOD, "{r:?}");
    let copied = tuples(&t, &a, 300, 4);
    for (i, tuple) in copied.iter().enumerate() {
        let b = &data[i * 512..(i + 1) * 512];
        assert_eq!(
            (tuple.guard, tuple.ref_tag),
            (crc16_t10dif(b), 300 + i as u32)
        );
    }
    // One bit flipped behind the unit in the source's third block: the copy
    // stops as COPY ABORTED with the guard check's code and that LBA, and
    // nothing of it reaches the destination.
    let mut b = [0u8; 1];
    store.read_at(22 * 512 + 7, &mut b).unwrap();
    store.write_at(22 * 512 + 7, &[b[0] ^ 0x01]).unwrap();
    let r = xcopy(&copy_within(&naa, 20, 600, 4));
    let s = expect_check(
        &r,
        SenseKey::CopyAborted,
        Asc::LOGICAL_BLOCK_GUARD_CHECK_FAILED,
    );
    assert_eq!(s.information, Some(22), "{s:?}");
    assert_eq!(super::tests::read(&t, &a, 600, 4).data_in, vec![0u8; 2048]);
    assert!(tuples(&t, &a, 600, 4).iter().all(|t| t.app_tag == 0xFFFF));
}
