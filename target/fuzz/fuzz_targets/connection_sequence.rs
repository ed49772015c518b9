//! Drives one target connection, login through the full feature phase,
//! with a sequence of PDUs the fuzzer picks: SCSI commands (READ, WRITE and
//! the rest of the core's opcodes), solicited and unsolicited Data-Out,
//! task management, text, NOP-Out, SNACK, logout, raw frames, the passing
//! of time and the daemon's shutdown. Most inputs log in properly first, so
//! the full feature phase is what gets explored. LUN 0 is RAM, or a file
//! served by sendfile or engine READs and double-buffered WRITEs; a
//! quarter of the inputs set QoS ceilings on it, the LUN's and the
//! initiator's.
//!
//! Beyond "no panic, no hang", every exchange is checked as an initiator
//! would check it (RFC 7143):
//! - every answer names a task the initiator started, of the right kind
//!   (§11.4, §11.6, §11.8, §11.11, §11.15, §11.19);
//! - StatSN grows by one per status and R2Ts carry the next one (§4.2.2.2);
//! - ExpCmdSN never goes back and the window never exceeds the queue depth
//!   or goes negative (§4.2.2.1);
//! - Data-In only for commands that read, never beyond the Expected Data
//!   Transfer Length, never overlapping (§11.7);
//! - R2Ts only for commands that write, within the length and
//!   MaxBurstLength, R2TSN counting from 0 (§11.8);
//! - no data segment beyond the initiator's MaxRecvDataSegmentLength
//!   (§13.12);
//! - at most one status per command;
//! - nothing about a task after "Function complete" aborted it (§11.5.1);
//! - nothing after the Logout Response that closes the connection (§11.15).
#![no_main]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

#[path = "../common/lun_files.rs"]
mod lun_files;

use blockwire_pdu::keys::{encode_text, parse_text, Digest};
use blockwire_pdu::pdu::codes::{
    LogoutReason, LogoutResponseCode, ServiceResponse, SnackType, TaskAttr, TmfFunction,
    TmfResponse,
};
use blockwire_pdu::pdu::{
    DataOut, LoginRequest, LogoutRequest, NopOut, ScsiCommand, SnackRequest, TaskMgmtRequest,
    TextRequest, RESERVED_TAG,
};
use blockwire_pdu::serial::sn_lt;
use blockwire_pdu::{Bhs, Digests, Lun, Pdu, Stage};
use blockwire_target::backstore::{Backstore, RamBackstore};
use blockwire_target::datapath::Mode;
use blockwire_target::iscsi::catalog::DataPathPolicy;
use blockwire_target::iscsi::connection::fuzzing::{DataPaths, Harness, Phase, Wire, TARGET};
use blockwire_target::iscsi::FabricSettings;
use blockwire_target::scsi::QosLimits;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

const BLOCK: u32 = 512;
const LUN_BYTES: u64 = 1 << 20;
/// SCSI status GOOD.
const GOOD: u8 = 0;
const SCRATCH_PREFIX: &str = "blockwire-fuzz-connection-";
const INITIATOR: &str = "iqn.2026-11.io.blockwire:fuzzer";
/// How far ahead the connection's next timer may be for `Op::NextTimer`
/// to run time on to it.
const NEXT_TIMER_WITHIN: Duration = Duration::from_secs(1);

#[derive(Arbitrary, Debug)]
struct Input {
    settings: Settings,
    login: Login,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug)]
struct Settings {
    queue_depth: u8,
    small_budget: bool,
    small_io: bool,
    target_mrdsl: u8,
    data_pdu_in_order: bool,
    /// LUN 0: RAM (half the inputs), or a file with the data paths a
    /// daemon starts for one.
    storage: u8,
    /// LUN 0's QoS ceilings (see [`Settings::qos`]).
    qos: u8,
}

impl Settings {
    /// LUN 0's store, and its data paths on the process's I/O engine: a
    /// file through the page cache with sendfile READs, or an O_DIRECT
    /// file with synchronized engine READs; both with double-buffered
    /// WRITEs, whose tasks take each Data-Out as it arrives (and must end
    /// cleanly on a sequence error, an abort or the connection's end).
    fn lun0(&self) -> (Arc<dyn Backstore>, DataPaths) {
        let direct = match self.storage % 4 {
            0 | 1 => return (Arc::new(RamBackstore::new(LUN_BYTES)), None),
            2 => false,
            _ => true,
        };
        let store = lun_files::zeroed_file_lun(SCRATCH_PREFIX, "lun0.img", direct, LUN_BYTES);
        let policy = DataPathPolicy {
            engine_reads: direct.then_some(Mode::Synchronized),
            sendfile: !direct,
            double_buffered_writes: true,
            chunk: if direct { 4 << 10 } else { 8 << 10 },
        };
        (
            Arc::new(store),
            Some((policy, lun_files::io_engine().clone())),
        )
    }

    /// LUN 0's QoS ceilings: none for three inputs in four, else the LUN's
    /// and each initiator's IOPS and bandwidth at rates that hold some of
    /// an input's commands back (WRITEs asked for their data by R2T wait
    /// in the machine for `Op::Advance`; other commands wait on real
    /// timers, so no rate is low enough to make an input slow).
    fn qos(&self) -> QosLimits {
        if self.qos < 192 {
            return QosLimits::NONE;
        }
        let pick = |bit: u8, rate: u64| (self.qos & bit != 0).then_some(rate);
        QosLimits {
            iops: pick(1, if self.qos & 16 != 0 { 100 } else { 1000 }),
            bytes_per_sec: pick(2, 64 << 20),
            initiator_iops: pick(4, if self.qos & 32 != 0 { 100 } else { 400 }),
            initiator_bytes_per_sec: pick(8, 32 << 20),
        }
    }

