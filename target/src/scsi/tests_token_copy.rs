//! Token-based copy (ODX) through the core: POPULATE TOKEN, RECEIVE ROD
//! TOKEN INFORMATION and WRITE USING TOKEN between the units of one table.

use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_pdu::scsi::opcode::copy_out;
use blockwire_pdu::scsi::{Asc, Cdb, CdbSize, PrOutAction, SenseKey, Vpd, VpdPage};
use proptest::prelude::*;

use super::tests::*;
use super::token_copy::*;
use super::*;

fn unit(lun: u16) -> Arc<LogicalUnit> {
    let mut c = LuConfig::new(Arc::new(crate::backstore::RamBackstore::new(1 << 20)));
    let (serial, naa) = stable_identity("iqn.t", lun);
    c.serial = serial;
    c.naa_id = naa;
    Arc::new(LogicalUnit::new(c))
}

/// A table of two 1 MiB RAM units (LUN 0 and 1), both past their power-on
/// unit attention for the nexuses given.
fn two_units(hosts: &[&ItNexus]) -> LunTable {
    let t = LunTable::new(vec![(0, unit(0)), (1, unit(1))]);
    for n in hosts {
        for lun in [0, 1] {
            while on(&t, n, lun, &c(Cdb::TestUnitReady), &[], 0).status != GOOD {}
        }
    }
    t
}

fn write_at(t: &LunTable, n: &ItNexus, lun: u16, lba: u64, data: &[u8]) {
    let cdb = c(Cdb::Write(rw(
        CdbSize::Sixteen,
        lba,
        (data.len() / 512) as u32,
    )));
    assert_eq!(on(t, n, lun, &cdb, data, 0).status, GOOD);
}

fn read_at(t: &LunTable, n: &ItNexus, lun: u16, lba: u64, blocks: u32) -> Vec<u8> {
    let cdb = c(Cdb::Read {
        rw: rw(CdbSize::Sixteen, lba, blocks),
        rarc: false,
    });
    let r = on(t, n, lun, &cdb, &[], blocks * 512);
    assert_eq!(r.status, GOOD);
    r.data_in
}

fn ranges(list: &[(u64, u32)]) -> Vec<BlockRange> {
    list.iter()
        .map(|&(lba, blocks)| BlockRange { lba, blocks })
        .collect()
}

fn populate(t: &LunTable, n: &ItNexus, lun: u16, list_id: u32, r: &[(u64, u32)]) -> ScsiResult {
    let p = encode_populate_token(&PopulateTokenParams {
        immed: false,
        rod_type: None,
        inactivity_timeout: 0,
        ranges: ranges(r),
    });
    let cdb = c(Cdb::TokenCopy {
        service_action: copy_out::POPULATE_TOKEN,
        list_identifier: list_id,
        parameter_list_length: p.len() as u32,
        group: 0,
    });
    on(t, n, lun, &cdb, &p, 0)
}

fn rrti(t: &LunTable, n: &ItNexus, lun: u16, list_id: u32) -> ScsiResult {
    let cdb = c(Cdb::ReceiveCopyResults {
        service_action: 0x07,
        list_identifier: list_id,
        allocation_length: 1024,
    });
    on(t, n, lun, &cdb, &[], 1024)
}

/// The token RECEIVE ROD TOKEN INFORMATION returns for `list_id`.
fn token_of(t: &LunTable, n: &ItNexus, lun: u16, list_id: u32) -> Box<[u8; TOKEN_LEN]> {
    let r = rrti(t, n, lun, list_id);
    assert_eq!(r.status, GOOD);
    let d = &r.data_in;
    let sense_len = usize::from(d[13]);
    let at = 32 + sense_len;
    let len = u32::from_be_bytes(d[at..at + 4].try_into().unwrap()) as usize;
    assert_eq!(len, TOKEN_LEN + 2, "ROD TOKEN DESCRIPTORS LENGTH");
    let mut tok = Box::new([0u8; TOKEN_LEN]);
    tok.copy_from_slice(&d[at + 6..at + 6 + TOKEN_LEN]);
    tok
}

