//! The blockwire iSCSI target daemon.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use blockwire_mgmt::config::{LoadOptions, TargetConfig};
use clap::{Parser, Subcommand};

/// blockwire's iSCSI target.
///
/// The configuration is the TOML file `--config` names; without it,
/// /etc/blockwire/target.toml if that file exists; without either, an
/// embedded default: the target iqn.2026-11.io.blockwire:default with one
/// 1 GiB RAM LUN (LUN 0) on 0.0.0.0:3260, open to any initiator (see
/// examples/ in the source tree, or --print-example-config). `--control`
/// opens a runtime control socket; `blockwire-target ctl` talks to it.
/// `--metrics` serves Prometheus metrics.
#[derive(Debug, Parser)]
#[command(
    name = "blockwire-target",
    version,
    about,
    long_about,
    after_long_help = SERVICE_HELP
)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Runtime control socket (JSON-RPC 2.0 over a Unix socket, one JSON
    /// object per line, created owner-only 0600); overrides the
    /// configuration's [control] socket. Without either there is none.
    /// See `blockwire-target ctl --help` for its methods.
    #[arg(long, value_name = "PATH")]
    control: Option<PathBuf>,
    /// Listen address for the embedded default (ADDR:PORT, e.g. 127.0.0.1:3260
    /// or [::]:3260). With --config it replaces the addresses of every portal
    /// group, which is handy for tests on a free port.
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<SocketAddr>,
    /// TOML configuration: portal groups, targets, ACLs, CHAP, LUNs.
    /// Default: /etc/blockwire/target.toml when it exists, else the
    /// embedded default.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Serve Prometheus metrics (text exposition format) over HTTP at
    /// http://ADDR:PORT/metrics: per LUN READ/WRITE commands, bytes and
    /// latency histograms, sessions per target, refused logins by reason,
    /// task management by function and response, data path, copy and RDMA
    /// counters. Overrides the configuration's [metrics] listen; without
    /// either there is no endpoint. It has no authentication: bind it
    /// where only the scraper reaches it (e.g. 127.0.0.1:9450).
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<SocketAddr>,
    /// Check the configuration and exit: report every problem found, and
    /// what a start would create or grow, without touching the disk
    /// (nothing is created, grown or opened for writing). Exit 1 on errors.
    #[arg(long)]
    check: bool,
    /// Print a commented example configuration and exit.
    #[arg(long)]
    print_example_config: bool,
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
    /// The output format is --log-format, not this.
    #[arg(long, default_value = "info", env = "BLOCKWIRE_LOG")]
    log: String,
    /// Log output format on stderr: "text" (human-readable; colours only when
    /// stderr is a terminal) or "json" (one JSON object per line).
    #[arg(
        long,
        value_enum,
        value_name = "FORMAT",
        default_value = "text",
        env = "BLOCKWIRE_LOG_FORMAT"
    )]
    log_format: LogFormat,
}

/// Where the daemon looks for its configuration when `--config` is not given.
const DEFAULT_CONFIG: &str = "/etc/blockwire/target.toml";

const SERVICE_HELP: &str = "\
Running under systemd:
  packaging/blockwire-target.service runs the daemon as a Type=notify
  service: it sends READY=1 to $NOTIFY_SOCKET once every portal accepts
  connections, STOPPING=1 when SIGTERM or SIGINT begins the graceful
  shutdown (initiators are asked to log out, backstores flushed), and
  RELOADING=1 then READY=1 around a SIGHUP (`systemctl reload`), which
  reads the configuration file again and applies the difference live (a
  file that fails a check changes nothing; see docs/control.md).

Files:
  /etc/blockwire/target.toml   the configuration when --config is not given";

/// The configuration file to serve: `given`, else `default` when it
/// exists; None means the embedded default.
fn config_path(given: Option<&Path>, default: &Path) -> Option<PathBuf> {
    match given {
        Some(p) => Some(p.to_owned()),
        None => default.is_file().then(|| default.to_owned()),
    }
}

