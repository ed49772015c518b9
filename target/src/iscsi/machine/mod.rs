//! The target side of one iSCSI connection as a state machine without I/O.
//!
//! [`LoginPhase`] takes Login Requests and says what to answer until the
//! session is attached (the login hand-off, RFC 7143 §6); [`ConnMachine`]
//! then takes every PDU of the full feature phase, the expiry of its timers
//! and the daemon's shutdown, each with the current time, and returns
//! [`Action`]s: send these PDUs, run this command, start this pipelined
//! WRITE, wait for these aborted tasks, end the connection. It holds the
//! CmdSN window (§4.2.2.1), WRITE data collection with R2T/TTT numbering
//! (§11.7-11.8), NOP-In pings and their timeout (§11.18-11.19), text
//! exchanges, task management (§11.5) and logout (§11.14). It never reads a
//! clock, never awaits and never touches a socket: the tokio driver in
//! [`super::connection`] moves the bytes and runs the commands, and the
//! tests in `tests.rs` drive it in memory with injected time.
//!
//! Running commands are not the machine's: each one's task owns its
//! [`CommandSlot`] (window slot and task-set entry) and queues its own
//! Data-In and status to the writer, so a READ's data never waits for the
//! reader. Whether a task may still answer after an abort is decided by
//! the session's task set ([`super::session::TaskSet`]), which the machine
//! and the tasks share.

mod login_phase;
#[cfg(test)]
mod tests;
mod tmf;
mod writes;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use blockwire_pdu::pdu::codes::{AsyncEvent, LogoutReason, LogoutResponseCode, RejectReason};
use blockwire_pdu::pdu::{
    AsyncMessage, LogoutRequest, LogoutResponse, NopIn, NopOut, Reject, ScsiCommand,
    TaskMgmtRequest, RESERVED_TAG,
};
use blockwire_pdu::{Bhs, DecodeError, Lun, Pdu};
use blockwire_transport::assist::Descriptor;
use tracing::{debug, info, warn};

use super::budget::{ReadBudget, ReadDataHeld, Reservation, WriteBudget};
use super::dataout::WriteLimits;
use super::discovery::{TextExchange, TextStep};
use super::login::LoginOutcome;
use super::rdma::Slot;
use super::response::DataInLimits;
use super::session::Session;
use super::task::CommandSlot;
use super::throttle::Throttle;
use super::window::{Admission, CmdWindow};
use super::Fabric;

pub(super) use login_phase::{LoginAction, LoginPhase};
use writes::Collecting;

/// The CmdSN window of a connection, shared by the machine (which admits
/// commands), the writer (which stamps ExpCmdSN and MaxCmdSN as PDUs leave)
/// and the command slots (which free their place).
pub(super) struct Shared {
    window: Mutex<CmdWindow<Admitted>>,
    /// Per-command copy tallies of READ payloads (debug copy counter).
    pub(super) copies: Arc<crate::copies::Tracker>,
    /// Bytes of READ data the core may have read and not yet sent
    /// ([`super::FabricSettings::read_budget_bytes`]).
    read_budget: ReadBudget,
    /// The same, for all connections together
    /// ([`super::FabricSettings::read_budget_total_bytes`]).
    fabric_read_budget: ReadBudget,
}

impl Shared {
    /// The shared state of a connection whose CmdSN window starts at
    /// `exp_cmd_sn` and holds `depth` commands, and that may hold
    /// `read_budget` bytes of READ data waiting to be sent, within the
    /// fabric's `fabric_read_budget`.
    pub(super) fn new(
        exp_cmd_sn: u32,
        depth: u32,
        read_budget: u64,
        fabric_read_budget: ReadBudget,
    ) -> Arc<Shared> {
        Arc::new(Shared {
            window: Mutex::new(CmdWindow::new(exp_cmd_sn, depth)),
            copies: Arc::default(),
            read_budget: ReadBudget::new(read_budget),
            fabric_read_budget,
        })
    }

    /// [`Shared::hold_read_data`] if both budgets have room now; Err if
    /// not.
    pub(super) fn try_hold_read_data(&self, len: u32) -> Result<Option<ReadDataHeld>, ()> {
        ReadDataHeld::try_take(&self.read_budget, &self.fabric_read_budget, len)
            .map(Some)
            .ok_or(())
    }

