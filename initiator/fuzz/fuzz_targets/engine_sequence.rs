//! Drives the initiator's sans-IO session engine: the fuzzer starts SCSI
//! commands (reads, writes, RDMA-offloaded ones), task management, pings
//! and a logout, and answers them as any target might, with well-formed
//! and malformed Data-In, SCSI Responses, R2Ts, NOP-Ins, task management
//! and logout responses, Async Messages, Rejects, Text Responses and raw
//! frames, in any order. The data of each Data-In is placed where the
//! engine says, as the session shell does.
//!
//! Beyond "no panic", each task is checked as the shell relies on it:
//! - ITTs are never the reserved tag and never shared by two live tasks;
//! - a task completes once, and only a task that was started;
//! - a read buffer is lent only within its bounds, for a live read, and
//!   comes back whole (same length) when the task ends, holding what the
//!   Data-In placed;
//! - a completed read never counts more Data-In bytes than it expected;
//! - an R2T reaches only a write, within its length and MaxBurstLength
//!   (RFC 7143 §11.8), in R2TSN order, and never while MaxOutstandingR2T
//!   of the write's R2Ts are unanswered (§13.17);
//! - the engine only ever sends NOP-Outs answering a target ping (§11.18);
//! - `in_flight` lists exactly the live SCSI tasks, `drain` every live task.
#![no_main]

use std::collections::{HashMap, VecDeque};
use std::ops::Range;

use blockwire_initiator::engine::{Engine, Event, Limits, Placement, TaskResult};
use blockwire_pdu::pdu::codes::{
    AsyncEvent, LogoutResponseCode, RejectReason, ServiceResponse, TmfFunction, TmfResponse,
};
use blockwire_pdu::pdu::{
    AsyncMessage, DataIn, LogoutResponse, NopIn, R2t, Reject, ScsiResponse, TaskMgmtResponse,
    TextResponse, RESERVED_TAG,
};
use blockwire_pdu::{Bhs, Digests, Lun, Pdu};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    limits: InLimits,
    cmd_sn: u32,
    exp_cmd_sn: u32,
    window: u8,
    stat_sn: u32,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug)]
struct InLimits {
    target_mrdsl: u8,
    our_mrdsl: u8,
    first_burst: u8,
    max_burst: u8,
    immediate_data: bool,
    initial_r2t: bool,
    data_pdu_in_order: bool,
    max_outstanding_r2t: u8,
}

const SIZES: [u32; 6] = [512, 4096, 8192, 65536, 262_144, 1 << 20];

impl InLimits {
    fn limits(&self) -> Limits {
        let size = |i: u8| SIZES[usize::from(i) % SIZES.len()];
        Limits {
            target_mrdsl: size(self.target_mrdsl),
            our_mrdsl: size(self.our_mrdsl),
            first_burst: size(self.first_burst),
            max_burst: size(self.max_burst),
            immediate_data: self.immediate_data,
            initial_r2t: self.initial_r2t,
            data_pdu_in_order: self.data_pdu_in_order,
            max_outstanding_r2t: u32::from(self.max_outstanding_r2t % 4) + 1,
        }
    }
}

/// Which task a target PDU names.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Tag {
    Live(u8),
    Ended(u8),
    Reserved,
    Any(u32),
}

/// The StatSN a target PDU carries.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum StatSn {
    Next,
    Same,
    Any(u32),
}

