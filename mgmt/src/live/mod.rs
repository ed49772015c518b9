//! Live changes to a running target. Every change, a control-socket call
//! or a SIGHUP reload, is a whole new configuration document: it is checked
//! exactly like a file at start-up, and only if it passes is the difference
//! to what runs applied. Sessions a change does not concern keep running:
//! targets keep their LUN table (sessions hold it), LUNs whose definition
//! is unchanged keep their unit (data, reservations, unit attentions), and
//! portals that stay keep their connections. `ctl save` writes the document
//! that runs, so the daemon can start from it. A dry run of any change
//! (`apply`) checks it the same way and says what it would do.

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use blockwire_target::iscsi::catalog::Catalog;
use blockwire_target::iscsi::portal::PortalSet;
use blockwire_target::iscsi::Fabric;
use blockwire_target::scsi::{Activity, AluaState};
use toml::{Table, Value};

use crate::claims::KnownFiles;
use crate::config::{parse_size, LoadOptions};

mod apply;
pub mod edits;

/// A LUN that served a READ or WRITE this recently counts as in use: an
/// initiator is likely to have it open (mounted, in a volume group).
const IN_USE_WINDOW: Duration = Duration::from_secs(10);

/// Backups `save` keeps of the file it replaces (targetcli keeps 10 too).
pub const BACKUPS_KEPT: usize = 10;

/// Why a change was not made.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// The new configuration fails a check; nothing changed.
    #[error("{0}")]
    Invalid(String),
    /// A target, LUN, ACL entry or credential the request names is not there.
    #[error("{0}")]
    NotFound(String),
    /// The change would take away something in use; nothing changed.
    #[error("{0}")]
    InUse(String),
    /// The change was attempted and failed (a portal that cannot bind, a
    /// file that cannot grow, a save that cannot write).
    #[error("{0}")]
    Failed(String),
}

/// What a change did, a line each, for the log and the caller; for a dry
/// run, what it would do, in the same words.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Applied {
    /// What changed (a dry run: what would change, and the files it would
    /// create or grow).
    pub changes: Vec<String>,
    /// Sections that changed in the document but take effect only at the
    /// next start.
    pub restart_needed: Vec<String>,
    /// A dry run: nothing was changed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

/// How a change is made.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChangeMode {
    /// Take away targets and LUNs in use anyway (their sessions are closed).
    pub force: bool,
    /// Check the change and say what it would do, but change nothing.
    pub dry_run: bool,
}

/// Where the running configuration came from.
#[derive(Debug, Clone, Default)]
pub struct Source {
    /// The file SIGHUP reloads and `save` writes (none: the embedded default).
    pub file: Option<PathBuf>,
    /// `--listen`: replaces every portal group's addresses, at start and on
    /// each reload.
    pub listen_override: Option<SocketAddr>,
}

/// The running configuration and the means to change it.
pub struct Live {
    fabric: Arc<Fabric>,
    portals: Arc<PortalSet>,
    opts: LoadOptions,
    source: Source,
    running: tokio::sync::Mutex<Running>,
    /// The iSNS registration, told of every change.
    isns: Option<IsnsLink>,
}

/// Where a live change finds the iSNS client, and what a client it starts
/// obeys.
struct IsnsLink {
    /// The client of `[isns]`, replaced when a change alters the section.
    slot: Arc<crate::isns::Slot>,
    /// The daemon's stop: every client deregisters when it turns true.
    stop: tokio::sync::watch::Receiver<bool>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

struct Running {
    doc: Table,
    /// Each configured listen address, with its portal group's tag, and the
    /// address its portal is bound to (they differ for port 0, which
    /// several groups may list: each gets a port of its own).
    bound: HashMap<(SocketAddr, u16), SocketAddr>,
    /// The RAM LUNs' sizes added up, as the configuration's build counted
    /// them (against `[fabric] ram_limit`).
    ram_lun_bytes: u64,
    /// The keys of the files the running units hold open, as the last
    /// change's check took them (none before the first).
    known_files: KnownFiles,
}

/// Parses configuration text into a document; a syntax error names its
/// line and says what is wrong as `--check` does.
pub fn parse_doc(file: &str, text: &str) -> Result<Table, LiveError> {
    text.parse::<Table>().map_err(|e| {
        let line = e
            .span()
            .map_or(1, |s| crate::config::line_of(text, s.start));
        LiveError::Invalid(format!(
            "{file}:{line}: syntax: {}",
            crate::config::syntax_message(text, &e)
        ))
    })
}

/// Replaces every portal group's listen addresses by `listen` (`--listen`).
pub fn override_listen(doc: &mut Table, listen: SocketAddr) {
    if let Some(Value::Array(groups)) = doc.get_mut("portal_group") {
        for g in groups.iter_mut().filter_map(Value::as_table_mut) {
            g.insert(
                "listen".into(),
                Value::Array(vec![Value::String(listen.to_string())]),
            );
        }
    }
}

/// Applies `--listen` (if given) to a file's document and returns the text to check it by:
/// the file's text with the addresses replaced in place, so that the check's messages name
/// the file's own lines; None when only a rendering of the document carries the override
/// (a portal group without `listen`).
pub fn apply_listen_override(
    doc: &mut Table,
    text: String,
    listen: Option<SocketAddr>,
) -> Option<String> {
    match listen {
        Some(l) => {
            override_listen(doc, l);
            override_listen_text(&text, l)
        }
        None => Some(text),
    }
}

/// The configuration text with every portal group's listen addresses replaced by `listen`
/// (`--listen`) where they are written, each array keeping its lines, so that a check of
/// the text names the file's own lines. None when a portal group has no `listen` to
/// replace (then only a rendering of the document carries the override), and when the text is
/// not a TOML document (the portal groups alone may read where the rest does not: an integer
/// beyond 64 bits elsewhere in it).
pub fn override_listen_text(text: &str, listen: SocketAddr) -> Option<String> {
    text.parse::<Table>().ok()?;
    #[derive(serde::Deserialize)]
    struct Groups {
        #[serde(default)]
        portal_group: Vec<Group>,
    }
    #[derive(serde::Deserialize)]
    struct Group {
        listen: Option<toml::Spanned<Value>>,
    }
    let groups: Groups = toml::from_str(text).ok()?;
    let mut spans = Vec::new();
    for g in groups.portal_group {
        // An array written as one (`listen = [...]`), not a table of dotted keys.
        let listen = g.listen?;
        let written = text.get(listen.span())?;
        if !listen.get_ref().is_array() || !written.starts_with('[') || !written.ends_with(']') {
            return None;
        }
        spans.push(listen.span());
    }
    let address = Value::String(listen.to_string());
    let mut out = text.to_owned();
    spans.sort_by_key(|s| std::cmp::Reverse(s.start));
    for span in spans {
        let newlines = text[span.clone()].matches('\n').count();
        out.replace_range(span, &format!("[{address}{}]", "\n".repeat(newlines)));
    }
    Some(out)
}

/// Where line `line` of a rendering of the document lies, in the words of the
/// configuration ("LUN 3 of iqn...", "portal group 1", "[fabric]"): a control-socket
/// change is checked as such a rendering, whose line numbers nobody has seen.
fn place_in_rendering(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let value_in = |header: usize, key: &str| -> Option<String> {
        lines[header + 1..]
            .iter()
            .take_while(|l| !l.trim_start().starts_with('['))
            .find_map(|l| {
                let (k, v) = l.split_once('=')?;
                (k.trim() == key).then(|| v.trim().trim_matches('"').to_owned())
            })
    };
    let last_header =
        |before: usize, name: &str| (0..before).rev().find(|&i| lines[i].trim() == name);
    let at = line.checked_sub(1).filter(|&i| i < lines.len())?;
    let header = (0..=at)
        .rev()
        .find(|&i| lines[i].trim_start().starts_with('['))?;
    let target_name = |before| last_header(before, "[[target]]").and_then(|t| value_in(t, "name"));
    match lines[header].trim() {
        "[[target]]" => Some(format!("target {}", value_in(header, "name")?)),
        "[[target.lun]]" => Some(format!(
            "LUN {} of {}",
            value_in(header, "id")?,
            target_name(header)?
        )),
        h if h.starts_with("[[target.") => Some(format!("{h} of target {}", target_name(header)?)),
        "[[portal_group]]" => Some(format!("portal group {}", value_in(header, "tag")?)),
        h => Some(h.to_owned()),
    }
}

impl Live {
    /// The running configuration `doc`, served by `fabric` through
    /// `portals`; `bound` maps configured listen addresses to bound ones;
    /// `ram_lun_bytes` is what its build counted of RAM LUNs.
    pub fn new(
        fabric: Arc<Fabric>,
        portals: Arc<PortalSet>,
        opts: LoadOptions,
        source: Source,
        doc: Table,
        bound: HashMap<(SocketAddr, u16), SocketAddr>,
        ram_lun_bytes: u64,
    ) -> Live {
        Live {
            fabric,
            portals,
            opts,
            source,
            running: tokio::sync::Mutex::new(Running {
                doc,
                bound,
                ram_lun_bytes,
                known_files: KnownFiles::default(),
            }),
            isns: None,
        }
    }

