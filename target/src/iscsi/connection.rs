//! One connection's tokio driver: it reads PDUs, feeds them with the time
//! to the connection's state machines ([`LoginPhase`], then
//! [`ConnMachine`]) and carries out what they return; commands start
//! through the [`Launcher`]; a writer task sends every PDU, stamping
//! StatSN, ExpCmdSN and MaxCmdSN as it leaves, so numbering follows send
//! order. The driver is generic over the byte stream ([`serve_stream`]);
//! TCP connections ([`serve_until_cut`]) get gathered, zero-copy and
//! sendfile sends.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use blockwire_pdu::keys::{Digest, SessionParams};
use blockwire_pdu::{Bhs, Digests, FrameDecoder, Pdu};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::batch_nap::BatchNap;
use super::busy_poll::{BusyPoll, NextStatSn};
use super::early_responses::{this_thread_cpu, EarlyResponses};
use super::file_map::MAX_PARTS;
use super::io::{
    advances_stat_sn, exp_stat_sn, stamp, FilePayload, PduReader, PduWriter, ReadError,
};
use super::launch::Launcher;
use super::login::LoginOutcome;
use super::machine::{Action, ConnMachine, LoginAction, LoginPhase, Shared};
use super::send_stall::is_stall;
use super::session::{PendingSession, Session};
use super::Fabric;

/// An in-memory driver of this connection for the stateful fuzz targets.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;

/// An RDMA offload grant bound to a session: its token and its slot in the
/// target's RDMA service.
/// A session's RDMA offload grant: its token, registered with the RDMA
/// service from just before the final Login Response carries it, stops
/// working when the grant is dropped. That is at the connection's end, or
/// with the login itself when it fails, times out or is cut (its portal
/// closed) before that response is sent: a token no initiator was told
/// must not stay bound to the session's TSIH.
struct RdmaGrant {
    token: [u8; blockwire_transport::assist::TOKEN_LEN],
    slot: Arc<super::rdma::Slot>,
    service: Arc<super::rdma::RdmaService>,
}

impl Drop for RdmaGrant {
    fn drop(&mut self) {
        self.service.unregister(&self.token);
    }
}

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
    cut: tokio::sync::watch::Receiver<bool>,
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
    let writer = PduWriter::new(wr);
    drive(fabric, PduReader::new(rd), writer, tpgt, local, peer, cut).await
}

/// [`serve_until_cut`] over any byte stream `stream` (an in-memory pipe in
/// tests, another transport later), as if accepted on `local` from `peer`.
pub async fn serve_stream<S>(
    fabric: Arc<Fabric>,
    stream: S,
    tpgt: u16,
    local: SocketAddr,
    peer: Option<SocketAddr>,
    cut: tokio::sync::watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (rd, wr) = tokio::io::split(stream);
    let writer = PduWriter::over_stream(wr);
    drive(fabric, PduReader::new(rd), writer, tpgt, local, peer, cut).await
}

