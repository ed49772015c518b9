//! READs of cached file LUNs sent with `sendfile(2)` (issue 7, part 2): the
//! Data-In payloads go from the page cache to the socket without a
//! user-space buffer or copy.
//!
//! For a LUN with `mode = "cached"` and `zero_copy = true` (the default)
//! and without `sync_send`, on a connection whose DataDigest is off (a
//! digest needs the bytes in memory) and for a command that is not
//! RDMA-offloaded, a READ(10/12/16) is validated by the SCSI core
//! ([`LunTable::plan_read`], the normal path without the data, as in
//! [`super::syncread`]), and each Data-In PDU is then queued as
//! [`Outgoing::FileData`]: the connection's writer sends its header, then
//! its payload by `sendfile` from the LUN's file at the right offset, then
//! the padding. The GOOD status rides on the last Data-In, as in the serial
//! path. Anything the core does not plan (other commands, errors, READ(6))
//! is answered by the normal path.
//!
//! Aborts: each PDU is queued under the task set's lock
//! ([`TaskSet::while_live`](super::session::TaskSet::while_live)), so
//! nothing of an aborted task follows the task management response.
//!
//! The data are read when the writer sends them, not when the command is
//! planned. A WRITE that completes in between (a command the initiator
//! issued while this READ was outstanding, with no ordering between them)
//! may be seen: SCSI allows either order for concurrent SIMPLE tasks.
//!
//! A file that shrank under the LUN (sendfile hits end of file) cannot be
//! answered with an error, because the PDU's header already left: the
//! writer logs an error naming the LUN and drops the connection.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use blockwire_pdu::pdu::ScsiCommand;
use blockwire_pdu::Bhs;
use tokio::sync::mpsc;
use tracing::debug;

use super::connection::{Outgoing, Shared};
use super::datain;
use super::response::{data_in_header, response_pdus, DataInLimits, Residual};
use super::session::Session;
use crate::copies::{self, CopyPath, Counts};
use crate::scsi::read_plan::ReadPlan;
use crate::scsi::{ItNexus, LunTable, ScsiRequest, ScsiResult};

/// One LUN's file, opened once for `sendfile`.
#[derive(Debug)]
pub struct SendfileLun {
    /// The file, opened read-only through the page cache.
    pub file: File,
    /// "target LUN n (path)", for errors.
    pub label: String,
}

/// The fabric's sendfile LUNs, by target name and LUN.
#[derive(Debug, Default)]
pub struct SendfileReads {
    luns: RwLock<HashMap<String, HashMap<u16, Arc<SendfileLun>>>>,
    any: AtomicBool,
}

impl SendfileReads {
    /// Sends READ data of `lun` of `target` from `path` with sendfile.
    /// Returns a line for the start-up log.
    pub fn enable(&self, target: &str, lun: u16, path: &Path) -> io::Result<String> {
        let file = File::open(path)?;
        let label = format!("{target} LUN {lun} ({})", path.display());
        self.luns
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(target.to_owned())
            .or_default()
            .insert(lun, Arc::new(SendfileLun { file, label }));
        self.any.store(true, Ordering::Release);
        Ok(
            "sendfile: Data-In payloads from the page cache to the socket, no user-space copy \
            (copy path on connections with DataDigest)"
                .to_owned(),
        )
    }

    /// The sendfile source of `lun` of `target`, if it has one.
    pub fn get(&self, target: &str, lun: u16) -> Option<Arc<SendfileLun>> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        self.luns
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(target)?
            .get(&lun)
            .cloned()
    }
}

/// Everything one sendfile READ needs from its connection.
pub(super) struct FileReadJob {
    pub cmd: ScsiCommand,
    pub cdb: Vec<u8>,
    pub luns: Arc<LunTable>,
    pub nexus: ItNexus,
    pub session: Arc<Session>,
    pub shared: Arc<Shared>,
    pub tx: mpsc::Sender<Outgoing>,
    pub limits: DataInLimits,
    pub aborted: Arc<AtomicBool>,
    pub lun: Arc<SendfileLun>,
}

/// What the blocking part decided.
enum Step {
    Aborted,
    /// Answered by the normal path; its copies.
    Answer(ScsiResult, Counts),
    /// Send `send` bytes at `offset`; the CDB asked for `len`.
    Send {
        offset: u64,
        len: u64,
        send: u32,
    },
}

fn request(job: &FileReadJob) -> ScsiRequest<'_> {
    ScsiRequest {
        lun: job.cmd.lun.index().unwrap_or(u16::MAX),
        cdb: &job.cdb,
        nexus: &job.nexus,
        task_tag: job.cmd.itt,
        attr: job.cmd.attr,
        data_out: &[],
        data_in_capacity: job.cmd.expected_data_transfer_length,
    }
}

