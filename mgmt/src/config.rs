//! The target's TOML configuration and its translation into the fabric's
//! catalog.
//!
//! Every error names the file, the line and the field, and says how to fix
//! it: a storage daemon that refuses to start must say why in one line.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use blockwire_target::backstore::{
    striped::check_stripe, Backstore, FileBackstore, FileMode, NullBackstore, RamBackstore,
    StripedBackstore,
};
use blockwire_target::iscsi::catalog::{
    Acl, AuthPolicy, Catalog, ChapSecret, PortalGroup, TargetEntry,
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
    /// WRITE data one connection may hold at once (e.g. "256M"); commands
    /// beyond it are answered TASK SET FULL.
    pub write_budget: String,
    /// Send large Data-In payloads with MSG_ZEROCOPY where the kernel
    /// allows it (default true); false: plain copying sends.
    pub zero_copy_send: bool,
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
            write_budget: "256M".into(),
            zero_copy_send: d.zero_copy_send,
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
    pub initiator: String,
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
    pub allow: Option<Vec<String>>,
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
    pub path: Option<PathBuf>,
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
    /// File LUNs: READs use synchronized sends (issue 7): read by the I/O
    /// engine in `sync_chunk` chunks submitted together, each Data-In PDU
    /// sent as soon as its bytes are read. Off by default (serial: read
    /// all, then send). A `mode = "direct"` LUN always reads through the
    /// engine into registered buffers; there `false` means the serial
    /// baseline on that path, `true` the synchronized sends.
    pub sync_send: Option<Spanned<bool>>,
    /// Chunk size for `sync_send`, e.g. "64K" (default), 4K to 1M.
    pub sync_chunk: Option<Spanned<String>>,
    /// File LUNs: double-buffered WRITEs (issue 7): each `sync_chunk` chunk
    /// of a WRITE goes to disk (I/O engine, registered buffer) while the
    /// next one arrives. Off by default (gather the whole WRITE, then
    /// write it).
    pub sync_write: Option<Spanned<bool>>,
    /// File LUNs in cached mode without `sync_send`: READ payloads go from
    /// the page cache to the socket by sendfile (default true; the copy
    /// path is used anyway on connections with DataDigest). false: the
    /// copy path (read into a buffer, then send), the baseline.
    pub zero_copy: Option<Spanned<bool>>,
}

/// A LUN whose READs go through the I/O engine path (registered buffers):
/// every `direct` file LUN, and cached ones with `sync_send = true`.
#[derive(Debug, Clone)]
pub struct SyncSendDef {
    /// Target name.
    pub target: String,
    /// LUN.
    pub lun: u16,
    /// The LUN's file.
    pub path: PathBuf,
    /// The backstore runs O_DIRECT (read the same way).
    pub direct: bool,
    /// Chunk size in bytes.
    pub chunk: usize,
    /// `Synchronized` with `sync_send = true`, else `Serial` (read every
    /// chunk, then send: the baseline of a direct LUN).
    pub mode: blockwire_target::datapath::Mode,
}

/// A cached file LUN whose READ payloads go by sendfile.
#[derive(Debug, Clone)]
pub struct SendfileDef {
    /// Target name.
    pub target: String,
    /// LUN.
    pub lun: u16,
    /// The LUN's file.
    pub path: PathBuf,
}

/// A LUN whose READs use the engine path from a prebuilt source: a striped
/// LUN (one stream per member), or any engine-path LUN under `--no-disk`
/// (pattern data).
#[derive(Debug, Clone)]
pub struct EngineSourceDef {
    /// Target name.
    pub target: String,
    /// LUN.
    pub lun: u16,
    /// What the engine reads.
    pub source: blockwire_target::datapath::Source,
    /// The source's files are O_DIRECT.
    pub direct: bool,
    /// Chunk size in bytes.
    pub chunk: usize,
    /// `Synchronized` with `sync_send = true`, else `Serial`.
    pub mode: blockwire_target::datapath::Mode,
}

/// How a configuration is turned into backstores.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// `--no-disk`: every LUN serves the no-disk pattern and drops writes;
    /// no backstore file is opened or created (benchmarks only).
    pub no_disk: bool,
}