/// Login, then the full feature phase, then the session's end.
async fn drive<R: AsyncRead + Unpin>(
    fabric: Arc<Fabric>,
    mut reader: PduReader<R>,
    mut writer: PduWriter,
    tpgt: u16,
    local: SocketAddr,
    peer: Option<SocketAddr>,
    mut cut: tokio::sync::watch::Receiver<bool>,
) {
    // A connection past the bound on logins in progress is closed before
    // it is read: it holds nothing but its socket, and only for a moment.
    let slot = match fabric.login_slots.take(peer.map(|p| p.ip())) {
        Ok(slot) => slot,
        Err(no_slot) => {
            warn!(
                ?peer,
                "connection closed at once: {no_slot}; raise that setting if so many initiators log in at once"
            );
            return;
        }
    };
    let logged_in = tokio::select! {
        l = login(&fabric, &mut reader, &mut writer, tpgt, local, peer) => l,
        _ = turns_true(&mut cut) => {
            // Dropped at once, as a cut connection is: nothing queued is
            // flushed to a peer that may not be reading.
            info!(?peer, "portal closed: connection cut during login");
            return;
        }
    };
    let (session, generation, outcome, rdma) = match logged_in {
        Ok(logged_in) => logged_in,
        Err(ended) => {
            // The login slot is held until the connection is gone: a peer
            // that keeps its end open meanwhile still counts against
            // max_logins_in_progress.
            let linger = ended == LoginEnded::Answered;
            close_after_login(&mut writer, &mut reader, &mut cut, linger).await;
            drop(slot);
            return;
        }
    };
    // Subscribed before the look below: a stop that comes after it wakes
    // the full feature loop, one that came before (between the attach and
    // here) shows in the value.
    let stop = session.stop_signal();
    if *stop.borrow() != generation {
        info!(
            tsih = session.tsih,
            initiator = %session.initiator_name,
            ?peer,
            "session closed or taken over before its full feature phase began: closing"
        );
        drop(rdma);
        close_after_login(&mut writer, &mut reader, &mut cut, true).await;
        drop(slot);
        return;
    }
    drop(slot);
    info!(
        tsih = session.tsih,
        initiator = %session.initiator_name,
        target = session.target.as_ref().map(|t| t.name.as_str()).unwrap_or("discovery"),
        ?peer,
        "login complete: full feature phase"
    );
    let machine = ConnMachine::new(
        fabric.clone(),
        session.clone(),
        generation,
        &outcome,
        local,
        rdma.as_ref().map(|r| r.slot.clone()),
        std::time::Instant::now(),
    );
    full_feature(
        &fabric, &session, generation, stop, machine, reader, writer, &outcome, local, cut,
    )
    .await;
    drop(rdma);
    // The session ends with its only connection (ErrorRecoveryLevel 0),
    // unless a logout ended it already.
    fabric.sessions.end(&session, generation);
    info!(tsih = session.tsih, initiator = %session.initiator_name, "connection closed");
}

/// Runs the login phase: the session and the login's outcome, or how it
/// ended without one (refused, timed out or gone; what the initiator must
/// hear was sent).
async fn login<R: AsyncRead + Unpin>(
    fabric: &Arc<Fabric>,
    reader: &mut PduReader<R>,
    writer: &mut PduWriter,
    tpgt: u16,
    local: SocketAddr,
    peer: Option<SocketAddr>,
) -> Result<(Arc<Session>, u64, Box<LoginOutcome>, Option<RdmaGrant>), LoginEnded> {
    use rand::SeedableRng;
    let mut phase = LoginPhase::new(
        fabric.clone(),
        tpgt,
        local,
        rand::rngs::StdRng::from_entropy(),
    )
    .from_peer(peer.map(|p| p.ip()));
    let deadline = tokio::time::Instant::now() + fabric.settings.login_deadline;
    let past_deadline = || {
        info!(
            ?peer,
            deadline = ?fabric.settings.login_deadline,
            "login not done within its deadline: closed"
        );
    };
    loop {
        let wait = fabric
            .settings
            .login_timeout
            .min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        let action = match tokio::time::timeout(wait, reader.next()).await {
            Err(_) if tokio::time::Instant::now() >= deadline => {
                past_deadline();
                return Err(LoginEnded::Silently);
            }
            Err(_) => {
                info!(?peer, "login timed out");
                return Err(LoginEnded::Silently);
            }
            Ok(Ok(Some(p))) => phase.on_pdu(&p),
            Ok(Ok(None)) => return Err(LoginEnded::Silently),
            Ok(Err(ReadError::Decode { error, header, .. })) => {
                info!(?peer, %error, "undecodable PDU during login");
                phase.on_undecodable(header.as_ref(), &error.to_string())
            }
            Ok(Err(e)) => {
                info!(?peer, error = %e, "login aborted");
                return Err(LoginEnded::Silently);
            }
        };
        match action {
            LoginAction::Respond(resp) => {
                if let Err(e) = send_login_response(writer, &resp, deadline).await {
                    info!(?peer, error = %e, "Login Response not sent: login ended");
                    return Err(LoginEnded::Silently);
                }
            }
            LoginAction::Refuse(resp) => {
                info!(?peer, "login refused");
                let now = tokio::time::Instant::now();
                let told = now
                    + fabric
                        .auth_failures
                        .refusal_delay(peer.map(|p| p.ip()), &resp, now);
                tokio::time::sleep_until(told.min(deadline)).await;
                return Err(match send_login_response(writer, &resp, deadline).await {
                    Ok(()) => LoginEnded::Answered,
                    Err(_) => LoginEnded::Silently,
                });
            }
            LoginAction::LoggedIn {
                response,
                session,
                generation,
                still_changing_medium,
                outcome,
            } => {
                let pending = PendingSession::new(&fabric.sessions, session, generation);
                medium_settled_before_login_ends(&still_changing_medium, pending.session()).await;
                // The token is bound to the session before the final Login Response
                // carries it: an initiator may open its RDMA connection the moment
                // it reads the grant.
                let rdma = grant_rdma_offload(fabric, pending.session(), &outcome);
                if let Err(e) = send_login_response(writer, &response, deadline).await {
                    info!(?peer, error = %e, "final Login Response not sent: the session ends");
                    return Err(LoginEnded::Silently);
                }
                let (session, generation) = pending.begin();
                return Ok((session, generation, outcome, rdma));
            }
        }
    }
}

