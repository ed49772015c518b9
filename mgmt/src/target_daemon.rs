//! Running the target daemon: bind every portal, serve until SIGTERM or
//! SIGINT, then ask initiators to log out, drain, flush and exit. SIGHUP
//! reloads the configuration file and applies the difference live (see
//! `live`). A service manager hears READY=1 once the portals accept
//! connections, RELOADING=1 and READY=1 around a reload, and STOPPING=1
//! when the shutdown begins (see `notify`).

use anyhow::Context;
use blockwire_target::backstore::ram_budget::RamBudget;
use blockwire_target::iscsi::portal::{Portal, PortalSet};
use blockwire_target::iscsi::Fabric;
use tokio::sync::watch;
use tracing::{error, info, warn};

use std::sync::Arc;

use crate::config::{Built, LoadOptions, RdmaBackend};
use crate::control::Control;
use crate::live::{ChangeMode, Live, Source};
use crate::notify::Notifier;

/// Sets the process's RAM budget to `[fabric] ram_limit` when given, and
/// says what the RAM LUNs (`ram_lun_bytes` of them) may hold: a warning
/// when they could hold more than the budget allows.
fn ram_budget(limit: Option<u64>, ram_lun_bytes: u64) {
    let budget = RamBudget::process();
    if let Some(limit) = limit {
        budget.set_limit(limit);
    }
    if ram_lun_bytes == 0 {
        return;
    }
    let whence = if limit.is_some() {
        "[fabric] ram_limit"
    } else {
        "[fabric] ram_limit unset: 3/4 of the memory this process may use"
    };
    let (total, limit) = (ram_lun_bytes >> 20, budget.limit() >> 20);
    if ram_lun_bytes > budget.limit() {
        warn!(
            "the RAM LUNs add up to {total} MiB, more than the {limit} MiB they may hold together \
             ({whence}): they are thin, and a write that needs memory past that fails with DATA \
             PROTECT, SPACE ALLOCATION FAILED WRITE PROTECT until UNMAP frees some"
        );
    } else {
        info!("the RAM LUNs add up to {total} MiB of at most {limit} MiB they may hold together ({whence})");
    }
}

