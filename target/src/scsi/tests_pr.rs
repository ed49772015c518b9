//! Persistent reservation tests: the conflict table, fencing by PREEMPT AND
//! ABORT, unit attentions, APTPL persistence and state-machine invariants.

use std::sync::{Arc, Mutex};

use blockwire_pdu::scsi::{
    Asc, Cdb, CdbSize, PrInAction, PrOutAction, PrOutData, PrOutParameters, PrType,
    RegisterAndMoveParameters, SenseKey, TransportId,
};
use proptest::prelude::*;

use super::tests::*;
use super::*;
use crate::backstore::RamBackstore;

fn prout(t: &LunTable, n: &ItNexus, sa: PrOutAction, ty: PrType, p: PrOutParameters) -> ScsiResult {
    let data = PrOutData::Basic(p).encode();
    let cdb = c(Cdb::PersistentReserveOut {
        service_action: sa,
        scope: 0,
        pr_type: ty.code(),
        parameter_list_length: data.len() as u32,
    });
    run(t, n, &cdb, &data, 0)
}

fn keys(rk: u64, sak: u64) -> PrOutParameters {
    PrOutParameters {
        reservation_key: rk,
        service_action_key: sak,
        ..PrOutParameters::default()
    }
}

fn register(t: &LunTable, n: &ItNexus, key: u64) {
    let r = prout(
        t,
        n,
        PrOutAction::Register,
        PrType::WriteExclusive,
        keys(0, key),
    );
    assert_eq!(r.status, GOOD, "{:?}", r.sense.as_ref().map(|_| sense(&r)));
}

fn reserve(t: &LunTable, n: &ItNexus, key: u64, ty: PrType) -> ScsiResult {
    prout(t, n, PrOutAction::Reserve, ty, keys(key, 0))
}

fn prin(t: &LunTable, n: &ItNexus, sa: PrInAction) -> Vec<u8> {
    let cdb = c(Cdb::PersistentReserveIn {
        service_action: sa,
        allocation_length: 4096,
    });
    let r = run(t, n, &cdb, &[], 4096);
    assert_eq!(r.status, GOOD);
    r.data_in
}

fn can_read(t: &LunTable, n: &ItNexus) -> u8 {
    read(t, n, 0, 1).status
}

fn can_write(t: &LunTable, n: &ItNexus) -> u8 {
    write(t, n, 0, &[7; 512]).status
}

fn three() -> (LunTable, ItNexus, ItNexus, ItNexus) {
    let t = table();
    let (a, b, x) = (nexus("iqn.a"), nexus("iqn.b"), nexus("iqn.x"));
    for n in [&a, &b, &x] {
        ready(&t, n);
    }
    (t, a, b, x)
}

#[test]
fn conflict_table_per_type() {
    use PrType::*;
    // (type, registered non-holder read/write, unregistered read/write)
    let table_ = [
        (WriteExclusive, (GOOD, CONFLICT), (GOOD, CONFLICT)),
        (ExclusiveAccess, (CONFLICT, CONFLICT), (CONFLICT, CONFLICT)),
        (
            WriteExclusiveRegistrantsOnly,
            (GOOD, GOOD),
            (GOOD, CONFLICT),
        ),
        (
            ExclusiveAccessRegistrantsOnly,
            (GOOD, GOOD),
            (CONFLICT, CONFLICT),
        ),
        (WriteExclusiveAllRegistrants, (GOOD, GOOD), (GOOD, CONFLICT)),
        (
            ExclusiveAccessAllRegistrants,
            (GOOD, GOOD),
            (CONFLICT, CONFLICT),
        ),
    ];
    for (ty, reg, unreg) in table_ {
        let (t, a, b, x) = three();
        register(&t, &a, 0xa);
        register(&t, &b, 0xb);
        assert_eq!(reserve(&t, &a, 0xa, ty).status, GOOD);
        // Reserving again with the same type is fine; another type is not.
        assert_eq!(reserve(&t, &a, 0xa, ty).status, GOOD);
        assert_eq!(
            (can_read(&t, &a), can_write(&t, &a)),
            (GOOD, GOOD),
            "{ty:?}"
        );
        assert_eq!(
            (can_read(&t, &b), can_write(&t, &b)),
            reg,
            "{ty:?} registered"
        );
        assert_eq!(
            (can_read(&t, &x), can_write(&t, &x)),
            unreg,
            "{ty:?} unregistered"
        );
        // Identification commands never conflict.
        let inq = c(Cdb::Inquiry {
            evpd: false,
            page_code: 0,
            allocation_length: 36,
        });
        assert_eq!(run(&t, &x, &inq, &[], 36).status, GOOD);
        assert_eq!(run(&t, &x, &c(Cdb::TestUnitReady), &[], 0).status, GOOD);
        // Non-holders cannot reserve.
        assert_eq!(
            reserve(&t, &b, 0xb, ty).status,
            if matches!(
                ty,
                WriteExclusiveAllRegistrants | ExclusiveAccessAllRegistrants
            ) {
                GOOD
            } else {
                CONFLICT
            }
        );
    }
}

#[test]
fn register_rules_and_read_keys() {
    let (t, a, b, _) = three();
    // Unregistered with a non-zero RESERVATION KEY.
    let r = prout(
        &t,
        &a,
        PrOutAction::Register,
        PrType::WriteExclusive,
        keys(5, 6),
    );
    assert_eq!(r.status, CONFLICT);
    register(&t, &a, 0xa1);
    // Wrong key.
    let r = prout(
        &t,
        &a,
        PrOutAction::Register,
        PrType::WriteExclusive,
        keys(1, 2),
    );
    assert_eq!(r.status, CONFLICT);
    // IGNORE EXISTING KEY replaces it.
    let r = prout(
        &t,
        &a,
        PrOutAction::RegisterAndIgnoreExistingKey,
        PrType::WriteExclusive,
        keys(0, 0xa2),
    );
    assert_eq!(r.status, GOOD);
    register(&t, &b, 0xb1);
    let d = prin(&t, &a, PrInAction::ReadKeys);
    assert_eq!(u32::from_be_bytes(d[0..4].try_into().unwrap()), 3);
    assert_eq!(&d[4..8], &[0, 0, 0, 16]);
    assert_eq!(&d[8..16], &0xa2u64.to_be_bytes());
    assert_eq!(&d[16..24], &0xb1u64.to_be_bytes());
    // Unregister.
    let r = prout(
        &t,
        &a,
        PrOutAction::Register,
        PrType::WriteExclusive,
        keys(0xa2, 0),
    );
    assert_eq!(r.status, GOOD);
    let d = prin(&t, &a, PrInAction::ReadKeys);
    assert_eq!(&d[4..8], &[0, 0, 0, 8]);
    // A new ISID is another initiator port: not registered.
    let a2 = ItNexus::iscsi("iqn.b", [0x40, 0, 0, 0, 0, 2], "iqn.2024-01.test:tgt", 1);
    ready(&t, &a2);
    assert_eq!(
        reserve(&t, &a2, 0xb1, PrType::WriteExclusive).status,
        CONFLICT
    );
    // Capabilities: no APTPL without a state file.
    let d = prin(&t, &a, PrInAction::ReportCapabilities);
    assert_eq!(&d[0..2], &[0, 8]);
    assert_eq!(d[2] & 1, 0);
    let mut p = keys(0xb1, 0xb1);
    p.aptpl = true;
    let r = prout(&t, &b, PrOutAction::Register, PrType::WriteExclusive, p);
    expect_check(
        &r,
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
    );
    // Wrong parameter list length.
    let cdb = c(Cdb::PersistentReserveOut {
        service_action: PrOutAction::Register,
        scope: 0,
        pr_type: 0,
        parameter_list_length: 20,
    });
    let r = run(&t, &b, &cdb, &[0; 20], 0);
    expect_check(
        &r,
        SenseKey::IllegalRequest,
        Asc::PARAMETER_LIST_LENGTH_ERROR,
    );
}