    fn fabric(&self) -> FabricSettings {
        FabricSettings {
            queue_depth: u32::from(self.queue_depth % 16) + 1,
            write_budget_bytes: if self.small_budget {
                16 << 10
            } else {
                256 << 20
            },
            max_io_bytes: if self.small_io { 64 << 10 } else { 32 << 20 },
            nop_interval: Some(Duration::from_secs(10)),
            nop_timeout: Duration::from_secs(30),
            logout_grace: Duration::from_secs(5),
            max_recv_data_segment_length: [262_144, 8192, 512][usize::from(self.target_mrdsl % 3)],
            data_pdu_in_order: self.data_pdu_in_order,
            zero_copy_send: false,
            ..FabricSettings::default()
        }
    }
}

/// How the login goes: mostly a proper one, sometimes anything.
#[derive(Arbitrary, Debug)]
struct Login {
    selector: u8,
    keys: LoginKeys,
    first_cmd_sn: u32,
    /// Straight from the security stage to the full feature phase.
    skip_operational: bool,
    arbitrary: Vec<LoginPdu>,
}

#[derive(Arbitrary, Debug)]
struct LoginKeys {
    header_digest: Option<u8>,
    data_digest: Option<u8>,
    mrdsl: Option<u8>,
    first_burst: Option<u8>,
    max_burst: Option<u8>,
    immediate_data: Option<bool>,
    initial_r2t: Option<bool>,
    data_pdu_in_order: Option<bool>,
    max_outstanding_r2t: Option<u8>,
}

const DIGESTS: [&str; 3] = ["None", "CRC32C", "CRC32C,None"];
const SIZES: [&str; 6] = ["512", "4096", "8192", "65536", "262144", "1048576"];
const YES_NO: [&str; 2] = ["No", "Yes"];

impl LoginKeys {
    fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::new();
        let mut add = |k: &'static str, val: Option<String>| {
            if let Some(val) = val {
                v.push((k, val));
            }
        };
        add(
            "HeaderDigest",
            self.header_digest
                .map(|i| DIGESTS[usize::from(i % 3)].into()),
        );
        add(
            "DataDigest",
            self.data_digest.map(|i| DIGESTS[usize::from(i % 3)].into()),
        );
        add(
            "MaxRecvDataSegmentLength",
            self.mrdsl.map(|i| SIZES[usize::from(i % 5)].into()),
        );
        add(
            "FirstBurstLength",
            self.first_burst.map(|i| SIZES[usize::from(i % 6)].into()),
        );
        add(
            "MaxBurstLength",
            self.max_burst.map(|i| SIZES[usize::from(i % 6)].into()),
        );
        add(
            "ImmediateData",
            self.immediate_data.map(|b| YES_NO[usize::from(b)].into()),
        );
        add(
            "InitialR2T",
            self.initial_r2t.map(|b| YES_NO[usize::from(b)].into()),
        );
        add(
            "DataPDUInOrder",
            self.data_pdu_in_order
                .map(|b| YES_NO[usize::from(b)].into()),
        );
        add(
            "MaxOutstandingR2T",
            self.max_outstanding_r2t.map(|n| (n % 4 + 1).to_string()),
        );
        v
    }
}

/// A login PDU of any shape (the arbitrary login).
#[derive(Arbitrary, Debug)]
enum LoginPdu {
    Request {
        transit: bool,
        continue_bit: bool,
        csg: u8,
        nsg: u8,
        tsih: u16,
        itt: u32,
        cmd_sn: u32,
        pairs: Vec<(u8, u8)>,
    },
    Raw(Vec<u8>),
}

/// Keys and values the arbitrary login and text requests pick from.
const KEYS: [&str; 12] = [
    "InitiatorName",
    "TargetName",
    "SessionType",
    "AuthMethod",
    "HeaderDigest",
    "MaxRecvDataSegmentLength",
    "SendTargets",
    "ImmediateData",
    "FirstBurstLength",
    "X-io.blockwire.Unknown",
    "CHAP_A",
    "MaxBurstLength",
];
const VALUES: [&str; 12] = [
    INITIATOR,
    TARGET,
    "Normal",
    "None",
    "Discovery",
    "CRC32C",
    "All",
    "Yes",
    "512",
    "",
    "5",
    "999999999999",
];

/// Which ITT a PDU carries.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Tag {
    Fresh,
    Recent(u8),
    Reserved,
    Any(u32),
}

/// Which CmdSN a PDU carries.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Sn {
    /// The next one (taken unless the PDU is immediate).
    Next,
    Ahead(u8),
    Behind(u8),
    Any(u32),
}

/// Which TTT a PDU carries.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Ttt {
    Reserved,
    FromR2t(u8),
    FromTarget,
    Any(u32),
}

/// The Expected Data Transfer Length of a command against its CDB's.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Edtl {
    Exact,
    Less(u16),
    More(u16),
    Any(u32),
}

#[derive(Arbitrary, Debug)]
enum Op {
    Read {
        lba: u16,
        blocks: u8,
        edtl: Edtl,
        sn: Sn,
        itt: Tag,
        lun: u8,
        immediate: bool,
    },
    Write {
        lba: u16,
        blocks: u8,
        edtl: Edtl,
        sn: Sn,
        itt: Tag,
        lun: u8,
        /// Send the immediate data and unsolicited Data-Out the
        /// negotiation allows (else nothing beyond the command).
        unsolicited: bool,
        final_bit: Option<bool>,
    },
    Other {
        opcode: u8,
        cdb: [u8; 15],
        edtl: u16,
        read: bool,
        write: bool,
        data: u16,
        sn: Sn,
        itt: Tag,
        lun: u8,
    },
    DataOut {
        itt: Tag,
        ttt: Ttt,
        data_sn: u8,
        offset: u32,
        len: u16,
        final_bit: bool,
    },
    /// Answers an R2T the target sent, properly.
    AnswerR2t {
        which: u8,
    },
    Tmf {
        function: u8,
        lun: u8,
        referenced: Tag,
        sn: Sn,
        immediate: bool,
    },
    Text {
        body: TextBody,
        sn: Sn,
        itt: Tag,
        ttt: Ttt,
        final_bit: bool,
        continue_bit: bool,
        immediate: bool,
    },
    Nop {
        itt: Tag,
        ttt: Ttt,
        sn: Sn,
        immediate: bool,
        data: u8,
    },
    Logout {
        reason: u8,
        sn: Sn,
        immediate: bool,
        cid: u16,
    },
    Snack {
        kind: u8,
        itt: Tag,
        beg_run: u32,
        run_length: u32,
    },
    /// Any header: opcode and bytes as given, a sound DataSegmentLength.
    Header {
        bytes: [u8; 48],
        data: Vec<u8>,
    },
    Raw(Vec<u8>),
    /// Time runs on to the connection's next timer, when that is near:
    /// a WRITE held by LUN 0's QoS ceilings gets its turn.
    NextTimer,
    Advance {
        seconds: u8,
    },
    Shutdown,
}

