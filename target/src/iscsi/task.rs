//! What every SCSI command task takes from its connection, and how such a
//! task ends.
//!
//! A command runs as a tokio task apart from the connection's reader: on
//! the generic path ([`super::connection`]: the core on the blocking pool),
//! or on one of the data paths ([`super::sendfile`], [`super::syncread`],
//! [`super::syncwrite`]). Each carries a [`CommandContext`]: the command
//! and its CDB, the LUN table and I_T nexus the core needs, the session
//! whose task set tracks it, the connection's shared state (its CmdSN
//! window), the writer queue and the negotiated Data-In limits, and the
//! task's abort flag.
//!
//! Ending a task always goes the same way, in this order:
//! 1. [`CommandContext::finish`]: the task turns "completing" in the task
//!    set (from then on an abort leaves it alone), unless it was aborted
//!    already, and the command's window slot is freed (exactly once per
//!    command, aborted or not);
//! 2. only if it was not aborted: its last PDUs are queued to the writer
//!    and the task is forgotten ([`CommandContext::send_and_forget`]).
//!
//! [`CommandContext::answer`] does both. Abort checks between PDUs sent
//! before the end use [`TaskSet::while_live`](super::session::TaskSet::while_live).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use blockwire_pdu::pdu::ScsiCommand;
use blockwire_pdu::scsi::{Asc, Sense, SenseFormat, SenseKey};
use blockwire_pdu::Pdu;
use tokio::sync::mpsc;

use super::connection::{Outgoing, Shared};
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
    pub fn in_core<T>(&self, f: impl FnOnce() -> T) -> T {
        crate::scsi::abortable(&self.aborted, f)
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
        let mine = self.session.tasks.finish(self.cmd.itt, &self.aborted);
        self.shared.complete();
        mine
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
        self.session.tasks.done(self.cmd.itt, &self.aborted);
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
        tracing::error!(itt = self.cmd.itt, error = %e, "SCSI command panicked");
        internal_failure()
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
