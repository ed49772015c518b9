//! The registration layer over the soft provider: every strategy moves correct bytes by
//! RDMA over a loopback connection; released keys stop working; counters add up.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use blockwire_transport::rdma::soft::{SoftCq, SoftPd, SoftProvider, SoftQp};
use blockwire_transport::rdma::*;
use blockwire_transport::reg::*;

struct Link {
    a_pd: SoftPd,
    a_cq: SoftCq,
    a_qp: SoftQp,
    b_pd: SoftPd,
    _b_qp: SoftQp,
}

/// a: the side that issues RDMA operations; b: the buffer owner, which stays passive.
async fn link(p: &SoftProvider) -> Link {
    let (a, b) = conformance::pair(p, "127.0.0.1:0".parse().unwrap())
        .await
        .expect("a soft RDMA connection over loopback");
    Link {
        a_pd: a.pd,
        a_cq: a.cq,
        a_qp: a.qp,
        b_pd: b.pd,
        _b_qp: b.qp,
    }
}

async fn wait(cq: &SoftCq) -> Completion {
    tokio::time::timeout(std::time::Duration::from_secs(10), cq.next())
        .await
        .unwrap()
        .unwrap()
}

/// "Target" a writes into "initiator" b's buffers registered with `reg` (as in RDMA-assisted iSCSI: READ data go
/// by RDMA WRITE into the initiator buffer), then reads them back (WRITE data by RDMA READ).
async fn exercise(reg: &dyn Registrar, link: &Link, bufs: &[(*mut u8, usize)], rounds: usize) {
    let staging = link
        .a_pd
        .register(AlignedBuf::new(1 << 20), AccessFlags::LOCAL_WRITE)
        .unwrap();
    let mut old_keys = Vec::new();
    for round in 0..rounds {
        for (i, &(p, len)) in bufs.iter().enumerate() {
            // SAFETY: buffers outlive the registrar's use; only the provider touches them.
            let h = unsafe { reg.register(p, len) }.unwrap();
            let pattern: Vec<u8> = (0..len).map(|k| (k + i * 7 + round) as u8).collect();
            staging.write_at(0, &pattern).unwrap();
            link.a_qp
                .post_send(SendWr {
                    wr_id: 1,
                    op: SendOp::RdmaWrite {
                        remote_addr: h.addr,
                        rkey: h.rkey,
                    },
                    sgl: vec![staging.sge(0, len).unwrap()],
                    signaled: true,
                })
                .unwrap();
            assert_eq!(
                wait(&link.a_cq).await.status,
                WcStatus::Success,
                "{:?}",
                reg.strategy()
            );
            link.a_qp
                .post_send(SendWr {
                    wr_id: 2,
                    op: SendOp::RdmaRead {
                        remote_addr: h.addr,
                        rkey: h.rkey,
                    },
                    sgl: vec![staging.sge(512 << 10, len).unwrap()],
                    signaled: true,
                })
                .unwrap();
            assert_eq!(wait(&link.a_cq).await.status, WcStatus::Success);
            let mut back = vec![0u8; len];
            staging.read_at(512 << 10, &mut back).unwrap();
            assert_eq!(back, pattern);
            old_keys.push(h.remote());
            reg.release(h).unwrap();
        }
    }
    // A key of a completed I/O is refused (except the arena's shared key, by design).
    if reg.strategy() != Strategy::Arena {
        let stale = old_keys[0];
        link.a_qp
            .post_send(SendWr {
                wr_id: 3,
                op: SendOp::RdmaWrite {
                    remote_addr: stale.addr,
                    rkey: stale.rkey,
                },
                sgl: vec![staging.sge(0, 8).unwrap()],
                signaled: true,
            })
            .unwrap();
        assert_eq!(
            wait(&link.a_cq).await.status,
            WcStatus::RemoteAccessError,
            "{:?}",
            reg.strategy()
        );
    }
}

fn user_buffers(n: usize, len: usize) -> Vec<AlignedBuf> {
    (0..n).map(|_| AlignedBuf::new(len)).collect()
}

