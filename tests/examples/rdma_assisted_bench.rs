//! RDMA-assisted iSCSI vs TCP iSCSI, one run, in-process target
//! with a RAM disk and the soft RDMA provider.
//!
//! (b) per SCSI command at 4 KiB, 64 KiB, 1 MiB: iSCSI PDUs on TCP (counted by a proxy
//!     that parses BHS headers), TCP messages and initiator wakeups (read completions
//!     on the initiator's socket, i.e. receive events the upper layer handles), and
//!     RDMA operations (target counters; the initiator's upper layer sees none).
//! (c) IOPS and MB/s at QD 1 and QD 32, 4 KiB and 64 KiB, read and write.
//!
//! Run: cargo run --release -p blockwire-tests --example rdma_assisted_bench

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use blockwire_initiator::rdma::{AssistedSession, RdmaConfig, RegConfig};
use blockwire_initiator::InitiatorConfig;
use blockwire_target::backstore::RamBackstore;
use blockwire_target::iscsi::{Fabric, FabricSettings};
use blockwire_target::scsi::{LogicalUnit, LuConfig};
use support::bind_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[path = "../tests/support/mod.rs"]
mod support;

const TARGET: &str = "iqn.2026-11.io.blockwire:bench";

#[derive(Default)]
struct Tap {
    /// PDUs initiator -> target, target -> initiator.
    pdus_out: AtomicU64,
    pdus_in: AtomicU64,
    /// read() completions with data on each side of the proxy.
    reads_in: AtomicU64,
    reads_out: AtomicU64,
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    tap: Arc<Tap>,
    inbound: bool,
) {
    let mut buf = vec![0u8; 1 << 20];
    let mut hdr = Vec::new(); // parser state: bytes of the current header
    let mut skip: usize = 0; // bytes of the current PDU still to pass
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if inbound {
            &tap.reads_in
        } else {
            &tap.reads_out
        }
        .fetch_add(1, Ordering::Relaxed);
        let mut i = 0;
        while i < n {
            if skip > 0 {
                let k = skip.min(n - i);
                skip -= k;
                i += k;
                continue;
            }
            let k = (48 - hdr.len()).min(n - i);
            hdr.extend_from_slice(&buf[i..i + k]);
            i += k;
            if hdr.len() == 48 {
                let ahs = hdr[4] as usize * 4;
                let dl = u32::from_be_bytes([0, hdr[5], hdr[6], hdr[7]]) as usize;
                skip = ahs + dl.next_multiple_of(4);
                hdr.clear();
                if inbound { &tap.pdus_in } else { &tap.pdus_out }.fetch_add(1, Ordering::Relaxed);
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

async fn proxy(target: SocketAddr, tap: Arc<Tap>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (c, _) = l.accept().await.unwrap();
            let s = TcpStream::connect(target).await.unwrap();
            c.set_nodelay(true).unwrap();
            s.set_nodelay(true).unwrap();
            let (cr, cw) = c.into_split();
            let (sr, sw) = s.into_split();
            tokio::spawn(pump(cr, sw, tap.clone(), false));
            tokio::spawn(pump(sr, cw, tap.clone(), true));
        }
    });
    addr
}

async fn start() -> (SocketAddr, Arc<Fabric>) {
    let lu = LogicalUnit::new(LuConfig::new(Arc::new(RamBackstore::new(256 << 20))));
    let t = bind_target(TARGET, lu, FabricSettings::default())
        .await
        .serve(true)
        .await;
    // The target serves until the process exits.
    std::mem::forget(t.stop);
    (t.addr, t.fabric)
}

async fn session(portal: SocketAddr, offer: bool, qd: usize, name: &str) -> AssistedSession {
    let cfg = InitiatorConfig::new(format!("iqn.2026-11.io.blockwire:{name}")).with_queue_depth(qd);
    AssistedSession::connect(
        cfg,
        RdmaConfig {
            offer,
            registration: RegConfig::PinDownCache { capacity: 256 },
            inline_threshold: 0,
            ..RdmaConfig::default()
        },
        &portal.to_string(),
        TARGET,
    )
    .await
    .unwrap()
}