    /// Takes `len` bytes (at most the whole budget) of the connection's
    /// READ budget, then of the fabric's, waiting until earlier READ data
    /// has been sent (None only if a budget were closed, which it never
    /// is). The connection's share first: a connection whose own data
    /// fill its budget waits on its initiator without holding any of the
    /// fabric's.
    pub(super) async fn hold_read_data(&self, len: u32) -> Option<ReadDataHeld> {
        ReadDataHeld::take(&self.read_budget, &self.fabric_read_budget, len).await
    }

    fn window(&self) -> std::sync::MutexGuard<'_, CmdWindow<Admitted>> {
        self.window.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A command (or other CmdSN-numbered request) arrived: what the window
    /// delivers now, each with the window slot it holds.
    pub(super) fn admit(
        self: &Arc<Self>,
        cmd_sn: u32,
        immediate: bool,
        item: Admitted,
    ) -> Admission<(Admitted, CommandSlot)> {
        let admission = self.window().admit(cmd_sn, immediate, item);
        match admission {
            Admission::Deliver(items) => Admission::Deliver(
                items
                    .into_iter()
                    .map(|i| (i, CommandSlot::taken(self.clone())))
                    .collect(),
            ),
            Admission::Queued => Admission::Queued,
            Admission::Dropped => Admission::Dropped,
        }
    }

    /// Whether immediate commands took the session past its depth (see
    /// [`CmdWindow::over_depth`]).
    pub(super) fn over_depth(&self) -> bool {
        self.window().over_depth()
    }

    /// ExpCmdSN and MaxCmdSN as they stand now.
    pub(super) fn numbers(&self) -> (u32, u32) {
        let w = self.window();
        (w.exp_cmd_sn(), w.max_cmd_sn())
    }

    /// Commands delivered and not completed.
    #[cfg(test)]
    pub(super) fn in_flight(&self) -> u32 {
        self.window().in_flight()
    }

    /// A command left the window (MaxCmdSN advances). Only its
    /// [`CommandSlot`] calls this.
    pub(super) fn complete(&self) {
        self.window().complete();
    }
}

/// A PDU that took a CmdSN and waits for its turn.
#[derive(Debug)]
pub(super) enum Admitted {
    Scsi(Pdu),
    Nop(Pdu),
    Text(Pdu),
    Tmf(TaskMgmtRequest),
    Logout(LogoutRequest),
}

/// A command whose data is all here (or moves by RDMA): the driver runs it.
pub(super) struct Ready {
    pub cmd: ScsiCommand,
    pub cdb: Vec<u8>,
    /// R2Ts sent for its data (the first Data-In's DataSN follows them).
    pub r2t_count: u32,
    /// Its WRITE data: the command PDU's immediate data when that is all
    /// of it (a slice of the connection's read buffer, which stays
    /// allocated while the slice lives), otherwise gathered from Data-Out.
    pub data_out: bytes::Bytes,
    /// The session's RDMA offload and the initiator's buffers, when its
    /// data moves by RDMA.
    pub offload: Option<(Arc<Slot>, Descriptor)>,
    /// The write budget its data holds, returned when it ends.
    pub budget: Option<Reservation>,
    /// Its place at its LUN's QoS ceilings, when it must wait for it
    /// before it starts (see [`super::throttle`]).
    pub throttle: Option<Throttle>,
    /// Its window slot and task-set entry.
    pub slot: CommandSlot,
}

impl Ready {
    /// A command that brings no data over TCP: no WRITE data, or data the
    /// target RDMA-Reads from the initiator's buffer (`offload`).
    fn without_data(
        cmd: ScsiCommand,
        cdb: Vec<u8>,
        offload: Option<(Arc<Slot>, Descriptor)>,
        slot: CommandSlot,
    ) -> Ready {
        Ready {
            cmd,
            cdb,
            r2t_count: 0,
            data_out: bytes::Bytes::new(),
            offload,
            budget: None,
            throttle: None,
            slot,
        }
    }
}

