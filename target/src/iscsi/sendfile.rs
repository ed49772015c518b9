//! READs of cached file LUNs sent with `sendfile(2)` (the zero-copy send of
//! the page cache): the Data-In payloads go from the page cache to the socket without a
//! user-space buffer or copy.
//!
//! For a LUN with `mode = "cached"` and `zero_copy = true` (the default)
//! and without `sync_send`, for a command that is not RDMA-offloaded, a
//! READ(10/12/16) is validated by the SCSI core
//! ([`LunTable::plan_read`], the normal path without the data, as in
//! [`super::syncread`]), and each Data-In PDU is then queued as
//! [`Outgoing::FileData`]: the connection's writer sends its header, then
//! its payload by `sendfile` from the LUN's file at the right offset, then
//! the padding. The GOOD status rides on the last Data-In, as in the serial
//! path. On a connection with DataDigest the writer reads the payload from
//! the page cache into memory instead (a digest needs the bytes) and sends
//! it with its digest: the same road, without the SCSI core's hop to the
//! blocking pool and back. Anything the core does not plan (other commands, errors, READ(6))
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use blockwire_pdu::Bhs;

use super::connection::Outgoing;
use super::datain;
use super::file_map::FileMap;
use super::lun_paths::LunPaths;
use super::mover::{plan_or_core, DataIn, Planned, Pushed, ReadMover};
use super::response::Residual;
use super::task::CommandContext;
use crate::copies::{CopyPath, Counts};

/// One LUN's file, opened once for `sendfile`.
#[derive(Debug)]
pub struct SendfileLun {
    /// The file, opened read-only through the page cache.
    pub file: File,
    /// "target LUN n (path)", for errors.
    pub label: String,
    /// The file lives in memory (tmpfs): a read of it never waits for a
    /// device, so small payloads are read with a plain `pread`.
    pub in_memory: bool,
    /// The file mapped: large payloads to initiators on this host go by
    /// copying sends from it when all their pages are cached (see
    /// [`super::file_map`]).
    pub map: Option<FileMap>,
    /// Cleared when the file system refuses `preadv2(RWF_NOWAIT)`: small
    /// payloads of a file not in memory then go by sendfile too (see
    /// [`PduWriter::push_file`]).
    ///
    /// [`PduWriter::push_file`]: super::io::PduWriter::push_file
    nowait_reads: AtomicBool,
}

impl SendfileLun {
    /// `file` of the LUN `label` names.
    pub fn new(file: File, label: String) -> SendfileLun {
        let in_memory = crate::backstore::lives_in_memory(&file);
        let map = FileMap::new(&file)
            .inspect_err(|e| {
                tracing::warn!(lun = %label, error = %e, "mapping the LUN's file failed: its large READ payloads go by sendfile")
            })
            .ok()
            .flatten();
        SendfileLun {
            file,
            label,
            in_memory,
            map,
            nowait_reads: AtomicBool::new(true),
        }
    }

    /// How a small payload may be read without stalling the connection's
    /// writer: a plain read of memory, a read that refuses pages not
    /// cached, or (None) not at all, by sendfile instead.
    pub fn small_read_flags(&self) -> Option<rustix::io::ReadWriteFlags> {
        if self.in_memory {
            Some(rustix::io::ReadWriteFlags::empty())
        } else if self.nowait_reads.load(Ordering::Relaxed) {
            Some(rustix::io::ReadWriteFlags::NOWAIT)
        } else {
            None
        }
    }

    /// The file system refused `RWF_NOWAIT`: small payloads go by sendfile.
    pub fn refuse_nowait_reads(&self) {
        self.nowait_reads.store(false, Ordering::Relaxed);
    }
}

/// The fabric's sendfile READ paths: entries in its per-LUN data path
/// table.
#[derive(Debug)]
pub struct SendfileReads {
    luns: Arc<LunPaths>,
}

impl SendfileReads {
    /// sendfile READ paths recorded in `luns`.
    pub fn new(luns: Arc<LunPaths>) -> SendfileReads {
        SendfileReads { luns }
    }

    /// Sends READ data of `lun` of `target` from `path` with sendfile.
    /// Returns a line for the start-up log.
    pub fn enable(&self, target: &str, lun: u16, path: &Path) -> io::Result<String> {
        let file = File::open(path)?;
        let label = format!("{target} LUN {lun} ({})", path.display());
        let path = Arc::new(SendfileLun::new(file, label));
        self.luns.update(target, lun, |p| p.sendfile = Some(path));
        Ok(
            "sendfile: Data-In payloads from the page cache to the socket, no user-space copy \
            (read into memory by the connection's writer on connections with DataDigest)"
                .to_owned(),
        )
    }

    /// The sendfile source of `lun` of `target`, if it has one.
    pub fn get(&self, target: &str, lun: u16) -> Option<Arc<SendfileLun>> {
        self.luns.get(target, lun)?.sendfile.clone()
    }
}

/// Runs one READ of `lun` on the sendfile path (see the module docs).
pub(super) async fn serve(ctx: Arc<CommandContext>, lun: Arc<SendfileLun>) {
    let mut mover = DataIn::new(true);
    let edtl = u64::from(ctx.cmd.expected_data_transfer_length);
    let step = plan_or_core(&ctx, move |_, plan| {
        // Nothing to send (Expected Data Transfer Length 0): the normal
        // path reports the residual.
        let send = plan.len.min(edtl);
        (send > 0).then_some((plan.offset, plan.len, send as u32, plan.clock))
    })
    .await;
    // The plan's clock times the READ in the LUN's statistics until this task ends,
    // its last Data-In queued.
    let (offset, len, send, _clock) = match step {
        Planned::Go(go) => go,
        Planned::Aborted => {
            mover.answer(&ctx, None, 0).await;
            return;
        }
        Planned::Answer(r, c, share) => {
            mover.keep_share(share);
            mover.answer(&ctx, Some((r, c)), 0).await;
            return;
        }
    };
    let itt = ctx.itt();
    let residual = Residual::of(ctx.cmd.expected_data_transfer_length, len as u32);
    ctx.shared
        .copies
        .begin(itt, CopyPath::Sendfile, Counts::default(), false);
    for seg in datain::segments(
        send,
        ctx.limits.max_recv_data_segment_length,
        ctx.limits.max_burst_length,
    ) {
        let item = |bhs: Bhs| Outgoing::FileData {
            bhs,
            lun: lun.clone(),
            offset: offset + u64::from(seg.offset),
            len: seg.length,
        };
        match mover.push(&ctx, &seg, residual, item).await {
            Pushed::Queued => {}
            Pushed::Last(_) | Pushed::Stopped => return,
        }
    }
}
