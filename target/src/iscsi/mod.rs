//! The iSCSI fabric: portals, login, authentication, discovery, sessions
//! and the command lifecycle over TCP.

pub mod auth_failures;
pub mod batch_nap;
pub mod budget;
pub mod busy_poll;
pub mod catalog;
pub mod connection;
pub mod connection_threads;
pub mod data_paths;
pub mod datain;
pub mod dataout;
pub mod discovery;
pub mod early_responses;
pub mod file_map;
pub mod host_key;
pub mod io;
pub mod iser;
mod launch;
pub mod login;
pub mod login_slots;
pub mod lun_paths;
mod machine;
pub(crate) mod mover;
pub mod portal;
pub mod rdma;
pub mod response;
pub mod send_stall;
pub mod sendfile;
pub mod session;
pub mod socket_room;
pub mod syncread;
pub mod syncwrite;
mod task;
mod throttle;
pub mod window;
pub mod write_chunks;
pub mod zerocopy;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::watch;

pub use catalog::Catalog;
pub use session::SessionTable;

/// Tunables of the fabric, with defaults suited to Linux initiators.
#[derive(Debug, Clone)]
pub struct FabricSettings {
    /// Commands a session may have in flight (the CmdSN window).
    pub queue_depth: u32,
    /// Largest data transfer of one command the target will buffer.
    pub max_io_bytes: u32,
    /// WRITE data one connection may hold at once; beyond it commands get
    /// TASK SET FULL.
    pub write_budget_bytes: u64,
    /// WRITE data all connections together may hold at once; beyond it
    /// commands get TASK SET FULL, or BUSY on a session with no command
    /// in its task set (see [`budget`]). Default
    /// [`default_budget_total`].
    pub write_budget_total_bytes: u64,
    /// READ data one connection may hold in memory before it is sent; READs
    /// beyond it wait to run until the initiator has taken earlier data, so
    /// an initiator that asks faster than it reads is held back, not served
    /// into memory without bound (nothing is refused).
    pub read_budget_bytes: u64,
    /// READ data all connections together may hold before it is sent;
    /// READs beyond it wait as those beyond a connection's budget do.
    /// Default [`default_budget_total`].
    pub read_budget_total_bytes: u64,
    /// Interval of NOP-In keepalive pings; None disables them.
    pub nop_interval: Option<Duration>,
    /// A connection whose initiator leaves a ping unanswered this long, takes
    /// no data this long, or sends none of a WRITE's awaited Data-Out this
    /// long, is dropped.
    pub nop_timeout: Duration,
    /// Time a login may take between PDUs.
    pub login_timeout: Duration,
    /// Time the whole login phase may take, from the connection's accept
    /// to its final Login Response sent: bounds a peer that trickles login
    /// PDUs within `login_timeout` of each other, and one that stops
    /// reading the target's Login Responses.
    pub login_deadline: Duration,
    /// Connections that may be in their login phase at once; one more is
    /// closed as soon as it is accepted (see [`login_slots`]).
    pub max_logins_in_progress: usize,
    /// Of those, the most from one host (an IPv4 address, an IPv6 /64: see
    /// [`host_key`]), so that one host cannot take every slot.
    pub max_logins_in_progress_per_address: usize,
    /// Discovery sessions that may be open at once; a discovery login past
    /// it is refused OUT OF RESOURCES. Normal sessions are not counted.
    pub max_discovery_sessions: usize,
    /// Of those, the most from one initiator host (an IPv4 address, an IPv6
    /// /64: see [`host_key`]), so that one host cannot take them all
    /// (initiators behind one NAT address share it).
    pub max_discovery_sessions_per_address: usize,
    /// Time initiators get to log out when the target shuts down.
    pub logout_grace: Duration,
    /// The target's MaxRecvDataSegmentLength.
    pub max_recv_data_segment_length: u32,
    /// Accept only HeaderDigest=CRC32C.
    pub require_header_digest: bool,
    /// Accept only DataDigest=CRC32C.
    pub require_data_digest: bool,
    /// The target's DataPDUInOrder answer (RFC 7143 13.18, an OR key).
    /// false (the default, "No"): an initiator that offers No gets Data-In
    /// PDUs in completion order with their BufferOffset (synchronized
    /// sends) and may send Data-Out out of order; one that offers Yes gets
    /// Yes. true: always Yes.
    pub data_pdu_in_order: bool,
    /// Send large Data-In payloads with `MSG_ZEROCOPY` where the kernel
    /// allows it (see [`zerocopy`]); false: plain copying sends.
    pub zero_copy_send: bool,
    /// Initiators on this host get copying sends: large READ payloads of
    /// in-memory file LUNs by one copying send from the file's mapping, not
    /// by `sendfile(2)` (see [`file_map`]), and no `MSG_ZEROCOPY`, which
    /// loopback delivery copies anyway.
    pub local_copy_sends: bool,
    /// After handling what arrived, a connection looks for the initiator's
    /// next PDU for up to this long before it sleeps (see [`busy_poll`]);
    /// None (the default here; the daemon's configuration defaults to
    /// 50 us): it sleeps at once.
    pub busy_poll: Option<Duration>,
    /// Connections run on this many threads of their own, a single-threaded
    /// runtime each (see [`connection_threads`]); 0 (the default here; the
    /// daemon's configuration defaults to one per CPU): on the tasks of the
    /// runtime that accepted them.
    pub connection_threads: usize,
    /// Benchmark-only `--no-net`: READs read their data but send no
    /// Data-In; they end GOOD with a residual underflow of the whole length.
    pub no_net: bool,
}

