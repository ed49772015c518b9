//! The session table: TSIH allocation, session reinstatement and the
//! state a session keeps across its (single) connection.
//!
//! blockwire negotiates MaxConnections=1, so a session has one connection
//! at a time. A login with the same InitiatorName and ISID and TSIH 0
//! reinstates the session (RFC 7143 §6.3.5): the old connection is told to
//! stop, its tasks are aborted, and a new session takes its place. A login
//! with a known TSIH and the same CID reinstates the connection: the new
//! connection takes over the session and its CmdSN window.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use blockwire_pdu::keys::SessionParams;
use tokio::sync::watch;

use crate::iscsi::catalog::TargetEntry;
use crate::scsi::stats::IoStats;
use crate::scsi::ItNexus;

/// Why a session could not be created or joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// A nonzero TSIH names no session.
    #[error("no session with TSIH {0}")]
    DoesNotExist(u16),
    /// The session already has its one connection and this is another CID.
    #[error("session already has a connection (MaxConnections=1)")]
    TooManyConnections,
    /// Every TSIH is in use.
    #[error("out of sessions")]
    OutOfResources,
    /// This many discovery sessions are open already.
    #[error("{0} discovery sessions are open already; raise max_discovery_sessions if that many initiators discover at once")]
    TooManyDiscoverySessions(usize),
    /// This many discovery sessions of the login's host (its IPv4 address
    /// or IPv6 /64, see [`super::host_key`]) are open already.
    #[error("{0} discovery sessions from this host (its IPv4 address or IPv6 /64) are open already; raise max_discovery_sessions_per_address if one host discovers that often at once")]
    TooManyDiscoverySessionsFromAddress(usize),
}

/// A SCSI task the session is running, as task management sees it.
#[derive(Debug, Clone)]
pub struct TaskInfo {
    /// LUN the task addresses.
    pub lun: u16,
    /// Set when the task is aborted: its result is then discarded.
    pub aborted: Arc<AtomicBool>,
    /// How many of the task's calls into the SCSI core that may change the
    /// medium are running ([`super::task::CommandContext::in_core`]): an
    /// abort's answer waits for them.
    pub changing_medium: Arc<AtomicUsize>,
    /// The task finished and its response is being queued: too late to
    /// abort. Task management waits for the response to be queued.
    pub completing: bool,
}

/// What an abort found.
#[derive(Debug, Default)]
pub struct Aborted {
    /// Tasks aborted: they will send no response.
    pub aborted: Vec<u32>,
    /// Tasks whose responses are already on their way.
    pub completing: Vec<u32>,
    /// The aborted tasks' counts of core calls that may change the medium
    /// (see [`TaskInfo::changing_medium`]): once an abort is answered,
    /// none of them may still be writing (SAM-5: an aborted command
    /// changes nothing after the task management function completes).
    pub changing_medium: Vec<Arc<AtomicUsize>>,
}

/// The tasks of one session, by Initiator Task Tag.
///
/// A task ends in exactly one of two ways, decided under this set's lock:
/// aborted (no response is ever sent) or completing (its response will be
/// queued; an abort then answers "task does not exist", after waiting until
/// the response is queued so the initiator sees them in that order).
#[derive(Debug, Default)]
pub struct TaskSet {
    // One insert and one removal per command (foldhash, seeded per map).
    tasks: Mutex<foldhash::HashMap<u32, TaskInfo>>,
}

impl TaskSet {
    fn lock(&self) -> std::sync::MutexGuard<'_, foldhash::HashMap<u32, TaskInfo>> {
        self.tasks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a new task and returns its abort flag and its count of
    /// core calls that may change the medium.
    pub fn insert(&self, itt: u32, lun: u16) -> (Arc<AtomicBool>, Arc<AtomicUsize>) {
        let aborted = Arc::new(AtomicBool::new(false));
        let changing_medium = Arc::new(AtomicUsize::new(0));
        self.lock().insert(
            itt,
            TaskInfo {
                lun,
                aborted: aborted.clone(),
                changing_medium: changing_medium.clone(),
                completing: false,
            },
        );
        (aborted, changing_medium)
    }

    /// The abort flag of a registered task; None if it was aborted.
    pub fn flag(&self, itt: u32) -> Option<Arc<AtomicBool>> {
        self.lock().get(&itt).map(|t| t.aborted.clone())
    }

    /// A task's result is ready: true if it may send its response (then
    /// call [`TaskSet::done`] once it is queued), false if it was aborted.
    pub fn finish(&self, itt: u32, flag: &Arc<AtomicBool>) -> bool {
        let mut tasks = self.lock();
        match tasks.get_mut(&itt) {
            Some(t) if Arc::ptr_eq(&t.aborted, flag) && !flag.load(Ordering::SeqCst) => {
                t.completing = true;
                true
            }
            _ => false,
        }
    }

    /// Runs `f` (e.g. queueing one of the task's Data-In PDUs) under this
    /// set's lock if the task is still live; false if it was aborted. An
    /// abort then either comes after `f` (and its response follows what
    /// `f` queued) or before it (and `f` never runs).
    pub fn while_live(&self, itt: u32, flag: &Arc<AtomicBool>, f: impl FnOnce()) -> bool {
        let tasks = self.lock();
        match tasks.get(&itt) {
            Some(t) if Arc::ptr_eq(&t.aborted, flag) && !flag.load(Ordering::SeqCst) => {
                f();
                true
            }
            _ => false,
        }
    }

    /// The task's response is queued: forget it.
    pub fn done(&self, itt: u32, flag: &Arc<AtomicBool>) {
        let mut tasks = self.lock();
        if tasks
            .get(&itt)
            .is_some_and(|t| Arc::ptr_eq(&t.aborted, flag))
        {
            tasks.remove(&itt);
        }
    }

