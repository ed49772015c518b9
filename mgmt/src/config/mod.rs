//! The target's TOML configuration and its translation into the fabric's
//! catalog.
//!
//! Every error names the file, the line and the field, and says how to fix
//! it: a storage daemon that refuses to start must say why in one line.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::claims::{Claims, FileKey, FileUse, KnownFiles};
pub use blockwire_pdu::keys::check_iscsi_name;
use blockwire_target::backstore::device_atomic::DeviceAtomicUnits;
use blockwire_target::backstore::{Backstore, FileBackstore};
use blockwire_target::iscsi::catalog::{
    Acl, AuthPolicy, Catalog, ChapSecret, PortalGroup, TargetEntry,
};
use blockwire_target::iscsi::FabricSettings;
use blockwire_target::scsi::{
    identity_from_uuid, stable_identity, AluaState, LogicalUnit, LunTable, TargetPortGroup,
};
use located::Located;
use serde::Deserialize;
use std::os::unix::fs::OpenOptionsExt;

mod check;
mod located;
mod lun;
mod probe;

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
    pub portal_groups: Vec<Located<PortalGroupConfig>>,
    /// Discovery session authentication.
    #[serde(default)]
    pub discovery: AuthConfig,
    /// Targets.
    #[serde(default, rename = "target")]
    pub targets: Vec<Located<TargetDef>>,
    /// The runtime control socket.
    #[serde(default)]
    pub control: ControlConfig,
    /// The Prometheus metrics endpoint.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// Registration with an iSNS server.
    #[serde(default)]
    pub isns: IsnsConfig,
}

/// `[isns]`: register the targets, their portals and portal groups with an
/// iSNS server (RFC 4171; see docs/isns.md), so initiators find them with
/// `iscsiadm -m discovery -t isns`. Off unless `server` is given.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct IsnsConfig {
    /// HOST[:PORT] of the server; the port defaults to 3205.
    pub server: Option<Located<String>>,
    /// The Entity Identifier the targets are registered under (default:
    /// this machine's host name). Two daemons registering with one server
    /// need two names: each registration replaces its entity's.
    pub entity: Option<Located<String>>,
    /// The registration period asked for, in seconds (default 900): the
    /// server forgets the targets this long after the daemon's last
    /// message if it dies without deregistering. The daemon refreshes at
    /// half the period the server grants.
    pub registration_period_secs: Option<Located<u32>>,
}

/// `[isns]` checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsnsSettings {
    /// HOST:PORT.
    pub server: String,
    /// The Entity Identifier.
    pub entity: String,
    /// The registration period asked for, in seconds.
    pub period_secs: u32,
}

/// `[metrics]`: an HTTP endpoint serving Prometheus' text exposition
/// format at `/metrics` (see docs/metrics.md). Off unless a listen
/// address is given here or with `--metrics`.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// ADDR:PORT, e.g. "127.0.0.1:9450". The endpoint has no
    /// authentication: bind it where only the scraper can reach it.
    pub listen: Option<Located<String>>,
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

/// The longest `[fabric] login_timeout_secs`: an hour between two login
/// PDUs is already far past any initiator's own login timeout.
const LOGIN_TIMEOUT_MAX_SECS: u64 = 3_600;

/// The most `[fabric] max_logins_in_progress`: each login in progress holds
/// a task and its buffers, some kilobytes.
const LOGINS_IN_PROGRESS_MAX: usize = 1 << 20;

/// `[fabric]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FabricConfig {
    /// Commands in flight per session.
    pub queue_depth: u32,
    /// Seconds between NOP-In keepalives; 0 disables them.
    pub nop_interval_secs: u64,
    /// Seconds before an initiator that ignores pings, takes no data, or
    /// sends none of a WRITE's awaited Data-Out, is dropped.
    pub nop_timeout_secs: u64,
    /// Seconds initiators get to log out at shutdown.
    pub logout_grace_secs: u64,
    /// Seconds an initiator may take to send its next login PDU.
    pub login_timeout_secs: u64,
    /// Seconds the whole login phase may take, from the connection's accept
    /// to its final Login Response sent.
    pub login_deadline_secs: u64,
    /// Connections that may be in their login phase at once; one more is
    /// closed as soon as it is accepted.
    pub max_logins_in_progress: usize,
    /// Of those, the most from one host (an IPv4 address, an IPv6 /64), so
    /// that one host cannot take every place. Unset: the target's default, or the total if that is
    /// lower.
    pub max_logins_in_progress_per_address: Option<usize>,
    /// Discovery sessions open at once; one more login is refused OUT OF
    /// RESOURCES (normal sessions are not counted).
    pub max_discovery_sessions: usize,
    /// Of those, the most from one initiator host (an IPv4 address, an IPv6
    /// /64; initiators behind one NAT address share it). Unset: the target's default, or the
    /// total if that is lower.
    pub max_discovery_sessions_per_address: Option<usize>,
    /// The target's MaxRecvDataSegmentLength.
    pub max_recv_data_segment_length: u32,
    /// HeaderDigest policy: "allow" (the initiator chooses) or "require" (CRC32C only).
    pub header_digest: String,
    /// DataDigest policy: "allow" or "require".
    pub data_digest: String,
    /// Directory for state that must survive restarts (persistent
    /// reservations with APTPL, ALUA states initiators set with SET TARGET
    /// PORT GROUPS). Without it APTPL=1 is refused and such states last
    /// until the daemon stops.
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
    /// WRITE data all connections together may hold at once (e.g. "4G"; at
    /// least `write_budget`); commands beyond it are answered TASK SET
    /// FULL, or BUSY on a session with no other command. Unset: an eighth
    /// of the daemon's memory, at least `write_budget`.
    pub write_budget_total: Option<String>,
    /// READ data one connection may hold before it is sent (e.g. "256M");
    /// READs beyond it wait until the initiator has taken earlier data.
    pub read_budget: String,
    /// READ data all connections together may hold before it is sent
    /// (e.g. "4G"; at least `read_budget`); READs beyond it wait. Unset: an
    /// eighth of the daemon's memory, at least `read_budget`.
    pub read_budget_total: Option<String>,
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
    /// Memory the RAM LUNs may hold together (e.g. "16G"; unset: three
    /// quarters of the machine's memory, or of its control group's limit
    /// where that is lower). RAM LUNs are thin: a write that needs memory
    /// past it fails with DATA PROTECT, SPACE ALLOCATION FAILED WRITE
    /// PROTECT instead of taking memory the machine may not have.
    pub ram_limit: Option<String>,
}

