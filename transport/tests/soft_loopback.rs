//! The soft RDMA provider over real TCP sockets on 127.0.0.1 (two endpoints, one process).

use std::sync::Arc;

use blockwire_transport::rdma::soft::{SoftCq, SoftPd, SoftProvider, SoftQp};
use blockwire_transport::rdma::*;

struct End {
    pd: SoftPd,
    cq: SoftCq,
    rcq: SoftCq,
    qp: SoftQp,
}

async fn pair(p: &SoftProvider) -> (End, End) {
    let mut l = p.listen("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = l.local_addr();
    let (pa, pb) = (p.alloc_pd().unwrap(), p.alloc_pd().unwrap());
    let (ca, cb) = (p.create_cq(256).unwrap(), p.create_cq(256).unwrap());
    let (ra, rb) = (p.create_cq(256).unwrap(), p.create_cq(256).unwrap());
    let init_b = QpInit::<SoftProvider> {
        pd: pb.clone(),
        send_cq: cb.clone(),
        recv_cq: rb.clone(),
        caps: QpCaps::default(),
    };
    let server = tokio::spawn(async move {
        let req = l.accept().await.unwrap();
        assert_eq!(req.private_data(), b"hello from a");
        req.accept(init_b, b"welcome").await.unwrap()
    });
    let init_a = QpInit::<SoftProvider> {
        pd: pa.clone(),
        send_cq: ca.clone(),
        recv_cq: ra.clone(),
        caps: QpCaps::default(),
    };
    let qa = p.connect(addr, init_a, b"hello from a").await.unwrap();
    assert_eq!(qa.peer_private_data(), b"welcome");
    let qb = server.await.unwrap();
    assert_eq!(qb.peer_private_data(), b"hello from a");
    (
        End {
            pd: pa,
            cq: ca,
            rcq: ra,
            qp: qa,
        },
        End {
            pd: pb,
            cq: cb,
            rcq: rb,
            qp: qb,
        },
    )
}

fn filled(len: usize, seed: u8) -> AlignedBuf {
    let mut b = AlignedBuf::new(len);
    for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
    b
}

async fn one(cq: &SoftCq) -> Completion {
    tokio::time::timeout(std::time::Duration::from_secs(10), cq.next())
        .await
        .expect("completion in time")
        .unwrap()
}

#[tokio::test]
async fn write_read_send_recv() {
    let p = SoftProvider::default();
    let (a, b) = pair(&p).await;
    // b exposes a region; a writes into it with a 2-SGE list, then reads it back.
    let target =
        b.pd.register(AlignedBuf::new(64 << 10), AccessFlags::ALL)
            .unwrap();
    let src =
        a.pd.register(filled(8192, 1), AccessFlags::LOCAL_WRITE)
            .unwrap();
    let dst =
        a.pd.register(AlignedBuf::new(8192), AccessFlags::LOCAL_WRITE)
            .unwrap();
    let rb = target.remote_buf();
    a.qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::RdmaWrite {
            remote_addr: rb.addr + 100,
            rkey: rb.rkey,
        },
        sgl: vec![src.sge(0, 4096).unwrap(), src.sge(4096, 4096).unwrap()],
        signaled: true,
    })
    .unwrap();
    let c = one(&a.cq).await;
    assert_eq!(
        (c.wr_id, c.status, c.opcode, c.byte_len),
        (1, WcStatus::Success, WcOpcode::RdmaWrite, 8192)
    );
    let mut got = vec![0u8; 8192];
    target.read_at(100, &mut got).unwrap();
    let mut want = vec![0u8; 8192];
    src.read_at(0, &mut want).unwrap();
    assert_eq!(
        got, want,
        "b's provider placed the bytes without b's upper layer"
    );

    a.qp.post_send(SendWr {
        wr_id: 2,
        op: SendOp::RdmaRead {
            remote_addr: rb.addr + 100,
            rkey: rb.rkey,
        },
        sgl: vec![dst.sge(4096, 4096).unwrap(), dst.sge(0, 4096).unwrap()],
        signaled: true,
    })
    .unwrap();
    let c = one(&a.cq).await;
    assert_eq!(
        (c.wr_id, c.status, c.opcode, c.byte_len),
        (2, WcStatus::Success, WcOpcode::RdmaRead, 8192)
    );
    let mut back = vec![0u8; 8192];
    dst.read_at(4096, &mut back[..4096]).unwrap();
    dst.read_at(0, &mut back[4096..]).unwrap();
    assert_eq!(back, want);

    // SEND/RECV both ways; the send arrives before the receive is posted.
    let rbuf =
        b.pd.register(AlignedBuf::new(256), AccessFlags::LOCAL_WRITE)
            .unwrap();
    let msg = a.pd.register(filled(100, 9), AccessFlags::NONE).unwrap();
    a.qp.post_send(SendWr {
        wr_id: 3,
        op: SendOp::Send,
        sgl: vec![msg.sge(0, 100).unwrap()],
        signaled: true,
    })
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    b.qp.post_recv(RecvWr {
        wr_id: 77,
        sgl: vec![rbuf.sge(0, 256).unwrap()],
    })
    .unwrap();
    let r = one(&b.rcq).await;
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len),
        (77, WcStatus::Success, WcOpcode::Recv, 100)
    );
    let c = one(&a.cq).await;
    assert_eq!((c.wr_id, c.status), (3, WcStatus::Success));
    let mut m = vec![0u8; 100];
    rbuf.read_at(0, &mut m).unwrap();
    let mut w = vec![0u8; 100];
    msg.read_at(0, &mut w).unwrap();
    assert_eq!(m, w);
    assert!(b.cq.is_empty());
}

