//! iSER target (RFC 7145): iSCSI over an RDMA reliable connection.
//!
//! An iSER portal is an RDMA CM listener. Every message is an RDMA Send that starts with the
//! 28-byte iSER header followed by one iSCSI PDU (no digests: RFC 7145 §5.1 leaves integrity
//! to the RDMA transport). The connection logs in through the same [`LoginPhase`] as TCP,
//! with RDMAExtensions=Yes and TargetRecvDataSegmentLength declared, then runs the same
//! [`ConnMachine`] and command launcher. Only the data movement differs, and it is done here,
//! outside the state machine:
//! - a Data-In PDU the command's task queues becomes an RDMA Write of its payload to the read
//!   STag the initiator advertised in the command's iSER header, at the PDU's buffer offset;
//!   a Data-In that carries the status becomes a SCSI Response Send after the write (RFC 7145
//!   §7.3.6: the target never sends Data-In messages);
//! - an R2T the machine asks for becomes an RDMA Read of that range from the write STag; its
//!   completion goes back into the machine as the Data-Out PDU the R2T would have brought;
//! - every other PDU is a Send.
//!
//! A range outside what the initiator advertised is refused before anything is posted and ends
//! the connection (a forged offset never reaches memory the command does not own).
//!
//! One file, a little over the usual size: the login, the receive loop and the send-side
//! conversions all work on the one message format; the per-command buffer table they share
//! is [`buffers`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blockwire_pdu::iser::{IserHeader, ISER_HEADER_LEN};
use blockwire_pdu::pdu::codes::ServiceResponse;
use blockwire_pdu::pdu::{DataOut, ScsiResponse};
use blockwire_pdu::{Bhs, Digests, Pdu};
use blockwire_transport::rdma::any::{AnyCq, AnyPd, AnyProvider, AnyQp, Backend};
use blockwire_transport::rdma::{
    AccessFlags, AlignedBuf, CompletionQueue, ConnectRequest, MemoryRegion, ProtectionDomain,
    QpCaps, QpInit, QueuePair, RdmaListener, RdmaProvider, RecvWr, SendOp, SendWr, Sge, WcStatus,
};
use blockwire_transport::reg::{BufferPool, PoolBuf, PoolConfig};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

use super::connection::{carry_out, turns_true, Outgoing};
use super::io::{advances_stat_sn, stamp};
use super::launch::Launcher;
use super::machine::{ConnMachine, LoginAction, LoginPhase, Shared};
use super::session::PendingSession;
use super::Fabric;

mod buffers;

use buffers::{Advertised, CommandBuffers};

/// What the target can receive in one message's data segment (TargetRecvDataSegmentLength).
pub const TARGET_RECV_DATA_SEGMENT_LENGTH: u32 = 8192;
/// One receive buffer: iSER header, BHS, the largest AHS, the data segment.
const RECV_LEN: usize = 16 << 10;
/// Receive buffers posted per connection.
const RECVS: usize = 64;
/// Largest RDMA operation posted.
const MAX_OP: u64 = 1 << 20;

/// Listens for iSER connections on `listen` (an address of the RDMA device) with `backend`,
/// serving `fabric` in portal group `tpgt`. Returns the bound address.
pub async fn start(
    fabric: Arc<Fabric>,
    listen: SocketAddr,
    backend: Backend,
    device: Option<&str>,
    tpgt: u16,
) -> std::io::Result<SocketAddr> {
    let io = |e: blockwire_transport::rdma::RdmaError| std::io::Error::other(e.to_string());
    let provider = AnyProvider::open(backend, device).map_err(io)?;
    let mut listener = provider.listen(listen).await.map_err(io)?;
    let bound = listener.local_addr();
    let pd = provider.alloc_pd().map_err(io)?;
    let pool = Arc::new(BufferPool::new(&pd, &PoolConfig::default()).map_err(io)?);
    info!(portal = %bound, backend = backend.name(), "iSER portal listening");
    let mut shutdown = fabric.shutdown.clone();
    tokio::spawn(async move {
        while let Some(req) =
            super::rdma::next_request(&mut listener, &mut shutdown, "iSER portal").await
        {
            let (fabric, provider, pd, pool) =
                (fabric.clone(), provider.clone(), pd.clone(), pool.clone());
            tokio::spawn(async move {
                let peer = req.peer_addr();
                if let Err(e) = serve(fabric, provider, pd, pool, req, bound, tpgt).await {
                    info!(%peer, error = %e, "iSER connection ended");
                }
            });
        }
    });
    Ok(bound)
}

