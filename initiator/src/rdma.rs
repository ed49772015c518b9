//! RDMA-assisted sessions (docs/rdma-assisted-iscsi.md).
//!
//! [`AssistedSession`] is a [`Session`] that offers `X-io.blockwire.RdmaOffload` at
//! login. When the target grants it, the session opens a soft-RDMA connection to the
//! endpoint the target named, presenting the granted token and the TSIH, and from then
//! on READ and WRITE commands carry a descriptor AHS naming the caller's registered
//! buffers ([`RdmaBuf`]): the target RDMA-Writes READ data into them and RDMA-Reads
//! WRITE data from them, and only the command and the status travel on TCP. Writes up to
//! the inline threshold go as immediate data instead. A command's registrations are
//! released when it completes, which makes its rkeys stop working (except with the arena
//! strategy, whose one key covers the arena).
//!
//! Fallback (RDMA-assisted iSCSI paper §3.3): a target without the key, a grant that cannot be used (data
//! digests, another backend) or an RDMA connection that cannot be set up leaves a plain
//! iSCSI session: the same calls then move the data over TCP through bounce buffers. A
//! transfer the target reports as failed (its RDMA connection broke) is retried over
//! TCP, and the next command sets up a new RDMA connection.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use blockwire_pdu::keys::Digest;
use blockwire_pdu::scsi::{ScsiStatus, Sense, SenseKey};
use blockwire_transport::assist::{
    offer_value, BindRequest, Descriptor, Direction, Grant, MAX_CHUNKS, OFFLOAD_KEY,
};
use blockwire_transport::rdma::any::{AnyPd, AnyProvider, AnyQp, Backend};
use blockwire_transport::rdma::{QpCaps, QpInit, QueuePair, RdmaProvider};
pub use blockwire_transport::reg::{FmrdConfig, RegConfig, RegStats};
use blockwire_transport::reg::{IoBuf, IoSpace};

use crate::config::InitiatorConfig;
use crate::error::{Error, Result};
use crate::session::{all_blocks_moved, Completion, DataDir, RawCompletion, Session};

/// A buffer the target can reach by RDMA (allocate with [`AssistedSession::alloc`]).
pub type RdmaBuf = IoBuf<AnyPd>;

/// How an [`AssistedSession`] uses RDMA.
#[derive(Debug, Clone)]
pub struct RdmaConfig {
    /// Offer the offload key at login (false: always plain iSCSI).
    pub offer: bool,
    /// How the command buffers are registered.
    pub registration: RegConfig,
    /// Writes of at most this many bytes go as immediate data on TCP.
    pub inline_threshold: usize,
    /// Commands moving more than this go over TCP (the target moves larger ones
    /// through its buffer pool in pieces of at most 4 MiB).
    pub max_offload: usize,
    /// How long the RDMA connection to the target's offload endpoint may take
    /// before the session gives up on offload and stays plain iSCSI. Generous:
    /// a busy host (or a test machine running many sessions) can be slow to
    /// accept, and falling back costs every later command its offload.
    pub connect_timeout: Duration,
    /// Which RDMA provider carries the data: the soft provider (RDMA over TCP) or verbs
    /// (an RDMA NIC or Soft-RoCE, with the `verbs` feature).
    pub backend: Backend,
    /// The verbs device (default: the first one).
    pub device: Option<String>,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            offer: true,
            registration: RegConfig::PinDownCache { capacity: 128 },
            inline_threshold: 8 << 10,
            max_offload: 4 << 20,
            connect_timeout: Duration::from_secs(15),
            backend: Backend::Soft,
            device: None,
        }
    }
}

/// Where the data of the next command goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// By RDMA.
    Offloaded,
    /// Over TCP (plain iSCSI).
    Plain,
}

/// What an [`AssistedSession`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RdmaStats {
    /// READ commands whose data the target RDMA-Wrote.
    pub offloaded_reads: u64,
    /// WRITE commands whose data the target RDMA-Read.
    pub offloaded_writes: u64,
    /// Writes sent as immediate data (below the inline threshold).
    pub inline_writes: u64,
    /// Commands that moved their data over TCP.
    pub plain_commands: u64,
    /// RDMA connections set up.
    pub binds: u64,
    /// Offloaded commands the target could not transfer (retried over TCP).
    pub failed_transfers: u64,
    /// Remote chunks advertised (one RDMA operation each at the target).
    pub chunks: u64,
}

#[derive(Default)]
struct Counters {
    offloaded_reads: AtomicU64,
    offloaded_writes: AtomicU64,
    inline_writes: AtomicU64,
    plain_commands: AtomicU64,
    binds: AtomicU64,
    failed_transfers: AtomicU64,
    chunks: AtomicU64,
}

