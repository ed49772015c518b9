//! The PVFS-over-InfiniBand paper's Fig. 8 shape: 1000 write I/Os over a pool of 1000 initiator buffers, cache size
//! 100, forced buffer reuse 20% and 80%; bandwidth of dynamic, pin-down cache, FMRD and
//! arena registration normalized to a run without registration (every buffer
//! registered up front). A write I/O = the target RDMA-Reads the initiator's buffer.
//!
//! Every I/O's data are checked (a stamp written into the initiator's buffer must arrive
//! in the target's staging buffer), and each strategy's registrations must all be
//! released at the end: one `PASS`/`FAIL` line per strategy and reuse, a summary line.
//!
//! ```text
//! reg_fig8 [SIZE_KIB]                                  # soft provider on 127.0.0.1
//! reg_fig8 --backend verbs --addr 10.77.0.1 [--device rxe0] [SIZE_KIB]   # --features verbs
//! ```
//! The kernel lab runs the verbs form on Soft-RoCE for function (real memory regions
//! registered, invalidated and deregistered by each strategy); its timings come from an
//! emulated CPU and are not a measurement.

use std::net::IpAddr;
use std::process::ExitCode;
use std::time::Instant;

use blockwire_transport::rdma::any::{AnyProvider, Backend};
use blockwire_transport::rdma::*;
use blockwire_transport::reg::*;

const POOL: usize = 1000;
const IOS: usize = 1000;
const CACHE: usize = 100;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The buffer sequence: with probability `reuse` one of the last CACHE buffers used,
/// else the next never-used buffer.
fn sequence(reuse: f64, seed: u64) -> Vec<usize> {
    let mut rng = Rng(seed);
    let mut fresh = 0usize;
    let mut recent: Vec<usize> = Vec::new();
    (0..IOS)
        .map(|_| {
            let r = (rng.next() % 10_000) as f64 / 10_000.0;
            let k = if !recent.is_empty() && (r < reuse || fresh >= POOL) {
                recent[(rng.next() % recent.len() as u64) as usize]
            } else {
                fresh += 1;
                fresh - 1
            };
            recent.retain(|&x| x != k);
            recent.push(k);
            if recent.len() > CACHE {
                recent.remove(0);
            }
            k
        })
        .collect()
}