    /// Tells the iSNS client in `slot` (if any) of every change from now
    /// on, and starts, replaces or ends it as changes to `[isns]` say;
    /// every client it starts ends at `stop`.
    pub fn with_isns(
        mut self,
        slot: Arc<crate::isns::Slot>,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> Live {
        self.isns = Some(IsnsLink { slot, stop });
        self
    }

    /// The iSNS registration, if `[isns]` configures one.
    pub fn isns(&self) -> Option<Arc<crate::isns::Client>> {
        self.isns.as_ref().and_then(|l| l.slot.get())
    }

    /// The running configuration as TOML.
    pub async fn text(&self) -> String {
        let mut running = self.running.lock().await;
        self.record_runtime_state(&mut running.doc);
        toml::to_string(&running.doc).unwrap_or_default()
    }

    /// Writes into `doc` what changed on the running units without a
    /// change of the document: the ALUA states initiators set, and the
    /// stall switches `lun.stall` turned.
    fn record_runtime_state(&self, doc: &mut Table) {
        self.record_explicit_alua(doc);
        self.record_stalls(doc);
    }

    /// Writes into `doc` each LUN's stall switch as it runs: `lun.stall`
    /// turns it on the unit alone, so a configuration saved after it said
    /// `stalled = true` of a unit running free, and the next start stalled
    /// it (every READ and WRITE waiting).
    fn record_stalls(&self, doc: &mut Table) {
        each_served_target(doc, &self.fabric.catalog(), |t, entry| {
            let Some(luns) = t.get_mut("lun").and_then(Value::as_array_mut) else {
                return;
            };
            for l in luns.iter_mut().filter_map(Value::as_table_mut) {
                let Some(unit) = l
                    .get("id")
                    .and_then(Value::as_integer)
                    .and_then(|id| u16::try_from(id).ok())
                    .and_then(|id| entry.luns.get(id))
                else {
                    continue;
                };
                if unit.is_stalled() {
                    l.insert("stalled".into(), Value::Boolean(true));
                } else {
                    l.remove("stalled");
                }
            }
        });
    }

    /// Writes into `doc` the ALUA states initiators have set with SET
    /// TARGET PORT GROUPS on targets that allow it: a `[target.alua_state]`
    /// entry for each group whose state differs from what `doc` gives it
    /// (the target's own entry, else its portal group's `alua_state`), so
    /// that `config.show` and `save` say what runs and a control-socket
    /// change does not undo them.
    fn record_explicit_alua(&self, doc: &mut Table) {
        let group_states: HashMap<i64, String> = doc
            .get("portal_group")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|g| {
                let tag = g.get("tag")?.as_integer()?;
                let state = g
                    .get("alua_state")
                    .and_then(Value::as_str)
                    .unwrap_or(AluaState::ActiveOptimized.name());
                Some((tag, state.to_owned()))
            })
            .collect();
        each_served_target(doc, &self.fabric.catalog(), |t, entry| {
            if !entry.luns.explicit_alua() {
                return;
            }
            for g in entry.luns.target_port_groups() {
                let key = g.id.to_string();
                let own = t
                    .get("alua_state")
                    .and_then(|s| s.get(&key))
                    .and_then(Value::as_str);
                let configured = own
                    .or_else(|| group_states.get(&i64::from(g.id)).map(String::as_str))
                    .unwrap_or(AluaState::ActiveOptimized.name());
                if configured == g.state.name() {
                    continue;
                }
                if let Some(states) = t
                    .entry("alua_state")
                    .or_insert_with(|| Value::Table(Table::new()))
                    .as_table_mut()
                {
                    states.insert(key, Value::String(g.state.name().to_owned()));
                }
            }
        });
    }

    /// Reads the configuration file again and applies the difference
    /// (SIGHUP; with `mode.dry_run`, only says what it would change). A file
    /// that fails a check changes nothing.
    pub async fn reload(&self, mode: ChangeMode) -> Result<Applied, LiveError> {
        let Some(path) = &self.source.file else {
            return Err(LiveError::NotFound(
                "the daemon runs the embedded default (no --config file): there is nothing to reload; \
                 start it with --config FILE, or change it with the control socket"
                    .into(),
            ));
        };
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| LiveError::Invalid(format!("{name}: cannot read the file: {e}")))?;
        let mut doc = parse_doc(&name, &text)?;
        // The file's own text is checked, so that an error names its line in the file.
        let text = apply_listen_override(&mut doc, text, self.source.listen_override);
        let mut running = self.running.lock().await;
        // Against the stall switches as they run: the file's say what
        // they are to be.
        self.record_stalls(&mut running.doc);
        let mode = ChangeMode {
            force: false,
            ..mode
        };
        self.apply(&mut running, doc, text, mode, &name).await
    }

