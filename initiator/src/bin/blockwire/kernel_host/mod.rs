//! `blockwire attach`: a target's LUNs as Linux SCSI devices (/dev/sdX,
//! /dev/sgN) through the `blockwire_scsi` kernel driver (initiator/kmod/).
//!
//! The driver registers a SCSI host and hands each command (CDB, direction,
//! data, tag) to this daemon through a shared area and read(); the daemon
//! runs it on the iSCSI session untouched ([`Session::pass_through`]: the
//! status and sense go back as the target sent them, so sd, sg_persist,
//! scsi_dh_alua and the error handler see a real SCSI device) and answers
//! through the slot and write(). The mid-layer's error handling arrives as
//! task management requests: ABORT TASK names the command's Initiator Task
//! Tag; LOGICAL UNIT RESET, TARGET WARM RESET and the host reset (a target
//! warm reset here) end every command they cover. A request is answered
//! "done" only once every command it covered has ended in this daemon, so
//! the driver can reuse their slots; otherwise "failed", and the mid-layer
//! escalates.
//!
//! Stopping (SIGINT/SIGTERM) detaches the host while commands are still
//! answered (sd's last SYNCHRONIZE CACHE), then logs out. If the daemon
//! dies instead, the driver fails what is outstanding and removes the host.

mod device;
mod session;

use std::collections::HashMap;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use blockwire_initiator::kernel_host::{
    iscsi_lun, AttachRequest, Attached, Direction, Event, EventKind, HostStatus, Reply, SlotAnswer,
    SlotCommand, EVENT_BYTES,
};
use blockwire_initiator::{Error as IscsiError, RawCompletion};
use blockwire_pdu::pdu::codes::TmfResponse;
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;

use device::{Device, SharedArea, SlotHold};
pub use session::PassSession;

/// The driver's character device.
pub const DEVICE_PATH: &str = "/dev/blockwire-scsi";

/// How long a task management request waits for the commands it covered
/// to end in this daemon, after the target said they ended.
const COVERED_END_WAIT: Duration = Duration::from_secs(20);

/// What `blockwire attach` was asked for.
pub struct AttachOptions {
    /// Commands in flight at most.
    pub queue_depth: u32,
    /// The largest transfer in bytes.
    pub max_io_bytes: u32,
}

/// A command this daemon runs for the driver.
struct Running {
    seq: u32,
    lun: u64,
    itt: Arc<AtomicU32>,
    ended: watch::Receiver<bool>,
}

struct Host {
    session: Arc<PassSession>,
    dev: Arc<AsyncFd<Device>>,
    area: Arc<SharedArea>,
    max_io: u32,
    running: Mutex<HashMap<u32, Running>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Attaches the session's target as a SCSI host and serves it until
/// SIGINT/SIGTERM or until the host is removed.
pub async fn serve(session: PassSession, opts: AttachOptions) -> Result<()> {
    let target = session.control().target().to_owned();
    let req = AttachRequest {
        queue_depth: opts.queue_depth,
        max_io_bytes: opts.max_io_bytes,
        target: target.clone(),
    };
    req.check().map_err(|e| anyhow!("blockwire attach: {e}"))?;
    let dev = Device::open(DEVICE_PATH).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => anyhow!(
            "{DEVICE_PATH} does not exist: load the blockwire_scsi module first \
             (build it with initiator/kmod/build.sh, then insmod blockwire_scsi.ko)"
        ),
        _ => anyhow!("open {DEVICE_PATH}: {e}"),
    })?;
    let answer = dev.attach(&req).with_context(|| {
        format!(
            "{DEVICE_PATH}: attach (queue depth {}, {} bytes per command)",
            req.queue_depth, req.max_io_bytes
        )
    })?;
    let attached = Attached::decode(&answer, &req).context("blockwire_scsi's attach answer")?;
    let area = Arc::new(
        dev.map(&attached, &req)
            .context("mapping the shared command area")?,
    );
    println!(
        "blockwire attach: host{} serves {target} at {} over {} (queue depth {}, {} KiB per \
         command); SIGINT or SIGTERM detaches",
        attached.host_no,
        session.control().portal(),
        session.describe().await,
        req.queue_depth,
        req.max_io_bytes >> 10
    );
    let host = Arc::new(Host {
        session: Arc::new(session),
        dev: Arc::new(
            dev.into_async()
                .context("registering the device with the runtime")?,
        ),
        area,
        max_io: req.max_io_bytes,
        running: Mutex::new(HashMap::new()),
    });

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut detaching: Option<tokio::task::JoinHandle<std::io::Result<()>>> = None;
    let mut buf = vec![0u8; EVENT_BYTES * 16];
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c(), if detaching.is_none() => {
                detaching = Some(start_detach(&host, attached.host_no));
            }
            _ = term.recv(), if detaching.is_none() => {
                detaching = Some(start_detach(&host, attached.host_no));
            }
            ready = host.dev.readable() => {
                let mut guard = ready.context("waiting for the driver")?;
                match guard.try_io(|fd| fd.get_ref().read_events(&mut buf)) {
                    Ok(Ok(0)) => break,
                    Ok(Ok(n)) => {
                        for chunk in buf[..n].chunks_exact(EVENT_BYTES) {
                            match Event::decode(chunk) {
                                Ok(ev) => dispatch(&host, ev),
                                Err(e) => tracing::warn!("blockwire_scsi event: {e}"),
                            }
                        }
                    }
                    Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Ok(Err(e)) => bail!("reading {DEVICE_PATH}: {e}"),
                    Err(_would_block) => {}
                }
            }
        }
    }
    // The driver said end of file: the host is gone (detached by us).
    if let Some(d) = detaching {
        d.await
            .context("detach thread")?
            .context("blockwire_scsi detach")?;
    }
    let pending: Vec<_> = lock(&host.running).drain().map(|(_, r)| r.ended).collect();
    for mut ended in pending {
        let _ = tokio::time::timeout(COVERED_END_WAIT, ended.wait_for(|&e| e)).await;
    }
    let rdma = match host.session.as_ref() {
        PassSession::Rdma(s) => {
            let st = s.stats();
            format!(
                "; data by RDMA: {} reads and {} writes, on TCP: {} commands and {} inline writes",
                st.offloaded_reads, st.offloaded_writes, st.plain_commands, st.inline_writes
            )
        }
        PassSession::Tcp(_) => String::new(),
    };
    println!("blockwire attach: host{} detached{rdma}", attached.host_no);
    let host = Arc::try_unwrap(host).map_err(|_| anyhow!("commands still running after detach"))?;
    if let Ok(session) = Arc::try_unwrap(host.session) {
        session.logout().await.context("logout")?;
    }
    Ok(())
}

