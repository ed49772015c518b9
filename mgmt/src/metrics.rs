//! Prometheus metrics: the fabric's counters in the text exposition format
//! (version 0.0.4), served over HTTP at `/metrics` on the address
//! `[metrics] listen` or `--metrics` names. Off unless asked for.
//!
//! Everything is read at scrape time from counters the data path already
//! keeps with relaxed atomics (per logical unit and per initiator READ/WRITE statistics, the
//! copy counters, the engine path's state timers, the double-buffered
//! write path, RDMA) or from rare-event counters (refused logins, task
//! management); a scrape costs the data path nothing.
//!
//! The HTTP side is the minimum a scraper needs: one GET per connection,
//! answered and closed. The endpoint has no authentication; bind it to an
//! address only the scraper reaches.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use blockwire_target::backstore::Space;
use blockwire_target::copies::{self, CopyPath};
use blockwire_target::datapath::stats::PHASES;
use blockwire_target::iscsi::Fabric;
use blockwire_target::scsi::stats::{Direction, IoStats, LatencyHistogram, LATENCY_BUCKETS};
use blockwire_target::scsi::LogicalUnit;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tracing::{debug, info};

/// The Content-Type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A text exposition being written: families in order, each with its
/// `# HELP` and `# TYPE` lines before its samples.
struct Exposition {
    out: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    /// One unlabelled counter family per (name, help, value).
    fn counters(&mut self, families: &[(&str, &str, &AtomicU64)]) {
        for (name, help, v) in families {
            self.family(name, "counter", help);
            self.sample(name, &[], v.load(Ordering::Relaxed));
        }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let v = v
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                let _ = write!(self.out, "{k}=\"{v}\"");
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }
}

