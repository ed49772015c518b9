//! Command-level tests of ALUA with several target port groups and of the
//! stall switch, through the LUN table as a fabric calls it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_pdu::scsi::{Asc, Cdb, CdbSize, DesignatorId, SenseKey, Vpd, VpdPage};

use super::tests::{c, expect_check, read, ready, run, rw, table, write, CHECK, GOOD};
use super::*;

/// The nexus of `initiator` through the port with relative identifier
/// (TPGT) `port`.
pub(super) fn via(initiator: &str, port: u16) -> ItNexus {
    ItNexus::iscsi(
        initiator,
        [0x40, 0, 0, 0, 0, 1],
        "iqn.2024-01.test:tgt",
        port,
    )
}

/// Group 1 active/optimized on port 1, group 2 in `second` on port 2.
pub(super) fn groups_with_second(second: AluaState) -> Vec<TargetPortGroup> {
    vec![
        TargetPortGroup {
            id: 1,
            state: AluaState::ActiveOptimized,
            ports: vec![1],
        },
        TargetPortGroup {
            id: 2,
            state: second,
            ports: vec![2],
        },
    ]
}

pub(super) fn two_groups(second: AluaState) -> LunTable {
    let t = table();
    t.set_port_groups(groups_with_second(second));
    t
}

fn rtpg(t: &LunTable, n: &ItNexus, format: u8) -> Vec<u8> {
    let cdb = c(Cdb::ReportTargetPortGroups {
        parameter_data_format: format,
        allocation_length: 1024,
    });
    let r = run(t, n, &cdb, &[], 1024);
    assert_eq!(r.status, GOOD, "{r:?}");
    r.data_in
}

/// (group id, state code, PREF, relative ports) of each RTPG descriptor.
fn groups_of(data: &[u8], format: u8) -> Vec<(u16, u8, bool, Vec<u16>)> {
    let len = u32::from_be_bytes(data[0..4].try_into().unwrap()) as usize;
    assert_eq!(len + 4, data.len(), "RETURN DATA LENGTH");
    let mut at = if format == 1 { 8 } else { 4 };
    let mut out = Vec::new();
    while at < data.len() {
        let d = &data[at..];
        let count = d[7] as usize;
        let ports = (0..count)
            .map(|i| u16::from_be_bytes([d[8 + 4 * i + 2], d[8 + 4 * i + 3]]))
            .collect();
        out.push((
            u16::from_be_bytes([d[2], d[3]]),
            d[0] & 0x0f,
            d[0] & 0x80 != 0,
            ports,
        ));
        at += 8 + 4 * count;
    }
    out
}

fn port_designators(t: &LunTable, n: &ItNexus) -> (u16, u16) {
    let cdb = c(Cdb::Inquiry {
        evpd: true,
        page_code: 0x83,
        allocation_length: 1024,
    });
    let r = run(t, n, &cdb, &[], 1024);
    assert_eq!(r.status, GOOD);
    let VpdPage::DeviceIdentification(ds) = Vpd::decode(&r.data_in).unwrap().page else {
        panic!("not VPD 83h")
    };
    let rel = ds.iter().find_map(|d| match d.id {
        DesignatorId::RelativeTargetPort(p) => Some(p),
        _ => None,
    });
    let group = ds.iter().find_map(|d| match d.id {
        DesignatorId::TargetPortGroup(g) => Some(g),
        _ => None,
    });
    (
        group.expect("port group designator"),
        rel.expect("relative port designator"),
    )
}

#[test]
fn rtpg_with_one_group_holds_the_asking_port() {
    let t = table();
    let a = via("iqn.a", 1);
    ready(&t, &a);
    for format in [0, 1] {
        let d = rtpg(&t, &a, format);
        assert_eq!(groups_of(&d, format), vec![(1, 0, true, vec![1])]);
    }
    assert_eq!(port_designators(&t, &a), (1, 1));
}

#[test]
fn rtpg_with_two_groups_reports_both_from_either_port() {
    let t = two_groups(AluaState::ActiveNonOptimized);
    for port in [1, 2] {
        let n = via("iqn.a", port);
        ready(&t, &n);
        for format in [0, 1] {
            let d = rtpg(&t, &n, format);
            if format == 1 {
                assert_eq!(d[4] & 0x70, 0x10, "FORMAT TYPE 001b");
            }
            assert_eq!(
                groups_of(&d, format),
                vec![(1, 0, true, vec![1]), (2, 1, false, vec![2])],
                "through port {port}, format {format}"
            );
        }
    }
    let inq = c(Cdb::Inquiry {
        evpd: false,
        page_code: 0,
        allocation_length: 96,
    });
    let r = run(&t, &via("iqn.a", 2), &inq, &[], 96);
    assert_eq!(
        r.data_in[5] & 0x30,
        0x10,
        "TPGS 01b: implicit ALUA unless the target allows explicit"
    );
}

#[test]
fn vpd_83_names_the_port_and_group_the_command_came_through() {
    let t = two_groups(AluaState::ActiveOptimized);
    assert_eq!(port_designators(&t, &via("iqn.a", 1)), (1, 1));
    assert_eq!(port_designators(&t, &via("iqn.a", 2)), (2, 2));
}