#[derive(Arbitrary, Debug)]
enum TextBody {
    SendTargets(u8),
    Pairs(Vec<(u8, u8)>),
    Raw(Vec<u8>),
}

/// A SCSI command the target received.
#[derive(Debug, Clone, Copy)]
struct Cmd {
    read: bool,
    write: bool,
    edtl: u32,
    lun: u16,
    cmd_sn: u32,
    immediate: bool,
}

/// A task management request the target received.
#[derive(Debug, Clone, Copy)]
struct Tmf {
    function: TmfFunction,
    lun: u16,
    referenced: u32,
    cmd_sn: u32,
    immediate: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Scsi,
    Tmf,
    Text,
    Nop,
    Logout,
}

/// The initiator's view: what it sent, what the target answered, and the
/// invariants checked on every PDU from the target.
struct Model {
    digests: Digests,
    /// The target's MaxRecvDataSegmentLength (what we may send).
    send_limit: u32,
    /// Ours (what the target may send).
    recv_limit: u32,
    max_burst: u32,
    first_burst: u32,
    immediate_data: bool,
    initial_r2t: bool,
    queue_depth: u32,
    cmd_sn: u32,
    next_itt: u32,
    recent: Vec<u32>,
    /// Every ITT the target received, by kind.
    kinds: HashMap<u32, HashSet<Kind>>,
    /// The SCSI command of each ITT the target received; None once two
    /// commands shared it unanswered (their answers cannot be told apart).
    cmds: HashMap<u32, Option<Cmd>>,
    /// SCSI commands received and not yet answered, by ITT: how many (an
    /// initiator that reuses a live ITT may hear of each command).
    open: HashMap<u32, u32>,
    /// Tasks "Function complete" aborted: never heard of again.
    aborted: HashSet<u32>,
    /// TMF requests received, by ITT.
    tmfs: HashMap<u32, Tmf>,
    /// Data-In bytes per open command: the ranges received.
    data_in: HashMap<u32, Vec<(u32, u32)>>,
    r2t_sn: HashMap<u32, u32>,
    r2ts: Vec<(u32, u32, u32, u32)>,
    /// TTT of the target's last NOP-In ping or text continuation.
    target_ttt: u32,
    stat_sn: Option<u32>,
    exp_cmd_sn: Option<u32>,
    closed: bool,
}

impl Model {
    fn new(queue_depth: u32) -> Model {
        Model {
            digests: Digests::default(),
            send_limit: 8192,
            recv_limit: 8192,
            max_burst: 262_144,
            first_burst: 65_536,
            immediate_data: true,
            initial_r2t: true,
            queue_depth,
            cmd_sn: 0,
            next_itt: 0x10,
            recent: Vec::new(),
            kinds: HashMap::new(),
            cmds: HashMap::new(),
            open: HashMap::new(),
            aborted: HashSet::new(),
            tmfs: HashMap::new(),
            data_in: HashMap::new(),
            r2t_sn: HashMap::new(),
            r2ts: Vec::new(),
            target_ttt: RESERVED_TAG,
            stat_sn: None,
            exp_cmd_sn: None,
            closed: false,
        }
    }

    fn logged_in(&mut self, h: &Harness) {
        let p = h.params().expect("logged in");
        self.digests = Digests {
            header: p.header_digest == Digest::Crc32c,
            data: p.data_digest == Digest::Crc32c,
        };
        self.send_limit = p.target_max_recv_data_segment_length;
        self.recv_limit = p.initiator_max_recv_data_segment_length;
        self.max_burst = p.max_burst_length;
        self.first_burst = p.first_burst_length;
        self.immediate_data = p.immediate_data;
        self.initial_r2t = p.initial_r2t;
    }

    fn itt(&mut self, tag: Tag) -> u32 {
        match tag {
            Tag::Fresh => {
                self.next_itt = self.next_itt.wrapping_add(1);
                if self.next_itt == RESERVED_TAG {
                    self.next_itt = 0;
                }
                self.recent.push(self.next_itt);
                if self.recent.len() > 32 {
                    self.recent.remove(0);
                }
                self.next_itt
            }
            Tag::Recent(i) if !self.recent.is_empty() => {
                self.recent[usize::from(i) % self.recent.len()]
            }
            Tag::Recent(_) | Tag::Reserved => RESERVED_TAG,
            Tag::Any(v) => v,
        }
    }

    fn cmd_sn(&mut self, sn: Sn, immediate: bool) -> u32 {
        match sn {
            Sn::Next => {
                let v = self.cmd_sn;
                if !immediate {
                    self.cmd_sn = self.cmd_sn.wrapping_add(1);
                }
                v
            }
            Sn::Ahead(n) => self.cmd_sn.wrapping_add(u32::from(n)),
            Sn::Behind(n) => self.cmd_sn.wrapping_sub(u32::from(n)),
            Sn::Any(v) => v,
        }
    }

    fn ttt(&self, ttt: Ttt) -> u32 {
        match ttt {
            Ttt::Reserved => RESERVED_TAG,
            Ttt::FromR2t(i) if !self.r2ts.is_empty() => {
                self.r2ts[usize::from(i) % self.r2ts.len()].1
            }
            Ttt::FromR2t(_) => RESERVED_TAG,
            Ttt::FromTarget => self.target_ttt,
            Ttt::Any(v) => v,
        }
    }

