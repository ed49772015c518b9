//! Synchronized sends (P0 M0.10/M0.11, P1 M1.6-M1.8) and double-buffered
//! writes, over any [`Engine`].
//!
//! A READ of `len` bytes is one pool buffer. In [`Mode::Synchronized`] its
//! chunks of `chunk` bytes are all submitted in one batch; each completion
//! marks a chunk valid in a [`Sequencer`], which releases send units as soon
//! as the sink's order allows (in order for TCP; any order for RDMA or
//! DataPDUInOrder=No). In [`Mode::Serial`] the whole buffer is read first
//! and then sent: the baseline.
//!
//! [`ReadCommand`] is the state of one READ and does no blocking: an async
//! fabric drives it from `rx.recv().await`; [`Pipeline::read`] drives it on
//! the calling (blocking) thread.

use std::io;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::buffer::BufLease;
use super::chunk::{ChunkPlan, SendOrder, Sequencer};
use super::engine::{completion_channel, Completion, CompletionRx, Engine, OpKind};
use super::sink::{ChunkProducer, ChunkSink};
use super::source::{pattern_fill, Source};
use super::stats::{CommandTimers, CopyCost, PhaseStats, USER_COPIED_BYTES};

/// Serial baseline or overlapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Read everything, then send (or receive everything, then write).
    Serial,
    /// Chunked and overlapped.
    Synchronized,
}

/// How to run one READ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadConfig {
    /// Serial or synchronized.
    pub mode: Mode,
    /// Chunk size `c` in bytes (disk completion granularity).
    pub chunk: usize,
    /// Send units (request-relative ranges tiling the request, e.g. the
    /// Data-In PDUs from `iscsi::datain::segments`); `None` means one unit
    /// per `chunk` bytes.
    pub units: Option<Vec<Range<u64>>>,
}

impl ReadConfig {
    /// Synchronized with chunk `c`, units = chunks.
    pub fn synchronized(chunk: usize) -> ReadConfig {
        ReadConfig {
            mode: Mode::Synchronized,
            chunk,
            units: None,
        }
    }
    /// Serial, sending in units of `chunk` after the whole read.
    pub fn serial(chunk: usize) -> ReadConfig {
        ReadConfig {
            mode: Mode::Serial,
            chunk,
            units: None,
        }
    }
}

/// What one command did.
#[derive(Debug, Clone, Copy)]
pub struct CommandReport {
    /// Its state timers.
    pub timers: CommandTimers,
    /// Bytes copied on its behalf.
    pub copies: CopyCost,
    /// Bytes moved.
    pub bytes: u64,
    /// Sends (or receives) made.
    pub units: usize,
}

/// The state of one READ in flight. Holds the buffer; releases units.
pub struct ReadCommand {
    buf: Arc<BufLease>,
    seq: Sequencer,
    /// Ops outstanding per chunk.
    pending: Vec<u32>,
    /// Bytes read so far per chunk (a chunk short at its end is an error).
    got: Vec<u64>,
    timers: CommandTimers,
    released_now: Vec<usize>,
}

impl std::fmt::Debug for ReadCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadCommand")
            .field("len", &self.seq.plan().len)
            .field("valid", &self.seq.valid_bytes())
            .finish()
    }
}

