//! An in-memory, deterministic driver of one connection, for the stateful
//! fuzz targets (`target/fuzz`): the initiator's bytes go through the real
//! [`PduReader`] into [`LoginPhase`] and then [`ConnMachine`], whose actions
//! the driver's own [`carry_out`] runs on the driver's [`Launcher`]; what
//! the target sends leaves through the real [`write_loop`] (StatSN, ExpCmdSN
//! and MaxCmdSN stamped as on a socket) and is decoded back, as the
//! initiator would see it.
//!
//! It differs from [`super::drive`] only where a fuzzer needs it to: time is
//! injected (NOP-In pings and the logout grace run on [`Harness::advance`]),
//! and after every PDU it waits until every command it started has answered
//! (or was aborted), so that one input always yields the same exchange.
//! Built with the `fuzzing` feature only; not part of the target's API.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::{Duration, Instant};

use blockwire_pdu::keys::SessionParams;
use blockwire_pdu::{Digests, Frame, FrameDecoder, Pdu};
use bytes::BytesMut;
use rand::SeedableRng;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf};
use tokio::runtime::Runtime;
use tokio::sync::mpsc;

use super::{carry_out, digests_of, write_loop, NextStatSn, Outgoing, Stop};
use crate::backstore::{Backstore, RamBackstore};
use crate::datapath::Engine;
use crate::iscsi::catalog::{Acl, Catalog, DataPathPolicy};
use crate::iscsi::io::{PduReader, PduWriter, ReadError};
use crate::iscsi::launch::Launcher;
use crate::iscsi::machine::{Action, ConnMachine, LoginAction, LoginPhase};
use crate::iscsi::session::Session;
use crate::iscsi::{Fabric, FabricSettings};
use crate::scsi::{LogicalUnit, LuConfig, QosLimits};

/// The data paths to start on LUN 0 and the I/O engine they run on (None:
/// the SCSI core's copy path only).
pub type DataPaths = Option<(DataPathPolicy, Arc<dyn Engine>)>;

/// The one target the harness serves (LUN 0, open to anyone).
pub const TARGET: &str = "iqn.2026-11.io.blockwire:fuzz";

/// Bytes the in-memory pipe holds each way: more than any exchange one
/// input produces between two reads (a 1 MiB LUN read whole, with headers).
const PIPE: usize = 4 << 20;

/// How long one PDU's commands may take before the harness calls it a hang.
const SETTLE_LIMIT: Duration = Duration::from_secs(20);

/// How long commands may run with nothing sent before the harness runs its
/// clock on to a held WRITE's turn (see [`Harness::settle`]).
const STILL_BEFORE_TURN: Duration = Duration::from_millis(100);

fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

fn local() -> SocketAddr {
    "127.0.0.1:3260".parse().expect("an address")
}

/// Polls `f` once: its output if ready, None if it would wait.
async fn poll_once<F: Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    std::future::poll_fn(|cx| {
        Poll::Ready(match f.as_mut().poll(cx) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        })
    })
    .await
}

/// One PDU on the wire, in the order the connection saw them.
#[derive(Debug, Clone)]
pub enum Wire {
    /// The target's reader delivered this PDU (to the login phase or the
    /// machine).
    ToTarget(Pdu),
    /// The target sent this PDU, as the initiator decoded it.
    FromTarget(Pdu),
}

/// Where the connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Login Requests are answered.
    Login,
    /// The session is attached; the full feature phase runs.
    FullFeature,
    /// The connection ended (refused login, logout, protocol error, ...).
    Ended,
}

struct Full {
    session: Arc<Session>,
    generation: u64,
    machine: ConnMachine,
    launcher: Launcher,
    writer_task: tokio::task::JoinHandle<()>,
}

/// One connection to a fresh target, driven in memory.
pub struct Harness {
    fabric: Arc<Fabric>,
    /// The initiator's end of the pipe.
    client: DuplexStream,
    /// The target's reader of the other end.
    reader: PduReader<ReadHalf<DuplexStream>>,
    /// The target's writer half, until the full feature phase takes it.
    writer: Option<PduWriter>,
    login: Option<LoginPhase>,
    full: Option<Full>,
    params: Option<SessionParams>,
    phase: Phase,
    now: Instant,
    /// What crossed the wire since the initiator last looked.
    log: Vec<Wire>,
    /// Received bytes not yet cut into PDUs, and how to cut them.
    received: BytesMut,
    out_digests: Digests,
}

