//! One TCP connection: login, then the full-feature phase.
//!
//! The reader (this task) decodes PDUs and drives the sans-IO pieces:
//! the login machine, the CmdSN window, write-data collectors and text
//! exchanges. SCSI commands run on the blocking pool; their PDUs go to a
//! writer task through a bounded channel. The writer stamps StatSN,
//! ExpCmdSN and MaxCmdSN as PDUs leave, so numbering follows send order.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blockwire_pdu::keys::{Digest, SessionParams};
use blockwire_pdu::pdu::codes::{
    AsyncEvent, LogoutReason, LogoutResponseCode, RejectReason, TmfFunction, TmfResponse,
};
use blockwire_pdu::pdu::{
    AsyncMessage, DataOut, LogoutRequest, LogoutResponse, NopIn, NopOut, R2t, Reject, ScsiCommand,
    TaskMgmtRequest, TaskMgmtResponse, RESERVED_TAG,
};
use blockwire_pdu::{Bhs, DecodeError, Digests, FrameDecoder, Lun, Pdu};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::budget::{Reservation, WriteBudget};
use super::dataout::{WriteCollector, WriteLimits};
use super::discovery::{TextExchange, TextStep};
use super::io::{advances_stat_sn, stamp, PduReader, PduWriter, ReadError};
use super::login::{LoginMachine, LoginOutcome, LoginSettings, LoginStep, RdmaOffer};
use super::mover::{self, Road, Wire};
use super::rdma::Slot;
use super::response::{status_only, DataInLimits};
use super::session::{Session, SessionError, SessionRequest};
use super::task::{data_phase_error_sense, CommandContext, CommandSlot};
use super::window::{Admission, CmdWindow};
use super::Fabric;
use crate::copies::{CopyPath, Counts};
use blockwire_transport::assist::{Descriptor, Direction};

/// CHECK CONDITION.
const CHECK_CONDITION: u8 = 0x02;
/// TASK SET FULL: the initiator retries later.
const TASK_SET_FULL: u8 = 0x28;

/// A PDU or an instruction for the writer task.
#[derive(Debug)]
pub(super) enum Outgoing {
    /// Stamp and send.
    Pdu(Pdu),
    /// Stamp and send a Data-In whose payload is `len` bytes of `lun`'s
    /// file at `offset`, by sendfile (see [`super::sendfile`]).
    FileData {
        bhs: Bhs,
        lun: Arc<super::sendfile::SendfileLun>,
        offset: u64,
        len: u32,
    },
    /// Flush, then close the connection.
    Close,
}

/// State shared by the reader, the writer and running commands.
pub(super) struct Shared {
    window: Mutex<CmdWindow<Admitted>>,
    /// Per-command copy tallies of READ payloads (debug copy counter).
    pub(super) copies: Arc<crate::copies::Tracker>,
}

impl Shared {
    /// The shared state of a connection whose CmdSN window starts at
    /// `exp_cmd_sn` and holds `depth` commands.
    pub(super) fn new(exp_cmd_sn: u32, depth: u32) -> Arc<Shared> {
        Arc::new(Shared {
            window: Mutex::new(CmdWindow::new(exp_cmd_sn, depth)),
            copies: Arc::default(),
        })
    }

    /// A command (or other CmdSN-numbered request) arrived: what the window
    /// delivers now, each with the window slot it holds.
    pub(super) fn admit(
        self: &Arc<Self>,
        cmd_sn: u32,
        immediate: bool,
        item: Admitted,
    ) -> Admission<(Admitted, CommandSlot)> {
        let admission = self
            .window
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .admit(cmd_sn, immediate, item);
        match admission {
            Admission::Deliver(items) => Admission::Deliver(
                items
                    .into_iter()
                    .map(|i| (i, CommandSlot::taken(self.clone())))
                    .collect(),
            ),
            Admission::Queued => Admission::Queued,
            Admission::Dropped => Admission::Dropped,
        }
    }

    /// Commands delivered and not completed.
    #[cfg(test)]
    pub(super) fn in_flight(&self) -> u32 {
        self.window
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .in_flight()
    }

    /// A command left the window (MaxCmdSN advances). Only its
    /// [`CommandSlot`] calls this.
    pub(super) fn complete(&self) {
        self.window
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .complete();
    }
}

/// A PDU that took a CmdSN and waits for its turn.
#[derive(Debug)]
pub(super) enum Admitted {
    Scsi(Pdu),
    Nop(Pdu),
    Text(Pdu),
    Tmf(TaskMgmtRequest),
    Logout(LogoutRequest),
}

