//! The target's TOML configuration and its translation into the fabric's
//! catalog.
//!
//! Every error names the file, the line and the field, and says how to fix
//! it: a storage daemon that refuses to start must say why in one line.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::claims::{Claims, FileUse};
pub use blockwire_pdu::keys::check_iscsi_name;
use blockwire_target::backstore::{
    ram_size_refusal, striped::check_stripe, Backstore, FileBackstore, FileMode, NullBackstore,
    RamBackstore, StripedBackstore,
};
use blockwire_target::iscsi::catalog::{
    Acl, AuthPolicy, Catalog, ChapSecret, DataPathPolicy, PortalGroup, TargetEntry,
};
use blockwire_target::iscsi::FabricSettings;
use blockwire_target::scsi::{
    identity_from_uuid, stable_identity, AluaState, LogicalUnit, LuConfig, LunTable,
    TargetPortGroup,
};
use serde::Deserialize;
use toml::Spanned;

/// A configuration error with its location.
#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}: {field}: {message}")]
pub struct ConfigError {
    /// The configuration file.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// The field at fault (dotted path).
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// The whole file.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// Fabric tunables.
    #[serde(default)]
    pub fabric: FabricConfig,
    /// Portal groups.
    #[serde(default, rename = "portal_group")]
    pub portal_groups: Vec<Spanned<PortalGroupConfig>>,
    /// Discovery session authentication.
    #[serde(default)]
    pub discovery: AuthConfig,
    /// Targets.
    #[serde(default, rename = "target")]
    pub targets: Vec<Spanned<TargetDef>>,
    /// The runtime control socket.
    #[serde(default)]
    pub control: ControlConfig,
    /// The Prometheus metrics endpoint.
    #[serde(default)]
    pub metrics: MetricsConfig,
}

/// `[metrics]`: an HTTP endpoint serving Prometheus' text exposition
/// format at `/metrics` (see docs/metrics.md). Off unless a listen
/// address is given here or with `--metrics`.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// ADDR:PORT, e.g. "127.0.0.1:9450". The endpoint has no
    /// authentication: bind it where only the scraper can reach it.
    pub listen: Option<Spanned<String>>,
}

/// `[control]`: the daemon's runtime control socket (JSON-RPC 2.0, one
/// object per line; see docs/control.md).
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ControlConfig {
    /// Unix socket path, created owner-only (0600). `--control` overrides
    /// it; without either there is no control socket.
    pub socket: Option<PathBuf>,
}

/// `[fabric]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FabricConfig {
    /// Commands in flight per session.
    pub queue_depth: u32,
    /// Seconds between NOP-In keepalives; 0 disables them.
    pub nop_interval_secs: u64,
    /// Seconds before an initiator that ignores pings is dropped.
    pub nop_timeout_secs: u64,
    /// Seconds initiators get to log out at shutdown.
    pub logout_grace_secs: u64,
    /// The target's MaxRecvDataSegmentLength.
    pub max_recv_data_segment_length: u32,
    /// HeaderDigest policy: "allow" (the initiator chooses) or "require" (CRC32C only).
    pub header_digest: String,
    /// DataDigest policy: "allow" or "require".
    pub data_digest: String,
    /// Directory for state that must survive restarts (persistent
    /// reservations with APTPL). Without it APTPL=1 is refused.
    pub state_dir: Option<PathBuf>,
    /// RDMA-assisted iSCSI: where the soft RDMA provider listens (e.g.
    /// "127.0.0.1:0"; port 0 picks one). Unset: no offload is offered.
    pub rdma_listen: Option<String>,
    /// RDMA provider for offloaded sessions: "soft" (RDMA over TCP, runs
    /// anywhere) or "verbs" (hardware; without a device the target says so
    /// and serves plain iSCSI).
    pub rdma_backend: String,
    /// The RDMA device for "verbs" (e.g. "rxe0"); unset: the first one.
    pub rdma_device: Option<String>,
    /// WRITE data one connection may hold at once (e.g. "256M"); commands
    /// beyond it are answered TASK SET FULL.
    pub write_budget: String,
    /// READ data one connection may hold before it is sent (e.g. "256M");
    /// READs beyond it wait until the initiator has taken earlier data.
    pub read_budget: String,
    /// Send large Data-In payloads with MSG_ZEROCOPY where the kernel
    /// allows it (default true); false: plain copying sends.
    pub zero_copy_send: bool,
    /// For initiators on this host (connections over the loopback
    /// interface or to one of its own addresses), copying sends: large READ
    /// payloads of cached file LUNs in tmpfs from the file's mapping instead
    /// of by sendfile, and no MSG_ZEROCOPY (default true; see the target's
    /// `iscsi::file_map`); false: sendfile and `zero_copy_send` for every
    /// initiator.
    pub local_copy_sends: bool,
    /// Microseconds a connection keeps looking for the initiator's next PDU
    /// before it sleeps (default [`DEFAULT_BUSY_POLL_US`]; 0: it sleeps at
    /// once; at most 1000). Only a connection whose reads bring about one
    /// PDU (QD1) and whose initiator has seen every response polls, and
    /// only while no other connection is at work and every runnable thread
    /// of the machine has a CPU. Saves the wake-up of an idle CPU per round
    /// trip, at the price of up to that much CPU time per wait. With it on,
    /// a connection on a connection thread whose reads bring several PDUs
    /// may instead nap 30 us after answering a batch, while that keeps its
    /// initiator's rate (the target's `iscsi::batch_nap`); 0 turns naps off
    /// as well.
    pub busy_poll_us: u64,
    /// Threads the iSCSI connections run on, each connection on one of them
    /// from login to close (the one with the fewest when it comes): a
    /// connection reads, runs a command and answers on one thread. Unset:
    /// one per CPU; 0: connections share the daemon's runtime workers; at
    /// most [`CONNECTION_THREADS_MAX`].
    pub connection_threads: Option<usize>,
    /// The target's DataPDUInOrder answer: false (default) lets an
    /// initiator that offers No receive Data-In in completion order
    /// (synchronized sends); true insists on in-order PDUs.
    pub data_pdu_in_order: bool,
}

impl Default for FabricConfig {
    fn default() -> Self {
        let d = FabricSettings::default();
        FabricConfig {
            queue_depth: d.queue_depth,
            nop_interval_secs: d.nop_interval.map_or(0, |i| i.as_secs()),
            nop_timeout_secs: d.nop_timeout.as_secs(),
            logout_grace_secs: d.logout_grace.as_secs(),
            max_recv_data_segment_length: 262_144,
            header_digest: "allow".into(),
            data_digest: "allow".into(),
            state_dir: None,
            rdma_listen: None,
            rdma_backend: "soft".into(),
            rdma_device: None,
            write_budget: "256M".into(),
            read_budget: "256M".into(),
            zero_copy_send: d.zero_copy_send,
            local_copy_sends: d.local_copy_sends,
            busy_poll_us: DEFAULT_BUSY_POLL_US,
            connection_threads: None,
            data_pdu_in_order: d.data_pdu_in_order,
        }
    }
}

/// `[[portal_group]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortalGroupConfig {
    /// Target portal group tag (1..65535).
    pub tag: u16,
    /// Listen addresses, e.g. "0.0.0.0:3260" or "[::]:3260".
    pub listen: Vec<Spanned<String>>,
    /// ALUA state of the group's port for every target in it:
    /// "active_optimized" (default), "active_non_optimized" (serves I/O,
    /// not preferred) or "standby" (media commands get NOT READY, LOGICAL
    /// UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE).
    pub alua_state: Option<Spanned<String>>,
    /// Also accept standard iSER (RFC 7145) on every listen address: an RDMA
    /// CM listener on the same address and port, with `[fabric] rdma_backend`
    /// and `rdma_device` as the RDMA provider (Linux initiators need "verbs").
    #[serde(default)]
    pub iser: bool,
    /// iSER listeners at other addresses than `listen` (required with the
    /// soft provider, which runs over TCP and cannot share the iSCSI port).
    #[serde(default)]
    pub iser_listen: Vec<Spanned<String>>,
}

/// A CHAP credential.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct ChapConfig {
    /// CHAP_N.
    pub user: String,
    /// Secret (12 to 255 characters; RFC 7143 asks for at least 96 bits).
    pub secret: Spanned<String>,
}

/// A per-initiator CHAP credential.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct InitiatorChapConfig {
    /// The initiator's iSCSI name.
    pub initiator: Spanned<String>,
    /// CHAP_N it uses.
    pub user: String,
    /// Its secret.
    pub secret: Spanned<String>,
}

/// Authentication settings shared by `[discovery]` and targets.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// One-way CHAP credentials any initiator may use.
    #[serde(default)]
    pub chap: Vec<ChapConfig>,
    /// Credentials for particular initiators.
    #[serde(default)]
    pub initiator_chap: Vec<InitiatorChapConfig>,
    /// The target's own credential for mutual CHAP.
    pub mutual_chap: Option<ChapConfig>,
    /// CHAP algorithms in order of preference: "SHA3-256", "SHA-256", "SHA1", "MD5".
    pub chap_algorithms: Option<Spanned<Vec<String>>>,
}

/// `[[target]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetDef {
    /// iSCSI name.
    pub name: Spanned<String>,
    /// TargetAlias.
    pub alias: Option<String>,
    /// Portal group tags; all groups when omitted.
    pub portal_groups: Option<Vec<Spanned<u16>>>,
    /// Initiator names allowed; any initiator when omitted.
    pub allow: Option<Vec<Spanned<String>>>,
    /// One-way CHAP credentials any initiator may use.
    #[serde(default)]
    pub chap: Vec<ChapConfig>,
    /// Credentials for particular initiators.
    #[serde(default)]
    pub initiator_chap: Vec<InitiatorChapConfig>,
    /// The target's own credential for mutual CHAP.
    pub mutual_chap: Option<ChapConfig>,
    /// CHAP algorithms in order of preference.
    pub chap_algorithms: Option<Spanned<Vec<String>>>,
    /// Logical units.
    #[serde(default, rename = "lun")]
    pub luns: Vec<Spanned<LunDef>>,
}

/// `[[target.lun]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LunDef {
    /// LUN number (0..16383).
    pub id: u16,
    /// "ram", "file", "striped" (RAID0 over `paths`) or "null" (reads
    /// zeros, discards writes: benchmarks).
    pub backstore: Spanned<String>,
    /// File and striped LUNs: "cached" (page cache, the default) or
    /// "direct" (O_DIRECT).
    pub mode: Option<Spanned<String>>,
    /// File or block device path (file backstore).
    pub path: Option<Spanned<PathBuf>>,
    /// Striped LUNs: the member files (at least 2), in layout order: stripe
    /// chunk k lives on member k mod N, so the order must never change.
    pub paths: Option<Spanned<Vec<PathBuf>>>,
    /// Striped LUNs: the stripe chunk, a power of two from the logical
    /// block size to "16M" ("64K" by default; at least "4K" in direct mode).
    pub stripe_chunk: Option<Spanned<String>>,
    /// Size, e.g. "1G", "512M", "1048576" (required for ram; creates or grows files).
    pub size: Option<Spanned<String>>,
    /// Refuse writes.
    #[serde(default)]
    pub read_only: bool,
    /// Removable medium: INQUIRY reports RMB=1, START STOP UNIT with LOEJ
    /// ejects and loads it (refused while PREVENT ALLOW MEDIUM REMOVAL
    /// prevents removal), and with the medium out media commands, TEST
    /// UNIT READY and READ CAPACITY end NOT READY, MEDIUM NOT PRESENT.
    #[serde(default)]
    pub removable: bool,
    /// The least time, in seconds, a SANITIZE operation takes (default 0:
    /// as fast as the backstore goes); the LUN answers NOT READY,
    /// SANITIZE IN PROGRESS meanwhile. Emulates a slow medium.
    pub sanitize_min_seconds: Option<Spanned<u64>>,
    /// Fault injection: start with the LUN stalled (media commands wait
    /// before the backstore until released with the control socket's
    /// `lun.stall`).
    #[serde(default)]
    pub stalled: bool,
    /// Logical block size: 512 (default) or 4096.
    pub block_size: Option<Spanned<u32>>,
    /// Unit serial number; derived from `uuid` or, without one, from the
    /// target name and LUN when omitted.
    pub serial: Option<String>,
    /// The LUN's UUID: its unit serial number (VPD 80h) and NAA identifier
    /// (VPD 83h) derive from it, so they stay the same when the LUN moves to
    /// another target name or LUN number. Without it both derive from the
    /// target name and the LUN number (deterministic, stable across
    /// restarts and portals, but changed by a rename). Generate one with
    /// `uuidgen` and keep it with the data.
    pub uuid: Option<Spanned<String>>,
    /// Physical block size reported in READ CAPACITY (16): equal to
    /// `block_size` (default) or a power-of-two multiple of it, e.g. 4096.
    pub physical_block_size: Option<Spanned<u32>>,
    /// File LUNs: READs use synchronized sends: read by the I/O
    /// engine in `sync_chunk` chunks submitted together, each Data-In PDU
    /// sent as soon as its bytes are read. Off by default (serial: read
    /// all, then send). A `mode = "direct"` LUN always reads through the
    /// engine into registered buffers; there `false` means the serial
    /// baseline on that path, `true` the synchronized sends.
    pub sync_send: Option<Spanned<bool>>,
    /// Chunk size for `sync_send`, e.g. "64K" (default), 4K to 1M.
    pub sync_chunk: Option<Spanned<String>>,
    /// File LUNs: double-buffered WRITEs: each `sync_chunk` chunk
    /// of a WRITE goes to disk (I/O engine, registered buffer) while the
    /// next one arrives. Off by default (gather the whole WRITE, then
    /// write it).
    pub sync_write: Option<Spanned<bool>>,
    /// File LUNs in cached mode without `sync_send`: READ payloads go from
    /// the page cache to the socket by sendfile (default true; the copy
    /// path is used anyway on connections with DataDigest). false: the
    /// copy path (read into a buffer, then send), the baseline.
    pub zero_copy: Option<Spanned<bool>>,
    /// WRITE ATOMIC(16) (SBC-4 atomic writes: every block or none, also
    /// across a crash). Default: on where the backstore can keep that
    /// promise: RAM and null LUNs (in process) and writable file LUNs on a
    /// regular file (through a write-ahead journal, `atomic_journal`).
    /// false: never offered. true: refused where it cannot be kept
    /// (striped and read-only LUNs, a block device without
    /// `atomic_journal`).
    pub atomic_writes: Option<Spanned<bool>>,
    /// File LUNs: where the atomic-write journal lives (default: the
    /// backing file's path with `.atomic-journal` appended). It must stay
    /// with the backing file: unfinished atomic writes are replayed from it
    /// when the LUN opens.
    pub atomic_journal: Option<Spanned<PathBuf>>,
}