    /// Forgets a task without running it (e.g. its data never arrived).
    pub fn remove(&self, itt: u32) {
        self.lock().remove(&itt);
    }

    /// Whether a task is registered and not yet completing: a new command
    /// under its tag would be a second task of the same name. (A completing
    /// task's tag may come back at once: the initiator may have its
    /// response before the task forgets it.)
    pub fn is_running(&self, itt: u32) -> bool {
        self.lock().get(&itt).is_some_and(|t| !t.completing)
    }

    /// Whether a task other than `itt` is registered (running or
    /// completing): the session has commands in the task set besides it.
    pub fn any_other_than(&self, itt: u32) -> bool {
        self.lock().keys().any(|&t| t != itt)
    }

    /// Whether a task is still registered (running or completing).
    pub fn contains(&self, itt: u32) -> bool {
        self.lock().contains_key(&itt)
    }

    /// Aborts the tasks `pick` selects by ITT and LUN, except those already
    /// completing, which are reported separately.
    pub fn abort_where(&self, pick: impl Fn(u32, u16) -> bool) -> Aborted {
        let mut tasks = self.lock();
        let mut out = Aborted::default();
        for (itt, t) in tasks.iter() {
            if pick(*itt, t.lun) {
                if t.completing {
                    out.completing.push(*itt);
                } else {
                    out.aborted.push(*itt);
                }
            }
        }
        for itt in &out.aborted {
            if let Some(t) = tasks.remove(itt) {
                // Set before the count is read (in `await_aborted`), as a
                // core call raises the count before it reads the flag: one
                // of the two sees the other.
                t.aborted.store(true, Ordering::SeqCst);
                out.changing_medium.push(t.changing_medium);
            }
        }
        out
    }
}

/// One logged-in session.
#[derive(Debug)]
pub struct Session {
    /// Target Session Identifying Handle.
    pub tsih: u16,
    /// Initiator Session ID.
    pub isid: [u8; 6],
    /// InitiatorName.
    pub initiator_name: String,
    /// The target (None for a discovery session).
    pub target: Option<Arc<TargetEntry>>,
    /// The I_T nexus (normal sessions).
    pub nexus: Option<ItNexus>,
    /// Negotiated parameters.
    pub params: SessionParams,
    /// Portal group tag of the connection's portal.
    pub tpgt: u16,
    /// The initiator's address at login, where the connection had one.
    pub peer: Option<std::net::IpAddr>,
    /// The portal (local address) of the current connection.
    portal: Mutex<std::net::SocketAddr>,
    /// CID of the current connection.
    cid: Mutex<u16>,
    /// Flips to true when the current connection must stop (reinstatement,
    /// target reset, shutdown of this session).
    stop: watch::Sender<u64>,
    /// Generation of the connection that currently owns the session.
    generation: Mutex<u64>,
    /// Running SCSI tasks.
    pub tasks: TaskSet,
    /// READ/WRITE counters of this session's initiator on its target, shared
    /// by every session of that initiator there (None: discovery).
    pub initiator_io: Option<Arc<IoStats>>,
}

impl Session {
    /// A receiver that changes when the connection with `generation` must stop.
    pub fn stop_signal(&self) -> watch::Receiver<u64> {
        self.stop.subscribe()
    }