/// Serves `built`, made from the configuration document `doc` (read from
/// `source`), until a termination signal; returns after a clean shutdown.
pub async fn run(
    built: Built,
    doc: toml::Table,
    source: Source,
    opts: LoadOptions,
) -> anyhow::Result<()> {
    let notifier = Notifier::from_env();
    let (stop_tx, stop_rx) = watch::channel(false);
    // Before any initiator can write to a RAM LUN.
    ram_budget(built.ram_limit, built.ram_lun_bytes);
    // Before any initiator logs in: the ALUA states initiators had set with
    // SET TARGET PORT GROUPS before the daemon stopped (kept under
    // `[fabric] state_dir`), so that a failed-over target stays so.
    for t in &built.catalog.targets {
        t.luns.restore_alua_states();
    }
    let mut settings = built.settings;
    settings.max_recv_data_segment_length = built.max_recv_data_segment_length;
    let fabric = Fabric::new(built.catalog.clone(), settings, stop_rx);
    if let Some(listen) = built.rdma_listen {
        let backend = match built.rdma_backend {
            RdmaBackend::Soft => blockwire_transport::rdma::any::Backend::Soft,
            RdmaBackend::Verbs => blockwire_transport::rdma::any::Backend::Verbs,
        };
        match fabric
            .start_rdma_on(listen, backend, built.rdma_device.as_deref())
            .await
        {
            Ok(ep) => info!(
                endpoint = %ep,
                backend = backend.name(),
                "RDMA-assisted iSCSI offered (X-io.blockwire.RdmaOffload)"
            ),
            // Without the device (or the verbs build) offload is not offered; sessions
            // are plain iSCSI over TCP. The soft provider needs nothing: its failure to
            // listen is a configuration error.
            Err(e) if backend == blockwire_transport::rdma::any::Backend::Verbs => {
                warn!("{e}; serving plain iSCSI over TCP ({listen} not opened)")
            }
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("starting the RDMA offload listener on {listen}"))
            }
        }
    }
    for (addr, tag) in &built.iser_portals {
        let backend = match built.rdma_backend {
            RdmaBackend::Soft => blockwire_transport::rdma::any::Backend::Soft,
            RdmaBackend::Verbs => blockwire_transport::rdma::any::Backend::Verbs,
        };
        // An iSER portal is asked for by name: without its RDMA device the daemon
        // stops and says so, rather than serve with a portal missing.
        let bound = blockwire_target::iscsi::iser::start(
            fabric.clone(),
            *addr,
            backend,
            built.rdma_device.as_deref(),
            *tag,
        )
        .await
        .with_context(|| {
            format!(
                "starting the iSER portal {addr} (portal group {tag}, RDMA backend {}); \
                 load the RDMA device (e.g. rdma_rxe) or remove `iser = true` from the group",
                backend.name()
            )
        })?;
        info!(portal = %bound, tpgt = tag, backend = backend.name(), "iSER portal (RFC 7145) listening");
    }

    if built.no_disk {
        warn!(
            "--no-disk: BENCHMARK-ONLY MODE. Every LUN serves pattern data (a function of the byte \
             offset) without any backstore I/O, and EVERY WRITE IS DROPPED: nothing written is \
             stored. Do not use for real data."
        );
    }
    let mut portals = Vec::new();
    let mut bound_at = std::collections::HashMap::new();
    for group in &fabric.catalog().portal_groups {
        for addr in &group.addresses {
            let portal = Portal::bind(*addr, group.tag).await?;
            let bound = portal.local_addr()?;
            info!(portal = %bound, tpgt = group.tag, "listening");
            bound_at.insert((*addr, group.tag), bound);
            portals.push((bound, portal));
        }
    }
    // Bound before anything is served, so a taken address fails the start.
    let metrics_listener = match built.metrics_listen {
        Some(addr) => Some(crate::metrics::bind(addr).await?),
        None => None,
    };
    // Bound before anything is served, so a bad path fails the start.
    let control_listener = match &built.control_socket {
        Some(path) => Some((path.clone(), crate::control::bind(path)?)),
        None => None,
    };
    // Each LUN's data paths, from its configured policy and what its
    // storage can do.
    for p in fabric
        .start_data_paths()
        .context("starting the LUNs' data paths")?
    {
        info!(target = %p.target, lun = p.lun, "{}", p.line);
    }
    if fabric.settings.no_net {
        warn!("--no-net: BENCHMARK-ONLY MODE. READ data are read from the backstores (engine-path LUNs through the I/O engine as usual, others by the SCSI core's serial path) but NOT SENT: \
               every READ ends GOOD with a residual underflow of its whole length. Initiators get no data; do not use for real I/O.");
    }
    if let Some(budget) = fabric.settings.busy_poll {
        info!("busy polling: a connection looks for the next PDU for {} us before it sleeps, or naps between batches of several PDUs ([fabric] busy_poll_us; costs CPU time after every read)", budget.as_micros());
    }
    match fabric.settings.connection_threads {
        0 => info!("connections share the runtime's workers ([fabric] connection_threads = 0)"),
        n => info!("connections run on {n} connection threads, each on the one with the fewest ([fabric] connection_threads; 0: the runtime's shared workers)"),
    }
    if fabric.settings.zero_copy_send {
        info!("zero-copy sends (MSG_ZEROCOPY) for Data-In payloads of at least {} KiB where the kernel allows it ([fabric] zero_copy_send = false turns them off)", blockwire_target::iscsi::zerocopy::ZC_MIN >> 10);
    } else {
        info!("zero-copy sends off ([fabric] zero_copy_send = false): Data-In payloads are copied into socket buffers");
    }
    for t in &fabric.catalog().targets {
        for lun in t.luns.lun_ids() {
            if fabric.settings.no_net && fabric.sync_reads.get(&t.name, lun).is_some() {
                info!(target = %t.name, lun, "READ engine: --no-net (engine path read as configured, nothing sent)");
            } else if fabric.settings.no_net {
                info!(target = %t.name, lun, "READ engine: --no-net (serial read, nothing sent)");
            } else if fabric.sendfile_reads.get(&t.name, lun).is_none()
                && fabric.sync_reads.get(&t.name, lun).is_none()
            {
                info!(target = %t.name, lun, "READ engine: serial (SCSI core on the blocking pool, read all then send)");
            }
            let unit = t
                .luns
                .get(lun)
                .map_or(0, |u| u.config().backstore.atomic_write_unit());
            if unit > 0 {
                info!(target = %t.name, lun, "WRITE ATOMIC(16): atomic writes of {} KiB by the device (RWF_ATOMIC), at LBAs aligned to them (atomic_unit)", unit >> 10);
            }
            info!(target = %t.name, lun, "serving");
            let limits = t.qos_of(lun);
            if limits.is_limited() {
                info!(target = %t.name, lun, "QoS ceiling: {limits} (media commands over it wait their turn; ctl lun.limit changes it)");
            }
            if t.luns.get(lun).is_some_and(|lu| lu.is_stalled()) {
                warn!(target = %t.name, lun, "LUN stalled from the start (stalled = true): media commands wait before the backstore until lun.stall releases it");
            }
        }
        for g in t.luns.target_port_groups() {
            info!(target = %t.name, port_group = g.id, state = g.state.name(), "ALUA target port group");
        }
        if t.luns.explicit_alua() {
            info!(target = %t.name, "explicit ALUA: initiators may set these states with SET TARGET PORT GROUPS (explicit_alua = true)");
        }
    }
    if let Some((addr, _)) = portals.first() {
        let host = if addr.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else {
            addr.ip().to_string()
        };
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        let t = &fabric.catalog().targets[0];
        let lun = t.luns.lun_ids().first().copied().unwrap_or(0);
        info!(
            "reach it with: iscsi-ls -s iscsi://{host}:{}  or  iscsi-inq iscsi://{host}:{}/{}/{lun}",
            addr.port(),
            addr.port(),
            t.name
        );
    }
    let portal_set = Arc::new(PortalSet::new(fabric.clone()));
    for (_, portal) in portals {
        portal_set.start(portal).await?;
    }
    // Registered once every portal listens: an initiator that learns of a
    // portal from the server can connect to it.
    let isns = built.isns.as_ref().map(|i| {
        let wanted =
            crate::isns::Registration::of(&i.entity, i.period_secs, &fabric.catalog(), &bound_at);
        info!(server = %i.server, entity = %i.entity, "iSNS: registering the targets (RFC 4171)");
        Arc::new(crate::isns::Client::start(
            i.server.clone(),
            wanted,
            stop_tx.subscribe(),
        ))
    });
    // Live changes of [isns] start, replace or end the client here.
    let isns_slot = Arc::new(crate::isns::Slot::default());
    isns_slot.replace(isns);
    let live = Live::new(
        fabric.clone(),
        portal_set.clone(),
        opts,
        source,
        doc,
        bound_at,
        built.ram_lun_bytes,
    )
    .with_isns(isns_slot.clone(), stop_tx.subscribe());
    let live = Arc::new(live);
    let control_task = control_listener.map(|(path, listener)| {
        info!(socket = %path.display(), "control socket (JSON-RPC 2.0, one object per line; try: blockwire-target ctl --control {} lun.list)", path.display());
        let control = Arc::new(Control::new(
            fabric.clone(),
            portal_set.clone(),
            Some(live.clone()),
        ));
        tokio::spawn(crate::control::serve(listener, path, control))
    });
    let metrics_task = metrics_listener.map(|listener| {
        tokio::spawn(crate::metrics::serve(
            listener,
            fabric.clone(),
            isns_slot.clone(),
            stop_tx.subscribe(),
        ))
    });
    // The handlers are in place before READY=1: a manager may send SIGHUP
    // (`systemctl reload`) as soon as it hears it, and SIGHUP's default
    // action would end the daemon.
    let signals = Signals::install()?;
    // Every portal accepts connections now: a unit ordered after this one
    // may log in.
    notifier.notify("READY=1\nSTATUS=serving");

    signals.wait(&notifier, &live).await;
    notifier.notify("STOPPING=1\nSTATUS=logging initiators out, flushing");
    info!("shutting down: asking initiators to log out");
    let _ = stop_tx.send(true);
    portal_set.join().await;
    if let Some(c) = isns_slot.get() {
        // Deregistered: at most the answer timeout.
        c.join().await;
    }
    if let Some(t) = control_task {
        let _ = t.await;
    }
    if let Some(t) = metrics_task {
        let _ = t.await;
    }
    blockwire_target::copies::log_summary();
    // Per-command state timers of the engine READ path (as in the GMBlock paper's Fig. 15).
    for line in fabric.sync_reads.summary() {
        info!("READ state timers: {line}");
    }
    // Every target's backstores are flushed, whichever fail: one target's
    // failing disk is no reason to leave another's cache unwritten.
    let mut failed = Vec::new();
    for t in &fabric.catalog().targets {
        if let Err(e) = t.luns.flush_all() {
            error!(target = %t.name, error = %e, "flushing backstores failed");
            failed.push(format!("{}: {e}", t.name));
        }
    }
    if !failed.is_empty() {
        anyhow::bail!("flushing the backstores failed for {}", failed.join("; "));
    }
    info!("backstores flushed; exiting");
    Ok(())
}

