//! An iSER target for the kernel lab: one target, `iqn.2026-11.io.blockwire:iser`, with a
//! RAM LUN 0 of SIZE MiB, reachable at ADDR:3260 both over TCP (SendTargets discovery,
//! plain iSCSI) and over iSER (an RDMA CM listener on the same address, RFC 7145), the RDMA
//! provider being BACKEND. Prints `iSER portal ADDR:3260` once both accept, serves until
//! SIGTERM.
//!
//! ```text
//! iser_target verbs 10.77.0.1 512 [DEVICE]   # built with --features blockwire-transport/verbs
//! ```
//! `interop/kernel/guest-rdma.sh` logs Linux's iSER initiator (ib_iser) in to it.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use blockwire_target::backstore::RamBackstore;
use blockwire_target::iscsi::catalog::{Acl, Catalog};
use blockwire_target::iscsi::portal::Portal;
use blockwire_target::iscsi::{Fabric, FabricSettings};
use blockwire_target::scsi::{LogicalUnit, LuConfig};
use blockwire_transport::rdma::any::Backend;

const TARGET: &str = "iqn.2026-11.io.blockwire:iser";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let backend = args.first().and_then(|b| Backend::parse(b));
    let ip = args.get(1).and_then(|a| a.parse::<IpAddr>().ok());
    let size_mib = args.get(2).and_then(|s| s.parse::<u64>().ok());
    let (Some(backend), Some(ip), Some(size_mib)) = (backend, ip, size_mib) else {
        eprintln!("usage: iser_target soft|verbs ADDR SIZE_MIB [DEVICE]");
        return std::process::ExitCode::from(2);
    };
    tracing_subscriber_init();
    let addr = SocketAddr::new(ip, 3260);
    let lu = LogicalUnit::new(LuConfig::new(Arc::new(RamBackstore::new(size_mib << 20))));
    let catalog = Catalog::one_target(TARGET, addr, Acl::Any, Arc::new(lu));
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    let fabric = Fabric::new(Arc::new(catalog), FabricSettings::default(), shutdown);
    let portal = match Portal::bind(addr, 1).await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("TCP portal {addr}: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match blockwire_target::iscsi::iser::start(
        fabric.clone(),
        addr,
        backend,
        args.get(3).map(String::as_str),
        1,
    )
    .await
    {
        Ok(bound) => println!("iSER portal {bound}"),
        Err(e) => {
            eprintln!("iSER portal {addr}: {e}");
            return std::process::ExitCode::FAILURE;
        }
    }
    tokio::spawn(portal.run(fabric));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    term.recv().await;
    std::process::ExitCode::SUCCESS
}

/// Logs to stderr at info (RUST_LOG overrides).
fn tracing_subscriber_init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