    /// Changes the running document with `edit` and applies the result;
    /// `mode.force` allows taking away LUNs and targets in use, and
    /// `mode.dry_run` only says what the change would do.
    pub async fn edit(
        &self,
        mode: ChangeMode,
        edit: impl FnOnce(&mut Table) -> Result<(), LiveError>,
    ) -> Result<Applied, LiveError> {
        let mut running = self.running.lock().await;
        self.record_runtime_state(&mut running.doc);
        let mut doc = running.doc.clone();
        edit(&mut doc)?;
        self.apply(&mut running, doc, None, mode, "<control socket change>")
            .await
    }

    /// Writes the running configuration to `path` (default: the file it
    /// was loaded from) atomically: a temporary file in the same directory,
    /// fsync, rename, fsync of the directory. A file it replaces is kept in
    /// `backup/` next to it; the newest [`BACKUPS_KEPT`] backups stay.
    pub async fn save(&self, path: Option<&Path>) -> Result<Saved, LiveError> {
        let path = match (path, &self.source.file) {
            (Some(p), _) => p.to_owned(),
            (None, Some(f)) => f.clone(),
            (None, None) => {
                return Err(LiveError::NotFound(
                    "the daemon runs the embedded default: name the file to write (\"path\")"
                        .into(),
                ))
            }
        };
        // `--listen` replaced the file's listen addresses in the running
        // document: written over the file, the override would become its
        // configuration (and two portal groups would list one address,
        // which the next start refuses).
        if let (Some(listen), Some(file)) = (self.source.listen_override, &self.source.file) {
            if same_file(&path, file) {
                return Err(LiveError::Invalid(format!(
                    "the daemon runs with --listen {listen}, which replaces the listen addresses \
                     of {}: saving over it would write {listen} there. Save to another file \
                     (\"path\"), or restart without --listen",
                    file.display()
                )));
            }
        }
        // One save or change at a time: the document is read and written
        // under the same lock.
        let mut running = self.running.lock().await;
        self.record_runtime_state(&mut running.doc);
        let body = toml::to_string(&running.doc)
            .map_err(|e| LiveError::Failed(format!("cannot write the configuration: {e}")))?;
        let text = format!(
            "# blockwire-target configuration, saved from the running daemon at {}.\n\
             # Start it with: blockwire-target --config {}\n\n{body}",
            utc_stamp(SystemTime::now(), ' '),
            path.display()
        );
        write_atomically(&path, text.as_bytes())
            .map_err(|e| LiveError::Failed(format!("saving to {}: {e}", path.display())))
    }
}

/// Whether `a` and `b` name one file: the same path as written, or the
/// same file on disk.
fn same_file(a: &Path, b: &Path) -> bool {
    if a == b {
        return true;
    }
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// What a save wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Saved {
    /// The file written.
    pub path: PathBuf,
    /// Its size.
    pub bytes: usize,
    /// Where the file it replaced was kept, if there was one.
    pub backup: Option<PathBuf>,
}

/// Writes `bytes` to `path` so that a crash leaves either the old file or
/// the new one, never a mix; the old one is copied to `backup/` first.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<Saved> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("the path names no file"))?
        .to_string_lossy()
        .into_owned();
    let backup = if path.exists() {
        let bdir = dir.join("backup");
        std::fs::create_dir_all(&bdir)?;
        let b = bdir.join(format!("{name}.{}", utc_stamp(SystemTime::now(), 'T')));
        std::fs::copy(path, &b)?;
        // On the disk before the new file replaces the old: a crash right
        // after the rename must not leave the only copy of the old
        // configuration as an empty or torn backup.
        std::fs::File::open(&b)?.sync_all()?;
        std::fs::File::open(&bdir)?.sync_all()?;
        prune_backups(&bdir, &name)?;
        Some(b)
    } else {
        None
    };
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode_owner_only()
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(&dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    Ok(Saved {
        path: path.to_owned(),
        bytes: bytes.len(),
        backup,
    })
}

/// Owner-only permissions for saved files: they hold CHAP secrets.
trait OwnerOnly {
    fn mode_owner_only(&mut self) -> &mut Self;
}

impl OwnerOnly for std::fs::OpenOptions {
    fn mode_owner_only(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
}

/// Keeps the newest [`BACKUPS_KEPT`] backups of `name` (their names sort by time).
fn prune_backups(bdir: &Path, name: &str) -> std::io::Result<()> {
    let prefix = format!("{name}.");
    // Only `name` and a time stamp: another file's backups ("t.toml.new"'s
    // beside "t.toml"'s) share the prefix but are not these.
    let is_stamp = |s: &str| {
        s.len() == 27
            && s.ends_with('Z')
            && s.as_bytes().get(10) == Some(&b'T')
            && s[..26]
                .bytes()
                .enumerate()
                .all(|(i, b)| i == 10 || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    let mut backups: Vec<PathBuf> = std::fs::read_dir(bdir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                n.to_string_lossy()
                    .strip_prefix(&prefix)
                    .is_some_and(is_stamp)
            })
        })
        .collect();
    backups.sort();
    let excess = backups.len().saturating_sub(BACKUPS_KEPT);
    for old in &backups[..excess] {
        std::fs::remove_file(old)?;
    }
    Ok(())
}

/// `2026-11-26T05:12:33.123456Z`-style UTC time (with `sep` between date
/// and time; ':' becomes '-' in file names).
fn utc_stamp(t: SystemTime, sep: char) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Gregorian, proleptic).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let colon = if sep == 'T' { '-' } else { ':' };
    format!(
        "{year:04}-{month:02}-{day:02}{sep}{:02}{colon}{:02}{colon}{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_micros()
    )
}

/// Why a unit counts as in use, if it does.
fn in_use(a: &Activity) -> Option<String> {
    if a.in_flight > 0 {
        return Some(format!("{} command(s) are running on it", a.in_flight));
    }
    if a.unsaved_registrations > 0 {
        // A cluster's fencing lives there: replaced, a fenced node's
        // writes would be taken again.
        return Some(format!(
            "it holds {} persistent reservation registration(s) kept in memory only (APTPL \
             off), which a new unit would start without (a fenced node could write again)",
            a.unsaved_registrations
        ));
    }
    match a.last_media {
        Some(ago) if ago < IN_USE_WINDOW => Some(format!(
            "it served a READ or WRITE {:.1} s ago",
            ago.as_secs_f64()
        )),
        _ => None,
    }
}

/// Every LUN definition of `doc`, by lower-case target name and LUN.
fn lun_defs(doc: &Table) -> HashMap<(String, u16), &Table> {
    let mut out = HashMap::new();
    for t in tables(doc, "target") {
        let Some(name) = t.get("name").and_then(Value::as_str) else {
            continue;
        };
        for l in tables(t, "lun") {
            if let Some(id) = l
                .get("id")
                .and_then(Value::as_integer)
                .and_then(|i| u16::try_from(i).ok())
            {
                out.insert((name.trim().to_ascii_lowercase(), id), l);
            }
        }
    }
    out
}

