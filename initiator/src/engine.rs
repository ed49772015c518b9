//! The full-feature-phase state machine of one session, without I/O.
//!
//! [`Engine`] numbers commands (ITT, CmdSN), tracks the target's CmdSN
//! window and StatSN, keeps the task table, checks every PDU the target
//! sends against it and says what to do: route an R2T to the command that
//! waits for it, place Data-In into the command's buffer, complete a task,
//! answer a NOP-In. It never reads a clock and never touches a socket; the
//! tokio shell in `session` moves the bytes.
//!
//! Each task carries an owner value `T` (the shell uses a channel sender);
//! the engine hands it back with the events that concern the task.

use std::collections::HashMap;
use std::ops::Range;
use std::time::Duration;

use blockwire_pdu::coverage::Coverage;
use blockwire_pdu::keys::SessionParams;
use blockwire_pdu::pdu::codes::{LogoutReason, LogoutResponseCode};
use blockwire_pdu::pdu::codes::{TaskAttr, TmfFunction, TmfResponse};
use blockwire_pdu::pdu::{
    DataIn, DataOut, LogoutRequest, NopIn, NopOut, R2t, ScsiCommand, ScsiResponse, TaskMgmtRequest,
    RESERVED_TAG,
};
use blockwire_pdu::scsi::{parse_sense_segment, Sense, SenseKey};
use blockwire_pdu::serial::{sn_gt, sn_le, sn_lt};
use blockwire_pdu::{Bhs, Lun, Pdu};

/// The negotiated limits that shape what the initiator sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The target's MaxRecvDataSegmentLength: the largest data segment we send.
    pub target_mrdsl: u32,
    /// Our MaxRecvDataSegmentLength: the largest data segment we accept.
    pub our_mrdsl: u32,
    /// FirstBurstLength.
    pub first_burst: u32,
    /// MaxBurstLength.
    pub max_burst: u32,
    /// ImmediateData.
    pub immediate_data: bool,
    /// InitialR2T.
    pub initial_r2t: bool,
    /// DataPDUInOrder: with Yes, Data-In PDUs must arrive at continuously
    /// increasing offsets; with No, in any order (each placed by its
    /// BufferOffset, overlaps refused).
    pub data_pdu_in_order: bool,
    /// MaxOutstandingR2T: how many R2Ts of one command the target may have
    /// asked for whose data is not yet all sent (RFC 7143 §13.17).
    pub max_outstanding_r2t: u32,
}

impl Limits {
    /// The limits a login negotiated.
    pub fn from_params(p: &SessionParams) -> Limits {
        Limits {
            target_mrdsl: p.target_max_recv_data_segment_length,
            our_mrdsl: p.initiator_max_recv_data_segment_length,
            first_burst: p.first_burst_length,
            max_burst: p.max_burst_length,
            immediate_data: p.immediate_data,
            initial_r2t: p.initial_r2t,
            data_pdu_in_order: p.data_pdu_in_order,
            max_outstanding_r2t: p.max_outstanding_r2t.max(1),
        }
    }

    /// For a write of `len` bytes: how many go as immediate data in the
    /// command PDU, and where the unsolicited Data-Out sequence ends.
    pub fn unsolicited(&self, len: usize) -> (usize, usize) {
        let first = (self.first_burst as usize).min(len);
        let immediate = if self.immediate_data {
            first.min(self.target_mrdsl as usize)
        } else {
            0
        };
        let end = if self.initial_r2t { immediate } else { first };
        (immediate, end)
    }
}

/// One Data-Out PDU to send: its header and the slice of the write buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataOutPdu {
    /// The header.
    pub header: DataOut,
    /// Bytes of the command's buffer it carries.
    pub range: Range<usize>,
}

/// Cuts `range` of a write buffer into Data-Out PDUs of at most `mrdsl`
/// bytes: one sequence (DataSN from 0, F bit on the last), answering the
/// R2T with `ttt` (0xffffffff for unsolicited data).
pub fn data_out_sequence(
    itt: u32,
    lun: Lun,
    ttt: u32,
    range: Range<usize>,
    mrdsl: u32,
    exp_stat_sn: u32,
) -> Vec<DataOutPdu> {
    let step = (mrdsl as usize).max(512);
    let mut out = Vec::new();
    let mut at = range.start;
    let mut data_sn = 0u32;
    while at < range.end {
        let end = (at + step).min(range.end);
        out.push(DataOutPdu {
            header: DataOut {
                final_bit: end == range.end,
                lun,
                itt,
                ttt,
                exp_stat_sn,
                data_sn,
                buffer_offset: at as u32,
            },
            range: at..end,
        });
        data_sn = data_sn.wrapping_add(1);
        at = end;
    }
    out
}

/// How a SCSI command ended, as the target reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScsiOutcome {
    /// iSCSI Response (0 = command completed at target).
    pub response: u8,
    /// SCSI status.
    pub status: u8,
    /// Residual underflow: this many bytes were not transferred.
    pub underflow: Option<u32>,
    /// Residual overflow: the command wanted this many more bytes.
    pub overflow: Option<u32>,
    /// The SCSI Response data segment (SenseLength + sense), if any.
    pub sense_segment: Vec<u8>,
    /// Data-In bytes received.
    pub data_in: u64,
    /// The read buffer, handed back.
    pub buf: Option<Vec<u8>>,
}

/// How a task ended.
#[derive(Debug)]
pub enum TaskResult {
    /// A SCSI command completed (any status).
    Scsi(ScsiOutcome),
    /// A task management function answered.
    Tmf(TmfResponse),
    /// A NOP-Out ping answered.
    Nop,
    /// The logout answered.
    /// The Logout Response's code and Time2Wait (seconds).
    Logout(LogoutResponseCode, u16),
    /// The command was aborted by a task management function.
    Aborted {
        /// The read buffer, handed back.
        buf: Option<Vec<u8>>,
    },
    /// The target broke the protocol for this task; the message says how.
    Failed {
        /// What went wrong.
        reason: String,
        /// The read buffer, handed back.
        buf: Option<Vec<u8>>,
    },
}

/// What the engine asks the shell to do.
#[derive(Debug)]
pub enum Event<T> {
    /// Give this R2T to the task's owner, who sends the Data-Out.
    R2t {
        /// The owner of the task.
        owner: T,
        /// The R2T.
        r2t: R2t,
    },
    /// The task is over and removed from the table.
    Complete {
        /// The owner of the task.
        owner: T,
        /// How it ended.
        result: TaskResult,
    },
    /// Send this PDU (a NOP-Out answering a target ping).
    Send(Pdu),
    /// The connection must end (the target asked for it by an Async
    /// Message, or broke the protocol): the shell should recover or log out.
    Drop {
        /// Why, for the log and the callers.
        reason: String,
        /// How long the target asked the initiator to wait before it logs
        /// in again (AsyncEvent 2 and 3, Parameter2, RFC 7143 §11.9.1);
        /// None: the session's DefaultTime2Wait.
        time2wait: Option<Duration>,
    },
    /// The target asks the initiator to log out within `within` (Async
    /// Message, AsyncEvent 1, RFC 7143 §11.9.1; Parameter3): the shell lets
    /// the commands in flight finish, sends no new ones, logs out, and
    /// logs in again.
    LogoutRequested {
        /// How long the target waits for the Logout Request.
        within: Duration,
    },
}

/// How long the commands in flight may take to finish when the target asks
/// to negotiate again (AsyncEvent 4), before the logout that answers it.
pub const NEGOTIATION_DRAIN: Duration = Duration::from_secs(2);

/// Where the data of a Data-In PDU goes.
#[derive(Debug)]
pub enum Placement {
    /// Read it into `buf[range]`, then call [`Engine::data_in_end`].
    Into {
        /// The task's buffer, lent for the read.
        buf: Vec<u8>,
        /// Where in it.
        range: Range<usize>,
    },
    /// No live task wants it (aborted or unknown): read and drop it.
    Discard,
}

#[derive(Debug)]
enum Kind {
    Scsi {
        expected_in: usize,
        expected_out: usize,
        /// Write data the target has had or asked for: the unsolicited part
        /// and each R2T's Desired Data Transfer Length.
        asked_out: u64,
        /// R2Ts taken whose data is not yet all sent: at most
        /// MaxOutstandingR2T, which bounds what the owner has queued.
        unanswered_r2ts: u32,
        received: u64,
        /// The DataSN of the next Data-In and the R2TSN of the next R2T:
        /// both count from 0 per command, and a bidirectional command's
        /// R2Ts and Data-Ins share the one numbering (RFC 7143 §11.7.5).
        next_data_sn: u32,
        buf: Option<Vec<u8>>,
        lent: bool,
        /// Byte ranges of the read buffer already filled by Data-In.
        placed: Coverage,
    },
    Tmf {
        function: TmfFunction,
        referenced: u32,
        lun: u16,
    },
    Nop,
    Logout,
}

fn is_scsi(kind: &Kind) -> bool {
    matches!(kind, Kind::Scsi { .. })
}

