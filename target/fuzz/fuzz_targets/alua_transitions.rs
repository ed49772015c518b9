//! Drives one target's ALUA state machine (SPC-4 5.16) with a sequence the
//! fuzzer picks: SET TARGET PORT GROUPS with any parameter list and any
//! PARAMETER LIST LENGTH, REPORT TARGET PORT GROUPS, READ, TEST UNIT READY
//! and INQUIRY from four I_T nexuses (two initiators, each through two of
//! the target's ports), beside the management plane's implicit changes (new
//! states for every group) and explicit ALUA turned on and off. Every answer
//! is checked against a model written from the standard, not from the code:
//! - a pending unit attention is reported first, oldest first, one code once
//!   (SAM-5 5.14), INQUIRY excepted;
//! - SET TARGET PORT GROUPS is an unsupported command unless explicit ALUA
//!   is on; a list that is not whole descriptors within the data is a
//!   PARAMETER LIST LENGTH ERROR; an unsupported state, a group named twice
//!   or a group the target does not have is INVALID FIELD IN PARAMETER
//!   LIST, and nothing changes;
//! - an accepted one sets exactly the named groups, and every nexus the unit
//!   knows but the asker hears ASYMMETRIC ACCESS STATE CHANGED when a state
//!   changed (SPC-4 5.16.2.5); an implicit change tells every nexus;
//! - REPORT TARGET PORT GROUPS gives each group's state, STATUS CODE 01h for
//!   groups a command set last and 02h otherwise, PREF on the first group
//!   not in standby;
//! - a READ through a port in standby is NOT READY, 04h/0Bh;
//! - INQUIRY's TPGS is 11b with explicit ALUA, 01b without, and turning it
//!   on or off is heard as INQUIRY DATA HAS CHANGED.
#![no_main]

use std::collections::VecDeque;
use std::sync::Arc;

use blockwire_pdu::pdu::codes::TaskAttr;
use blockwire_pdu::scsi::{Cdb, CdbSize, Rw};
use blockwire_target::backstore::RamBackstore;
use blockwire_target::scsi::{
    AluaState, ItNexus, LogicalUnit, LuConfig, LunTable, ScsiRequest, ScsiResult,
    TargetPortGroup,
};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

const GOOD: u8 = 0;
const CHECK: u8 = 2;
const NEXUSES: usize = 4;
/// (ASC, ASCQ) of the conditions the model follows.
const POWER_ON: (u8, u8) = (0x29, 0x00);
const STATE_CHANGED: (u8, u8) = (0x2a, 0x06);
const INQUIRY_CHANGED: (u8, u8) = (0x3f, 0x03);

#[derive(Arbitrary, Debug)]
struct Input {
    /// Three groups instead of two.
    three_groups: bool,
    explicit: bool,
    /// The states the groups start in (low two bits of each).
    start: [u8; 3],
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// SET TARGET PORT GROUPS: descriptors (state code, group), or raw
    /// bytes, with the list's own length or another.
    Stpg {
        nexus: u8,
        descriptors: Vec<(u8, u16)>,
        raw: Option<Vec<u8>>,
        length: Length,
    },
    Rtpg(u8),
    Read(u8),
    Tur(u8),
    Inquiry(u8),
    /// The management plane sets every group's state (low two bits each).
    SetStates([u8; 3]),
    SetExplicit(bool),
}

#[derive(Arbitrary, Debug)]
enum Length {
    Exact,
    Less(u8),
    More(u8),
    Any(u32),
}

/// What the standard says the target's state is.
struct Model {
    explicit: bool,
    /// (group, state code), in the target's order; the group's one port
    /// has the group's number.
    groups: Vec<(u16, u8)>,
    set_by_command: Vec<u16>,
    known: [bool; NEXUSES],
    pending: [VecDeque<(u8, u8)>; NEXUSES],
}

impl Model {
    fn push(&mut self, n: usize, code: (u8, u8)) {
        if !self.pending[n].contains(&code) {
            self.pending[n].push_back(code);
        }
    }

    fn tell_known(&mut self, except: Option<usize>, code: (u8, u8)) {
        for n in 0..NEXUSES {
            if self.known[n] && Some(n) != except {
                self.push(n, code);
            }
        }
    }

    /// First contact (a new nexus hears POWER ON), then the oldest pending
    /// condition, which the command gets instead of running.
    fn start(&mut self, n: usize, exempt: bool) -> Option<(u8, u8)> {
        if !self.known[n] {
            self.known[n] = true;
            self.push(n, POWER_ON);
        }
        if exempt {
            None
        } else {
            self.pending[n].pop_front()
        }
    }

    fn port_state(&self, n: usize) -> u8 {
        let port = port_of(n, self.groups.len());
        self.groups.iter().find(|g| g.0 == port).map_or(0, |g| g.1)
    }
}

/// Nexus `n`'s port: initiators 0 and 1, each through ports 1 and 2 (3 as
/// well with three groups).
fn port_of(n: usize, groups: usize) -> u16 {
    (n % groups) as u16 + 1
}

