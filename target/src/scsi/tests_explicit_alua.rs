//! Command-level tests of explicit ALUA: SET TARGET PORT GROUPS from an
//! initiator (SPC-4 5.16.2.5, 6.38), through the LUN table as a fabric
//! calls it, with one nexus through each of two target port groups.

use blockwire_pdu::scsi::{Asc, Cdb, FieldPointer, SenseKey, SenseKeySpecific};

use super::tests::{c, expect_check, read, ready, run, GOOD};
use super::tests_alua_stall::{groups_with_second, two_groups, via};
use super::*;

/// Group 1 active/optimized on port 1, group 2 in standby on port 2; SET
/// TARGET PORT GROUPS allowed or not.
fn active_passive(explicit: bool) -> LunTable {
    let t = two_groups(AluaState::Standby);
    t.set_explicit_alua(explicit);
    t
}

/// A SET TARGET PORT GROUPS parameter list asking each (group, state code).
fn list(requests: &[(u16, u8)]) -> Vec<u8> {
    let mut l = vec![0u8; 4];
    for (group, code) in requests {
        l.extend_from_slice(&[*code, 0]);
        l.extend_from_slice(&group.to_be_bytes());
    }
    l
}

fn stpg(t: &LunTable, n: &ItNexus, list: &[u8]) -> ScsiResult {
    stpg_len(t, n, list, list.len() as u32)
}

fn stpg_len(t: &LunTable, n: &ItNexus, list: &[u8], parameter_list_length: u32) -> ScsiResult {
    let cdb = c(Cdb::SetTargetPortGroups {
        parameter_list_length,
    });
    run(t, n, &cdb, list, 0)
}

/// (group, state code, STATUS CODE) of each REPORT TARGET PORT GROUPS
/// descriptor (one port per group).
fn states(t: &LunTable, n: &ItNexus) -> Vec<(u16, u8, u8)> {
    let cdb = c(Cdb::ReportTargetPortGroups {
        parameter_data_format: 0,
        allocation_length: 1024,
    });
    let r = run(t, n, &cdb, &[], 1024);
    assert_eq!(r.status, GOOD, "{r:?}");
    r.data_in[4..]
        .chunks(12)
        .map(|d| (u16::from_be_bytes([d[2], d[3]]), d[0] & 0x0f, d[5]))
        .collect()
}

fn tpgs(t: &LunTable, n: &ItNexus) -> u8 {
    let inq = c(Cdb::Inquiry {
        evpd: false,
        page_code: 0,
        allocation_length: 96,
    });
    let r = run(t, n, &inq, &[], 96);
    assert_eq!(r.status, GOOD);
    (r.data_in[5] >> 4) & 3
}

/// REPORT SUPPORTED OPERATION CODES' SUPPORT field for SET TARGET PORT
/// GROUPS (011b supported, 001b not).
fn stpg_support(t: &LunTable, n: &ItNexus) -> u8 {
    let cdb = c(Cdb::ReportSupportedOperationCodes {
        rctd: false,
        reporting_options: 2,
        requested_opcode: 0xa4,
        requested_service_action: 0x0a,
        allocation_length: 64,
    });
    let r = run(t, n, &cdb, &[], 64);
    assert_eq!(r.status, GOOD, "{r:?}");
    r.data_in[1] & 7
}

fn field_pointer(r: &ScsiResult, asc: Asc) -> FieldPointer {
    let s = expect_check(r, SenseKey::IllegalRequest, asc);
    match s.sks {
        Some(SenseKeySpecific::FieldPointer(p)) => p,
        other => panic!("no field pointer: {other:?}"),
    }
}

#[test]
fn a_target_with_implicit_alua_only_refuses_stpg_and_says_so() {
    let t = active_passive(false);
    let n = via("iqn.a", 2);
    ready(&t, &n);
    assert_eq!(tpgs(&t, &n), 1, "TPGS 01b: implicit only");
    assert_eq!(stpg_support(&t, &n), 1, "SET TARGET PORT GROUPS not listed");
    let r = stpg(&t, &n, &list(&[(2, 0)]));
    expect_check(
        &r,
        SenseKey::IllegalRequest,
        Asc::INVALID_COMMAND_OPERATION_CODE,
    );
    assert_eq!(states(&t, &n), vec![(1, 0, 2), (2, 2, 2)], "nothing moved");
}