/// Gives a file LUN its atomic-write journal when it should have one (see
/// `LunDef::atomic_writes`), replaying the atomic writes a crash left
/// unfinished. A read-only LUN cannot replay them, so it refuses to open
/// while its journal holds any.
/// The file under `[fabric] state_dir` that keeps the saved persistent
/// reservations of LUN `id` of target `name`: the name with every
/// character a file name might not hold as '_'. (Two targets whose names
/// differ only there would share it: [`Claims`] refuses that.)
fn pr_state_file_name(name: &str, id: u16) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{safe}.lun{id}.pr")
}

/// The unit serial number (VPD 80h) and NAA identifier (VPD 83h) of LUN
/// `l` of target `name`: from its uuid, else derived from the target name
/// and the LUN; a `serial` given replaces the serial. None: the uuid is
/// not a UUID.
fn unit_identity(name: &str, l: &LunDef) -> Option<(String, u64)> {
    let (serial, naa) = match &l.uuid {
        Some(u) => identity_from_uuid(u.get_ref())?,
        None => stable_identity(name, l.id),
    };
    Some((l.serial.clone().unwrap_or(serial), naa))
}

/// Takes for each LUN of target `t` its identity and (unless `--no-disk`,
/// which touches no file) the files it holds, reporting each one that
/// another LUN holds already.
fn claim_units(
    ctx: &Ctx<'_>,
    report: &mut CheckReport,
    claims: &mut Claims,
    state_dir: Option<&Path>,
    t: &TargetDef,
) {
    let name = t.name.get_ref().trim();
    for l in &t.luns {
        let lspan = l.span();
        let l = l.get_ref();
        let unit = format!("LUN {} of {name}", l.id);
        let line = line_of(ctx.text, lspan.start);
        if let Some((serial, naa)) = unit_identity(name, l) {
            if let Err(m) = claims.identity(&unit, line, &serial, naa) {
                report.errors.push(match (&l.serial, &l.uuid) {
                    (None, Some(u)) => ctx.err(u.span(), "target.lun.uuid", m),
                    _ => ctx.err(lspan.clone(), "target.lun.serial", m),
                });
            }
        }
        let pr_state = state_dir.map(|d| d.join(pr_state_file_name(name, l.id)));
        let files = held_files(l, pr_state.as_deref());
        // --no-disk opens no backing file, but still keeps reservations.
        let used = |h: &HeldFile<'_>| !ctx.no_disk || h.what == FileUse::Reservations;
        for held in files.into_iter().filter(used) {
            if let Err(m) = claims.file(&unit, line, &held.path, held.what) {
                let span = held.span.unwrap_or_else(|| t.name.span());
                report.errors.push(ctx.err(span, held.field, m));
                break; // its other files (a journal named after it) say no more
            }
        }
    }
}

/// A file a LUN holds for itself alone.
struct HeldFile<'a> {
    path: std::borrow::Cow<'a, Path>,
    what: FileUse,
    /// The field that names it, and where (none: the target's name,
    /// which the file is named after).
    field: &'static str,
    span: Option<std::ops::Range<usize>>,
}

/// The files LUN `l` holds for itself alone: its data or striped members,
/// its atomic-write journal unless atomic writes are off, and its saved
/// reservations (at `pr_state_path`).
fn held_files<'a>(l: &'a LunDef, pr_state_path: Option<&'a Path>) -> Vec<HeldFile<'a>> {
    let kind = l.backstore.get_ref().as_str();
    let atomic_writes = l.atomic_writes.as_ref().map(|a| *a.get_ref());
    use std::borrow::Cow;
    let named = |path: &'a Path, what, field, span| HeldFile {
        path: Cow::Borrowed(path),
        what,
        field,
        span: Some(span),
    };
    let mut held = Vec::new();
    match (kind, &l.path, &l.paths) {
        ("file", Some(path), _) => {
            held.push(named(
                path.get_ref(),
                FileUse::Data,
                "target.lun.path",
                path.span(),
            ));
            match (&l.atomic_journal, atomic_writes) {
                (_, Some(false)) => {}
                (Some(j), _) => held.push(named(
                    j.get_ref(),
                    FileUse::AtomicJournal,
                    "target.lun.atomic_journal",
                    j.span(),
                )),
                (None, _) => held.push(HeldFile {
                    path: Cow::Owned(FileBackstore::default_journal_path(path.get_ref())),
                    what: FileUse::AtomicJournal,
                    field: "target.lun.path",
                    span: Some(path.span()),
                }),
            }
        }
        ("striped", _, Some(paths)) => {
            for p in paths.get_ref() {
                held.push(named(
                    p,
                    FileUse::StripeMember,
                    "target.lun.paths",
                    paths.span(),
                ));
            }
        }
        _ => {}
    }
    if let Some(p) = pr_state_path {
        held.push(HeldFile {
            path: Cow::Borrowed(p),
            what: FileUse::Reservations,
            field: "target.name",
            span: None,
        });
    }
    held
}

fn file_atomic_journal(
    ctx: &Ctx<'_>,
    l: &LunDef,
    lspan: std::ops::Range<usize>,
    path: &std::path::Path,
    fb: FileBackstore,
    atomic_writes: Option<bool>,
) -> Result<FileBackstore, ConfigError> {
    let journal = l
        .atomic_journal
        .as_ref()
        .map(|j| j.get_ref().clone())
        .unwrap_or_else(|| FileBackstore::default_journal_path(path));
    let field = if l.atomic_journal.is_some() {
        "target.lun.atomic_journal"
    } else {
        "target.lun.path"
    };
    if l.read_only {
        let n = blockwire_target::backstore::journal::unfinished(&journal, fb.size())
            .map_err(|e| ctx.err(lspan.clone(), field, e.to_string()))?;
        if n > 0 {
            return Err(ctx.err(
                lspan,
                field,
                format!(
                    "{} holds {n} unfinished atomic write(s) for {}: open the LUN writable once to replay them",
                    journal.display(),
                    path.display()
                ),
            ));
        }
        return Ok(fb);
    }
    let regular = std::fs::metadata(path).is_ok_and(|m| m.is_file());
    let wanted = match atomic_writes {
        Some(false) => false,
        Some(true) => true,
        None => regular || l.atomic_journal.is_some(),
    };
    if !wanted {
        return Ok(fb);
    }
    if !regular && l.atomic_journal.is_none() {
        return Err(ctx.err(
            lspan,
            "target.lun.atomic_writes",
            format!(
                "{} is a block device: give its atomic-write journal a place with atomic_journal = \"...\" (on another device), or remove atomic_writes",
                path.display()
            ),
        ));
    }
    let (fb, replayed) = fb
        .with_atomic_journal(&journal)
        .map_err(|e| ctx.err(lspan, field, e.to_string()))?;
    if replayed > 0 {
        tracing::warn!(
            path = %path.display(),
            journal = %journal.display(),
            replayed,
            "replayed atomic writes a crash left unfinished: each is now wholly written"
        );
    }
    Ok(fb)
}

/// How a configuration is turned into backstores.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// `--no-disk`: every LUN serves the no-disk pattern and drops writes;
    /// no backstore file is opened or created (benchmarks only).
    pub no_disk: bool,
}

/// What the daemon needs to start.
#[derive(Debug)]
pub struct Built {
    /// Targets and portals.
    pub catalog: Arc<Catalog>,
    /// Tunables.
    pub settings: FabricSettings,
    /// The target's MaxRecvDataSegmentLength.
    pub max_recv_data_segment_length: u32,
    /// Where the RDMA offload listener binds (`[fabric] rdma_listen`).
    pub rdma_listen: Option<SocketAddr>,
    /// Which RDMA provider (`[fabric] rdma_backend`).
    pub rdma_backend: RdmaBackend,
    /// The RDMA device for "verbs" (`[fabric] rdma_device`).
    pub rdma_device: Option<String>,
    /// Addresses with an iSER listener, each with its portal group's tag
    /// (`[[portal_group]] iser = true`).
    pub iser_portals: Vec<(SocketAddr, u16)>,
    /// Built with `--no-disk`: no LUN stores anything.
    pub no_disk: bool,
    /// The control socket's path (`[control] socket`).
    pub control_socket: Option<PathBuf>,
    /// The Prometheus endpoint's address (`[metrics] listen`).
    pub metrics_listen: Option<SocketAddr>,
}

/// The RDMA provider asked for in the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdmaBackend {
    /// The software provider (RDMA semantics over TCP).
    Soft,
    /// libibverbs hardware.
    Verbs,
}

/// Parses a size like "1G", "512M", "64K", "4096" into bytes.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (digits, mult) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1u64 << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        'g' | 'G' => (&s[..s.len() - 1], 1 << 30),
        't' | 'T' => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    digits.trim().parse::<u64>().ok()?.checked_mul(mult)
}

/// What a TOML syntax error says, on one line. The parser's own words when
/// it has any (several joined by "; "); for the errors it leaves without
/// words, such as a control character in a comment, what stands at the
/// error's column.
fn syntax_message(text: &str, e: &toml::de::Error) -> String {
    let said: Vec<&str> = e
        .message()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if !said.is_empty() {
        return said.join("; ");
    }
    let mut at = e.span().map_or(text.len(), |s| s.start.min(text.len()));
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let column = text[line_start..at].chars().count() + 1;
    match text[at..].chars().next() {
        Some(c) if c.is_control() => format!(
            "control character U+{:04X} at column {column}: TOML allows no control character \
             other than tab in comments and strings (remove it; inside a string, write \\u{:04X})",
            c as u32, c as u32
        ),
        Some(c) => format!("unexpected {c:?} at column {column}"),
        None => "the file ends in the middle of a line that needs more".into(),
    }
}

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

struct Ctx<'a> {
    file: &'a str,
    text: &'a str,
    no_disk: bool,
    /// `--check`: build nothing that touches the disk (no file created,
    /// grown or opened for writing, no directory created).
    dry_run: bool,
    /// Units already serving, by lower-case target name and LUN: a live
    /// change keeps them (their data, reservations and sessions) instead of
    /// opening their storage again.
    reuse: Option<&'a Reuse>,
}

/// Units a live change keeps, by lower-case target name and LUN.
pub type Reuse = std::collections::HashMap<(String, u16), Arc<LogicalUnit>>;

/// The 1-based line of `key = ...` in the `[table]` section of `text`, or
/// of the section's header when the key is not written there (a default
/// value at fault), or 1.
fn key_line(text: &str, table: &str, key: &str) -> usize {
    let mut in_table = false;
    let mut header = None;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.starts_with('[') {
            // "[fabric]", "[fabric] # tunables", "[[target]]".
            let name = line
                .trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or("")
                .trim();
            in_table = name == table;
            if in_table && header.is_none() {
                header = Some(i + 1);
            }
        } else if in_table {
            if let Some(rest) = line.strip_prefix(key) {
                if rest.trim_start().starts_with('=') {
                    return i + 1;
                }
            }
        }
    }
    header.unwrap_or(1)
}

impl Ctx<'_> {
    fn err(
        &self,
        span: std::ops::Range<usize>,
        field: &str,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            file: self.file.to_owned(),
            line: line_of(self.text, span.start),
            field: field.to_owned(),
            message: one_line(message.into()),
        }
    }

    /// An error in `[fabric] key`, on the key's line.
    fn fabric_err(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_owned(),
            line: key_line(self.text, "fabric", key),
            field: format!("fabric.{key}"),
            message: one_line(message.into()),
        }
    }
}

/// `message` with each control character escaped (`\n`, `\u{1b}`): paths
/// and names quoted from the file may hold them, and a problem is reported
/// on one line.
fn one_line(message: String) -> String {
    if !message.chars().any(char::is_control) {
        return message;
    }
    message
        .chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// What `--check` found: every error it could find without touching the
/// disk, and notices of what a start would do to it (files created or
/// grown, directories created).
#[derive(Debug, Default)]
pub struct CheckReport {
    /// Problems that stop a start, in line order.
    pub errors: Vec<ConfigError>,
    /// Changes a start would make on disk, in line order (same shape as an
    /// error: file, line, field, what).
    pub notices: Vec<ConfigError>,
    /// Targets defined.
    pub targets: usize,
}

impl CheckReport {
    /// Whether the configuration would start.
    pub fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }
}

/// The default `[fabric] busy_poll_us`: about one QD1 round trip of a fast
/// initiator on a 2-vCPU VM. The poll gives way to busy initiators, to the
/// target's other connections and to any thread waiting for a CPU, so QD32
/// and many sessions keep their pace (interop/results/bench-vs-tgtd.md,
/// bench/many-sessions-results.txt).
pub const DEFAULT_BUSY_POLL_US: u64 = 50;

/// The most `[fabric] connection_threads` may ask for: more threads than
/// CPUs only take turns on them.
pub const CONNECTION_THREADS_MAX: usize = 1024;

/// A commented example configuration (`examples/target.toml`), printed by
/// `blockwire-target --print-example-config`.
pub const EXAMPLE_CONFIG: &str = include_str!("../../examples/target.toml");

impl TargetConfig {
    /// Checks a configuration file without side effects: nothing is
    /// created, grown or opened for writing. Reports every problem found.
    pub fn check_file(path: &Path, opts: LoadOptions) -> CheckReport {
        let file = path.display().to_string();
        match std::fs::read_to_string(path) {
            Ok(text) => Self::check_str(&file, &text, opts),
            Err(e) => CheckReport {
                errors: vec![ConfigError {
                    file,
                    line: 0,
                    field: "-".into(),
                    message: format!("cannot read the file: {e}"),
                }],
                ..CheckReport::default()
            },
        }
    }

    /// Checks configuration text without side effects; `file` names it.
    pub fn check_str(file: &str, text: &str, opts: LoadOptions) -> CheckReport {
        let config = match Self::parse(file, text) {
            Ok(c) => c,
            Err(e) => {
                return CheckReport {
                    errors: vec![e],
                    ..CheckReport::default()
                }
            }
        };
        let ctx = Ctx {
            file,
            text,
            no_disk: opts.no_disk,
            dry_run: true,
            reuse: None,
        };
        let mut report = config.validate(&ctx);
        report.targets = config.targets.len();
        // The checks that building does (LUN ids, sizes, modes, ...), with
        // every file replaced by a stand-in: the first one that fails.
        if let Err(e) = config.build(&ctx, None) {
            if !report
                .errors
                .iter()
                .any(|x| x.line == e.line && x.field == e.field)
            {
                report.errors.push(e);
            }
        }
        report.errors.sort_by_key(|e| e.line);
        report.notices.sort_by_key(|e| e.line);
        report
    }

    fn parse(file: &str, text: &str) -> Result<TargetConfig, ConfigError> {
        toml::from_str(text).map_err(|e| {
            let line = e.span().map_or(0, |s| line_of(text, s.start));
            ConfigError {
                file: file.to_owned(),
                line,
                field: "syntax".into(),
                message: syntax_message(text, &e),
            }
        })
    }

    /// Reads and checks a configuration file.
    pub fn load(path: &Path) -> Result<Built, ConfigError> {
        Self::load_with(path, LoadOptions::default())
    }