/// The send side of one iSER connection: posts and awaits work requests.
/// What the iSER portals of a fabric moved: messages and one-sided operations.
#[derive(Debug, Default)]
pub struct IserCounters {
    /// iSER connections accepted.
    pub connections: AtomicU64,
    /// RDMA Sends posted (Login, SCSI and other responses, NOP-In, R2T-free status).
    pub sends: AtomicU64,
    /// Messages received (commands, Data-Out-free WRITE commands, NOP-Out, ...).
    pub receives: AtomicU64,
    /// RDMA Writes posted (READ data into the initiator's read STag).
    pub rdma_writes: AtomicU64,
    /// RDMA Reads posted (WRITE data from the initiator's write STag).
    pub rdma_reads: AtomicU64,
    /// Bytes moved by RDMA Write and RDMA Read.
    pub rdma_bytes: AtomicU64,
    /// The most commands whose advertised buffers one connection held on record at once
    /// (bounded, however many commands go unanswered: see `buffers`).
    pub advertised_high: AtomicU64,
    /// Bytes of the staging pool given up for good: buffers of work
    /// requests whose flush never came, which an RDMA Read might still land
    /// in, so never reused (see `Wire::post`).
    pub staging_bytes_given_up: AtomicU64,
}

struct Wire {
    fabric: Arc<Fabric>,
    qp: Arc<AnyQp>,
    pool: Arc<BufferPool<AnyPd>>,
    waiters: Arc<Mutex<HashMap<u64, oneshot::Sender<WcStatus>>>>,
    next_wr: AtomicU64,
}

impl Wire {
    /// Posts one work request on `bufs` (its `sgl` lies in them) and waits
    /// for its completion.
    ///
    /// A request uncompleted after the NOP timeout (a peer that stalls
    /// without breaking the connection) ends the connection: tearing the
    /// queue pair down flushes it. Only once it is flushed may `bufs` go
    /// back to the pool, since until then an RDMA Read may still land in
    /// them, in whatever they would hold next; if the flush does not come
    /// either, `bufs` are given up (left out of the pool) rather than reused.
    async fn post(
        &self,
        op: SendOp,
        sgl: Vec<Sge>,
        bufs: &mut Vec<PoolBuf<AnyPd>>,
    ) -> Result<(), String> {
        let c = &self.fabric.iser_counters;
        let bytes: u64 = sgl.iter().map(|s| u64::from(s.length)).sum();
        match op {
            SendOp::Send => c.sends.fetch_add(1, Ordering::Relaxed),
            SendOp::RdmaWrite { .. } => {
                c.rdma_bytes.fetch_add(bytes, Ordering::Relaxed);
                c.rdma_writes.fetch_add(1, Ordering::Relaxed)
            }
            SendOp::RdmaRead { .. } => {
                c.rdma_bytes.fetch_add(bytes, Ordering::Relaxed);
                c.rdma_reads.fetch_add(1, Ordering::Relaxed)
            }
        };
        let wr_id = self.next_wr.fetch_add(1, Ordering::Relaxed);
        let (tx, mut rx) = oneshot::channel();
        self.waiters.lock().unwrap().insert(wr_id, tx);
        if let Err(e) = self.qp.post_send(SendWr {
            wr_id,
            op,
            sgl,
            signaled: true,
        }) {
            self.waiters.lock().unwrap().remove(&wr_id);
            return Err(format!("post: {e}"));
        }
        let limit = self.fabric.settings.nop_timeout;
        match tokio::time::timeout(limit, &mut rx).await {
            Ok(Ok(WcStatus::Success)) => Ok(()),
            Ok(Ok(s)) => Err(format!("work request completed with {s:?}")),
            Ok(Err(_)) => Err("the connection closed".into()),
            Err(_) => {
                let lost = super::rdma::tear_down_for_good(&self.qp, limit, rx, bufs).await;
                c.staging_bytes_given_up
                    .fetch_add(lost as u64, Ordering::Relaxed);
                Err(format!("no completion in {limit:?}"))
            }
        }
    }

