//! RDMA-assisted iSCSI end to end: blockwire's initiator (AssistedSession) against an
//! in-process blockwire target with the soft RDMA provider. Integrity for every
//! registration strategy and for scatter-gather buffers; forged, out-of-range and
//! replayed descriptors are refused and change nothing; the fallback matrix; the offload
//! listener closing when the target shuts down.

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use blockwire_initiator::rdma::{AssistedSession, FmrdConfig, Mode, RdmaConfig, RegConfig};
use blockwire_initiator::{Error, InitiatorConfig, Session};
use blockwire_pdu::scsi::{ScsiStatus, SenseKey};
use blockwire_target::backstore::RamBackstore;
use blockwire_target::iscsi::FabricSettings;
use blockwire_target::scsi::{LogicalUnit, LuConfig};
use blockwire_transport::assist::{reject, BindRequest, Descriptor, Direction, TOKEN_LEN};
use blockwire_transport::rdma::soft::SoftProvider;
use blockwire_transport::rdma::{QpCaps, QpInit, RdmaError, RdmaProvider, RemoteBuf};
use rand::{Rng, SeedableRng};
use support::{bind_target, TestTarget};

const TARGET: &str = "iqn.2026-11.io.blockwire:rdma-test";
const BS: usize = 512;

async fn start(rdma: bool) -> TestTarget {
    start_with(FabricSettings::default(), rdma).await
}

/// A target with a 32 MiB RAM LUN under `settings`, with RDMA offload or not.
async fn start_with(settings: FabricSettings, rdma: bool) -> TestTarget {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("warn")
        .try_init();
    let lu = LogicalUnit::new(LuConfig::new(Arc::new(RamBackstore::new(32 << 20))));
    bind_target(TARGET, lu, settings).await.serve(rdma).await
}

fn cfg(name: &str) -> InitiatorConfig {
    InitiatorConfig::new(format!("iqn.2026-11.io.blockwire:{name}"))
}

async fn assisted(t: &TestTarget, name: &str, rdma: RdmaConfig) -> AssistedSession {
    AssistedSession::connect(cfg(name), rdma, &t.addr.to_string(), TARGET)
        .await
        .unwrap()
}

fn strategies() -> Vec<RegConfig> {
    vec![
        RegConfig::Dynamic,
        RegConfig::PinDownCache { capacity: 8 },
        RegConfig::Fmrd(FmrdConfig {
            capacity: 8,
            slots: 16,
            dereg_threshold: 4,
        }),
        RegConfig::Arena { bytes: 8 << 20 },
    ]
}

fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill(&mut v[..]);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integrity_for_every_registration_strategy() {
    let t = start(true).await;
    for (i, reg) in strategies().into_iter().enumerate() {
        let s = assisted(
            &t,
            &format!("strategy{i}"),
            RdmaConfig {
                registration: reg,
                ..RdmaConfig::default()
            },
        )
        .await;
        assert_eq!(s.mode().await, Mode::Offloaded, "{reg:?}");
        let mut lba = 0u64;
        for (j, len) in [16 << 10, 64 << 10, 1 << 20, 4 << 10]
            .into_iter()
            .enumerate()
        {
            let data = random(len, (i * 10 + j) as u64);
            let mut w = s.alloc(len).unwrap();
            w.write_at(0, &data).unwrap();
            s.write(0, lba, (len / BS) as u32, &w).await.unwrap();
            let mut r = s.alloc(len).unwrap();
            let c = s.read(0, lba, (len / BS) as u32, &mut r).await.unwrap();
            assert_eq!(c.transferred, len);
            assert!(r.to_vec() == data, "{reg:?} {len}");
            lba += (len / BS) as u64;
        }
        // What RDMA placed is what plain iSCSI reads back from the disk.
        let mut v = vec![0u8; 16 << 10];
        s.session().read(0, 0, 32, &mut v).await.unwrap();
        assert!(v == random(16 << 10, (i * 10) as u64));
        let st = s.stats();
        assert_eq!(st.offloaded_reads, 4, "{reg:?} {st:?}");
        // 4 KiB goes inline (below the 8 KiB threshold), the rest by RDMA Read.
        assert_eq!((st.offloaded_writes, st.inline_writes), (3, 1), "{reg:?}");
        assert_eq!(st.failed_transfers, 0);
        s.logout().await.unwrap();
    }
    let c = t.fabric.rdma.get().unwrap().counters();
    assert!(c.rdma_writes.load(Ordering::Relaxed) >= 16);
    assert!(c.rdma_reads.load(Ordering::Relaxed) >= 12);
    assert_eq!(c.failed_transfers.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scatter_gather_buffers() {
    let t = start(true).await;
    for (i, reg) in strategies().into_iter().enumerate() {
        let s = assisted(
            &t,
            &format!("sg{i}"),
            RdmaConfig {
                registration: reg,
                ..RdmaConfig::default()
            },
        )
        .await;
        let data = random(64 << 10, 100 + i as u64);
        // Gather from 4 KiB + 8 KiB + 12 KiB + 40 KiB, scatter into 16 + 16 + 32 KiB.
        let mut off = 0;
        let mut out = Vec::new();
        for n in [4 << 10, 8 << 10, 12 << 10, 40 << 10] {
            let mut b = s.alloc(n).unwrap();
            b.write_at(0, &data[off..off + n]).unwrap();
            off += n;
            out.push(b);
        }
        s.write_sg(0, 1000, 128, &out).await.unwrap();
        let mut ins: Vec<_> = [16 << 10, 16 << 10, 32 << 10]
            .into_iter()
            .map(|n| s.alloc(n).unwrap())
            .collect();
        s.read_sg(0, 1000, 128, &mut ins).await.unwrap();
        let got: Vec<u8> = ins.iter().flat_map(|b| b.to_vec()).collect();
        assert!(got == data, "{reg:?}");
        let desc = s.last_descriptor().unwrap();
        assert_eq!(desc.dir, Direction::Read);
        assert_eq!(desc.len(), 64 << 10);
        if matches!(reg, RegConfig::Arena { .. }) {
            // Neighbouring arena buffers coalesce into one chunk (buffer re-organization, RDMA-assisted iSCSI paper §4.3).
            assert_eq!(desc.chunks.len(), 1);
        } else {
            assert_eq!(desc.chunks.len(), 3);
        }
        s.logout().await.unwrap();
    }
}

fn is_refused(e: &Error) -> bool {
    matches!(e, Error::Scsi(s) if s.sense.as_ref().is_some_and(|s| s.key == SenseKey::AbortedCommand && s.asc == 0x4b))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_out_of_range_and_replayed_descriptors_change_nothing() {
    let t = start(true).await;
    let svc = t.fabric.rdma.get().unwrap().clone();
    for (i, reg) in strategies().into_iter().take(3).enumerate() {
        let s = assisted(
            &t,
            &format!("forge{i}"),
            RdmaConfig {
                registration: reg,
                ..RdmaConfig::default()
            },
        )
        .await;
        let lba = 4000 + 100 * i as u64;
        let disk = random(16 << 10, 200 + i as u64);
        let mut w = s.alloc(16 << 10).unwrap();
        w.write_at(0, &disk).unwrap();
        s.write(0, lba, 32, &w).await.unwrap();
        let read16 = blockwire_initiator::rw16(false, lba, 32, false);
        let write16 = blockwire_initiator::rw16(true, lba, 32, false);
        let poison = vec![0xEEu8; 16 << 10];
        let failures = svc.counters().failed_transfers.load(Ordering::Relaxed);

        // 1. Forged rkey on a live registration: READ and WRITE refused.
        let mut buf = s.alloc(16 << 10).unwrap();
        buf.write_at(0, &poison).unwrap();
        let regd = s.space().register_sg([&buf], u64::MAX).unwrap();
        let mut chunks = regd.remote();
        chunks[0].rkey ^= 0x5a;
        for dir in [Direction::Read, Direction::Write] {
            let cdb = if dir == Direction::Read {
                read16.clone()
            } else {
                write16.clone()
            };
            let d = Descriptor {
                dir,
                chunks: chunks.clone(),
            };
            let e = s.execute_with_descriptor(0, &cdb, &d).await.unwrap_err();
            assert!(is_refused(&e), "{reg:?} forged {dir:?}: {e}");
        }
        // 2. Out of range: the right key, but 32 KiB claimed over a 16 KiB buffer.
        let mut wide = regd.remote();
        wide[0].len = 32 << 10;
        let d = Descriptor {
            dir: Direction::Read,
            chunks: wide,
        };
        let cdb = blockwire_initiator::rw16(false, lba, 64, false);
        let e = s.execute_with_descriptor(0, &cdb, &d).await.unwrap_err();
        assert!(is_refused(&e), "{reg:?} out of range: {e}");
        regd.release().unwrap();
        assert!(
            buf.to_vec() == poison,
            "{reg:?}: a refused access changed the buffer"
        );

        // 3. Replay after completion: a completed command's descriptor is dead.
        let mut ok = s.alloc(16 << 10).unwrap();
        s.read(0, lba, 32, &mut ok).await.unwrap();
        assert!(ok.to_vec() == disk);
        let stale = s.last_descriptor().unwrap();
        ok.write_at(0, &poison).unwrap();
        let e = s
            .execute_with_descriptor(0, &read16, &stale)
            .await
            .unwrap_err();
        assert!(is_refused(&e), "{reg:?} replayed read: {e}");
        assert!(
            ok.to_vec() == poison,
            "{reg:?}: a replayed READ wrote the buffer"
        );
        let mut wb = s.alloc(16 << 10).unwrap();
        wb.write_at(0, &poison).unwrap();
        s.write(0, lba + 32, 32, &wb).await.unwrap();
        let stale_w = s.last_descriptor().unwrap();
        assert_eq!(stale_w.dir, Direction::Write);
        let e = s
            .execute_with_descriptor(0, &write16, &stale_w)
            .await
            .unwrap_err();
        assert!(is_refused(&e), "{reg:?} replayed write: {e}");

        // The disk never saw the poison at `lba`, and the session still works
        // (a new RDMA connection replaces the one the refusals broke).
        let mut check = vec![0u8; 16 << 10];
        s.session().read(0, lba, 32, &mut check).await.unwrap();
        assert!(check == disk, "{reg:?}: a refused WRITE changed the disk");
        let mut again = s.alloc(16 << 10).unwrap();
        s.read(0, lba, 32, &mut again).await.unwrap();
        assert!(again.to_vec() == disk);
        assert_eq!(s.mode().await, Mode::Offloaded);
        assert!(s.stats().binds >= 2);
        assert_eq!(
            svc.counters().failed_transfers.load(Ordering::Relaxed) - failures,
            5,
            "{reg:?}"
        );
        s.logout().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_matrix() {
    let with = start(true).await;
    let without = start(false).await;
    let off = RdmaConfig {
        offer: false,
        ..RdmaConfig::default()
    };
    let cases = [
        ("both", &with, RdmaConfig::default(), Mode::Offloaded),
        (
            "initiator-only",
            &without,
            RdmaConfig::default(),
            Mode::Plain,
        ),
        ("target-only", &with, off.clone(), Mode::Plain),
        ("neither", &without, off, Mode::Plain),
    ];
    for (name, t, rdma, want) in cases {
        let s = assisted(t, name, rdma).await;
        assert_eq!(s.mode().await, want, "{name}");
        assert_eq!(s.grant().is_some(), want == Mode::Offloaded, "{name}");
        let data = random(128 << 10, 7);
        let mut w = s.alloc(data.len()).unwrap();
        w.write_at(0, &data).unwrap();
        s.write(0, 0, 256, &w).await.unwrap();
        let mut r = s.alloc(data.len()).unwrap();
        s.read(0, 0, 256, &mut r).await.unwrap();
        assert!(r.to_vec() == data, "{name}");
        let st = s.stats();
        if want == Mode::Offloaded {
            assert_eq!((st.offloaded_reads, st.offloaded_writes), (1, 1), "{name}");
        } else {
            assert_eq!((st.plain_commands, st.binds), (2, 0), "{name}");
        }
        s.logout().await.unwrap();
    }
    // Data digests and offload exclude each other: the target answers No.
    let s = AssistedSession::connect(
        cfg("digest").with_digests(false, true),
        RdmaConfig::default(),
        &with.addr.to_string(),
        TARGET,
    )
    .await
    .unwrap();
    assert_eq!(s.mode().await, Mode::Plain);
    assert_eq!(s.session().vendor_answers().1[0].1, "No");
    s.logout().await.unwrap();
    // A plain blockwire session against an RDMA-enabled target is untouched.
    let p = Session::connect(cfg("plain"), &with.addr.to_string(), TARGET)
        .await
        .unwrap();
    assert!(p.vendor_answers().1.is_empty());
    let mut v = vec![0u8; 4096];
    p.read(0, 0, 8, &mut v).await.unwrap();
    p.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_session_token_binds() {
    let t = start(true).await;
    let s = assisted(&t, "bind", RdmaConfig::default()).await;
    assert_eq!(s.mode().await, Mode::Offloaded);
    let grant = s.grant().unwrap();
    let p = SoftProvider::default();
    let connect = |bind: Vec<u8>| {
        let p = p.clone();
        async move {
            let init = QpInit::<SoftProvider> {
                pd: p.alloc_pd().unwrap(),
                send_cq: p.create_cq(4).unwrap(),
                recv_cq: p.create_cq(4).unwrap(),
                caps: QpCaps::default(),
            };
            p.connect(grant.endpoint, init, &bind).await
        }
    };
    let code = |r: Result<_, RdmaError>| match r {
        Err(RdmaError::Rejected { private_data }) => private_data[0],
        Err(e) => panic!("{e}"),
        Ok(_) => 0,
    };
    let tsih = s.session().tsih();
    let unknown = BindRequest {
        tsih,
        token: [0x42; TOKEN_LEN],
    };
    assert_eq!(code(connect(unknown.encode()).await), reject::UNKNOWN_TOKEN);
    let wrong_tsih = BindRequest {
        tsih: tsih.wrapping_add(1),
        token: grant.token,
    };
    assert_eq!(
        code(connect(wrong_tsih.encode()).await),
        reject::UNKNOWN_TOKEN
    );
    assert_eq!(code(connect(b"hello".to_vec()).await), reject::MALFORMED);
    let stolen = BindRequest {
        tsih,
        token: grant.token,
    };
    assert_eq!(code(connect(stolen.encode()).await), reject::ALREADY_BOUND);
    // After logout the token is gone.
    s.logout().await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(code(connect(stolen.encode()).await), reject::UNKNOWN_TOKEN);
    let _ = RemoteBuf {
        addr: 0,
        len: 0,
        rkey: 0,
    };
}

/// WRITE data moved by RDMA Read counts against the connection's write budget as data
/// gathered from Data-Out does: without it, an RDMA-assisted initiator could pin the
/// whole window times the largest transfer (128 × 32 MiB) while its data is read in.
/// A WRITE larger than the whole budget runs once nothing else holds a share, holding
/// all of it (it used to be answered TASK SET FULL every time, which an initiator
/// retrying TASK SET FULL, as this one does, would have retried until it gave up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offloaded_write_larger_than_the_write_budget_runs_alone() {
    let settings = FabricSettings {
        write_budget_bytes: 64 << 10,
        ..FabricSettings::default()
    };
    let t = start_with(settings, true).await;
    let s = assisted(&t, "budget", RdmaConfig::default()).await;
    assert_eq!(
        s.mode().await,
        Mode::Offloaded,
        "the session must move data by RDMA"
    );

    let big = random(128 << 10, 7);
    let mut w = s.alloc(big.len()).unwrap();
    w.write_at(0, &big).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(20), s.write(0, 0, 256, &w))
        .await
        .expect("the WRITE ends")
        .expect("128 KiB over a 64 KiB budget runs alone");
    let mut back = s.alloc(big.len()).unwrap();
    s.read(0, 0, 256, &mut back).await.unwrap();
    let mut got = vec![0u8; big.len()];
    back.read_at(0, &mut got).unwrap();
    assert!(got == big, "the WRITE over the budget read back differs");

    let small = random(32 << 10, 8);
    let mut w = s.alloc(small.len()).unwrap();
    w.write_at(0, &small).unwrap();
    s.write(0, 0, 64, &w).await.unwrap();
    let mut back = s.alloc(small.len()).unwrap();
    s.read(0, 0, 64, &mut back).await.unwrap();
    let mut got = vec![0u8; small.len()];
    back.read_at(0, &mut got).unwrap();
    assert!(got == small);
}

/// A session granted RDMA offload whose RDMA connection is bound by hand on the soft
/// provider's wire and then never read (a stalled or hostile peer): the session, the
/// vendor-key generation its offloaded commands name, and the connection's socket.
async fn stalled_rdma_peer(
    t: &TestTarget,
    name: &str,
) -> (Arc<Session>, u64, tokio::net::TcpStream) {
    use blockwire_transport::assist::{Grant, OFFLOAD_KEY};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut config = cfg(name).with_queue_depth(128);
    config
        .vendor_offers
        .push((OFFLOAD_KEY.to_owned(), "soft".to_owned()));
    let s = Arc::new(
        Session::connect(config, &t.addr.to_string(), TARGET)
            .await
            .unwrap(),
    );
    let (generation, answers) = s.vendor_answers();
    let grant = answers
        .iter()
        .find(|(k, _)| k == OFFLOAD_KEY)
        .and_then(|(_, v)| Grant::parse(v))
        .expect("the target grants RDMA offload");
    // The soft provider's CONNECT frame (kind 1, length, the magic "SFRD" in aux)
    // carrying the bind request; then the ACCEPT, and nothing read after it.
    let bind = BindRequest {
        tsih: s.tsih(),
        token: grant.token,
    }
    .encode();
    let mut rdma = tokio::net::TcpStream::connect(grant.endpoint)
        .await
        .unwrap();
    let mut frame = vec![1u8, 0, 0, 0];
    frame.extend_from_slice(&(bind.len() as u32).to_be_bytes());
    frame.extend_from_slice(&[0; 12]);
    frame.extend_from_slice(&0x5346_5244u32.to_be_bytes());
    frame.extend_from_slice(&bind);
    rdma.write_all(&frame).await.unwrap();
    let mut header = [0u8; 24];
    rdma.read_exact(&mut header).await.unwrap();
    assert_eq!(header[0], 2, "the target accepts the bind: {header:?}");
    let private = u32::from_be_bytes(header[4..8].try_into().unwrap()) as usize;
    rdma.read_exact(&mut vec![0; private]).await.unwrap();
    (s, generation, rdma)
}

/// A peer that stalls without breaking its RDMA connection: the target gives up on an
/// RDMA Read that never completes after the NOP timeout. It tears the RDMA connection
/// down (the peer sees it close), the WRITE fails, and the session serves on.
/// Without that bound the WRITE waited for good, holding its window slot and staging
/// buffers, and every later offloaded command of the session queued behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rdma_operation_a_stalled_peer_never_completes_ends_after_the_nop_timeout() {
    use std::time::{Duration, Instant};
    use tokio::io::AsyncReadExt;
    let settings = FabricSettings {
        nop_timeout: Duration::from_secs(2),
        ..FabricSettings::default()
    };
    let t = start_with(settings, true).await;
    let (s, generation, mut rdma) = stalled_rdma_peer(&t, "stalled-rdma-read").await;
    let _ = s
        .execute(0, &[0; 6], blockwire_initiator::DataDir::None)
        .await;
    let desc = Descriptor {
        dir: Direction::Write,
        chunks: vec![RemoteBuf {
            addr: 0x1000_0000,
            len: 64 << 10,
            rkey: 0x77,
        }],
    };
    let blocks = ((64 << 10) / BS) as u16;
    let cdb = [0x2a, 0, 0, 0, 0, 0, 0, (blocks >> 8) as u8, blocks as u8, 0];
    let started = Instant::now();
    let write = tokio::time::timeout(
        Duration::from_secs(30),
        s.execute_offloaded(generation, 0, &cdb, 0, 64 << 10, vec![desc.to_ahs()]),
    )
    .await
    .expect("the WRITE still waits 30 s after its RDMA Read went unanswered");
    assert!(
        write.is_err(),
        "a WRITE whose data never came succeeded: {write:?}"
    );
    eprintln!("the WRITE failed after {:?}", started.elapsed());
    // The target closed the RDMA connection: the socket reads to its end (the
    // RDMA Read request it sent first, then EOF).
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), rdma.read_to_end(&mut rest))
        .await
        .expect("the target keeps the stalled RDMA connection open")
        .expect("the RDMA connection ends cleanly");
    // The session itself serves on.
    let tur = s
        .execute(0, &[0; 6], blockwire_initiator::DataDir::None)
        .await
        .expect("TEST UNIT READY after the failed transfer");
    assert_eq!(tur.status, ScsiStatus::GOOD);
}

/// READ data on the core road wait, whole in memory, until their RDMA Writes complete,
/// and so count against the connection's READ budget just as Data-In waiting for the
/// socket does. The initiator here binds its RDMA connection by hand and then never
/// reads it (a stalled or hostile peer): its RDMA Writes never complete. Without the
/// budget, 120 READs of 4 MiB held their data (and the soft provider's frames of it)
/// at once; with a 16 MiB budget the READs beyond it wait before the core reads. Once
/// the peer is gone, the READs still queued fail after one wait for a new bind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offloaded_reads_a_peer_does_not_take_stay_within_the_read_budget() {
    fn resident() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
        let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * 4096
    }
    const MIB: usize = 1 << 20;
    let settings = FabricSettings {
        read_budget_bytes: 16 << 20,
        ..FabricSettings::default()
    };
    let t = start_with(settings, true).await;
    let (s, generation, rdma) = stalled_rdma_peer(&t, "stalled-rdma-peer").await;

    // The unit's power-on attention out of the way, and data to read (a
    // RAM LUN's unwritten blocks read as zeros, which cost no memory).
    let _ = s
        .execute(0, &[0; 6], blockwire_initiator::DataDir::None)
        .await;
    s.write(0, 0, (4 * MIB / BS) as u32, &random(4 * MIB, 9))
        .await
        .unwrap();

    let base = resident();
    let blocks = (4 * MIB / BS) as u16;
    let mut reads = tokio::task::JoinSet::new();
    for i in 0..120u32 {
        let s = s.clone();
        let desc = Descriptor {
            dir: Direction::Read,
            chunks: vec![RemoteBuf {
                addr: u64::from(i) << 32,
                len: 4 * MIB as u64,
                rkey: 0x100 + i,
            }],
        };
        let cdb = [0x28, 0, 0, 0, 0, 0, 0, (blocks >> 8) as u8, blocks as u8, 0];
        reads.spawn(async move {
            s.execute_offloaded(generation, 0, &cdb, 4 * MIB, 0, vec![desc.to_ahs()])
                .await
        });
    }
    // At least two seconds, then until resident memory stops growing.
    let (mut high, mut since) = (resident(), std::time::Instant::now());
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_secs(2)
        || since.elapsed() < std::time::Duration::from_secs(1)
    {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        if resident() > high + MIB {
            (high, since) = (resident(), std::time::Instant::now());
        }
    }
    let growth = high.saturating_sub(base);
    eprintln!("resident memory grew by {} MiB", growth / MIB);
    assert!(
        growth < 128 * MIB,
        "resident memory grew by {} MiB while the RDMA peer took no data",
        growth / MIB
    );
    if let Some(r) = reads.try_join_next() {
        panic!("a READ ended while its RDMA Write waits: {r:?}");
    }
    // The peer goes away: every READ ends (failed), those still queued
    // after one wait for a new bind (10 s) rather than one wait each (120
    // READs, four at a time within the budget: 300 s).
    drop(rdma);
    let ended = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while let Some(r) = reads.join_next().await {
            assert!(
                r.unwrap().is_err(),
                "a READ whose data never arrived succeeded"
            );
        }
    });
    if ended.await.is_err() {
        panic!("READs still wait 60 s after the RDMA connection went");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_shutting_down_takes_no_new_rdma_connection() {
    let t = start(true).await;
    let endpoint = t.fabric.rdma.get().expect("the RDMA service").endpoint();
    let s = assisted(&t, "before-shutdown", RdmaConfig::default()).await;
    assert_eq!(s.mode().await, Mode::Offloaded);
    s.logout().await.unwrap();
    t.stop.send(true).unwrap();
    // The offload listener closes once the shutdown reaches it: the soft provider's
    // TCP connection to the endpoint is then refused.
    support::wait_until_refused(endpoint, "the RDMA endpoint").await;
}

/// An RDMA-assisted WRITE that its LUN's ceiling holds back takes its share of the write
/// budget, and has its data read, only when its place comes: with a 64 KiB budget, two 48
/// KiB WRITEs sent together under a 1 IOPS ceiling both land, the later one no sooner than
/// 0.9 s after (had the held one taken its share on arrival, beside the first's, it would
/// have been answered TASK SET FULL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_rdma_assisted_write_takes_its_budget_share_at_its_turn() {
    let settings = FabricSettings {
        write_budget_bytes: 64 << 10,
        ..FabricSettings::default()
    };
    let t = start_with(settings, true).await;
    let s = assisted(&t, "held", RdmaConfig::default()).await;
    assert_eq!(s.mode().await, Mode::Offloaded);
    let len = 48 << 10;
    let blocks = (len / BS) as u32;
    let mut r = s.alloc(len).unwrap();
    // The power-on unit attention first, before the ceiling.
    s.read(0, 0, blocks, &mut r).await.unwrap();
    let unit = t.fabric.catalog().targets[0].luns.get(0).unwrap();
    unit.set_qos(blockwire_target::scsi::QosLimits {
        iops: Some(1),
        bytes_per_sec: None,
        ..Default::default()
    });
    let (a, b) = (random(len, 60), random(len, 61));
    let mut wa = s.alloc(len).unwrap();
    wa.write_at(0, &a).unwrap();
    let mut wb = s.alloc(len).unwrap();
    wb.write_at(0, &b).unwrap();
    let t0 = std::time::Instant::now();
    let (ra, rb) = tokio::join!(
        async { (s.write(0, 0, blocks, &wa).await, t0.elapsed()) },
        async { (s.write(0, 256, blocks, &wb).await, t0.elapsed()) },
    );
    ra.0.expect("the first WRITE");
    rb.0.expect("the second WRITE");
    let later = ra.1.max(rb.1);
    println!("two 48 KiB RDMA-assisted WRITEs at 1 IOPS, 64 KiB budget: {later:?}");
    assert!(later >= std::time::Duration::from_millis(900), "{later:?}");
    assert_eq!(unit.qos().counters().delayed, 1);
    assert_eq!(unit.qos().counters().waiting, 0);
    unit.set_qos(blockwire_target::scsi::QosLimits::NONE);
    for (lba, want) in [(0, &a), (256, &b)] {
        s.read(0, lba, blocks, &mut r).await.unwrap();
        assert!(
            &r.to_vec() == want,
            "the WRITE at LBA {lba} read back differs"
        );
    }
    s.logout().await.unwrap();
}

