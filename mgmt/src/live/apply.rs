//! Applying a checked configuration to what runs: portals, resizes, the
//! targets' LUN tables, sessions the change concerns. A dry run walks the
//! same steps and says what each would do, in the words a change uses, but
//! touches nothing: no portal is bound or closed, no unit resized, no table,
//! catalog, session or document changed, and the new LUNs are built as
//! `--check` builds them (stand-ins; no file created, grown or opened for
//! writing).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use blockwire_target::backstore::ram_budget::RamBudget;
use blockwire_target::iscsi::catalog::{Catalog, TargetEntry, TargetsByName};
use blockwire_target::iscsi::portal::Portal;
use blockwire_target::iscsi::session::Session;
use blockwire_target::scsi::{state_changes, LogicalUnit};
use toml::Table;
use tracing::{debug, info, warn};

use super::{
    in_use, iser_keys, lun_defs, place_in_rendering, portal_pairs, same_unit, size_of, Applied,
    ChangeMode, Live, LiveError, Running, LOW_SPACE_KEY,
};
use crate::config::{Built, ConfigError, IsnsSettings, Rebuild, Reuse, TargetConfig};
use crate::isns::{Client, Registration};

/// A unit a change resizes: its target (lower case) and LUN, the unit, the
/// new size in bytes.
type Resize = ((String, u16), Arc<LogicalUnit>, u64);

