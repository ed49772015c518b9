//! One conformance suite for every RDMA backend: the same checks run
//! against the soft provider (in `cargo test`) and against real verbs on
//! Soft-RoCE in the kernel lab (`examples/rdma_conformance.rs`). Each
//! check connects its own queue pairs through the provider's connection
//! manager and returns what went wrong, so a runner can print one line per
//! check.
//!
//! What is checked is what the upper layers rely on: private data at
//! connection and rejection (InfiniBand pads it: the suite accepts trailing
//! zeros), RDMA Write and Read with scatter/gather lists, Send/Recv,
//! remote access errors for a forged or stale key, an out-of-bounds range
//! or a missing permission (the QP then enters the error state and later
//! work flushes), that nothing outside the region is touched, rkey
//! invalidation and deregistration, local protection errors, and
//! disconnection flushing posted receives.

use std::net::SocketAddr;
use std::time::Duration;

use super::{
    AccessFlags, AlignedBuf, Completion, CompletionQueue, ConnectRequest, MemoryRegion,
    ProtectionDomain, QpCaps, QpInit, QueuePair, RdmaError, RdmaListener, RdmaProvider, RecvWr,
    SendOp, SendWr, WcOpcode, WcStatus, MAX_PRIVATE_DATA,
};

/// What a failed check says.
pub type Outcome = std::result::Result<(), String>;

/// One end of a connected pair.
pub struct End<P: RdmaProvider> {
    pub pd: P::Pd,
    pub cq: P::Cq,
    pub rcq: P::Cq,
    pub qp: P::Qp,
}

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

fn err(what: &str) -> impl Fn(RdmaError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Whether `got` is `sent`, possibly followed by zeros (InfiniBand CM pads
/// private data to a fixed length).
pub fn private_data_matches(got: &[u8], sent: &[u8]) -> bool {
    got.len() >= sent.len() && got.starts_with(sent) && got[sent.len()..].iter().all(|&b| b == 0)
}

fn init<P: RdmaProvider>(p: &P) -> Result<(QpInit<P>, P::Cq), String> {
    let pd = p.alloc_pd().map_err(err("alloc_pd"))?;
    let cq = p.create_cq(256).map_err(err("create_cq"))?;
    let rcq = p.create_cq(256).map_err(err("create_cq"))?;
    Ok((
        QpInit {
            pd,
            send_cq: cq,
            recv_cq: rcq.clone(),
            caps: QpCaps::default(),
        },
        rcq,
    ))
}

/// Connects two queue pairs through `p`'s listener on `addr` (port 0: any),
/// checking the private data both ways.
pub async fn pair<P: RdmaProvider>(p: &P, addr: SocketAddr) -> Result<(End<P>, End<P>), String> {
    let mut l = p.listen(addr).await.map_err(err("listen"))?;
    let at = l.local_addr();
    let (init_b, rcq_b) = init(p)?;
    let server_init = init_b.clone();
    let server = tokio::spawn(async move {
        let req = l.accept().await.map_err(err("accept"))?;
        if !private_data_matches(req.private_data(), b"hello from a") {
            return Err(format!(
                "connect private data arrived as {:?}",
                req.private_data()
            ));
        }
        req.accept(server_init, b"welcome")
            .await
            .map_err(err("accept the request"))
    });
    let (init_a, rcq_a) = init(p)?;
    let qa = within(p.connect(at, init_a.clone(), b"hello from a"))
        .await?
        .map_err(err("connect"))?;
    let qb = within(server)
        .await?
        .map_err(|e| format!("listener task: {e}"))??;
    ensure!(
        private_data_matches(qa.peer_private_data(), b"welcome"),
        "accept private data arrived as {:?}",
        qa.peer_private_data()
    );
    Ok((
        End {
            pd: init_a.pd,
            cq: init_a.send_cq,
            rcq: rcq_a,
            qp: qa,
        },
        End {
            pd: init_b.pd,
            cq: init_b.send_cq,
            rcq: rcq_b,
            qp: qb,
        },
    ))
}

async fn within<T>(f: impl std::future::Future<Output = T>) -> Result<T, String> {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .map_err(|_| "no answer within 20 s".to_string())
}

async fn one<C: CompletionQueue>(cq: &C) -> Result<Completion, String> {
    within(cq.next()).await?.map_err(err("completion"))
}

fn filled(len: usize, seed: u8) -> AlignedBuf {
    let mut b = AlignedBuf::new(len);
    for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
    b
}

fn snapshot(mr: &impl MemoryRegion) -> Vec<u8> {
    let mut v = vec![0u8; mr.len()];
    let _ = mr.read_at(0, &mut v);
    v
}

fn write_wr(wr_id: u64, remote_addr: u64, rkey: u32, sge: super::Sge) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::RdmaWrite { remote_addr, rkey },
        sgl: vec![sge],
        signaled: true,
    }
}

