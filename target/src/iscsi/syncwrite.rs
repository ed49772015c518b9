//! Double-buffered WRITEs (the write side of synchronized sends): chunk k
//! goes to disk while chunk k+1 arrives.
//!
//! For a file LUN with `sync_write` on, a WRITE(10/12/16) whose Expected
//! Data Transfer Length is exactly the CDB's bytes takes this path when a
//! registered pool buffer of that size is free (and, for an O_DIRECT LUN,
//! its offset and length are 4 KiB aligned); otherwise it is gathered
//! whole and run by the SCSI core as before. The decision is taken as the
//! command arrives ([`lease_for`]), with no I/O.
//!
//! The connection's reader keeps doing what it does for every WRITE: it
//! checks each Data-Out against the sequence rules (a validating
//! `WriteCollector`: Target Transfer Tag, DataSN, BufferOffset, overlap, F
//! bit) and sends the R2Ts, MaxOutstandingR2T at a time. It does not keep
//! the bytes: each accepted payload (immediate, unsolicited, solicited) is
//! handed to this command's task through a [`Feed`] (the payload shares the
//! read buffer, no copy) and the reader goes on; it never waits on the
//! disk.
//!
//! The task ([`run`]):
//! - asks the core for a plan ([`LunTable::plan_write`], on the blocking
//!   pool): validation by the normal path and a hold on the block range and
//!   the nexus's in-flight count, kept until the last chunk write ended;
//! - copies each payload into the buffer at its BufferOffset, and as soon
//!   as a chunk of `sync_chunk` bytes (aligned to the command) is complete
//!   and the plan is there, submits it to the engine (io_uring WRITE_FIXED
//!   or pwrite) while the next chunk is still arriving;
//! - after the last chunk completed, syncs the file when the write must be
//!   durable (FUA, or the write cache off: the file backstore's rule) and
//!   sends the status.
//!
//! Errors:
//! - a chunk write (or the sync) fails: no further chunk is submitted, and
//!   once the data phase is over and in-flight writes ended, the status is
//!   the core's for that errno ([`LogicalUnit::write_failure`]: MEDIUM
//!   ERROR, WRITE ERROR for EIO; DATA PROTECT, SPACE ALLOCATION FAILED for
//!   ENOSPC), with the failed chunk's first LBA in INFORMATION;
//! - a Data-Out sequence error: CHECK CONDITION, ABORTED COMMAND, DATA PHASE
//!   ERROR, as the gathered path answers, sent after the chunk writes
//!   already submitted ended. Unlike the gathered path, chunks complete
//!   before the error may be on the medium: SCSI leaves the data of a
//!   failed WRITE undefined (SBC-3 4.11 / SAM-5: a command that ends with
//!   CHECK CONDITION may have changed any block of its range), which is
//!   exactly what an initiator must assume;
//! - the plan answers an error (reservation conflict, write protect, ...):
//!   that answer, after the data phase, as the gathered path gives it;
//! - an abort (task management, PREEMPT AND ABORT, connection loss): no
//!   further chunk is submitted, in-flight chunk writes are waited for
//!   before the buffer and the hold are released, and no status is sent.
//!   Task management waits (boundedly) for that drain before it answers
//!   ([`Running::wait_drained`] on this connection; the task's count of
//!   work that may change the medium, held until the drain, for a CLEAR
//!   TASK SET from another session), so no chunk of an aborted WRITE
//!   reaches the disk after the initiator learnt it was aborted.
//!
//! Memory: the buffer is the command's share of the connection's write
//! budget (reserved as for a gathered WRITE, released with the buffer) and
//! comes from the engine's fixed pool. The command's window slot is freed
//! by the task, exactly once, when it ends.
//!
//! Measurement: each command counts the chunk writes submitted before its
//! last byte arrived (the overlap) into [`SyncWriteStats`] and logs it with
//! its timers at `debug` ("pipelined write done").
//!
//! One file over the usual size: the path's registry, the reader's feed,
//! the running-task table task management waits on, and the task itself
//! all speak the one feed protocol (`Msg`) and are read together.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blockwire_pdu::pdu::ScsiCommand;
use blockwire_pdu::scsi::{Cdb, CdbSize};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::budget::Reservation;
use super::connection::Outgoing;
use super::lun_paths::LunPaths;
use super::response::{response_pdus, status_after_r2ts};
use super::task::{data_phase_error_sense, internal_failure, CommandContext};
use super::write_chunks::ChunkFill;
use crate::datapath::{completion_channel, BufLease, Completion, Engine, IoOp, OpKind};
use crate::scsi::write_plan::{PlannedWrite, WritePlan};
use crate::scsi::{LunTable, ScsiResult};

