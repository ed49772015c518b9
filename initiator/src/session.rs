//! A normal session: the tokio shell around [`crate::engine::Engine`].
//!
//! - One reader task per connection decodes PDUs and feeds the engine;
//!   Data-In goes straight from the socket into the command's buffer.
//! - Each command runs in its caller's future: it takes a queue slot, waits
//!   for the CmdSN window, sends its PDU (immediate data, unsolicited
//!   Data-Out) under the writer lock, answers R2Ts from its own buffer and
//!   waits for its status. Nothing of the caller's write data is copied.
//! - A keepalive task pings an idle connection (NOP-Out) and declares it
//!   dead when the ping goes unanswered.
//! - When the connection is lost, every command in flight is told so; a
//!   recovery task logs in again (same ISID, TSIH 0: session reinstatement
//!   at ErrorRecoveryLevel 0) with bounded, backed-off retries, and the
//!   commands re-issue themselves on the new connection.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use blockwire_pdu::keys::SessionParams;
use blockwire_pdu::pdu::codes::{LogoutResponseCode, TmfFunction, TmfResponse};
use blockwire_pdu::pdu::{DataIn, R2t, RESERVED_TAG};
use blockwire_pdu::scsi::{parse_sense_segment, split_sense_segment, ScsiStatus, Sense};
use blockwire_pdu::{Bhs, Digests, Lun, Pdu};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, watch, Notify, Semaphore};
use tokio::task::AbortHandle;

use crate::config::InitiatorConfig;
use crate::connect::{connect_login, normalize_portal, Connection};
use crate::engine::{
    data_out_sequence, Engine, Event, Limits, Placement, ScsiOutcome, TaskInfo, TaskResult,
};
use crate::error::{Error, Result, ScsiError};
use crate::isid::isid_for;
use crate::retry::Retries;
use crate::wire::{is_data_in, write_pdu, write_whole, PduReader};

/// The data phase of a command.
#[derive(Debug)]
pub enum DataDir<'a> {
    /// No data.
    None,
    /// Data-In into this buffer; its length is the expected transfer
    /// length. The buffer is lent to the connection while the command runs
    /// (the target's data lands in it directly) and truncated to the bytes
    /// received. If the command's future is dropped early the buffer is
    /// lost (left empty).
    Read(&'a mut Vec<u8>),
    /// Data-Out from this slice.
    Write(&'a [u8]),
}

/// Residual count of a completed command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residual {
    /// Exactly the expected length moved.
    None,
    /// Fewer bytes moved than expected.
    Underflow(u32),
    /// The command wanted more bytes than the buffer held.
    Overflow(u32),
}

/// A command that completed with GOOD (or CONDITION MET) status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The status.
    pub status: ScsiStatus,
    /// Residual reported by the target.
    pub residual: Residual,
    /// Bytes transferred (Data-In received or Data-Out accepted).
    pub transferred: usize,
    /// Sense data sent with a good status (rare; e.g. recovered errors).
    pub sense: Option<Sense>,
}

/// How a command passed through for another SCSI stack ended at the target:
/// any status, with the sense bytes as the target sent them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawCompletion {
    /// The SCSI status (GOOD, CHECK CONDITION, RESERVATION CONFLICT, ...).
    pub status: ScsiStatus,
    /// The sense data, undecoded (empty without).
    pub sense: Vec<u8>,
    /// Residual reported by the target.
    pub residual: Residual,
    /// Bytes transferred (Data-In received or Data-Out accepted).
    pub transferred: usize,
}

impl RawCompletion {
    /// The completion a caller with a retry policy of its own takes (the
    /// session's own commands): a status that did not complete the command
    /// (CHECK CONDITION other than RECOVERED ERROR, BUSY, RESERVATION
    /// CONFLICT, ...) is an error, with its sense decoded.
    pub fn decoded(self, lun: u16, opcode: u8) -> Result<Completion> {
        let sense = if self.sense.is_empty() {
            None
        } else {
            Sense::decode(&self.sense).ok()
        };
        if !crate::engine::completes_command(self.status.0, sense.as_ref()) {
            return Err(Error::Scsi(ScsiError {
                lun,
                opcode,
                status: self.status,
                sense,
            }));
        }
        Ok(Completion {
            status: self.status,
            residual: self.residual,
            transferred: self.transferred,
            sense,
        })
    }