#[tokio::test]
async fn bad_key_range_permission_change_nothing() {
    let p = SoftProvider::default();
    for case in 0..5 {
        let (a, b) = pair(&p).await;
        let ro =
            b.pd.register(filled(4096, 3), AccessFlags::REMOTE_READ)
                .unwrap();
        let rw = b.pd.register(filled(4096, 4), AccessFlags::ALL).unwrap();
        let before_ro = snapshot(&ro);
        let before_rw = snapshot(&rw);
        let src =
            a.pd.register(filled(4096, 5), AccessFlags::LOCAL_WRITE)
                .unwrap();
        let (op, len) = match case {
            0 => (
                SendOp::RdmaWrite {
                    remote_addr: rw.addr(),
                    rkey: rw.rkey() ^ 0x100,
                },
                16,
            ), // forged key
            1 => (
                SendOp::RdmaWrite {
                    remote_addr: rw.addr() + 4090,
                    rkey: rw.rkey(),
                },
                16,
            ), // past the end
            2 => (
                SendOp::RdmaWrite {
                    remote_addr: ro.addr(),
                    rkey: ro.rkey(),
                },
                16,
            ), // no REMOTE_WRITE
            3 => (
                SendOp::RdmaWrite {
                    remote_addr: rw.addr(),
                    rkey: rw.lkey(),
                },
                16,
            ), // lkey is not an rkey
            _ => (
                SendOp::RdmaRead {
                    remote_addr: rw.addr() - 8,
                    rkey: rw.rkey(),
                },
                16,
            ), // before the start
        };
        a.qp.post_send(SendWr {
            wr_id: 10,
            op,
            sgl: vec![src.sge(0, len).unwrap()],
            signaled: true,
        })
        .unwrap();
        let c = one(&a.cq).await;
        assert_eq!(
            (c.wr_id, c.status),
            (10, WcStatus::RemoteAccessError),
            "case {case}"
        );
        assert!(a.qp.is_error());
        // Further work flushes.
        a.qp.post_send(SendWr {
            wr_id: 11,
            op: SendOp::Send,
            sgl: vec![],
            signaled: false,
        })
        .unwrap();
        assert_eq!(one(&a.cq).await.status, WcStatus::WrFlushError);
        assert_eq!(snapshot(&ro), before_ro);
        assert_eq!(snapshot(&rw), before_rw);
        let mut s = vec![0u8; 4096];
        src.read_at(0, &mut s).unwrap();
        assert_eq!(
            s,
            filled(4096, 5).as_slice(),
            "a refused READ changed no local byte"
        );
        drop(b);
    }
}

fn snapshot(mr: &impl MemoryRegion) -> Vec<u8> {
    let mut v = vec![0u8; mr.len()];
    mr.read_at(0, &mut v).unwrap();
    v
}

#[tokio::test]
async fn local_errors_and_dereg_fence() {
    let p = SoftProvider::default();
    let (a, b) = pair(&p).await;
    let rw =
        b.pd.register(AlignedBuf::new(4096), AccessFlags::ALL)
            .unwrap();
    let src = a.pd.register(filled(4096, 1), AccessFlags::NONE).unwrap();
    // Dereg: the key dies, a later WRITE is refused.
    let rbuf = rw.remote_buf();
    rw.deregister().unwrap();
    a.qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::RdmaWrite {
            remote_addr: rbuf.addr,
            rkey: rbuf.rkey,
        },
        sgl: vec![src.sge(0, 8).unwrap()],
        signaled: true,
    })
    .unwrap();
    assert_eq!(one(&a.cq).await.status, WcStatus::RemoteAccessError);

    // A READ into a region without LOCAL_WRITE is a local protection error.
    let (a, b) = pair(&p).await;
    let rw =
        b.pd.register(AlignedBuf::new(4096), AccessFlags::ALL)
            .unwrap();
    a.qp.post_send(SendWr {
        wr_id: 2,
        op: SendOp::RdmaRead {
            remote_addr: rw.addr(),
            rkey: rw.rkey(),
        },
        sgl: vec![src.sge(0, 8).unwrap()],
        signaled: true,
    })
    .unwrap();
    // src belongs to the other connection's PD... and this PD doesn't know it either.
    assert_eq!(one(&a.cq).await.status, WcStatus::LocalProtectionError);
    drop(b);
}