/// A double-buffered WRITE (see [`super::syncwrite`]) whose task the
/// driver starts; the machine keeps the feed end and passes it the data.
pub(super) struct PipedWrite {
    pub cmd: ScsiCommand,
    pub cdb: Vec<u8>,
    /// The LUN's double-buffered write path.
    pub path: Arc<super::syncwrite::SyncWriteLun>,
    /// The buffer its chunks gather in.
    pub lease: crate::datapath::BufLease,
    /// The write budget its data holds.
    pub budget: Reservation,
    /// Its window slot and task-set entry, owned by its task from now on.
    pub slot: CommandSlot,
    /// The task's end of the feed the machine passes the data into.
    pub feed: super::syncwrite::FeedReceiver,
    /// Its place at its LUN's QoS ceilings, when its chunk writes must
    /// wait for it.
    pub throttle: Option<Throttle>,
}

/// Why the machine ends the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EndReason {
    /// The initiator logged out (the Logout Response is queued before).
    LoggedOut,
    /// A TARGET COLD RESET drops the connection (RFC 7143 §11.5.1).
    ColdReset,
    /// A PDU the connection cannot continue after (a format error).
    ProtocolError,
    /// A NOP-In ping went unanswered for the NOP timeout.
    NopTimeout,
    /// A WRITE waited for Data-Out the initiator never sent, for the NOP
    /// timeout.
    DataOutTimeout,
    /// The daemon shuts down and the initiator did not log out in time.
    LogoutTimeout,
}

/// What the driver does next, in order.
pub(super) enum Action {
    /// Queue this PDU to the writer (numbered as it leaves).
    Send(Pdu),
    /// Run this command.
    Run(Ready),
    /// Cut the Data-In of commands started from now on to these limits
    /// (the initiator declared a new MaxRecvDataSegmentLength in a Text
    /// exchange).
    DataInLimits(DataInLimits),
    /// Start this double-buffered WRITE's task.
    StartPipedWrite(PipedWrite),
    /// Task management aborted `aborted` (not started, pipelined WRITEs
    /// whose chunk writes must end first, or commands the core is running,
    /// counted in `changing_medium` while they may change the medium) and
    /// let `completing` finish: wait (bounded) until all are gone, so the
    /// task management response queued next follows their answers on the
    /// wire and no aborted WRITE reaches the medium after it.
    AwaitAborted {
        aborted: Vec<u32>,
        completing: Vec<u32>,
        changing_medium: Vec<Arc<std::sync::atomic::AtomicUsize>>,
    },
    /// A cold reset: wait (bounded) until the commands of every session
    /// that were running on the reset units have ended, so the task
    /// management response queued next follows the last of their writes
    /// to the medium.
    AwaitSettled(crate::scsi::Settling),
    /// A reset: send this task management response once the commands of
    /// every session that were running on the reset units have ended
    /// (bounded), while the connection goes on.
    SendWhenSettled(crate::scsi::Settling, Pdu),
    /// End the connection: flush what is queued, then close.
    End(EndReason),
}

impl std::fmt::Debug for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Action::Send(p) => write!(f, "Send({:?})", p.bhs.opcode()),
            Action::Run(r) => write!(f, "Run(itt {:#x})", r.cmd.itt),
            Action::DataInLimits(l) => write!(f, "DataInLimits({l:?})"),
            Action::StartPipedWrite(_) => write!(f, "StartPipedWrite"),
            Action::AwaitAborted {
                aborted,
                completing,
                ..
            } => write!(f, "AwaitAborted({aborted:?}, {completing:?})"),
            Action::AwaitSettled(_) => write!(f, "AwaitSettled"),
            Action::SendWhenSettled(_, p) => write!(f, "SendWhenSettled({:?})", p.bhs.opcode()),
            Action::End(r) => write!(f, "End({r:?})"),
        }
    }
}

