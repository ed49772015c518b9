//! A soft queue pair against a raw peer: its memory when the peer does not keep up, and
//! the order of what it sends back.
//!
//! A real RC queue pair never buffers for its peer: an RDMA READ beyond the responder's
//! resources waits at the requester, and a SEND with no receive posted is refused with
//! RNR NAK and retried by the sender. Over TCP, the soft provider gets the same effect by
//! reading no more requests while its budgets are spent, so TCP pushes back on the
//! peer. These tests play a raw peer on a TCP socket (it speaks the frame format and
//! ignores every rule of a well-behaved requester) and watch this process's resident
//! memory. Each nextest test is its own process, so the growth is the queue pair's.

use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::super::wire::{self, Header, Kind, HEADER_LEN, MAGIC};
use super::super::SoftProvider;
use crate::rdma::{
    AccessFlags, AlignedBuf, Completion, CompletionQueue, ConnectRequest, MemoryRegion,
    ProtectionDomain, QpCaps, QpInit, QueuePair, RdmaListener, RdmaProvider, RecvWr, SendOp,
    SendWr, Sge, WcStatus,
};

const MIB: usize = 1 << 20;

/// Resident bytes of this process.
fn resident() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|f| f.parse().ok())
        .expect("statm's second field");
    pages * 4096
}

/// Waits at least two seconds, and then until resident memory has not grown for one
/// (at most `limit` in all); returns the highest growth seen since `base`.
async fn settled_growth(base: usize, limit: Duration) -> usize {
    let start = Instant::now();
    let (mut high, mut since) = (resident(), Instant::now());
    let settling = |start: Instant, since: Instant| {
        start.elapsed() < Duration::from_secs(2) || since.elapsed() < Duration::from_secs(1)
    };
    while start.elapsed() < limit && settling(start, since) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = resident();
        if now > high + MIB {
            (high, since) = (now, Instant::now());
        }
    }
    high.saturating_sub(base)
}

struct Served<P: RdmaProvider> {
    qp: P::Qp,
    pd: P::Pd,
    recv_cq: P::Cq,
}

/// A soft listener that accepts one raw peer: the peer's socket and this side's queue pair.
async fn raw_peer(p: &SoftProvider) -> (TcpStream, Served<SoftProvider>) {
    let mut listener = p.listen("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let at = listener.local_addr();
    let mut peer = TcpStream::connect(at).await.unwrap();
    let mut connect = Header::new(Kind::Connect);
    connect.aux = MAGIC;
    peer.write_all(&wire::frame(connect, b"raw")).await.unwrap();
    let request = listener.accept().await.unwrap();
    let init: QpInit<SoftProvider> = QpInit {
        pd: p.alloc_pd().unwrap(),
        send_cq: p.create_cq(64).unwrap(),
        recv_cq: p.create_cq(64).unwrap(),
        caps: QpCaps::default(),
    };
    let served = Served {
        pd: init.pd.clone(),
        recv_cq: init.recv_cq.clone(),
        qp: request.accept(init, b"").await.unwrap(),
    };
    let accept = read_frame(&mut peer).await.0;
    assert_eq!(accept.kind, Kind::Accept);
    (peer, served)
}

async fn read_frame(peer: &mut (impl AsyncRead + Unpin)) -> (Header, Vec<u8>) {
    let mut hb = [0u8; HEADER_LEN];
    peer.read_exact(&mut hb).await.unwrap();
    let h = Header::decode(&hb).unwrap();
    let mut payload = vec![0u8; h.len as usize];
    peer.read_exact(&mut payload).await.unwrap();
    (h, payload)
}

/// Reads the `n`th acknowledgement, which must report success.
async fn expect_ack(rd: &mut (impl AsyncRead + Unpin), n: impl std::fmt::Display) {
    let (ack, _) = read_frame(rd).await;
    assert_eq!(
        (ack.kind, ack.status),
        (Kind::Ack, WcStatus::Success),
        "ack {n}"
    );
}

/// Registers a 4 MiB region the peer may read, filled with a pattern, and the RDMA READ
/// request for all of it: the region, the request, and the bytes an answer must carry.
fn readable_region(served: &Served<SoftProvider>) -> (impl MemoryRegion, Header, Vec<u8>) {
    let len = 4 * MIB;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
    let mr = served.pd.register(AlignedBuf::new(len), access).unwrap();
    let pattern: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    mr.write_at(0, &pattern).unwrap();
    let mut ask = Header::new(Kind::ReadReq);
    (ask.addr, ask.rkey, ask.aux) = (mr.addr(), mr.rkey(), len as u32);
    (mr, ask, pattern)
}

/// A buffer of `len` bytes registered for receives, and the one SGE that covers it.
fn receive_buffer(served: &Served<SoftProvider>, len: usize) -> (impl MemoryRegion, Sge) {
    let access = AccessFlags::LOCAL_WRITE;
    let mr = served.pd.register(AlignedBuf::new(len), access).unwrap();
    let sge = Sge {
        addr: mr.addr(),
        length: len as u32,
        lkey: mr.lkey(),
    };
    (mr, sge)
}

/// Posts a receive of `sge` as `wr_id` and waits (at most 10 s, else
/// panics with `why`) for the completion it gets.
async fn receive(served: &Served<SoftProvider>, wr_id: u64, sge: Sge, why: &str) -> Completion {
    served
        .qp
        .post_recv(RecvWr {
            wr_id,
            sgl: vec![sge],
        })
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), served.recv_cq.next())
        .await
        .expect(why)
        .unwrap()
}