/// How long a connection that ends in its login phase has to flush what
/// it queued (a refusal's Login Response) and see its peer close its end
/// before it closes.
const LOGIN_LINGER: Duration = Duration::from_secs(5);

/// How much a peer may still send, once its login has ended, before the
/// connection closes without waiting for its end.
const LOGIN_LINGER_BYTES: usize = 1 << 20;

/// How a login phase ended without a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LoginEnded {
    /// A Login Response told the initiator why (a refusal).
    Answered,
    /// Nothing could be told: the login timed out, or its peer left or
    /// stopped reading.
    Silently,
}

/// Closes a connection whose login ended, within [`LOGIN_LINGER`] (a peer
/// that stopped reading would hold the flush, and the connection, for
/// good) or at once when the portal is cut: its last Login Response
/// flushed and its sending side shut (a FIN), then, when `linger` (a
/// response the peer must read was sent), what the peer still sends (the
/// rest of a refused PDU, requests it pipelined) read and dropped until it
/// closes its end. Closed with those bytes unread, the socket would end
/// with a reset, which can cost the peer the Login Response telling it
/// why. A login that timed out has nothing to tell, and its silent peer
/// would hold the connection for the whole linger.
async fn close_after_login<R: AsyncRead + Unpin>(
    writer: &mut PduWriter,
    reader: &mut PduReader<R>,
    cut: &mut tokio::sync::watch::Receiver<bool>,
    linger: bool,
) {
    let linger = async {
        if writer.shutdown().await.is_ok() && linger {
            reader.discard_until_end(LOGIN_LINGER_BYTES).await;
        }
    };
    tokio::select! {
        _ = tokio::time::timeout(LOGIN_LINGER, linger) => {}
        _ = turns_true(cut) => {}
    }
}

/// Sends one Login Response, by the login's `deadline`: a peer that stops
/// reading cannot hold the connection in its login phase for good.
async fn send_login_response(
    writer: &mut PduWriter,
    response: &Pdu,
    deadline: tokio::time::Instant,
) -> std::io::Result<()> {
    let send = async {
        writer.push(response).await?;
        writer.flush().await
    };
    tokio::time::timeout_at(deadline, send)
        .await
        .unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the login's deadline passed while its peer was not reading",
            ))
        })
}

/// Waits, at most 5 s as an abort's answer does, until the commands the
/// login aborted (those of the session it reinstated, or of the connection
/// it replaced) that may still change the medium have left it, so that
/// none lands over what the initiator writes once it has its final Login
/// Response (RFC 7143 §6.3.5: the old session's tasks end before the new
/// one serves).
pub(super) async fn medium_settled_before_login_ends(
    still_changing_medium: &[Arc<std::sync::atomic::AtomicUsize>],
    session: &Session,
) {
    if still_changing_medium.is_empty() {
        return;
    }
    let running =
        super::session::await_medium_settled(still_changing_medium, Duration::from_secs(5)).await;
    if running > 0 {
        warn!(
            tsih = session.tsih,
            commands = running,
            "login answered with the replaced commands still in the backstore after 5s"
        );
    }
}