fn nexus(n: usize, groups: usize) -> ItNexus {
    let initiator = if n < 2 { "iqn.2026-12.fuzz:a" } else { "iqn.2026-12.fuzz:b" };
    ItNexus::iscsi(initiator, [0x40, 0, 0, 0, 0, n as u8], "iqn.2026-12.fuzz:tgt", port_of(n, groups))
}

fn state_of(code: u8) -> AluaState {
    match code & 3 {
        1 => AluaState::ActiveNonOptimized,
        2 => AluaState::Standby,
        _ => AluaState::ActiveOptimized,
    }
}

fn groups_with(codes: &[(u16, u8)]) -> Vec<TargetPortGroup> {
    codes
        .iter()
        .map(|&(id, code)| TargetPortGroup {
            id,
            state: state_of(code),
            ports: vec![id],
        })
        .collect()
}

fn run(t: &LunTable, n: &ItNexus, cdb: &[u8], out: &[u8], cap: u32) -> ScsiResult {
    t.execute(&ScsiRequest {
        lun: 0,
        cdb,
        nexus: n,
        task_tag: 1,
        attr: TaskAttr::Simple,
        data_out: out,
        data_in_capacity: cap,
        initiator_stats: None,
    })
}

/// (SENSE KEY, ASC, ASCQ) of fixed-format sense data.
fn sense(r: &ScsiResult) -> (u8, u8, u8) {
    let s = r.sense.as_deref().expect("CHECK CONDITION without sense data");
    (s[2] & 0x0f, s[12], s[13])
}

fn expect(r: &ScsiResult, key: u8, code: (u8, u8), what: &str) {
    assert_eq!(r.status, CHECK, "{what}: {r:?}");
    assert_eq!(sense(r), (key, code.0, code.1), "{what}");
}

/// The model's reading of a SET TARGET PORT GROUPS parameter list:
/// Ok(requests) or Err((ASC, ASCQ)) of the refusal.
fn model_parse(len: u32, data: &[u8], groups: &[(u16, u8)]) -> Result<Vec<(u16, u8)>, (u8, u8)> {
    const LENGTH_ERROR: (u8, u8) = (0x1a, 0x00);
    const INVALID_FIELD: (u8, u8) = (0x26, 0x00);
    let len = len as usize;
    if len == 0 {
        return Ok(Vec::new());
    }
    if len > data.len() || len < 4 || (len - 4) % 4 != 0 {
        return Err(LENGTH_ERROR);
    }
    let mut out: Vec<(u16, u8)> = Vec::new();
    for d in data[4..len].chunks(4) {
        let code = d[0] & 0x0f;
        let group = u16::from_be_bytes([d[2], d[3]]);
        if code > 2 || out.iter().any(|r| r.0 == group) {
            return Err(INVALID_FIELD);
        }
        out.push((group, code));
    }
    if out.iter().any(|r| !groups.iter().any(|g| g.0 == r.0)) {
        return Err(INVALID_FIELD);
    }
    Ok(out)
}