    async fn staging(&self, len: usize) -> Result<Vec<PoolBuf<AnyPd>>, String> {
        self.pool
            .alloc(len)
            .await
            .map_err(|e| format!("buffer pool: {e}"))
    }

    /// Sends one iSER message: the control header, then `pdu`.
    async fn send(&self, pdu: &Pdu) -> Result<(), String> {
        self.send_by(pdu, None).await
    }

    /// [`Wire::send`], its wait for staging buffers given up at `deadline`
    /// (a login's: the shared pool may be drained by other connections).
    /// Only that wait: once posted, a Send is waited for, bounded by its
    /// own completion timeout, since its buffers must not go back to the
    /// pool while it may still be read.
    async fn send_by(
        &self,
        pdu: &Pdu,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<(), String> {
        let mut msg = IserHeader::Control {
            write: None,
            read: None,
        }
        .encode()
        .to_vec();
        pdu.encode_into(&mut msg, Digests::NONE);
        let mut bufs = match deadline {
            None => self.staging(msg.len()).await?,
            Some(d) => tokio::time::timeout_at(d, self.staging(msg.len()))
                .await
                .map_err(|_| "no staging buffer before the login's deadline".to_string())??,
        };
        let mut at = 0;
        for b in &bufs {
            b.write_at(0, &msg[at..at + b.len()])
                .map_err(|e| e.to_string())?;
            at += b.len();
        }
        let sgl = bufs.iter().map(PoolBuf::sge).collect();
        self.post(SendOp::Send, sgl, &mut bufs).await
    }

    /// RDMA-Writes `data` to `remote` at `offset`, or RDMA-Reads `len` bytes from there.
    async fn rdma(
        &self,
        remote: &Advertised,
        offset: u64,
        write: Option<&[u8]>,
        len: usize,
    ) -> Result<Vec<u8>, String> {
        let end = offset.checked_add(len as u64).ok_or("offset overflows")?;
        if remote.buf.base_offset.checked_add(end).is_none() {
            return Err(format!(
                "the initiator's buffer at {:#x} runs past the end of the address space",
                remote.buf.base_offset
            ));
        }
        let reach = remote.len - remote.solicited_from.unwrap_or(0).min(remote.len);
        if end > reach {
            return Err(format!(
                "{len} bytes at {offset} fall outside the initiator's {reach}-byte buffer"
            ));
        }
        let mut bufs = self.staging(len).await?;
        if let Some(data) = write {
            let mut at = 0;
            for b in &bufs {
                b.write_at(0, &data[at..at + b.len()])
                    .map_err(|e| e.to_string())?;
                at += b.len();
            }
        }
        // One operation per staging buffer (each at most MAX_OP... the pool's largest class).
        let mut ops = Vec::new();
        let mut at = 0u64;
        for b in &bufs {
            let mut done = 0u64;
            while done < b.len() as u64 {
                let n = (b.len() as u64 - done).min(MAX_OP);
                let remote_addr = remote.buf.base_offset + offset + at + done;
                let sge = Sge {
                    addr: b.sge().addr + done,
                    length: n as u32,
                    lkey: b.lkey(),
                };
                let op = if write.is_some() {
                    SendOp::RdmaWrite {
                        remote_addr,
                        rkey: remote.buf.stag,
                    }
                } else {
                    SendOp::RdmaRead {
                        remote_addr,
                        rkey: remote.buf.stag,
                    }
                };
                ops.push((op, sge));
                done += n;
            }
            at += b.len() as u64;
        }
        for (op, sge) in ops {
            self.post(op, vec![sge], &mut bufs).await?;
        }
        let mut out = Vec::new();
        if write.is_none() {
            out = vec![0u8; len];
            let mut at = 0;
            for b in &bufs {
                b.read_at(0, &mut out[at..at + b.len()])
                    .map_err(|e| e.to_string())?;
                at += b.len();
            }
        }
        Ok(out)
    }
}

/// The buffer table of one connection, shared by its receive loop (which records what each
/// command advertises) and its send loop (which moves data to and from those buffers).
type Buffers = Arc<Mutex<CommandBuffers>>;

/// Receives: one registered region cut into [`RECVS`] buffers.
struct Receives {
    mr: <AnyPd as ProtectionDomain>::Mr,
}

impl Receives {
    fn post(&self, qp: &AnyQp, i: usize) -> Result<(), String> {
        let sge = self
            .mr
            .sge(i * RECV_LEN, RECV_LEN)
            .ok_or("receive buffer")?;
        qp.post_recv(RecvWr {
            wr_id: i as u64,
            sgl: vec![sge],
        })
        .map_err(|e| format!("post_recv: {e}"))
    }

