//! The blockwire initiator over iSER (RFC 7145) against blockwire's iSER target, both on
//! the soft RDMA provider in this process: login with RDMAExtensions=Yes, READ data placed
//! by the target's RDMA Writes and WRITE data taken by its RDMA Reads for every
//! registration strategy that gives one region per buffer, the message count of a 1 MiB
//! READ, a released buffer's STag refused, logout and a new login finding the data, the
//! portal closing when the target shuts down.

mod support;

use std::sync::Arc;

use blockwire_initiator::iser::IserSession;
use blockwire_initiator::rdma::{RdmaConfig, RegConfig};
use blockwire_initiator::InitiatorConfig;
use blockwire_target::backstore::RamBackstore;
use blockwire_target::iscsi::FabricSettings;
use blockwire_target::scsi::{LogicalUnit, LuConfig};
use blockwire_transport::rdma::any::Backend;
use rand::{Rng, SeedableRng};
use support::{bind_target, TestTarget};

const TARGET: &str = "iqn.2026-11.io.blockwire:iser-test";
const BS: usize = 512;
const MIB: usize = 1 << 20;

async fn start() -> (TestTarget, std::net::SocketAddr) {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("warn")
        .try_init();
    let lu = LogicalUnit::new(LuConfig::new(Arc::new(RamBackstore::new(64 << 20))));
    let t = bind_target(TARGET, lu, FabricSettings::default())
        .await
        .serve(false)
        .await;
    let iser = t.start_iser().await;
    (t, iser)
}

fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill(&mut v[..]);
    v
}