impl Default for FabricConfig {
    fn default() -> Self {
        let d = FabricSettings::default();
        FabricConfig {
            queue_depth: d.queue_depth,
            nop_interval_secs: d.nop_interval.map_or(0, |i| i.as_secs()),
            nop_timeout_secs: d.nop_timeout.as_secs(),
            logout_grace_secs: d.logout_grace.as_secs(),
            login_timeout_secs: d.login_timeout.as_secs(),
            login_deadline_secs: d.login_deadline.as_secs(),
            max_logins_in_progress: d.max_logins_in_progress,
            max_logins_in_progress_per_address: None,
            max_discovery_sessions: d.max_discovery_sessions,
            max_discovery_sessions_per_address: None,
            max_recv_data_segment_length: 262_144,
            header_digest: "allow".into(),
            data_digest: "allow".into(),
            state_dir: None,
            rdma_listen: None,
            rdma_backend: "soft".into(),
            rdma_device: None,
            write_budget: "256M".into(),
            write_budget_total: None,
            read_budget: "256M".into(),
            read_budget_total: None,
            zero_copy_send: d.zero_copy_send,
            local_copy_sends: d.local_copy_sends,
            busy_poll_us: DEFAULT_BUSY_POLL_US,
            connection_threads: None,
            data_pdu_in_order: d.data_pdu_in_order,
            ram_limit: None,
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
    pub listen: Vec<Located<String>>,
    /// ALUA state of the group's port for every target in it:
    /// "active_optimized" (default), "active_non_optimized" (serves I/O,
    /// not preferred) or "standby" (media commands get NOT READY, LOGICAL
    /// UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE).
    pub alua_state: Option<Located<String>>,
    /// Also accept standard iSER (RFC 7145) on every listen address: an RDMA
    /// CM listener on the same address and port, with `[fabric] rdma_backend`
    /// and `rdma_device` as the RDMA provider (Linux initiators need "verbs").
    #[serde(default)]
    pub iser: bool,
    /// iSER listeners at other addresses than `listen` (required with the
    /// soft provider, which runs over TCP and cannot share the iSCSI port).
    #[serde(default)]
    pub iser_listen: Vec<Located<String>>,
}

/// A CHAP credential.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct ChapConfig {
    /// CHAP_N.
    pub user: String,
    /// Secret (12 to 255 characters; RFC 7143 asks for at least 96 bits).
    pub secret: Located<String>,
}

/// A per-initiator CHAP credential.
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct InitiatorChapConfig {
    /// The initiator's iSCSI name.
    pub initiator: Located<String>,
    /// CHAP_N it uses.
    pub user: String,
    /// Its secret.
    pub secret: Located<String>,
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
    pub chap_algorithms: Option<Located<Vec<String>>>,
}

/// `[[target]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetDef {
    /// iSCSI name.
    pub name: Located<String>,
    /// TargetAlias.
    pub alias: Option<String>,
    /// Portal group tags; all groups when omitted.
    pub portal_groups: Option<Vec<Located<u16>>>,
    /// Explicit ALUA: initiators may change this target's ALUA states with
    /// SET TARGET PORT GROUPS (a multipath host failing an active/passive
    /// pair over asks the passive group to become active). Off by default:
    /// only the configuration sets states. The states an initiator sets
    /// show in `config.show` as `[target.alua_state]` and stay until a
    /// change or reload of the configuration sets others.
    #[serde(default)]
    pub explicit_alua: bool,
    /// This target's ALUA state in some of its portal groups, by tag
    /// (`[target.alua_state]`, e.g. `2 = "active_optimized"`), in place of
    /// the portal group's `alua_state`.
    pub alua_state: Option<BTreeMap<String, Located<String>>>,
    /// Initiator names allowed; any initiator when omitted.
    pub allow: Option<Vec<Located<String>>>,
    /// One-way CHAP credentials any initiator may use.
    #[serde(default)]
    pub chap: Vec<ChapConfig>,
    /// Credentials for particular initiators.
    #[serde(default)]
    pub initiator_chap: Vec<InitiatorChapConfig>,
    /// The target's own credential for mutual CHAP.
    pub mutual_chap: Option<ChapConfig>,
    /// CHAP algorithms in order of preference.
    pub chap_algorithms: Option<Located<Vec<String>>>,
    /// Logical units.
    #[serde(default, rename = "lun")]
    pub luns: Vec<Located<LunDef>>,
}