/// The session's RDMA offload slot when the login granted offload: the token is
/// registered to the session (never with data digests, which offloaded data
/// cannot carry).
fn grant_rdma_offload(
    fabric: &Fabric,
    session: &Session,
    outcome: &LoginOutcome,
) -> Option<RdmaGrant> {
    match (outcome.rdma_token, fabric.rdma.get()) {
        (Some(token), Some(svc)) if outcome.params.data_digest != Digest::Crc32c => {
            info!(tsih = session.tsih, "RDMA offload granted");
            Some(RdmaGrant {
                token,
                slot: svc.register(token, session.tsih),
                service: svc.clone(),
            })
        }
        _ => None,
    }
}

fn digests_of(params: &SessionParams) -> Digests {
    Digests {
        header: params.header_digest == Digest::Crc32c,
        data: params.data_digest == Digest::Crc32c,
    }
}

/// Why the full feature loop stopped.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Stop {
    /// Flush what is queued and close.
    Close,
    /// The portal was closed: drop the connection with nothing more sent.
    Cut,
}

#[allow(clippy::too_many_arguments)]
async fn full_feature<R: AsyncRead + Unpin>(
    fabric: &Arc<Fabric>,
    session: &Arc<Session>,
    my_generation: u64,
    mut stop: tokio::sync::watch::Receiver<u64>,
    mut machine: ConnMachine,
    mut reader: PduReader<R>,
    mut writer: PduWriter,
    outcome: &LoginOutcome,
    local: SocketAddr,
    mut cut: tokio::sync::watch::Receiver<bool>,
) {
    let first_stat_sn = outcome.stat_sn.wrapping_add(1);
    // Digests and the target's MaxRecvDataSegmentLength are this
    // connection's own (RFC 7143 §13.1, §13.12): a connection that joins a
    // session (TSIH given) negotiated them afresh.
    let params = &outcome.params;
    let digests = digests_of(params);
    reader.framer = FrameDecoder::new(params.target_max_recv_data_segment_length, digests);
    writer.digests = digests;
    let shared = machine.shared().clone();
    writer.track_copies(shared.copies.clone());
    // An initiator on this host gets copying sends: over loopback the
    // kernel copies MSG_ZEROCOPY payloads at delivery anyway (and says so
    // in every notification), and sendfile costs more than one copy (see
    // super::file_map).
    let local_copies = fabric.settings.local_copy_sends
        && peer_on_this_host(&writer, local)
        && writer.copy_local_sends();
    if local_copies {
        debug!(
            tsih = session.tsih,
            "initiator on this host: copying sends (no MSG_ZEROCOPY; large READ payloads of in-memory files from their mapping)"
        );
    } else if fabric.settings.zero_copy_send && writer.enable_zero_copy() {
        debug!(
            tsih = session.tsih,
            "zero-copy sends (MSG_ZEROCOPY) for Data-In payloads of at least {} KiB",
            super::zerocopy::ZC_MIN >> 10
        );
    }
    let next_stat_sn = NextStatSn::new(first_stat_sn);
    let mut busy_poll = fabric.settings.busy_poll.and_then(|budget| {
        let stream = writer.tcp_stream()?;
        BusyPoll::new(
            stream,
            budget,
            next_stat_sn.clone(),
            fabric.busy_poll_neighbours.clone(),
        )
        .inspect_err(
            |e| warn!(tsih = session.tsih, error = %e, "busy polling off for this connection"),
        )
        .ok()
    });
    // Room for a full window of responses plus their Data-In PDUs.
    let (tx, rx) = mpsc::channel::<Outgoing>(1024);
    let writer_cut = writer.cut_flag();
    // An initiator that takes no data for as long as it may leave a NOP-In
    // unanswered is as gone as one that does not answer (see
    // `send_stall`): the writer gives up, and its end (the queue closed)
    // ends the connection.
    writer.limit_stalls(fabric.settings.nop_timeout);
    let writer_progress = writer.progress();
    let mut writer_task = tokio::spawn(write_loop(writer, rx, shared.clone(), next_stat_sn));
    let mut launcher = Launcher::new(fabric, session, &machine, tx.clone());
    launcher.writer_progress = writer_progress;

    let mut shutdown = fabric.shutdown.clone();
    let mut actions = Vec::new();
    // PDUs the last socket read brought, for busy polling and early responses.
    let mut pdus_this_read = 0u32;
    // Only where the writer shares the reader's thread: on the shared
    // workers it runs beside the reader anyway.
    let mut early_responses = fabric
        .connection_threads
        .is_some()
        .then(EarlyResponses::new);
    // Naps between batches: only on a connection thread (a shared worker
    // must not sleep) and with busy polling on (its neighbours and reads).
    let mut batch_nap = (early_responses.is_some() && busy_poll.is_some()).then(BatchNap::new);
    let mut shutting_down = *shutdown.borrow();
    if shutting_down {
        actions = machine.on_shutdown(std::time::Instant::now());
    }
    let mut pause_after_actions = false;
    // What the timer waits for while the machine has no deadline.
    let far_off = || tokio::time::Instant::now() + Duration::from_secs(365 * 86400);
    let mut no_deadline = far_off();
    let timer = tokio::time::sleep_until(no_deadline);
    tokio::pin!(timer);
    let why = loop {
        // Stopped (the session closed, reinstated or joined by another
        // connection): no command read on this connection runs any more,
        // not even those already read (ErrorRecoveryLevel 0); a command
        // started now would act for a nexus already released or a session
        // another connection owns.
        if stop.has_changed().unwrap_or(true) && *stop.borrow() != my_generation {
            info!(tsih = session.tsih, "connection replaced or reset: closing");
            break Stop::Close;
        }
        if let Some(stop) = carry_out(&mut launcher, std::mem::take(&mut actions)).await {
            break stop;
        }
        if std::mem::take(&mut pause_after_actions) {
            tokio::task::yield_now().await;
        }
        // Commands already received are handled before the connection
        // waits: one socket read often brings several, and each select
        // below polls the timer and three watches.
        if let Some(next) = reader.next_buffered() {
            pdus_this_read += 1;
            heard(&mut busy_poll, next.as_ref().ok());
            match on_read(&mut machine, next.map(Some), session) {
                Ok(a) => actions = a,
                Err(stop) => break stop,
            }
            if early_responses
                .as_ref()
                .is_some_and(|early| early.pause_after(pdus_this_read))
            {
                // Once this command is carried out, the writer sends what
                // the batch has produced so far.
                pause_after_actions = true;
            }
            continue;
        }
        let waits_at = std::time::Instant::now();
        if let Some(early) = &mut early_responses {
            early.at_wait(waits_at, this_thread_cpu);
        }
        if let Some(poll) = &mut busy_poll {
            let pdus = std::mem::take(&mut pdus_this_read);
            poll.note_read(pdus);
            if let Some(nap) = &mut batch_nap {
                nap.note_read(pdus);
                let allowed = early_responses.as_ref().is_some_and(EarlyResponses::spare)
                    && poll.reads_bring_several()
                    && poll.alone_awake();
                if let Some(length) = nap.at_wait(waits_at, allowed) {
                    // The answers leave first; the nap holds the thread,
                    // which no other connection needs now (see batch_nap).
                    tokio::task::yield_now().await;
                    std::thread::sleep(length);
                }
            }
            // Whether or not the next PDU came in the budget, the select
            // below reads it: found, it is already in epoll's ready list,
            // so the wait below does not sleep.
            poll.until_readable().await;
            poll.sleeps();
        }
        // One timer for the connection's life, moved only when the deadline
        // does: a timer registered afresh for each wait that falls due
        // before the runtime's next wake-up makes the runtime write its
        // eventfd to wake itself (most socket reads of a QD1 connection).
        let deadline = machine
            .poll_timeout()
            .map_or(no_deadline, tokio::time::Instant::from_std);
        if timer.deadline() != deadline {
            timer.as_mut().reset(deadline);
        }
        tokio::select! {
            next = reader.next() => {
                heard(&mut busy_poll, next.as_ref().ok().and_then(Option::as_ref));
                match on_read(&mut machine, next, session) {
                    Ok(a) => {
                        pdus_this_read = 1;
                        actions = a;
                    }
                    Err(stop) => break stop,
                }
            }
            _ = turns_true(&mut cut) => {
                warn!(tsih = session.tsih, initiator = %session.initiator_name, portal = %local, "portal closed: cutting the connection");
                break Stop::Cut;
            }
            _ = tx.closed() => {
                // The writer gave up (the initiator took no data for the
                // NOP timeout) or its socket failed: nothing more can be
                // answered.
                info!(tsih = session.tsih, initiator = %session.initiator_name, "the connection's writer ended: closing");
                break Stop::Cut;
            }
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() != my_generation {
                    info!(tsih = session.tsih, "connection replaced or reset: closing");
                    break Stop::Close;
                }
            }
            _ = turns_true(&mut shutdown), if !shutting_down => {
                shutting_down = true;
                actions = machine.on_shutdown(std::time::Instant::now());
            }
            _ = &mut timer => {
                actions = machine.on_timeout(std::time::Instant::now());
                if deadline == no_deadline {
                    // A connection older than a year: a new far deadline.
                    no_deadline = far_off();
                }
            }
        }
        if let Some(poll) = &mut busy_poll {
            poll.wakes();
        }
    };
    // Abort whatever is still running: its responses have nowhere to go.
    // A connection that was replaced leaves the session's tasks alone: they
    // belong to the session, which lives on; a session no longer in the
    // table (closed, reinstated) has no one else to end what this
    // connection started.
    if !session.abort_tasks_if_owned_by(my_generation) && !fabric.sessions.holds(session) {
        session.tasks.abort_where(|_, _| true);
    }
    // WRITEs still collecting data go with the machine (never executed).
    drop(machine);
    if let Stop::Cut = why {
        // As if the network went away: nothing more leaves, queued PDUs
        // included; dropping the writer closes the socket (resetting it
        // when the kernel still holds zero-copy sends).
        writer_cut.store(true, std::sync::atomic::Ordering::Release);
        writer_task.abort();
        let _ = writer_task.await;
        return;
    }
    // Closing the queue closes the socket after what is queued, as Close
    // does; a full queue (a writer that cannot send) does not hold this up.
    let _ = tx.try_send(Outgoing::Close);
    drop(launcher);
    drop(tx);
    if tokio::time::timeout(Duration::from_secs(5), &mut writer_task)
        .await
        .is_err()
    {
        // A writer stuck on a socket the initiator does not read: dropping
        // it closes the socket (resetting it, as for a cut).
        writer_cut.store(true, std::sync::atomic::Ordering::Release);
        writer_task.abort();
        let _ = writer_task.await;
    }
}