/// Whether a command the target ends with `status` and `sense` completed:
/// a good status, or CHECK CONDITION with RECOVERED ERROR (SPC-4 4.5.6:
/// the device server recovered on its own; not a deferred one, which is
/// an earlier command's). Its data are then the caller's, as Linux's sd
/// completes it, and so must be all there.
pub(crate) fn completes_command(status: u8, sense: Option<&Sense>) -> bool {
    const GOOD: u8 = 0x00;
    const CHECK_CONDITION: u8 = 0x02;
    const CONDITION_MET: u8 = 0x04;
    match status {
        GOOD | CONDITION_MET => true,
        CHECK_CONDITION => sense.is_some_and(|s| s.key == SenseKey::RecoveredError && !s.deferred),
        _ => false,
    }
}

/// The bytes a command that moves `expected` bytes one way owes that way
/// when the target ends it: none to check (None) unless it `completed`
/// ([`completes_command`]), otherwise all of them less an underflow
/// (RFC 7143 §11.4.5.2).
fn owed_by_good_status(expected: usize, completed: bool, underflow: Option<u32>) -> Option<usize> {
    (expected > 0 && completed)
        .then(|| expected.saturating_sub(underflow.map_or(0, |n| n as usize)))
}

/// Why a command the target ends with `status` has not had the read data it
/// owes, if it has not. A good status with the U bit clear says that all of
/// the Expected Data Transfer Length was sent, and with it set that all but
/// the residual was (RFC 7143 §11.4.5.2): those bytes must have come, as one
/// run from offset 0, or the buffer handed back would carry bytes the
/// target never sent (zeros, or an earlier attempt's) as data. (A failed
/// command's data counts for nothing anyway.)
fn read_data_missing(
    itt: u32,
    kind: &Kind,
    status: u8,
    completed: bool,
    underflow: Option<u32>,
) -> Option<String> {
    let Kind::Scsi {
        expected_in,
        received,
        placed,
        ..
    } = kind
    else {
        return None;
    };
    let owed = owed_by_good_status(*expected_in, completed, underflow)?;
    let filled = placed.contiguous_end();
    if filled == owed as u64 && *received == owed as u64 {
        return None;
    }
    Some(format!(
        "the target ended READ ITT {itt:#x} with status {status:#04x} after {received} bytes of \
         Data-In ({filled} of them in one run from offset 0) where {owed} were owed ({expected_in} \
         expected, residual underflow {})",
        underflow.unwrap_or(0)
    ))
}

/// Why a WRITE the target ends with a good `status` cannot have taken the
/// data it claims, if it cannot. With the U bit clear the status says that
/// all of the Expected Data Transfer Length was taken, with it set all but
/// the residual (RFC 7143 §11.4.5.2); the target can only have what went as
/// immediate or unsolicited data or what its R2Ts asked for, and a good
/// status claiming more would have blocks never sent taken as written.
fn write_data_missing(
    itt: u32,
    kind: &Kind,
    status: u8,
    completed: bool,
    underflow: Option<u32>,
) -> Option<String> {
    let Kind::Scsi {
        expected_out,
        asked_out,
        ..
    } = kind
    else {
        return None;
    };
    let owed = owed_by_good_status(*expected_out, completed, underflow)? as u64;
    if *asked_out >= owed {
        return None;
    }
    Some(format!(
        "the target ended WRITE ITT {itt:#x} with status {status:#04x} claiming {owed} bytes taken \
         ({expected_out} expected, residual underflow {}) where only {asked_out} were sent \
         unsolicited or asked for by R2T",
        underflow.unwrap_or(0)
    ))
}

#[derive(Debug)]
struct Task<T> {
    owner: T,
    lun: u16,
    cmd_sn: u32,
    kind: Kind,
}

impl<T> Task<T> {
    /// The read buffer the task lent, handed back with its end.
    fn into_parts(self) -> (T, Option<Vec<u8>>) {
        let buf = match self.kind {
            Kind::Scsi { buf, .. } => buf,
            _ => None,
        };
        (self.owner, buf)
    }

    /// The task's end as a failure, its read buffer handed back.
    fn failed(self, reason: String) -> Event<T> {
        let (owner, buf) = self.into_parts();
        Event::Complete {
            owner,
            result: TaskResult::Failed { reason, buf },
        }
    }
}

/// A command in flight, as [`Session::in_flight`](crate::Session::in_flight) lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskInfo {
    /// Initiator Task Tag.
    pub itt: u32,
    /// LUN.
    pub lun: u16,
    /// CmdSN it was sent with.
    pub cmd_sn: u32,
}

/// The session's sequence numbers and task table.
#[derive(Debug)]
pub struct Engine<T> {
    generation: u64,
    limits: Limits,
    cmd_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    exp_stat_sn: u32,
    next_itt: u32,
    tasks: HashMap<u32, Task<T>>,
}

impl<T: Clone> Engine<T> {
    /// An engine for a connection that just logged in: `cmd_sn` is the next
    /// CmdSN to use, `stat_sn` the last StatSN received.
    pub fn new(
        generation: u64,
        limits: Limits,
        cmd_sn: u32,
        exp_cmd_sn: u32,
        max_cmd_sn: u32,
        stat_sn: u32,
    ) -> Self {
        Engine {
            generation,
            limits,
            cmd_sn,
            exp_cmd_sn,
            max_cmd_sn,
            exp_stat_sn: stat_sn.wrapping_add(1),
            next_itt: 0x1000,
            tasks: HashMap::new(),
        }
    }

    /// This engine for a connection that replaces one whose engine would
    /// have handed out `next_itt` next: tags go on from there rather than
    /// start again, so a tag another stack took from a command on the old
    /// connection (the kernel host driver's ABORT TASK) names no command
    /// of the new one.
    pub fn going_on_from(mut self, next_itt: u32) -> Self {
        self.next_itt = next_itt;
        self
    }

    /// The Initiator Task Tag this engine hands out next (unless in use).
    pub fn next_itt(&self) -> u32 {
        self.next_itt
    }

    /// Which connection this engine belongs to.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The Data-Out sequence that answers `r2t` (RFC 7143 §11.7), for the
    /// owner of its write to send at once, whole: PDUs of at most the
    /// target's MaxRecvDataSegmentLength over the range the R2T asks for,
    /// under the write's LUN and the R2T's Target Transfer Tag. From here
    /// on the R2T is no longer outstanding: the target's next R2T, which
    /// may follow the sequence's final PDU at once, finds it counted off,
    /// and an owner can send no R2T's data without counting it off. None
    /// for a write that is over (nothing is owed for it).
    pub fn answer_r2t(&mut self, r2t: &R2t) -> Option<Vec<DataOutPdu>> {
        let Some(Task {
            lun,
            kind: Kind::Scsi {
                unanswered_r2ts, ..
            },
            ..
        }) = self.tasks.get_mut(&r2t.itt)
        else {
            return None;
        };
        *unanswered_r2ts = unanswered_r2ts.saturating_sub(1);
        let start = r2t.buffer_offset as usize;
        let end = start + r2t.desired_data_transfer_length as usize;
        Some(data_out_sequence(
            r2t.itt,
            Lun::from_index(*lun),
            r2t.ttt,
            start..end,
            self.limits.target_mrdsl,
            self.exp_stat_sn,
        ))
    }

    /// The negotiated limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The next StatSN expected (ExpStatSN of outgoing PDUs).
    pub fn exp_stat_sn(&self) -> u32 {
        self.exp_stat_sn
    }

    /// The CmdSN the next command gets, and the window's upper end.
    #[cfg(test)]
    pub fn window(&self) -> (u32, u32) {
        (self.cmd_sn, self.max_cmd_sn)
    }

    /// Whether a non-immediate command may be sent now.
    pub fn window_open(&self) -> bool {
        sn_le(self.cmd_sn, self.max_cmd_sn)
    }

    /// Commands in flight (SCSI tasks only).
    pub fn in_flight(&self) -> Vec<TaskInfo> {
        let mut v: Vec<TaskInfo> = self
            .tasks
            .iter()
            .filter(|(_, t)| matches!(t.kind, Kind::Scsi { .. }))
            .map(|(itt, t)| TaskInfo {
                itt: *itt,
                lun: t.lun,
                cmd_sn: t.cmd_sn,
            })
            .collect();
        v.sort_by(|a, b| {
            if sn_lt(a.cmd_sn, b.cmd_sn) {
                std::cmp::Ordering::Less
            } else {
                std::cmp::Ordering::Greater
            }
        });
        v
    }

    /// Number of tasks of any kind in the table.
    #[cfg(test)]
    pub fn task_count(&self) -> usize {
        self.tasks.len()
    }

    fn alloc_itt(&mut self) -> u32 {
        loop {
            let itt = self.next_itt;
            self.next_itt = self.next_itt.wrapping_add(1);
            if itt != RESERVED_TAG && !self.tasks.contains_key(&itt) {
                return itt;
            }
        }
    }