/// Removes the host in a blocking thread while the event loop keeps
/// answering the mid-layer's last commands; the loop ends when the driver
/// reports end of file, which it does once the removal is done.
fn start_detach(host: &Arc<Host>, host_no: u32) -> tokio::task::JoinHandle<std::io::Result<()>> {
    eprintln!("blockwire attach: detaching host{host_no}");
    let dev = Arc::clone(&host.dev);
    tokio::task::spawn_blocking(move || dev.get_ref().detach())
}

fn dispatch(host: &Arc<Host>, ev: Event) {
    match ev.kind {
        EventKind::Command => {
            let Some(hold) = host.area.hold(ev.tag) else {
                tracing::warn!(
                    tag = ev.tag,
                    "blockwire_scsi: a command for a slot already held"
                );
                return;
            };
            let itt = Arc::new(AtomicU32::new(0));
            let (ended_tx, ended) = watch::channel(false);
            lock(&host.running).insert(
                ev.tag,
                Running {
                    seq: ev.seq,
                    lun: ev.lun,
                    itt: Arc::clone(&itt),
                    ended,
                },
            );
            let host = Arc::clone(host);
            tokio::spawn(async move {
                run_command(&host, hold, ev, &itt).await;
                ended_tx.send_replace(true);
            });
        }
        _ => {
            let host = Arc::clone(host);
            tokio::spawn(async move {
                let done = task_management(&host, ev).await;
                reply(
                    &host,
                    Reply::Tmf {
                        tmf_id: ev.tmf_id,
                        done,
                    },
                );
            });
        }
    }
}

fn reply(host: &Host, r: Reply) {
    if let Err(e) = host.dev.get_ref().write_replies(&r.encode()) {
        tracing::warn!("blockwire_scsi reply {r:?}: {e}");
    }
}

/// Fixed-format sense (SPC-5 4.4.3) for an answer the daemon makes itself.
fn fixed_sense(key: u8, asc: u8, ascq: u8) -> Vec<u8> {
    let mut s = vec![0u8; 18];
    s[0] = 0x70;
    s[2] = key;
    s[7] = 10;
    s[12] = asc;
    s[13] = ascq;
    s
}

async fn run_command(host: &Host, mut hold: SlotHold, ev: Event, itt: &AtomicU32) {
    let answer = match SlotCommand::decode(hold.slot(), host.max_io) {
        Ok(cmd) if cmd.seq == ev.seq => execute(host, &mut hold, &cmd, itt).await,
        Ok(cmd) => {
            tracing::warn!(
                tag = ev.tag,
                "slot holds command {} but the event names {}",
                cmd.seq,
                ev.seq
            );
            SlotAnswer {
                host: HostStatus::Error,
                status: 0,
                sense: vec![],
                resid: 0,
            }
        }
        Err(e) => {
            tracing::warn!(tag = ev.tag, "blockwire_scsi slot: {e}");
            SlotAnswer {
                host: HostStatus::Error,
                status: 0,
                sense: vec![],
                resid: 0,
            }
        }
    };
    answer.write_into(hold.slot_mut());
    // Let go of the slot before the reply: the driver may reuse the tag at
    // once.
    drop(hold);
    reply(
        host,
        Reply::Command {
            tag: ev.tag,
            seq: ev.seq,
        },
    );
}