#[test]
fn fencing_preempt_and_abort() {
    let (t, a, b, _) = three();
    let aborted: Arc<Mutex<Vec<(u16, String)>>> = Arc::default();
    let log = aborted.clone();
    t.set_abort_handler(Arc::new(move |lun, n: &ItNexus| {
        log.lock()
            .unwrap()
            .push((lun, n.initiator_port.to_string()))
    }));
    register(&t, &a, 0xa);
    register(&t, &b, 0xb);
    assert_eq!(
        reserve(&t, &a, 0xa, PrType::WriteExclusiveRegistrantsOnly).status,
        GOOD
    );
    assert_eq!(can_write(&t, &b), GOOD);
    let r = prout(
        &t,
        &a,
        PrOutAction::PreemptAndAbort,
        PrType::WriteExclusiveRegistrantsOnly,
        keys(0xa, 0xb),
    );
    assert_eq!(r.status, GOOD);
    assert_eq!(
        aborted.lock().unwrap().as_slice(),
        &[(0, b.initiator_port.to_string())]
    );
    let r = run(&t, &b, &c(Cdb::TestUnitReady), &[], 0);
    expect_check(&r, SenseKey::UnitAttention, Asc::REGISTRATIONS_PREEMPTED);
    ready(&t, &b);
    assert_eq!(can_write(&t, &b), CONFLICT);
    assert_eq!(can_read(&t, &b), GOOD);
    assert_eq!(can_write(&t, &a), GOOD);
    // b's old key is gone: it cannot re-register with it, nor preempt.
    let r = prout(
        &t,
        &b,
        PrOutAction::Preempt,
        PrType::WriteExclusive,
        keys(0xb, 0xa),
    );
    assert_eq!(r.status, CONFLICT);
    let d = prin(&t, &a, PrInAction::ReadReservation);
    assert_eq!(&d[4..8], &[0, 0, 0, 16]);
    assert_eq!(&d[8..16], &0xau64.to_be_bytes());
    assert_eq!(d[21], PrType::WriteExclusiveRegistrantsOnly.code());
}

/// PREEMPT AND ABORT answers only once the preempted node's commands that
/// passed their reservation check before it have left the unit, even when
/// that node's connection ended already (the usual reason to fence it,
/// which forgets its nexus for unit attentions); and it does not wait for
/// the commands the node sends after it, which check the new state (a
/// fenced node may still READ under the Write Exclusive types).
#[test]
fn preempt_and_abort_waits_for_a_gone_nodes_write_and_not_for_later_commands() {
    use std::time::{Duration, Instant};
    let (t, a, b, _) = three();
    register(&t, &a, 0xa);
    register(&t, &b, 0xb);
    let ty = PrType::WriteExclusiveRegistrantsOnly;
    assert_eq!(reserve(&t, &a, 0xa, ty).status, GOOD);
    // B's pipelined WRITE passed its checks; its bytes are still to land.
    let cdb = c(Cdb::Write(rw(CdbSize::Ten, 8, 8)));
    let req = ScsiRequest {
        lun: 0,
        cdb: &cdb,
        nexus: &b,
        task_tag: 7,
        attr: blockwire_pdu::pdu::codes::TaskAttr::Simple,
        data_out: &[],
        data_in_capacity: 0,
        initiator_stats: None,
    };
    let write_plan::WritePlan::Write(write) = t.plan_write(&req, 4096, false) else {
        panic!("B's WRITE is planned")
    };
    t.nexus_lost(&b);
    let lu = t.get(0).unwrap();
    std::thread::scope(|s| {
        let preempt =
            s.spawn(|| prout(&t, &a, PrOutAction::PreemptAndAbort, ty, keys(0xa, 0xb)).status);
        std::thread::sleep(Duration::from_millis(300));
        let answered_early = preempt.is_finished();
        // Sent after the preemption, still running.
        let later = lu.in_flight.hold(&b);
        drop(write);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !preempt.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let answered = preempt.is_finished();
        lu.in_flight.release(&b, later);
        assert!(
            !answered_early,
            "PREEMPT AND ABORT answered while the fenced node's WRITE was still to land"
        );
        assert!(
            answered,
            "PREEMPT AND ABORT waited for a command sent after it"
        );
        assert_eq!(preempt.join().unwrap(), GOOD);
    });
}

#[test]
fn release_and_clear_unit_attentions() {
    let (t, a, b, _) = three();
    register(&t, &a, 1);
    register(&t, &b, 2);
    assert_eq!(
        reserve(&t, &a, 1, PrType::ExclusiveAccessRegistrantsOnly).status,
        GOOD
    );
    // Releasing with another type is an invalid release.
    let r = prout(
        &t,
        &a,
        PrOutAction::Release,
        PrType::WriteExclusive,
        keys(1, 0),
    );
    expect_check(
        &r,
        SenseKey::IllegalRequest,
        Asc::INVALID_RELEASE_OF_PERSISTENT_RESERVATION,
    );
    // A non-holder's release is a no-op.
    let r = prout(
        &t,
        &b,
        PrOutAction::Release,
        PrType::ExclusiveAccessRegistrantsOnly,
        keys(2, 0),
    );
    assert_eq!(r.status, GOOD);
    let r = prout(
        &t,
        &a,
        PrOutAction::Release,
        PrType::ExclusiveAccessRegistrantsOnly,
        keys(1, 0),
    );
    assert_eq!(r.status, GOOD);
    expect_check(
        &run(&t, &b, &c(Cdb::TestUnitReady), &[], 0),
        SenseKey::UnitAttention,
        Asc::RESERVATIONS_RELEASED,
    );
    assert_eq!(reserve(&t, &b, 2, PrType::ExclusiveAccess).status, GOOD);
    let r = prout(
        &t,
        &a,
        PrOutAction::Clear,
        PrType::WriteExclusive,
        keys(1, 0),
    );
    assert_eq!(r.status, GOOD);
    expect_check(
        &run(&t, &b, &c(Cdb::TestUnitReady), &[], 0),
        SenseKey::UnitAttention,
        Asc::RESERVATIONS_PREEMPTED,
    );
    let d = prin(&t, &a, PrInAction::ReadKeys);
    assert_eq!(&d[4..8], &[0, 0, 0, 0]);
    assert_eq!(can_write(&t, &b), GOOD);
}