/// The daemon's signal handlers: SIGTERM and SIGINT end it, SIGHUP
/// reloads the configuration.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            // SIGHUP's default action ends the process: caught, it reloads.
            hup: signal(SignalKind::hangup()).context("installing the SIGHUP handler")?,
        })
    }

    /// Returns on SIGTERM or SIGINT.
    async fn wait(self, notifier: &Notifier, live: &Live) {
        let Signals {
            mut term,
            mut int,
            mut hup,
        } = self;
        loop {
            tokio::select! {
                _ = term.recv() => { info!("SIGTERM received"); break; }
                _ = int.recv() => { info!("SIGINT received"); break; }
                _ = hup.recv() => {
                    // The manager's `systemctl reload` waits for READY=1 after
                    // RELOADING=1.
                    notifier.notify("RELOADING=1\nSTATUS=reloading");
                    info!("SIGHUP: reloading the configuration");
                    let status = match live.reload(ChangeMode::default()).await {
                        Ok(a) => {
                            info!(changes = a.changes.len(), restart_needed = a.restart_needed.len(), "configuration reloaded");
                            format!("serving (reloaded: {} change(s))", a.changes.len())
                        }
                        Err(e) => {
                            error!("reload failed, still serving the previous configuration: {e}");
                            "serving the previous configuration (reload failed, see the log)".to_string()
                        }
                    };
                    notifier.notify(&format!("READY=1\nSTATUS={status}"));
                }
            }
        }
    }
}