/// The tables of the array `key` of `t`.
pub fn tables<'a>(t: &'a Table, key: &str) -> impl Iterator<Item = &'a Table> + 'a {
    t.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_table)
}

/// The strings of the array `key` of `t`.
pub fn strings<'a>(t: &'a Table, key: &str) -> impl Iterator<Item = &'a str> + 'a {
    t.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// A LUN's low-space threshold: changed on the running unit.
pub(super) const LOW_SPACE_KEY: &str = "low_space_threshold";

/// A LUN's QoS ceilings: changed on the running unit.
const QOS_KEYS: [&str; 4] = [
    "iops_limit",
    "bandwidth_limit",
    "initiator_iops_limit",
    "initiator_bandwidth_limit",
];

/// Whether two LUN definitions describe the same unit: equal but for the
/// size (a resize) and the stall switch (a start-up option).
fn same_unit(a: &Table, b: &Table) -> bool {
    // QoS ceilings change on the running unit.
    let of_the_unit =
        |k: &str| !matches!(k, "size" | "stalled" | LOW_SPACE_KEY) && !QOS_KEYS.contains(&k);
    let count = |t: &Table| t.keys().filter(|k| of_the_unit(k)).count();
    count(a) == count(b)
        && a.iter()
            .filter(|(k, _)| of_the_unit(k))
            .all(|(k, v)| b.get(k) == Some(v))
}

fn size_of(v: &Value) -> Option<u64> {
    match v {
        Value::String(s) => parse_size(s),
        Value::Integer(i) => u64::try_from(*i).ok(),
        _ => None,
    }
}

/// Calls `f` with each `[[target]]` table of `doc` that `catalog` serves,
/// and the entry serving it (tables of targets it does not serve are
/// passed over).
fn each_served_target(
    doc: &mut Table,
    catalog: &Catalog,
    mut f: impl FnMut(&mut Table, &Arc<blockwire_target::iscsi::catalog::TargetEntry>),
) {
    let by_name = catalog.targets_by_name();
    let Some(targets) = doc.get_mut("target").and_then(Value::as_array_mut) else {
        return;
    };
    for t in targets.iter_mut().filter_map(Value::as_table_mut) {
        let Some(entry) = t
            .get("name")
            .and_then(Value::as_str)
            .and_then(|n| by_name.get(n))
            .cloned()
        else {
            continue;
        };
        f(t, &entry);
    }
}

fn portal_pairs(c: &Catalog) -> Vec<(SocketAddr, u16)> {
    c.portal_groups
        .iter()
        .flat_map(|g| g.addresses.iter().map(move |a| (*a, g.tag)))
        .collect()
}

/// The iSER settings of each portal group that has any, with its tag:
/// groups without them coming or going change no iSER portal.
fn iser_keys(doc: &Table) -> Vec<(Option<Value>, Option<Value>, Option<Value>)> {
    tables(doc, "portal_group")
        .map(|g| {
            (
                g.get("tag").cloned(),
                g.get("iser").cloned(),
                g.get("iser_listen").cloned(),
            )
        })
        .filter(|(_, iser, listen)| iser.is_some() || listen.is_some())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TargetConfig;

    /// A live configuration of `text`, served by a fabric with no portal
    /// bound, reloading from `file`.
    fn live_of(text: &str, file: &Path) -> Live {
        let built = TargetConfig::from_str("t.toml", text).unwrap_or_else(|e| panic!("{e}"));
        let (_, stop) = tokio::sync::watch::channel(false);
        let fabric = Fabric::new(built.catalog, built.settings, stop);
        let portals = Arc::new(PortalSet::new(fabric.clone()));
        let source = Source {
            file: Some(file.to_path_buf()),
            listen_override: None,
        };
        let doc = parse_doc("t.toml", text).unwrap();
        Live::new(
            fabric,
            portals,
            LoadOptions::default(),
            source,
            doc,
            HashMap::new(),
            built.ram_lun_bytes,
        )
    }

    /// A syntax error at the start of a line (here a key given twice) is
    /// named at that line, as `--check` names it, with what is wrong; the
    /// start-up and a reload read the file this way.
    #[test]
    fn a_syntax_error_names_its_own_line() {
        let text = "[fabric]\nqueue_depth = 1\nqueue_depth = 2\n";
        let LiveError::Invalid(said) = parse_doc("t.toml", text).unwrap_err() else {
            panic!("not a syntax error")
        };
        assert!(said.starts_with("t.toml:3: syntax: "), "{said}");
        let checked = TargetConfig::check_str("t.toml", text, LoadOptions::default());
        assert_eq!(checked.errors[0].line, 3, "{checked:?}");
        // A span inside a character of more than one byte does not panic.
        let text = "[fabric]\nqueue_depth = \"é\u{e9}\"\u{e9} = 1\n";
        assert!(parse_doc("t.toml", text).is_err());
    }

    /// Backups are pruned per file: saving "t.toml" does not count, or
    /// prune, the backups of "t.toml.new" beside it, nor they its own.
    #[test]
    fn saving_one_file_keeps_its_backup_beside_another_files() {
        let dir = tempfile::tempdir().unwrap();
        let other = dir.path().join("t.toml.new");
        for _ in 0..=BACKUPS_KEPT {
            write_atomically(&other, b"x").unwrap();
        }
        let t = dir.path().join("t.toml");
        write_atomically(&t, b"old").unwrap();
        let saved = write_atomically(&t, b"new").unwrap();
        let backup = saved.backup.expect("a backup of the old file");
        assert!(backup.exists(), "{} was pruned", backup.display());
        assert_eq!(std::fs::read(&backup).unwrap(), b"old");
    }

    /// A portal group and a target of one RAM LUN.
    const ONE_RAM_LUN: &str = "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:0\"]\n\n\
        [[target]]\nname = \"iqn.2026-11.io.blockwire:disk\"\n\n\
        [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n";

    /// A Live serving `text` from `file`, as the daemon starts it with `--listen`
    /// when `listen` is given.
    fn live_listening(text: &str, file: &Path, listen: Option<SocketAddr>) -> Live {
        let mut doc = parse_doc("t.toml", text).unwrap();
        let text = match listen {
            Some(l) => {
                override_listen(&mut doc, l);
                toml::to_string(&doc).unwrap()
            }
            None => text.to_owned(),
        };
        let mut live = live_of(&text, file);
        live.source.listen_override = listen;
        live
    }

    #[tokio::test]
    async fn a_reload_names_the_line_of_the_file_not_of_a_rendering() {
        // Comments, blank lines and a listen array over three lines: a rendering of the
        // document has none of them, so its lines are not the file's.
        let text =
            "# blockwire\n\n[[portal_group]]\ntag = 1\nlisten = [\n  \"127.0.0.9:3260\",\n]\n\n\
                    # disks\n[[target]]\nname = \"iqn.2026-11.io.blockwire:disk\"\n\n\
                    [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n";
        let broken = format!(
            "{text}\n# a file in a directory that is not there\n[[target.lun]]\nid = 1\n\
             backstore = \"file\"\npath = \"/nonexistent-blockwire-dir/disk.img\"\nsize = \"1M\"\n"
        );
        let line = broken
            .lines()
            .position(|l| l.starts_with("path ="))
            .unwrap()
            + 1;
        assert_eq!(line, 22);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        for listen in [None, Some("127.0.0.1:0".parse().unwrap())] {
            let live = live_listening(text, &file, listen);
            std::fs::write(&file, &broken).unwrap();
            let e = live
                .reload(ChangeMode::default())
                .await
                .unwrap_err()
                .to_string();
            let at = format!("{}:{line}: target.lun.path: ", file.display());
            assert!(e.starts_with(&at), "--listen {listen:?}: {e}");
        }
    }

    /// A daemon started with `--listen` does not save its override over
    /// the file it was started from (the file keeps its own addresses); it
    /// saves to another file, and without `--listen` to its own.
    #[tokio::test]
    async fn a_listen_override_is_not_saved_over_the_configuration_file() {
        let text = "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.9:3260\"]\n\n\
            [[portal_group]]\ntag = 2\nlisten = [\"127.0.0.10:3260\"]\n\n\
            [[target]]\nname = \"iqn.2026-11.io.blockwire:disk\"\n\n\
            [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n";
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        std::fs::write(&file, text).unwrap();
        let live = live_listening(text, &file, Some("127.0.0.1:0".parse().unwrap()));
        for path in [
            None,
            Some(file.clone()),
            Some(dir.path().join(".").join("t.toml")),
        ] {
            let e = live.save(path.as_deref()).await.unwrap_err().to_string();
            assert!(
                e.contains("runs with --listen 127.0.0.1:0"),
                "{path:?}: {e}"
            );
        }
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            text,
            "the file untouched"
        );
        let elsewhere = dir.path().join("running.toml");
        live.save(Some(&elsewhere)).await.unwrap();
        assert!(std::fs::read_to_string(&elsewhere)
            .unwrap()
            .contains("127.0.0.1:0"));
        let plain = live_listening(text, &file, None);
        plain.save(None).await.unwrap();
    }

    #[test]
    fn listen_overrides_keep_the_lines_of_the_file() {
        let text = "[[portal_group]]\ntag = 1\nlisten = [\n  \"127.0.0.1:3260\", # first\n  \
                    \"[::1]:3260\",\n]\n\n[[portal_group]]\ntag = 2\nlisten = [\"127.0.0.2:3260\"]\n\
                    [[target]]\nname = \"iqn.2026-11.io.blockwire:disk\"\n";
        let listen: SocketAddr = "127.0.0.3:3261".parse().unwrap();
        let out = override_listen_text(text, listen).unwrap();
        assert_eq!(out.lines().count(), text.lines().count(), "{out}");
        assert_eq!(out.lines().nth(10), Some("[[target]]"), "{out}");
        let mut doc = parse_doc("t.toml", text).unwrap();
        override_listen(&mut doc, listen);
        assert_eq!(parse_doc("t.toml", &out).unwrap(), doc);
        // A group with no listen to replace: only a rendering can carry the override.
        assert!(override_listen_text("[[portal_group]]\ntag = 1\n", listen).is_none());
    }

    #[tokio::test]
    async fn a_value_with_hundreds_of_quotes_in_a_row_is_written_and_read_back() {
        // TOML's writer counts quotes in a row to choose a string's form;
        // toml 0.8's count overflowed at 256 (a panic where overflow
        // checks are on: tests, fuzzing), toml 1's saturates.
        // (A TargetAlias is refused past 255 bytes: the value is put in the
        // running document by hand, as a long path of a LUN file could be.)
        let dir = tempfile::tempdir().unwrap();
        let alias = format!("a{}b{}c", "\"".repeat(300), "'".repeat(300));
        let live = live_of(ONE_RAM_LUN, &dir.path().join("t.toml"));
        {
            let mut running = live.running.lock().await;
            let target = running
                .doc
                .get_mut("target")
                .and_then(Value::as_array_mut)
                .and_then(|a| a.first_mut())
                .and_then(Value::as_table_mut)
                .unwrap();
            target.insert("alias".into(), Value::String(alias.clone()));
        }
        let shown: Table = live.text().await.parse().unwrap();
        let t = tables(&shown, "target").next().unwrap();
        assert_eq!(t.get("alias").and_then(Value::as_str), Some(alias.as_str()));
    }

    #[tokio::test]
    async fn a_file_one_change_created_is_held_against_the_next_that_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let live = live_of(ONE_RAM_LUN, &dir.path().join("t.toml"));
        let add = |id: u16, path: &Path| {
            let lun: Table = format!(
                "id = {id}\nbackstore = \"file\"\npath = \"{}\"\nsize = \"1M\"\n",
                path.display()
            )
            .parse()
            .unwrap();
            move |d: &mut Table| edits::add_lun(d, "iqn.2026-11.io.blockwire:disk", lun)
        };
        let img = dir.path().join("new.img");
        let other = dir.path().join("other.img");
        live.edit(ChangeMode::default(), add(1, &img))
            .await
            .unwrap();
        assert!(img.exists(), "the change created it");
        // LUN 1 keeps serving through every change that follows: the file
        // it holds is known by what the file is now, not by the path it
        // had before it was created.
        let refused = |e: LiveError| {
            let e = e.to_string();
            assert!(e.contains("and also the data file of LUN 1 of"), "{e}");
        };
        refused(
            live.edit(ChangeMode::default(), add(2, &img))
                .await
                .unwrap_err(),
        );
        live.edit(ChangeMode::default(), add(3, &other))
            .await
            .unwrap();
        refused(
            live.edit(ChangeMode::default(), add(4, &img))
                .await
                .unwrap_err(),
        );
        let dotted = dir.path().join("sub/../new.img");
        refused(
            live.edit(ChangeMode::default(), add(4, &dotted))
                .await
                .unwrap_err(),
        );
    }

    #[tokio::test]
    async fn a_control_change_names_the_unit_at_fault_not_a_line() {
        let dir = tempfile::tempdir().unwrap();
        let text = ONE_RAM_LUN;
        let live = live_of(text, &dir.path().join("t.toml"));
        let add = |lun: &str| {
            let lun: Table = lun.parse().unwrap();
            move |d: &mut Table| edits::add_lun(d, "iqn.2026-11.io.blockwire:disk", lun)
        };
        let e = live
            .edit(
                ChangeMode::default(),
                add("id = 1\nbackstore = \"ram\"\nsize = \"ten\"\n"),
            )
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "<control socket change>: LUN 1 of iqn.2026-11.io.blockwire:disk: target.lun.size: "
            ),
            "{e}"
        );
        live.edit(
            ChangeMode::default(),
            add("id = 1\nbackstore = \"ram\"\nsize = \"1M\"\nserial = \"abc\"\n"),
        )
        .await
        .unwrap();
        let e = live
            .edit(
                ChangeMode::default(),
                add("id = 2\nbackstore = \"ram\"\nsize = \"1M\"\nserial = \"ABC\"\n"),
            )
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("serial number \"ABC\" of LUN 1 of iqn.2026-11.io.blockwire:disk: "),
            "{e}"
        );
        assert!(!e.contains("line"), "a line of a text nobody sees: {e}");
    }

    #[tokio::test]
    async fn a_reload_may_not_rename_a_target_in_case_only() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        let text = ONE_RAM_LUN;
        let live = live_of(text, &file);
        let renamed = text.replace("blockwire:disk", "blockwire:Disk");
        std::fs::write(&file, &renamed).unwrap();
        let e = live
            .reload(ChangeMode::default())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("is renamed iqn.2026-11.io.blockwire:Disk (case only)"),
            "{e}"
        );
        let served = live.fabric.catalog();
        assert_eq!(served.targets[0].name, "iqn.2026-11.io.blockwire:disk");
        assert!(live.text().await.contains("blockwire:disk"));
        // Another change of the same target goes through.
        std::fs::write(&file, text.replace("size = \"1M\"", "size = \"2M\"")).unwrap();
        live.reload(ChangeMode::default()).await.unwrap();
        assert_eq!(
            live.fabric.catalog().targets[0]
                .luns
                .get(0)
                .unwrap()
                .blocks(),
            4096
        );
    }

    /// A LUN's stall switch is saved as it runs: `lun.stall` turns it on
    /// the unit alone, and a configuration saved after it still said
    /// `stalled = true` of a unit running free, so the next start stalled
    /// it. A reload turns it as the file says (it said nothing, and did
    /// nothing).
    #[tokio::test]
    async fn the_stall_switch_is_saved_as_it_runs_and_a_reload_turns_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        let stalled = ONE_RAM_LUN.replace("size = \"1M\"", "size = \"1M\"\nstalled = true");
        assert_ne!(stalled, ONE_RAM_LUN);
        std::fs::write(&file, &stalled).unwrap();
        let live = live_of(&stalled, &file);
        let unit = live.fabric.catalog().targets[0].luns.get(0).unwrap();
        assert!(unit.is_stalled());
        unit.set_stalled(false);
        assert!(
            !live.text().await.contains("stalled"),
            "{}",
            live.text().await
        );
        live.save(None).await.unwrap();
        assert!(!std::fs::read_to_string(&file).unwrap().contains("stalled"));
        // The file stalls it again, and then lets it go.
        std::fs::write(&file, &stalled).unwrap();
        let applied = live.reload(ChangeMode::default()).await.unwrap();
        assert!(unit.is_stalled(), "{:?}", applied.changes);
        assert!(
            applied.changes.iter().any(|c| c.contains("stalled")),
            "{:?}",
            applied.changes
        );
        std::fs::write(&file, ONE_RAM_LUN).unwrap();
        live.reload(ChangeMode::default()).await.unwrap();
        assert!(!unit.is_stalled());
    }

    /// A RAM LUN's blocks live in memory only: a reload that rebuilds it
    /// from a changed definition (here a default written out) would serve
    /// an empty unit in its place, so it is refused, even when the LUN has
    /// been quiet, unless forced.
    #[tokio::test]
    async fn a_changed_definition_keeps_a_ram_luns_data_unless_forced() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        let live = live_of(ONE_RAM_LUN, &file);
        let first_block = |live: &Live| {
            let lu = live.fabric.catalog().targets[0].luns.get(0).unwrap();
            let mut b = [0u8; 512];
            lu.config().backstore.read_at(0, &mut b).unwrap();
            b
        };
        let lu = live.fabric.catalog().targets[0].luns.get(0).unwrap();
        lu.config().backstore.write_at(0, &[7; 512]).unwrap();
        std::fs::write(&file, format!("{ONE_RAM_LUN}read_only = false\n")).unwrap();
        let e = live.reload(ChangeMode::default()).await.unwrap_err();
        assert!(
            matches!(&e, LiveError::InUse(m) if m.contains("in memory only")),
            "{e:?}"
        );
        assert_eq!(first_block(&live), [7; 512], "the data are still served");
        // A resize alone keeps the unit and its data.
        std::fs::write(&file, ONE_RAM_LUN.replace("\"1M\"", "\"2M\"")).unwrap();
        live.reload(ChangeMode::default()).await.unwrap();
        assert_eq!(first_block(&live), [7; 512]);
        // The control socket's change is refused the same way, and made
        // when forced (a reload is never forced).
        let write_out_default = |d: &mut Table| {
            let lun = d
                .get_mut("target")
                .and_then(Value::as_array_mut)
                .and_then(|a| a.first_mut())
                .and_then(|t| t.get_mut("lun"))
                .and_then(Value::as_array_mut)
                .and_then(|a| a.first_mut())
                .and_then(Value::as_table_mut)
                .expect("the LUN's table");
            lun.insert("read_only".into(), Value::Boolean(false));
            Ok(())
        };
        let e = live
            .edit(ChangeMode::default(), write_out_default)
            .await
            .unwrap_err();
        assert!(matches!(&e, LiveError::InUse(_)), "{e:?}");
        assert_eq!(first_block(&live), [7; 512]);
        let forced = ChangeMode {
            force: true,
            dry_run: false,
        };
        live.edit(forced, write_out_default).await.unwrap();
        assert_eq!(first_block(&live), [0; 512]);
    }

    #[tokio::test]
    async fn a_dry_run_says_what_the_change_would_do_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        let live = live_of(ONE_RAM_LUN, &file);
        let disk = dir.path().join("d1.img");
        let lun: Table = format!("id = 1\nbackstore = \"file\"\npath = {disk:?}\nsize = \"1M\"\n")
            .parse()
            .unwrap();
        let add = |lun: Table| {
            move |d: &mut Table| edits::add_lun(d, "iqn.2026-11.io.blockwire:disk", lun)
        };
        let dry = ChangeMode {
            force: false,
            dry_run: true,
        };
        let served = live.fabric.catalog();
        let text = live.text().await;

        let said = live.edit(dry, add(lun.clone())).await.unwrap();
        assert!(said.dry_run);
        let added = format!(
            "LUN 1 of iqn.2026-11.io.blockwire:disk added: file {} (1 MiB, cached",
            disk.display()
        );
        assert!(
            said.changes.iter().any(|c| c.starts_with(&added)),
            "{said:?}"
        );
        assert!(
            said.changes.iter().any(|c| c
                == &format!(
                    "target.lun.path: {} does not exist: it will be created (1048576 bytes)",
                    disk.display()
                )),
            "{said:?}"
        );
        assert!(!disk.exists(), "a dry run created {}", disk.display());
        assert!(Arc::ptr_eq(&served, &live.fabric.catalog()));
        assert_eq!(served.targets[0].luns.lun_ids(), [0]);
        assert_eq!(live.text().await, text);

        // The change itself says the same, but for what only opening the
        // file can tell (its data paths, an atomic-write journal).
        let done = live.edit(ChangeMode::default(), add(lun)).await.unwrap();
        assert!(!done.dry_run);
        assert!(
            done.changes.iter().any(|c| c.starts_with(&added)),
            "{done:?}"
        );
        assert!(disk.exists());
        assert_eq!(live.fabric.catalog().targets[0].luns.lun_ids(), [0, 1]);

        // A resize and a reload of an edited file, dry: the unit keeps its
        // size and the document its text.
        let unit = live.fabric.catalog().targets[0].luns.get(0).unwrap();
        let resize = |d: &mut Table| edits::resize_lun(d, "iqn.2026-11.io.blockwire:disk", 0, "2M");
        let said = live.edit(dry, resize).await.unwrap();
        assert_eq!(
            said.changes,
            [
                "LUN 0 of iqn.2026-11.io.blockwire:disk resized from 1048576 to 2097152 bytes \
              (initiators hear CAPACITY DATA HAS CHANGED)"
            ]
        );
        assert_eq!(unit.config().backstore.size(), 1 << 20);
        let text = live.text().await;
        std::fs::write(&file, &text).unwrap();
        let mut edited: Table = text.parse().unwrap();
        edits::remove_lun(&mut edited, "iqn.2026-11.io.blockwire:disk", 1).unwrap();
        edits::acl_add(
            &mut edited,
            "iqn.2026-11.io.blockwire:disk",
            "iqn.2026-11.io.example:h1",
        )
        .unwrap();
        std::fs::write(&file, toml::to_string(&edited).unwrap()).unwrap();
        let said = live.reload(dry).await.unwrap();
        assert_eq!(
            said.changes,
            [
                "LUN 1 of iqn.2026-11.io.blockwire:disk removed",
                "access list of iqn.2026-11.io.blockwire:disk changed"
            ]
        );
        assert_eq!(live.fabric.catalog().targets[0].luns.lun_ids(), [0, 1]);
        assert_eq!(live.text().await, text);
        let done = live.reload(ChangeMode::default()).await.unwrap();
        assert_eq!(done.changes, said.changes);
        assert_eq!(live.fabric.catalog().targets[0].luns.lun_ids(), [0]);
    }

    /// A dry run reads an existing file named as a LUN's atomic-write
    /// journal, as the change would: one that is not a journal is refused
    /// by both, in the same words, and nothing is created.
    #[tokio::test]
    async fn a_dry_run_refuses_a_journal_that_the_change_would_refuse() {
        let dir = tempfile::tempdir().unwrap();
        let live = live_of(ONE_RAM_LUN, &dir.path().join("t.toml"));
        let not_a_journal = dir.path().join("data.img");
        std::fs::write(&not_a_journal, vec![7u8; 8192]).unwrap();
        let disk = dir.path().join("d1.img");
        let lun: Table = format!(
            "id = 1\nbackstore = \"file\"\npath = {disk:?}\nsize = \"1M\"\natomic_journal = {not_a_journal:?}\n"
        )
        .parse()
        .unwrap();
        let add = |lun: Table| {
            move |d: &mut Table| edits::add_lun(d, "iqn.2026-11.io.blockwire:disk", lun)
        };
        let dry = ChangeMode {
            force: false,
            dry_run: true,
        };
        let said = live.edit(dry, add(lun.clone())).await.unwrap_err();
        let done = live
            .edit(ChangeMode::default(), add(lun))
            .await
            .unwrap_err();
        assert!(matches!(said, LiveError::Invalid(_)), "{said:?}");
        assert_eq!(said.to_string(), done.to_string());
        assert!(
            said.to_string().contains("not an atomic-write journal"),
            "{said}"
        );
        assert_eq!(std::fs::read(&not_a_journal).unwrap(), vec![7u8; 8192]);
        assert_eq!(live.fabric.catalog().targets[0].luns.lun_ids(), [0]);
    }

    #[tokio::test]
    async fn a_change_that_adds_ram_luns_past_the_ram_limit_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let text = ONE_RAM_LUN;
        let live = live_of(text, &dir.path().join("t.toml"));
        let add = |id: u16, size: &str| {
            let lun: Table = format!("id = {id}\nbackstore = \"ram\"\nsize = \"{size}\"\n")
                .parse()
                .unwrap();
            move |d: &mut Table| edits::add_lun(d, "iqn.2026-11.io.blockwire:disk", lun)
        };
        let said = |a: &Applied| a.changes.iter().any(|c| c.contains("[fabric] ram_limit"));
        let small = live
            .edit(ChangeMode::default(), add(1, "1M"))
            .await
            .unwrap();
        assert!(!said(&small), "{small:?}");
        // 100 TiB: more than any machine's memory, thin as every RAM LUN.
        let huge = live
            .edit(ChangeMode::default(), add(2, "100T"))
            .await
            .unwrap();
        assert!(said(&huge), "{huge:?}");
        let e = live.fabric.catalog().targets[0].luns.get(2).unwrap();
        assert_eq!(e.config().backstore.size(), 100 << 40);
    }

    #[test]
    fn utc_stamps_are_civil_dates() {
        let t = UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        assert_eq!(utc_stamp(t, ' '), "2026-11-18 11:06:40.000000Z");
        assert_eq!(utc_stamp(UNIX_EPOCH, 'T'), "1970-01-01T00-00-00.000000Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert!(utc_stamp(leap, ' ').starts_with("2000-02-29 "));
    }

    #[test]
    fn saves_replace_atomically_and_keep_ten_backups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("target.toml");
        let first = write_atomically(&path, b"one").unwrap();
        assert!(first.backup.is_none());
        for i in 0..12 {
            let s = write_atomically(&path, format!("v{i}").as_bytes()).unwrap();
            let b = s.backup.unwrap();
            let before = if i == 0 {
                "one".to_string()
            } else {
                format!("v{}", i - 1)
            };
            assert_eq!(std::fs::read_to_string(&b).unwrap(), before);
        }
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "v11");
        let kept = std::fs::read_dir(dir.path().join("backup"))
            .unwrap()
            .count();
        assert_eq!(kept, BACKUPS_KEPT);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "saved files hold CHAP secrets");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn a_unit_is_the_same_across_a_resize_but_not_a_new_backstore() {
        let a: Table = "id = 0\nbackstore = \"ram\"\nsize = \"1G\"\n"
            .parse()
            .unwrap();
        let b: Table = "id = 0\nbackstore = \"ram\"\nsize = \"2G\"\n"
            .parse()
            .unwrap();
        let c: Table = "id = 0\nbackstore = \"null\"\nsize = \"1G\"\n"
            .parse()
            .unwrap();
        assert!(same_unit(&a, &b));
        assert!(!same_unit(&a, &c));
    }

    /// A RAM store that counts its flushes and fails each with EIO.
    #[derive(Debug)]
    struct FailsFlushes {
        ram: blockwire_target::backstore::RamBackstore,
        flushes: std::sync::atomic::AtomicUsize,
    }

    impl blockwire_target::backstore::Backstore for FailsFlushes {
        fn size(&self) -> u64 {
            self.ram.size()
        }
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
            self.ram.read_at(offset, buf)
        }
        fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
            self.ram.write_at(offset, data)
        }
        fn flush(&self) -> std::io::Result<()> {
            self.flushes
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Err(std::io::Error::other("the disk went away"))
        }
        fn describe(&self) -> String {
            "fails flushes".into()
        }
    }

    /// A unit taken out of service (a LUN removed from a target that
    /// stays, or every LUN of a removed target) has its write cache
    /// written back: no initiator can send it SYNCHRONIZE CACHE any more.
    /// A flush that fails is named in the change's report, with the unit.
    #[tokio::test]
    async fn units_taken_out_of_service_are_flushed_and_a_failure_is_reported() {
        let two_targets = format!(
            "{ONE_RAM_LUN}\n[[target.lun]]\nid = 1\nbackstore = \"ram\"\nsize = \"1M\"\n\n\
             [[target]]\nname = \"iqn.2026-11.io.blockwire:other\"\n\n\
             [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        std::fs::write(&file, &two_targets).unwrap();
        let live = live_of(&two_targets, &file);
        let stores: Vec<Arc<FailsFlushes>> = (0..2)
            .map(|_| {
                Arc::new(FailsFlushes {
                    ram: blockwire_target::backstore::RamBackstore::new(1 << 20),
                    flushes: Default::default(),
                })
            })
            .collect();
        let catalog = live.fabric.catalog();
        let by_name = catalog.targets_by_name();
        for (store, (target, lun)) in stores.iter().zip([
            ("iqn.2026-11.io.blockwire:disk", 1),
            ("iqn.2026-11.io.blockwire:other", 0),
        ]) {
            let table = &by_name.get(target).unwrap().luns;
            table.remove(lun).unwrap();
            let cfg = blockwire_target::scsi::LuConfig::new(store.clone());
            table
                .add(lun, Arc::new(blockwire_target::scsi::LogicalUnit::new(cfg)))
                .unwrap();
        }
        std::fs::write(&file, ONE_RAM_LUN).unwrap();
        let applied = live.reload(ChangeMode::default()).await.unwrap();
        for store in &stores {
            assert_eq!(
                store.flushes.load(std::sync::atomic::Ordering::SeqCst),
                1,
                "{applied:?}"
            );
        }
        for unit in [
            "LUN 1 of iqn.2026-11.io.blockwire:disk",
            "LUN 0 of iqn.2026-11.io.blockwire:other",
        ] {
            let said = format!("{unit}: its final flush failed (the disk went away)");
            assert!(
                applied.changes.iter().any(|c| c.starts_with(&said)),
                "{said} in {applied:?}"
            );
        }
    }

    /// A RAM LUN's blocks live in this process alone: a reload that shrinks
    /// one holding data past the new end is refused (it would drop them for
    /// good), naming the bytes; forced, or with nothing written there, the
    /// shrink goes ahead.
    #[tokio::test]
    async fn shrinking_a_ram_lun_with_data_past_the_new_end_needs_force() {
        let four = ONE_RAM_LUN.replace("size = \"1M\"", "size = \"4M\"");
        let two = ONE_RAM_LUN.replace("size = \"1M\"", "size = \"2M\"");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        std::fs::write(&file, &four).unwrap();
        let live = live_of(&four, &file);
        let unit = live.fabric.catalog().targets[0].luns.get(0).unwrap();
        let store = unit.config().backstore.clone();
        store.write_at(3 << 20, &[0x5a; 512]).unwrap();
        std::fs::write(&file, &two).unwrap();
        let e = live
            .reload(ChangeMode::default())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "shrinking LUN 0 of iqn.2026-11.io.blockwire:disk: it holds 512 bytes \
                        of data past the new end (2097152 bytes)"
            ) && e.contains("nothing was changed"),
            "{e}"
        );
        assert_eq!(store.size(), 4 << 20);
        // Written below the new end only: the shrink goes ahead.
        store.discard(3 << 20, 512).unwrap();
        store.write_at(1 << 20, &[0x5a; 512]).unwrap();
        live.reload(ChangeMode::default()).await.unwrap();
        assert_eq!(store.size(), 2 << 20);
        // Forced, a shrink over written blocks goes ahead too.
        store.write_at((2 << 20) - 512, &[0x5a; 512]).unwrap();
        let one = ONE_RAM_LUN;
        std::fs::write(&file, one).unwrap();
        assert!(live.reload(ChangeMode::default()).await.is_err());
        let applied = live
            .edit(
                ChangeMode {
                    force: true,
                    ..ChangeMode::default()
                },
                |doc| {
                    *doc = parse_doc("t.toml", one).unwrap();
                    Ok(())
                },
            )
            .await
            .unwrap();
        assert_eq!(store.size(), 1 << 20, "{applied:?}");
    }

    /// A login that passed its last check against the catalog when a
    /// change taking its initiator off the access list began is attached
    /// before that change lists the sessions to close, and is closed by
    /// it. Before, the change listed sessions as it started: a login
    /// attaching meanwhile kept its session under the new access list.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_login_admitted_while_a_change_revokes_it_is_closed_by_that_change() {
        const A: &str = "iqn.2026-11.io.blockwire.test:a";
        const B: &str = "iqn.2026-11.io.blockwire.test:b";
        let allow = |names: &str| {
            ONE_RAM_LUN.replace(
                "name = \"iqn.2026-11.io.blockwire:disk\"\n",
                &format!("name = \"iqn.2026-11.io.blockwire:disk\"\nallow = [{names}]\n"),
            )
        };
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        let both = allow(&format!("\"{A}\", \"{B}\""));
        std::fs::write(&file, &both).unwrap();
        let live = Arc::new(live_of(&both, &file));
        std::fs::write(&file, allow(&format!("\"{B}\""))).unwrap();
        // A's login has passed its check: it holds the gate until attached.
        let gate = live.fabric.admission_gate();
        let target = live.fabric.catalog().targets[0].clone();
        assert!(target.acl.allows(A));
        let change = tokio::spawn({
            let live = live.clone();
            async move { live.reload(ChangeMode::default()).await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let session = live
            .fabric
            .sessions
            .attach(blockwire_target::iscsi::session::SessionRequest {
                initiator_name: A.into(),
                isid: [0x80, 0, 0, 0, 0, 1],
                tsih: 0,
                cid: 1,
                target: Some(target),
                tpgt: 1,
                portal: "127.0.0.1:3260".parse().unwrap(),
                peer: None,
                params: Default::default(),
            })
            .unwrap();
        drop(gate);
        let applied = tokio::time::timeout(Duration::from_secs(10), change)
            .await
            .expect("the change ends")
            .unwrap()
            .unwrap();
        let closed = format!(
            "session {A} (TSIH {}) closed: {A} is no longer in the access list",
            session.tsih
        );
        assert!(
            applied.changes.iter().any(|c| c.starts_with(&closed)),
            "{closed} in {applied:?}"
        );
        assert!(live.fabric.sessions.all().is_empty(), "A's session stayed");
    }
}