/// Resolves once `flag` turns true; never if its sender goes away first.
pub(super) async fn turns_true(flag: &mut tokio::sync::watch::Receiver<bool>) {
    if flag.wait_for(|v| *v).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Serves one accepted connection until it ends.
pub async fn serve(fabric: Arc<Fabric>, stream: TcpStream, tpgt: u16) {
    // Never cut: the sender lives as long as the connection.
    let (_keep, cut) = tokio::sync::watch::channel(false);
    serve_until_cut(fabric, stream, tpgt, cut).await
}

/// [`serve`], cut short when `cut` turns true (its portal was closed): the
/// connection is dropped at once, as if the network had gone away (no
/// logout request, no queued response flushed); its session's tasks are
/// aborted and the session ends.
pub async fn serve_until_cut(
    fabric: Arc<Fabric>,
    stream: TcpStream,
    tpgt: u16,
    mut cut: tokio::sync::watch::Receiver<bool>,
) {
    let peer = stream.peer_addr().ok();
    let local = match stream.local_addr() {
        Ok(a) => a,
        Err(e) => {
            warn!(error = %e, "connection without a local address");
            return;
        }
    };
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
    let mut reader = PduReader::new(rd);
    let mut writer = PduWriter::new(wr);
    let logged_in = tokio::select! {
        l = login(&fabric, &mut reader, &mut writer, tpgt, local, peer) => l,
        _ = turns_true(&mut cut) => {
            info!(?peer, "portal closed: connection cut during login");
            None
        }
    };
    let Some((session, outcome)) = logged_in else {
        let _ = writer.shutdown().await;
        return;
    };
    let generation = session.generation();
    info!(
        tsih = session.tsih,
        initiator = %session.initiator_name,
        target = session.target.as_ref().map(|t| t.name.as_str()).unwrap_or("discovery"),
        ?peer,
        "login complete: full feature phase"
    );
    // RDMA offload granted at login: bind the token to the session (never
    // with data digests, which offloaded data cannot carry).
    let rdma = match (outcome.rdma_token, fabric.rdma.get()) {
        (Some(token), Some(svc)) if session.params.data_digest != Digest::Crc32c => {
            info!(tsih = session.tsih, "RDMA offload granted");
            Some((token, svc.register(token, session.tsih)))
        }
        _ => None,
    };
    full_feature(
        &fabric,
        &session,
        reader,
        writer,
        &outcome,
        local,
        rdma.as_ref().map(|r| r.1.clone()),
        cut,
    )
    .await;
    if let (Some((token, _)), Some(svc)) = (&rdma, fabric.rdma.get()) {
        svc.unregister(token);
    }
    if session.generation() == generation {
        // The session ends with its only connection (ErrorRecoveryLevel 0).
        fabric.sessions.detach(&session, generation);
        if let (Some(t), Some(nexus)) = (&session.target, &session.nexus) {
            t.luns.nexus_lost(nexus);
        }
    }
    info!(tsih = session.tsih, initiator = %session.initiator_name, "connection closed");
}

/// Runs the login phase. Returns the session, ExpCmdSN and the next StatSN.
async fn login(
    fabric: &Arc<Fabric>,
    reader: &mut PduReader<tokio::net::tcp::OwnedReadHalf>,
    writer: &mut PduWriter,
    tpgt: u16,
    local: SocketAddr,
    peer: Option<SocketAddr>,
) -> Option<(Arc<Session>, Box<LoginOutcome>)> {
    use rand::SeedableRng;
    let mut settings = LoginSettings {
        cmd_window: fabric.settings.queue_depth,
        rdma_offload: fabric.rdma.get().map(|svc| {
            let ep = svc.endpoint();
            RdmaOffer {
                backend: svc.backend().to_owned(),
                // A wildcard listener is reached at the address the
                // initiator already uses.
                endpoint: if ep.ip().is_unspecified() {
                    SocketAddr::new(local.ip(), ep.port())
                } else {
                    ep
                },
            }
        }),
        ..LoginSettings::default()
    };
    let n = &mut settings.negotiation;
    n.max_recv_data_segment_length = fabric.settings.max_recv_data_segment_length;
    // The target accepts either digest unless told to insist on CRC32C;
    // otherwise the initiator's order decides.
    let accepted = |required: bool| {
        if required {
            vec![Digest::Crc32c]
        } else {
            vec![Digest::Crc32c, Digest::None]
        }
    };
    n.header_digests = accepted(fabric.settings.require_header_digest);
    n.data_digests = accepted(fabric.settings.require_data_digest);
    // InitialR2T is OR-ed and ImmediateData AND-ed: offering No/Yes leaves
    // the choice to the initiator, whose unsolicited data saves a round trip.
    n.initial_r2t = false;
    n.immediate_data = true;
    n.first_burst_length = 256 * 1024;
    n.max_burst_length = (1 << 20).min(fabric.settings.max_io_bytes);
    n.max_outstanding_r2t = 8;
    // An OR key: answering No leaves the choice to the initiator.
    n.data_pdu_in_order = fabric.settings.data_pdu_in_order;
    let mut machine = LoginMachine::with_settings(
        fabric.catalog.clone(),
        tpgt,
        local,
        settings,
        rand::rngs::StdRng::from_entropy(),
    );
    loop {
        let pdu = match tokio::time::timeout(fabric.settings.login_timeout, reader.next()).await {
            Err(_) => {
                info!(?peer, "login timed out");
                return None;
            }
            Ok(Ok(Some(p))) => p,
            Ok(Ok(None)) => return None,
            Ok(Err(e)) => {
                info!(?peer, error = %e, "login aborted");
                return None;
            }
        };
        let Bhs::LoginRequest(req) = pdu.bhs else {
            info!(?peer, opcode = ?pdu.bhs.opcode(), "non-login PDU during login: closing");
            let _ = writer
                .push(&machine.reject(blockwire_pdu::LoginStatus::INVALID_DURING_LOGIN))
                .await;
            let _ = writer.flush().await;
            return None;
        };
        match machine.on_request(&req, &pdu.data) {
            LoginStep::Respond(resp) => {
                writer.push(&resp).await.ok()?;
                writer.flush().await.ok()?;
            }
            LoginStep::Fail(resp) => {
                let _ = writer.push(&resp).await;
                let _ = writer.flush().await;
                return None;
            }
            LoginStep::Complete(outcome) => {
                // A digest the initiator would not agree to is answered
                // Reject and falls back to None (RFC 7143 §6.2); when the
                // target insists on CRC32C, such a login must fail.
                let s = &fabric.settings;
                if (s.require_header_digest && outcome.params.header_digest != Digest::Crc32c)
                    || (s.require_data_digest && outcome.params.data_digest != Digest::Crc32c)
                {
                    info!(?peer, initiator = %outcome.initiator_name, "login refused: the target requires CRC32C digests");
                    let _ = writer
                        .push(&machine.reject(blockwire_pdu::LoginStatus::INITIATOR_ERROR))
                        .await;
                    let _ = writer.flush().await;
                    return None;
                }
                let request = SessionRequest {
                    initiator_name: outcome.initiator_name.clone(),
                    isid: outcome.isid,
                    tsih: outcome.tsih_requested,
                    cid: outcome.cid,
                    target: outcome.target.clone(),
                    tpgt,
                    portal: local,
                    params: outcome.params.clone(),
                };
                let window = fabric.settings.queue_depth;
                match fabric.sessions.attach(request) {
                    Ok(session) => {
                        let resp = machine.final_response(
                            session.tsih,
                            outcome.stat_sn,
                            outcome.exp_cmd_sn.wrapping_add(window).wrapping_sub(1),
                        );
                        writer.push(&resp).await.ok()?;
                        writer.flush().await.ok()?;
                        return Some((session, outcome));
                    }
                    Err(e) => {
                        info!(?peer, error = %e, "login refused by the session table");
                        let status = match e {
                            SessionError::DoesNotExist(_) => {
                                blockwire_pdu::LoginStatus::SESSION_DOES_NOT_EXIST
                            }
                            SessionError::TooManyConnections => {
                                blockwire_pdu::LoginStatus::TOO_MANY_CONNECTIONS
                            }
                            SessionError::OutOfResources => {
                                blockwire_pdu::LoginStatus::OUT_OF_RESOURCES
                            }
                        };
                        let _ = writer.push(&machine.reject(status)).await;
                        let _ = writer.flush().await;
                        return None;
                    }
                }
            }
        }
    }
}

fn digests_of(params: &SessionParams) -> Digests {
    Digests {
        header: params.header_digest == Digest::Crc32c,
        data: params.data_digest == Digest::Crc32c,
    }
}

/// Everything the reader needs while in full feature phase.
struct Conn<'a> {
    fabric: &'a Arc<Fabric>,
    session: &'a Arc<Session>,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Outgoing>,
    collectors: HashMap<u32, Collecting>,
    write_budget: Arc<WriteBudget>,
    text: TextExchange,
    limits: DataInLimits,
    write_limits: WriteLimits,
    next_ttt: u32,
    /// TTT of our NOP-In ping still unanswered, and when it was sent.
    ping: Option<(u32, tokio::time::Instant)>,
    logout_requested: bool,
    /// The session's RDMA offload, when granted at login.
    rdma: Option<Arc<Slot>>,
    /// Double-buffered WRITEs running (see [`super::syncwrite`]).
    sync_writes: super::syncwrite::Running,
}

