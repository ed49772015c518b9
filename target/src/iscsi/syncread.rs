//! The engine READ path: synchronized sends over TCP and
//! multi-stream placement over RDMA.
//!
//! For a LUN on this path, a READ(10/12/16) is validated by the SCSI core
//! ([`LunTable::plan_read`]: the normal path, without the data), then read
//! by the I/O engine (io_uring READ_FIXED or the thread pool) into one
//! registered pool buffer in chunks of `sync_chunk` bytes submitted
//! together. Each Data-In PDU leaves as soon as every chunk under it is
//! valid; the GOOD status rides on the last one sent, as in the serial
//! path. The PDU's payload shares the registered buffer (no copy), which
//! returns to the pool once the writer has put the last of them on the
//! socket.
//!
//! Send order (RFC 7143 13.18, 13.19): with DataPDUInOrder=Yes the PDUs go
//! in offset order. With DataPDUInOrder=No a PDU goes as soon as its bytes
//! are valid, with its BufferOffset; since the target always answers
//! DataSequenceInOrder=Yes, sequences (MaxBurstLength each) still go one
//! after the other: a PDU of a later sequence waits until every PDU of the
//! current one is sent. DataSN counts in send order, the F bit goes on the
//! PDU that completes its sequence and the status on the last one sent
//! ([`DataInStamper`]). Over RDMA (an offloaded READ), each chunk is RDMA
//! Written at its offset of the initiator's buffer as soon as it is valid,
//! in any order, and the SCSI Response follows the last completed Write.
//!
//! Each LUN on this path has a [`Mode`]: `Synchronized` as above, or
//! `Serial` (one chunk: read everything into the registered buffer, then
//! send), the baseline of a `direct` LUN without `sync_send`. LUNs are
//! registered from a path ([`SyncReads::enable`]) or from a prebuilt
//! [`Source`] ([`SyncReads::enable_source`]: striped files, no-disk).
//!
//! Every READ served here records its state timers (GMBlock paper Fig. 15: init, disk
//! read, send setup, send not overlapped with the disk, finish) in its
//! LUN's [`PhaseStats`] ([`SyncReads::stats`]) and in a `debug` tracing
//! event inside a `read_cmd` span. On TCP a "send" is the PDU handed to the
//! connection's writer queue.
//!
//! `--no-net` ([`Discard`](super::mover::Discard), benchmark only): a media READ still
//! runs here exactly as above (same chunks, same mode, timers recorded in
//! the LUN's histograms) but its units are dropped as they become valid:
//! no Data-In is sent and the command ends GOOD with a residual underflow
//! of its whole Expected Data Transfer Length, as `--no-net` does on the
//! core's serial path. Its copies count under [`CopyPath::NoNet`]. So
//! `--no-net` measures the engine's disk rate on engine-path LUNs.
//!
//! The core's serial path (read everything on the blocking pool, then
//! send) stays the default for other LUNs, and is the fallback whenever
//! this one cannot run: a READ the core did not plan, an unaligned O_DIRECT
//! range, no free buffer, a submission error, or (TCP) a read error before
//! the first PDU was sent. A read error after some Data-In went out, or any
//! read error of an RDMA-placed READ, ends the command with the core's
//! CHECK CONDITION sense; a failed RDMA Write with ABORTED COMMAND, DATA
//! PHASE ERROR. Abort flags are checked as each PDU is queued, under the
//! task set's lock, so nothing of an aborted task follows the task
//! management response.
//!
//! [`LunTable::plan_read`]: crate::scsi::LunTable::plan_read

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tracing::{debug, warn, Instrument};

use super::datain::DataInSegment;
use super::lun_paths::LunPaths;
use super::mover::{plan_or_core, read_share, run_core, Flow, Layout, Planned, ReadMover};
use super::task::CommandContext;
use crate::datapath::stats::PHASES;
use crate::datapath::{
    open_engine, BufferPool, CommandTimers, CopyCost, Engine, EnginePref, Mode, PhaseStats,
    ReadCommand, ReadConfig, Source,
};
use crate::scsi::read_plan::PlannedRead;

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
    /// State timers of every READ served on this path.
    pub stats: Arc<PhaseStats>,
    /// Data-In PDUs sent at another offset than where the previous one
    /// ended (DataPDUInOrder=No at work), a debug counter.
    pub reordered_pdus: std::sync::atomic::AtomicU64,
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