/// The full feature phase of one connection.
pub(super) struct ConnMachine {
    fabric: Arc<Fabric>,
    session: Arc<Session>,
    /// The session's connection generation this machine serves.
    generation: u64,
    shared: Arc<Shared>,
    /// WRITEs waiting for data, by ITT.
    collectors: HashMap<u32, Collecting>,
    /// WRITEs that their LUN's QoS ceilings hold back (among `collectors`
    /// with no R2T sent yet, or in `held_offloads`): when each may ask for
    /// its data, and its ITT.
    held: BTreeSet<(Instant, u32)>,
    /// RDMA-assisted WRITEs their LUN's QoS ceilings hold back, by ITT: no
    /// write budget taken and no data read until their place comes.
    held_offloads: HashMap<u32, (Ready, Throttle)>,
    write_budget: Arc<WriteBudget>,
    text: TextExchange,
    write_limits: WriteLimits,
    next_ttt: u32,
    /// TTT of our NOP-In ping still unanswered, and when it was sent.
    ping: Option<(u32, Instant)>,
    /// When the next NOP-In is due (None: pings disabled).
    next_ping: Option<Instant>,
    /// Set once the initiator was asked to log out: when it must be gone.
    logout_deadline: Option<Instant>,
    /// When to look again for a WRITE whose Data-Out is overdue (at or
    /// before the earliest `Collecting::data_due`; None: none waits).
    next_data_out_check: Option<Instant>,
    /// When a Data-Out last added to a WRITE's data.
    last_data_out: Instant,
    /// Whether the last look found a WRITE's Data-Out overdue (the
    /// connection ends if the next finds it so still).
    data_out_stall_seen: bool,
    /// The session's RDMA offload, when granted at login.
    rdma: Option<Arc<Slot>>,
    /// Actions produced by the current input.
    out: Vec<Action>,
}

impl ConnMachine {
    /// Double-buffered WRITEs whose data still arrive: their tasks run,
    /// waiting for Data-Out (the in-memory harness counts them as idle).
    #[cfg(feature = "fuzzing")]
    pub(crate) fn piped_writes_waiting_for_data(&self) -> usize {
        self.collectors.values().filter(|c| c.is_piped()).count()
    }

    /// When the first WRITE held back by its LUN's QoS ceilings gets its
    /// turn (the in-memory harness runs its clock on to it when commands
    /// wait behind it).
    #[cfg(feature = "fuzzing")]
    pub(crate) fn next_held_turn(&self) -> Option<Instant> {
        self.held.first().map(|(at, _)| *at)
    }

    /// The full feature phase after `outcome`'s login, on the connection
    /// whose local address is `local`, starting at `now`; the connection
    /// owns `generation` of `session` (read when the login attached it).
    pub(super) fn new(
        fabric: Arc<Fabric>,
        session: Arc<Session>,
        generation: u64,
        outcome: &LoginOutcome,
        local: SocketAddr,
        rdma: Option<Arc<Slot>>,
        now: Instant,
    ) -> ConnMachine {
        let params = &session.params;
        let write_limits = WriteLimits {
            first_burst_length: params.first_burst_length,
            max_burst_length: params.max_burst_length,
            initial_r2t: params.initial_r2t,
            immediate_data: params.immediate_data,
            max_outstanding_r2t: params.max_outstanding_r2t,
            data_pdu_in_order: params.data_pdu_in_order,
        };
        let settings = &fabric.settings;
        ConnMachine {
            shared: Shared::new(
                outcome.exp_cmd_sn,
                settings.queue_depth,
                settings.read_budget_bytes,
                fabric.read_budget.clone(),
            ),
            collectors: HashMap::new(),
            held: BTreeSet::new(),
            held_offloads: HashMap::new(),
            write_budget: WriteBudget::within(
                settings.write_budget_bytes,
                fabric.write_budget.clone(),
            ),
            text: TextExchange::from_outcome(fabric.catalog(), outcome, local),
            write_limits,
            next_ttt: 1,
            ping: None,
            next_ping: settings.nop_interval.map(|i| now + i),
            logout_deadline: None,
            next_data_out_check: None,
            last_data_out: now,
            data_out_stall_seen: false,
            rdma,
            out: Vec::new(),
            generation,
            session,
            fabric,
        }
    }

    /// The CmdSN window, for the writer and the commands.
    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The negotiated Data-In limits of this connection: the initiator's
    /// MaxRecvDataSegmentLength as last declared, at login or in a Text
    /// exchange since (a connection key, RFC 7143 §13.12).
    pub(super) fn data_in_limits(&self) -> DataInLimits {
        DataInLimits {
            max_recv_data_segment_length: self.text.params().initiator_max_recv_data_segment_length,
            max_burst_length: self.session.params.max_burst_length,
        }
    }