#[test]
fn stpg_moves_the_standby_group_to_active_and_every_other_nexus_hears_it() {
    let t = active_passive(true);
    let (asker, other, bystander) = (via("iqn.a", 2), via("iqn.a", 1), via("iqn.b", 1));
    for n in [&asker, &other, &bystander] {
        ready(&t, n);
    }
    assert_eq!(tpgs(&t, &asker), 3, "TPGS 11b: implicit and explicit");
    assert_eq!(stpg_support(&t, &asker), 3, "SET TARGET PORT GROUPS listed");
    expect_check(
        &read(&t, &asker, 0, 1),
        SenseKey::NotReady,
        Asc::LU_NOT_ACCESSIBLE_TARGET_PORT_IN_STANDBY_STATE,
    );

    let r = stpg(&t, &asker, &list(&[(2, 0)]));
    assert_eq!(r.status, GOOD, "{r:?}");
    assert_eq!(
        states(&t, &asker),
        vec![(1, 0, 2), (2, 0, 1)],
        "group 2 active/optimized, STATUS CODE 01h (altered by SET TARGET PORT GROUPS)"
    );
    assert_eq!(t.port_groups_set_by_command(), vec![2]);
    // The nexus that asked hears nothing; the others (another port of the
    // same initiator, another initiator) hear the change once.
    assert_eq!(read(&t, &asker, 0, 1).status, GOOD, "media through group 2");
    for n in [&other, &bystander] {
        expect_check(
            &run(&t, n, &c(Cdb::TestUnitReady), &[], 0),
            SenseKey::UnitAttention,
            Asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
        );
        assert_eq!(run(&t, n, &c(Cdb::TestUnitReady), &[], 0).status, GOOD);
    }

    // Asking for the state a group has already changes nothing and tells
    // no one.
    assert_eq!(stpg(&t, &asker, &list(&[(2, 0)])).status, GOOD);
    assert_eq!(run(&t, &other, &c(Cdb::TestUnitReady), &[], 0).status, GOOD);

    // Both groups in one list: group 1 to standby, group 2 non-optimized.
    assert_eq!(stpg(&t, &other, &list(&[(1, 2), (2, 1)])).status, GOOD);
    assert_eq!(states(&t, &other), vec![(1, 2, 1), (2, 1, 1)]);
    expect_check(
        &read(&t, &other, 0, 1),
        SenseKey::NotReady,
        Asc::LU_NOT_ACCESSIBLE_TARGET_PORT_IN_STANDBY_STATE,
    );
}

#[test]
fn a_refused_stpg_changes_nothing_and_points_at_the_field() {
    let t = active_passive(true);
    let (asker, other) = (via("iqn.a", 2), via("iqn.b", 1));
    ready(&t, &asker);
    ready(&t, &other);
    let before = states(&t, &asker);

    // No group 9: the second descriptor's TARGET PORT GROUP (byte 8 + 2),
    // even though the first descriptor was valid.
    let p = field_pointer(
        &stpg(&t, &asker, &list(&[(2, 0), (9, 0)])),
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
    );
    assert_eq!((p.in_cdb, p.byte), (false, 10));
    // Unavailable (3h), offline (Eh), transitioning (Fh): not supported
    // here; the pointer names the ASYMMETRIC ACCESS STATE's top bit.
    for code in [0x3, 0x4, 0xe, 0xf] {
        let p = field_pointer(
            &stpg(&t, &asker, &list(&[(2, code)])),
            Asc::INVALID_FIELD_IN_PARAMETER_LIST,
        );
        assert_eq!((p.byte, p.bit), (4, Some(3)), "state {code:#x}");
    }
    // The same group twice.
    let p = field_pointer(
        &stpg(&t, &asker, &list(&[(2, 0), (2, 1)])),
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
    );
    assert_eq!(p.byte, 10);
    // A length that cuts a descriptor, a header alone cut short, and a
    // length longer than the data that came.
    let whole = list(&[(2, 0)]);
    for (data, len) in [(&whole[..6], 6), (&whole[..2], 2), (&whole[..], 12)] {
        expect_check(
            &stpg_len(&t, &asker, data, len),
            SenseKey::IllegalRequest,
            Asc::PARAMETER_LIST_LENGTH_ERROR,
        );
    }
    // A length of 0 asks for nothing and succeeds; a header alone too.
    assert_eq!(stpg_len(&t, &asker, &[], 0).status, GOOD);
    assert_eq!(stpg(&t, &asker, &list(&[])).status, GOOD);

    assert_eq!(states(&t, &asker), before, "nothing moved");
    assert!(t.port_groups_set_by_command().is_empty());
    assert_eq!(
        run(&t, &other, &c(Cdb::TestUnitReady), &[], 0).status,
        GOOD,
        "and no one was told of a change"
    );
}