impl ReadCommand {
    /// Takes a buffer for `len` bytes of device range starting at
    /// `dev_offset` from `src`, submits every chunk read in one batch and
    /// returns the command with the channel its completions arrive on.
    /// Units already sendable (no-disk mode) are in [`ReadCommand::take_ready`].
    /// Blocks only while the pool has no free buffer.
    pub fn start(
        engine: &dyn Engine,
        src: &Source,
        dev_offset: u64,
        len: usize,
        order: SendOrder,
        cfg: &ReadConfig,
        received: Instant,
    ) -> io::Result<(ReadCommand, CompletionRx)> {
        let lease = engine.pool().acquire(len).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "READ of {len} bytes is larger than the largest I/O buffer ({} bytes): split it",
                    engine.pool().max_len()
                ),
            )
        })?;
        Self::start_in(engine, lease, src, dev_offset, len, order, cfg, received)
    }

    /// Like [`ReadCommand::start`] but never waits for a buffer: `Ok(None)`
    /// when the pool has no free buffer of `len` bytes right now (or none
    /// that large at all). For async callers, which then fall back to the
    /// serial path rather than block.
    pub fn try_start(
        engine: &dyn Engine,
        src: &Source,
        dev_offset: u64,
        len: usize,
        order: SendOrder,
        cfg: &ReadConfig,
        received: Instant,
    ) -> io::Result<Option<(ReadCommand, CompletionRx)>> {
        match engine.pool().try_acquire(len) {
            None => Ok(None),
            Some(lease) => {
                Self::start_in(engine, lease, src, dev_offset, len, order, cfg, received).map(Some)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn start_in(
        engine: &dyn Engine,
        mut lease: BufLease,
        src: &Source,
        dev_offset: u64,
        len: usize,
        order: SendOrder,
        cfg: &ReadConfig,
        received: Instant,
    ) -> io::Result<(ReadCommand, CompletionRx)> {
        let mut timers = CommandTimers::new(received);
        if matches!(src, Source::Pattern) {
            pattern_fill(dev_offset, lease.as_mut_slice());
        }
        let chunk = match cfg.mode {
            Mode::Synchronized => cfg.chunk.max(1) as u64,
            Mode::Serial => len.max(1) as u64,
        };
        let plan = ChunkPlan::new(len as u64, chunk);
        let units = cfg.units.clone().unwrap_or_else(|| {
            let c = cfg.chunk.max(1) as u64;
            (0..(len as u64).div_ceil(c))
                .map(|i| i * c..((i + 1) * c).min(len as u64))
                .collect()
        });
        let seq = Sequencer::new(plan, units, order);
        let buf = Arc::new(lease);
        let (tx, rx) = completion_channel();
        let mut ops = Vec::new();
        let mut pending = vec![0u32; plan.count()];
        for (i, r) in plan.ranges().enumerate() {
            let o = src.ops(
                OpKind::Read,
                dev_offset + r.start..dev_offset + r.end,
                &buf,
                r.start as usize,
                i as u64,
            );
            pending[i] = o.len() as u32;
            ops.extend(o);
        }
        let mut cmd = ReadCommand {
            buf,
            seq,
            got: vec![0; pending.len()],
            pending,
            timers,
            released_now: Vec::new(),
        };
        if !ops.is_empty() {
            engine.submit(ops, &tx)?;
        }
        timers = cmd.timers;
        timers.submitted = Some(Instant::now());
        cmd.timers = timers;
        // Chunks with no ops (no-disk, zero-length) are valid at once.
        for i in 0..plan.count() {
            if cmd.pending[i] == 0 {
                cmd.chunk_valid(i, Instant::now());
            }
        }
        if plan.count() == 0 {
            cmd.timers.disk_done = cmd.timers.submitted;
        }
        Ok((cmd, rx))
    }

    fn chunk_valid(&mut self, i: usize, now: Instant) {
        let newly = self.seq.on_valid(i);
        self.timers.first_valid.get_or_insert(now);
        if self.seq.all_valid() {
            self.timers.disk_done = Some(now);
        }
        self.released_now.extend(newly);
    }

    /// Applies one completion. Returns an error for a failed or short read
    /// (the command should end with CHECK CONDITION, MEDIUM ERROR).
    pub fn on_completion(&mut self, c: Completion, now: Instant) -> io::Result<()> {
        let i = c.tag as usize;
        let n = c.result?;
        self.got[i] += n as u64;
        self.pending[i] -= 1;
        if self.pending[i] == 0 {
            let r = self.seq.plan().range(i);
            if self.got[i] < r.end - r.start {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "short read: {} of {} bytes at request offset {}",
                        self.got[i],
                        r.end - r.start,
                        r.start
                    ),
                ));
            }
            self.chunk_valid(i, now);
        }
        Ok(())
    }

    /// Units released since the last call, in the order to send them.
    pub fn take_ready(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.released_now)
    }

    /// A released unit's request range and bytes.
    pub fn unit(&self, u: usize) -> (Range<u64>, &[u8]) {
        let r = self.seq.unit(u);
        for c in self.seq.plan().chunks_of(&r) {
            assert_eq!(self.pending[c], 0, "unit {u} is not valid yet");
        }
        // SAFETY: every chunk of the unit has completed: no I/O writes it.
        let data = unsafe { self.buf.slice(r.start as usize..r.end as usize) };
        (r, data)
    }

    /// A released unit's request range and its bytes as a [`bytes::Bytes`]
    /// that shares the registered buffer (no copy): the buffer goes back
    /// to the pool only once every such `Bytes` and the command are dropped,
    /// e.g. after the writer has put the Data-In PDU on the socket.
    pub fn unit_bytes(&self, u: usize) -> (Range<u64>, bytes::Bytes) {
        let r = self.seq.unit(u);
        for c in self.seq.plan().chunks_of(&r) {
            assert_eq!(self.pending[c], 0, "unit {u} is not valid yet");
        }
        let owner = UnitView {
            buf: self.buf.clone(),
            range: r.start as usize..r.end as usize,
        };
        (r, bytes::Bytes::from_owner(owner))
    }

    /// Whether every unit has been released.
    pub fn all_released(&self) -> bool {
        self.seq.all_released()
    }

    /// The timers, for the fabric to stamp sends and the finish.
    pub fn timers_mut(&mut self) -> &mut CommandTimers {
        &mut self.timers
    }
}