    /// Whether Data-In may leave in completion order (DataPDUInOrder=No).
    pub(super) fn data_pdu_in_order(&self) -> bool {
        self.write_limits.data_pdu_in_order
    }

    /// When [`Self::on_timeout`] must next be called.
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        let held = self.held.first().map(|&(due, _)| due);
        [
            self.next_ping,
            self.ping_deadline(),
            self.logout_deadline,
            self.next_data_out_check,
            held,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn take(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.out)
    }

    /// When the ping on its way times out: `nop_timeout` after it went,
    /// whatever the interval between pings.
    fn ping_deadline(&self) -> Option<Instant> {
        let (_, sent) = self.ping?;
        self.fabric.settings.nop_interval?;
        Some(sent + self.fabric.settings.nop_timeout)
    }

    fn send(&mut self, pdu: Pdu) {
        self.out.push(Action::Send(pdu));
    }

    fn reject(&mut self, reason: RejectReason, header: Vec<u8>) {
        let bhs = Bhs::Reject(Reject {
            reason,
            stat_sn: 0,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
            data_sn_or_r2t_sn: 0,
        });
        self.send(Pdu::with_data(bhs, header));
    }

    fn new_ttt(&mut self) -> u32 {
        next_ttt_after(&mut self.next_ttt)
    }

    /// Time passed: a NOP-In ping falls due, or times out, the logout
    /// grace ran out, held WRITEs may ask for their data, or a WRITE's
    /// Data-Out is overdue.
    pub(super) fn on_timeout(&mut self, now: Instant) -> Vec<Action> {
        self.release_held_writes(now);
        if self.data_out_overdue(now) {
            self.out.push(Action::End(EndReason::DataOutTimeout));
            return self.take();
        }
        if self.logout_deadline.is_some_and(|d| now >= d) {
            info!(
                tsih = self.session.tsih,
                "initiator did not log out in time: closing"
            );
            self.out.push(Action::End(EndReason::LogoutTimeout));
            return self.take();
        }
        if self.ping_deadline().is_some_and(|d| now >= d) {
            warn!(tsih = self.session.tsih, initiator = %self.session.initiator_name, "no answer to NOP-In: dropping the connection");
            self.out.push(Action::End(EndReason::NopTimeout));
            return self.take();
        }
        if let (Some(due), Some(interval)) = (self.next_ping, self.fabric.settings.nop_interval) {
            if now >= due {
                self.next_ping = Some(now + interval);
                if self.ping.is_none() {
                    self.send_ping(now);
                }
            }
        }
        self.take()
    }

    fn send_ping(&mut self, now: Instant) {
        let ttt = self.new_ttt();
        self.ping = Some((ttt, now));
        self.send(Pdu::new(Bhs::NopIn(NopIn {
            lun: Lun::default(),
            itt: RESERVED_TAG,
            ttt,
            stat_sn: 0,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
        })));
    }

    /// The daemon shuts down: ask the initiator to log out within the
    /// logout grace (an Asynchronous Message, RFC 7143 §11.9.1 event 1).
    pub(super) fn on_shutdown(&mut self, now: Instant) -> Vec<Action> {
        if self.logout_deadline.is_some() {
            return Vec::new();
        }
        let grace = self.fabric.settings.logout_grace;
        self.logout_deadline = Some(now + grace);
        info!(tsih = self.session.tsih, "asking the initiator to log out");
        self.send(Pdu::new(Bhs::AsyncMessage(AsyncMessage {
            lun: Lun::default(),
            stat_sn: 0,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
            event: AsyncEvent::LogoutRequest,
            vcode: 0,
            parameter1: 0,
            parameter2: 0,
            parameter3: grace.as_secs().min(3600) as u16,
        })));
        self.take()
    }