    /// A SCSI Response as the target gave it (a response other than
    /// Command Completed at Target is an error): its sense bytes out of the
    /// sense segment (RFC 7143 §11.4.7), its residual, and what moved of
    /// `read_len` bytes in (by Data-In) or `write_len` bytes out.
    fn of_outcome(
        lun: u16,
        o: &ScsiOutcome,
        read_len: usize,
        write_len: usize,
    ) -> Result<RawCompletion> {
        if o.response != 0 {
            return Err(Error::TargetFailure {
                lun,
                response: o.response,
            });
        }
        let sense = split_sense_segment(&o.sense_segment)
            .map(|(sense, _)| sense.to_vec())
            .map_err(|e| Error::Protocol(format!("SCSI Response sense segment: {e}")))?;
        let (residual, transferred) = transfer_of(o, read_len, write_len);
        Ok(RawCompletion {
            status: ScsiStatus(o.status),
            sense,
            residual,
            transferred,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ConnState {
    Up(u64),
    /// The target asked for a logout: the commands in flight on this
    /// connection finish, new ones wait for the next connection.
    Draining(u64),
    Recovering,
    Failed(String),
    Closed,
}

#[derive(Debug)]
enum Msg {
    R2t(R2t),
    Done(TaskResult),
    Lost(Option<Vec<u8>>),
}

type Owner = mpsc::UnboundedSender<Msg>;

struct WriterSlot {
    generation: u64,
    half: Option<OwnedWriteHalf>,
    digests: Digests,
    /// A Logout Request went on this connection: nothing more may follow
    /// it there (RFC 7143 §11.14), not a keepalive ping, not an ABORT TASK.
    logging_out: bool,
}

/// Why a connection whose write half is gone while it is up is recovered:
/// a PDU sequence on it was cut short (see [`send_whole`]).
const CUT_SHORT: &str = "a PDU sequence was cut short: the connection ended";

/// Runs `send`, one PDU sequence written to the connection's write half,
/// which the caller took out of its [`WriterSlot`] and puts back only when
/// this succeeds. A sequence cut short leaves part of a PDU on the stream,
/// which the next PDU's bytes would complete (a command's data made of
/// another's header and data, written GOOD): so the half is never put back
/// then, and dropped, tokio shuts the socket's write side down and the
/// target sees the connection end instead. That holds for a sequence the
/// caller gave up on (its future dropped: the half goes with it), one that
/// failed, and one the target did not take whole within `limit` (it stopped
/// reading; the writer, and every command behind it, would wait for good).
async fn send_whole<F>(limit: Duration, send: F) -> std::io::Result<()>
where
    F: std::future::Future<Output = std::io::Result<()>>,
{
    match tokio::time::timeout(limit, send).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the target did not take the PDUs within {limit:?}"),
        )),
    }
}

struct Inner {
    config: InitiatorConfig,
    portal: String,
    target: String,
    engine: Mutex<Engine<Owner>>,
    writer: tokio::sync::Mutex<WriterSlot>,
    state: watch::Sender<ConnState>,
    window: Notify,
    slots: Semaphore,
    params: Mutex<SessionParams>,
    tsih: Mutex<u16>,
    recoveries: AtomicU32,
    /// UNIT ATTENTIONs saying CAPACITY DATA HAS CHANGED (SBC-4 4.6), which
    /// the command retries take away from the caller.
    capacity_changes: AtomicU64,
    /// Task management requests this session sent: a TASK ABORTED that
    /// follows one may be its doing, which a retry would undo.
    own_task_management: AtomicU64,
    /// Deferred errors the next SYNCHRONIZE CACHE of their LUN reports.
    deferred: Arc<crate::retry::DeferredErrors>,
    background: Mutex<Vec<AbortHandle>>,
    epoch: Instant,
    last_rx_ms: AtomicU64,
    /// The login generation and the target's answers to our vendor keys.
    vendor: Mutex<(u64, Vec<(String, String)>)>,
    /// Answers to the target's NOP-In pings on their way out.
    ping_answers: PingAnswers,
    /// The wait before the next login the target asked for by an Async
    /// Message that ended the connection; None: DefaultTime2Wait.
    time2wait: Mutex<Option<Duration>>,
}

/// How many answers to the target's NOP-In pings may wait to be sent at
/// once. Each waits in a task of its own (the reader never waits for the
/// writer); a target that sends pings faster than its connection takes the
/// answers (one that does not read) would have them pile up without end,
/// so past this the connection is dropped and recovered. A target that
/// waits for each answer (RFC 7143 §11.19) has one or two out.
const MAX_PING_ANSWERS: usize = 64;

/// How often a session draining for a logout the target asked for checks
/// whether its commands in flight finished.
const DRAIN_POLL: Duration = Duration::from_millis(10);

/// How long a logout the target asked for waits for its Logout Response.
const LOGOUT_ANSWER: Duration = Duration::from_secs(10);

/// The answers to the target's NOP-In pings a connection has on their way
/// out, at most [`MAX_PING_ANSWERS`] (TCP and iSER sessions alike).
#[derive(Default)]
pub(crate) struct PingAnswers(Arc<AtomicUsize>);

/// One answer on its way out; its place is given back when it is dropped.
pub(crate) struct PingAnswer(Arc<AtomicUsize>);

impl PingAnswers {
    /// A place for one more answer; the reason to drop the connection
    /// when all are taken.
    pub(crate) fn take(&self) -> std::result::Result<PingAnswer, String> {
        if self.0.fetch_add(1, Ordering::Relaxed) >= MAX_PING_ANSWERS {
            self.0.fetch_sub(1, Ordering::Relaxed);
            return Err(format!(
                "the target's NOP-In pings came faster than the connection took our answers \
                 ({MAX_PING_ANSWERS} waiting)"
            ));
        }
        Ok(PingAnswer(self.0.clone()))
    }
}

impl Drop for PingAnswer {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A logged-in session with one target. Share it between tasks with
/// `Arc<Session>`; every method takes `&self`. Dropping it stops the
/// background tasks; [`Session::logout`] ends it politely.
pub struct Session {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("target", &self.inner.target)
            .field("portal", &self.inner.portal)
            .finish()
    }
}

impl Session {
    /// Connects to `portal` (`HOST[:PORT]`) and logs in to `target`.
    pub async fn connect(config: InitiatorConfig, portal: &str, target: &str) -> Result<Session> {
        if config.queue_depth == 0 {
            return Err(Error::Config("queue depth must be at least 1".into()));
        }
        let portal = normalize_portal(portal);
        let conn = connect_login(&config, &portal, Some(target), 0).await?;
        let limits = Limits::from_params(&conn.outcome.params);
        let (state, _) = watch::channel(ConnState::Recovering);
        let inner = Arc::new(Inner {
            slots: Semaphore::new(config.queue_depth),
            config,
            portal,
            target: target.to_owned(),
            engine: Mutex::new(Engine::new(0, limits, 0, 0, 0, 0)),
            writer: tokio::sync::Mutex::new(WriterSlot {
                generation: 0,
                half: None,
                digests: Digests::NONE,
                logging_out: false,
            }),
            state,
            window: Notify::new(),
            params: Mutex::new(conn.outcome.params.clone()),
            tsih: Mutex::new(0),
            recoveries: AtomicU32::new(0),
            capacity_changes: AtomicU64::new(0),
            own_task_management: AtomicU64::new(0),
            deferred: Default::default(),
            time2wait: Mutex::new(None),
            background: Mutex::new(Vec::new()),
            epoch: Instant::now(),
            last_rx_ms: AtomicU64::new(0),
            vendor: Mutex::new((0, Vec::new())),
            ping_answers: PingAnswers::default(),
        });
        inner.install(conn, 1).await;
        Ok(Session { inner })
    }

    /// The target's name.
    pub fn target(&self) -> &str {
        &self.inner.target
    }

    /// The portal (`HOST:PORT`).
    pub fn portal(&self) -> &str {
        &self.inner.portal
    }

    /// Our ISID (stable per initiator name and qualifier).
    pub fn isid(&self) -> [u8; 6] {
        isid_for(
            &self.inner.config.initiator_name,
            self.inner.config.isid_qualifier,
        )
    }

    /// The TSIH of the current login.
    pub fn tsih(&self) -> u16 {
        *lock(&self.inner.tsih)
    }

    /// The parameters the current login negotiated.
    pub fn params(&self) -> SessionParams {
        lock(&self.inner.params).clone()
    }

    /// The target's answers to `InitiatorConfig::vendor_offers` at the
    /// current login, with the login's generation (it changes when the
    /// session logs in again after a lost connection).
    pub fn vendor_answers(&self) -> (u64, Vec<(String, String)>) {
        lock(&self.inner.vendor).clone()
    }

    /// Runs a SCSI command whose data the target moves by RDMA: the command
    /// PDU carries `ahs` (the buffer descriptor) and announces `read_len` or
    /// `write_len` bytes, and no data travels on the connection. Fails
    /// without sending when the login generation is no longer `generation`
    /// (the RDMA binding belongs to the old login). `transferred` is derived
    /// from the residual count.
    pub async fn execute_offloaded(
        &self,
        generation: u64,
        lun: u16,
        cdb: &[u8],
        read_len: usize,
        write_len: usize,
        ahs: Vec<blockwire_pdu::Ahs>,
    ) -> Result<Completion> {
        self.offloaded_as_given(generation, lun, cdb, read_len, write_len, ahs, true)
            .await?
            .decoded(lun, cdb.first().copied().unwrap_or_default())
    }

    /// An offloaded command's end as the target gave it; `timed`: under
    /// the session's command timeout. Untimed, for a command another SCSI
    /// stack runs (the kernel's, behind `blockwire attach`), which that
    /// stack times out and aborts as [`Session::pass_through`] leaves it
    /// to: the session's command timeout then does not give the connection
    /// up under it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn offloaded_as_given(
        &self,
        generation: u64,
        lun: u16,
        cdb: &[u8],
        read_len: usize,
        write_len: usize,
        ahs: Vec<blockwire_pdu::Ahs>,
        timed: bool,
    ) -> Result<RawCompletion> {
        self.inner
            .run_offloaded(generation, lun, cdb, read_len, write_len, ahs, timed)
            .await
    }

    /// How many times the session logged in again after a lost connection.
    pub fn recoveries(&self) -> u32 {
        self.inner.recoveries.load(Ordering::Relaxed)
    }

    /// The SCSI commands in flight, oldest first.
    pub fn in_flight(&self) -> Vec<TaskInfo> {
        lock(&self.inner.engine).in_flight()
    }

    /// Runs one SCSI command. CHECK CONDITION and other bad statuses come
    /// back as [`Error::Scsi`] with the decoded sense. As the SCSI
    /// midlayer does, UNIT ATTENTION and TASK ABORTED (another nexus's
    /// abort) are retried (up to 4 times each), and BUSY and TASK SET FULL
    /// (SAM-5 5.3: the target could not take the command now, and did
    /// nothing of it) after a growing pause, for up to
    /// [`crate::retry::BUSY_RETRY_FOR`] in all (see [`crate::retry`]).
    pub async fn execute(&self, lun: u16, cdb: &[u8], mut dir: DataDir<'_>) -> Result<Completion> {
        let mut retries = self.retries();
        loop {
            let managed = self.task_management_sent();
            match self.inner.execute_once(lun, cdb, &mut dir).await {
                Err(e) => {
                    self.inner.note_capacity_change(lun, &e);
                    if self.ended_by_own_task_management(&e, managed)
                        || !retries.again_after(&e).await
                    {
                        return Err(e);
                    }
                }
                r => return r,
            }
        }
    }