impl Live {
    /// Checks `doc` and applies what differs from the running document
    /// (`mode.dry_run`: says what it would apply); `text` is the text `doc`
    /// was read from (none: a rendering of `doc` is checked, and errors say
    /// where in the configuration instead of a line).
    pub(super) async fn apply(
        &self,
        running: &mut Running,
        doc: Table,
        text: Option<String>,
        mode: ChangeMode,
        origin: &str,
    ) -> Result<Applied, LiveError> {
        let rendered = text.is_none();
        let dry = mode.dry_run;
        let old = self.fabric.catalog();
        let mut applied = Applied {
            dry_run: dry,
            ..Applied::default()
        };

        // Units that stay: the same LUN table (size, the stall switch and
        // the QoS ceilings aside) in a target of the same name.
        let old_luns = lun_defs(&running.doc);
        let old_by_name = old.targets_by_name();
        let mut reuse = Reuse::new();
        let mut resizes: Vec<Resize> = Vec::new();
        let mut thresholds: Vec<Threshold> = Vec::new();
        let mut stalls: Vec<Stall> = Vec::new();
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
                if before.get(LOW_SPACE_KEY) != def.get(LOW_SPACE_KEY) {
                    // The check below refuses a value that is not a size.
                    let bytes = def.get(LOW_SPACE_KEY).and_then(size_of);
                    thresholds.push((key.clone(), unit.clone(), bytes));
                }
                let stalled =
                    |d: &Table| d.get("stalled").and_then(toml::Value::as_bool) == Some(true);
                if stalled(before) != stalled(&def) {
                    stalls.push((key.clone(), unit.clone(), stalled(&def)));
                }
                reuse.insert(key, unit);
            }
        }
        let how = Rebuild {
            reuse: Some(&reuse),
            known_files: Some(&running.known_files),
            rendered,
            dry_run: dry,
        };
        // A control-socket change is read from its document; only one
        // the check finds fault with, and a dry run (whose notices name
        // places), is read from a rendering of it (see `from_doc_reusing`).
        let from_doc = (rendered && !dry)
            .then(|| TargetConfig::from_doc_reusing(origin, &doc, self.opts, how))
            .flatten();
        let (mut built, notices) = match from_doc {
            Some(built) => built,
            None => self.from_text(origin, &doc, text, how)?,
        };
        let new = built.catalog.clone();
        let ram_lun_bytes = built.ram_lun_bytes;
        let known_files = std::mem::take(&mut built.known_files);
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

        let sessions = self.fabric.sessions.all();
        let busy = busy_units(&old, &new_by_name, &reuse, &resizes, &sessions);
        if !busy.is_empty() && !mode.force {
            return Err(LiveError::InUse(format!(
                "{}; nothing was changed (pass force to do it anyway: sessions are closed, \
                 commands to the LUN fail)",
                busy.join("; ")
            )));
        }
        check_resizes(&resizes)?;
        if dry {
            // What building the real units would do on disk.
            applied.changes.extend(
                notices
                    .iter()
                    .map(|n| format!("{}: {}", n.field, n.message)),
            );
        }

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
        let portals = self
            .open_portals(running, &coming, &leaving, dry, &mut applied)
            .await?;
        // A unit that cannot take its size or threshold fails the change
        // after the portals opened: they are closed again (and those that
        // moved group listen in their old one), so the portals that run
        // are those of the configuration that still does.
        let units = resize_units(resizes, dry, &mut applied)
            .and_then(|()| set_thresholds(thresholds, dry, &mut applied));
        if units.is_ok() {
            set_stalls(stalls, dry, &mut applied);
        }
        if let Err(e) = units {
            let lost = self.undo_portals(running, portals).await;
            return Err(match e {
                LiveError::Failed(m) if !lost.is_empty() => LiveError::Failed(format!("{m}{lost}")),
                other if !lost.is_empty() => LiveError::Failed(format!("{other}{lost}")),
                other => other,
            });
        }

        let mut removed = Vec::new();
        let targets = self.merge_targets(&new, &old_by_name, dry, &mut applied, &mut removed);
        for (what, lu) in removed {
            if let Some(failed) = final_flush(lu).await {
                applied.changes.push(format!("{what}: {failed}"));
            }
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
        // The sessions the change looks at are those once the new catalog
        // serves: a login checked against the old one while the change ran
        // has attached by then (see `Fabric::admission_gate`).
        let sessions = {
            let _gate = self.fabric.admission_gate();
            if !dry {
                self.fabric.replace_catalog(catalog.clone());
            }
            self.fabric.sessions.all()
        };
        let catalog_by_name = catalog.targets_by_name();

        // Sessions the change concerns: of removed targets, of initiators
        // the access list no longer admits, and through portal groups the
        // target no longer serves (a login there is refused now, so a
        // session there must not go on either).
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
                Some(t) if !t.portal_groups.is_empty() && !t.portal_groups.contains(&s.tpgt) => {
                    format!(
                        "{} is no longer served through portal group {}",
                        t.name, s.tpgt
                    )
                }
                Some(_) => continue,
            };
            if !dry {
                self.fabric.sessions.close(s);
            }
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
            let mut flushes = Vec::new();
            if !dry {
                for id in t.luns.lun_ids() {
                    self.fabric.lun_paths.remove(&t.name, id);
                    flushes.extend(t.luns.get(id).map(|lu| (id, lu)));
                }
                t.luns.forget_alua_states();
            }
            applied.changes.push(format!("target {} removed", t.name));
            for (id, lu) in flushes {
                if let Some(failed) = final_flush(lu).await {
                    applied
                        .changes
                        .push(format!("LUN {id} of {}: {failed}", t.name));
                }
            }
        }
        self.close_portals(running, leaving, &new_portals, dry, &mut applied)
            .await;
        applied.restart_needed = restart_needed(&running.doc, &doc);
        let ram = RamBudget::process();
        // (With no_disk the build counts no RAM LUN: nothing holds memory.)
        if ram_lun_bytes > running.ram_lun_bytes && ram_lun_bytes > ram.limit() {
            applied.changes.push(format!(
                "the RAM LUNs now add up to {} MiB, more than the {} MiB they may hold together \
                 ([fabric] ram_limit): they are thin, and a write that needs memory past that \
                 fails with DATA PROTECT, SPACE ALLOCATION FAILED WRITE PROTECT",
                ram_lun_bytes >> 20,
                ram.limit() >> 20
            ));
        }
        if dry {
            isns_lines(
                self.isns(),
                &running.doc,
                &doc,
                built.isns.as_ref(),
                &mut applied,
            );
            debug!(
                origin,
                lines = applied.changes.len(),
                "dry run: nothing was changed"
            );
            return Ok(applied);
        }
        self.follow_isns(running, &doc, built.isns.as_ref(), &catalog, &mut applied)
            .await;
        running.doc = doc;
        running.ram_lun_bytes = ram_lun_bytes;
        running.known_files = known_files;
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

    /// Checks and builds `doc` from `text`, or from a rendering of it where
    /// there is none (a control-socket change): an error then names its
    /// place in the configuration's words ("LUN 3 of iqn..."), as the
    /// rendering's lines are nobody's to look up.
    fn from_text(
        &self,
        origin: &str,
        doc: &Table,
        text: Option<String>,
        how: Rebuild<'_>,
    ) -> Result<(Built, Vec<ConfigError>), LiveError> {
        let rendered = text.is_none();
        let text = match text {
            Some(t) => t,
            None => toml::to_string(doc)
                .map_err(|e| LiveError::Invalid(format!("cannot write the configuration: {e}")))?,
        };
        TargetConfig::from_str_reusing(origin, &text, self.opts, how).map_err(|e| {
            let located = match rendered
                .then(|| place_in_rendering(&text, e.line))
                .flatten()
            {
                Some(place) => format!("{origin}: {place}: {}: {}", e.field, e.message),
                None => e.to_string(),
            };
            LiveError::Invalid(format!("{located}; nothing was changed"))
        })
    }

    /// Binds the portals that come. Those that leave or change group close
    /// first (their address may be bound again); a bind failure undoes the
    /// binds, listens again where a portal moving group listened, and
    /// changes nothing else. A dry run starts no portal: it binds each new
    /// address (not one that moves between groups, still bound here) and
    /// lets it go again once all are bound, so an address in use or not of
    /// this host fails it as it would fail the change. Returns what
    /// [`Self::undo_portals`] takes back.
    async fn open_portals(
        &self,
        running: &mut Running,
        coming: &[(SocketAddr, u16)],
        leaving: &[(SocketAddr, u16)],
        dry: bool,
        applied: &mut Applied,
    ) -> Result<OpenedPortals, LiveError> {
        let mut undo = OpenedPortals::default();
        let mut opened = Vec::new();
        let mut probes = Vec::new();
        for &(addr, tag) in coming {
            // Same address, other group: it must be free first. (Not
            // for port 0: each listing of it gets a port of its own.)
            let moving = leaving.iter().find(|(a, _)| *a == addr && addr.port() != 0);
            if dry {
                if moving.is_none() {
                    let probe = std::net::TcpListener::bind(addr).map_err(|e| {
                        LiveError::Failed(format!(
                            "cannot listen on {addr} (portal group {tag}): {e}; nothing else was changed"
                        ))
                    })?;
                    probes.push(probe);
                }
                opened.push((addr, tag, addr));
                continue;
            }
            let start = async {
                let portal = Portal::bind(addr, tag).await?;
                self.portals.start(portal).await
            };
            if let Some(&(a, old_tag)) = moving {
                if let Some(b) = running.bound.remove(&(a, old_tag)) {
                    let _ = self.portals.remove(b).await;
                    undo.moved.push((a, old_tag));
                }
            }
            match start.await {
                Ok(bound) => opened.push((addr, tag, bound)),
                Err(e) => {
                    for (_, _, b) in &opened {
                        let _ = self.portals.remove(*b).await;
                    }
                    let back = self.listen_again(running, &undo.moved).await;
                    return Err(LiveError::Failed(format!(
                        "cannot listen on {addr} (portal group {tag}): {e}; nothing else was changed{back}"
                    )));
                }
            }
        }
        for (addr, tag, bound) in opened {
            if !dry {
                running.bound.insert((addr, tag), bound);
                undo.opened.push((addr, tag));
            }
            applied
                .changes
                .push(format!("portal {bound} (portal group {tag}) listening"));
        }
        Ok(undo)
    }

    /// Closes the portals a change opened and listens again where those it
    /// moved between groups listened: the change failed after them. Says
    /// which could not listen again, for the change's error.
    async fn undo_portals(&self, running: &mut Running, undo: OpenedPortals) -> String {
        for key in &undo.opened {
            if let Some(b) = running.bound.remove(key) {
                let _ = self.portals.remove(b).await;
            }
        }
        let back = self.listen_again(running, &undo.moved).await;
        if !back.is_empty() {
            warn!("undoing a failed change{back}");
        }
        back
    }

    /// Binds `moved` (address, portal group) again, as they were before a
    /// change that failed; says which could not be, for the error.
    async fn listen_again(&self, running: &mut Running, moved: &[(SocketAddr, u16)]) -> String {
        let mut lost = Vec::new();
        for &(addr, tag) in moved {
            let start = async {
                let portal = Portal::bind(addr, tag).await?;
                self.portals.start(portal).await
            };
            match start.await {
                Ok(bound) => {
                    running.bound.insert((addr, tag), bound);
                }
                Err(e) => lost.push(format!(
                    "{addr} (portal group {tag}) could not listen again: {e}; restart the target to listen there"
                )),
            }
        }
        if lost.is_empty() {
            String::new()
        } else {
            format!("; but {}", lost.join("; "))
        }
    }

    /// The new catalog's targets: those that stay keep their LUN table,
    /// brought in line with the new definition (a dry run leaves the table
    /// as it is and only says what would change in it).
    fn merge_targets(
        &self,
        new: &Catalog,
        old_by_name: &TargetsByName<'_>,
        dry: bool,
        applied: &mut Applied,
        removed: &mut Vec<(String, Arc<blockwire_target::scsi::LogicalUnit>)>,
    ) -> Vec<Arc<TargetEntry>> {
        let mut targets = Vec::new();
        for nt in &new.targets {
            let Some(ot) = old_by_name.get(&nt.name) else {
                if !dry {
                    applied.changes.extend(self.start_paths(nt, |_| true));
                }
                applied.changes.push(format!(
                    "target {} added ({} LUNs)",
                    nt.name,
                    nt.luns.lun_ids().len()
                ));
                targets.push(nt.clone());
                continue;
            };
            let (leaving, joining) = lun_changes(ot, nt);
            let table = ot.luns.clone();
            for id in leaving {
                if !dry {
                    if let Ok(lu) = table.remove(id) {
                        removed.push((format!("LUN {id} of {}", ot.name), lu));
                    }
                    self.fabric.lun_paths.remove(&ot.name, id);
                }
                applied
                    .changes
                    .push(format!("LUN {id} of {} removed", ot.name));
            }
            let mut added = Vec::new();
            for (id, lu) in joining {
                if !dry {
                    if let Err(e) = table.add(id, lu.clone()) {
                        warn!(target = %nt.name, lun = id, "{e}");
                        continue;
                    }
                }
                added.push(id);
                applied.changes.push(format!(
                    "LUN {id} of {} added: {} (initiators hear REPORTED LUNS DATA HAS CHANGED; rescan to see it)",
                    nt.name,
                    lu.config().backstore.describe()
                ));
            }
            let groups = nt.luns.target_port_groups();
            let by_initiator = table.port_groups_set_by_command();
            let transitions = if dry {
                state_changes(&table.target_port_groups(), &groups)
            } else {
                table.set_port_groups(groups)
            };
            for (id, from, to) in transitions {
                let undone = if by_initiator.contains(&id) {
                    "; this undoes the state an initiator set with SET TARGET PORT GROUPS \
                     (`config.save` before a reload keeps such states)"
                } else {
                    ""
                };
                applied.changes.push(format!(
                    "ALUA state of portal group {id} of {}: {} -> {} (initiators hear ASYMMETRIC \
                     ACCESS STATE CHANGED{undone})",
                    nt.name,
                    from.name(),
                    to.name()
                ));
            }
            let explicit = nt.luns.explicit_alua();
            if table.explicit_alua() != explicit {
                if !dry {
                    table.set_explicit_alua(explicit);
                }
                applied.changes.push(format!(
                    "explicit ALUA of {}: {} (initiators hear INQUIRY DATA HAS CHANGED)",
                    nt.name,
                    if explicit {
                        "on, initiators may set its ALUA states with SET TARGET PORT GROUPS"
                    } else {
                        "off, only the configuration sets its ALUA states"
                    }
                ));
            }
            // Kept units take their new ceilings here; new ones were
            // built with theirs.
            for (id, unit) in nt.luns.units() {
                let want = nt.qos_of(id);
                let had = unit.qos().limits();
                if had != want {
                    if !dry {
                        unit.set_qos(want);
                    }
                    applied.changes.push(format!(
                        "QoS of LUN {id} of {}: {had} -> {want} (commands from now on)",
                        nt.name
                    ));
                }
            }
            let entry = Arc::new(TargetEntry {
                name: nt.name.clone(),
                alias: nt.alias.clone(),
                portal_groups: nt.portal_groups.clone(),
                acl: nt.acl.clone(),
                auth: nt.auth.clone(),
                luns: table,
                data_paths: nt.data_paths.clone(),
                qos: nt.qos.clone(),
            });
            if !dry {
                applied
                    .changes
                    .extend(self.start_paths(&entry, |id| added.contains(&id)));
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
        targets
    }

    /// Closes the portals that leave (not those re-bound for a new group);
    /// a dry run counts the connections that closing would cut.
    async fn close_portals(
        &self,
        running: &mut Running,
        leaving: Vec<(SocketAddr, u16)>,
        new_portals: &[(SocketAddr, u16)],
        dry: bool,
        applied: &mut Applied,
    ) {
        for (addr, tag) in leaving {
            if addr.port() != 0 && new_portals.iter().any(|(a, _)| *a == addr) {
                continue; // re-bound for its new group
            }
            let cut = if dry {
                let Some(&b) = running.bound.get(&(addr, tag)) else {
                    continue;
                };
                let open = self.portals.list();
                let cut = open
                    .iter()
                    .find(|p| p.addr == b)
                    .map_or(0, |p| p.connections);
                (b, cut)
            } else {
                let Some(b) = running.bound.remove(&(addr, tag)) else {
                    continue;
                };
                (b, self.portals.remove(b).await.unwrap_or(0))
            };
            applied.changes.push(format!(
                "portal {} (portal group {tag}) removed, {} connection(s) cut",
                cut.0, cut.1
            ));
        }
    }

    /// Tells the iSNS client of the new catalog, or, when the change alters
    /// `[isns]`, ends the client (it deregisters; the next one starts once
    /// it has, so that a deregistration never follows the new registration
    /// of the same entity) and starts the one the new section asks for.
    async fn follow_isns(
        &self,
        running: &Running,
        doc: &Table,
        settings: Option<&IsnsSettings>,
        catalog: &Catalog,
        applied: &mut Applied,
    ) {
        let Some(link) = &self.isns else { return };
        if !isns_lines(link.slot.get(), &running.doc, doc, settings, applied) {
            if let Some(client) = link.slot.get() {
                client.serve(catalog, &running.bound);
            }
            return;
        }
        if let Some(old) = link.slot.replace(None) {
            old.retire();
            if tokio::time::timeout(RETIRE_WAIT, old.join()).await.is_err() {
                warn!(
                    server = old.server(),
                    "iSNS: the old registration did not end in {} s; it goes on ending in the background",
                    RETIRE_WAIT.as_secs()
                );
            }
        }
        if let Some(s) = settings {
            let wanted = Registration::of(&s.entity, s.period_secs, catalog, &running.bound);
            let client = Client::start(s.server.clone(), wanted, link.stop.clone());
            link.slot.replace(Some(Arc::new(client)));
        }
    }

    /// Starts the data paths (sendfile, engine) of `t`'s LUNs that `which`
    /// picks, as configured; the lines say what each path does.
    fn start_paths(&self, t: &TargetEntry, which: impl Fn(u16) -> bool) -> Vec<String> {
        let mut lines = Vec::new();
        for &(id, policy) in t.data_paths.iter().filter(|(id, _)| which(*id)) {
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
}

/// What a change would take away while in use: targets with sessions, LUNs
/// removed or replaced while busy, LUNs shrunk while busy.
fn busy_units(
    old: &Catalog,
    new_by_name: &TargetsByName<'_>,
    reuse: &Reuse,
    resizes: &[Resize],
    sessions: &[Arc<Session>],
) -> Vec<String> {
    let mut busy = Vec::new();
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
            let removing = gone
                || new_by_name
                    .get(&t.name)
                    .is_some_and(|n| !n.luns.has_lun(id));
            // A unit rebuilt from a changed definition starts empty when its
            // data live in memory only: a quiet RAM LUN is no less in use.
            let why = in_use(&lu.activity())
                .or_else(|| (!removing).then(|| held_in_memory_only(&lu)).flatten());
            if let Some(why) = why {
                let what = if removing {
                    "removing"
                } else {
                    "replacing (its definition changed)"
                };
                busy.push(format!("{what} LUN {id} of {}: {why}", t.name));
            }
        }
    }
    for (key, unit, size) in resizes {
        if *size < unit.config().backstore.size() {
            let why = in_use(&unit.activity()).or_else(|| written_past(unit, *size));
            if let Some(why) = why {
                busy.push(format!("shrinking LUN {} of {}: {why}", key.1, key.0));
            }
        }
    }
    busy
}

/// Why shrinking `lu` to `size` bytes would lose data, if it would: a
/// store whose blocks live in this process's memory only (a RAM LUN) with
/// blocks written past the new end, which the shrink drops for good (a
/// file LUN's unit refuses to shrink at all).
fn written_past(lu: &LogicalUnit, size: u64) -> Option<String> {
    let store = &lu.config().backstore;
    if !store.in_memory() {
        return None;
    }
    let end = store.size();
    let written: u64 = match store.allocation(size, end - size) {
        Ok(Some(map)) => map.iter().filter(|e| e.mapped).map(|e| e.len).sum(),
        // A store that keeps no map may hold anything there.
        Ok(None) | Err(_) => end - size,
    };
    (written > 0).then(|| {
        format!(
            "it holds {written} bytes of data past the new end ({size} bytes) in memory only, \
             which the shrink discards"
        )
    })
}

/// Why replacing `lu` would lose data, if it would: a store whose blocks
/// live in this process's memory only (a RAM LUN) and hold some.
fn held_in_memory_only(lu: &LogicalUnit) -> Option<String> {
    let store = &lu.config().backstore;
    if !store.in_memory() {
        return None;
    }
    let used = store.space().ok().flatten().map_or(0, |s| s.used);
    (used > 0).then(|| {
        format!(
            "it holds {used} bytes of data in memory only, which the unit built from the \
             changed definition would start without (a change of size, stalled, \
             low_space_threshold or the QoS limits alone keeps them)"
        )
    })
}

/// A kept unit whose low-space threshold a change sets (or removes).
type Threshold = ((String, u16), Arc<LogicalUnit>, Option<u64>);

/// A kept unit whose `stalled` switch the change turns, and to what.
type Stall = ((String, u16), Arc<LogicalUnit>, bool);

/// Turns kept units' stall switches as the change says, as `lun.stall`
/// does (a dry run only says so).
fn set_stalls(stalls: Vec<Stall>, dry: bool, applied: &mut Applied) {
    for ((target, lun), unit, stalled) in stalls {
        if !dry {
            unit.set_stalled(stalled);
        }
        applied.changes.push(if stalled {
            format!("LUN {lun} of {target} stalled: its reads and writes wait")
        } else {
            format!("LUN {lun} of {target} no longer stalled")
        });
    }
}

/// The portals a change opened, and those it moved between portal groups
/// (address, old group): what undoing the change takes back.
#[derive(Default)]
struct OpenedPortals {
    opened: Vec<(SocketAddr, u16)>,
    moved: Vec<(SocketAddr, u16)>,
}

/// Gives kept units their new low-space thresholds (a dry run only says so).
fn set_thresholds(
    thresholds: Vec<Threshold>,
    dry: bool,
    applied: &mut Applied,
) -> Result<(), LiveError> {
    for (key, unit, bytes) in thresholds {
        // The check refused a threshold for a unit without space; what is
        // left of those are --no-disk stand-ins.
        if bytes.is_some() && !unit.reports_space() {
            continue;
        }
        if !dry {
            unit.set_low_space_threshold(bytes).map_err(|e| {
                LiveError::Failed(format!(
                    "low-space threshold of LUN {} of {}: {e}",
                    key.1, key.0
                ))
            })?;
        }
        applied.changes.push(match bytes {
            Some(b) => format!(
                "low-space threshold of LUN {} of {}: {b} bytes (initiators hear THIN \
                 PROVISIONING SOFT THRESHOLD REACHED when less is left)",
                key.1, key.0
            ),
            None => format!("low-space threshold of LUN {} of {}: none", key.1, key.0),
        });
    }
    Ok(())
}

/// Resizes the units whose size changed (a dry run only says so).
/// Refuses a change one of whose resizes its unit would refuse, before
/// anything of the change is made: refused after others were made, those
/// LUNs would stay resized (their initiators told so) while the running
/// configuration kept the old sizes, which the next save and start would
/// then serve.
fn check_resizes(resizes: &[Resize]) -> Result<(), LiveError> {
    for (key, unit, size) in resizes {
        unit.check_resize(*size).map_err(|e| {
            LiveError::Invalid(format!(
                "resizing LUN {} of {} to {size} bytes: {e}; nothing was changed",
                key.1, key.0
            ))
        })?;
    }
    Ok(())
}

fn resize_units(resizes: Vec<Resize>, dry: bool, applied: &mut Applied) -> Result<(), LiveError> {
    for (key, unit, size) in resizes {
        let before = unit.config().backstore.size();
        if !dry {
            unit.resize(size).map_err(|e| {
                LiveError::Failed(format!("resizing LUN {} of {}: {e}", key.1, key.0))
            })?;
        }
        applied.changes.push(format!(
            "LUN {} of {} resized from {before} to {size} bytes (initiators hear CAPACITY DATA HAS CHANGED)",
            key.1, key.0
        ));
    }
    Ok(())
}

/// The LUNs of a target that stays which leave its table (removed, or
/// replaced by a new unit) and which join it (new, or the replacement).
fn lun_changes(old: &TargetEntry, new: &TargetEntry) -> (Vec<u16>, Vec<(u16, Arc<LogicalUnit>)>) {
    let kept = |table: &TargetEntry, id: u16, lu: &Arc<LogicalUnit>| {
        table.luns.get(id).is_some_and(|u| Arc::ptr_eq(&u, lu))
    };
    let leaving = old
        .luns
        .units()
        .into_iter()
        .filter(|(id, lu)| !kept(new, *id, lu))
        .map(|(id, _)| id)
        .collect();
    let joining = new
        .luns
        .units()
        .into_iter()
        .filter(|(id, lu)| !kept(old, *id, lu))
        .collect();
    (leaving, joining)
}

/// How long a change waits for a replaced iSNS client to deregister: its
/// connection attempt and the answer's timeout.
const RETIRE_WAIT: Duration = Duration::from_secs(16);

/// Says what a change of `[isns]` from `old` to `new` (now `settings`) does
/// to the registration `current`; whether the section changed.
fn isns_lines(
    current: Option<Arc<Client>>,
    old: &Table,
    new: &Table,
    settings: Option<&IsnsSettings>,
    applied: &mut Applied,
) -> bool {
    if old.get("isns") == new.get("isns") {
        return false;
    }
    if let Some(c) = current {
        applied.changes.push(format!(
            "iSNS: entity {} deregistered from {}",
            c.entity(),
            c.server()
        ));
    }
    if let Some(s) = settings {
        applied.changes.push(format!(
            "iSNS: registering the targets with {} as entity {} (period {} s)",
            s.server, s.entity, s.period_secs
        ));
    }
    true
}

/// The sections (and iSER listeners) a change alters that take effect only
/// at the next start.
fn restart_needed(old: &Table, new: &Table) -> Vec<String> {
    let mut needed: Vec<String> = ["fabric", "control", "metrics"]
        .into_iter()
        .filter(|section| old.get(*section) != new.get(*section))
        .map(|section| format!("[{section}]"))
        .collect();
    if iser_keys(old) != iser_keys(new) {
        needed.push("iSER portals (iser, iser_listen)".into());
    }
    needed
}

/// Writes back what a unit taken out of service acknowledged (its write
/// cache, WCE=1 by default): no initiator can send it SYNCHRONIZE CACHE
/// any more, and the shutdown flushes only the units still served. None
/// when that held; else what failed, for the change's report.
async fn final_flush(lu: Arc<blockwire_target::scsi::LogicalUnit>) -> Option<String> {
    match tokio::task::spawn_blocking(move || lu.flush()).await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => {
            warn!(error = %e, "the final flush of a removed LUN failed");
            Some(format!(
                "its final flush failed ({e}): writes it acknowledged may be lost"
            ))
        }
        Err(e) => Some(format!("its final flush did not run ({e})")),
    }
}