    /// A PDU that could not be decoded: Reject it (unless its header
    /// cannot be trusted) and end the connection unless the reader could
    /// skip it (an unknown opcode with a sound length).
    pub(super) fn on_decode_error(
        &mut self,
        error: &DecodeError,
        header: Option<&[u8]>,
        skippable: bool,
    ) -> Vec<Action> {
        warn!(tsih = self.session.tsih, error = %error, "bad PDU");
        let reason = match error {
            DecodeError::UnknownOpcode(_) => RejectReason::CommandNotSupported,
            DecodeError::DataDigest { .. } => RejectReason::DataDigestError,
            _ => RejectReason::ProtocolError,
        };
        if !matches!(error, DecodeError::HeaderDigest { .. }) {
            self.reject(reason, header.map(<[u8]>::to_vec).unwrap_or_default());
        }
        if !(skippable && matches!(error, DecodeError::UnknownOpcode(_))) {
            self.out.push(Action::End(EndReason::ProtocolError));
        }
        self.take()
    }

    /// One PDU from the initiator.
    pub(super) fn on_pdu(&mut self, pdu: Pdu, now: Instant) -> Vec<Action> {
        let (cmd_sn, immediate, admitted) = match pdu.bhs {
            Bhs::ScsiCommand(c) => (c.cmd_sn, c.immediate, Admitted::Scsi(pdu)),
            Bhs::NopOut(n) => {
                if n.itt == RESERVED_TAG {
                    // The answer to our ping; it takes no CmdSN.
                    if self.ping.is_some_and(|(ttt, _)| ttt == n.ttt) {
                        self.ping = None;
                    }
                    return self.take();
                }
                (n.cmd_sn, n.immediate, Admitted::Nop(pdu))
            }
            Bhs::TextRequest(t) => (t.cmd_sn, t.immediate, Admitted::Text(pdu)),
            Bhs::TaskMgmtRequest(t) => (t.cmd_sn, t.immediate, Admitted::Tmf(t)),
            Bhs::LogoutRequest(l) => (l.cmd_sn, l.immediate, Admitted::Logout(l)),
            Bhs::DataOut(d) => {
                self.data_out(d, pdu.data, now);
                return self.take();
            }
            Bhs::SnackRequest(_) => {
                // ErrorRecoveryLevel 0: no SNACK support.
                self.reject(RejectReason::ProtocolError, pdu.bhs.encode(0, 0).to_vec());
                return self.take();
            }
            _ => {
                warn!(tsih = self.session.tsih, opcode = ?pdu.bhs.opcode(), "unexpected PDU in full feature phase");
                let header = pdu.bhs.encode(0, pdu.data.len() as u32).to_vec();
                self.reject(RejectReason::ProtocolError, header);
                return self.take();
            }
        };
        match self.shared.admit(cmd_sn, immediate, admitted) {
            Admission::Dropped => {
                debug!(
                    tsih = self.session.tsih,
                    cmd_sn, "CmdSN outside the window: dropped"
                );
            }
            Admission::Queued => {}
            Admission::Deliver(items) => {
                for (item, slot) in items {
                    if !self.dispatch(item, slot, now) {
                        break;
                    }
                }
            }
        }
        self.take()
    }