struct Link {
    generation: u64,
    qp: AnyQp,
}

impl Drop for Link {
    /// Down before anything else happens: a link is let go when a command
    /// on it failed or went unanswered, or its login is gone, and the
    /// buffers of those commands go back to their callers next. A target
    /// still running one must not RDMA Write into a buffer once it is
    /// reused (an arena's or a cached registration's rkey stays valid).
    fn drop(&mut self) {
        self.qp.disconnect();
    }
}

/// A session whose data moves by RDMA when the target agrees.
pub struct AssistedSession {
    session: Session,
    provider: AnyProvider,
    pd: AnyPd,
    space: IoSpace<AnyPd>,
    cfg: RdmaConfig,
    link: tokio::sync::Mutex<Option<Link>>,
    /// Login generation whose grant turned out unusable (no retry until it changes).
    unusable: AtomicU64,
    counters: Counters,
    last: std::sync::Mutex<Option<Descriptor>>,
}

impl std::fmt::Debug for AssistedSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AssistedSession")
            .field("session", &self.session)
            .field("registration", &self.cfg.registration)
            .finish_non_exhaustive()
    }
}

fn rdma_err(e: blockwire_transport::rdma::RdmaError) -> Error {
    Error::Protocol(format!("RDMA: {e}"))
}

impl AssistedSession {
    /// Logs in to `target` at `portal`, offering RDMA offload, and sets up the RDMA
    /// connection when the target grants it.
    pub async fn connect(
        mut config: InitiatorConfig,
        rdma: RdmaConfig,
        portal: &str,
        target: &str,
    ) -> Result<AssistedSession> {
        // The provider first: without the device the session is plain iSCSI (said once
        // here), its buffers plain memory registered with the soft provider.
        let (provider, offer) = match AnyProvider::open(rdma.backend, rdma.device.as_deref()) {
            Ok(p) => (p, rdma.offer),
            Err(e) => {
                tracing::warn!(
                    backend = rdma.backend.name(),
                    error = %e,
                    "RDMA offload unavailable: this session is plain iSCSI over TCP"
                );
                (
                    AnyProvider::open(Backend::Soft, None).map_err(rdma_err)?,
                    false,
                )
            }
        };
        if offer {
            config
                .vendor_offers
                .push((OFFLOAD_KEY.to_owned(), offer_value(&[provider.name()])));
        }
        let session = Session::connect(config, portal, target).await?;
        let pd = provider.alloc_pd().map_err(rdma_err)?;
        let space = IoSpace::new(&pd, rdma.registration).map_err(rdma_err)?;
        let s = AssistedSession {
            session,
            provider,
            pd,
            space,
            cfg: rdma,
            link: tokio::sync::Mutex::new(None),
            unusable: AtomicU64::new(u64::MAX),
            counters: Counters::default(),
            last: std::sync::Mutex::new(None),
        };
        s.ensure_link().await;
        Ok(s)
    }

    /// The underlying iSCSI session (control commands, task management).
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The registered I/O memory.
    pub fn space(&self) -> &IoSpace<AnyPd> {
        &self.space
    }

    /// Where data goes now.
    pub async fn mode(&self) -> Mode {
        match self.ensure_link().await {
            Some(_) => Mode::Offloaded,
            None => Mode::Plain,
        }
    }

    /// The target's answer to the offload key at the current login.
    pub fn grant(&self) -> Option<Grant> {
        let (_, answers) = self.session.vendor_answers();
        answers
            .iter()
            .find(|(k, _)| k == OFFLOAD_KEY)
            .and_then(|(_, v)| Grant::parse(v))
    }

