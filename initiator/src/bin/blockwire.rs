//! `blockwire`: the command line of blockwire's iSCSI initiator.
//!
//! `unsafe` only in `kernel_host::device` (the ioctls and the shared area
//! of the blockwire_scsi driver); the FUSE export (fuser) and the ublk
//! front end (libublk) keep theirs inside those crates.
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]
// map_or(true, ..) and `%` keep the crate's rust-version (1.80).
#![allow(
    clippy::unnecessary_map_or,
    clippy::type_complexity,
    unknown_lints,
    clippy::manual_is_multiple_of
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

/// `println!` for a command whose stdout may be a pipe the reader closed
/// (`blockwire ls -p HOST | head -1`): the output nobody reads any more is
/// dropped and the command ends quietly with status 0, as the reader had
/// what it wanted; std's `println!` would panic on the broken pipe.
macro_rules! println {
    () => { $crate::stdout_line(format_args!("")) };
    ($($arg:tt)*) => { $crate::stdout_line(format_args!($($arg)*)) };
}

/// Writes one line to stdout (see `println!` above).
fn stdout_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let written = out
        .write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            eprintln!("blockwire: writing to stdout: {e}");
            std::process::exit(exit::GENERIC);
        }
    }
}
use blockwire_initiator::{
    discover, discover_list, serial_of, ChapAlgorithm, ChapConfig, DiscoveredTarget,
    InitiatorConfig, Session,
};
use clap::{Args, Parser, Subcommand, ValueEnum};
use rand::{Rng, SeedableRng};

#[path = "blockwire/bench.rs"]
mod bench;
#[path = "blockwire/capacity_watch.rs"]
mod capacity_watch;
#[path = "blockwire/data_path.rs"]
mod data_path;
#[path = "blockwire/dd.rs"]
mod dd;
#[path = "blockwire/iscsiadm.rs"]
mod iscsiadm;
#[path = "blockwire/kernel_host/mod.rs"]
mod kernel_host;
#[path = "blockwire/mount.rs"]
mod mount;
#[path = "blockwire/nodedb.rs"]
mod nodedb;
#[cfg(feature = "ublk")]
#[path = "blockwire/ublk.rs"]
mod ublk;

const LONG_ABOUT: &str = "\
blockwire is an iSCSI initiator that runs in user space: no kernel iSCSI
module, no iscsid. It discovers targets, logs in (AuthMethod None or CHAP
with MD5, SHA1, SHA-256 or SHA3-256, one-way or mutual) and runs SCSI
commands with many in flight.

Portals are HOST[:PORT] (port 3260 by default; IPv6 as [ADDR]:PORT).
When -T/--target is left out, the first target that discovery lists is used.

The initiator name is --initiator-name (or $BLOCKWIRE_INITIATOR_NAME); else
the InitiatorName= line of /etc/iscsi/initiatorname.iscsi (open-iscsi's file,
so an ACL written for this host's kernel initiator admits blockwire too;
$BLOCKWIRE_INITIATORNAME_FILE names another file); else one made from the
host name (iqn.2026-11.io.blockwire:HOSTNAME).

dd takes dd's own operands as well as the long options:
  blockwire dd if=disk.img of=iscsi://127.0.0.1/IQN/0 bs=1M count=16 skip=2 seek=4

Exit status, as open-iscsi's iscsiadm uses it:
   0  success
   1  any other error (bad arguments, I/O error, ...)
   4  the portal could not be reached (connection refused, unreachable)
  19  the target refused the login for another reason (unknown target name,
      missing parameter, ...) or the target failed mutual CHAP
  21  nothing found: discovery listed no targets (or iscsiadm -m node/session
      matched no record)
  24  authentication or authorization failure: wrong CHAP name or secret, or
      the target's ACL does not admit this initiator name
A closed stdout (e.g. `| head -1`) ends the command quietly with status 0.

Examples:
  blockwire discover -p 127.0.0.1:3260
  blockwire iscsiadm -m discovery -t sendtargets -p 127.0.0.1:3260
  blockwire ls -p 127.0.0.1
  blockwire inq -p 127.0.0.1 -T iqn.2026-11.io.blockwire:default -l 0
  blockwire readcap -p 127.0.0.1
  blockwire bench -p 127.0.0.1 --pattern rand --op read --bs 4k --qd 32 --time 10s
  blockwire mount -p 127.0.0.1 /mnt/luns &   # then: losetup -f --show /mnt/luns/lun0
  blockwire discover -p 10.0.0.5 --chap-user alice --chap-secret alice-secret-12 \\
      --mutual-user target --mutual-secret target-secret-1";

#[derive(Parser, Debug)]
#[command(name = "blockwire", version, about = "blockwire iSCSI initiator", long_about = LONG_ABOUT)]
struct Cli {
    /// Our iSCSI name (InitiatorName); the ISID is derived from it, so it
    /// should be stable per host.
    #[arg(long, global = true, env = "BLOCKWIRE_INITIATOR_NAME")]
    initiator_name: Option<String>,
    /// Log protocol events (tracing; RUST_LOG refines it).
    #[arg(long, global = true)]
    verbose: bool,
    /// Threads that drive the sessions' sockets (the async runtime's
    /// workers). Default: 1 for `bench` and `dd`, which stream one session:
    /// a second worker would sit in epoll_wait and be woken by every TCP
    /// segment the first is already reading, and would pull tasks across
    /// cores. Elsewhere (mount, attach, ublk, ...) one per CPU.
    #[arg(long, global = true, env = "BLOCKWIRE_THREADS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: Option<u16>,
    #[command(flatten)]
    data: data_path::DataPathArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Debug, Clone, Default)]