    /// A command's retries, keeping the deferred errors they hear for the
    /// next SYNCHRONIZE CACHE of their LUN to report (see
    /// [`crate::retry::DeferredErrors`]).
    pub(crate) fn retries(&self) -> Retries {
        Retries::keeping_deferred_errors_in(self.inner.deferred.clone())
    }

    /// The deferred error of `lun` no flush has reported yet, taken.
    pub(crate) fn take_deferred_error(&self, lun: u16) -> Option<crate::ScsiError> {
        self.inner.deferred.take(lun)
    }

    /// Task management requests this session sent so far.
    pub(crate) fn task_management_sent(&self) -> u64 {
        self.inner.own_task_management.load(Ordering::Relaxed)
    }

    /// Whether `e`, the failure of a command sent when this session had
    /// sent `before` task management requests, may be the end one of its
    /// own since asked for: TASK ABORTED is retried as another nexus's
    /// doing (see [`crate::retry`]), but not after this session's own
    /// ABORT TASK or reset, whose end a retry would undo.
    pub(crate) fn ended_by_own_task_management(&self, e: &Error, before: u64) -> bool {
        matches!(e, Error::Scsi(s) if s.status == ScsiStatus::TASK_ABORTED)
            && self.task_management_sent() != before
    }

    /// How many times the target said a LUN's capacity changed (UNIT
    /// ATTENTION, CAPACITY DATA HAS CHANGED) on this session. [`Session::execute`]
    /// retries the command past it, as the SCSI midlayer does; a caller that
    /// sized something by READ CAPACITY (a block device, a mounted file)
    /// reads this to learn that the size it holds is stale.
    pub fn capacity_changes(&self) -> u64 {
        self.inner.capacity_changes.load(Ordering::Relaxed)
    }

    /// READ(16) of `blocks` blocks at `lba` into `buf`, whose length is the
    /// transfer length (blocks × block size). A good answer with fewer
    /// bytes (a residual) is an error: the buffer always holds every block.
    pub async fn read(
        &self,
        lun: u16,
        lba: u64,
        blocks: u32,
        buf: &mut Vec<u8>,
    ) -> Result<Completion> {
        let cdb = crate::scsi::rw16(false, lba, blocks, false);
        let asked = buf.len();
        let done = self.execute(lun, &cdb, DataDir::Read(buf)).await?;
        // A good READ of blocks with a residual brought fewer bytes than
        // its blocks: callers (dd, mount, ublk) take the buffer as all of
        // them, so that is an error here, not a short buffer.
        if buf.len() < asked {
            return Err(Error::Protocol(format!(
                "READ(16) of {blocks} blocks at LBA {lba} of LUN {lun} ended GOOD with {} of its {asked} bytes",
                buf.len()
            )));
        }
        Ok(done)
    }

    /// WRITE(16) of `data` (blocks × block size bytes) at `lba`.
    pub async fn write(&self, lun: u16, lba: u64, blocks: u32, data: &[u8]) -> Result<Completion> {
        let cdb = crate::scsi::rw16(true, lba, blocks, false);
        self.write_blocks(lun, &cdb, data).await
    }

    /// Runs a WRITE-type `cdb` (WRITE(16) with FUA, ...) whose blocks are
    /// `data`, all of it. A good status with a residual underflow took
    /// fewer bytes than the blocks (RFC 7143 §11.4.5), so the rest were not
    /// written: an error here, where callers (dd, a file system over ublk
    /// or FUSE) would take them as written.
    pub async fn write_blocks(&self, lun: u16, cdb: &[u8], data: &[u8]) -> Result<Completion> {
        let done = self.execute(lun, cdb, DataDir::Write(data)).await?;
        if done.transferred < data.len() {
            return Err(Error::Protocol(format!(
                "{} to LUN {lun} ended GOOD with {} of its {} bytes taken",
                cdb.first()
                    .and_then(|&op| blockwire_pdu::scsi::opcode::opcode_name(op, None))
                    .unwrap_or("a WRITE"),
                done.transferred,
                data.len()
            )));
        }
        Ok(done)
    }

    /// ABORT TASK for the command with tag `itt` (see [`Session::in_flight`]).
    /// Returns the target's answer: function complete, or task does not
    /// exist when the command had already finished.
    pub async fn abort_task(&self, lun: u16, itt: u32) -> Result<TmfResponse> {
        self.inner.tmf(TmfFunction::AbortTask, lun, Some(itt)).await
    }

    /// ABORT TASK SET on `lun`.
    pub async fn abort_task_set(&self, lun: u16) -> Result<()> {
        self.tmf_ok(TmfFunction::AbortTaskSet, lun).await
    }

    /// LOGICAL UNIT RESET.
    pub async fn lun_reset(&self, lun: u16) -> Result<()> {
        self.tmf_ok(TmfFunction::LogicalUnitReset, lun).await
    }

    /// TARGET WARM RESET (RFC 7143 §11.5.1): every task of the session ends.
    pub async fn target_warm_reset(&self) -> Result<()> {
        self.tmf_ok(TmfFunction::TargetWarmReset, 0).await
    }

    /// Runs one command on behalf of another SCSI stack (the kernel host
    /// driver): the status and sense come back as the target sent them and
    /// nothing is retried, so a UNIT ATTENTION or RESERVATION CONFLICT
    /// reaches that stack's own error handling. `itt` follows the command's
    /// Initiator Task Tag (0 until it is sent; it changes when the command
    /// is re-issued after a lost connection), so that stack's ABORT TASK
    /// can name it (see [`Session::abort_task`]).
    pub async fn pass_through(
        &self,
        lun: u16,
        cdb: &[u8],
        dir: DataDir<'_>,
        itt: &AtomicU32,
    ) -> Result<RawCompletion> {
        self.inner.pass_through(lun, cdb, dir, itt).await
    }

    async fn tmf_ok(&self, f: TmfFunction, lun: u16) -> Result<()> {
        match self.inner.tmf(f, lun, None).await? {
            TmfResponse::FunctionComplete => Ok(()),
            response => Err(Error::Tmf {
                function: f.name(),
                lun,
                response,
            }),
        }
    }

    /// Logs the session out and closes it.
    pub async fn logout(self) -> Result<()> {
        let inner = self.inner.clone();
        let gen = inner.wait_up().await?;
        inner.state.send_replace(ConnState::Closed);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let req = lock(&inner.engine).start_logout(tx);
        inner
            .send_pdu(gen, Pdu::new(Bhs::LogoutRequest(req)))
            .await?;
        let answer = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await;
        inner.stop_background();
        if let Some(h) = inner.writer.lock().await.half.as_mut() {
            let _ = h.shutdown().await;
        }
        match answer {
            Ok(Some(Msg::Done(TaskResult::Logout(LogoutResponseCode::Closed, _)))) => Ok(()),
            Ok(Some(Msg::Done(TaskResult::Logout(code, _)))) => Err(Error::Protocol(format!(
                "logout from {} answered: {}",
                inner.target,
                code.name()
            ))),
            Ok(_) => Ok(()), // connection closed first: the session is gone anyway
            Err(_) => Err(Error::Timeout(format!("logout from {}", inner.target))),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.inner.state.send_replace(ConnState::Closed);
        self.inner.stop_background();
        self.inner.slots.close();
    }
}

impl Inner {
    fn stop_background(&self) {
        for h in lock(&self.background).drain(..) {
            h.abort();
        }
    }

