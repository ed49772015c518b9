//! Soft reliable-connection queue pairs: connection establishment with private data, the
//! requester (post_send/post_recv, completions in order) and the per-connection responder
//! task that serves the peer's one-sided requests from registered memory.
//!
//! Tasks per connection: a reader (socket → responses handled inline, requests forwarded
//! to the responder), the responder (serves requests strictly in order, so responses go
//! back in order; it waits for a posted receive before consuming a SEND, like an RNR
//! retry that never gives up) and a writer (frames → socket).
//!
//! A real RC queue pair buffers nothing for its peer: RDMA READs beyond the responder's
//! resources wait at the requester, a SEND with no receive posted is refused (RNR NAK)
//! and retried. Here the responder's queues have budgets ([`REQUEST_BYTES`],
//! [`ANSWER_BYTES`], [`QUEUED_FRAMES`]); while one is spent the reader reads no more
//! requests, and TCP's flow control holds the peer back instead of this side's memory
//! growing. A well-behaved peer, whose requests in flight are bounded by its send queue,
//! rarely meets a budget, and then only waits.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};

use super::memory::KeyTable;
use super::wire::{self, Header, Kind, HEADER_LEN, MAGIC, MAX_PAYLOAD};
use super::{SoftCq, SoftProvider};
use crate::rdma::{
    check_private_data, Completion, ConnectRequest, QpCaps, QpInit, QueuePair, RdmaError,
    RdmaListener, RecvWr, Result, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Payload bytes of the peer's requests (RDMA WRITE and SEND data) read and not yet
/// served. A frame's share is taken before its payload is read, so at most this much
/// waits, for instance behind a SEND that has no receive to land in. At least one
/// frame of the largest size must fit.
const REQUEST_BYTES: usize = MAX_PAYLOAD;
/// Bytes of RDMA READ answers built and not yet written to the socket: the responder's
/// resources for a peer that asks faster than it takes the answers.
const ANSWER_BYTES: usize = MAX_PAYLOAD;
/// Requests, and answers, queued at most: a zero-length WRITE costs no bytes, but its
/// queue entry and acknowledgement do. Above any send queue depth used here (1024), so
/// a well-behaved peer never waits for it.
const QUEUED_FRAMES: usize = 4096;
/// How long the socket may take no byte at all once the peer's frames have ended: a
/// peer that closed and reads nothing more is going away (its queue pair is gone; an RC
/// requester would exhaust its transport retries), so the queue pair fails instead of
/// holding its answers until the layer above times out. A closed peer that still reads,
/// however slowly, gets every answer.
const CLOSED_PEER_WRITE_GRACE: Duration = Duration::from_secs(5);

/// A frame read from the socket. A request (RDMA WRITE, SEND) holds its share of
/// [`REQUEST_BYTES`] until served.
struct Frame {
    header: Header,
    payload: Vec<u8>,
    /// A request's share; none for responses and for a refused WRITE.
    budget: Option<OwnedSemaphorePermit>,
    /// An RDMA WRITE that could not be placed as its header arrived (unknown or stale
    /// rkey, out of bounds, no REMOTE_WRITE): its payload was read and dropped, and it is
    /// answered with a remote access error in its turn.
    refused: bool,
}

/// The responder's answer to one request; a READ answer holds its share of
/// [`ANSWER_BYTES`] until written.
struct Answer {
    /// Its place in the order this side queues frames in ([`Shared::queue_order`]).
    queued: u64,
    frame: Bytes,
    budget: Option<OwnedSemaphorePermit>,
}

struct Pending {
    wr_id: u64,
    opcode: WcOpcode,
    signaled: bool,
    byte_len: u32,
    /// Where an RDMA READ's data go.
    read_sgl: Option<Vec<Sge>>,
    /// Failed locally at post time; completes with this status when it reaches the head.
    local_error: Option<WcStatus>,
}

#[derive(Default)]
struct State {
    error: bool,
    /// The peer's frames have ended (it closed, or broke the protocol): the requests
    /// read before are still served, in order, and then the queue pair fails.
    peer_closed: bool,
    outstanding: VecDeque<Pending>,
    recvs: VecDeque<RecvWr>,
}

struct Shared {
    keys: Arc<KeyTable>,
    send_cq: SoftCq,
    recv_cq: SoftCq,
    caps: QpCaps,
    out: mpsc::UnboundedSender<(u64, Bytes)>,
    /// Numbers the frames this side queues, requests and answers alike: the writer sends
    /// them in this order, as one wire would.
    queued: AtomicU64,
    state: Mutex<State>,
    recv_posted: Notify,
}

impl Shared {
    fn complete_send(&self, p: &Pending, status: WcStatus) {
        if p.signaled || !status.is_ok() {
            self.send_cq.push(Completion {
                wr_id: p.wr_id,
                status,
                opcode: p.opcode,
                byte_len: if status.is_ok() { p.byte_len } else { 0 },
            });
        }
    }

    /// Enter the error state: flush every outstanding send and posted receive.
    fn enter_error(&self, st: &mut State) {
        st.error = true;
        for p in st.outstanding.drain(..) {
            let status = p.local_error.unwrap_or(WcStatus::WrFlushError);
            if p.signaled || !status.is_ok() {
                self.send_cq.push(Completion {
                    wr_id: p.wr_id,
                    status,
                    opcode: p.opcode,
                    byte_len: 0,
                });
            }
        }
        for r in st.recvs.drain(..) {
            self.recv_cq.push(Completion {
                wr_id: r.wr_id,
                status: WcStatus::WrFlushError,
                opcode: WcOpcode::Recv,
                byte_len: 0,
            });
        }
        self.recv_posted.notify_waiters();
    }

    /// Complete requests that failed locally once they reach the head of the queue.
    fn drain_local_errors(&self, st: &mut State) {
        if let Some(status) = st.outstanding.front().and_then(|p| p.local_error) {
            let p = st.outstanding.pop_front().unwrap();
            self.complete_send(&p, status);
            self.enter_error(st);
        }
    }

    /// A response (ACK or READ_RESP) for the oldest outstanding request.
    fn on_response(&self, h: &Header, payload: &[u8]) -> Result<()> {
        let mut st = self.state.lock().unwrap();
        if st.error {
            return Ok(()); // flushed already
        }
        let Some(p) = st.outstanding.pop_front() else {
            return Err(RdmaError::Protocol("response without a request".into()));
        };
        let expect_read = p.opcode == WcOpcode::RdmaRead;
        if expect_read != (h.kind == Kind::ReadResp) {
            return Err(RdmaError::Protocol(
                "response kind does not match request".into(),
            ));
        }
        let mut status = h.status;
        if status.is_ok() {
            if let Some(sgl) = &p.read_sgl {
                if payload.len() != p.byte_len as usize {
                    return Err(RdmaError::Protocol("READ response length mismatch".into()));
                }
                if let Err(s) = self.keys.scatter(sgl, payload) {
                    status = s;
                }
            }
        }
        self.complete_send(&p, status);
        if !status.is_ok() {
            self.enter_error(&mut st);
        } else {
            self.drain_local_errors(&mut st);
        }
        Ok(())
    }

    fn send_frame(&self, f: Bytes) {
        // A closed channel means the connection is gone; the reader flushes everything.
        let _ = self.out.send((self.queue_order(), f));
    }

    /// The next frame's place in the order of the wire.
    fn queue_order(&self) -> u64 {
        self.queued.fetch_add(1, Ordering::Relaxed)
    }
}

/// A soft RC queue pair. Dropping it closes the connection.
pub struct SoftQp {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
    peer_private: Vec<u8>,
    peer_addr: SocketAddr,
}

impl QueuePair for SoftQp {
    fn post_send(&self, wr: SendWr) -> Result<()> {
        let sh = &self.shared;
        if wr.sgl.len() > sh.caps.max_sge as usize {
            return Err(RdmaError::InvalidArgument(format!(
                "{} SGEs, max_sge is {}",
                wr.sgl.len(),
                sh.caps.max_sge
            )));
        }
        let total: u64 = wr.sgl.iter().map(|s| s.length as u64).sum();
        if total > MAX_PAYLOAD as u64 {
            return Err(RdmaError::InvalidArgument(format!(
                "{total} bytes exceed the soft backend's {MAX_PAYLOAD}-byte message limit"
            )));
        }
        let mut st = sh.state.lock().unwrap();
        let opcode = WcOpcode::from(wr.op);
        let mut pending = Pending {
            wr_id: wr.wr_id,
            opcode,
            signaled: wr.signaled,
            byte_len: total as u32,
            read_sgl: None,
            local_error: None,
        };
        if st.error {
            sh.complete_send(&pending, WcStatus::WrFlushError);
            return Ok(());
        }
        if st.outstanding.len() >= sh.caps.max_send_wr as usize {
            return Err(RdmaError::QueueFull {
                queue: "send",
                depth: sh.caps.max_send_wr,
            });
        }
        let frame = match wr.op {
            SendOp::Send | SendOp::RdmaWrite { .. } => {
                let mut buf = Vec::with_capacity(HEADER_LEN + total as usize);
                buf.resize(HEADER_LEN, 0);
                match sh.keys.gather(&wr.sgl, &mut buf) {
                    Ok(()) => {
                        let mut h = Header::new(if wr.op == SendOp::Send {
                            Kind::Send
                        } else {
                            Kind::Write
                        });
                        if let SendOp::RdmaWrite { remote_addr, rkey } = wr.op {
                            h.addr = remote_addr;
                            h.rkey = rkey;
                        }
                        h.len = total as u32;
                        let mut hb = bytes::BytesMut::with_capacity(HEADER_LEN);
                        h.encode(&mut hb);
                        buf[..HEADER_LEN].copy_from_slice(&hb);
                        Ok(Bytes::from(buf))
                    }
                    Err(s) => Err(s),
                }
            }
            SendOp::RdmaRead { remote_addr, rkey } => match sh.keys.check_local(&wr.sgl, true) {
                Ok(_) => {
                    pending.read_sgl = Some(wr.sgl);
                    let mut h = Header::new(Kind::ReadReq);
                    h.addr = remote_addr;
                    h.rkey = rkey;
                    h.aux = total as u32;
                    Ok(wire::frame(h, &[]).freeze())
                }
                Err(s) => Err(s),
            },
        };
        match frame {
            Ok(f) => {
                st.outstanding.push_back(pending);
                sh.send_frame(f);
            }
            Err(status) => {
                pending.local_error = Some(status);
                st.outstanding.push_back(pending);
                sh.drain_local_errors(&mut st);
            }
        }
        Ok(())
    }

    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        let sh = &self.shared;
        if wr.sgl.len() > sh.caps.max_sge as usize {
            return Err(RdmaError::InvalidArgument("too many SGEs".into()));
        }
        let mut st = sh.state.lock().unwrap();
        if st.error {
            sh.recv_cq.push(Completion {
                wr_id: wr.wr_id,
                status: WcStatus::WrFlushError,
                opcode: WcOpcode::Recv,
                byte_len: 0,
            });
            return Ok(());
        }
        if st.recvs.len() >= sh.caps.max_recv_wr as usize {
            return Err(RdmaError::QueueFull {
                queue: "receive",
                depth: sh.caps.max_recv_wr,
            });
        }
        st.recvs.push_back(wr);
        drop(st);
        sh.recv_posted.notify_waiters();
        Ok(())
    }

    fn peer_private_data(&self) -> &[u8] {
        &self.peer_private
    }

    fn peer_addr(&self) -> SocketAddr {
        self.peer_addr
    }

    fn is_error(&self) -> bool {
        self.shared.state.lock().unwrap().error
    }

    fn disconnect(&self) {
        for t in &self.tasks {
            t.abort();
        }
        let mut st = self.shared.state.lock().unwrap();
        if !st.error {
            self.shared.enter_error(&mut st);
        }
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        self.disconnect();
    }
}

