//! SCSI commands as they arrive: refusals, their place at their LUN's QoS
//! ceilings, WRITE data collection (immediate data, unsolicited and
//! solicited Data-Out, R2T with its TTT numbering, RFC 7143 §11.7-11.8)
//! and RDMA-described commands.
//!
//! A WRITE that its LUN's ceilings hold back, and whose data the target
//! must ask for, is held here: no R2T goes out and no write budget is
//! taken until its place comes (its unsolicited data, at most
//! FirstBurstLength, is kept meanwhile). An RDMA-assisted WRITE held back
//! takes its budget share, and has its data read, when its place comes.
//! So a deep queue of throttled WRITEs holds neither memory nor budget
//! that other LUNs' WRITEs on the connection need, and the initiator keeps
//! their data until it is wanted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_pdu::pdu::codes::RejectReason;
use blockwire_pdu::pdu::{DataOut, R2t, ScsiCommand, RESERVED_TAG};
use blockwire_pdu::{Bhs, Pdu};
use blockwire_transport::assist::{Descriptor, Direction};
use tracing::{debug, warn};

use super::{Action, ConnMachine, PipedWrite, Ready};
use crate::iscsi::budget::{Refused, Reservation};
use crate::iscsi::dataout::WriteCollector;
use crate::iscsi::rdma::Slot;
use crate::iscsi::response::{status_after_r2ts, status_only};
use crate::iscsi::task::{data_phase_error_sense, CommandSlot};
use crate::iscsi::throttle::Throttle;

/// CHECK CONDITION.
const CHECK_CONDITION: u8 = 0x02;
/// TASK SET FULL: the initiator retries later.
const TASK_SET_FULL: u8 = 0x28;
/// BUSY: the logical unit cannot take the command now; retried later.
const BUSY: u8 = 0x08;

/// A WRITE waiting for its data.
pub(super) struct Collecting {
    cmd: ScsiCommand,
    cdb: Vec<u8>,
    collector: WriteCollector,
    dest: WriteDest,
    /// Its place at its LUN's QoS ceilings, when it must still wait for
    /// it (passed on to the command when it runs).
    qos: Option<Throttle>,
    /// When the initiator must have sent more of its data: the NOP timeout
    /// after its R2T or its last Data-Out (None while held, asking for
    /// nothing).
    data_due: Option<Instant>,
}

impl Collecting {
    /// Whether a double-buffered WRITE's task already runs for it: that
    /// task waits for the initiator's Data-Out, not for the target.
    #[cfg(feature = "fuzzing")]
    pub(super) fn is_piped(&self) -> bool {
        matches!(self.dest, WriteDest::Pipe(_))
    }
}

/// Where a WRITE's accepted bytes go.
enum WriteDest {
    /// Gathered by the collector; the command runs once they are all
    /// there. The memory it holds, returned when it is dropped, and the
    /// command's window slot, freed when it is dropped unrun (aborted, or
    /// the connection is gone).
    Gather(Reservation, CommandSlot),
    /// All of it came as the command PDU's immediate data: kept as that
    /// slice of the connection's read buffer, not copied (the collector
    /// only validates). Budget and slot as for `Gather`.
    Immediate(bytes::Bytes, Reservation, CommandSlot),
    /// Passed to a double-buffered WRITE's task, which owns the window
    /// slot and the budget ([`crate::iscsi::syncwrite`]); the task ends
    /// when its feed drops.
    Pipe(crate::iscsi::syncwrite::Feed),
    /// Held back by its LUN's QoS ceilings until its place (the throttle)
    /// comes: no R2T and no budget yet; its unsolicited bytes are
    /// gathered. Then it takes its budget and becomes `Gather`.
    Held(CommandSlot, Throttle),
}