#[derive(Arbitrary, Debug)]
enum Op {
    Read {
        len: u16,
        lun: u8,
    },
    Write {
        len: u32,
        lun: u8,
    },
    Offloaded {
        read: u32,
        write: u32,
    },
    Tmf {
        function: u8,
        lun: u8,
        referenced: Option<Tag>,
    },
    Ping,
    Logout,
    /// A well-shaped Data-In for a live read: the next piece of its data.
    NextDataIn {
        task: u8,
        len: u16,
        status: Option<u8>,
    },
    DataIn {
        itt: Tag,
        data_sn: Option<u32>,
        offset: u32,
        len: u16,
        status: Option<u8>,
        underflow: bool,
        overflow: bool,
        residual: u32,
        stat_sn: StatSn,
        window: (u32, u32),
    },
    Response {
        itt: Tag,
        response: u8,
        status: u8,
        underflow: bool,
        overflow: bool,
        residual: u32,
        sense: Vec<u8>,
        stat_sn: StatSn,
        window: (u32, u32),
    },
    R2t {
        itt: Tag,
        ttt: u32,
        /// None: the R2TSN the task's next R2T carries.
        r2t_sn: Option<u32>,
        offset: u32,
        len: u32,
        window: (u32, u32),
    },
    NopIn {
        itt: Tag,
        ttt: Option<u32>,
        stat_sn: StatSn,
        data: Vec<u8>,
    },
    TmfResponse {
        itt: Tag,
        response: u8,
        stat_sn: StatSn,
    },
    LogoutResponse {
        itt: Tag,
        response: u8,
        stat_sn: StatSn,
    },
    Async {
        event: u8,
        stat_sn: StatSn,
        window: (u32, u32),
    },
    Reject {
        itt: Tag,
        reason: u8,
        /// The rejected PDU's opcode (low 6 bits): a request ends its task,
        /// a Data-Out or SNACK leaves it to the target's own answer.
        opcode: u8,
        stat_sn: StatSn,
    },
    Text {
        itt: Tag,
        stat_sn: StatSn,
        data: Vec<u8>,
    },
    Raw(Vec<u8>),
    /// The owner of a live task has sent the last Data-Out answering one
    /// of its R2Ts.
    AnswerR2t(Tag),
    Drain,
}

/// What the fuzz target knows of a live task.
#[derive(Debug)]
struct Task {
    owner: u64,
    scsi: bool,
    /// Read buffer length (0: none lent).
    read_len: usize,
    write_len: usize,
    /// Byte ranges Data-In placed, with the byte pattern seed each used.
    placed: Vec<(Range<usize>, u32)>,
    /// Where the next well-shaped Data-In goes, and its DataSN.
    next_offset: usize,
    next_data_sn: u32,
    /// R2Ts handed to the owner (the next R2TSN of a write), and those
    /// not yet answered, oldest first.
    r2ts: u32,
    unanswered: VecDeque<R2t>,
}

struct Model {
    limits: Limits,
    engine: Engine<u64>,
    next_owner: u64,
    /// Live tasks by ITT.
    live: HashMap<u32, Task>,
    /// Owners of live tasks, to their ITT.
    owners: HashMap<u64, u32>,
    ended: Vec<u32>,
    stat_sn: u32,
    /// The buffer the engine lent for the Data-In being placed.
    seed: u32,
}

fn fill(buf: &mut [u8], seed: u32) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i as u32).wrapping_mul(7).wrapping_add(seed) as u8;
    }
}

impl Model {
    fn owner(&mut self) -> u64 {
        self.next_owner += 1;
        self.next_owner
    }

    fn started(&mut self, itt: u32, task: Task) {
        assert_ne!(itt, RESERVED_TAG, "a task got the reserved ITT");
        assert!(
            !self.live.contains_key(&itt),
            "ITT {itt:#x} given to two live tasks"
        );
        self.owners.insert(task.owner, itt);
        self.live.insert(itt, task);
    }

    fn tag(&self, tag: Tag) -> u32 {
        match tag {
            Tag::Live(i) if !self.live.is_empty() => {
                let mut itts: Vec<u32> = self.live.keys().copied().collect();
                itts.sort_unstable();
                itts[usize::from(i) % itts.len()]
            }
            Tag::Ended(i) if !self.ended.is_empty() => {
                self.ended[usize::from(i) % self.ended.len()]
            }
            Tag::Live(_) | Tag::Ended(_) | Tag::Reserved => RESERVED_TAG,
            Tag::Any(v) => v,
        }
    }

