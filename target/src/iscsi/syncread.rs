//! Synchronized sends for READs (issue 7, part 3) over TCP.
//!
//! For a LUN with `sync_send` on, a READ(10/12/16) is validated by the SCSI
//! core ([`LunTable::plan_read`]: the normal path, without the data), then
//! read by the I/O engine (io_uring READ_FIXED or the thread pool) into one
//! registered pool buffer in chunks of `sync_chunk` bytes submitted
//! together. Each Data-In PDU leaves as soon as every chunk under it is
//! valid, in offset order (DataSN = send order); the GOOD status rides on
//! the last one, as in the serial path. The PDU's payload shares the
//! registered buffer (no copy), which returns to the pool once the writer
//! has put the last of them on the socket.
//!
//! Each LUN on this path has a [`Mode`]: `Synchronized` as above, or
//! `Serial` (one chunk: read everything into the registered buffer, then
//! send), the baseline of a `direct` LUN without `sync_send`. LUNs are
//! registered from a path ([`SyncReads::enable`]) or from a prebuilt
//! [`Source`] ([`SyncReads::enable_source`]: striped files, no-disk).
//!
//! The core's serial path (read everything on the blocking pool, then
//! send) stays the default for other LUNs, and is the fallback whenever this one cannot run: a READ
//! the core did not plan, an unaligned O_DIRECT range, no free buffer, a
//! submission error, or a read error before the first PDU was sent. A read
//! error after some Data-In went out ends the command with the core's
//! CHECK CONDITION sense. Abort flags are checked as each PDU is queued,
//! under the task set's lock, so nothing of an aborted task follows the
//! task management response.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use blockwire_pdu::pdu::codes::TaskAttr;
use blockwire_pdu::pdu::ScsiCommand;
use blockwire_pdu::{Bhs, Pdu};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::connection::{Outgoing, Shared};
use super::datain;
use super::response::{data_in_header, response_pdus, DataInLimits, Residual};
use super::session::Session;
use crate::datapath::{
    open_engine, BufferPool, Engine, EnginePref, Mode, ReadCommand, ReadConfig, SendOrder, Source,
};
use crate::scsi::read_plan::ReadPlan;
use crate::scsi::{ItNexus, LunTable, ScsiRequest, ScsiResult};

/// O_DIRECT alignment asked of planned ranges (covers 512 and 4K devices).
const DIRECT_ALIGN: u64 = 4096;

/// One LUN's pipelined read path.
pub struct SyncReadLun {
    /// The engine (shared by every LUN of the fabric).
    pub engine: Arc<dyn Engine>,
    /// The LUN's file, opened for the engine.
    pub source: Source,
    /// Whether `source` is O_DIRECT (ranges must then be aligned).
    pub direct: bool,
    /// Chunk size in bytes.
    pub chunk: usize,
    /// [`Mode::Synchronized`] (send each PDU as soon as its chunks are
    /// valid) or [`Mode::Serial`] (read every chunk, then send: the
    /// baseline, still through the engine and its registered buffers).
    pub mode: Mode,
}

impl std::fmt::Debug for SyncReadLun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncReadLun")
            .field("engine", &self.engine.kind())
            .field("direct", &self.direct)
            .field("chunk", &self.chunk)
            .field("mode", &self.mode)
            .field("streams", &self.source.streams())
            .finish()
    }
}

/// The fabric's pipelined read paths, by target name and LUN.
#[derive(Default)]
pub struct SyncReads {
    engine: Mutex<Option<(Arc<dyn Engine>, String)>>,
    luns: RwLock<HashMap<String, HashMap<u16, Arc<SyncReadLun>>>>,
    any: AtomicBool,
}

impl std::fmt::Debug for SyncReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncReads")
            .field("luns", &self.luns.read().map(|l| l.len()).unwrap_or(0))
            .finish()
    }
}

impl SyncReads {
    /// The engine, opened on first use; the string says which one and why.
    pub fn engine(&self) -> io::Result<(Arc<dyn Engine>, String)> {
        let mut g = self.engine.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = &*g {
            return Ok(e.clone());
        }
        let e = open_engine(BufferPool::with_defaults(), EnginePref::Auto)?;
        *g = Some(e.clone());
        Ok(e)
    }

    /// Turns the engine read path on for READs of `lun` of `target`, whose
    /// file is `path`: opened O_DIRECT when `direct` (and the filesystem
    /// allows it), else buffered. Returns a line for the start-up log.
    pub fn enable(
        &self,
        target: &str,
        lun: u16,
        path: &Path,
        direct: bool,
        chunk: usize,
        mode: Mode,
    ) -> io::Result<String> {
        let (file, direct) = if direct {
            crate::datapath::open_direct_or_buffered(path, false)?
        } else {
            (std::fs::File::open(path)?, false)
        };
        self.enable_source(
            target,
            lun,
            Source::File(Arc::new(file)),
            direct,
            chunk,
            mode,
        )
    }