impl ConnMachine {
    /// A SCSI Command the window delivered at `now`.
    pub(super) fn scsi_command(&mut self, pdu: Pdu, mut slot: CommandSlot, now: Instant) {
        let Bhs::ScsiCommand(cmd) = pdu.bhs else {
            unreachable!("admitted as a SCSI Command")
        };
        let cdb = pdu.full_cdb().unwrap_or_default();
        let edtl = cmd.expected_data_transfer_length;
        if self.session.is_discovery() {
            // Discovery sessions carry no SCSI commands (RFC 7143 §4.3.1).
            drop(slot);
            self.reject(RejectReason::ProtocolError, pdu.bhs.encode(0, 0).to_vec());
            return;
        }
        // With an Expected Data Transfer Length, R or W says which way the
        // data go (RFC 7143 §11.3.1). Neither would answer a WRITE GOOD
        // with nothing written; both ask for a bidirectional command, which
        // this target does not serve (as LIO does not).
        if edtl > 0 && cmd.read == cmd.write {
            warn!(
                tsih = self.session.tsih,
                itt = cmd.itt,
                edtl,
                read = cmd.read,
                write = cmd.write,
                "SCSI command with a data length and neither or both of R and W: rejected"
            );
            drop(slot);
            self.reject(RejectReason::ProtocolError, pdu.bhs.encode(0, 0).to_vec());
            return;
        }
        // The Initiator Task Tag names the task session-wide while it lives,
        // and 0xffffffff is never a task's (RFC 7143 §11.2.1.8): such a
        // command would take over the running task's place in the task set
        // (its answer lost, task management aimed at the wrong command).
        let clash = if cmd.itt == RESERVED_TAG {
            Some(RejectReason::InvalidPduField)
        } else if self.session.tasks.is_running(cmd.itt) {
            Some(RejectReason::TaskInProgress)
        } else {
            None
        };
        if let Some(reason) = clash {
            warn!(
                tsih = self.session.tsih,
                itt = cmd.itt,
                reason = reason.name(),
                "SCSI command refused for its task tag"
            );
            drop(slot);
            self.reject(reason, pdu.bhs.encode(0, 0).to_vec());
            return;
        }
        if cmd.immediate && self.shared.over_depth() {
            // An immediate command bypasses the CmdSN window, so only this
            // keeps a stream of them (each a task, a WRITE with its data)
            // from growing without bound: past the session's depth the task
            // set is full (SAM-5 5.3.3), and the initiator retries later.
            self.refuse(slot, status_only(&cmd, TASK_SET_FULL, None));
            return;
        }
        if let Some(rdma) = self.rdma.clone() {
            match Descriptor::from_ahs(&pdu.ahs) {
                Ok(Some(desc)) => {
                    self.offloaded(cmd, cdb, desc, rdma, pdu.data.len(), slot, now);
                    return;
                }
                Ok(None) => {}
                Err(e) => {
                    warn!(tsih = self.session.tsih, itt = cmd.itt, error = %e, "bad RDMA descriptor");
                    let pdus = status_only(&cmd, CHECK_CONDITION, Some(bad_descriptor_sense()));
                    self.refuse(slot, pdus);
                    return;
                }
            }
        }
        if !(cmd.write && edtl > 0) {
            self.register_task(&cmd, &mut slot);
            let throttle = self.book_qos(&cmd, &cdb, now);
            let mut ready = Ready::without_data(cmd, cdb, None, slot);
            ready.throttle = throttle;
            self.run(ready);
            return;
        }
        if edtl > self.fabric.settings.max_io_bytes {
            warn!(
                tsih = self.session.tsih,
                itt = cmd.itt,
                edtl,
                "write larger than the target buffers: refused"
            );
            let pdus = status_only(&cmd, CHECK_CONDITION, Some(too_large_sense()));
            self.refuse(slot, pdus);
            return;
        }
        let throttle = match self.book_qos(&cmd, &cdb, now) {
            Some(t)
                if WriteCollector::would_solicit(
                    pdu.data.len() as u32,
                    edtl,
                    cmd.final_bit,
                    self.write_limits,
                ) =>
            {
                if let Some(collector) = self.collector_for(&pdu, &cmd, WriteCollector::new) {
                    self.hold(cmd, cdb, collector, slot, t);
                }
                return;
            }
            t => t,
        };
        let budget = match self.write_budget_for(&cmd) {
            Ok(b) => b,
            Err(status) => {
                self.refuse(slot, status_only(&cmd, status, None));
                return;
            }
        };
        let lease = self.sync_write_lease(&cmd, &cdb);
        // A small WRITE's data usually all come in its command PDU: then
        // nothing is gathered, and the command runs on the PDU's bytes.
        let whole_immediate = lease.is_none() && pdu.data.len() == edtl as usize;
        let make = if lease.is_some() || whole_immediate {
            WriteCollector::validating
        } else {
            WriteCollector::new
        };
        let Some(collector) = self.collector_for(&pdu, &cmd, make) else {
            return;
        };
        self.register_task(&cmd, &mut slot);
        let mut qos = throttle;
        let dest = match lease {
            Some((path, lease)) => {
                let (feed, rx) = crate::iscsi::syncwrite::feed();
                feed.data(0, pdu.data.clone());
                self.out.push(Action::StartPipedWrite(PipedWrite {
                    cmd,
                    cdb: cdb.clone(),
                    path,
                    lease,
                    budget,
                    slot,
                    feed: rx,
                    throttle: qos.take(),
                }));
                WriteDest::Pipe(feed)
            }
            None if whole_immediate => WriteDest::Immediate(pdu.data, budget, slot),
            None => WriteDest::Gather(budget, slot),
        };
        self.advance_write(
            Collecting {
                cmd,
                cdb,
                collector,
                dest,
                qos,
                data_due: None,
            },
            now,
            true,
        );
    }