/// A file LUN whose WRITEs are double-buffered (`sync_write = true`).
#[derive(Debug, Clone)]
pub struct SyncWriteDef {
    /// Target name.
    pub target: String,
    /// LUN.
    pub lun: u16,
    /// The LUN's file.
    pub path: PathBuf,
    /// The backstore runs O_DIRECT (write the same way).
    pub direct: bool,
    /// Chunk size in bytes (`sync_chunk`).
    pub chunk: usize,
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
    /// LUNs whose READs use the engine path (direct, or `sync_send = true`).
    pub sync_sends: Vec<SyncSendDef>,
    /// File LUNs with `sync_write = true` (double-buffered WRITEs).
    pub sync_writes: Vec<SyncWriteDef>,
    /// Cached file LUNs with `zero_copy` (default) and no `sync_send`.
    pub sendfiles: Vec<SendfileDef>,
    /// Engine-path LUNs with a prebuilt source (striped; all under `--no-disk`).
    pub engine_sources: Vec<EngineSourceDef>,
    /// Built with `--no-disk`: no LUN stores anything.
    pub no_disk: bool,
    /// The control socket's path (`[control] socket`).
    pub control_socket: Option<PathBuf>,
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

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())]
        .bytes()
        .filter(|&b| b == b'\n')
        .count()
        + 1
}

struct Ctx<'a> {
    file: &'a str,
    text: &'a str,
    no_disk: bool,
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
            message: message.into(),
        }
    }
}