/// The fabric's engine READ paths: the engine they share, and their
/// entries in the fabric's per-LUN data path table.
pub struct SyncReads {
    engine: Mutex<Option<(Arc<dyn Engine>, String)>>,
    luns: Arc<LunPaths>,
}

impl std::fmt::Debug for SyncReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncReads")
            .field("luns", &self.luns)
            .finish()
    }
}

impl SyncReads {
    /// Engine READ paths recorded in `luns`; no engine is opened yet.
    pub fn new(luns: Arc<LunPaths>) -> SyncReads {
        SyncReads {
            engine: Mutex::default(),
            luns,
        }
    }

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

    /// Makes LUNs enabled from now on use `engine` (e.g. the thread pool,
    /// or an emulated disk for benchmarks) instead of the one
    /// [`SyncReads::engine`] would open; `banner` names it in the log.
    pub fn set_engine(&self, engine: Arc<dyn Engine>, banner: String) {
        *self.engine.lock().unwrap_or_else(|e| e.into_inner()) = Some((engine, banner));
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
        let path = Arc::new(SyncReadLun {
            engine,
            source,
            direct,
            chunk,
            mode,
            stats: Arc::new(PhaseStats::default()),
            reordered_pdus: Default::default(),
        });
        self.luns
            .update(target, lun, |p| p.engine_reads = Some(path));
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
        self.luns.get(target, lun)?.engine_reads.clone()
    }

    /// The state-timer histograms of every LUN on this path, by target and
    /// LUN (for a metrics API and the shutdown summary).
    pub fn stats(&self) -> Vec<(String, u16, Arc<PhaseStats>)> {
        self.luns
            .all()
            .into_iter()
            .filter_map(|(t, l, p)| Some((t, l, p.engine_reads.as_ref()?.stats.clone())))
            .collect()
    }

