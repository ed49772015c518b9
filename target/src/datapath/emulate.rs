//! Token-bucket emulation of a disk of rate `r_disk` and a network of rate
//! `r_net` (the seed papers' settings), for benchmarks and tests.
//!
//! A [`Pacer`] is a bucket with no burst: a transfer of `n` bytes occupies
//! the device for `n / rate` seconds after it becomes free; sleeps target
//! absolute deadlines so oversleeping never accumulates.

use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::buffer::BufferPool;
use super::chunk::SendOrder;
use super::engine::{completion_channel, Completion, CompletionTx, Engine, EngineKind, IoOp};
use super::sink::{ChunkProducer, ChunkSink};
use super::stats::CopyCost;

/// Asks for 1 µs timer slack on the calling thread, so sleeps end close to
/// their deadline (the default slack is 50 µs).
pub fn precise_sleeps() {
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000u64, 0u64, 0u64, 0u64) };
}

/// Sleeps until `deadline`.
pub fn sleep_until(deadline: Instant) {
    let now = Instant::now();
    if deadline > now {
        std::thread::sleep(deadline - now);
    }
}

/// A device busy for `bytes / rate` per transfer.
#[derive(Debug, Clone, Copy)]
pub struct Pacer {
    rate: f64,
    free_at: Instant,
}

impl Pacer {
    /// `rate` in bytes per second.
    pub fn new(rate: f64) -> Pacer {
        Pacer {
            rate,
            free_at: Instant::now(),
        }
    }
    /// Books a transfer of `bytes` starting no earlier than now; returns
    /// when it ends.
    pub fn admit(&mut self, bytes: usize) -> Instant {
        let start = self.free_at.max(Instant::now());
        self.free_at = start + Duration::from_secs_f64(bytes as f64 / self.rate);
        self.free_at
    }
    /// When the device is next idle.
    pub fn free_at(&self) -> Instant {
        self.free_at
    }
}

/// An emulated disk: one FIFO stream per `IoOp::stream` (a stripe member),
/// each at `rate_per_stream` bytes/s. Each op gets its deadline when
/// submitted (after the stream's previous op); its completion is delivered
/// at that deadline, or later if the real I/O is slower. With an inner
/// engine the data really move (the whole batch goes to it at once);
/// without one the buffer is left as is (bogus data, like the
/// synchronized-sends paper's `gmblock-bogussynchro`).
pub struct ThrottledEngine {
    pool: BufferPool,
    pacers: Mutex<Vec<Pacer>>,
    timer: Option<Sender<Due>>,
    threads: Vec<JoinHandle<()>>,
    rate: f64,
    inner: Option<Arc<dyn Engine>>,
    /// Inner-engine tag -> (deadline, original tag, reply channel).
    waiting: Waiting,
    inner_tx: Option<CompletionTx>,
    next_id: AtomicU64,
}

/// Inner-engine tag -> (deadline, original tag, reply channel).
type Waiting = Arc<Mutex<HashMap<u64, (Instant, u64, CompletionTx)>>>;

struct Due {
    at: Instant,
    seq: u64,
    tag: u64,
    tx: CompletionTx,
    result: io::Result<usize>,
}

