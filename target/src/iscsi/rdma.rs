//! RDMA-assisted iSCSI on the target (docs/rdma-assisted-iscsi.md).
//!
//! Control stays on the iSCSI TCP connection; the data of offloaded commands moves by
//! one-sided RDMA between the target's pre-registered buffer pool and the buffers the
//! initiator advertised in the command's descriptor AHS: READ data by RDMA Write before
//! the SCSI Response, WRITE data by RDMA Read before execution.
//!
//! [`RdmaService`] runs the listener of the configured provider (the soft provider, RDMA
//! over TCP, or verbs: RDMA NICs and Soft-RoCE). A session that was granted offload at
//! login registers its token here ([`RdmaService::register`]); the initiator's RDMA
//! connection must present that token and the session's TSIH in its private data, or it
//! is rejected. The accepted queue pair becomes the session's [`Binding`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use blockwire_transport::assist::{reject, BindRequest, Descriptor, TOKEN_LEN};
use blockwire_transport::rdma::any::{AnyCq, AnyPd, AnyProvider, AnyQp, Backend};
use blockwire_transport::rdma::{
    CompletionQueue, ConnectRequest, QpCaps, QpInit, QueuePair, RdmaListener, RdmaProvider,
    RemoteBuf, SendOp, SendWr, Sge, WcStatus,
};
use blockwire_transport::reg::{plan_ops, BufferPool, Chunk, PoolBuf, PoolConfig};
use tokio::sync::{oneshot, watch};
use tracing::{debug, info, warn};

/// Largest RDMA operation the target posts (a chunk longer than this is split).
const MAX_OP: u64 = 4 << 20;
/// How long a command waits for the session's RDMA connection to appear. The
/// initiator sends a descriptor only once its side of the connection is up, so
/// the wait is the target's accept catching up; a loaded host can take seconds.
const BIND_WAIT: Duration = Duration::from_secs(10);
/// How long a bind request for an already bound session waits for the old
/// connection's failure, and for a bind being accepted, to show on this side
/// before it is refused.
const REPLACEMENT_WAIT: Duration = Duration::from_millis(500);
/// How long, once a connection is torn down for operations that never
/// completed, its flush completions may take before the staging buffers of
/// those operations are given up for good (see [`tear_down_for_good`]).
const FLUSH_WAIT: Duration = Duration::from_secs(5);

/// Counters of the RDMA data path.
#[derive(Debug, Default)]
pub struct RdmaCounters {
    pub binds: AtomicU64,
    pub rejected_binds: AtomicU64,
    pub rdma_writes: AtomicU64,
    pub rdma_reads: AtomicU64,
    pub bytes_written: AtomicU64,
    pub bytes_read: AtomicU64,
    /// Offloaded commands whose data transfer failed (bad key, bounds, lost QP).
    pub failed_transfers: AtomicU64,
    pub offloaded_commands: AtomicU64,
}

/// The target's RDMA endpoint and the sessions bound to it.
pub struct RdmaService {
    provider: AnyProvider,
    pd: AnyPd,
    pool: BufferPool<AnyPd>,
    endpoint: SocketAddr,
    slots: Mutex<HashMap<[u8; TOKEN_LEN], Arc<Slot>>>,
    counters: RdmaCounters,
    /// How long a transfer waits for its operations' completions before
    /// it gives the connection up (the fabric's NOP timeout).
    completion_timeout: Duration,
}

impl std::fmt::Debug for RdmaService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaService")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

/// One offloaded session's RDMA state.
pub struct Slot {
    tsih: u16,
    binding: watch::Sender<Option<Arc<Binding>>>,
    /// A bind request for this session is between its verdict and its accept. The
    /// claim is taken with the verdict, so a second request with the same token (a
    /// replay racing the real one) is refused even before the first is accepted.
    accepting: std::sync::atomic::AtomicBool,
    /// Since when commands have found no working connection (none bound
    /// yet, or the last one failed), until one is bound: they wait for it
    /// until [`BIND_WAIT`] after that, not each [`BIND_WAIT`] from its own
    /// start, so that once a peer is gone for good the commands still
    /// queued fail at once instead of one wait after another.
    unbound_since: Mutex<Option<tokio::time::Instant>>,
}