/// Writes `frame` `times` times from a task (it blocks once this side stops reading).
fn send_repeatedly(
    mut peer: tokio::net::tcp::OwnedWriteHalf,
    frame: BytesMut,
    times: usize,
) -> tokio::task::JoinHandle<tokio::net::tcp::OwnedWriteHalf> {
    tokio::spawn(async move {
        for _ in 0..times {
            peer.write_all(&frame).await.unwrap();
        }
        peer
    })
}

/// RDMA READ requests whose answers the peer does not read: 256 of 4 MiB would queue
/// 1 GiB of answers. Once read, every answer arrives whole and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_read_answers_stay_bounded() {
    let p = SoftProvider::default();
    let (peer, served) = raw_peer(&p).await;
    let (_mr, ask, pattern) = readable_region(&served);
    let (mut rd, wr) = peer.into_split();
    let base = resident();
    let asking = send_repeatedly(wr, wire::frame(ask, &[]), 256);
    let growth = settled_growth(base, Duration::from_secs(20)).await;
    assert!(
        growth < 160 * MIB,
        "resident memory grew by {} MiB while the peer left READ answers unread",
        growth / MIB
    );

    for n in 0..256 {
        let (h, data) = read_frame(&mut rd).await;
        assert_eq!(
            (h.kind, h.status),
            (Kind::ReadResp, WcStatus::Success),
            "answer {n}"
        );
        assert!(data == pattern, "answer {n} differs from the region");
    }
    drop(asking.await.unwrap());
    drop(served.qp);
}

/// SENDs with no receive posted: 64 of 4 MiB would queue 256 MiB of payloads. Once the
/// receives are posted, each SEND lands in its own, in order, and is acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_without_receives_stay_bounded() {
    let p = SoftProvider::default();
    let (peer, served) = raw_peer(&p).await;
    let len = 4 * MIB;
    let (mut rd, wr) = peer.into_split();
    let base = resident();
    let payload = vec![0x5au8; len];
    let sending = send_repeatedly(wr, wire::frame(Header::new(Kind::Send), &payload), 64);
    drop(payload);
    let growth = settled_growth(base, Duration::from_secs(20)).await;
    assert!(
        growth < 160 * MIB,
        "resident memory grew by {} MiB while SENDs waited for receives",
        growth / MIB
    );

    let (mr, sge) = receive_buffer(&served, len);
    for n in 0..64u64 {
        mr.write_at(0, &[0u8; 8]).unwrap();
        let c = receive(&served, n, sge, "a receive completes").await;
        assert_eq!(
            (c.wr_id, c.status, c.byte_len as usize),
            (n, WcStatus::Success, len)
        );
        let mut head = [0u8; 8];
        mr.read_at(0, &mut head).unwrap();
        assert_eq!(head, [0x5a; 8], "SEND {n} landed");
        expect_ack(&mut rd, n).await;
    }
    drop(sending.await.unwrap());
}