/// ALL_TG_PT from an initiator port already registered through another
/// target port registers it as if each I_T nexus ran the command: REGISTER
/// needs that nexus's key (RESERVATION CONFLICT, nothing changes); REGISTER
/// AND IGNORE EXISTING KEY replaces its registration, and a reservation it
/// held stays held. Never two registrations (two keys) for one I_T nexus.
#[test]
fn all_tg_pt_over_a_port_already_registered() {
    let t = table();
    let a = nexus("iqn.a");
    let a2 = ItNexus::iscsi("iqn.a", [0x40, 0, 0, 0, 0, 1], "iqn.2024-01.test:tgt", 2);
    let b = nexus("iqn.b");
    for n in [&a, &a2, &b] {
        ready(&t, n);
    }
    register(&t, &a, 0xa);
    register(&t, &b, 0xb);
    assert_eq!(reserve(&t, &a, 0xa, PrType::WriteExclusive).status, GOOD);
    let before = full_status(&t, &a);
    let all = |rk, sak| PrOutParameters {
        all_tg_pt: true,
        ..keys(rk, sak)
    };
    let r = prout(
        &t,
        &a2,
        PrOutAction::Register,
        PrType::WriteExclusive,
        all(0, 0xc),
    );
    assert_eq!(r.status, CONFLICT);
    assert_eq!(full_status(&t, &a), before);
    let r = prout(
        &t,
        &a2,
        PrOutAction::RegisterAndIgnoreExistingKey,
        PrType::WriteExclusive,
        all(0, 0xc),
    );
    assert_eq!(r.status, GOOD);
    let after = full_status(&t, &a);
    let mine: Vec<_> = after
        .registrations
        .iter()
        .filter(|r| r.1.starts_with("iqn.a,"))
        .collect();
    assert_eq!(mine.len(), 1, "{after:?}");
    let (key, _, _, all_tg_pt, holder, _) = mine[0];
    assert_eq!((*key, *all_tg_pt, *holder), (0xc, true, true), "{after:?}");
    // Both paths of the initiator hold the reservation under the new key.
    assert_eq!(can_write(&t, &a2), GOOD);
    assert_eq!(can_write(&t, &b), CONFLICT);
    let r = prout(
        &t,
        &a,
        PrOutAction::Release,
        PrType::WriteExclusive,
        keys(0xc, 0),
    );
    assert_eq!(r.status, GOOD);
    assert_eq!(can_write(&t, &b), GOOD);
}

#[test]
fn spec_i_pt_all_tg_pt_and_full_status() {
    let (t, a, b, _) = three();
    let p = PrOutParameters {
        reservation_key: 0,
        service_action_key: 0x55,
        spec_i_pt: true,
        all_tg_pt: true,
        aptpl: false,
        transport_ids: vec![TransportId::Iscsi {
            name: "iqn.b".into(),
            isid: Some("400000000001".into()),
        }],
    };
    let r = prout(&t, &a, PrOutAction::Register, PrType::WriteExclusive, p);
    assert_eq!(r.status, GOOD);
    // b is registered through a's SPEC_I_PT, on every target port.
    let b_other_port = ItNexus::iscsi("iqn.b", [0x40, 0, 0, 0, 0, 1], "iqn.2024-01.test:tgt", 2);
    ready(&t, &b_other_port);
    assert_eq!(
        reserve(&t, &b_other_port, 0x55, PrType::WriteExclusive).status,
        GOOD
    );
    assert_eq!(can_write(&t, &b), GOOD);
    assert_eq!(can_write(&t, &a), CONFLICT);
    let d = prin(&t, &a, PrInAction::ReadFullStatus);
    let len = u32::from_be_bytes(d[4..8].try_into().unwrap()) as usize;
    assert_eq!(d.len(), 8 + len);
    // Two descriptors; the second (b) holds the reservation, both ALL_TG_PT.
    assert_eq!(d[8 + 12], 0x02);
    let second = 8 + 24 + u32::from_be_bytes(d[8 + 20..8 + 24].try_into().unwrap()) as usize;
    assert_eq!(d[second + 12], 0x03);
}

/// REGISTER AND MOVE from `n` (RESERVATION KEY `rk`) to the initiator
/// port of `dest` on `rtpi`, registered there with `sak`.
fn register_and_move(
    t: &LunTable,
    n: &ItNexus,
    rk: u64,
    sak: u64,
    dest: &ItNexus,
    rtpi: u16,
    unreg: bool,
) -> ScsiResult {
    register_and_move_aptpl(t, n, (rk, sak), dest, rtpi, unreg, false)
}

/// [`register_and_move`] with its APTPL bit `aptpl`; `(rk, sak)` the
/// RESERVATION KEY and SERVICE ACTION RESERVATION KEY.
fn register_and_move_aptpl(
    t: &LunTable,
    n: &ItNexus,
    (rk, sak): (u64, u64),
    dest: &ItNexus,
    rtpi: u16,
    unreg: bool,
    aptpl: bool,
) -> ScsiResult {
    let (name, isid) = dest.initiator_port.split_once(",i,0x").unwrap();
    let data = PrOutData::RegisterAndMove(RegisterAndMoveParameters {
        reservation_key: rk,
        service_action_key: sak,
        unreg,
        aptpl,
        relative_target_port: rtpi,
        transport_id: TransportId::Iscsi {
            name: name.into(),
            isid: Some(isid.into()),
        },
    })
    .encode();
    let cdb = c(Cdb::PersistentReserveOut {
        service_action: PrOutAction::RegisterAndMove,
        scope: 0,
        pr_type: PrType::WriteExclusive.code(),
        parameter_list_length: data.len() as u32,
    });
    run(t, n, &cdb, &data, 0)
}

#[test]
fn register_and_move_hands_the_reservation_to_another_port() {
    let (t, a, b, x) = three();
    register(&t, &a, 0xa);
    assert_eq!(reserve(&t, &a, 0xa, PrType::WriteExclusive).status, GOOD);
    // With UNREG the sender's registration goes; b is registered with the
    // new key and holds the reservation.
    let r = register_and_move(&t, &a, 0xa, 0xb2, &b, 1, true);
    assert_eq!(r.status, GOOD, "{:?}", r.sense.as_ref().map(|_| sense(&r)));
    let after = full_status(&t, &x);
    assert_eq!(after.registrations.len(), 1, "{after:?}");
    let (key, port, _, _, holder, ty) = &after.registrations[0];
    assert_eq!(
        (*key, port.as_str(), *holder, *ty),
        (0xb2, &*b.initiator_port, true, 1)
    );
    assert_eq!(can_write(&t, &b), GOOD);
    assert_eq!(can_write(&t, &a), CONFLICT);
    // Only the holder moves it, and only with its key.
    assert_eq!(
        register_and_move(&t, &a, 0xa, 0xa2, &a, 1, false).status,
        CONFLICT
    );
    assert_eq!(
        register_and_move(&t, &b, 0xb, 0xa2, &a, 1, false).status,
        CONFLICT
    );
}

/// An initiator port registered with ALL_TG_PT (or by a SPEC_I_PT list
/// naming it without an ISID) holds the reservation through every target
/// port. Moving the reservation to its own nexus on another port would need
/// that one registration split into two with two keys; with UNREG it used to
/// remove the registration it had just made the holder, leaving a
/// reservation whose holder was no registration (a holder-less reservation
/// fences every initiator, and with APTPL it was saved so).
#[test]
fn register_and_move_to_a_port_the_senders_registration_covers_is_refused() {
    let t = table();
    let a = nexus("iqn.a");
    let a2 = ItNexus::iscsi("iqn.a", [0x40, 0, 0, 0, 0, 1], "iqn.2024-01.test:tgt", 2);
    let b = nexus("iqn.b");
    for n in [&a, &a2, &b] {
        ready(&t, n);
    }
    let all = PrOutParameters {
        all_tg_pt: true,
        ..keys(0, 0xa)
    };
    let r = prout(&t, &a, PrOutAction::Register, PrType::WriteExclusive, all);
    assert_eq!(r.status, GOOD);
    register(&t, &b, 0xb);
    assert_eq!(reserve(&t, &a, 0xa, PrType::WriteExclusive).status, GOOD);
    let before = full_status(&t, &b);
    for unreg in [true, false] {
        let r = register_and_move(&t, &a, 0xa, 0xa2, &a2, 2, unreg);
        expect_check(
            &r,
            SenseKey::IllegalRequest,
            Asc::INVALID_FIELD_IN_PARAMETER_LIST,
        );
        assert_eq!(full_status(&t, &b), before);
    }
    assert_eq!(can_write(&t, &a2), GOOD);
    assert_eq!(can_write(&t, &b), CONFLICT);
}