/// A session's RDMA connection: the queue pair and the completions of its operations.
pub struct Binding {
    qp: AnyQp,
    waiters: Arc<Mutex<HashMap<u64, oneshot::Sender<WcStatus>>>>,
    next_wr: AtomicU64,
    pump: tokio::task::JoinHandle<()>,
}

impl Drop for Binding {
    fn drop(&mut self) {
        self.qp.disconnect();
        self.pump.abort();
    }
}

/// Why an offloaded transfer failed.
#[derive(Debug)]
pub struct TransferError(pub String);

impl RdmaService {
    /// Starts the listener of `backend` on `listen` (port 0: any); verbs opens `device`
    /// (default: the first one) and must listen on an address of that device. It stops
    /// accepting when `shutdown` turns true, as the target's portals do.
    pub async fn start_on(
        listen: SocketAddr,
        backend: Backend,
        device: Option<&str>,
        completion_timeout: Duration,
        mut shutdown: watch::Receiver<bool>,
    ) -> std::io::Result<Arc<RdmaService>> {
        let io = |e: blockwire_transport::rdma::RdmaError| std::io::Error::other(e.to_string());
        let provider = AnyProvider::open(backend, device).map_err(io)?;
        let mut listener = provider.listen(listen).await.map_err(io)?;
        let endpoint = listener.local_addr();
        let pd = provider.alloc_pd().map_err(io)?;
        let pool = BufferPool::new(&pd, &PoolConfig::default()).map_err(io)?;
        let svc = Arc::new(RdmaService {
            provider,
            pd,
            pool,
            endpoint,
            slots: Mutex::new(HashMap::new()),
            counters: RdmaCounters::default(),
            completion_timeout,
        });
        let weak = Arc::downgrade(&svc);
        tokio::spawn(async move {
            while let Some(req) =
                next_request(&mut listener, &mut shutdown, "RDMA offload listener").await
            {
                let Some(svc) = weak.upgrade() else { return };
                tokio::spawn(async move { svc.bind(req).await });
            }
        });
        info!(%endpoint, backend = backend.name(), "RDMA offload listener started");
        Ok(svc)
    }