    /// Registers a SCSI command and returns its header. `read_buf` receives
    /// Data-In (its length is the expected read length); `write_len` is the
    /// length of the data to send. The caller must have checked
    /// [`Engine::window_open`]. `immediate_len` bytes go in the PDU itself
    /// and `final_bit` says whether unsolicited Data-Out follows.
    pub fn start_scsi(
        &mut self,
        lun: u16,
        cdb: &[u8; 16],
        read_buf: Option<Vec<u8>>,
        write_len: usize,
        owner: T,
    ) -> (u32, ScsiCommand, usize, usize) {
        let itt = self.alloc_itt();
        let cmd_sn = self.cmd_sn;
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        let expected_in = read_buf.as_ref().map_or(0, Vec::len);
        let (immediate, unsolicited_end) = self.limits.unsolicited(write_len);
        let header = ScsiCommand {
            immediate: false,
            final_bit: unsolicited_end == immediate,
            read: expected_in > 0,
            write: write_len > 0,
            attr: TaskAttr::Simple,
            lun: Lun::from_index(lun),
            itt,
            expected_data_transfer_length: if write_len > 0 {
                write_len as u32
            } else {
                expected_in as u32
            },
            cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            cdb: *cdb,
        };
        self.tasks.insert(
            itt,
            Task {
                owner,
                lun,
                cmd_sn,
                kind: Kind::Scsi {
                    expected_in,
                    expected_out: write_len,
                    asked_out: unsolicited_end as u64,
                    unanswered_r2ts: 0,
                    received: 0,
                    next_data_sn: 0,
                    buf: read_buf,
                    lent: false,
                    placed: Coverage::default(),
                },
            },
        );
        (itt, header, immediate, unsolicited_end)
    }

    /// Registers a SCSI command whose data the target moves by RDMA (the
    /// caller adds the descriptor AHS): the header announces `read_len` or
    /// `write_len` bytes but no data follows on the connection (no immediate
    /// or unsolicited data, F bit set), and no read buffer is lent.
    pub fn start_scsi_offloaded(
        &mut self,
        lun: u16,
        cdb: &[u8; 16],
        read_len: usize,
        write_len: usize,
        owner: T,
    ) -> (u32, ScsiCommand) {
        let itt = self.alloc_itt();
        let cmd_sn = self.cmd_sn;
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        let header = ScsiCommand {
            immediate: false,
            final_bit: true,
            read: read_len > 0,
            write: write_len > 0,
            attr: TaskAttr::Simple,
            lun: Lun::from_index(lun),
            itt,
            expected_data_transfer_length: read_len.max(write_len) as u32,
            cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            cdb: *cdb,
        };
        self.tasks.insert(
            itt,
            Task {
                owner,
                lun,
                cmd_sn,
                kind: Kind::Scsi {
                    expected_in: 0,
                    // R2Ts for an offloaded write are refused as out of range.
                    expected_out: 0,
                    asked_out: 0,
                    unanswered_r2ts: 0,
                    received: 0,
                    next_data_sn: 0,
                    buf: None,
                    lent: false,
                    placed: Coverage::default(),
                },
            },
        );
        (itt, header)
    }

    /// Registers a task management request (sent immediate).
    pub fn start_tmf(
        &mut self,
        function: TmfFunction,
        lun: u16,
        referenced: Option<u32>,
        owner: T,
    ) -> TaskMgmtRequest {
        let itt = self.alloc_itt();
        let (referenced_task_tag, ref_cmd_sn) =
            match referenced.and_then(|r| self.tasks.get(&r).map(|t| (r, t.cmd_sn))) {
                Some((r, sn)) => (r, sn),
                None => (referenced.unwrap_or(RESERVED_TAG), self.cmd_sn),
            };
        self.tasks.insert(
            itt,
            Task {
                owner,
                lun,
                cmd_sn: self.cmd_sn,
                kind: Kind::Tmf {
                    function,
                    referenced: referenced_task_tag,
                    lun,
                },
            },
        );
        TaskMgmtRequest {
            immediate: true,
            function,
            lun: Lun::from_index(lun),
            itt,
            referenced_task_tag: if function == TmfFunction::AbortTask {
                referenced_task_tag
            } else {
                RESERVED_TAG
            },
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            ref_cmd_sn,
            exp_data_sn: 0,
        }
    }

    /// Registers a keepalive NOP-Out that expects a NOP-In (immediate).
    pub fn start_ping(&mut self, owner: T) -> NopOut {
        let itt = self.alloc_itt();
        self.tasks.insert(
            itt,
            Task {
                owner,
                lun: 0,
                cmd_sn: self.cmd_sn,
                kind: Kind::Nop,
            },
        );
        NopOut {
            immediate: true,
            lun: Lun::default(),
            itt,
            ttt: RESERVED_TAG,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        }
    }

    /// Registers a logout of the whole session (sent immediate).
    pub fn start_logout(&mut self, owner: T) -> LogoutRequest {
        let itt = self.alloc_itt();
        self.tasks.insert(
            itt,
            Task {
                owner,
                lun: 0,
                cmd_sn: self.cmd_sn,
                kind: Kind::Logout,
            },
        );
        LogoutRequest {
            immediate: true,
            reason: LogoutReason::CloseSession,
            itt,
            cid: 0,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        }
    }

    /// Removes the SCSI command `itt` the target no longer has (an ABORT
    /// TASK for it was answered TASK DOES NOT EXIST: the target ended it
    /// without a word, as another initiator's LOGICAL UNIT RESET does with
    /// TAS=0). Returns its owner and read buffer, if it was still here;
    /// PDUs still to come for it are dropped as for any unknown task.
    pub fn forget(&mut self, itt: u32) -> Option<(T, Option<Vec<u8>>)> {
        if !self.tasks.get(&itt).is_some_and(|t| is_scsi(&t.kind)) {
            return None;
        }
        self.tasks.remove(&itt).map(|t| t.into_parts())
    }

    /// Removes every task (the connection is gone) and returns their owners
    /// with the read buffers they lent.
    pub fn drain(&mut self) -> Vec<(T, Option<Vec<u8>>)> {
        self.tasks.drain().map(|(_, t)| t.into_parts()).collect()
    }

    fn update_sn(&mut self, stat_sn: Option<u32>, exp_cmd_sn: u32, max_cmd_sn: u32) -> bool {
        if let Some(s) = stat_sn {
            if !sn_lt(s, self.exp_stat_sn.wrapping_sub(1)) {
                self.exp_stat_sn = s.wrapping_add(1);
            }
        }
        // RFC 7143 4.2.2.1: ignore the pair when MaxCmdSN < ExpCmdSN - 1.
        if sn_lt(max_cmd_sn, exp_cmd_sn.wrapping_sub(1)) {
            return false;
        }
        let mut opened = false;
        if sn_gt(exp_cmd_sn, self.exp_cmd_sn) {
            self.exp_cmd_sn = exp_cmd_sn;
        }
        if sn_gt(max_cmd_sn, self.max_cmd_sn) {
            self.max_cmd_sn = max_cmd_sn;
            opened = true;
        }
        opened
    }

    /// Takes the header of a Data-In PDU carrying `len` data bytes and says
    /// where its data goes. Errors are protocol violations that end the task
    /// (returned as a completion event) or the connection.
    pub fn data_in_begin(&mut self, d: &DataIn, len: usize) -> (Placement, Vec<Event<T>>) {
        let mut events = Vec::new();
        let Some(task) = self.tasks.get_mut(&d.itt) else {
            return (Placement::Discard, events);
        };
        let Kind::Scsi {
            expected_in,
            next_data_sn,
            buf,
            lent,
            placed,
            ..
        } = &mut task.kind
        else {
            return (Placement::Discard, events);
        };
        let start = d.buffer_offset as usize;
        let in_order = self.limits.data_pdu_in_order;
        let fail = if *expected_in == 0 {
            // Data-In carries read data only: a status in one for a WRITE
            // (or a command without data) would end it GOOD with its R2Ts
            // still owed, its data never sent (RFC 7143 §11.7).
            Some(format!(
                "Data-In for ITT {:#x}, a command that reads nothing",
                d.itt
            ))
        } else if d.status.is_some() && !d.final_bit {
            Some(format!(
                "Data-In with the S bit and not the F bit (ITT {:#x}; RFC 7143 §11.7.1)",
                d.itt
            ))
        } else if d.data_sn != *next_data_sn {
            Some(format!(
                "Data-In DataSN {} where {} was expected (ITT {:#x})",
                d.data_sn, next_data_sn, d.itt
            ))
        } else if start.checked_add(len).is_none_or(|end| end > *expected_in) {
            Some(format!(
                "Data-In at offset {start} with {len} bytes overruns the {expected_in}-byte read buffer (ITT {:#x})",
                d.itt
            ))
        } else if in_order && len > 0 && start as u64 != placed.contiguous_end() {
            Some(format!(
                "Data-In at offset {start} where {} was expected: DataPDUInOrder=Yes was negotiated (ITT {:#x})",
                placed.contiguous_end(),
                d.itt
            ))
        } else if let Err(refused) = placed.insert(start as u64, len as u64) {
            Some(format!(
                "Data-In at offset {start} with {len} bytes {refused} (ITT {:#x})",
                d.itt
            ))
        } else {
            None
        };
        if let Some(reason) = fail {
            let task = self.tasks.remove(&d.itt).expect("present");
            events.push(task.failed(reason));
            return (Placement::Discard, events);
        }
        *next_data_sn = next_data_sn.wrapping_add(1);
        match buf.take() {
            Some(b) if len > 0 => {
                *lent = true;
                (
                    Placement::Into {
                        buf: b,
                        range: start..start + len,
                    },
                    events,
                )
            }
            other => {
                *buf = other;
                (Placement::Discard, events)
            }
        }
    }