fn start(stream: TcpStream, init: QpInit<SoftProvider>, peer_private: Vec<u8>) -> Result<SoftQp> {
    stream.set_nodelay(true)?;
    let peer_addr = stream.peer_addr()?;
    let (rd, wr) = stream.into_split();
    let (out_tx, out_rx) = mpsc::unbounded_channel();
    let (req_tx, req_rx) = mpsc::channel(QUEUED_FRAMES);
    let (answer_tx, answer_rx) = mpsc::channel(QUEUED_FRAMES);
    let shared = Arc::new(Shared {
        keys: init.pd.keys.clone(),
        send_cq: init.send_cq,
        recv_cq: init.recv_cq,
        caps: init.caps,
        out: out_tx,
        queued: AtomicU64::new(0),
        state: Mutex::new(State::default()),
        recv_posted: Notify::new(),
    });
    let tasks = vec![
        tokio::spawn(writer(wr, shared.clone(), out_rx, answer_rx)),
        tokio::spawn(reader(rd, shared.clone(), req_tx)),
        tokio::spawn(responder(shared.clone(), req_rx, answer_tx)),
    ];
    Ok(SoftQp {
        shared,
        tasks,
        peer_private,
        peer_addr,
    })
}

/// Writes this side's requests (bounded by the send queue) and the responder's answers,
/// in the order they were queued: an acknowledgement queued before this side's software
/// saw the SEND it acknowledges goes out before whatever that software posts in reply.
async fn writer(
    mut wr: OwnedWriteHalf,
    shared: Arc<Shared>,
    mut requests: mpsc::UnboundedReceiver<(u64, Bytes)>,
    mut answers: mpsc::Receiver<Answer>,
) {
    let (mut request, mut answer) = (None, None);
    loop {
        if request.is_none() {
            request = requests.try_recv().ok();
        }
        if answer.is_none() {
            answer = answers.try_recv().ok();
        }
        let first_answer = match (&request, &answer) {
            (Some((r, _)), Some(a)) => a.queued < *r,
            (None, Some(_)) => true,
            (Some(_), None) => false,
            (None, None) => {
                tokio::select! {
                    Some(r) = requests.recv() => request = Some(r),
                    Some(a) = answers.recv() => answer = Some(a),
                    else => break,
                }
                continue;
            }
        };
        let (frame, budget) = if first_answer {
            let a = answer.take().expect("an answer waits");
            (a.frame, a.budget)
        } else {
            (request.take().expect("a request waits").1, None)
        };
        if !write_frame(&mut wr, &shared, &frame).await {
            break;
        }
        // Only now is the answer's memory free to count again.
        drop(budget);
    }
    let _ = wr.shutdown().await;
}