    /// The backend name advertised at login.
    pub fn backend(&self) -> &'static str {
        self.provider.name()
    }

    pub fn endpoint(&self) -> SocketAddr {
        self.endpoint
    }

    pub fn counters(&self) -> &RdmaCounters {
        &self.counters
    }

    /// A session with `tsih` was granted `token`.
    pub fn register(&self, token: [u8; TOKEN_LEN], tsih: u16) -> Arc<Slot> {
        let (tx, _) = watch::channel(None);
        let slot = Arc::new(Slot {
            tsih,
            binding: tx,
            accepting: std::sync::atomic::AtomicBool::new(false),
            unbound_since: Mutex::new(None),
        });
        self.slots.lock().unwrap().insert(token, slot.clone());
        slot
    }

    /// Tokens registered now: one per session granted offload whose
    /// connection has not ended.
    pub fn registered_tokens(&self) -> usize {
        self.slots.lock().unwrap().len()
    }

    /// The session ended: its token stops working and its RDMA connection closes.
    pub fn unregister(&self, token: &[u8; TOKEN_LEN]) {
        if let Some(slot) = self.slots.lock().unwrap().remove(token) {
            slot.binding.send_replace(None);
        }
    }

    async fn bind(
        self: Arc<Self>,
        req: <<AnyProvider as RdmaProvider>::Listener as RdmaListener>::Request,
    ) {
        let peer = req.peer_addr();
        let refuse = |code: u8, why: &str| {
            self.counters.rejected_binds.fetch_add(1, Ordering::Relaxed);
            warn!(%peer, why, "RDMA connection rejected");
            code
        };
        let verdict = match BindRequest::decode(req.private_data()) {
            None => Err(refuse(
                reject::MALFORMED,
                "private data is not a bind request",
            )),
            Some(b) => {
                let slot = self.slots.lock().unwrap().get(&b.token).cloned();
                match slot {
                    Some(s) if s.tsih == b.tsih => {
                        if s.claim().await {
                            Ok(s)
                        } else {
                            Err(refuse(reject::ALREADY_BOUND, "session already bound"))
                        }
                    }
                    _ => Err(refuse(reject::UNKNOWN_TOKEN, "unknown token or TSIH")),
                }
            }
        };
        let slot = match verdict {
            Ok(s) => s,
            Err(code) => {
                let _ = req.reject(&[code]).await;
                return;
            }
        };
        // Whatever happens below, the claim ends with this call: on success the
        // binding itself then marks the session as bound.
        let _claim = AcceptClaim(&slot.accepting);
        let cq = match self.provider.create_cq(4096) {
            Ok(c) => c,
            Err(e) => {
                warn!(%peer, error = %e, "RDMA connection refused: no completion queue");
                let _ = req.reject(&[]).await;
                return;
            }
        };
        let recv_cq = match self.provider.create_cq(16) {
            Ok(c) => c,
            Err(e) => {
                warn!(%peer, error = %e, "RDMA connection refused: no completion queue");
                let _ = req.reject(&[]).await;
                return;
            }
        };
        let init = QpInit::<AnyProvider> {
            pd: self.pd.clone(),
            send_cq: cq.clone(),
            recv_cq,
            caps: QpCaps {
                max_send_wr: 1024,
                max_recv_wr: 16,
                max_sge: 16,
            },
        };
        let qp = match req.accept(init, &[]).await {
            Ok(qp) => qp,
            Err(e) => {
                warn!(%peer, error = %e, "RDMA accept failed");
                return;
            }
        };
        let waiters: Arc<Mutex<HashMap<u64, oneshot::Sender<WcStatus>>>> = Arc::default();
        let pump = tokio::spawn(pump(cq, Arc::downgrade(&waiters)));
        let b = Arc::new(Binding {
            qp,
            waiters,
            next_wr: AtomicU64::new(1),
            pump,
        });
        self.counters.binds.fetch_add(1, Ordering::Relaxed);
        info!(%peer, tsih = slot.tsih, "RDMA connection bound to session");
        *slot.unbound_since.lock().unwrap() = None;
        slot.binding.send_replace(Some(b));
    }

    /// READ: RDMA-Write `data` into the initiator's chunks (the data may be shorter than
    /// the descriptor: underflow).
    pub async fn write_to(
        &self,
        slot: &Slot,
        desc: &Descriptor,
        data: &[u8],
    ) -> Result<(), TransferError> {
        self.write_at(slot, desc, 0, data).await
    }

    /// READ, one piece: RDMA-Write `data` at byte `offset` of the buffer the
    /// descriptor describes (its chunks taken as one contiguous space). Pieces
    /// of one command may be written concurrently and in any order
    /// (multi-stream placement). A range beyond the descriptor is refused
    /// before anything is posted.
    pub async fn write_at(
        &self,
        slot: &Slot,
        desc: &Descriptor,
        offset: u64,
        data: &[u8],
    ) -> Result<(), TransferError> {
        if data.is_empty() {
            return Ok(());
        }
        let Some(chunks) = sub_range(&desc.chunks, offset, data.len() as u64) else {
            self.counters
                .failed_transfers
                .fetch_add(1, Ordering::Relaxed);
            return Err(TransferError(format!(
                "RDMA Write of {} bytes at offset {offset} falls outside the initiator's {}-byte buffer",
                data.len(),
                desc.len()
            )));
        };
        drop(chunks);
        let b = self.wait(slot).await?;
        let piece = self.piece_len();
        for (i, part) in data.chunks(piece).enumerate() {
            let at = offset + (i * piece) as u64;
            let chunks =
                sub_range(&desc.chunks, at, part.len() as u64).expect("within the checked range");
            let mut bufs = self.alloc(part.len()).await?;
            let mut off = 0;
            for pb in &bufs {
                pb.write_at(0, &part[off..off + pb.len()])
                    .map_err(|e| TransferError(e.to_string()))?;
                off += pb.len();
            }
            let n = self.transfer(&b, &mut bufs, &chunks, true).await;
            self.counters.rdma_writes.fetch_add(n.0, Ordering::Relaxed);
            n.1?;
        }
        self.counters
            .bytes_written
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Most bytes one transfer moves through the pool at once: a command's
    /// data beyond it goes in pieces, one after another, so that a command
    /// larger than the pool still moves, and none needs all of the pool at
    /// once (which it would wait for while smaller ones come and go).
    fn piece_len(&self) -> usize {
        (MAX_PIECE.min(self.pool.total_bytes() / 2)).max(4096)
    }

    /// WRITE: RDMA-Read the initiator's chunks into pool buffers and gather them.
    pub async fn read_from(
        &self,
        slot: &Slot,
        desc: &Descriptor,
    ) -> Result<Vec<u8>, TransferError> {
        let len = desc.len() as usize;
        if len == 0 {
            return Ok(Vec::new());
        }
        let b = self.wait(slot).await?;
        let mut out = vec![0u8; len];
        for (i, part) in out.chunks_mut(self.piece_len()).enumerate() {
            let at = (i * self.piece_len()) as u64;
            let chunks =
                sub_range(&desc.chunks, at, part.len() as u64).expect("within the descriptor");
            let mut bufs = self.alloc(part.len()).await?;
            let n = self.transfer(&b, &mut bufs, &chunks, false).await;
            self.counters.rdma_reads.fetch_add(n.0, Ordering::Relaxed);
            n.1?;
            let mut off = 0;
            for pb in &bufs {
                pb.read_at(0, &mut part[off..off + pb.len()])
                    .map_err(|e| TransferError(e.to_string()))?;
                off += pb.len();
            }
        }
        self.counters
            .bytes_read
            .fetch_add(len as u64, Ordering::Relaxed);
        Ok(out)
    }

    /// Whether the session has a working RDMA connection, waiting for a
    /// (re)bind as a transfer would: a READ checks before its data are read
    /// and held, so that without a connection it holds nothing while it
    /// waits.
    pub async fn bound(&self, slot: &Slot) -> bool {
        self.wait(slot).await.is_ok()
    }

    async fn wait(&self, slot: &Slot) -> Result<Arc<Binding>, TransferError> {
        slot.wait().await.inspect_err(|_| {
            self.counters
                .failed_transfers
                .fetch_add(1, Ordering::Relaxed);
        })
    }

    async fn alloc(&self, len: usize) -> Result<Vec<PoolBuf<AnyPd>>, TransferError> {
        self.pool
            .alloc(len)
            .await
            .map_err(|e| TransferError(format!("target buffer pool: {e}")))
    }

    /// Posts one operation per (split) chunk and waits for all. Returns the number of
    /// operations posted and the outcome.
    ///
    /// Operations still uncompleted after the completion timeout (a peer
    /// that stalls without breaking the connection) end the connection:
    /// tearing it down flushes them. Only once they are flushed may `bufs`
    /// go back to the pool, since until then an RDMA Read may still land
    /// in them, in whatever command's data they would hold next; if the
    /// flushes do not come either, `bufs` are given up (left out of the
    /// pool) rather than reused.
    async fn transfer(
        &self,
        b: &Binding,
        bufs: &mut Vec<PoolBuf<AnyPd>>,
        remote: &[RemoteBuf],
        write: bool,
    ) -> (u64, Result<(), TransferError>) {
        let local: Vec<Sge> = bufs.iter().map(PoolBuf::sge).collect();
        let mut chunks = Vec::new();
        let mut offset = 0;
        for r in remote {
            let mut done = 0;
            while done < r.len {
                let n = (r.len - done).min(MAX_OP);
                chunks.push(Chunk {
                    remote: RemoteBuf {
                        addr: r.addr + done,
                        len: n,
                        rkey: r.rkey,
                    },
                    offset,
                });
                done += n;
                offset += n;
            }
        }
        let Some(ops) = plan_ops(&local, &chunks, 16) else {
            return (
                0,
                Err(TransferError(
                    "descriptor and buffers differ in length".into(),
                )),
            );
        };
        let mut pending = Vec::with_capacity(ops.len());
        for op in ops {
            let wr_id = b.next_wr.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = oneshot::channel();
            b.waiters.lock().unwrap().insert(wr_id, tx);
            let sop = if write {
                SendOp::RdmaWrite {
                    remote_addr: op.remote_addr,
                    rkey: op.rkey,
                }
            } else {
                SendOp::RdmaRead {
                    remote_addr: op.remote_addr,
                    rkey: op.rkey,
                }
            };
            let posted = b.qp.post_send(SendWr {
                wr_id,
                op: sop,
                sgl: op.local,
                signaled: true,
            });
            if let Err(e) = posted {
                b.waiters.lock().unwrap().remove(&wr_id);
                let n = pending.len() as u64;
                for rx in pending {
                    let _ = rx.await;
                }
                self.counters
                    .failed_transfers
                    .fetch_add(1, Ordering::Relaxed);
                return (n, Err(TransferError(format!("posting: {e}"))));
            }
            pending.push(rx);
        }
        let n = pending.len() as u64;
        let mut failure = None;
        let mut completed = 0;
        let limit = self.completion_timeout;
        let all = await_completions(&mut pending, &mut completed, &mut failure);
        if tokio::time::timeout(limit, all).await.is_err() {
            let flushed = await_completions(&mut pending, &mut completed, &mut failure);
            let _ = tear_down_for_good(&b.qp, limit, flushed, bufs).await;
            failure = Some(format!("no completion in {limit:?}"));
        }
        match failure {
            None => (n, Ok(())),
            Some(why) => {
                self.counters
                    .failed_transfers
                    .fetch_add(1, Ordering::Relaxed);
                debug!(why, "offloaded transfer failed");
                (n, Err(TransferError(why)))
            }
        }
    }
}