#[test]
fn register_and_move_checks_the_port_and_the_type() {
    let (t, a, b, _) = three();
    t.set_port_groups(super::tests_alua_stall::groups_with_second(
        AluaState::ActiveOptimized,
    ));
    for n in [&a, &b] {
        // The port groups' change is a unit attention.
        run(&t, n, &c(Cdb::TestUnitReady), &[], 0);
    }
    register(&t, &a, 0xa);
    assert_eq!(reserve(&t, &a, 0xa, PrType::WriteExclusive).status, GOOD);
    let before = full_status(&t, &a);
    // Port 0 is reserved, and the unit is reached through ports 1 and 2.
    for rtpi in [0, 3] {
        let r = register_and_move(&t, &a, 0xa, 0xb, &b, rtpi, false);
        expect_check(
            &r,
            SenseKey::IllegalRequest,
            Asc::INVALID_FIELD_IN_PARAMETER_LIST,
        );
        assert_eq!(full_status(&t, &a), before, "port {rtpi}");
    }
    assert_eq!(
        register_and_move(&t, &a, 0xa, 0xb, &b, 2, false).status,
        GOOD
    );
    // Every registrant holds an all-registrants reservation: none can move
    // it (SPC-4 5.9.8: RESERVATION CONFLICT).
    let (t, a, b, _) = three();
    register(&t, &a, 0xa);
    let all = PrType::WriteExclusiveAllRegistrants;
    assert_eq!(reserve(&t, &a, 0xa, all).status, GOOD);
    let before = full_status(&t, &a);
    assert_eq!(
        register_and_move(&t, &a, 0xa, 0xb, &b, 1, false).status,
        CONFLICT
    );
    assert_eq!(full_status(&t, &a), before);
}

/// A PREEMPT that only removes registrations ignores the CDB's TYPE and
/// SCOPE (SPC-4 5.12.11.2.2, 5.12.11.2.3): cluster managers send it with
/// whatever those fields hold. One that makes a reservation (preempting the
/// holder) checks them.
#[test]
fn a_preempt_that_only_removes_registrations_ignores_type_and_scope() {
    let preempt = |t: &LunTable, n: &ItNexus, rk: u64, sak: u64, scope: u8, ty: u8| {
        let data = PrOutData::Basic(keys(rk, sak)).encode();
        let cdb = c(Cdb::PersistentReserveOut {
            service_action: PrOutAction::Preempt,
            scope,
            pr_type: ty,
            parameter_list_length: data.len() as u32,
        });
        run(t, n, &cdb, &data, 0)
    };
    let registered = |t: &LunTable, n: &ItNexus| {
        let keys = prin(t, n, PrInAction::ReadKeys);
        u32::from_be_bytes(keys[4..8].try_into().unwrap()) / 8
    };
    let (t, a, b, x) = three();
    for (n, key) in [(&a, 0xa), (&b, 0xb), (&x, 0xc)] {
        register(&t, n, key);
    }
    // No reservation: B's registration goes; type 0 (none) is ignored.
    assert_eq!(preempt(&t, &a, 0xa, 0xb, 0, 0).status, GOOD);
    assert_eq!(registered(&t, &a), 2);
    // A holds the reservation: preempting X, not the holder, ignores an
    // element scope and type 0 as well.
    assert_eq!(reserve(&t, &a, 0xa, PrType::WriteExclusive).status, GOOD);
    assert_eq!(preempt(&t, &a, 0xa, 0xc, 2, 0).status, GOOD);
    assert_eq!(registered(&t, &a), 1);
    // Preempting the holder makes a reservation of that type: checked.
    ready(&t, &b);
    register(&t, &b, 0xb);
    expect_check(
        &preempt(&t, &b, 0xb, 0xa, 0, 0),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_CDB,
    );
    assert_eq!(registered(&t, &a), 2, "nothing removed");
    assert_eq!(
        preempt(&t, &b, 0xb, 0xa, 0, PrType::ExclusiveAccess.code()).status,
        GOOD
    );
    assert_eq!(registered(&t, &b), 1);
}

#[test]
fn aptpl_and_spec_i_pt_belong_to_the_registering_actions() {
    // APTPL on a unit that cannot persist: refused for REGISTER, ignored by
    // the others (SPC-4 6.16.3).
    let (t, a, _, _) = three();
    let mut p = keys(0, 0xa);
    p.aptpl = true;
    let r = prout(&t, &a, PrOutAction::Register, PrType::WriteExclusive, p);
    expect_check(
        &r,
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
    );
    register(&t, &a, 0xa);
    let mut p = keys(0xa, 0);
    p.aptpl = true;
    let r = prout(
        &t,
        &a,
        PrOutAction::Reserve,
        PrType::WriteExclusive,
        p.clone(),
    );
    assert_eq!(r.status, GOOD);
    let r = prout(&t, &a, PrOutAction::Release, PrType::WriteExclusive, p);
    assert_eq!(r.status, GOOD);
    // SPEC_I_PT is for REGISTER alone.
    let p = PrOutParameters {
        spec_i_pt: true,
        transport_ids: vec![TransportId::Iscsi {
            name: "iqn.b".into(),
            isid: None,
        }],
        ..keys(0xa, 0)
    };
    let before = full_status(&t, &a);
    for sa in [
        PrOutAction::Reserve,
        PrOutAction::Clear,
        PrOutAction::Preempt,
    ] {
        let r = prout(&t, &a, sa, PrType::WriteExclusive, p.clone());
        expect_check(
            &r,
            SenseKey::IllegalRequest,
            Asc::INVALID_FIELD_IN_PARAMETER_LIST,
        );
        assert_eq!(full_status(&t, &a), before, "{sa:?}");
    }
    // APTPL of REGISTER AND MOVE is byte 17 bit 0 of its list.
    let (t2, a2, b2, _) = three();
    register(&t2, &a2, 0xa);
    assert_eq!(reserve(&t2, &a2, 0xa, PrType::WriteExclusive).status, GOOD);
    let s = expect_check(
        &register_and_move_aptpl(&t2, &a2, (0xa, 0xb), &b2, 1, false, true),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
    );
    assert_eq!(
        s.sks,
        Some(blockwire_pdu::scsi::SenseKeySpecific::FieldPointer(
            blockwire_pdu::scsi::FieldPointer::parameter(17, Some(0))
        ))
    );
    // The bit set in a plain 24-byte list, with no TransportIDs after it:
    // still the invalid field, not PARAMETER LIST LENGTH ERROR.
    let mut data = PrOutData::Basic(keys(0xa, 0)).encode();
    data.truncate(24);
    data[20] |= 0x08;
    let cdb = c(Cdb::PersistentReserveOut {
        service_action: PrOutAction::Reserve,
        scope: 0,
        pr_type: PrType::WriteExclusive.code(),
        parameter_list_length: 24,
    });
    let s = expect_check(
        &run(&t, &a, &cdb, &data, 0),
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
    );
    assert_eq!(
        s.sks,
        Some(blockwire_pdu::scsi::SenseKeySpecific::FieldPointer(
            blockwire_pdu::scsi::FieldPointer::parameter(20, Some(3))
        ))
    );
}