/// A new fabric with `settings`, serving [`TARGET`] (open to any
/// initiator) with `store` as LUN 0 and, with `paths`, the data paths a
/// daemon starts for such a LUN on the engine `paths` names; `shutdown`
/// turning true shuts it down, as SIGTERM does a daemon's.
///
/// # Panics
/// When a data path does not start: the fuzz target asked for one the
/// store cannot carry.
pub fn fabric_serving(
    settings: FabricSettings,
    store: Arc<dyn Backstore>,
    paths: DataPaths,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Arc<Fabric> {
    fabric_serving_unit(settings, LuConfig::new(store), paths, shutdown)
}

/// [`fabric_serving`] with LUN 0 built from `unit` (e.g. formatted with
/// protection information).
///
/// # Panics
/// When a data path does not start: the fuzz target asked for one the
/// store cannot carry.
pub fn fabric_serving_unit(
    settings: FabricSettings,
    unit: LuConfig,
    paths: DataPaths,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Arc<Fabric> {
    let lu = Arc::new(LogicalUnit::new(unit));
    let mut catalog = Catalog::one_target(TARGET, local(), Acl::Any, lu);
    if let (Some((policy, _)), Some(t)) = (&paths, catalog.targets.first_mut()) {
        Arc::get_mut(t).expect("a target of our own").data_paths = vec![(0, *policy)];
    }
    let fabric = Fabric::new(Arc::new(catalog), settings, shutdown);
    if let Some((_, engine)) = paths {
        fabric.sync_reads.set_engine(engine, "fuzzing".into());
        fabric.start_data_paths().expect("LUN 0's data paths");
    }
    fabric
}

impl Harness {
    /// A connection to a new fabric with `settings`, serving [`TARGET`]
    /// with one RAM LUN of `lun_bytes`.
    pub fn new(settings: FabricSettings, lun_bytes: u64) -> Harness {
        Harness::serving(settings, Arc::new(RamBackstore::new(lun_bytes)), None)
    }

    /// A connection to a new fabric with `settings`, serving [`TARGET`]
    /// with `store` as LUN 0 and, with `paths`, the data paths a daemon
    /// starts for such a LUN (sendfile READs, engine READs, double-buffered
    /// WRITEs) on `engine`, the process's one I/O engine as a daemon has
    /// one. Over the in-memory pipe the writer sends what `sendfile(2)`
    /// would send from the file by reading it, as on any non-TCP stream.
    ///
    /// # Panics
    /// When a data path does not start: the fuzz target asked for one the
    /// store cannot carry.
    pub fn serving(
        settings: FabricSettings,
        store: Arc<dyn Backstore>,
        paths: DataPaths,
    ) -> Harness {
        Harness::serving_unit(settings, LuConfig::new(store), paths)
    }

    /// [`Harness::serving`] with LUN 0 built from `unit` (e.g. formatted
    /// with protection information).
    ///
    /// # Panics
    /// When a data path does not start.
    pub fn serving_unit(settings: FabricSettings, unit: LuConfig, paths: DataPaths) -> Harness {
        // Shutdown comes through `Harness::shutdown`, never the watch.
        let (_, shutdown) = tokio::sync::watch::channel(false);
        let fabric = fabric_serving_unit(settings, unit, paths, shutdown);
        let (client, server) = tokio::io::duplex(PIPE);
        let (rd, wr) = tokio::io::split(server);
        let login = LoginPhase::new(
            fabric.clone(),
            1,
            local(),
            rand::rngs::StdRng::seed_from_u64(7),
        );
        Harness {
            fabric,
            client,
            reader: PduReader::new(rd),
            writer: Some(PduWriter::over_stream(wr)),
            login: Some(login),
            full: None,
            params: None,
            phase: Phase::Login,
            now: Instant::now(),
            log: Vec::new(),
            received: BytesMut::new(),
            out_digests: Digests::default(),
        }
    }

    /// Where the connection stands.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The parameters the login negotiated, once logged in.
    pub fn params(&self) -> Option<&SessionParams> {
        self.params.as_ref()
    }

    /// What crossed the wire since the last call, in order.
    pub fn take_log(&mut self) -> Vec<Wire> {
        std::mem::take(&mut self.log)
    }

    /// The initiator sends `bytes`; every whole PDU among what it sent so
    /// far is handled, and every command it starts answered, before this
    /// returns.
    pub fn send(&mut self, bytes: &[u8]) {
        if self.phase == Phase::Ended {
            return;
        }
        runtime().block_on(async {
            if self.client.write_all(bytes).await.is_err() {
                return;
            }
            self.handle_input().await;
        });
    }

    /// `by` passes: NOP-In pings fall due or time out, the logout grace
    /// runs out.
    pub fn advance(&mut self, by: Duration) {
        self.now += by;
        if self.phase != Phase::FullFeature {
            return;
        }
        runtime().block_on(async {
            let now = self.now;
            let actions = self.full_mut().machine.on_timeout(now);
            self.carry(actions).await;
        });
    }

    /// LUN 0 of [`TARGET`].
    fn lun0(&self) -> Option<Arc<LogicalUnit>> {
        self.fabric.catalog().targets.first()?.luns.get(0)
    }

    /// Sets LUN 0's QoS ceilings, as `lun.limit` does on a running unit.
    /// The machine books commands on its injected clock: WRITEs it holds
    /// for their turn wait for [`Harness::advance`]; other commands wait
    /// out their booked time on the runtime's (real) timers.
    pub fn set_qos(&self, limits: QosLimits) {
        if let Some(lu) = self.lun0() {
            lu.set_qos(limits);
        }
    }

    /// Commands waiting at LUN 0's QoS ceilings now.
    pub fn qos_waiting(&self) -> u64 {
        self.lun0().map_or(0, |lu| lu.qos().counters().waiting)
    }

    /// Places held in LUN 0's initiators' lines at its ceilings now.
    pub fn qos_in_lines(&self) -> usize {
        self.lun0().map_or(0, |lu| lu.qos().in_lines())
    }

    /// Time passes up to the connection's next timer when that falls
    /// within `within` (a held WRITE's turn at its LUN's ceilings, say):
    /// what falls due then happens.
    pub fn advance_to_next_timer(&mut self, within: Duration) {
        let Some(full) = self.full.as_ref() else {
            return;
        };
        if let Some(at) = full.machine.poll_timeout() {
            let by = at.saturating_duration_since(self.now);
            if by <= within {
                self.advance(by);
            }
        }
    }

    /// The daemon shuts down: the initiator is asked to log out.
    pub fn shutdown(&mut self) {
        if self.phase != Phase::FullFeature {
            return;
        }
        runtime().block_on(async {
            let now = self.now;
            let actions = self.full_mut().machine.on_shutdown(now);
            self.carry(actions).await;
        });
    }

    /// The initiator closes its end; the connection ends as on a socket.
    pub fn close(&mut self) {
        if self.phase == Phase::Ended {
            return;
        }
        runtime().block_on(async {
            let _ = self.client.shutdown().await;
            self.handle_input().await;
            if self.phase != Phase::Ended {
                self.end().await;
            }
        });
    }

    fn full_mut(&mut self) -> &mut Full {
        self.full.as_mut().expect("full feature phase")
    }

    /// Every whole PDU (or framing error) the reader holds, handled.
    async fn handle_input(&mut self) {
        while self.phase != Phase::Ended {
            let Some(next) = poll_once(self.reader.next()).await else {
                return;
            };
            match (self.phase, next) {
                (Phase::Login, Ok(Some(pdu))) => {
                    self.log.push(Wire::ToTarget(pdu.clone()));
                    self.login_pdu(&pdu)
                }
                (Phase::FullFeature, Ok(Some(pdu))) => {
                    self.log.push(Wire::ToTarget(pdu.clone()));
                    let now = self.now;
                    let actions = self.full_mut().machine.on_pdu(pdu, now);
                    self.carry(actions).await;
                }
                (
                    Phase::FullFeature,
                    Err(ReadError::Decode {
                        error,
                        header,
                        skip,
                    }),
                ) => {
                    let actions = self.full_mut().machine.on_decode_error(
                        &error,
                        header.as_ref().map(|h| &h[..]),
                        skip.is_some(),
                    );
                    self.carry(actions).await;
                }
                // End of stream, a failed read, or a framing error during
                // login (the login loop gives up on those).
                (Phase::FullFeature, _) => self.end().await,
                (_, _) => self.phase = Phase::Ended,
            }
        }
    }

    fn login_pdu(&mut self, pdu: &Pdu) {
        let phase = self.login.as_mut().expect("login phase");
        match phase.on_pdu(pdu) {
            LoginAction::Respond(p) => self.log.push(Wire::FromTarget(p)),
            LoginAction::Refuse(p) => {
                self.log.push(Wire::FromTarget(p));
                self.phase = Phase::Ended;
                self.login = None;
            }
            LoginAction::LoggedIn {
                response,
                session,
                generation,
                outcome,
                ..
            } => {
                self.log.push(Wire::FromTarget(response));
                self.login = None;
                self.start_full_feature(session, generation, &outcome);
            }
        }
    }

    /// As the driver's `full_feature` sets up: digests and limits on both
    /// ends, the writer task, the launcher.
    fn start_full_feature(
        &mut self,
        session: Arc<Session>,
        generation: u64,
        outcome: &crate::iscsi::login::LoginOutcome,
    ) {
        let machine = ConnMachine::new(
            self.fabric.clone(),
            session.clone(),
            generation,
            outcome,
            local(),
            None,
            self.now,
        );
        let params = outcome.params.clone();
        let digests = digests_of(&params);
        self.reader.framer = FrameDecoder::new(params.target_max_recv_data_segment_length, digests);
        self.out_digests = digests;
        let mut writer = self.writer.take().expect("writer unused until now");
        writer.digests = digests;
        writer.limit_stalls(self.fabric.settings.nop_timeout);
        let writer_progress = writer.progress();
        let shared = machine.shared().clone();
        writer.track_copies(shared.copies.clone());
        let (tx, rx) = mpsc::channel::<Outgoing>(1024);
        let first_stat_sn = outcome.stat_sn.wrapping_add(1);
        let writer_task = {
            let _guard = runtime().enter();
            tokio::spawn(write_loop(
                writer,
                rx,
                shared,
                NextStatSn::new(first_stat_sn),
            ))
        };
        let mut launcher = Launcher::new(&self.fabric, &session, &machine, tx);
        launcher.writer_progress = writer_progress;
        self.params = Some(params);
        self.full = Some(Full {
            generation: session.generation(),
            session,
            machine,
            launcher,
            writer_task,
        });
        self.phase = Phase::FullFeature;
    }

    /// Carries out `actions` as the driver does, then waits until every
    /// command started so far has answered; or, when they end the
    /// connection, ends it at once as the driver does (commands started
    /// with the ending, say before a Logout delivered with them, are
    /// aborted, not waited for).
    async fn carry(&mut self, actions: Vec<Action>) {
        let launcher = &mut self.full_mut().launcher;
        match carry_out(launcher, actions).await {
            Some(Stop::Close | Stop::Cut) => self.end().await,
            None => self.settle().await,
        }
    }

    /// Waits until no command task holds the writer queue (except those of
    /// double-buffered WRITEs waiting for their data, and of commands
    /// queued for a block range behind them), the writer has sent
    /// everything queued, and reads what it sent.
    async fn settle(&mut self) {
        let started = Instant::now();
        let mut quiet = 0;
        while quiet < 3 {
            let full = self.full.as_ref().expect("full feature phase");
            let tx = &full.launcher.tx;
            // A double-buffered WRITE's task holds the queue while its
            // Data-Out is still to come from the initiator.
            let piped = full.machine.piped_writes_waiting_for_data();
            // A command overlapping such a WRITE's blocks waits for its
            // range until the WRITE's data came and landed: the unit keeps
            // the nexus's overlapping commands in order (SPC-4 Control mode
            // page, QUEUE ALGORITHM MODIFIER 0h: restricted reordering), so
            // it too waits on the initiator, not on the target.
            let behind = if piped > 0 {
                self.lun0().map_or(0, |lu| lu.ranges.queued())
            } else {
                0
            };
            let waiting = piped + behind;
            let idle = tx.strong_count() <= 1 + waiting && tx.capacity() == tx.max_capacity();
            let got = self.read_output().await;
            quiet = if idle && !got { quiet + 1 } else { 0 };
            // A command in its initiator's line at the LUN's ceilings behind
            // a WRITE held for its turn starts when that turn comes, and the
            // turn is on this harness's clock: on a connection time passes
            // meanwhile, so here the clock runs on to it.
            if !idle
                && !got
                && started.elapsed() > STILL_BEFORE_TURN
                && self.run_on_to_held_turn().await
            {
                return;
            }
            assert!(
                started.elapsed() < SETTLE_LIMIT,
                "commands still running after {SETTLE_LIMIT:?}: a task never answered"
            );
            tokio::task::yield_now().await;
        }
    }

    /// Runs the clock on to the first held WRITE's turn, if one is to
    /// come, and carries out what falls due then, as the driver does (a
    /// timer that falls due with it, a NOP-In's say, does too). Returns
    /// whether that ended the connection.
    async fn run_on_to_held_turn(&mut self) -> bool {
        let Some(at) = self.full.as_ref().and_then(|f| f.machine.next_held_turn()) else {
            return false;
        };
        if at <= self.now {
            return false;
        }
        self.now = at;
        let actions = self.full_mut().machine.on_timeout(at);
        let launcher = &mut self.full_mut().launcher;
        match carry_out(launcher, actions).await {
            Some(Stop::Close | Stop::Cut) => {
                self.end().await;
                true
            }
            None => false,
        }
    }

    /// Reads and decodes what the target sent; true if anything came.
    async fn read_output(&mut self) -> bool {
        let mut got = false;
        loop {
            self.received.reserve(64 * 1024);
            match poll_once(self.client.read_buf(&mut self.received)).await {
                Some(Ok(n)) if n > 0 => got = true,
                _ => break,
            }
        }
        // The largest segment the format allows: limits are the fuzz
        // target's to check.
        let framer = FrameDecoder::new(0x00ff_ffff, self.out_digests);
        loop {
            match framer.decode(&self.received) {
                Ok(Frame::Pdu { pdu, consumed }) => {
                    let _ = self.received.split_to(consumed);
                    self.log.push(Wire::FromTarget(pdu));
                }
                Ok(Frame::NeedMore(_)) => break,
                Err(e) => panic!("the target sent bytes that do not decode: {e}"),
            }
        }
        got
    }

    /// The connection ends, as `full_feature` ends it: running tasks are
    /// aborted, the writer flushes and closes, the session detaches.
    async fn end(&mut self) {
        self.phase = Phase::Ended;
        let Some(full) = self.full.take() else {
            return;
        };
        let Full {
            session,
            generation,
            machine,
            launcher,
            writer_task,
        } = full;
        if session.generation() == generation {
            session.tasks.abort_where(|_, _| true);
        }
        drop(machine);
        let probe = launcher.tx.downgrade();
        let _ = launcher.tx.send(Outgoing::Close).await;
        drop(launcher);
        let started = Instant::now();
        while probe.strong_count() > 0 {
            self.read_output().await;
            assert!(
                started.elapsed() < SETTLE_LIMIT,
                "commands still running after the connection closed"
            );
            tokio::task::yield_now().await;
        }
        while !writer_task.is_finished() {
            self.read_output().await;
            tokio::task::yield_now().await;
        }
        self.read_output().await;
        assert!(
            self.received.is_empty(),
            "the target's last PDU was cut short: {} bytes left",
            self.received.len()
        );
        // The session ends with its only connection (ErrorRecoveryLevel 0),
        // unless a logout ended it already.
        self.fabric.sessions.end(&session, generation);
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if self.phase == Phase::FullFeature && !std::thread::panicking() {
            self.close();
        }
    }
}