/// A LUN's bandwidth ceiling holds RDMA-assisted commands as it holds TCP ones: at 1 MiB/s
/// (a burst of 50 ms worth), four 256 KiB WRITEs by RDMA Read, one after another, take at
/// least 3 x 256 KiB less the burst, about 0.7 s, and the data still lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qos_ceiling_holds_rdma_assisted_commands_too() {
    let t = start(true).await;
    let s = assisted(&t, "qos", RdmaConfig::default()).await;
    assert_eq!(s.mode().await, Mode::Offloaded);
    let len = 256 << 10;
    let mut r = s.alloc(len).unwrap();
    // The power-on unit attention first, before the ceiling.
    s.read(0, 0, (len / BS) as u32, &mut r).await.unwrap();
    let unit = t.fabric.catalog().targets[0].luns.get(0).unwrap();
    unit.set_qos(blockwire_target::scsi::QosLimits {
        iops: None,
        bytes_per_sec: Some(1 << 20),
        ..Default::default()
    });
    let t0 = std::time::Instant::now();
    for i in 0..4u64 {
        let data = random(len, 40 + i);
        let mut w = s.alloc(len).unwrap();
        w.write_at(0, &data).unwrap();
        s.write(0, i * (len / BS) as u64, (len / BS) as u32, &w)
            .await
            .unwrap();
    }
    let took = t0.elapsed();
    println!("4 RDMA-assisted 256 KiB WRITEs at 1 MiB/s: {took:?}");
    assert!(took >= std::time::Duration::from_millis(700), "{took:?}");
    assert!(unit.qos().counters().delayed >= 1);
    unit.set_qos(blockwire_target::scsi::QosLimits::NONE);
    for i in 0..4u64 {
        s.read(0, i * (len / BS) as u64, (len / BS) as u32, &mut r)
            .await
            .unwrap();
        assert!(
            r.to_vec() == random(len, 40 + i),
            "WRITE {i} read back differs"
        );
    }
    let st = s.stats();
    assert!(
        st.offloaded_writes >= 4 && st.failed_transfers == 0,
        "{st:?}"
    );
    s.logout().await.unwrap();
}