    /// Turns the engine read path on for READs of `lun` of `target` from a
    /// prebuilt `source` (a file, striped files, or the no-disk pattern).
    /// `direct` says whether its files are O_DIRECT (planned ranges must
    /// then be 4 KiB aligned, else the READ takes the serial core path).
    /// Returns a line for the start-up log.
    pub fn enable_source(
        &self,
        target: &str,
        lun: u16,
        source: Source,
        direct: bool,
        chunk: usize,
        mode: Mode,
    ) -> io::Result<String> {
        let (engine, banner) = self.engine()?;
        let chunk = chunk.max(4096);
        let streams = source.streams();
        let what = match &source {
            Source::Pattern => "no-disk pattern data".to_owned(),
            Source::File(_) if direct => "O_DIRECT reads".to_owned(),
            Source::File(_) => "page-cache reads".to_owned(),
            Source::Striped { .. } => format!(
                "{streams} striped members, {} reads",
                if direct { "O_DIRECT" } else { "page-cache" }
            ),
        };
        self.luns
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(target.to_owned())
            .or_default()
            .insert(
                lun,
                Arc::new(SyncReadLun {
                    engine,
                    source,
                    direct,
                    chunk,
                    mode,
                }),
            );
        self.any.store(true, Ordering::Release);
        let how = match mode {
            Mode::Synchronized => "synchronized sends",
            Mode::Serial => "serial (read every chunk, then send)",
        };
        Ok(format!(
            "engine path, {how}, {} KiB chunks, {what}, engine {banner}",
            chunk >> 10
        ))
    }

    /// The pipelined path of `lun` of `target`, if it has one.
    pub fn get(&self, target: &str, lun: u16) -> Option<Arc<SyncReadLun>> {
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

/// Everything one pipelined READ needs from its connection.
pub(super) struct ReadJob {
    pub cmd: ScsiCommand,
    pub cdb: Vec<u8>,
    pub luns: Arc<LunTable>,
    pub nexus: ItNexus,
    pub session: Arc<Session>,
    pub shared: Arc<Shared>,
    pub tx: mpsc::Sender<Outgoing>,
    pub limits: DataInLimits,
    pub aborted: Arc<AtomicBool>,
    pub path: Arc<SyncReadLun>,
}

/// What the blocking part decided.
enum Step {
    /// Aborted before it ran.
    Aborted,
    /// Answer with this result (the normal path's, or an error).
    Answer(ScsiResult),
    /// Reading: send units as they become valid.
    Pipelined {
        read: Box<ReadCommand>,
        rx: crate::datapath::CompletionRx,
        len: u64,
        lba: u64,
        lu: Arc<crate::scsi::LogicalUnit>,
        sent_len: u32,
    },
}

fn request<'a>(job: &'a ReadJob, attr: TaskAttr) -> ScsiRequest<'a> {
    ScsiRequest {
        lun: job.cmd.lun.index().unwrap_or(u16::MAX),
        cdb: &job.cdb,
        nexus: &job.nexus,
        task_tag: job.cmd.itt,
        attr,
        data_out: &[],
        data_in_capacity: job.cmd.expected_data_transfer_length,
    }
}

/// Plans and starts the read, or answers the normal way (blocking).
fn prepare(job: &ReadJob) -> Step {
    if job.aborted.load(Ordering::SeqCst) {
        return Step::Aborted;
    }
    let req = request(job, job.cmd.attr);
    let plan = match job.luns.plan_read(&req) {
        ReadPlan::NotPlanned => return Step::Answer(job.luns.execute(&req)),
        ReadPlan::Answer(r) => return Step::Answer(r),
        ReadPlan::Read(p) => p,
    };
    let edtl = u64::from(job.cmd.expected_data_transfer_length);
    let send = plan.len.min(edtl);
    let aligned = !job.path.direct || (plan.offset % DIRECT_ALIGN == 0 && send % DIRECT_ALIGN == 0);
    if send == 0 || !aligned || send > job.path.engine.pool().max_len() as u64 {
        return Step::Answer(job.luns.execute(&req));
    }
    let units = datain::segments(
        send as u32,
        job.limits.max_recv_data_segment_length,
        job.limits.max_burst_length,
    )
    .map(|s| u64::from(s.offset)..u64::from(s.offset + s.length))
    .collect();
    let cfg = ReadConfig {
        mode: job.path.mode,
        chunk: job.path.chunk,
        units: Some(units),
    };
    match ReadCommand::try_start(
        &*job.path.engine,
        &job.path.source,
        plan.offset,
        send as usize,
        SendOrder::InOrder,
        &cfg,
        Instant::now(),
    ) {
        Ok(Some((read, rx))) => Step::Pipelined {
            read: Box::new(read),
            rx,
            len: plan.len,
            lba: plan.lba,
            lu: plan.lu,
            sent_len: send as u32,
        },
        Ok(None) => {
            debug!(itt = job.cmd.itt, "no free I/O buffer: serial read");
            Step::Answer(job.luns.execute(&req))
        }
        Err(e) => {
            warn!(itt = job.cmd.itt, error = %e, "pipelined read did not start: serial read");
            Step::Answer(job.luns.execute(&req))
        }
    }
}

