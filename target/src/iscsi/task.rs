//! What every SCSI command task takes from its connection, and how such a
//! task ends.
//!
//! A command runs as a tokio task apart from the connection's reader (or, when
//! it never has to wait, to its end on the reader, see
//! [`super::launch`]): on the generic path ([`super::connection`]: the core on the blocking pool),
//! or on one of the data paths ([`super::sendfile`], [`super::syncread`],
//! [`super::syncwrite`]). Each carries a [`CommandContext`]: the command
//! and its CDB, the LUN table and I_T nexus the core needs, the session
//! whose task set tracks it, the connection's shared state (its CmdSN
//! window), the writer queue and the negotiated Data-In limits, and the
//! task's abort flag.
//!
//! The command's CmdSN window slot and its entry in the session's task set
//! are owned by a [`CommandSlot`], made when the window admits the command
//! (RFC 7143 §4.2.2.1: MaxCmdSN advances when it is released). Whoever
//! holds the command holds its slot: the reader while a WRITE's data
//! arrive, then the command's task. Dropping the slot frees the window
//! slot and forgets the task, so no path (answered, refused, aborted,
//! panicked, connection gone) can leak it or free it twice.
//!
//! Ending a task always goes the same way, in this order:
//! 1. [`CommandContext::finish`]: the task turns "completing" in the task
//!    set (from then on an abort leaves it alone), unless it was aborted
//!    already, and the command's window slot is freed, before its last
//!    PDUs are queued, so they carry the MaxCmdSN it opened;
//! 2. only if it was not aborted: its last PDUs are queued to the writer
//!    and the task is forgotten ([`CommandContext::send_and_forget`]).
//!
//! [`CommandContext::answer`] does both. Abort checks between PDUs sent
//! before the end use [`TaskSet::while_live`](super::session::TaskSet::while_live).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use blockwire_pdu::pdu::ScsiCommand;
use blockwire_pdu::scsi::{Asc, Sense, SenseFormat, SenseKey};
use blockwire_pdu::Pdu;
use tokio::sync::mpsc;

use super::connection::Outgoing;
use super::machine::Shared;
use super::response::DataInLimits;
use super::session::Session;
use crate::scsi::{ItNexus, LunTable, ScsiRequest, ScsiResult};

/// Everything a command's task needs from its connection.
pub(super) struct CommandContext {
    pub cmd: ScsiCommand,
    pub cdb: Vec<u8>,
    pub luns: Arc<LunTable>,
    pub nexus: ItNexus,
    pub session: Arc<Session>,
    pub shared: Arc<Shared>,
    /// The connection's writer queue.
    pub tx: mpsc::Sender<Outgoing>,
    pub limits: DataInLimits,
    /// Set when the task is aborted (task management, PREEMPT AND ABORT,
    /// connection loss).
    pub aborted: Arc<AtomicBool>,
    /// The command's window slot and task-set entry, released when the
    /// context is dropped (or, the window slot, at [`Self::finish`]).
    pub slot: CommandSlot,
}

impl CommandContext {
    /// The command's Initiator Task Tag.
    pub fn itt(&self) -> u32 {
        self.cmd.itt
    }

    /// Whether the task was aborted.
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// Runs `f`, this command's calls into the SCSI core (on a blocking
    /// thread), under the task's abort flag: a media command held by a
    /// stalled LUN gives up as soon as the task is aborted, so it never
    /// reaches the backstore (see [`crate::scsi::stall`]).
    ///
    /// A command that may change the medium (anything but READ, VERIFY,
    /// PRE-FETCH, GET LBA STATUS) is counted in its task's entry while `f`
    /// runs, and the count is raised before `f` looks at the abort flag: an
    /// abort that came too late to stop it waits for it before it is
    /// answered (see [`super::launch::Launcher::await_aborted`]). A WRITE
    /// the core was writing when its ABORT TASK was answered "Function
    /// complete" could otherwise land after a later WRITE of the same
    /// blocks, the aborted data winning.
    pub fn in_core<T>(&self, f: impl FnOnce() -> T) -> T {
        let _counted = ChangingMedium::enter(
            self.slot
                .changing_medium()
                .filter(|_| !crate::scsi::stall::only_reads_the_medium(&self.cdb))
                .map(|n| &**n),
        );
        crate::scsi::abortable(&self.aborted, f)
    }