/// Offloaded commands larger than the target's whole buffer pool (8.5 MiB by
/// default) move through it in pieces: a 16 MiB WRITE and READ of an
/// initiator that offloads that much move by RDMA, whole. Before, each was
/// refused (DATA PHASE ERROR) and the initiator fell back to TCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offloaded_command_larger_than_the_target_pool_moves_in_pieces() {
    let t = start(true).await;
    let s = assisted(
        &t,
        "big",
        RdmaConfig {
            max_offload: 16 << 20,
            registration: RegConfig::Dynamic,
            ..RdmaConfig::default()
        },
    )
    .await;
    assert_eq!(s.mode().await, Mode::Offloaded);
    let len = 16 << 20;
    let data = random(len, 16);
    let mut w = s.alloc(len).unwrap();
    w.write_at(0, &data).unwrap();
    s.write(0, 8, (len / BS) as u32, &w)
        .await
        .expect("a 16 MiB offloaded WRITE");
    let mut r = s.alloc(len).unwrap();
    let c = s
        .read(0, 8, (len / BS) as u32, &mut r)
        .await
        .expect("a 16 MiB offloaded READ");
    assert_eq!(c.transferred, len);
    assert!(r.to_vec() == data, "the 16 MiB read back differs");
    let st = s.stats();
    assert_eq!(
        (st.offloaded_writes, st.offloaded_reads, st.failed_transfers),
        (1, 1, 0),
        "{st:?}"
    );
    assert_eq!(s.mode().await, Mode::Offloaded, "still offloading");
    s.logout().await.unwrap();
}