/// Whether the initiator runs on this host: its address is a loopback one,
/// or the address it reached (`local`) is its own. Such a connection never
/// leaves the host, and its receiving side of TCP runs on the host's CPUs.
fn peer_on_this_host(writer: &PduWriter, local: SocketAddr) -> bool {
    writer
        .tcp_stream()
        .and_then(|s| s.peer_addr().ok())
        .is_some_and(|peer| peer.ip().is_loopback() || peer.ip() == local.ip())
}

/// Tells the busy poll, if any, what the initiator acknowledged with the
/// PDU just read.
fn heard(busy_poll: &mut Option<BusyPoll>, pdu: Option<&Pdu>) {
    // Without a poll (busy polling off) the header is not looked at.
    let Some(poll) = busy_poll else {
        return;
    };
    if let Some(exp) = pdu.and_then(|p| exp_stat_sn(&p.bhs)) {
        poll.note_exp_stat_sn(exp);
    }
}

/// What the machine makes of a read: its actions, or why the connection
/// ends (the initiator closed it, or the socket failed).
fn on_read(
    machine: &mut ConnMachine,
    read: Result<Option<Pdu>, ReadError>,
    session: &Session,
) -> Result<Vec<Action>, Stop> {
    match read {
        Ok(Some(pdu)) => Ok(machine.on_pdu(pdu, std::time::Instant::now())),
        Ok(None) => Err(Stop::Close),
        Err(ReadError::Decode {
            error,
            header,
            skip,
        }) => Ok(machine.on_decode_error(&error, header.as_ref().map(|h| &h[..]), skip.is_some())),
        Err(ReadError::Io(e)) => {
            debug!(tsih = session.tsih, error = %e, "connection read failed");
            Err(Stop::Close)
        }
    }
}