/// Zero-length RDMA WRITEs whose acknowledgements the peer does not read: each asks
/// nothing of memory, but two million queued acknowledgements would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_acknowledgements_stay_bounded() {
    let p = SoftProvider::default();
    let (peer, served) = raw_peer(&p).await;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr = served.pd.register(AlignedBuf::new(4096), access).unwrap();
    let (mut rd, wr) = peer.into_split();
    let base = resident();
    let mut put = Header::new(Kind::Write);
    (put.addr, put.rkey) = (mr.addr(), mr.rkey());
    let mut burst = BytesMut::new();
    for _ in 0..4096 {
        burst.extend_from_slice(&wire::frame(put, &[]));
    }
    let times = 512;
    let putting = send_repeatedly(wr, burst, times);
    let growth = settled_growth(base, Duration::from_secs(20)).await;
    assert!(
        growth < 32 * MIB,
        "resident memory grew by {} MiB while acknowledgements went unread",
        growth / MIB
    );
    for n in 0..times * 4096 {
        expect_ack(&mut rd, n).await;
    }
    drop(putting.await.unwrap());
    drop(served.qp);
}

/// RDMA WRITEs this side's keys refuse (an rkey never issued), eight of the largest frame
/// (64 MiB), behind a SEND that waits for a receive and so holds its share of the request
/// budget. Each WRITE is refused as its header arrives and its payload dropped on the way
/// in: the peer gets to write all 512 MiB while the SEND still waits, and none of it stays
/// resident here. (Were the payloads held, the first would wait for a budget the waiting
/// SEND never gives back, and TCP would stop the peer.) Once a receive is posted every
/// answer comes back in order: the SEND's acknowledgement, eight remote access errors,
/// and a valid WRITE that follows them lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_writes_are_dropped_as_they_arrive() {
    let p = SoftProvider::default();
    let (peer, served) = raw_peer(&p).await;
    let (mut rd, mut wr) = peer.into_split();
    let message = vec![0x5au8; 4096];
    let send = wire::frame(Header::new(Kind::Send), &message);
    wr.write_all(&send).await.unwrap();
    let mut bad = Header::new(Kind::Write);
    (bad.addr, bad.rkey) = (0x10_0000, 0xdead_be01);
    let refused = 8;
    let frame = wire::frame(bad, &vec![0xa5u8; wire::MAX_PAYLOAD]);
    let base = resident();
    let writing = send_repeatedly(wr, frame, refused);
    let mut wr = tokio::time::timeout(Duration::from_secs(60), writing)
        .await
        .expect("the peer wrote every refused WRITE while the SEND waited for a receive")
        .unwrap();
    let growth = settled_growth(base, Duration::from_secs(10)).await;
    assert!(
        growth < 32 * MIB,
        "resident memory grew by {} MiB for WRITEs that were refused",
        growth / MIB
    );

    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let target = served.pd.register(AlignedBuf::new(4096), access).unwrap();
    let mut good = Header::new(Kind::Write);
    (good.addr, good.rkey) = (target.addr(), target.rkey());
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    wr.write_all(&wire::frame(good, &pattern)).await.unwrap();
    let (inbox, sge) = receive_buffer(&served, 4096);
    let c = receive(&served, 7, sge, "the SEND lands once a receive is posted").await;
    assert_eq!(
        (c.wr_id, c.status, c.byte_len),
        (7, WcStatus::Success, 4096)
    );
    let mut landed = vec![0u8; 4096];
    inbox.read_at(0, &mut landed).unwrap();
    assert!(landed == message, "the SEND's bytes");
    expect_ack(&mut rd, "of the SEND").await;
    for n in 0..refused {
        let (h, _) = read_frame(&mut rd).await;
        assert_eq!(
            (h.kind, h.status),
            (Kind::Ack, WcStatus::RemoteAccessError),
            "refused WRITE {n}"
        );
    }
    expect_ack(&mut rd, "of the valid WRITE").await;
    let mut placed = vec![0u8; 4096];
    target.read_at(0, &mut placed).unwrap();
    assert!(placed == pattern, "the valid WRITE's bytes");
    drop(served.qp);
}