/// An RDMA-assisted session whose command timeout is one second, a 64 KiB
/// block of `seed` written at LBA 0 by an offloaded WRITE, then LUN 0's
/// media commands held unanswered for two seconds (the task that ends the
/// hold returned).
async fn written_then_stalled_for_two_seconds(
    t: &TestTarget,
    name: &str,
    seed: u64,
) -> (AssistedSession, Vec<u8>, tokio::task::JoinHandle<()>) {
    let config = cfg(name).with_command_timeout(Some(std::time::Duration::from_secs(1)));
    let s = AssistedSession::connect(config, RdmaConfig::default(), &t.addr.to_string(), TARGET)
        .await
        .unwrap();
    assert_eq!(s.mode().await, Mode::Offloaded);
    let data = random(64 << 10, seed);
    let blocks = (data.len() / BS) as u32;
    let mut w = s.alloc(data.len()).unwrap();
    w.write_at(0, &data).unwrap();
    s.write(0, 0, blocks, &w).await.expect("an offloaded WRITE");
    let luns = t.fabric.catalog().targets[0].luns.clone();
    luns.set_stalled(0, true).unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        luns.set_stalled(0, false).unwrap();
    });
    (s, data, release)
}

/// An offloaded command the target does not answer within the command timeout gives
/// its connection up: its buffers are the target's to RDMA Write or Read until it
/// ends, so it is not aborted and sent again on that connection as a TCP command is.
/// The session logs in again and the command runs again over TCP. Before, it waited
/// for as long as the target held it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offloaded_command_unanswered_past_its_deadline_runs_again_over_tcp() {
    let t = start(true).await;
    let (s, data, release) = written_then_stalled_for_two_seconds(&t, "late-offload", 23).await;
    let blocks = (data.len() / BS) as u32;
    let mut r = s.alloc(data.len()).unwrap();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        s.read(0, 0, blocks, &mut r),
    )
    .await
    .expect("the READ ends");
    release.await.unwrap();
    read.expect("the READ, sent again over TCP");
    assert!(r.to_vec() == data, "the data read back differs");
    let st = s.stats();
    assert!(
        st.failed_transfers >= 1,
        "the offloaded READ waited past its deadline: {st:?}"
    );
    assert!(
        s.session().recoveries() >= 1,
        "the connection was given up and recovered"
    );
    s.logout().await.unwrap();
}