    fn encode(&self, pdus: &[Pdu]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in pdus {
            p.encode_into(&mut out, self.digests);
        }
        out
    }

    /// Records what the target received and checks what it sent.
    fn observe(&mut self, log: Vec<Wire>, full_feature: bool) {
        for w in log {
            match w {
                Wire::ToTarget(p) => self.to_target(&p),
                Wire::FromTarget(p) if full_feature => self.from_target(&p),
                Wire::FromTarget(_) => {}
            }
        }
    }

    fn to_target(&mut self, p: &Pdu) {
        let (itt, kind) = match p.bhs {
            Bhs::ScsiCommand(c) => {
                let cmd = Cmd {
                    read: c.read,
                    write: c.write,
                    edtl: c.expected_data_transfer_length,
                    lun: c.lun.index().unwrap_or(u16::MAX),
                    cmd_sn: c.cmd_sn,
                    immediate: c.immediate,
                };
                let shared = self.open.get(&c.itt).is_some_and(|&n| n > 0);
                self.cmds.insert(c.itt, (!shared).then_some(cmd));
                *self.open.entry(c.itt).or_default() += 1;
                self.aborted.remove(&c.itt);
                self.data_in.remove(&c.itt);
                self.r2t_sn.remove(&c.itt);
                (c.itt, Kind::Scsi)
            }
            Bhs::TaskMgmtRequest(t) => {
                self.tmfs.insert(
                    t.itt,
                    Tmf {
                        function: t.function,
                        lun: t.lun.index().unwrap_or(u16::MAX),
                        referenced: t.referenced_task_tag,
                        cmd_sn: t.cmd_sn,
                        immediate: t.immediate,
                    },
                );
                (t.itt, Kind::Tmf)
            }
            Bhs::TextRequest(t) => (t.itt, Kind::Text),
            Bhs::NopOut(n) => (n.itt, Kind::Nop),
            Bhs::LogoutRequest(l) => (l.itt, Kind::Logout),
            _ => return,
        };
        self.kinds.entry(itt).or_default().insert(kind);
    }

    fn sent(&self, itt: u32, kind: Kind) -> bool {
        self.kinds.get(&itt).is_some_and(|k| k.contains(&kind))
    }

    fn from_target(&mut self, p: &Pdu) {
        let bhs = &p.bhs;
        assert!(
            !self.closed,
            "{:?} after the Logout Response closed the connection",
            bhs.opcode()
        );
        assert!(
            p.data.len() as u32 <= self.recv_limit,
            "{:?} with a {}-byte data segment beyond our MaxRecvDataSegmentLength {}",
            bhs.opcode(),
            p.data.len(),
            self.recv_limit
        );
        self.numbers(bhs);
        match *bhs {
            Bhs::ScsiResponse(r) => {
                if r.response == ServiceResponse::CommandCompleted {
                    self.check_transferred(r.itt, r.status, r.underflow, r.residual_count);
                }
                self.status(r.itt)
            }
            Bhs::DataIn(d) => {
                let itt = d.itt;
                assert!(
                    self.sent(itt, Kind::Scsi),
                    "Data-In for ITT {itt:#x}, no command"
                );
                self.not_aborted(itt, "Data-In");
                if let Some(Some(cmd)) = self.cmds.get(&itt).copied() {
                    let len = p.data.len() as u32;
                    let end = u64::from(d.buffer_offset) + u64::from(len);
                    if len > 0 {
                        assert!(
                            cmd.read,
                            "Data-In for ITT {itt:#x}, a command without the R bit"
                        );
                    }
                    assert!(
                        end <= u64::from(cmd.edtl),
                        "Data-In for ITT {itt:#x} ends at {end}, beyond its {}-byte EDTL",
                        cmd.edtl
                    );
                    if len > 0 {
                        let ranges = self.data_in.entry(itt).or_default();
                        let (s, e) = (d.buffer_offset, d.buffer_offset + len);
                        assert!(
                            ranges.iter().all(|&(a, b)| e <= a || b <= s),
                            "Data-In for ITT {itt:#x} at {s}..{e} overlaps data sent before"
                        );
                        ranges.push((s, e));
                    }
                }
                if let Some(status) = d.status {
                    self.check_transferred(itt, status, d.underflow, d.residual_count);
                    self.status(itt);
                }
            }
            Bhs::R2t(r) => {
                let itt = r.itt;
                assert!(
                    self.sent(itt, Kind::Scsi),
                    "R2T for ITT {itt:#x}, no command"
                );
                self.not_aborted(itt, "R2T");
                assert_ne!(r.ttt, RESERVED_TAG, "R2T with the reserved TTT");
                if let Some(Some(cmd)) = self.cmds.get(&itt).copied() {
                    assert!(
                        cmd.write,
                        "R2T for ITT {itt:#x}, a command without the W bit"
                    );
                    let end =
                        u64::from(r.buffer_offset) + u64::from(r.desired_data_transfer_length);
                    assert!(r.desired_data_transfer_length > 0, "R2T for no data");
                    assert!(
                        end <= u64::from(cmd.edtl),
                        "R2T for ITT {itt:#x} up to {end}, beyond its {}-byte EDTL",
                        cmd.edtl
                    );
                    assert!(
                        r.desired_data_transfer_length <= self.max_burst,
                        "R2T for {} bytes, above MaxBurstLength {}",
                        r.desired_data_transfer_length,
                        self.max_burst
                    );
                    let sn = self.r2t_sn.entry(itt).or_insert(0);
                    assert_eq!(r.r2t_sn, *sn, "R2TSN of ITT {itt:#x}");
                    *sn += 1;
                }
                self.r2ts
                    .push((itt, r.ttt, r.buffer_offset, r.desired_data_transfer_length));
                if self.r2ts.len() > 64 {
                    self.r2ts.remove(0);
                }
            }
            Bhs::TaskMgmtResponse(t) => {
                assert!(
                    self.sent(t.itt, Kind::Tmf),
                    "TMF response for ITT {:#x}",
                    t.itt
                );
                if t.response == TmfResponse::FunctionComplete {
                    if let Some(&tmf) = self.tmfs.get(&t.itt) {
                        self.aborted_by(tmf, t.exp_cmd_sn);
                    }
                }
            }
            Bhs::TextResponse(t) => {
                assert!(
                    self.sent(t.itt, Kind::Text),
                    "Text Response for ITT {:#x}",
                    t.itt
                );
                assert!(
                    !(t.final_bit && t.continue_bit),
                    "Text Response with both F and C"
                );
                if t.ttt != RESERVED_TAG {
                    self.target_ttt = t.ttt;
                }
            }
            Bhs::NopIn(n) => {
                if n.itt == RESERVED_TAG {
                    assert_ne!(n.ttt, RESERVED_TAG, "NOP-In with neither ITT nor TTT");
                    self.target_ttt = n.ttt;
                } else {
                    assert!(self.sent(n.itt, Kind::Nop), "NOP-In for ITT {:#x}", n.itt);
                    assert_eq!(n.ttt, RESERVED_TAG, "a NOP-In answer with a TTT");
                }
            }
            Bhs::LogoutResponse(l) => {
                assert!(
                    self.sent(l.itt, Kind::Logout),
                    "Logout Response for ITT {:#x}",
                    l.itt
                );
                if l.response == LogoutResponseCode::Closed {
                    self.closed = true;
                }
            }
            Bhs::Reject(_) | Bhs::AsyncMessage(_) => {}
            ref other => panic!("{:?} from the target in full feature phase", other.opcode()),
        }
    }