#[tokio::test]
async fn reject_carries_private_data_and_limits() {
    let p = SoftProvider::default();
    let mut l = p.listen("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = l.local_addr();
    tokio::spawn(async move {
        let req = l.accept().await.unwrap();
        req.reject(b"go away").await.unwrap();
    });
    let init = QpInit::<SoftProvider> {
        pd: p.alloc_pd().unwrap(),
        send_cq: p.create_cq(4).unwrap(),
        recv_cq: p.create_cq(4).unwrap(),
        caps: QpCaps::default(),
    };
    match p.connect(addr, init.clone(), b"hi").await {
        Err(RdmaError::Rejected { private_data }) => assert_eq!(private_data, b"go away"),
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("should be rejected"),
    }
    assert!(matches!(
        p.connect(addr, init, &[0u8; MAX_PRIVATE_DATA + 1]).await,
        Err(RdmaError::InvalidArgument(_))
    ));
}

#[tokio::test]
async fn disconnect_flushes_outstanding_and_recvs() {
    let p = SoftProvider::default();
    let (a, b) = pair(&p).await;
    let rbuf =
        a.pd.register(AlignedBuf::new(64), AccessFlags::LOCAL_WRITE)
            .unwrap();
    a.qp.post_recv(RecvWr {
        wr_id: 5,
        sgl: vec![rbuf.sge(0, 64).unwrap()],
    })
    .unwrap();
    drop(b);
    let r = one(&a.rcq).await;
    assert_eq!((r.wr_id, r.status), (5, WcStatus::WrFlushError));
    assert!(a.qp.is_error());
}

/// Many tasks issue WRITEs and READs on disjoint slices of one remote region while the
/// target side reads its memory locally; each task's data must come back intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_stress() {
    let p = SoftProvider::default();
    let (a, b) = pair(&p).await;
    let a = Arc::new(a);
    const TASKS: usize = 16;
    const SLICE: usize = 4096;
    let target = Arc::new(
        b.pd.register(AlignedBuf::new(TASKS * SLICE), AccessFlags::ALL)
            .unwrap(),
    );
    // One CQ shared by all tasks: a dispatcher routes completions by wr_id.
    let mut waiters = Vec::new();
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..TASKS)
        .map(|_| tokio::sync::mpsc::unbounded_channel::<Completion>())
        .unzip();
    let a2 = a.clone();
    let disp = tokio::spawn(async move {
        loop {
            let c = a2.cq.next().await.unwrap();
            if txs[(c.wr_id >> 32) as usize].send(c).is_err() {
                break;
            }
        }
    });
    for (t, mut rx) in rxs.into_iter().enumerate() {
        let a = a.clone();
        let rb = target.remote_buf();
        waiters.push(tokio::spawn(async move {
            let mr =
                a.pd.register(AlignedBuf::new(2 * SLICE), AccessFlags::LOCAL_WRITE)
                    .unwrap();
            for i in 0..50u64 {
                let v = vec![(t as u8) ^ (i as u8); SLICE];
                mr.write_at(0, &v).unwrap();
                let remote_addr = rb.addr + (t * SLICE) as u64;
                let id = ((t as u64) << 32) | (i * 2);
                loop {
                    match a.qp.post_send(SendWr {
                        wr_id: id,
                        op: SendOp::RdmaWrite {
                            remote_addr,
                            rkey: rb.rkey,
                        },
                        sgl: vec![mr.sge(0, SLICE).unwrap()],
                        signaled: true,
                    }) {
                        Err(RdmaError::QueueFull { .. }) => tokio::task::yield_now().await,
                        r => {
                            r.unwrap();
                            break;
                        }
                    }
                }
                assert_eq!(rx.recv().await.unwrap().status, WcStatus::Success);
                loop {
                    match a.qp.post_send(SendWr {
                        wr_id: id + 1,
                        op: SendOp::RdmaRead {
                            remote_addr,
                            rkey: rb.rkey,
                        },
                        sgl: vec![mr.sge(SLICE, SLICE).unwrap()],
                        signaled: true,
                    }) {
                        Err(RdmaError::QueueFull { .. }) => tokio::task::yield_now().await,
                        r => {
                            r.unwrap();
                            break;
                        }
                    }
                }
                assert_eq!(rx.recv().await.unwrap().status, WcStatus::Success);
                let mut back = vec![0u8; SLICE];
                mr.read_at(SLICE, &mut back).unwrap();
                assert_eq!(back, v);
            }
        }));
    }
    // Meanwhile the owner reads its region locally.
    let t2 = target.clone();
    let local = tokio::task::spawn_blocking(move || {
        let mut s = vec![0u8; SLICE];
        for i in 0..2000 {
            t2.read_at((i % TASKS) * SLICE, &mut s).unwrap();
            assert!(s.iter().all(|&x| x == s[0]));
        }
    });
    for w in waiters {
        w.await.unwrap();
    }
    local.await.unwrap();
    disp.abort();
    assert!(!a.qp.is_error());
}