#[tokio::test]
async fn all_strategies_move_correct_bytes() {
    let p = SoftProvider::default();
    let access = AccessFlags::ALL;
    let mem = user_buffers(8, 16 << 10);
    let bufs: Vec<(*mut u8, usize)> = mem.iter().map(|b| (b.as_ptr(), b.len())).collect();

    let l = link(&p).await;
    let dynamic = Dynamic::new(l.b_pd.clone(), access);
    exercise(&dynamic, &l, &bufs, 2).await;
    let s = dynamic.stats();
    assert_eq!(
        (s.registrations, s.deregistrations, s.hits, s.bytes_pinned),
        (16, 16, 0, 0)
    );

    let l = link(&p).await;
    let cache = PinDownCache::new(l.b_pd.clone(), access, 4);
    exercise(&cache, &l, &bufs, 2).await;
    let s = cache.stats();
    // 8 buffers cycling through 4 entries: every access misses (LRU), 12 evictions.
    assert_eq!(
        (s.misses, s.hits, s.registrations, s.evictions),
        (16, 0, 16, 12)
    );
    assert_eq!(cache.cached(), 4);
    cache.flush().unwrap();
    assert_eq!(cache.stats().bytes_pinned, 0);

    let l = link(&p).await;
    let cache = PinDownCache::new(l.b_pd.clone(), access, 8);
    exercise(&cache, &l, &bufs, 3).await;
    let s = cache.stats();
    assert_eq!((s.misses, s.hits, s.deregistrations), (8, 16, 0));

    let l = link(&p).await;
    let fmrd = Fmrd::new(
        l.b_pd.clone(),
        access,
        FmrdConfig {
            capacity: 4,
            slots: 8,
            dereg_threshold: 3,
        },
    )
    .unwrap();
    exercise(&fmrd, &l, &bufs, 2).await;
    let s = fmrd.stats();
    assert_eq!((s.misses, s.evictions), (16, 12));
    assert_eq!(s.deregistrations, 12, "4 batches of 3");
    assert_eq!(s.dereg_calls, 4);
    assert_eq!(fmrd.pending_deregistrations(), 0);
    fmrd.flush().unwrap();
    assert_eq!(fmrd.stats().bytes_pinned, 0);

    let l = link(&p).await;
    let arena = Arena::new(&l.b_pd, 256 << 10, access).unwrap();
    let abufs: Vec<ArenaBuf> = (0..8).map(|_| arena.alloc(16 << 10).unwrap()).collect();
    let ab: Vec<(*mut u8, usize)> = abufs.iter().map(|b| (b.as_ptr(), b.len())).collect();
    exercise(&arena, &l, &ab, 2).await;
    let s = arena.stats();
    assert_eq!((s.registrations, s.hits, s.deregistrations), (1, 16, 0));
    // outside the arena is refused
    // SAFETY: `mem` stays allocated until its explicit drop below, and the
    // arena refuses a range outside itself without registering it.
    assert!(unsafe { arena.register(mem[0].as_ptr(), 16) }.is_err());
    for b in abufs {
        arena.free(b);
    }
    assert_eq!(arena.free_bytes(), 256 << 10);
    drop(mem);
}

#[tokio::test]
async fn cache_hits_on_sub_ranges_and_refcounts() {
    let p = SoftProvider::default();
    let pd = p.alloc_pd().unwrap();
    let cache = PinDownCache::new(pd, AccessFlags::ALL, 2);
    let mem = AlignedBuf::new(64 << 10);
    // SAFETY: both ranges lie inside `mem`, which stays allocated until
    // after `cache.flush()` below (it is dropped explicitly after it).
    let h1 = unsafe { cache.register(mem.as_ptr(), 64 << 10) }.unwrap();
    // SAFETY: as above; 4096..8192 of the 64 KiB `mem`.
    let h2 = unsafe { cache.register(mem.as_ptr().wrapping_add(4096), 4096) }.unwrap();
    assert_eq!(cache.stats().hits, 1);
    assert_eq!(h2.addr, h1.addr + 4096);
    assert_eq!(h2.lkey, h1.lkey);
    cache.release(h1.clone()).unwrap();
    cache.release(h2).unwrap();
    assert!(cache.release(h1).is_err(), "double release is refused");
    // in-use entries are not evicted
    let other: Vec<AlignedBuf> = (0..3).map(|_| AlignedBuf::new(4096)).collect();
    let hs: Vec<_> = other
        .iter()
        // SAFETY: each 4096-byte buffer of `other` is registered whole and
        // `other` stays allocated past `cache.flush()` below.
        .map(|b| unsafe { cache.register(b.as_ptr(), 4096) }.unwrap())
        .collect();
    assert_eq!(
        cache.cached(),
        3,
        "over capacity while everything is in use"
    );
    for h in hs {
        cache.release(h).unwrap();
    }
    cache.flush().unwrap();
    assert_eq!(cache.cached(), 0);
    drop(mem);
}