fn main() -> ExitCode {
    let mut backend = Backend::Soft;
    let mut ip: IpAddr = "127.0.0.1".parse().unwrap();
    let mut device: Option<String> = None;
    let mut kib = 64usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let parsed = match a.as_str() {
            "--backend" => args
                .next()
                .and_then(|b| Backend::parse(&b))
                .map(|b| backend = b),
            "--addr" => args.next().and_then(|v| v.parse().ok()).map(|v| ip = v),
            "--device" => args.next().map(|d| device = Some(d)),
            n => n.parse().ok().map(|v| kib = v),
        };
        if parsed.is_none() {
            eprintln!(
                "usage: reg_fig8 [--backend soft|verbs] [--addr ADDR] [--device DEV] [SIZE_KIB]"
            );
            return ExitCode::from(2);
        }
    }
    let size = kib << 10;
    blockwire_transport::rdma::soft::raise_memlock_limit(1 << 31);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (passed, failed) = rt.block_on(async move {
        let p = match AnyProvider::open(backend, device.as_deref()) {
            Ok(p) => p,
            Err(e) => {
                println!("FAIL open the {} backend: {e}", backend.name());
                return (0, 1);
            }
        };
        // b: the initiator (buffer owner, passive); a: the target (issues RDMA Read).
        let (a, b) = match conformance::pair(&p, std::net::SocketAddr::new(ip, 0)).await {
            Ok(pair) => pair,
            Err(e) => {
                println!("FAIL connect over the {} backend: {e}", backend.name());
                return (0, 1);
            }
        };
        let (a_pd, a_cq, a_qp, b_pd, _b_qp) = (a.pd, a.cq, a.qp, b.pd, b.qp);
        let staging = a_pd.register(AlignedBuf::new(size), AccessFlags::LOCAL_WRITE).unwrap();

        println!(
            "PVFS-over-InfiniBand Fig. 8 shape: {IOS} write I/Os of {kib} KiB over {POOL} buffers, cache {CACHE}, {} backend",
            p.name()
        );
        println!("{:<8} {:<16} {:>9} {:>7} {:>6} {:>6}", "reuse", "strategy", "MB/s", "ratio", "hits", "regs");
        let (mut passed, mut failed) = (0, 0);
        for reuse in [0.2, 0.8] {
            let seq = sequence(reuse, 0x5eed);
            let configs: Vec<(&str, RegConfig)> = vec![
                ("none", RegConfig::PinDownCache { capacity: 2 * POOL }),
                ("dynamic", RegConfig::Dynamic),
                ("pin-down cache", RegConfig::PinDownCache { capacity: CACHE }),
                ("FMRD", RegConfig::Fmrd(FmrdConfig { capacity: CACHE, slots: CACHE + 28, dereg_threshold: 16 })),
                ("arena (ZKMR)", RegConfig::Arena { bytes: POOL * size }),
            ];
            let mut base = 0.0;
            for (name, cfg) in configs {
                let space = IoSpace::new(&b_pd, cfg).unwrap();
                let mut bufs: Vec<_> = (0..POOL).map(|_| space.alloc(size).unwrap()).collect();
                let mut wrong = 0;
                if name == "none" {
                    // Registered up front: the loop below only hits.
                    for b in &bufs {
                        space.register_sg([b], u64::MAX).unwrap().release().unwrap();
                    }
                }
                let before = space.stats();
                let t0 = Instant::now();
                for (i, &k) in seq.iter().enumerate() {
                    let stamp = (i as u64 ^ 0xb10c_3172).to_le_bytes();
                    bufs[k].write_at(0, &stamp).unwrap();
                    let reg = space.register_sg([&bufs[k]], u64::MAX).unwrap();
                    let c = reg.chunks()[0].remote;
                    a_qp.post_send(SendWr {
                        wr_id: i as u64,
                        op: SendOp::RdmaRead { remote_addr: c.addr, rkey: c.rkey },
                        sgl: vec![staging.sge(0, size).unwrap()],
                        signaled: true,
                    })
                    .unwrap();
                    let wc = a_cq.next().await.unwrap();
                    assert!(wc.status.is_ok(), "{wc:?}");
                    reg.release().unwrap();
                    let mut got = [0u8; 8];
                    staging.read_at(0, &mut got).unwrap();
                    if got != stamp {
                        wrong += 1;
                    }
                }
                let mbps = (IOS * size) as f64 / t0.elapsed().as_secs_f64() / 1e6;
                if name == "none" {
                    base = mbps;
                }
                let st = space.stats();
                println!(
                    "{:<8} {:<16} {:>9.0} {:>7.2} {:>6} {:>6}",
                    format!("{:.0}%", reuse * 100.0),
                    name,
                    mbps,
                    mbps / base,
                    st.hits - before.hits,
                    st.registrations - before.registrations
                );
                drop(bufs);
                let left = {
                    space.flush().unwrap();
                    let s = space.stats();
                    s.registrations - s.deregistrations
                };
                drop(space);
                let label = format!("{name} at {:.0}% reuse", reuse * 100.0);
                // "none" and the arena keep their one standing registration each.
                let standing = if name == "none" || name.starts_with("arena") { left <= POOL as u64 } else { left == 0 };
                if wrong == 0 && standing {
                    passed += 1;
                    println!("PASS {label}: {IOS} RDMA Reads carried the stamped data");
                } else {
                    failed += 1;
                    println!("FAIL {label}: {wrong} I/Os with wrong data, {left} registrations left");
                }
            }
        }
        (passed, failed)
    });
    println!("reg-fig8: {passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