/// Seconds as the exposition writes floats.
fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// A label value from an RFC 7143 name: lower case, words joined by `_`.
fn label_word(name: &str) -> String {
    name.chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == ' ' || *c == '-')
        .map(|c| {
            if c == ' ' || c == '-' {
                '_'
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect()
}

/// The fabric's metrics in the text exposition format.
pub fn render(fabric: &Fabric) -> String {
    let mut e = Exposition { out: String::new() };
    lun_metrics(&mut e, fabric);
    initiator_metrics(&mut e, fabric);
    session_metrics(&mut e, fabric);
    event_metrics(&mut e);
    copy_metrics(&mut e);
    engine_metrics(&mut e, fabric);
    rdma_metrics(&mut e, fabric);
    iser_metrics(&mut e, fabric);
    ram_metrics(&mut e);
    e.out
}

/// The fabric's metrics and those of the iSNS registration, if any.
pub fn render_all(fabric: &Fabric, isns: Option<&crate::isns::Client>) -> String {
    let mut out = render(fabric);
    if let Some(client) = isns {
        let mut e = Exposition { out: String::new() };
        isns_metrics(&mut e, client);
        out.push_str(&e.out);
    }
    out
}

/// Where the iSNS registration stands (`[isns]`).
fn isns_metrics(e: &mut Exposition, client: &crate::isns::Client) {
    let s = client.status();
    let labels = [("server", client.server()), ("entity", client.entity())];
    let name = "blockwire_isns_registered";
    e.family(
        name,
        "gauge",
        "1 while the iSNS server holds the registration ([isns]; isns.status says more).",
    );
    let registered = s.state == crate::isns::registrar::State::Registered;
    e.sample(name, &labels, u8::from(registered));
    for (name, help, v) in [
        (
            "blockwire_isns_registrations_total",
            "Registrations the iSNS server accepted (the first, each change, each re-registration).",
            s.registrations,
        ),
        (
            "blockwire_isns_refreshes_total",
            "Refreshes of the registration the iSNS server answered.",
            s.refreshes,
        ),
        (
            "blockwire_isns_failures_total",
            "Attempts that failed: no connection, no answer, an error status, a broken connection.",
            s.failures,
        ),
    ] {
        e.family(name, "counter", help);
        e.sample(name, &labels, v);
    }
}

/// What the RAM LUNs hold against `[fabric] ram_limit`.
fn ram_metrics(e: &mut Exposition) {
    let budget = blockwire_target::backstore::ram_budget::RamBudget::process();
    let name = "blockwire_ram_bytes";
    e.family(
        name,
        "gauge",
        "Memory the RAM LUNs hold now (1 MiB per chunk written since it was last freed).",
    );
    e.sample(name, &[], budget.held());
    let name = "blockwire_ram_limit_bytes";
    e.family(
        name,
        "gauge",
        "Memory the RAM LUNs may hold together ([fabric] ram_limit); writes that need more \
         are answered SPACE ALLOCATION FAILED.",
    );
    e.sample(name, &[], budget.limit());
}

/// One set of READ/WRITE counters and the labels that name it.
type IoRow = (Vec<(&'static str, String)>, Arc<IoStats>);

/// Every LUN of every target: its labels and counters.
fn luns(fabric: &Fabric) -> Vec<IoRow> {
    let mut out = Vec::new();
    for t in &fabric.catalog().targets {
        for (id, lu) in t.luns.units() {
            let labels = vec![("target", t.name.clone()), ("lun", id.to_string())];
            out.push((labels, lu.stats().clone()));
        }
    }
    out
}

fn lun_metrics(e: &mut Exposition, fabric: &Fabric) {
    io_metrics(e, "blockwire_lun", "the logical unit", "", &luns(fabric));
    qos_metrics(e, fabric);
    space_metrics(e, fabric);
    protection_metrics(e, fabric);
}

/// Each protected LUN's failed protection information checks: blocks that
/// did not match their tuples when read or were sent with tuples that did
/// not match them.
fn protection_metrics(e: &mut Exposition, fabric: &Fabric) {
    let name = "blockwire_lun_protection_check_failures_total";
    e.family(
        name,
        "counter",
        "Protection information checks that failed on the LUN (protection = \"type1\"): guard \
         (the block does not match its CRC: changed or damaged where it is kept, or sent so), \
         reference_tag (a block that belongs at another LBA). No series: no protection.",
    );
    let catalog = fabric.catalog();
    for t in &catalog.targets {
        for (id, lu) in t.luns.units() {
            if !lu.protected() {
                continue;
            }
            let f = lu.pi_check_failures();
            let lun = id.to_string();
            for (check, v) in [("guard", f.guard), ("reference_tag", f.reference)] {
                e.sample(
                    name,
                    &[("target", &t.name), ("lun", &lun), ("check", check)],
                    v,
                );
            }
        }
    }
}

/// Each thin LUN's space (stores that allocate as they are written: sparse
/// files, RAM) and its low-space threshold, if it has one.
fn space_metrics(e: &mut Exposition, fabric: &Fabric) {
    let catalog = fabric.catalog();
    let mut rows = Vec::new();
    for t in &catalog.targets {
        for (id, lu) in t.luns.units() {
            // A store that cannot say now (an I/O error) has no sample.
            let Ok(Some(space)) = lu.space() else {
                continue;
            };
            rows.push((
                t.name.as_str(),
                id.to_string(),
                space,
                lu.low_space_threshold(),
            ));
        }
    }
    type Pick = fn(&Space, Option<u64>) -> Option<u64>;
    let families: [(&str, &str, Pick); 3] = [
        (
            "blockwire_lun_space_used_bytes",
            "Bytes the thin LUN's store holds (a sparse file's allocated blocks, a RAM LUN's chunks).",
            |space, _| Some(space.used),
        ),
        (
            "blockwire_lun_space_available_bytes",
            "Bytes the thin LUN's writes may still allocate: the free space of its file system, or \
             what ram_limit still allows the RAM LUNs (other files and LUNs draw on it too).",
            |space, _| Some(space.available),
        ),
        (
            "blockwire_lun_low_space_threshold_bytes",
            "The LUN's low_space_threshold: below it initiators hear THIN PROVISIONING SOFT \
             THRESHOLD REACHED; no series: none.",
            |_, threshold| threshold,
        ),
    ];
    for (name, help, pick) in families {
        e.family(name, "gauge", help);
        for (target, lun, space, threshold) in &rows {
            if let Some(v) = pick(space, *threshold) {
                e.sample(name, &[("target", target), ("lun", lun)], v);
            }
        }
    }
}

/// Each LUN's QoS ceilings (LUNs with any) and what they held back.
fn qos_metrics(e: &mut Exposition, fabric: &Fabric) {
    type Pick = fn(&LogicalUnit) -> Option<f64>;
    let families: [(&str, &str, &str, Pick); 7] = [
        (
            "blockwire_lun_qos_iops_limit",
            "gauge",
            "The LUN's ceiling on media commands per second (iops_limit); no series: none.",
            |lu| lu.qos().limits().iops.map(|v| v as f64),
        ),
        (
            "blockwire_lun_qos_bandwidth_limit_bytes",
            "gauge",
            "The LUN's ceiling on READ and WRITE bytes per second (bandwidth_limit); no series: none.",
            |lu| lu.qos().limits().bytes_per_sec.map(|v| v as f64),
        ),
        (
            "blockwire_lun_qos_initiator_iops_limit",
            "gauge",
            "The LUN's ceiling on each initiator's media commands per second (initiator_iops_limit); no series: none.",
            |lu| lu.qos().limits().initiator_iops.map(|v| v as f64),
        ),
        (
            "blockwire_lun_qos_initiator_bandwidth_limit_bytes",
            "gauge",
            "The LUN's ceiling on each initiator's READ and WRITE bytes per second (initiator_bandwidth_limit); no series: none.",
            |lu| lu.qos().limits().initiator_bytes_per_sec.map(|v| v as f64),
        ),
        (
            "blockwire_lun_qos_delayed_commands_total",
            "counter",
            "Media commands the LUN's QoS ceilings made wait before they started.",
            |lu| Some(lu.qos().counters().delayed as f64),
        ),
        (
            "blockwire_lun_qos_delay_seconds_total",
            "counter",
            "The waits the LUN's QoS ceilings gave media commands, summed.",
            |lu| Some(lu.qos().counters().delay_ns as f64 / 1e9),
        ),
        (
            "blockwire_lun_qos_waiting_commands",
            "gauge",
            "Media commands waiting for their turn under the LUN's QoS ceilings now.",
            |lu| Some(lu.qos().counters().waiting as f64),
        ),
    ];
    let catalog = fabric.catalog();
    let units: Vec<(&str, String, Arc<LogicalUnit>)> = catalog
        .targets
        .iter()
        .flat_map(|t| {
            t.luns
                .units()
                .into_iter()
                .map(move |(id, lu)| (t.name.as_str(), id.to_string(), lu))
        })
        .collect();
    for (name, kind, help, pick) in families {
        e.family(name, kind, help);
        for (target, lun, lu) in &units {
            if let Some(v) = pick(lu) {
                e.sample(name, &[("target", target), ("lun", lun)], v);
            }
        }
    }
}

/// Per host: each initiator's sessions with each target (its paths), and its
/// READ/WRITE families over all its LUNs and sessions there.
fn initiator_metrics(e: &mut Exposition, fabric: &Fabric) {
    let listed = fabric.sessions.initiators();
    let name = "blockwire_initiator_sessions";
    e.family(
        name,
        "gauge",
        "Sessions the initiator has with the target now: one per path of a multipath host, \
         so a drop says a path went.",
    );
    for i in &listed {
        let labels = [("target", &*i.target), ("initiator", &*i.initiator)];
        e.sample(name, &labels, i.sessions);
    }
    let rows: Vec<IoRow> = listed
        .into_iter()
        .map(|i| {
            let labels = vec![("target", i.target), ("initiator", i.initiator)];
            (labels, i.io)
        })
        .collect();
    io_metrics(
        e,
        "blockwire_initiator",
        "the initiator on the target, over all its LUNs and sessions there",
        " The series of an initiator are there while it has a session with the target, and \
         count from 0 when it logs in again after all its sessions had gone.",
        &rows,
    );
    initiator_qos_metrics(e, &rows);
}

/// Per host: what the QoS ceilings of its target's LUNs held it back,
/// at the LUNs' ceilings and at each initiator's own (so an admin sees
/// which host a ceiling slows, and by how much).
fn initiator_qos_metrics(e: &mut Exposition, rows: &[IoRow]) {
    type Pick = fn(&IoStats) -> f64;
    let families: [(&str, &str, Pick); 2] = [
        (
            "blockwire_initiator_qos_delayed_commands_total",
            "Media commands of the initiator that QoS ceilings (a LUN's, or each initiator's \
             there) made wait before they started, over all its LUNs and sessions on the target.",
            |io| io.qos.delayed() as f64,
        ),
        (
            "blockwire_initiator_qos_delay_seconds_total",
            "The waits QoS ceilings gave the initiator's media commands, summed, over all its \
             LUNs and sessions on the target.",
            |io| io.qos.delay().as_nanos() as f64 / 1e9,
        ),
    ];
    for (name, help, pick) in families {
        e.family(name, "counter", help);
        for (labels, io) in rows {
            let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
            e.sample(name, &labels, pick(io));
        }
    }
}

/// The READ/WRITE families `PREFIX_commands_total`, `PREFIX_command_errors_total`,
/// `PREFIX_bytes_total` and the `PREFIX_command_duration_seconds` histogram, one series
/// per row and direction (`op`), for the commands `whose` says.
fn io_metrics(e: &mut Exposition, prefix: &str, whose: &str, note: &str, rows: &[IoRow]) {
    type Pick = fn(&blockwire_target::scsi::stats::DirectionStats) -> u64;
    let counters: [(&str, &str, Pick); 3] = [
        (
            "commands_total",
            "READ and WRITE commands finished (GOOD or not)",
            |s| s.commands.load(Ordering::Relaxed),
        ),
        (
            "command_errors_total",
            "READ and WRITE commands that did not end GOOD",
            |s| s.errors.load(Ordering::Relaxed),
        ),
        (
            "bytes_total",
            "Data bytes READ and WRITE commands moved",
            |s| s.bytes.load(Ordering::Relaxed),
        ),
    ];
    // One sample: the row's labels, then `more`.
    let sample = |e: &mut Exposition,
                  name: &str,
                  row: &[(&'static str, String)],
                  more: &[(&str, &str)],
                  value: &dyn std::fmt::Display| {
        let labels: Vec<(&str, &str)> = row
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .chain(more.iter().copied())
            .collect();
        e.sample(name, &labels, value);
    };
    for (suffix, help, pick) in counters {
        let name = format!("{prefix}_{suffix}");
        e.family(&name, "counter", &format!("{help} for {whose}.{note}"));
        for (labels, stats) in rows {
            for d in Direction::ALL {
                let op = [("op", d.name())];
                sample(e, &name, labels, &op, &pick(stats.direction(d)));
            }
        }
    }
    let name = format!("{prefix}_command_duration_seconds");
    e.family(
        &name,
        "histogram",
        &format!(
            "Time from a READ or WRITE reaching the SCSI core until the logical unit was done \
             with it, for {whose}: the backstore I/O for commands the core executes, the last \
             chunk write for double-buffered WRITEs, the last Data-In and status queued for \
             READs sent by sendfile or the I/O engine.{note}"
        ),
    );
    let bounds: Vec<String> = (0..LATENCY_BUCKETS)
        .map(|i| seconds(LatencyHistogram::bound(i)).to_string())
        .collect();
    for (labels, stats) in rows {
        for d in Direction::ALL {
            let h = &stats.direction(d).latency;
            let cumulative = h.cumulative();
            let bucket = format!("{name}_bucket");
            let op = d.name();
            for (i, le) in bounds.iter().enumerate() {
                sample(
                    e,
                    &bucket,
                    labels,
                    &[("op", op), ("le", le)],
                    &cumulative[i],
                );
            }
            let total = cumulative[LATENCY_BUCKETS];
            sample(e, &bucket, labels, &[("op", op), ("le", "+Inf")], &total);
            let sum = seconds(h.sum());
            sample(e, &format!("{name}_sum"), labels, &[("op", op)], &sum);
            sample(e, &format!("{name}_count"), labels, &[("op", op)], &total);
        }
    }
}

fn session_metrics(e: &mut Exposition, fabric: &Fabric) {
    let sessions = fabric.sessions.all();
    let name = "blockwire_target_sessions";
    e.family(
        name,
        "gauge",
        "Normal sessions logged in to the target now.",
    );
    for t in &fabric.catalog().targets {
        let n = sessions
            .iter()
            .filter(|s| s.target.as_ref().is_some_and(|st| st.name == t.name))
            .count();
        e.sample(name, &[("target", &t.name)], n);
    }
    let name = "blockwire_discovery_sessions";
    e.family(name, "gauge", "Discovery sessions logged in now.");
    e.sample(
        name,
        &[],
        sessions.iter().filter(|s| s.target.is_none()).count(),
    );
    if let Some(threads) = &fabric.connection_threads {
        let name = "blockwire_connection_thread_connections";
        e.family(
            name,
            "gauge",
            "iSCSI connections running on each connection thread now ([fabric] connection_threads).",
        );
        for (i, n) in threads.connections().into_iter().enumerate() {
            e.sample(name, &[("thread", &i.to_string())], n);
        }
    }
}

fn event_metrics(e: &mut Exposition) {
    let name = "blockwire_login_failures_total";
    e.family(
        name,
        "counter",
        "Logins the target refused, by the RFC 7143 status it answered.",
    );
    for (status, n) in blockwire_target::events::login_failures() {
        let reason = label_word(status.name());
        e.sample(name, &[("reason", &reason)], n);
    }
    let name = "blockwire_task_management_total";
    e.family(
        name,
        "counter",
        "Task management functions answered, by function and response.",
    );
    for (function, response, n) in blockwire_target::events::task_management_counts() {
        let f = label_word(function.name());
        let r = label_word(response.name());
        e.sample(name, &[("function", &f), ("response", &r)], n);
    }
}

fn copy_metrics(e: &mut Exposition) {
    let totals: Vec<_> = CopyPath::ALL
        .iter()
        .map(|&p| (p.name(), copies::totals(p)))
        .collect();
    let name = "blockwire_read_path_commands_total";
    e.family(
        name,
        "counter",
        "READ commands finished, by the data path their payload took.",
    );
    for (path, c) in &totals {
        e.sample(name, &[("path", path)], c.commands);
    }
    let name = "blockwire_read_path_payload_bytes_total";
    e.family(
        name,
        "counter",
        "Data-In payload bytes of finished READs, by data path.",
    );
    for (path, c) in &totals {
        e.sample(name, &[("path", path)], c.payload);
    }
    let name = "blockwire_read_path_copy_bytes_total";
    e.family(
        name,
        "counter",
        "READ payload bytes by how they were moved or copied: user_copied (memcpy in blockwire), \
         read_to_user (page cache to a user buffer), sent_from_user (copying send), sendfile, \
         zc_sent (MSG_ZEROCOPY), and of those zc_copied (the kernel copied anyway) and zc_zero.",
    );
    for (path, c) in &totals {
        for (kind, v) in [
            ("user_copied", c.user_copied),
            ("read_to_user", c.read_to_user),
            ("sent_from_user", c.sent_from_user),
            ("sendfile", c.sendfile),
            ("zc_sent", c.zc_sent),
            ("zc_copied", c.zc_copied),
            ("zc_zero", c.zc_zero),
        ] {
            e.sample(name, &[("path", path), ("kind", kind)], v);
        }
    }
}

fn engine_metrics(e: &mut Exposition, fabric: &Fabric) {
    let stats = fabric.sync_reads.stats();
    let name = "blockwire_engine_read_phase_seconds";
    e.family(
        name,
        "summary",
        "Per-command state timers of READs on the I/O engine path, by phase (init, disk_read, \
         send_setup, send_unoverlapped, fin, total); quantiles are upper bounds of power-of-two \
         nanosecond buckets.",
    );
    for (target, lun, s) in &stats {
        let lun = lun.to_string();
        for p in PHASES {
            let h = s.histogram(p);
            for (q, label) in [(0.5, "0.5"), (0.99, "0.99")] {
                let v = seconds(h.quantile(q));
                let labels = [
                    ("target", &**target),
                    ("lun", &*lun),
                    ("phase", p.name()),
                    ("quantile", label),
                ];
                e.sample(name, &labels, v);
            }
            let labels = [("target", &**target), ("lun", &*lun), ("phase", p.name())];
            e.sample(&format!("{name}_sum"), &labels, seconds(h.sum()));
            e.sample(&format!("{name}_count"), &labels, h.count());
        }
    }
    let name = "blockwire_engine_read_bytes_total";
    e.family(
        name,
        "counter",
        "Bytes of READs on the I/O engine path, and the bytes user space or the kernel copied on \
         their way (kind: moved, user_copied, kernel_copied).",
    );
    for (target, lun, s) in &stats {
        let lun = lun.to_string();
        for (kind, v) in [
            ("moved", &s.bytes),
            ("user_copied", &s.user_copied),
            ("kernel_copied", &s.kernel_copied),
        ] {
            let labels = [("target", &**target), ("lun", &*lun), ("kind", kind)];
            e.sample(name, &labels, v.load(Ordering::Relaxed));
        }
    }
    let w = &fabric.sync_writes.stats;
    let name = "blockwire_sync_write_commands_total";
    e.family(
        name,
        "counter",
        "WRITEs on sync_write LUNs: pipelined (double-buffered) or gathered (not plannable, \
         unaligned or no free buffer).",
    );
    e.sample(
        name,
        &[("path", "pipelined")],
        w.pipelined.load(Ordering::Relaxed),
    );
    e.sample(
        name,
        &[("path", "gathered")],
        w.gathered.load(Ordering::Relaxed),
    );
    let name = "blockwire_sync_write_chunks_total";
    e.family(
        name,
        "counter",
        "Chunk writes the double-buffered write path submitted.",
    );
    e.sample(name, &[], w.chunks.load(Ordering::Relaxed));
    let name = "blockwire_sync_write_overlapped_chunks_total";
    e.family(
        name,
        "counter",
        "Chunk writes submitted before their command's last byte arrived (disk and network \
         overlapped).",
    );
    e.sample(name, &[], w.overlapped.load(Ordering::Relaxed));
}

fn rdma_metrics(e: &mut Exposition, fabric: &Fabric) {
    let Some(svc) = fabric.rdma.get() else {
        return;
    };
    let c = svc.counters();
    e.counters(&[
        (
            "blockwire_rdma_binds_total",
            "RDMA connections bound to a session.",
            &c.binds,
        ),
        (
            "blockwire_rdma_rejected_binds_total",
            "RDMA connections refused (unknown or reused token).",
            &c.rejected_binds,
        ),
        (
            "blockwire_rdma_writes_total",
            "RDMA Writes posted (READ data).",
            &c.rdma_writes,
        ),
        (
            "blockwire_rdma_reads_total",
            "RDMA Reads posted (WRITE data).",
            &c.rdma_reads,
        ),
        (
            "blockwire_rdma_written_bytes_total",
            "Bytes moved by RDMA Write.",
            &c.bytes_written,
        ),
        (
            "blockwire_rdma_read_bytes_total",
            "Bytes moved by RDMA Read.",
            &c.bytes_read,
        ),
        (
            "blockwire_rdma_failed_transfers_total",
            "Offloaded commands whose data transfer failed (bad key, bounds, lost queue pair).",
            &c.failed_transfers,
        ),
        (
            "blockwire_rdma_offloaded_commands_total",
            "Commands whose data moved by RDMA.",
            &c.offloaded_commands,
        ),
    ]);
}

/// What the iSER portals (RFC 7145) moved; zero while none is configured.
fn iser_metrics(e: &mut Exposition, fabric: &Fabric) {
    let c = &fabric.iser_counters;
    e.counters(&[
        (
            "blockwire_iser_connections_total",
            "iSER connections accepted.",
            &c.connections,
        ),
        (
            "blockwire_iser_sends_total",
            "RDMA Sends posted by iSER connections (login, SCSI and other responses, NOP-In).",
            &c.sends,
        ),
        (
            "blockwire_iser_receives_total",
            "Messages iSER connections received in full feature phase (commands, NOP-Out, ...).",
            &c.receives,
        ),
        (
            "blockwire_iser_rdma_writes_total",
            "RDMA Writes posted by iSER connections (READ data).",
            &c.rdma_writes,
        ),
        (
            "blockwire_iser_rdma_reads_total",
            "RDMA Reads posted by iSER connections (WRITE data).",
            &c.rdma_reads,
        ),
        (
            "blockwire_iser_rdma_bytes_total",
            "Bytes moved by the RDMA Writes and Reads of iSER connections.",
            &c.rdma_bytes,
        ),
        (
            "blockwire_iser_staging_bytes_given_up_total",
            "Bytes of the iSER staging pool given up for good: work requests whose flush \
             never came, whose buffers an RDMA Read might still land in.",
            &c.staging_bytes_given_up,
        ),
    ]);
    let name = "blockwire_iser_advertised_commands_high";
    e.family(
        name,
        "gauge",
        "The most commands whose advertised buffers (RFC 7145 STags) one iSER connection \
         held on record at once; unanswered commands do not raise it past twice the queue \
         depth plus 128.",
    );
    e.sample(name, &[], c.advertised_high.load(Ordering::Relaxed));
}

/// Binds the metrics endpoint (before anything is served, so a taken
/// address fails the start).
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.with_context(|| {
        format!(
            "binding the metrics endpoint on {addr} ([metrics] listen or --metrics): \
             choose a free address or remove the setting"
        )
    })
}

/// Serves `/metrics` on `listener` until `stop` turns true.
pub async fn serve(
    listener: TcpListener,
    fabric: Arc<Fabric>,
    isns: Arc<crate::isns::Slot>,
    mut stop: watch::Receiver<bool>,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(endpoint = %addr, "Prometheus metrics at http://{addr}/metrics");
    }
    loop {
        let accepted = tokio::select! {
            // The guard `wait_for` returns is dropped at once: it must not
            // live across an await.
            _ = stop.wait_for(|s| *s) => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let fabric = fabric.clone();
                let isns = isns.get();
                tokio::spawn(async move {
                    if let Err(e) = answer(stream, &fabric, isns.as_deref()).await {
                        debug!(%peer, error = %e, "metrics request failed");
                    }
                });
            }
            Err(e) => {
                // Out of file descriptors and the like: back off.
                debug!(error = %e, "metrics accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Reads one request (headers only; a scraper sends no body) and answers it.
async fn answer(
    mut stream: TcpStream,
    fabric: &Fabric,
    isns: Option<&crate::isns::Client>,
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let read = async {
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 * 1024 {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok::<_, std::io::Error>(())
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "request header"))??;
    let text = String::from_utf8_lossy(&buf);
    let mut words = text.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => ("200 OK", CONTENT_TYPE, render_all(fabric, isns)),
        ("GET" | "HEAD", "/") => (
            "200 OK",
            "text/plain; charset=utf-8",
            "blockwire-target: Prometheus metrics are at /metrics\n".to_owned(),
        ),
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            format!("no such page {path:?}; the metrics are at /metrics\n"),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET is served\n".to_owned(),
        ),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if method != "HEAD" {
        response.extend_from_slice(body.as_bytes());
    }
    stream.write_all(&response).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_and_help_text_are_escaped() {
        let mut e = Exposition { out: String::new() };
        e.family("x_total", "counter", "a \\ b\nc");
        e.sample("x_total", &[("t", "q\"uo\\te\nd")], 1);
        assert_eq!(
            e.out,
            "# HELP x_total a \\\\ b\\nc\n# TYPE x_total counter\nx_total{t=\"q\\\"uo\\\\te\\nd\"} 1\n"
        );
        assert_eq!(
            label_word("can't include in session"),
            "cant_include_in_session"
        );
        assert_eq!(label_word("authorization failure"), "authorization_failure");
    }
}