impl TargetConfig {
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
        let config: TargetConfig = toml::from_str(text).map_err(|e| {
            let line = e.span().map_or(0, |s| line_of(text, s.start));
            ConfigError {
                file: file.to_owned(),
                line,
                field: "syntax".into(),
                message: e.message().to_owned(),
            }
        })?;
        config.build(
            &Ctx {
                file,
                text,
                no_disk: opts.no_disk,
            },
            None,
        )
    }

    /// The embedded default: one target with one 1 GiB RAM LUN, open to any
    /// initiator, on `listen`.
    pub fn embedded_default(listen: SocketAddr) -> Built {
        Self::embedded_default_with(listen, LoadOptions::default())
    }

    /// The embedded default, its LUN built as `opts` says.
    pub fn embedded_default_with(listen: SocketAddr, opts: LoadOptions) -> Built {
        let text = format!(
            "[[portal_group]]\ntag = 1\nlisten = [\"{listen}\"]\n\n\
             [[target]]\nname = \"{DEFAULT_TARGET}\"\nalias = \"blockwire-default\"\n\n\
             [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1G\"\n"
        );
        Self::from_str_with("<embedded default>", &text, opts)
            .expect("the embedded default configuration is valid")
    }

    fn build(self, ctx: &Ctx<'_>, _base: Option<&Path>) -> Result<Built, ConfigError> {
        let f = &self.fabric;
        if let Some(dir) = &f.state_dir {
            std::fs::create_dir_all(dir).map_err(|e| {
                ctx.err(
                    0..0,
                    "fabric.state_dir",
                    format!("cannot create {}: {e}", dir.display()),
                )
            })?;
        }
        let rdma_listen = match &f.rdma_listen {
            None => None,
            Some(a) => Some(a.parse::<SocketAddr>().map_err(|e| {
                ctx.err(
                    0..0,
                    "fabric.rdma_listen",
                    format!("{a:?} is not an address:port ({e})"),
                )
            })?),
        };
        let rdma_backend = match f.rdma_backend.as_str() {
            "soft" => RdmaBackend::Soft,
            "verbs" => RdmaBackend::Verbs,
            other => {
                return Err(ctx.err(
                    0..0,
                    "fabric.rdma_backend",
                    format!("{other:?} is not an RDMA backend (use \"soft\" or \"verbs\")"),
                ))
            }
        };
        if !(1..=65536).contains(&f.queue_depth) {
            return Err(ctx.err(0..0, "fabric.queue_depth", "must be between 1 and 65536"));
        }
        if !(512..=16_777_215).contains(&f.max_recv_data_segment_length) {
            return Err(ctx.err(
                0..0,
                "fabric.max_recv_data_segment_length",
                "must be between 512 and 16777215",
            ));
        }
        let require = |v: &str, field: &str| match v {
            "allow" => Ok(false),
            "require" => Ok(true),
            other => Err(ctx.err(
                0..0,
                field,
                format!("{other:?} is not a digest policy (use \"allow\" or \"require\")"),
            )),
        };
        let write_budget_bytes = parse_size(&f.write_budget)
            .filter(|&n| n >= 1 << 20)
            .ok_or_else(|| {
                ctx.err(
                    0..0,
                    "fabric.write_budget",
                    format!(
                        "{:?} is not a size of at least 1M (write e.g. \"256M\")",
                        f.write_budget
                    ),
                )
            })?;
        let settings = FabricSettings {
            write_budget_bytes,
            require_header_digest: require(&f.header_digest, "fabric.header_digest")?,
            require_data_digest: require(&f.data_digest, "fabric.data_digest")?,
            queue_depth: f.queue_depth,
            nop_interval: (f.nop_interval_secs > 0)
                .then(|| std::time::Duration::from_secs(f.nop_interval_secs)),
            nop_timeout: std::time::Duration::from_secs(f.nop_timeout_secs.max(1)),
            logout_grace: std::time::Duration::from_secs(f.logout_grace_secs),
            zero_copy_send: f.zero_copy_send,
            data_pdu_in_order: f.data_pdu_in_order,
            ..FabricSettings::default()
        };

        let mut portal_groups = Vec::new();
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
        let mut sync_sends = Vec::new();
        let mut sync_writes = Vec::new();
        let mut engine_sources = Vec::new();
        let mut sendfiles = Vec::new();
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
                let mut prebuilt: Option<(blockwire_target::datapath::Source, bool)> = None;
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
                let mut file_direct: Option<(PathBuf, bool)> = None;
                let mut sendfile_path: Option<PathBuf> = None;
                let backstore: Arc<dyn Backstore> = match kind {
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
                    "file" if ctx.no_disk => {
                        let path = l.path.as_ref().ok_or_else(|| {
                            ctx.err(lspan.clone(), "target.lun.path", "a file LUN needs a path")
                        })?;
                        // --no-disk: the file is neither opened nor created;
                        // its length (metadata only) stands in for a size.
                        let size = match size {
                            Some(s) => s,
                            None => std::fs::metadata(path).map(|m| m.len()).map_err(|e| {
                                ctx.err(
                                    lspan.clone(),
                                    "target.lun.size",
                                    format!(
                                        "--no-disk needs a size for {} ({e}): add size = \"...\"",
                                        path.display()
                                    ),
                                )
                            })?,
                        };
                        if engine_path {
                            prebuilt = Some((blockwire_target::datapath::Source::Pattern, false));
                        }
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
                        if ctx.no_disk {
                            let size = match size {
                                Some(s) => s,
                                None => {
                                    let mut least = u64::MAX;
                                    for p in paths.get_ref() {
                                        let len = std::fs::metadata(p).map(|m| m.len()).map_err(|e| {
                                            ctx.err(lspan.clone(), "target.lun.size", format!("--no-disk needs a size for {} ({e}): add size = \"...\"", p.display()))
                                        })?;
                                        least = least.min(len);
                                    }
                                    least / stripe * stripe * paths.get_ref().len() as u64
                                }
                            };
                            if engine_path {
                                prebuilt =
                                    Some((blockwire_target::datapath::Source::Pattern, false));
                            }
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
                            if engine_path {
                                prebuilt = Some(sb.engine_source().map_err(|e| {
                                    ctx.err(paths.span(), "target.lun.paths", e.to_string())
                                })?);
                            }
                            Arc::new(sb)
                        }
                    }
                    "file" => {
                        let path = l.path.as_ref().ok_or_else(|| {
                            ctx.err(lspan.clone(), "target.lun.path", "a file LUN needs a path")
                        })?;
                        let fb = FileBackstore::open_with(path, size, l.read_only, mode).map_err(
                            |e| ctx.err(lspan.clone(), "target.lun.path", e.to_string()),
                        )?;
                        // Direct LUNs always take the engine path (serial
                        // unless sync_send); cached ones only with sync_send.
                        if sync_send || mode == FileMode::Direct {
                            file_direct = Some((path.clone(), fb.mode() == FileMode::Direct));
                        }
                        // Cached LUNs without sync_send: READ payloads by
                        // sendfile unless zero_copy = false.
                        if !sync_send && mode == FileMode::Cached && zero_copy {
                            sendfile_path = Some(path.clone());
                        }
                        if sync_write {
                            sync_writes.push(SyncWriteDef {
                                target: name.clone(),
                                lun: l.id,
                                path: path.clone(),
                                direct: fb.mode() == FileMode::Direct,
                                chunk: sync_chunk,
                            });
                        }
                        Arc::new(fb)
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
                let (serial, naa) = match &l.uuid {
                    Some(u) => identity_from_uuid(u.get_ref()).ok_or_else(|| {
                        ctx.err(
                            u.span(),
                            "target.lun.uuid",
                            format!(
                                "{:?} is not a UUID (32 hex digits, e.g. from uuidgen)",
                                u.get_ref()
                            ),
                        )
                    })?,
                    None => stable_identity(&name, l.id),
                };
                let mut lu = LuConfig::new(backstore);
                lu.block_size = block_size;
                lu.physical_block_exponent = physical_block_exponent;
                lu.read_only = l.read_only;
                let stalled = l.stalled;
                lu.serial = l.serial.clone().unwrap_or(serial);
                lu.naa_id = naa;
                lu.pr_state_path = f.state_dir.as_ref().map(|d| {
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
                    d.join(format!("{safe}.lun{}.pr", l.id))
                });
                let unit = LogicalUnit::new(lu);
                if stalled {
                    unit.set_stalled(true);
                }
                luns.push((l.id, Arc::new(unit)));
                if let Some(path) = sendfile_path {
                    sendfiles.push(SendfileDef {
                        target: name.clone(),
                        lun: l.id,
                        path,
                    });
                }
                if let Some((source, direct)) = prebuilt {
                    engine_sources.push(EngineSourceDef {
                        target: name.clone(),
                        lun: l.id,
                        source,
                        direct,
                        chunk: sync_chunk,
                        mode: engine_mode,
                    });
                }
                if let Some((path, direct)) = file_direct {
                    sync_sends.push(SyncSendDef {
                        target: name.clone(),
                        lun: l.id,
                        path,
                        direct,
                        chunk: sync_chunk,
                        mode: if sync_send {
                            blockwire_target::datapath::Mode::Synchronized
                        } else {
                            blockwire_target::datapath::Mode::Serial
                        },
                    });
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
                acl: t.allow.map_or(Acl::Any, Acl::Only),
                auth,
                luns: Arc::new(luns),
            }));
        }
        if targets.is_empty() {
            return Err(ctx.err(0..0, "target", "no [[target]] is defined"));
        }
        let discovery_auth = auth_policy(ctx, &self.discovery, "discovery")?;
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
            sync_sends,
            sync_writes,
            engine_sources,
            no_disk: ctx.no_disk,
            sendfiles,
            control_socket: self.control.socket,
        })
    }
}