/// Runs `req` through the core, with the copies it made.
fn execute_counted(job: &FileReadJob) -> (ScsiResult, Counts) {
    let _ = copies::take_thread();
    let r = job.luns.execute(&request(job));
    (r, copies::take_thread())
}

fn prepare(job: &FileReadJob) -> Step {
    if job.aborted.load(Ordering::SeqCst) {
        return Step::Aborted;
    }
    let plan = match job.luns.plan_read(&request(job)) {
        ReadPlan::NotPlanned => {
            let (r, c) = execute_counted(job);
            return Step::Answer(r, c);
        }
        ReadPlan::Answer(r) => return Step::Answer(r, Counts::default()),
        ReadPlan::Read(p) => p,
    };
    let send = plan
        .len
        .min(u64::from(job.cmd.expected_data_transfer_length));
    if send == 0 {
        // Nothing to send (Expected Data Transfer Length 0): the normal
        // path reports the residual.
        let (r, c) = execute_counted(job);
        return Step::Answer(r, c);
    }
    Step::Send {
        offset: plan.offset,
        len: plan.len,
        send: send as u32,
    }
}

/// Answers the way the serial path does (no Data-In was sent yet).
async fn answer(job: &FileReadJob, result: Option<(ScsiResult, Counts)>) {
    let mine = job.session.tasks.finish(job.cmd.itt, &job.aborted);
    job.shared.complete();
    if !mine {
        return;
    }
    let pdus = match result {
        Some((r, core)) => {
            if job.cmd.read && !r.data_in.is_empty() {
                job.shared
                    .copies
                    .begin(job.cmd.itt, CopyPath::Copy, core, false);
            }
            response_pdus(&job.cmd, r, job.limits, 0)
        }
        None => Vec::new(),
    };
    for pdu in pdus {
        if job.tx.send(Outgoing::Pdu(pdu)).await.is_err() {
            break;
        }
    }
    job.session.tasks.done(job.cmd.itt, &job.aborted);
}

/// The status of a command the path stopped sending (aborted, or the
/// connection went away): nothing more is queued.
async fn stop(job: &FileReadJob, sent: usize) {
    debug!(
        itt = job.cmd.itt,
        sent, "sendfile READ aborted while sending"
    );
    job.shared.copies.forget(job.cmd.itt);
    answer(job, None).await;
}

/// HARDWARE ERROR, INTERNAL TARGET FAILURE, for a panic in the core.
fn internal_failure() -> ScsiResult {
    use blockwire_pdu::scsi::{Asc, Sense, SenseFormat, SenseKey};
    ScsiResult {
        status: 0x02,
        sense: Some(
            Sense::new(SenseKey::HardwareError, Asc::new(0x44, 0x00)).encode(SenseFormat::Fixed),
        ),
        data_in: Vec::new(),
        transfer_length: 0,
    }
}

/// Runs one READ on the sendfile path (see the module docs).
pub(super) async fn serve(job: FileReadJob) {
    let job = Arc::new(job);
    let j = job.clone();
    let step = match tokio::task::spawn_blocking(move || prepare(&j)).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(itt = job.cmd.itt, error = %e, "SCSI command panicked");
            Step::Answer(internal_failure(), Counts::default())
        }
    };
    let (offset, len, send) = match step {
        Step::Aborted => return answer(&job, None).await,
        Step::Answer(r, c) => return answer(&job, Some((r, c))).await,
        Step::Send { offset, len, send } => (offset, len, send),
    };
    let itt = job.cmd.itt;
    let residual = Residual::of(job.cmd.expected_data_transfer_length, len as u32);
    job.shared
        .copies
        .begin(itt, CopyPath::Sendfile, Counts::default(), false);
    for (sent, seg) in datain::segments(
        send,
        job.limits.max_recv_data_segment_length,
        job.limits.max_burst_length,
    )
    .enumerate()
    {
        let item = |bhs: Bhs| Outgoing::FileData {
            bhs,
            lun: job.lun.clone(),
            offset: offset + u64::from(seg.offset),
            len: seg.length,
        };
        if seg.last {
            // The status rides on the last Data-In (the task completes).
            let bhs = data_in_header(&job.cmd, &seg, Some((0, residual)));
            let mine = job.session.tasks.finish(itt, &job.aborted);
            job.shared.complete();
            if mine {
                let _ = job.tx.send(item(bhs)).await;
                job.session.tasks.done(itt, &job.aborted);
            } else {
                job.shared.copies.forget(itt);
            }
            return;
        }
        let out = item(data_in_header(&job.cmd, &seg, None));
        let Ok(permit) = job.tx.reserve().await else {
            // The connection is gone.
            return stop(&job, sent).await;
        };
        if !job
            .session
            .tasks
            .while_live(itt, &job.aborted, move || permit.send(out))
        {
            return stop(&job, sent).await;
        }
    }
}