async fn connect(portal: std::net::SocketAddr, name: &str, reg: RegConfig) -> IserSession {
    IserSession::connect(
        InitiatorConfig::new(format!("iqn.2026-11.io.blockwire:{name}")),
        RdmaConfig {
            registration: reg,
            backend: Backend::Soft,
            ..RdmaConfig::default()
        },
        portal,
        TARGET,
    )
    .await
    .unwrap_or_else(|e| panic!("iSER login: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_moves_by_rdma_for_every_single_region_strategy() {
    let (_t, portal) = start().await;
    let strategies = [
        RegConfig::Dynamic,
        RegConfig::PinDownCache { capacity: 8 },
        RegConfig::Arena { bytes: 8 << 20 },
    ];
    for (i, reg) in strategies.into_iter().enumerate() {
        let s = connect(portal, &format!("strategy{i}"), reg).await;
        assert!(s.params().rdma_extensions, "RDMAExtensions=Yes");
        let mut lba = (i * 8 * MIB / BS) as u64;
        for (j, len) in [4 << 10, 64 << 10, MIB, 3 * MIB].into_iter().enumerate() {
            let data = random(len, (i * 10 + j) as u64);
            let mut w = s.alloc(len).unwrap();
            w.write_at(0, &data).unwrap();
            s.write(0, lba, (len / BS) as u32, &w).await.unwrap();
            let mut r = s.alloc(len).unwrap();
            let c = s.read(0, lba, (len / BS) as u32, &mut r).await.unwrap();
            assert_eq!(c.transferred, len, "{reg:?} {len}");
            assert!(r.to_vec() == data, "{reg:?} {len}: read back differs");
            lba += (len / BS) as u64;
        }
        assert_eq!(s.stats().rdma_commands, 8, "{reg:?}");
        s.logout().await.unwrap();
    }
}

/// What one 1 MiB READ costs in messages: one Send (the command) and one receive (the
/// SCSI Response); the data is one-sided RDMA Writes into the advertised buffer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_mib_read_is_one_send_and_one_receive() {
    let (_t, portal) = start().await;
    let s = connect(portal, "count", RegConfig::PinDownCache { capacity: 8 }).await;
    let mut r = s.alloc(MIB).unwrap();
    // The first command takes the LUN's power-on unit attention (answered and retried).
    s.read(0, 0, (MIB / BS) as u32, &mut r).await.unwrap();
    let before = s.stats();
    for i in 0..16u64 {
        s.read(0, i * (MIB / BS) as u64, (MIB / BS) as u32, &mut r)
            .await
            .unwrap();
    }
    let after = s.stats();
    println!(
        "iSER, per 1 MiB READ: {} Sends, {} receives",
        (after.sends - before.sends) as f64 / 16.0,
        (after.receives - before.receives) as f64 / 16.0
    );
    assert_eq!(after.sends - before.sends, 16);
    assert_eq!(after.receives - before.receives, 16);
    s.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logout_then_a_new_login_finds_the_data() {
    let (t, portal) = start().await;
    let data = random(256 << 10, 99);
    {
        let s = connect(portal, "again", RegConfig::Dynamic).await;
        let mut w = s.alloc(data.len()).unwrap();
        w.write_at(0, &data).unwrap();
        s.write(0, 4096, (data.len() / BS) as u32, &w)
            .await
            .unwrap();
        s.logout().await.unwrap();
    }
    let s = connect(portal, "again", RegConfig::Dynamic).await;
    let mut r = s.alloc(data.len()).unwrap();
    s.read(0, 4096, (data.len() / BS) as u32, &mut r)
        .await
        .unwrap();
    assert!(r.to_vec() == data);
    // The same bytes over plain iSCSI on TCP: the LUN is one LUN whatever the transport.
    let plain = blockwire_initiator::Session::connect(
        InitiatorConfig::new("iqn.2026-11.io.blockwire:plain"),
        &t.addr.to_string(),
        TARGET,
    )
    .await
    .unwrap();
    let mut v = vec![0u8; data.len()];
    plain
        .read(0, 4096, (data.len() / BS) as u32, &mut v)
        .await
        .unwrap();
    assert!(v == data);
    plain.logout().await.unwrap();
    s.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portal_that_is_not_iser_is_named_in_the_error() {
    let (t, _) = start().await;
    // The TCP portal's port has no RDMA listener: the connection is refused.
    let e = IserSession::connect(
        InitiatorConfig::new("iqn.2026-11.io.blockwire:wrong"),
        RdmaConfig {
            backend: Backend::Soft,
            connect_timeout: std::time::Duration::from_secs(5),
            ..RdmaConfig::default()
        },
        "127.0.0.1:1".parse().unwrap(),
        TARGET,
    )
    .await
    .err()
    .expect("no iSER portal there");
    assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
    drop(t);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_shutting_down_takes_no_new_iser_connection() {
    let (t, portal) = start().await;
    let s = connect(portal, "before-shutdown", RegConfig::Dynamic).await;
    s.logout().await.unwrap();
    t.stop.send(true).unwrap();
    // The listener closes once the shutdown reaches it: the soft provider's TCP
    // connection to the portal is then refused.
    support::wait_until_refused(portal, "the iSER portal").await;
}

/// A LUN's QoS ceiling holds iSER commands as it holds TCP ones: the fabric books each one
/// before its road starts, whatever the wire. At 20 IOPS (a burst of one more), 8 READs one
/// after another take at least 6 x 50 ms, each after the first two counted as delayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qos_ceiling_holds_iser_commands_too() {
    let (t, portal) = start().await;
    let s = connect(portal, "qos", RegConfig::PinDownCache { capacity: 8 }).await;
    let mut r = s.alloc(4096).unwrap();
    // The power-on unit attention first, before the ceiling.
    s.read(0, 0, 8, &mut r).await.unwrap();
    let unit = t.fabric.catalog().targets[0].luns.get(0).unwrap();
    unit.set_qos(blockwire_target::scsi::QosLimits {
        iops: Some(20),
        bytes_per_sec: None,
        ..Default::default()
    });
    let t0 = std::time::Instant::now();
    for i in 0..8u64 {
        let c = s.read(0, i * 8, 8, &mut r).await.unwrap();
        assert_eq!(c.transferred, 4096);
    }
    let took = t0.elapsed();
    println!("8 iSER READs at 20 IOPS: {took:?}");
    assert!(took >= std::time::Duration::from_millis(300), "{took:?}");
    // 6 when each READ comes within its 50 ms; a slower client is held less.
    assert!(unit.qos().counters().delayed >= 1);
    assert!(s.stats().rdma_commands >= 8, "the data moved by RDMA");
    s.logout().await.unwrap();
}