/// O_DIRECT alignment asked of pipelined ranges and chunks.
const DIRECT_ALIGN: u64 = 4096;

/// How often a waiting task looks at its abort flag (an abort by another
/// initiator sets the flag without a word to the connection).
const ABORT_POLL: Duration = Duration::from_millis(10);

/// One LUN's double-buffered write path.
pub struct SyncWriteLun {
    /// The engine (shared with the READ path).
    pub engine: Arc<dyn Engine>,
    /// The LUN's file, opened for writing by the engine.
    pub file: Arc<File>,
    /// Whether `file` is O_DIRECT (ranges and chunks must be aligned).
    pub direct: bool,
    /// Chunk size in bytes.
    pub chunk: usize,
}

impl std::fmt::Debug for SyncWriteLun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncWriteLun")
            .field("engine", &self.engine.kind())
            .field("direct", &self.direct)
            .field("chunk", &self.chunk)
            .finish()
    }
}

/// Counters of the double-buffered write path (all LUNs of the fabric).
#[derive(Debug, Default)]
pub struct SyncWriteStats {
    /// WRITEs that took the pipelined path.
    pub pipelined: AtomicU64,
    /// WRITEs on a `sync_write` LUN that were gathered instead (not
    /// plannable, unaligned, no free buffer).
    pub gathered: AtomicU64,
    /// Chunk writes submitted.
    pub chunks: AtomicU64,
    /// Chunk writes submitted before their command's last byte arrived:
    /// the disk working while the network still delivers.
    pub overlapped: AtomicU64,
}

/// The fabric's double-buffered write paths: their statistics, and their
/// entries in the fabric's per-LUN data path table.
pub struct SyncWrites {
    luns: Arc<LunPaths>,
    /// What the path did so far.
    pub stats: SyncWriteStats,
}

impl std::fmt::Debug for SyncWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncWrites")
            .field("luns", &self.luns)
            .field("stats", &self.stats)
            .finish()
    }
}

impl SyncWrites {
    /// Double-buffered write paths recorded in `luns`.
    pub fn new(luns: Arc<LunPaths>) -> SyncWrites {
        SyncWrites {
            luns,
            stats: SyncWriteStats::default(),
        }
    }

    /// Turns double-buffered writes on for `lun` of `target`, whose file is
    /// `path`, written by `engine` (the fabric's, see
    /// `SyncReads::engine`): opened O_DIRECT when `direct` and the
    /// filesystem allows it, else buffered. `chunk` is rounded up to 4 KiB.
    /// Returns a line for the start-up log.
    pub fn enable(
        &self,
        engine: Arc<dyn Engine>,
        target: &str,
        lun: u16,
        path: &Path,
        direct: bool,
        chunk: usize,
    ) -> io::Result<String> {
        let (file, direct) = if direct {
            crate::datapath::open_direct_or_buffered(path, true)?
        } else {
            (
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path)?,
                false,
            )
        };
        let chunk = chunk.max(1).next_multiple_of(DIRECT_ALIGN as usize);
        let kind = engine.describe();
        let path = Arc::new(SyncWriteLun {
            engine,
            file: Arc::new(file),
            direct,
            chunk,
        });
        self.luns
            .update(target, lun, |p| p.engine_writes = Some(path));
        Ok(format!(
            "double-buffered writes, {} KiB chunks, {} writes, engine {kind}",
            chunk >> 10,
            if direct { "O_DIRECT" } else { "page cache" }
        ))
    }

    /// The double-buffered path of `lun` of `target`, if it has one.
    pub fn get(&self, target: &str, lun: u16) -> Option<Arc<SyncWriteLun>> {
        self.luns.get(target, lun)?.engine_writes.clone()
    }
}