struct AuthArgs {
    /// CHAP user name (CHAP_N) for the login.
    #[arg(long)]
    chap_user: Option<String>,
    /// CHAP secret (12..255 characters on most targets).
    #[arg(long, env = "BLOCKWIRE_CHAP_SECRET", hide_env_values = true)]
    chap_secret: Option<String>,
    /// Mutual CHAP: the name the target must answer with.
    #[arg(long)]
    mutual_user: Option<String>,
    /// Mutual CHAP: the secret the target must prove (must differ from ours).
    #[arg(long, env = "BLOCKWIRE_MUTUAL_SECRET", hide_env_values = true)]
    mutual_secret: Option<String>,
    /// CHAP algorithms offered, most preferred first: SHA3-256,SHA-256,SHA1,MD5.
    #[arg(long, value_delimiter = ',')]
    chap_algorithms: Vec<String>,
}

#[derive(Args, Debug, Clone)]
struct SessionArgs {
    /// Target portal, HOST[:PORT].
    #[arg(short = 'p', long)]
    portal: String,
    /// Target name (IQN); default: the first target discovery lists.
    #[arg(short = 'T', long)]
    target: Option<String>,
    #[command(flatten)]
    auth: AuthArgs,
    /// Use CRC32C header digests (the login fails if the target does not take them).
    #[arg(long)]
    header_digest: bool,
    /// Use CRC32C data digests (the login fails if the target does not take them).
    #[arg(long)]
    data_digest: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum Pattern {
    Rand,
    Seq,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum Op {
    Read,
    Write,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// SendTargets discovery: print each target and its portals.
    Discover {
        /// Discovery portal, HOST[:PORT].
        #[arg(short = 'p', long)]
        portal: String,
        #[command(flatten)]
        auth: AuthArgs,
    },
    /// iscsiadm-compatible subset. `-m discovery -t sendtargets -p HOST[:PORT]`
    /// prints `HOST:PORT,TPGT IQN` lines like open-iscsi's iscsiadm and
    /// records the nodes; `-m node` lists them (`-o new|delete|update|show`,
    /// `-n KEY -v VALUE` for node.session.auth.*); `-m node -T IQN [-p P]
    /// --login` logs in (checking the full login and TEST UNIT READY) and
    /// records the session, `--logout` removes it; `-m session` lists the
    /// recorded sessions. blockwire holds no kernel session: a recorded
    /// login is bookkeeping for scripts, each blockwire command logs in on
    /// its own.
    Iscsiadm(IscsiadmArgs),
    /// List targets at a portal with their LUNs, sizes, vendors and products.
    Ls {
        /// Portal, HOST[:PORT].
        #[arg(short = 'p', long)]
        portal: String,
        #[command(flatten)]
        auth: AuthArgs,
    },
    /// Standard INQUIRY data and the unit serial number of a LUN.
    Inq {
        #[command(flatten)]
        s: SessionArgs,
        /// LUN.
        #[arg(short = 'l', long, default_value_t = 0)]
        lun: u16,
    },
    /// READ CAPACITY of a LUN.
    Readcap {
        #[command(flatten)]
        s: SessionArgs,
        /// LUN.
        #[arg(short = 'l', long, default_value_t = 0)]
        lun: u16,
    },
    /// Copy between files and LUNs, dd-like, with many commands in flight
    /// and a progress line. A LUN is `iscsi://[USER%SECRET@]HOST[:PORT]/IQN/LUN`
    /// (libiscsi's URL form); anything else is a file path. dd's own
    /// operands work too: `if=IN of=OUT bs=1M count=N skip=N seek=N
    /// status=none`.
    Dd {
        /// Source (file or iscsi:// URL); also `if=`.
        #[arg(long = "if")]
        input: String,
        /// Destination (file or iscsi:// URL); also `of=`.
        #[arg(long = "of")]
        output: String,
        /// Bytes per command (multiple of the block size); also `bs=`.
        #[arg(long, default_value = "1M")]
        bs: String,
        /// Copy at most COUNT blocks of --bs (default: the smaller size);
        /// also `count=`.
        #[arg(long)]
        count: Option<u64>,
        /// Skip SKIP blocks of --bs at the start of the input; also `skip=`.
        #[arg(long, default_value_t = 0)]
        skip: u64,
        /// Skip SEEK blocks of --bs at the start of the output; also `seek=`.
        #[arg(long, default_value_t = 0)]
        seek: u64,
        /// Commands in flight.
        #[arg(long, default_value_t = 16)]
        qd: usize,
        /// No progress line; also `status=none`.
        #[arg(long)]
        quiet: bool,
    },
    /// Load generator: prints IOPS, MB/s and latency percentiles.
    Bench {
        #[command(flatten)]
        s: SessionArgs,
        /// LUN.
        #[arg(short = 'l', long, default_value_t = 0)]
        lun: u16,
        /// Access pattern.
        #[arg(long, value_enum, default_value_t = Pattern::Rand)]
        pattern: Pattern,
        /// Read or write (writes destroy data on the LUN).
        #[arg(long, value_enum, default_value_t = Op::Read)]
        op: Op,
        /// I/O size (512, 4k, 1M, ...).
        #[arg(long, default_value = "4k")]
        bs: String,
        /// Commands in flight.
        #[arg(long, default_value_t = 32)]
        qd: usize,
        /// Run time (10s, 500ms, 1m).
        #[arg(long, default_value = "10s")]
        time: String,
        /// Limit the I/O to the first SPAN bytes of the LUN (512, 64M, 1G, ...; default: all).
        #[arg(long)]
        span: Option<String>,
    },
    /// Expose each LUN as a file (`lun0`, `lun1`, ...) in a FUSE mount, sized
    /// to its capacity: reads and writes become READ/WRITE (direct I/O, no
    /// page cache), fsync becomes SYNCHRONIZE CACHE, O_SYNC/O_DSYNC writes
    /// carry FUA. `losetup` makes a file a block device. Runs in the
    /// foreground until unmounted or SIGINT/SIGTERM, then flushes and logs out.
    Mount {
        #[command(flatten)]
        s: SessionArgs,
        /// Only these LUNs (repeat, or comma-separated; default: all that REPORT LUNS lists).
        #[arg(short = 'l', long = "lun", value_delimiter = ',')]
        luns: Vec<u16>,
        /// Commands in flight at most.
        #[arg(long, default_value_t = 32)]
        qd: usize,
        /// Mount read-only.
        #[arg(long)]
        read_only: bool,
        /// Let users other than the mounting one open the files (FUSE allow_other).
        #[arg(long)]
        allow_other: bool,
        /// Send O_DIRECT writes with FUA too (by default only O_SYNC/O_DSYNC ones).
        #[arg(long)]
        fua_direct: bool,
        /// Directory to mount on.
        mountpoint: std::path::PathBuf,
    },
    /// Attach the target's LUNs as Linux SCSI devices (/dev/sdX and /dev/sgN)
    /// through the blockwire_scsi kernel driver (initiator/kmod/: build with
    /// initiator/kmod/build.sh, then insmod blockwire_scsi.ko). Every SCSI
    /// command the kernel sends runs on this iSCSI session as it is, so
    /// sg_persist, fence_scsi, multipath and ALUA work; the SCSI error
    /// handler's aborts and resets become ABORT TASK, LOGICAL UNIT RESET and
    /// TARGET WARM RESET. Runs in the foreground until SIGINT/SIGTERM, then
    /// removes the host (sd flushes first) and logs out. If this process
    /// dies, the kernel fails the outstanding commands and removes the host.
    Attach {
        #[command(flatten)]
        s: SessionArgs,
        /// Commands in flight at most (the host's queue depth, 1-256).
        #[arg(long, default_value_t = 32)]
        qd: u32,
        /// The largest transfer per command, in KiB (4-1024, a multiple of 4;
        /// queue depth x this must fit the driver's 64 MiB shared area).
        #[arg(long, default_value_t = 256)]
        max_io_kib: u32,
    },
    /// Serve a LUN as a Linux block device /dev/ublkbN through the kernel's
    /// ublk driver (needs /dev/ublk-control, i.e. ublk_drv; and a build with
    /// `--features ublk`). Runs until SIGINT/SIGTERM, then deletes the
    /// device, flushes and logs out.
    Ublk {
        #[command(flatten)]
        s: SessionArgs,
        /// LUN.
        #[arg(short = 'l', long, default_value_t = 0)]
        lun: u16,
        /// ublk queue depth (also the commands in flight at most).
        #[arg(long, default_value_t = 64)]
        qd: u16,
    },
}

#[derive(Args, Debug)]
struct IscsiadmArgs {
    /// Mode: discovery (or discoverydb).
    #[arg(short = 'm', long)]
    mode: String,
    /// Discovery type: sendtargets (st), or isns: ask the iSNS server at -p
    /// (HOST[:PORT], port 3205 by default) which targets this initiator may see.
    #[arg(short = 't', long = "type")]
    kind: Option<String>,
    /// Portal, HOST[:PORT].
    #[arg(short = 'p', long)]
    portal: Option<String>,
    /// Interface (accepted for compatibility; blockwire uses TCP).
    #[arg(short = 'I', long)]
    interface: Option<String>,
    /// Run the discovery (implied with -m discovery).
    #[arg(long)]
    discover: bool,
    /// Target name (-m node).
    #[arg(short = 'T', long = "targetname")]
    targetname: Option<String>,
    /// Log in to the matching node records (-m node).
    #[arg(short = 'l', long)]
    login: bool,
    /// Log out of the matching sessions (-m node).
    #[arg(short = 'u', long)]
    logout: bool,
    /// Operation on node records: new, delete, update, show.
    #[arg(short = 'o', long)]
    op: Option<String>,
    /// Setting name for -o update (e.g. node.session.auth.username).
    #[arg(short = 'n', long)]
    name: Option<String>,
    /// Setting value for -o update.
    #[arg(short = 'v', long)]
    value: Option<String>,
    /// Where the node database lives (default $BLOCKWIRE_CONFIG_DIR or
    /// $HOME/.config/blockwire).
    #[arg(long)]
    config_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    auth: AuthArgs,
}

fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = match t.trim_end_matches(['b', 'i']).chars().last() {
        Some('k') => (&t[..t.find('k').unwrap_or(t.len())], 1u64 << 10),
        Some('m') => (&t[..t.find('m').unwrap_or(t.len())], 1 << 20),
        Some('g') => (&t[..t.find('g').unwrap_or(t.len())], 1 << 30),
        _ => (t.as_str(), 1),
    };
    let n: u64 = num
        .parse()
        .with_context(|| format!("size `{s}`: expected a number with an optional k/M/G suffix"))?;
    Ok(n * mult)
}

fn parse_duration(s: &str) -> Result<Duration> {
    let t = s.trim();
    let (num, unit) = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map(|i| t.split_at(i))
        .unwrap_or((t, "s"));
    let n: f64 = num
        .parse()
        .with_context(|| format!("duration `{s}`: expected e.g. 10s, 500ms, 2m"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" | "" => n,
        "m" | "min" => n * 60.0,
        _ => bail!("duration `{s}`: unknown unit `{unit}` (ms, s, m)"),
    };
    Ok(Duration::from_secs_f64(secs))
}

/// open-iscsi's initiator name file.
const INITIATORNAME_FILE: &str = "/etc/iscsi/initiatorname.iscsi";

/// The `InitiatorName=` of an open-iscsi initiator name file (comments and
/// blank lines skipped); None when there is none.
fn initiator_name_in(text: &str) -> Option<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix("InitiatorName="))
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
}