    /// CID of the session's connection.
    pub fn cid(&self) -> u16 {
        *self.cid.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The generation a newly attached connection owns.
    pub fn generation(&self) -> u64 {
        *self.generation.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Aborts every task of the session when the connection of
    /// `generation` still owns it, and says whether it did. Checked and
    /// done under the generation's lock: a connection that joins the
    /// session meanwhile (connection reinstatement) takes it over either
    /// before, its old tasks already aborted by the join, or after, its own
    /// tasks untouched.
    pub fn abort_tasks_if_owned_by(&self, generation: u64) -> bool {
        let g = self.generation.lock().unwrap_or_else(|e| e.into_inner());
        let owned = *g == generation;
        if owned {
            self.tasks.abort_where(|_, _| true);
        }
        owned
    }

    /// Tells the current connection to stop.
    pub fn stop_connection(&self) {
        let mut g = self.generation.lock().unwrap_or_else(|e| e.into_inner());
        *g += 1;
        // Kept even with no connection subscribed yet (`send` would drop
        // it): the connection that attached before this stop subscribes
        // later and must find it.
        self.stop.send_replace(*g);
    }

    /// I_T nexus loss on every LUN of the session's target (none for a
    /// discovery session). Called by whoever takes the session out of the
    /// table, once.
    fn release_nexus(&self) {
        if let (Some(t), Some(nexus)) = (&self.target, &self.nexus) {
            t.luns.nexus_lost(nexus);
        }
    }

    /// The portal (local address) of the current connection.
    pub fn portal(&self) -> std::net::SocketAddr {
        *self.portal.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this session is a discovery session.
    pub fn is_discovery(&self) -> bool {
        self.target.is_none()
    }
}

/// All sessions of the fabric.
#[derive(Debug, Default)]
pub struct SessionTable {
    inner: Mutex<TableInner>,
}

#[derive(Debug, Default)]
struct TableInner {
    by_tsih: HashMap<u16, Arc<Session>>,
    last_tsih: u16,
    /// Each initiator's counters on each target, held by its sessions: an
    /// entry lives while one of them does (so memory follows the sessions),
    /// and counts again from 0 when the initiator comes back after all had
    /// gone. Keyed by the two names as iSCSI compares them (case ignored).
    initiators: HashMap<(String, String), InitiatorEntry>,
    /// The most discovery sessions open at once (None: no bound). Each
    /// holds a connection and its task; a host opening them without end
    /// would otherwise hold memory without end, and every TSIH.
    discovery_limit: Option<DiscoveryLimit>,
}

/// The most discovery sessions open at once: in all, and from one host.
#[derive(Debug, Clone, Copy)]
struct DiscoveryLimit {
    total: usize,
    per_address: usize,
}

#[derive(Debug)]
struct InitiatorEntry {
    target: String,
    initiator: String,
    io: Weak<IoStats>,
}

/// One initiator's READ/WRITE counters on one target (every LUN, every
/// session of it there), for a metrics exporter.
#[derive(Debug, Clone)]
pub struct InitiatorIo {
    /// The target's name.
    pub target: String,
    /// The InitiatorName, as the login that made the entry spelled it.
    pub initiator: String,
    /// The counters.
    pub io: Arc<IoStats>,
    /// Its sessions with the target in the table now (its paths).
    pub sessions: usize,
}

/// A request to create or join a session, from a completed login.
#[derive(Debug, Clone)]
pub struct SessionRequest {
    /// InitiatorName.
    pub initiator_name: String,
    /// ISID.
    pub isid: [u8; 6],
    /// TSIH from the login (0: a new session).
    pub tsih: u16,
    /// CID.
    pub cid: u16,
    /// The target (None: discovery).
    pub target: Option<Arc<TargetEntry>>,
    /// Portal group tag the login came through.
    pub tpgt: u16,
    /// The local address (portal) the login came through.
    pub portal: std::net::SocketAddr,
    /// The initiator's address, where the connection has one.
    pub peer: Option<std::net::IpAddr>,
    /// Negotiated parameters.
    pub params: SessionParams,
}

impl SessionRequest {
    /// Whether this login names the I_T nexus of `s`: the same initiator
    /// (iSCSI names compare without case), ISID, target (or both
    /// discovery) and portal group.
    fn names_the_nexus_of(&self, s: &Session) -> bool {
        let same_target = match (&s.target, &self.target) {
            (Some(a), Some(b)) => a.name.eq_ignore_ascii_case(&b.name),
            (None, None) => true,
            _ => false,
        };
        s.isid == self.isid
            && s.initiator_name.eq_ignore_ascii_case(&self.initiator_name)
            && same_target
            && s.tpgt == self.tpgt
    }
}

/// A session attached for a connection
/// ([`SessionTable::attach_connection`]).
pub struct Attached {
    /// The session.
    pub session: Arc<Session>,
    /// The generation of `session` the connection owns.
    pub generation: u64,
    /// The core calls of the tasks the attach aborted (those of the session
    /// it reinstated, or of the connection it replaced) that may still
    /// change the medium: the final Login Response waits for them, as an
    /// abort's answer does, so that none lands over what the initiator
    /// writes on its new connection.
    pub still_changing_medium: Vec<Arc<AtomicUsize>>,
}

/// Waits, at most `bound`, until none of `counters` (core calls of aborted
/// tasks that may change the medium, see [`Aborted::changing_medium`])
/// runs; how many still do.
pub async fn await_medium_settled(
    counters: &[Arc<AtomicUsize>],
    bound: std::time::Duration,
) -> usize {
    let deadline = tokio::time::Instant::now() + bound;
    let running = || {
        counters
            .iter()
            .filter(|n| n.load(Ordering::SeqCst) > 0)
            .count()
    };
    while running() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    running()
}

/// A session attached for a connection that has not begun its full feature
/// phase yet. Should the connection go first (its final Login Response
/// could not be sent, its portal was cut meanwhile, its task dropped), the
/// session ends with it when this is dropped: at ErrorRecoveryLevel 0 no
/// other connection will, and it would stay in the table, its TSIH and
/// its I_T nexus taken, for good.
pub struct PendingSession<'a> {
    table: &'a SessionTable,
    attached: Option<(Arc<Session>, u64)>,
}

impl<'a> PendingSession<'a> {
    /// `session`, attached in `table` for the connection of `generation`.
    pub fn new(table: &'a SessionTable, session: Arc<Session>, generation: u64) -> Self {
        PendingSession {
            table,
            attached: Some((session, generation)),
        }
    }

    /// The session.
    pub fn session(&self) -> &Arc<Session> {
        &self.attached.as_ref().expect("until begun").0
    }

    /// The connection begins its full feature phase: the session and the
    /// generation it owns are its to end from now on.
    pub fn begin(mut self) -> (Arc<Session>, u64) {
        self.attached.take().expect("taken only here")
    }
}

impl Drop for PendingSession<'_> {
    fn drop(&mut self) {
        if let Some((session, generation)) = self.attached.take() {
            tracing::info!(tsih = session.tsih, initiator = %session.initiator_name, "connection gone before its full feature phase: the session ends");
            self.table.end(&session, generation);
        }
    }
}

impl SessionTable {
    /// At most `total` discovery sessions at once from now on, and
    /// `per_address` of them from one initiator host (an IPv4 address, an
    /// IPv6 /64: see [`super::host_key`]); a discovery login
    /// past either is refused ([`SessionError::TooManyDiscoverySessions`],
    /// [`SessionError::TooManyDiscoverySessionsFromAddress`]). The share
    /// keeps one host from taking every discovery session there is.
    pub fn limit_discovery_sessions(&self, total: usize, per_address: usize) {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .discovery_limit = Some(DiscoveryLimit { total, per_address });
    }