#[test]
fn non_optimized_serves_io_and_standby_refuses_media_commands() {
    let t = two_groups(AluaState::ActiveNonOptimized);
    let n = via("iqn.a", 2);
    ready(&t, &n);
    assert_eq!(write(&t, &n, 0, &[7u8; 512]).status, GOOD);
    assert_eq!(read(&t, &n, 0, 1).data_in, vec![7u8; 512]);

    let t = two_groups(AluaState::Standby);
    let (active, standby) = (via("iqn.a", 1), via("iqn.a", 2));
    ready(&t, &active);
    ready(&t, &standby);
    assert_eq!(write(&t, &active, 0, &[9u8; 512]).status, GOOD);
    for r in [
        read(&t, &standby, 0, 1),
        write(&t, &standby, 0, &[1u8; 512]),
        run(
            &t,
            &standby,
            &c(Cdb::SynchronizeCache {
                size: CdbSize::Ten,
                immed: false,
                lba: 0,
                blocks: 0,
                group: 0,
            }),
            &[],
            0,
        ),
    ] {
        assert_eq!(r.status, CHECK);
        expect_check(
            &r,
            SenseKey::NotReady,
            Asc::LU_NOT_ACCESSIBLE_TARGET_PORT_IN_STANDBY_STATE,
        );
    }
    // Management commands still answer through the standby port.
    assert_eq!(
        run(&t, &standby, &c(Cdb::TestUnitReady), &[], 0).status,
        GOOD
    );
    assert_eq!(groups_of(&rtpg(&t, &standby, 0), 0)[1].1, 2, "standby");
    assert_eq!(
        read(&t, &active, 0, 1).data_in,
        vec![9u8; 512],
        "refused write changed nothing"
    );
}

fn read_req<'a>(n: &'a ItNexus, cdb: &'a [u8]) -> ScsiRequest<'a> {
    ScsiRequest {
        lun: 0,
        cdb,
        nexus: n,
        task_tag: 9,
        attr: blockwire_pdu::pdu::codes::TaskAttr::Simple,
        data_out: &[],
        data_in_capacity: 512,
        initiator_stats: None,
    }
}

fn wait_held(t: &LunTable, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while t.get(0).unwrap().held_commands() < n {
        assert!(Instant::now() < deadline, "no command reached the gate");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_stalled_lun_holds_media_commands_and_answers_the_rest() {
    let t = Arc::new(table());
    let a = via("iqn.a", 1);
    ready(&t, &a);
    assert_eq!(write(&t, &a, 0, &[5u8; 512]).status, GOOD);
    let change = t.set_stalled(0, true).unwrap();
    assert!(!change.was_stalled);
    assert!(t.get(0).unwrap().is_stalled());
    let (t2, a2) = (t.clone(), a.clone());
    let held = std::thread::spawn(move || read(&t2, &a2, 0, 1));
    wait_held(&t, 1);
    // Non-media commands are answered meanwhile.
    assert_eq!(run(&t, &a, &c(Cdb::TestUnitReady), &[], 0).status, GOOD);
    let inq = c(Cdb::Inquiry {
        evpd: false,
        page_code: 0,
        allocation_length: 96,
    });
    assert_eq!(run(&t, &a, &inq, &[], 96).status, GOOD);
    std::thread::sleep(Duration::from_millis(50));
    assert!(!held.is_finished(), "the READ went past a stalled LUN");
    let change = t.set_stalled(0, false).unwrap();
    assert_eq!((change.was_stalled, change.held), (true, 1));
    let r = held.join().unwrap();
    assert_eq!((r.status, r.data_in), (GOOD, vec![5u8; 512]));
    assert!(t.set_stalled(3, true).is_err());
    assert_eq!(
        t.set_stalled(3, true).unwrap_err().to_string(),
        "no LUN 3; LUNs are 0"
    );
}

#[test]
fn a_held_command_whose_task_is_aborted_never_reaches_the_backstore() {
    let t = Arc::new(table());
    let a = via("iqn.a", 1);
    ready(&t, &a);
    t.set_stalled(0, true).unwrap();
    let flag = Arc::new(AtomicBool::new(false));
    let (t2, a2, f2) = (t.clone(), a.clone(), flag.clone());
    let held = std::thread::spawn(move || abortable(&f2, || write(&t2, &a2, 8, &[0xaa; 512])));
    // A planned READ (the fabric's own data paths) waits at the same gate.
    let (t3, a3, f3) = (t.clone(), a.clone(), Arc::new(AtomicBool::new(false)));
    let f3b = f3.clone();
    let planned = std::thread::spawn(move || {
        let cdb = c(Cdb::Read {
            rw: rw(CdbSize::Ten, 0, 1),
            rarc: false,
        });
        abortable(&f3b, || {
            matches!(
                t3.plan_read(&read_req(&a3, &cdb)),
                read_plan::ReadPlan::Read(_)
            )
        })
    });
    wait_held(&t, 2);
    flag.store(true, Ordering::SeqCst);
    let r = held.join().unwrap();
    assert_eq!(r.status, 0x40, "TASK ABORTED (never sent by the fabric)");
    assert_eq!(
        t.get(0).unwrap().held_commands(),
        1,
        "the planned READ still waits"
    );
    assert!(
        t.get(0).unwrap().is_stalled(),
        "an abort does not lift the stall"
    );
    t.set_stalled(0, false).unwrap();
    assert!(planned.join().unwrap(), "released, the READ is planned");
    let _ = f3;
    assert_eq!(
        read(&t, &a, 8, 1).data_in,
        vec![0u8; 512],
        "the aborted WRITE never landed"
    );
}