/// A valid range of a READ's buffer, kept alive by its lease.
struct UnitView {
    buf: Arc<BufLease>,
    range: Range<usize>,
}

impl AsRef<[u8]> for UnitView {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: built only by `unit_bytes` for a unit whose chunks have all
        // completed; no later I/O of the command writes this range, and the
        // lease is not reused while this view holds it.
        unsafe { self.buf.slice(self.range.clone()) }
    }
}

/// How to run one WRITE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteConfig {
    /// Serial (receive all, then write) or pipelined.
    pub mode: Mode,
    /// Chunk size in bytes.
    pub chunk: usize,
    /// Buffers in rotation: 2 is double buffering.
    pub depth: usize,
}

/// Runs commands over one engine and keeps their statistics.
pub struct Pipeline {
    engine: Arc<dyn Engine>,
    stats: Arc<PhaseStats>,
}

impl Pipeline {
    /// Over `engine`.
    pub fn new(engine: Arc<dyn Engine>) -> Pipeline {
        Pipeline {
            engine,
            stats: Arc::new(PhaseStats::default()),
        }
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }

    /// Statistics of every command run so far.
    pub fn stats(&self) -> &Arc<PhaseStats> {
        &self.stats
    }

    /// Reads `len` bytes at `dev_offset` of `src` and hands them to `sink`
    /// (synchronized or serial per `cfg`), then calls `sink.finish()`.
    /// Blocks the calling thread: not for use on an async executor thread.
    pub fn read(
        &self,
        src: &Source,
        dev_offset: u64,
        len: usize,
        cfg: &ReadConfig,
        sink: &mut dyn ChunkSink,
    ) -> io::Result<CommandReport> {
        let span = tracing::debug_span!("read_cmd", len, chunk = cfg.chunk, mode = ?cfg.mode);
        let _g = span.enter();
        let received = Instant::now();
        let (mut cmd, mut rx) = ReadCommand::start(
            &*self.engine,
            src,
            dev_offset,
            len,
            sink.order(),
            cfg,
            received,
        )?;
        let mut cost = CopyCost::default();
        let mut units = 0;
        loop {
            let ready = cmd.take_ready();
            if !ready.is_empty() {
                cmd.timers.first_send.get_or_insert_with(Instant::now);
                for u in ready {
                    let (r, data) = cmd.unit(u);
                    cost += sink.send(r, data)?;
                    units += 1;
                }
                cmd.timers.last_send_done = Some(Instant::now());
            }
            if cmd.all_released() {
                break;
            }
            let c = rx
                .blocking_recv()
                .ok_or_else(|| io::Error::other("I/O engine dropped a completion"))?;
            cmd.on_completion(c, Instant::now())?;
            // Apply whatever else already completed before sending again.
            while let Ok(c) = rx.try_recv() {
                cmd.on_completion(c, Instant::now())?;
            }
        }
        cost += sink.finish()?;
        cmd.timers.finished = Some(Instant::now());
        self.finish(&cmd.timers, len as u64, cost);
        Ok(CommandReport {
            timers: cmd.timers,
            copies: cost,
            bytes: len as u64,
            units,
        })
    }

