//! What one 1 MiB READ costs on the wire, for each data path, counted (not timed): plain
//! iSCSI over TCP, RDMA-assisted iSCSI (soft provider) and iSER (soft provider), all
//! against one in-process blockwire target with a RAM LUN. TCP PDUs are counted by a
//! relay that parses each PDU header on its way through; RDMA operations and iSER messages
//! by the target's counters. Prints the table and checks each path against what its
//! protocol says a READ is.

mod support;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use blockwire_initiator::iser::IserSession;
use blockwire_initiator::rdma::{AssistedSession, Mode, RdmaConfig};
use blockwire_initiator::{InitiatorConfig, Session};
use blockwire_target::backstore::RamBackstore;
use blockwire_target::iscsi::FabricSettings;
use blockwire_target::scsi::{LogicalUnit, LuConfig};
use blockwire_transport::rdma::any::Backend;
use support::bind_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TARGET: &str = "iqn.2026-11.io.blockwire:wire-counts";
const MIB: usize = 1 << 20;
const READS: u64 = 16;

/// PDUs seen per direction and opcode.
#[derive(Default)]
struct Tally {
    to_target: HashMap<u8, u64>,
    to_initiator: HashMap<u8, u64>,
}

/// A TCP relay from a free port to `to` that counts whole PDUs each way (no digests:
/// header 48 bytes, TotalAHSLength in 4-byte words, DataSegmentLength padded to 4).
async fn counting_relay(
    to: std::net::SocketAddr,
    tally: Arc<Mutex<Tally>>,
) -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((a, _)) = l.accept().await else { return };
            let b = tokio::net::TcpStream::connect(to).await.unwrap();
            let (ar, aw) = a.into_split();
            let (br, bw) = b.into_split();
            tokio::spawn(pump(ar, bw, tally.clone(), true));
            tokio::spawn(pump(br, aw, tally.clone(), false));
        }
    });
    addr
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    tally: Arc<Mutex<Tally>>,
    to_target: bool,
) {
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        while pending.len() >= 48 {
            let ahs = usize::from(pending[4]) * 4;
            let data = u32::from_be_bytes([0, pending[5], pending[6], pending[7]]) as usize;
            let len = 48 + ahs + data.div_ceil(4) * 4;
            if pending.len() < len {
                break;
            }
            let op = pending[0] & 0x3f;
            let mut t = tally.lock().unwrap();
            let side = if to_target {
                &mut t.to_target
            } else {
                &mut t.to_initiator
            };
            *side.entry(op).or_default() += 1;
            drop(t);
            pending.drain(..len);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

fn total(m: &HashMap<u8, u64>) -> u64 {
    m.values().sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_per_1_mib_read_for_each_data_path() {
    let lu = LogicalUnit::new(LuConfig::new(Arc::new(RamBackstore::new(64 << 20))));
    let t = bind_target(TARGET, lu, FabricSettings::default())
        .await
        .serve(true)
        .await;
    let iser = t.start_iser().await;
    let tally = Arc::new(Mutex::new(Tally::default()));
    let relay = counting_relay(t.addr, tally.clone()).await;
    let cfg = |n: &str| InitiatorConfig::new(format!("iqn.2026-11.io.blockwire:{n}"));
    let blocks = (MIB / 512) as u32;
    let reset = || *tally.lock().unwrap() = Tally::default();
    let snapshot = |t: &Mutex<Tally>| {
        let t = t.lock().unwrap();
        (t.to_target.clone(), t.to_initiator.clone())
    };
    let mut table = Vec::new();

    // Plain iSCSI: the command, Data-In PDUs of at most our MaxRecvDataSegmentLength,
    // the status (collapsed into the last Data-In, or a SCSI Response).
    let s = Session::connect(cfg("tcp"), &relay.to_string(), TARGET)
        .await
        .unwrap();
    let mut v = vec![0u8; MIB];
    s.read(0, 0, blocks, &mut v).await.unwrap(); // takes the power-on unit attention
    reset();
    for i in 0..READS {
        s.read(0, i * u64::from(blocks), blocks, &mut v)
            .await
            .unwrap();
    }
    let (out, inn) = snapshot(&tally);
    let mrdsl = s.params().initiator_max_recv_data_segment_length as u64;
    let data_ins = inn.get(&0x25).copied().unwrap_or(0);
    table.push(format!(
        "tcp:           {:>5.2} PDUs to the target, {:>5.2} PDUs back ({:.2} Data-In of <= {} bytes), 0 RDMA operations",
        total(&out) as f64 / READS as f64,
        total(&inn) as f64 / READS as f64,
        data_ins as f64 / READS as f64,
        mrdsl
    ));
    assert_eq!(total(&out), READS, "one SCSI Command PDU per READ");
    assert_eq!(
        data_ins,
        READS * (MIB as u64).div_ceil(mrdsl),
        "Data-In PDUs of MaxRecvDataSegmentLength"
    );
    s.logout().await.unwrap();

    // RDMA-assisted: command and status on TCP, the data by the target's RDMA Writes.
    let a = AssistedSession::connect(
        cfg("rdma"),
        RdmaConfig::default(),
        &relay.to_string(),
        TARGET,
    )
    .await
    .unwrap();
    assert_eq!(a.mode().await, Mode::Offloaded);
    let mut r = a.alloc(MIB).unwrap();
    a.read(0, 0, blocks, &mut r).await.unwrap();
    let svc = t.fabric.rdma.get().unwrap();
    let writes0 = svc.counters().rdma_writes.load(Ordering::Relaxed);
    reset();
    for i in 0..READS {
        a.read(0, i * u64::from(blocks), blocks, &mut r)
            .await
            .unwrap();
    }
    let (out, inn) = snapshot(&tally);
    let writes = svc.counters().rdma_writes.load(Ordering::Relaxed) - writes0;
    table.push(format!(
        "rdma-assisted: {:>5.2} PDUs to the target, {:>5.2} PDUs back, {:.2} RDMA Writes",
        total(&out) as f64 / READS as f64,
        total(&inn) as f64 / READS as f64,
        writes as f64 / READS as f64
    ));
    assert_eq!(
        (total(&out), total(&inn)),
        (READS, READS),
        "command and response only"
    );
    assert!(writes >= READS, "the data went by RDMA Write: {writes}");
    assert_eq!(inn.get(&0x25), None, "no Data-In on TCP");
    a.logout().await.unwrap();

    // iSER: one Send each way, the data by RDMA Write.
    let c = &t.fabric.iser_counters;
    let s = IserSession::connect(
        cfg("iser"),
        RdmaConfig {
            backend: Backend::Soft,
            ..RdmaConfig::default()
        },
        iser,
        TARGET,
    )
    .await
    .unwrap();
    let mut r = s.alloc(MIB).unwrap();
    s.read(0, 0, blocks, &mut r).await.unwrap();
    let (sends0, recvs0, writes0) = (
        c.sends.load(Ordering::Relaxed),
        c.receives.load(Ordering::Relaxed),
        c.rdma_writes.load(Ordering::Relaxed),
    );
    for i in 0..READS {
        s.read(0, i * u64::from(blocks), blocks, &mut r)
            .await
            .unwrap();
    }
    let (sends, recvs, writes) = (
        c.sends.load(Ordering::Relaxed) - sends0,
        c.receives.load(Ordering::Relaxed) - recvs0,
        c.rdma_writes.load(Ordering::Relaxed) - writes0,
    );
    table.push(format!(
        "iser:          {:>5.2} Sends to the target, {:>5.2} Sends back, {:.2} RDMA Writes",
        recvs as f64 / READS as f64,
        sends as f64 / READS as f64,
        writes as f64 / READS as f64
    ));
    assert_eq!((recvs, sends), (READS, READS));
    assert!(writes >= READS);
    s.logout().await.unwrap();

    println!("per 1 MiB READ ({READS} READs each):");
    for line in &table {
        println!("  {line}");
    }
}