/// An unregistered I_T nexus's REGISTER with SERVICE ACTION RESERVATION KEY
/// zero does nothing (SPC-4 table "Register behaviors"). Its APTPL bit of
/// zero used to turn APTPL off and remove the saved reservations, so that a
/// fenced node could lift its own fence at the next restart of the target.
#[test]
fn a_register_that_does_nothing_keeps_the_saved_reservations() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun0.pr");
    let mk = aptpl_unit(&path);
    let (fencer, fenced) = (nexus("iqn.fencer"), nexus("iqn.fenced"));
    let t = mk();
    ready(&t, &fencer);
    ready(&t, &fenced);
    let mut p = keys(0, 0xf);
    p.aptpl = true;
    let r = prout(
        &t,
        &fencer,
        PrOutAction::Register,
        PrType::WriteExclusive,
        p,
    );
    assert_eq!(r.status, GOOD);
    let ty = PrType::WriteExclusiveRegistrantsOnly;
    assert_eq!(reserve(&t, &fencer, 0xf, ty).status, GOOD);
    let saved = std::fs::read(&path).unwrap();
    let before = full_status(&t, &fencer);
    for sa in [
        PrOutAction::Register,
        PrOutAction::RegisterAndIgnoreExistingKey,
    ] {
        let r = prout(&t, &fenced, sa, PrType::WriteExclusive, keys(0, 0));
        assert_eq!(r.status, GOOD, "{sa:?}");
        assert_eq!(full_status(&t, &fencer), before, "{sa:?}");
        assert_eq!(std::fs::read(&path).unwrap(), saved, "{sa:?}");
        let caps = prin(&t, &fencer, PrInAction::ReportCapabilities);
        assert_eq!(caps[3] & 1, 1, "PTPL_A after {sa:?}");
    }
    drop(t);
    let t = mk();
    ready(&t, &fenced);
    assert_eq!(can_write(&t, &fenced), CONFLICT);
}

#[test]
fn log_sense_and_allowing_medium_removal_never_conflict() {
    for ty in [PrType::WriteExclusive, PrType::ExclusiveAccess] {
        let (t, a, _, x) = three();
        register(&t, &a, 0xa);
        assert_eq!(reserve(&t, &a, 0xa, ty).status, GOOD);
        let log = c(Cdb::LogSense {
            sp: false,
            ppc: false,
            page_control: 1,
            page_code: 0,
            subpage_code: 0,
            parameter_pointer: 0,
            allocation_length: 64,
        });
        assert_eq!(run(&t, &x, &log, &[], 64).status, GOOD, "{ty:?}");
        let allow = c(Cdb::PreventAllowMediumRemoval { prevent: 0 });
        assert_eq!(run(&t, &x, &allow, &[], 0).status, GOOD, "{ty:?}");
        let prevent = c(Cdb::PreventAllowMediumRemoval { prevent: 1 });
        assert_eq!(run(&t, &x, &prevent, &[], 0).status, CONFLICT, "{ty:?}");
    }
}

/// A maker of a unit whose saved reservations live at `path`, over one RAM
/// store: each unit it makes is the same LUN after a restart.
fn aptpl_unit(path: &std::path::Path) -> impl Fn() -> LunTable {
    let store = Arc::new(RamBackstore::new(1 << 20));
    let path = path.to_owned();
    move || {
        let mut cfg = LuConfig::new(store.clone());
        cfg.pr_state_path = Some(path.clone());
        LunTable::new(vec![(0, Arc::new(LogicalUnit::new(cfg)))])
    }
}

/// `n` registers key 77h with APTPL and reserves Exclusive Access.
fn reserve_persistently(t: &LunTable, n: &ItNexus) {
    ready(t, n);
    let mut p = keys(0, 0x77);
    p.aptpl = true;
    assert_eq!(
        prout(t, n, PrOutAction::Register, PrType::WriteExclusive, p).status,
        GOOD
    );
    assert_eq!(reserve(t, n, 0x77, PrType::ExclusiveAccess).status, GOOD);
}

#[test]
fn aptpl_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun0.pr");
    let mk = aptpl_unit(&path);
    let (a, b) = (nexus("iqn.a"), nexus("iqn.b"));
    reserve_persistently(&mk(), &a);
    assert!(path.exists());
    let t = mk();
    ready(&t, &a);
    ready(&t, &b);
    assert_eq!(can_read(&t, &b), CONFLICT);
    assert_eq!(can_read(&t, &a), GOOD);
    let d = prin(&t, &b, PrInAction::ReportCapabilities);
    assert_eq!(d[3] & 1, 1, "PTPL_A");
    // The registration and the reservation came back; the generation,
    // set to zero by a power on whatever APTPL says (SPC-4 6.16.2), did not.
    let generation_of = |t: &LunTable| {
        u32::from_be_bytes(prin(t, &b, PrInAction::ReadKeys)[0..4].try_into().unwrap())
    };
    assert_eq!(generation_of(&t), 0, "PRgeneration after a restart");
    // Registering without APTPL drops the file.
    let r = prout(
        &t,
        &a,
        PrOutAction::Register,
        PrType::WriteExclusive,
        keys(0x77, 0x78),
    );
    assert_eq!(r.status, GOOD);
    assert!(!path.exists());
}

/// The APTPL file is written one record a line with fields between spaces,
/// and the names in it come from the initiators' logins. A name with a space
/// or a line break must come back as it went in, and must not add, drop or
/// forge a record: otherwise one initiator's registration could make the file
/// unreadable at the next start, and with it every fencing reservation.
#[test]
fn aptpl_names_cannot_break_or_forge_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun0.pr");
    let mk = aptpl_unit(&path);
    let fencer = nexus("iqn.2026-11.io.example:fencer");
    let odd = nexus("iqn.x y\nresv 3 1\nreg 00000000000000ee 1 0 1 iqn.forged t %41");
    let fenced = nexus("iqn.2026-11.io.example:fenced");
    {
        let t = mk();
        for n in [&fencer, &odd] {
            ready(&t, n);
        }
        let mut p = keys(0, 0x77);
        p.aptpl = true;
        assert_eq!(
            prout(
                &t,
                &fencer,
                PrOutAction::Register,
                PrType::WriteExclusive,
                p
            )
            .status,
            GOOD
        );
        assert_eq!(
            reserve(&t, &fencer, 0x77, PrType::ExclusiveAccess).status,
            GOOD
        );
        let mut p = keys(0, 0x99);
        p.aptpl = true;
        assert_eq!(
            prout(&t, &odd, PrOutAction::Register, PrType::WriteExclusive, p).status,
            GOOD
        );
    }
    let t = mk();
    for n in [&fencer, &odd, &fenced] {
        ready(&t, n);
    }
    assert_eq!(
        can_read(&t, &fenced),
        CONFLICT,
        "the reservation must survive"
    );
    assert_eq!(can_read(&t, &fencer), GOOD);
    // READ KEYS: exactly the two keys registered, no forged 0xee.
    let d = prin(&t, &fencer, PrInAction::ReadKeys);
    let len = u32::from_be_bytes(d[4..8].try_into().unwrap()) as usize;
    let mut got: Vec<u64> = d[8..8 + len]
        .chunks(8)
        .map(|k| u64::from_be_bytes(k.try_into().unwrap()))
        .collect();
    got.sort();
    assert_eq!(got, vec![0x77, 0x99]);
    // The odd name's registration is still its own: it can unregister.
    let r = prout(
        &t,
        &odd,
        PrOutAction::Register,
        PrType::WriteExclusive,
        keys(0x99, 0),
    );
    assert_eq!(r.status, GOOD);
}