    fn message(&self, i: usize, len: usize) -> Result<Vec<u8>, String> {
        let mut m = vec![0u8; len.min(RECV_LEN)];
        self.mr
            .read_at(i * RECV_LEN, &mut m)
            .map_err(|e| e.to_string())?;
        Ok(m)
    }
}

/// One received message: its iSER header and PDU.
fn parse(msg: &[u8]) -> Result<(IserHeader, Pdu), String> {
    let header = IserHeader::decode(msg).map_err(|e| format!("iSER header: {e}"))?;
    let rest = &msg[ISER_HEADER_LEN.min(msg.len())..];
    let (pdu, used) = Pdu::decode(rest, Digests::NONE).map_err(|e| format!("iSCSI PDU: {e}"))?;
    if used != rest.len() {
        return Err(format!(
            "{} bytes after the PDU in one iSER message",
            rest.len() - used
        ));
    }
    Ok((header, pdu))
}

#[allow(clippy::too_many_arguments)]
async fn serve(
    fabric: Arc<Fabric>,
    provider: AnyProvider,
    pd: AnyPd,
    pool: Arc<BufferPool<AnyPd>>,
    req: <<AnyProvider as RdmaProvider>::Listener as RdmaListener>::Request,
    local: SocketAddr,
    tpgt: u16,
) -> Result<(), String> {
    let peer = req.peer_addr();
    let e = |e: blockwire_transport::rdma::RdmaError| e.to_string();
    // As over TCP, a connection past the bound on logins in progress is
    // refused before anything is set up for it (its receive buffers alone
    // are a registered region of RECVS messages).
    let slot = match fabric.login_slots.take(Some(peer.ip())) {
        Ok(slot) => slot,
        Err(no_slot) => {
            let _ = req.reject(&[]).await;
            return Err(format!(
                "refused: {no_slot}, raise the setting if that many initiators log in at once"
            ));
        }
    };
    let send_cq = provider.create_cq(1024).map_err(e)?;
    let recv_cq = provider.create_cq(RECVS * 2).map_err(e)?;
    let init = QpInit::<AnyProvider> {
        pd: pd.clone(),
        send_cq: send_cq.clone(),
        recv_cq: recv_cq.clone(),
        caps: QpCaps {
            max_send_wr: 512,
            max_recv_wr: RECVS as u32,
            max_sge: 16,
        },
    };
    let recvs = Receives {
        mr: pd
            .register(AlignedBuf::new(RECVS * RECV_LEN), AccessFlags::LOCAL_WRITE)
            .map_err(e)?,
    };
    // RFC 7145 §9.2 (iSER CM private data): no zero-based virtual addresses, no Send with
    // Invalidate.
    let qp = Arc::new(req.accept(init, &[0xc0, 0, 0, 0]).await.map_err(e)?);
    for i in 0..RECVS {
        recvs.post(&qp, i)?;
    }
    info!(%peer, "iSER connection accepted");
    let waiters: Arc<Mutex<HashMap<u64, oneshot::Sender<WcStatus>>>> = Arc::default();
    let pump_task = tokio::spawn(super::rdma::pump(send_cq, Arc::downgrade(&waiters)));
    fabric
        .iser_counters
        .connections
        .fetch_add(1, Ordering::Relaxed);
    let wire = Arc::new(Wire {
        fabric: fabric.clone(),
        qp: qp.clone(),
        pool,
        waiters,
        next_wr: AtomicU64::new(1),
    });
    let result = run(&fabric, &wire, &recvs, &recv_cq, local, tpgt, slot).await;
    qp.disconnect();
    // What is still posted (a detached RDMA Read, the writer's last Sends)
    // completes now, flushed: the pump must hand those completions over,
    // or each waits out the NOP timeout and its staging buffers are given
    // up for good. It stops once nothing uses the wire any more, bounded.
    let until = tokio::time::Instant::now() + fabric.settings.nop_timeout;
    while Arc::strong_count(&wire) > 1 && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pump_task.abort();
    result
}

/// The next received message (reposting its buffer).
async fn receive(recvs: &Receives, qp: &AnyQp, cq: &AnyCq) -> Result<Option<Vec<u8>>, String> {
    let c = cq.next().await.map_err(|e| e.to_string())?;
    if c.status != WcStatus::Success {
        return Ok(None);
    }
    let i = c.wr_id as usize;
    let m = recvs.message(i, c.byte_len as usize)?;
    recvs.post(qp, i)?;
    Ok(Some(m))
}

async fn run(
    fabric: &Arc<Fabric>,
    wire: &Arc<Wire>,
    recvs: &Receives,
    recv_cq: &AnyCq,
    local: SocketAddr,
    tpgt: u16,
    login_slot: super::login_slots::LoginSlot,
) -> Result<(), String> {
    use rand::SeedableRng;
    let mut phase = LoginPhase::new_iser(
        fabric.clone(),
        tpgt,
        local,
        rand::rngs::StdRng::from_entropy(),
    )
    .from_peer(Some(wire.qp.peer_addr().ip()));
    let qp = wire.qp.clone();
    // The whole login phase is bounded as over TCP: each wait for the next
    // message ends at the deadline at the latest, so a login trickled
    // within the per-message timeout still ends there. Sends are never
    // cancelled: a Send's staging buffer must not go back to the shared
    // pool while its work request is posted (see `Wire::post`); each is
    // bounded by its own completion wait and the teardown.
    let deadline = tokio::time::Instant::now() + fabric.settings.login_deadline;
    let past_deadline = || {
        format!(
            "login not done within its deadline ({:?}): closed",
            fabric.settings.login_deadline
        )
    };
    let (session, generation, outcome) = loop {
        // Checked before each message: a receive whose message is already
        // there completes even with no time left, and a peer that keeps
        // sending would otherwise go on past the deadline.
        if tokio::time::Instant::now() >= deadline {
            return Err(past_deadline());
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let msg = tokio::time::timeout(
            fabric.settings.login_timeout.min(left),
            receive(recvs, &qp, recv_cq),
        )
        .await
        .map_err(|_| {
            if tokio::time::Instant::now() >= deadline {
                past_deadline()
            } else {
                "login timed out".to_string()
            }
        })??
        .ok_or("connection lost during login")?;
        let action = match parse(&msg) {
            Ok((_, pdu)) => phase.on_pdu(&pdu),
            Err(why) => {
                let header = msg
                    .get(ISER_HEADER_LEN..ISER_HEADER_LEN + 48)
                    .and_then(|h| <&[u8; 48]>::try_from(h).ok());
                phase.on_undecodable(header, &why)
            }
        };
        match action {
            LoginAction::Respond(p) => wire.send_by(&p, Some(deadline)).await?,
            LoginAction::Refuse(p) => {
                let now = tokio::time::Instant::now();
                let peer = Some(wire.qp.peer_addr().ip());
                let delay = fabric.auth_failures.refusal_delay(peer, &p, now);
                tokio::time::sleep_until((now + delay).min(deadline)).await;
                wire.send_by(&p, Some(deadline)).await?;
                return Err("login refused".into());
            }
            LoginAction::LoggedIn {
                response,
                session,
                generation,
                still_changing_medium,
                outcome,
            } => {
                let pending = PendingSession::new(&fabric.sessions, session, generation);
                super::connection::medium_settled_before_login_ends(
                    &still_changing_medium,
                    pending.session(),
                )
                .await;
                wire.send_by(&response, Some(deadline)).await?;
                let (session, generation) = pending.begin();
                break (session, generation, outcome);
            }
        }
    };
    drop(login_slot);
    // Subscribed before the look below: a close, reinstatement or joining
    // connection that came between the attach and here shows in the value.
    let mut stop = session.stop_signal();
    if *stop.borrow() != generation {
        info!(tsih = session.tsih, initiator = %session.initiator_name, "session closed or taken over before its iSER full feature phase began: closing");
        return Ok(());
    }
    info!(tsih = session.tsih, initiator = %session.initiator_name, "iSER login complete: full feature phase");
    let mut machine = ConnMachine::new(
        fabric.clone(),
        session.clone(),
        generation,
        &outcome,
        local,
        None,
        std::time::Instant::now(),
    );
    let (tx, rx) = mpsc::channel::<Outgoing>(1024);
    let (data_tx, mut data_rx) = mpsc::unbounded_channel::<Pdu>();
    let buffers: Buffers = Arc::new(Mutex::new(CommandBuffers::new(fabric.settings.queue_depth)));
    let writer = tokio::spawn(write_loop(
        wire.clone(),
        rx,
        machine.shared().clone(),
        outcome.stat_sn.wrapping_add(1),
        buffers.clone(),
        data_tx,
    ));
    let mut launcher = Launcher::new(fabric, &session, &machine, tx.clone());
    launcher.send_data_in_by_rdma();
    let mut shutdown = fabric.shutdown.clone();
    let mut shutting_down = *shutdown.borrow();
    let mut actions = if shutting_down {
        machine.on_shutdown(std::time::Instant::now())
    } else {
        Vec::new()
    };
    let why: Result<(), String> = loop {
        // As over TCP: once stopped, no command read here runs any more.
        if stop.has_changed().unwrap_or(true) && *stop.borrow() != generation {
            break Ok(());
        }
        if carry_out(&mut launcher, std::mem::take(&mut actions))
            .await
            .is_some()
        {
            break Ok(());
        }
        let timer = machine
            .poll_timeout()
            .map(tokio::time::Instant::from_std)
            .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86400));
        tokio::select! {
            m = receive(recvs, &qp, recv_cq) => match m {
                Ok(Some(msg)) => match parse(&msg).inspect(|_| {
                    fabric.iser_counters.receives.fetch_add(1, Ordering::Relaxed);
                }) {
                    Ok((header, pdu)) => {
                        debug!(opcode = ?pdu.bhs.opcode(), ?header, data = pdu.data.len(), "iSER receive");
                        if let (IserHeader::Control { write, read }, Bhs::ScsiCommand(c)) = (header, &pdu.bhs) {
                            let len = u64::from(c.expected_data_transfer_length);
                            let held = {
                                let mut b = buffers.lock().unwrap();
                                let running = session.tasks.is_running(c.itt);
                                b.advertise(c.itt, len, write, read, running, |itt| session.tasks.contains(itt));
                                b.len() as u64
                            };
                            fabric.iser_counters.advertised_high.fetch_max(held, Ordering::Relaxed);
                        }
                        actions = machine.on_pdu(pdu, std::time::Instant::now());
                    }
                    Err(e) => break Err(format!("bad iSER message: {e}")),
                },
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            },
            Some(data) = data_rx.recv() => actions = machine.on_pdu(data, std::time::Instant::now()),
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() != generation {
                    break Ok(());
                }
            }
            _ = turns_true(&mut shutdown), if !shutting_down => {
                shutting_down = true;
                actions = machine.on_shutdown(std::time::Instant::now());
            }
            _ = tokio::time::sleep_until(timer) => actions = machine.on_timeout(std::time::Instant::now()),
        }
    };
    if !session.abort_tasks_if_owned_by(generation) && !fabric.sessions.holds(&session) {
        session.tasks.abort_where(|_, _| true);
    }
    drop(machine);
    let _ = tx.send(Outgoing::Close).await;
    drop(launcher);
    drop(tx);
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    // The session ends with its only connection (ErrorRecoveryLevel 0),
    // unless a logout ended it already.
    fabric.sessions.end(&session, generation);
    why
}