/// RDMA Write with two SGEs into the peer's region, RDMA Read back into
/// two SGEs in the other order, then Send/Recv with the Send posted before
/// the receive.
pub async fn write_read_send_recv<P: RdmaProvider>(p: &P, addr: SocketAddr) -> Outcome {
    let (a, b) = pair(p, addr).await?;
    let reg = |pd: &P::Pd, buf, acc| pd.register(buf, acc).map_err(err("register"));
    let target = reg(&b.pd, AlignedBuf::new(64 << 10), AccessFlags::ALL)?;
    let src = reg(&a.pd, filled(8192, 1), AccessFlags::LOCAL_WRITE)?;
    let dst = reg(&a.pd, AlignedBuf::new(8192), AccessFlags::LOCAL_WRITE)?;
    let rb = target.remote_buf();
    let sge = |mr: &<P::Pd as ProtectionDomain>::Mr, off, len| mr.sge(off, len).ok_or("sge");
    a.qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::RdmaWrite {
            remote_addr: rb.addr + 100,
            rkey: rb.rkey,
        },
        sgl: vec![sge(&src, 0, 4096)?, sge(&src, 4096, 4096)?],
        signaled: true,
    })
    .map_err(err("post RDMA Write"))?;
    let c = one(&a.cq).await?;
    ensure!(
        (c.wr_id, c.status, c.opcode) == (1, WcStatus::Success, WcOpcode::RdmaWrite),
        "RDMA Write completed as {c:?}"
    );
    let mut got = vec![0u8; 8192];
    target.read_at(100, &mut got).map_err(err("read_at"))?;
    ensure!(
        got == filled(8192, 1).as_slice(),
        "the written bytes did not land at offset 100"
    );
    ensure!(
        snapshot(&target)[..100].iter().all(|&b| b == 0),
        "bytes before the written range changed"
    );
    a.qp.post_send(SendWr {
        wr_id: 2,
        op: SendOp::RdmaRead {
            remote_addr: rb.addr + 100,
            rkey: rb.rkey,
        },
        sgl: vec![sge(&dst, 4096, 4096)?, sge(&dst, 0, 4096)?],
        signaled: true,
    })
    .map_err(err("post RDMA Read"))?;
    let c = one(&a.cq).await?;
    ensure!(
        (c.wr_id, c.status, c.opcode, c.byte_len)
            == (2, WcStatus::Success, WcOpcode::RdmaRead, 8192),
        "RDMA Read completed as {c:?}"
    );
    let mut back = vec![0u8; 8192];
    dst.read_at(4096, &mut back[..4096])
        .map_err(err("read_at"))?;
    dst.read_at(0, &mut back[4096..]).map_err(err("read_at"))?;
    ensure!(back == got, "RDMA Read brought back other bytes");

    let rbuf = reg(&b.pd, AlignedBuf::new(256), AccessFlags::LOCAL_WRITE)?;
    let msg = reg(&a.pd, filled(100, 9), AccessFlags::LOCAL_WRITE)?;
    b.qp.post_recv(RecvWr {
        wr_id: 77,
        sgl: vec![sge(&rbuf, 0, 256)?],
    })
    .map_err(err("post_recv"))?;
    a.qp.post_send(SendWr {
        wr_id: 3,
        op: SendOp::Send,
        sgl: vec![sge(&msg, 0, 100)?],
        signaled: true,
    })
    .map_err(err("post Send"))?;
    let r = one(&b.rcq).await?;
    ensure!(
        (r.wr_id, r.status, r.opcode, r.byte_len) == (77, WcStatus::Success, WcOpcode::Recv, 100),
        "receive completed as {r:?}"
    );
    let c = one(&a.cq).await?;
    ensure!(
        (c.wr_id, c.status) == (3, WcStatus::Success),
        "Send completed as {c:?}"
    );
    let mut m = vec![0u8; 100];
    rbuf.read_at(0, &mut m).map_err(err("read_at"))?;
    ensure!(m == filled(100, 9).as_slice(), "Send delivered other bytes");
    Ok(())
}

