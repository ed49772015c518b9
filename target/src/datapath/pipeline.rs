//! Synchronized sends, single- and multiple-stream (GMBlock paper §6.2-6.3;
//! the synchronized-sends paper, with its firmware markers replaced by
//! engine completions) and double-buffered writes, over any [`Engine`].
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
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::buffer::BufLease;
use super::chunk::ChunkPlan;
use super::engine::{completion_channel, CompletionRx, Engine, OpKind};
use super::read::{Mode, ReadCommand, ReadConfig};
use super::sink::{ChunkProducer, ChunkSink};
use super::source::Source;
use super::stats::{CommandTimers, CopyCost, PhaseStats, USER_COPIED_BYTES};

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
                cmd.timers_mut().first_send.get_or_insert_with(Instant::now);
                for u in ready {
                    let (r, data) = cmd.unit(u);
                    cost += sink.send(r, data)?;
                    units += 1;
                }
                cmd.timers_mut().last_send_done = Some(Instant::now());
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
        cmd.timers_mut().finished = Some(Instant::now());
        let timers = *cmd.timers_mut();
        self.finish(&timers, len as u64, cost);
        Ok(CommandReport {
            timers,
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