    /// Counts this command as one that may change the medium for as long
    /// as the returned guard lives, as [`Self::in_core`] does for one core
    /// call: a pipelined WRITE holds it from before it first looks at its
    /// abort flag until its last chunk write ended, so an abort from any
    /// session (CLEAR TASK SET from another initiator) waits for those
    /// writes before it is answered.
    pub fn changing_medium(&self) -> ChangingMedium<Arc<AtomicUsize>> {
        ChangingMedium::enter(self.slot.changing_medium().cloned())
    }

    /// The core's request for this command, with the WRITE data
    /// `data_out` and room for `data_in_capacity` bytes of READ data.
    pub fn request<'a>(&'a self, data_out: &'a [u8], data_in_capacity: u32) -> ScsiRequest<'a> {
        ScsiRequest {
            lun: self.cmd.lun.index().unwrap_or(u16::MAX),
            cdb: &self.cdb,
            nexus: &self.nexus,
            task_tag: self.cmd.itt,
            attr: self.cmd.attr,
            data_out,
            data_in_capacity,
            initiator_stats: self.session.initiator_io.as_ref(),
        }
    }

    /// [`Self::request`] of a READ: no data out, room for the Expected Data
    /// Transfer Length.
    pub fn read_request(&self) -> ScsiRequest<'_> {
        self.request(&[], self.cmd.expected_data_transfer_length)
    }

    /// Ends the task in the task set and frees its window slot. Returns
    /// false if it was aborted: then nothing more of it may be sent.
    pub fn finish(&self) -> bool {
        self.slot.finish()
    }

    /// Queues a finished task's last `items` to the writer (stopping if the
    /// connection is gone), then forgets the task. Call only after
    /// [`Self::finish`] returned true.
    pub async fn send_and_forget(&self, items: impl IntoIterator<Item = Outgoing>) {
        for item in items {
            if self.tx.send(item).await.is_err() {
                break;
            }
        }
        self.slot.forget();
    }

    /// [`Self::finish`], then, if the task was not aborted, sends the PDUs
    /// `pdus` builds (built only then: building may count copies) and
    /// forgets the task. Returns whether the task was not aborted.
    pub async fn answer(&self, pdus: impl FnOnce() -> Vec<Pdu>) -> bool {
        if !self.finish() {
            return false;
        }
        self.send_and_forget(pdus().into_iter().map(Outgoing::Pdu))
            .await;
        true
    }

    /// Logs a panic of the SCSI core (or of a blocking step) running this
    /// command and returns the answer that replaces its result, so the
    /// initiator is not left waiting.
    pub fn panicked(&self, e: &tokio::task::JoinError) -> ScsiResult {
        if e.is_cancelled() {
            // The runtime is shutting down with the command's blocking step
            // still queued: not a fault of the command.
            tracing::debug!(
                itt = self.cmd.itt,
                "SCSI command cancelled: the target is stopping"
            );
        } else {
            tracing::error!(itt = self.cmd.itt, error = %e, "SCSI command panicked");
        }
        internal_failure()
    }
}

/// One admitted command's CmdSN window slot and, once the command is
/// registered, its entry in the session's task set. Made by the window
/// ([`Shared::admit`]); dropping it frees the window slot (unless
/// [`CommandSlot::finish`] did already) and forgets the task (unless it was
/// aborted, or forgotten, already).
pub(super) struct CommandSlot {
    shared: Arc<Shared>,
    /// The window slot was freed.
    freed: AtomicBool,
    task: Option<TaskEntry>,
}

/// One count in a task's entry of work that may change the medium (see
/// [`CommandContext::in_core`]), taken when made, given back when dropped.
pub(super) struct ChangingMedium<N: std::ops::Deref<Target = AtomicUsize>>(Option<N>);

impl<N: std::ops::Deref<Target = AtomicUsize>> ChangingMedium<N> {
    fn enter(count: Option<N>) -> Self {
        if let Some(n) = &count {
            n.fetch_add(1, Ordering::SeqCst);
        }
        ChangingMedium(count)
    }
}

impl<N: std::ops::Deref<Target = AtomicUsize>> Drop for ChangingMedium<N> {
    fn drop(&mut self) {
        if let Some(n) = &self.0 {
            n.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A registered task: which entry of which task set is this command's.
struct TaskEntry {
    session: Arc<Session>,
    itt: u32,
    aborted: Arc<AtomicBool>,
    changing_medium: Arc<AtomicUsize>,
}

impl std::fmt::Debug for CommandSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandSlot")
            .field("freed", &self.freed)
            .field("itt", &self.task.as_ref().map(|t| t.itt))
            .finish()
    }
}

impl CommandSlot {
    /// The slot of a command the window just delivered (the window counts
    /// it in flight already).
    pub(super) fn taken(shared: Arc<Shared>) -> CommandSlot {
        CommandSlot {
            shared,
            freed: AtomicBool::new(false),
            task: None,
        }
    }