/// A command run as sent (the kernel's, behind `blockwire attach`) is the
/// caller's to time out, offloaded as over TCP: a target slower than the
/// session's own command timeout does not have the session give its
/// connection up and send the command again over TCP, which the caller
/// never asked for. Before, the offloaded path timed it out like one of
/// the session's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_run_as_sent_is_not_timed_out_by_the_session() {
    use std::sync::atomic::AtomicU32;
    let t = start(true).await;
    let (s, data, release) = written_then_stalled_for_two_seconds(&t, "as-sent-late", 37).await;
    let blocks = (data.len() / BS) as u32;
    let read = blockwire_initiator::rw16(false, 0, blocks, false);
    let itt = AtomicU32::new(0);
    let mut r = s.alloc(data.len()).unwrap();
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        s.read_cdb_as_sent(0, &read, std::slice::from_mut(&mut r), &itt),
    )
    .await
    .expect("the READ ends");
    release.await.unwrap();
    let answer = answer.expect("the READ");
    assert_eq!(
        (answer.status, answer.transferred),
        (ScsiStatus::GOOD, data.len())
    );
    assert!(r.to_vec() == data, "the data read back differs");
    let st = s.stats();
    assert_eq!(st.failed_transfers, 0, "the READ was given up: {st:?}");
    assert_eq!(
        s.session().recoveries(),
        0,
        "the session gave its connection up under the caller's command"
    );
    assert!(st.offloaded_reads >= 1, "{st:?}");
    s.logout().await.unwrap();
}