    /// A SCSI command's status: one per command.
    fn status(&mut self, itt: u32) {
        assert!(
            self.sent(itt, Kind::Scsi),
            "status for ITT {itt:#x}, no command"
        );
        self.not_aborted(itt, "status");
        let open = self.open.entry(itt).or_default();
        assert!(*open > 0, "more statuses than commands for ITT {itt:#x}");
        *open -= 1;
        self.data_in.remove(&itt);
        self.r2t_sn.remove(&itt);
        self.r2ts.retain(|r| r.0 != itt);
    }

    /// A command that read and ended GOOD received exactly its Expected
    /// Data Transfer Length, less the residual when the U bit says the
    /// command wanted fewer bytes (RFC 7143 §11.4.5.1, §11.7.5): an
    /// initiator trusts the status and the residual, not a count of its own.
    fn check_transferred(&self, itt: u32, status: u8, underflow: bool, residual: u32) {
        let Some(Some(cmd)) = self.cmds.get(&itt).copied() else {
            return;
        };
        if status != GOOD || !cmd.read || cmd.write {
            return;
        }
        let got: u64 = self
            .data_in
            .get(&itt)
            .map_or(0, |r| r.iter().map(|&(a, b)| u64::from(b - a)).sum());
        let want = if underflow {
            u64::from(cmd.edtl.saturating_sub(residual))
        } else {
            u64::from(cmd.edtl)
        };
        assert_eq!(
            got, want,
            "ITT {itt:#x} ended GOOD with {got} bytes of Data-In, its EDTL {} and residual \
             (U {underflow}) {residual} say {want}",
            cmd.edtl
        );
    }

    fn not_aborted(&self, itt: u32, what: &str) {
        assert!(
            !self.aborted.contains(&itt),
            "{what} for ITT {itt:#x} after task management aborted it"
        );
    }

    /// Open commands a "Function complete" covered: those the target had
    /// delivered when the function ran (RFC 7143 §3.2.2.1, §11.5): immediate
    /// ones, and those below the ExpCmdSN its response carries and, for a
    /// non-immediate function, below its own CmdSN (commands after it in
    /// CmdSN order may be delivered in the same breath and are not its).
    fn aborted_by(&mut self, tmf: Tmf, exp_cmd_sn: u32) {
        let Tmf {
            function,
            lun,
            referenced,
            ..
        } = tmf;
        let victims: Vec<u32> = self
            .open
            .iter()
            .filter(|(_, &n)| n > 0)
            .map(|(&itt, _)| itt)
            .filter(|itt| {
                let Some(Some(cmd)) = self.cmds.get(itt) else {
                    return false;
                };
                let delivered = cmd.immediate
                    || (sn_lt(cmd.cmd_sn, exp_cmd_sn)
                        && (tmf.immediate || sn_lt(cmd.cmd_sn, tmf.cmd_sn)));
                delivered
                    && match function {
                        TmfFunction::AbortTask => *itt == referenced,
                        TmfFunction::AbortTaskSet
                        | TmfFunction::ClearTaskSet
                        | TmfFunction::LogicalUnitReset => cmd.lun == lun,
                        TmfFunction::TargetWarmReset | TmfFunction::TargetColdReset => true,
                        _ => false,
                    }
            })
            .collect();
        for itt in victims {
            self.open.remove(&itt);
            self.aborted.insert(itt);
            self.r2ts.retain(|r| r.0 != itt);
        }
    }