    /// `cmd`'s place at its LUN's QoS ceilings (and the session's
    /// initiator's own there), booked at `now`, when it must wait for it.
    fn book_qos(&self, cmd: &ScsiCommand, cdb: &[u8], now: Instant) -> Option<Throttle> {
        let target = self.session.target.as_ref()?;
        Throttle::book(
            &target.luns,
            cmd,
            cdb,
            &self.session.initiator_name,
            self.session.initiator_io.as_ref(),
            now,
        )
    }

    /// A collector (made by `make`) for the WRITE `cmd` arriving in `pdu`;
    /// None when its immediate data breaks the negotiated limits: the PDU
    /// is then rejected, and the command never runs.
    fn collector_for(
        &mut self,
        pdu: &Pdu,
        cmd: &ScsiCommand,
        make: MakeCollector,
    ) -> Option<WriteCollector> {
        let edtl = cmd.expected_data_transfer_length;
        match make(edtl, &pdu.data, cmd.final_bit, self.write_limits) {
            Ok(c) => Some(c),
            Err(e) => {
                warn!(tsih = self.session.tsih, itt = cmd.itt, error = %e, "bad immediate data");
                self.reject(RejectReason::ProtocolError, pdu.bhs.encode(0, 0).to_vec());
                None
            }
        }
    }

    /// Holds a WRITE whose place at its LUN's ceilings (`throttle`) is
    /// still to come: it gathers its unsolicited data, and asks for the
    /// rest when [`Self::release_held_writes`] finds its place come.
    fn hold(
        &mut self,
        cmd: ScsiCommand,
        cdb: Vec<u8>,
        collector: WriteCollector,
        mut slot: CommandSlot,
        throttle: Throttle,
    ) {
        self.register_task(&cmd, &mut slot);
        self.held.insert((throttle.due(), cmd.itt));
        debug!(
            tsih = self.session.tsih,
            itt = cmd.itt,
            "WRITE held by its LUN's QoS ceiling: R2Ts wait for its place"
        );
        self.collectors.insert(
            cmd.itt,
            Collecting {
                cmd,
                cdb,
                collector,
                dest: WriteDest::Held(slot, throttle),
                qos: None,
                data_due: None,
            },
        );
    }