/// A saved reservation file that cannot be read (a damaged disk, a bad hand
/// edit) must not bring the unit up without its reservations: a node fenced
/// out by them would read and write again. The unit answers every command but
/// INQUIRY, REPORT LUNS and REQUEST SENSE with NOT READY, MANUAL INTERVENTION
/// REQUIRED, and writes nothing over the file.
#[test]
fn an_unreadable_reservation_file_keeps_the_unit_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun0.pr");
    let damaged = "blockwire-pr 1\ngeneration 3\nreg 77 1 0 1 iqn.a,i,0x400000000001\n";
    std::fs::write(&path, damaged).unwrap();
    let mut cfg = LuConfig::new(Arc::new(RamBackstore::new(1 << 20)));
    cfg.pr_state_path = Some(path.clone());
    let t = LunTable::new(vec![(0, Arc::new(LogicalUnit::new(cfg)))]);
    let n = nexus("iqn.2026-11.io.example:node");
    // The first commands report the power-on unit attention.
    for _ in 0..4 {
        let _ = run(&t, &n, &c(Cdb::TestUnitReady), &[], 0);
    }
    let not_ready = |r: &ScsiResult| {
        expect_check(
            r,
            SenseKey::NotReady,
            Asc::LU_NOT_READY_MANUAL_INTERVENTION_REQUIRED,
        );
    };
    not_ready(&run(&t, &n, &c(Cdb::TestUnitReady), &[], 0));
    not_ready(&read(&t, &n, 0, 1));
    not_ready(&write(&t, &n, 0, &[7; 512]));
    not_ready(&prout(
        &t,
        &n,
        PrOutAction::Register,
        PrType::WriteExclusive,
        keys(0, 5),
    ));
    let inquiry = c(Cdb::Inquiry {
        evpd: false,
        page_code: 0,
        allocation_length: 96,
    });
    assert_eq!(run(&t, &n, &inquiry, &[], 96).status, GOOD);
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        damaged,
        "the file was written over"
    );
}

#[test]
fn spc2_reserve_release_and_nexus_loss() {
    let (t, a, b, _) = three();
    assert_eq!(run(&t, &a, &c(Cdb::Reserve6), &[], 0).status, GOOD);
    assert_eq!(run(&t, &b, &c(Cdb::Reserve6), &[], 0).status, CONFLICT);
    assert_eq!(can_read(&t, &b), CONFLICT);
    assert_eq!(can_read(&t, &a), GOOD);
    // RELEASE by a non-holder is a no-op.
    assert_eq!(run(&t, &b, &c(Cdb::Release6), &[], 0).status, GOOD);
    assert_eq!(can_read(&t, &b), CONFLICT);
    t.nexus_lost(&a);
    assert_eq!(can_read(&t, &b), GOOD);
    assert_eq!(run(&t, &b, &c(Cdb::Reserve6), &[], 0).status, GOOD);
    let _ = t.reset_lun(0, &a);
    ready(&t, &a);
    assert_eq!(can_read(&t, &a), GOOD);
}

/// RESERVE and RELEASE (SPC-2) beside persistent registrations, with
/// CRH=1 (SPC-4 5.9.3): a successful no-op from the holder and, under a
/// registrants-only or all-registrants reservation, from a registered
/// nexus; a RESERVATION CONFLICT from anyone else while any registration
/// stands (SPC-2 5.5.1), reservation or not. A RESERVE granted to an
/// outsider would refuse the registrants' PREEMPT: fencing lost.
#[test]
fn reserve_and_release_beside_registrations_follow_crh() {
    let (t, a, b, x) = three();
    let reserve6 = |n: &ItNexus| run(&t, n, &c(Cdb::Reserve6), &[], 0).status;
    let release6 = |n: &ItNexus| run(&t, n, &c(Cdb::Release6), &[], 0).status;
    register(&t, &a, 0xa);
    register(&t, &b, 0xb);
    assert_eq!(reserve6(&x), CONFLICT, "RESERVE beside registrations");
    assert_eq!(release6(&x), CONFLICT, "RELEASE beside registrations");
    assert_eq!(
        reserve6(&a),
        CONFLICT,
        "RESERVE of a registrant, no reservation"
    );
    assert_eq!(
        reserve(&t, &a, 0xa, PrType::WriteExclusiveRegistrantsOnly).status,
        GOOD
    );
    for (who, n) in [("the holder", &a), ("a registrant", &b)] {
        assert_eq!(reserve6(n), GOOD, "RESERVE of {who}");
        assert_eq!(release6(n), GOOD, "RELEASE of {who}");
    }
    assert_eq!(reserve6(&x), CONFLICT);
    assert_eq!(release6(&x), CONFLICT);
    // Nothing changed: B still writes as a registrant, and preempts.
    assert_eq!(can_write(&t, &b), GOOD);
    let r = prout(
        &t,
        &b,
        PrOutAction::Preempt,
        PrType::WriteExclusiveRegistrantsOnly,
        keys(0xb, 0xa),
    );
    assert_eq!(r.status, GOOD);
}

#[test]
fn preempt_holder_changes_type_and_tells_others() {
    let (t, a, b, x) = three();
    register(&t, &a, 1);
    register(&t, &b, 2);
    register(&t, &x, 3);
    assert_eq!(reserve(&t, &b, 2, PrType::WriteExclusive).status, GOOD);
    let r = prout(
        &t,
        &a,
        PrOutAction::Preempt,
        PrType::ExclusiveAccess,
        keys(1, 2),
    );
    assert_eq!(r.status, GOOD);
    expect_check(
        &run(&t, &b, &c(Cdb::TestUnitReady), &[], 0),
        SenseKey::UnitAttention,
        Asc::REGISTRATIONS_PREEMPTED,
    );
    expect_check(
        &run(&t, &x, &c(Cdb::TestUnitReady), &[], 0),
        SenseKey::UnitAttention,
        Asc::RESERVATIONS_RELEASED,
    );
    assert_eq!(can_read(&t, &x), CONFLICT);
    // Preempting a key nobody has conflicts.
    let r = prout(
        &t,
        &a,
        PrOutAction::Preempt,
        PrType::ExclusiveAccess,
        keys(1, 99),
    );
    assert_eq!(r.status, CONFLICT);
    // Preempting with key 0 when not the holder's key is invalid.
    let r = prout(
        &t,
        &a,
        PrOutAction::Preempt,
        PrType::ExclusiveAccess,
        keys(1, 0),
    );
    expect_check(
        &r,
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Random PR OUT sequences from three nexuses never leave the state
    /// inconsistent: a reservation implies a registered holder that can
    /// write, READ KEYS and READ FULL STATUS agree, the generation never
    /// goes back.
    #[test]
    fn pr_state_machine_invariants(ops in proptest::collection::vec((0usize..3, 0u8..8, 0u64..4, 0u64..4, 0usize..6), 1..40)) {
        let (t, a, b, x) = three();
        let ns = [a, b, x];
        let types = [PrType::WriteExclusive, PrType::ExclusiveAccess, PrType::WriteExclusiveRegistrantsOnly,
            PrType::ExclusiveAccessRegistrantsOnly, PrType::WriteExclusiveAllRegistrants, PrType::ExclusiveAccessAllRegistrants];
        let mut last_gen = 0u32;
        for (who, action, rk, sak, ty) in ops {
            let sa = [PrOutAction::Register, PrOutAction::RegisterAndIgnoreExistingKey, PrOutAction::Reserve,
                PrOutAction::Release, PrOutAction::Clear, PrOutAction::Preempt, PrOutAction::PreemptAndAbort,
                PrOutAction::Register][action as usize];
            let r = prout(&t, &ns[who], sa, types[ty], keys(rk, sak));
            prop_assert!(matches!(r.status, GOOD | CHECK | CONFLICT));
            for n in &ns {
                while run(&t, n, &c(Cdb::TestUnitReady), &[], 0).status == CHECK {}
            }
            let k = prin(&t, &ns[0], PrInAction::ReadKeys);
            let gen = u32::from_be_bytes(k[0..4].try_into().unwrap());
            prop_assert!(gen >= last_gen);
            last_gen = gen;
            let nkeys = u32::from_be_bytes(k[4..8].try_into().unwrap()) / 8;
            let fs = prin(&t, &ns[0], PrInAction::ReadFullStatus);
            let mut off = 8;
            let mut ndesc = 0;
            let mut holders = 0;
            while off < fs.len() {
                ndesc += 1;
                if fs[off + 12] & 1 == 1 { holders += 1; }
                off += 24 + u32::from_be_bytes(fs[off + 20..off + 24].try_into().unwrap()) as usize;
            }
            prop_assert_eq!(ndesc, nkeys);
            let rr = prin(&t, &ns[0], PrInAction::ReadReservation);
            let reserved = rr[7] == 16;
            prop_assert_eq!(reserved, holders > 0);
            if reserved {
                // Some holder can always write.
                let writers = ns.iter().filter(|n| write(&t, n, 1, &[1; 512]).status == GOOD).count();
                prop_assert!(writers >= 1);
            }
        }
    }
}

#[test]
fn compare_and_write_respects_reservations() {
    let (t, a, b, _) = three();
    register(&t, &a, 1);
    assert_eq!(reserve(&t, &a, 1, PrType::WriteExclusive).status, GOOD);
    let cdb = c(Cdb::CompareAndWrite {
        lba: 0,
        blocks: 1,
        wrprotect: 0,
        dpo: false,
        fua: false,
        group: 0,
    });
    assert_eq!(run(&t, &b, &cdb, &[0; 1024], 0).status, CONFLICT);
    let _ = CdbSize::Ten;
}

/// What READ FULL STATUS reports (SPC-4 6.16.5): the generation and, per
/// registration, its key, initiator port (from the TransportID), relative
/// target port, ALL_TG_PT, R_HOLDER and the reservation type.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FullStatus {
    generation: u32,
    registrations: Vec<(u64, String, u16, bool, bool, u8)>,
}