impl Default for FabricSettings {
    fn default() -> Self {
        FabricSettings {
            queue_depth: 128,
            max_io_bytes: 32 << 20,
            write_budget_bytes: 256 << 20,
            write_budget_total_bytes: default_budget_total(256 << 20),
            read_budget_bytes: 256 << 20,
            read_budget_total_bytes: default_budget_total(256 << 20),
            nop_interval: Some(Duration::from_secs(15)),
            nop_timeout: Duration::from_secs(30),
            login_timeout: Duration::from_secs(15),
            login_deadline: Duration::from_secs(60),
            max_logins_in_progress: 1024,
            max_logins_in_progress_per_address: 256,
            max_discovery_sessions: 256,
            max_discovery_sessions_per_address: 64,
            logout_grace: Duration::from_secs(5),
            max_recv_data_segment_length: 262_144,
            require_header_digest: false,
            require_data_digest: false,
            data_pdu_in_order: false,
            zero_copy_send: true,
            local_copy_sends: true,
            busy_poll: None,
            connection_threads: 0,
            no_net: false,
        }
    }
}

/// The default bound on the WRITE (or READ) data all connections together
/// hold: an eighth of the memory the daemon may use (the machine's, or its
/// control group's), so that the two together leave three quarters to the
/// rest, and never less than one connection's `per_connection` budget. It
/// bounds memory, not fairness: an initiator with several sessions that
/// fill their budgets (WRITEs whose data it never sends, READ data it
/// never reads) holds back the others' commands past it, where without it
/// enough of them would run the daemon out of memory. Unknown memory: no
/// bound.
pub fn default_budget_total(per_connection: u64) -> u64 {
    crate::backstore::ram_budget::usable_memory()
        .map_or(u64::MAX, |memory| (memory / 8).max(per_connection))
}

/// The shared state of every connection.
#[derive(Debug)]
pub struct Fabric {
    /// What is served: logins read the snapshot current when they start,
    /// SendTargets the one current when it is asked; the management plane
    /// swaps in a new one.
    catalog: std::sync::RwLock<Arc<Catalog>>,
    /// Live sessions.
    pub sessions: SessionTable,
    /// Held by a login from its last look at the catalog until its session
    /// is attached, and by a live change from its catalog replacement until
    /// it has listed the sessions it may close (see
    /// [`Fabric::admission_gate`]).
    admissions: std::sync::Mutex<()>,
    /// Tunables.
    pub settings: FabricSettings,
    /// Connections in their login phase (see [`login_slots`]).
    pub login_slots: Arc<login_slots::LoginSlots>,
    /// Failed authentications by address (see [`auth_failures`]).
    pub auth_failures: auth_failures::AuthFailures,
    /// WRITE data held by all connections, each connection's budget
    /// drawn from it (see [`budget`]).
    pub write_budget: Arc<budget::WriteBudget>,
    /// READ data held unsent by all connections, each connection's READ
    /// budget taken within it.
    pub(crate) read_budget: budget::ReadBudget,
    /// Turns true when the daemon shuts down.
    pub shutdown: watch::Receiver<bool>,
    /// RDMA offload (RDMA-assisted iSCSI), once started with [`Fabric::start_rdma`].
    pub rdma: OnceLock<Arc<rdma::RdmaService>>,
    /// Every LUN's data paths besides the SCSI core's copy path.
    pub lun_paths: Arc<lun_paths::LunPaths>,
    /// LUNs whose READs use synchronized sends (see [`syncread`]).
    pub sync_reads: syncread::SyncReads,
    /// LUNs whose WRITEs are double-buffered (see [`syncwrite`]).
    pub sync_writes: syncwrite::SyncWrites,
    /// Cached file LUNs whose READ payloads go by sendfile (see [`sendfile`]).
    pub sendfile_reads: sendfile::SendfileReads,
    /// What the iSER portals moved (see [`iser`]).
    pub iser_counters: iser::IserCounters,
    /// What busy-polling connections look at besides their own sockets
    /// (see [`busy_poll`]).
    pub busy_poll_neighbours: Arc<busy_poll::Neighbours>,
    /// The threads connections run on, when the settings ask for them.
    pub connection_threads: Option<Arc<connection_threads::ConnectionThreads>>,
}