/// How log events are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Parses `--log` as a tracing filter, refusing a value that is an output
/// format name: EnvFilter would take "json" for a target name and, matching
/// nothing, silently turn logging off.
fn log_filter(spec: &str) -> anyhow::Result<tracing_subscriber::EnvFilter> {
    const FORMATS: [&str; 5] = ["json", "text", "pretty", "compact", "full"];
    if let Some(word) = spec
        .split(',')
        .map(str::trim)
        .find(|d| FORMATS.iter().any(|f| d.eq_ignore_ascii_case(f)))
    {
        anyhow::bail!(
            "--log {spec:?}: {word:?} is an output format, not a log filter; \
             use --log-format {} (--log takes a level or target filter, e.g. \"info\" \
             or \"blockwire_target=debug\")",
            word.to_ascii_lowercase()
        );
    }
    tracing_subscriber::EnvFilter::try_new(spec)
        .with_context(|| format!("--log {spec:?} is not a valid log filter"))
}

/// Installs the global subscriber: `filter`, written to stderr in `format`.
/// Raises the open-file limit to the hard limit: every session is a socket,
/// and the usual soft limit (1024) would refuse connections long before
/// the target runs out of anything else. Logged either way.
fn raise_open_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current >= limit.maximum {
        return;
    }
    let raised = Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => tracing::info!(
            from = limit.current,
            to = limit.maximum,
            "open-file limit raised (one socket per connection)"
        ),
        Err(e) => tracing::warn!(
            limit = limit.current,
            error = %e,
            "cannot raise the open-file limit: at most about that many connections"
        ),
    }
}

fn init_logging(filter: tracing_subscriber::EnvFilter, format: LogFormat) {
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.with_ansi(false).json().init(),
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Calls one method of a running daemon's control socket and prints
    /// its result as JSON (exit 0), or its error (exit 1).
    #[command(after_help = ctl_help())]
    Ctl {
        /// The daemon's control socket (its --control PATH); the default is
        /// where the packaged systemd unit opens it.
        #[arg(long, value_name = "PATH", default_value = blockwire_mgmt::control::DEFAULT_CONTROL_SOCKET)]
        control: PathBuf,
        /// Seconds to wait for the answer (portal.close waits until the
        /// portal's connections are gone).
        #[arg(long, value_name = "SECS", default_value_t = 30)]
        timeout: u64,
        /// For a method that changes the configuration (target.*, lun.add,
        /// lun.remove, lun.resize, acl.*, chap.*, portal.add, portal.remove,
        /// config.reload): check the change and print what it would do,
        /// changing nothing (adds "dry_run": true to the parameters).
        #[arg(long)]
        dry_run: bool,
        /// The method, e.g. lun.stall (see the list below).
        method: String,
        /// Its parameters as one JSON object, e.g.
        /// '{"target": "iqn.2026-11.io.blockwire:default", "lun": 0, "stalled": true}'.
        params: Option<String>,
    },
}

fn ctl_help() -> String {
    format!(
        "Methods:\n{}\n\nExamples:\n  \
         # the packaged service's socket, {socket}\n  \
         blockwire-target ctl lun.stall \\\n    \
         '{{\"target\": \"{target}\", \"lun\": 0, \"stalled\": true}}'\n  \
         # a daemon started with --control /tmp/bw.sock\n  \
         blockwire-target ctl --control /tmp/bw.sock lun.list\n  \
         # what reloading the edited file would change (systemctl reload does it)\n  \
         blockwire-target ctl --dry-run config.reload",
        blockwire_mgmt::control::methods_help(),
        socket = blockwire_mgmt::control::DEFAULT_CONTROL_SOCKET,
        target = blockwire_mgmt::config::DEFAULT_TARGET,
    )
}

