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
//!
//! [`LunTable::plan_read`]: crate::scsi::LunTable::plan_read

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;

use blockwire_pdu::Bhs;
use tracing::debug;

use super::connection::Outgoing;
use super::datain;
use super::lun_paths::LunPaths;
use super::response::{data_in_header, response_pdus, Residual};
use super::task::CommandContext;
use crate::copies::{self, CopyPath, Counts};
use crate::scsi::read_plan::ReadPlan;
use crate::scsi::ScsiResult;

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
    luns: LunPaths<SendfileLun>,
}

impl SendfileReads {
    /// Sends READ data of `lun` of `target` from `path` with sendfile.
    /// Returns a line for the start-up log.
    pub fn enable(&self, target: &str, lun: u16, path: &Path) -> io::Result<String> {
        let file = File::open(path)?;
        let label = format!("{target} LUN {lun} ({})", path.display());
        self.luns.insert(target, lun, SendfileLun { file, label });
        Ok(
            "sendfile: Data-In payloads from the page cache to the socket, no user-space copy \
            (copy path on connections with DataDigest)"
                .to_owned(),
        )
    }

    /// The sendfile source of `lun` of `target`, if it has one.
    pub fn get(&self, target: &str, lun: u16) -> Option<Arc<SendfileLun>> {
        self.luns.get(target, lun)
    }
}

/// One sendfile READ: its command's context and the LUN's file.
pub(super) struct FileReadJob {
    pub ctx: CommandContext,
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

/// Runs the READ through the core, with the copies it made.
fn execute_counted(ctx: &CommandContext) -> (ScsiResult, Counts) {
    copies::counted(|| ctx.luns.execute(&ctx.read_request()))
}

fn prepare(ctx: &CommandContext) -> Step {
    if ctx.is_aborted() {
        return Step::Aborted;
    }
    let plan = match ctx.luns.plan_read(&ctx.read_request()) {
        ReadPlan::NotPlanned => {
            let (r, c) = execute_counted(ctx);
            return Step::Answer(r, c);
        }
        ReadPlan::Answer(r) => return Step::Answer(r, Counts::default()),
        ReadPlan::Read(p) => p,
    };
    let send = plan
        .len
        .min(u64::from(ctx.cmd.expected_data_transfer_length));
    if send == 0 {
        // Nothing to send (Expected Data Transfer Length 0): the normal
        // path reports the residual.
        let (r, c) = execute_counted(ctx);
        return Step::Answer(r, c);
    }
    Step::Send {
        offset: plan.offset,
        len: plan.len,
        send: send as u32,
    }
}

/// Answers the way the serial path does (no Data-In was sent yet).
async fn answer(ctx: &CommandContext, result: Option<(ScsiResult, Counts)>) {
    ctx.answer(|| match result {
        Some((r, core)) => {
            if ctx.cmd.read && !r.data_in.is_empty() {
                ctx.shared
                    .copies
                    .begin(ctx.itt(), CopyPath::Copy, core, false);
            }
            response_pdus(&ctx.cmd, r, ctx.limits, 0)
        }
        None => Vec::new(),
    })
    .await;
}

/// The status of a command the path stopped sending (aborted, or the
/// connection went away): nothing more is queued.
async fn stop(ctx: &CommandContext, sent: usize) {
    debug!(itt = ctx.itt(), sent, "sendfile READ aborted while sending");
    ctx.shared.copies.forget(ctx.itt());
    answer(ctx, None).await;
}

/// Runs one READ on the sendfile path (see the module docs).
pub(super) async fn serve(job: FileReadJob) {
    let job = Arc::new(job);
    let j = job.clone();
    let ctx = &job.ctx;
    let step = match tokio::task::spawn_blocking(move || j.ctx.in_core(|| prepare(&j.ctx))).await {
        Ok(s) => s,
        Err(e) => Step::Answer(ctx.panicked(&e), Counts::default()),
    };
    let (offset, len, send) = match step {
        Step::Aborted => return answer(ctx, None).await,
        Step::Answer(r, c) => return answer(ctx, Some((r, c))).await,
        Step::Send { offset, len, send } => (offset, len, send),
    };
    let itt = ctx.itt();
    let residual = Residual::of(ctx.cmd.expected_data_transfer_length, len as u32);
    ctx.shared
        .copies
        .begin(itt, CopyPath::Sendfile, Counts::default(), false);
    for (sent, seg) in datain::segments(
        send,
        ctx.limits.max_recv_data_segment_length,
        ctx.limits.max_burst_length,
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
            let bhs = data_in_header(&ctx.cmd, &seg, Some((0, residual)));
            if ctx.finish() {
                ctx.send_and_forget([item(bhs)]).await;
            } else {
                ctx.shared.copies.forget(itt);
            }
            return;
        }
        let out = item(data_in_header(&ctx.cmd, &seg, None));
        let Ok(permit) = ctx.tx.reserve().await else {
            // The connection is gone.
            return stop(ctx, sent).await;
        };
        if !ctx
            .session
            .tasks
            .while_live(itt, &ctx.aborted, move || permit.send(out))
        {
            return stop(ctx, sent).await;
        }
    }
}