/// The initiator name when none is given: open-iscsi's file, else one made
/// from the host name.
fn default_initiator_name() -> String {
    let file = std::env::var_os("BLOCKWIRE_INITIATORNAME_FILE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| INITIATORNAME_FILE.into());
    if let Some(name) = std::fs::read_to_string(&file)
        .ok()
        .as_deref()
        .and_then(initiator_name_in)
    {
        return name;
    }
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("iqn.2026-11.io.blockwire:{host}")
}

/// Says on stderr that a CHAP secret is shorter than the 12 bytes (96 bits)
/// RFC 7143 (9.2.1) asks for without IPsec: a login's challenge and answer
/// let an eavesdropper guess a short one offline. Not refused: the target
/// decides, and some take short ones.
fn warn_if_short(option: &str, secret: &str) {
    if secret.len() < 12 {
        eprintln!(
            "blockwire: warning: {option} is {} bytes; RFC 7143 asks for at least 12 \
             (96 bits) without IPsec, as one overheard login lets a short secret be \
             guessed offline",
            secret.len()
        );
    }
}

fn chap_of(a: &AuthArgs) -> Result<Option<ChapConfig>> {
    let Some(user) = &a.chap_user else {
        if a.chap_secret.is_some() || a.mutual_user.is_some() {
            bail!("--chap-secret and --mutual-user need --chap-user");
        }
        return Ok(None);
    };
    let secret = a
        .chap_secret
        .as_deref()
        .ok_or_else(|| anyhow!("--chap-user needs --chap-secret (or BLOCKWIRE_CHAP_SECRET)"))?;
    warn_if_short("--chap-secret", secret);
    let mut c = ChapConfig::new(user.clone(), secret);
    if let Some(mu) = &a.mutual_user {
        let ms = a
            .mutual_secret
            .as_deref()
            .ok_or_else(|| anyhow!("--mutual-user needs --mutual-secret"))?;
        if ms == secret {
            bail!(
                "--mutual-secret equals --chap-secret: RFC 7143 (9.2.1) forbids one CHAP \
                 secret in both directions, and such a login fails; give the target's \
                 mutual CHAP its own secret"
            );
        }
        warn_if_short("--mutual-secret", ms);
        c = c.with_mutual(mu.clone(), ms);
    }
    let mut algs = Vec::new();
    for name in &a.chap_algorithms {
        let alg = ChapAlgorithm::ALL
            .into_iter()
            .find(|x| x.name().eq_ignore_ascii_case(name.trim()))
            .ok_or_else(|| {
                anyhow!("unknown CHAP algorithm `{name}` (SHA3-256, SHA-256, SHA1, MD5)")
            })?;
        algs.push(alg);
    }
    Ok(Some(c.with_algorithms(algs)))
}

fn config(cli: &Cli, auth: &AuthArgs) -> Result<InitiatorConfig> {
    let name = cli
        .initiator_name
        .clone()
        .unwrap_or_else(default_initiator_name);
    let mut cfg = InitiatorConfig::new(name);
    let chap = chap_of(auth)?;
    cfg.discovery_chap = chap.clone();
    cfg.chap = chap;
    Ok(cfg)
}

/// Which session of this host a command's login is (RFC 7143 §10.1.1):
/// the ISID qualifier it logs in with. Two live sessions of one initiator
/// name to one target must differ in ISID, or the second login reinstates
/// (ends) the first (§6.3.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SessionRole {
    /// A session that serves until stopped (`attach`, which serves the
    /// whole target): the same ISID every time, so a restart after a crash
    /// reinstates the session it left behind rather than waiting for the
    /// target to time it out.
    Held,
    /// `blockwire mount` of a set of LUNs (empty: all): held, and one per
    /// set, so mounts of different LUNs of one target run side by side
    /// where each login ended the other's session, over and over.
    HeldForMount(u16),
    /// `blockwire ublk` of one LUN: held, and one per LUN, so devices of
    /// several LUNs of one target run side by side.
    #[cfg_attr(not(feature = "ublk"), allow(dead_code))]
    HeldForLun(u16),
    /// A command that logs in, does its work and logs out (`inq`, `ls`,
    /// `dd`, `bench`, the iscsiadm login check): an ISID of this process,
    /// one per `end` (dd's input and output), so it never ends a held
    /// session of the same name, nor another such command running beside it.
    OneShot { end: u16 },
}