fn main() {
    blockwire_transport::rdma::soft::raise_memlock_limit(1 << 31);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (addr, fabric) = start().await;
        let rc = fabric.rdma.get().unwrap().clone();
        println!("(b) per SCSI command (averaged over 50 commands; inline threshold 0)");
        println!(
            "{:<6} {:<6} {:<5} {:>6} {:>9} {:>9} {:>8}",
            "size", "dir", "mode", "PDUs", "TCP msgs", "wakeups", "RDMA ops"
        );
        for size in [4usize << 10, 64 << 10, 1 << 20] {
            for write in [false, true] {
                for offer in [false, true] {
                    let tap = Arc::new(Tap::default());
                    let p = proxy(addr, tap.clone()).await;
                    let s = session(p, offer, 1, "tap").await;
                    let mut b = s.alloc(size).unwrap();
                    let blocks = (size / 512) as u32;
                    // warm up (unit attention, registration)
                    s.read(0, 0, blocks, &mut b).await.unwrap();
                    let snap = |t: &Tap| {
                        [
                            t.pdus_out.load(Ordering::Relaxed) + t.pdus_in.load(Ordering::Relaxed),
                            t.reads_in.load(Ordering::Relaxed)
                                + t.reads_out.load(Ordering::Relaxed),
                            t.reads_in.load(Ordering::Relaxed),
                        ]
                    };
                    let ops0 = rc.counters().rdma_reads.load(Ordering::Relaxed)
                        + rc.counters().rdma_writes.load(Ordering::Relaxed);
                    let a = snap(&tap);
                    let n = 50;
                    for i in 0..n {
                        if write {
                            s.write(0, i * blocks as u64, blocks, &b).await.unwrap();
                        } else {
                            s.read(0, i * blocks as u64, blocks, &mut b).await.unwrap();
                        }
                    }
                    let z = snap(&tap);
                    let ops = rc.counters().rdma_reads.load(Ordering::Relaxed)
                        + rc.counters().rdma_writes.load(Ordering::Relaxed)
                        - ops0;
                    let per = |i: usize| (z[i] - a[i]) as f64 / n as f64;
                    println!(
                        "{:<6} {:<6} {:<5} {:>6.1} {:>9.1} {:>9.1} {:>8.1}",
                        format!("{}K", size >> 10),
                        if write { "write" } else { "read" },
                        if offer { "RDMA" } else { "TCP" },
                        per(0),
                        per(1),
                        per(2),
                        ops as f64 / n as f64
                    );
                    s.logout().await.unwrap();
                }
            }
        }
        println!("\n(c) throughput, direct connection (no proxy), 2 s per point");
        println!(
            "{:<6} {:<6} {:>3} {:>11} {:>11} {:>11} {:>11} {:>6}",
            "size", "dir", "QD", "TCP IOPS", "TCP MB/s", "RDMA IOPS", "RDMA MB/s", "ratio"
        );
        for size in [4usize << 10, 64 << 10] {
            for write in [false, true] {
                for qd in [1usize, 32] {
                    let mut res = Vec::new();
                    for offer in [false, true] {
                        let s = Arc::new(session(addr, offer, qd, "tput").await);
                        let blocks = (size / 512) as u32;
                        let t0 = Instant::now();
                        let done = Arc::new(AtomicU64::new(0));
                        let mut js = tokio::task::JoinSet::new();
                        for w in 0..qd {
                            let s = s.clone();
                            let done = done.clone();
                            js.spawn(async move {
                                let mut b = s.alloc(size).unwrap();
                                let mut i = w as u64;
                                while t0.elapsed().as_secs_f64() < 2.0 {
                                    let lba = (i % 2000) * blocks as u64;
                                    if write {
                                        s.write(0, lba, blocks, &b).await.unwrap();
                                    } else {
                                        s.read(0, lba, blocks, &mut b).await.unwrap();
                                    }
                                    done.fetch_add(1, Ordering::Relaxed);
                                    i += qd as u64;
                                }
                            });
                        }
                        while js.join_next().await.is_some() {}
                        let el = t0.elapsed().as_secs_f64();
                        let iops = done.load(Ordering::Relaxed) as f64 / el;
                        res.push((iops, iops * size as f64 / 1e6));
                        if let Ok(s) = Arc::try_unwrap(s) {
                            s.logout().await.unwrap();
                        }
                    }
                    println!(
                        "{:<6} {:<6} {:>3} {:>11.0} {:>11.1} {:>11.0} {:>11.1} {:>6.2}",
                        format!("{}K", size >> 10),
                        if write { "write" } else { "read" },
                        qd,
                        res[0].0,
                        res[0].1,
                        res[1].0,
                        res[1].1,
                        res[1].0 / res[0].0
                    );
                }
            }
        }
    });
}