    fn touch(&self) {
        self.last_rx_ms
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let now = self.epoch.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_rx_ms.load(Ordering::Relaxed)))
    }

    async fn install(self: &Arc<Self>, conn: Connection, generation: u64) {
        let Connection {
            reader,
            writer,
            outcome,
            digests,
        } = conn;
        {
            let mut w = self.writer.lock().await;
            w.generation = generation;
            w.half = Some(writer);
            w.digests = digests;
            w.logging_out = false;
        }
        {
            let mut engine = lock(&self.engine);
            let next_itt = engine.next_itt();
            *engine = Engine::new(
                generation,
                Limits::from_params(&outcome.params),
                outcome.exp_cmd_sn,
                outcome.exp_cmd_sn,
                outcome.max_cmd_sn,
                outcome.stat_sn,
            )
            .going_on_from(next_itt);
        }
        *lock(&self.params) = outcome.params.clone();
        *lock(&self.tsih) = outcome.tsih;
        *lock(&self.vendor) = (generation, outcome.vendor.clone());
        self.touch();
        // Up before the reader runs: a connection the target ends at once
        // (right after the login) is lost only from Up, so the reader must
        // find it so. The background list stays locked until the reader's
        // handle is in it, for that loss to abort it with the rest.
        let mut bg = lock(&self.background);
        bg.clear();
        self.state.send_replace(ConnState::Up(generation));
        bg.push(tokio::spawn(self.clone().reader_loop(generation, reader)).abort_handle());
        if let Some(interval) = self.config.nop_interval {
            bg.push(tokio::spawn(self.clone().keepalive(generation, interval)).abort_handle());
        }
        drop(bg);
        self.window.notify_waiters();
    }

    async fn wait_up(&self) -> Result<u64> {
        let mut rx = self.state.subscribe();
        loop {
            let s = rx.borrow_and_update().clone();
            match s {
                ConnState::Up(g) => return Ok(g),
                ConnState::Failed(reason) => {
                    return Err(Error::SessionLost {
                        target: self.target.clone(),
                        attempts: self.config.recovery.max_attempts,
                        reason,
                    })
                }
                ConnState::Closed => return Err(Error::Closed),
                ConnState::Recovering | ConnState::Draining(_) => {}
            }
            rx.changed().await.map_err(|_| Error::Closed)?;
        }
    }

    /// The connection of `generation` is gone: fail its tasks over to the
    /// recovery and start logging in again.
    fn connection_lost(self: &Arc<Self>, generation: u64, reason: String) {
        let mut mine = false;
        self.state.send_if_modified(|s| {
            if *s == ConnState::Up(generation) || *s == ConnState::Draining(generation) {
                *s = ConnState::Recovering;
                mine = true;
                true
            } else {
                false
            }
        });
        if !mine {
            return;
        }
        tracing::warn!(target = %self.target, portal = %self.portal, %reason, "connection lost; recovering");
        let drained = lock(&self.engine).drain();
        for (owner, buf) in drained {
            let _ = owner.send(Msg::Lost(buf));
        }
        self.stop_background();
        let handle = tokio::spawn(self.clone().recover(generation, reason)).abort_handle();
        lock(&self.background).push(handle);
    }

    /// The target asked for a logout within `within` (RFC 7143 §11.9.1,
    /// e.g. it is shutting down or moving the session): new commands wait
    /// for the next connection while those in flight finish, at most
    /// `within`; then the session logs out, so the target ends it cleanly
    /// rather than seeing the connection drop, and logs in again as after a
    /// loss. Commands still in flight then are issued again there.
    async fn log_out_on_request(self: Arc<Self>, generation: u64, within: Duration) {
        let claimed = self.state.send_if_modified(|s| {
            let up = *s == ConnState::Up(generation);
            if up {
                *s = ConnState::Draining(generation);
            }
            up
        });
        if !claimed {
            return;
        }
        tracing::info!(target = %self.target, portal = %self.portal, ?within, "the target asked for a logout; letting commands in flight finish");
        let deadline = tokio::time::Instant::now() + within;
        while !lock(&self.engine).in_flight().is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(DRAIN_POLL).await;
        }
        let (tx, mut rx) = mpsc::unbounded_channel();
        let req = lock(&self.engine).start_logout(tx);
        let answer = match self
            .send_pdu(generation, Pdu::new(Bhs::LogoutRequest(req)))
            .await
        {
            Ok(()) => tokio::time::timeout(LOGOUT_ANSWER, rx.recv())
                .await
                .ok()
                .flatten(),
            Err(_) => None,
        };
        let reason = match answer {
            Some(Msg::Done(TaskResult::Logout(code, _))) => {
                format!("logged out at the target's request ({})", code.name())
            }
            _ => "the target asked for a logout, which went unanswered".to_string(),
        };
        self.connection_lost(generation, reason);
    }

    /// The wait before the next login a Logout Response sets. Closed: the
    /// session ended cleanly, so that login implies no logout and need not
    /// wait (at ERL 0 the Time2Wait is for task reassignment). Cleanup
    /// failed, or recovery not supported: the target gives the least wait
    /// before a new, implicit, logout (RFC 7143 §11.15.4).
    fn after_logout(&self, code: LogoutResponseCode, time2wait: u16) {
        let wait = match code {
            LogoutResponseCode::RecoveryNotSupported | LogoutResponseCode::CleanupFailed => {
                u64::from(time2wait)
            }
            _ => 0,
        };
        *lock(&self.time2wait) = Some(Duration::from_secs(wait));
    }

    /// Counts a UNIT ATTENTION saying CAPACITY DATA HAS CHANGED (2Ah/09h).
    fn note_capacity_change(&self, lun: u16, e: &Error) {
        let Error::Scsi(s) = e else { return };
        if s.sense_code() == Some((blockwire_pdu::scsi::SenseKey::UnitAttention, 0x2a, 0x09)) {
            self.capacity_changes.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(target = %self.target, lun, "the target says the LUN's capacity changed");
        }
    }

    async fn recover(self: Arc<Self>, generation: u64, reason: String) {
        if let Some(mut h) = self.writer.lock().await.half.take() {
            let _ = h.shutdown().await;
        }
        let policy = self.config.recovery;
        let mut delay = policy.initial_backoff;
        // A new login with our ISID ends the old session on the target (an
        // implicit logout), which waits at least DefaultTime2Wait after a
        // connection ends, or the Time2Wait the target's Async Message
        // gave (RFC 7143 §13.15, §11.9.1); only the first login waits it.
        let time2wait = lock(&self.time2wait).take().unwrap_or_else(|| {
            Duration::from_secs(u64::from(lock(&self.params).default_time2wait))
        });
        if time2wait > delay {
            tracing::info!(target = %self.target, ?time2wait, "waiting the target's Time2Wait before logging in again");
        }
        let mut first_wait = time2wait;
        let mut last = reason;
        let mut attempts = 0;
        while attempts < policy.max_attempts {
            attempts += 1;
            tokio::time::sleep(delay.max(std::mem::take(&mut first_wait))).await;
            match connect_login(&self.config, &self.portal, Some(&self.target), 0).await {
                Ok(conn) => {
                    self.recoveries.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(target = %self.target, attempts, "session reinstated");
                    // install() replaces the background list, which holds
                    // this task's handle: it is finished by then anyway.
                    self.install(conn, generation + 1).await;
                    return;
                }
                Err(e) => {
                    tracing::warn!(target = %self.target, attempt = attempts, error = %e, "re-login failed");
                    let transient = e.is_transient();
                    last = e.to_string();
                    if !transient {
                        break;
                    }
                }
            }
            delay = (delay * 2).min(policy.max_backoff);
        }
        self.state.send_replace(ConnState::Failed(format!(
            "{last} (after {attempts} login attempts)"
        )));
    }

    async fn send_pdu(self: &Arc<Self>, generation: u64, pdu: Pdu) -> Result<()> {
        self.send_built(generation, || Ok(pdu)).await
    }

    /// [`Inner::send_pdu`] of the PDU `build` makes once the writer is held,
    /// for a PDU that must take its place in the stream as it is built (a
    /// CmdSN taken from the engine). `build` runs only on the connection of
    /// `generation`; its error is returned with nothing sent.
    async fn send_built(
        self: &Arc<Self>,
        generation: u64,
        build: impl FnOnce() -> Result<Pdu>,
    ) -> Result<()> {
        let mut w = self.writer.lock().await;
        let digests = w.digests;
        let current = w.generation == generation;
        if current && w.logging_out {
            return Err(Error::Closed);
        }
        match w.half.take_if(|_| current) {
            Some(mut half) => {
                let pdu = match build() {
                    Ok(pdu) => pdu,
                    Err(e) => {
                        w.half = Some(half);
                        return Err(e);
                    }
                };
                w.logging_out = matches!(pdu.bhs, Bhs::LogoutRequest(_));
                let sent = send_whole(
                    self.config.send_timeout,
                    write_whole(&mut half, &pdu, digests),
                )
                .await;
                if let Err(e) = sent {
                    drop(half);
                    drop(w);
                    self.connection_lost(generation, format!("sending a PDU: {e}"));
                    return Err(Error::io(format!("sending to {}", self.portal), e));
                }
                w.half = Some(half);
                Ok(())
            }
            None => {
                if current {
                    drop(w);
                    self.connection_lost(generation, CUT_SHORT.into());
                }
                Err(Error::io(
                    format!("sending to {}", self.portal),
                    std::io::Error::new(std::io::ErrorKind::NotConnected, "connection lost"),
                ))
            }
        }
    }

    fn dispatch(self: &Arc<Self>, generation: u64, events: Vec<Event<Owner>>) -> Option<String> {
        let mut drop_reason = None;
        for ev in events {
            match ev {
                Event::R2t { owner, r2t } => {
                    let _ = owner.send(Msg::R2t(r2t));
                }
                Event::Complete { owner, result } => {
                    if let TaskResult::Logout(code, time2wait) = &result {
                        // Taken here, by the reader, before it can see the
                        // connection end after the response.
                        self.after_logout(*code, *time2wait);
                    }
                    let _ = owner.send(Msg::Done(result));
                }
                Event::Send(pdu) => {
                    let answer = match self.ping_answers.take() {
                        Ok(answer) => answer,
                        Err(why) => {
                            drop_reason = Some(why);
                            continue;
                        }
                    };
                    // Never wait for the writer here: the reader must keep
                    // draining the socket while commands are sending.
                    let me = self.clone();
                    tokio::spawn(async move {
                        let _ = me.send_pdu(generation, pdu).await;
                        drop(answer);
                    });
                }
                Event::Drop { reason, time2wait } => {
                    if time2wait.is_some() {
                        *lock(&self.time2wait) = time2wait;
                    }
                    drop_reason = Some(reason);
                }
                Event::LogoutRequested { within } => {
                    let handle = tokio::spawn(self.clone().log_out_on_request(generation, within))
                        .abort_handle();
                    // A target repeating the request gets tasks that end at
                    // once (the first claimed the connection): their handles
                    // go, so a flood of them holds no memory.
                    let mut bg = lock(&self.background);
                    bg.retain(|h| !h.is_finished());
                    bg.push(handle);
                }
            }
        }
        drop_reason
    }

    async fn reader_loop(self: Arc<Self>, generation: u64, mut reader: PduReader<OwnedReadHalf>) {
        let reason = loop {
            let h = match reader.read_header().await {
                Ok(h) => h,
                Err(e) => break e.to_string(),
            };
            self.touch();
            let events = if is_data_in(&h) {
                let Bhs::DataIn(d) = h.bhs else {
                    unreachable!("checked")
                };
                let (placement, events) = {
                    let mut eng = lock(&self.engine);
                    if eng.generation() != generation {
                        return;
                    }
                    eng.data_in_begin(&d, h.data_len)
                };
                if let Some(r) = self.dispatch(generation, events) {
                    break r;
                }
                match placement {
                    Placement::Into { mut buf, range } => {
                        let r = reader.read_data_into(&mut buf[range]).await;
                        if let Err(e) = r {
                            // The payload never arrived whole: the buffer
                            // goes back to its task, whose status is not
                            // taken, so the task stays for the connection's
                            // loss to report it Lost, and counted.
                            let unread = DataIn { status: None, ..d };
                            lock(&self.engine).data_in_end(&unread, Some(buf), 0);
                            break e.to_string();
                        }
                        lock(&self.engine).data_in_end(&d, Some(buf), h.data_len)
                    }
                    Placement::Discard => {
                        if let Err(e) = reader.skip_data(h.data_len).await {
                            break e.to_string();
                        }
                        lock(&self.engine).data_in_end(&d, None, 0)
                    }
                }
            } else {
                let pdu = match reader.finish_pdu(h).await {
                    Ok(p) => p,
                    Err(e) => break e.to_string(),
                };
                let mut eng = lock(&self.engine);
                if eng.generation() != generation {
                    return;
                }
                eng.receive(pdu)
            };
            self.window.notify_waiters();
            if let Some(r) = self.dispatch(generation, events) {
                break r;
            }
        };
        self.connection_lost(generation, reason);
    }

    async fn keepalive(self: Arc<Self>, generation: u64, interval: Duration) {
        loop {
            tokio::time::sleep(interval / 2).await;
            if self.idle_for() < interval {
                continue;
            }
            let (tx, mut rx) = mpsc::unbounded_channel();
            let nop = lock(&self.engine).start_ping(tx);
            if self
                .send_pdu(generation, Pdu::new(Bhs::NopOut(nop)))
                .await
                .is_err()
            {
                return;
            }
            match tokio::time::timeout(self.config.nop_timeout, rx.recv()).await {
                Ok(Some(Msg::Done(_))) => {}
                Ok(_) => return,
                Err(_) => {
                    self.connection_lost(
                        generation,
                        format!(
                            "keepalive NOP-Out unanswered for {:?}",
                            self.config.nop_timeout
                        ),
                    );
                    return;
                }
            }
        }
    }

    async fn tmf(
        self: &Arc<Self>,
        function: TmfFunction,
        lun: u16,
        referenced: Option<u32>,
    ) -> Result<TmfResponse> {
        let gen = self.wait_up().await?;
        self.tmf_on(gen, function, lun, referenced).await
    }

    /// [`Inner::tmf`] on the connection of generation `gen` only: an ABORT
    /// TASK names a tag of that connection, which a later one hands out
    /// afresh to other commands.
    async fn tmf_on(
        self: &Arc<Self>,
        gen: u64,
        function: TmfFunction,
        lun: u16,
        referenced: Option<u32>,
    ) -> Result<TmfResponse> {
        self.own_task_management.fetch_add(1, Ordering::Relaxed);
        let (tx, mut rx) = mpsc::unbounded_channel();
        // The request takes its CmdSN with the writer held, as a command
        // does. An immediate request carries the CmdSN of the next command
        // (RFC 7143 §4.2.2.1) and covers the commands numbered below it; one
        // numbered before a command still waiting for the writer would share
        // that command's CmdSN and follow it on the wire, so the target would
        // end that command with the task set while this side spared it, and
        // it would wait for an answer that never comes.
        self.send_built(gen, || {
            let mut eng = lock(&self.engine);
            if eng.generation() != gen {
                return Err(Error::Protocol("connection changed; retry".into()));
            }
            let req = eng.start_tmf(function, lun, referenced, tx);
            tracing::debug!(target = %self.target, lun, itt = req.itt, cmd_sn = req.cmd_sn, function = function.name(), "task management");
            Ok(Pdu::new(Bhs::TaskMgmtRequest(req)))
        })
        .await?;
        match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
            Ok(Some(Msg::Done(TaskResult::Tmf(r)))) => Ok(r),
            Ok(Some(Msg::Done(TaskResult::Failed { reason, .. }))) => Err(Error::Protocol(reason)),
            Ok(_) => Err(Error::Protocol(format!(
                "connection lost before the {} response",
                function.name()
            ))),
            Err(_) => Err(Error::Timeout(format!("{} on LUN {lun}", function.name()))),
        }
    }

    async fn pass_through(
        self: &Arc<Self>,
        lun: u16,
        cdb: &[u8],
        dir: DataDir<'_>,
        itt: &AtomicU32,
    ) -> Result<RawCompletion> {
        let cdb16 = cdb16_of(cdb)?;
        let _permit = self.slots.acquire().await.map_err(|_| Error::Closed)?;
        let (read_len, write, mut read_into) = match dir {
            DataDir::None => (0, &[][..], None),
            DataDir::Read(b) => (b.len(), &[][..], Some(b)),
            DataDir::Write(d) => (0, d, None),
        };
        let initial = read_into.as_mut().map(|b| std::mem::take(*b));
        let result = self
            .run(lun, &cdb16, read_len, write, initial, Some(itt))
            .await?;
        let (outcome, back) = match result {
            TaskResult::Scsi(mut o) => {
                let back = o.buf.take();
                (Ok(o), back)
            }
            TaskResult::Aborted { buf } => (Err(Error::Aborted { lun }), buf),
            TaskResult::Failed { reason, buf } => (Err(Error::Protocol(reason)), buf),
            other => (
                Err(Error::Protocol(format!(
                    "unexpected completion {other:?} for a SCSI command"
                ))),
                None,
            ),
        };
        if let Some(b) = read_into {
            *b = back.unwrap_or_default();
        }
        RawCompletion::of_outcome(lun, &outcome?, read_len, write.len())
    }

    async fn execute_once(
        self: &Arc<Self>,
        lun: u16,
        cdb: &[u8],
        dir: &mut DataDir<'_>,
    ) -> Result<Completion> {
        let cdb16 = cdb16_of(cdb)?;
        let _permit = self.slots.acquire().await.map_err(|_| Error::Closed)?;
        let (read_len, write): (usize, &[u8]) = match dir {
            DataDir::None => (0, &[]),
            DataDir::Read(b) => (b.len(), &[]),
            DataDir::Write(d) => (0, d),
        };
        let mut buf = match dir {
            DataDir::Read(b) => Some(std::mem::take(*b)),
            _ => None,
        };
        let result = self
            .run(lun, &cdb16, read_len, write, buf.take(), None)
            .await
            .and_then(|r| self.complete(lun, cdb16[0], read_len, write.len(), r, &mut buf));
        if let DataDir::Read(b) = dir {
            let mut v = buf.unwrap_or_else(|| vec![0; read_len]);
            if let Ok(c) = &result {
                v.truncate(c.transferred);
            }
            **b = v;
        }
        result
    }

    /// Runs one command until the target ends it, re-issuing it after a lost
    /// connection; the task's end comes back undecoded. `buf` is the read
    /// buffer to use (one of `read_len` bytes is made if it is None). `itt` follows the
    /// tag the command was last sent with (0 before it is sent), for an
    /// ABORT TASK by a caller that only knows its own handle on the command.
    async fn run(
        self: &Arc<Self>,
        lun: u16,
        cdb: &[u8; 16],
        read_len: usize,
        write: &[u8],
        mut buf: Option<Vec<u8>>,
        itt_sink: Option<&AtomicU32>,
    ) -> Result<TaskResult> {
        let mut timeouts = 0;
        let mut losses = 0;
        loop {
            if losses >= COMMAND_LOSSES {
                let name =
                    blockwire_pdu::scsi::opcode::opcode_name(cdb[0], None).unwrap_or("a command");
                return Err(Error::io(
                    format!("sending {name} to LUN {lun}"),
                    std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        format!(
                            "the connection was lost {losses} times with it in flight; given up \
                             (does {} drop the connection on this command?)",
                            self.target
                        ),
                    ),
                ));
            }
            let gen = self.wait_up().await?;
            let (tx, mut rx) = mpsc::unbounded_channel();
            let read_buf = (read_len > 0).then(|| buf.take().unwrap_or_else(|| vec![0; read_len]));
            let itt = match self.send_command(gen, lun, cdb, read_buf, write, tx).await {
                Ok(itt) => itt,
                Err(back) => {
                    buf = back;
                    continue;
                }
            };
            if let Some(sink) = itt_sink {
                sink.store(itt, Ordering::Release);
            }
            // A command run for another SCSI stack (`itt_sink`) is that
            // stack's to time out and abort.
            let deadline = self
                .config
                .command_timeout
                .filter(|_| itt_sink.is_none())
                .and_then(|t| deadline_of(cdb[0], t))
                .map(|t| tokio::time::Instant::now() + t);
            loop {
                let msg = match deadline {
                    None => rx.recv().await,
                    Some(at) => match tokio::time::timeout_at(at, rx.recv()).await {
                        Ok(msg) => msg,
                        Err(_) => {
                            timeouts += 1;
                            match self
                                .abort_unanswered(gen, lun, cdb, itt, &mut rx, timeouts)
                                .await?
                            {
                                Unanswered::Answered(result) => return Ok(result),
                                Unanswered::Gone(back) => {
                                    buf = back;
                                    break;
                                }
                                Unanswered::Lost(back) => {
                                    buf = back;
                                    losses += 1;
                                    break;
                                }
                            }
                        }
                    },
                };
                match msg {
                    Some(Msg::R2t(r2t)) => self.send_solicited(gen, &r2t, write).await,
                    Some(Msg::Done(result)) => return Ok(result),
                    Some(Msg::Lost(back)) => {
                        buf = back;
                        losses += 1;
                        tracing::debug!(target = %self.target, lun, itt, losses, "re-issuing a command after the connection was lost");
                        break;
                    }
                    // The task's end went unsaid: a loss all the same, or
                    // a command that keeps meeting it is sent for good.
                    None => {
                        losses += 1;
                        break;
                    }
                }
            }
        }
    }

    /// A command `itt`, sent on the connection of generation `gen`, whose
    /// deadline passed without an answer: ABORT TASK ends it at the target
    /// (or finds the target has no such task), so a late answer cannot
    /// land in a buffer that went on. Returns its answer if it came
    /// meanwhile; else the command is gone and may be sent again, up to
    /// [`COMMAND_TRIES`] times in all. An ABORT TASK that cannot be made on
    /// that connection (lost, or the target does not answer it) drops the
    /// connection: recovery sends the command again, as after any lost
    /// connection.
    async fn abort_unanswered(
        self: &Arc<Self>,
        gen: u64,
        lun: u16,
        cdb: &[u8; 16],
        itt: u32,
        rx: &mut mpsc::UnboundedReceiver<Msg>,
        timeouts: u32,
    ) -> Result<Unanswered> {
        let waited = self
            .config
            .command_timeout
            .and_then(|t| deadline_of(cdb[0], t))
            .unwrap_or_default();
        let name = blockwire_pdu::scsi::opcode::opcode_name(cdb[0], None).unwrap_or("a command");
        // Ended just now (aborted by the caller's own task management, say):
        // that end is the command's answer. Lost just now: sent again, as
        // far as the bound below allows.
        let early = match settled(rx) {
            Some(Unanswered::Gone(buf)) => {
                return Ok(Unanswered::Answered(TaskResult::Aborted { buf }))
            }
            Some(Unanswered::Answered(result)) => return Ok(Unanswered::Answered(result)),
            lost => lost,
        };
        let done = match early {
            Some(lost) => lost,
            None => self.abort_on(gen, lun, name, itt, waited, rx).await?,
        };
        // A target that never answers it would otherwise have the session
        // drop and re-send it for good.
        if !matches!(done, Unanswered::Answered(_)) && timeouts >= COMMAND_TRIES {
            return Err(Error::Timeout(format!(
                "{name} to LUN {lun} had no answer within {waited:?}, {timeouts} times; aborted"
            )));
        }
        Ok(done)
    }

    /// The ABORT TASK of [`Inner::abort_unanswered`] and what it came to.
    async fn abort_on(
        self: &Arc<Self>,
        gen: u64,
        lun: u16,
        name: &str,
        itt: u32,
        waited: Duration,
        rx: &mut mpsc::UnboundedReceiver<Msg>,
    ) -> Result<Unanswered> {
        tracing::warn!(target = %self.target, lun, itt, command = name, "no answer within {waited:?}: ABORT TASK");
        let answer = self
            .tmf_on(gen, TmfFunction::AbortTask, lun, Some(itt))
            .await;
        // The engine ends an aborted task before it ends the ABORT TASK, so
        // its end (or a late answer) is queued by now.
        Ok(match (settled(rx), answer) {
            (Some(done), _) => done,
            (None, Ok(TmfResponse::TaskDoesNotExist)) => {
                let forgotten = {
                    let mut eng = lock(&self.engine);
                    (eng.generation() == gen).then(|| eng.forget(itt)).flatten()
                };
                match forgotten {
                    Some((_, buf)) => Unanswered::Gone(buf),
                    // Lost meanwhile (the engine emptied): its Lost is
                    // queued or on the way.
                    None => match settled(rx) {
                        Some(done) => done,
                        None => self.lost_after_all(rx).await?,
                    },
                }
            }
            (None, other) => {
                tracing::warn!(target = %self.target, lun, itt, answer = ?other, "ABORT TASK did not end an unanswered command: dropping the connection");
                self.connection_lost(
                    gen,
                    format!(
                        "{name} to LUN {lun} unanswered for {waited:?}, and ABORT TASK did not end it"
                    ),
                );
                self.lost_after_all(rx).await?
            }
        })
    }

    /// Waits (bounded) for the end of a command whose connection was
    /// dropped: its Lost, or an end that came first. A session closing
    /// meanwhile ends it as closed.
    async fn lost_after_all(&self, rx: &mut mpsc::UnboundedReceiver<Msg>) -> Result<Unanswered> {
        let limit = Duration::from_secs(10);
        let deadline = tokio::time::Instant::now() + limit;
        let mut state = self.state.subscribe();
        loop {
            let msg = tokio::select! {
                // An answer that came with the close is the answer.
                biased;
                msg = rx.recv() => msg,
                _ = state.wait_for(|s| *s == ConnState::Closed) => return Err(Error::Closed),
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(Error::Timeout(format!(
                        "the commands of a dropped connection not ended within {limit:?}"
                    )))
                }
            };
            match msg {
                Some(msg) => match Unanswered::of(msg) {
                    Some(done) => return Ok(done),
                    None => continue,
                },
                None => return Ok(Unanswered::Lost(None)),
            }
        }
    }

    /// Sends the command (with immediate and unsolicited data). Err hands
    /// the read buffer back when the connection changed before the command
    /// was registered.
    async fn send_command(
        self: &Arc<Self>,
        gen: u64,
        lun: u16,
        cdb: &[u8; 16],
        mut read_buf: Option<Vec<u8>>,
        write: &[u8],
        tx: Owner,
    ) -> std::result::Result<u32, Option<Vec<u8>>> {
        loop {
            let notified = self.window.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let mut w = self.writer.lock().await;
            if w.generation != gen || w.half.is_none() {
                let cut = w.generation == gen;
                drop(w);
                if cut {
                    self.connection_lost(gen, CUT_SHORT.into());
                }
                // Wait for the next connection before trying again.
                let _ = self.wait_up().await;
                return Err(read_buf);
            }
            let started = {
                let mut eng = lock(&self.engine);
                if eng.generation() != gen || *self.state.borrow() != ConnState::Up(gen) {
                    None
                } else if eng.window_open() {
                    let limits = eng.limits();
                    let exp = eng.exp_stat_sn();
                    let s = eng.start_scsi(lun, cdb, read_buf.take(), write.len(), tx.clone());
                    Some((s, limits, exp))
                } else {
                    None
                }
            };
            let Some(((itt, header, imm, unsol_end), limits, exp)) = started else {
                drop(w);
                if *self.state.borrow() != ConnState::Up(gen) {
                    let _ = self.wait_up().await;
                    return Err(read_buf);
                }
                let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
                continue;
            };
            let digests = w.digests;
            let mut half = w.half.take().expect("checked");
            let limit = self.config.send_timeout;
            let r = send_whole(limit, async {
                let half = &mut half;
                write_pdu(half, &Bhs::ScsiCommand(header), &write[..imm], digests).await?;
                if unsol_end > imm {
                    let lun = Lun::from_index(lun);
                    for p in data_out_sequence(
                        itt,
                        lun,
                        RESERVED_TAG,
                        imm..unsol_end,
                        limits.target_mrdsl,
                        exp,
                    ) {
                        write_pdu(half, &Bhs::DataOut(p.header), &write[p.range], digests).await?;
                    }
                }
                Ok::<_, std::io::Error>(())
            })
            .await;
            if r.is_ok() {
                w.half = Some(half);
            } else {
                drop(half);
            }
            drop(w);
            if let Err(e) = r {
                self.connection_lost(gen, format!("sending a command: {e}"));
            }
            return Ok(itt);
        }
    }

    async fn run_offloaded(
        self: &Arc<Self>,
        generation: u64,
        lun: u16,
        cdb: &[u8],
        read_len: usize,
        write_len: usize,
        ahs: Vec<blockwire_pdu::Ahs>,
        timed: bool,
    ) -> Result<RawCompletion> {
        if cdb.is_empty() || cdb.len() > 16 {
            return Err(Error::Config(format!("CDB of {} bytes", cdb.len())));
        }
        let mut cdb16 = [0u8; 16];
        cdb16[..cdb.len()].copy_from_slice(cdb);
        let stale = || {
            Error::OffloadInterrupted("the session logged in again: RDMA binding is stale".into())
        };
        let _permit = self.slots.acquire().await.map_err(|_| Error::Closed)?;
        let gen = self.wait_up().await?;
        if gen != generation {
            return Err(stale());
        }
        let (tx, mut rx) = mpsc::unbounded_channel();
        loop {
            let notified = self.window.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let mut w = self.writer.lock().await;
            if w.generation != gen || w.half.is_none() {
                return Err(stale());
            }
            let started = {
                let mut eng = lock(&self.engine);
                if eng.generation() != gen {
                    return Err(stale());
                }
                eng.window_open()
                    .then(|| eng.start_scsi_offloaded(lun, &cdb16, read_len, write_len, tx.clone()))
            };
            let Some((_itt, header)) = started else {
                drop(w);
                let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
                continue;
            };
            let pdu = Pdu {
                bhs: Bhs::ScsiCommand(header),
                ahs,
                data: Default::default(),
            };
            let digests = w.digests;
            let mut half = w.half.take().expect("checked");
            let r = send_whole(
                self.config.send_timeout,
                write_whole(&mut half, &pdu, digests),
            )
            .await;
            if r.is_ok() {
                w.half = Some(half);
            } else {
                drop(half);
            }
            drop(w);
            if let Err(e) = r {
                self.connection_lost(gen, format!("sending a command: {e}"));
            }
            break;
        }
        let answered = async {
            loop {
                match rx.recv().await {
                    Some(Msg::R2t(_)) => {} // refused by the engine (offloaded writes take none)
                    Some(Msg::Done(result)) => return Some(result),
                    Some(Msg::Lost(_)) | None => return None,
                }
            }
        };
        let deadline = self
            .config
            .command_timeout
            .filter(|_| timed)
            .and_then(|t| deadline_of(cdb16[0], t));
        let answer = match deadline {
            Some(d) => match tokio::time::timeout(d, answered).await {
                Ok(answer) => answer,
                // Not aborted and sent again as a TCP command is: its
                // buffers are the target's to RDMA Write or Read until it
                // ends. The connection is recovered, which makes the RDMA
                // binding stale; the caller takes its RDMA connection down
                // and sends the command again over TCP.
                Err(_) => {
                    let why = format!(
                        "no answer to the offloaded SCSI command {:#04x} within {d:?}",
                        cdb16[0]
                    );
                    self.connection_lost(gen, why.clone());
                    return Err(Error::OffloadInterrupted(why));
                }
            },
            None => answered.await,
        };
        let Some(result) = answer else {
            return Err(Error::OffloadInterrupted(
                "connection lost during an offloaded command".into(),
            ));
        };
        match result {
            // No data travelled on the connection: what moved either way
            // is what the residual leaves of the buffers.
            TaskResult::Scsi(o) => RawCompletion::of_outcome(lun, &o, 0, read_len + write_len),
            TaskResult::Aborted { .. } => Err(Error::Aborted { lun }),
            TaskResult::Failed { reason, .. } => Err(Error::Protocol(reason)),
            other => Err(Error::Protocol(format!(
                "unexpected completion {other:?} for an offloaded SCSI command"
            ))),
        }
    }

    async fn send_solicited(self: &Arc<Self>, gen: u64, r2t: &R2t, write: &[u8]) {
        let mut w = self.writer.lock().await;
        if w.generation != gen {
            return;
        }
        let digests = w.digests;
        let Some(mut half) = w.half.take() else {
            drop(w);
            self.connection_lost(gen, CUT_SHORT.into());
            return;
        };
        // Built, and the R2T counted off, with the writer held: sent whole
        // from here, so no other R2T's answer is counted off before it.
        let pdus = lock(&self.engine).answer_r2t(r2t).unwrap_or_default();
        let res = send_whole(self.config.send_timeout, async {
            for p in pdus {
                write_pdu(&mut half, &Bhs::DataOut(p.header), &write[p.range], digests).await?;
            }
            Ok(())
        })
        .await;
        if res.is_ok() {
            w.half = Some(half);
        } else {
            drop(half);
        }
        drop(w);
        if let Err(e) = res {
            self.connection_lost(gen, format!("sending Data-Out: {e}"));
        }
    }

    fn complete(
        &self,
        lun: u16,
        opcode: u8,
        read_len: usize,
        write_len: usize,
        result: TaskResult,
        buf: &mut Option<Vec<u8>>,
    ) -> Result<Completion> {
        scsi_completion(lun, opcode, read_len, write_len, result, buf)
    }
}