impl SessionRole {
    /// `mount`'s role for `luns` (in any order, repeated or not).
    fn mount_of(luns: &[u16]) -> SessionRole {
        let mut set = luns.to_vec();
        set.sort_unstable();
        set.dedup();
        // FNV-1a: stable across runs and builds, as the ISID must be.
        let hash = set.iter().fold(0x811c_9dc5u32, |h, lun| {
            lun.to_be_bytes()
                .iter()
                .fold(h, |h, &b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
        });
        SessionRole::HeldForMount((hash & 0x1fff) as u16)
    }

    /// The ISID qualifier: 0 for [`SessionRole::Held`], 2000h up for a
    /// mount (by its LUNs), 4000h plus the LUN for one LUN's device, and
    /// 8000h up from this process's ID for a one-shot command: the ranges
    /// never meet.
    fn isid_qualifier(self) -> u16 {
        match self {
            SessionRole::Held => 0,
            SessionRole::HeldForMount(set) => 0x2000 | (set & 0x1fff),
            SessionRole::HeldForLun(lun) => 0x4000 | (lun & 0x3fff),
            SessionRole::OneShot { end } => {
                let own = std::process::id()
                    .wrapping_mul(2)
                    .wrapping_add(u32::from(end));
                0x8000 | (own & 0x7fff) as u16
            }
        }
    }
}

/// `cfg` logging in as `role` (see [`SessionRole`]).
fn as_role(mut cfg: InitiatorConfig, role: SessionRole) -> InitiatorConfig {
    cfg.isid_qualifier = role.isid_qualifier();
    cfg
}

async fn open(cli: &Cli, s: &SessionArgs, qd: usize, role: SessionRole) -> Result<Session> {
    let (cfg, target) = resolve(cli, s, qd).await?;
    Session::connect(as_role(cfg, role), &s.portal, &target)
        .await
        .with_context(|| format!("login to {target} at {}", s.portal))
}

/// A session for `dd` and `bench`, its data on the path `--data-path`
/// chose: a one-shot session, `end` telling dd's two ends apart.
async fn open_lun(
    cli: &Cli,
    s: &SessionArgs,
    qd: usize,
    end: u16,
) -> Result<data_path::LunSession> {
    let (cfg, target) = resolve(cli, s, qd).await?;
    let cfg = as_role(cfg, SessionRole::OneShot { end });
    data_path::LunSession::open(cfg, &cli.data, &s.portal, &target).await
}

/// Mount and ublk hand the LUN to the kernel through plain iSCSI sessions.
fn tcp_only(what: &str, cli: &Cli) -> Result<()> {
    if cli.data.data_path != data_path::DataPath::Tcp {
        bail!(
            "`blockwire {what}` moves data over TCP only; --data-path rdma and iser \
             work with `blockwire dd` and `blockwire bench`"
        );
    }
    Ok(())
}

/// The login configuration and the target name (`-T`, or the first that discovery lists).
async fn resolve(cli: &Cli, s: &SessionArgs, qd: usize) -> Result<(InitiatorConfig, String)> {
    let cfg = config(cli, &s.auth)?
        .with_digests(s.header_digest, s.data_digest)
        .with_queue_depth(qd);
    let target = match &s.target {
        Some(t) => t.clone(),
        None => {
            let targets = discover(&cfg, &s.portal)
                .await
                .with_context(|| format!("discovery at {}", s.portal))?;
            targets.first().map(|t| t.name.clone()).ok_or_else(|| {
                anyhow!(NothingFound(format!(
                    "discovery at {} lists no targets; give one with -T",
                    s.portal
                )))
            })?
        }
    };
    Ok((cfg, target))
}

fn print_iscsiadm(targets: &[DiscoveredTarget]) {
    for t in targets {
        for p in &t.portals {
            println!("{p} {}", t.name);
        }
    }
}

fn main() {
    let cli = Cli::parse_from(dd_operands(std::env::args_os()));
    let runtime = match runtime_for(&cli) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("blockwire: starting the async runtime: {e}");
            std::process::exit(1);
        }
    };
    runtime.block_on(cli_main(cli));
}