    /// Held WRITEs whose place came by `now` take their share of the write
    /// budget and ask for their data; one aborted meanwhile is forgotten
    /// (its place given back). With the budget full the WRITE ends TASK
    /// SET FULL, as it would have had it come now. One whose wait at its
    /// initiator's ceilings ended books its place at the LUN's, and waits
    /// on when that is still to come.
    pub(super) fn release_held_writes(&mut self, now: Instant) {
        while let Some(&(due, itt)) = self.held.first() {
            if due > now {
                break;
            }
            self.held.pop_first();
            // An entry whose ITT now names a later command is stale.
            if let Some((mut ready, mut t)) = self.held_offloads.remove(&itt) {
                if t.due() != due {
                    self.held_offloads.insert(itt, (ready, t));
                } else if let Some(later) = t.advance(now) {
                    self.held.insert((later, itt));
                    self.held_offloads.insert(itt, (ready, t));
                } else if let Some((budget, slot)) = self.share_at_turn(&ready.cmd, ready.slot, t) {
                    ready.slot = slot;
                    ready.budget = Some(budget);
                    self.run(ready);
                }
                continue;
            }
            let Some(mut c) = self.collectors.remove(&itt) else {
                continue;
            };
            match c.dest {
                WriteDest::Held(slot, mut t) if t.due() == due => {
                    if let Some(later) = t.advance(now) {
                        self.held.insert((later, itt));
                        c.dest = WriteDest::Held(slot, t);
                        self.collectors.insert(itt, c);
                    } else if let Some((budget, slot)) = self.share_at_turn(&c.cmd, slot, t) {
                        c.dest = WriteDest::Gather(budget, slot);
                        self.advance_write(c, now, true);
                    }
                }
                _ => {
                    self.collectors.insert(itt, c);
                }
            }
        }
    }

    /// A held WRITE's place (`t`) came: its share of the write budget, its
    /// wait settled; None when it was aborted meanwhile (forgotten, its
    /// place given back) or the budget is full (answered TASK SET FULL).
    fn share_at_turn(
        &mut self,
        cmd: &ScsiCommand,
        slot: CommandSlot,
        t: Throttle,
    ) -> Option<(Reservation, CommandSlot)> {
        if slot.is_aborted() || !self.session.tasks.contains(cmd.itt) {
            return None;
        }
        let budget = match self.write_budget_for(cmd) {
            Ok(b) => b,
            Err(status) => {
                self.refuse(slot, status_only(cmd, status, None));
                return None;
            }
        };
        t.settle();
        Some((budget, slot))
    }

    /// Runs `ready`, unless it was aborted (e.g. by another initiator's
    /// LUN reset) before its data was complete: then it is never executed,
    /// and dropping it frees its window slot.
    fn run(&mut self, ready: Ready) {
        if !ready.slot.is_aborted() {
            self.out.push(Action::Run(ready));
        }
    }

    /// A command whose data moves by RDMA (its descriptor AHS names the
    /// initiator's buffers): no immediate data, no R2T, no Data-In.
    fn offloaded(
        &mut self,
        cmd: ScsiCommand,
        cdb: Vec<u8>,
        desc: Descriptor,
        rdma: Arc<Slot>,
        immediate_len: usize,
        mut slot: CommandSlot,
        now: Instant,
    ) {
        let edtl = cmd.expected_data_transfer_length;
        let dir_ok = match desc.dir {
            Direction::Read => cmd.read && !cmd.write,
            Direction::Write => cmd.write && !cmd.read,
        };
        if !dir_ok
            || desc.len() != u64::from(edtl)
            || immediate_len != 0
            || edtl > self.fabric.settings.max_io_bytes
        {
            warn!(
                tsih = self.session.tsih,
                itt = cmd.itt,
                edtl,
                described = desc.len(),
                "RDMA descriptor does not fit the command: refused"
            );
            let pdus = status_only(&cmd, CHECK_CONDITION, Some(bad_descriptor_sense()));
            self.refuse(slot, pdus);
            return;
        }
        let throttle = match (desc.dir, self.book_qos(&cmd, &cdb, now)) {
            (Direction::Write, Some(t)) => {
                // Held back by its LUN's ceilings: its data is read, and its
                // share of the budget taken, when its place comes.
                self.register_task(&cmd, &mut slot);
                self.held.insert((t.due(), cmd.itt));
                let itt = cmd.itt;
                let ready = Ready::without_data(cmd, cdb, Some((rdma, desc)), slot);
                self.held_offloads.insert(itt, (ready, t));
                return;
            }
            (_, t) => t,
        };
        // WRITE data read in by RDMA is held like data gathered from Data-Out
        // until the command ends, so it counts against the same budget.
        let budget = match desc.dir {
            Direction::Write => match self.write_budget_for(&cmd) {
                Ok(r) => Some(r),
                Err(status) => {
                    self.refuse(slot, status_only(&cmd, status, None));
                    return;
                }
            },
            Direction::Read => None,
        };
        self.register_task(&cmd, &mut slot);
        let mut ready = Ready::without_data(cmd, cdb, Some((rdma, desc)), slot);
        ready.budget = budget;
        ready.throttle = throttle;
        self.run(ready);
    }