/// The least a writer must send in a NOP timeout for the connection's
/// reader to go on waiting on its full queue: far below any link an
/// initiator would run on (4 kbit/s at the default NOP timeout of 30 s).
const MIN_WRITER_PROGRESS: u64 = 16 << 10;

/// Carries out the machine's actions in order; Some once the connection
/// must end.
pub(super) async fn carry_out(launcher: &mut Launcher, actions: Vec<Action>) -> Option<Stop> {
    for action in actions {
        match action {
            Action::Send(pdu) => {
                if matches!(pdu.bhs, Bhs::LogoutResponse(_)) {
                    launcher.answers_queued().await;
                }
                // The queue stays full while the writer waits on the
                // socket: a slow link, or an initiator that takes no data
                // (its receive window shut). One that takes none for as
                // long as it may leave a NOP-In unanswered is as gone as one
                // that does not answer; waiting on, this reader would hear
                // neither its timers nor a shutdown, and the connection and
                // all it holds would stay for good. While the writer's
                // bytes move (at least MIN_WRITER_PROGRESS a NOP timeout,
                // so one taking a byte now and then cannot hold the reader
                // for good), the wait goes on.
                // (A queue with room takes it at once, without a timer.)
                let mut item = match launcher.tx.try_send(Outgoing::Pdu(pdu)) {
                    Err(mpsc::error::TrySendError::Full(item)) => item,
                    _ => continue,
                };
                let limit = launcher.fabric.settings.nop_timeout;
                let progress = || launcher.writer_progress.load(Ordering::Relaxed);
                let mut sent_before = progress();
                while let Err(mpsc::error::SendTimeoutError::Timeout(back)) =
                    launcher.tx.send_timeout(item, limit).await
                {
                    if progress().wrapping_sub(sent_before) < MIN_WRITER_PROGRESS {
                        warn!(
                            tsih = launcher.session.tsih,
                            initiator = %launcher.session.initiator_name,
                            "the initiator took no data for {limit:?}: cutting the connection"
                        );
                        return Some(Stop::Cut);
                    }
                    sent_before = progress();
                    item = back;
                }
            }
            Action::Run(ready) => launcher.run(ready),
            Action::DataInLimits(limits) => launcher.renegotiated(limits),
            Action::StartPipedWrite(w) => launcher.start_piped_write(w),
            Action::AwaitAborted {
                aborted,
                completing,
                changing_medium,
            } => {
                launcher
                    .await_aborted(&aborted, &completing, &changing_medium)
                    .await
            }
            Action::AwaitSettled(settling) => launcher.settle(settling).await,
            Action::SendWhenSettled(settling, pdu) => launcher.answer_when_settled(settling, pdu),
            Action::End(reason) => {
                debug!(tsih = launcher.session.tsih, ?reason, "connection ends");
                return Some(Stop::Close);
            }
        }
    }
    None
}