    fn stat_sn(&mut self, s: StatSn) -> u32 {
        match s {
            StatSn::Next => {
                let v = self.stat_sn;
                self.stat_sn = self.stat_sn.wrapping_add(1);
                v
            }
            StatSn::Same => self.stat_sn.wrapping_sub(1),
            StatSn::Any(v) => v,
        }
    }

    fn events(&mut self, events: Vec<Event<u64>>) {
        for e in events {
            match e {
                Event::Complete { owner, result } => self.complete(owner, result),
                Event::R2t { owner, r2t } => {
                    let itt = *self
                        .owners
                        .get(&owner)
                        .expect("R2T for a task that is not live");
                    let max_outstanding = self.limits.max_outstanding_r2t;
                    let t = self.live.get_mut(&itt).expect("live");
                    assert_eq!(r2t.itt, itt, "R2T handed to another task's owner");
                    assert_eq!(r2t.r2t_sn, t.r2ts, "R2T handed out of R2TSN order");
                    assert!(
                        (t.unanswered.len() as u32) < max_outstanding,
                        "R2T handed past MaxOutstandingR2T"
                    );
                    t.r2ts += 1;
                    t.unanswered.push_back(r2t.clone());
                    assert!(
                        t.scsi && t.write_len > 0,
                        "R2T handed to a task that writes nothing"
                    );
                    let end =
                        u64::from(r2t.buffer_offset) + u64::from(r2t.desired_data_transfer_length);
                    assert!(end <= t.write_len as u64, "R2T beyond the write");
                    assert!(
                        r2t.desired_data_transfer_length <= self.limits.max_burst,
                        "R2T above MaxBurstLength"
                    );
                }
                Event::Send(p) => match p.bhs {
                    Bhs::NopOut(n) => {
                        assert_eq!(n.itt, RESERVED_TAG, "the engine pings on its own");
                        assert_ne!(
                            n.ttt, RESERVED_TAG,
                            "a NOP-Out answer without the ping's TTT"
                        );
                    }
                    other => panic!("the engine sends {:?} by itself", other.opcode()),
                },
                Event::Drop { .. } | Event::LogoutRequested { .. } => {}
            }
        }
    }

    fn complete(&mut self, owner: u64, result: TaskResult) {
        let itt = self
            .owners
            .remove(&owner)
            .expect("a task completed twice, or was never started");
        let task = self.live.remove(&itt).expect("live");
        self.ended.push(itt);
        if self.ended.len() > 16 {
            self.ended.remove(0);
        }
        let buf = match result {
            TaskResult::Scsi(o) => {
                assert!(task.scsi, "a SCSI outcome for a task that is not a command");
                assert!(
                    o.data_in <= task.read_len as u64,
                    "{} Data-In bytes counted for a {}-byte read",
                    o.data_in,
                    task.read_len
                );
                o.buf
            }
            TaskResult::Aborted { buf } | TaskResult::Failed { buf, .. } => buf,
            TaskResult::Tmf(_) | TaskResult::Nop | TaskResult::Logout(..) => None,
        };
        match buf {
            Some(b) => {
                assert_eq!(b.len(), task.read_len, "read buffer came back resized");
                for (r, seed) in &task.placed {
                    let mut want = vec![0u8; r.len()];
                    fill(&mut want, *seed);
                    assert!(
                        b[r.clone()] == want[..],
                        "read buffer lost the data placed at {r:?}"
                    );
                }
            }
            None => assert!(task.read_len == 0 || !task.scsi, "read buffer lost"),
        }
    }

    fn data_in(&mut self, d: DataIn, len: usize) {
        let (placement, events) = self.engine.data_in_begin(&d, len);
        self.events(events);
        let back = match placement {
            Placement::Into { mut buf, range } => {
                let task = self
                    .live
                    .get_mut(&d.itt)
                    .expect("buffer lent for a task not live");
                assert_eq!(buf.len(), task.read_len, "lent buffer of the wrong size");
                assert!(
                    range.end <= buf.len(),
                    "lent range {range:?} beyond the buffer"
                );
                assert_eq!(range.len(), len, "lent range is not the PDU's data");
                assert_eq!(
                    range.start, d.buffer_offset as usize,
                    "lent range not at the offset"
                );
                self.seed = self.seed.wrapping_add(1);
                fill(&mut buf[range.clone()], self.seed);
                task.placed
                    .retain(|(r, _)| r.end <= range.start || range.end <= r.start);
                task.placed.push((range, self.seed));
                Some(buf)
            }
            Placement::Discard => None,
        };
        let n = if back.is_some() { len } else { 0 };
        let events = self.engine.data_in_end(&d, back, n);
        self.events(events);
    }