    /// One line per LUN that served READs: count, bytes, and per phase the
    /// mean and 99th percentile (bucket bound), for the shutdown log.
    pub fn summary(&self) -> Vec<String> {
        self.stats()
            .into_iter()
            .filter(|(_, _, s)| s.histogram(crate::datapath::Phase::Total).count() > 0)
            .map(|(t, l, s)| {
                let phases = PHASES
                    .iter()
                    .map(|&p| {
                        let h = s.histogram(p);
                        format!(
                            "{}={:.0}/{:.0}us",
                            p.name(),
                            h.mean().as_secs_f64() * 1e6,
                            h.quantile(0.99).as_secs_f64() * 1e6
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(" ");
                format!(
                    "{t} LUN {l}: {} READs, {} MiB; mean/p99 {phases}",
                    s.histogram(crate::datapath::Phase::Total).count(),
                    s.bytes.load(Ordering::Relaxed) >> 20
                )
            })
            .collect()
    }
}

/// One pipelined READ: its command's context, its LUN's path and how its
/// units are cut.
pub(super) struct ReadJob {
    pub ctx: Arc<CommandContext>,
    pub path: Arc<SyncReadLun>,
    /// Negotiated DataPDUInOrder: false lets PDUs leave in completion order.
    pub data_pdu_in_order: bool,
    /// When the command was ready to execute (its timers start here).
    pub received: Instant,
}

/// Starts the engine read of a planned READ (blocking), or None to have
/// the core answer it whole: an unaligned O_DIRECT range, more than a pool
/// buffer holds, no free buffer, or a submission error.
fn start(
    ctx: &CommandContext,
    path: &SyncReadLun,
    plan: PlannedRead,
    layout: Layout,
    received: Instant,
) -> Option<Pipelined> {
    let edtl = u64::from(ctx.cmd.expected_data_transfer_length);
    let send = plan.len.min(edtl);
    let aligned = !path.direct || (plan.offset % DIRECT_ALIGN == 0 && send % DIRECT_ALIGN == 0);
    if send == 0 || !aligned || send > path.engine.pool().max_len() as u64 {
        return None;
    }
    let cfg = ReadConfig {
        mode: path.mode,
        chunk: path.chunk,
        units: layout.units(send as u32),
    };
    match ReadCommand::try_start(
        &*path.engine,
        &path.source,
        plan.offset,
        send as usize,
        layout.order,
        &cfg,
        received,
    ) {
        Ok(Some((read, rx))) => Some(Pipelined {
            read: Box::new(read),
            rx,
            len: plan.len,
            lba: plan.lba,
            lu: plan.lu,
            sent_len: send as u32,
            clock: plan.clock,
        }),
        Ok(None) => {
            debug!(itt = ctx.cmd.itt, "no free I/O buffer: serial read");
            None
        }
        Err(e) => {
            warn!(itt = ctx.cmd.itt, error = %e, "pipelined read did not start: serial read");
            None
        }
    }
}

/// Turns the units the sequencer releases into Data-In PDUs in send order
/// (sans-IO, see the module docs): DataSN counts sends, a PDU of a later
/// sequence waits for the current sequence to be sent whole
/// (DataSequenceInOrder=Yes), the F bit goes on the PDU that completes its
/// sequence and `last` on the final one sent. With in-order releases the
/// result equals [`datain::segments`]. Each unit travels with its payload
/// `T`: a unit held back keeps its payload until it is sent, however many
/// releases later.
#[derive(Debug)]
pub struct DataInStamper<T> {
    segs: Vec<DataInSegment>,
    /// Sequence index of each unit.
    seq_of: Vec<u32>,
    /// Units of each sequence not yet sent.
    seq_left: Vec<u32>,
    current: u32,
    /// Units released before their sequence's turn, by sequence, in the
    /// order they were released.
    held: BTreeMap<u32, Vec<(usize, T)>>,
    sent: u32,
}

impl<T> DataInStamper<T> {
    /// For the Data-In segments of one command, in offset order (units are
    /// their indices).
    pub fn new(segs: Vec<DataInSegment>) -> DataInStamper<T> {
        let mut seq_of = Vec::with_capacity(segs.len());
        let mut seq_left = Vec::new();
        let mut seq = 0u32;
        for s in &segs {
            if seq_left.len() <= seq as usize {
                seq_left.push(0);
            }
            seq_of.push(seq);
            seq_left[seq as usize] += 1;
            if s.final_in_sequence {
                seq += 1;
            }
        }
        DataInStamper {
            segs,
            seq_of,
            seq_left,
            current: 0,
            held: BTreeMap::new(),
            sent: 0,
        }
    }

    /// PDUs sent so far.
    pub fn sent(&self) -> u32 {
        self.sent
    }

    /// Units just released, each with its payload: the ones to send now, in
    /// order, each with its segment as it goes on the wire and its payload.
    pub fn release(
        &mut self,
        units: impl IntoIterator<Item = (usize, T)>,
    ) -> Vec<(usize, DataInSegment, T)> {
        let mut out = Vec::new();
        for (u, payload) in units {
            let seq = self.seq_of[u];
            if seq != self.current {
                self.held.entry(seq).or_default().push((u, payload));
                continue;
            }
            self.stamp(u, payload, &mut out);
            // A finished sequence lets the next one go, with what of it
            // already waits, and so on: a loop, since the run of waiting
            // sequences may be as long as the command has PDUs.
            while self.seq_left.get(self.current as usize) == Some(&0) {
                self.current += 1;
                for (h, payload) in self.held.remove(&self.current).unwrap_or_default() {
                    self.stamp(h, payload, &mut out);
                }
            }
        }
        out
    }

    /// Sends unit `u` of the current sequence: its DataSN, F bit and the
    /// command's last-PDU mark.
    fn stamp(&mut self, u: usize, payload: T, out: &mut Vec<(usize, DataInSegment, T)>) {
        let s = self.seq_of[u] as usize;
        self.seq_left[s] -= 1;
        let total = self.segs.len() as u32;
        let seg = DataInSegment {
            data_sn: self.sent,
            final_in_sequence: self.seq_left[s] == 0,
            last: self.sent + 1 == total,
            ..self.segs[u]
        };
        self.sent += 1;
        out.push((u, seg, payload));
    }
}

/// Records a finished command's timers in its LUN's statistics and as a
/// debug event (inside the command's `read_cmd` span).
fn record(job: &ReadJob, t: &CommandTimers, bytes: u64) {
    use crate::datapath::Phase::*;
    tracing::debug!(
        init_us = t.phase(Init).as_micros() as u64,
        disk_read_us = t.phase(DiskRead).as_micros() as u64,
        send_setup_us = t.phase(SendSetup).as_micros() as u64,
        send_unoverlapped_us = t.phase(SendUnoverlapped).as_micros() as u64,
        fin_us = t.phase(Fin).as_micros() as u64,
        total_us = t.phase(Total).as_micros() as u64,
        bytes,
        "READ finished"
    );
    // The payloads share the registered buffer: no user-space copy here
    // (what the socket write costs is counted by the send path).
    job.path.stats.record(t, bytes, CopyCost::default());
}

/// Runs one READ on the pipelined path (see the module docs), its data
/// moved by `mover`.
pub(super) async fn serve<M: ReadMover>(job: ReadJob, mover: M) {
    let span = tracing::debug_span!(
        "read_cmd",
        itt = job.ctx.cmd.itt,
        lun = job.ctx.cmd.lun.index().unwrap_or(u16::MAX),
        len = job.ctx.cmd.expected_data_transfer_length,
        mode = ?job.path.mode,
        wire = mover.wire(),
        in_order = job.data_pdu_in_order,
    );
    serve_inner(job, mover).instrument(span).await
}

async fn serve_inner<M: ReadMover>(job: ReadJob, mut m: M) {
    let ctx = job.ctx.clone();
    let itt = ctx.cmd.itt;
    let layout = m.layout(&ctx, job.data_pdu_in_order);
    let (path, received) = (job.path.clone(), job.received);
    let mut p =
        match plan_or_core(&ctx, move |c, plan| start(c, &path, plan, layout, received)).await {
            Planned::Go(p) => p,
            Planned::Aborted => {
                m.answer(&ctx, None, 0).await;
                return;
            }
            Planned::Answer(r, core, share) => {
                m.keep_share(share);
                m.answer(&ctx, Some((r, core)), 0).await;
                return;
            }
        };
    let mut failure = None;
    loop {
        let ready = p.read.take_ready();
        let moved = !ready.is_empty();
        if moved {
            p.read
                .timers_mut()
                .first_send
                .get_or_insert_with(Instant::now);
        }
        let units = ready
            .into_iter()
            .map(|u| {
                let (r, data) = p.read.unit_bytes(u);
                (u, r, data)
            })
            .collect();
        match m.chunks(&ctx, units, p.len).await {
            Flow::More => {}
            Flow::Done => break,
            Flow::Ended(good) => {
                if good {
                    let now = Instant::now();
                    let t = p.read.timers_mut();
                    t.last_send_done = Some(now);
                    t.finished = Some(now);
                    let t = *t;
                    record(&job, &t, u64::from(p.sent_len));
                }
                return;
            }
        }
        if moved {
            p.read.timers_mut().last_send_done = Some(Instant::now());
        }
        if p.read.all_released() {
            break;
        }
        if let Err(e) = p.next_completions().await {
            if m.may_fall_back() {
                // Nothing left yet: the core reads it whole, and counts it;
                // the plan counts it only if the core does not run it (an
                // abort first), as an error.
                let clock = p.clock.clone();
                drop(p);
                warn!(itt, wire = m.wire(), error = %e, "pipelined read failed: serial read");
                let share = read_share(&ctx).await;
                m.keep_share(share);
                let r = run_core(&ctx, Vec::new(), ()).await;
                if r.is_some() {
                    clock.forget();
                } else {
                    clock.fail();
                }
                drop(clock);
                m.answer(&ctx, r, 0).await;
                return;
            }
            warn!(itt, error = %e, "pipelined read failed");
            p.clock.fail();
            // The failed chunk's first block, as INFORMATION says (data
            // of the chunks before it may have gone already).
            let into = p.read.failed_offset().unwrap_or(0) / u64::from(p.lu.block_size());
            failure = Some(p.lu.read_failure(p.lba + into, p.len, &e));
            break;
        }
    }
    let good = m.end(&ctx, failure, p.len).await;
    let t = p.read.timers_mut();
    t.last_send_done.get_or_insert_with(Instant::now);
    if good {
        t.finished = Some(Instant::now());
        let t = *t;
        record(&job, &t, u64::from(p.sent_len));
    }
}

/// A read in flight.
struct Pipelined {
    read: Box<ReadCommand>,
    rx: crate::datapath::CompletionRx,
    len: u64,
    lba: u64,
    lu: Arc<crate::scsi::LogicalUnit>,
    sent_len: u32,
    /// Times the READ in the LUN's statistics until the task ends (its
    /// status queued or it was aborted).
    clock: Arc<crate::scsi::stats::CommandClock>,
}

impl Pipelined {
    /// Waits for at least one completion and applies every one already
    /// there.
    async fn next_completions(&mut self) -> io::Result<()> {
        match self.rx.recv().await {
            None => Err(io::Error::other("I/O engine dropped a completion")),
            Some(c) => {
                self.read.on_completion(c, Instant::now())?;
                while let Ok(c) = self.rx.try_recv() {
                    self.read.on_completion(c, Instant::now())?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests;