/// Whether a WRITE on a `sync_write` LUN can be pipelined, and if so its
/// buffer: WRITE(10/12/16), Expected Data Transfer Length equal to the
/// CDB's bytes, aligned for an O_DIRECT file, and a pool buffer free now.
/// Pure bookkeeping (no I/O, never waits): safe on the reader.
pub(super) fn lease_for(
    path: &SyncWriteLun,
    stats: &SyncWriteStats,
    luns: &LunTable,
    cmd: &ScsiCommand,
    cdb: &[u8],
) -> Option<BufLease> {
    let lease = (|| {
        let lu = luns.get(cmd.lun.index()?)?;
        let Ok(Cdb::Write(rw)) = Cdb::decode(cdb) else {
            return None;
        };
        let bs = u64::from(lu.block_size());
        let bytes = u64::from(rw.length) * bs;
        let edtl = u64::from(cmd.expected_data_transfer_length);
        if rw.size == CdbSize::Six || bytes == 0 || bytes != edtl {
            return None;
        }
        let offset = rw.lba.checked_mul(bs)?;
        if path.direct && (offset % DIRECT_ALIGN != 0 || bytes % DIRECT_ALIGN != 0) {
            return None;
        }
        path.engine.pool().try_acquire(bytes as usize)
    })();
    match &lease {
        Some(_) => stats.pipelined.fetch_add(1, Ordering::Relaxed),
        None => stats.gathered.fetch_add(1, Ordering::Relaxed),
    };
    lease
}

/// What the reader hands a pipelined WRITE's task.
#[derive(Debug)]
enum Msg {
    /// Accepted payload bytes at a command offset.
    Data(u32, bytes::Bytes),
    /// Every byte arrived; this many R2Ts were sent (for ExpDataSN).
    Complete(u32),
    /// A Data-Out broke the sequence rules: the command fails; this many
    /// R2Ts had been sent.
    Failed(u32),
}

/// The reader's end of a pipelined WRITE. Dropping it without
/// [`Feed::complete`] or [`Feed::failed`] ends the command as aborted.
#[derive(Debug)]
pub(super) struct Feed {
    tx: mpsc::UnboundedSender<Msg>,
}

impl Feed {
    /// An accepted payload (immediate data at 0, a Data-Out at its
    /// BufferOffset). The channel is unbounded but what it carries is
    /// bounded by the command's length: the collector accepts each byte
    /// of the command at most once.
    pub(super) fn data(&self, offset: u32, data: bytes::Bytes) {
        if !data.is_empty() {
            let _ = self.tx.send(Msg::Data(offset, data));
        }
    }

    /// The data phase ended; `r2ts` R2Ts were sent.
    pub(super) fn complete(self, r2ts: u32) {
        let _ = self.tx.send(Msg::Complete(r2ts));
    }

    /// The data phase failed (a sequence error) after `r2ts` R2Ts.
    pub(super) fn failed(self, r2ts: u32) {
        let _ = self.tx.send(Msg::Failed(r2ts));
    }
}

/// The connection's running pipelined WRITEs, so task management can wait
/// until an aborted one has no chunk write in flight.
#[derive(Debug, Default, Clone)]
pub(super) struct Running(Arc<Mutex<HashMap<u32, Arc<AtomicBool>>>>);