/// Writes one frame; false when the socket failed, or when it took no byte of the frame
/// for [`CLOSED_PEER_WRITE_GRACE`] and the peer's frames had ended by then. The writer
/// then stops, which ends the responder, and the queue pair fails.
async fn write_frame(wr: &mut OwnedWriteHalf, shared: &Shared, frame: &[u8]) -> bool {
    let mut rest = frame;
    while !rest.is_empty() {
        // `write` takes bytes only when it completes, so a timed-out one wrote nothing.
        match tokio::time::timeout(CLOSED_PEER_WRITE_GRACE, wr.write(rest)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return false,
            Ok(Ok(n)) => rest = &rest[n..],
            Err(_) if shared.state.lock().unwrap().peer_closed => {
                tracing::debug!("soft RDMA: the peer closed and reads nothing more");
                return false;
            }
            // The peer is slow, or has no receive posted for our SEND: an RC requester
            // keeps retrying (RNR retry count 7 is unbounded), and so does this.
            Err(_) => {}
        }
    }
    true
}

/// Reads one frame. A request's payload is read only once it has its share of
/// `request_bytes`; until then the socket is not read. An RDMA WRITE that this side's
/// keys refuse as its header arrives takes no share: its payload passes through a small
/// buffer and is dropped, so a peer cannot make this side hold up to [`MAX_PAYLOAD`]
/// bytes per frame for writes it may not make (a peer that was given no key, such as an
/// initiator before login, can make no other).
async fn read_frame(
    rd: &mut OwnedReadHalf,
    keys: &KeyTable,
    request_bytes: &Arc<Semaphore>,
) -> Result<Frame> {
    let mut hb = [0u8; HEADER_LEN];
    rd.read_exact(&mut hb).await?;
    let h = Header::decode(&hb)?;
    if h.kind == Kind::Write && !keys.remote_write_allowed(h.rkey, h.addr, h.len as usize) {
        let len = u64::from(h.len);
        let dropped = tokio::io::copy(&mut (&mut *rd).take(len), &mut tokio::io::sink()).await?;
        if dropped != len {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
        return Ok(Frame {
            header: h,
            payload: Vec::new(),
            budget: None,
            refused: true,
        });
    }
    let budget = if h.kind.is_request() {
        // `decode` bounds len by MAX_PAYLOAD, which the budget holds whole.
        let share = request_bytes.clone().acquire_many_owned(h.len).await;
        Some(share.map_err(|_| RdmaError::QpError)?)
    } else {
        None
    };
    let mut payload = vec![0u8; h.len as usize];
    rd.read_exact(&mut payload).await?;
    Ok(Frame {
        header: h,
        payload,
        budget,
        refused: false,
    })
}

async fn reader(mut rd: OwnedReadHalf, shared: Arc<Shared>, req_tx: mpsc::Sender<Frame>) {
    let request_bytes = Arc::new(Semaphore::new(REQUEST_BYTES));
    loop {
        let frame = match read_frame(&mut rd, &shared.keys, &request_bytes).await {
            Ok(f) => f,
            Err(e) => {
                tracing::debug!("soft RDMA connection closed: {e}");
                break;
            }
        };
        let h = frame.header;
        if h.kind.is_request() {
            if req_tx.send(frame).await.is_err() {
                break;
            }
        } else if matches!(h.kind, Kind::Ack | Kind::ReadResp) {
            if let Err(e) = shared.on_response(&h, &frame.payload) {
                tracing::warn!("soft RDMA: {e}; closing the connection");
                break;
            }
        } else {
            tracing::warn!("soft RDMA: unexpected {:?} frame; closing", h.kind);
            break;
        }
    }
    // What the peer sent before it closed still lands, as on an RC adapter, which
    // places every packet it received before it notices the connection is gone: a
    // target's Logout Response followed at once by its close must reach the initiator.
    // The responder serves the requests already read, then fails the queue pair; the
    // requests' channel closes as this task ends.
    shared.state.lock().unwrap().peer_closed = true;
    shared.recv_posted.notify_waiters();
}

/// The responder: serves the peer's requests against this side's registered memory,
/// without involving the upper layer. When the requests end (the peer closed) or cannot
/// be served, the queue pair enters the error state.
async fn responder(shared: Arc<Shared>, rx: mpsc::Receiver<Frame>, answers: mpsc::Sender<Answer>) {
    serve_requests(&shared, rx, answers).await;
    let mut st = shared.state.lock().unwrap();
    if !st.error {
        shared.enter_error(&mut st);
    }
}

async fn serve_requests(
    shared: &Shared,
    mut rx: mpsc::Receiver<Frame>,
    answers: mpsc::Sender<Answer>,
) {
    let answer_bytes = Arc::new(Semaphore::new(ANSWER_BYTES));
    while let Some(request) = rx.recv().await {
        let Frame {
            header: h,
            payload,
            budget: held,
            refused,
        } = request;
        let mut budget = None;
        let reply = match h.kind {
            Kind::Write => {
                let mut a = Header::new(Kind::Ack);
                a.status = if refused {
                    WcStatus::RemoteAccessError
                } else {
                    // Placed with the state locked, as READ responses and
                    // SENDs are: `disconnect` aborts this task, but an abort
                    // lands at its next await, not within a copy; the error
                    // state it enters under this lock is what ensures that
                    // once it returns no byte of this connection lands in
                    // memory the caller may reuse (an arena, a registration
                    // cache). A queue pair in the error state places nothing,
                    // as an RC adapter's drops what arrives.
                    let st = shared.state.lock().unwrap();
                    if st.error {
                        WcStatus::RemoteOperationError
                    } else {
                        shared.keys.remote_write(h.rkey, h.addr, &payload)
                    }
                };
                wire::frame(a, &[])
            }
            Kind::ReadReq => {
                // `decode` bounds aux by MAX_PAYLOAD, which the budget holds whole.
                let Ok(share) = answer_bytes.clone().acquire_many_owned(h.aux).await else {
                    return;
                };
                let mut data = vec![0u8; h.aux as usize];
                let status = shared.keys.remote_read(h.rkey, h.addr, &mut data);
                let mut a = Header::new(Kind::ReadResp);
                a.status = status;
                budget = status.is_ok().then_some(share);
                wire::frame(a, if status.is_ok() { &data } else { &[] })
            }
            Kind::Send => {
                // The acknowledgement is queued as the receive completes (see
                // `deliver_send`), not after.
                let Ok(ack) = answers.reserve().await else {
                    return;
                };
                if !deliver_send(shared, &payload, ack).await {
                    return;
                }
                continue;
            }
            _ => unreachable!("reader forwards requests only"),
        };
        // Served: the payload's bytes no longer wait.
        drop((payload, held));
        let answer = Answer {
            queued: shared.queue_order(),
            frame: reply.freeze(),
            budget,
        };
        if answers.send(answer).await.is_err() {
            return;
        }
    }
}

/// Place an incoming SEND into the oldest posted receive, waiting for one, and queue its
/// acknowledgement through `ack` before the receive's completion becomes visible: an RC
/// adapter acknowledges on placement, so whatever the software above posts in answer
/// leaves after the acknowledgement. (Were the answer first, a peer that answers and then
/// disconnects, as an iSER target does after a Logout Response, would leave the
/// requester's SEND, which it did receive, flushed with an error.) False when the queue
/// pair failed meanwhile, or when no receive is posted and the peer has closed (no RNR
/// retry can follow).
async fn deliver_send(shared: &Shared, payload: &[u8], ack: mpsc::Permit<'_, Answer>) -> bool {
    loop {
        let posted = shared.recv_posted.notified();
        {
            let mut st = shared.state.lock().unwrap();
            if st.error {
                return false;
            }
            if let Some(r) = st.recvs.pop_front() {
                let (recv_status, sender_status) = match shared.keys.scatter(&r.sgl, payload) {
                    Ok(()) => (WcStatus::Success, WcStatus::Success),
                    Err(WcStatus::LocalLengthError) => {
                        (WcStatus::LocalLengthError, WcStatus::RemoteInvalidRequest)
                    }
                    Err(s) => (s, WcStatus::RemoteOperationError),
                };
                let mut a = Header::new(Kind::Ack);
                a.status = sender_status;
                ack.send(Answer {
                    queued: shared.queue_order(),
                    frame: wire::frame(a, &[]).freeze(),
                    budget: None,
                });
                shared.recv_cq.push(Completion {
                    wr_id: r.wr_id,
                    status: recv_status,
                    opcode: WcOpcode::Recv,
                    byte_len: if recv_status.is_ok() {
                        payload.len() as u32
                    } else {
                        0
                    },
                });
                return true;
            }
            if st.peer_closed {
                return false;
            }
        }
        posted.await;
    }
}

/// Active side: connect and wait for ACCEPT or REJECT.
pub(super) async fn connect(
    addr: SocketAddr,
    init: QpInit<SoftProvider>,
    private_data: &[u8],
) -> Result<SoftQp> {
    check_private_data(private_data)?;
    let mut stream = TcpStream::connect(addr).await?;
    let mut h = Header::new(Kind::Connect);
    h.aux = MAGIC;
    stream.write_all(&wire::frame(h, private_data)).await?;
    let (h, peer_private) = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let mut hb = [0u8; HEADER_LEN];
        stream.read_exact(&mut hb).await?;
        let h = Header::decode(&hb)?;
        let mut pd = vec![0u8; h.len as usize];
        stream.read_exact(&mut pd).await?;
        Ok::<_, RdmaError>((h, pd))
    })
    .await
    .map_err(|_| RdmaError::Protocol("connection handshake timed out".into()))??;
    match h.kind {
        Kind::Accept => start(stream, init, peer_private),
        Kind::Reject => Err(RdmaError::Rejected {
            private_data: peer_private,
        }),
        k => Err(RdmaError::Protocol(format!(
            "unexpected {k:?} during connect"
        ))),
    }
}