    /// Counters of this session's commands.
    pub fn stats(&self) -> RdmaStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RdmaStats {
            offloaded_reads: l(&c.offloaded_reads),
            offloaded_writes: l(&c.offloaded_writes),
            inline_writes: l(&c.inline_writes),
            plain_commands: l(&c.plain_commands),
            binds: l(&c.binds),
            failed_transfers: l(&c.failed_transfers),
            chunks: l(&c.chunks),
        }
    }

    /// The registration layer's counters.
    pub fn registration_stats(&self) -> RegStats {
        self.space.stats()
    }

    /// The descriptor the last offloaded command advertised (diagnostics, tests).
    pub fn last_descriptor(&self) -> Option<Descriptor> {
        self.last.lock().unwrap().clone()
    }

    /// A zeroed buffer of `len` bytes the target can reach by RDMA.
    pub fn alloc(&self, len: usize) -> Result<RdmaBuf> {
        self.space.alloc(len).map_err(rdma_err)
    }

    /// The login generation of a working RDMA connection, setting one up if needed.
    async fn ensure_link(&self) -> Option<u64> {
        let mut link = self.link.lock().await;
        let (generation, _) = self.session.vendor_answers();
        if let Some(l) = link.as_ref() {
            if l.generation == generation && !l.qp.is_error() {
                return Some(generation);
            }
            *link = None;
        }
        if self.unusable.load(Ordering::Relaxed) == generation {
            return None;
        }
        let grant = self.grant();
        let usable = grant
            .as_ref()
            .is_some_and(|g| g.backend == self.provider.name())
            && self.session.params().data_digest != Digest::Crc32c;
        let Some(grant) = grant.filter(|_| usable) else {
            self.unusable.store(generation, Ordering::Relaxed);
            return None;
        };
        let init = QpInit::<AnyProvider> {
            pd: self.pd.clone(),
            send_cq: self.provider.create_cq(16).ok()?,
            recv_cq: self.provider.create_cq(16).ok()?,
            caps: QpCaps::default(),
        };
        let bind = BindRequest {
            tsih: self.session.tsih(),
            token: grant.token,
        };
        let connected = tokio::time::timeout(
            self.cfg.connect_timeout,
            self.provider.connect(grant.endpoint, init, &bind.encode()),
        )
        .await;
        match connected {
            Ok(Ok(qp)) => {
                self.counters.binds.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(endpoint = %grant.endpoint, "RDMA offload connection up");
                *link = Some(Link { generation, qp });
                Some(generation)
            }
            Ok(Err(e)) => {
                tracing::warn!(endpoint = %grant.endpoint, error = %e, "RDMA offload unavailable: plain iSCSI");
                self.unusable.store(generation, Ordering::Relaxed);
                None
            }
            Err(_) => {
                tracing::warn!(endpoint = %grant.endpoint, "RDMA connect timed out: plain iSCSI");
                self.unusable.store(generation, Ordering::Relaxed);
                None
            }
        }
    }

    async fn drop_link(&self) {
        *self.link.lock().await = None;
    }

    /// READ(16) of `blocks` blocks at `lba` into `bufs` (scatter list, in order; their
    /// lengths add up to the transfer length).
    pub async fn read_sg(
        &self,
        lun: u16,
        lba: u64,
        blocks: u32,
        bufs: &mut [RdmaBuf],
    ) -> Result<Completion> {
        let cdb = crate::scsi::rw16(false, lba, blocks, false);
        let asked = bufs.iter().map(|b| b.len()).sum();
        let done = self.read_cdb(lun, &cdb, bufs).await?;
        all_blocks_moved(done, "READ(16)", lun, lba, blocks, asked)
    }

    /// WRITE(16) of `bufs` (gather list) at `lba`.
    pub async fn write_sg(
        &self,
        lun: u16,
        lba: u64,
        blocks: u32,
        bufs: &[RdmaBuf],
    ) -> Result<Completion> {
        let cdb = crate::scsi::rw16(true, lba, blocks, false);
        let asked = bufs.iter().map(|b| b.len()).sum();
        let done = self.write_cdb(lun, &cdb, bufs).await?;
        all_blocks_moved(done, "WRITE(16)", lun, lba, blocks, asked)
    }

    /// READ into one buffer.
    pub async fn read(
        &self,
        lun: u16,
        lba: u64,
        blocks: u32,
        buf: &mut RdmaBuf,
    ) -> Result<Completion> {
        self.read_sg(lun, lba, blocks, std::slice::from_mut(buf))
            .await
    }

    /// WRITE from one buffer.
    pub async fn write(
        &self,
        lun: u16,
        lba: u64,
        blocks: u32,
        buf: &RdmaBuf,
    ) -> Result<Completion> {
        self.write_sg(lun, lba, blocks, std::slice::from_ref(buf))
            .await
    }

    /// Any data-in command (`cdb` up to 16 bytes) into `bufs`.
    pub async fn read_cdb(&self, lun: u16, cdb: &[u8], bufs: &mut [RdmaBuf]) -> Result<Completion> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total > 0 && total <= self.cfg.max_offload {
            if let Some(r) = self.offload(lun, cdb, Direction::Read, bufs, true).await {
                return r?.decoded(lun, cdb.first().copied().unwrap_or_default());
            }
        }
        self.counters.plain_commands.fetch_add(1, Ordering::Relaxed);
        let mut v = vec![0u8; total];
        let c = self
            .session
            .execute(lun, cdb, DataDir::Read(&mut v))
            .await?;
        let mut off = 0;
        for b in bufs.iter_mut() {
            let n = b.len().min(v.len().saturating_sub(off));
            b.write_at(0, &v[off..off + n]).map_err(rdma_err)?;
            off += n;
        }
        Ok(c)
    }

    /// Any data-out command (`cdb` up to 16 bytes) from `bufs`.
    pub async fn write_cdb(&self, lun: u16, cdb: &[u8], bufs: &[RdmaBuf]) -> Result<Completion> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total > self.cfg.inline_threshold && total <= self.cfg.max_offload {
            if let Some(r) = self.offload(lun, cdb, Direction::Write, bufs, true).await {
                return r?.decoded(lun, cdb.first().copied().unwrap_or_default());
            }
        }
        if total <= self.cfg.inline_threshold {
            self.counters.inline_writes.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters.plain_commands.fetch_add(1, Ordering::Relaxed);
        }
        let mut v = Vec::with_capacity(total);
        for b in bufs {
            v.extend_from_slice(&b.to_vec());
        }
        self.session.execute(lun, cdb, DataDir::Write(&v)).await
    }

    /// [`AssistedSession::read_cdb`] for a caller that does its own error
    /// handling, as the kernel's SCSI mid-layer does behind `blockwire
    /// attach`: nothing is retried (a UNIT ATTENTION such as CAPACITY DATA
    /// HAS CHANGED, BUSY and the rest reach the caller), and every status
    /// comes back as the target gave it. The caller times commands out, as
    /// it does over TCP: the session's command timeout does not give the
    /// connection up under an offloaded one. A command that goes over TCP is
    /// named by `itt` for ABORT TASK, as [`Session::pass_through`] names it.
    pub async fn read_cdb_as_sent(
        &self,
        lun: u16,
        cdb: &[u8],
        bufs: &mut [RdmaBuf],
        itt: &AtomicU32,
    ) -> Result<RawCompletion> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total > 0 && total <= self.cfg.max_offload {
            if let Some(r) = self.offload(lun, cdb, Direction::Read, bufs, false).await {
                return r;
            }
        }
        self.counters.plain_commands.fetch_add(1, Ordering::Relaxed);
        let mut v = vec![0u8; total];
        let c = self
            .session
            .pass_through(lun, cdb, DataDir::Read(&mut v), itt)
            .await?;
        let mut off = 0;
        for b in bufs.iter_mut() {
            let n = b.len().min(c.transferred.min(v.len()).saturating_sub(off));
            b.write_at(0, &v[off..off + n]).map_err(rdma_err)?;
            off += n;
        }
        Ok(c)
    }

    /// [`AssistedSession::write_cdb`] as [`AssistedSession::read_cdb_as_sent`]
    /// runs a READ: nothing retried, every status as the target gave it.
    pub async fn write_cdb_as_sent(
        &self,
        lun: u16,
        cdb: &[u8],
        bufs: &[RdmaBuf],
        itt: &AtomicU32,
    ) -> Result<RawCompletion> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total > self.cfg.inline_threshold && total <= self.cfg.max_offload {
            if let Some(r) = self.offload(lun, cdb, Direction::Write, bufs, false).await {
                return r;
            }
        }
        if total <= self.cfg.inline_threshold {
            self.counters.inline_writes.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters.plain_commands.fetch_add(1, Ordering::Relaxed);
        }
        let mut v = Vec::with_capacity(total);
        for b in bufs {
            v.extend_from_slice(&b.to_vec());
        }
        self.session
            .pass_through(lun, cdb, DataDir::Write(&v), itt)
            .await
    }

    /// One offloaded command; `None`: not possible now (use TCP). With
    /// `retry`, UNIT ATTENTION, BUSY and TASK SET FULL are retried as
    /// [`Session::execute`] retries them ([`crate::retry`]); without, the
    /// first answer is the caller's.
    async fn offload(
        &self,
        lun: u16,
        cdb: &[u8],
        dir: Direction,
        bufs: &[RdmaBuf],
        retry: bool,
    ) -> Option<Result<RawCompletion>> {
        let opcode = cdb.first().copied().unwrap_or_default();
        let mut retries = self.session.retries();
        loop {
            let managed = self.session.task_management_sent();
            let generation = self.ensure_link().await?;
            let reg = match self.space.register_sg(bufs.iter(), u64::from(u32::MAX)) {
                Ok(r) => r,
                Err(e) => return Some(Err(rdma_err(e))),
            };
            if reg.chunks().len() > MAX_CHUNKS {
                return None;
            }
            let desc = Descriptor {
                dir,
                chunks: reg.remote(),
            };
            self.counters
                .chunks
                .fetch_add(desc.chunks.len() as u64, Ordering::Relaxed);
            let r = self
                .send_descriptor(generation, lun, cdb, &desc, !retry)
                .await;
            // The command is over: its rkeys stop working.
            if let Err(e) = reg.release() {
                return Some(Err(rdma_err(e)));
            }
            let (e, answered) = match r {
                Ok(raw) if failed_in_transfer(&raw) => {
                    self.transfer_failed("the target could not move the data (DATA PHASE ERROR)");
                    return None;
                }
                Err(e) if is_transfer_failure(&e) => {
                    self.transfer_failed(&e.to_string());
                    return None;
                }
                Ok(raw) => {
                    // Decoded here only when it failed (not on the data
                    // path's GOOD answers): the retry policy reads errors.
                    let failed = (raw.status != ScsiStatus::GOOD)
                        .then(|| raw.clone().decoded(lun, opcode).err())
                        .flatten();
                    let Some(e) = failed else {
                        let counter = match dir {
                            Direction::Read => &self.counters.offloaded_reads,
                            Direction::Write => &self.counters.offloaded_writes,
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                        return Some(Ok(raw));
                    };
                    (e, Some(raw))
                }
                Err(e) => (e, None),
            };
            if retry
                && !self.session.ended_by_own_task_management(&e, managed)
                && retries.again_after(&e).await
            {
                continue;
            }
            return Some(answered.ok_or(e));
        }
    }

    async fn send_descriptor(
        &self,
        generation: u64,
        lun: u16,
        cdb: &[u8],
        desc: &Descriptor,
        as_sent: bool,
    ) -> Result<RawCompletion> {
        *self.last.lock().unwrap() = Some(desc.clone());
        let len = desc.len() as usize;
        let (read_len, write_len) = match desc.dir {
            Direction::Read => (len, 0),
            Direction::Write => (0, len),
        };
        let ahs = vec![desc.to_ahs()];
        let r = self
            .session
            .offloaded_as_given(generation, lun, cdb, read_len, write_len, ahs, !as_sent)
            .await;
        // A SCSI Response says the target is done with the buffers; any
        // other end (a failed transfer, the command aborted by a task
        // management function, a protocol error, a lost connection) leaves
        // RDMA operations of the target possibly queued behind it,
        // unordered against the TCP connection: the link goes down before
        // the buffers go back.
        if r.as_ref().map_or(true, failed_in_transfer) {
            self.drop_link().await;
        }
        r
    }

    fn transfer_failed(&self, why: &str) {
        self.counters
            .failed_transfers
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(error = %why, "offloaded transfer failed: retrying over TCP");
    }

    /// Sends a command with a caller-made descriptor (diagnostics and tests: forged
    /// keys, ranges outside a registration, replayed descriptors). Requires a working
    /// RDMA connection.
    pub async fn execute_with_descriptor(
        &self,
        lun: u16,
        cdb: &[u8],
        desc: &Descriptor,
    ) -> Result<Completion> {
        let generation = self
            .ensure_link()
            .await
            .ok_or_else(|| Error::Protocol("no RDMA offload on this session".into()))?;
        self.send_descriptor(generation, lun, cdb, desc, false)
            .await?
            .decoded(lun, cdb.first().copied().unwrap_or_default())
    }

    /// Logs out.
    pub async fn logout(self) -> Result<()> {
        self.drop_link().await;
        self.session.logout().await
    }
}

/// The target could not move the data (ABORTED COMMAND, DATA PHASE ERROR), or the
/// RDMA binding belongs to an old login.
fn is_transfer_failure(e: &Error) -> bool {
    // The login the binding belongs to is gone or going (also when the
    // command went unanswered past its deadline and the TCP connection is
    // being recovered): the RDMA connection goes before the buffers do,
    // and the command runs again over TCP once the session has logged in
    // again.
    matches!(e, Error::OffloadInterrupted(_))
}

/// A SCSI Response by which the target says it could not move the
/// command's data by RDMA: ABORTED COMMAND with ASC 4Bh (DATA PHASE ERROR
/// and its kin, SPC-5 Table 49).
fn failed_in_transfer(raw: &RawCompletion) -> bool {
    raw.status == ScsiStatus::CHECK_CONDITION
        && Sense::decode(&raw.sense)
            .is_ok_and(|s| s.key == SenseKey::AbortedCommand && s.asc == 0x4b)
}