/// Peers that open a TCP connection and never send CONNECT (a port scan, an initiator
/// that died mid-connect) hold up no one else: a real connect made behind two of them
/// is accepted long before their handshakes time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_do_not_hold_up_the_listener() {
    let p = SoftProvider::default();
    let mut listener = p.listen("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let at = listener.local_addr();
    let server = tokio::spawn(async move {
        let request = listener.accept().await.unwrap();
        (request.private_data().to_vec(), listener)
    });
    let silent_a = TcpStream::connect(at).await.unwrap();
    let silent_b = TcpStream::connect(at).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut real = TcpStream::connect(at).await.unwrap();
    let mut connect = Header::new(Kind::Connect);
    connect.aux = MAGIC;
    real.write_all(&wire::frame(connect, b"real"))
        .await
        .unwrap();
    let (private_data, _listener) = tokio::time::timeout(super::HANDSHAKE_TIMEOUT / 2, server)
        .await
        .expect("the real connect is accepted while the silent ones wait")
        .unwrap();
    assert!(private_data == b"real", "accepted {private_data:?}");
    drop((silent_a, silent_b));
}

/// A responder acknowledges a SEND before the software above can react to its receive
/// completion, as an RC adapter acknowledges on placement: a SEND posted in answer goes
/// out after the acknowledgement. Otherwise a requester that gets the answer and then
/// the close (an iSER target answering a Logout Request and disconnecting) sees its own
/// SEND, which the peer did receive, flushed with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_is_acknowledged_before_the_answer_to_it() {
    let p = SoftProvider::default();
    let (peer, served) = raw_peer(&p).await;
    // Small frames both ways, as an adapter sends them: no Nagle delay.
    peer.set_nodelay(true).unwrap();
    let (mut rd, mut wr) = peer.into_split();
    let mr = served
        .pd
        .register(AlignedBuf::new(4096), AccessFlags::LOCAL_WRITE)
        .unwrap();
    let sge = |len: u32| Sge {
        addr: mr.addr(),
        length: len,
        lkey: mr.lkey(),
    };
    for n in 0..500u64 {
        served
            .qp
            .post_recv(RecvWr {
                wr_id: n,
                sgl: vec![sge(4096)],
            })
            .unwrap();
        wr.write_all(&wire::frame(Header::new(Kind::Send), b"request"))
            .await
            .unwrap();
        let c = tokio::time::timeout(Duration::from_secs(10), served.recv_cq.next())
            .await
            .expect("the request's receive completes")
            .unwrap();
        assert_eq!((c.wr_id, c.status), (n, WcStatus::Success));
        served
            .qp
            .post_send(SendWr {
                wr_id: n,
                op: SendOp::Send,
                sgl: vec![sge(8)],
                signaled: false,
            })
            .unwrap();
        let (first, _) = read_frame(&mut rd).await;
        assert_eq!(
            (first.kind, first.status),
            (Kind::Ack, WcStatus::Success),
            "round {n}: the answer went out before the request's acknowledgement"
        );
        let (answer, payload) = read_frame(&mut rd).await;
        assert_eq!((answer.kind, payload.len()), (Kind::Send, 8), "round {n}");
        // Acknowledge the answer, as the raw peer's adapter would.
        wr.write_all(&wire::frame(Header::new(Kind::Ack), &[]))
            .await
            .unwrap();
    }
}