/// A connection whose operations on `bufs` went uncompleted for `limit` (a
/// peer that stalls without breaking it) is torn down, which flushes them.
/// Only once `flushed` (the wait for those flushes) is done may `bufs` go
/// back to the pool: until then an RDMA Read may still land in them, in
/// whatever they would hold next. If the flushes do not come either, `bufs`
/// are given up (left out of the pool) rather than reused; returns their
/// bytes. Shared by the RDMA-assisted transfers and iSER.
pub(super) async fn tear_down_for_good(
    qp: &AnyQp,
    limit: Duration,
    flushed: impl std::future::Future,
    bufs: &mut Vec<PoolBuf<AnyPd>>,
) -> usize {
    warn!(
        peer = %qp.peer_addr(),
        "RDMA operations uncompleted for {limit:?}: closing the RDMA connection"
    );
    qp.disconnect();
    if tokio::time::timeout(FLUSH_WAIT, flushed).await.is_ok() {
        return 0;
    }
    let bytes = bufs.iter().map(PoolBuf::capacity).sum::<usize>();
    warn!(
        peer = %qp.peer_addr(),
        bytes,
        "RDMA operations not flushed: their staging buffers leave the pool"
    );
    std::mem::forget(std::mem::take(bufs));
    bytes
}

/// Waits for the completions `pending[*completed..]` in order, counting
/// them in `completed` (so a wait cut short can be taken up again) and
/// noting the first failure.
async fn await_completions(
    pending: &mut [oneshot::Receiver<WcStatus>],
    completed: &mut usize,
    failure: &mut Option<String>,
) {
    while let Some(rx) = pending.get_mut(*completed) {
        let status = rx.await;
        *completed += 1;
        match status {
            Ok(WcStatus::Success) => {}
            Ok(s) => *failure = failure.take().or(Some(format!("{s:?}"))),
            Err(_) => *failure = failure.take().or(Some("RDMA connection closed".into())),
        }
    }
}