    /// Handles one request the window delivered; false once the connection
    /// ends.
    fn dispatch(&mut self, item: Admitted, slot: CommandSlot, now: Instant) -> bool {
        if let Admitted::Scsi(pdu) = item {
            self.scsi_command(pdu, slot, now);
            return true;
        }
        // The other requests hold no slot past here: MaxCmdSN opens before
        // their answer is stamped.
        drop(slot);
        match item {
            Admitted::Scsi(_) => unreachable!("handled above"),
            Admitted::Nop(pdu) => {
                let Bhs::NopOut(NopOut { lun, itt, .. }) = pdu.bhs else {
                    unreachable!("admitted as a NOP-Out")
                };
                // The echo is a NOP-In data segment, which the initiator's
                // MaxRecvDataSegmentLength bounds (RFC 7143 §13.12), or on
                // iSER its InitiatorRecvDataSegmentLength, the size of the
                // buffers its Sends land in (RFC 7145 §6.3): ping data past
                // it cannot come back, so the ping is refused, as LIO
                // refuses it, in its CmdSN turn.
                let params = &self.session.params;
                let limit = if params.rdma_extensions {
                    params.initiator_recv_data_segment_length
                } else {
                    self.data_in_limits().max_recv_data_segment_length
                };
                if pdu.data.len() > limit as usize {
                    warn!(
                        tsih = self.session.tsih,
                        bytes = pdu.data.len(),
                        limit,
                        "NOP-Out ping data longer than the initiator's MaxRecvDataSegmentLength: rejected"
                    );
                    let header = pdu.bhs.encode(0, pdu.data.len() as u32).to_vec();
                    self.reject(RejectReason::ProtocolError, header);
                    return true;
                }
                let reply = Bhs::NopIn(NopIn {
                    lun,
                    itt,
                    ttt: RESERVED_TAG,
                    stat_sn: 0,
                    exp_cmd_sn: 0,
                    max_cmd_sn: 0,
                });
                // The ping data comes back as it was sent (RFC 7143 §11.19).
                self.send(Pdu::with_data(reply, pdu.data));
                true
            }
            Admitted::Text(pdu) => {
                let Bhs::TextRequest(req) = pdu.bhs else {
                    unreachable!("admitted as a Text Request")
                };
                let before = self.data_in_limits();
                self.text.use_catalog(self.fabric.catalog());
                let step = self.text.on_request(&req, &pdu.data);
                let after = self.data_in_limits();
                if after != before {
                    self.out.push(Action::DataInLimits(after));
                }
                match step {
                    TextStep::Respond(p) => self.send(p),
                    TextStep::Reject(p) => {
                        warn!(tsih = self.session.tsih, "text request rejected");
                        self.send(p);
                    }
                }
                true
            }
            Admitted::Tmf(req) => self.task_management(req),
            Admitted::Logout(req) => self.logout(req),
        }
    }

    /// A Logout Request. With one connection per session and no
    /// ErrorRecoveryLevel 2, closing the session or the connection both
    /// end it; removing a connection for recovery is not supported. A
    /// connection the session does not have is not found (RFC 7143
    /// §11.15.1), and this one goes on.
    fn logout(&mut self, req: LogoutRequest) -> bool {
        let response = match req.reason {
            LogoutReason::CloseConnection if req.cid != self.session.cid() => {
                LogoutResponseCode::CidNotFound
            }
            LogoutReason::CloseSession | LogoutReason::CloseConnection => {
                LogoutResponseCode::Closed
            }
            LogoutReason::RemoveForRecovery => LogoutResponseCode::RecoveryNotSupported,
            LogoutReason::Other(_) => LogoutResponseCode::CleanupFailed,
        };
        info!(
            tsih = self.session.tsih,
            reason = req.reason.name(),
            "logout"
        );
        // A connection already replaced by a reinstatement leaves the
        // session, its tasks and its nexus to the new one.
        if response == LogoutResponseCode::Closed && self.session.generation() == self.generation {
            // The response tells the initiator that the session's cleanup is
            // done (RFC 7143 §11.15): the commands still pending are
            // terminated (§11.14) and then the I_T nexus is lost, before
            // it leaves, so a command the initiator sends on another
            // session right after it no longer meets this one's RESERVE(6).
            // As for an abort, the response waits until none of them can
            // still change the medium: a WRITE the backstore was writing
            // could otherwise land over what the initiator writes next.
            self.abort_where(|_, _| true);
            self.fabric.sessions.end(&self.session, self.generation);
        }
        self.send(Pdu::new(Bhs::LogoutResponse(LogoutResponse {
            response,
            itt: req.itt,
            stat_sn: 0,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
            time2wait: 0,
            time2retain: 0,
        })));
        if response == LogoutResponseCode::Closed {
            self.out.push(Action::End(EndReason::LoggedOut));
            return false;
        }
        true
    }

    /// Answers a command that will not run with `pdus`, after freeing its
    /// window slot (so they carry the MaxCmdSN it opened).
    fn refuse(&mut self, slot: CommandSlot, pdus: Vec<Pdu>) {
        drop(slot);
        for p in pdus {
            self.send(p);
        }
    }
}

/// Moves `last` to the next Target Transfer Tag and returns it: never
/// FFFFFFFFh, which says "no tag" (RFC 7143 §11.7.4, §11.8), nor 0.
pub(super) fn next_ttt_after(last: &mut u32) -> u32 {
    *last = last.wrapping_add(1);
    if *last == RESERVED_TAG || *last == 0 {
        *last = 1;
    }
    *last
}