/// A forged key, a range past the end or before the start, a region
/// without remote write permission and an lkey used as rkey: each is a
/// remote access error, the QP enters the error state, later work
/// flushes, and no byte of either side changes.
pub async fn remote_access_errors<P: RdmaProvider>(p: &P, addr: SocketAddr) -> Outcome {
    for case in 0..5 {
        let (a, b) = pair(p, addr).await?;
        let reg = |pd: &P::Pd, buf, acc| pd.register(buf, acc).map_err(err("register"));
        let ro = reg(&b.pd, filled(4096, 3), AccessFlags::REMOTE_READ)?;
        let rw = reg(&b.pd, filled(4096, 4), AccessFlags::ALL)?;
        let (before_ro, before_rw) = (snapshot(&ro), snapshot(&rw));
        let src = reg(&a.pd, filled(4096, 5), AccessFlags::LOCAL_WRITE)?;
        let sge = src.sge(0, 16).ok_or("sge")?;
        let (name, wr) = match case {
            0 => (
                "forged rkey",
                write_wr(10, rw.addr(), rw.rkey() ^ 0x100, sge),
            ),
            1 => (
                "past the end",
                write_wr(10, rw.addr() + 4090, rw.rkey(), sge),
            ),
            2 => ("no REMOTE_WRITE", write_wr(10, ro.addr(), ro.rkey(), sge)),
            3 if rw.lkey() != rw.rkey() => {
                ("lkey as rkey", write_wr(10, rw.addr(), rw.lkey(), sge))
            }
            3 => continue,
            _ => (
                "before the start",
                SendWr {
                    wr_id: 10,
                    op: SendOp::RdmaRead {
                        remote_addr: rw.addr() - 8,
                        rkey: rw.rkey(),
                    },
                    sgl: vec![sge],
                    signaled: true,
                },
            ),
        };
        a.qp.post_send(wr).map_err(err("post"))?;
        let c = one(&a.cq).await?;
        ensure!(
            (c.wr_id, c.status) == (10, WcStatus::RemoteAccessError),
            "{name}: completed as {c:?}"
        );
        ensure!(a.qp.is_error(), "{name}: the QP is not in the error state");
        match a.qp.post_send(SendWr {
            wr_id: 11,
            op: SendOp::Send,
            sgl: vec![],
            signaled: true,
        }) {
            Ok(()) => {
                let c = one(&a.cq).await?;
                ensure!(
                    c.status == WcStatus::WrFlushError,
                    "{name}: work after the error completed as {c:?}"
                );
            }
            // Some providers refuse to post on an errored QP at all.
            Err(RdmaError::QpError) | Err(RdmaError::Verbs { .. }) => {}
            Err(e) => return Err(format!("{name}: posting after the error: {e}")),
        }
        ensure!(
            snapshot(&ro) == before_ro,
            "{name}: the read-only region changed"
        );
        ensure!(
            snapshot(&rw) == before_rw,
            "{name}: the writable region changed"
        );
        ensure!(
            snapshot(&src) == filled(4096, 5).as_slice(),
            "{name}: a refused request changed a local byte"
        );
        drop(b);
    }
    Ok(())
}

/// After [`MemoryRegion::invalidate_rkey`] the old key is refused and the
/// new one works; after deregistration the key is refused.
pub async fn rkey_invalidation_and_deregistration<P: RdmaProvider>(
    p: &P,
    addr: SocketAddr,
) -> Outcome {
    let (a, b) = pair(p, addr).await?;
    let target =
        b.pd.register(AlignedBuf::new(4096), AccessFlags::ALL)
            .map_err(err("register"))?;
    let src =
        a.pd.register(filled(4096, 7), AccessFlags::LOCAL_WRITE)
            .map_err(err("register"))?;
    let old = target.rkey();
    let new = target.invalidate_rkey().map_err(err("invalidate_rkey"))?;
    ensure!(new != old, "invalidation kept the rkey {old:#x}");
    ensure!(target.rkey() == new, "rkey() does not report the new key");
    a.qp.post_send(write_wr(
        1,
        target.addr(),
        new,
        src.sge(0, 64).ok_or("sge")?,
    ))
    .map_err(err("post"))?;
    let c = one(&a.cq).await?;
    ensure!(
        c.status == WcStatus::Success,
        "the new key was refused: {c:?}"
    );
    a.qp.post_send(write_wr(
        2,
        target.addr(),
        old,
        src.sge(64, 64).ok_or("sge")?,
    ))
    .map_err(err("post"))?;
    let c = one(&a.cq).await?;
    ensure!(
        c.status == WcStatus::RemoteAccessError,
        "the invalidated key still worked: {c:?}"
    );
    let mut got = vec![0u8; 128];
    target.read_at(0, &mut got).map_err(err("read_at"))?;
    ensure!(
        got[..64] == filled(4096, 7).as_slice()[..64] && got[64..].iter().all(|&b| b == 0),
        "the region holds other bytes than the one accepted write"
    );
    // Deregistration kills the key too.
    let (a, b) = pair(p, addr).await?;
    let target =
        b.pd.register(AlignedBuf::new(4096), AccessFlags::ALL)
            .map_err(err("register"))?;
    let src =
        a.pd.register(filled(4096, 8), AccessFlags::LOCAL_WRITE)
            .map_err(err("register"))?;
    let rb = target.remote_buf();
    target.deregister().map_err(err("deregister"))?;
    a.qp.post_send(write_wr(3, rb.addr, rb.rkey, src.sge(0, 8).ok_or("sge")?))
        .map_err(err("post"))?;
    let c = one(&a.cq).await?;
    ensure!(
        c.status == WcStatus::RemoteAccessError,
        "a deregistered key still worked: {c:?}"
    );
    Ok(())
}