/// `blockwire-target ctl`: one call, its result on stdout (exit 0) or its
/// error on stderr (exit 1).
fn ctl(
    control: &Path,
    timeout: u64,
    method: &str,
    params: Option<&str>,
    dry_run: bool,
) -> ExitCode {
    let mut params = match params.map(serde_json::from_str::<serde_json::Value>) {
        None => serde_json::Value::Null,
        Some(Ok(v)) => v,
        Some(Err(e)) => {
            eprintln!("error: the parameters are not JSON ({e}); write them as one object, e.g. '{{\"lun\": 0}}'");
            return ExitCode::FAILURE;
        }
    };
    if dry_run {
        if params.is_null() {
            params = serde_json::json!({});
        }
        let Some(map) = params.as_object_mut() else {
            eprintln!("error: --dry-run adds \"dry_run\": true to the parameters, which must then be one JSON object, e.g. '{{\"lun\": 0}}'");
            return ExitCode::FAILURE;
        };
        map.insert("dry_run".into(), serde_json::Value::Bool(true));
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let call = blockwire_mgmt::control::ctl(
        control,
        method,
        params,
        std::time::Duration::from_secs(timeout),
    );
    match runtime.block_on(call) {
        Ok(result) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&result).unwrap_or_else(|_| result.to_string())
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--check`: parse and validate without side effects; every error on
/// stderr, what a start would change on disk on stdout.
fn check(config: Option<&Path>, listen: Option<SocketAddr>, opts: LoadOptions) -> ExitCode {
    let report = match config {
        Some(path) => TargetConfig::check_file(path, opts),
        None => TargetConfig::check_str(
            "<embedded default>",
            &TargetConfig::embedded_default_text(
                listen.unwrap_or_else(|| "0.0.0.0:3260".parse().expect("valid default address")),
            ),
            opts,
        ),
    };
    for n in &report.notices {
        println!("note: {n}");
    }
    for e in &report.errors {
        eprintln!("error: {e}");
    }
    if report.is_valid() {
        println!("configuration is valid: {} target(s)", report.targets);
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "configuration is not valid: {} problem(s) found",
            report.errors.len()
        );
        ExitCode::FAILURE
    }
}

fn main() -> anyhow::Result<ExitCode> {
    let args = Args::parse();
    if let Some(Command::Ctl {
        control,
        timeout,
        dry_run,
        method,
        params,
    }) = &args.command
    {
        return Ok(ctl(control, *timeout, method, params.as_deref(), *dry_run));
    }
    if args.print_example_config {
        print!("{}", blockwire_mgmt::config::EXAMPLE_CONFIG);
        return Ok(ExitCode::SUCCESS);
    }
    init_logging(log_filter(&args.log)?, args.log_format);
    raise_open_file_limit();
    let opts = LoadOptions {
        no_disk: args.no_disk,
    };
    let config = config_path(args.config.as_deref(), Path::new(DEFAULT_CONFIG));
    if args.config.is_none() {
        if let Some(path) = &config {
            tracing::info!(config = %path.display(), "no --config given: using the default configuration file");
        }
    }
    if args.check {
        return Ok(check(config.as_deref(), args.listen, opts));
    }
    // The daemon keeps the configuration as a document: live changes edit
    // it, SIGHUP reloads it, `ctl config.save` writes it.
    let (file, text) = match &config {
        Some(path) => (
            path.display().to_string(),
            std::fs::read_to_string(path)
                .with_context(|| format!("{}: cannot read the file", path.display()))?,
        ),
        None => (
            "<embedded default>".to_string(),
            TargetConfig::embedded_default_text(
                args.listen
                    .unwrap_or_else(|| "0.0.0.0:3260".parse().expect("valid default address")),
            ),
        ),
    };
    let mut doc =
        blockwire_mgmt::live::parse_doc(&file, &text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let listen_override = args.listen.filter(|_| config.is_some());
    let text = match blockwire_mgmt::live::apply_listen_override(&mut doc, text, listen_override) {
        Some(t) => t,
        None => toml::to_string(&doc).context("applying --listen")?,
    };
    let mut built =
        TargetConfig::from_str_with(&file, &text, opts).map_err(|e| anyhow::anyhow!("{e}"))?;
    let source = blockwire_mgmt::live::Source {
        file: config.clone(),
        listen_override,
    };
    built.settings.no_net = args.no_net;
    if let Some(path) = args.control {
        built.control_socket = Some(path);
    }
    if let Some(addr) = args.metrics {
        built.metrics_listen = Some(addr);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("blockwire")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(blockwire_mgmt::target_daemon::run(built, doc, source, opts))?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctl_calls_the_packaged_units_socket_when_not_told() {
        let Some(Command::Ctl { control, .. }) =
            Args::try_parse_from(["blockwire-target", "ctl", "lun.list"])
                .unwrap()
                .command
        else {
            panic!("ctl parses as ctl");
        };
        assert_eq!(
            control,
            Path::new(blockwire_mgmt::control::DEFAULT_CONTROL_SOCKET)
        );
    }

    #[test]
    fn the_default_configuration_file_is_used_only_when_it_exists() {
        let dir = tempfile::tempdir().unwrap();
        let default = dir.path().join("target.toml");
        let given = dir.path().join("other.toml");
        assert_eq!(config_path(None, &default), None, "embedded default");
        std::fs::write(&default, "").unwrap();
        assert_eq!(config_path(None, &default), Some(default.clone()));
        assert_eq!(
            config_path(Some(&given), &default),
            Some(given.clone()),
            "--config wins"
        );
    }
}
