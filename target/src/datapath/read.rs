//! One READ through the engine: [`ReadCommand`] (sans-IO apart from the
//! engine it submits to) holds the command's pool buffer, submits its
//! chunks, marks them valid in a [`Sequencer`] as they complete and releases
//! send units as the wire's order allows (in order for TCP; any order for
//! RDMA or DataPDUInOrder=No). [`Mode::Synchronized`] submits every chunk
//! in one batch; [`Mode::Serial`] reads the whole buffer first: the
//! baseline. The fabric drives it from `rx.recv().await` and hands the
//! units to its data mover (`iscsi::mover`).

use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use super::buffer::BufLease;
use super::chunk::{ChunkPlan, SendOrder, Sequencer};
use super::engine::{completion_channel, Completion, CompletionRx, Engine, OpKind};
use super::source::{pattern_fill, Source};
use super::stats::CommandTimers;

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
    /// Where in the request the first failed chunk starts.
    failed_at: Option<u64>,
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
            failed_at: None,
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
        let r = self.seq.plan().range(i);
        let n = match c.result {
            Ok(n) => n,
            Err(e) => {
                self.failed_at.get_or_insert(r.start);
                return Err(e);
            }
        };
        self.got[i] += n as u64;
        self.pending[i] -= 1;
        if self.pending[i] == 0 {
            if self.got[i] < r.end - r.start {
                self.failed_at.get_or_insert(r.start);
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

    /// Where in the request (bytes from its start) the first chunk whose
    /// read failed begins: the block a MEDIUM ERROR names (SBC-4 4.18), not
    /// the command's first.
    pub fn failed_offset(&self) -> Option<u64> {
        self.failed_at
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