    /// `cmd`'s share of the connection's write budget (its whole Expected
    /// Data Transfer Length), or the status that refuses it when it does
    /// not fit: TASK SET FULL when the connection's own WRITEs fill its
    /// budget, or when the fabric's is full while the session has other
    /// commands in the task set; BUSY when the fabric's is full and the
    /// session has none (SAM-5 5.3: TASK SET FULL tells the initiator its
    /// own commands fill the task set). The initiator retries the command
    /// later either way.
    fn write_budget_for(&self, cmd: &ScsiCommand) -> Result<Reservation, u8> {
        let edtl = cmd.expected_data_transfer_length;
        let refused = match self.write_budget.reserve(u64::from(edtl)) {
            Ok(share) => return Ok(share),
            Err(refused) => refused,
        };
        let status = match refused {
            Refused::EnclosingFull if !self.session.tasks.any_other_than(cmd.itt) => BUSY,
            _ => TASK_SET_FULL,
        };
        debug!(
            tsih = self.session.tsih,
            itt = cmd.itt,
            edtl,
            ?refused,
            status,
            "write data budget full"
        );
        Err(status)
    }

    /// The LUN's double-buffered write path and a buffer for this WRITE,
    /// when it can take that path (no I/O, never waits).
    fn sync_write_lease(
        &self,
        cmd: &ScsiCommand,
        cdb: &[u8],
    ) -> Option<(
        Arc<crate::iscsi::syncwrite::SyncWriteLun>,
        crate::datapath::BufLease,
    )> {
        let target = self.session.target.as_ref()?;
        let path = self
            .fabric
            .sync_writes
            .get(&target.name, cmd.lun.index()?)?;
        let stats = &self.fabric.sync_writes.stats;
        let lease = crate::iscsi::syncwrite::lease_for(&path, stats, &target.luns, cmd, cdb)?;
        Some((path, lease))
    }

    /// Registers `cmd` in the session's task set, as `slot`'s task.
    fn register_task(&self, cmd: &ScsiCommand, slot: &mut CommandSlot) {
        slot.register(&self.session, cmd.itt, cmd.lun.index().unwrap_or(u16::MAX));
    }

    /// Asks for the next bursts of `c`'s data, within MaxOutstandingR2T.
    fn send_r2ts(&mut self, c: &mut Collecting) {
        let last = &mut self.next_ttt;
        let reqs = c.collector.next_r2ts(|| super::next_ttt_after(last));
        for r in reqs {
            self.send(Pdu::new(Bhs::R2t(R2t {
                lun: c.cmd.lun,
                itt: c.cmd.itt,
                ttt: r.ttt,
                stat_sn: 0,
                exp_cmd_sn: 0,
                max_cmd_sn: 0,
                r2t_sn: r.r2t_sn,
                buffer_offset: r.offset,
                desired_data_transfer_length: r.length,
            })));
        }
    }

