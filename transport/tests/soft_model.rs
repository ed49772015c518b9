//! Model test of the soft provider: random sequences of register / RDMA WRITE / RDMA READ /
//! local write / deregister from two endpoints give the same bytes as a plain model, and
//! every invalid access (forged or stale key, out of range, missing permission) completes
//! with an error and changes no byte anywhere.

use blockwire_transport::rdma::soft::{SoftCq, SoftMr, SoftPd, SoftProvider, SoftQp};
use blockwire_transport::rdma::*;
use proptest::prelude::*;

const SLOTS: usize = 3;
const PAGE: usize = 4096;

#[derive(Clone, Debug)]
enum KeyMode {
    Valid,
    Forged,
    Stale,
}

#[derive(Clone, Debug)]
enum Op {
    Register {
        side: usize,
        slot: usize,
        pages: usize,
        access: u32,
    },
    Deregister {
        side: usize,
        slot: usize,
    },
    Write {
        from: usize,
        slot: usize,
        off: usize,
        len: usize,
        key: KeyMode,
    },
    Read {
        from: usize,
        slot: usize,
        off: usize,
        len: usize,
        key: KeyMode,
    },
    Local {
        side: usize,
        slot: usize,
        off: usize,
        byte: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let side = 0usize..2;
    let slot = 0usize..SLOTS;
    let key = prop_oneof![6 => Just(KeyMode::Valid), 1 => Just(KeyMode::Forged), 1 => Just(KeyMode::Stale)];
    prop_oneof![
        3 => (side.clone(), slot.clone(), 1usize..3, 0u32..8).prop_map(|(side, slot, pages, a)| Op::Register { side, slot, pages, access: a }),
        1 => (side.clone(), slot.clone()).prop_map(|(side, slot)| Op::Deregister { side, slot }),
        4 => (side.clone(), slot.clone(), 0usize..2 * PAGE + 64, 0usize..PAGE, key.clone()).prop_map(|(from, slot, off, len, key)| Op::Write { from, slot, off, len, key }),
        3 => (side.clone(), slot.clone(), 0usize..2 * PAGE + 64, 0usize..PAGE, key).prop_map(|(from, slot, off, len, key)| Op::Read { from, slot, off, len, key }),
        1 => (side, slot, 0usize..2 * PAGE, any::<u8>()).prop_map(|(side, slot, off, byte)| Op::Local { side, slot, off, byte }),
    ]
}

struct Side {
    pd: SoftPd,
    cq: SoftCq,
    scratch: SoftMr,
    regions: Vec<Option<(SoftMr, Vec<u8>)>>,
    stale: Vec<RemoteBuf>,
}

async fn connect(p: &SoftProvider, a: &Side, b: &Side) -> (SoftQp, SoftQp) {
    let mut l = p.listen("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = l.local_addr();
    let ib = QpInit::<SoftProvider> {
        pd: b.pd.clone(),
        send_cq: b.cq.clone(),
        recv_cq: p.create_cq(4).unwrap(),
        caps: QpCaps::default(),
    };
    let srv = tokio::spawn(async move { l.accept().await.unwrap().accept(ib, b"").await.unwrap() });
    let ia = QpInit::<SoftProvider> {
        pd: a.pd.clone(),
        send_cq: a.cq.clone(),
        recv_cq: p.create_cq(4).unwrap(),
        caps: QpCaps::default(),
    };
    let qa = p.connect(addr, ia, b"").await.unwrap();
    (qa, srv.await.unwrap())
}

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 13 + seed * 7 + 1) as u8).collect()
}