    /// Ends a Data-In PDU: takes back the lent buffer (None when no data
    /// was placed), counts the bytes and, with the S bit, completes the task.
    pub fn data_in_end(
        &mut self,
        d: &DataIn,
        lent_back: Option<Vec<u8>>,
        len: usize,
    ) -> Vec<Event<T>> {
        let mut events = Vec::new();
        let opened = self.update_sn(d.status.map(|_| d.stat_sn), d.exp_cmd_sn, d.max_cmd_sn);
        let _ = opened;
        let Some(task) = self.tasks.get_mut(&d.itt) else {
            return events;
        };
        if let Kind::Scsi {
            received,
            buf,
            lent,
            ..
        } = &mut task.kind
        {
            if let Some(b) = lent_back {
                *buf = Some(b);
                *lent = false;
            }
            *received += len as u64;
        }
        if let Some(status) = d.status {
            let Some(task) = self.answered(d.itt, "Data-In with status", is_scsi, &mut events)
            else {
                return events;
            };
            let underflow = d.underflow.then_some(d.residual_count);
            // A status in Data-In comes without sense data (RFC 7143 §11.7.4).
            let completed = completes_command(status, None);
            if let Some(gap) = read_data_missing(d.itt, &task.kind, status, completed, underflow) {
                events.push(task.failed(gap));
                return events;
            }
            let (buf, received) = match task.kind {
                Kind::Scsi { buf, received, .. } => (buf, received),
                _ => (None, 0),
            };
            events.push(Event::Complete {
                owner: task.owner,
                result: TaskResult::Scsi(ScsiOutcome {
                    response: 0,
                    status,
                    underflow: d.underflow.then_some(d.residual_count),
                    overflow: d.overflow.then_some(d.residual_count),
                    sense_segment: Vec::new(),
                    data_in: received,
                    buf,
                }),
            });
        }
        events
    }

    /// Whether the last call changed MaxCmdSN is not tracked here; the shell
    /// compares [`Engine::window`] before and after.
    ///
    /// Takes any PDU from the target other than Data-In.
    pub fn receive(&mut self, pdu: Pdu) -> Vec<Event<T>> {
        let mut events = Vec::new();
        match pdu.bhs {
            Bhs::ScsiResponse(r) => {
                self.update_sn(Some(r.stat_sn), r.exp_cmd_sn, r.max_cmd_sn);
                self.scsi_response(r, pdu.data.to_vec(), &mut events);
            }
            Bhs::R2t(r) => {
                self.update_sn(None, r.exp_cmd_sn, r.max_cmd_sn);
                if let Some(Task {
                    kind:
                        Kind::Scsi {
                            expected_out,
                            asked_out,
                            unanswered_r2ts,
                            next_data_sn,
                            ..
                        },
                    owner,
                    ..
                }) = self.tasks.get_mut(&r.itt)
                {
                    let end = r.buffer_offset as u64 + u64::from(r.desired_data_transfer_length);
                    let max_outstanding = self.limits.max_outstanding_r2t;
                    // RFC 7143 §11.8.4: the Desired Data Transfer Length is
                    // neither 0 nor above MaxBurstLength. An empty R2T asks
                    // for nothing (a read, whose write length is 0, would
                    // otherwise take it as one of its own).
                    let fail = if end > *expected_out as u64
                        || r.desired_data_transfer_length == 0
                        || r.desired_data_transfer_length > self.limits.max_burst
                    {
                        Some(format!(
                            "R2T for {} bytes at offset {} is empty, outside the {}-byte write or above MaxBurstLength {}",
                            r.desired_data_transfer_length,
                            r.buffer_offset,
                            expected_out,
                            self.limits.max_burst
                        ))
                    } else if r.r2t_sn != *next_data_sn {
                        // At ErrorRecoveryLevel 0 an R2T is never sent
                        // again: each carries the next R2TSN (§11.8.3).
                        Some(format!(
                            "R2T with R2TSN {} where {} was next (ITT {:#x})",
                            r.r2t_sn, next_data_sn, r.itt
                        ))
                    } else if *unanswered_r2ts >= max_outstanding {
                        // Every R2T waits for its owner to send its data:
                        // a target past the limit it agreed to would make
                        // that queue as long as it liked.
                        Some(format!(
                            "R2T while {} of the write's R2Ts are not yet answered, MaxOutstandingR2T being {} (ITT {:#x})",
                            unanswered_r2ts, max_outstanding, r.itt
                        ))
                    } else {
                        None
                    };
                    if let Some(reason) = fail {
                        let task = self.tasks.remove(&r.itt).expect("present");
                        // A read's buffer goes back to its owner with the failure.
                        events.push(task.failed(reason));
                    } else {
                        *asked_out += u64::from(r.desired_data_transfer_length);
                        *unanswered_r2ts += 1;
                        *next_data_sn = next_data_sn.wrapping_add(1);
                        events.push(Event::R2t {
                            owner: owner.clone(),
                            r2t: r,
                        });
                    }
                }
            }
            Bhs::NopIn(n) => {
                self.update_sn(
                    (n.itt != RESERVED_TAG).then_some(n.stat_sn),
                    n.exp_cmd_sn,
                    n.max_cmd_sn,
                );
                self.nop_in(n, &mut events);
            }
            Bhs::TaskMgmtResponse(t) => {
                self.update_sn(Some(t.stat_sn), t.exp_cmd_sn, t.max_cmd_sn);
                let tmf = |k: &Kind| matches!(k, Kind::Tmf { .. });
                if let Some(task) =
                    self.answered(t.itt, "Task Management Response", tmf, &mut events)
                {
                    if let Kind::Tmf {
                        function,
                        referenced,
                        lun,
                    } = task.kind
                    {
                        if t.response == TmfResponse::FunctionComplete {
                            self.aborted_by(function, referenced, lun, task.cmd_sn, &mut events);
                        }
                    }
                    events.push(Event::Complete {
                        owner: task.owner,
                        result: TaskResult::Tmf(t.response),
                    });
                }
            }
            Bhs::LogoutResponse(l) => {
                self.update_sn(Some(l.stat_sn), l.exp_cmd_sn, l.max_cmd_sn);
                let logout = |k: &Kind| matches!(k, Kind::Logout);
                if let Some(task) = self.answered(l.itt, "Logout Response", logout, &mut events) {
                    events.push(Event::Complete {
                        owner: task.owner,
                        result: TaskResult::Logout(l.response, l.time2wait),
                    });
                }
            }
            Bhs::AsyncMessage(a) => {
                self.update_sn(Some(a.stat_sn), a.exp_cmd_sn, a.max_cmd_sn);
                use blockwire_pdu::pdu::codes::AsyncEvent;
                match a.event {
                    AsyncEvent::LogoutRequest => events.push(Event::LogoutRequested {
                        within: Duration::from_secs(u64::from(a.parameter3)),
                    }),
                    // The target wants to negotiate again: the initiator
                    // MUST answer by a Text Request or by a Logout Request
                    // (RFC 7143 §11.9.1). The logout, after a short drain,
                    // and the new login negotiate everything afresh.
                    AsyncEvent::NegotiationRequest => events.push(Event::LogoutRequested {
                        within: NEGOTIATION_DRAIN,
                    }),
                    AsyncEvent::ConnectionDrop | AsyncEvent::SessionDrop => {
                        events.push(Event::Drop {
                            reason: format!("target sent async event: {}", a.event.name()),
                            time2wait: Some(Duration::from_secs(u64::from(a.parameter2))),
                        });
                    }
                    _ => {}
                }
            }
            Bhs::Reject(r) => {
                self.update_sn(Some(r.stat_sn), r.exp_cmd_sn, r.max_cmd_sn);
                // The data segment holds the rejected header; its ITT names the task.
                let itt = pdu
                    .data
                    .get(16..20)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                // A rejected Data-Out (or SNACK) belongs to a command the
                // target already holds: it ends that command itself, with a
                // SCSI Response, once the rest of its data is in (RFC 7143
                // §11.17.1), so the task stays to take that answer and to go
                // on answering R2Ts. Only a rejected request ends its task.
                let of_a_running_command = pdu.data.first().map(|b| b & 0x3f).is_some_and(|op| {
                    op == blockwire_pdu::Opcode::DataOut as u8
                        || op == blockwire_pdu::Opcode::SnackRequest as u8
                });
                if of_a_running_command {
                    return events;
                }
                if let Some(task) = itt.and_then(|itt| self.tasks.remove(&itt)) {
                    events
                        .push(task.failed(format!("target rejected the PDU: {}", r.reason.name())));
                }
            }
            Bhs::TextResponse(t) => {
                self.update_sn(Some(t.stat_sn), t.exp_cmd_sn, t.max_cmd_sn);
            }
            other => {
                events.push(Event::Drop {
                    reason: format!(
                        "unexpected {:?} PDU from the target in full feature phase",
                        other.opcode()
                    ),
                    time2wait: None,
                });
            }
        }
        events
    }