/// The name the embedded default target serves.
pub const DEFAULT_TARGET: &str = "iqn.2026-11.io.blockwire:default";

fn secret(ctx: &Ctx<'_>, s: &Spanned<String>, field: &str) -> Result<String, ConfigError> {
    let len = s.get_ref().len();
    if !(12..=255).contains(&len) {
        // RFC 7143 §12.1.3: at least 96 bits of secret; tgt and open-iscsi
        // refuse shorter ones too, so catch it here rather than at login.
        return Err(ctx.err(s.span(), field, "CHAP secrets must be 12 to 255 characters"));
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
            c.initiator.clone(),
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
                .unwrap_or_else(|e| panic!("{e}"))
                .sendfiles
                .len()
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
        assert_eq!(b.sync_sends.len(), 1);
        assert_eq!((b.sync_sends[0].lun, b.sync_sends[0].chunk), (0, 128 << 10));
        assert_eq!(
            b.sync_sends[0].mode,
            blockwire_target::datapath::Mode::Synchronized
        );
        let off = TargetConfig::from_str(
            "t.toml",
            &one_lun(&format!(
                "backstore = \"file\"\npath = {img:?}\nsize = \"1M\"\n"
            )),
        )
        .unwrap();
        assert!(off.sync_sends.is_empty(), "off by default on cached LUNs");
        // A direct LUN always reads through the engine: serial without
        // sync_send (the baseline on registered buffers).
        let direct = TargetConfig::from_str(
            "t.toml",
            &one_lun(&format!(
                "backstore = \"file\"\npath = {img:?}\nsize = \"1M\"\nmode = \"direct\"\n"
            )),
        )
        .unwrap();
        assert_eq!(direct.sync_sends.len(), 1);
        assert_eq!(
            direct.sync_sends[0].mode,
            blockwire_target::datapath::Mode::Serial
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
        assert!(b.engine_sources.is_empty() && b.sync_sends.is_empty());
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
        assert_eq!(b.engine_sources.len(), 1);
        let d = &b.engine_sources[0];
        assert_eq!((d.lun, d.chunk, d.mode), (0, 256 << 10, Mode::Synchronized));
        match &d.source {
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
        assert_eq!(b.engine_sources[0].mode, Mode::Serial);
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
        assert!(b.sync_sends.is_empty() && b.sendfiles.is_empty());
        let engine: Vec<u16> = b.engine_sources.iter().map(|d| d.lun).collect();
        assert_eq!(engine, [0, 2], "the engine-path LUNs");
        assert!(b
            .engine_sources
            .iter()
            .all(|d| matches!(d.source, Source::Pattern)));
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
        assert_eq!(b.sync_writes.len(), 1);
        let w = &b.sync_writes[0];
        assert_eq!((w.lun, w.chunk, w.direct), (0, 256 << 10, false));
        assert_eq!(w.path, img);
        let off = TargetConfig::from_str(
            "t.toml",
            &one_lun(&format!(
                "backstore = \"file\"\npath = {img:?}\nsize = \"1M\"\nsync_write = false\n"
            )),
        )
        .unwrap();
        assert!(off.sync_writes.is_empty());
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

    fn two_groups(second: &str, target_groups: &str) -> String {
        format!(
            "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n\
             [[portal_group]]\ntag = 2\nlisten = [\"127.0.0.1:3261\"]\n{second}\n\
             [[target]]\nname = \"iqn.2026-11.io.blockwire:t\"\n{target_groups}\n\
             [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n"
        )
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