impl PartialEq for Due {
    fn eq(&self, o: &Due) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, o: &Due) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Due {
    fn cmp(&self, o: &Due) -> std::cmp::Ordering {
        // Min-heap on (deadline, arrival).
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

fn timer_loop(rx: Receiver<Due>) {
    precise_sleeps();
    let mut heap = BinaryHeap::<Due>::new();
    loop {
        let msg = match heap.peek() {
            None => match rx.recv() {
                Ok(d) => Some(d),
                Err(_) => return,
            },
            Some(top) => {
                let now = Instant::now();
                if top.at <= now {
                    let d = heap.pop().unwrap();
                    let _ = d.tx.send(Completion {
                        tag: d.tag,
                        result: d.result,
                    });
                    continue;
                }
                match rx.recv_timeout(top.at - now) {
                    Ok(d) => Some(d),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => {
                        sleep_until(top.at);
                        None
                    }
                }
            }
        };
        if let Some(d) = msg {
            heap.push(d);
        }
    }
}

impl ThrottledEngine {
    /// `streams` streams of `rate_per_stream` bytes/s over `pool`, moving
    /// data through `inner` when given (then the inner engine's pool is
    /// used instead of `pool`: its buffers are the registered ones).
    pub fn new(
        pool: BufferPool,
        streams: usize,
        rate_per_stream: f64,
        inner: Option<Arc<dyn Engine>>,
    ) -> ThrottledEngine {
        let pool = inner.as_ref().map(|e| e.pool().clone()).unwrap_or(pool);
        let (ttx, trx) = channel::<Due>();
        let mut threads = vec![std::thread::Builder::new()
            .name("bw-emu-disk".into())
            .spawn(move || timer_loop(trx))
            .expect("spawn emulated disk timer")];
        let waiting: Waiting = Arc::default();
        let mut inner_tx = None;
        if inner.is_some() {
            let (itx, mut irx) = completion_channel();
            inner_tx = Some(itx);
            let w = waiting.clone();
            let ttx = ttx.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("bw-emu-disk-fwd".into())
                    .spawn(move || {
                        let mut seq = u64::MAX / 2;
                        while let Some(c) = irx.blocking_recv() {
                            let Some((at, tag, tx)) = w.lock().unwrap().remove(&c.tag) else {
                                continue;
                            };
                            seq += 1;
                            let _ = ttx.send(Due {
                                at,
                                seq,
                                tag,
                                tx,
                                result: c.result,
                            });
                        }
                    })
                    .expect("spawn emulated disk forwarder"),
            );
        }
        ThrottledEngine {
            pool,
            pacers: Mutex::new(vec![Pacer::new(rate_per_stream); streams.max(1)]),
            timer: Some(ttx),
            threads,
            rate: rate_per_stream,
            inner,
            waiting,
            inner_tx,
            next_id: AtomicU64::new(0),
        }
    }
}

impl Engine for ThrottledEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Emulated
    }
    fn describe(&self) -> String {
        format!(
            "emulated disk: {} streams x {:.1} MB/s{}",
            self.pacers.lock().unwrap().len(),
            self.rate / 1e6,
            match &self.inner {
                Some(e) => format!(" over {}", e.describe()),
                None => " (no data)".to_string(),
            }
        )
    }
    fn pool(&self) -> &BufferPool {
        &self.pool
    }
    fn submit(&self, ops: Vec<IoOp>, done: &CompletionTx) -> io::Result<()> {
        let timer = self.timer.as_ref().expect("running");
        let mut pacers = self.pacers.lock().unwrap();
        let n = pacers.len();
        let mut inner_ops = Vec::new();
        for mut op in ops {
            let at = pacers[op.stream as usize % n].admit(op.len);
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            match &self.inner {
                Some(_) => {
                    self.waiting
                        .lock()
                        .unwrap()
                        .insert(id, (at, op.tag, done.clone()));
                    op.tag = id;
                    inner_ops.push(op);
                }
                None => {
                    let (tag, len) = (op.tag, op.len);
                    drop(op);
                    timer
                        .send(Due {
                            at,
                            seq: id,
                            tag,
                            tx: done.clone(),
                            result: Ok(len),
                        })
                        .map_err(|_| io::Error::other("emulated disk stopped"))?;
                }
            }
        }
        drop(pacers);
        if let (Some(e), Some(itx)) = (&self.inner, &self.inner_tx) {
            e.submit(inner_ops, itx)?;
        }
        Ok(())
    }
}

impl Drop for ThrottledEngine {
    fn drop(&mut self) {
        self.timer.take();
        self.inner_tx.take();
        self.inner.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// An emulated network link of `rate` bytes/s in front of a sink. A send
/// returns once the link is at most `slack` behind (a socket buffer of
/// `slack * rate` bytes); `finish` waits until the link is idle.
pub struct ThrottledSink<S: ChunkSink> {
    /// The sink behind the link.
    pub inner: S,
    pacer: Pacer,
    slack: Duration,
}

impl<S: ChunkSink> ThrottledSink<S> {
    /// `rate` bytes/s before `inner`.
    pub fn new(inner: S, rate: f64, slack: Duration) -> ThrottledSink<S> {
        precise_sleeps();
        ThrottledSink {
            inner,
            pacer: Pacer::new(rate),
            slack,
        }
    }
}

impl<S: ChunkSink> ChunkSink for ThrottledSink<S> {
    fn order(&self) -> SendOrder {
        self.inner.order()
    }
    fn send(&mut self, bytes: Range<u64>, data: &[u8]) -> io::Result<CopyCost> {
        let c = self.inner.send(bytes, data)?;
        let end = self.pacer.admit(data.len());
        sleep_until(end - self.slack);
        Ok(c)
    }
    fn finish(&mut self) -> io::Result<CopyCost> {
        sleep_until(self.pacer.free_at());
        self.inner.finish()
    }
}

/// An emulated network link of `rate` bytes/s in front of a producer: each
/// fill returns when its bytes have crossed the link.
pub struct ThrottledProducer<P: ChunkProducer> {
    /// The producer behind the link.
    pub inner: P,
    pacer: Pacer,
}

impl<P: ChunkProducer> ThrottledProducer<P> {
    /// `rate` bytes/s before `inner`.
    pub fn new(inner: P, rate: f64) -> ThrottledProducer<P> {
        precise_sleeps();
        ThrottledProducer {
            inner,
            pacer: Pacer::new(rate),
        }
    }
}

impl<P: ChunkProducer> ChunkProducer for ThrottledProducer<P> {
    fn fill(&mut self, bytes: Range<u64>, buf: &mut [u8]) -> io::Result<CopyCost> {
        let end = self.pacer.admit(buf.len());
        let c = self.inner.fill(bytes, buf)?;
        sleep_until(end);
        Ok(c)
    }
}