/// Sends the answer of a command that ended without (more) pipelined
/// Data-In, as the serial path does. `data_ins` Data-In PDUs were already
/// sent (they count in ExpDataSN).
async fn answer(job: &ReadJob, result: Option<ScsiResult>, data_ins: u32) {
    let mine = job.session.tasks.finish(job.cmd.itt, &job.aborted);
    job.shared.complete();
    if !mine {
        return;
    }
    let mut pdus = match result {
        Some(r) => response_pdus(&job.cmd, r, job.limits, 0),
        None => Vec::new(),
    };
    if data_ins > 0 {
        for p in &mut pdus {
            if let Bhs::ScsiResponse(r) = &mut p.bhs {
                r.exp_data_sn = data_ins;
            }
        }
    }
    for pdu in pdus {
        if job.tx.send(Outgoing::Pdu(pdu)).await.is_err() {
            break;
        }
    }
    job.session.tasks.done(job.cmd.itt, &job.aborted);
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

/// Runs one READ on the pipelined path (see the module docs).
pub(super) async fn serve(job: ReadJob) {
    let job = Arc::new(job);
    let j = job.clone();
    let step = match tokio::task::spawn_blocking(move || prepare(&j)).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(itt = job.cmd.itt, error = %e, "SCSI command panicked");
            Step::Answer(internal_failure())
        }
    };
    let (mut read, mut rx, len, lba, lu, sent_len) = match step {
        Step::Aborted => return answer(&job, None, 0).await,
        Step::Answer(r) => return answer(&job, Some(r), 0).await,
        Step::Pipelined {
            read,
            rx,
            len,
            lba,
            lu,
            sent_len,
        } => (read, rx, len, lba, lu, sent_len),
    };
    let itt = job.cmd.itt;
    let residual = Residual::of(job.cmd.expected_data_transfer_length, len as u32);
    let segs: Vec<datain::DataInSegment> = datain::segments(
        sent_len,
        job.limits.max_recv_data_segment_length,
        job.limits.max_burst_length,
    )
    .collect();
    let mut sent = 0u32;
    loop {
        for u in read.take_ready() {
            let (_, data) = read.unit_bytes(u);
            let seg = segs[u];
            if seg.last {
                // The status rides on the last Data-In (the task completes).
                let bhs = data_in_header(&job.cmd, &seg, Some((0, residual)));
                let mine = job.session.tasks.finish(itt, &job.aborted);
                job.shared.complete();
                if mine {
                    let _ = job.tx.send(Outgoing::Pdu(Pdu::with_data(bhs, data))).await;
                    job.session.tasks.done(itt, &job.aborted);
                }
                return;
            }
            let pdu = Pdu::with_data(data_in_header(&job.cmd, &seg, None), data);
            let Ok(permit) = job.tx.reserve().await else {
                // The connection is gone.
                return answer(&job, None, sent).await;
            };
            if !job
                .session
                .tasks
                .while_live(itt, &job.aborted, move || permit.send(Outgoing::Pdu(pdu)))
            {
                debug!(itt, sent, "READ aborted while sending");
                return answer(&job, None, sent).await;
            }
            sent += 1;
        }
        let failed = match rx.recv().await {
            None => Err(io::Error::other("I/O engine dropped a completion")),
            Some(c) => {
                let mut r = read.on_completion(c, Instant::now());
                while r.is_ok() {
                    match rx.try_recv() {
                        Ok(c) => r = read.on_completion(c, Instant::now()),
                        Err(_) => break,
                    }
                }
                r
            }
        };
        if let Err(e) = failed {
            drop(read);
            if sent == 0 {
                warn!(itt, error = %e, "pipelined read failed: serial read");
                let j = job.clone();
                let r = tokio::task::spawn_blocking(move || {
                    let req = request(&j, j.cmd.attr);
                    j.luns.execute(&req)
                })
                .await
                .unwrap_or_else(|_| internal_failure());
                return answer(&job, Some(r), 0).await;
            }
            let r = lu.read_failure(lba, len, &e);
            return answer(&job, Some(r), sent).await;
        }
    }
}
