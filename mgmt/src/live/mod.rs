//! Live changes to a running target. Every change, a control-socket call
//! or a SIGHUP reload, is a whole new configuration document: it is checked
//! exactly like a file at start-up, and only if it passes is the difference
//! to what runs applied. Sessions a change does not concern keep running:
//! targets keep their LUN table (sessions hold it), LUNs whose definition
//! is unchanged keep their unit (data, reservations, unit attentions), and
//! portals that stay keep their connections. `ctl save` writes the document
//! that runs, so the daemon can start from it.

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use blockwire_target::backstore::ram_budget::RamBudget;
use blockwire_target::iscsi::catalog::{Catalog, TargetEntry};
use blockwire_target::iscsi::portal::{Portal, PortalSet};
use blockwire_target::iscsi::Fabric;
use blockwire_target::scsi::Activity;
use toml::{Table, Value};
use tracing::{info, warn};

use crate::config::{parse_size, LoadOptions, Reuse, TargetConfig};

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

/// What a change did, a line each, for the log and the caller.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Applied {
    /// What changed.
    pub changes: Vec<String>,
    /// Sections that changed in the document but take effect only at the
    /// next start.
    pub restart_needed: Vec<String>,
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
    isns: Option<Arc<crate::isns::Client>>,
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
}

/// Parses configuration text into a document; a syntax error names its line.
pub fn parse_doc(file: &str, text: &str) -> Result<Table, LiveError> {
    text.parse::<Table>().map_err(|e| {
        let line = e.span().map_or(0, |s| {
            text[..s.start.min(text.len())].lines().count().max(1)
        });
        LiveError::Invalid(format!("{file}:{line}: syntax: {}", e.message()))
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
/// replace (then only a rendering of the document carries the override).
pub fn override_listen_text(text: &str, listen: SocketAddr) -> Option<String> {
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
            }),
            isns: None,
        }
    }

    /// Tells `client` of every change from now on (`[isns]`).
    pub fn with_isns(mut self, client: Arc<crate::isns::Client>) -> Live {
        self.isns = Some(client);
        self
    }

    /// The iSNS registration, if `[isns]` configured one.
    pub fn isns(&self) -> Option<&Arc<crate::isns::Client>> {
        self.isns.as_ref()
    }

    /// The running configuration as TOML.
    pub async fn text(&self) -> String {
        toml::to_string(&self.running.lock().await.doc).unwrap_or_default()
    }

    /// Reads the configuration file again and applies the difference
    /// (SIGHUP). A file that fails a check changes nothing.
    pub async fn reload(&self) -> Result<Applied, LiveError> {
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
        self.apply(&mut running, doc, text, false, &name).await
    }

    /// Changes the running document with `edit` and applies the result;
    /// `force` allows taking away LUNs and targets in use.
    pub async fn edit(
        &self,
        force: bool,
        edit: impl FnOnce(&mut Table) -> Result<(), LiveError>,
    ) -> Result<Applied, LiveError> {
        let mut running = self.running.lock().await;
        let mut doc = running.doc.clone();
        edit(&mut doc)?;
        self.apply(&mut running, doc, None, force, "<control socket change>")
            .await
    }

    /// Checks `doc` and applies what differs from the running document;
    /// `text` is the text `doc` was read from (none: a rendering of `doc` is
    /// checked, and errors say where in the configuration instead of a line).
    async fn apply(
        &self,
        running: &mut Running,
        doc: Table,
        text: Option<String>,
        force: bool,
        origin: &str,
    ) -> Result<Applied, LiveError> {
        let rendered = text.is_none();
        let text = match text {
            Some(t) => t,
            None => toml::to_string(&doc)
                .map_err(|e| LiveError::Invalid(format!("cannot write the configuration: {e}")))?,
        };
        let old = self.fabric.catalog();
        let mut applied = Applied::default();

        // Units that stay: the same LUN table (size and the stall switch
        // aside) in a target of the same name.
        let old_luns = lun_defs(&running.doc);
        let old_by_name = old.targets_by_name();
        let mut reuse = Reuse::new();
        let mut resizes = Vec::new();
        for (key, def) in lun_defs(&doc) {
            let Some(before) = old_luns.get(&key) else {
                continue;
            };
            let Some(unit) = old_by_name.get(&key.0).and_then(|t| t.luns.get(key.1)) else {
                continue;
            };
            if same_unit(before, &def) {
                if before.get("size") != def.get("size") {
                    let size = def.get("size").and_then(size_of).ok_or_else(|| {
                        LiveError::Invalid(format!(
                            "LUN {} of {}: give size as e.g. \"2G\" to resize it",
                            key.1, key.0
                        ))
                    })?;
                    resizes.push((key.clone(), unit.clone(), size));
                }
                reuse.insert(key, unit);
            }
        }
        let built =
            TargetConfig::from_str_reusing(origin, &text, self.opts, Some(&reuse), rendered)
                .map_err(|e| {
                    let located = match rendered
                        .then(|| place_in_rendering(&text, e.line))
                        .flatten()
                    {
                        Some(place) => format!("{origin}: {place}: {}: {}", e.field, e.message),
                        None => e.to_string(),
                    };
                    LiveError::Invalid(format!("{located}; nothing was changed"))
                })?;
        let new = built.catalog.clone();
        let ram_lun_bytes = built.ram_lun_bytes;
        let new_by_name = new.targets_by_name();
        // A target renamed in case only is the same target to initiators
        // (iSCSI names compare case-insensitively), but its LUNs' derived
        // identities and its saved reservations' file follow the name as
        // written: the running units would keep theirs, and the next start
        // would present new disks without their reservations.
        for nt in &new.targets {
            if let Some(ot) = old_by_name.get(&nt.name).filter(|ot| ot.name != nt.name) {
                return Err(LiveError::Invalid(format!(
                    "target {} is renamed {} (case only): its LUNs' serial numbers and NAA \
                     identifiers (unless they have a uuid) and its saved reservations' files \
                     derive from the name as written, so the next start would present new \
                     disks and lose the reservations; keep the name as it was; nothing was changed",
                    ot.name, nt.name
                )));
            }
        }

        // What would be taken away, and whether it is in use.
        let mut busy = Vec::new();
        let sessions = self.fabric.sessions.all();
        for t in &old.targets {
            let gone = new_by_name.get(&t.name).is_none();
            if gone {
                let users: Vec<&str> = sessions
                    .iter()
                    .filter(|s| {
                        s.target
                            .as_ref()
                            .is_some_and(|st| st.name.eq_ignore_ascii_case(&t.name))
                    })
                    .map(|s| s.initiator_name.as_str())
                    .collect();
                if !users.is_empty() {
                    busy.push(format!(
                        "target {} has {} session(s) (from {})",
                        t.name,
                        users.len(),
                        users.join(", ")
                    ));
                }
            }
            for (id, lu) in t.luns.units() {
                if reuse.contains_key(&(t.name.to_ascii_lowercase(), id)) {
                    continue;
                }
                if let Some(why) = in_use(&lu.activity()) {
                    let what = if gone
                        || new_by_name
                            .get(&t.name)
                            .is_some_and(|n| !n.luns.has_lun(id))
                    {
                        "removing"
                    } else {
                        "replacing (its definition changed)"
                    };
                    busy.push(format!("{what} LUN {id} of {}: {why}", t.name));
                }
            }
        }
        for (key, unit, size) in &resizes {
            if *size < unit.config().backstore.size() {
                if let Some(why) = in_use(&unit.activity()) {
                    busy.push(format!("shrinking LUN {} of {}: {why}", key.1, key.0));
                }
            }
        }
        if !busy.is_empty() && !force {
            return Err(LiveError::InUse(format!(
                "{}; nothing was changed (pass force to do it anyway: sessions are closed, \
                 commands to the LUN fail)",
                busy.join("; ")
            )));
        }

        // Portals: those that leave or change group close first (their
        // address may be bound again), then new ones bind; a bind failure
        // undoes the binds and changes nothing else.
        let old_portals = portal_pairs(&old);
        let new_portals = portal_pairs(&new);
        let leaving: Vec<(SocketAddr, u16)> = old_portals
            .iter()
            .filter(|p| !new_portals.contains(p))
            .copied()
            .collect();
        let coming: Vec<(SocketAddr, u16)> = new_portals
            .iter()
            .filter(|p| !old_portals.contains(p))
            .copied()
            .collect();
        let mut opened = Vec::new();
        for (addr, tag) in &coming {
            let start = async {
                let portal = Portal::bind(*addr, *tag).await?;
                self.portals.start(portal).await
            };
            // Same address, other group: it must be free first. (Not
            // for port 0: each listing of it gets a port of its own.)
            let moving = leaving.iter().find(|(a, _)| a == addr && addr.port() != 0);
            if let Some(&(a, old_tag)) = moving {
                if let Some(b) = running.bound.remove(&(a, old_tag)) {
                    let _ = self.portals.remove(b).await;
                }
            }
            match start.await {
                Ok(bound) => opened.push((*addr, *tag, bound)),
                Err(e) => {
                    for (_, _, b) in &opened {
                        let _ = self.portals.remove(*b).await;
                    }
                    return Err(LiveError::Failed(format!(
                        "cannot listen on {addr} (portal group {tag}): {e}; nothing else was changed"
                    )));
                }
            }
        }
        for (addr, tag, bound) in opened {
            running.bound.insert((addr, tag), bound);
            applied
                .changes
                .push(format!("portal {bound} (portal group {tag}) listening"));
        }

        for (key, unit, size) in resizes {
            let before = unit.config().backstore.size();
            unit.resize(size).map_err(|e| {
                LiveError::Failed(format!("resizing LUN {} of {}: {e}", key.1, key.0))
            })?;
            applied.changes.push(format!(
                "LUN {} of {} resized from {before} to {size} bytes (initiators hear CAPACITY DATA HAS CHANGED)",
                key.1, key.0
            ));
        }

        // The new catalog: targets that stay keep their LUN table, brought
        // in line with the new definition.
        let mut targets = Vec::new();
        for nt in &new.targets {
            let Some(ot) = old_by_name.get(&nt.name) else {
                for line in self.start_paths(nt) {
                    applied.changes.push(line);
                }
                applied.changes.push(format!(
                    "target {} added ({} LUNs)",
                    nt.name,
                    nt.luns.lun_ids().len()
                ));
                targets.push(nt.clone());
                continue;
            };
            let table = ot.luns.clone();
            for (id, lu) in table.units() {
                if nt.luns.get(id).is_some_and(|n| Arc::ptr_eq(&n, &lu)) {
                    continue;
                }
                let _ = table.remove(id);
                self.fabric.lun_paths.remove(&ot.name, id);
                applied
                    .changes
                    .push(format!("LUN {id} of {} removed", ot.name));
            }
            let mut added = Vec::new();
            for (id, lu) in nt.luns.units() {
                if table.get(id).is_some() {
                    continue;
                }
                if let Err(e) = table.add(id, lu.clone()) {
                    warn!(target = %nt.name, lun = id, "{e}");
                    continue;
                }
                added.push(id);
                applied.changes.push(format!(
                    "LUN {id} of {} added: {} (initiators hear REPORTED LUNS DATA HAS CHANGED; rescan to see it)",
                    nt.name,
                    lu.config().backstore.describe()
                ));
            }
            table.set_port_groups(nt.luns.target_port_groups());
            let entry = Arc::new(TargetEntry {
                name: nt.name.clone(),
                alias: nt.alias.clone(),
                portal_groups: nt.portal_groups.clone(),
                acl: nt.acl.clone(),
                auth: nt.auth.clone(),
                luns: table,
                data_paths: nt.data_paths.clone(),
            });
            for &(id, policy) in entry.data_paths.iter().filter(|(id, _)| added.contains(id)) {
                match self
                    .fabric
                    .start_lun_paths(&entry.name, id, &entry.luns, policy)
                {
                    Ok(lines) => applied.changes.extend(
                        lines
                            .into_iter()
                            .map(|l| format!("LUN {id} of {}: {l}", entry.name)),
                    ),
                    Err(e) => warn!("{e}; the LUN uses the SCSI core's copy path"),
                }
            }
            if ot.acl != nt.acl {
                applied
                    .changes
                    .push(format!("access list of {} changed", nt.name));
            }
            if ot.auth != nt.auth {
                applied.changes.push(format!(
                    "CHAP settings of {} changed (for logins from now on)",
                    nt.name
                ));
            }
            if ot.portal_groups != nt.portal_groups || ot.alias != nt.alias {
                applied
                    .changes
                    .push(format!("portal groups or alias of {} changed", nt.name));
            }
            targets.push(entry);
        }
        if old.discovery_auth != new.discovery_auth {
            applied
                .changes
                .push("discovery CHAP settings changed".into());
        }
        let catalog = Arc::new(Catalog {
            portal_groups: new.portal_groups.clone(),
            targets,
            discovery_auth: new.discovery_auth.clone(),
        });
        self.fabric.replace_catalog(catalog.clone());
        let catalog_by_name = catalog.targets_by_name();

        // Sessions the change concerns: of removed targets, and of
        // initiators the access list no longer admits.
        for s in &sessions {
            let Some(st) = &s.target else { continue };
            let why = match catalog_by_name.get(&st.name) {
                None => format!("target {} was removed", st.name),
                Some(t) if !t.acl.allows(&s.initiator_name) => {
                    format!(
                        "{} is no longer in the access list of {}",
                        s.initiator_name, t.name
                    )
                }
                Some(_) => continue,
            };
            self.fabric.sessions.close(s);
            applied.changes.push(format!(
                "session {} (TSIH {}) closed: {why}",
                s.initiator_name, s.tsih
            ));
        }
        for t in old
            .targets
            .iter()
            .filter(|t| catalog_by_name.get(&t.name).is_none())
        {
            for id in t.luns.lun_ids() {
                self.fabric.lun_paths.remove(&t.name, id);
            }
            applied.changes.push(format!("target {} removed", t.name));
        }
        for (addr, tag) in leaving {
            if addr.port() != 0 && new_portals.iter().any(|(a, _)| *a == addr) {
                continue; // re-bound above for its new group
            }
            if let Some(b) = running.bound.remove(&(addr, tag)) {
                let cut = self.portals.remove(b).await.unwrap_or(0);
                applied.changes.push(format!(
                    "portal {b} (portal group {tag}) removed, {cut} connection(s) cut"
                ));
            }
        }
        if let Some(isns) = &self.isns {
            isns.serve(&catalog, &running.bound);
        }
        for section in ["fabric", "control", "metrics", "isns"] {
            if running.doc.get(section) != doc.get(section) {
                applied.restart_needed.push(format!("[{section}]"));
            }
        }
        if iser_keys(&running.doc) != iser_keys(&doc) {
            applied
                .restart_needed
                .push("iSER portals (iser, iser_listen)".into());
        }
        let ram = RamBudget::process();
        // (With no_disk the build counts no RAM LUN: nothing holds memory.)
        let ram_bytes = (running.ram_lun_bytes, ram_lun_bytes);
        if ram_bytes.1 > ram_bytes.0 && ram_bytes.1 > ram.limit() {
            applied.changes.push(format!(
                "the RAM LUNs now add up to {} MiB, more than the {} MiB they may hold together \
                 ([fabric] ram_limit): they are thin, and a write that needs memory past that \
                 fails with DATA PROTECT, SPACE ALLOCATION FAILED WRITE PROTECT",
                ram_bytes.1 >> 20,
                ram.limit() >> 20
            ));
        }
        running.doc = doc;
        running.ram_lun_bytes = ram_lun_bytes;
        for c in &applied.changes {
            info!(origin, "{c}");
        }
        for r in &applied.restart_needed {
            warn!(origin, "{r} changed: it takes effect at the next start");
        }
        if applied.changes.is_empty() {
            info!(origin, "configuration applied: nothing to change");
        }
        Ok(applied)
    }

    fn start_paths(&self, t: &TargetEntry) -> Vec<String> {
        let mut lines = Vec::new();
        for &(id, policy) in &t.data_paths {
            match self.fabric.start_lun_paths(&t.name, id, &t.luns, policy) {
                Ok(l) => lines.extend(
                    l.into_iter()
                        .map(|l| format!("LUN {id} of {}: {l}", t.name)),
                ),
                Err(e) => warn!("{e}; the LUN uses the SCSI core's copy path"),
            }
        }
        lines
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
        // One save or change at a time: the document is read and written
        // under the same lock.
        let running = self.running.lock().await;
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
    let mut backups: Vec<PathBuf> = std::fs::read_dir(bdir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
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
    match a.last_media {
        Some(ago) if ago < IN_USE_WINDOW => Some(format!(
            "it served a READ or WRITE {:.1} s ago",
            ago.as_secs_f64()
        )),
        _ => None,
    }
}

/// Every LUN definition of `doc`, by lower-case target name and LUN.
fn lun_defs(doc: &Table) -> HashMap<(String, u16), Table> {
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
                out.insert((name.trim().to_ascii_lowercase(), id), l.clone());
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

/// Whether two LUN definitions describe the same unit: equal but for the
/// size (a resize) and the stall switch (a start-up option).
fn same_unit(a: &Table, b: &Table) -> bool {
    let strip = |t: &Table| {
        let mut t = t.clone();
        t.remove("size");
        t.remove("stalled");
        t
    };
    strip(a) == strip(b)
}

fn size_of(v: &Value) -> Option<u64> {
    match v {
        Value::String(s) => parse_size(s),
        Value::Integer(i) => u64::try_from(*i).ok(),
        _ => None,
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
            let e = live.reload().await.unwrap_err().to_string();
            let at = format!("{}:{line}: target.lun.path: ", file.display());
            assert!(e.starts_with(&at), "--listen {listen:?}: {e}");
        }
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
    async fn a_control_change_names_the_unit_at_fault_not_a_line() {
        let dir = tempfile::tempdir().unwrap();
        let text = ONE_RAM_LUN;
        let live = live_of(text, &dir.path().join("t.toml"));
        let add = |lun: &str| {
            let lun: Table = lun.parse().unwrap();
            move |d: &mut Table| edits::add_lun(d, "iqn.2026-11.io.blockwire:disk", lun)
        };
        let e = live
            .edit(false, add("id = 1\nbackstore = \"ram\"\nsize = \"ten\"\n"))
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
            false,
            add("id = 1\nbackstore = \"ram\"\nsize = \"1M\"\nserial = \"abc\"\n"),
        )
        .await
        .unwrap();
        let e = live
            .edit(
                false,
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
        let e = live.reload().await.unwrap_err().to_string();
        assert!(
            e.contains("is renamed iqn.2026-11.io.blockwire:Disk (case only)"),
            "{e}"
        );
        let served = live.fabric.catalog();
        assert_eq!(served.targets[0].name, "iqn.2026-11.io.blockwire:disk");
        assert!(live.text().await.contains("blockwire:disk"));
        // Another change of the same target goes through.
        std::fs::write(&file, text.replace("size = \"1M\"", "size = \"2M\"")).unwrap();
        live.reload().await.unwrap();
        assert_eq!(
            live.fabric.catalog().targets[0]
                .luns
                .get(0)
                .unwrap()
                .blocks(),
            4096
        );
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
        let small = live.edit(false, add(1, "1M")).await.unwrap();
        assert!(!said(&small), "{small:?}");
        // 100 TiB: more than any machine's memory, thin as every RAM LUN.
        let huge = live.edit(false, add(2, "100T")).await.unwrap();
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
}