    /// A Data-Out PDU, at `now`.
    pub(super) fn data_out(&mut self, d: DataOut, data: bytes::Bytes, now: Instant) {
        if !self.session.tasks.contains(d.itt) {
            // Aborted from elsewhere (another initiator's LUN reset or
            // PREEMPT AND ABORT) while its data was arriving: drop the
            // partial data and free the window slot now.
            self.collectors.remove(&d.itt);
            return;
        }
        let Some(mut c) = self.collectors.remove(&d.itt) else {
            // Data for a task that was aborted, or never existed.
            debug!(
                tsih = self.session.tsih,
                itt = d.itt,
                "Data-Out for no pending write: ignored"
            );
            return;
        };
        if let Err(e) =
            c.collector
                .on_data_out(d.ttt, d.data_sn, d.buffer_offset, &data, d.final_bit)
        {
            // The command fails and is never executed, so no byte of it
            // reaches the disk; the connection stays up (libiscsi's
            // iSCSIDataSnInvalid expects exactly this). Later Data-Out PDUs
            // of the same task find no collector and are dropped.
            warn!(tsih = self.session.tsih, itt = d.itt, error = %e, "Data-Out sequence error: command failed");
            let r2ts = c.collector.r2t_count();
            match c.dest {
                // Its task answers once its chunk writes ended (some may
                // have reached the disk: see syncwrite).
                WriteDest::Pipe(feed) => feed.failed(r2ts),
                // Forgotten, its window slot freed, before the status leaves.
                WriteDest::Gather(_, slot)
                | WriteDest::Immediate(_, _, slot)
                | WriteDest::Held(slot, _) => {
                    let pdus = status_after_r2ts(
                        &c.cmd,
                        CHECK_CONDITION,
                        Some(data_phase_error_sense()),
                        r2ts,
                    );
                    self.refuse(slot, pdus);
                }
            }
            return;
        }
        // An empty Data-Out brings nothing: it does not restart the wait,
        // or one every 29 s would hold a WRITE's buffer for good.
        let brought_data = !data.is_empty();
        if brought_data {
            self.last_data_out = now;
        }
        if let WriteDest::Pipe(feed) = &c.dest {
            feed.data(d.buffer_offset, data);
        }
        self.advance_write(c, now, brought_data);
    }

    /// A WRITE whose data is complete runs; otherwise it asks for more data
    /// (R2Ts within MaxOutstandingR2T, unless it is held) and waits for it,
    /// until [`Self::data_out_timeout`] from `now` when `fresh` (it began
    /// waiting, or data came) or it had no due yet.
    fn advance_write(&mut self, mut c: Collecting, now: Instant, fresh: bool) {
        let held = matches!(c.dest, WriteDest::Held(..));
        if !c.collector.is_complete() || held {
            if !held {
                self.send_r2ts(&mut c);
            }
            if !held && (fresh || c.data_due.is_none()) {
                let due = now + self.data_out_timeout();
                c.data_due = Some(due);
                self.next_data_out_check =
                    Some(self.next_data_out_check.map_or(due, |d| d.min(due)));
            }
            self.collectors.insert(c.cmd.itt, c);
            return;
        }
        let r2t_count = c.collector.r2t_count();
        match c.dest {
            WriteDest::Gather(budget, slot) => self.run(Ready {
                cmd: c.cmd,
                cdb: c.cdb,
                r2t_count,
                data_out: c.collector.into_data().into(),
                offload: None,
                budget: Some(budget),
                throttle: c.qos,
                slot,
            }),
            WriteDest::Immediate(data, budget, slot) => self.run(Ready {
                cmd: c.cmd,
                cdb: c.cdb,
                r2t_count,
                data_out: data,
                offload: None,
                budget: Some(budget),
                throttle: c.qos,
                slot,
            }),
            WriteDest::Pipe(feed) => feed.complete(r2t_count),
            WriteDest::Held(..) => unreachable!("a held WRITE is kept above"),
        }
    }

    /// Forgets the WRITEs among `itts` still waiting for data (aborted:
    /// never executed; dropping a gathered one frees its window slot, a
    /// piped one's task ends when its feed drops).
    pub(super) fn drop_collectors(&mut self, itts: &[u32]) {
        for itt in itts {
            self.collectors.remove(itt);
            self.held_offloads.remove(itt);
        }
    }

    /// How long a WRITE may wait for Data-Out while none comes on its
    /// connection: the NOP timeout, at least [`DATA_OUT_TIMEOUT_FLOOR`].
    fn data_out_timeout(&self) -> Duration {
        self.fabric.settings.nop_timeout.max(DATA_OUT_TIMEOUT_FLOOR)
    }