/// Stamps a PDU as it leaves: StatSN, ExpCmdSN and MaxCmdSN; a PDU that
/// carries a status moves StatSN on (published for the busy poll).
fn number(bhs: &mut Bhs, stat_sn: &NextStatSn, shared: &Shared) {
    let (exp, max) = shared.numbers();
    let sn = stat_sn.get();
    stamp(bhs, sn, exp, max);
    if advances_stat_sn(bhs) {
        stat_sn.set(sn.wrapping_add(1));
    }
}

/// Ends a writer's connection in both directions, as the driver's cut
/// does: its zero-copy buffers are let go of at once, not after a grace
/// for a peer still reading.
fn cut_writer(writer: &PduWriter) {
    writer
        .cut_flag()
        .store(true, std::sync::atomic::Ordering::Release);
    writer.abort();
}

/// Sends PDUs in order, stamping sequence numbers as they leave; `stat_sn`
/// holds the StatSN of the next response. A send that failed ends the
/// loop; one that timed out (the writer's stall limit: the initiator took
/// nothing) also cuts the connection.
async fn write_loop(
    mut writer: PduWriter,
    mut rx: mpsc::Receiver<Outgoing>,
    shared: Arc<Shared>,
    stat_sn: NextStatSn,
) {
    let failed = |writer: &PduWriter, e: std::io::Error| {
        if is_stall(&e) {
            warn!(error = %e, "nop_timeout_secs passed: cutting the connection");
            cut_writer(writer);
        }
    };
    loop {
        // While zero-copy sends await the kernel's notification, an idle
        // writer reaps them so their buffers return to the pool.
        let first = if writer.zero_copy_pending() {
            tokio::select! {
                m = rx.recv() => m,
                r = writer.reap_zero_copy() => {
                    if let Err(e) = r {
                        return failed(&writer, e);
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
        // An item taken from the queue while gathering Data-In PDUs that
        // could not join them; it is sent next.
        let mut held = None;
        // Drain what is queued before flushing, so small PDUs share writes.
        while let Some(item) = next.take() {
            match item {
                Outgoing::Close => {
                    if let Err(e) = writer.shutdown().await {
                        failed(&writer, e);
                    }
                    return;
                }
                Outgoing::Pdu(mut pdu) => {
                    number(&mut pdu.bhs, &stat_sn, &shared);
                    if let Err(e) = writer.push(&pdu).await {
                        return failed(&writer, e);
                    }
                }
                Outgoing::FileData {
                    mut bhs,
                    lun,
                    offset,
                    len,
                } => {
                    number(&mut bhs, &stat_sn, &shared);
                    let mut pdus = vec![FilePayload { bhs, offset, len }];
                    // The Data-In PDUs of the same LUN queued behind this one
                    // (the rest of a large READ) may leave in one send.
                    while pdus.len() < MAX_PARTS {
                        match rx.try_recv() {
                            Ok(Outgoing::FileData {
                                mut bhs,
                                lun: other,
                                offset,
                                len,
                            }) if Arc::ptr_eq(&other, &lun) => {
                                number(&mut bhs, &stat_sn, &shared);
                                pdus.push(FilePayload { bhs, offset, len });
                            }
                            Ok(other) => {
                                held = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    if let Err(e) = writer.push_files(&lun, &pdus).await {
                        if is_stall(&e) {
                            return failed(&writer, e);
                        } else if e.kind() == std::io::ErrorKind::UnexpectedEof {
                            // The header left already: the PDU cannot be
                            // completed or taken back.
                            tracing::error!(lun = %lun.label, error = %e, "sendfile READ came up short: dropping the connection");
                        } else if e.raw_os_error() == Some(libc::EIO) {
                            // The file, not the socket: a media error found
                            // after the header left, so no MEDIUM ERROR can
                            // be answered. Said where an administrator looks.
                            tracing::error!(lun = %lun.label, error = %e, "reading the LUN's file for a READ failed (a media error?): dropping the connection");
                        } else {
                            debug!(lun = %lun.label, error = %e, "sendfile failed");
                        }
                        cut_writer(&writer);
                        return;
                    }
                }
            }
            next = held.take().or_else(|| rx.try_recv().ok());
        }
        if let Err(e) = writer.flush().await {
            return failed(&writer, e);
        }
    }
    if let Err(e) = writer.shutdown().await {
        failed(&writer, e);
    }
}