#[tokio::test]
async fn pool_classes_fallback_and_split() {
    let p = SoftProvider::default();
    let pd = p.alloc_pd().unwrap();
    let pool = BufferPool::new(
        &pd,
        &PoolConfig {
            classes: vec![(4096, 4), (65536, 2)],
            access: AccessFlags::ALL,
        },
    )
    .unwrap();
    assert_eq!(pool.class_sizes(), vec![4096, 65536]);
    let a = pool.try_alloc(100).unwrap();
    assert_eq!((a.len(), a[0].capacity(), a[0].len()), (1, 4096, 100));
    a[0].write_at(0, b"abc").unwrap();
    assert!(a[0].write_at(99, b"xy").is_err());
    // bigger than the largest class: split 64K + 64K + 4K
    let big = pool.try_alloc(2 * 65536 + 10).unwrap();
    assert_eq!(
        big.iter().map(|b| b.len()).collect::<Vec<_>>(),
        vec![65536, 65536, 10]
    );
    assert_eq!(pool.stats().splits, 1);
    assert_eq!(big.iter().map(|b| b.len()).sum::<usize>(), 2 * 65536 + 10);
    // 64K classes exhausted: a 10K transfer splits over 4K buffers (2 left: 8K) -> fails
    assert!(pool.try_alloc(10_000).is_none());
    assert_eq!(pool.free_counts(), vec![2, 0]);
    drop(big);
    // smallest class full -> bigger class
    let x = pool.try_alloc(4096).unwrap();
    let y = pool.try_alloc(4096).unwrap();
    let w = pool.try_alloc(4096).unwrap();
    let z = pool.try_alloc(4096).unwrap();
    assert_eq!(w[0].capacity(), 4096);
    assert_eq!(z[0].capacity(), 65536);
    assert_eq!(pool.stats().bigger_class, 1);
    // async alloc waits for a buffer to come back
    let pool2 = pool.clone();
    let waiter = tokio::spawn(async move { pool2.alloc(65536 * 2).await.unwrap().len() });
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    assert!(
        !waiter.is_finished(),
        "one 64K buffer is out: 128K must split and 4K are taken"
    );
    drop(z);
    assert_eq!(waiter.await.unwrap(), 2);
    assert!(pool.alloc(1 << 30).await.is_err());
    drop((x, y, w, a));
}