#[test]
fn an_implicit_change_after_stpg_reports_the_implicit_status_again() {
    let t = active_passive(true);
    let n = via("iqn.a", 2);
    ready(&t, &n);
    assert_eq!(stpg(&t, &n, &list(&[(2, 0)])).status, GOOD);
    // The management plane puts the configured states back.
    let changed = t.set_port_groups(groups_with_second(AluaState::Standby));
    assert_eq!(
        changed,
        vec![(2, AluaState::ActiveOptimized, AluaState::Standby)]
    );
    // An implicit change is heard by every nexus, the one that sent the
    // STPG included.
    expect_check(
        &run(&t, &n, &c(Cdb::TestUnitReady), &[], 0),
        SenseKey::UnitAttention,
        Asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
    );
    assert_eq!(states(&t, &n), vec![(1, 0, 2), (2, 2, 2)]);
    assert!(t.port_groups_set_by_command().is_empty());
}

#[test]
fn turning_explicit_alua_on_or_off_is_heard_as_changed_inquiry_data() {
    let t = active_passive(false);
    let n = via("iqn.a", 1);
    ready(&t, &n);
    assert!(t.set_explicit_alua(true));
    assert!(!t.set_explicit_alua(true), "no change the second time");
    expect_check(
        &run(&t, &n, &c(Cdb::TestUnitReady), &[], 0),
        SenseKey::UnitAttention,
        Asc::INQUIRY_DATA_HAS_CHANGED,
    );
    assert_eq!(tpgs(&t, &n), 3);
    assert_eq!(run(&t, &n, &c(Cdb::TestUnitReady), &[], 0).status, GOOD);
}

/// The table of a target as the daemon builds it from its configuration
/// (group 1 active/optimized, group 2 in standby), keeping the states its
/// initiators set in `file`.
fn kept_in(file: &std::path::Path, explicit: bool) -> LunTable {
    let t = super::tests::table()
        .with_explicit_alua(explicit)
        .with_alua_state_file(file.to_owned());
    t.set_port_groups(groups_with_second(AluaState::Standby));
    t
}

#[test]
fn states_an_initiator_set_outlive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tgt.alua");
    let t = kept_in(&file, true);
    let n = via("iqn.a", 2);
    ready(&t, &n);
    assert!(!file.exists(), "nothing set by a command yet");
    assert_eq!(stpg(&t, &n, &list(&[(2, 0), (1, 2)])).status, GOOD);
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "blockwire-alua 1\ngroup 2 active_optimized\ngroup 1 standby\n"
    );
    drop(t);

    // The daemon restarts on the same configuration: the states come back,
    // still reported as set by SET TARGET PORT GROUPS.
    let t = kept_in(&file, true);
    assert_eq!(
        t.restore_alua_states(),
        vec![
            (2, AluaState::Standby, AluaState::ActiveOptimized),
            (1, AluaState::ActiveOptimized, AluaState::Standby)
        ]
    );
    ready(&t, &n);
    assert_eq!(states(&t, &n), vec![(1, 2, 1), (2, 0, 1)]);
    assert_eq!(read(&t, &n, 0, 1).status, GOOD, "group 2 serves");
    let other = via("iqn.b", 1);
    ready(&t, &other);
    expect_check(
        &read(&t, &other, 0, 1),
        SenseKey::NotReady,
        Asc::LU_NOT_ACCESSIBLE_TARGET_PORT_IN_STANDBY_STATE,
    );

    // The configuration puts its own states back (a reload): nothing an
    // initiator set holds any more, and the next restart keeps that.
    t.set_port_groups(groups_with_second(AluaState::Standby));
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "blockwire-alua 1\n"
    );
    let again = kept_in(&file, true);
    assert_eq!(again.restore_alua_states(), vec![]);
    ready(&again, &n);
    assert_eq!(states(&again, &n), vec![(1, 0, 2), (2, 2, 2)]);

    // The target removed: its file goes.
    t.forget_alua_states();
    assert!(!file.exists());
}