/// Ends a bind request's claim on its session when the request is done with.
struct AcceptClaim<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for AcceptClaim<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Slot {
    /// Claims the session for a new RDMA connection: true once no other bind
    /// of it is being accepted and its current connection, if any, has failed.
    /// A replacement bind follows a connection the initiator saw fail (a bad
    /// key or a bounds error moves both queue pairs to the error state), and
    /// both the error and the end of the previous bind's accept can reach this
    /// side a moment after the initiator's new request (the initiator may use
    /// a connection, break it and ask for the next while the task that bound
    /// it has yet to drop its claim): wait briefly for them before calling the
    /// session busy. Two requests racing for one session (a replayed token and
    /// the real one) get one claim; the other then finds the new connection
    /// working and is refused.
    async fn claim(&self) -> bool {
        let deadline = tokio::time::Instant::now() + REPLACEMENT_WAIT;
        loop {
            let lives = self
                .binding
                .borrow()
                .as_ref()
                .is_some_and(|b| !b.qp.is_error());
            if !lives
                && self
                    .accepting
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                // A connection is on its way: commands wait for it afresh.
                *self.unbound_since.lock().unwrap() = None;
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The session's working RDMA connection, waiting briefly for it to be bound.
    async fn wait(&self) -> Result<Arc<Binding>, TransferError> {
        let mut rx = self.binding.subscribe();
        let working = rx.borrow().as_ref().is_some_and(|b| !b.qp.is_error());
        let deadline = if working {
            tokio::time::Instant::now() + BIND_WAIT
        } else {
            let mut since = self.unbound_since.lock().unwrap();
            *since.get_or_insert_with(tokio::time::Instant::now) + BIND_WAIT
        };
        // A broken connection may be replaced by a new bind at any moment.
        let got = tokio::time::timeout_at(deadline, async {
            loop {
                if let Some(b) = rx.borrow_and_update().clone() {
                    if !b.qp.is_error() {
                        return Some(b);
                    }
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        })
        .await;
        match got {
            Ok(Some(b)) => Ok(b),
            _ => Err(TransferError(
                "no working RDMA connection bound to the session".into(),
            )),
        }
    }
}

/// Most bytes one RDMA transfer moves through the pool at once (see
/// `RdmaService::piece_len`).
const MAX_PIECE: usize = 4 << 20;

/// Bytes `offset..offset + len` of the space `chunks` describe (in order, as
/// one contiguous buffer), as remote pieces; None when the range does not
/// fit inside it.
fn sub_range(chunks: &[RemoteBuf], mut offset: u64, mut len: u64) -> Option<Vec<RemoteBuf>> {
    let total: u64 = chunks.iter().map(|c| c.len).sum();
    if offset.checked_add(len)? > total {
        return None;
    }
    let mut out = Vec::new();
    for c in chunks {
        if len == 0 {
            break;
        }
        if offset >= c.len {
            offset -= c.len;
            continue;
        }
        let n = (c.len - offset).min(len);
        out.push(RemoteBuf {
            addr: c.addr + offset,
            len: n,
            rkey: c.rkey,
        });
        offset = 0;
        len -= n;
    }
    Some(out)
}

/// Hands each completion of `cq` to the waiter registered under its work request id, until
/// the CQ fails or the waiters' owner is gone (shared by RDMA-assisted bindings and iSER).
pub(super) async fn pump(cq: AnyCq, waiters: Weak<Mutex<HashMap<u64, oneshot::Sender<WcStatus>>>>) {
    loop {
        let c = match cq.next().await {
            Ok(c) => c,
            Err(_) => return,
        };
        let Some(w) = waiters.upgrade() else { return };
        let tx = w.lock().unwrap().remove(&c.wr_id);
        if let Some(tx) = tx {
            let _ = tx.send(c.status);
        }
    }
}

/// The next connection request on an RDMA listener (`what` names it in the log), or None
/// when it is to close: the target is shutting down and takes no new connections, or the
/// listener failed.
pub(super) async fn next_request<L: RdmaListener>(
    listener: &mut L,
    shutdown: &mut watch::Receiver<bool>,
    what: &str,
) -> Option<L::Request> {
    let addr = listener.local_addr();
    tokio::select! {
        accepted = listener.accept() => match accepted {
            Ok(req) => Some(req),
            Err(e) => {
                warn!(listener = what, %addr, error = %e, "RDMA listener failed");
                None
            }
        },
        _ = super::connection::turns_true(shutdown) => {
            info!(listener = what, %addr, "closed: the target is shutting down");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rb(addr: u64, len: u64) -> RemoteBuf {
        RemoteBuf { addr, len, rkey: 7 }
    }

    #[test]
    fn sub_ranges_cross_chunks_and_refuse_the_outside() {
        let chunks = [rb(1000, 100), rb(5000, 50), rb(9000, 200)];
        let flat = |v: Vec<RemoteBuf>| v.iter().map(|c| (c.addr, c.len)).collect::<Vec<_>>();
        assert_eq!(
            flat(sub_range(&chunks, 0, 350).unwrap()),
            vec![(1000, 100), (5000, 50), (9000, 200)]
        );
        assert_eq!(
            flat(sub_range(&chunks, 90, 70).unwrap()),
            vec![(1090, 10), (5000, 50), (9000, 10)]
        );
        assert_eq!(
            flat(sub_range(&chunks, 150, 200).unwrap()),
            vec![(9000, 200)]
        );
        assert_eq!(flat(sub_range(&chunks, 120, 5).unwrap()), vec![(5020, 5)]);
        assert!(
            sub_range(&chunks, 300, 51).is_none(),
            "one byte past the end"
        );
        assert!(
            sub_range(&chunks, u64::MAX, 2).is_none(),
            "overflowing offset"
        );
        assert!(sub_range(&[], 0, 1).is_none());
    }
}