    fn finish(&self, t: &CommandTimers, bytes: u64, cost: CopyCost) {
        use super::stats::Phase::*;
        tracing::debug!(
            init_us = t.phase(Init).as_micros() as u64,
            disk_read_us = t.phase(DiskRead).as_micros() as u64,
            send_setup_us = t.phase(SendSetup).as_micros() as u64,
            send_unoverlapped_us = t.phase(SendUnoverlapped).as_micros() as u64,
            fin_us = t.phase(Fin).as_micros() as u64,
            user_copied = cost.user,
            "command finished"
        );
        USER_COPIED_BYTES.fetch_add(cost.user as u64, Ordering::Relaxed);
        self.stats.record(t, bytes, cost);
    }

    /// Writes `len` bytes from `incoming` to `dst` at `dev_offset`. In
    /// [`Mode::Synchronized`], `cfg.depth` chunk buffers rotate: chunk k goes
    /// to disk while chunk k+1 arrives. In [`Mode::Serial`], everything
    /// arrives into one buffer before the disk write starts.
    /// Timers: `first_valid`/`last_send_done` mark data arrival, `disk_done`
    /// the last write.
    pub fn write(
        &self,
        dst: &Source,
        dev_offset: u64,
        len: usize,
        cfg: &WriteConfig,
        incoming: &mut dyn ChunkProducer,
    ) -> io::Result<CommandReport> {
        let span = tracing::debug_span!("write_cmd", len, chunk = cfg.chunk, mode = ?cfg.mode);
        let _g = span.enter();
        let mut t = CommandTimers::new(Instant::now());
        let (chunk, depth) = match cfg.mode {
            Mode::Synchronized => (cfg.chunk.max(1).min(len.max(1)), cfg.depth.max(1)),
            Mode::Serial => (len.max(1), 1),
        };
        let recv_unit = cfg.chunk.max(1);
        let pool = self.engine.pool();
        let mut bufs: Vec<Arc<BufLease>> = (0..depth)
            .map(|_| {
                pool.acquire(chunk).map(Arc::new).ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "write chunk larger than any I/O buffer",
                    )
                })
            })
            .collect::<io::Result<_>>()?;
        let mut busy = vec![0u32; depth];
        let (tx, mut rx) = completion_channel();
        let mut cost = CopyCost::default();
        let mut units = 0;
        let plan = ChunkPlan::new(len as u64, chunk as u64);
        t.submitted = Some(Instant::now());
        let wait_one = |rx: &mut CompletionRx, busy: &mut [u32]| -> io::Result<()> {
            let c = rx
                .blocking_recv()
                .ok_or_else(|| io::Error::other("I/O engine dropped a completion"))?;
            c.result?;
            busy[c.tag as usize] -= 1;
            Ok(())
        };
        for (i, r) in plan.ranges().enumerate() {
            let slot = i % depth;
            while busy[slot] > 0 {
                wait_one(&mut rx, &mut busy)?;
            }
            let b = Arc::get_mut(&mut bufs[slot]).expect("no I/O in flight on an idle buffer");
            let n = (r.end - r.start) as usize;
            // Receive in units of cfg.chunk (so serial mode sees the same
            // arrivals as the pipelined one).
            let region = &mut b.as_mut_slice()[..n];
            let mut at = 0;
            t.first_valid.get_or_insert_with(Instant::now);
            while at < n {
                let m = recv_unit.min(n - at);
                let abs = r.start + at as u64;
                cost += incoming.fill(abs..abs + m as u64, &mut region[at..at + m])?;
                at += m;
                units += 1;
            }
            t.last_send_done = Some(Instant::now());
            let ops = dst.ops(
                OpKind::Write,
                dev_offset + r.start..dev_offset + r.end,
                &bufs[slot],
                0,
                slot as u64,
            );
            busy[slot] = ops.len() as u32;
            if !ops.is_empty() {
                self.engine.submit(ops, &tx)?;
            }
        }
        while busy.iter().any(|&b| b > 0) {
            wait_one(&mut rx, &mut busy)?;
        }
        t.disk_done = Some(Instant::now());
        t.finished = t.disk_done;
        USER_COPIED_BYTES.fetch_add(cost.user as u64, Ordering::Relaxed);
        self.stats.record(&t, len as u64, cost);
        Ok(CommandReport {
            timers: t,
            copies: cost,
            bytes: len as u64,
            units,
        })
    }
}