async fn execute(
    host: &Host,
    hold: &mut SlotHold,
    cmd: &SlotCommand,
    itt: &AtomicU32,
) -> SlotAnswer {
    let Some(lun) = iscsi_lun(cmd.lun) else {
        // LOGICAL UNIT NOT SUPPORTED (SPC-5 table F.1): the daemon speaks
        // peripheral and flat LUNs below 16384.
        return SlotAnswer {
            host: HostStatus::Ok,
            status: 0x02,
            sense: fixed_sense(0x05, 0x25, 0x00),
            resid: cmd.data_len,
        };
    };
    let len = cmd.data_len as usize;
    let mut data_in = match cmd.dir {
        Direction::FromDevice => vec![0u8; len],
        _ => Vec::new(),
    };
    // Data-Out goes to the session straight from the shared buffer, which
    // this command holds until its reply.
    let data_out: &[u8] = match cmd.dir {
        Direction::ToDevice => &hold.data()[..len],
        _ => &[],
    };
    let result: Result<RawCompletion, IscsiError> = host
        .session
        .run(lun, &cmd.cdb, cmd.dir, data_out, &mut data_in, itt)
        .await;
    if let (Ok(c), Direction::FromDevice) = (&result, cmd.dir) {
        let n = c.transferred.min(data_in.len());
        hold.data_mut()[..n].copy_from_slice(&data_in[..n]);
    }
    match result {
        Ok(c) => SlotAnswer {
            host: HostStatus::Ok,
            status: c.status.0,
            sense: c.sense,
            resid: cmd
                .data_len
                .saturating_sub(u32::try_from(c.transferred).unwrap_or(u32::MAX)),
        },
        Err(e) => {
            let host_status = match &e {
                IscsiError::Closed => HostStatus::NoConnect,
                _ => HostStatus::Error,
            };
            if !matches!(e, IscsiError::Aborted { .. }) {
                tracing::warn!(lun, opcode = cmd.cdb[0], "command failed: {e}");
            }
            SlotAnswer {
                host: host_status,
                status: 0,
                sense: vec![],
                resid: cmd.data_len,
            }
        }
    }
}

/// Carries out one of the mid-layer's task management requests; true when
/// every command it covered has ended here.
async fn task_management(host: &Host, ev: Event) -> bool {
    let session = host.session.control();
    let (covered, outcome): (Vec<watch::Receiver<bool>>, std::result::Result<(), String>) = match ev
        .kind
    {
        EventKind::Abort => {
            let (itt, lun, ended) = {
                let running = lock(&host.running);
                match running.get(&ev.tag) {
                    Some(r) if r.seq == ev.seq => (
                        r.itt.load(std::sync::atomic::Ordering::Acquire),
                        r.lun,
                        r.ended.clone(),
                    ),
                    // An older command still runs in the slot: the one the
                    // request names never started here, and the slot is not
                    // free, since the older one will still answer into it.
                    Some(r) if !*r.ended.borrow() => return false,
                    // Not ours (any more): it ended before the request.
                    _ => return true,
                }
            };
            let Some(iscsi) = iscsi_lun(lun) else {
                return true;
            };
            if itt == 0 {
                // Not sent yet: nothing on the wire to abort by tag. Say
                // so; the mid-layer's LUN reset covers it at the target.
                eprintln!("blockwire attach: ABORT TASK for a command not yet sent: escalating");
                return false;
            }
            let r = session.abort_task(iscsi, itt).await;
            eprintln!("blockwire attach: ABORT TASK lun {iscsi} itt {itt:#x}: {r:?}");
            let outcome = match r {
                Ok(TmfResponse::FunctionComplete | TmfResponse::TaskDoesNotExist) => Ok(()),
                Ok(other) => Err(format!("{other:?}")),
                Err(e) => Err(e.to_string()),
            };
            (vec![ended], outcome)
        }
        EventKind::LunReset => {
            let Some(iscsi) = iscsi_lun(ev.lun) else {
                return false;
            };
            let r = session.lun_reset(iscsi).await;
            eprintln!("blockwire attach: LOGICAL UNIT RESET lun {iscsi}: {r:?}");
            (covered_by(host, Some(ev.lun)), r.map_err(|e| e.to_string()))
        }
        EventKind::TargetReset | EventKind::HostReset => {
            let r = session.target_warm_reset().await;
            eprintln!("blockwire attach: TARGET WARM RESET ({:?}): {r:?}", ev.kind);
            (covered_by(host, None), r.map_err(|e| e.to_string()))
        }
        EventKind::Command => return false,
    };
    if let Err(e) = outcome {
        eprintln!("blockwire attach: {:?} failed: {e}", ev.kind);
        return false;
    }
    for mut ended in covered {
        if tokio::time::timeout(COVERED_END_WAIT, ended.wait_for(|&e| e))
            .await
            .is_err()
        {
            eprintln!(
                "blockwire attach: a command covered by {:?} did not end within {COVERED_END_WAIT:?}",
                ev.kind
            );
            return false;
        }
    }
    true
}

/// The commands a reset of `lun` (every LUN for None) covers.
fn covered_by(host: &Host, lun: Option<u64>) -> Vec<watch::Receiver<bool>> {
    lock(&host.running)
        .values()
        .filter(|r| lun.map_or(true, |l| r.lun == l))
        .map(|r| r.ended.clone())
        .collect()
}