/// CONNECT frames awaited at once at most; past this the listener takes no more TCP
/// connections until a handshake ends (each ends within [`HANDSHAKE_TIMEOUT`]).
const HANDSHAKES: usize = 64;

/// A connection whose CONNECT frame arrived: its socket and the peer's private data.
type Handshaken = Result<(TcpStream, Vec<u8>)>;

/// Passive side: a TCP listener that reads CONNECT frames.
pub struct SoftListener {
    listener: TcpListener,
    /// Connections whose CONNECT frame is awaited, each in its own task: a peer that
    /// connects and sends nothing holds up no one else.
    handshakes: JoinSet<(SocketAddr, Handshaken)>,
}

/// Reads a CONNECT frame and its private data.
async fn handshake(mut stream: TcpStream) -> Handshaken {
    let connect = async {
        let mut hb = [0u8; HEADER_LEN];
        stream.read_exact(&mut hb).await?;
        let h = Header::decode(&hb)?;
        if h.kind != Kind::Connect || h.aux != MAGIC {
            return Err(RdmaError::Protocol("not a soft RDMA CONNECT".into()));
        }
        let mut pd = vec![0u8; h.len as usize];
        stream.read_exact(&mut pd).await?;
        Ok(pd)
    };
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, connect).await {
        Ok(Ok(private_data)) => Ok((stream, private_data)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(RdmaError::Protocol(format!(
            "no CONNECT within {} s",
            HANDSHAKE_TIMEOUT.as_secs()
        ))),
    }
}