    /// Reads and checks a configuration file, building backstores as
    /// `opts` says.
    pub fn load_with(path: &Path, opts: LoadOptions) -> Result<Built, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: 0,
            field: "-".into(),
            message: format!("cannot read the file: {e}"),
        })?;
        Self::from_str_with(&file, &text, opts)
    }

    /// Parses and checks configuration text; `file` names it in errors.
    pub fn from_str(file: &str, text: &str) -> Result<Built, ConfigError> {
        Self::from_str_with(file, text, LoadOptions::default())
    }

    /// Parses and checks configuration text, building backstores as `opts`
    /// says; `file` names it in errors.
    pub fn from_str_with(file: &str, text: &str, opts: LoadOptions) -> Result<Built, ConfigError> {
        Self::from_str_reusing(file, text, opts, None)
    }

    /// [`TargetConfig::from_str_with`] for a live change: the LUNs in
    /// `reuse` keep their running units (nothing of theirs is opened,
    /// created or grown); every other LUN is built.
    pub fn from_str_reusing(
        file: &str,
        text: &str,
        opts: LoadOptions,
        reuse: Option<&Reuse>,
    ) -> Result<Built, ConfigError> {
        let config = Self::parse(file, text)?;
        let ctx = Ctx {
            file,
            text,
            no_disk: opts.no_disk,
            dry_run: false,
            reuse,
        };
        // Validate without side effects first, so a start that would fail
        // on a later field has not created or grown any file yet.
        let mut report = config.validate(&ctx);
        if !report.errors.is_empty() {
            report.errors.sort_by_key(|e| e.line);
            return Err(report.errors.swap_remove(0));
        }
        config.build(&ctx, None)
    }

    /// The embedded default: one target with one 1 GiB RAM LUN, open to any
    /// initiator, on `listen`.
    pub fn embedded_default(listen: SocketAddr) -> Built {
        Self::embedded_default_with(listen, LoadOptions::default())
    }

    /// The embedded default's configuration text.
    pub fn embedded_default_text(listen: SocketAddr) -> String {
        format!(
            "[[portal_group]]\ntag = 1\nlisten = [\"{listen}\"]\n\n\
             [[target]]\nname = \"{DEFAULT_TARGET}\"\nalias = \"blockwire-default\"\n\n\
             [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1G\"\n"
        )
    }

    /// The embedded default, its LUN built as `opts` says.
    pub fn embedded_default_with(listen: SocketAddr, opts: LoadOptions) -> Built {
        let text = Self::embedded_default_text(listen);
        Self::from_str_with("<embedded default>", &text, opts)
            .expect("the embedded default configuration is valid")
    }

    fn build(self, ctx: &Ctx<'_>, _base: Option<&Path>) -> Result<Built, ConfigError> {
        let f = &self.fabric;
        if let Some(dir) = f.state_dir.as_ref().filter(|_| !ctx.dry_run) {
            std::fs::create_dir_all(dir).map_err(|e| {
                ctx.fabric_err("state_dir", format!("cannot create {}: {e}", dir.display()))
            })?;
        }
        let (settings, rdma_listen, rdma_backend) =
            fabric_settings(f, ctx).map_err(|mut errors| errors.swap_remove(0))?;

        let mut portal_groups = Vec::new();
        let mut iser_portals = Vec::new();
        let mut alua_states = Vec::new();
        for g in &self.portal_groups {
            let span = g.span();
            let g = g.get_ref();
            if g.tag == 0 {
                return Err(ctx.err(span, "portal_group.tag", "must be between 1 and 65535"));
            }
            if portal_groups.iter().any(|p: &PortalGroup| p.tag == g.tag) {
                return Err(ctx.err(
                    span,
                    "portal_group.tag",
                    format!("tag {} is defined twice", g.tag),
                ));
            }
            let mut addresses = Vec::new();
            for a in &g.listen {
                let addr: SocketAddr = a.get_ref().parse().map_err(|_| {
                    ctx.err(
                        a.span(),
                        "portal_group.listen",
                        format!(
                            "{:?} is not an address:port (write \"0.0.0.0:3260\" or \"[::]:3260\")",
                            a.get_ref()
                        ),
                    )
                })?;
                addresses.push(addr);
            }
            if addresses.is_empty() {
                return Err(ctx.err(span, "portal_group.listen", "give at least one address"));
            }
            let state = match &g.alua_state {
                None => AluaState::ActiveOptimized,
                Some(s) => AluaState::from_name(s.get_ref()).ok_or_else(|| {
                    ctx.err(
                        s.span(),
                        "portal_group.alua_state",
                        format!(
                            "{:?} is not an ALUA state (use \"active_optimized\", \"active_non_optimized\" or \"standby\")",
                            s.get_ref()
                        ),
                    )
                })?,
            };
            alua_states.push((g.tag, state));
            if g.iser {
                if rdma_backend == RdmaBackend::Soft {
                    return Err(ctx.err(
                        span,
                        "portal_group.iser",
                        "the soft RDMA provider runs over TCP and cannot share the iSCSI \
                         port: set [fabric] rdma_backend = \"verbs\", or give the iSER \
                         addresses with iser_listen = [\"ADDR:PORT\"] instead",
                    ));
                }
                iser_portals.extend(addresses.iter().map(|a| (*a, g.tag)));
            }
            for a in &g.iser_listen {
                let addr: SocketAddr = a.get_ref().parse().map_err(|_| {
                    ctx.err(
                        a.span(),
                        "portal_group.iser_listen",
                        format!("{:?} is not an address:port", a.get_ref()),
                    )
                })?;
                if rdma_backend == RdmaBackend::Soft && addresses.contains(&addr) {
                    return Err(ctx.err(
                        a.span(),
                        "portal_group.iser_listen",
                        format!(
                            "{addr} is also an iSCSI listen address: the soft RDMA provider \
                             runs over TCP, so pick another port"
                        ),
                    ));
                }
                iser_portals.push((addr, g.tag));
            }
            portal_groups.push(PortalGroup {
                tag: g.tag,
                addresses,
            });
        }
        if portal_groups.is_empty() {
            return Err(ctx.err(
                0..0,
                "portal_group",
                "no [[portal_group]] is defined: add one with a tag and listen addresses",
            ));
        }

        let mut targets = Vec::new();
        for t in self.targets {
            let tspan = t.span();
            let t = t.into_inner();
            let name = t.name.get_ref().trim().to_owned();
            let lower = name.to_ascii_lowercase();
            if !(lower.starts_with("iqn.")
                || lower.starts_with("eui.")
                || lower.starts_with("naa."))
                || name.len() > 223
            {
                return Err(ctx.err(t.name.span(), "target.name", format!(
                    "{name:?} is not an iSCSI name (iqn.YYYY-MM.reversed.domain:id, at most 223 bytes)")));
            }
            if targets
                .iter()
                .any(|e: &Arc<TargetEntry>| e.name.eq_ignore_ascii_case(&name))
            {
                return Err(ctx.err(
                    t.name.span(),
                    "target.name",
                    format!("target {name} is defined twice"),
                ));
            }
            let groups = match &t.portal_groups {
                None => portal_groups.iter().map(|g| g.tag).collect(),
                Some(tags) => {
                    let mut v = Vec::new();
                    for tag in tags {
                        if !portal_groups.iter().any(|g| g.tag == *tag.get_ref()) {
                            return Err(ctx.err(
                                tag.span(),
                                "target.portal_groups",
                                format!(
                                    "portal group {} is not defined (defined: {})",
                                    tag.get_ref(),
                                    portal_groups
                                        .iter()
                                        .map(|g| g.tag.to_string())
                                        .collect::<Vec<_>>()
                                        .join(", ")
                                ),
                            ));
                        }
                        if v.contains(tag.get_ref()) {
                            return Err(ctx.err(
                                tag.span(),
                                "target.portal_groups",
                                format!("portal group {} is listed twice", tag.get_ref()),
                            ));
                        }
                        v.push(*tag.get_ref());
                    }
                    v
                }
            };
            // Spans do not survive #[serde(flatten)], so the target's auth
            // fields are listed in TargetDef and gathered here.
            let auth_config = AuthConfig {
                chap: t.chap.clone(),
                initiator_chap: t.initiator_chap.clone(),
                mutual_chap: t.mutual_chap.clone(),
                chap_algorithms: t.chap_algorithms.clone(),
            };
            let auth = auth_policy(ctx, &auth_config, "target")?;
            let mut luns = Vec::new();
            let mut data_paths = Vec::new();
            for l in &t.luns {
                let lspan = l.span();
                let l = l.get_ref();
                if l.id > 16383 {
                    return Err(ctx.err(lspan, "target.lun.id", "must be between 0 and 16383"));
                }
                if luns.iter().any(|(id, _)| *id == l.id) {
                    return Err(ctx.err(
                        lspan,
                        "target.lun.id",
                        format!("LUN {} is defined twice in {name}", l.id),
                    ));
                }
                let size = match &l.size {
                    Some(s) => {
                        Some(parse_size(s.get_ref()).filter(|&n| n > 0).ok_or_else(|| {
                            ctx.err(
                                s.span(),
                                "target.lun.size",
                                format!(
                                    "{:?} is not a size (write e.g. \"1G\", \"512M\" or bytes)",
                                    s.get_ref()
                                ),
                            )
                        })?)
                    }
                    None => None,
                };
                let block_size = match &l.block_size {
                    Some(b) if *b.get_ref() != 512 && *b.get_ref() != 4096 => {
                        return Err(ctx.err(
                            b.span(),
                            "target.lun.block_size",
                            "must be 512 or 4096",
                        ));
                    }
                    Some(b) => *b.get_ref(),
                    None => 512,
                };
                let kind = l.backstore.get_ref().as_str();
                let mode = match &l.mode {
                    None => FileMode::Cached,
                    Some(m) if kind != "file" && kind != "striped" => {
                        return Err(ctx.err(
                            m.span(),
                            "target.lun.mode",
                            format!("only file and striped LUNs have a mode; remove it from this {kind} LUN"),
                        ));
                    }
                    Some(m) => match m.get_ref().as_str() {
                        "cached" => FileMode::Cached,
                        "direct" => FileMode::Direct,
                        other => {
                            return Err(ctx.err(
                                m.span(),
                                "target.lun.mode",
                                format!("{other:?} is not a mode (use \"cached\" or \"direct\")"),
                            ));
                        }
                    },
                };
                let physical_block_exponent = match &l.physical_block_size {
                    None => 0,
                    Some(p) => {
                        let v = *p.get_ref();
                        let ratio = v / block_size;
                        if v < block_size
                            || v % block_size != 0
                            || !ratio.is_power_of_two()
                            || ratio > 1 << 15
                        {
                            return Err(ctx.err(
                                p.span(),
                                "target.lun.physical_block_size",
                                format!("must be block_size ({block_size}) times a power of two, e.g. 4096"),
                            ));
                        }
                        ratio.trailing_zeros() as u8
                    }
                };
                let sync_chunk = match &l.sync_chunk {
                    None => 64 << 10,
                    Some(c) => match parse_size(c.get_ref()) {
                        Some(n) if (4096..=1 << 20).contains(&n) && n % 4096 == 0 => n as usize,
                        _ => {
                            return Err(ctx.err(
                                c.span(),
                                "target.lun.sync_chunk",
                                format!(
                                    "{:?} is not a chunk size (a multiple of 4K from \"4K\" to \"1M\", e.g. \"64K\")",
                                    c.get_ref()
                                ),
                            ));
                        }
                    },
                };
                let sync_send = l.sync_send.as_ref().is_some_and(|s| *s.get_ref());
                if let Some(s) = l
                    .sync_send
                    .as_ref()
                    .filter(|_| kind != "file" && kind != "striped")
                {
                    return Err(ctx.err(
                        s.span(),
                        "target.lun.sync_send",
                        format!("only file and striped LUNs have synchronized sends; remove it from this {kind} LUN"),
                    ));
                }
                let engine_mode = if sync_send {
                    blockwire_target::datapath::Mode::Synchronized
                } else {
                    blockwire_target::datapath::Mode::Serial
                };
                // Striped LUNs, like file LUNs, read through the engine when
                // direct (serial unless sync_send) or with sync_send.
                let engine_path = sync_send || mode == FileMode::Direct;
                if let Some(p) = l.paths.as_ref().filter(|_| kind != "striped") {
                    return Err(ctx.err(
                        p.span(),
                        "target.lun.paths",
                        format!("only striped LUNs have member paths; use path = \"...\" for this {kind} LUN"),
                    ));
                }
                if let Some(c) = l.stripe_chunk.as_ref().filter(|_| kind != "striped") {
                    return Err(ctx.err(
                        c.span(),
                        "target.lun.stripe_chunk",
                        format!(
                            "only striped LUNs have a stripe chunk; remove it from this {kind} LUN"
                        ),
                    ));
                }
                if let Some(z) = l.zero_copy.as_ref().filter(|_| kind != "file") {
                    return Err(ctx.err(
                        z.span(),
                        "target.lun.zero_copy",
                        format!("only file LUNs have zero_copy (sendfile) reads; remove it from this {kind} LUN"),
                    ));
                }
                let zero_copy = l.zero_copy.as_ref().is_none_or(|z| *z.get_ref());
                if let Some(w) = l.sync_write.as_ref().filter(|_| kind != "file") {
                    return Err(ctx.err(
                        w.span(),
                        "target.lun.sync_write",
                        format!("only file LUNs have double-buffered writes; remove sync_write from this {kind} LUN"),
                    ));
                }
                let sync_write = l.sync_write.as_ref().is_some_and(|w| *w.get_ref());
                if let Some(j) = l.atomic_journal.as_ref().filter(|_| kind != "file") {
                    return Err(ctx.err(
                        j.span(),
                        "target.lun.atomic_journal",
                        format!("only file LUNs keep an atomic-write journal; remove it from this {kind} LUN"),
                    ));
                }
                let atomic_writes = l.atomic_writes.as_ref().map(|a| *a.get_ref());
                if let Some(a) = l.atomic_writes.as_ref().filter(|a| *a.get_ref()) {
                    let why = match kind {
                        "striped" => Some("a striped LUN cannot write atomically (one write may span members); remove atomic_writes"),
                        _ if l.read_only => Some("a read-only LUN takes no writes; remove atomic_writes"),
                        _ => None,
                    };
                    if let Some(why) = why {
                        return Err(ctx.err(a.span(), "target.lun.atomic_writes", why));
                    }
                }
                let pr_state_path = f
                    .state_dir
                    .as_ref()
                    .map(|d| d.join(pr_state_file_name(&name, l.id)));
                let kept = ctx
                    .reuse
                    .and_then(|r| r.get(&(name.to_ascii_lowercase(), l.id)).cloned());
                // Checked here and not only by the store, so that --check and
                // --no-disk (which build no RAM store) refuse it too.
                if let Some(why) = size.filter(|_| kind == "ram").and_then(ram_size_refusal) {
                    let span = l.size.as_ref().map_or(lspan.clone(), Spanned::span);
                    return Err(ctx.err(
                        span,
                        "target.lun.size",
                        format!(
                            "{why}: a larger thin LUN belongs on a sparse file (backstore = \"file\")"
                        ),
                    ));
                }
                let backstore: Arc<dyn Backstore> = match kind {
                    _ if kept.is_some() => kept
                        .as_ref()
                        .map(|u| u.config().backstore.clone())
                        .expect("checked is_some"),
                    "null" | "ram" if ctx.no_disk => {
                        let size = size.ok_or_else(|| {
                            ctx.err(
                                lspan.clone(),
                                "target.lun.size",
                                format!("a {kind} LUN needs a size"),
                            )
                        })?;
                        Arc::new(NullBackstore::pattern(size))
                    }
                    "null" => {
                        let size = size.ok_or_else(|| {
                            ctx.err(lspan.clone(), "target.lun.size", "a null LUN needs a size")
                        })?;
                        Arc::new(NullBackstore::new(size))
                    }
                    "ram" => {
                        let size = size.ok_or_else(|| {
                            ctx.err(lspan.clone(), "target.lun.size", "a ram LUN needs a size")
                        })?;
                        Arc::new(RamBackstore::new(size))
                    }
                    "file" if ctx.no_disk || ctx.dry_run => {
                        let path = l.path.as_ref().map(Spanned::get_ref).ok_or_else(|| {
                            ctx.err(lspan.clone(), "target.lun.path", "a file LUN needs a path")
                        })?;
                        // --no-disk and --check: the file is neither opened
                        // nor created; its length (metadata only) stands in
                        // for a size.
                        let size = match (size, std::fs::metadata(path), ctx.dry_run) {
                            (Some(s), _, _) => s,
                            (None, Ok(m), true) if m.is_file() && m.len() > 0 => m.len(),
                            // validate() reports the missing, empty or
                            // special file; a stand-in lets the rest be checked.
                            (None, _, true) => DRY_RUN_SIZE,
                            (None, Ok(m), false) => m.len(),
                            (None, Err(e), false) => {
                                return Err(ctx.err(
                                    lspan.clone(),
                                    "target.lun.size",
                                    format!(
                                        "--no-disk needs a size for {} ({e}): add size = \"...\"",
                                        path.display()
                                    ),
                                ))
                            }
                        };
                        Arc::new(NullBackstore::pattern(size))
                    }
                    "striped" => {
                        let paths = l.paths.as_ref().ok_or_else(|| {
                            ctx.err(
                                lspan.clone(),
                                "target.lun.paths",
                                "a striped LUN needs paths = [\"a.img\", \"b.img\", ...] (at least 2)",
                            )
                        })?;
                        if paths.get_ref().len() < 2 {
                            return Err(ctx.err(
                                paths.span(),
                                "target.lun.paths",
                                format!("a striped LUN needs at least 2 member paths ({} given); use backstore = \"file\" for one", paths.get_ref().len()),
                            ));
                        }
                        if l.path.is_some() {
                            return Err(ctx.err(
                                lspan.clone(),
                                "target.lun.path",
                                "a striped LUN takes its members from paths = [...]; remove path",
                            ));
                        }
                        let stripe = match &l.stripe_chunk {
                            None => 64 << 10,
                            Some(c) => {
                                let n = parse_size(c.get_ref()).ok_or_else(|| {
                                    ctx.err(
                                        c.span(),
                                        "target.lun.stripe_chunk",
                                        format!(
                                            "{:?} is not a size (write e.g. \"64K\")",
                                            c.get_ref()
                                        ),
                                    )
                                })?;
                                check_stripe(n, mode)
                                    .map_err(|m| ctx.err(c.span(), "target.lun.stripe_chunk", m))?;
                                if n < u64::from(block_size) {
                                    return Err(ctx.err(
                                        c.span(),
                                        "target.lun.stripe_chunk",
                                        format!("the stripe chunk ({n} bytes) must hold at least one {block_size}-byte block"),
                                    ));
                                }
                                n
                            }
                        };
                        if ctx.no_disk || ctx.dry_run {
                            let size = match size {
                                Some(s) => s,
                                None => {
                                    let mut least = u64::MAX;
                                    for p in paths.get_ref() {
                                        let len = match (std::fs::metadata(p), ctx.dry_run) {
                                            (Ok(m), _) => m.len(),
                                            // validate() reports the missing member.
                                            (Err(_), true) => DRY_RUN_SIZE,
                                            (Err(e), false) => return Err(ctx.err(lspan.clone(), "target.lun.size", format!("--no-disk needs a size for {} ({e}): add size = \"...\"", p.display()))),
                                        };
                                        least = least.min(len);
                                    }
                                    let size =
                                        least / stripe * stripe * paths.get_ref().len() as u64;
                                    if ctx.dry_run && size == 0 {
                                        stripe * paths.get_ref().len() as u64
                                    } else {
                                        size
                                    }
                                }
                            };
                            Arc::new(NullBackstore::pattern(size))
                        } else {
                            let sb = StripedBackstore::open(
                                paths.get_ref(),
                                stripe,
                                size,
                                l.read_only,
                                mode,
                            )
                            .map_err(|e| {
                                ctx.err(paths.span(), "target.lun.paths", e.to_string())
                            })?;
                            Arc::new(sb)
                        }
                    }
                    "file" => {
                        let path = l.path.as_ref().map(Spanned::get_ref).ok_or_else(|| {
                            ctx.err(lspan.clone(), "target.lun.path", "a file LUN needs a path")
                        })?;
                        let fb = FileBackstore::open_with(path, size, l.read_only, mode).map_err(
                            |e| ctx.err(lspan.clone(), "target.lun.path", e.to_string()),
                        )?;
                        Arc::new(file_atomic_journal(
                            ctx,
                            l,
                            lspan.clone(),
                            path,
                            fb,
                            atomic_writes,
                        )?)
                    }
                    other => {
                        return Err(ctx.err(
                            l.backstore.span(),
                            "target.lun.backstore",
                            format!(
                                "{other:?} is not a backstore (use \"ram\", \"file\", \"striped\" or \"null\")"
                            ),
                        ));
                    }
                };
                if !backstore.size().is_multiple_of(u64::from(block_size))
                    || backstore.size() < u64::from(block_size)
                {
                    return Err(ctx.err(
                        lspan,
                        "target.lun.size",
                        format!(
                            "{} bytes is not a whole number of {block_size}-byte blocks",
                            backstore.size()
                        ),
                    ));
                }
                let (serial, naa) = unit_identity(&name, l).ok_or_else(|| {
                    let u = l.uuid.as_ref().expect("only a uuid can be no identity");
                    ctx.err(
                        u.span(),
                        "target.lun.uuid",
                        format!(
                            "{:?} is not a UUID (32 hex digits, e.g. from uuidgen)",
                            u.get_ref()
                        ),
                    )
                })?;
                let mut lu = LuConfig::new(backstore);
                lu.block_size = block_size;
                lu.physical_block_exponent = physical_block_exponent;
                lu.read_only = l.read_only;
                lu.removable = l.removable;
                lu.atomic_writes = atomic_writes != Some(false);
                if let Some(secs) = &l.sanitize_min_seconds {
                    if *secs.get_ref() > 86_400 {
                        return Err(ctx.err(
                            secs.span(),
                            "target.lun.sanitize_min_seconds",
                            format!("{} seconds is more than a day", secs.get_ref()),
                        ));
                    }
                    lu.sanitize_min_duration = std::time::Duration::from_secs(*secs.get_ref());
                }
                let stalled = l.stalled;
                lu.serial = serial;
                lu.naa_id = naa;
                lu.pr_state_path = pr_state_path;
                let unit = match kept {
                    // A kept unit stays as it runs (its stall switch too).
                    Some(unit) => unit,
                    None => {
                        let unit = LogicalUnit::new(lu);
                        if stalled {
                            unit.set_stalled(true);
                        }
                        Arc::new(unit)
                    }
                };
                luns.push((l.id, unit));
                // What the operator asked of the LUN's data; the fabric
                // maps it onto what the storage can do when it starts.
                // File and striped LUNs read through the engine when direct
                // (serial unless sync_send) or with sync_send; cached file
                // LUNs otherwise send READ payloads by sendfile unless
                // zero_copy = false.
                let policy = DataPathPolicy {
                    engine_reads: (engine_path && (kind == "file" || kind == "striped"))
                        .then_some(engine_mode),
                    sendfile: kind == "file" && !sync_send && mode == FileMode::Cached && zero_copy,
                    // --no-disk drops every WRITE: nothing to double-buffer.
                    double_buffered_writes: sync_write && !ctx.no_disk,
                    chunk: sync_chunk,
                };
                if policy.engine_reads.is_some() || policy.sendfile || policy.double_buffered_writes
                {
                    data_paths.push((l.id, policy));
                }
            }
            if luns.is_empty() {
                return Err(ctx.err(
                    tspan,
                    "target.lun",
                    format!("target {name} has no [[target.lun]]"),
                ));
            }
            // ALUA: one target port group per portal group of the target,
            // its relative port the TPGT (the SCSI target port of an iSCSI
            // target is its name and TPGT); the first one is preferred.
            let luns = LunTable::new(luns);
            luns.set_port_groups(
                groups
                    .iter()
                    .map(|&tag| TargetPortGroup {
                        id: tag,
                        state: alua_states
                            .iter()
                            .find(|(t, _)| *t == tag)
                            .map_or(AluaState::ActiveOptimized, |(_, s)| *s),
                        ports: vec![tag],
                    })
                    .collect(),
            );
            targets.push(Arc::new(TargetEntry {
                name,
                alias: t.alias,
                portal_groups: groups,
                acl: t.allow.map_or(Acl::Any, |names| {
                    Acl::Only(names.into_iter().map(Spanned::into_inner).collect())
                }),
                auth,
                luns: Arc::new(luns),
                data_paths,
            }));
        }
        if targets.is_empty() {
            return Err(ctx.err(0..0, "target", "no [[target]] is defined"));
        }
        let discovery_auth = auth_policy(ctx, &self.discovery, "discovery")?;
        let metrics_listen = match &self.metrics.listen {
            None => None,
            Some(l) => Some(l.get_ref().parse::<SocketAddr>().map_err(|_| {
                ctx.err(
                    l.span(),
                    "metrics.listen",
                    format!(
                        "{:?} is not an IP address and port: write e.g. \"127.0.0.1:9450\" \
                         or \"[::1]:9450\" (host names are not resolved)",
                        l.get_ref()
                    ),
                )
            })?),
        };
        Ok(Built {
            catalog: Arc::new(Catalog {
                portal_groups,
                targets,
                discovery_auth,
            }),
            settings,
            max_recv_data_segment_length: f.max_recv_data_segment_length,
            rdma_listen,
            rdma_backend,
            rdma_device: f.rdma_device.clone(),
            iser_portals,
            no_disk: ctx.no_disk,
            control_socket: self.control.socket,
            metrics_listen,
        })
    }
}