/// A command run as sent comes back as the target gave it when its data
/// move by RDMA, as over TCP: here descriptor-format sense (the unit's
/// D_SENSE set, SPC-5 4.4.2) for a READ past the end, byte for byte what
/// the same command passed through over TCP gets. Before, the offloaded
/// path decoded the sense and sent it on re-encoded in fixed format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_run_as_sent_and_offloaded_keeps_the_targets_sense_bytes() {
    use blockwire_initiator::DataDir;
    use std::sync::atomic::AtomicU32;
    let t = start(true).await;
    let s = assisted(&t, "as-sent-sense", RdmaConfig::default()).await;
    assert_eq!(s.mode().await, Mode::Offloaded);
    // MODE SENSE(6) of the Control page (DBD), D_SENSE set, MODE SELECT(6).
    let mut page = vec![0u8; 255];
    let c = s
        .session()
        .execute(0, &[0x1a, 0x08, 0x0a, 0, 255, 0], DataDir::Read(&mut page))
        .await
        .expect("MODE SENSE of the Control page");
    page.truncate(c.transferred);
    assert_eq!(page[4] & 0x3f, 0x0a, "{page:?}");
    page[0] = 0; // MODE DATA LENGTH is reserved in MODE SELECT
    page[2] = 0;
    page[4] &= 0x3f; // PS
    page[4 + 2] |= 0x04; // D_SENSE
    s.session()
        .execute(
            0,
            &[0x15, 0x10, 0, 0, page.len() as u8, 0],
            DataDir::Write(&page),
        )
        .await
        .expect("MODE SELECT with D_SENSE");
    let len = 64 << 10;
    let past_the_end = blockwire_initiator::rw16(false, 1 << 40, (len / BS) as u32, false);
    let itt = AtomicU32::new(0);
    let mut buf = s.alloc(len).unwrap();
    let offloaded = s
        .read_cdb_as_sent(0, &past_the_end, std::slice::from_mut(&mut buf), &itt)
        .await
        .expect("an answer");
    assert!(s.stats().failed_transfers == 0 && s.stats().binds >= 1);
    let mut v = vec![0u8; len];
    let over_tcp = s
        .session()
        .pass_through(0, &past_the_end, DataDir::Read(&mut v), &itt)
        .await
        .expect("an answer over TCP");
    assert_eq!(over_tcp.status, ScsiStatus::CHECK_CONDITION, "{over_tcp:?}");
    assert_eq!(
        over_tcp.sense[0] & 0x7f,
        0x72,
        "descriptor format: {over_tcp:?}"
    );
    assert_eq!(
        (over_tcp.sense[1] & 0x0f, over_tcp.sense[2]),
        (0x05, 0x21),
        "ILLEGAL REQUEST, LBA OUT OF RANGE: {over_tcp:?}"
    );
    assert_eq!(offloaded.status, over_tcp.status);
    assert_eq!(offloaded.sense, over_tcp.sense, "offloaded {offloaded:?}");
    s.logout().await.unwrap();
}