/// `[[target.lun]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LunDef {
    /// LUN number (0..16383).
    pub id: u16,
    /// "ram", "file", "striped" (RAID0 over `paths`) or "null" (reads
    /// zeros, discards writes: benchmarks).
    pub backstore: Located<String>,
    /// File and striped LUNs: "cached" (page cache, the default) or
    /// "direct" (O_DIRECT).
    pub mode: Option<Located<String>>,
    /// File or block device path (file backstore).
    pub path: Option<Located<PathBuf>>,
    /// Striped LUNs: the member files (at least 2), in layout order: stripe
    /// chunk k lives on member k mod N, so the order must never change.
    pub paths: Option<Located<Vec<PathBuf>>>,
    /// Striped LUNs: the stripe chunk, a power of two from the logical
    /// block size to "16M" ("64K" by default; at least "4K" in direct mode).
    pub stripe_chunk: Option<Located<String>>,
    /// Size, e.g. "1G", "512M", "1048576" (required for ram; creates or grows files).
    pub size: Option<Located<String>>,
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
    pub sanitize_min_seconds: Option<Located<u64>>,
    /// Fault injection: start with the LUN stalled (media commands wait
    /// before the backstore until released with the control socket's
    /// `lun.stall`).
    #[serde(default)]
    pub stalled: bool,
    /// Logical block size: 512 (default) or 4096.
    pub block_size: Option<Located<u32>>,
    /// Unit serial number; derived from `uuid` or, without one, from the
    /// target name and LUN when omitted.
    pub serial: Option<String>,
    /// The LUN's UUID: its unit serial number (VPD 80h) and NAA identifier
    /// (VPD 83h) derive from it, so they stay the same when the LUN moves to
    /// another target name or LUN number. Without it both derive from the
    /// target name and the LUN number (deterministic, stable across
    /// restarts and portals, but changed by a rename). Generate one with
    /// `uuidgen` and keep it with the data.
    pub uuid: Option<Located<String>>,
    /// Physical block size reported in READ CAPACITY (16): equal to
    /// `block_size` (default) or a power-of-two multiple of it, e.g. 4096.
    pub physical_block_size: Option<Located<u32>>,
    /// File LUNs: READs use synchronized sends: read by the I/O
    /// engine in `sync_chunk` chunks submitted together, each Data-In PDU
    /// sent as soon as its bytes are read. Off by default (serial: read
    /// all, then send). A `mode = "direct"` LUN always reads through the
    /// engine into registered buffers; there `false` means the serial
    /// baseline on that path, `true` the synchronized sends.
    pub sync_send: Option<Located<bool>>,
    /// Chunk size for `sync_send`, e.g. "64K" (default), 4K to 1M.
    pub sync_chunk: Option<Located<String>>,
    /// File LUNs: double-buffered WRITEs: each `sync_chunk` chunk
    /// of a WRITE goes to disk (I/O engine, registered buffer) while the
    /// next one arrives. Off by default (gather the whole WRITE, then
    /// write it).
    pub sync_write: Option<Located<bool>>,
    /// File LUNs in cached mode without `sync_send`: READ payloads go from
    /// the page cache to the socket by sendfile (default true; the copy
    /// path is used anyway on connections with DataDigest). false: the
    /// copy path (read into a buffer, then send), the baseline.
    pub zero_copy: Option<Located<bool>>,
    /// WRITE ATOMIC(16) (SBC-4 atomic writes: every block or none, also
    /// across a crash). Default: on where the backstore can keep that
    /// promise: RAM and null LUNs (in process) and writable file LUNs on a
    /// regular file (through a write-ahead journal, `atomic_journal`).
    /// false: never offered. true: refused where it cannot be kept
    /// (striped and read-only LUNs, a block device without
    /// `atomic_journal` whose kernel offers no untorn writes). A block
    /// device whose kernel offers them (`mode = "direct"`, statx
    /// STATX_WRITE_ATOMIC) has them by default, by `RWF_ATOMIC`, of
    /// `atomic_unit` bytes.
    pub atomic_writes: Option<Located<bool>>,
    /// File LUNs: where the atomic-write journal lives (default: the
    /// backing file's path with `.atomic-journal` appended). It must stay
    /// with the backing file: unfinished atomic writes are replayed from it
    /// when the LUN opens.
    pub atomic_journal: Option<Located<PathBuf>>,
    /// File LUNs on a block device whose kernel offers untorn writes (no
    /// `atomic_journal`): the one size every WRITE ATOMIC(16) has, at LBAs
    /// aligned to it, a power of two within the device's atomic write
    /// units such as "8K" (default "16K", within the device's range). The
    /// kernel takes only such writes, so the LUN offers only that one.
    pub atomic_unit: Option<Located<String>>,
    /// T10 protection information (SBC-3 4.18): "type1" formats the LUN
    /// with Type 1 protection: an 8-byte tuple (CRC guard, application tag,
    /// reference tag) kept beside every block, generated for each write,
    /// checked on each read, so a block changed behind the target's back
    /// is reported (ABORTED COMMAND, LOGICAL BLOCK GUARD CHECK FAILED)
    /// instead of returned; initiators that speak protection information
    /// send and receive the tuples (RDPROTECT, WRPROTECT, VRPROTECT).
    /// "none" (default). RAM and file LUNs; not with sync_send, sync_write
    /// or atomic writes.
    pub protection: Option<Located<String>>,
    /// File LUNs with `protection`: the file that keeps the tuples, 8
    /// bytes per block, created sparse (default: the backing file's path
    /// with `.protection` appended). It belongs with the backing file:
    /// without it every block reads unchecked.
    pub protection_file: Option<Located<PathBuf>>,
    /// Thin provisioning soft threshold (SBC-4 4.7.3.7), a size such as
    /// "2G": when the space this LUN's writes allocate from falls below it
    /// (the free space of the file system under a file or striped LUN, what
    /// `[fabric] ram_limit` still allows the RAM LUNs), every initiator
    /// hears THIN PROVISIONING SOFT THRESHOLD REACHED once, while writes
    /// still succeed; it warns again only after the space rose above it.
    /// Looked at once a second. Off by default; not for the null store or a
    /// block device, whose space does not run out under them. Changed live
    /// by a reload (SIGHUP, `config.reload`), on the running unit.
    pub low_space_threshold: Option<Located<String>>,
    /// Quality of service: at most this many media commands (READ, WRITE,
    /// UNMAP, ...) per second; a command over it waits its turn before it
    /// starts. Changed live by a reload or `lun.limit`.
    pub iops_limit: Option<Located<u64>>,
    /// Quality of service: at most this many bytes of READ and WRITE data
    /// per second, e.g. "100M".
    pub bandwidth_limit: Option<Located<String>>,
    /// Quality of service of a shared LUN: at most this many media
    /// commands per second from each initiator (its sessions together).
    pub initiator_iops_limit: Option<Located<u64>>,
    /// Quality of service of a shared LUN: at most this many bytes per
    /// second from each initiator.
    pub initiator_bandwidth_limit: Option<Located<String>>,
}

/// The file under `[fabric] state_dir` that keeps the saved persistent
/// reservations of LUN `id` of target `name`: the name with every
/// character a file name might not hold as '_'. (Two targets whose names
/// differ only there would share it: [`Claims`] refuses that.)
fn pr_state_file_name(name: &str, id: u16) -> String {
    format!("{}.lun{id}.pr", file_safe(name))
}

/// The file under `[fabric] state_dir` that keeps the ALUA states
/// initiators set on target `name` with SET TARGET PORT GROUPS (named as
/// [`pr_state_file_name`] names its files).
fn alua_state_file_name(name: &str) -> String {
    format!("{}.alua", file_safe(name))
}