    /// Creates a session, reinstating any with the same initiator, ISID and
    /// target, or joins an existing one (connection reinstatement).
    pub fn attach(&self, req: SessionRequest) -> Result<Arc<Session>, SessionError> {
        self.attach_connection(req).map(|a| a.session)
    }

    /// [`attach`](Self::attach) for the connection that will carry the
    /// session: with the generation that connection owns, read under the
    /// table's lock. A close, a reinstatement or a joining connection that
    /// comes before the connection starts its full feature phase (its final
    /// Login Response still on the way) moves the generation on, and the
    /// connection must see that it lost the session before it serves a
    /// command; reading the generation only then would take the new one as
    /// its own.
    pub fn attach_connection(&self, req: SessionRequest) -> Result<Attached, SessionError> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut still_changing_medium = Vec::new();
        let session = Self::attach_locked(&mut inner, req, &mut still_changing_medium)?;
        let generation = session.generation();
        drop(inner);
        Ok(Attached {
            session,
            generation,
            still_changing_medium,
        })
    }

    /// Attaches under the table's lock; the tasks it aborts (of a session
    /// reinstated, of a connection replaced) that may still change the
    /// medium are added to `still_changing_medium`.
    fn attach_locked(
        inner: &mut TableInner,
        req: SessionRequest,
        still_changing_medium: &mut Vec<Arc<AtomicUsize>>,
    ) -> Result<Arc<Session>, SessionError> {
        if req.tsih != 0 {
            let s = inner
                .by_tsih
                .get(&req.tsih)
                .cloned()
                .ok_or(SessionError::DoesNotExist(req.tsih))?;
            // A session is its I_T nexus: InitiatorName, ISID, TargetName and
            // portal group (RFC 7143 §4.4.1). The login that joins it was
            // authorized (ACL, CHAP) for the target and session type it
            // named, so it joins only a session of that very nexus: one
            // naming a discovery session, another target or another portal
            // group must not take over this one.
            if !req.names_the_nexus_of(&s) {
                return Err(SessionError::DoesNotExist(req.tsih));
            }
            let mut cid = s.cid.lock().unwrap_or_else(|e| e.into_inner());
            if *cid != req.cid {
                return Err(SessionError::TooManyConnections);
            }
            *cid = req.cid;
            drop(cid);
            *s.portal.lock().unwrap_or_else(|e| e.into_inner()) = req.portal;
            // ErrorRecoveryLevel 0 has no task reassignment: the old
            // connection's tasks end with it.
            still_changing_medium.extend(s.tasks.abort_where(|_, _| true).changing_medium);
            s.stop_connection();
            return Ok(s);
        }
        if let (None, Some(limit)) = (&req.target, inner.discovery_limit) {
            // Counted before the reinstatement below, leaving out the
            // sessions it ends: a discovery login that takes over its own
            // session still opens, and one that is refused ends nothing.
            // Per host, not per address: an IPv6 host may take as many
            // addresses of its /64 as it likes.
            let host = req.peer.map(super::host_key::host_key);
            let (mut open, mut from_peer) = (0, 0);
            for s in inner
                .by_tsih
                .values()
                .filter(|s| s.target.is_none() && !req.names_the_nexus_of(s))
            {
                open += 1;
                from_peer +=
                    usize::from(host.is_some() && s.peer.map(super::host_key::host_key) == host);
            }
            if open >= limit.total {
                return Err(SessionError::TooManyDiscoverySessions(limit.total));
            }
            if from_peer >= limit.per_address {
                return Err(SessionError::TooManyDiscoverySessionsFromAddress(
                    limit.per_address,
                ));
            }
        }
        // Session reinstatement: the same I_T nexus logs in afresh (RFC 7143
        // §6.3.5). Targets compare by name (a live configuration change
        // builds new entries for the targets it keeps).
        let old: Vec<u16> = inner
            .by_tsih
            .values()
            .filter(|s| req.names_the_nexus_of(s))
            .map(|s| s.tsih)
            .collect();
        for tsih in old {
            if let Some(s) = inner.by_tsih.remove(&tsih) {
                tracing::info!(tsih, initiator = %s.initiator_name, "session reinstated: stopping the old connection");
                // The old I_T nexus is lost before the new one exists: its
                // tasks are aborted and its non-persistent state released.
                still_changing_medium.extend(s.tasks.abort_where(|_, _| true).changing_medium);
                s.release_nexus();
                s.stop_connection();
            }
        }
        let tsih = Self::free_tsih(inner).ok_or(SessionError::OutOfResources)?;
        let nexus = req
            .target
            .as_ref()
            .map(|t| ItNexus::iscsi(&req.initiator_name, req.isid, &t.name, req.tpgt));
        let initiator_io = req
            .target
            .as_ref()
            .map(|t| Self::initiator_io(inner, &t.name, &req.initiator_name));
        let (stop, _) = watch::channel(0);
        let s = Arc::new(Session {
            tsih,
            isid: req.isid,
            initiator_name: req.initiator_name,
            target: req.target,
            nexus,
            params: req.params,
            tpgt: req.tpgt,
            peer: req.peer,
            portal: Mutex::new(req.portal),
            cid: Mutex::new(req.cid),
            stop,
            generation: Mutex::new(0),
            tasks: TaskSet::default(),
            initiator_io,
        });
        inner.by_tsih.insert(tsih, s.clone());
        Ok(s)
    }

    /// Ends `session` for its connection of `generation`: at a logout that
    /// closes it, or when that connection goes (at ErrorRecoveryLevel 0 a
    /// session does not outlive its last connection). It leaves the table
    /// and its I_T nexus is lost on every LUN (SPC-2 reservations, PREVENT
    /// and unit attentions go; persistent reservations stay).
    ///
    /// Only the call that takes the session out of the table releases the
    /// nexus. A connection that was replaced (another generation) does
    /// nothing, and neither does a second call: once the session is out of
    /// the table, a new session may already hold the same I_T nexus
    /// (initiator, ISID, target) and what it took must stay.
    pub fn end(&self, session: &Arc<Session>, generation: u64) {
        self.take_out(session, Some(generation));
    }