/// The name the embedded default target serves.
pub const DEFAULT_TARGET: &str = "iqn.2026-11.io.blockwire:default";

/// The size a file LUN stands in with when `--check` cannot learn one
/// (the file is missing or special); validate() reports why.
const DRY_RUN_SIZE: u64 = 1 << 20;

/// `[fabric]` turned into the fabric's settings: every problem found, each
/// on its key's line. Never fails with an empty list.
fn fabric_settings(
    f: &FabricConfig,
    ctx: &Ctx<'_>,
) -> Result<(FabricSettings, Option<SocketAddr>, RdmaBackend), Vec<ConfigError>> {
    let mut errors = Vec::new();
    let rdma_listen = match &f.rdma_listen {
        None => None,
        Some(a) => match a.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(e) => {
                errors.push(ctx.fabric_err(
                    "rdma_listen",
                    format!("{a:?} is not an address:port ({e}); write e.g. \"127.0.0.1:0\""),
                ));
                None
            }
        },
    };
    let rdma_backend = match f.rdma_backend.as_str() {
        "soft" => RdmaBackend::Soft,
        "verbs" => RdmaBackend::Verbs,
        other => {
            errors.push(ctx.fabric_err(
                "rdma_backend",
                format!("{other:?} is not an RDMA backend (use \"soft\" or \"verbs\")"),
            ));
            RdmaBackend::Soft
        }
    };
    let busy_poll_max = blockwire_target::iscsi::busy_poll::BUSY_POLL_MAX.as_micros() as u64;
    if f.busy_poll_us > busy_poll_max {
        errors.push(ctx.fabric_err(
            "busy_poll_us",
            format!(
                "{} is more than {busy_poll_max}: a connection would burn a CPU for little (0 turns busy polling off)",
                f.busy_poll_us
            ),
        ));
    }
    if f.connection_threads
        .is_some_and(|n| n > CONNECTION_THREADS_MAX)
    {
        errors.push(ctx.fabric_err(
            "connection_threads",
            format!(
                "{} is more than {CONNECTION_THREADS_MAX} (leave it unset for one per CPU; 0 runs connections on the daemon's shared workers)",
                f.connection_threads.unwrap_or_default()
            ),
        ));
    }
    if !(1..=65536).contains(&f.queue_depth) {
        errors.push(ctx.fabric_err("queue_depth", "must be between 1 and 65536"));
    }
    if !(512..=16_777_215).contains(&f.max_recv_data_segment_length) {
        errors.push(ctx.fabric_err(
            "max_recv_data_segment_length",
            "must be between 512 and 16777215",
        ));
    }
    let mut require = |v: &str, key: &str| match v {
        "allow" => false,
        "require" => true,
        other => {
            errors.push(ctx.fabric_err(
                key,
                format!("{other:?} is not a digest policy (use \"allow\" or \"require\")"),
            ));
            false
        }
    };
    let require_header_digest = require(&f.header_digest, "header_digest");
    let require_data_digest = require(&f.data_digest, "data_digest");
    let mut budget =
        |key: &'static str, value: &str| match parse_size(value).filter(|&n| n >= 1 << 20) {
            Some(n) => n,
            None => {
                errors.push(ctx.fabric_err(
                    key,
                    format!("{value:?} is not a size of at least 1M (write e.g. \"256M\")"),
                ));
                1 << 20
            }
        };
    let write_budget_bytes = budget("write_budget", &f.write_budget);
    let read_budget_bytes = budget("read_budget", &f.read_budget);
    if !errors.is_empty() {
        return Err(errors);
    }
    let settings = FabricSettings {
        write_budget_bytes,
        read_budget_bytes,
        require_header_digest,
        require_data_digest,
        queue_depth: f.queue_depth,
        nop_interval: (f.nop_interval_secs > 0)
            .then(|| std::time::Duration::from_secs(f.nop_interval_secs)),
        nop_timeout: std::time::Duration::from_secs(f.nop_timeout_secs.max(1)),
        logout_grace: std::time::Duration::from_secs(f.logout_grace_secs),
        zero_copy_send: f.zero_copy_send,
        local_copy_sends: f.local_copy_sends,
        busy_poll: (f.busy_poll_us > 0).then(|| std::time::Duration::from_micros(f.busy_poll_us)),
        data_pdu_in_order: f.data_pdu_in_order,
        connection_threads: f.connection_threads.unwrap_or_else(
            blockwire_target::iscsi::connection_threads::ConnectionThreads::one_per_cpu,
        ),
        ..FabricSettings::default()
    };
    Ok((settings, rdma_listen, rdma_backend))
}