fuzz_target!(|input: Input| {
    let count = if input.three_groups { 3 } else { 2 };
    let mut model = Model {
        explicit: input.explicit,
        groups: (0..count)
            .map(|i| (i as u16 + 1, state_of(input.start[i]).code()))
            .collect(),
        set_by_command: Vec::new(),
        known: [false; NEXUSES],
        pending: Default::default(),
    };
    let unit = LogicalUnit::new(LuConfig::new(Arc::new(RamBackstore::new(64 << 10))));
    let table = LunTable::new(vec![(0, Arc::new(unit))]).with_explicit_alua(input.explicit);
    table.set_port_groups(groups_with(&model.groups));
    let nexuses: Vec<ItNexus> = (0..NEXUSES).map(|n| nexus(n, count)).collect();

    for op in input.ops.into_iter().take(64) {
        match op {
            Op::Stpg {
                nexus: n,
                descriptors,
                raw,
                length,
            } => {
                let n = usize::from(n) % NEXUSES;
                let data = raw.unwrap_or_else(|| {
                    let mut l = vec![0u8; 4];
                    for (code, group) in descriptors.iter().take(8) {
                        l.extend_from_slice(&[*code, 0]);
                        l.extend_from_slice(&group.to_be_bytes());
                    }
                    l
                });
                let exact = data.len() as u32;
                let len = match length {
                    Length::Exact => exact,
                    Length::Less(d) => exact.saturating_sub(u32::from(d)),
                    Length::More(d) => exact + u32::from(d),
                    Length::Any(v) => v,
                };
                let cdb = Cdb::SetTargetPortGroups {
                    parameter_list_length: len,
                }
                .encode();
                let r = run(&table, &nexuses[n], &cdb, &data, 0);
                if let Some(ua) = model.start(n, false) {
                    expect(&r, 6, ua, "STPG behind a unit attention");
                    continue;
                }
                if !model.explicit {
                    expect(&r, 5, (0x20, 0x00), "STPG without explicit ALUA");
                    continue;
                }
                match model_parse(len, &data, &model.groups) {
                    Err(code) => expect(&r, 5, code, "refused STPG"),
                    Ok(requests) => {
                        assert_eq!(r.status, GOOD, "accepted STPG: {r:?}");
                        let mut changed = false;
                        for (group, code) in requests {
                            let g = model.groups.iter_mut().find(|g| g.0 == group).unwrap();
                            changed |= g.1 != code;
                            g.1 = code;
                            if !model.set_by_command.contains(&group) {
                                model.set_by_command.push(group);
                            }
                        }
                        if changed {
                            model.tell_known(Some(n), STATE_CHANGED);
                        }
                    }
                }
            }
            Op::Rtpg(n) => {
                let n = usize::from(n) % NEXUSES;
                let cdb = Cdb::ReportTargetPortGroups {
                    parameter_data_format: 0,
                    allocation_length: 1024,
                }
                .encode();
                let r = run(&table, &nexuses[n], &cdb, &[], 1024);
                if let Some(ua) = model.start(n, false) {
                    expect(&r, 6, ua, "RTPG behind a unit attention");
                    continue;
                }
                assert_eq!(r.status, GOOD, "RTPG: {r:?}");
                let d = &r.data_in;
                assert_eq!(d.len(), 4 + 12 * count, "RTPG length");
                let preferred = model.groups.iter().position(|g| g.1 != 2);
                for (i, (id, code)) in model.groups.iter().enumerate() {
                    let desc = &d[4 + 12 * i..16 + 12 * i];
                    let pref = if Some(i) == preferred { 0x80 } else { 0 };
                    let status = if model.set_by_command.contains(id) { 1 } else { 2 };
                    assert_eq!(desc[0], pref | code, "group {id}: PREF and state");
                    assert_eq!(u16::from_be_bytes([desc[2], desc[3]]), *id);
                    assert_eq!(desc[5], status, "group {id}: STATUS CODE");
                    assert_eq!(u16::from_be_bytes([desc[10], desc[11]]), *id, "its port");
                }
            }
            Op::Read(n) => {
                let n = usize::from(n) % NEXUSES;
                let cdb = Cdb::Read {
                    rw: Rw {
                        size: CdbSize::Ten,
                        lba: 0,
                        length: 1,
                        protect: 0,
                        dpo: false,
                        fua: false,
                        group: 0,
                    },
                    rarc: false,
                }
                .encode();
                let r = run(&table, &nexuses[n], &cdb, &[], 512);
                if let Some(ua) = model.start(n, false) {
                    expect(&r, 6, ua, "READ behind a unit attention");
                } else if model.port_state(n) == 2 {
                    expect(&r, 2, (0x04, 0x0b), "READ through a port in standby");
                } else {
                    assert_eq!(r.status, GOOD, "READ: {r:?}");
                }
            }
            Op::Tur(n) => {
                let n = usize::from(n) % NEXUSES;
                let r = run(&table, &nexuses[n], &Cdb::TestUnitReady.encode(), &[], 0);
                match model.start(n, false) {
                    Some(ua) => expect(&r, 6, ua, "TEST UNIT READY"),
                    None => assert_eq!(r.status, GOOD, "TEST UNIT READY: {r:?}"),
                }
            }
            Op::Inquiry(n) => {
                let n = usize::from(n) % NEXUSES;
                let cdb = Cdb::Inquiry {
                    evpd: false,
                    page_code: 0,
                    allocation_length: 96,
                }
                .encode();
                let r = run(&table, &nexuses[n], &cdb, &[], 96);
                assert!(model.start(n, true).is_none());
                assert_eq!(r.status, GOOD, "INQUIRY: {r:?}");
                let tpgs = (r.data_in[5] >> 4) & 3;
                assert_eq!(tpgs, if model.explicit { 3 } else { 1 }, "TPGS");
            }
            Op::SetStates(codes) => {
                let new: Vec<(u16, u8)> = model
                    .groups
                    .iter()
                    .zip(codes)
                    .map(|(g, c)| (g.0, state_of(c).code()))
                    .collect();
                let changed: Vec<u16> = model
                    .groups
                    .iter()
                    .zip(&new)
                    .filter(|(old, new)| old.1 != new.1)
                    .map(|(old, _)| old.0)
                    .collect();
                let reported = table.set_port_groups(groups_with(&new));
                assert_eq!(
                    reported.iter().map(|c| c.0).collect::<Vec<_>>(),
                    changed,
                    "the groups an implicit change reports"
                );
                model.set_by_command.retain(|id| !changed.contains(id));
                model.groups = new;
                if !changed.is_empty() {
                    model.tell_known(None, STATE_CHANGED);
                }
            }
            Op::SetExplicit(on) => {
                let changed = table.set_explicit_alua(on);
                assert_eq!(changed, on != model.explicit, "explicit ALUA changed");
                model.explicit = on;
                if changed {
                    model.tell_known(None, INQUIRY_CHANGED);
                }
                if changed && !on {
                    // What initiators set is the configuration's from now on.
                    model.set_by_command.clear();
                }
            }
        }
        assert_eq!(
            table.port_groups_set_by_command(),
            model.set_by_command,
            "groups a command set last"
        );
    }
});
