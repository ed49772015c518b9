//! The soft RDMA provider over real TCP sockets on 127.0.0.1 (two endpoints, one process),
//! through the conformance suite every backend runs (the verbs backend runs it on Soft-RoCE
//! in the kernel lab), plus a concurrency stress of the soft provider.

use std::sync::Arc;

use blockwire_transport::rdma::conformance::{self, End};
use blockwire_transport::rdma::soft::SoftProvider;
use blockwire_transport::rdma::*;

const ANY: &str = "127.0.0.1:0";

async fn pair(p: &SoftProvider) -> (End<SoftProvider>, End<SoftProvider>) {
    conformance::pair(p, ANY.parse().unwrap()).await.unwrap()
}

#[tokio::test]
async fn write_read_send_recv() {
    conformance::write_read_send_recv(&SoftProvider::default(), ANY.parse().unwrap())
        .await
        .unwrap();
}

#[tokio::test]
async fn bad_key_range_permission_change_nothing() {
    conformance::remote_access_errors(&SoftProvider::default(), ANY.parse().unwrap())
        .await
        .unwrap();
}

#[tokio::test]
async fn rkey_invalidation_and_deregistration() {
    conformance::rkey_invalidation_and_deregistration(
        &SoftProvider::default(),
        ANY.parse().unwrap(),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn local_protection_error() {
    conformance::local_protection_error(&SoftProvider::default(), ANY.parse().unwrap())
        .await
        .unwrap();
}

#[tokio::test]
async fn reject_carries_private_data_and_limits() {
    conformance::reject_with_private_data(&SoftProvider::default(), ANY.parse().unwrap())
        .await
        .unwrap();
}

#[tokio::test]
async fn disconnect_flushes_outstanding_and_recvs() {
    conformance::disconnect_flushes_receives(&SoftProvider::default(), ANY.parse().unwrap())
        .await
        .unwrap();
}

#[test]
fn private_data_padding_rule() {
    assert!(conformance::private_data_matches(b"abc", b"abc"));
    assert!(conformance::private_data_matches(b"abc\0\0", b"abc"));
    assert!(!conformance::private_data_matches(b"abd\0", b"abc"));
    assert!(!conformance::private_data_matches(b"abc\0x", b"abc"));
    assert!(!conformance::private_data_matches(b"ab", b"abc"));
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
