//! Runs the RDMA conformance suite (`blockwire_transport::rdma::conformance`) against one
//! backend and prints one `PASS`/`FAIL` line per check; exits 1 if any check failed.
//!
//! ```text
//! rdma_conformance soft  [ADDR]    # the soft provider (RDMA over TCP), default 127.0.0.1
//! rdma_conformance verbs ADDR [DEV] # libibverbs + librdmacm on the device owning ADDR
//!                                   # (built with --features verbs), e.g. Soft-RoCE:
//!                                   # rdma link add rxe0 type rxe netdev veth0
//! ```
//!
//! The kernel lab runs it on Soft-RoCE (`interop/kernel/guest-rdma.sh`).

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;

use blockwire_transport::rdma::conformance::{run_all, Outcome};

fn usage() -> ExitCode {
    eprintln!("usage: rdma_conformance soft [ADDR] | rdma_conformance verbs ADDR [DEVICE]");
    ExitCode::from(2)
}

fn report(backend: &str, results: Vec<(&'static str, Outcome)>) -> ExitCode {
    let mut failed = 0;
    for (name, outcome) in &results {
        match outcome {
            Ok(()) => println!("PASS {backend}: {name}"),
            Err(e) => {
                failed += 1;
                println!("FAIL {backend}: {name}: {e}");
            }
        }
    }
    println!(
        "{backend}: {} passed, {failed} failed",
        results.len() - failed
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ip = |s: Option<&String>| -> Option<IpAddr> {
        s.map_or(Some(IpAddr::from([127, 0, 0, 1])), |s| s.parse().ok())
    };
    match args.first().map(String::as_str) {
        Some("soft") => {
            let Some(ip) = ip(args.get(1)) else {
                return usage();
            };
            let p = blockwire_transport::rdma::soft::SoftProvider::default();
            report("soft", run_all(&p, SocketAddr::new(ip, 0)).await)
        }
        Some("verbs") => verbs(args.get(1), args.get(2)).await,
        _ => usage(),
    }
}

#[cfg(feature = "verbs")]
async fn verbs(addr: Option<&String>, device: Option<&String>) -> ExitCode {
    use blockwire_transport::rdma::verbs::VerbsProvider;
    let Some(ip) = addr.and_then(|s| s.parse::<IpAddr>().ok()) else {
        return usage();
    };
    let p = match VerbsProvider::open(device.map(String::as_str)) {
        Ok(p) => p,
        Err(e) => {
            println!("FAIL verbs: open the device: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("verbs device: {}", p.device_name());
    report("verbs", run_all(&p, SocketAddr::new(ip, 0)).await)
}

#[cfg(not(feature = "verbs"))]
async fn verbs(_: Option<&String>, _: Option<&String>) -> ExitCode {
    println!("FAIL verbs: this build has no verbs backend (build with --features verbs)");
    ExitCode::FAILURE
}