    /// Removes the task `itt` that a target response `what` ends, if it is
    /// of the kind `fits` accepts. A task of another kind fails instead (the
    /// target answered it with the wrong PDU, RFC 7143 §11), with its read
    /// buffer handed back.
    fn answered(
        &mut self,
        itt: u32,
        what: &str,
        fits: fn(&Kind) -> bool,
        events: &mut Vec<Event<T>>,
    ) -> Option<Task<T>> {
        let task = self.tasks.remove(&itt)?;
        if fits(&task.kind) {
            return Some(task);
        }
        events.push(task.failed(format!("{what} for ITT {itt:#x}, a task of another kind")));
        None
    }

    fn scsi_response(&mut self, r: ScsiResponse, data: Vec<u8>, events: &mut Vec<Event<T>>) {
        let Some(task) = self.answered(r.itt, "SCSI Response", is_scsi, events) else {
            return;
        };
        let underflow = r.underflow.then_some(r.residual_count);
        let sense = parse_sense_segment(&data).ok().flatten();
        let completed = completes_command(r.status, sense.as_ref());
        if let Some(gap) = read_data_missing(r.itt, &task.kind, r.status, completed, underflow)
            .or_else(|| write_data_missing(r.itt, &task.kind, r.status, completed, underflow))
        {
            events.push(task.failed(gap));
            return;
        }
        let (buf, received) = match task.kind {
            Kind::Scsi { buf, received, .. } => (buf, received),
            _ => (None, 0),
        };
        events.push(Event::Complete {
            owner: task.owner,
            result: TaskResult::Scsi(ScsiOutcome {
                response: r.response.to_u8(),
                status: r.status,
                underflow: r.underflow.then_some(r.residual_count),
                overflow: r.overflow.then_some(r.residual_count),
                sense_segment: data,
                data_in: received,
                buf,
            }),
        });
    }

    fn nop_in(&mut self, n: NopIn, events: &mut Vec<Event<T>>) {
        if n.itt != RESERVED_TAG {
            if let Some(task) = self.answered(n.itt, "NOP-In", |k| matches!(k, Kind::Nop), events) {
                events.push(Event::Complete {
                    owner: task.owner,
                    result: TaskResult::Nop,
                });
            }
        }
        if n.ttt != RESERVED_TAG {
            // A ping from the target: answer with its TTT (RFC 7143 11.18).
            events.push(Event::Send(Pdu::new(Bhs::NopOut(NopOut {
                immediate: true,
                lun: n.lun,
                itt: RESERVED_TAG,
                ttt: n.ttt,
                cmd_sn: self.cmd_sn,
                exp_stat_sn: self.exp_stat_sn,
            }))));
        }
    }

    /// Ends the commands a task management function sent with `tmf_cmd_sn`
    /// aborted. The functions over a task set, a logical unit or the whole
    /// target cover only the commands sent before them, with a lower CmdSN
    /// (RFC 7143 §11.5.1): the request is immediate, so the target acted on
    /// it before any command sent after it on this connection, and that one
    /// is still the target's to run and answer, even when the Function
    /// Complete comes after the initiator stopped waiting for it.
    fn aborted_by(
        &mut self,
        function: TmfFunction,
        referenced: u32,
        lun: u16,
        tmf_cmd_sn: u32,
        events: &mut Vec<Event<T>>,
    ) {
        let victims: Vec<u32> = self
            .tasks
            .iter()
            .filter(|(itt, t)| {
                matches!(t.kind, Kind::Scsi { .. })
                    && match function {
                        TmfFunction::AbortTask => **itt == referenced,
                        TmfFunction::AbortTaskSet
                        | TmfFunction::ClearTaskSet
                        | TmfFunction::LogicalUnitReset => {
                            t.lun == lun && sn_lt(t.cmd_sn, tmf_cmd_sn)
                        }
                        TmfFunction::TargetWarmReset | TmfFunction::TargetColdReset => {
                            sn_lt(t.cmd_sn, tmf_cmd_sn)
                        }
                        _ => false,
                    }
            })
            .map(|(itt, _)| *itt)
            .collect();
        for itt in victims {
            let (owner, buf) = self.tasks.remove(&itt).expect("present").into_parts();
            events.push(Event::Complete {
                owner,
                result: TaskResult::Aborted { buf },
            });
        }
    }