/// How many times a READ, WRITE or SYNCHRONIZE CACHE is sent when its
/// answer does not come in time ([`InitiatorConfig::command_timeout`]).
pub const COMMAND_TRIES: u32 = 3;

/// How many connections a command may be in flight on when they are lost
/// before it fails: each loss sends it again on the next connection, and a
/// target that drops the connection whenever it gets this command (a CDB
/// its parser cannot take) would have it sent for good, its caller never
/// answered. Linux's disk driver likewise gives a command five tries.
pub const COMMAND_LOSSES: u32 = 5;

/// How long a command may wait for its answer, given the command timeout:
/// the reads and writes of blocks, which a target answers within seconds,
/// that long; SYNCHRONIZE CACHE, which writes a whole cache back, twice
/// that (as the Linux disk driver allows a flush); none for the commands
/// that may rightly run for minutes (see
/// [`InitiatorConfig::command_timeout`]).
pub(crate) fn deadline_of(opcode: u8, command_timeout: Duration) -> Option<Duration> {
    use blockwire_pdu::scsi::opcode as op;
    match opcode {
        op::READ_6
        | op::READ_10
        | op::READ_12
        | op::READ_16
        | op::WRITE_6
        | op::WRITE_10
        | op::WRITE_12
        | op::WRITE_16 => Some(command_timeout),
        op::SYNCHRONIZE_CACHE_10 | op::SYNCHRONIZE_CACHE_16 => Some(command_timeout * 2),
        _ => None,
    }
}