    /// StatSN, ExpCmdSN and MaxCmdSN of a stamped PDU.
    fn numbers(&mut self, bhs: &Bhs) {
        let (stat_sn, exp, max, advances) = match *bhs {
            Bhs::ScsiResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
            Bhs::DataIn(d) => (d.stat_sn, d.exp_cmd_sn, d.max_cmd_sn, d.status.is_some()),
            Bhs::R2t(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, false),
            Bhs::TaskMgmtResponse(t) => (t.stat_sn, t.exp_cmd_sn, t.max_cmd_sn, true),
            Bhs::TextResponse(t) => (t.stat_sn, t.exp_cmd_sn, t.max_cmd_sn, true),
            Bhs::LogoutResponse(l) => (l.stat_sn, l.exp_cmd_sn, l.max_cmd_sn, true),
            Bhs::NopIn(n) => (n.stat_sn, n.exp_cmd_sn, n.max_cmd_sn, n.itt != RESERVED_TAG),
            Bhs::Reject(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
            Bhs::AsyncMessage(a) => (a.stat_sn, a.exp_cmd_sn, a.max_cmd_sn, true),
            _ => return,
        };
        let expected = self.stat_sn.expect("StatSN known after login");
        let checked = advances || matches!(bhs, Bhs::R2t(_));
        if checked {
            assert_eq!(stat_sn, expected, "StatSN of {:?}", bhs.opcode());
        }
        if advances {
            self.stat_sn = Some(expected.wrapping_add(1));
        }
        if let Some(prev) = self.exp_cmd_sn {
            assert!(!sn_lt(exp, prev), "ExpCmdSN went back from {prev} to {exp}");
        }
        self.exp_cmd_sn = Some(exp);
        let window = max.wrapping_sub(exp).wrapping_add(1);
        assert!(
            window <= self.queue_depth,
            "window ExpCmdSN {exp} MaxCmdSN {max} beyond the queue depth {}",
            self.queue_depth
        );
    }
}

fn login_request(
    csg: Stage,
    nsg: Stage,
    transit: bool,
    cmd_sn: u32,
    pairs: &[(&str, String)],
) -> Pdu {
    Pdu::with_data(
        Bhs::LoginRequest(LoginRequest {
            transit,
            continue_bit: false,
            csg,
            nsg,
            version_max: 0,
            version_min: 0,
            isid: [0x80, 0, 0, 0, 0x42, 1],
            tsih: 0,
            itt: 0x77,
            cid: 1,
            cmd_sn,
            exp_stat_sn: 0,
        }),
        encode_text(pairs).unwrap_or_default(),
    )
}

fn pick_pairs(pairs: &[(u8, u8)]) -> Vec<(&'static str, String)> {
    pairs
        .iter()
        .take(8)
        .map(|&(k, v)| {
            (
                KEYS[usize::from(k) % KEYS.len()],
                VALUES[usize::from(v) % VALUES.len()].to_string(),
            )
        })
        .collect()
}

/// The last Login Response in `log`.
fn login_response(log: &[Wire]) -> Option<&Pdu> {
    log.iter().rev().find_map(|w| match w {
        Wire::FromTarget(p) if matches!(p.bhs, Bhs::LoginResponse(_)) => Some(p),
        _ => None,
    })
}

/// Logs in as the input says; true once in the full feature phase.
fn login(h: &mut Harness, m: &mut Model, l: &Login) -> bool {
    let no_digests = Digests::default();
    let mut last = None;
    if l.selector < 236 {
        let discovery = l.selector >= 216;
        let mut security = vec![
            ("InitiatorName", INITIATOR.to_string()),
            ("AuthMethod", "None".to_string()),
        ];
        if discovery {
            security.push(("SessionType", "Discovery".into()));
        } else {
            security.push(("SessionType", "Normal".into()));
            security.push(("TargetName", TARGET.into()));
        }
        let mine = l.keys.pairs();
        let nsg = if l.skip_operational {
            Stage::FullFeature
        } else {
            Stage::Operational
        };
        if l.skip_operational {
            security.extend(mine.iter().cloned());
        }
        h.send(
            &login_request(Stage::Security, nsg, true, l.first_cmd_sn, &security)
                .encode(no_digests),
        );
        let log = h.take_log();
        last = login_response(&log).cloned();
        m.observe(log, false);
        let mut request = mine.clone();
        for _round in 0..4 {
            if h.phase() != Phase::Login {
                break;
            }
            h.send(
                &login_request(
                    Stage::Operational,
                    Stage::FullFeature,
                    true,
                    l.first_cmd_sn,
                    &request,
                )
                .encode(no_digests),
            );
            let log = h.take_log();
            last = login_response(&log).cloned();
            m.observe(log, false);
            // Accept what the target offered of its own.
            let offered = last
                .as_ref()
                .and_then(|p| parse_text(&p.data).ok())
                .unwrap_or_default();
            request = offered
                .into_iter()
                .filter(|(k, _)| !mine.iter().any(|(mk, _)| mk == k))
                .map(|(k, v)| {
                    (
                        KEYS.iter()
                            .find(|x| **x == k)
                            .copied()
                            .unwrap_or("X-ignored"),
                        v,
                    )
                })
                .collect();
        }
    } else {
        for p in l.arbitrary.iter().take(6) {
            if h.phase() != Phase::Login {
                break;
            }
            let bytes = match p {
                LoginPdu::Request {
                    transit,
                    continue_bit,
                    csg,
                    nsg,
                    tsih,
                    itt,
                    cmd_sn,
                    pairs,
                } => {
                    let mut pdu = login_request(
                        Stage::from_bits(csg & 3),
                        Stage::from_bits(nsg & 3),
                        *transit,
                        *cmd_sn,
                        &pick_pairs(pairs),
                    );
                    if let Bhs::LoginRequest(r) = &mut pdu.bhs {
                        r.continue_bit = *continue_bit;
                        r.tsih = *tsih;
                        r.itt = *itt;
                    }
                    pdu.encode(no_digests)
                }
                LoginPdu::Raw(b) => b.clone(),
            };
            h.send(&bytes);
            let log = h.take_log();
            if let Some(p) = login_response(&log) {
                last = Some(p.clone());
            }
            m.observe(log, false);
        }
    }
    if h.phase() != Phase::FullFeature {
        return false;
    }
    let Some(Bhs::LoginResponse(r)) = last.map(|p| p.bhs) else {
        panic!("logged in without a final Login Response");
    };
    assert!(
        r.transit && r.nsg == Stage::FullFeature,
        "final Login Response {r:?}"
    );
    m.stat_sn = Some(r.stat_sn.wrapping_add(1));
    m.cmd_sn = r.exp_cmd_sn;
    m.exp_cmd_sn = Some(r.exp_cmd_sn);
    m.logged_in(h);
    true
}

fn lun(v: u8) -> Lun {
    // Mostly LUN 0, the one that exists.
    Lun::from_index(if v < 224 { 0 } else { u16::from(v & 3) })
}

fn edtl(e: Edtl, exact: u32) -> u32 {
    match e {
        Edtl::Exact => exact,
        Edtl::Less(n) => exact.saturating_sub(u32::from(n)),
        Edtl::More(n) => exact.saturating_add(u32::from(n)),
        Edtl::Any(v) => v % (2 << 20),
    }
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(seed) as u8)
        .collect()
}