/// Whether this process may write in (`dir = true`: create entries in)
/// `path`, by access(2): nothing is opened or created.
fn writable(path: &Path, dir: bool) -> bool {
    use rustix::fs::Access;
    let how = if dir {
        Access::WRITE_OK | Access::EXEC_OK
    } else {
        Access::WRITE_OK
    };
    rustix::fs::access(path, how).is_ok()
}

/// The size and state of one backing file, checked by metadata and
/// access(2) only; errors and notices go to `report`.
fn check_backing_file(
    ctx: &Ctx<'_>,
    report: &mut CheckReport,
    line: std::ops::Range<usize>,
    field: &str,
    path: &Path,
    size: Option<u64>,
    read_only: bool,
) -> Option<u64> {
    let shown = path.display();
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            report.errors.push(ctx.err(
                line,
                field,
                format!("{shown} is a directory: name a file or block device in it"),
            ));
            None
        }
        Ok(m) => {
            if !read_only && !writable(path, false) {
                report.errors.push(ctx.err(
                    line.clone(),
                    field,
                    format!(
                        "{shown} is not writable by this user: fix its permissions or set read_only = true"
                    ),
                ));
            }
            if !m.is_file() {
                // A block device: its size needs an open; the start reads it.
                return None;
            }
            let len = m.len();
            match size {
                Some(want) if len < want && !read_only => report.notices.push(ctx.err(
                    line,
                    field,
                    format!("{shown} is {len} bytes: a start grows it to {want} bytes"),
                )),
                Some(want) if len < want => report.notices.push(ctx.err(
                    line,
                    field,
                    format!(
                        "{shown} is {len} bytes, less than size ({want}); read_only: it is served at {len} bytes, not grown"
                    ),
                )),
                None if len == 0 => report.errors.push(ctx.err(
                    line,
                    field,
                    format!("{shown} is empty: give the LUN a size = \"...\""),
                )),
                _ => {}
            }
            Some(len)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            let pshown = parent.display();
            match std::fs::metadata(parent) {
                Err(_) => report.errors.push(ctx.err(
                    line,
                    field,
                    format!(
                        "the directory {pshown} of {shown} does not exist: create it (mkdir -p {pshown}) or fix the path"
                    ),
                )),
                Ok(m) if !m.is_dir() => report.errors.push(ctx.err(
                    line,
                    field,
                    format!("{pshown} (the directory of {shown}) is not a directory: fix the path"),
                )),
                Ok(_) if read_only => report.errors.push(ctx.err(
                    line,
                    field,
                    format!("{shown} does not exist and a read_only LUN is never created: fix the path or remove read_only"),
                )),
                Ok(_) if !writable(parent, true) => report.errors.push(ctx.err(
                    line,
                    field,
                    format!(
                        "{shown} does not exist and its directory {pshown} is not writable by this user: fix the permissions or the path"
                    ),
                )),
                Ok(_) => match size {
                    None => report.errors.push(ctx.err(
                        line,
                        field,
                        format!("{shown} does not exist: add size = \"...\" to create it, or fix the path"),
                    )),
                    Some(want) => report.notices.push(ctx.err(
                        line,
                        field,
                        format!("{shown} does not exist: a start creates it ({want} bytes)"),
                    )),
                },
            }
            Some(0)
        }
        Err(e) => {
            report
                .errors
                .push(ctx.err(line, field, format!("cannot inspect {shown}: {e}")));
            None
        }
    }
}

/// The CHAP credentials of one section checked together: each secret's
/// length, each initiator's name, and no mutual secret equal to a one-way
/// one (RFC 7143 §12.1.3: a secret used to authenticate initiators must
/// not authenticate the target).
fn check_auth(ctx: &Ctx<'_>, report: &mut CheckReport, a: &AuthConfig, section: &str) {
    let mut one_way = Vec::new();
    for c in &a.chap {
        if let Err(e) = secret(ctx, &c.secret, &format!("{section}.chap.secret")) {
            report.errors.push(e);
        }
        one_way.push(c.secret.get_ref());
    }
    for c in &a.initiator_chap {
        if let Err(why) = check_iscsi_name(c.initiator.get_ref().trim()) {
            report.errors.push(ctx.err(
                c.initiator.span(),
                &format!("{section}.initiator_chap.initiator"),
                why,
            ));
        }
        if let Err(e) = secret(ctx, &c.secret, &format!("{section}.initiator_chap.secret")) {
            report.errors.push(e);
        }
        one_way.push(c.secret.get_ref());
    }
    if let Some(m) = &a.mutual_chap {
        if let Err(e) = secret(ctx, &m.secret, &format!("{section}.mutual_chap.secret")) {
            report.errors.push(e);
        }
        if one_way.contains(&m.secret.get_ref()) {
            report.errors.push(ctx.err(
                m.secret.span(),
                &format!("{section}.mutual_chap.secret"),
                "the mutual CHAP secret equals a one-way CHAP secret of the same section; RFC 7143 (12.1.3) forbids using one secret in both directions: choose another",
            ));
        }
    }
}