/// An offloaded command that ends without a SCSI Response (here aborted by
/// this session's own LOGICAL UNIT RESET) takes its RDMA connection down
/// before its buffers go back: RDMA Writes the target queued before the
/// reset could still land in them once reused (the queue pair is not
/// ordered against the TCP connection that carried the reset's answer). The
/// next offloaded command binds a new connection. Before, only a failed
/// transfer took the connection down, and the buffer went back with it up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offloaded_command_ended_without_a_response_takes_its_connection_down() {
    let t = start(true).await;
    let s = assisted(&t, "reset-offload", RdmaConfig::default()).await;
    assert_eq!(s.mode().await, Mode::Offloaded);
    let data = random(64 << 10, 29);
    let blocks = (data.len() / BS) as u32;
    let mut w = s.alloc(data.len()).unwrap();
    w.write_at(0, &data).unwrap();
    s.write(0, 0, blocks, &w).await.expect("an offloaded WRITE");
    assert_eq!(s.stats().binds, 1);
    // The READ waits at the stalled unit until the reset aborts it.
    let luns = t.fabric.catalog().targets[0].luns.clone();
    luns.set_stalled(0, true).unwrap();
    let mut r = s.alloc(data.len()).unwrap();
    let read = s.read(0, 0, blocks, &mut r);
    let reset = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        s.session().lun_reset(0).await
    };
    let (read, reset) = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        tokio::join!(read, reset)
    })
    .await
    .expect("the READ and the reset end");
    reset.expect("LOGICAL UNIT RESET");
    let e = read.expect_err("the READ the reset aborted");
    assert!(matches!(e, Error::Aborted { .. }), "{e}");
    luns.set_stalled(0, false).unwrap();
    // The next offloaded command binds a new RDMA connection.
    let mut again = s.alloc(data.len()).unwrap();
    s.read(0, 0, blocks, &mut again)
        .await
        .expect("an offloaded READ after the reset");
    assert!(again.to_vec() == data, "the data read back differs");
    let st = s.stats();
    assert_eq!(
        st.binds, 2,
        "the aborted command's connection was let go: {st:?}"
    );
    s.logout().await.unwrap();
}

/// Commands run "as sent" (the kernel's through `blockwire attach`) leave
/// every status to the caller: a UNIT ATTENTION such as CAPACITY DATA HAS
/// CHANGED comes back as the target gave it, offloaded or not, for the
/// SCSI mid-layer to act on (sd reads the new capacity). The session's own
/// commands retry past it. Before, the RDMA-assisted path retried it for
/// the kernel too, which never heard of the resize.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_run_as_sent_leave_unit_attentions_to_the_caller() {
    use std::sync::atomic::AtomicU32;
    let t = start(true).await;
    let s = assisted(&t, "as-sent", RdmaConfig::default()).await;
    assert_eq!(s.mode().await, Mode::Offloaded);
    let unit = t.fabric.catalog().targets[0].luns.get(0).unwrap();
    let len = 64 << 10;
    let read = blockwire_initiator::rw16(false, 0, (len / BS) as u32, false);
    let write = blockwire_initiator::rw16(true, 0, (len / BS) as u32, false);
    let mut buf = s.alloc(len).unwrap();
    buf.write_at(0, &random(len, 31)).unwrap();
    // Whatever the login left pending is retried away here.
    s.read_cdb(0, &read, std::slice::from_mut(&mut buf))
        .await
        .expect("a READ");
    let itt = AtomicU32::new(0);
    let capacity_changed = |sense: &[u8]| (sense[2] & 0x0f, sense[12], sense[13]);
    for (step, size) in [("READ", 64u64 << 20), ("WRITE", 96 << 20)] {
        unit.resize(size).unwrap();
        let r = if step == "READ" {
            s.read_cdb_as_sent(0, &read, std::slice::from_mut(&mut buf), &itt)
                .await
        } else {
            s.write_cdb_as_sent(0, &write, std::slice::from_ref(&buf), &itt)
                .await
        }
        .expect("an answer");
        assert_eq!(r.status, ScsiStatus::CHECK_CONDITION, "{step}: {r:?}");
        assert_eq!(
            capacity_changed(&r.sense),
            (0x06, 0x2a, 0x09),
            "{step}: {r:?}"
        );
        let r = s
            .read_cdb_as_sent(0, &read, std::slice::from_mut(&mut buf), &itt)
            .await
            .expect("an answer");
        assert_eq!(
            (r.status, r.transferred),
            (ScsiStatus::GOOD, len),
            "{step}, again"
        );
    }
    // The session's own commands go on past one.
    unit.resize(128 << 20).unwrap();
    s.read_cdb(0, &read, std::slice::from_mut(&mut buf))
        .await
        .expect("a READ retried past CAPACITY DATA HAS CHANGED");
    assert!(s.stats().offloaded_reads >= 4, "{:?}", s.stats());
    s.logout().await.unwrap();
}