/// The Data-Out PDUs answering `len` bytes at `offset` of `itt`'s data.
fn data_outs(m: &Model, itt: u32, ttt: u32, offset: u32, len: u32) -> Vec<Pdu> {
    let step = m.send_limit.max(512);
    let mut out = Vec::new();
    let mut at = 0u32;
    let mut data_sn = 0u32;
    while at < len && out.len() < 64 {
        let n = step.min(len - at);
        out.push(Pdu::with_data(
            Bhs::DataOut(DataOut {
                final_bit: at + n == len,
                lun: Lun::from_index(0),
                itt,
                ttt,
                exp_stat_sn: m.stat_sn.unwrap_or(0),
                data_sn,
                buffer_offset: offset + at,
            }),
            pattern(n as usize, offset + at),
        ));
        at += n;
        data_sn += 1;
    }
    out
}

fn rw_cdb(op: u8, lba: u16, blocks: u8) -> [u8; 16] {
    let mut cdb = [0u8; 16];
    cdb[0] = op;
    cdb[2..6].copy_from_slice(&u32::from(lba).to_be_bytes());
    cdb[7..9].copy_from_slice(&u16::from(blocks).to_be_bytes());
    cdb
}

fn command(
    m: &mut Model,
    cdb: [u8; 16],
    read: bool,
    write: bool,
    edtl: u32,
    sn: Sn,
    itt: Tag,
    lun: Lun,
    immediate: bool,
) -> ScsiCommand {
    let itt = m.itt(itt);
    ScsiCommand {
        immediate,
        final_bit: true,
        read,
        write,
        attr: TaskAttr::Simple,
        lun,
        itt,
        expected_data_transfer_length: edtl,
        cmd_sn: m.cmd_sn(sn, immediate),
        exp_stat_sn: m.stat_sn.unwrap_or(0),
        cdb,
    }
}