impl Fabric {
    /// A fabric serving `catalog`, wired so that SCSI-level task aborts
    /// (PREEMPT AND ABORT) reach the sessions of the preempted nexus.
    pub fn new(
        catalog: Arc<Catalog>,
        settings: FabricSettings,
        shutdown: watch::Receiver<bool>,
    ) -> Arc<Fabric> {
        let lun_paths = Arc::new(lun_paths::LunPaths::default());
        let targets = catalog.targets.clone();
        let connection_threads = (settings.connection_threads > 0).then(|| {
            Arc::new(connection_threads::ConnectionThreads::new(
                settings.connection_threads,
            ))
        });
        let login_slots = login_slots::LoginSlots::new(
            settings.max_logins_in_progress,
            settings.max_logins_in_progress_per_address,
        );
        let sessions = SessionTable::default();
        sessions.limit_discovery_sessions(
            settings.max_discovery_sessions,
            settings.max_discovery_sessions_per_address,
        );
        let fabric = Arc::new(Fabric {
            catalog: std::sync::RwLock::new(catalog),
            sessions,
            login_slots,
            auth_failures: auth_failures::AuthFailures::default(),
            write_budget: budget::WriteBudget::new(settings.write_budget_total_bytes),
            read_budget: budget::ReadBudget::new(settings.read_budget_total_bytes),
            admissions: std::sync::Mutex::new(()),
            settings,
            shutdown,
            rdma: OnceLock::new(),
            sync_reads: syncread::SyncReads::new(lun_paths.clone()),
            sync_writes: syncwrite::SyncWrites::new(lun_paths.clone()),
            sendfile_reads: sendfile::SendfileReads::new(lun_paths.clone()),
            lun_paths,
            iser_counters: iser::IserCounters::default(),
            busy_poll_neighbours: Arc::new(busy_poll::Neighbours::of_this_machine()),
            connection_threads,
        });
        for target in &targets {
            fabric.wire_aborts(&target.luns);
        }
        fabric
    }

    /// Bytes of READ data all connections hold now, read and not yet sent
    /// (within `FabricSettings::read_budget_total_bytes`).
    pub fn read_data_held(&self) -> u64 {
        self.read_budget.held()
    }

    /// What is served now.
    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The gate between logins and live changes. A login holds it from its
    /// last check against the catalog (the target still served, the
    /// initiator still in its access list) until its session is attached;
    /// a change holds it from replacing the catalog until it has listed the
    /// sessions it is to close. So a login admitted under the old catalog
    /// is attached before the change lists sessions (and is closed by it),
    /// or it checks against the new catalog (and is refused): a revoked
    /// initiator never keeps a session the change did not see.
    pub fn admission_gate(&self) -> std::sync::MutexGuard<'_, ()> {
        self.admissions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serves `catalog` from now on: new logins and discovery see it;
    /// sessions keep the target entry they logged in to (its LUN table is
    /// shared, so LUN changes reach them). Units of new tables get the
    /// PREEMPT AND ABORT wiring.
    pub fn replace_catalog(self: &Arc<Self>, catalog: Arc<Catalog>) {
        for target in &catalog.targets {
            self.wire_aborts(&target.luns);
        }
        *self.catalog.write().unwrap_or_else(|e| e.into_inner()) = catalog;
    }

    /// Routes the table's PREEMPT AND ABORT to the sessions of the
    /// preempted nexus (SPC-4 5.9.11.5: the fabric owns the tasks).
    fn wire_aborts(self: &Arc<Self>, luns: &crate::scsi::LunTable) {
        // Weak: the handler lives inside the catalog the fabric owns.
        let weak = Arc::downgrade(self);
        luns.set_abort_handler(Arc::new(move |lun, nexus| {
            if let Some(f) = weak.upgrade() {
                let n = f.sessions.abort_nexus_tasks(lun, nexus);
                tracing::info!(lun, nexus = %nexus.initiator_port, tasks = n, "tasks aborted by PREEMPT AND ABORT");
            }
        }));
    }

    /// Starts the RDMA offload listener (soft provider) on `listen`: from now on
    /// normal sessions that offer `X-io.blockwire.RdmaOffload` get it. Returns
    /// the bound address.
    pub async fn start_rdma(
        &self,
        listen: std::net::SocketAddr,
    ) -> std::io::Result<std::net::SocketAddr> {
        self.start_rdma_on(listen, blockwire_transport::rdma::any::Backend::Soft, None)
            .await
    }

    /// [`Fabric::start_rdma`] on `backend` (verbs: on `device`, default the first one).
    pub async fn start_rdma_on(
        &self,
        listen: std::net::SocketAddr,
        backend: blockwire_transport::rdma::any::Backend,
        device: Option<&str>,
    ) -> std::io::Result<std::net::SocketAddr> {
        if let Some(s) = self.rdma.get() {
            return Ok(s.endpoint());
        }
        // A peer that completes no RDMA operation for as long as it may
        // leave a NOP-In unanswered is as gone as one that does not answer.
        let completion_timeout = self.settings.nop_timeout;
        let svc = rdma::RdmaService::start_on(
            listen,
            backend,
            device,
            completion_timeout,
            self.shutdown.clone(),
        )
        .await?;
        let addr = svc.endpoint();
        let _ = self.rdma.set(svc);
        Ok(addr)
    }
}