/// A table keeping its states in `file`, whose standby group 2 a nexus
/// through it has made active/optimized with SET TARGET PORT GROUPS.
fn standby_group_made_active(file: &std::path::Path) -> (LunTable, ItNexus) {
    let n = via("iqn.a", 2);
    let t = kept_in(file, true);
    ready(&t, &n);
    assert_eq!(stpg(&t, &n, &list(&[(2, 0)])).status, GOOD);
    (t, n)
}

#[test]
fn without_explicit_alua_saved_states_are_not_restored_and_their_file_goes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tgt.alua");
    let (t, n) = standby_group_made_active(&file);
    drop(t);
    // Only the configuration sets states: the file is not applied, and
    // goes, so that turning explicit ALUA on again later does not bring
    // back a state set before.
    let off = kept_in(&file, false);
    assert_eq!(off.restore_alua_states(), vec![]);
    ready(&off, &n);
    assert_eq!(states(&off, &n), vec![(1, 0, 2), (2, 2, 2)]);
    assert!(!file.exists());
    let on = kept_in(&file, true);
    assert_eq!(on.restore_alua_states(), vec![]);
}

#[test]
fn turning_explicit_alua_off_keeps_the_states_as_configured_and_drops_their_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tgt.alua");
    let (t, n) = standby_group_made_active(&file);
    assert!(file.exists());
    assert!(t.set_explicit_alua(false));
    // Group 2 stays active, now as the configuration's state (status code
    // 02h, changed by implicit transition, no longer 01h, by STPG).
    expect_check(
        &run(&t, &n, &c(Cdb::TestUnitReady), &[], 0),
        SenseKey::UnitAttention,
        Asc::INQUIRY_DATA_HAS_CHANGED,
    );
    assert_eq!(states(&t, &n), vec![(1, 0, 2), (2, 0, 2)]);
    assert!(t.port_groups_set_by_command().is_empty());
    assert!(!file.exists(), "the saved states went with explicit ALUA");
    // On again before a restart: nothing set before comes back at the next.
    assert!(t.set_explicit_alua(true));
    drop(t);
    let restarted = kept_in(&file, true);
    assert_eq!(restarted.restore_alua_states(), vec![]);
}

#[test]
fn a_state_that_cannot_be_saved_is_refused_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let t = kept_in(&dir.path().join("gone").join("tgt.alua"), true);
    let (asker, other) = (via("iqn.a", 2), via("iqn.b", 1));
    ready(&t, &asker);
    ready(&t, &other);
    expect_check(
        &stpg(&t, &asker, &list(&[(2, 0)])),
        SenseKey::HardwareError,
        Asc::SET_TARGET_PORT_GROUPS_COMMAND_FAILED,
    );
    assert_eq!(states(&t, &asker), vec![(1, 0, 2), (2, 2, 2)]);
    assert!(t.port_groups_set_by_command().is_empty());
    assert_eq!(
        run(&t, &other, &c(Cdb::TestUnitReady), &[], 0).status,
        GOOD,
        "no one told of a change that did not happen"
    );
}

#[test]
fn a_damaged_or_outdated_file_leaves_the_configured_states() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tgt.alua");
    let n = via("iqn.a", 1);
    std::fs::write(&file, "group 2 active_optimized\n").unwrap();
    let t = kept_in(&file, true);
    assert_eq!(t.restore_alua_states(), vec![], "no header: damaged");
    ready(&t, &n);
    assert_eq!(states(&t, &n), vec![(1, 0, 2), (2, 2, 2)]);

    // A group the configuration no longer has is left out; the rest holds.
    std::fs::write(
        &file,
        "blockwire-alua 1\ngroup 9 standby\ngroup 2 active_non_optimized\n",
    )
    .unwrap();
    let t = kept_in(&file, true);
    assert_eq!(
        t.restore_alua_states(),
        vec![(2, AluaState::Standby, AluaState::ActiveNonOptimized)]
    );
    ready(&t, &n);
    assert_eq!(states(&t, &n), vec![(1, 0, 2), (2, 1, 1)]);
}