/// Sends what the connection's machine and tasks queue, turning Data-In into RDMA Writes and
/// R2Ts into RDMA Reads (see the module docs).
async fn write_loop(
    wire: Arc<Wire>,
    mut rx: mpsc::Receiver<Outgoing>,
    shared: Arc<Shared>,
    mut stat_sn: u32,
    buffers: Buffers,
    data_tx: mpsc::UnboundedSender<Pdu>,
) {
    while let Some(item) = rx.recv().await {
        let (bhs, data) = match item {
            Outgoing::Close => return,
            Outgoing::Pdu(p) => (p.bhs, p.data.to_vec()),
            Outgoing::FileData {
                bhs,
                lun,
                offset,
                len,
            } => {
                use std::os::unix::fs::FileExt;
                let mut buf = vec![0u8; len as usize];
                if let Err(e) = lun.file.read_exact_at(&mut buf, offset) {
                    warn!(lun = %lun.label, error = %e, "iSER: reading a file range failed");
                    wire.qp.disconnect();
                    return;
                }
                (bhs, buf)
            }
        };
        let result = match bhs {
            Bhs::DataIn(d) => {
                let read = buffers.lock().unwrap().read(d.itt);
                let written = match (read, data.is_empty()) {
                    (_, true) => Ok(()),
                    (Some(r), false) => wire
                        .rdma(&r, u64::from(d.buffer_offset), Some(&data), data.len())
                        .await
                        .map(|_| ()),
                    (None, false) => Err(format!(
                        "READ data for ITT {:#x} without a read STag",
                        d.itt
                    )),
                };
                match (written, d.status) {
                    (Err(e), _) => Err(e),
                    (Ok(()), None) => Ok(()),
                    (Ok(()), Some(status)) => {
                        buffers.lock().unwrap().answered(d.itt);
                        let mut resp = Bhs::ScsiResponse(ScsiResponse {
                            bidi_read_overflow: false,
                            bidi_read_underflow: false,
                            overflow: d.overflow,
                            underflow: d.underflow,
                            response: ServiceResponse::CommandCompleted,
                            status,
                            itt: d.itt,
                            snack_tag: 0,
                            stat_sn: 0,
                            exp_cmd_sn: 0,
                            max_cmd_sn: 0,
                            exp_data_sn: 0,
                            bidi_read_residual_count: 0,
                            residual_count: d.residual_count,
                        });
                        send_stamped(&wire, &shared, &mut stat_sn, &mut resp, Vec::new()).await
                    }
                }
            }
            Bhs::R2t(r) => {
                let write = buffers.lock().unwrap().solicit(r.itt, r.buffer_offset);
                match write {
                    None => Err(format!("R2T for ITT {:#x} without a write STag", r.itt)),
                    Some(w) => {
                        // The RDMA Read runs beside the other sends; its data return to the
                        // machine as the Data-Out the R2T solicits.
                        let (wire, data_tx) = (wire.clone(), data_tx.clone());
                        debug!(
                            itt = r.itt,
                            offset = r.buffer_offset,
                            len = r.desired_data_transfer_length,
                            ?w,
                            "iSER R2T: RDMA Read"
                        );
                        tokio::spawn(async move {
                            let len = r.desired_data_transfer_length as usize;
                            let from = w.solicited_from.unwrap_or(0);
                            let at = u64::from(r.buffer_offset).checked_sub(from);
                            let read = match at {
                                Some(at) => wire.rdma(&w, at, None, len).await,
                                None => Err(format!(
                                    "R2T at {} before the solicited data at {from}",
                                    r.buffer_offset
                                )),
                            };
                            match read {
                                Ok(data) => {
                                    debug!(itt = r.itt, "iSER RDMA Read done");
                                    let _ = data_tx.send(Pdu::with_data(
                                        Bhs::DataOut(DataOut {
                                            final_bit: true,
                                            lun: r.lun,
                                            itt: r.itt,
                                            ttt: r.ttt,
                                            exp_stat_sn: 0,
                                            data_sn: 0,
                                            buffer_offset: r.buffer_offset,
                                        }),
                                        data,
                                    ));
                                }
                                Err(e) => {
                                    warn!(itt = r.itt, error = %e, "iSER RDMA Read failed: dropping the connection");
                                    wire.qp.disconnect();
                                }
                            }
                        });
                        Ok(())
                    }
                }
            }
            mut other => {
                if let Bhs::ScsiResponse(s) = other {
                    buffers.lock().unwrap().answered(s.itt);
                }
                send_stamped(&wire, &shared, &mut stat_sn, &mut other, data).await
            }
        };
        if let Err(e) = result {
            warn!(error = %e, "iSER send failed: dropping the connection");
            wire.qp.disconnect();
            return;
        }
    }
}

async fn send_stamped(
    wire: &Wire,
    shared: &Shared,
    stat_sn: &mut u32,
    bhs: &mut Bhs,
    data: Vec<u8>,
) -> Result<(), String> {
    let (exp, max) = shared.numbers();
    stamp(bhs, *stat_sn, exp, max);
    if advances_stat_sn(bhs) {
        *stat_sn = stat_sn.wrapping_add(1);
    }
    debug!(opcode = ?bhs.opcode(), "iSER send");
    wire.send(&Pdu::with_data(*bhs, data)).await
}