    /// Ends `session` from the target's side (an operator closed it, or a
    /// live change took away its target or its place in the access list):
    /// it leaves the table at once, its tasks are aborted and its I_T nexus
    /// is lost on every LUN (SPC-2 reservations go, persistent ones stay),
    /// and its connection stops.
    pub fn close(&self, session: &Arc<Session>) {
        self.take_out(session, None);
        session.stop_connection();
    }

    /// Whether `session` is in the table (not ended, closed or reinstated).
    pub fn holds(&self, session: &Arc<Session>) -> bool {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .by_tsih
            .get(&session.tsih)
            .is_some_and(|s| Arc::ptr_eq(s, session))
    }

    /// Takes `session` out of the table if it is still there (and, with
    /// `generation`, still owned by that connection); whether it did. The
    /// one call that takes it out aborts its tasks and releases its I_T
    /// nexus, under the table's lock as a reinstatement does: a new login of
    /// the same nexus, which may attach the moment the session is out,
    /// keeps what it takes (a RESERVE, a unit attention taken) from this
    /// session's late release.
    fn take_out(&self, session: &Arc<Session>, generation: Option<u64>) -> bool {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let present = generation.is_none_or(|g| session.generation() == g)
            && inner
                .by_tsih
                .get(&session.tsih)
                .is_some_and(|s| Arc::ptr_eq(s, session));
        if present {
            inner.by_tsih.remove(&session.tsih);
            session.tasks.abort_where(|_, _| true);
            session.release_nexus();
        }
        present
    }

    /// Every live session.
    pub fn all(&self) -> Vec<Arc<Session>> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.by_tsih.values().cloned().collect()
    }

    /// Every initiator's counters and sessions on every target it has a
    /// session with, in the order of the two names (case ignored).
    pub fn initiators(&self) -> Vec<InitiatorIo> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        // A session holds its initiator's counters: count the sessions by them.
        let mut paths: HashMap<*const IoStats, usize> = HashMap::new();
        for io in inner
            .by_tsih
            .values()
            .filter_map(|s| s.initiator_io.as_ref())
        {
            *paths.entry(Arc::as_ptr(io)).or_default() += 1;
        }
        let mut live: Vec<(&(String, String), InitiatorIo)> = inner
            .initiators
            .iter()
            .filter_map(|(key, e)| {
                let io = e.io.upgrade()?;
                let sessions = paths.get(&Arc::as_ptr(&io)).copied().unwrap_or(0);
                let io = InitiatorIo {
                    target: e.target.clone(),
                    initiator: e.initiator.clone(),
                    io,
                    sessions,
                };
                Some((key, io))
            })
            .collect();
        live.sort_by(|a, b| a.0.cmp(b.0));
        live.into_iter().map(|(_, io)| io).collect()
    }

    /// The counters `initiator` shares on `target`, made when it has no
    /// session there; entries no session holds any more are dropped first.
    fn initiator_io(inner: &mut TableInner, target: &str, initiator: &str) -> Arc<IoStats> {
        inner.initiators.retain(|_, e| e.io.strong_count() > 0);
        let key = (target.to_ascii_lowercase(), initiator.to_ascii_lowercase());
        if let Some(io) = inner.initiators.get(&key).and_then(|e| e.io.upgrade()) {
            return io;
        }
        let io = Arc::new(IoStats::default());
        inner.initiators.insert(
            key,
            InitiatorEntry {
                target: target.to_owned(),
                initiator: initiator.to_owned(),
                io: Arc::downgrade(&io),
            },
        );
        io
    }

    fn free_tsih(inner: &mut TableInner) -> Option<u16> {
        for _ in 0..u16::MAX {
            inner.last_tsih = inner.last_tsih.wrapping_add(1);
            // TSIH 0 means "new session" on the wire and is never assigned.
            if inner.last_tsih != 0 && !inner.by_tsih.contains_key(&inner.last_tsih) {
                return Some(inner.last_tsih);
            }
        }
        None
    }
}

impl SessionTable {
    /// Aborts, in every session of `nexus`, the tasks addressed to `lun`
    /// (PREEMPT AND ABORT from another initiator, SPC-4 §5.13.11.2.6).
    pub fn abort_nexus_tasks(&self, lun: u16, nexus: &ItNexus) -> usize {
        self.all()
            .iter()
            .filter(|s| s.nexus.as_ref() == Some(nexus))
            .map(|s| {
                s.tasks
                    .abort_where(|_, task_lun| task_lun == lun)
                    .aborted
                    .len()
            })
            .sum()
    }

    /// CLEAR TASK SET of `lun` from `by`'s session: the tasks of the
    /// target's other sessions on `lun` are aborted too (the unit's task set
    /// is shared, TST=000b), and each nexus that lost one gets a unit
    /// attention, COMMANDS CLEARED BY ANOTHER INITIATOR (SAM-5 7.4, TAS=0).
    /// Returns the counts of those tasks' core calls that may change the
    /// medium, for the answer to wait for.
    pub fn clear_task_set(
        &self,
        target: &Arc<TargetEntry>,
        lun: u16,
        by: &Arc<Session>,
    ) -> Vec<Arc<AtomicUsize>> {
        let mut changing = Vec::new();
        let unit = target.luns.get(lun);
        for s in self.all() {
            if Arc::ptr_eq(&s, by) || !of_target(&s, target) {
                continue;
            }
            let out = s.tasks.abort_where(|_, task_lun| task_lun == lun);
            if out.aborted.is_empty() {
                continue;
            }
            if let (Some(lu), Some(nexus)) = (&unit, &s.nexus) {
                lu.commands_cleared(nexus);
            }
            changing.extend(out.changing_medium);
        }
        changing
    }