impl TargetConfig {
    /// Checks everything that can be checked without side effects and
    /// without building: iSCSI names, listen addresses, CHAP secrets,
    /// `[fabric]`, and the backing files (metadata and access(2) only).
    fn validate(&self, ctx: &Ctx<'_>) -> CheckReport {
        let mut report = CheckReport::default();
        if let Err(errors) = fabric_settings(&self.fabric, ctx) {
            report.errors.extend(errors);
        }
        if let Some(dir) = &self.fabric.state_dir {
            match std::fs::metadata(dir) {
                Ok(m) if !m.is_dir() => report.errors.push(
                    ctx.fabric_err("state_dir", format!("{} is not a directory", dir.display())),
                ),
                Ok(_) if !writable(dir, true) => report.errors.push(ctx.fabric_err(
                    "state_dir",
                    format!(
                        "{} is not writable by this user: fix its permissions",
                        dir.display()
                    ),
                )),
                Ok(_) => {}
                Err(_) => {
                    let existing = dir.ancestors().skip(1).find(|a| a.is_dir());
                    match existing {
                        Some(a) if writable(a, true) => report.notices.push(ctx.fabric_err(
                            "state_dir",
                            format!("{} does not exist: a start creates it", dir.display()),
                        )),
                        _ => report.errors.push(ctx.fabric_err(
                            "state_dir",
                            format!(
                                "{} does not exist and cannot be created by this user: create it or fix the path",
                                dir.display()
                            ),
                        )),
                    }
                }
            }
        }
        // Each listen address is bound once: a repeat, or an address under
        // a wildcard of the same family and port, fails the start.
        let mut seen: Vec<(SocketAddr, u16)> = Vec::new();
        for g in &self.portal_groups {
            let tag = g.get_ref().tag;
            for a in &g.get_ref().listen {
                let Ok(addr) = a.get_ref().parse::<SocketAddr>() else {
                    continue; // build() reports it
                };
                // Port 0 (a port picked at start) may be listed in several
                // groups, each getting its own, but once per group.
                let clash = seen.iter().find(|(other, other_tag)| {
                    (*other == addr && *other_tag == tag)
                        || other.port() == addr.port()
                            && addr.port() != 0
                            && other.is_ipv4() == addr.is_ipv4()
                            && (other.ip() == addr.ip()
                                || other.ip().is_unspecified()
                                || addr.ip().is_unspecified())
                });
                if let Some((_, other_tag)) = clash.filter(|_| addr.port() == 0) {
                    report.errors.push(ctx.err(
                        a.span(),
                        "portal_group.listen",
                        format!(
                            "{addr} is listed twice in portal group {other_tag}: port 0 picks one port per group; list it once"
                        ),
                    ));
                } else if let Some((other, other_tag)) = clash {
                    let what = if *other == addr {
                        format!("{addr} is listed already")
                    } else {
                        format!("{addr} overlaps {other}")
                    };
                    report.errors.push(ctx.err(
                        a.span(),
                        "portal_group.listen",
                        format!(
                            "{what} (portal group {other_tag}): an address:port is bound once; remove it from one group (portal group {tag} here)"
                        ),
                    ));
                }
                seen.push((addr, tag));
            }
        }
        let mut claims = Claims::default();
        for t in &self.targets {
            let t = t.get_ref();
            if let Err(why) = check_iscsi_name(t.name.get_ref().trim()) {
                report
                    .errors
                    .push(ctx.err(t.name.span(), "target.name", why));
            }
            for a in t.allow.iter().flatten() {
                if let Err(why) = check_iscsi_name(a.get_ref().trim()) {
                    report.errors.push(ctx.err(
                        a.span(),
                        "target.allow",
                        format!("{why}; allow lists InitiatorNames"),
                    ));
                }
            }
            let auth = AuthConfig {
                chap: t.chap.clone(),
                initiator_chap: t.initiator_chap.clone(),
                mutual_chap: t.mutual_chap.clone(),
                chap_algorithms: None,
            };
            check_auth(ctx, &mut report, &auth, "target");
            claim_units(
                ctx,
                &mut report,
                &mut claims,
                self.fabric.state_dir.as_deref(),
                t,
            );
            if ctx.no_disk {
                continue; // no backing file is touched at all
            }
            for l in &t.luns {
                let l = l.get_ref();
                let size = l.size.as_ref().and_then(|s| parse_size(s.get_ref()));
                match l.backstore.get_ref().as_str() {
                    "file" => {
                        if let Some(p) = &l.path {
                            check_backing_file(
                                ctx,
                                &mut report,
                                p.span(),
                                "target.lun.path",
                                p.get_ref(),
                                size,
                                l.read_only,
                            );
                        }
                    }
                    "striped" => {
                        let Some(paths) = &l.paths else { continue };
                        let n = paths.get_ref().len().max(1) as u64;
                        let member_size = size.map(|s| s.div_ceil(n));
                        let mut lens = Vec::new();
                        for p in paths.get_ref() {
                            let len = check_backing_file(
                                ctx,
                                &mut report,
                                paths.span(),
                                "target.lun.paths",
                                p,
                                member_size,
                                l.read_only,
                            );
                            if let Some(len) = len {
                                lens.push((p, len));
                            }
                        }
                        let with_data: Vec<_> = lens.iter().filter(|(_, n)| *n > 0).collect();
                        if let Some((first, flen)) = with_data.first() {
                            if let Some((p, n)) = lens.iter().find(|(_, n)| n != flen) {
                                report.errors.push(ctx.err(
                                    paths.span(),
                                    "target.lun.paths",
                                    format!(
                                        "striped member {} is {n} bytes but {} is {flen} bytes: the members of one set are equal in size; restore or grow the member, else fix paths",
                                        p.display(),
                                        first.display()
                                    ),
                                ));
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        check_auth(ctx, &mut report, &self.discovery, "discovery");
        report
    }
}

fn secret(ctx: &Ctx<'_>, s: &Spanned<String>, field: &str) -> Result<String, ConfigError> {
    let len = s.get_ref().len();
    if !(12..=255).contains(&len) {
        // RFC 7143 §12.1.3: at least 96 bits of secret; tgt and open-iscsi
        // refuse shorter ones too, so catch it here rather than at login.
        return Err(ctx.err(
            s.span(),
            field,
            format!(
                "CHAP secrets must be 12 to 255 characters ({len} given): RFC 7143 (12.1.3) asks for at least 96 bits; use a random secret of 16 characters or more"
            ),
        ));
    }
    Ok(s.get_ref().clone())
}

fn auth_policy(ctx: &Ctx<'_>, a: &AuthConfig, section: &str) -> Result<AuthPolicy, ConfigError> {
    let mut p = AuthPolicy::default();
    for c in &a.chap {
        p.incoming.push(ChapSecret {
            user: c.user.clone(),
            secret: secret(ctx, &c.secret, &format!("{section}.chap.secret"))?,
        });
    }
    for c in &a.initiator_chap {
        p.per_initiator.push((
            c.initiator.get_ref().clone(),
            ChapSecret {
                user: c.user.clone(),
                secret: secret(ctx, &c.secret, &format!("{section}.initiator_chap.secret"))?,
            },
        ));
    }
    if let Some(m) = &a.mutual_chap {
        if !p.requires_chap() {
            return Err(ctx.err(
                m.secret.span(),
                &format!("{section}.mutual_chap"),
                "mutual CHAP needs one-way CHAP credentials too (add chap = [...])",
            ));
        }
        p.outgoing = Some(ChapSecret {
            user: m.user.clone(),
            secret: secret(ctx, &m.secret, &format!("{section}.mutual_chap.secret"))?,
        });
    }
    p.algorithms = match &a.chap_algorithms {
        None => vec![8, 7, 6, 5],
        Some(list) => {
            let mut v = Vec::new();
            for name in list.get_ref() {
                v.push(match name.to_ascii_uppercase().as_str() {
                    "MD5" => 5,
                    "SHA1" | "SHA-1" => 6,
                    "SHA256" | "SHA-256" => 7,
                    "SHA3-256" | "SHA3_256" => 8,
                    _ => {
                        return Err(ctx.err(
                            list.span(),
                            &format!("{section}.chap_algorithms"),
                            format!(
                        "{name:?} is not a CHAP algorithm (use SHA3-256, SHA-256, SHA1 or MD5)"),
                        ))
                    }
                });
            }
            v
        }
    };
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("512m"), Some(512 << 20));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("x"), None);
    }

    #[test]
    fn a_ram_lun_past_a_pebibyte_is_refused_by_name_before_anything_is_built() {
        let text = |size: &str| {
            format!(
                "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n[[target]]\n\
                 name = \"iqn.2026-11.io.blockwire:t\"\n\n[[target.lun]]\nid = 0\n\
                 backstore = \"ram\"\nsize = \"{size}\"\n"
            )
        };
        // A typo's worth of digits used to build a chunk table of its size
        // (and abort when that could not be had).
        for size in ["1025T", "16000000T", "18446744073709551615"] {
            let e = TargetConfig::from_str("t.toml", &text(size)).unwrap_err();
            assert_eq!((e.line, e.field.as_str()), (11, "target.lun.size"), "{e}");
            assert!(e.message.contains("at most 1 PiB"), "{e}");
            assert_eq!(fields(&check(&text(size))), vec![(11, "target.lun.size")]);
        }
        // The largest one is thin: its check and its start allocate no data.
        assert!(check(&text("1024T")).errors.is_empty());
        let b = TargetConfig::from_str("t.toml", &text("1024T")).unwrap();
        let lu = b.catalog.targets[0].luns.get(0).unwrap();
        assert_eq!(lu.config().backstore.size(), 1 << 50);
    }

    #[test]
    fn every_syntax_error_says_what_is_wrong_on_one_line() {
        // The TOML parser gives no words for a control character in a
        // comment; the error names it and where it is.
        let e = TargetConfig::from_str("t.toml", "[fabric]\n# a note\u{e}\n").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (2, "syntax"));
        assert!(
            e.message
                .starts_with("control character U+000E at column 9:"),
            "{e}"
        );
        // Where the parser has several lines of words, one line joins them.
        let e = TargetConfig::from_str("t.toml", "[fabric]\n[fabric]\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(!e.message.is_empty() && !e.message.contains('\n'), "{e:?}");
        let e = TargetConfig::from_str("t.toml", "[fabric]\nqueue_depth = ").unwrap_err();
        assert!(!e.message.is_empty() && !e.message.contains('\n'), "{e:?}");
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let text = "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n[[target]]\nname = \"iqn.2026-11.io.blockwire:t\"\n\n[[target.lun]]\nid = 0\nbackstore = \"tape\"\nsize = \"1M\"\n";
        let e = TargetConfig::from_str("t.toml", text).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (10, "target.lun.backstore"));
        assert!(
            e.to_string()
                .starts_with("t.toml:10: target.lun.backstore:"),
            "{e}"
        );

        let e = TargetConfig::from_str(
            "t.toml",
            "[[portal_group]]\ntag = 1\nlisten = [\"nowhere\"]\n",
        )
        .unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (3, "portal_group.listen"));

        let e = TargetConfig::from_str("t.toml", "[fabric]\nqueue_dpth = 3\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("queue_dpth"), "{e}");
    }

    fn one_lun(lun: &str) -> String {
        format!("[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n[[target]]\nname = \"iqn.2026-11.io.blockwire:t\"\n\n[[target.lun]]\nid = 0\n{lun}")
    }

    /// The data path policy of LUN `lun` of the first target, if it has one.
    fn policy(b: &Built, lun: u16) -> Option<DataPathPolicy> {
        b.catalog.targets[0]
            .data_paths
            .iter()
            .find(|(l, _)| *l == lun)
            .map(|(_, p)| *p)
    }

    #[test]
    fn zero_copy_sendfile_on_cached_file_luns_by_default() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("z.img");
        let lun = |extra: &str| {
            one_lun(&format!(
                "backstore = \"file\"\npath = {img:?}\nsize = \"1M\"\n{extra}"
            ))
        };
        let sendfiles = |extra: &str| {
            TargetConfig::from_str("t.toml", &lun(extra))
                .map(|b| usize::from(policy(&b, 0).is_some_and(|p| p.sendfile)))
                .unwrap_or_else(|e| panic!("{e}"))
        };
        assert_eq!(sendfiles(""), 1, "cached file LUNs use sendfile by default");
        assert_eq!(sendfiles("zero_copy = true\n"), 1);
        assert_eq!(sendfiles("zero_copy = false\n"), 0, "the copy path");
        assert_eq!(sendfiles("sync_send = true\n"), 0, "the engine path");
        assert_eq!(sendfiles("mode = \"direct\"\n"), 0, "the engine path");
        let e = TargetConfig::from_str(
            "t.toml",
            &one_lun("backstore = \"ram\"\nsize = \"1M\"\nzero_copy = true\n"),
        )
        .unwrap_err();
        assert_eq!(e.field, "target.lun.zero_copy", "{e}");
        let b = TargetConfig::from_str(
            "t.toml",
            &format!("[fabric]\nzero_copy_send = false\n{}", lun("")),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(!b.settings.zero_copy_send);
        let b = TargetConfig::from_str("t.toml", &lun("")).unwrap();
        assert!(b.settings.zero_copy_send, "zero-copy sends on by default");
        assert!(
            b.settings.local_copy_sends,
            "copying sends to local initiators by default"
        );
        let b = TargetConfig::from_str(
            "t.toml",
            &format!("[fabric]\nlocal_copy_sends = false\n{}", lun("")),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(!b.settings.local_copy_sends);
    }

    /// A configuration of one RAM LUN with `fabric` (a `[fabric]` table or
    /// nothing) before it.
    fn with_fabric(fabric: &str) -> Result<Built, ConfigError> {
        TargetConfig::from_str(
            "t.toml",
            &format!(
                "{fabric}{}",
                one_lun("backstore = \"ram\"\nsize = \"1M\"\n")
            ),
        )
    }

    #[test]
    fn busy_polling_is_on_by_default_off_at_zero_and_bounded() {
        let b = with_fabric("").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            b.settings.busy_poll,
            Some(std::time::Duration::from_micros(50)),
            "50 us by default"
        );
        let b = with_fabric("[fabric]\nbusy_poll_us = 0\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.settings.busy_poll, None, "0 is off");
        let b = with_fabric("[fabric]\nbusy_poll_us = 200\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            b.settings.busy_poll,
            Some(std::time::Duration::from_micros(200))
        );
        let e = with_fabric("[fabric]\nbusy_poll_us = 5000\n").unwrap_err();
        assert_eq!(e.field, "fabric.busy_poll_us", "{e}");
        assert!(e.to_string().contains("more than 1000"), "{e}");
    }

    #[test]
    fn connections_get_a_thread_per_cpu_by_default_the_shared_workers_at_zero() {
        let cpus = std::thread::available_parallelism().unwrap().get();
        let b = with_fabric("").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            b.settings.connection_threads, cpus,
            "one per CPU by default"
        );
        let b = with_fabric("[fabric]\nconnection_threads = 0\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.settings.connection_threads, 0, "0: the shared workers");
        let b = with_fabric("[fabric]\nconnection_threads = 3\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.settings.connection_threads, 3);
        let e = with_fabric("[fabric]\nconnection_threads = 5000\n").unwrap_err();
        assert_eq!(e.field, "fabric.connection_threads", "{e}");
        assert!(e.to_string().contains("one per CPU"), "{e}");
    }

    #[test]
    fn sync_send_only_on_file_luns_with_a_valid_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("s.img");
        let b = TargetConfig::from_str(
            "t.toml",
            &one_lun(&format!("backstore = \"file\"\npath = {img:?}\nsize = \"1M\"\nmode = \"direct\"\nsync_send = true\nsync_chunk = \"128K\"\n")),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let p = policy(&b, 0).expect("a data path policy");
        assert_eq!(p.chunk, 128 << 10);
        assert_eq!(
            p.engine_reads,
            Some(blockwire_target::datapath::Mode::Synchronized)
        );
        let off = TargetConfig::from_str(
            "t.toml",
            &one_lun(&format!(
                "backstore = \"file\"\npath = {img:?}\nsize = \"1M\"\n"
            )),
        )
        .unwrap();
        assert!(
            policy(&off, 0).is_none_or(|p| p.engine_reads.is_none()),
            "off by default on cached LUNs"
        );
        // A direct LUN always reads through the engine: serial without
        // sync_send (the baseline on registered buffers).
        let direct = TargetConfig::from_str(
            "t.toml",
            &one_lun(&format!(
                "backstore = \"file\"\npath = {img:?}\nsize = \"1M\"\nmode = \"direct\"\n"
            )),
        )
        .unwrap();
        assert_eq!(
            policy(&direct, 0).and_then(|p| p.engine_reads),
            Some(blockwire_target::datapath::Mode::Serial)
        );
        let e = TargetConfig::from_str(
            "t.toml",
            &one_lun("backstore = \"ram\"\nsize = \"1M\"\nsync_send = true\n"),
        )
        .unwrap_err();
        assert_eq!(e.field, "target.lun.sync_send", "{e}");
        let e = TargetConfig::from_str(
            "t.toml",
            &one_lun(&format!(
                "backstore = \"file\"\npath = {img:?}\nsync_send = true\nsync_chunk = \"3K\"\n"
            )),
        )
        .unwrap_err();
        assert_eq!(e.field, "target.lun.sync_chunk", "{e}");
    }

    #[test]
    fn striped_luns_and_their_errors() {
        use blockwire_target::datapath::{Mode, Source};
        let dir = tempfile::tempdir().unwrap();
        let m = |i: usize| dir.path().join(format!("m{i}.img"));
        let members = format!("paths = [{:?}, {:?}, {:?}]\n", m(0), m(1), m(2));
        // Cached, default 64K stripe, no sync_send: the core path.
        let b = TargetConfig::from_str(
            "t.toml",
            &one_lun(&format!(
                "backstore = \"striped\"\n{members}size = \"3M\"\n"
            )),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(policy(&b, 0), None, "the core path");
        let lu = b.catalog.targets[0].luns.get(0).unwrap().config().clone();
        assert_eq!(lu.backstore.size(), 3 << 20);
        assert!(lu.backstore.describe().starts_with("striped 3 x 64 KiB"));
        assert_eq!(std::fs::metadata(m(2)).unwrap().len(), 1 << 20);
        // Direct with sync_send: engine path, one stream per member.
        let b = TargetConfig::from_str(
            "t.toml",
            &one_lun(&format!("backstore = \"striped\"\n{members}size = \"3M\"\nmode = \"direct\"\nstripe_chunk = \"128K\"\nsync_send = true\nsync_chunk = \"256K\"\n")),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let p = policy(&b, 0).expect("a data path policy");
        assert_eq!(
            (p.chunk, p.engine_reads),
            (256 << 10, Some(Mode::Synchronized))
        );
        let store = b.catalog.targets[0]
            .luns
            .get(0)
            .unwrap()
            .config()
            .backstore
            .clone();
        let (source, _) = store.engine_source().unwrap().expect("the engine reads it");
        match &source {
            Source::Striped { files, layout } => {
                assert_eq!((files.len(), layout.stripe), (3, 128 << 10))
            }
            other => panic!("{other:?}"),
        }
        // Direct without sync_send: the engine's serial baseline.
        let b = TargetConfig::from_str(
            "t.toml",
            &one_lun(&format!(
                "backstore = \"striped\"\n{members}mode = \"direct\"\nstripe_chunk = \"128K\"\n"
            )),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            policy(&b, 0).and_then(|p| p.engine_reads),
            Some(Mode::Serial)
        );
        assert_eq!(
            b.catalog.targets[0]
                .luns
                .get(0)
                .unwrap()
                .config()
                .backstore
                .size(),
            3 << 20,
            "size from the members"
        );

        let bad = |lun: String| TargetConfig::from_str("t.toml", &one_lun(&lun)).expect_err(&lun);
        let e = bad(format!(
            "backstore = \"striped\"\npaths = [{:?}]\nsize = \"1M\"\n",
            m(0)
        ));
        assert_eq!((e.line, e.field.as_str()), (11, "target.lun.paths"), "{e}");
        assert!(e.message.contains("at least 2"), "{e}");
        let e = bad("backstore = \"striped\"\nsize = \"1M\"\n".into());
        assert_eq!(e.field, "target.lun.paths", "{e}");
        for (chunk, why) in [
            ("3K", "power of two"),
            ("1K\"\nmode = \"direct", "at least 4K"),
            ("64M", "power of two"),
            ("lots", "not a size"),
        ] {
            let e = bad(format!(
                "backstore = \"striped\"\n{members}size = \"3M\"\nstripe_chunk = \"{chunk}\"\n"
            ));
            assert_eq!(
                (e.line, e.field.as_str()),
                (13, "target.lun.stripe_chunk"),
                "{e}"
            );
            assert!(e.message.contains(why), "{chunk}: {e}");
        }
        let e = bad(format!("backstore = \"striped\"\n{members}size = \"3M\"\nblock_size = 4096\nstripe_chunk = \"2K\"\n"));
        assert_eq!(e.field, "target.lun.stripe_chunk", "{e}");
        assert!(e.message.contains("4096-byte block"), "{e}");
        let e = bad(format!(
            "backstore = \"file\"\npath = {:?}\n{members}",
            m(0)
        ));
        assert_eq!((e.line, e.field.as_str()), (12, "target.lun.paths"), "{e}");
        let e = bad(format!(
            "backstore = \"file\"\npath = {:?}\nstripe_chunk = \"64K\"\n",
            m(0)
        ));
        assert_eq!(e.field, "target.lun.stripe_chunk", "{e}");
        // A member of another size: refused, naming it.
        std::fs::OpenOptions::new()
            .write(true)
            .open(m(1))
            .unwrap()
            .set_len(4096)
            .unwrap();
        let e = bad(format!("backstore = \"striped\"\n{members}size = \"3M\"\n"));
        assert_eq!((e.line, e.field.as_str()), (11, "target.lun.paths"), "{e}");
        assert!(e.message.contains("m1.img is 4096 bytes"), "{e}");
    }

    #[test]
    fn no_disk_serves_the_pattern_and_opens_no_file() {
        use blockwire_target::datapath::source::pattern_byte;
        use blockwire_target::datapath::Source;
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("never.img");
        let m = |i: usize| dir.path().join(format!("s{i}.img"));
        let text = format!(
            "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n[[target]]\nname = \"iqn.2026-11.io.blockwire:t\"\n\n\
             [[target.lun]]\nid = 0\nbackstore = \"file\"\npath = {img:?}\nsize = \"1M\"\nmode = \"direct\"\n\n\
             [[target.lun]]\nid = 1\nbackstore = \"ram\"\nsize = \"1M\"\n\n\
             [[target.lun]]\nid = 2\nbackstore = \"striped\"\npaths = [{:?}, {:?}]\nsize = \"1M\"\nsync_send = true\n",
            m(0),
            m(1)
        );
        let b = TargetConfig::from_str_with("t.toml", &text, LoadOptions { no_disk: true })
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(b.no_disk);
        assert!(
            !img.exists() && !m(0).exists(),
            "no backstore file is created"
        );
        let paths = &b.catalog.targets[0].data_paths;
        assert!(paths
            .iter()
            .all(|(_, p)| !p.sendfile && !p.double_buffered_writes));
        let engine: Vec<u16> = paths
            .iter()
            .filter(|(_, p)| p.engine_reads.is_some())
            .map(|(l, _)| *l)
            .collect();
        assert_eq!(engine, [0, 2], "the engine-path LUNs");
        for lun in engine {
            let store = b.catalog.targets[0]
                .luns
                .get(lun)
                .unwrap()
                .config()
                .backstore
                .clone();
            let source = store.engine_source().unwrap().map(|(s, _)| s);
            assert!(matches!(source, Some(Source::Pattern)), "LUN {lun}");
        }
        for lun in 0..3 {
            let store = b.catalog.targets[0]
                .luns
                .get(lun)
                .unwrap()
                .config()
                .backstore
                .clone();
            assert_eq!(store.size(), 1 << 20);
            store.write_at(4096, &[0u8; 512]).unwrap();
            let mut back = [0u8; 512];
            store.read_at(4096, &mut back).unwrap();
            assert!(
                back.iter()
                    .enumerate()
                    .all(|(i, &v)| v == pattern_byte(4096 + i as u64)),
                "LUN {lun}"
            );
        }
        // Without the option the same text creates the files.
        TargetConfig::from_str("t.toml", &text).unwrap_or_else(|e| panic!("{e}"));
        assert!(img.exists() && m(1).exists());
    }

    #[test]
    fn sync_write_only_on_file_luns() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("w.img");
        let b = TargetConfig::from_str(
            "t.toml",
            &one_lun(&format!("backstore = \"file\"\npath = {img:?}\nsize = \"1M\"\nsync_write = true\nsync_chunk = \"256K\"\n")),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let p = policy(&b, 0).expect("a data path policy");
        assert!(p.double_buffered_writes);
        assert_eq!(p.chunk, 256 << 10);
        let store = b.catalog.targets[0]
            .luns
            .get(0)
            .unwrap()
            .config()
            .backstore
            .clone();
        assert_eq!(
            store.capabilities().file,
            Some(blockwire_target::backstore::StoreFile {
                path: img.clone(),
                direct: false
            }),
            "the double-buffered path writes the store's own file"
        );
        let off = TargetConfig::from_str(
            "t.toml",
            &one_lun(&format!(
                "backstore = \"file\"\npath = {img:?}\nsize = \"1M\"\nsync_write = false\n"
            )),
        )
        .unwrap();
        assert!(policy(&off, 0).is_none_or(|p| !p.double_buffered_writes));
        for kind in [
            "backstore = \"ram\"\nsize = \"1M\"\n",
            "backstore = \"null\"\nsize = \"1M\"\n",
        ] {
            let e =
                TargetConfig::from_str("t.toml", &one_lun(&format!("{kind}sync_write = true\n")))
                    .unwrap_err();
            assert_eq!(e.field, "target.lun.sync_write", "{e}");
            assert!(e.message.contains("only file LUNs"), "{e}");
        }
    }

    #[test]
    fn lun_backstores_modes_and_uuid() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("d.img");
        // null, file direct (or its announced fallback), file cached.
        for lun in [
            "backstore = \"null\"\nsize = \"1G\"\n".to_string(),
            format!("backstore = \"file\"\npath = {img:?}\nsize = \"1M\"\nmode = \"direct\"\n"),
            format!("backstore = \"file\"\npath = {img:?}\nmode = \"cached\"\nphysical_block_size = 4096\n"),
        ] {
            TargetConfig::from_str("t.toml", &one_lun(&lun)).unwrap_or_else(|e| panic!("{e}"));
        }
        let e = TargetConfig::from_str(
            "t.toml",
            &one_lun("backstore = \"ram\"\nsize = \"1M\"\nmode = \"direct\"\n"),
        )
        .unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (12, "target.lun.mode"), "{e}");
        let e = TargetConfig::from_str(
            "t.toml",
            &one_lun(&format!(
                "backstore = \"file\"\npath = {img:?}\nmode = \"fast\"\n"
            )),
        )
        .unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (12, "target.lun.mode"), "{e}");
        let e = TargetConfig::from_str(
            "t.toml",
            &one_lun("backstore = \"null\"\nsize = \"1M\"\nuuid = \"nope\"\n"),
        )
        .unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (12, "target.lun.uuid"), "{e}");
        let e = TargetConfig::from_str(
            "t.toml",
            &one_lun("backstore = \"null\"\nsize = \"1M\"\nphysical_block_size = 1000\n"),
        )
        .unwrap_err();
        assert_eq!(e.field, "target.lun.physical_block_size", "{e}");
        // The UUID, not the target name, decides the identity.
        let uuid = "uuid = \"3f2504e0-4f89-11d3-9a0c-0305e82c3301\"\n";
        let lun = format!("backstore = \"null\"\nsize = \"1M\"\n{uuid}");
        let a = TargetConfig::from_str("t.toml", &one_lun(&lun)).unwrap();
        let b = TargetConfig::from_str(
            "t.toml",
            &one_lun(&lun).replace("blockwire:t", "blockwire:renamed"),
        )
        .unwrap();
        let cfg = |b: &Built| {
            let lu = b.catalog.targets[0].luns.get(0).unwrap().config().clone();
            (lu.serial, lu.naa_id)
        };
        assert_eq!(cfg(&a), cfg(&b));
        assert_eq!(cfg(&a).0, "3f2504e04f8911d39a0c0305e82c3301");
    }

    #[test]
    fn a_path_with_a_line_break_is_reported_on_one_line() {
        let lun =
            "backstore = \"file\"\npath = \"/nonexistent\\nfake: line/a.img\"\nsize = \"1M\"\n";
        let r = check(&one_lun(lun));
        assert!(!r.errors.is_empty());
        for e in &r.errors {
            assert!(!e.message.contains('\n'), "{e:?}");
            assert!(e.message.contains("/nonexistent\\nfake: line"), "{e:?}");
        }
    }

    #[test]
    fn each_unit_holds_its_files_and_identity_alone() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("a.img");
        let other = dir.path().join("b.img");
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let dotted = dir.path().join("sub/../a.img");
        let two = |first: &str, second: &str| {
            format!("{}\n[[target.lun]]\nid = 1\n{second}", one_lun(first))
        };
        let file = |p: &std::path::Path, more: &str| {
            format!("backstore = \"file\"\npath = {p:?}\nsize = \"1M\"\n{more}")
        };
        // Line 17 is LUN 1's path (or journal), 14 its header.
        let refused = [
            (two(&file(&img, ""), &file(&dotted, "")), 17, "target.lun.path", "data file of LUN 0"),
            (
                two(&file(&img, ""), &file(&other, &format!("atomic_journal = {img:?}\n"))),
                19,
                "target.lun.atomic_journal",
                "data file of LUN 0",
            ),
            (
                two(
                    &file(&img, ""),
                    &format!("backstore = \"striped\"\npaths = [{other:?}, {img:?}]\nsize = \"1M\"\n"),
                ),
                17,
                "target.lun.paths",
                "data file of LUN 0",
            ),
            (
                two(
                    "backstore = \"ram\"\nsize = \"1M\"\nuuid = \"3f2504e0-4f89-11d3-9a0c-0305e82c3301\"\n",
                    "backstore = \"ram\"\nsize = \"1M\"\nuuid = \"3F2504E0-4F89-11D3-9A0C-0305E82C3301\"\n",
                ),
                18,
                "target.lun.uuid",
                "same identity",
            ),
            (
                two(
                    "backstore = \"ram\"\nsize = \"1M\"\nserial = \"disk7\"\n",
                    "backstore = \"ram\"\nsize = \"1M\"\nserial = \"disk7\"\n",
                ),
                14,
                "target.lun.serial",
                "serial number \"disk7\" of LUN 0",
            ),
        ];
        for (text, line, field, said) in refused {
            let e = TargetConfig::from_str("t.toml", &text).unwrap_err();
            assert_eq!((e.line, e.field.as_str()), (line, field), "{e}\n{text}");
            assert!(e.message.contains(said), "{e}");
            // --check finds a problem there too (its own check of the
            // file may come first: it reports one problem per field).
            let r = check(&text);
            assert!(fields(&r).contains(&(line, field)), "{:?}", r.errors);
        }
        // Journals apart (or off), LUNs over their own files are fine.
        let apart = two(&file(&img, ""), &file(&other, ""));
        TargetConfig::from_str("t.toml", &apart).unwrap_or_else(|e| panic!("{e}"));
        let journal_off = two(
            &file(&img, "atomic_writes = false\n"),
            &file(
                &other,
                &format!(
                    "atomic_journal = {:?}\n",
                    dir.path().join("a.img.atomic-journal")
                ),
            ),
        );
        TargetConfig::from_str("t.toml", &journal_off).unwrap_or_else(|e| panic!("{e}"));

        // Saved reservations are named after the target: two names that
        // differ only in characters a file name holds as '_' (here 'é' and
        // 'ü') would share them.
        let state = dir.path().join("state");
        let two_targets = format!(
            "[fabric]\nstate_dir = {state:?}\n\n[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n\
             [[target]]\nname = \"iqn.2026-11.io.blockwire:é\"\n[[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n\n\
             [[target]]\nname = \"iqn.2026-11.io.blockwire:ü\"\n[[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n"
        );
        let e = TargetConfig::from_str("t.toml", &two_targets).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (16, "target.name"), "{e}");
        assert!(
            e.message
                .contains("saved reservations of LUN 0 of iqn.2026-11.io.blockwire:ü"),
            "{e}"
        );
        assert!(e.message.contains("rename one of the targets"), "{e}");
        let apart = two_targets.replace("blockwire:ü", "blockwire:u");
        TargetConfig::from_str("t.toml", &apart).unwrap_or_else(|e| panic!("{e}"));
    }