/// Buffer re-organization end to end: an initiator SG list of 4 adjacent pieces of one
/// registration and 2 of another becomes 2 RDMA WRITEs from a split pool allocation.
#[tokio::test]
async fn coalesced_plan_over_the_wire() {
    let p = SoftProvider::default();
    let l = link(&p).await;
    let arena = Arena::new(&l.b_pd, 1 << 20, AccessFlags::ALL).unwrap();
    let b1 = arena.alloc(64 << 10).unwrap();
    let b2 = arena.alloc(64 << 10).unwrap();
    let other = l
        .b_pd
        .register(AlignedBuf::new(32 << 10), AccessFlags::ALL)
        .unwrap();
    // SAFETY: b1 and b2 are the arena's own allocations, registered whole;
    // the arena's memory lives as long as the arena.
    let h1 = unsafe { arena.register(b1.as_ptr(), b1.len()) }.unwrap();
    // SAFETY: as for b1.
    let h2 = unsafe { arena.register(b2.as_ptr(), b2.len()) }.unwrap();
    let mut list = Vec::new();
    for k in 0..4u64 {
        list.push(RemoteBuf {
            addr: h1.addr + k * (16 << 10),
            len: 16 << 10,
            rkey: h1.rkey,
        });
    }
    for k in 0..4u64 {
        list.push(RemoteBuf {
            addr: h2.addr + k * (16 << 10),
            len: 16 << 10,
            rkey: h2.rkey,
        });
    }
    list.push(RemoteBuf {
        addr: other.addr(),
        len: 32 << 10,
        rkey: other.rkey(),
    });
    let chunks = coalesce(&list, 1 << 30);
    assert_eq!(
        chunks.len(),
        2,
        "b1 and b2 are adjacent in the arena: one chunk; plus `other`"
    );
    let total: u64 = list.iter().map(|b| b.len).sum();
    let pool = BufferPool::new(
        &l.a_pd,
        &PoolConfig {
            classes: vec![(4096, 8), (64 << 10, 4)],
            access: AccessFlags::LOCAL_WRITE,
        },
    )
    .unwrap();
    let bufs = pool.try_alloc(total as usize).unwrap();
    let mut off = 0usize;
    for b in &bufs {
        let data: Vec<u8> = (off..off + b.len()).map(|x| (x % 251) as u8).collect();
        b.write_at(0, &data).unwrap();
        off += b.len();
    }
    let sgl: Vec<Sge> = bufs.iter().map(|b| b.sge()).collect();
    let ops = plan_ops(&sgl, &chunks, 16).unwrap();
    assert_eq!(ops.len(), 2);
    for (i, op) in ops.iter().enumerate() {
        l.a_qp
            .post_send(SendWr {
                wr_id: i as u64,
                op: SendOp::RdmaWrite {
                    remote_addr: op.remote_addr,
                    rkey: op.rkey,
                },
                sgl: op.local.clone(),
                signaled: true,
            })
            .unwrap();
    }
    for _ in 0..2 {
        assert!(wait(&l.a_cq).await.status.is_ok());
    }
    let mut got = vec![0u8; 128 << 10];
    arena.mr().read_at(b1.offset(), &mut got).unwrap();
    let mut tail = vec![0u8; 32 << 10];
    other.read_at(0, &mut tail).unwrap();
    got.extend(tail);
    let want: Vec<u8> = (0..total as usize).map(|x| (x % 251) as u8).collect();
    assert_eq!(got, want);
}

/// A pool made with the default configuration (as the target's RDMA-assisted
/// and iSER listeners make theirs) is the local end of operations its owner
/// starts: a peer on the same protection domain's connections, holding a
/// buffer's address and key (soft keys are a slot and a generation, easy to
/// guess), can neither write nor read it. Before, the pool was registered
/// with remote read and write, and both succeeded.
#[tokio::test]
async fn a_default_pool_is_closed_to_peers() {
    let p = SoftProvider::default();
    for read in [false, true] {
        // A queue pair fails at a remote access error: a link for each try.
        let l = link(&p).await;
        let pool = BufferPool::new(&l.b_pd, &PoolConfig::default()).unwrap();
        let bufs = pool.try_alloc(4096).unwrap();
        bufs[0].write_at(0, &[0x5a; 4096]).unwrap();
        let target = bufs[0].remote();
        let mine = l
            .a_pd
            .register(AlignedBuf::new(4096), AccessFlags::LOCAL_WRITE)
            .unwrap();
        mine.write_at(0, &[0xa5; 4096]).unwrap();
        let op = if read {
            SendOp::RdmaRead {
                remote_addr: target.addr,
                rkey: target.rkey,
            }
        } else {
            SendOp::RdmaWrite {
                remote_addr: target.addr,
                rkey: target.rkey,
            }
        };
        let what = format!("{op:?}");
        l.a_qp
            .post_send(SendWr {
                wr_id: 1,
                op,
                sgl: vec![mine.sge(0, 4096).unwrap()],
                signaled: true,
            })
            .unwrap();
        let c = wait(&l.a_cq).await;
        assert!(!c.status.is_ok(), "{what} on the pool completed: {c:?}");
        let mut got = vec![0u8; 4096];
        bufs[0].read_at(0, &mut got).unwrap();
        assert_eq!(got, vec![0x5a; 4096], "the pool's buffer is untouched");
        let mut got = vec![0u8; 4096];
        mine.read_at(0, &mut got).unwrap();
        assert_eq!(got, vec![0xa5; 4096], "nothing of the pool's was read");
    }
}