/// What is queued for a command whose deadline passed: its end (an answer,
/// or aborted) or its connection's loss; None if nothing.
fn settled(rx: &mut mpsc::UnboundedReceiver<Msg>) -> Option<Unanswered> {
    loop {
        match rx.try_recv() {
            Ok(msg) => match Unanswered::of(msg) {
                Some(done) => return Some(done),
                None => continue,
            },
            Err(mpsc::error::TryRecvError::Empty) => return None,
            Err(mpsc::error::TryRecvError::Disconnected) => return Some(Unanswered::Lost(None)),
        }
    }
}

/// What became of a command whose deadline passed.
enum Unanswered {
    /// Its answer came after all.
    Answered(TaskResult),
    /// The target no longer has it: send it again (with this read buffer),
    /// counted as a timeout.
    Gone(Option<Vec<u8>>),
    /// Its connection was lost: send it again once recovered, as any
    /// command of a lost connection.
    Lost(Option<Vec<u8>>),
}

impl Unanswered {
    /// What a message to the command's owner says of it: None for an R2T
    /// (the target's wish for data of a command now ending).
    fn of(msg: Msg) -> Option<Unanswered> {
        match msg {
            Msg::Done(TaskResult::Aborted { buf }) => Some(Unanswered::Gone(buf)),
            Msg::Done(result) => Some(Unanswered::Answered(result)),
            Msg::Lost(back) => Some(Unanswered::Lost(back)),
            Msg::R2t(_) => None,
        }
    }
}