/// A WRITE waiting for its data.
struct Collecting {
    cmd: ScsiCommand,
    cdb: Vec<u8>,
    collector: WriteCollector,
    dest: WriteDest,
}

/// Where a WRITE's accepted bytes go.
enum WriteDest {
    /// Gathered by the collector; the command runs once they are all
    /// there. The memory it holds, returned when it is dropped, and the
    /// command's window slot, freed when it is dropped unrun (aborted, or
    /// the connection is gone).
    Gather(Reservation, CommandSlot),
    /// Handed to a double-buffered WRITE's task, which owns the window
    /// slot and the budget ([`super::syncwrite`]); the task ends when its
    /// feed drops.
    Pipe(super::syncwrite::Feed),
}

#[allow(clippy::too_many_arguments)]
async fn full_feature(
    fabric: &Arc<Fabric>,
    session: &Arc<Session>,
    mut reader: PduReader<tokio::net::tcp::OwnedReadHalf>,
    mut writer: PduWriter,
    outcome: &LoginOutcome,
    local: SocketAddr,
    rdma: Option<Arc<Slot>>,
    mut cut: tokio::sync::watch::Receiver<bool>,
) {
    let exp_cmd_sn = outcome.exp_cmd_sn;
    let first_stat_sn = outcome.stat_sn.wrapping_add(1);
    let params = &session.params;
    let digests = digests_of(params);
    reader.framer = FrameDecoder::new(params.target_max_recv_data_segment_length, digests);
    writer.digests = digests;
    let shared = Shared::new(exp_cmd_sn, fabric.settings.queue_depth);
    writer.track_copies(shared.copies.clone());
    if fabric.settings.zero_copy_send && writer.enable_zero_copy() {
        debug!(
            tsih = session.tsih,
            "zero-copy sends (MSG_ZEROCOPY) for Data-In payloads of at least {} KiB",
            super::zerocopy::ZC_MIN >> 10
        );
    }
    // Room for a full window of responses plus their Data-In PDUs.
    let (tx, rx) = mpsc::channel::<Outgoing>(1024);
    let writer_task = tokio::spawn(write_loop(writer, rx, shared.clone(), first_stat_sn));

    let mut conn = Conn {
        fabric,
        session,
        shared: shared.clone(),
        tx: tx.clone(),
        collectors: HashMap::new(),
        text: TextExchange::from_outcome(fabric.catalog.clone(), outcome, local),
        limits: DataInLimits {
            max_recv_data_segment_length: params.initiator_max_recv_data_segment_length,
            max_burst_length: params.max_burst_length,
        },
        write_limits: WriteLimits {
            first_burst_length: params.first_burst_length,
            max_burst_length: params.max_burst_length,
            initial_r2t: params.initial_r2t,
            immediate_data: params.immediate_data,
            max_outstanding_r2t: params.max_outstanding_r2t,
            data_pdu_in_order: params.data_pdu_in_order,
        },
        next_ttt: 1,
        write_budget: WriteBudget::new(fabric.settings.write_budget_bytes),
        ping: None,
        logout_requested: false,
        rdma,
        sync_writes: Default::default(),
    };

    let mut stop = session.stop_signal();
    let my_generation = session.generation();
    let mut shutdown = fabric.shutdown.clone();
    let mut nop_timer = tokio::time::interval(
        fabric
            .settings
            .nop_interval
            .unwrap_or(Duration::from_secs(3600)),
    );
    nop_timer.tick().await;
    let mut logout_deadline: Option<tokio::time::Instant> = None;
    let mut was_cut = false;
    if *shutdown.borrow() {
        conn.request_logout().await;
        logout_deadline = Some(tokio::time::Instant::now() + fabric.settings.logout_grace);
    }

    loop {
        let deadline = logout_deadline
            .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86400));
        tokio::select! {
            next = reader.next() => match next {
                Ok(Some(pdu)) => {
                    if !conn.handle(pdu).await {
                        break;
                    }
                }
                Ok(None) => break,
                Err(ReadError::Decode { error, header, skip }) => {
                    let recoverable = skip.is_some() && matches!(error, DecodeError::UnknownOpcode(_));
                    warn!(tsih = session.tsih, error = %error, "bad PDU");
                    let reason = match error {
                        DecodeError::UnknownOpcode(_) => RejectReason::CommandNotSupported,
                        DecodeError::DataDigest { .. } => RejectReason::DataDigestError,
                        _ => RejectReason::ProtocolError,
                    };
                    if !matches!(error, DecodeError::HeaderDigest { .. }) {
                        conn.reject(reason, header.map(|h| h.to_vec()).unwrap_or_default()).await;
                    }
                    if !recoverable {
                        break;
                    }
                }
                Err(ReadError::Io(e)) => {
                    debug!(tsih = session.tsih, error = %e, "connection read failed");
                    break;
                }
            },
            _ = turns_true(&mut cut) => {
                warn!(tsih = session.tsih, initiator = %session.initiator_name, portal = %local, "portal closed: cutting the connection");
                was_cut = true;
                break;
            }
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() != my_generation {
                    info!(tsih = session.tsih, "connection replaced or reset: closing");
                    break;
                }
            }
            _ = shutdown.changed(), if logout_deadline.is_none() => {
                if *shutdown.borrow() {
                    conn.request_logout().await;
                    logout_deadline = Some(tokio::time::Instant::now() + fabric.settings.logout_grace);
                }
            }
            _ = tokio::time::sleep_until(deadline), if logout_deadline.is_some() => {
                info!(tsih = session.tsih, "initiator did not log out in time: closing");
                break;
            }
            _ = nop_timer.tick(), if fabric.settings.nop_interval.is_some() => {
                if let Some((_, sent)) = conn.ping {
                    if sent.elapsed() >= fabric.settings.nop_timeout {
                        warn!(tsih = session.tsih, initiator = %session.initiator_name, "no answer to NOP-In: dropping the connection");
                        break;
                    }
                } else {
                    conn.send_ping().await;
                }
            }
        }
    }
    // Abort whatever is still running: its responses have nowhere to go.
    // A connection that was replaced leaves the session's tasks alone: they
    // belong to the session, which lives on.
    if session.generation() == my_generation {
        session.tasks.abort_where(|_, _| true);
    }
    if was_cut {
        // As if the network went away: nothing more leaves, queued PDUs
        // included; dropping the writer closes the socket.
        writer_task.abort();
        let _ = writer_task.await;
        return;
    }
    let _ = tx.send(Outgoing::Close).await;
    drop(conn);
    drop(tx);
    let _ = tokio::time::timeout(Duration::from_secs(5), writer_task).await;
}