impl Running {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<AtomicBool>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until none of `itts` has a task still running (its chunk
    /// writes drained), at most until `deadline`.
    pub(super) async fn wait_drained(&self, itts: &[u32], deadline: tokio::time::Instant) {
        let flags: Vec<Arc<AtomicBool>> = {
            let map = self.lock();
            itts.iter().filter_map(|i| map.get(i).cloned()).collect()
        };
        for f in flags {
            while !f.load(Ordering::Acquire) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
}

/// One pipelined WRITE: its command's context (shared with the blocking
/// steps that plan or gather it), its LUN's path and its budget.
pub(super) struct WriteJob {
    pub ctx: Arc<CommandContext>,
    pub path: Arc<SyncWriteLun>,
    /// The command's share of the connection's write budget, returned
    /// when the task ends (with the buffer).
    pub budget: Reservation,
    pub fabric: Arc<super::Fabric>,
}

/// The task's end of a pipelined WRITE's feed.
#[derive(Debug)]
pub(super) struct FeedReceiver(mpsc::UnboundedReceiver<Msg>);

/// A new feed: the reader's end and the task's end. What the reader passes
/// before the task starts waits in the channel.
pub(super) fn feed() -> (Feed, FeedReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Feed { tx }, FeedReceiver(rx))
}

/// Starts the task of a pipelined WRITE (see the module docs), fed through
/// `rx`. The task owns the command's window slot from now on.
pub(super) fn spawn(
    job: WriteJob,
    lease: BufLease,
    rx: FeedReceiver,
    running: &Running,
    throttle: Option<super::throttle::Throttle>,
) {
    let rx = rx.0;
    let drained = Arc::new(AtomicBool::new(false));
    running.lock().insert(job.ctx.itt(), drained.clone());
    let running = running.clone();
    // Counted before the task first reads its abort flag, as a core call
    // is: an abort of this WRITE by another session, which cannot see this
    // connection's running table, waits on the count instead.
    let changing_medium = job.ctx.changing_medium();
    tokio::spawn(async move {
        let itt = job.ctx.itt();
        // Held by the LUN's QoS ceilings: no chunk is written before the
        // command's place comes; its data keeps arriving into the lease.
        let aborted = job.ctx.aborted.clone();
        super::throttle::after_wait(throttle, aborted, run(job, lease, rx)).await;
        // Only now: every chunk write ended and the hold is released.
        drop(changing_medium);
        drained.store(true, Ordering::Release);
        let mut map = running.lock();
        if map.get(&itt).is_some_and(|f| Arc::ptr_eq(f, &drained)) {
            map.remove(&itt);
        }
    });
}

/// Where the plan is.
enum PlanState {
    Pending(tokio::task::JoinHandle<WritePlan>),
    Write(Box<PlannedWrite>),
    Answer(ScsiResult),
    /// Not plannable: run the core on the gathered buffer at the end.
    Gather,
}

/// How the data phase ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Input {
    Open,
    Complete(u32),
    Failed(u32),
    /// The reader dropped the feed: aborted, or the connection is gone.
    Dropped,
}

/// One pipelined WRITE in progress.
struct Pipe {
    job: WriteJob,
    buf: Arc<BufLease>,
    fill: ChunkFill,
    len: u64,
    done_tx: crate::datapath::CompletionTx,
    /// The first write failure: (LBA of its chunk, error).
    error: Option<(u64, io::Error)>,
    submitted: u64,
    overlapped: u64,
    received: Instant,
    last_data: Option<Instant>,
}

impl Pipe {
    /// Copies an accepted payload into the buffer at `offset`.
    fn place(&mut self, offset: u32, data: &[u8]) {
        if let Err(e) = self.fill.place(u64::from(offset), data.len() as u64) {
            // The collector refuses overlaps and ranges outside the
            // command, so this is a bug: fail the command, never write
            // bytes that were not placed.
            warn!(itt = self.job.ctx.itt(), error = %e, "pipelined write: payload refused");
            self.error
                .get_or_insert((0, io::Error::other(format!("payload refused: {e}"))));
            return;
        }
        // SAFETY: `place` accepted the range, so every chunk it touches is
        // still filling: no engine op has been submitted for it (ops only
        // cover chunks handed out by `take_complete`), and nothing else
        // reads or writes it. In bounds: the range lies in the command and
        // the lease holds at least the command's bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.buf.as_ptr().add(offset as usize),
                data.len(),
            );
        }
        if self.fill.all_arrived() {
            self.last_data = Some(Instant::now());
        }
    }

    /// Submits every complete chunk, when the plan allows writing and no
    /// write failed.
    fn submit_complete(&mut self, plan: &PlannedWrite) {
        if self.error.is_some() || self.job.ctx.is_aborted() {
            return;
        }
        let ks = self.fill.take_complete();
        if ks.is_empty() {
            return;
        }
        let overlapping = !self.fill.all_arrived();
        let ops: Vec<IoOp> = ks
            .iter()
            .map(|&k| {
                let r = self.fill.range(k);
                IoOp {
                    kind: OpKind::Write,
                    file: self.job.path.file.clone(),
                    file_offset: plan.offset + r.start,
                    buf: self.buf.clone(),
                    buf_offset: r.start as usize,
                    len: (r.end - r.start) as usize,
                    stream: 0,
                    tag: k as u64,
                }
            })
            .collect();
        let n = ks.len() as u64;
        self.submitted += n;
        let stats = &self.job.fabric.sync_writes.stats;
        stats.chunks.fetch_add(n, Ordering::Relaxed);
        if overlapping {
            self.overlapped += n;
            stats.overlapped.fetch_add(n, Ordering::Relaxed);
        }
        if let Err(e) = self.job.path.engine.submit(ops, &self.done_tx) {
            // Only a stopped engine fails a batch, with none of its ops in
            // flight (see `Engine::submit`): the batch has ended.
            let lba = plan.lba + self.fill.range(ks[0]).start / u64::from(plan.block_size);
            self.error.get_or_insert((lba, e));
            for k in ks {
                self.fill.on_written(k);
            }
        }
    }

    /// Applies one engine completion.
    fn on_completion(&mut self, c: Completion, plan: Option<&PlannedWrite>) {
        let k = c.tag as usize;
        if k >= self.fill.count() || self.fill.state(k) != super::write_chunks::ChunkState::Writing
        {
            return; // From a batch already counted as failed.
        }
        let r = self.fill.range(k);
        let want = (r.end - r.start) as usize;
        let failed = match c.result {
            Ok(n) if n == want => None,
            Ok(n) => Some(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write: {n} of {want} bytes"),
            )),
            Err(e) => Some(e),
        };
        self.fill.on_written(k);
        if let (Some(e), Some(p)) = (failed, plan) {
            let lba = p.lba + r.start / u64::from(p.block_size);
            self.error.get_or_insert((lba, e));
        }
    }
}