/// The residual the target reported (RFC 7143 §11.4.5) and the bytes the
/// command moved: Data-In received for a read, Data-Out accepted (the
/// length less an underflow) for a write.
fn transfer_of(o: &ScsiOutcome, read_len: usize, write_len: usize) -> (Residual, usize) {
    let residual = match (o.underflow, o.overflow) {
        (Some(n), _) if n > 0 => Residual::Underflow(n),
        (_, Some(n)) if n > 0 => Residual::Overflow(n),
        _ => Residual::None,
    };
    let transferred = if read_len > 0 {
        usize::try_from(o.data_in)
            .unwrap_or(usize::MAX)
            .min(read_len)
    } else {
        match residual {
            Residual::Underflow(n) => write_len.saturating_sub(n as usize),
            _ => write_len,
        }
    };
    (residual, transferred)
}

/// A READ or WRITE of `blocks` blocks at `lba` whose buffer is `asked` bytes,
/// every one of them: a good answer with an underflow residual (RFC 7143
/// §11.4.5) moved fewer, and callers that take the buffer as all its blocks
/// (dd, mount, ublk) must see an error, not zeros read or blocks unwritten.
/// For the data paths whose data move by RDMA, where the residual is all the
/// initiator learns of what moved.
pub(crate) fn all_blocks_moved(
    done: Completion,
    what: &str,
    lun: u16,
    lba: u64,
    blocks: u32,
    asked: usize,
) -> Result<Completion> {
    match done.residual {
        Residual::Underflow(n) if n > 0 => Err(Error::Protocol(format!(
            "{what} of {blocks} blocks at LBA {lba} of LUN {lun} ended GOOD with {} of its \
             {asked} bytes moved",
            asked.saturating_sub(n as usize)
        ))),
        _ => Ok(done),
    }
}

