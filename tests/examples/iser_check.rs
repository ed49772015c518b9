//! blockwire's iSER initiator (`IserSession`, RFC 7145) against any iSER target, printing
//! one `PASS`/`FAIL` line per check and a summary (exit 1 on any failure): login with
//! RDMAExtensions=Yes and no digests; 16 MiB of random data written in 1 MiB commands (the
//! target RDMA-Reads them) and read back (it RDMA-Writes them) and compared; the messages
//! a 1 MiB READ costs; the registrations made and released; logout, a new login, and the
//! data still there.
//!
//! ```text
//! iser_check soft|verbs ADDR:PORT TARGET_IQN [DEVICE]   # verbs: --features blockwire-transport/verbs
//! ```
//! The kernel lab runs it over Soft-RoCE against blockwire-target's iSER portal and LIO's
//! `ib_isert` (`interop/kernel/guest-rdma.sh`).

use std::net::SocketAddr;
use std::process::ExitCode;

use blockwire_initiator::iser::IserSession;
use blockwire_initiator::rdma::{RdmaConfig, RegConfig};
use blockwire_initiator::InitiatorConfig;
use blockwire_pdu::keys::Digest;
use blockwire_transport::rdma::any::Backend;
use rand::{Rng, SeedableRng};

const MIB: usize = 1 << 20;
const TOTAL: usize = 16 * MIB;

struct Checks {
    failed: usize,
    passed: usize,
}

impl Checks {
    fn check(&mut self, name: &str, ok: bool, detail: impl std::fmt::Display) {
        if ok {
            self.passed += 1;
            println!("PASS {name}: {detail}");
        } else {
            self.failed += 1;
            println!("FAIL {name}: {detail}");
        }
    }
}

fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill(&mut v[..]);
    v
}

async fn login(
    backend: Backend,
    device: Option<String>,
    portal: SocketAddr,
    target: &str,
) -> Result<IserSession, String> {
    IserSession::connect(
        InitiatorConfig::new("iqn.2026-11.io.blockwire:iser-check").with_queue_depth(16),
        RdmaConfig {
            backend,
            device,
            registration: RegConfig::PinDownCache { capacity: 32 },
            ..RdmaConfig::default()
        },
        portal,
        target,
    )
    .await
    .map_err(|e| e.to_string())
}

/// The LUN's logical block length (READ CAPACITY(16)).
async fn block_size(s: &IserSession) -> Result<usize, String> {
    let cdb = [0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];
    let mut buf = s.alloc(32).map_err(|e| e.to_string())?;
    s.execute(0, &cdb, Some(&mut buf), None)
        .await
        .map_err(|e| format!("READ CAPACITY(16): {e}"))?;
    let v = buf.to_vec();
    Ok(u32::from_be_bytes([v[8], v[9], v[10], v[11]]) as usize)
}

async fn run(
    c: &mut Checks,
    backend: Backend,
    device: Option<String>,
    portal: SocketAddr,
    target: &str,
) {
    let s = match login(backend, device.clone(), portal, target).await {
        Ok(s) => s,
        Err(e) => return c.check("iSER login", false, e),
    };
    let p = s.params();
    c.check(
        "iSER login",
        p.rdma_extensions && p.header_digest == Digest::None && p.data_digest == Digest::None,
        format!(
            "{target} at {portal}: TSIH {}, RDMAExtensions={}, digests {:?}/{:?}, MaxBurstLength {}",
            s.tsih(),
            p.rdma_extensions,
            p.header_digest,
            p.data_digest,
            p.max_burst_length
        ),
    );
    let bs = match block_size(&s).await {
        Ok(b) if b > 0 && MIB % b == 0 => b,
        Ok(b) => return c.check("block size", false, b),
        Err(e) => return c.check("block size", false, e),
    };
    let blocks = (MIB / bs) as u32;
    let mut bad = Vec::new();
    for i in 0..TOTAL / MIB {
        let lba = (i * MIB / bs) as u64;
        let data = random(MIB, i as u64);
        let mut w = s.alloc(MIB).unwrap();
        w.write_at(0, &data).unwrap();
        if let Err(e) = s.write(0, lba, blocks, &w).await {
            bad.push(format!("WRITE at LBA {lba}: {e}"));
            continue;
        }
        let mut r = s.alloc(MIB).unwrap();
        match s.read(0, lba, blocks, &mut r).await {
            Ok(_) if r.to_vec() == data => {}
            Ok(_) => bad.push(format!("READ at LBA {lba}: data differ")),
            Err(e) => bad.push(format!("READ at LBA {lba}: {e}")),
        }
    }
    c.check(
        "16 MiB written by RDMA Read, read back by RDMA Write, compared",
        bad.is_empty(),
        if bad.is_empty() {
            format!("{} commands", 2 * TOTAL / MIB)
        } else {
            bad.join("; ")
        },
    );
    let before = s.stats();
    let mut r = s.alloc(MIB).unwrap();
    let mut failed = None;
    for i in 0..8 {
        if let Err(e) = s.read(0, (i * MIB / bs) as u64, blocks, &mut r).await {
            failed = Some(e.to_string());
        }
    }
    let after = s.stats();
    let (sends, receives) = (after.sends - before.sends, after.receives - before.receives);
    c.check(
        "messages per 1 MiB READ",
        failed.is_none() && sends == 8 && receives == 8,
        format!(
            "{} Send(s) and {} receive(s) per READ (8 READs){}",
            sends as f64 / 8.0,
            receives as f64 / 8.0,
            failed.map(|e| format!(", error: {e}")).unwrap_or_default()
        ),
    );
    let reg = s.registration_stats();
    println!("registrations: {reg:?}");
    if let Err(e) = s.logout().await {
        return c.check("logout", false, e);
    }
    c.check("logout", true, "answered");
    let s = match login(backend, device, portal, target).await {
        Ok(s) => s,
        Err(e) => return c.check("login again", false, e),
    };
    let mut r = s.alloc(MIB).unwrap();
    let again = s.read(0, 0, blocks, &mut r).await;
    c.check(
        "login again: the first 1 MiB reads back",
        again.is_ok() && r.to_vec() == random(MIB, 0),
        format!("TSIH {}", s.tsih()),
    );
    let _ = s.logout().await;
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let backend = args.first().and_then(|b| Backend::parse(b));
    let portal = args.get(1).and_then(|a| a.parse::<SocketAddr>().ok());
    let (Some(backend), Some(portal), Some(target)) = (backend, portal, args.get(2)) else {
        eprintln!("usage: iser_check soft|verbs ADDR:PORT TARGET_IQN [DEVICE]");
        return ExitCode::from(2);
    };
    let device = args.get(3).cloned();
    // Protocol events on stderr when RUST_LOG asks (e.g. blockwire_initiator=debug).
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .try_init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut c = Checks {
        failed: 0,
        passed: 0,
    };
    rt.block_on(run(&mut c, backend, device, portal, target));
    println!("iser-initiator: {} passed, {} failed", c.passed, c.failed);
    if c.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