/// The runtime `cli`'s command runs on: `--threads` workers, or the
/// command's default (see [`Cli::threads`]).
fn runtime_for(cli: &Cli) -> std::io::Result<tokio::runtime::Runtime> {
    let one_stream = matches!(cli.command, Command::Bench { .. } | Command::Dd { .. });
    let workers = cli.threads.map(usize::from).or(one_stream.then_some(1));
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(n) = workers {
        builder.worker_threads(n);
    }
    builder.build()
}

async fn cli_main(cli: Cli) {
    if cli.verbose {
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "debug".into()),
            )
            .with_writer(std::io::stderr)
            .init();
    }
    if let Err(e) = run(&cli).await {
        eprintln!("blockwire: {e:#}");
        std::process::exit(exit::code(&e));
    }
}

/// dd's operands (`if=IN of=OUT bs=N count=N skip=N seek=N status=none`)
/// after the `dd` subcommand, turned into the long options clap parses.
/// Only the subcommand's own arguments are looked at: a global option's
/// value (e.g. an initiator name) is never rewritten.
fn dd_operands(args: impl IntoIterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let mut args: Vec<_> = args.into_iter().collect();
    // The subcommand is the first argument that is neither an option nor
    // the value of a global option given as a separate word.
    const TAKES_VALUE: [&str; 5] = [
        "--initiator-name",
        "--data-path",
        "--rdma-backend",
        "--rdma-device",
        "--iser-portal",
    ];
    let mut i = 1;
    while i < args.len() {
        let a = args[i].to_string_lossy();
        if TAKES_VALUE.contains(&a.as_ref()) {
            i += 2;
        } else if a.starts_with('-') {
            i += 1;
        } else {
            break;
        }
    }
    if args.get(i).is_none_or(|a| a != "dd") {
        return args;
    }
    for a in &mut args[i + 1..] {
        let text = a.to_string_lossy().into_owned();
        let Some((key, value)) = text.split_once('=') else {
            continue;
        };
        *a = match key {
            "if" | "of" | "bs" | "count" | "skip" | "seek" => format!("--{key}={value}").into(),
            "status" if value == "none" => "--quiet".into(),
            "status" if value == "progress" => continue,
            "status" => {
                // clap reports the unknown option with the usage.
                format!("--status={value}").into()
            }
            _ => continue,
        };
    }
    args
}