/// The PDUs (as bytes) an op sends.
fn op_bytes(m: &mut Model, op: &Op) -> Vec<u8> {
    let pdus: Vec<Pdu> = match *op {
        Op::Read {
            lba,
            blocks,
            edtl: e,
            sn,
            itt,
            lun: l,
            immediate,
        } => {
            let cdb = rw_cdb(0x28, lba % 2100, blocks);
            let len = edtl(e, u32::from(blocks) * BLOCK);
            vec![Pdu::new(Bhs::ScsiCommand(command(
                m,
                cdb,
                true,
                false,
                len,
                sn,
                itt,
                lun(l),
                immediate,
            )))]
        }
        Op::Write {
            lba,
            blocks,
            edtl: e,
            sn,
            itt,
            lun: l,
            unsolicited,
            final_bit,
        } => {
            let cdb = rw_cdb(0x2a, lba % 2100, blocks);
            let len = edtl(e, u32::from(blocks) * BLOCK);
            let mut cmd = command(m, cdb, false, true, len, sn, itt, lun(l), false);
            let (immediate, end) = if unsolicited {
                let first = m.first_burst.min(len);
                let imm = if m.immediate_data {
                    first.min(m.send_limit)
                } else {
                    0
                };
                (imm, if m.initial_r2t { imm } else { first })
            } else {
                (0, 0)
            };
            cmd.final_bit = final_bit.unwrap_or(end == immediate);
            let mut pdus = vec![Pdu::with_data(
                Bhs::ScsiCommand(cmd),
                pattern(immediate as usize, 0),
            )];
            if end > immediate {
                pdus.extend(data_outs(
                    m,
                    cmd.itt,
                    RESERVED_TAG,
                    immediate,
                    end - immediate,
                ));
            }
            pdus
        }
        Op::Other {
            opcode,
            cdb: rest,
            edtl,
            read,
            write,
            data,
            sn,
            itt,
            lun: l,
        } => {
            // Mostly opcodes the core implements, shaped like the real ones.
            const OPS: [u8; 24] = [
                0x00, 0x03, 0x12, 0x1a, 0x25, 0x9e, 0xa0, 0x35, 0x91, 0x93, 0x42, 0x89, 0x5e, 0x5f,
                0x2f, 0x2e, 0x88, 0x8a, 0x83, 0x84, 0x41, 0xa3, 0x1b, 0x1e,
            ];
            let mut cdb = [0u8; 16];
            cdb[0] = if opcode < 200 {
                OPS[usize::from(opcode) % OPS.len()]
            } else {
                opcode
            };
            cdb[1..].copy_from_slice(&rest);
            let edtl = u32::from(edtl);
            let mut cmd = command(m, cdb, read, write, edtl, sn, itt, lun(l), false);
            let data = pattern(
                usize::from(data)
                    .min(edtl as usize)
                    .min(m.send_limit as usize),
                1,
            );
            cmd.final_bit = true;
            vec![Pdu::with_data(Bhs::ScsiCommand(cmd), data)]
        }
        Op::DataOut {
            itt,
            ttt,
            data_sn,
            offset,
            len,
            final_bit,
        } => {
            let itt = m.itt(itt);
            let ttt = m.ttt(ttt);
            let len = u32::from(len).min(m.send_limit);
            vec![Pdu::with_data(
                Bhs::DataOut(DataOut {
                    final_bit,
                    lun: Lun::from_index(0),
                    itt,
                    ttt,
                    exp_stat_sn: m.stat_sn.unwrap_or(0),
                    data_sn: u32::from(data_sn),
                    buffer_offset: offset % (1 << 21),
                }),
                pattern(len as usize, offset),
            )]
        }
        Op::AnswerR2t { which } => {
            if m.r2ts.is_empty() {
                return Vec::new();
            }
            let (itt, ttt, offset, len) = m.r2ts.remove(usize::from(which) % m.r2ts.len());
            data_outs(m, itt, ttt, offset, len)
        }
        Op::Tmf {
            function,
            lun: l,
            referenced,
            sn,
            immediate,
        } => {
            let itt = m.itt(Tag::Fresh);
            let referenced = m.itt(referenced);
            vec![Pdu::new(Bhs::TaskMgmtRequest(TaskMgmtRequest {
                immediate,
                function: TmfFunction::from_u8(function % 10),
                lun: lun(l),
                itt,
                referenced_task_tag: referenced,
                cmd_sn: m.cmd_sn(sn, immediate),
                exp_stat_sn: m.stat_sn.unwrap_or(0),
                ref_cmd_sn: m.cmd_sn.wrapping_sub(1),
                exp_data_sn: 0,
            }))]
        }
        Op::Text {
            ref body,
            sn,
            itt,
            ttt,
            final_bit,
            continue_bit,
            immediate,
        } => {
            let data = match body {
                TextBody::SendTargets(v) => {
                    let what = match v % 3 {
                        0 => "All".to_string(),
                        1 => TARGET.to_string(),
                        _ => String::new(),
                    };
                    encode_text(&[("SendTargets", what)]).unwrap_or_default()
                }
                TextBody::Pairs(p) => encode_text(&pick_pairs(p)).unwrap_or_default(),
                TextBody::Raw(b) => b.iter().copied().take(m.send_limit as usize).collect(),
            };
            let itt = m.itt(itt);
            vec![Pdu::with_data(
                Bhs::TextRequest(TextRequest {
                    immediate,
                    final_bit,
                    continue_bit,
                    lun: Lun::default(),
                    itt,
                    ttt: m.ttt(ttt),
                    cmd_sn: m.cmd_sn(sn, immediate),
                    exp_stat_sn: m.stat_sn.unwrap_or(0),
                }),
                data,
            )]
        }
        Op::Nop {
            itt,
            ttt,
            sn,
            immediate,
            data,
        } => {
            let itt = m.itt(itt);
            vec![Pdu::with_data(
                Bhs::NopOut(NopOut {
                    immediate,
                    lun: Lun::default(),
                    itt,
                    ttt: m.ttt(ttt),
                    cmd_sn: m.cmd_sn(sn, immediate || itt == RESERVED_TAG),
                    exp_stat_sn: m.stat_sn.unwrap_or(0),
                }),
                pattern(usize::from(data), 2),
            )]
        }
        Op::Logout {
            reason,
            sn,
            immediate,
            cid,
        } => {
            let itt = m.itt(Tag::Fresh);
            vec![Pdu::new(Bhs::LogoutRequest(LogoutRequest {
                immediate,
                reason: LogoutReason::from_u8(reason & 0x7f),
                itt,
                cid,
                cmd_sn: m.cmd_sn(sn, immediate),
                exp_stat_sn: m.stat_sn.unwrap_or(0),
            }))]
        }
        Op::Snack {
            kind,
            itt,
            beg_run,
            run_length,
        } => {
            let itt = m.itt(itt);
            vec![Pdu::new(Bhs::SnackRequest(SnackRequest {
                snack_type: SnackType::from_u8(kind & 0x0f),
                lun: Lun::default(),
                itt,
                ttt_or_snack_tag: m.target_ttt,
                exp_stat_sn: m.stat_sn.unwrap_or(0),
                beg_run,
                run_length,
            }))]
        }
        Op::Header { bytes, ref data } => {
            let mut header = bytes;
            let data = &data[..data.len().min(m.send_limit as usize)];
            // No AHS and a DataSegmentLength that matches: the frame is cut
            // where it ends and the next PDU follows.
            header[4] = 0;
            header[5..8].copy_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
            let mut out = header.to_vec();
            if m.digests.header {
                out.extend_from_slice(&blockwire_pdu::digest::crc32c_digest(&header).to_le_bytes());
            }
            out.extend_from_slice(data);
            out.resize(
                48 + usize::from(m.digests.header) * 4 + data.len().div_ceil(4) * 4,
                0,
            );
            if m.digests.data && !data.is_empty() {
                out.extend_from_slice(&blockwire_pdu::pdu::data_digest(data));
            }
            return out;
        }
        Op::Raw(ref b) => return b.clone(),
        Op::Advance { .. } | Op::NextTimer | Op::Shutdown => Vec::new(),
    };
    m.encode(&pdus)
}

fuzz_target!(|input: Input| {
    let settings = input.settings.fabric();
    let mut m = Model::new(settings.queue_depth);
    let (store, paths) = input.settings.lun0();
    let mut h = Harness::serving(settings, store, paths);
    h.set_qos(input.settings.qos());
    let to_each_turn = input.settings.qos() != QosLimits::NONE && input.settings.qos & 64 != 0;
    if login(&mut h, &mut m, &input.login) {
        for op in input.ops.iter().take(64) {
            if h.phase() != Phase::FullFeature {
                break;
            }
            match op {
                Op::Advance { seconds } => h.advance(Duration::from_secs(u64::from(*seconds))),
                Op::NextTimer => h.advance_to_next_timer(NEXT_TIMER_WITHIN),
                Op::Shutdown => h.shutdown(),
                op => {
                    let bytes = op_bytes(&mut m, op);
                    h.send(&bytes);
                }
            }
            if to_each_turn {
                // Time runs on to each held WRITE's turn as it comes.
                h.advance_to_next_timer(NEXT_TIMER_WITHIN);
            }
            let log = h.take_log();
            m.observe(log, true);
        }
        h.close();
        let log = h.take_log();
        m.observe(log, true);
    }
    // Every command booked at the ceilings has started or gone.
    assert_eq!(
        h.qos_waiting(),
        0,
        "commands still counted as waiting for their turn"
    );
    assert_eq!(
        h.qos_in_lines(),
        0,
        "places still held in an initiator's line at the LUN"
    );
});
