//! RDMA-assisted iSCSI end to end on one RDMA backend, printing one `PASS`/`FAIL` line per
//! check (exit 1 on any failure): an in-process target with a RAM LUN whose offload
//! listener runs BACKEND on ADDR, and blockwire's initiator (`AssistedSession`) asking for
//! the same backend. 32 MiB of random data go out by RDMA Read and come back by RDMA Write
//! in 1 MiB commands and are compared; the target's and the initiator's counters must show
//! the offload and no failed transfer. Then an initiator asking for the other backend is
//! answered plain iSCSI and its data still verify.
//!
//! ```text
//! rdma_assisted_check soft  127.0.0.1
//! rdma_assisted_check verbs 10.77.0.1 [rxe0]   # built with --features verbs
//! ```
//! The kernel lab runs the verbs form on Soft-RoCE (`interop/kernel/guest-rdma.sh`).

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use blockwire_initiator::rdma::{AssistedSession, Mode, RdmaConfig};
use blockwire_initiator::InitiatorConfig;
use blockwire_target::backstore::RamBackstore;
use blockwire_target::iscsi::FabricSettings;
use blockwire_target::scsi::{LogicalUnit, LuConfig};
use blockwire_transport::rdma::any::Backend;
use support::{bind_target, pattern};

#[path = "../tests/support/mod.rs"]
mod support;

const TARGET: &str = "iqn.2026-11.io.blockwire:rdma-check";
const MIB: usize = 1 << 20;

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

async fn session(
    portal: SocketAddr,
    backend: Backend,
    device: Option<String>,
    name: &str,
) -> AssistedSession {
    let cfg = InitiatorConfig::new(format!("iqn.2026-11.io.blockwire:{name}")).with_queue_depth(8);
    AssistedSession::connect(
        cfg,
        RdmaConfig {
            backend,
            device,
            inline_threshold: 0,
            ..RdmaConfig::default()
        },
        &portal.to_string(),
        TARGET,
    )
    .await
    .expect("iSCSI login")
}

/// Writes then reads back `total` bytes in 1 MiB commands; the number of mismatching
/// commands.
async fn write_read_verify(s: &AssistedSession, total: usize, seed: u64) -> Result<usize, String> {
    let mut bad = 0;
    for (i, at) in (0..total).step_by(MIB).enumerate() {
        let data = pattern(MIB, seed + i as u64);
        let lba = (at / 512) as u64;
        let mut w = s.alloc(MIB).map_err(|e| e.to_string())?;
        w.write_at(0, &data).map_err(|e| e.to_string())?;
        // A completion is GOOD; anything else is an error.
        s.write(0, lba, (MIB / 512) as u32, &w)
            .await
            .map_err(|e| format!("WRITE at LBA {lba}: {e}"))?;
        let mut r = s.alloc(MIB).map_err(|e| e.to_string())?;
        s.read(0, lba, (MIB / 512) as u32, &mut r)
            .await
            .map_err(|e| format!("READ at LBA {lba}: {e}"))?;
        if r.to_vec() != data {
            bad += 1;
        }
    }
    Ok(bad)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let backend = args.first().and_then(|b| Backend::parse(b));
    let ip = args.get(1).and_then(|a| a.parse::<IpAddr>().ok());
    let (Some(backend), Some(ip)) = (backend, ip) else {
        eprintln!("usage: rdma_assisted_check soft|verbs ADDR [DEVICE]");
        return ExitCode::from(2);
    };
    let device = args.get(2).cloned();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut c = Checks {
        failed: 0,
        passed: 0,
    };
    rt.block_on(async {
        let lu = LogicalUnit::new(LuConfig::new(Arc::new(RamBackstore::new(64 << 20))));
        let bound = bind_target(TARGET, lu, FabricSettings::default()).await;
        let fabric = bound.fabric.clone();
        match fabric
            .start_rdma_on(SocketAddr::new(ip, 0), backend, device.as_deref())
            .await
        {
            Ok(ep) => c.check(
                "target offload listener",
                true,
                format!("{} on {ep}", backend.name()),
            ),
            Err(e) => {
                c.check("target offload listener", false, e);
                return;
            }
        }
        let t = bound.serve(false).await;
        let s = session(t.addr, backend, device.clone(), "same-backend").await;
        let mode = s.mode().await;
        let grant = s.grant().map(|g| g.backend.clone());
        c.check(
            "session offloaded",
            mode == Mode::Offloaded && grant.as_deref() == Some(backend.name()),
            format!("mode {mode:?}, granted backend {grant:?}"),
        );
        let total = 32 * MIB;
        match write_read_verify(&s, total, 1).await {
            Ok(bad) => c.check(
                "32 MiB written and read back by RDMA",
                bad == 0,
                format!("{bad} of {} 1 MiB commands differ", total / MIB),
            ),
            Err(e) => c.check("32 MiB written and read back by RDMA", false, e),
        }
        let st = s.stats();
        let n = (total / MIB) as u64;
        c.check(
            "initiator counted the offload",
            st.offloaded_writes == n && st.offloaded_reads == n && st.failed_transfers == 0,
            format!(
                "{} offloaded writes, {} offloaded reads, {} plain, {} failed",
                st.offloaded_writes, st.offloaded_reads, st.plain_commands, st.failed_transfers
            ),
        );
        let svc = fabric.rdma.get().expect("listener started");
        let k = svc.counters();
        let (reads, writes, failed) = (
            k.rdma_reads.load(Ordering::Relaxed),
            k.rdma_writes.load(Ordering::Relaxed),
            k.failed_transfers.load(Ordering::Relaxed),
        );
        c.check(
            "target moved the data by RDMA Read and RDMA Write",
            reads >= n && writes >= n && failed == 0,
            format!("{reads} RDMA Reads, {writes} RDMA Writes, {failed} failed transfers"),
        );
        // An initiator asking for the other backend: plain iSCSI, same data.
        let other = match backend {
            Backend::Soft => Backend::Verbs,
            Backend::Verbs => Backend::Soft,
        };
        let p = session(t.addr, other, None, "other-backend").await;
        let mode = p.mode().await;
        c.check(
            "an initiator asking for another backend gets plain iSCSI",
            mode == Mode::Plain,
            format!("asked {}, mode {mode:?}", other.name()),
        );
        match write_read_verify(&p, 4 * MIB, 100).await {
            Ok(bad) => c.check(
                "plain-iSCSI fallback data verify",
                bad == 0,
                format!("{bad} of 4 commands differ"),
            ),
            Err(e) => c.check("plain-iSCSI fallback data verify", false, e),
        }
        let _ = t.stop.send(true);
    });
    println!(
        "rdma-assisted {}: {} passed, {} failed",
        backend.name(),
        c.passed,
        c.failed
    );
    if c.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