impl SoftListener {
    pub(super) async fn bind(addr: SocketAddr) -> Result<SoftListener> {
        Ok(SoftListener {
            listener: TcpListener::bind(addr).await?,
            handshakes: JoinSet::new(),
        })
    }
}

impl RdmaListener for SoftListener {
    type Provider = SoftProvider;
    type Request = SoftConnectRequest;

    fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("bound listener has an address")
    }

    async fn accept(&mut self) -> Result<SoftConnectRequest> {
        loop {
            tokio::select! {
                accepted = self.listener.accept(), if self.handshakes.len() < HANDSHAKES => {
                    let (stream, peer) = accepted?;
                    self.handshakes.spawn(async move { (peer, handshake(stream).await) });
                }
                Some(ended) = self.handshakes.join_next() => match ended {
                    Ok((peer, Ok((stream, private_data)))) => {
                        return Ok(SoftConnectRequest {
                            stream,
                            peer,
                            private_data,
                        })
                    }
                    Ok((peer, Err(e))) => {
                        tracing::warn!("soft RDMA: refused connection from {peer}: {e}")
                    }
                    Err(e) => tracing::warn!("soft RDMA: a handshake task failed: {e}"),
                },
            }
        }
    }
}

/// A pending connection.
pub struct SoftConnectRequest {
    stream: TcpStream,
    peer: SocketAddr,
    private_data: Vec<u8>,
}

impl ConnectRequest for SoftConnectRequest {
    type Provider = SoftProvider;

    fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    async fn accept(mut self, init: QpInit<SoftProvider>, private_data: &[u8]) -> Result<SoftQp> {
        check_private_data(private_data)?;
        self.stream
            .write_all(&wire::frame(Header::new(Kind::Accept), private_data))
            .await?;
        start(self.stream, init, self.private_data)
    }

    async fn reject(mut self, private_data: &[u8]) -> Result<()> {
        check_private_data(private_data)?;
        self.stream
            .write_all(&wire::frame(Header::new(Kind::Reject), private_data))
            .await?;
        let _ = self.stream.shutdown().await;
        Ok(())
    }
}

#[cfg(test)]
#[path = "qp_tests.rs"]
mod tests;