    /// Updates the window from any target PDU's ExpCmdSN/MaxCmdSN fields;
    /// true when MaxCmdSN moved forward.
    #[cfg(test)]
    pub fn note_window(&mut self, exp_cmd_sn: u32, max_cmd_sn: u32) -> bool {
        self.update_sn(None, exp_cmd_sn, max_cmd_sn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockwire_pdu::pdu::codes::ServiceResponse;

    fn limits() -> Limits {
        Limits {
            target_mrdsl: 8192,
            our_mrdsl: 262144,
            first_burst: 65536,
            max_burst: 262144,
            immediate_data: true,
            initial_r2t: false,
            data_pdu_in_order: true,
            max_outstanding_r2t: 1,
        }
    }

    /// An Async Message of `event` with Parameter2 and Parameter3.
    fn async_message(
        event: blockwire_pdu::pdu::codes::AsyncEvent,
        parameter2: u16,
        parameter3: u16,
    ) -> Pdu {
        Pdu::new(Bhs::AsyncMessage(blockwire_pdu::pdu::AsyncMessage {
            lun: Lun::default(),
            stat_sn: 0,
            exp_cmd_sn: 1,
            max_cmd_sn: 8,
            event,
            vcode: 0,
            parameter1: 0,
            parameter2,
            parameter3,
        }))
    }

    /// What the initiator must do for each Async Message that asks
    /// something of it (RFC 7143 §11.9.1): a negotiation request is
    /// answered by a logout (and a new login), where it went unanswered.
    #[test]
    fn async_messages_that_ask_something_are_acted_on() {
        use blockwire_pdu::pdu::codes::AsyncEvent;
        let mut e = engine();
        let ev = e.receive(async_message(AsyncEvent::LogoutRequest, 0, 7));
        assert!(
            matches!(ev[..], [Event::LogoutRequested { within }] if within == Duration::from_secs(7)),
            "{ev:?}"
        );
        let ev = e.receive(async_message(AsyncEvent::NegotiationRequest, 0, 0));
        assert!(
            matches!(ev[..], [Event::LogoutRequested { within }] if within == NEGOTIATION_DRAIN),
            "{ev:?}"
        );
        for event in [AsyncEvent::ConnectionDrop, AsyncEvent::SessionDrop] {
            let ev = e.receive(async_message(event, 3, 20));
            assert!(
                matches!(&ev[..], [Event::Drop { time2wait: Some(t), .. }] if *t == Duration::from_secs(3)),
                "{ev:?}"
            );
        }
    }

    fn engine() -> Engine<u32> {
        Engine::new(1, limits(), 10, 10, 12, 99)
    }

    #[test]
    fn unsolicited_split() {
        let l = limits();
        assert_eq!(l.unsolicited(4096), (4096, 4096));
        assert_eq!(l.unsolicited(100_000), (8192, 65536));
        let l2 = Limits {
            initial_r2t: true,
            immediate_data: false,
            ..l
        };
        assert_eq!(l2.unsolicited(100_000), (0, 0));
    }

    fn r2t(itt: u32, buffer_offset: u32, desired_data_transfer_length: u32) -> Pdu {
        numbered_r2t(itt, 0, buffer_offset, desired_data_transfer_length)
    }

    fn numbered_r2t(
        itt: u32,
        r2t_sn: u32,
        buffer_offset: u32,
        desired_data_transfer_length: u32,
    ) -> Pdu {
        Pdu::new(Bhs::R2t(R2t {
            lun: Lun::from_index(0),
            itt,
            ttt: 0x55,
            stat_sn: 100,
            exp_cmd_sn: 10,
            max_cmd_sn: 12,
            r2t_sn,
            buffer_offset,
            desired_data_transfer_length,
        }))
    }

    /// RFC 7143 §11.8.4: an R2T asks for at least one byte. An empty one
    /// fails the task (a read's or a write's) like any R2T outside it, and
    /// a read's buffer comes back with the failure.
    #[test]
    fn empty_r2t_fails_the_task() {
        let mut e = engine();
        let cdb = [0u8; 16];
        let (read, ..) = e.start_scsi(0, &cdb, Some(vec![0; 512]), 0, 1);
        let events = e.receive(r2t(read, 0, 0));
        assert!(
            matches!(
                &events[..],
                [Event::Complete {
                    owner: 1,
                    result: TaskResult::Failed { buf: Some(b), .. }
                }] if b.len() == 512
            ),
            "{events:?}"
        );
        let (write, ..) = e.start_scsi(0, &cdb, None, 100_000, 2);
        let events = e.receive(r2t(write, 65536, 0));
        assert!(
            matches!(
                &events[..],
                [Event::Complete {
                    owner: 2,
                    result: TaskResult::Failed { .. }
                }]
            ),
            "{events:?}"
        );
        // A sound R2T still reaches the write's owner.
        let (write, ..) = e.start_scsi(0, &cdb, None, 100_000, 3);
        let events = e.receive(r2t(write, 65536, 34464));
        assert!(
            matches!(&events[..], [Event::R2t { owner: 3, .. }]),
            "{events:?}"
        );
    }

    /// Each R2T a write takes waits in its owner's queue until the owner
    /// has sent its data: a target may have at most MaxOutstandingR2T of
    /// them unanswered (RFC 7143 §13.17), each with the next R2TSN
    /// (§11.8.3), or it could queue as many as it liked. One past either
    /// fails the write; answering an R2T makes room for the next.
    #[test]
    fn a_write_takes_r2ts_in_order_and_no_more_than_max_outstanding_r2t() {
        let cdb = [0u8; 16];
        let failed = |events: &[Event<u32>], why: &str| match events {
            [Event::Complete {
                result: TaskResult::Failed { reason, .. },
                ..
            }] => assert!(reason.contains(why), "{reason}"),
            other => panic!("the R2T was taken: {other:?}"),
        };
        let taken = |events: &[Event<u32>]| match events {
            [Event::R2t { r2t, .. }] => r2t.clone(),
            other => panic!("the R2T was not taken: {other:?}"),
        };
        // MaxOutstandingR2T 1: a second R2T before the first is answered.
        let mut e = engine();
        let (itt, ..) = e.start_scsi(0, &cdb, None, 300_000, 1);
        taken(&e.receive(numbered_r2t(itt, 0, 65536, 65536)));
        failed(
            &e.receive(numbered_r2t(itt, 1, 131_072, 65536)),
            "MaxOutstandingR2T being 1",
        );
        // Answered, the next R2T is taken; the same R2TSN again is not.
        let (itt, ..) = e.start_scsi(0, &cdb, None, 300_000, 2);
        let first = taken(&e.receive(numbered_r2t(itt, 0, 65536, 65536)));
        // Its answer: the range it asks for, in PDUs of the target's
        // MaxRecvDataSegmentLength (8192), under the R2T's TTT, the last
        // one final.
        let pdus = e.answer_r2t(&first).expect("a live write");
        assert_eq!(pdus.len(), 8);
        assert_eq!((pdus[0].range.start, pdus[7].range.end), (65536, 131_072));
        assert!(pdus
            .iter()
            .all(|p| p.header.ttt == 0x55 && p.header.itt == itt));
        assert!(pdus[7].header.final_bit && !pdus[6].header.final_bit);
        assert_eq!(pdus[0].header.exp_stat_sn, e.exp_stat_sn());
        let second = taken(&e.receive(numbered_r2t(itt, 1, 131_072, 65536)));
        e.answer_r2t(&second).expect("a live write");
        failed(
            &e.receive(numbered_r2t(itt, 1, 131_072, 65536)),
            "R2TSN 1 where 2 was next",
        );
        // Nothing is owed for a write that is over.
        assert!(e.answer_r2t(&second).is_none());
        // A first R2T that does not start the numbering.
        let (itt, ..) = e.start_scsi(0, &cdb, None, 300_000, 3);
        failed(
            &e.receive(numbered_r2t(itt, 5, 65536, 65536)),
            "R2TSN 5 where 0 was next",
        );
        // MaxOutstandingR2T 2: two at once, not three.
        let mut e = Engine::new(
            1,
            Limits {
                max_outstanding_r2t: 2,
                ..limits()
            },
            10,
            10,
            12,
            99,
        );
        let (itt, ..) = e.start_scsi(0, &cdb, None, 300_000, 4);
        taken(&e.receive(numbered_r2t(itt, 0, 65536, 65536)));
        taken(&e.receive(numbered_r2t(itt, 1, 131_072, 65536)));
        failed(
            &e.receive(numbered_r2t(itt, 2, 196_608, 65536)),
            "2 of the write's R2Ts are not yet answered",
        );
    }

    #[test]
    fn data_out_sequence_covers_range() {
        let pdus = data_out_sequence(7, Lun::from_index(0), 5, 8192..30000, 8192, 3);
        assert_eq!(pdus.len(), 3);
        assert_eq!(pdus[0].range, 8192..16384);
        assert_eq!(pdus[2].range, 24576..30000);
        assert!(pdus[2].header.final_bit && !pdus[0].header.final_bit);
        assert_eq!(pdus[2].header.data_sn, 2);
        assert_eq!(pdus[1].header.buffer_offset, 16384);
    }

    #[test]
    fn window_and_completion() {
        let mut e = engine();
        let cdb = [0u8; 16];
        assert!(e.window_open());
        let (itt1, h1, ..) = e.start_scsi(0, &cdb, None, 0, 1);
        let (_itt2, h2, ..) = e.start_scsi(0, &cdb, None, 0, 2);
        let (_itt3, ..) = e.start_scsi(0, &cdb, None, 0, 3);
        assert_eq!((h1.cmd_sn, h2.cmd_sn), (10, 11));
        assert_eq!(h1.exp_stat_sn, 100);
        assert!(!e.window_open(), "CmdSN 13 is beyond MaxCmdSN 12");
        let resp = ScsiResponse {
            bidi_read_overflow: false,
            bidi_read_underflow: false,
            overflow: false,
            underflow: false,
            response: ServiceResponse::CommandCompleted,
            status: 0,
            itt: itt1,
            snack_tag: 0,
            stat_sn: 100,
            exp_cmd_sn: 11,
            max_cmd_sn: 20,
            exp_data_sn: 0,
            bidi_read_residual_count: 0,
            residual_count: 0,
        };
        let ev = e.receive(Pdu::new(Bhs::ScsiResponse(resp)));
        assert!(matches!(
            ev[..],
            [Event::Complete {
                owner: 1,
                result: TaskResult::Scsi(_)
            }]
        ));
        assert!(e.window_open());
        assert_eq!(e.exp_stat_sn(), 101);
        // A stale window update is ignored.
        e.note_window(5, 3);
        assert_eq!(e.window(), (13, 20));
    }

    #[test]
    fn data_in_is_placed_and_checked() {
        let mut e = engine();
        let (itt, ..) = e.start_scsi(0, &[0; 16], Some(vec![0; 1000]), 0, 1);
        let d = |sn, off, status| data_in(itt, sn, off, status);
        let (p, ev) = e.data_in_begin(&d(0, 0, None), 500);
        assert!(ev.is_empty());
        let Placement::Into { mut buf, range } = p else {
            panic!("placed")
        };
        assert_eq!(range, 0..500);
        buf[..500].fill(7);
        assert!(e.data_in_end(&d(0, 0, None), Some(buf), 500).is_empty());
        let (p, _) = e.data_in_begin(&d(1, 500, Some(0)), 500);
        let Placement::Into { buf, .. } = p else {
            panic!("placed")
        };
        let ev = e.data_in_end(&d(1, 500, Some(0)), Some(buf), 500);
        match &ev[..] {
            [Event::Complete {
                result: TaskResult::Scsi(o),
                ..
            }] => {
                assert_eq!(o.data_in, 1000);
                assert_eq!(o.buf.as_ref().unwrap()[0], 7);
            }
            other => panic!("{other:?}"),
        }
        // An overrun fails the task.
        let (itt2, ..) = e.start_scsi(0, &[0; 16], Some(vec![0; 10]), 0, 2);
        let mut bad = d(0, 8, None);
        bad.itt = itt2;
        let (p, ev) = e.data_in_begin(&bad, 4);
        assert!(matches!(p, Placement::Discard));
        assert!(matches!(
            ev[..],
            [Event::Complete {
                owner: 2,
                result: TaskResult::Failed { .. }
            }]
        ));
    }

    /// A Data-In of `itt` with DataSN `sn` at BufferOffset `off`; with the
    /// status (and the F bit) when `status` is set.
    fn data_in(itt: u32, sn: u32, off: u32, status: Option<u8>) -> DataIn {
        DataIn {
            final_bit: status.is_some(),
            acknowledge: false,
            overflow: false,
            underflow: false,
            status,
            lun: Lun::default(),
            itt,
            ttt: RESERVED_TAG,
            stat_sn: 100,
            exp_cmd_sn: 11,
            max_cmd_sn: 20,
            data_sn: sn,
            buffer_offset: off,
            residual_count: 0,
        }
    }

    /// Feeds one Data-In of `len` bytes at `off` (DataSN `sn`) to `itt`,
    /// filling its bytes with `fill`; returns the completion events, or
    /// None if the PDU was discarded with a failure.
    fn feed(
        e: &mut Engine<u32>,
        itt: u32,
        sn: u32,
        off: u32,
        len: usize,
        status: Option<u8>,
        fill: u8,
    ) -> Result<Vec<Event<u32>>, String> {
        let d = data_in(itt, sn, off, status);
        let (p, ev) = e.data_in_begin(&d, len);
        match p {
            Placement::Into { mut buf, range } => {
                assert_eq!(range, off as usize..off as usize + len);
                buf[range].fill(fill);
                Ok(e.data_in_end(&d, Some(buf), len))
            }
            Placement::Discard => match &ev[..] {
                [Event::Complete {
                    result: TaskResult::Failed { reason, .. },
                    ..
                }] => Err(reason.clone()),
                _ => Ok(e.data_in_end(&d, None, len)),
            },
        }
    }

    /// An engine of a session that negotiated DataPDUInOrder=No.
    fn unordered_engine() -> Engine<u32> {
        Engine::new(
            1,
            Limits {
                data_pdu_in_order: false,
                ..limits()
            },
            10,
            10,
            12,
            99,
        )
    }

    #[test]
    fn data_pdu_in_order_no_places_by_offset_and_refuses_overlaps() {
        let mut e = unordered_engine();
        let (itt, ..) = e.start_scsi(0, &[0; 16], Some(vec![0; 3000]), 0, 1);
        // Completion order 2, 0, 1; DataSN counts sends.
        assert!(feed(&mut e, itt, 0, 2000, 1000, None, 3)
            .unwrap()
            .is_empty());
        assert!(feed(&mut e, itt, 1, 0, 1000, None, 1).unwrap().is_empty());
        let ev = feed(&mut e, itt, 2, 1000, 1000, Some(0), 2).unwrap();
        match &ev[..] {
            [Event::Complete {
                result: TaskResult::Scsi(o),
                ..
            }] => {
                assert_eq!(o.data_in, 3000);
                let b = o.buf.as_ref().unwrap();
                assert!(b[..1000].iter().all(|&x| x == 1));
                assert!(b[1000..2000].iter().all(|&x| x == 2));
                assert!(b[2000..].iter().all(|&x| x == 3));
            }
            other => panic!("{other:?}"),
        }
        // An overlap fails the task, and so does a range past the buffer.
        let (itt, ..) = e.start_scsi(0, &[0; 16], Some(vec![0; 3000]), 0, 2);
        assert!(feed(&mut e, itt, 0, 1000, 1000, None, 1)
            .unwrap()
            .is_empty());
        let why = feed(&mut e, itt, 1, 1500, 1000, None, 1).unwrap_err();
        assert!(why.contains("overlaps"), "{why}");
        let (itt, ..) = e.start_scsi(0, &[0; 16], Some(vec![0; 3000]), 0, 3);
        let why = feed(&mut e, itt, 0, u32::MAX, 1000, None, 1).unwrap_err();
        assert!(why.contains("overruns"), "{why}");
    }

    #[test]
    fn data_pdu_in_order_yes_refuses_a_jump() {
        let mut e = engine();
        let (itt, ..) = e.start_scsi(0, &[0; 16], Some(vec![0; 3000]), 0, 1);
        assert!(feed(&mut e, itt, 0, 0, 1000, None, 1).unwrap().is_empty());
        let why = feed(&mut e, itt, 1, 2000, 1000, None, 1).unwrap_err();
        assert!(why.contains("DataPDUInOrder=Yes"), "{why}");
    }

    /// The outcome a completion event carries: the bytes of Data-In for a
    /// good one, the reason for a failed one.
    fn outcome(ev: &[Event<u32>]) -> Result<u64, String> {
        match ev {
            [Event::Complete {
                result: TaskResult::Scsi(o),
                ..
            }] => Ok(o.data_in),
            [Event::Complete {
                result: TaskResult::Failed { reason, .. },
                ..
            }] => Err(reason.clone()),
            other => panic!("{other:?}"),
        }
    }

    /// A good status owes the whole expected length, less an underflow, as
    /// one run from offset 0 (RFC 7143 §11.4.5.2): a READ that got less, or
    /// got it with a hole, fails instead of handing back bytes the target
    /// never sent as data.
    #[test]
    fn a_good_read_owes_all_its_data_from_offset_zero() {
        let mut e = unordered_engine();
        // Half the data with the status in the last Data-In, no residual.
        let (itt, ..) = e.start_scsi(0, &[0; 16], Some(vec![0; 4096]), 0, 1);
        let why = outcome(&feed(&mut e, itt, 0, 0, 2048, Some(0), 7).unwrap()).unwrap_err();
        assert!(why.contains("where 4096 were owed"), "{why}");
        // The second half only (DataPDUInOrder=No): the first is a hole.
        let (itt, ..) = e.start_scsi(0, &[0; 16], Some(vec![0; 4096]), 0, 2);
        let why = outcome(&feed(&mut e, itt, 0, 2048, 2048, Some(0), 7).unwrap()).unwrap_err();
        assert!(why.contains("0 of them in one run from offset 0"), "{why}");
        // Half the data, then a SCSI Response with GOOD and no residual.
        let (itt, ..) = e.start_scsi(0, &[0; 16], Some(vec![0; 4096]), 0, 3);
        assert!(feed(&mut e, itt, 0, 0, 2048, None, 7).unwrap().is_empty());
        let resp = |itt: u32, underflow: Option<u32>| scsi_response(itt, 0, underflow, 1);
        let ev = e.receive(resp(itt, None));
        assert!(outcome(&ev).unwrap_err().contains("where 4096 were owed"));
        // The same with the residual said: a good, shorter READ.
        let (itt, ..) = e.start_scsi(0, &[0; 16], Some(vec![0; 4096]), 0, 4);
        assert!(feed(&mut e, itt, 0, 0, 2048, None, 7).unwrap().is_empty());
        let ev = e.receive(resp(itt, Some(2048)));
        assert_eq!(outcome(&ev), Ok(2048));
        // A failed command's partial data is no one's business.
        let (itt, ..) = e.start_scsi(0, &[0; 16], Some(vec![0; 4096]), 0, 5);
        let ev = feed(&mut e, itt, 0, 0, 2048, Some(2), 7).unwrap();
        assert_eq!(outcome(&ev), Ok(2048));
    }

    /// A good status for a WRITE claims all of its data taken, less an
    /// underflow (RFC 7143 §11.4.5.2): the target can only have had the
    /// unsolicited data and what its R2Ts asked for.
    #[test]
    fn a_good_write_claims_no_more_than_it_was_sent_or_asked_for() {
        let mut e = engine();
        let resp = |itt: u32, underflow: Option<u32>| scsi_response(itt, 0, underflow, 0);
        let len = 300_000usize;
        // GOOD with only the 65536 unsolicited bytes sent and no R2T.
        let (itt, ..) = e.start_scsi(0, &[0; 16], None, len, 1);
        let why = outcome(&e.receive(resp(itt, None))).unwrap_err();
        assert!(why.contains("where only 65536 were sent"), "{why}");
        // GOOD after an R2T for part of the rest only.
        let (itt, ..) = e.start_scsi(0, &[0; 16], None, len, 2);
        assert_eq!(e.receive(r2t(itt, 65536, 100_000)).len(), 1);
        let why = outcome(&e.receive(resp(itt, None))).unwrap_err();
        assert!(why.contains("where only 165536 were sent"), "{why}");
        // The residual said: a good, shorter WRITE.
        let (itt, ..) = e.start_scsi(0, &[0; 16], None, len, 3);
        assert_eq!(e.receive(r2t(itt, 65536, 100_000)).len(), 1);
        let short = (len - 165_536) as u32;
        assert!(outcome(&e.receive(resp(itt, Some(short)))).is_ok());
        // Every byte asked for.
        let (itt, ..) = e.start_scsi(0, &[0; 16], None, len, 4);
        assert_eq!(e.receive(r2t(itt, 65536, 234_464)).len(), 1);
        assert!(outcome(&e.receive(resp(itt, None))).is_ok());
        // A failed WRITE claims nothing.
        let (itt, ..) = e.start_scsi(0, &[0; 16], None, len, 5);
        assert!(outcome(&e.receive(scsi_response(itt, 2, None, 0))).is_ok());
    }

    /// A Reject of one of a WRITE's Data-Out PDUs (a data digest error)
    /// does not end the WRITE: the target ends it with a SCSI Response once
    /// the rest of its data is in (RFC 7143 §11.17.1), so the task goes on
    /// answering R2Ts and takes that response. A Reject of a request (the
    /// command itself, a NOP-Out) ends its task: no other answer comes.
    #[test]
    fn a_rejected_data_out_leaves_its_write_to_the_targets_response() {
        use blockwire_pdu::pdu::codes::RejectReason;
        use blockwire_pdu::pdu::Reject;
        use blockwire_pdu::Digests;
        let mut e = engine();
        let reject = |rejected: Pdu| {
            let header = rejected.encode(Digests::NONE)[..48].to_vec();
            Pdu::with_data(
                Bhs::Reject(Reject {
                    reason: RejectReason::DataDigestError,
                    stat_sn: 100,
                    exp_cmd_sn: 11,
                    max_cmd_sn: 20,
                    data_sn_or_r2t_sn: 0,
                }),
                header,
            )
        };
        let len = 300_000usize;
        let (itt, ..) = e.start_scsi(0, &[0; 16], None, len, 1);
        let data_out = Pdu::with_data(
            Bhs::DataOut(DataOut {
                final_bit: false,
                lun: Lun::from_index(0),
                itt,
                ttt: RESERVED_TAG,
                exp_stat_sn: 100,
                data_sn: 0,
                buffer_offset: 0,
            }),
            vec![0; 8192],
        );
        assert!(
            e.receive(reject(data_out)).is_empty(),
            "a rejected Data-Out ended its WRITE"
        );
        assert_eq!(
            e.receive(r2t(itt, 65536, 234_464)).len(),
            1,
            "the WRITE still answers R2Ts"
        );
        let ended = e.receive(scsi_response(itt, 2, None, 1));
        assert!(
            matches!(&ended[..], [Event::Complete { result: TaskResult::Scsi(o), .. }] if o.status == 2),
            "{ended:?}"
        );
        // A rejected command ends its task at once.
        let (itt, header, ..) = e.start_scsi(0, &[0; 16], None, 0, 2);
        let events = e.receive(reject(Pdu::new(Bhs::ScsiCommand(header))));
        assert!(outcome(&events).is_err(), "a rejected command still waits");
        assert!(
            e.receive(scsi_response(itt, 2, None, 1)).is_empty(),
            "the task was still there"
        );
    }

    /// A status in a Data-In for a command that reads nothing (a WRITE) does
    /// not end it GOOD with its data never sent, and the S bit needs the F
    /// bit (RFC 7143 §11.7.1).
    #[test]
    fn a_data_in_with_status_ends_only_a_read() {
        let mut e = engine();
        let (write, ..) = e.start_scsi(0, &[0; 16], None, 4096, 1);
        let why = feed(&mut e, write, 0, 0, 0, Some(0), 0).unwrap_err();
        assert!(why.contains("reads nothing"), "{why}");
        let (read, ..) = e.start_scsi(0, &[0; 16], Some(vec![0; 512]), 0, 2);
        let mut d = data_in(read, 0, 0, Some(0));
        d.final_bit = false;
        let (p, ev) = e.data_in_begin(&d, 512);
        assert!(matches!(p, Placement::Discard));
        assert!(outcome(&ev)
            .unwrap_err()
            .contains("S bit and not the F bit"));
    }

    /// A task management function over a task set, a logical unit or the
    /// target covers only the commands sent before it (RFC 7143 §11.5.1):
    /// the target took the immediate request before any command sent after
    /// it on the connection, so that one is still the target's to run and
    /// answer, even when the Function Complete comes late.
    #[test]
    fn a_task_set_function_spares_the_commands_sent_after_it() {
        for function in [
            TmfFunction::AbortTaskSet,
            TmfFunction::ClearTaskSet,
            TmfFunction::LogicalUnitReset,
            TmfFunction::TargetWarmReset,
            TmfFunction::TargetColdReset,
        ] {
            let mut e = engine();
            let (before, ..) = e.start_scsi(3, &[0; 16], None, 0, 1);
            let req = e.start_tmf(function, 3, None, 2);
            let (after, ..) = e.start_scsi(3, &[0; 16], None, 0, 3);
            let ev = e.receive(function_complete(req.itt));
            let aborted: Vec<u32> = ev
                .iter()
                .filter_map(|ev| match ev {
                    Event::Complete {
                        owner,
                        result: TaskResult::Aborted { .. },
                    } => Some(*owner),
                    _ => None,
                })
                .collect();
            let name = function.name();
            assert_eq!(aborted, [1], "{name}: only the command sent before");
            assert!(
                e.tasks.contains_key(&after) && !e.tasks.contains_key(&before),
                "{name}"
            );
            let ev = e.receive(good_response(after));
            assert!(
                matches!(
                    ev[..],
                    [Event::Complete {
                        owner: 3,
                        result: TaskResult::Scsi(_)
                    }]
                ),
                "{name}: the later command's own answer ends it"
            );
        }
    }

    /// A SCSI Response ending the command `itt` with `status`, an
    /// `underflow` residual if any, after `exp_data_sn` data PDUs.
    fn scsi_response(itt: u32, status: u8, underflow: Option<u32>, exp_data_sn: u32) -> Pdu {
        Pdu::new(Bhs::ScsiResponse(ScsiResponse {
            bidi_read_overflow: false,
            bidi_read_underflow: false,
            overflow: false,
            underflow: underflow.is_some(),
            response: ServiceResponse::CommandCompleted,
            status,
            itt,
            snack_tag: 0,
            stat_sn: 100,
            exp_cmd_sn: 11,
            max_cmd_sn: 20,
            exp_data_sn,
            bidi_read_residual_count: 0,
            residual_count: underflow.unwrap_or(0),
        }))
    }

    /// A SCSI Response of GOOD, no data, for the command `itt`.
    fn good_response(itt: u32) -> Pdu {
        Pdu::new(Bhs::ScsiResponse(ScsiResponse {
            bidi_read_overflow: false,
            bidi_read_underflow: false,
            overflow: false,
            underflow: false,
            response: ServiceResponse::CommandCompleted,
            status: 0,
            itt,
            snack_tag: 0,
            stat_sn: 101,
            exp_cmd_sn: 12,
            max_cmd_sn: 20,
            exp_data_sn: 0,
            bidi_read_residual_count: 0,
            residual_count: 0,
        }))
    }

    /// The target's Function Complete for the task management request `itt`.
    fn function_complete(itt: u32) -> Pdu {
        Pdu::new(Bhs::TaskMgmtResponse(
            blockwire_pdu::pdu::TaskMgmtResponse {
                response: TmfResponse::FunctionComplete,
                itt,
                stat_sn: 100,
                exp_cmd_sn: 11,
                max_cmd_sn: 20,
            },
        ))
    }

    #[test]
    fn abort_completes_the_victim() {
        let mut e = engine();
        let (victim, ..) = e.start_scsi(3, &[0; 16], None, 0, 1);
        let req = e.start_tmf(TmfFunction::AbortTask, 3, Some(victim), 2);
        assert_eq!(req.ref_cmd_sn, 10);
        let ev = e.receive(function_complete(req.itt));
        assert_eq!(ev.len(), 2);
        assert!(matches!(
            ev[0],
            Event::Complete {
                owner: 1,
                result: TaskResult::Aborted { .. }
            }
        ));
        assert!(matches!(
            ev[1],
            Event::Complete {
                owner: 2,
                result: TaskResult::Tmf(TmfResponse::FunctionComplete)
            }
        ));
        assert_eq!(e.task_count(), 0);
    }

    /// A response names its task by ITT (RFC 7143 §11): one of another
    /// kind than the task (a NOP-In or a task management, logout or SCSI
    /// response, or a Data-In with status) fails the task, which keeps its
    /// read buffer, instead of completing it as if it had been answered.
    #[test]
    fn a_response_of_the_wrong_kind_fails_the_task() {
        let mut e = engine();
        let window = (100, 11, 20);
        let (read, ..) = e.start_scsi(0, &[0; 16], Some(vec![0; 512]), 0, 1);
        let ping = e.start_ping(2);
        let logout = e.start_logout(3);
        let tmf = e.start_tmf(TmfFunction::AbortTask, 0, Some(0x9999), 4);
        let nop_in = Pdu::new(Bhs::NopIn(NopIn {
            lun: Lun::default(),
            itt: read,
            ttt: RESERVED_TAG,
            stat_sn: window.0,
            exp_cmd_sn: window.1,
            max_cmd_sn: window.2,
        }));
        let tmf_response = Pdu::new(Bhs::TaskMgmtResponse(
            blockwire_pdu::pdu::TaskMgmtResponse {
                response: TmfResponse::FunctionComplete,
                itt: ping.itt,
                stat_sn: window.0,
                exp_cmd_sn: window.1,
                max_cmd_sn: window.2,
            },
        ));
        let logout_response = Pdu::new(Bhs::LogoutResponse(blockwire_pdu::pdu::LogoutResponse {
            response: LogoutResponseCode::Closed,
            itt: tmf.itt,
            stat_sn: window.0,
            exp_cmd_sn: window.1,
            max_cmd_sn: window.2,
            time2wait: 0,
            time2retain: 0,
        }));
        for (pdu, owner) in [(nop_in, 1), (tmf_response, 2), (logout_response, 4)] {
            let ev = e.receive(pdu);
            match &ev[..] {
                [Event::Complete {
                    owner: o,
                    result: TaskResult::Failed { buf, .. },
                }] if *o == owner => {
                    assert_eq!(buf.as_ref().map(Vec::len), (owner == 1).then_some(512));
                }
                other => panic!("owner {owner}: {other:?}"),
            }
        }
        // A Data-In with status for the logout.
        let d = data_in(logout.itt, 0, 0, Some(0));
        let (p, ev) = e.data_in_begin(&d, 0);
        assert!(matches!(p, Placement::Discard) && ev.is_empty());
        let ev = e.data_in_end(&d, None, 0);
        assert!(
            matches!(
                &ev[..],
                [Event::Complete {
                    owner: 3,
                    result: TaskResult::Failed { .. }
                }]
            ),
            "{ev:?}"
        );
        assert_eq!(e.task_count(), 0);
    }

    #[test]
    fn target_ping_is_answered() {
        let mut e = engine();
        let ev = e.receive(Pdu::new(Bhs::NopIn(NopIn {
            lun: Lun::default(),
            itt: RESERVED_TAG,
            ttt: 0x55,
            stat_sn: 100,
            exp_cmd_sn: 10,
            max_cmd_sn: 12,
        })));
        match &ev[..] {
            [Event::Send(p)] => match p.bhs {
                Bhs::NopOut(n) => assert_eq!((n.ttt, n.itt), (0x55, RESERVED_TAG)),
                _ => panic!(),
            },
            other => panic!("{other:?}"),
        }
    }
}