/// Runs one pipelined WRITE to its end (see the module docs).
async fn run(job: WriteJob, lease: BufLease, mut rx: mpsc::UnboundedReceiver<Msg>) {
    let len = u64::from(job.ctx.cmd.expected_data_transfer_length);
    let chunk = job.path.chunk as u64;
    let plan = {
        let ctx = job.ctx.clone();
        let exclusive = job.path.direct;
        tokio::task::spawn_blocking(move || {
            ctx.in_core(|| ctx.luns.plan_write(&ctx.request(&[], 0), len, exclusive))
        })
    };
    let mut plan = PlanState::Pending(plan);
    let (done_tx, mut done_rx) = completion_channel();
    let mut p = Pipe {
        buf: Arc::new(lease),
        fill: ChunkFill::new(len, chunk),
        len,
        done_tx,
        error: None,
        submitted: 0,
        overlapped: 0,
        received: Instant::now(),
        last_data: None,
        job,
    };
    let mut input = Input::Open;
    let mut tick = tokio::time::interval(ABORT_POLL);
    loop {
        let aborted = p.job.ctx.is_aborted() || input == Input::Dropped;
        let plan_known = !matches!(plan, PlanState::Pending(_));
        if p.fill.writing() == 0 && (aborted || matches!(input, Input::Failed(_))) {
            break;
        }
        if p.fill.writing() == 0 && plan_known && matches!(input, Input::Complete(_)) {
            break;
        }
        tokio::select! {
            m = rx.recv(), if input == Input::Open => match m {
                Some(Msg::Data(offset, data)) => {
                    if !matches!(plan, PlanState::Answer(_)) {
                        p.place(offset, &data);
                    }
                    if let PlanState::Write(w) = &plan {
                        p.submit_complete(w);
                    }
                }
                Some(Msg::Complete(r2ts)) => input = Input::Complete(r2ts),
                Some(Msg::Failed(r2ts)) => input = Input::Failed(r2ts),
                None => input = Input::Dropped,
            },
            r = async {
                match &mut plan {
                    PlanState::Pending(h) => h.await,
                    _ => unreachable!("polled only while pending"),
                }
            }, if !plan_known => {
                plan = match r {
                    Ok(WritePlan::Write(w)) => PlanState::Write(w),
                    Ok(WritePlan::Answer(a)) => PlanState::Answer(a),
                    Ok(WritePlan::NotPlanned) => PlanState::Gather,
                    Err(e) => {
                        tracing::error!(itt = p.job.ctx.itt(), error = %e, "WRITE planning panicked");
                        PlanState::Answer(internal_failure())
                    }
                };
                if let PlanState::Write(w) = &plan {
                    p.submit_complete(w);
                }
            },
            c = done_rx.recv(), if p.fill.writing() > 0 => {
                let w = match &plan {
                    PlanState::Write(w) => Some(&**w),
                    _ => None,
                };
                if let Some(c) = c {
                    p.on_completion(c, w);
                    while let Ok(c) = done_rx.try_recv() {
                        p.on_completion(c, w);
                    }
                }
            },
            _ = tick.tick() => {}
        }
    }
    finish(p, plan, input).await;
}