/// Sends PDUs in order, stamping sequence numbers as they leave.
async fn write_loop(
    mut writer: PduWriter,
    mut rx: mpsc::Receiver<Outgoing>,
    shared: Arc<Shared>,
    mut stat_sn: u32,
) {
    loop {
        // While zero-copy sends await the kernel's notification, an idle
        // writer reaps them so their buffers return to the pool.
        let first = if writer.zero_copy_pending() {
            tokio::select! {
                m = rx.recv() => m,
                r = writer.reap_zero_copy() => {
                    if r.is_err() {
                        return;
                    }
                    continue;
                }
            }
        } else {
            rx.recv().await
        };
        let Some(first) = first else {
            break;
        };
        let mut next = Some(first);
        // Drain what is queued before flushing, so small PDUs share writes.
        while let Some(item) = next.take() {
            match item {
                Outgoing::Close => {
                    let _ = writer.shutdown().await;
                    return;
                }
                Outgoing::Pdu(mut pdu) => {
                    let (exp, max) = {
                        let w = shared.window.lock().unwrap_or_else(|e| e.into_inner());
                        (w.exp_cmd_sn(), w.max_cmd_sn())
                    };
                    stamp(&mut pdu.bhs, stat_sn, exp, max);
                    if advances_stat_sn(&pdu.bhs) {
                        stat_sn = stat_sn.wrapping_add(1);
                    }
                    if writer.push(&pdu).await.is_err() {
                        return;
                    }
                }
                Outgoing::FileData {
                    mut bhs,
                    lun,
                    offset,
                    len,
                } => {
                    let (exp, max) = {
                        let w = shared.window.lock().unwrap_or_else(|e| e.into_inner());
                        (w.exp_cmd_sn(), w.max_cmd_sn())
                    };
                    stamp(&mut bhs, stat_sn, exp, max);
                    if advances_stat_sn(&bhs) {
                        stat_sn = stat_sn.wrapping_add(1);
                    }
                    if let Err(e) = writer
                        .push_file(&bhs, &lun.file, offset, len, &lun.label)
                        .await
                    {
                        if e.kind() == std::io::ErrorKind::UnexpectedEof {
                            // The header left already: the PDU cannot be
                            // completed or taken back.
                            tracing::error!(lun = %lun.label, error = %e, "sendfile READ came up short: dropping the connection");
                        } else {
                            debug!(lun = %lun.label, error = %e, "sendfile failed");
                        }
                        writer.abort();
                        return;
                    }
                }
            }
            next = rx.try_recv().ok();
        }
        if writer.flush().await.is_err() {
            return;
        }
    }
    let _ = writer.shutdown().await;
}