    fn two_groups(second: &str, target_groups: &str) -> String {
        format!(
            "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n\
             [[portal_group]]\ntag = 2\nlisten = [\"127.0.0.1:3261\"]\n{second}\n\
             [[target]]\nname = \"iqn.2026-11.io.blockwire:t\"\n{target_groups}\n\
             [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n"
        )
    }

    #[test]
    fn iser_portals_are_the_flagged_groups_addresses_with_their_tags() {
        let verbs = format!(
            "[fabric]\nrdma_backend = \"verbs\"\n{}",
            two_groups("iser = true\n", "")
        );
        let b = TargetConfig::from_str("t.toml", &verbs).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            b.iser_portals,
            vec![("127.0.0.1:3261".parse().unwrap(), 2)],
            "only group 2 asked for iSER"
        );
        let b = TargetConfig::from_str("t.toml", &two_groups("iser = \"yes\"\n", ""));
        assert!(b.is_err(), "iser takes true or false");
        // With the soft provider (RDMA over TCP) the iSER listener needs its own port.
        let soft = |second: &str| {
            TargetConfig::from_str(
                "t.toml",
                &format!(
                    "[fabric]\nrdma_backend = \"soft\"\n{}",
                    two_groups(second, "")
                ),
            )
        };
        let e = soft("iser = true\n").unwrap_err().to_string();
        assert!(e.contains("iser_listen") && e.contains("verbs"), "{e}");
        let e = soft("iser_listen = [\"127.0.0.1:3261\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("127.0.0.1:3261"), "{e}");
        let b = soft("iser_listen = [\"127.0.0.1:3262\"]\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.iser_portals, vec![("127.0.0.1:3262".parse().unwrap(), 2)]);
    }

    #[test]
    fn alua_one_target_port_group_per_portal_group_of_the_target() {
        let groups = |b: &Built| b.catalog.targets[0].luns.target_port_groups();
        let b = TargetConfig::from_str("t.toml", &two_groups("", "portal_groups = [2, 1]\n"))
            .unwrap_or_else(|e| panic!("{e}"));
        let g = groups(&b);
        assert_eq!(
            g.iter()
                .map(|g| (g.id, g.state, g.ports.clone()))
                .collect::<Vec<_>>(),
            vec![
                (2, AluaState::ActiveOptimized, vec![2]),
                (1, AluaState::ActiveOptimized, vec![1])
            ],
            "in the target's order (the first is preferred), relative port = TPGT"
        );
        for (state, want) in [
            ("active_optimized", AluaState::ActiveOptimized),
            ("active_non_optimized", AluaState::ActiveNonOptimized),
            ("standby", AluaState::Standby),
        ] {
            let b = TargetConfig::from_str(
                "t.toml",
                &two_groups(&format!("alua_state = \"{state}\"\n"), ""),
            )
            .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(groups(&b)[1].state, want);
            assert_eq!(
                groups(&b)[0].state,
                AluaState::ActiveOptimized,
                "the default"
            );
        }
        let b = TargetConfig::from_str("t.toml", &two_groups("", "portal_groups = [1]\n")).unwrap();
        assert_eq!(groups(&b).len(), 1, "only the target's own groups");
    }

    #[test]
    fn alua_and_portal_group_errors() {
        let e = TargetConfig::from_str("t.toml", &two_groups("alua_state = \"offline\"\n", ""))
            .unwrap_err();
        assert_eq!(
            (e.line, e.field.as_str()),
            (8, "portal_group.alua_state"),
            "{e}"
        );
        assert!(
            e.message.contains("\"standby\""),
            "says what is allowed: {e}"
        );
        let e = TargetConfig::from_str("t.toml", &two_groups("", "portal_groups = [1, 3]\n"))
            .unwrap_err();
        assert_eq!(
            (e.line, e.field.as_str()),
            (11, "target.portal_groups"),
            "{e}"
        );
        assert_eq!(e.message, "portal group 3 is not defined (defined: 1, 2)");
        let e = TargetConfig::from_str("t.toml", &two_groups("", "portal_groups = [2, 2]\n"))
            .unwrap_err();
        assert_eq!(e.message, "portal group 2 is listed twice", "{e}");
        let e = TargetConfig::from_str("t.toml", &two_groups("alua = 1\n", "")).unwrap_err();
        assert!(e.message.contains("unknown field `alua`"), "{e}");
    }

    #[test]
    fn metrics_listen_address_is_opt_in_and_checked() {
        let lun = || one_lun("backstore = \"ram\"\nsize = \"1M\"\n");
        let b = TargetConfig::from_str(
            "t.toml",
            &format!("[metrics]\nlisten = \"127.0.0.1:9450\"\n\n{}", lun()),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.metrics_listen, Some("127.0.0.1:9450".parse().unwrap()));
        let b = TargetConfig::from_str("t.toml", &lun()).unwrap();
        assert_eq!(b.metrics_listen, None, "no endpoint unless asked for");
        let e = TargetConfig::from_str(
            "t.toml",
            &format!("[metrics]\nlisten = \"localhost\"\n\n{}", lun()),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("t.toml:2") && e.contains("metrics.listen") && e.contains("127.0.0.1:9450"),
            "{e}"
        );
    }

    #[test]
    fn removable_and_sanitize_min_seconds() {
        let b = TargetConfig::from_str(
            "t.toml",
            &one_lun(
                "backstore = \"ram\"\nsize = \"1M\"\nremovable = true\nsanitize_min_seconds = 10\n",
            ),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let lu = b.catalog.targets[0].luns.get(0).unwrap();
        assert!(lu.config().removable);
        assert_eq!(
            lu.config().sanitize_min_duration,
            std::time::Duration::from_secs(10)
        );
        let b = TargetConfig::from_str("t.toml", &one_lun("backstore = \"ram\"\nsize = \"1M\"\n"))
            .unwrap();
        let lu = b.catalog.targets[0].luns.get(0).unwrap();
        assert!(!lu.config().removable, "fixed unless asked for");
        assert!(lu.config().sanitize_min_duration.is_zero());
        let e = TargetConfig::from_str(
            "t.toml",
            &one_lun("backstore = \"ram\"\nsize = \"1M\"\nsanitize_min_seconds = 100000\n"),
        )
        .unwrap_err();
        assert_eq!(e.field, "target.lun.sanitize_min_seconds", "{e}");
    }

    #[test]
    fn atomic_writes_where_honest() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("a.img");
        let build = |extra: &str| TargetConfig::from_str("t.toml", &one_lun(extra));
        let atomic_max = |b: &Built| {
            let lu = b.catalog.targets[0].luns.get(0).unwrap();
            (
                lu.config().atomic_writes,
                lu.config().backstore.atomic_write_max(),
            )
        };
        // RAM: on by default, off when asked.
        let b = build("backstore = \"ram\"\nsize = \"1M\"\n").unwrap();
        assert_eq!(atomic_max(&b), (true, 1 << 20));
        let b = build("backstore = \"ram\"\nsize = \"1M\"\natomic_writes = false\n").unwrap();
        assert!(!atomic_max(&b).0);
        // A file: a journal next to it, by default.
        let file = format!("backstore = \"file\"\npath = {img:?}\nsize = \"1M\"\n");
        let b = build(&file).unwrap();
        assert_eq!(atomic_max(&b), (true, 128 << 10));
        assert!(dir.path().join("a.img.atomic-journal").is_file());
        drop(b);
        // Off: no journal opened.
        let img2 = dir.path().join("b.img");
        let b = build(&format!(
            "backstore = \"file\"\npath = {img2:?}\nsize = \"1M\"\natomic_writes = false\n"
        ))
        .unwrap();
        assert_eq!(atomic_max(&b), (false, 0));
        assert!(!dir.path().join("b.img.atomic-journal").exists());
        // Elsewhere.
        let j = dir.path().join("journals").join("c.journal");
        std::fs::create_dir(dir.path().join("journals")).unwrap();
        let b = build(&format!("{file}atomic_journal = {j:?}\n")).unwrap();
        assert_eq!(atomic_max(&b).1, 128 << 10);
        assert!(j.is_file());
        drop(b);
        // Read-only: no atomic writes, and asking for them is an error.
        let b = build(&format!("{file}read_only = true\n")).unwrap();
        assert_eq!(atomic_max(&b).1, 0);
        let e = build(&format!("{file}read_only = true\natomic_writes = true\n")).unwrap_err();
        assert_eq!(e.field, "target.lun.atomic_writes", "{e}");
        let e =
            build("backstore = \"ram\"\nsize = \"1M\"\natomic_journal = \"/tmp/x\"\n").unwrap_err();
        assert_eq!(e.field, "target.lun.atomic_journal", "{e}");
        // A read-only LUN does not serve a file its journal holds an
        // unfinished atomic write for.
        let g = blockwire_target::backstore::journal::Geometry::DEFAULT;
        let jpath = dir.path().join("a.img.atomic-journal");
        let mut image = std::fs::read(&jpath).unwrap();
        let rec = blockwire_target::backstore::journal::encode_record(9, 0, &[1; 512]);
        let at = g.slot_offset(1) as usize;
        image[at..at + rec.len()].copy_from_slice(&rec);
        std::fs::write(&jpath, &image).unwrap();
        let e = build(&format!("{file}read_only = true\n")).unwrap_err();
        assert!(e.message.contains("unfinished atomic write"), "{e}");
        // Opened writable, it replays it.
        let b = build(&file).unwrap();
        let lu = b.catalog.targets[0].luns.get(0).unwrap();
        let mut got = [0u8; 512];
        lu.config().backstore.read_at(0, &mut got).unwrap();
        assert_eq!(got, [1; 512]);
    }

    #[test]
    fn control_socket_and_stalled_luns() {
        let b = TargetConfig::from_str(
            "t.toml",
            &format!(
                "[control]\nsocket = \"/run/bw.sock\"\n\n{}",
                one_lun("backstore = \"ram\"\nsize = \"1M\"\nstalled = true\n")
            ),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.control_socket.as_deref(), Some(Path::new("/run/bw.sock")));
        assert!(b.catalog.targets[0].luns.get(0).unwrap().is_stalled());
        let b = TargetConfig::from_str("t.toml", &one_lun("backstore = \"ram\"\nsize = \"1M\"\n"))
            .unwrap();
        assert_eq!(b.control_socket, None, "no socket unless asked for");
        assert!(!b.catalog.targets[0].luns.get(0).unwrap().is_stalled());
        let e = TargetConfig::from_str("t.toml", "[control]\npath = \"/x\"\n").unwrap_err();
        assert!(e.message.contains("unknown field `path`"), "{e}");
    }

    fn check(text: &str) -> CheckReport {
        TargetConfig::check_str("t.toml", text, LoadOptions::default())
    }

    fn fields(r: &CheckReport) -> Vec<(usize, &str)> {
        r.errors
            .iter()
            .map(|e| (e.line, e.field.as_str()))
            .collect()
    }

    #[test]
    fn check_reports_every_bad_name_with_its_line() {
        let text = "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n\
                    [[target]]\nname = \"iqn.2026-11.io.blockwire:t\"\n\
                    allow = [\"iqn.2026-01.org.example:ok\",\n         \"host1\"]\n\
                    initiator_chap = [{ initiator = \"my_host\", user = \"u\", secret = \"0123456789abcdef\" }]\n\n\
                    [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n\n\
                    [[target]]\nname = \"disk2\"\n\n\
                    [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n";
        let r = check(text);
        assert_eq!(
            fields(&r),
            [
                (8, "target.allow"),
                (9, "target.initiator_chap.initiator"),
                (17, "target.name")
            ],
            "{:?}",
            r.errors
        );
        assert!(r.errors[0].message.contains("\"host1\""), "{}", r.errors[0]);
        // A normal start refuses the first one.
        let e = TargetConfig::from_str("t.toml", text).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (8, "target.allow"));
    }