/// A SEND the peer made just before it closed lands in its posted receive, and only
/// then does the queue pair fail: an RC adapter places what arrived before it notices
/// the connection is gone. (An iSER target closes right after its Logout Response.)
/// A SEND that finds no receive posted after the close is not kept waiting for one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_before_the_close_lands() {
    let p = SoftProvider::default();
    for round in 0..200 {
        let (peer, served) = raw_peer(&p).await;
        let (mut rd, mut wr) = peer.into_split();
        let (_mr, sge) = receive_buffer(&served, 4096);
        for wr_id in [1, 2] {
            let sgl = vec![sge];
            served.qp.post_recv(RecvWr { wr_id, sgl }).unwrap();
        }
        let mut both = wire::frame(Header::new(Kind::Send), b"last words");
        both.extend_from_slice(&wire::frame(Header::new(Kind::Send), b"after"));
        wr.write_all(&both).await.unwrap();
        wr.shutdown().await.unwrap();
        let mut completions = Vec::new();
        for _ in 0..2 {
            let c = tokio::time::timeout(Duration::from_secs(10), served.recv_cq.next())
                .await
                .expect("the receives complete")
                .unwrap();
            completions.push((c.wr_id, c.status, c.byte_len));
        }
        assert_eq!(
            completions,
            [(1, WcStatus::Success, 10), (2, WcStatus::Success, 5)],
            "round {round}"
        );
        // Both acknowledged, then the queue pair fails.
        expect_ack(&mut rd, "of the first SEND").await;
        expect_ack(&mut rd, "of the second SEND").await;
        fails(&served.qp, "after the peer's close").await;
    }
    // No receive posted: the SEND cannot land, and the close fails the queue pair.
    let (peer, served) = raw_peer(&p).await;
    let (_rd, mut wr) = peer.into_split();
    wr.write_all(&wire::frame(Header::new(Kind::Send), b"nowhere"))
        .await
        .unwrap();
    wr.shutdown().await.unwrap();
    fails(&served.qp, "although a SEND waits for a receive").await;
}

/// A peer that asks for RDMA READs, closes its side and then reads nothing: the answers
/// (256 MiB) cannot all be written, and the queue pair fails within seconds instead of
/// holding them until the layer above gives up on the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_peer_that_reads_nothing_fails_the_queue_pair() {
    let p = SoftProvider::default();
    let (peer, served) = raw_peer(&p).await;
    let (_mr, ask, _) = readable_region(&served);
    let (_unread, mut wr) = peer.into_split();
    for _ in 0..64 {
        wr.write_all(&wire::frame(ask, &[])).await.unwrap();
    }
    wr.shutdown().await.unwrap();
    fails(&served.qp, "although its peer closed and reads nothing").await;
}

/// A peer that asks for RDMA READs, closes its side and then reads the answers slowly
/// (640 KiB/s, so one 4 MiB answer takes over 6 s to write): while the socket takes
/// bytes the peer is still there, and it gets every answer whole before the queue pair
/// fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_peer_that_still_reads_gets_every_answer() {
    let p = SoftProvider::default();
    let (peer, served) = raw_peer(&p).await;
    let (_mr, ask, pattern) = readable_region(&served);
    let (mut rd, mut wr) = peer.into_split();
    for _ in 0..2 {
        wr.write_all(&wire::frame(ask, &[])).await.unwrap();
    }
    wr.shutdown().await.unwrap();
    let (mut stream, mut piece) = (Vec::new(), vec![0u8; 64 * 1024]);
    let expected = 2 * (HEADER_LEN + pattern.len());
    let started = Instant::now();
    while stream.len() < expected {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let want = piece.len().min(expected - stream.len());
        let n = tokio::time::timeout(Duration::from_secs(20), rd.read(&mut piece[..want]))
            .await
            .expect("the answers keep coming")
            .unwrap();
        assert!(
            n > 0,
            "the connection ended {:?} after the close, {} of the answers' {expected} bytes read",
            started.elapsed(),
            stream.len()
        );
        stream.extend_from_slice(&piece[..n]);
    }
    for (n, answer) in stream.chunks(HEADER_LEN + pattern.len()).enumerate() {
        let h = Header::decode(answer[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(
            (h.kind, h.status, h.len as usize),
            (Kind::ReadResp, WcStatus::Success, pattern.len()),
            "answer {n}"
        );
        assert!(answer[HEADER_LEN..] == pattern, "answer {n} differs");
    }
    fails(&served.qp, "once its closed peer had every answer").await;
}

/// Waits (10 s at most) for `qp` to enter the error state.
async fn fails(qp: &impl QueuePair, when: &str) {
    let failed = async {
        while !qp.is_error() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), failed)
        .await
        .unwrap_or_else(|_| panic!("the queue pair did not fail {when}"));
}