/// The CDB padded to the 16 bytes of the SCSI Command PDU (RFC 7143 §11.3.5).
fn cdb16_of(cdb: &[u8]) -> Result<[u8; 16]> {
    if cdb.is_empty() || cdb.len() > 16 {
        return Err(Error::Config(format!(
            "CDB of {} bytes: blockwire sends CDBs of 1 to 16 bytes",
            cdb.len()
        )));
    }
    let mut cdb16 = [0u8; 16];
    cdb16[..cdb.len()].copy_from_slice(cdb);
    Ok(cdb16)
}

/// How a SCSI task's end looks to the caller: a [`Completion`], or the error that
/// names the LUN and the command (CHECK CONDITION with its sense, an abort, a
/// protocol failure). `buf` gets the read buffer back.
pub(crate) fn scsi_completion(
    lun: u16,
    opcode: u8,
    read_len: usize,
    write_len: usize,
    result: TaskResult,
    buf: &mut Option<Vec<u8>>,
) -> Result<Completion> {
    {
        match result {
            TaskResult::Scsi(mut o) => {
                *buf = o.buf.take();
                if o.response != 0 {
                    return Err(Error::TargetFailure {
                        lun,
                        response: o.response,
                    });
                }
                let sense = parse_sense_segment(&o.sense_segment).ok().flatten();
                let status = ScsiStatus(o.status);
                // RECOVERED ERROR (SPC-4 4.5.6): the command completed, the
                // device server having recovered on its own; its data and
                // sense are the caller's, as Linux's sd completes it.
                if !crate::engine::completes_command(o.status, sense.as_ref()) {
                    return Err(Error::Scsi(ScsiError {
                        lun,
                        opcode,
                        status,
                        sense,
                    }));
                }
                let (residual, transferred) = transfer_of(&o, read_len, write_len);
                Ok(Completion {
                    status,
                    residual,
                    transferred,
                    sense,
                })
            }
            TaskResult::Aborted { buf: b } => {
                *buf = b;
                Err(Error::Aborted { lun })
            }
            TaskResult::Failed { reason, buf: b } => {
                *buf = b;
                Err(Error::Protocol(reason))
            }
            other => Err(Error::Protocol(format!(
                "unexpected completion {other:?} for a SCSI command"
            ))),
        }
    }
}
