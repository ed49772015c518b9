//! The blockwire iSCSI target daemon.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use blockwire_mgmt::config::{LoadOptions, TargetConfig};
use clap::Parser;

/// blockwire's iSCSI target.
///
/// With no arguments it serves an embedded default: the target
/// iqn.2026-11.io.blockwire:default with one 1 GiB RAM LUN (LUN 0) on
/// 0.0.0.0:3260, open to any initiator. `--config` serves what a TOML file
/// describes instead (see examples/ in the source tree).
#[derive(Debug, Parser)]
#[command(name = "blockwire-target", version, about, long_about)]
struct Args {
    /// Listen address for the embedded default (ADDR:PORT, e.g. 127.0.0.1:3260
    /// or [::]:3260). With --config it replaces the addresses of every portal
    /// group, which is handy for tests on a free port.
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<SocketAddr>,
    /// TOML configuration: portal groups, targets, ACLs, CHAP, LUNs.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Check the configuration and exit.
    #[arg(long)]
    check: bool,
    /// BENCHMARK ONLY: READs read their data but send none (each ends GOOD
    /// with a residual underflow of its whole length), to measure the disk
    /// side alone. Initiators get no data.
    #[arg(long)]
    no_net: bool,
    /// BENCHMARK ONLY: every LUN serves pattern data (a function of the
    /// byte offset) without backstore I/O and drops every WRITE, to measure
    /// the network side alone. No backstore file is opened or created.
    #[arg(long)]
    no_disk: bool,
    /// Log filter (tracing EnvFilter syntax), e.g. "info" or "blockwire_target=debug".
    #[arg(long, default_value = "info", env = "BLOCKWIRE_LOG")]
    log: String,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&args.log).context("--log")?)
        .with_writer(std::io::stderr)
        .init();
    let opts = LoadOptions {
        no_disk: args.no_disk,
    };
    let mut built = match &args.config {
        Some(path) => TargetConfig::load_with(path, opts).map_err(|e| anyhow::anyhow!("{e}"))?,
        None => TargetConfig::embedded_default_with(
            args.listen
                .unwrap_or_else(|| "0.0.0.0:3260".parse().expect("valid default address")),
            opts,
        ),
    };
    if let (Some(listen), Some(_)) = (args.listen, &args.config) {
        let catalog = std::sync::Arc::get_mut(&mut built.catalog).expect("catalog not shared yet");
        for group in &mut catalog.portal_groups {
            group.addresses = vec![listen];
        }
    }
    built.settings.no_net = args.no_net;
    if args.check {
        println!(
            "configuration is valid: {} target(s)",
            built.catalog.targets.len()
        );
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("blockwire")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(blockwire_mgmt::target_daemon::run(built))
}