    #[test]
    fn check_refuses_a_listen_address_bound_twice() {
        let text = "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\", \"[::1]:3260\"]\n\n\
                    [[portal_group]]\ntag = 2\nlisten = [\"127.0.0.1:3260\",\n  \"0.0.0.0:3261\",\n  \"127.0.0.2:3261\",\n  \"127.0.0.1:0\", \"127.0.0.1:0\"]\n\n\
                    [[target]]\nname = \"iqn.2026-11.io.blockwire:t\"\n\n\
                    [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n";
        let r = check(text);
        assert_eq!(
            fields(&r),
            [
                (7, "portal_group.listen"),
                (9, "portal_group.listen"),
                (10, "portal_group.listen")
            ],
            "{:?}",
            r.errors
        );
        assert!(
            r.errors[0]
                .message
                .contains("listed already (portal group 1)"),
            "{}",
            r.errors[0]
        );
        assert!(
            r.errors[1].message.contains("overlaps 0.0.0.0:3261"),
            "{}",
            r.errors[1]
        );
        // Port 0 may be in several groups (each gets a port), once in each.
        assert!(
            r.errors[2]
                .message
                .contains("listed twice in portal group 2"),
            "{}",
            r.errors[2]
        );
        assert!(TargetConfig::from_str("t.toml", text).is_err());
    }

    #[test]
    fn check_chap_secret_lengths_and_mutual_secret_reuse() {
        let lun = "\n[[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n";
        let head = "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n[[target]]\nname = \"iqn.2026-11.io.blockwire:t\"\n";
        let text = format!(
            "{head}chap = [{{ user = \"a\", secret = \"short\" }},\n  {{ user = \"b\", secret = \"0123456789abcdef\" }}]\n\
             mutual_chap = {{ user = \"t\", secret = \"0123456789abcdef\" }}\n{lun}\n\
             [discovery]\nchap = [{{ user = \"d\", secret = \"eleven-char\" }}]\n"
        );
        let r = check(&text);
        assert_eq!(
            fields(&r),
            [
                (7, "target.chap.secret"),
                (9, "target.mutual_chap.secret"),
                (17, "discovery.chap.secret")
            ],
            "{:?}",
            r.errors
        );
        assert!(r.errors[0].message.contains("(5 given)"), "{}", r.errors[0]);
        assert!(r.errors[1].message.contains("RFC 7143"), "{}", r.errors[1]);
        // Distinct secrets of 12 characters or more pass.
        let ok = format!(
            "{head}chap = [{{ user = \"a\", secret = \"0123456789ab\" }}]\n\
             mutual_chap = {{ user = \"t\", secret = \"another-secret-1\" }}\n{lun}"
        );
        assert!(check(&ok).is_valid(), "{:?}", check(&ok).errors);
        // The same secret in per-initiator CHAP counts as one-way too.
        let reuse = format!(
            "{head}initiator_chap = [{{ initiator = \"iqn.2026-01.org.example:i\", user = \"a\", secret = \"0123456789ab\" }}]\n\
             mutual_chap = {{ user = \"t\", secret = \"0123456789ab\" }}\n{lun}"
        );
        assert_eq!(fields(&check(&reuse)), [(8, "target.mutual_chap.secret")]);
    }

    #[test]
    fn fabric_errors_name_their_line_and_all_are_reported() {
        let text = format!(
            "# comment\n[fabric]\nqueue_depth = 0\nnop_interval_secs = 5\nheader_digest = \"sometimes\"\nwrite_budget = \"1K\"\n\n{}",
            one_lun("backstore = \"ram\"\nsize = \"1M\"\n")
        );
        let r = check(&text);
        assert_eq!(
            fields(&r),
            [
                (3, "fabric.queue_depth"),
                (5, "fabric.header_digest"),
                (6, "fabric.write_budget")
            ],
            "{:?}",
            r.errors
        );
        let e = TargetConfig::from_str("t.toml", &text).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (3, "fabric.queue_depth"));
        assert_eq!(key_line("[fabric]\nx = 1\n", "fabric", "queue_depth"), 1);
        assert_eq!(key_line("a = 1\n", "fabric", "queue_depth"), 1);
        assert_eq!(
            key_line(
                "[[target]]\nqueue_depth = 1\n[ fabric ] # tunables\n  queue_depth= 0\n",
                "fabric",
                "queue_depth"
            ),
            4
        );
    }

    #[test]
    fn check_backing_files_without_touching_them() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let lun = |path: &Path, extra: &str| {
            one_lun(&format!("backstore = \"file\"\npath = {path:?}\n{extra}"))
        };
        // Absent, in a writable directory: it would be created.
        let new = dir.path().join("new.img");
        let r = check(&lun(&new, "size = \"1M\"\n"));
        assert!(r.is_valid(), "{:?}", r.errors);
        assert_eq!(r.notices.len(), 1);
        assert_eq!(
            (r.notices[0].line, r.notices[0].field.as_str()),
            (11, "target.lun.path")
        );
        assert!(r.notices[0].message.contains("a start creates it"));
        assert!(!new.exists(), "--check creates nothing");
        // Absent without a size, or read-only: an error.
        let r = check(&lun(&new, ""));
        assert_eq!(fields(&r), [(11, "target.lun.path")], "{:?}", r.errors);
        assert!(r.errors[0].message.contains("add size"));
        let r = check(&lun(&new, "size = \"1M\"\nread_only = true\n"));
        assert!(r.errors[0].message.contains("read_only"), "{:?}", r.errors);
        // Its directory missing.
        let r = check(&lun(&dir.path().join("nodir/x.img"), "size = \"1M\"\n"));
        assert_eq!(fields(&r), [(11, "target.lun.path")], "{:?}", r.errors);
        assert!(r.errors[0].message.contains("mkdir -p"), "{}", r.errors[0]);
        assert!(!dir.path().join("nodir").exists());
        // Smaller than size: reported as grown, left alone.
        let small = dir.path().join("small.img");
        std::fs::write(&small, vec![0u8; 4096]).unwrap();
        let r = check(&lun(&small, "size = \"1M\"\n"));
        assert!(r.is_valid(), "{:?}", r.errors);
        assert!(
            r.notices[0]
                .message
                .contains("is 4096 bytes: a start grows it to 1048576 bytes"),
            "{}",
            r.notices[0]
        );
        assert_eq!(std::fs::metadata(&small).unwrap().len(), 4096);
        // A directory is not a backing file; an empty file needs a size.
        let r = check(&lun(dir.path(), "size = \"1M\"\n"));
        assert!(
            r.errors[0].message.contains("is a directory"),
            "{:?}",
            r.errors
        );
        let empty = dir.path().join("empty.img");
        std::fs::write(&empty, b"").unwrap();
        assert!(check(&lun(&empty, "")).errors[0]
            .message
            .contains("is empty"));
        // Not writable (unless root, whom access(2) lets write anyway).
        let ro = dir.path().join("ro");
        std::fs::create_dir(&ro).unwrap();
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
        if !writable(&ro, true) {
            let r = check(&lun(&ro.join("x.img"), "size = \"1M\"\n"));
            assert!(
                r.errors[0].message.contains("not writable"),
                "{:?}",
                r.errors
            );
        }
        // A state_dir to create is a notice, and is not created.
        let state = dir.path().join("state/sub");
        let r = check(&format!(
            "[fabric]\nstate_dir = {state:?}\n\n{}",
            one_lun("backstore = \"ram\"\nsize = \"1M\"\n")
        ));
        assert!(r.is_valid(), "{:?}", r.errors);
        assert_eq!(
            (r.notices[0].line, r.notices[0].field.as_str()),
            (2, "fabric.state_dir")
        );
        assert!(!state.exists());
        // Striped members: one absent while another holds data.
        let m0 = dir.path().join("m0.img");
        std::fs::write(&m0, vec![0u8; 1 << 20]).unwrap();
        let r = check(&one_lun(&format!(
            "backstore = \"striped\"\npaths = [{m0:?}, {:?}]\nsize = \"2M\"\n",
            dir.path().join("m1.img")
        )));
        assert_eq!(fields(&r), [(11, "target.lun.paths")], "{:?}", r.errors);
        assert!(!dir.path().join("m1.img").exists());
    }

    #[test]
    fn example_config_parses() {
        let r = TargetConfig::check_str("example", EXAMPLE_CONFIG, LoadOptions::default());
        assert!(r.is_valid(), "{:?}", r.errors);
        assert!(EXAMPLE_CONFIG.starts_with("# "), "commented");
    }

    #[test]
    fn embedded_default_and_examples_load() {
        let b = TargetConfig::embedded_default("127.0.0.1:3260".parse().unwrap());
        assert_eq!(b.catalog.targets.len(), 1);
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        // The two-portal-group example (ALUA, control socket, a stalled LUN)
        // loads as its comments say.
        let ha = TargetConfig::load(&dir.join("two-portal-groups.toml"))
            .unwrap_or_else(|e| panic!("{e}"));
        let t = &ha.catalog.targets[0];
        let states: Vec<(u16, AluaState)> = t
            .luns
            .target_port_groups()
            .iter()
            .map(|g| (g.id, g.state))
            .collect();
        assert_eq!(
            states,
            [
                (1, AluaState::ActiveOptimized),
                (2, AluaState::ActiveNonOptimized)
            ]
        );
        assert!(!t.luns.get(0).unwrap().is_stalled() && t.luns.get(1).unwrap().is_stalled());
        assert_eq!(
            ha.control_socket.as_deref(),
            Some(Path::new("/run/blockwire/control.sock"))
        );
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                // File LUNs in examples point at /var/lib; load only those
                // whose backstores are RAM, check the others parse.
                let text = std::fs::read_to_string(&path).unwrap();
                if !text.contains("backstore = \"file\"") {
                    TargetConfig::load(&path).unwrap_or_else(|e| panic!("{e}"));
                } else {
                    toml::from_str::<TargetConfig>(&text)
                        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                }
            }
        }
    }
}