/// A WRITE whose data phase failed, or that was aborted: its plan, once
/// there, counts it as an error with no bytes, and is let go.
fn fail_plan(plan: PlanState) {
    match plan {
        PlanState::Write(w) => w.hold.fail(),
        // Still waiting for its range: failed when it comes.
        PlanState::Pending(h) => {
            tokio::spawn(async move {
                if let Ok(WritePlan::Write(w)) = h.await {
                    w.hold.fail();
                }
            });
        }
        PlanState::Answer(_) | PlanState::Gather => {}
    }
}

/// Ends the command: answers (unless aborted), then releases everything.
async fn finish(mut p: Pipe, plan: PlanState, input: Input) {
    let aborted = p.job.ctx.is_aborted() || input == Input::Dropped;
    let itt = p.job.ctx.itt();
    let r2ts = match input {
        Input::Complete(n) | Input::Failed(n) => n,
        _ => 0,
    };
    let pdus = if aborted {
        debug!(itt, written = p.fill.written(), "pipelined write aborted");
        // Ended by ABORT TASK (or its connection's loss) part way through
        // its data: it did not complete, and its statistics say so (an
        // error, no bytes), where dropping its plan counted it GOOD.
        fail_plan(plan);
        None
    } else if matches!(input, Input::Failed(_)) {
        // Its plan counts it once, as an error, and lets its range and
        // in-flight count go before the status.
        fail_plan(plan);
        Some(status_after_r2ts(
            &p.job.ctx.cmd,
            0x02,
            Some(data_phase_error_sense()),
            r2ts,
        ))
    } else {
        let result = match plan {
            PlanState::Answer(r) => r,
            PlanState::Gather => {
                let buf = p.buf.clone();
                let ctx = p.job.ctx.clone();
                let len = p.len as usize;
                tokio::task::spawn_blocking(move || {
                    // SAFETY: no op was submitted on this buffer (no plan),
                    // and every byte of the command was placed.
                    let data = unsafe { buf.slice(0..len) };
                    ctx.in_core(|| ctx.luns.execute(&ctx.request(data, 0)))
                })
                .await
                .unwrap_or_else(|_| internal_failure())
            }
            PlanState::Write(w) => {
                let w = *w;
                let r = match p.error.take() {
                    Some((lba, e)) => {
                        w.hold.fail();
                        w.lu.write_failure(lba, w.len, &e)
                    }
                    None if w.write_through => {
                        let file = p.job.path.file.clone();
                        match tokio::task::spawn_blocking(move || file.sync_data()).await {
                            Ok(Ok(())) => w.lu.write_done(w.len),
                            Ok(Err(e)) => {
                                w.hold.fail();
                                w.lu.write_failure(w.lba, w.len, &e)
                            }
                            Err(_) => {
                                w.hold.fail();
                                internal_failure()
                            }
                        }
                    }
                    None => w.lu.write_done(w.len),
                };
                // The range and the in-flight count go before the status,
                // as when the core returns.
                drop(w);
                r
            }
            PlanState::Pending(_) => unreachable!("finished with the plan pending"),
        };
        Some(response_pdus(
            &p.job.ctx.cmd,
            result,
            p.job.ctx.limits,
            r2ts,
        ))
    };
    let since =
        |t: Option<Instant>| t.map_or(0, |t| t.duration_since(p.received).as_micros() as u64);
    debug!(
        itt,
        len = p.len,
        chunks = p.fill.count(),
        submitted = p.submitted,
        submitted_before_last_data = p.overlapped,
        last_data_us = since(p.last_data),
        finished_us = since(Some(Instant::now())),
        "pipelined write done"
    );
    // The buffer (no op holds it any more) and the budget go back before
    // the status, as for a gathered WRITE.
    let Pipe { job, buf, .. } = p;
    drop(buf);
    let WriteJob { ctx, budget, .. } = job;
    drop(budget);
    // A task whose feed the reader dropped (its connection is gone) has no
    // status to send but is forgotten all the same, so the session's task
    // set does not keep it as "completing" forever.
    if ctx.finish() {
        let items = pdus.into_iter().flatten().map(Outgoing::Pdu);
        ctx.send_and_forget(items).await;
    }
}