/// Discovery at `portal` listed nothing this initiator may see.
fn no_targets(portal: &str) -> anyhow::Error {
    anyhow!(NothingFound(format!(
        "SendTargets discovery at {portal} lists no targets (none configured, or none whose ACL \
         admits this initiator name)"
    )))
}

/// Nothing to work on was found (no targets, no records): exit 21.
#[derive(Debug)]
struct NothingFound(String);

impl std::fmt::Display for NothingFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NothingFound {}

/// Exit statuses, numbered as open-iscsi's iscsiadm numbers them
/// (iscsi_err.h), so scripts written for iscsiadm read blockwire's alike.
mod exit {
    use blockwire_initiator::Error;

    /// Any other failure.
    pub const GENERIC: i32 = 1;
    /// ISCSI_ERR_TRANS: the portal could not be reached.
    pub const TRANSPORT: i32 = 4;
    /// ISCSI_ERR_FATAL_LOGIN: the login failed for good.
    pub const FATAL_LOGIN: i32 = 19;
    /// ISCSI_ERR_NO_OBJS_FOUND: no targets, records or sessions.
    pub const NO_OBJS_FOUND: i32 = 21;
    /// ISCSI_ERR_LOGIN_AUTH_FAILED: authentication or authorization.
    pub const LOGIN_AUTH_FAILED: i32 = 24;

    /// The status for `e`, from the first cause in its chain that says.
    pub fn code(e: &anyhow::Error) -> i32 {
        for cause in e.chain() {
            if cause.downcast_ref::<super::NothingFound>().is_some() {
                return NO_OBJS_FOUND;
            }
            if let Some(e) = cause.downcast_ref::<Error>() {
                if let Some(code) = of_initiator(e) {
                    return code;
                }
            }
        }
        GENERIC
    }

    fn of_initiator(e: &Error) -> Option<i32> {
        match e {
            // Status class 2 details 1 and 2 (RFC 7143 §11.13.5): the
            // credentials or the initiator name were refused.
            Error::LoginRejected { status, .. }
                if status.class == 2 && (status.detail == 1 || status.detail == 2) =>
            {
                Some(LOGIN_AUTH_FAILED)
            }
            Error::LoginRejected { .. } | Error::Chap { .. } => Some(FATAL_LOGIN),
            // Refused, or no route (ENETUNREACH 101, EHOSTUNREACH 113 on
            // Linux; their ErrorKinds are newer than the crate's MSRV).
            Error::Io { cause, .. }
                if cause.kind() == std::io::ErrorKind::ConnectionRefused
                    || cause.kind() == std::io::ErrorKind::AddrNotAvailable
                    || matches!(cause.raw_os_error(), Some(101 | 113)) =>
            {
                Some(TRANSPORT)
            }
            _ => None,
        }
    }
}