    /// Ends every session of `target` but `keep` (see [`Self::close`]): a
    /// TARGET COLD RESET drops the target's connections to all initiators
    /// (RFC 7143 §11.5.1); `keep`, the session that asked, ends once its
    /// answer is sent. Returns how many ended.
    pub fn close_target_sessions(&self, target: &Arc<TargetEntry>, keep: &Arc<Session>) -> usize {
        let others: Vec<Arc<Session>> = self
            .all()
            .into_iter()
            .filter(|s| !Arc::ptr_eq(s, keep) && of_target(s, target))
            .collect();
        for s in &others {
            self.close(s);
        }
        others.len()
    }

    /// Aborts the tasks of every session of `target` on `lun` (`None`: all
    /// LUNs): LUN and target resets affect all initiators (SAM-5 §6.3).
    pub fn abort_target_tasks(&self, target: &Arc<TargetEntry>, lun: Option<u16>) -> usize {
        self.all()
            .iter()
            .filter(|s| of_target(s, target))
            .map(|s| {
                s.tasks
                    .abort_where(|_, task_lun| lun.is_none_or(|l| l == task_lun))
                    .aborted
                    .len()
            })
            .sum()
    }
}

/// Whether `session` is a session of `target`: by name, as a live change
/// gives later sessions a new entry for the same target (same LUN table).
fn of_target(session: &Session, target: &TargetEntry) -> bool {
    session
        .target
        .as_ref()
        .is_some_and(|t| t.name.eq_ignore_ascii_case(&target.name))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::iscsi::catalog::{Acl, AuthPolicy};
    use crate::iscsi::login::tests::target;
    use crate::scsi::stats::Direction;

    /// A login of `initiator` with ISID qualifier `qualifier` and CID 0,
    /// naming TSIH `tsih` (0: a new session), to `target` through portal
    /// group `tpgt`.
    fn request(
        initiator: &str,
        qualifier: u8,
        tsih: u16,
        target: Option<&Arc<TargetEntry>>,
        tpgt: u16,
    ) -> SessionRequest {
        SessionRequest {
            initiator_name: initiator.into(),
            isid: [0x80, 0, 0, 0, 0, qualifier],
            tsih,
            cid: 0,
            target: target.cloned(),
            tpgt,
            portal: "127.0.0.1:3260".parse().unwrap(),
            peer: None,
            params: Default::default(),
        }
    }

    fn login(
        table: &SessionTable,
        initiator: &str,
        qualifier: u8,
        target: Option<&Arc<TargetEntry>>,
    ) -> Arc<Session> {
        table
            .attach(request(initiator, qualifier, 0, target, 1))
            .unwrap()
    }

    fn names(table: &SessionTable) -> Vec<(String, String)> {
        table
            .initiators()
            .into_iter()
            .map(|i| (i.target, i.initiator))
            .collect()
    }

    /// Discovery sessions past the limit are refused, whoever asks; normal
    /// sessions are not counted, a discovery login that reinstates its own
    /// session still opens, and one closing makes room.
    #[test]
    fn discovery_sessions_past_the_limit_are_refused() {
        let table = SessionTable::default();
        table.limit_discovery_sessions(2, 2);
        let t = target(
            "iqn.2026-11.test:one",
            Acl::Any,
            AuthPolicy::default(),
            vec![1],
        );
        let a = login(&table, "iqn.2026-11.test:host-a", 1, None);
        let _b = login(&table, "iqn.2026-11.test:host-b", 1, None);
        assert_eq!(
            table
                .attach(request("iqn.2026-11.test:host-c", 1, 0, None, 1))
                .unwrap_err(),
            SessionError::TooManyDiscoverySessions(2)
        );
        let _normal = login(&table, "iqn.2026-11.test:host-c", 1, Some(&t));
        // The same nexus as `a`: the old session goes first.
        let a_again = login(&table, "iqn.2026-11.test:host-a", 1, None);
        assert_ne!(a_again.tsih, a.tsih);
        table.end(&a_again, a_again.generation());
        let _c = login(&table, "iqn.2026-11.test:host-c", 1, None);
        assert!(table
            .attach(request("iqn.2026-11.test:host-d", 1, 0, None, 1))
            .is_err());
    }

    /// One address holds at most its share of the discovery sessions,
    /// whatever names its logins give; other addresses still find room,
    /// and a connection without an address counts in the total only.
    #[test]
    fn one_address_holds_at_most_its_share_of_discovery_sessions() {
        let table = SessionTable::default();
        table.limit_discovery_sessions(5, 2);
        let from = |initiator: &str, last: u8| {
            let mut r = request(initiator, 1, 0, None, 1);
            r.peer = Some(std::net::IpAddr::from([192, 0, 2, last]));
            table.attach(r)
        };
        let _a1 = from("iqn.2026-11.test:a1", 1).unwrap();
        let a2 = from("iqn.2026-11.test:a2", 1).unwrap();
        assert_eq!(
            from("iqn.2026-11.test:a3", 1).unwrap_err(),
            SessionError::TooManyDiscoverySessionsFromAddress(2)
        );
        let _b = from("iqn.2026-11.test:b", 2).unwrap();
        let _none = login(&table, "iqn.2026-11.test:c", 1, None);
        table.end(&a2, a2.generation());
        let _a3 = from("iqn.2026-11.test:a3", 1).unwrap();
        let b2 = from("iqn.2026-11.test:b2", 2).unwrap();
        assert_eq!(
            from("iqn.2026-11.test:d", 3).unwrap_err(),
            SessionError::TooManyDiscoverySessions(5)
        );
        // The nexus of `b2` logging in again from a full address: it
        // would reinstate `b2`, but is refused, and `b2` goes on.
        let mut again = request("iqn.2026-11.test:b2", 1, 0, None, 1);
        again.peer = Some(std::net::IpAddr::from([192, 0, 2, 1]));
        assert_eq!(
            table.attach(again).unwrap_err(),
            SessionError::TooManyDiscoverySessionsFromAddress(2)
        );
        assert!(table.holds(&b2), "a refused login ended a session");
    }

    /// The share is a host's, not an address's: addresses of one IPv6 /64
    /// share it, as does an IPv4 address written IPv4-mapped.
    #[test]
    fn a_hosts_addresses_share_its_discovery_sessions() {
        let table = SessionTable::default();
        table.limit_discovery_sessions(10, 2);
        let from = |initiator: &str, peer: &str| {
            let mut r = request(initiator, 1, 0, None, 1);
            r.peer = Some(peer.parse().unwrap());
            table.attach(r)
        };
        let _a = from("iqn.2026-11.test:a", "2001:db8:1:2::1").unwrap();
        let _b = from("iqn.2026-11.test:b", "2001:db8:1:2::2").unwrap();
        assert_eq!(
            from("iqn.2026-11.test:c", "2001:db8:1:2:ffff::3").unwrap_err(),
            SessionError::TooManyDiscoverySessionsFromAddress(2)
        );
        let _other = from("iqn.2026-11.test:d", "2001:db8:1:3::1").unwrap();
        let _v4 = from("iqn.2026-11.test:e", "198.51.100.7").unwrap();
        let _mapped = from("iqn.2026-11.test:f", "::ffff:198.51.100.7").unwrap();
        assert_eq!(
            from("iqn.2026-11.test:g", "198.51.100.7").unwrap_err(),
            SessionError::TooManyDiscoverySessionsFromAddress(2)
        );
    }

    #[test]
    fn an_initiators_sessions_on_a_target_share_its_counters_while_one_is_open() {
        let table = SessionTable::default();
        let t1 = target(
            "iqn.2026-11.test:one",
            Acl::Any,
            AuthPolicy::default(),
            vec![1],
        );
        let t2 = target(
            "iqn.2026-11.test:two",
            Acl::Any,
            AuthPolicy::default(),
            vec![1],
        );
        // Two paths of one host (ISIDs differ; iSCSI names compare without case), the
        // same host on another target, another host, and a discovery session.
        let a1 = login(&table, "iqn.2026-11.test:host-a", 1, Some(&t1));
        let a2 = login(&table, "IQN.2026-11.TEST:HOST-A", 2, Some(&t1));
        let a_on_2 = login(&table, "iqn.2026-11.test:host-a", 1, Some(&t2));
        let b = login(&table, "iqn.2026-11.test:host-b", 1, Some(&t1));
        let discovery = login(&table, "iqn.2026-11.test:host-c", 1, None);
        assert!(discovery.initiator_io.is_none());
        let (a1_io, a2_io) = (
            a1.initiator_io.clone().unwrap(),
            a2.initiator_io.clone().unwrap(),
        );
        assert!(Arc::ptr_eq(&a1_io, &a2_io));
        assert!(!Arc::ptr_eq(&a1_io, a_on_2.initiator_io.as_ref().unwrap()));
        assert!(!Arc::ptr_eq(&a1_io, b.initiator_io.as_ref().unwrap()));
        assert_eq!(
            names(&table),
            [
                (
                    "iqn.2026-11.test:one".into(),
                    "iqn.2026-11.test:host-a".into()
                ),
                (
                    "iqn.2026-11.test:one".into(),
                    "iqn.2026-11.test:host-b".into()
                ),
                (
                    "iqn.2026-11.test:two".into(),
                    "iqn.2026-11.test:host-a".into()
                ),
            ]
        );
        a1_io.record(
            Direction::Write,
            true,
            4096,
            std::time::Duration::from_micros(5),
        );
        // One path goes: the host's counters stay, with what they counted.
        table.end(&a1, a1.generation());
        drop((a1, a1_io));
        let kept = table.initiators();
        assert_eq!(kept.len(), 3);
        let write = kept[0].io.direction(Direction::Write);
        assert_eq!(write.commands.load(Ordering::Relaxed), 1);
        drop(kept);
        // Its last path goes: the entry goes once no session holds it, and a new
        // session of the host counts from 0.
        table.end(&a2, a2.generation());
        drop((a2, a2_io));
        assert_eq!(names(&table).len(), 2);
        let again = login(&table, "iqn.2026-11.test:host-a", 3, Some(&t1));
        let io = again.initiator_io.as_ref().unwrap();
        assert_eq!(
            io.direction(Direction::Write)
                .commands
                .load(Ordering::Relaxed),
            0
        );
        assert_eq!(names(&table).len(), 3);
    }

    /// A login of `initiator` with ISID qualifier 1 naming TSIH `tsih`.
    fn join(
        table: &SessionTable,
        initiator: &str,
        tsih: u16,
        target: Option<&Arc<TargetEntry>>,
        tpgt: u16,
    ) -> Result<Arc<Session>, SessionError> {
        table.attach(request(initiator, 1, tsih, target, tpgt))
    }

    #[test]
    fn a_connection_joins_only_a_session_of_the_nexus_its_login_names() {
        let table = SessionTable::default();
        let guarded = target(
            "iqn.2026-11.test:guarded",
            Acl::Any,
            AuthPolicy::default(),
            vec![1],
        );
        let open = target(
            "iqn.2026-11.test:open",
            Acl::Any,
            AuthPolicy::default(),
            vec![1],
        );
        let host = "iqn.2026-11.test:host-a";
        let victim = join(&table, host, 0, Some(&guarded), 1).unwrap();
        let stops = victim.stop_signal();
        // The login was authorized for what it named, not for the session
        // whose TSIH it carries: a discovery login, one to another target and
        // one through another portal group join nothing.
        for (what, target, tpgt) in [
            ("a discovery login", None, 1),
            ("a login to another target", Some(&open), 1),
            ("a login through another portal group", Some(&guarded), 2),
        ] {
            assert!(
                matches!(
                    join(&table, host, victim.tsih, target, tpgt),
                    Err(SessionError::DoesNotExist(_))
                ),
                "{what} joined the session"
            );
        }
        assert!(
            !stops.has_changed().unwrap(),
            "the victim's connection was stopped"
        );
        // Its own nexus, however the names are written, rejoins.
        let shouted = target(
            "IQN.2026-11.TEST:GUARDED",
            Acl::Any,
            AuthPolicy::default(),
            vec![1],
        );
        let again = join(
            &table,
            &host.to_ascii_uppercase(),
            victim.tsih,
            Some(&shouted),
            1,
        );
        assert!(Arc::ptr_eq(&again.unwrap(), &victim));
    }

    #[test]
    fn reinstatement_follows_the_nexus_not_the_catalog_entry() {
        let table = SessionTable::default();
        let before = target(
            "iqn.2026-11.test:one",
            Acl::Any,
            AuthPolicy::default(),
            vec![1],
        );
        let host = "iqn.2026-11.test:host-a";
        let first = join(&table, host, 0, Some(&before), 1).unwrap();
        // Through another portal group the same ISID is another I_T nexus.
        let other_group = join(&table, host, 0, Some(&before), 2).unwrap();
        let open = |tsih: u16| table.all().iter().any(|s| s.tsih == tsih);
        assert!(open(first.tsih), "another portal group's login reinstated");
        // A live change builds a new entry for the target it keeps: a new
        // login of the same nexus still reinstates (ends) the old session.
        let after = target(
            "iqn.2026-11.test:one",
            Acl::Any,
            AuthPolicy::default(),
            vec![1],
        );
        let second = join(&table, host, 0, Some(&after), 1).unwrap();
        assert!(!open(first.tsih), "the old session stays");
        assert!(open(second.tsih) && open(other_group.tsih));
    }

    #[derive(Debug, Clone)]
    enum Step {
        /// A login of host `host` (its name in upper case if `shout`) with ISID
        /// qualifier `qualifier` to target `target`.
        Login {
            host: usize,
            shout: bool,
            qualifier: u8,
            target: usize,
        },
        /// The end of the `n`th session still open (modulo their number).
        End(usize),
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            (0..3usize, any::<bool>(), 0..3u8, 0..2usize).prop_map(
                |(host, shout, qualifier, target)| Step::Login {
                    host,
                    shout,
                    qualifier,
                    target
                }
            ),
            any::<usize>().prop_map(Step::End),
        ]
    }

    proptest::proptest! {
        /// Whatever the order of logins, reinstatements and ends: the counters
        /// listed are exactly those of the (target, initiator) pairs with an open
        /// session, and every open session of a pair shares its pair's counters.
        #[test]
        fn the_counters_listed_are_those_of_the_open_sessions(
            steps in proptest::collection::vec(step(), 1..40)
        ) {
            let table = SessionTable::default();
            let targets = [
                target("iqn.2026-11.test:one", Acl::Any, AuthPolicy::default(), vec![1]),
                target("iqn.2026-11.test:two", Acl::Any, AuthPolicy::default(), vec![1]),
            ];
            let mut open: Vec<(usize, usize, Arc<Session>)> = Vec::new();
            for step in steps {
                match step {
                    Step::Login { host, shout, qualifier, target: t } => {
                        let name = format!("iqn.2026-11.test:host-{host}");
                        let name = if shout { name.to_ascii_uppercase() } else { name };
                        let s = login(&table, &name, qualifier, Some(&targets[t]));
                        // Reinstatement: the session of the same I_T nexus is gone.
                        open.retain(|(h, tt, o)| !(*h == host && *tt == t && o.isid == s.isid));
                        open.push((host, t, s));
                    }
                    Step::End(n) if !open.is_empty() => {
                        let (_, _, s) = open.remove(n % open.len());
                        table.end(&s, s.generation());
                    }
                    Step::End(_) => {}
                }
                let mut want: Vec<(String, String)> = open
                    .iter()
                    .map(|(h, t, _)| (targets[*t].name.clone(), format!("iqn.2026-11.test:host-{h}")))
                    .collect();
                want.sort();
                want.dedup();
                let listed = table.initiators();
                let got: Vec<(String, String)> = listed
                    .iter()
                    .map(|i| (i.target.clone(), i.initiator.to_ascii_lowercase()))
                    .collect();
                proptest::prop_assert_eq!(&got, &want);
                for (h, t, s) in &open {
                    let pair = &listed[want
                        .binary_search(&(targets[*t].name.clone(), format!("iqn.2026-11.test:host-{h}")))
                        .unwrap()];
                    proptest::prop_assert!(Arc::ptr_eq(s.initiator_io.as_ref().unwrap(), &pair.io));
                }
            }
        }
    }
}