fn write_using(
    t: &LunTable,
    n: &ItNexus,
    lun: u16,
    list_id: u32,
    token: &[u8; TOKEN_LEN],
    offset: u64,
    delete_token: bool,
    r: &[(u64, u32)],
) -> ScsiResult {
    let p = encode_write_using_token(&WriteUsingTokenParams {
        immed: false,
        delete_token,
        offset,
        token: Box::new(*token),
        ranges: ranges(r),
    });
    let cdb = c(Cdb::TokenCopy {
        service_action: copy_out::WRITE_USING_TOKEN,
        list_identifier: list_id,
        parameter_list_length: p.len() as u32,
        group: 0,
    });
    on(t, n, lun, &cdb, &p, 0)
}

fn pattern(seed: u8, blocks: usize) -> Vec<u8> {
    (0..blocks * 512)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn a_token_of_scattered_ranges_writes_them_in_order_to_another_unit() {
    let a = nexus("iqn.a");
    let t = two_units(&[&a]);
    let (x, y) = (pattern(1, 8), pattern(2, 4));
    write_at(&t, &a, 0, 100, &x);
    write_at(&t, &a, 0, 300, &y);
    let r = populate(&t, &a, 0, 7, &[(100, 8), (300, 4)]);
    assert_eq!(r.status, GOOD, "{:?}", r.sense.as_ref().map(|_| sense(&r)));
    let st = rrti(&t, &a, 0, 7);
    assert_eq!(
        st.data_in[4],
        copy_out::POPULATE_TOKEN,
        "RESPONSE TO SERVICE ACTION"
    );
    assert_eq!(st.data_in[5], 0x01, "COPY OPERATION STATUS: completed");
    assert_eq!(
        &st.data_in[16..24],
        &12u64.to_be_bytes(),
        "TRANSFER COUNT in blocks"
    );
    let tok = token_of(&t, &a, 0, 7);
    assert_eq!(&tok[..4], &ROD_TYPE_ACCESS_UPON_REFERENCE.to_be_bytes());
    assert_eq!(&tok[6..8], &0x01f8u16.to_be_bytes());
    assert_eq!(
        &tok[48..64],
        &(12u128 * 512).to_be_bytes(),
        "NUMBER OF BYTES REPRESENTED"
    );
    assert_eq!(tok[16], 0xe4, "CREATOR LOGICAL UNIT DESCRIPTOR");
    assert_eq!(&tok[96..100], &512u32.to_be_bytes(), "LOGICAL BLOCK LENGTH");
    // The 12 blocks land as 6 + 6 on LUN 1, from offset 0.
    let r = write_using(&t, &a, 1, 8, &tok, 0, false, &[(10, 6), (50, 6)]);
    assert_eq!(r.status, GOOD, "{:?}", r.sense.as_ref().map(|_| sense(&r)));
    let mut want = x.clone();
    want.extend_from_slice(&y);
    assert_eq!(read_at(&t, &a, 1, 10, 6), want[..6 * 512]);
    assert_eq!(read_at(&t, &a, 1, 50, 6), want[6 * 512..]);
    let st = rrti(&t, &a, 1, 8);
    assert_eq!(st.data_in[4], copy_out::WRITE_USING_TOKEN);
    assert_eq!(st.data_in[5], 0x01);
    assert_eq!(&st.data_in[16..24], &12u64.to_be_bytes());
    // OFFSET INTO ROD: from block 5 on, 4 blocks (3 of x, 1 of y).
    let r = write_using(&t, &a, 0, 9, &tok, 5, false, &[(900, 4)]);
    assert_eq!(r.status, GOOD);
    assert_eq!(read_at(&t, &a, 0, 900, 4), want[5 * 512..9 * 512]);
}

#[test]
fn a_token_stands_for_the_data_when_it_is_used() {
    // Access upon reference: a write after POPULATE TOKEN is what is
    // copied.
    let a = nexus("iqn.a");
    let t = two_units(&[&a]);
    write_at(&t, &a, 0, 0, &pattern(1, 4));
    assert_eq!(populate(&t, &a, 0, 1, &[(0, 4)]).status, GOOD);
    let tok = token_of(&t, &a, 0, 1);
    write_at(&t, &a, 0, 0, &pattern(9, 4));
    assert_eq!(
        write_using(&t, &a, 1, 2, &tok, 0, false, &[(0, 4)]).status,
        GOOD
    );
    assert_eq!(read_at(&t, &a, 1, 0, 4), pattern(9, 4));
}

#[test]
fn another_host_given_the_token_can_use_it() {
    let (a, b) = (nexus("iqn.a"), nexus("iqn.b"));
    let t = two_units(&[&a, &b]);
    write_at(&t, &a, 0, 64, &pattern(3, 2));
    assert_eq!(populate(&t, &a, 0, 1, &[(64, 2)]).status, GOOD);
    let tok = token_of(&t, &a, 0, 1);
    assert_eq!(
        write_using(&t, &b, 1, 1, &tok, 0, false, &[(8, 2)]).status,
        GOOD
    );
    assert_eq!(read_at(&t, &b, 1, 8, 2), pattern(3, 2));
    // The status is the nexus's own: A's list 1 on LUN 1 does not exist.
    expect_check(
        &rrti(&t, &a, 1, 1),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
}

#[test]
fn the_block_device_zero_token_zeros_the_ranges() {
    let a = nexus("iqn.a");
    let t = two_units(&[&a]);
    write_at(&t, &a, 1, 0, &pattern(5, 16));
    let r = write_using(
        &t,
        &a,
        1,
        3,
        &block_zero_token(),
        0,
        false,
        &[(2, 3), (10, 2)],
    );
    assert_eq!(r.status, GOOD, "{:?}", r.sense.as_ref().map(|_| sense(&r)));
    let back = read_at(&t, &a, 1, 0, 16);
    let old = pattern(5, 16);
    for blk in 0..16 {
        let got = &back[blk * 512..(blk + 1) * 512];
        if (2..5).contains(&blk) || (10..12).contains(&blk) {
            assert!(got.iter().all(|&b| b == 0), "block {blk} zeroed");
        } else {
            assert_eq!(got, &old[blk * 512..(blk + 1) * 512], "block {blk} kept");
        }
    }
}

#[test]
fn tokens_that_were_not_handed_out_are_refused_and_write_nothing() {
    let a = nexus("iqn.a");
    let t = two_units(&[&a]);
    write_at(&t, &a, 0, 0, &pattern(1, 4));
    write_at(&t, &a, 1, 0, &pattern(2, 4));
    assert_eq!(populate(&t, &a, 0, 1, &[(0, 4)]).status, GOOD);
    let tok = token_of(&t, &a, 0, 1);
    // Its random part changed: corrupt.
    let mut forged = tok.clone();
    forged[100] ^= 1;
    let r = write_using(&t, &a, 1, 2, &forged, 0, false, &[(0, 4)]);
    expect_check(&r, SenseKey::IllegalRequest, Asc::TOKEN_CORRUPT);
    // An identifier never issued: unknown.
    let mut other = tok.clone();
    other[15] ^= 0x80;
    let r = write_using(&t, &a, 1, 2, &other, 0, false, &[(0, 4)]);
    expect_check(&r, SenseKey::IllegalRequest, Asc::TOKEN_UNKNOWN);
    // A ROD type not made here, and a wrong ROD TOKEN LENGTH.
    let mut pit = tok.clone();
    pit[..4].copy_from_slice(&0x0080_0000u32.to_be_bytes());
    let r = write_using(&t, &a, 1, 2, &pit, 0, false, &[(0, 4)]);
    expect_check(&r, SenseKey::IllegalRequest, Asc::TOKEN_UNSUPPORTED_TYPE);
    let mut short = tok.clone();
    short[7] = 0;
    let r = write_using(&t, &a, 1, 2, &short, 0, false, &[(0, 4)]);
    expect_check(&r, SenseKey::IllegalRequest, Asc::TOKEN_INVALID_LENGTH);
    assert_eq!(read_at(&t, &a, 1, 0, 4), pattern(2, 4), "nothing written");
    // RECEIVE ROD TOKEN INFORMATION reports the failure with its sense.
    let st = rrti(&t, &a, 1, 2);
    assert_eq!(st.data_in[5], 0x02, "completed with errors");
    assert_eq!(st.data_in[12], CHECK);
    assert!(st.data_in[13] > 0, "sense data");
    // DEL_TKN: the token lapses after its use.
    assert_eq!(
        write_using(&t, &a, 1, 2, &tok, 0, true, &[(0, 4)]).status,
        GOOD
    );
    let r = write_using(&t, &a, 1, 2, &tok, 0, false, &[(0, 4)]);
    expect_check(&r, SenseKey::IllegalRequest, Asc::TOKEN_UNKNOWN);
}

#[test]
fn a_token_whose_unit_left_the_target_is_revoked() {
    let a = nexus("iqn.a");
    let t = two_units(&[&a]);
    assert_eq!(populate(&t, &a, 0, 1, &[(0, 4)]).status, GOOD);
    let tok = token_of(&t, &a, 0, 1);
    t.remove(0).unwrap();
    // REPORTED LUNS DATA HAS CHANGED first.
    while on(&t, &a, 1, &c(Cdb::TestUnitReady), &[], 0).status != GOOD {}
    let r = write_using(&t, &a, 1, 2, &tok, 0, false, &[(0, 4)]);
    expect_check(&r, SenseKey::IllegalRequest, Asc::TOKEN_REVOKED);
}

#[test]
fn a_token_of_a_unit_whose_medium_is_out_is_not_read() {
    // The copy runs on LUN 1; LUN 0, the token's unit, answers no command
    // of its own, so the copy asks it whether it can be read.
    let a = nexus("iqn.a");
    let t = LunTable::new(vec![
        (0, {
            let mut c = LuConfig::new(Arc::new(crate::backstore::RamBackstore::new(1 << 20)));
            let (serial, naa) = stable_identity("iqn.t", 0);
            c.serial = serial;
            c.naa_id = naa;
            c.removable = true;
            Arc::new(LogicalUnit::new(c))
        }),
        (1, unit(1)),
    ]);
    for lun in [0, 1] {
        while on(&t, &a, lun, &c(Cdb::TestUnitReady), &[], 0).status != GOOD {}
    }
    write_at(&t, &a, 1, 0, &pattern(2, 4));
    assert_eq!(populate(&t, &a, 0, 1, &[(0, 4)]).status, GOOD);
    let tok = token_of(&t, &a, 0, 1);
    let eject = c(Cdb::StartStopUnit {
        immed: false,
        power_condition_modifier: 0,
        power_condition: 0,
        no_flush: false,
        loej: true,
        start: false,
    });
    assert_eq!(on(&t, &a, 0, &eject, &[], 0).status, GOOD);
    let r = write_using(&t, &a, 1, 2, &tok, 0, false, &[(0, 4)]);
    let s = expect_check(&r, SenseKey::CopyAborted, Asc::NO_ADDITIONAL_SENSE);
    assert_eq!(s.command_specific, Some(0x3a00), "MEDIUM NOT PRESENT");
    assert_eq!(read_at(&t, &a, 1, 0, 4), pattern(2, 4), "nothing written");
}

#[test]
fn ranges_are_checked_before_anything_moves() {
    let a = nexus("iqn.a");
    let t = two_units(&[&a]);
    let blocks = (1u64 << 20) / 512;
    // Past the end.
    expect_check(
        &populate(&t, &a, 0, 1, &[(blocks - 2, 4)]),
        SenseKey::IllegalRequest,
        Asc::LBA_OUT_OF_RANGE,
    );
    assert_eq!(populate(&t, &a, 0, 1, &[(0, 8)]).status, GOOD);
    let tok = token_of(&t, &a, 0, 1);
    write_at(&t, &a, 1, 0, &pattern(4, 8));
    let r = write_using(&t, &a, 1, 2, &tok, 0, false, &[(0, 4), (blocks - 2, 4)]);
    expect_check(&r, SenseKey::IllegalRequest, Asc::LBA_OUT_OF_RANGE);
    assert_eq!(read_at(&t, &a, 1, 0, 8), pattern(4, 8), "nothing written");
    // Overlapping destination ranges.
    let r = write_using(&t, &a, 1, 2, &tok, 0, false, &[(0, 4), (3, 4)]);
    expect_check(
        &r,
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
    );
    // More range descriptors than the Third-party Copy page allows.
    let many: Vec<(u64, u32)> = (0..MAX_RANGES as u64 + 1).map(|i| (i * 2, 1)).collect();
    expect_check(
        &populate(&t, &a, 0, 1, &many),
        SenseKey::IllegalRequest,
        Asc::TOO_MANY_SEGMENT_DESCRIPTORS,
    );
    // An offset at or past the token's end.
    let r = write_using(&t, &a, 1, 2, &tok, 8, false, &[(0, 1)]);
    expect_check(
        &r,
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
    );
}

#[test]
fn ranges_longer_than_the_token_are_refused_before_a_block_moves() {
    let a = nexus("iqn.a");
    let t = two_units(&[&a]);
    write_at(&t, &a, 0, 0, &pattern(6, 4));
    write_at(&t, &a, 1, 0, &pattern(7, 8));
    assert_eq!(populate(&t, &a, 0, 1, &[(0, 4)]).status, GOOD);
    let tok = token_of(&t, &a, 0, 1);
    // 3 blocks are left past OFFSET INTO ROD 1; 4 are asked for.
    let r = write_using(&t, &a, 1, 2, &tok, 1, false, &[(0, 2), (4, 2)]);
    expect_check(
        &r,
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
    );
    assert_eq!(read_at(&t, &a, 1, 0, 8), pattern(7, 8), "nothing written");
    let st = rrti(&t, &a, 1, 2);
    assert_eq!(st.data_in[5], 0x02, "completed with errors");
    assert_eq!(&st.data_in[16..24], &0u64.to_be_bytes());
    // Exactly what is left is fine.
    assert_eq!(
        write_using(&t, &a, 1, 2, &tok, 1, false, &[(0, 1), (4, 2)]).status,
        GOOD
    );
    let back = read_at(&t, &a, 1, 0, 8);
    assert_eq!(back[..512], pattern(6, 4)[512..1024]);
    assert_eq!(back[4 * 512..6 * 512], pattern(6, 4)[1024..]);
}

#[test]
fn reservations_fence_token_copies_like_reads_and_writes() {
    let (a, b) = (nexus("iqn.a"), nexus("iqn.b"));
    let t = two_units(&[&a, &b]);
    let pr = |n: &ItNexus, lun: u16, action: PrOutAction, key: u64, ty: u8| {
        let mut p = vec![0u8; 24];
        p[..8].copy_from_slice(
            &(if action == PrOutAction::Register {
                0
            } else {
                key
            })
            .to_be_bytes(),
        );
        if action == PrOutAction::Register {
            p[8..16].copy_from_slice(&key.to_be_bytes());
        }
        let cdb = c(Cdb::PersistentReserveOut {
            service_action: action,
            scope: 0,
            pr_type: ty,
            parameter_list_length: 24,
        });
        assert_eq!(on(&t, n, lun, &cdb, &p, 0).status, GOOD);
    };
    // B holds Exclusive Access on LUN 0: A may not make a token of it.
    pr(&b, 0, PrOutAction::Register, 0xb, 0);
    pr(&b, 0, PrOutAction::Reserve, 0xb, 3);
    assert_eq!(populate(&t, &a, 0, 1, &[(0, 4)]).status, CONFLICT);
    assert_eq!(populate(&t, &b, 0, 1, &[(0, 4)]).status, GOOD);
    let tok = token_of(&t, &b, 0, 1);
    // B holds Write Exclusive on LUN 1: A may not write there with it.
    pr(&b, 1, PrOutAction::Register, 0xb, 0);
    pr(&b, 1, PrOutAction::Reserve, 0xb, 1);
    assert_eq!(
        write_using(&t, &a, 1, 2, &tok, 0, false, &[(0, 4)]).status,
        CONFLICT
    );
    assert_eq!(
        write_using(&t, &b, 1, 2, &tok, 0, false, &[(0, 4)]).status,
        GOOD
    );
    // A token made before its unit was reserved by another host: the
    // source is read as the nexus using the token, so A is fenced off it.
    pr(&b, 0, PrOutAction::Release, 0xb, 3);
    assert_eq!(populate(&t, &a, 0, 3, &[(8, 4)]).status, GOOD);
    let early = token_of(&t, &a, 0, 3);
    pr(&b, 0, PrOutAction::Reserve, 0xb, 3);
    pr(&b, 1, PrOutAction::Release, 0xb, 1);
    assert_eq!(
        write_using(&t, &a, 1, 4, &early, 0, false, &[(0, 4)]).status,
        CONFLICT
    );
    // RECEIVE ROD TOKEN INFORMATION says so: completed with errors, ended
    // in RESERVATION CONFLICT, no sense data, nothing written.
    let st = rrti(&t, &a, 1, 4);
    assert_eq!(
        (
            st.data_in[5],
            st.data_in[12],
            st.data_in[13],
            st.data_in[23]
        ),
        (0x02, CONFLICT, 0, 0)
    );
}

#[test]
fn the_third_party_copy_page_states_the_limits_the_commands_enforce() {
    let a = nexus("iqn.a");
    let t = two_units(&[&a]);
    let inq = |page: u8| {
        let cdb = c(Cdb::Inquiry {
            evpd: true,
            page_code: page,
            allocation_length: 1024,
        });
        on(&t, &a, 0, &cdb, &[], 1024)
    };
    let VpdPage::SupportedPages(pages) = Vpd::decode(&inq(0).data_in).unwrap().page else {
        panic!("VPD 00h")
    };
    assert!(pages.contains(&0x8f), "{pages:x?}");
    let r = inq(0x8f);
    assert_eq!(r.status, GOOD);
    let d = &r.data_in;
    assert_eq!(d[1], 0x8f);
    assert_eq!(usize::from(u16::from_be_bytes([d[2], d[3]])), d.len() - 4);
    let mut descriptors = std::collections::HashMap::new();
    let mut at = 4;
    while at + 4 <= d.len() {
        let kind = u16::from_be_bytes([d[at], d[at + 1]]);
        let len = usize::from(u16::from_be_bytes([d[at + 2], d[at + 3]]));
        descriptors.insert(kind, d[at + 4..at + 4 + len].to_vec());
        at += 4 + len;
    }
    assert_eq!(at, d.len(), "descriptors fill the page");
    let limits = &descriptors[&0x0000];
    assert_eq!(
        u16::from_be_bytes([limits[6], limits[7]]) as usize,
        MAX_RANGES
    );
    assert_eq!(
        u64::from_be_bytes(limits[16..24].try_into().unwrap()),
        MAX_TOKEN_TRANSFER_BYTES / 512,
        "MAXIMUM TOKEN TRANSFER SIZE"
    );
    assert!(descriptors.contains_key(&0x0001) && descriptors.contains_key(&0x0108));
    // A token of more than the maximum transfer is refused.
    let per = (MAX_TOKEN_TRANSFER_BYTES / 512) as u32;
    let r = populate(&t, &a, 0, 1, &[(0, 1), (2, per)]);
    assert_eq!(r.status, CHECK);
}

#[test]
fn lapsed_tokens_are_expired_and_the_table_stays_bounded() {
    let store = RodTokens::default();
    let u = unit(0);
    let t0 = Instant::now();
    let one = [BlockRange { lba: 0, blocks: 1 }];
    let origin = u.token_origin();
    let tok = store.create(&origin, &one, Duration::from_secs(5), t0);
    assert!(store.resolve(&tok, t0 + Duration::from_secs(4)).is_ok());
    // Each use restarts the inactivity timer.
    assert!(store.resolve(&tok, t0 + Duration::from_secs(8)).is_ok());
    assert_eq!(
        store
            .resolve(&tok, t0 + Duration::from_secs(14))
            .unwrap_err(),
        TokenRefusal::Expired
    );
    assert_eq!(
        store.resolve(&tok, t0).unwrap_err(),
        TokenRefusal::Unknown,
        "dropped once expired"
    );
    let first = store.create(&origin, &one, Duration::from_secs(60), t0);
    for i in 0..MAX_TOKENS + 10 {
        store.create(
            &origin,
            &one,
            Duration::from_secs(60),
            t0 + Duration::from_millis(i as u64 + 1),
        );
    }
    assert_eq!(store.len(), MAX_TOKENS);
    assert_eq!(
        store.resolve(&first, t0).unwrap_err(),
        TokenRefusal::Unknown,
        "least recently used dropped"
    );
}

fn arb_ranges() -> impl Strategy<Value = Vec<BlockRange>> {
    proptest::collection::vec((0u64..1 << 40, 0u32..64), 1..8).prop_map(|v| {
        // Non-overlapping: each range starts past the previous one's end.
        let mut at = 0u64;
        v.into_iter()
            .map(|(gap, blocks)| {
                let lba = at + gap % 1000;
                at = lba + u64::from(blocks);
                BlockRange { lba, blocks }
            })
            .collect()
    })
}

proptest! {
    /// The pieces a WRITE USING TOKEN copies are the token's blocks from
    /// OFFSET INTO ROD on, block for block, onto the destination ranges'
    /// blocks in order, as far as both go.
    #[test]
    fn pieces_pair_the_source_blocks_with_the_destination_blocks(
        src in arb_ranges(),
        dst in arb_ranges(),
        offset in 0u64..200,
    ) {
        let flat = |rs: &[BlockRange]| rs.iter().flat_map(|r| r.lba..r.lba + u64::from(r.blocks)).collect::<Vec<_>>();
        let (s, d) = (flat(&src), flat(&dst));
        let want: Vec<(u64, u64)> = s.iter().skip(offset as usize).copied().zip(d.iter().copied()).collect();
        let got: Vec<(u64, u64)> = pair_ranges(&src, offset, &dst)
            .into_iter()
            .flat_map(|(sl, dl, n)| (0..n).map(move |i| (sl + i, dl + i)))
            .collect();
        prop_assert_eq!(got, want);
    }

    #[test]
    fn parameter_lists_read_back_as_written(
        r in arb_ranges(),
        immed: bool,
        rtv: bool,
        timeout: u32,
        offset: u64,
        del: bool,
        seed: u8,
    ) {
        let pt = PopulateTokenParams { immed, rod_type: rtv.then_some(ROD_TYPE_ACCESS_UPON_REFERENCE), inactivity_timeout: timeout, ranges: r.clone() };
        prop_assert_eq!(parse_populate_token(&encode_populate_token(&pt)).unwrap(), pt);
        let mut token = Box::new([seed; TOKEN_LEN]);
        token[0] = 0;
        let wut = WriteUsingTokenParams { immed, delete_token: del, offset, token, ranges: r };
        prop_assert_eq!(parse_write_using_token(&encode_write_using_token(&wut)).unwrap(), wut);
    }

    /// Any bytes: a parse never panics, and what it accepts names no more
    /// ranges than the list holds.
    #[test]
    fn parameter_lists_of_any_bytes_are_refused_or_read_within_bounds(p in proptest::collection::vec(any::<u8>(), 0..800)) {
        if let Ok(x) = parse_populate_token(&p) {
            prop_assert!(16 + x.ranges.len() * 16 <= p.len());
            prop_assert!(x.ranges.len() <= MAX_RANGES);
        }
        if let Ok(x) = parse_write_using_token(&p) {
            prop_assert!(536 + x.ranges.len() * 16 <= p.len());
        }
    }
}