async fn run(cli: &Cli) -> Result<()> {
    match &cli.command {
        Command::Discover { portal, auth } => {
            let targets = discover(&config(cli, auth)?, portal)
                .await
                .with_context(|| format!("SendTargets discovery at {portal}"))?;
            if targets.is_empty() {
                return Err(no_targets(portal));
            }
            for t in &targets {
                println!("{}", t.name);
                for p in &t.portals {
                    println!("    portal {} (tpgt {})", p.address(), p.tpgt);
                }
            }
        }
        Command::Iscsiadm(a) => iscsiadm::iscsiadm(cli, a).await?,
        Command::Ls { portal, auth } => {
            let cfg = as_role(config(cli, auth)?, SessionRole::OneShot { end: 0 });
            let targets = discover(&cfg, portal)
                .await
                .with_context(|| format!("SendTargets discovery at {portal}"))?;
            if targets.is_empty() {
                return Err(no_targets(portal));
            }
            for t in &targets {
                println!("Target: {}", t.name);
                for p in &t.portals {
                    println!("  Portal: {p}");
                }
                let s = match Session::connect(cfg.clone(), portal, &t.name).await {
                    Ok(s) => s,
                    Err(e) => {
                        println!("  (login failed: {e})");
                        continue;
                    }
                };
                let luns = s.report_luns().await.unwrap_or_else(|_| vec![0]);
                for lun in luns {
                    let inq = s.inquiry(lun).await;
                    let cap = s.read_capacity(lun).await;
                    match (inq, cap) {
                        (Ok(i), Ok(c)) => println!(
                            "  Lun: {lun}  Type: {:#04x}  Vendor: {}  Product: {}  Rev: {}  Size: {} ({} blocks of {} bytes)",
                            i.peripheral.device_type,
                            i.vendor_str(),
                            i.product_str(),
                            i.revision_str(),
                            human(c.bytes()),
                            c.blocks,
                            c.block_size
                        ),
                        (Ok(i), Err(_)) => println!(
                            "  Lun: {lun}  Type: {:#04x}  Vendor: {}  Product: {}  Rev: {}",
                            i.peripheral.device_type,
                            i.vendor_str(),
                            i.product_str(),
                            i.revision_str()
                        ),
                        (Err(e), _) => println!("  Lun: {lun}  (INQUIRY failed: {e})"),
                    }
                }
                let _ = s.logout().await;
            }
        }
        Command::Inq { s, lun } => {
            let sess = open(cli, s, 4, SessionRole::OneShot { end: 0 }).await?;
            let i = sess.inquiry(*lun).await?;
            println!("Target:        {}", sess.target());
            println!("LUN:           {lun}");
            println!("Device type:   {:#04x}", i.peripheral.device_type);
            println!("Qualifier:     {}", i.peripheral.qualifier);
            println!("Vendor:        {}", i.vendor_str());
            println!("Product:       {}", i.product_str());
            println!("Revision:      {}", i.revision_str());
            println!("Version:       {:#04x}", i.version);
            println!("Removable:     {}", i.rmb);
            println!("Command queue: {}", i.cmdque);
            if let Ok(v) = sess.vpd(*lun, 0x80).await {
                if let Some(sn) = serial_of(&v) {
                    println!("Unit serial:   {sn}");
                }
            }
            let _ = sess.logout().await;
        }
        Command::Readcap { s, lun } => {
            let sess = open(cli, s, 4, SessionRole::OneShot { end: 0 }).await?;
            let c = sess.read_capacity(*lun).await?;
            println!("Target:        {}", sess.target());
            println!("LUN:           {lun}");
            println!("Blocks:        {}", c.blocks);
            println!("Block size:    {}", c.block_size);
            println!("Capacity:      {} bytes ({})", c.bytes(), human(c.bytes()));
            let _ = sess.logout().await;
        }
        Command::Dd {
            input,
            output,
            bs,
            count,
            skip,
            seek,
            qd,
            quiet,
        } => {
            let bs = parse_size(bs)?;
            let span = dd::Span {
                bs,
                count: *count,
                skip: *skip,
                seek: *seek,
            };
            dd::dd(cli, input, output, span, (*qd).max(1), *quiet).await?;
        }
        Command::Bench {
            s,
            lun,
            pattern,
            op,
            bs,
            qd,
            time,
            span,
        } => {
            let bs = parse_size(bs)?;
            let time = parse_duration(time)?;
            let span = span.as_deref().map(parse_size).transpose()?;
            bench::bench(cli, s, *lun, *pattern, *op, bs, (*qd).max(1), time, span).await?;
        }
        Command::Mount {
            s,
            luns,
            qd,
            read_only,
            allow_other,
            fua_direct,
            mountpoint,
        } => {
            tcp_only("mount", cli)?;
            let role = SessionRole::mount_of(luns);
            let sess = open(cli, s, (*qd).max(1), role).await?;
            let opts = mount::MountOptions {
                mountpoint: mountpoint.clone(),
                read_only: *read_only,
                allow_other: *allow_other,
                fua_direct: *fua_direct,
            };
            mount::mount(sess, luns, opts).await?;
        }
        Command::Attach { s, qd, max_io_kib } => {
            let (cfg, target) = resolve(cli, s, (*qd).max(1) as usize).await?;
            let cfg = as_role(cfg, SessionRole::Held);
            let sess = kernel_host::PassSession::open(cfg, &cli.data, &s.portal, &target).await?;
            let opts = kernel_host::AttachOptions {
                queue_depth: *qd,
                max_io_bytes: max_io_kib.saturating_mul(1024),
            };
            kernel_host::serve(sess, opts).await?;
        }
        #[cfg(feature = "ublk")]
        Command::Ublk { s, lun, qd } => {
            // Before the login: no point in one without the driver, or
            // without the descriptors its queue needs.
            ublk::open_files_for(*qd)?;
            ublk::check_available()?;
            tcp_only("ublk", cli)?;
            let role = SessionRole::HeldForLun(*lun);
            let sess = open(cli, s, usize::from((*qd).max(1)), role).await?;
            ublk::serve(sess, *lun, *qd).await?;
        }
        #[cfg(not(feature = "ublk"))]
        Command::Ublk { .. } => {
            bail!(
                "this blockwire was built without ublk support: rebuild with \
                 `cargo build -p blockwire-initiator --features ublk` (or use \
                 `blockwire mount` + losetup)"
            );
        }
    }
    Ok(())
}