fn full_status(t: &LunTable, n: &ItNexus) -> FullStatus {
    let fs = prin(t, n, PrInAction::ReadFullStatus);
    let generation = u32::from_be_bytes(fs[0..4].try_into().unwrap());
    let end = 8 + u32::from_be_bytes(fs[4..8].try_into().unwrap()) as usize;
    let mut registrations = Vec::new();
    let mut off = 8;
    while off < end {
        let d = &fs[off..];
        let key = u64::from_be_bytes(d[0..8].try_into().unwrap());
        let tid_len = u32::from_be_bytes(d[20..24].try_into().unwrap()) as usize;
        let tid = &d[24..24 + tid_len];
        // An iSCSI TransportID: the name (with ",i,0x" and the ISID for
        // format 01b), NUL terminated, after a 4-byte header.
        let name: String = tid[4..]
            .iter()
            .take_while(|&&b| b != 0)
            .map(|&b| b as char)
            .collect();
        let rtpi = u16::from_be_bytes(d[18..20].try_into().unwrap());
        registrations.push((
            key,
            name,
            rtpi,
            d[12] & 2 != 0,
            d[12] & 1 != 0,
            d[13] & 0x0f,
        ));
        off += 24 + tid_len;
    }
    registrations.sort();
    FullStatus {
        generation,
        registrations,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    /// Random PR OUT sequences from four I_T nexuses (three initiators, one
    /// of them through two target ports), with keys that collide and
    /// ALL_TG_PT on and off. After each command, every nexus's READ and
    /// WRITE answer exactly as the conflict table (SPC-4 5.9.1, SBC-3
    /// table 13) says for the state READ FULL STATUS reports: holders may do
    /// anything; registrants may too under a registrants-only or
    /// all-registrants reservation; otherwise a Write Exclusive type lets
    /// READs through and an Exclusive Access type nothing. A command that
    /// is not GOOD changes nothing, and RESERVE and RELEASE never change
    /// the generation. Now and then the unit restarts: with APTPL the
    /// registrations and the reservation come back as they were, without
    /// APTPL none do.
    #[test]
    fn every_nexus_is_fenced_as_the_reported_state_says(
        ops in proptest::collection::vec((0usize..4, 0u8..9, 0u64..3, 0u64..3, 0usize..6, any::<bool>(), any::<bool>()), 1..32)
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mk = aptpl_unit(&dir.path().join("lun0.pr"));
        let mut t = mk();
        let a = nexus("iqn.a");
        let a2 = ItNexus::iscsi("iqn.a", [0x40, 0, 0, 0, 0, 1], "iqn.2024-01.test:tgt", 2);
        let (b, x) = (nexus("iqn.b"), nexus("iqn.x"));
        let ns = [a, a2, b, x];
        let types = [PrType::WriteExclusive, PrType::ExclusiveAccess, PrType::WriteExclusiveRegistrantsOnly,
            PrType::ExclusiveAccessRegistrantsOnly, PrType::WriteExclusiveAllRegistrants, PrType::ExclusiveAccessAllRegistrants];
        let settle = |t: &LunTable, n: &ItNexus| {
            for _ in 0..8 {
                if run(t, n, &c(Cdb::TestUnitReady), &[], 0).status != CHECK {
                    return;
                }
            }
            panic!("unit attentions never end");
        };
        for n in &ns {
            settle(&t, n);
        }
        for (who, action, rk, sak, ty, all_tg_pt, aptpl) in ops {
            if action == 7 {
                // A restart: with APTPL (PTPL_A) every registration and the
                // reservation come back as they were; without, none.
                let before = full_status(&t, &ns[0]);
                let kept = prin(&t, &ns[0], PrInAction::ReportCapabilities)[3] & 1 == 1;
                drop(t);
                t = mk();
                for n in &ns {
                    settle(&t, n);
                }
                let after = full_status(&t, &ns[0]);
                let expected = if kept { before.registrations } else { vec![] };
                prop_assert_eq!(after.registrations, expected, "after a restart (PTPL_A {})", kept);
                prop_assert_eq!(after.generation, 0, "PRgeneration after a restart (power on)");
                continue;
            }
            let sa = [PrOutAction::Register, PrOutAction::RegisterAndIgnoreExistingKey, PrOutAction::Reserve,
                PrOutAction::Release, PrOutAction::Clear, PrOutAction::Preempt, PrOutAction::PreemptAndAbort]
                .get(action as usize).copied().unwrap_or(PrOutAction::RegisterAndMove);
            let before = full_status(&t, &ns[0]);
            let r = if sa == PrOutAction::RegisterAndMove {
                // To the nexus `ty` picks, on its port; UNREG as ALL_TG_PT says.
                let dest = &ns[ty % ns.len()];
                register_and_move(&t, &ns[who], rk, sak, dest, dest.relative_target_port, all_tg_pt)
            } else {
                let params = PrOutParameters { all_tg_pt, aptpl, ..keys(rk, sak) };
                prout(&t, &ns[who], sa, types[ty], params)
            };
            prop_assert!(matches!(r.status, GOOD | CHECK | CONFLICT), "{r:?}");
            for n in &ns {
                settle(&t, n);
            }
            let after = full_status(&t, &ns[0]);
            if r.status != GOOD {
                prop_assert_eq!(&after, &before, "{:?} by nexus {} answered {:#x} and changed the state", sa, who, r.status);
            }
            if matches!(sa, PrOutAction::Reserve | PrOutAction::Release) {
                prop_assert_eq!(after.generation, before.generation, "{:?} changed the generation", sa);
            }
            for n in &ns {
                let mine: Vec<_> = after.registrations.iter()
                    .filter(|(_, port, rtpi, all, _, _)| port.eq_ignore_ascii_case(&n.initiator_port) && (*all || *rtpi == n.relative_target_port))
                    .collect();
                prop_assert!(mine.len() <= 1, "nexus {} has {} registrations", n.initiator_port, mine.len());
                let registered = !mine.is_empty();
                let holder = mine.iter().any(|r| r.4);
                let reservation = after.registrations.iter().find(|r| r.4).map(|r| r.5);
                let expected = match reservation {
                    None => (GOOD, GOOD),
                    Some(_) if holder => (GOOD, GOOD),
                    // Registrants only (5h, 6h) and all registrants (7h, 8h).
                    Some(5..=8) if registered => (GOOD, GOOD),
                    // Write Exclusive types (1h, 5h, 7h) let READs through.
                    Some(1 | 5 | 7) => (GOOD, CONFLICT),
                    Some(_) => (CONFLICT, CONFLICT),
                };
                let got = (can_read(&t, n), can_write(&t, n));
                prop_assert_eq!(got, expected, "nexus {} (registered {}, holder {}) under {:?}", n.initiator_port, registered, holder, after);
            }
        }
    }
}

/// A SPEC_I_PT REGISTER listing more initiator ports than the unit can
/// register is refused for want of resources (SPC-4 5.14.7, INSUFFICIENT
/// REGISTRATION RESOURCES) before any of its list is matched against the
/// rest: matching every listed port against all others, with the unit's
/// reservation state locked, took minutes for a list of tens of thousands,
/// and every command of every initiator waited on that lock.
#[test]
fn a_spec_i_pt_list_beyond_the_registration_limit_is_refused_at_once() {
    let (t, a, b, _) = three();
    let ids: Vec<TransportId> = (0..40_000)
        .map(|i| TransportId::Iscsi {
            name: format!("iqn.2024-01.listed:{i}"),
            isid: None,
        })
        .collect();
    let p = PrOutParameters {
        spec_i_pt: true,
        transport_ids: ids,
        ..keys(0, 5)
    };
    let t = std::sync::Arc::new(t);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let (t2, a2) = (t.clone(), a.clone());
    std::thread::spawn(move || {
        let r = prout(&t2, &a2, PrOutAction::Register, PrType::WriteExclusive, p);
        let _ = done_tx.send(r);
    });
    let r = done_rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the REGISTER still runs after 20 s, holding the reservation state");
    expect_check(
        &r,
        SenseKey::IllegalRequest,
        Asc::INSUFFICIENT_REGISTRATION_RESOURCES,
    );
    assert_eq!(can_write(&t, &b), GOOD, "nothing was registered");
    assert_eq!(full_status(&t, &a).registrations.len(), 0);
}

/// An APTPL file cut short (a damaged disk, a copy that stopped) is damage,
/// not a smaller state: without its last lines it would bring the unit up
/// with no reservation, or with the registrations after the cut gone, and
/// a fenced node could write. The unit stays NOT READY, as for any other
/// unreadable file.
#[test]
fn a_reservation_file_cut_short_keeps_the_unit_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun0.pr");
    let mk = aptpl_unit(&path);
    let (a, b) = (nexus("iqn.a"), nexus("iqn.b"));
    reserve_persistently(&mk(), &a);
    let whole = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = whole.lines().collect();
    for keep in 1..lines.len() {
        let cut = format!("{}\n", lines[..keep].join("\n"));
        let mut cuts = vec![cut.clone()];
        // Cut inside a line too: every byte of the last line but one.
        cuts.extend((1..lines[keep].len()).map(|n| format!("{cut}{}", &lines[keep][..n])));
        for cut in cuts {
            std::fs::write(&path, &cut).unwrap();
            let t = mk();
            for _ in 0..4 {
                let _ = run(&t, &b, &c(Cdb::TestUnitReady), &[], 0);
            }
            let r = run(&t, &b, &c(Cdb::TestUnitReady), &[], 0);
            assert_eq!(r.status, CHECK, "restored from {cut:?}");
            expect_check(
                &r,
                SenseKey::NotReady,
                Asc::LU_NOT_READY_MANUAL_INTERVENTION_REQUIRED,
            );
        }
    }
    // The whole file still restores the reservation.
    std::fs::write(&path, &whole).unwrap();
    let t = mk();
    ready(&t, &b);
    assert_eq!(can_read(&t, &b), CONFLICT);
}