    /// Registers the command as task `itt` on `lun` in `session`'s task
    /// set; returns its abort flag.
    pub fn register(&mut self, session: &Arc<Session>, itt: u32, lun: u16) -> Arc<AtomicBool> {
        let (aborted, changing_medium) = session.tasks.insert(itt, lun);
        self.task = Some(TaskEntry {
            session: session.clone(),
            itt,
            aborted: aborted.clone(),
            changing_medium,
        });
        aborted
    }

    /// The registered task's count of core calls that may change the
    /// medium (see [`CommandContext::in_core`]).
    fn changing_medium(&self) -> Option<&Arc<AtomicUsize>> {
        self.task.as_ref().map(|t| &t.changing_medium)
    }

    /// The registered task's abort flag.
    pub fn abort_flag(&self) -> Option<&Arc<AtomicBool>> {
        self.task.as_ref().map(|t| &t.aborted)
    }

    /// Whether the registered task was aborted (an unregistered command
    /// never is).
    pub fn is_aborted(&self) -> bool {
        self.abort_flag().is_some_and(|f| f.load(Ordering::SeqCst))
    }

    /// Frees the window slot, the first time only.
    fn free_window(&self) {
        if !self.freed.swap(true, Ordering::AcqRel) {
            self.shared.complete();
        }
    }

    /// The task's result is ready: it turns "completing" in the task set
    /// unless it was aborted, and the window slot is freed. Returns false
    /// if it was aborted (then nothing more of it may be sent).
    pub fn finish(&self) -> bool {
        let mine = match &self.task {
            Some(t) => t.session.tasks.finish(t.itt, &t.aborted),
            None => true,
        };
        self.free_window();
        mine
    }