/// `name` with every character a file name might not hold as '_'.
fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
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
    let lower = name.to_ascii_lowercase();
    if let Some(dir) = state_dir {
        let unit = format!("target {name}");
        let line = (!ctx.rendered).then(|| ctx.line(t.name.span().start));
        let path = dir.join(alua_state_file_name(name));
        if let Err(m) = claims.file(&unit, line, &path, FileUse::AluaStates) {
            report.errors.push(ctx.err(t.name.span(), "target.name", m));
        }
    }
    let mut ids = std::collections::HashSet::new();
    for l in &t.luns {
        let lspan = l.span();
        let l = l.get_ref();
        if !ids.insert(l.id) {
            // Said as what it is, not as the identity or files the two definitions share.
            report.errors.push(ctx.err(
                lspan,
                "target.lun.id",
                format!("LUN {} is defined twice in {name}", l.id),
            ));
            continue;
        }
        let unit = format!("LUN {} of {name}", l.id);
        // (A rendering's lines mean nothing to the reader: the unit's name says it.)
        let line = (!ctx.rendered).then(|| ctx.line(lspan.start));
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
        let files: Vec<_> = files.into_iter().filter(used).collect();
        let held_open = |h: &&HeldFile<'_>| h.what != FileUse::Reservations;
        // A unit that keeps serving holds the files it held when last checked.
        let kept = ctx
            .known_files
            .filter(|_| ctx.keeps_unit(&lower, l.id))
            .and_then(|k| k.of(&lower, l.id))
            .filter(|keys| keys.len() == files.iter().filter(held_open).count());
        let mut kept = kept.into_iter().flatten();
        let mut open_keys = Vec::new();
        let mut claimed = true;
        for held in &files {
            let known = if held_open(&held) { kept.next() } else { None };
            let key = known.cloned().unwrap_or_else(|| FileKey::of(&held.path));
            if held_open(&held) {
                open_keys.push(key.clone());
            }
            if let Err(m) = claims.file_at(&unit, line, &held.path, held.what, key) {
                let span = held.span.clone().unwrap_or_else(|| t.name.span());
                report.errors.push(ctx.err(span, held.field, m));
                claimed = false;
                break; // its other files (a journal named after it) say no more
            }
        }
        if claimed {
            report
                .known_files
                .insert_existing(lower.clone(), l.id, open_keys);
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
/// its atomic-write journal unless atomic writes are off, its protection
/// information file when it is protected, and its saved reservations (at
/// `pr_state_path`).
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
            // The tuples are written into this file as the blocks are: a
            // file another LUN holds would have its data overwritten.
            let protected = l
                .protection
                .as_ref()
                .is_some_and(|p| p.get_ref() == "type1");
            match (&l.protection_file, protected) {
                (_, false) => {}
                (Some(f), true) => held.push(named(
                    f.get_ref(),
                    FileUse::ProtectionInformation,
                    "target.lun.protection_file",
                    f.span(),
                )),
                (None, true) => {
                    held.push(HeldFile {
                        path: Cow::Owned(lun::default_protection_file(path.get_ref())),
                        what: FileUse::ProtectionInformation,
                        field: "target.lun.protection",
                        span: l.protection.as_ref().map(Located::span),
                    });
                }
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

/// How a file LUN's WRITE ATOMIC(16) is kept: not at all, by the kernel's
/// untorn writes of one size, or through a journal (at that path, named by
/// that field).
enum AtomicPlan {
    None,
    Device(u32),
    Journal(PathBuf, &'static str),
}

/// Decides how file LUN `l` (of `capacity` bytes, whose kernel offers
/// `units` of untorn writes) keeps its atomic writes, refusing what cannot
/// be kept, without changing anything: the build and a dry run decide
/// alike.
fn atomic_plan(
    ctx: &Ctx<'_>,
    l: &LunDef,
    lspan: std::ops::Range<usize>,
    path: &std::path::Path,
    capacity: u64,
    units: Option<DeviceAtomicUnits>,
    atomic_writes: Option<bool>,
) -> Result<AtomicPlan, ConfigError> {
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
    let plan = chosen_atomic_plan(
        ctx,
        l,
        lspan.clone(),
        path,
        units,
        atomic_writes,
        &journal,
        field,
    )?;
    if matches!(plan, AtomicPlan::Journal(..)) {
        return Ok(plan);
    }
    // Served without the journal, the blocks of an atomic write a crash left
    // unfinished stay torn, and a later start with it would replay them over
    // everything written since: such a file is not served until replayed.
    let n = blockwire_target::backstore::journal::unfinished(&journal, capacity)
        .map_err(|e| ctx.err(lspan.clone(), field, e.to_string()))?;
    if n > 0 {
        let how = if l.read_only {
            "open the LUN writable once to replay them"
        } else {
            "start it once with its atomic writes on and this journal to replay them"
        };
        return Err(ctx.err(
            lspan,
            field,
            format!(
                "{} holds {n} unfinished atomic write(s) for {}: {how}",
                journal.display(),
                path.display()
            ),
        ));
    }
    Ok(plan)
}

/// How a file LUN makes its atomic writes, as its definition asks (see
/// [`atomic_plan`]).
#[allow(clippy::too_many_arguments)]
fn chosen_atomic_plan(
    ctx: &Ctx<'_>,
    l: &LunDef,
    lspan: std::ops::Range<usize>,
    path: &std::path::Path,
    units: Option<DeviceAtomicUnits>,
    atomic_writes: Option<bool>,
    journal: &std::path::Path,
    field: &'static str,
) -> Result<AtomicPlan, ConfigError> {
    if l.read_only {
        return Ok(AtomicPlan::None);
    }
    // A file the change would create is a regular file (a dry run decides
    // before it exists).
    let regular = std::fs::metadata(path).map_or(true, |m| m.is_file());
    if !regular && l.atomic_journal.is_none() {
        return device_atomic_plan(ctx, l, lspan, path, units, atomic_writes);
    }
    if let Some(u) = &l.atomic_unit {
        return Err(ctx.err(
            u.span(),
            "target.lun.atomic_unit",
            "atomic_unit is for a block device whose kernel makes the atomic writes; this LUN's go through its journal, which takes any whole blocks: remove atomic_unit",
        ));
    }
    let wanted = match atomic_writes {
        Some(false) => false,
        Some(true) => true,
        None => regular || l.atomic_journal.is_some(),
    };
    Ok(if wanted {
        AtomicPlan::Journal(journal.to_owned(), field)
    } else {
        AtomicPlan::None
    })
}

/// Turns on the atomic writes [`atomic_plan`] chose for the opened `fb`.
fn file_atomic_journal(
    ctx: &Ctx<'_>,
    l: &LunDef,
    lspan: std::ops::Range<usize>,
    path: &std::path::Path,
    fb: FileBackstore,
    atomic_writes: Option<bool>,
) -> Result<FileBackstore, ConfigError> {
    let plan = atomic_plan(
        ctx,
        l,
        lspan.clone(),
        path,
        fb.size(),
        fb.device_atomic_units(),
        atomic_writes,
    )?;
    let (journal, field) = match plan {
        AtomicPlan::None => return Ok(fb),
        AtomicPlan::Device(unit) => {
            return fb
                .with_device_atomic_writes(unit)
                .map_err(|e| ctx.err(lspan, "target.lun.atomic_writes", e.to_string()))
        }
        AtomicPlan::Journal(j, field) => (j, field),
    };
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

/// A dry run of file LUN `l`: what [`file_atomic_journal`] would refuse,
/// found without opening anything for writing (a journal that exists is
/// read; a block device's untorn writes are asked of a read-only open).
fn dry_run_atomic_writes(
    ctx: &Ctx<'_>,
    l: &LunDef,
    lspan: std::ops::Range<usize>,
    path: &std::path::Path,
    capacity: u64,
    direct: bool,
    atomic_writes: Option<bool>,
) -> Result<(), ConfigError> {
    let units = (direct && !l.read_only)
        .then(|| {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
                .open(path)
                .ok()
        })
        .flatten()
        .and_then(|f| DeviceAtomicUnits::probe(&f));
    if let AtomicPlan::Journal(journal, field) =
        atomic_plan(ctx, l, lspan.clone(), path, capacity, units, atomic_writes)?
    {
        blockwire_target::backstore::journal::check_openable(&journal, capacity)
            .map_err(|e| ctx.err(lspan, field, e.to_string()))?;
    }
    Ok(())
}

/// A file LUN on a block device without a journal: WRITE ATOMIC(16) by the
/// kernel's untorn writes where it offers them (by default), of one size
/// (`atomic_unit`; see `blockwire_target::backstore::device_atomic`).
fn device_atomic_plan(
    ctx: &Ctx<'_>,
    l: &LunDef,
    lspan: std::ops::Range<usize>,
    path: &std::path::Path,
    units: Option<DeviceAtomicUnits>,
    atomic_writes: Option<bool>,
) -> Result<AtomicPlan, ConfigError> {
    if atomic_writes == Some(false) {
        return match &l.atomic_unit {
            Some(u) => Err(ctx.err(
                u.span(),
                "target.lun.atomic_unit",
                "this LUN offers no atomic writes (atomic_writes = false, or protection): remove atomic_unit",
            )),
            None => Ok(AtomicPlan::None),
        };
    }
    let Some(units) = units else {
        let field = match (&l.atomic_unit, atomic_writes) {
            (Some(u), _) => Some((u.span(), "target.lun.atomic_unit")),
            (None, Some(true)) => Some((lspan, "target.lun.atomic_writes")),
            (None, _) => None,
        };
        return match field {
            // Nothing asked for: no atomic writes, as before the kernel had them.
            None => Ok(AtomicPlan::None),
            Some((span, field)) => Err(ctx.err(
                span,
                field,
                format!(
                    "{} is a block device the kernel offers no untorn writes for (statx STATX_WRITE_ATOMIC; they need mode = \"direct\" and a device with atomic write units): give its atomic-write journal a place with atomic_journal = \"...\" (on another device), or remove {}",
                    path.display(),
                    field.trim_start_matches("target.lun.")
                ),
            )),
        };
    };
    let unit = match &l.atomic_unit {
        None => u64::from(units.default_unit()),
        Some(u) => parse_size(u.get_ref()).ok_or_else(|| {
            ctx.err(
                u.span(),
                "target.lun.atomic_unit",
                format!("{:?} is not a size (e.g. \"16K\")", u.get_ref()),
            )
        })?,
    };
    let block = u64::from(l.block_size.as_ref().map_or(512, |b| *b.get_ref()));
    let max = u64::from(blockwire_target::scsi::MAX_TRANSFER_BYTES);
    let why = if !units.takes(u32::try_from(unit).unwrap_or(0)) {
        Some(format!(
            "the kernel takes untorn writes of {} of a power of two from {} to {} bytes, not {unit}",
            path.display(),
            units.min,
            units.max
        ))
    } else if !unit.is_multiple_of(block) {
        Some(format!(
            "an atomic write of {unit} bytes is not whole blocks of {block} bytes"
        ))
    } else if unit > max {
        Some(format!(
            "an atomic write of {unit} bytes is longer than one command's data ({max} bytes)"
        ))
    } else {
        None
    };
    let Some(why) = why else {
        return Ok(AtomicPlan::Device(unit as u32));
    };
    let (span, field) = match (&l.atomic_unit, atomic_writes) {
        (Some(u), _) => (u.span(), "target.lun.atomic_unit"),
        (None, Some(true)) => (lspan, "target.lun.atomic_writes"),
        (None, _) => {
            // Nothing asked for: no atomic writes rather than no LUN.
            tracing::warn!(path = %path.display(), reason = %why, "no atomic writes for this LUN (set atomic_unit to a size the device and the block size allow)");
            return Ok(AtomicPlan::None);
        }
    };
    Err(ctx.err(
        span,
        field,
        format!("{why}; set atomic_unit to a power of two the device takes"),
    ))
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
    /// The iSNS server to register with (`[isns]`).
    pub isns: Option<IsnsSettings>,
    /// `[fabric] ram_limit` in bytes (unset: the budget's default).
    pub ram_limit: Option<u64>,
    /// The sizes of the RAM LUNs, added up (0 with `--no-disk`).
    pub ram_lun_bytes: u64,
    /// The keys of the files each unit holds open, as the check took them
    /// (for the next live change: see [`KnownFiles`]).
    pub known_files: KnownFiles,
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
/// it has any (several joined by "; "); for an error it leaves without
/// words (as toml 0.8 left a control character in a comment), what stands
/// at the error's column.
pub(crate) fn syntax_message(text: &str, e: &toml::de::Error) -> String {
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
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

struct Ctx<'a> {
    file: &'a str,
    text: &'a str,
    /// Where each line of `text` starts: every unit's line is looked up, and a count of
    /// newlines from the start each time would cost the square of the file's length.
    line_starts: Vec<usize>,
    no_disk: bool,
    /// `--check`: build nothing that touches the disk (no file created,
    /// grown or opened for writing, no directory created).
    dry_run: bool,
    /// A live change's dry run: new LUNs' existing files and devices are
    /// opened and closed again, as the change would open them (`probe`).
    /// `--check` opens nothing.
    probe_files: bool,
    /// Units already serving, by lower-case target name and LUN: a live
    /// change keeps them (their data, reservations and sessions) instead of
    /// opening their storage again.
    reuse: Option<&'a Reuse>,
    /// The keys of the files of the units that keep serving, as the check
    /// of the running configuration took them.
    known_files: Option<&'a KnownFiles>,
    /// The text is a rendering of the running document (a control-socket
    /// change), not a file: its line numbers are nobody's to look up.
    rendered: bool,
}

/// Units a live change keeps, by lower-case target name and LUN.
pub type Reuse = std::collections::HashMap<(String, u16), Arc<LogicalUnit>>;

/// How [`TargetConfig::from_str_reusing`] builds a live change's
/// configuration.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rebuild<'a> {
    /// The LUNs that keep their running units (nothing of theirs is
    /// opened, created or grown); every other LUN is built.
    pub reuse: Option<&'a Reuse>,
    /// The keys of the files of the running units, as the check of the
    /// running configuration took them (see [`KnownFiles`]).
    pub known_files: Option<&'a KnownFiles>,
    /// The text is a rendering of the running document, not a file: its
    /// lines go unnamed in messages.
    pub rendered: bool,
    /// A dry run: the new LUNs get stand-ins, as `--check` builds them, and
    /// nothing on disk is created, grown or opened for writing.
    pub dry_run: bool,
}

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

/// Byte offsets where the lines of `text` start (the first at 0).
fn line_starts(text: &str) -> Vec<usize> {
    std::iter::once(0)
        .chain(text.match_indices('\n').map(|(i, _)| i + 1))
        .collect()
}

impl<'a> Ctx<'a> {
    /// The context of a live change's check and build of `text` (empty: a
    /// document read as such, see [`TargetConfig::from_doc_reusing`]).
    fn for_rebuild(file: &'a str, text: &'a str, opts: LoadOptions, how: Rebuild<'a>) -> Ctx<'a> {
        Ctx {
            file,
            text,
            line_starts: line_starts(text),
            no_disk: opts.no_disk,
            dry_run: how.dry_run,
            probe_files: how.dry_run,
            reuse: how.reuse,
            known_files: how.known_files,
            rendered: how.rendered,
        }
    }

    /// Whether LUN `id` of the target named `lower` (in lower case) keeps
    /// its running unit in this live change.
    fn keeps_unit(&self, lower: &str, id: u16) -> bool {
        self.reuse
            .is_some_and(|r| r.contains_key(&(lower.to_owned(), id)))
    }

    /// 1-based line of a byte offset, as [`line_of`] counts it.
    fn line(&self, offset: usize) -> usize {
        let offset = offset.min(self.text.len());
        // Lines starting at or before `offset`; a line that starts exactly at it (just
        // after a newline at offset - 1) counts, as that newline lies before `offset`.
        self.line_starts.partition_point(|&start| start <= offset)
    }

    fn err(
        &self,
        span: std::ops::Range<usize>,
        field: &str,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            file: self.file.to_owned(),
            line: self.line(span.start),
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
    /// The keys of the files each unit holds open, as this check took them.
    pub known_files: KnownFiles,
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
pub const EXAMPLE_CONFIG: &str = include_str!("../../../examples/target.toml");

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
            line_starts: line_starts(text),
            no_disk: opts.no_disk,
            dry_run: true,
            probe_files: false,
            reuse: None,
            known_files: None,
            rendered: false,
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
        Self::from_str_reusing(file, text, opts, Rebuild::default()).map(|(built, _)| built)
    }

    /// [`TargetConfig::from_str_with`] for a live change (see [`Rebuild`]),
    /// with the notices of what building does on disk (files created or
    /// grown), in line order.
    pub fn from_str_reusing(
        file: &str,
        text: &str,
        opts: LoadOptions,
        how: Rebuild<'_>,
    ) -> Result<(Built, Vec<ConfigError>), ConfigError> {
        let config = Self::parse(file, text)?;
        config.check_then_build(&Ctx::for_rebuild(file, text, opts, how))
    }

    /// [`TargetConfig::from_str_reusing`] for a live change that is a
    /// document and was never text (a control-socket change), read from
    /// the document itself: rendering it only to read it back would cost
    /// more than the rest of the change, and grow with the configuration.
    /// It is checked and built as a rendering of it would be, with no line
    /// to name; `None` where anything is at fault (nothing built is kept),
    /// so that the caller reads a rendering for a message that names the
    /// place (the check touches nothing, and a build that failed leaves
    /// only what building the rendering does again: files created or
    /// grown, opened and closed).
    pub fn from_doc_reusing(
        file: &str,
        doc: &toml::Table,
        opts: LoadOptions,
        how: Rebuild<'_>,
    ) -> Option<(Built, Vec<ConfigError>)> {
        let config: TargetConfig = toml::Value::Table(doc.clone()).try_into().ok()?;
        let how = Rebuild {
            rendered: true,
            ..how
        };
        config
            .check_then_build(&Ctx::for_rebuild(file, "", opts, how))
            .ok()
    }

    /// Checks the configuration without side effects first, so that one
    /// that would fail on a later field has not created or grown any file
    /// yet, then builds it; the first error in line order, or what was built
    /// with the notices of what building did on disk, in line order.
    fn check_then_build(self, ctx: &Ctx<'_>) -> Result<(Built, Vec<ConfigError>), ConfigError> {
        let mut report = self.validate(ctx);
        if !report.errors.is_empty() {
            report.errors.sort_by_key(|e| e.line);
            return Err(report.errors.swap_remove(0));
        }
        report.notices.sort_by_key(|e| e.line);
        let mut built = self.build(ctx, None)?;
        built.known_files = std::mem::take(&mut report.known_files);
        Ok((built, report.notices))
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
        let ram_limit = ram_limit(f, ctx)?;
        let ram_lun_bytes = if ctx.no_disk {
            0
        } else {
            self.targets
                .iter()
                .flat_map(|t| &t.get_ref().luns)
                .map(Located::get_ref)
                .filter(|l| l.backstore.get_ref() == "ram")
                .filter_map(|l| l.size.as_ref().and_then(|s| parse_size(s.get_ref())))
                .sum()
        };

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
                Some(s) => alua_state_named(&ctx, s, "portal_group.alua_state")?,
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
        // Names seen, in lower case (iSCSI names compare without regard to case): a scan
        // of the targets built so far for each would cost the square of their number.
        let mut names = std::collections::HashSet::new();
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
            if !names.insert(lower.clone()) {
                return Err(ctx.err(
                    t.name.span(),
                    "target.name",
                    format!("target {name} is defined twice"),
                ));
            }
            let groups = match &t.portal_groups {
                None => portal_groups.iter().map(|g| g.tag).collect(),
                // An empty list would serve the target through no portal,
                // yet the login admits a target without groups through any
                // (and SendTargets lists no address for it): refused.
                Some(tags) if tags.is_empty() => {
                    return Err(ctx.err(
                        t.name.span(),
                        "target.portal_groups",
                        format!(
                            "target {name} lists no portal group: list the tags it is served \
                             through, or leave portal_groups out to serve it through all"
                        ),
                    ));
                }
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
            let own_alua = target_alua_states(&ctx, &t, &name, &groups)?;
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
            let mut ids = std::collections::HashSet::new();
            let mut data_paths = Vec::new();
            let mut qos = Vec::new();
            for l in &t.luns {
                let lspan = l.span();
                let l = l.get_ref();
                if l.id > 16383 {
                    return Err(ctx.err(lspan, "target.lun.id", "must be between 0 and 16383"));
                }
                if !ids.insert(l.id) {
                    return Err(ctx.err(
                        lspan,
                        "target.lun.id",
                        format!("LUN {} is defined twice in {name}", l.id),
                    ));
                }
                let (unit, policy, limits) =
                    lun::build_lun(ctx, f.state_dir.as_deref(), &name, l, lspan)?;
                luns.push((l.id, unit));
                if limits.is_limited() {
                    qos.push((l.id, limits));
                }
                if let Some(policy) = policy {
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
            // target is its name and TPGT); the first not in standby is
            // preferred. The target's own state in a group comes before
            // the group's.
            let mut luns = LunTable::new(luns).with_explicit_alua(t.explicit_alua);
            if let Some(dir) = f.state_dir.as_ref() {
                luns = luns.with_alua_state_file(dir.join(alua_state_file_name(&name)));
            }
            luns.set_port_groups(
                groups
                    .iter()
                    .map(|&tag| TargetPortGroup {
                        id: tag,
                        state: own_alua
                            .iter()
                            .chain(&alua_states)
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
                // Checked trimmed (an iSCSI name has no spaces): kept so.
                acl: t.allow.map_or(Acl::Any, |names| {
                    Acl::Only(
                        names
                            .into_iter()
                            .map(|n| n.get_ref().trim().to_owned())
                            .collect(),
                    )
                }),
                auth,
                luns: Arc::new(luns),
                data_paths,
                qos,
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
        let isns = isns_settings(&self.isns, ctx)?;
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
            isns,
            ram_limit,
            ram_lun_bytes,
            known_files: KnownFiles::default(),
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
    // Timers of a day and more are no keepalive, and seconds near the
    // integer limit would overflow the clock they are added to.
    const TIMER_MAX_SECS: u64 = 86_400;
    if !(1..=TIMER_MAX_SECS).contains(&f.nop_timeout_secs) {
        errors.push(ctx.fabric_err(
            "nop_timeout_secs",
            format!(
                "{} is not between 1 and {TIMER_MAX_SECS}: it is how long an initiator may take \
                 no data, send none of a WRITE's awaited data, or answer no NOP-In, before its \
                 connection is cut (it cannot be off; \
                 nop_interval_secs = 0 turns the pings off)",
                f.nop_timeout_secs
            ),
        ));
    }
    for (key, secs) in [
        ("nop_interval_secs", f.nop_interval_secs),
        ("logout_grace_secs", f.logout_grace_secs),
    ] {
        if secs > TIMER_MAX_SECS {
            errors
                .push(ctx.fabric_err(key, format!("{secs} is more than {TIMER_MAX_SECS} (a day)")));
        }
    }
    if !(1..=LOGIN_TIMEOUT_MAX_SECS).contains(&f.login_timeout_secs) {
        errors.push(ctx.fabric_err(
            "login_timeout_secs",
            format!(
                "{} is not between 1 and {LOGIN_TIMEOUT_MAX_SECS}: it is how long an initiator \
                 may take to send its next login PDU",
                f.login_timeout_secs
            ),
        ));
    }
    if !(1..=TIMER_MAX_SECS).contains(&f.login_deadline_secs) {
        errors.push(ctx.fabric_err(
            "login_deadline_secs",
            format!(
                "{} is not between 1 and {TIMER_MAX_SECS}: it is how long a whole login may take",
                f.login_deadline_secs
            ),
        ));
    }
    // Each bound with its per-address share. Discovery sessions go up to
    // 65 535: a session is named by a TSIH of 16 bits, 0 being none.
    let d = FabricSettings::default();
    let mut share_of = |total: (&str, usize), most: usize, share: (&str, Option<usize>, usize)| {
        // A bound of 0 would refuse everyone; a share is at most the whole,
        // and one left unset is the default's, or the whole if that is less.
        if !(1..=most).contains(&total.1) {
            errors
                .push(ctx.fabric_err(total.0, format!("{} is not between 1 and {most}", total.1)));
        }
        match share.1 {
            Some(n) if !(1..=total.1).contains(&n) => {
                errors.push(ctx.fabric_err(
                    share.0,
                    format!("{n} is not between 1 and {} ({})", total.0, total.1),
                ));
                1
            }
            Some(n) => n,
            None => share.2.min(total.1),
        }
    };
    let logins_per_address = share_of(
        ("max_logins_in_progress", f.max_logins_in_progress),
        LOGINS_IN_PROGRESS_MAX,
        (
            "max_logins_in_progress_per_address",
            f.max_logins_in_progress_per_address,
            d.max_logins_in_progress_per_address,
        ),
    );
    let discovery_per_address = share_of(
        ("max_discovery_sessions", f.max_discovery_sessions),
        65_535,
        (
            "max_discovery_sessions_per_address",
            f.max_discovery_sessions_per_address,
            d.max_discovery_sessions_per_address,
        ),
    );
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
    let mut total = |key: &'static str, value: &Option<String>, share: u64| match value {
        Some(v) => budget(key, v),
        None => blockwire_target::iscsi::default_budget_total(share),
    };
    let write_budget_total_bytes = total(
        "write_budget_total",
        &f.write_budget_total,
        write_budget_bytes,
    );
    let read_budget_total_bytes =
        total("read_budget_total", &f.read_budget_total, read_budget_bytes);
    for (key, total, total_text, share, share_text) in [
        (
            "write_budget_total",
            write_budget_total_bytes,
            &f.write_budget_total,
            write_budget_bytes,
            &f.write_budget,
        ),
        (
            "read_budget_total",
            read_budget_total_bytes,
            &f.read_budget_total,
            read_budget_bytes,
            &f.read_budget,
        ),
    ] {
        // A value that did not parse was reported already.
        let parsed = |text: &str| parse_size(text).is_some_and(|n| n >= 1 << 20);
        let Some(total_text) = total_text else {
            continue;
        };
        if total < share && parsed(total_text) && parsed(share_text) {
            let share_key = key.trim_end_matches("_total");
            errors.push(ctx.fabric_err(
                key,
                format!(
                    "{total_text:?} is less than {share_key} ({share_text:?}): one connection \
                     could never hold its budget; raise {key} or lower {share_key}"
                ),
            ));
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let settings = FabricSettings {
        write_budget_bytes,
        write_budget_total_bytes,
        read_budget_bytes,
        read_budget_total_bytes,
        require_header_digest,
        require_data_digest,
        queue_depth: f.queue_depth,
        nop_interval: (f.nop_interval_secs > 0)
            .then(|| std::time::Duration::from_secs(f.nop_interval_secs)),
        nop_timeout: std::time::Duration::from_secs(f.nop_timeout_secs),
        logout_grace: std::time::Duration::from_secs(f.logout_grace_secs),
        login_timeout: std::time::Duration::from_secs(f.login_timeout_secs),
        login_deadline: std::time::Duration::from_secs(f.login_deadline_secs),
        max_logins_in_progress: f.max_logins_in_progress,
        max_logins_in_progress_per_address: logins_per_address,
        max_discovery_sessions: f.max_discovery_sessions,
        max_discovery_sessions_per_address: discovery_per_address,
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

/// `[fabric] ram_limit` in bytes, if set.
/// The shortest and longest registration periods taken: a period of a few
/// seconds would have the daemon refresh all the time; RFC 4171 §6.2.6
/// gives the field 32 bits, and a day is long enough for a server to keep a
/// dead entity.
const ISNS_PERIOD_SECS: std::ops::RangeInclusive<u32> = 30..=86_400;

fn isns_settings(i: &IsnsConfig, ctx: &Ctx<'_>) -> Result<Option<IsnsSettings>, ConfigError> {
    let Some(server) = &i.server else {
        // Settings of a registration that never happens are a mistake to
        // say, not to run without: most likely the server line was lost.
        let without_server = |span, field| {
            Err(ctx.err(
                span,
                field,
                "is set but isns.server is not: name the iSNS server to register with",
            ))
        };
        if let Some(e) = &i.entity {
            return without_server(e.span(), "isns.entity");
        }
        if let Some(p) = &i.registration_period_secs {
            return without_server(p.span(), "isns.registration_period_secs");
        }
        return Ok(None);
    };
    let server = crate::isns::server_address(server.get_ref())
        .map_err(|m| ctx.err(server.span(), "isns.server", m))?;
    let entity = match &i.entity {
        Some(e) => {
            let v = e.get_ref();
            // RFC 4171 §6.2.1: up to 255 bytes of UTF-8, NUL-terminated on the wire.
            if v.is_empty() || v.len() > 255 || v.contains('\0') {
                return Err(ctx.err(e.span(), "isns.entity", format!("{v:?}: give 1 to 255 bytes without NUL (the Entity Identifier, unique on the iSNS server)")));
            }
            v.clone()
        }
        None => crate::isns::default_entity(),
    };
    let period_secs = match &i.registration_period_secs {
        Some(p) if !ISNS_PERIOD_SECS.contains(p.get_ref()) => {
            return Err(ctx.err(
                p.span(),
                "isns.registration_period_secs",
                format!(
                    "{} is outside {}..={} seconds",
                    p.get_ref(),
                    ISNS_PERIOD_SECS.start(),
                    ISNS_PERIOD_SECS.end()
                ),
            ))
        }
        Some(p) => *p.get_ref(),
        None => crate::isns::DEFAULT_PERIOD_SECS,
    };
    Ok(Some(IsnsSettings {
        server,
        entity,
        period_secs,
    }))
}

fn ram_limit(f: &FabricConfig, ctx: &Ctx<'_>) -> Result<Option<u64>, ConfigError> {
    let Some(value) = &f.ram_limit else {
        return Ok(None);
    };
    match parse_size(value).filter(|&n| n >= 1 << 20) {
        Some(n) => Ok(Some(n)),
        None => Err(ctx.fabric_err(
            "ram_limit",
            format!(
                "{value:?} is not a size of at least 1M (write e.g. \"16G\"; unset, RAM LUNs \
                 may hold three quarters of the machine's memory)"
            ),
        )),
    }
}

/// The ALUA state `s` names, or an error at it that lists the names.
fn alua_state_named(
    ctx: &Ctx<'_>,
    s: &Located<String>,
    field: &str,
) -> Result<AluaState, ConfigError> {
    AluaState::from_name(s.get_ref()).ok_or_else(|| {
        ctx.err(
            s.span(),
            field,
            format!(
                "{:?} is not an ALUA state (use \"active_optimized\", \"active_non_optimized\" or \"standby\")",
                s.get_ref()
            ),
        )
    })
}

/// A target's `[target.alua_state]`: (tag, state) for each of its portal
/// groups it names.
fn target_alua_states(
    ctx: &Ctx<'_>,
    t: &TargetDef,
    name: &str,
    groups: &[u16],
) -> Result<Vec<(u16, AluaState)>, ConfigError> {
    let mut out = Vec::new();
    for (key, state) in t.alua_state.iter().flatten() {
        let tag = key
            .parse::<u16>()
            .ok()
            .filter(|tag| groups.contains(tag))
            .ok_or_else(|| {
                ctx.err(
                    state.span(),
                    "target.alua_state",
                    format!(
                        "{key:?} is not a portal group of target {name} (its groups: {}); \
                     the keys of [target.alua_state] are portal group tags",
                        groups
                            .iter()
                            .map(u16::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })?;
        out.push((tag, alua_state_named(ctx, state, "target.alua_state")?));
    }
    Ok(out)
}

fn secret(ctx: &Ctx<'_>, s: &Located<String>, field: &str) -> Result<String, ConfigError> {
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
            c.initiator.get_ref().trim().to_owned(),
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
mod tests;