/// An SPC-2 RESERVE and a persistent REGISTER racing from two nexuses end
/// with one of them refused, whichever order their checks and their work
/// interleave in: the check lets go of the unit's lock before the work
/// takes it again. Both succeeded, and from then on the registrant's
/// PREEMPT met RESERVATION CONFLICT: fencing stopped working.
#[test]
fn a_reserve_and_a_registration_racing_cannot_both_stand() {
    let (t, a, b, _) = three();
    let lu = t.get(0).unwrap();
    // A's RESERVE(6) passed its check; B registers before A's RESERVE runs.
    assert!(lu.reservation_check(&a, &Cdb::Reserve6).is_ok());
    register(&t, &b, 0xb);
    assert!(
        matches!(lu.reserve_spc2(&a), Err(super::outcome::Failure::Conflict)),
        "a RESERVE granted beside a registration"
    );
    // Nothing SPC-2 stands in the registrant's way.
    let r = prout(
        &t,
        &b,
        PrOutAction::Reserve,
        PrType::WriteExclusive,
        keys(0xb, 0),
    );
    assert_eq!(r.status, GOOD);

    // B's REGISTER passed its check; A reserves before B's REGISTER runs.
    let (t, a, b, _) = three();
    let lu = t.get(0).unwrap();
    let register_b = Cdb::PersistentReserveOut {
        service_action: PrOutAction::Register,
        scope: 0,
        pr_type: 0,
        parameter_list_length: 24,
    };
    assert!(lu.reservation_check(&b, &register_b).is_ok());
    assert_eq!(run(&t, &a, &c(Cdb::Reserve6), &[], 0).status, GOOD);
    let data = PrOutData::Basic(keys(0, 0xb)).encode();
    let r = lu.pr_out(&b, &[1], PrOutAction::Register, 0, 0, 24, &data);
    assert!(
        matches!(r, Err(super::outcome::Failure::Conflict)),
        "a registration made beside an SPC-2 reservation"
    );
    // READ KEYS (from A, the holder): no key registered.
    assert_eq!(&prin(&t, &a, PrInAction::ReadKeys)[4..8], &[0, 0, 0, 0]);
}

/// A SPEC_I_PT list's TransportIDs differ in length (an iSCSI one by its
/// name): a listed port the target refuses, already registered or of
/// another protocol, is named by the byte where its TransportID starts in
/// the parameter list (SPC-4 6.16.3), where it was 28 plus its index.
#[test]
fn a_refused_listed_port_is_named_where_its_transport_id_starts() {
    let long = TransportId::Iscsi {
        name: "iqn.2024-01.listed:a-name-long-enough-for-sixty-four-bytes-of-id".into(),
        isid: None,
    };
    let mut first = Vec::new();
    long.encode_into(&mut first);
    assert_eq!(first.len(), 72);
    let fc = TransportId::Other {
        protocol_identifier: 0,
        bytes: vec![0; 24],
    };
    for (second, what) in [(long.clone(), "listed twice"), (fc, "a Fibre Channel port")] {
        let (t, a, _, _) = three();
        let p = PrOutParameters {
            spec_i_pt: true,
            transport_ids: vec![long.clone(), second],
            ..keys(0, 5)
        };
        let s = expect_check(
            &prout(&t, &a, PrOutAction::Register, PrType::WriteExclusive, p),
            SenseKey::IllegalRequest,
            Asc::INVALID_FIELD_IN_PARAMETER_LIST,
        );
        assert_eq!(
            s.sks,
            Some(blockwire_pdu::scsi::SenseKeySpecific::FieldPointer(
                blockwire_pdu::scsi::FieldPointer::parameter(28 + 72, None)
            )),
            "{what}"
        );
        assert_eq!(full_status(&t, &a).registrations.len(), 0, "{what}");
    }
}