    /// The task's last PDUs are queued: forget it (its window slot goes
    /// too, if [`Self::finish`] did not free it).
    pub fn forget(&self) {
        self.free_window();
        if let Some(t) = &self.task {
            t.session.tasks.done(t.itt, &t.aborted);
        }
    }
}

impl Drop for CommandSlot {
    fn drop(&mut self) {
        self.forget();
    }
}

/// CHECK CONDITION with `sense`, no data.
fn check_condition(sense: Vec<u8>) -> ScsiResult {
    ScsiResult {
        status: 0x02,
        sense: Some(sense),
        data_in: Vec::new(),
        transfer_length: 0,
    }
}

/// HARDWARE ERROR, INTERNAL TARGET FAILURE (44/00), for a panic in the core.
pub(super) fn internal_failure_sense() -> Vec<u8> {
    Sense::new(SenseKey::HardwareError, Asc::new(0x44, 0x00)).encode(SenseFormat::Fixed)
}

/// [`internal_failure_sense`] as a CHECK CONDITION result.
pub(super) fn internal_failure() -> ScsiResult {
    check_condition(internal_failure_sense())
}

/// ABORTED COMMAND, DATA PHASE ERROR (4B/00): a WRITE whose Data-Out PDUs
/// broke the sequence rules, or data RDMA could not move.
pub(super) fn data_phase_error_sense() -> Vec<u8> {
    Sense::new(SenseKey::AbortedCommand, Asc::new(0x4b, 0x00)).encode(SenseFormat::Fixed)
}

/// [`data_phase_error_sense`] as a CHECK CONDITION result.
pub(super) fn data_phase_error() -> ScsiResult {
    check_condition(data_phase_error_sense())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iscsi::machine::Admitted;
    use crate::iscsi::session::{SessionRequest, SessionTable};
    use crate::iscsi::window::Admission;
    use blockwire_pdu::pdu::{NopOut, RESERVED_TAG};
    use blockwire_pdu::{Bhs, Lun};

    fn session() -> Arc<Session> {
        SessionTable::default()
            .attach(SessionRequest {
                initiator_name: "iqn.2026-01.test:ini".into(),
                isid: [0x80, 0, 0, 0, 0, 1],
                tsih: 0,
                cid: 0,
                target: None,
                tpgt: 1,
                portal: "127.0.0.1:3260".parse().unwrap(),
                peer: None,
                params: Default::default(),
            })
            .unwrap()
    }

    /// Admits one immediate request and returns its slot.
    fn admit(shared: &Arc<Shared>) -> CommandSlot {
        let nop = Admitted::Nop(Pdu::new(Bhs::NopOut(NopOut {
            immediate: true,
            lun: Lun::default(),
            itt: 1,
            ttt: RESERVED_TAG,
            cmd_sn: 0,
            exp_stat_sn: 0,
        })));
        match shared.admit(0, true, nop) {
            Admission::Deliver(mut v) => v.pop().unwrap().1,
            other => panic!("not delivered: {other:?}"),
        }
    }

    /// A window with `other` commands in flight besides the one under
    /// test, so a double free would show (the window's count saturates at
    /// zero).
    fn window_with(other: usize) -> (Arc<Shared>, Vec<CommandSlot>) {
        let shared = Shared::new(
            0,
            8,
            1 << 20,
            crate::iscsi::budget::ReadBudget::new(1 << 20),
        );
        let held = (0..other).map(|_| admit(&shared)).collect();
        (shared, held)
    }

    #[test]
    fn answered_task_frees_one_slot_and_is_forgotten() {
        let (shared, _held) = window_with(2);
        let s = session();
        let mut slot = admit(&shared);
        slot.register(&s, 7, 0);
        assert_eq!(shared.in_flight(), 3);
        assert!(s.tasks.contains(7));
        assert!(slot.finish(), "not aborted: may answer");
        assert_eq!(shared.in_flight(), 2, "freed before the answer is queued");
        slot.forget();
        assert!(!s.tasks.contains(7));
        drop(slot);
        assert_eq!(shared.in_flight(), 2, "finish, forget and drop free once");
    }

    #[test]
    fn unregistered_refused_command_frees_one_slot() {
        let (shared, _held) = window_with(1);
        let slot = admit(&shared);
        assert!(!slot.is_aborted());
        drop(slot);
        assert_eq!(shared.in_flight(), 1);
    }

    #[test]
    fn aborted_task_frees_one_slot() {
        let (shared, _held) = window_with(1);
        let s = session();
        let mut slot = admit(&shared);
        let flag = slot.register(&s, 9, 3);
        let out = s.tasks.abort_where(|_, lun| lun == 3);
        assert_eq!(out.aborted, vec![9]);
        assert!(flag.load(Ordering::SeqCst) && slot.is_aborted());
        assert!(!slot.finish(), "aborted: nothing more may be sent");
        drop(slot);
        assert_eq!(shared.in_flight(), 1);
    }

    #[test]
    fn dropped_task_leaves_a_newer_task_of_the_same_tag_alone() {
        let (shared, _held) = window_with(0);
        let s = session();
        let mut old = admit(&shared);
        old.register(&s, 5, 0);
        s.tasks.abort_where(|_, _| true);
        let mut new = admit(&shared);
        new.register(&s, 5, 0);
        drop(old);
        assert!(
            s.tasks.contains(5),
            "the old slot forgets only its own task"
        );
        assert_eq!(shared.in_flight(), 1);
        drop(new);
        assert!(!s.tasks.contains(5));
        assert_eq!(shared.in_flight(), 0);
    }

    #[test]
    fn panicked_task_frees_one_slot_and_is_forgotten() {
        let (shared, _held) = window_with(1);
        let s = session();
        let mut slot = admit(&shared);
        slot.register(&s, 11, 0);
        let r = std::thread::spawn(move || {
            let _slot = slot;
            panic!("SCSI core bug (test)");
        })
        .join();
        assert!(r.is_err());
        assert_eq!(shared.in_flight(), 1);
        assert!(!s.tasks.contains(11), "not left running forever");
    }

    #[test]
    fn task_of_a_gone_connection_frees_one_slot() {
        // The connection ends: its tasks are aborted and whatever holds
        // their slots (a WRITE's collector, a running task) is dropped.
        let (shared, held) = window_with(0);
        let s = session();
        let mut slots: Vec<CommandSlot> = held;
        for itt in 0..4 {
            let mut slot = admit(&shared);
            slot.register(&s, itt, 0);
            slots.push(slot);
        }
        assert!(slots[1].finish(), "one was completing already");
        assert_eq!(shared.in_flight(), 3);
        s.tasks.abort_where(|_, _| true);
        drop(slots);
        assert_eq!(shared.in_flight(), 0);
        for itt in 0..4 {
            assert!(!s.tasks.contains(itt));
        }
    }
}