async fn run(ops: Vec<Op>) {
    let p = SoftProvider::default();
    let mut sides: Vec<Side> = (0..2)
        .map(|i| {
            let pd = p.alloc_pd().unwrap();
            let scratch = pd
                .register(AlignedBuf::new(2 * PAGE), AccessFlags::LOCAL_WRITE)
                .unwrap();
            scratch.write_at(0, &pattern(i + 100, PAGE)).unwrap();
            Side {
                pd,
                cq: p.create_cq(64).unwrap(),
                scratch,
                regions: (0..SLOTS).map(|_| None).collect(),
                stale: Vec::new(),
            }
        })
        .collect();
    let (mut q0, mut q1) = connect(&p, &sides[0], &sides[1]).await;
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Register {
                side,
                slot,
                pages,
                access,
            } => {
                let s = &mut sides[side];
                if let Some((mr, _)) = s.regions[slot].take() {
                    s.stale.push(mr.remote_buf());
                }
                let mut access = AccessFlags::from_bits_truncate(access);
                if access.contains(AccessFlags::REMOTE_WRITE) {
                    access = access | AccessFlags::LOCAL_WRITE;
                }
                let mr =
                    s.pd.register(AlignedBuf::new(pages * PAGE), access)
                        .unwrap();
                s.regions[slot] = Some((mr, vec![0; pages * PAGE]));
            }
            Op::Deregister { side, slot } => {
                let s = &mut sides[side];
                if let Some((mr, _)) = s.regions[slot].take() {
                    s.stale.push(mr.remote_buf());
                    mr.deregister().unwrap();
                }
            }
            Op::Local {
                side,
                slot,
                off,
                byte,
            } => {
                if let Some((mr, model)) = sides[side].regions[slot].as_mut() {
                    let ok = off < model.len();
                    assert_eq!(mr.write_at(off, &[byte]).is_ok(), ok);
                    if ok {
                        model[off] = byte;
                    }
                }
            }
            Op::Write {
                from,
                slot,
                off,
                len,
                ref key,
            }
            | Op::Read {
                from,
                slot,
                off,
                len,
                ref key,
            } => {
                let write = matches!(op, Op::Write { .. });
                let to = 1 - from;
                let target = sides[to].regions[slot]
                    .as_ref()
                    .map(|(mr, m)| (mr.remote_buf(), mr.access(), m.len()));
                let stale = sides[to].stale.last().copied();
                let (rb, expect_ok) = match (key, target) {
                    (KeyMode::Valid, Some((rb, access, size))) => {
                        let perm = if write {
                            AccessFlags::REMOTE_WRITE
                        } else {
                            AccessFlags::REMOTE_READ
                        };
                        (rb, access.contains(perm) && off + len <= size)
                    }
                    (KeyMode::Forged, Some((rb, _, _))) => (
                        RemoteBuf {
                            rkey: rb.rkey ^ 0x80,
                            ..rb
                        },
                        false,
                    ),
                    (KeyMode::Stale, _) | (_, None) => match stale {
                        Some(s) => (s, false),
                        None => continue,
                    },
                };
                let remote_addr = rb.addr + off as u64;
                let (qp, cq) = if from == 0 {
                    (&q0, &sides[0].cq)
                } else {
                    (&q1, &sides[1].cq)
                };
                let sgl = vec![sides[from]
                    .scratch
                    .sge(if write { 0 } else { PAGE }, len)
                    .unwrap()];
                let wr = SendWr {
                    wr_id: step as u64,
                    op: if write {
                        SendOp::RdmaWrite {
                            remote_addr,
                            rkey: rb.rkey,
                        }
                    } else {
                        SendOp::RdmaRead {
                            remote_addr,
                            rkey: rb.rkey,
                        }
                    },
                    sgl,
                    signaled: true,
                };
                qp.post_send(wr).unwrap();
                let c = tokio::time::timeout(std::time::Duration::from_secs(10), cq.next())
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(c.wr_id, step as u64);
                if expect_ok {
                    assert_eq!(c.status, WcStatus::Success, "step {step}: {op:?}");
                    let src = pattern(from + 100, PAGE);
                    let model = &mut sides[to].regions[slot].as_mut().unwrap().1;
                    if write {
                        model[off..off + len].copy_from_slice(&src[..len]);
                    } else {
                        let mut got = vec![0u8; len];
                        sides[from].scratch.read_at(PAGE, &mut got).unwrap();
                        assert_eq!(
                            &got[..],
                            &sides[to].regions[slot].as_ref().unwrap().1[off..off + len]
                        );
                    }
                } else {
                    assert_eq!(c.status, WcStatus::RemoteAccessError, "step {step}: {op:?}");
                    // The RC queue pair is now in the error state: reconnect.
                    assert!(qp.is_error());
                    drop((q0, q1));
                    (q0, q1) = connect(&p, &sides[0], &sides[1]).await;
                }
            }
        }
        // Every live region equals its model.
        for s in &sides {
            for (mr, model) in s.regions.iter().flatten() {
                let mut got = vec![0u8; model.len()];
                mr.read_at(0, &mut got).unwrap();
                assert!(got == *model, "step {step}: region differs from the model");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn soft_provider_matches_model(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(run(ops));
    }
}