    /// Whether a WRITE's Data-Out is overdue at `now`: the initiator sent
    /// none of the data its R2T asked for (or its unsolicited data
    /// promised) for [`Self::data_out_timeout`], and no Data-Out of any
    /// WRITE came on the connection meanwhile either (a slow link's
    /// initiator sending the earlier WRITEs' data first is not stalled).
    /// At ErrorRecoveryLevel 0 there is no recovery R2T to send (RFC 7143
    /// §7.1.4.1, §7.11), so the connection ends, as LIO's Data-Out timer
    /// ends it: the WRITEs' buffers and their shares of the write budgets
    /// are given back, and the initiator logs in again and retries.
    /// Without this, an initiator that answers pings but never sends the
    /// data held both for the connection's life.
    ///
    /// A stall is seen twice, [`DATA_OUT_STALL_CONFIRM`] apart, before the
    /// connection ends: the driver may have been busy past the deadline
    /// (waiting for aborted commands, a full writer queue) with Data-Out
    /// unread in the socket, and it reads that before the second look.
    pub(super) fn data_out_overdue(&mut self, now: Instant) -> bool {
        if self.next_data_out_check.is_none_or(|at| at > now) {
            return false;
        }
        let waiting = self
            .collectors
            .values()
            .filter_map(|c| Some((c.data_due?, c.cmd.itt)))
            .min();
        let Some((due, itt)) = waiting else {
            self.next_data_out_check = None;
            self.data_out_stall_seen = false;
            return false;
        };
        let overdue_at = due.max(self.last_data_out + self.data_out_timeout());
        if overdue_at > now {
            self.next_data_out_check = Some(overdue_at);
            self.data_out_stall_seen = false;
            return false;
        }
        if !self.data_out_stall_seen {
            self.data_out_stall_seen = true;
            self.next_data_out_check = Some(now + DATA_OUT_STALL_CONFIRM);
            return false;
        }
        warn!(
            tsih = self.session.tsih,
            initiator = %self.session.initiator_name,
            itt,
            waited = ?self.data_out_timeout(),
            "no Data-Out for a WRITE waiting for its data within the NOP timeout (nop_timeout_secs, at least 30 s): dropping the connection"
        );
        true
    }

    /// WRITEs waiting for data.
    #[cfg(test)]
    pub(super) fn collecting(&self) -> usize {
        self.collectors.len()
    }
}

/// The least time a WRITE may wait for Data-Out while none comes on its
/// connection, whatever the NOP timeout: a short NOP timeout finds a dead
/// peer sooner, but a WRITE's data wait behind the earlier WRITEs' on the
/// initiator's side and behind the Data-In ahead of its R2T on the target's.
pub(super) const DATA_OUT_TIMEOUT_FLOOR: Duration = Duration::from_secs(30);

/// How long after a Data-Out stall is first seen it is looked at again
/// before the connection ends (see [`ConnMachine::data_out_overdue`]).
pub(super) const DATA_OUT_STALL_CONFIRM: Duration = Duration::from_secs(1);

/// How a WRITE's collector is made: gathering its bytes, or only checking
/// them ([`WriteCollector::new`], [`WriteCollector::validating`]).
type MakeCollector = fn(
    u32,
    &[u8],
    bool,
    crate::iscsi::dataout::WriteLimits,
) -> Result<WriteCollector, crate::iscsi::dataout::DataOutError>;

/// Sense data for an RDMA descriptor that does not match its command:
/// ILLEGAL REQUEST, INVALID FIELD IN CDB.
fn bad_descriptor_sense() -> Vec<u8> {
    use blockwire_pdu::scsi::{Asc, Sense, SenseFormat};
    Sense::illegal_request(Asc::INVALID_FIELD_IN_CDB, None).encode(SenseFormat::Fixed)
}

/// Sense data for a transfer larger than the target will buffer: ILLEGAL
/// REQUEST, INVALID FIELD IN CDB, pointing at the transfer length.
fn too_large_sense() -> Vec<u8> {
    use blockwire_pdu::scsi::{Asc, FieldPointer, Sense, SenseFormat};
    Sense::illegal_request(Asc::INVALID_FIELD_IN_CDB, Some(FieldPointer::cdb(7, None)))
        .encode(SenseFormat::Fixed)
}