    fn receive(&mut self, pdu: Pdu) {
        if let Bhs::DataIn(d) = pdu.bhs {
            self.data_in(d, pdu.data.len());
        } else {
            let events = self.engine.receive(pdu);
            self.events(events);
        }
    }

    fn check_tables(&self) {
        let scsi = self.live.values().filter(|t| t.scsi).count();
        let listed = self.engine.in_flight();
        assert_eq!(listed.len(), scsi, "in_flight lists {listed:?}");
        for t in listed {
            assert!(
                self.live.get(&t.itt).is_some_and(|x| x.scsi),
                "in_flight lists {:#x}",
                t.itt
            );
        }
    }
}

/// ExpCmdSN and a MaxCmdSN at most 63 beyond (a window or, from
/// ExpCmdSN's wrap, a "closed" one the engine must ignore).
fn window(w: (u32, u32)) -> (u32, u32) {
    (w.0, w.0.wrapping_add(w.1 % 64))
}

fuzz_target!(|input: Input| {
    let limits = input.limits.limits();
    let max_cmd_sn = input.exp_cmd_sn.wrapping_add(u32::from(input.window % 32));
    let mut m = Model {
        limits,
        engine: Engine::new(
            1,
            limits,
            input.cmd_sn,
            input.exp_cmd_sn,
            max_cmd_sn,
            input.stat_sn,
        ),
        next_owner: 0,
        live: HashMap::new(),
        owners: HashMap::new(),
        ended: Vec::new(),
        stat_sn: input.stat_sn.wrapping_add(1),
        seed: 0,
    };
    assert_eq!(m.engine.limits(), limits);
    for op in input.ops.iter().take(256) {
        match *op {
            Op::Read { len, lun } => {
                let owner = m.owner();
                let len = usize::from(len);
                let cdb = [0x28u8; 16];
                let (itt, cmd, imm, end) =
                    m.engine
                        .start_scsi(u16::from(lun % 4), &cdb, Some(vec![0u8; len]), 0, owner);
                assert_eq!((imm, end), (0, 0), "unsolicited data for a read");
                assert_eq!(cmd.itt, itt);
                assert_eq!(cmd.expected_data_transfer_length as usize, len);
                m.started(
                    itt,
                    Task {
                        owner,
                        scsi: true,
                        read_len: len,
                        write_len: 0,
                        placed: Vec::new(),
                        next_offset: 0,
                        next_data_sn: 0,
                        r2ts: 0,
                        unanswered: VecDeque::new(),
                    },
                );
            }
            Op::Write { len, lun } => {
                let owner = m.owner();
                let len = (len % (4 << 20)) as usize;
                let cdb = [0x2au8; 16];
                let (itt, cmd, imm, end) =
                    m.engine
                        .start_scsi(u16::from(lun % 4), &cdb, None, len, owner);
                assert!(
                    imm <= end && end <= len,
                    "unsolicited {imm}..{end} of a {len}-byte write"
                );
                assert!(
                    imm <= limits.target_mrdsl as usize,
                    "immediate data beyond the target's MRDSL"
                );
                assert!(
                    end <= limits.first_burst as usize,
                    "unsolicited data beyond FirstBurstLength"
                );
                assert_eq!(
                    cmd.final_bit,
                    imm == end,
                    "F bit against unsolicited Data-Out"
                );
                m.started(
                    itt,
                    Task {
                        owner,
                        scsi: true,
                        read_len: 0,
                        write_len: len,
                        placed: Vec::new(),
                        next_offset: 0,
                        next_data_sn: 0,
                        r2ts: 0,
                        unanswered: VecDeque::new(),
                    },
                );
            }
            Op::Offloaded { read, write } => {
                let owner = m.owner();
                let (itt, _) = m.engine.start_scsi_offloaded(
                    0,
                    &[0u8; 16],
                    read as usize,
                    write as usize,
                    owner,
                );
                m.started(
                    itt,
                    Task {
                        owner,
                        scsi: true,
                        read_len: 0,
                        write_len: 0,
                        placed: Vec::new(),
                        next_offset: 0,
                        next_data_sn: 0,
                        r2ts: 0,
                        unanswered: VecDeque::new(),
                    },
                );
            }
            Op::Tmf {
                function,
                lun,
                referenced,
            } => {
                let owner = m.owner();
                let referenced = referenced.map(|t| m.tag(t));
                let req = m.engine.start_tmf(
                    TmfFunction::from_u8(function % 16),
                    u16::from(lun % 4),
                    referenced,
                    owner,
                );
                m.started(
                    req.itt,
                    Task {
                        owner,
                        scsi: false,
                        read_len: 0,
                        write_len: 0,
                        placed: Vec::new(),
                        next_offset: 0,
                        next_data_sn: 0,
                        r2ts: 0,
                        unanswered: VecDeque::new(),
                    },
                );
            }
            Op::Ping => {
                let owner = m.owner();
                let n = m.engine.start_ping(owner);
                m.started(
                    n.itt,
                    Task {
                        owner,
                        scsi: false,
                        read_len: 0,
                        write_len: 0,
                        placed: Vec::new(),
                        next_offset: 0,
                        next_data_sn: 0,
                        r2ts: 0,
                        unanswered: VecDeque::new(),
                    },
                );
            }
            Op::Logout => {
                let owner = m.owner();
                let l = m.engine.start_logout(owner);
                m.started(
                    l.itt,
                    Task {
                        owner,
                        scsi: false,
                        read_len: 0,
                        write_len: 0,
                        placed: Vec::new(),
                        next_offset: 0,
                        next_data_sn: 0,
                        r2ts: 0,
                        unanswered: VecDeque::new(),
                    },
                );
            }
            Op::NextDataIn { task, len, status } => {
                let mut reads: Vec<u32> = m
                    .live
                    .iter()
                    .filter(|(_, t)| t.read_len > 0)
                    .map(|(i, _)| *i)
                    .collect();
                if reads.is_empty() {
                    continue;
                }
                reads.sort_unstable();
                let itt = reads[usize::from(task) % reads.len()];
                let t = m.live.get_mut(&itt).expect("live");
                let len = usize::from(len)
                    .min(t.read_len - t.next_offset)
                    .min(limits.our_mrdsl as usize);
                let d = DataIn {
                    final_bit: status.is_some(),
                    acknowledge: false,
                    overflow: false,
                    underflow: status.is_some() && t.next_offset + len < t.read_len,
                    status,
                    lun: Lun::default(),
                    itt,
                    ttt: RESERVED_TAG,
                    stat_sn: 0,
                    exp_cmd_sn: input.exp_cmd_sn,
                    max_cmd_sn,
                    data_sn: t.next_data_sn,
                    buffer_offset: t.next_offset as u32,
                    residual_count: (t.read_len - t.next_offset - len) as u32,
                };
                t.next_offset += len;
                t.next_data_sn += 1;
                let d = DataIn {
                    stat_sn: if status.is_some() {
                        m.stat_sn(StatSn::Next)
                    } else {
                        0
                    },
                    ..d
                };
                m.data_in(d, len);
            }
            Op::DataIn {
                itt,
                data_sn,
                offset,
                len,
                status,
                underflow,
                overflow,
                residual,
                stat_sn,
                window: w,
            } => {
                let itt = m.tag(itt);
                let data_sn =
                    data_sn.unwrap_or_else(|| m.live.get(&itt).map_or(0, |t| t.next_data_sn));
                let stat = m.stat_sn(stat_sn);
                let (exp, max) = window(w);
                let d = DataIn {
                    final_bit: status.is_some(),
                    acknowledge: false,
                    overflow,
                    underflow,
                    status,
                    lun: Lun::default(),
                    itt,
                    ttt: RESERVED_TAG,
                    stat_sn: stat,
                    exp_cmd_sn: exp,
                    max_cmd_sn: max,
                    data_sn,
                    buffer_offset: offset,
                    residual_count: residual,
                };
                if let Some(t) = m.live.get_mut(&itt) {
                    t.next_data_sn = data_sn.wrapping_add(1);
                }
                m.data_in(d, usize::from(len));
            }
            Op::Response {
                itt,
                response,
                status,
                underflow,
                overflow,
                residual,
                ref sense,
                stat_sn,
                window: w,
            } => {
                let stat = m.stat_sn(stat_sn);
                let (exp, max) = window(w);
                let pdu = Pdu::with_data(
                    Bhs::ScsiResponse(ScsiResponse {
                        bidi_read_overflow: false,
                        bidi_read_underflow: false,
                        overflow,
                        underflow,
                        response: ServiceResponse::from_u8(response),
                        status,
                        itt: m.tag(itt),
                        snack_tag: 0,
                        stat_sn: stat,
                        exp_cmd_sn: exp,
                        max_cmd_sn: max,
                        exp_data_sn: 0,
                        bidi_read_residual_count: 0,
                        residual_count: residual,
                    }),
                    sense.clone(),
                );
                m.receive(pdu);
            }
            Op::R2t {
                itt,
                ttt,
                r2t_sn,
                offset,
                len,
                window: w,
            } => {
                let (exp, max) = window(w);
                let itt = m.tag(itt);
                let r2t_sn = r2t_sn.unwrap_or_else(|| m.live.get(&itt).map_or(0, |t| t.r2ts));
                let pdu = Pdu::new(Bhs::R2t(R2t {
                    lun: Lun::default(),
                    itt,
                    ttt,
                    stat_sn: m.stat_sn,
                    exp_cmd_sn: exp,
                    max_cmd_sn: max,
                    r2t_sn,
                    buffer_offset: offset,
                    desired_data_transfer_length: len,
                }));
                m.receive(pdu);
            }
            Op::NopIn {
                itt,
                ttt,
                stat_sn,
                ref data,
            } => {
                let pdu = Pdu::with_data(
                    Bhs::NopIn(NopIn {
                        lun: Lun::default(),
                        itt: m.tag(itt),
                        ttt: ttt.unwrap_or(RESERVED_TAG),
                        stat_sn: m.stat_sn(stat_sn),
                        exp_cmd_sn: input.exp_cmd_sn,
                        max_cmd_sn,
                    }),
                    data.clone(),
                );
                m.receive(pdu);
            }
            Op::TmfResponse {
                itt,
                response,
                stat_sn,
            } => {
                let pdu = Pdu::new(Bhs::TaskMgmtResponse(TaskMgmtResponse {
                    response: TmfResponse::from_u8(response % 8),
                    itt: m.tag(itt),
                    stat_sn: m.stat_sn(stat_sn),
                    exp_cmd_sn: input.exp_cmd_sn,
                    max_cmd_sn,
                }));
                m.receive(pdu);
            }
            Op::LogoutResponse {
                itt,
                response,
                stat_sn,
            } => {
                let pdu = Pdu::new(Bhs::LogoutResponse(LogoutResponse {
                    response: LogoutResponseCode::from_u8(response % 4),
                    itt: m.tag(itt),
                    stat_sn: m.stat_sn(stat_sn),
                    exp_cmd_sn: input.exp_cmd_sn,
                    max_cmd_sn,
                    time2wait: 0,
                    time2retain: 0,
                }));
                m.receive(pdu);
            }
            Op::Async {
                event,
                stat_sn,
                window: w,
            } => {
                let stat = m.stat_sn(stat_sn);
                let (exp, max) = window(w);
                let pdu = Pdu::new(Bhs::AsyncMessage(AsyncMessage {
                    lun: Lun::default(),
                    stat_sn: stat,
                    exp_cmd_sn: exp,
                    max_cmd_sn: max,
                    event: AsyncEvent::from_u8(event % 6),
                    vcode: 0,
                    parameter1: 0,
                    parameter2: 0,
                    parameter3: 0,
                }));
                m.receive(pdu);
            }
            Op::Reject {
                itt,
                reason,
                opcode,
                stat_sn,
            } => {
                // The rejected header, naming the task by its ITT.
                let mut header = vec![0u8; 48];
                header[0] = opcode & 0x3f;
                header[16..20].copy_from_slice(&m.tag(itt).to_be_bytes());
                let pdu = Pdu::with_data(
                    Bhs::Reject(Reject {
                        reason: RejectReason::from_u8(reason),
                        stat_sn: m.stat_sn(stat_sn),
                        exp_cmd_sn: input.exp_cmd_sn,
                        max_cmd_sn,
                        data_sn_or_r2t_sn: 0,
                    }),
                    header,
                );
                m.receive(pdu);
            }
            Op::Text {
                itt,
                stat_sn,
                ref data,
            } => {
                let pdu = Pdu::with_data(
                    Bhs::TextResponse(TextResponse {
                        final_bit: true,
                        continue_bit: false,
                        lun: Lun::default(),
                        itt: m.tag(itt),
                        ttt: RESERVED_TAG,
                        stat_sn: m.stat_sn(stat_sn),
                        exp_cmd_sn: input.exp_cmd_sn,
                        max_cmd_sn,
                    }),
                    data.clone(),
                );
                m.receive(pdu);
            }
            Op::Raw(ref bytes) => {
                if let Ok((pdu, _)) = Pdu::decode(bytes, Digests::default()) {
                    m.receive(pdu);
                }
            }
            Op::AnswerR2t(tag) => {
                let itt = m.tag(tag);
                let Some(r2t) = m.live.get_mut(&itt).and_then(|t| t.unanswered.pop_front()) else {
                    continue;
                };
                let exp_stat_sn = m.engine.exp_stat_sn();
                let pdus = m
                    .engine
                    .answer_r2t(&r2t)
                    .expect("no answer for an R2T of a live write");
                // The sequence covers the R2T's range in order, DataSN from
                // 0, each PDU within the target's MaxRecvDataSegmentLength,
                // only the last one final (RFC 7143 §11.7).
                let mut at = r2t.buffer_offset as usize;
                for (i, p) in pdus.iter().enumerate() {
                    let h = &p.header;
                    assert_eq!((h.itt, h.ttt), (itt, r2t.ttt), "Data-Out tags");
                    assert_eq!(h.data_sn, i as u32, "Data-Out DataSN");
                    assert_eq!((h.buffer_offset as usize, p.range.start), (at, at));
                    assert!(p.range.end > at, "an empty Data-Out");
                    assert!(
                        p.range.len() <= (m.limits.target_mrdsl as usize).max(512),
                        "a Data-Out above the target's MaxRecvDataSegmentLength"
                    );
                    assert_eq!(h.final_bit, i + 1 == pdus.len(), "the F bit");
                    assert_eq!(h.exp_stat_sn, exp_stat_sn);
                    at = p.range.end;
                }
                assert_eq!(
                    at,
                    r2t.buffer_offset as usize + r2t.desired_data_transfer_length as usize,
                    "the Data-Out sequence ends where the R2T's range does"
                );
            }
            Op::Drain => {
                let drained = m.engine.drain();
                assert_eq!(drained.len(), m.live.len(), "drain left tasks behind");
                for (owner, buf) in drained {
                    let itt = m
                        .owners
                        .remove(&owner)
                        .expect("drained a task that is not live");
                    let task = m.live.remove(&itt).expect("live");
                    if task.read_len > 0 {
                        assert_eq!(
                            buf.map(|b| b.len()),
                            Some(task.read_len),
                            "drain lost a read buffer"
                        );
                    }
                }
            }
        }
        m.check_tables();
    }
});