impl Conn<'_> {
    async fn send(&self, pdu: Pdu) {
        let _ = self.tx.send(Outgoing::Pdu(pdu)).await;
    }

    async fn reject(&self, reason: RejectReason, header: Vec<u8>) {
        let bhs = Bhs::Reject(Reject {
            reason,
            stat_sn: 0,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
            data_sn_or_r2t_sn: 0,
        });
        self.send(Pdu::with_data(bhs, header)).await;
    }

    fn new_ttt(&mut self) -> u32 {
        self.next_ttt = self.next_ttt.wrapping_add(1);
        if self.next_ttt == RESERVED_TAG {
            self.next_ttt = 1;
        }
        self.next_ttt
    }

    async fn send_ping(&mut self) {
        let ttt = self.new_ttt();
        self.ping = Some((ttt, tokio::time::Instant::now()));
        self.send(Pdu::new(Bhs::NopIn(NopIn {
            lun: Lun::default(),
            itt: RESERVED_TAG,
            ttt,
            stat_sn: 0,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
        })))
        .await;
    }

    async fn request_logout(&mut self) {
        if self.logout_requested {
            return;
        }
        self.logout_requested = true;
        info!(tsih = self.session.tsih, "asking the initiator to log out");
        let secs = self.fabric.settings.logout_grace.as_secs().min(3600) as u16;
        self.send(Pdu::new(Bhs::AsyncMessage(AsyncMessage {
            lun: Lun::default(),
            stat_sn: 0,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
            event: AsyncEvent::LogoutRequest,
            vcode: 0,
            parameter1: 0,
            parameter2: 0,
            parameter3: secs,
        })))
        .await;
    }

    /// Handles one PDU; false ends the connection.
    async fn handle(&mut self, pdu: Pdu) -> bool {
        let (cmd_sn, immediate, admitted) = match pdu.bhs {
            Bhs::ScsiCommand(c) => (c.cmd_sn, c.immediate, Admitted::Scsi(pdu)),
            Bhs::NopOut(n) => {
                if n.itt == RESERVED_TAG {
                    // The answer to our ping; it takes no CmdSN.
                    if self.ping.is_some_and(|(ttt, _)| ttt == n.ttt) {
                        self.ping = None;
                    }
                    return true;
                }
                (n.cmd_sn, n.immediate, Admitted::Nop(pdu))
            }
            Bhs::TextRequest(t) => (t.cmd_sn, t.immediate, Admitted::Text(pdu)),
            Bhs::TaskMgmtRequest(t) => (t.cmd_sn, t.immediate, Admitted::Tmf(t)),
            Bhs::LogoutRequest(l) => (l.cmd_sn, l.immediate, Admitted::Logout(l)),
            Bhs::DataOut(d) => return self.data_out(d, pdu.data).await,
            Bhs::SnackRequest(_) => {
                // ErrorRecoveryLevel 0: no SNACK support.
                self.reject(RejectReason::ProtocolError, pdu.bhs.encode(0, 0).to_vec())
                    .await;
                return true;
            }
            _ => {
                warn!(tsih = self.session.tsih, opcode = ?pdu.bhs.opcode(), "unexpected PDU in full feature phase");
                self.reject(
                    RejectReason::ProtocolError,
                    pdu.bhs.encode(0, pdu.data.len() as u32).to_vec(),
                )
                .await;
                return true;
            }
        };
        match self.shared.admit(cmd_sn, immediate, admitted) {
            Admission::Dropped => {
                debug!(
                    tsih = self.session.tsih,
                    cmd_sn, "CmdSN outside the window: dropped"
                );
                true
            }
            Admission::Queued => true,
            Admission::Deliver(items) => {
                for (item, slot) in items {
                    if !self.dispatch(item, slot).await {
                        return false;
                    }
                }
                true
            }
        }
    }

    async fn dispatch(&mut self, item: Admitted, slot: CommandSlot) -> bool {
        if let Admitted::Scsi(pdu) = item {
            self.scsi_command(pdu, slot).await;
            return true;
        }
        // The other requests hold no slot past here: MaxCmdSN opens before
        // their answer is stamped.
        drop(slot);
        match item {
            Admitted::Scsi(_) => unreachable!(),
            Admitted::Nop(pdu) => {
                let Bhs::NopOut(NopOut { lun, itt, .. }) = pdu.bhs else {
                    unreachable!()
                };
                let reply = Bhs::NopIn(NopIn {
                    lun,
                    itt,
                    ttt: RESERVED_TAG,
                    stat_sn: 0,
                    exp_cmd_sn: 0,
                    max_cmd_sn: 0,
                });
                // The ping data comes back as it was sent.
                self.send(Pdu::with_data(reply, pdu.data)).await;
                true
            }
            Admitted::Text(pdu) => {
                let Bhs::TextRequest(req) = pdu.bhs else {
                    unreachable!()
                };
                match self.text.on_request(&req, &pdu.data) {
                    TextStep::Respond(p) => self.send(p).await,
                    TextStep::Reject(p) => {
                        warn!(tsih = self.session.tsih, "text request rejected");
                        self.send(p).await;
                    }
                }
                true
            }
            Admitted::Tmf(req) => self.task_management(req).await,
            Admitted::Logout(req) => {
                let response = match req.reason {
                    LogoutReason::CloseSession | LogoutReason::CloseConnection => {
                        LogoutResponseCode::Closed
                    }
                    LogoutReason::RemoveForRecovery => LogoutResponseCode::RecoveryNotSupported,
                    LogoutReason::Other(_) => LogoutResponseCode::CleanupFailed,
                };
                info!(
                    tsih = self.session.tsih,
                    reason = req.reason.name(),
                    "logout"
                );
                self.send(Pdu::new(Bhs::LogoutResponse(LogoutResponse {
                    response,
                    itt: req.itt,
                    stat_sn: 0,
                    exp_cmd_sn: 0,
                    max_cmd_sn: 0,
                    time2wait: 0,
                    time2retain: 0,
                })))
                .await;
                response != LogoutResponseCode::Closed
            }
        }
    }

    /// Answers a command that will not run with `pdus`, after freeing its
    /// window slot (so they carry the MaxCmdSN it opened).
    async fn refuse(&self, slot: CommandSlot, pdus: Vec<Pdu>) {
        drop(slot);
        for p in pdus {
            self.send(p).await;
        }
    }

    async fn scsi_command(&mut self, pdu: Pdu, mut slot: CommandSlot) {
        let Bhs::ScsiCommand(cmd) = pdu.bhs else {
            unreachable!()
        };
        let cdb = pdu.full_cdb().unwrap_or_default();
        let edtl = cmd.expected_data_transfer_length;
        if self.session.is_discovery() {
            // Discovery sessions carry no SCSI commands (RFC 7143 §4.3.1).
            drop(slot);
            self.reject(RejectReason::ProtocolError, pdu.bhs.encode(0, 0).to_vec())
                .await;
            return;
        }
        if let Some(rdma) = self.rdma.clone() {
            match Descriptor::from_ahs(&pdu.ahs) {
                Ok(Some(desc)) => {
                    self.offloaded(cmd, cdb, desc, rdma, pdu.data.len(), slot)
                        .await;
                    return;
                }
                Ok(None) => {}
                Err(e) => {
                    warn!(tsih = self.session.tsih, itt = cmd.itt, error = %e, "bad RDMA descriptor");
                    let pdus = status_only(&cmd, CHECK_CONDITION, Some(bad_descriptor_sense()));
                    self.refuse(slot, pdus).await;
                    return;
                }
            }
        }
        if cmd.write && edtl > 0 {
            if edtl > self.fabric.settings.max_io_bytes {
                warn!(
                    tsih = self.session.tsih,
                    itt = cmd.itt,
                    edtl,
                    "write larger than the target buffers: refused"
                );
                let pdus = status_only(&cmd, CHECK_CONDITION, Some(too_large_sense()));
                self.refuse(slot, pdus).await;
                return;
            }
            let Some(budget) = self.write_budget.try_reserve(u64::from(edtl)) else {
                debug!(
                    tsih = self.session.tsih,
                    itt = cmd.itt,
                    edtl,
                    "write data budget full: TASK SET FULL"
                );
                self.refuse(slot, status_only(&cmd, TASK_SET_FULL, None))
                    .await;
                return;
            };
            let lease = self.sync_write_lease(&cmd, &cdb);
            let made = match lease {
                Some(_) => WriteCollector::validating,
                None => WriteCollector::new,
            }(edtl, &pdu.data, cmd.final_bit, self.write_limits);
            match made {
                Ok(collector) => {
                    self.register_task(&cmd, &mut slot);
                    let dest = match lease {
                        Some((path, lease)) => {
                            let feed = self.start_sync_write(&cmd, &cdb, path, lease, budget, slot);
                            feed.data(0, pdu.data.clone());
                            WriteDest::Pipe(feed)
                        }
                        None => WriteDest::Gather(budget, slot),
                    };
                    let c = Collecting {
                        cmd,
                        cdb,
                        collector,
                        dest,
                    };
                    self.advance_write(c).await;
                }
                Err(e) => {
                    warn!(tsih = self.session.tsih, itt = cmd.itt, error = %e, "bad immediate data");
                    drop(slot);
                    self.reject(RejectReason::ProtocolError, pdu.bhs.encode(0, 0).to_vec())
                        .await;
                }
            }
            return;
        }
        self.register_task(&cmd, &mut slot);
        self.execute(cmd, cdb, 0, Vec::new(), slot);
    }

    /// A command whose data moves by RDMA (its descriptor AHS names the
    /// initiator's buffers): no immediate data, no R2T, no Data-In.
    async fn offloaded(
        &mut self,
        cmd: ScsiCommand,
        cdb: Vec<u8>,
        desc: Descriptor,
        rdma: Arc<Slot>,
        immediate_len: usize,
        mut slot: CommandSlot,
    ) {
        let edtl = cmd.expected_data_transfer_length;
        let dir_ok = match desc.dir {
            Direction::Read => cmd.read && !cmd.write,
            Direction::Write => cmd.write && !cmd.read,
        };
        if !dir_ok
            || desc.len() != u64::from(edtl)
            || immediate_len != 0
            || edtl > self.fabric.settings.max_io_bytes
        {
            warn!(
                tsih = self.session.tsih,
                itt = cmd.itt,
                edtl,
                described = desc.len(),
                "RDMA descriptor does not fit the command: refused"
            );
            let pdus = status_only(&cmd, CHECK_CONDITION, Some(bad_descriptor_sense()));
            self.refuse(slot, pdus).await;
            return;
        }
        self.register_task(&cmd, &mut slot);
        self.execute_with(cmd, cdb, 0, Vec::new(), Some((rdma, desc)), None, slot);
    }

    /// The LUN's double-buffered write path and a buffer for this WRITE,
    /// when it can take that path (no I/O, never waits).
    fn sync_write_lease(
        &self,
        cmd: &ScsiCommand,
        cdb: &[u8],
    ) -> Option<(
        Arc<super::syncwrite::SyncWriteLun>,
        crate::datapath::BufLease,
    )> {
        let target = self.session.target.as_ref()?;
        let path = self
            .fabric
            .sync_writes
            .get(&target.name, cmd.lun.index()?)?;
        let stats = &self.fabric.sync_writes.stats;
        let lease = super::syncwrite::lease_for(&path, stats, &target.luns, cmd, cdb)?;
        Some((path, lease))
    }

    /// Starts a registered WRITE's double-buffered task.
    fn start_sync_write(
        &self,
        cmd: &ScsiCommand,
        cdb: &[u8],
        path: Arc<super::syncwrite::SyncWriteLun>,
        lease: crate::datapath::BufLease,
        budget: Reservation,
        slot: CommandSlot,
    ) -> super::syncwrite::Feed {
        let job = super::syncwrite::WriteJob {
            ctx: Arc::new(self.command_context(*cmd, cdb.to_vec(), slot)),
            path,
            budget,
            fabric: self.fabric.clone(),
        };
        super::syncwrite::spawn(job, lease, &self.sync_writes)
    }

    /// What a task of `cmd` in this (normal) session needs from the
    /// connection; `slot` is its window slot, registered as a task.
    fn command_context(&self, cmd: ScsiCommand, cdb: Vec<u8>, slot: CommandSlot) -> CommandContext {
        let aborted = slot
            .abort_flag()
            .cloned()
            .unwrap_or_else(|| Arc::new(std::sync::atomic::AtomicBool::new(true)));
        let target = self
            .session
            .target
            .as_ref()
            .expect("normal session has a target");
        CommandContext {
            cmd,
            cdb,
            luns: target.luns.clone(),
            nexus: self
                .session
                .nexus
                .clone()
                .expect("normal session has a nexus"),
            session: self.session.clone(),
            shared: self.shared.clone(),
            tx: self.tx.clone(),
            limits: self.limits,
            aborted,
            slot,
        }
    }

    /// Registers `cmd` in the session's task set, as `slot`'s task.
    fn register_task(&self, cmd: &ScsiCommand, slot: &mut CommandSlot) {
        slot.register(self.session, cmd.itt, cmd.lun.index().unwrap_or(u16::MAX));
    }

    async fn send_r2ts(&mut self, c: &mut Collecting) {
        let mut ttts = Vec::new();
        let reqs = c.collector.next_r2ts(|| {
            let t = self.next_ttt.wrapping_add(1 + ttts.len() as u32);
            ttts.push(t);
            t
        });
        self.next_ttt = self.next_ttt.wrapping_add(ttts.len() as u32);
        for r in reqs {
            self.send(Pdu::new(Bhs::R2t(R2t {
                lun: c.cmd.lun,
                itt: c.cmd.itt,
                ttt: r.ttt,
                stat_sn: 0,
                exp_cmd_sn: 0,
                max_cmd_sn: 0,
                r2t_sn: r.r2t_sn,
                buffer_offset: r.offset,
                desired_data_transfer_length: r.length,
            })))
            .await;
        }
    }

    async fn data_out(&mut self, d: DataOut, data: bytes::Bytes) -> bool {
        if !self.session.tasks.contains(d.itt) {
            // Aborted from elsewhere (another initiator's LUN reset or
            // PREEMPT AND ABORT) while its data was arriving: drop the
            // partial data and free the window slot now.
            self.collectors.remove(&d.itt);
            return true;
        }
        let Some(mut c) = self.collectors.remove(&d.itt) else {
            // Data for a task that was aborted, or never existed.
            debug!(
                tsih = self.session.tsih,
                itt = d.itt,
                "Data-Out for no pending write: ignored"
            );
            return true;
        };
        if let Err(e) =
            c.collector
                .on_data_out(d.ttt, d.data_sn, d.buffer_offset, &data, d.final_bit)
        {
            // The command fails and is never executed, so no byte of it
            // reaches the disk; the connection stays up (libiscsi's
            // iSCSIDataSnInvalid expects exactly this). Later Data-Out PDUs
            // of the same task find no collector and are dropped.
            warn!(tsih = self.session.tsih, itt = d.itt, error = %e, "Data-Out sequence error: command failed");
            if let WriteDest::Pipe(feed) = c.dest {
                // Its task answers once its chunk writes ended (some may
                // have reached the disk: see syncwrite).
                feed.failed();
                return true;
            }
            // Forgotten, its window slot freed, before the status leaves.
            let WriteDest::Gather(_, slot) = c.dest else {
                unreachable!("the double-buffered case returned above")
            };
            let pdus = status_only(&c.cmd, CHECK_CONDITION, Some(data_phase_error_sense()));
            self.refuse(slot, pdus).await;
            return true;
        }
        if let WriteDest::Pipe(feed) = &c.dest {
            feed.data(d.buffer_offset, data);
        }
        self.advance_write(c).await;
        true
    }

    /// A WRITE whose data is complete runs; otherwise it asks for more data
    /// (R2Ts within MaxOutstandingR2T) and waits for it.
    async fn advance_write(&mut self, mut c: Collecting) {
        if c.collector.is_complete() {
            let r2ts = c.collector.r2t_count();
            match c.dest {
                WriteDest::Gather(budget, slot) => self.execute_with(
                    c.cmd,
                    c.cdb,
                    r2ts,
                    c.collector.into_data(),
                    None,
                    Some(budget),
                    slot,
                ),
                WriteDest::Pipe(feed) => feed.complete(r2ts),
            }
        } else {
            self.send_r2ts(&mut c).await;
            self.collectors.insert(c.cmd.itt, c);
        }
    }

    /// Runs a command on the blocking pool and sends its answer.
    fn execute(
        &self,
        cmd: ScsiCommand,
        cdb: Vec<u8>,
        r2t_count: u32,
        data_out: Vec<u8>,
        slot: CommandSlot,
    ) {
        self.execute_with(cmd, cdb, r2t_count, data_out, None, None, slot)
    }

    /// [`Self::execute`], with the data moved by RDMA when `offload` is set:
    /// WRITE data is RDMA-Read before execution, READ data RDMA-Written
    /// before the SCSI Response (which then carries no data).
    #[allow(clippy::too_many_arguments)]
    fn execute_with(
        &self,
        cmd: ScsiCommand,
        cdb: Vec<u8>,
        r2t_count: u32,
        data_out: Vec<u8>,
        offload: Option<(Arc<Slot>, Descriptor)>,
        budget: Option<Reservation>,
        slot: CommandSlot,
    ) {
        if slot.is_aborted() {
            // Aborted (e.g. by another initiator's LUN reset) before its
            // data was complete: never executed (dropping the slot frees
            // its window slot).
            return;
        }
        let target = self
            .session
            .target
            .clone()
            .expect("normal session has a target");
        let digest = digests_of(&self.session.params).data;
        let route = mover::choose(self.fabric, &target.name, &cmd, &cdb, offload, digest);
        let ctx = Arc::new(self.command_context(cmd, cdb, slot));
        match route.road {
            Road::Core => {
                tokio::spawn(mover::core_road(
                    ctx, route.wire, data_out, budget, r2t_count,
                ));
            }
            Road::File(lun) => {
                tokio::spawn(super::sendfile::serve(ctx, lun));
            }
            Road::Engine(path) => {
                let job = super::syncread::ReadJob {
                    ctx,
                    path: path.clone(),
                    data_pdu_in_order: self.write_limits.data_pdu_in_order,
                    received: std::time::Instant::now(),
                };
                match route.wire {
                    Wire::Tcp => {
                        // Debug copy counter: the engine reads into
                        // registered buffers (a kernel copy unless
                        // O_DIRECT). A --no-net READ counts itself
                        // (CopyPath::NoNet).
                        self.shared.copies.begin(
                            cmd.itt,
                            CopyPath::Engine,
                            Counts::default(),
                            !path.direct,
                        );
                        let m = mover::DataIn::engine(path);
                        tokio::spawn(super::syncread::serve(job, m));
                    }
                    Wire::NoNet => {
                        let m = mover::Discard {
                            buffered: !path.direct,
                        };
                        tokio::spawn(super::syncread::serve(job, m));
                    }
                    Wire::Rdma(p) => {
                        let m = mover::RdmaWrite::new(p);
                        tokio::spawn(super::syncread::serve(job, m));
                    }
                }
            }
        }
    }

    async fn task_management(&mut self, req: TaskMgmtRequest) -> bool {
        let lun = req.lun.index().unwrap_or(u16::MAX);
        let target = self.session.target.clone();
        let mut close_after = false;
        let response = match (&target, req.function) {
            (None, _) => TmfResponse::NotSupported,
            (Some(_), TmfFunction::AbortTask) => {
                // With one connection per session commands arrive in CmdSN
                // order, so a task that is not registered has completed (or
                // never existed): "task does not exist", as libiscsi expects.
                if self
                    .abort_where(|itt, _| itt == req.referenced_task_tag)
                    .await
                    > 0
                {
                    TmfResponse::FunctionComplete
                } else {
                    TmfResponse::TaskDoesNotExist
                }
            }
            (Some(t), TmfFunction::AbortTaskSet | TmfFunction::ClearTaskSet) => {
                if !t.luns.has_lun(lun) {
                    TmfResponse::LunDoesNotExist
                } else {
                    self.abort_where(|_, task_lun| task_lun == lun).await;
                    TmfResponse::FunctionComplete
                }
            }
            (Some(t), TmfFunction::LogicalUnitReset) => {
                if !t.luns.has_lun(lun) {
                    TmfResponse::LunDoesNotExist
                } else {
                    self.abort_where(|_, task_lun| task_lun == lun).await;
                    self.fabric.sessions.abort_target_tasks(t, Some(lun));
                    if let Some(nexus) = &self.session.nexus {
                        t.luns.reset_lun(lun, nexus);
                    }
                    TmfResponse::FunctionComplete
                }
            }
            (Some(t), TmfFunction::TargetWarmReset | TmfFunction::TargetColdReset) => {
                self.abort_where(|_, _| true).await;
                self.fabric.sessions.abort_target_tasks(t, None);
                if let Some(nexus) = &self.session.nexus {
                    t.luns.reset_target(nexus);
                }
                // A cold reset also drops the connections (RFC 7143 §11.5.1).
                close_after = req.function == TmfFunction::TargetColdReset;
                TmfResponse::FunctionComplete
            }
            (Some(_), TmfFunction::ClearAca) => TmfResponse::FunctionComplete,
            (Some(_), TmfFunction::TaskReassign) => TmfResponse::ReassignmentNotSupported,
            (Some(_), TmfFunction::Other(_)) => TmfResponse::NotSupported,
        };
        info!(
            tsih = self.session.tsih,
            function = req.function.name(),
            lun,
            response = response.name(),
            "task management"
        );
        self.send(Pdu::new(Bhs::TaskMgmtResponse(TaskMgmtResponse {
            response,
            itt: req.itt,
            stat_sn: 0,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
        })))
        .await;
        !close_after
    }

    /// Aborts the tasks `pick` selects (by ITT and LUN); returns how many
    /// were aborted. Tasks already completing are let finish, and this waits
    /// (boundedly) until their responses are queued, so the task management
    /// response follows them on the wire.
    async fn abort_where(&mut self, pick: impl Fn(u32, u16) -> bool) -> usize {
        let outcome = self.session.tasks.abort_where(pick);
        for itt in &outcome.aborted {
            // Never executed: dropping it frees its window slot.
            self.collectors.remove(itt);
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        // Aborted double-buffered WRITEs first end their chunk writes, so
        // none lands after the initiator hears of the abort.
        self.sync_writes
            .wait_drained(&outcome.aborted, deadline)
            .await;
        for itt in &outcome.completing {
            while self.session.tasks.contains(*itt) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        outcome.aborted.len()
    }
}

/// Sense data for an RDMA descriptor that does not match its command:
/// ILLEGAL REQUEST, INVALID FIELD IN CDB.
fn bad_descriptor_sense() -> Vec<u8> {
    use blockwire_pdu::scsi::{Asc, Sense, SenseFormat};
    Sense::illegal_request(Asc::INVALID_FIELD_IN_CDB, None).encode(SenseFormat::Fixed)
}

/// Sense data for a transfer larger than the target will buffer: ILLEGAL
/// REQUEST, INVALID FIELD IN CDB, pointing at the transfer length.
fn too_large_sense() -> Vec<u8> {
    use blockwire_pdu::scsi::{Asc, FieldPointer, Sense, SenseFormat};
    Sense::illegal_request(Asc::INVALID_FIELD_IN_CDB, Some(FieldPointer::cdb(7, None)))
        .encode(SenseFormat::Fixed)
}