fn human(bytes: u64) -> String {
    const U: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", U[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<std::ffi::OsString> {
        words.iter().map(Into::into).collect()
    }

    #[test]
    fn dd_operands_after_global_options_with_values() {
        let got = dd_operands(argv(&[
            "blockwire",
            "--data-path",
            "iser",
            "--iser-portal",
            "10.0.0.1:3260",
            "dd",
            "if=a",
            "of=b",
        ]));
        assert_eq!(&got[6..], &argv(&["--if=a", "--of=b"])[..]);
    }

    #[test]
    fn dd_operands_become_long_options_after_dd_only() {
        let got = dd_operands(argv(&[
            "blockwire",
            "--initiator-name",
            "if=odd-but-legal",
            "dd",
            "if=a.img",
            "of=iscsi://h/iqn.x/0",
            "bs=4k",
            "count=3",
            "skip=1",
            "seek=2",
            "status=none",
        ]));
        assert_eq!(
            got,
            argv(&[
                "blockwire",
                "--initiator-name",
                "if=odd-but-legal",
                "dd",
                "--if=a.img",
                "--of=iscsi://h/iqn.x/0",
                "--bs=4k",
                "--count=3",
                "--skip=1",
                "--seek=2",
                "--quiet",
            ])
        );
        let cli = Cli::try_parse_from(got).unwrap();
        let Command::Dd {
            input,
            output,
            count,
            skip,
            seek,
            quiet,
            ..
        } = cli.command
        else {
            panic!("not dd: {:?}", cli.command);
        };
        assert_eq!(
            (input.as_str(), output.as_str(), count, skip, seek, quiet),
            ("a.img", "iscsi://h/iqn.x/0", Some(3), 1, 2, true)
        );
        // Other subcommands keep key=value words as they are.
        let other = argv(&["blockwire", "inq", "-p", "h", "-T", "if=x"]);
        assert_eq!(dd_operands(other.clone()), other);
    }

    #[test]
    fn the_initiator_name_file_is_read_as_open_iscsi_writes_it() {
        let text = "## DO NOT EDIT OR REMOVE THIS FILE!\n\
                    # InitiatorName=iqn.commented.out:x\n\
                    \n\
                    InitiatorName=iqn.1993-08.org.debian:01:abcdef\n";
        assert_eq!(
            initiator_name_in(text).as_deref(),
            Some("iqn.1993-08.org.debian:01:abcdef")
        );
        assert_eq!(initiator_name_in("InitiatorName=\n"), None);
        assert_eq!(initiator_name_in("# nothing\n"), None);
    }

    #[test]
    fn exit_statuses_follow_iscsiadm() {
        use blockwire_initiator::Error;
        use blockwire_pdu::LoginStatus;
        let refused = |status| {
            anyhow::Error::new(Error::LoginRejected {
                target: "t".into(),
                portal: "p".into(),
                status,
            })
            .context("login to t at p")
        };
        assert_eq!(
            exit::code(&refused(LoginStatus::AUTHENTICATION_FAILURE)),
            24
        );
        assert_eq!(exit::code(&refused(LoginStatus::AUTHORIZATION_FAILURE)), 24);
        assert_eq!(exit::code(&refused(LoginStatus::NOT_FOUND)), 19);
        assert_eq!(exit::code(&no_targets("h:3260")), 21);
        let refused_conn = anyhow::Error::new(Error::Io {
            context: "connecting to h".into(),
            cause: std::io::ErrorKind::ConnectionRefused.into(),
        });
        assert_eq!(exit::code(&refused_conn), 4);
        assert_eq!(exit::code(&anyhow!("bad --bs")), 1);
    }

    #[test]
    fn sizes_and_durations() {
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
    }
}