/// An RDMA Read into memory registered in another protection domain is a
/// local protection error.
pub async fn local_protection_error<P: RdmaProvider>(p: &P, addr: SocketAddr) -> Outcome {
    let (a, b) = pair(p, addr).await?;
    let (other, _) = pair(p, addr).await?;
    let target =
        b.pd.register(AlignedBuf::new(4096), AccessFlags::ALL)
            .map_err(err("register"))?;
    let foreign = other
        .pd
        .register(AlignedBuf::new(4096), AccessFlags::LOCAL_WRITE)
        .map_err(err("register"))?;
    a.qp.post_send(SendWr {
        wr_id: 2,
        op: SendOp::RdmaRead {
            remote_addr: target.addr(),
            rkey: target.rkey(),
        },
        sgl: vec![foreign.sge(0, 8).ok_or("sge")?],
        signaled: true,
    })
    .map_err(err("post"))?;
    let c = one(&a.cq).await?;
    ensure!(
        c.status == WcStatus::LocalProtectionError,
        "an SGE of another PD completed as {c:?}"
    );
    Ok(())
}

/// A rejected connection carries the rejecter's private data; private data
/// over [`MAX_PRIVATE_DATA`] is refused before anything is sent.
pub async fn reject_with_private_data<P: RdmaProvider>(p: &P, addr: SocketAddr) -> Outcome {
    let mut l = p.listen(addr).await.map_err(err("listen"))?;
    let at = l.local_addr();
    tokio::spawn(async move {
        if let Ok(req) = l.accept().await {
            let _ = req.reject(b"go away").await;
        }
    });
    let (qp_init, _) = init(p)?;
    match within(p.connect(at, qp_init.clone(), b"hi")).await? {
        Err(RdmaError::Rejected { private_data }) => ensure!(
            private_data_matches(&private_data, b"go away"),
            "reject private data arrived as {private_data:?}"
        ),
        Err(e) => return Err(format!("connect to a rejecting listener: {e}")),
        Ok(_) => return Err("connected to a listener that rejects".into()),
    }
    match p.connect(at, qp_init, &[0u8; MAX_PRIVATE_DATA + 1]).await {
        Err(RdmaError::InvalidArgument(_)) => Ok(()),
        Err(e) => Err(format!("oversized private data: {e}")),
        Ok(_) => Err("oversized private data was sent".into()),
    }
}

/// When the peer goes away, posted receives complete with a flush error
/// and the QP reports the error state.
pub async fn disconnect_flushes_receives<P: RdmaProvider>(p: &P, addr: SocketAddr) -> Outcome {
    let (a, b) = pair(p, addr).await?;
    let rbuf =
        a.pd.register(AlignedBuf::new(64), AccessFlags::LOCAL_WRITE)
            .map_err(err("register"))?;
    a.qp.post_recv(RecvWr {
        wr_id: 5,
        sgl: vec![rbuf.sge(0, 64).ok_or("sge")?],
    })
    .map_err(err("post_recv"))?;
    b.qp.disconnect();
    drop(b);
    let r = one(&a.rcq).await?;
    ensure!(
        (r.wr_id, r.status) == (5, WcStatus::WrFlushError),
        "the posted receive completed as {r:?}"
    );
    // The error state may be reported a moment after the flush.
    for _ in 0..100 {
        if a.qp.is_error() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err("the QP does not report the error state after the peer left".into())
}

/// Every check, by name, in order.
pub async fn run_all<P: RdmaProvider>(p: &P, addr: SocketAddr) -> Vec<(&'static str, Outcome)> {
    vec![
        (
            "connect and accept with private data",
            pair(p, addr).await.map(|_| ()),
        ),
        (
            "RDMA Write, RDMA Read, Send/Recv",
            write_read_send_recv(p, addr).await,
        ),
        ("remote access errors", remote_access_errors(p, addr).await),
        (
            "rkey invalidation and deregistration",
            rkey_invalidation_and_deregistration(p, addr).await,
        ),
        (
            "local protection error",
            local_protection_error(p, addr).await,
        ),
        (
            "reject with private data",
            reject_with_private_data(p, addr).await,
        ),
        (
            "disconnect flushes receives",
            disconnect_flushes_receives(p, addr).await,
        ),
    ]
}
