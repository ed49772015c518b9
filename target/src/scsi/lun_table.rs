//! The logical units of one target, by LUN: routes commands, answers
//! REPORT LUNS and commands to LUNs that do not exist, and applies task
//! management and nexus loss to every unit. Units can be added and removed
//! while sessions run (the management plane); every change raises REPORTED
//! LUNS DATA HAS CHANGED for the initiators the remaining units know.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};

use blockwire_pdu::scsi::opcode as op;
use blockwire_pdu::scsi::{
    Asc, Cdb, Lun, Peripheral, ReportLuns, Sense, SenseFormat, SenseKey, StandardInquiry,
};
use tracing::{debug_span, error, info, warn};

use super::alua::{AluaState, PortGroups, TargetPortGroup};
use super::logical_unit::{finish, LogicalUnit};
use super::outcome::{illegal, invalid_cdb, CmdResult, Done, Failure};
use super::stall::StallChange;
use super::token_copy::RodTokens;
use super::{ItNexus, ScsiRequest, ScsiResult};

/// The logical units of one target, by LUN. Answers REPORT LUNS and
/// commands to LUNs that do not exist.
#[derive(Default)]
pub struct LunTable {
    /// The current set; a command works on the snapshot it started with.
    units: RwLock<Arc<Units>>,
    /// The target port groups the units are reached through (ALUA).
    ports: RwLock<PortGroups>,
    /// The file that keeps the states SET TARGET PORT GROUPS set across
    /// restarts, if any. Every change of `ports` holds this lock, so that
    /// the file and the states agree.
    alua_saved: Mutex<Option<PathBuf>>,
    /// What PREEMPT AND ABORT calls, kept for units added later.
    abort: Mutex<Option<TableAbortHandler>>,
    /// The ROD tokens of the target's copy manager (POPULATE TOKEN, WRITE
    /// USING TOKEN across its units).
    tokens: RodTokens,
}

/// The fabric's PREEMPT AND ABORT hook for a table: called with the LUN and
/// the preempted nexus.
pub type TableAbortHandler = Arc<dyn Fn(u16, &ItNexus) + Send + Sync>;

impl std::fmt::Debug for LunTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LunTable")
            .field("luns", &self.lun_ids())
            .finish_non_exhaustive()
    }
}

/// One snapshot of a table's units.
#[derive(Debug, Default)]
struct Units {
    map: BTreeMap<u16, Arc<LogicalUnit>>,
    /// LUN numbers in ascending order, for REPORT LUNS.
    ids: Vec<u16>,
}

impl Units {
    fn of(map: BTreeMap<u16, Arc<LogicalUnit>>) -> Units {
        let ids = map.keys().copied().collect();
        Units { map, ids }
    }
}

/// Why a unit cannot be added to a table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddLunError {
    /// The number is taken.
    #[error("LUN {0} exists already; remove it first or pick another number")]
    Exists(u16),
    /// Above what single-level LUN addressing reaches.
    #[error("LUN {0} is above 16383, the highest LUN single-level addressing reaches")]
    OutOfRange(u16),
}

/// Why a LUN-addressed management request (e.g. a stall) cannot be done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no LUN {lun}; LUNs are {}", list_ids(.existing))]
pub struct NoSuchLun {
    /// The LUN asked for.
    pub lun: u16,
    /// The LUNs there are.
    pub existing: Vec<u16>,
}

fn list_ids(ids: &[u16]) -> String {
    if ids.is_empty() {
        return "none".into();
    }
    ids.iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The commands of every I_T nexus running on units when they were reset.
/// A reset ends when every task it aborted has ended (SAM-5 6.3, 7.11):
/// the fabric aborts the tasks, but a command already in the backstore or
/// a pipelined WRITE's chunk writes already submitted run on, and their
/// data could reach the medium after the initiator that reset heard
/// FUNCTION COMPLETE (and, say, rewrote those blocks). Its response
/// waits for them with [`Settling::wait`].
#[derive(Debug, Default)]
#[must_use = "a reset's response waits for the commands running when it was made"]
pub struct Settling {
    units: Vec<(u16, Arc<LogicalUnit>, u64)>,
}

impl Settling {
    fn add(&mut self, lun: u16, lu: Arc<LogicalUnit>) {
        let epoch = lu.in_flight.new_epoch();
        if lu.in_flight.total() > 0 {
            self.units.push((lun, lu, epoch));
        }
    }

    /// Whether no reset unit had a command running (nothing to wait for).
    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    /// Blocks, at most `limit` in all, until no command that was running
    /// on the reset units at the reset still runs; the LUNs where some
    /// still did then.
    pub fn wait(&self, limit: std::time::Duration) -> Vec<u16> {
        let deadline = std::time::Instant::now() + limit;
        self.units
            .iter()
            .filter(|(_, lu, epoch)| {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                !lu.in_flight.wait_before(*epoch, |_| true, left).is_empty()
            })
            .map(|(lun, _, _)| *lun)
            .collect()
    }
}

impl LunTable {
    /// A table of `luns`. LUNs above 16383 cannot be addressed by the
    /// single-level LUN format and are dropped with a warning; a repeated
    /// LUN keeps its last unit.
    pub fn new(luns: Vec<(u16, Arc<LogicalUnit>)>) -> LunTable {
        let mut map = BTreeMap::new();
        for (id, lu) in luns {
            if Lun::new(id).is_none() {
                warn!(lun = id, "LUN above 16383 cannot be reported, ignored");
                continue;
            }
            map.insert(id, lu);
        }
        LunTable {
            units: RwLock::new(Arc::new(Units::of(map))),
            ports: RwLock::default(),
            alua_saved: Mutex::default(),
            abort: Mutex::default(),
            tokens: RodTokens::default(),
        }
    }

    /// The target's live ROD tokens.
    pub fn rod_tokens(&self) -> &RodTokens {
        &self.tokens
    }

    fn snapshot(&self) -> Arc<Units> {
        self.units.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Adds `lu` as `lun` while sessions run. Every initiator a unit of the
    /// table knows gets REPORTED LUNS DATA HAS CHANGED (SPC-4 6.33), which
    /// tells it to scan again.
    pub fn add(&self, lun: u16, lu: Arc<LogicalUnit>) -> Result<(), AddLunError> {
        if Lun::new(lun).is_none() {
            return Err(AddLunError::OutOfRange(lun));
        }
        if let Some(h) = self.abort.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            lu.set_abort_handler(Arc::new(move |n: &ItNexus| h(lun, n)));
        }
        {
            let mut units = self.units.write().unwrap_or_else(|e| e.into_inner());
            if units.map.contains_key(&lun) {
                return Err(AddLunError::Exists(lun));
            }
            let mut map = units.map.clone();
            map.insert(lun, lu);
            *units = Arc::new(Units::of(map));
        }
        info!(lun, "LUN added");
        self.luns_changed();
        Ok(())
    }

    /// Removes `lun`, returning its unit (which commands already running
    /// on it finish with). The remaining units' initiators get REPORTED
    /// LUNS DATA HAS CHANGED; new commands to `lun` get LOGICAL UNIT NOT
    /// SUPPORTED.
    pub fn remove(&self, lun: u16) -> Result<Arc<LogicalUnit>, NoSuchLun> {
        let removed = {
            let mut units = self.units.write().unwrap_or_else(|e| e.into_inner());
            let mut map = units.map.clone();
            let removed = map.remove(&lun).ok_or_else(|| NoSuchLun {
                lun,
                existing: units.ids.clone(),
            })?;
            *units = Arc::new(Units::of(map));
            removed
        };
        info!(lun, "LUN removed");
        self.luns_changed();
        Ok(removed)
    }

    /// Queues REPORTED LUNS DATA HAS CHANGED for every nexus any unit knows.
    fn luns_changed(&self) {
        self.tell_every_nexus(Asc::REPORTED_LUNS_DATA_HAS_CHANGED);
    }

    /// Queues the unit attention `code` on every unit for every nexus any
    /// unit of the table knows (a change of the target, not of one unit).
    fn tell_every_nexus(&self, code: Asc) {
        self.tell_every_nexus_but(None, code);
    }

    /// [`Self::tell_every_nexus`], leaving out `except` (the nexus whose
    /// own command made the change).
    fn tell_every_nexus_but(&self, except: Option<&ItNexus>, code: Asc) {
        let units = self.snapshot();
        let mut nexuses = std::collections::HashSet::new();
        for lu in units.map.values() {
            nexuses.extend(lu.lock().ua.known().cloned());
        }
        if let Some(e) = except {
            nexuses.remove(e);
        }
        for lu in units.map.values() {
            let mut st = lu.lock();
            for n in &nexuses {
                st.ua.push(n, code);
            }
        }
    }

    /// Sets the target port groups every unit of the table is reached
    /// through, in order (the first is reported preferred). Each group's
    /// ports are relative target port identifiers, the
    /// `ItNexus::relative_target_port` of commands that come through it.
    /// Without any, every port is in one active/optimized group.
    ///
    /// A group that stays with another access state is an implicit ALUA
    /// transition (SPC-4 5.16.2.4): every nexus any unit knows hears
    /// ASYMMETRIC ACCESS STATE CHANGED (2Ah/06h), so that a multipath host
    /// asks REPORT TARGET PORT GROUPS again and moves its I/O before a
    /// command fails on a port gone to standby. Returns the groups whose
    /// state changed, with the states before and after.
    pub fn set_port_groups(
        &self,
        groups: Vec<TargetPortGroup>,
    ) -> Vec<(u16, AluaState, AluaState)> {
        let saving = self.alua_saving();
        let (changed, kept) = {
            let mut ports = self.ports.write().unwrap_or_else(|e| e.into_inner());
            let before = ports.set_states();
            let changed = ports.replace(groups);
            let kept = ports.set_states();
            (changed, (kept != before).then_some(kept))
        };
        // A state the configuration changed is no longer one an initiator
        // set: the saved file forgets it. The change itself stands whether
        // or not the file could be written (it came from the configuration,
        // which a restart reads again).
        if let (Some(path), Some(kept)) = (saving.as_ref(), kept) {
            if let Err(e) = super::alua_saved::save(path, &kept) {
                warn!(
                    path = %path.display(),
                    "the ALUA states set by SET TARGET PORT GROUPS could not be saved: {e}; after \
                     a restart the target would put back ones this change undid"
                );
            }
        }
        drop(saving);
        if !changed.is_empty() {
            for (id, from, to) in &changed {
                info!(
                    group = id,
                    from = from.name(),
                    to = to.name(),
                    "ALUA state changed"
                );
            }
            self.tell_every_nexus(Asc::ASYMMETRIC_ACCESS_STATE_CHANGED);
        }
        changed
    }

    /// The target port groups (see [`Self::set_port_groups`]), with the
    /// states SET TARGET PORT GROUPS may have given them since.
    pub fn target_port_groups(&self) -> Vec<TargetPortGroup> {
        self.port_groups().groups.clone()
    }

    /// Allows (`true`) or refuses initiators' SET TARGET PORT GROUPS
    /// (explicit ALUA, TPGS=11b in standard INQUIRY data). A change is
    /// heard as INQUIRY DATA HAS CHANGED. Returns whether it changed.
    ///
    /// Turned off, the states initiators set stay as they are, but as the
    /// configuration's own from then on (the management plane writes them
    /// into the running configuration first): they are no longer reported
    /// as set by SET TARGET PORT GROUPS, and their saved file goes at once,
    /// as at a start with explicit ALUA off, so that turning it on again
    /// before a restart does not bring back at the next start a state set
    /// before.
    pub fn set_explicit_alua(&self, explicit: bool) -> bool {
        let changed = {
            let saving = self.alua_saving();
            let mut ports = self.ports.write().unwrap_or_else(|e| e.into_inner());
            let changed = ports.explicit != explicit;
            ports.explicit = explicit;
            if changed && !explicit {
                ports.set_by_command.clear();
                if let Some(path) = saving.as_ref() {
                    super::saved_file::remove_saved(path);
                }
            }
            changed
        };
        if changed {
            self.tell_every_nexus(Asc::INQUIRY_DATA_HAS_CHANGED);
        }
        changed
    }

    /// The table as built, allowing SET TARGET PORT GROUPS or not (see
    /// [`Self::set_explicit_alua`]); no nexus is told, since a table being
    /// built has served none (its units may have, in the table it will
    /// replace, which tells them of a change itself).
    pub fn with_explicit_alua(self, explicit: bool) -> LunTable {
        self.ports
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .explicit = explicit;
        self
    }

    /// The table as built, keeping the states SET TARGET PORT GROUPS sets
    /// in `path` (rewritten whenever they change), so that
    /// [`Self::restore_alua_states`] puts them back after a restart.
    pub fn with_alua_state_file(self, path: PathBuf) -> LunTable {
        *self.alua_saving() = Some(path);
        self
    }

    /// At start-up: puts back the states SET TARGET PORT GROUPS had set
    /// before the target stopped, from the file given by
    /// [`Self::with_alua_state_file`], where the target allows explicit
    /// ALUA (without it only the configuration sets states, and the file
    /// goes). Groups the target no longer has are left out.
    /// No nexus is told: none has logged in yet. A file that cannot be
    /// read leaves the configured states, said at error level. Returns the
    /// groups whose state changed, with the states before and after.
    pub fn restore_alua_states(&self) -> Vec<(u16, AluaState, AluaState)> {
        let saving = self.alua_saving();
        let Some(path) = saving.as_ref() else {
            return Vec::new();
        };
        let saved = match super::alua_saved::load(path) {
            Ok(Some(saved)) => saved,
            Ok(None) => return Vec::new(),
            Err(why) => {
                error!(
                    path = %path.display(),
                    "ALUA states set by SET TARGET PORT GROUPS not restored, {why}: the target \
                     serves with its configured states; an initiator's next SET TARGET PORT \
                     GROUPS writes the file again"
                );
                return Vec::new();
            }
        };
        let mut ports = self.ports.write().unwrap_or_else(|e| e.into_inner());
        if !ports.explicit {
            // They hold no longer, and must not come back if explicit ALUA
            // is turned on again later.
            super::saved_file::remove_saved(path);
            if !saved.is_empty() {
                warn!(
                    path = %path.display(),
                    "ALUA states set by SET TARGET PORT GROUPS not restored, and their file \
                     removed: explicit_alua is off for this target, so only the configuration \
                     sets its states"
                );
            }
            return Vec::new();
        }
        let (changed, gone) = ports.restore(&saved);
        for id in gone {
            warn!(
                group = id,
                path = %path.display(),
                "a saved ALUA state names a portal group the target no longer has; left out"
            );
        }
        for (id, from, to) in &changed {
            info!(
                group = id,
                from = from.name(),
                to = to.name(),
                "ALUA state set by SET TARGET PORT GROUPS before the restart restored"
            );
        }
        changed
    }

    /// The target leaves the running configuration: the states initiators
    /// set no longer hold anywhere, so their file goes (a target added
    /// again under the name starts from its configured states, now and
    /// after a restart).
    pub fn forget_alua_states(&self) {
        let mut saving = self.alua_saving();
        if let Some(path) = saving.take() {
            super::saved_file::remove_saved(&path);
        }
    }

    fn alua_saving(&self) -> MutexGuard<'_, Option<PathBuf>> {
        self.alua_saved.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether initiators may set states (see [`Self::set_explicit_alua`]).
    pub fn explicit_alua(&self) -> bool {
        self.port_groups().explicit
    }

    /// The groups whose state a SET TARGET PORT GROUPS set last.
    pub fn port_groups_set_by_command(&self) -> Vec<u16> {
        self.port_groups().set_by_command.clone()
    }

    /// SET TARGET PORT GROUPS from `nexus` (SPC-4 6.38): an explicit ALUA
    /// transition. Refused as an unsupported command where the target
    /// does not allow explicit ALUA. The named groups take their states
    /// at once (this target has no transitioning state) and, where the
    /// table keeps a file of them, are saved before the command succeeds
    /// (HARDWARE ERROR, SET TARGET PORT GROUPS COMMAND FAILED, SPC-4 6.45,
    /// and nothing changed when they cannot be); every other
    /// nexus hears ASYMMETRIC ACCESS STATE CHANGED (SPC-4 5.16.2.5), the
    /// one that asked does not.
    pub(crate) fn set_target_port_groups(
        &self,
        nexus: &ItNexus,
        parameter_list_length: u32,
        data_out: &[u8],
    ) -> CmdResult {
        if !self.explicit_alua() {
            return Err(illegal(Asc::INVALID_COMMAND_OPERATION_CODE));
        }
        let requests = super::alua::parse_set_target_port_groups(parameter_list_length, data_out)?;
        // Changed on a copy, saved, then committed: a state that would not
        // outlive a restart is refused, and nothing changes.
        let saving = self.alua_saving();
        let mut next = self.port_groups().clone();
        // Explicit ALUA may have been turned off while this command waited
        // for the saved file: it then changes nothing (INQUIRY no longer
        // offers the command, and the file is gone for good).
        if !next.explicit {
            return Err(illegal(Asc::INVALID_COMMAND_OPERATION_CODE));
        }
        let changed = next.set_by_command(&requests)?;
        if let Some(path) = saving.as_ref() {
            if let Err(e) = super::alua_saved::save(path, &next.set_states()) {
                error!(
                    path = %path.display(),
                    initiator = %nexus.initiator_port,
                    "SET TARGET PORT GROUPS refused: its states could not be saved: {e}"
                );
                return Err(Failure::Check(Sense::new(
                    SenseKey::HardwareError,
                    Asc::SET_TARGET_PORT_GROUPS_COMMAND_FAILED,
                )));
            }
        }
        *self.ports.write().unwrap_or_else(|e| e.into_inner()) = next;
        drop(saving);
        for (id, from, to) in &changed {
            info!(
                group = id,
                from = from.name(),
                to = to.name(),
                initiator = %nexus.initiator_port,
                "ALUA state changed by SET TARGET PORT GROUPS"
            );
        }
        if !changed.is_empty() {
            self.tell_every_nexus_but(Some(nexus), Asc::ASYMMETRIC_ACCESS_STATE_CHANGED);
        }
        Ok(Done::none())
    }

    pub(crate) fn port_groups(&self) -> RwLockReadGuard<'_, PortGroups> {
        self.ports.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Stalls (`true`) or releases (`false`) `lun`: while stalled, its
    /// media commands wait before they reach the backstore and resume when
    /// released, unless their task was aborted meanwhile (see
    /// `LogicalUnit::set_stalled`). Logged at warn level.
    pub fn set_stalled(&self, lun: u16, stalled: bool) -> Result<StallChange, NoSuchLun> {
        let units = self.snapshot();
        let lu = units.map.get(&lun).ok_or_else(|| NoSuchLun {
            lun,
            existing: units.ids.clone(),
        })?;
        let change = lu.set_stalled(stalled);
        if stalled {
            warn!(
                lun,
                "LUN stalled: media commands wait before the backstore until released"
            );
        } else {
            warn!(
                lun,
                held = change.held,
                was_stalled = change.was_stalled,
                "LUN released: held media commands resume (aborted ones are dropped)"
            );
        }
        Ok(change)
    }

    /// Executes one command (blocking: may wait for backstore I/O). Safe
    /// to call from many threads at once, also for the same LUN.
    pub fn execute(&self, req: &ScsiRequest<'_>) -> ScsiResult {
        // Every event below (backstore errors, reservation changes) carries
        // the LUN and initiator through this span.
        let span = debug_span!("scsi", lun = req.lun, initiator = %req.nexus.initiator_port, itt = req.task_tag);
        let _in = span.enter();
        match self.get(req.lun) {
            Some(lu) => lu.execute(req.lun, req, self, true),
            None => self.no_such_lun(req),
        }
    }

    /// [`LunTable::execute`] for a planned command's length-0 validation
    /// probe: the same checks, but not counted as a READ or WRITE of its
    /// own (the planned command is counted when it ends).
    pub(crate) fn execute_probe(&self, req: &ScsiRequest<'_>) -> ScsiResult {
        match self.get(req.lun) {
            Some(lu) => lu.execute(req.lun, req, self, false),
            None => self.no_such_lun(req),
        }
    }

    /// Whether `lun` exists.
    pub fn has_lun(&self, lun: u16) -> bool {
        self.snapshot().map.contains_key(&lun)
    }

    /// The LUNs, ascending.
    pub fn lun_ids(&self) -> Vec<u16> {
        self.snapshot().ids.clone()
    }

    /// The unit at `lun`.
    pub fn get(&self, lun: u16) -> Option<Arc<LogicalUnit>> {
        self.snapshot().map.get(&lun).cloned()
    }

    /// Every unit, by LUN.
    pub fn units(&self) -> Vec<(u16, Arc<LogicalUnit>)> {
        self.snapshot()
            .map
            .iter()
            .map(|(id, lu)| (*id, lu.clone()))
            .collect()
    }

    /// Sets what PREEMPT AND ABORT calls, with the LUN and the preempted
    /// nexus, so the fabric aborts that nexus's tasks on that LUN (SPC-4
    /// 5.9.11.5). Without one, only the reservation state changes.
    pub fn set_abort_handler(&self, handler: TableAbortHandler) {
        *self.abort.lock().unwrap_or_else(|e| e.into_inner()) = Some(handler.clone());
        for (lun, lu) in self.units() {
            let h = handler.clone();
            lu.set_abort_handler(Arc::new(move |n: &ItNexus| h(lun, n)));
        }
    }

    /// LOGICAL UNIT RESET of `lun`, requested through `by`; the commands
    /// then running on it, which the reset's response waits for.
    pub fn reset_lun(&self, lun: u16, by: &ItNexus) -> Settling {
        let mut settling = Settling::default();
        if let Some(lu) = self.get(lun) {
            info!(lun, initiator = %by.initiator_port, "logical unit reset");
            lu.reset(Asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED);
            settling.add(lun, lu);
        }
        settling
    }

    /// TARGET WARM/COLD RESET requested through `by`: every unit is reset.
    /// The commands then running, which the reset's response waits for.
    pub fn reset_target(&self, by: &ItNexus) -> Settling {
        info!(initiator = %by.initiator_port, "target reset");
        let mut settling = Settling::default();
        for (lun, lu) in self.units() {
            lu.reset(Asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET);
            settling.add(lun, lu);
        }
        settling
    }

    /// I_T nexus loss (session closed or reinstated): releases the
    /// nexus's SPC-2 reservations and per-nexus state on every unit.
    /// Persistent reservations and registrations stay.
    pub fn nexus_lost(&self, nexus: &ItNexus) {
        for (_, lu) in self.units() {
            lu.nexus_lost(nexus);
        }
    }

    /// Flushes every unit's backstore (shutdown); the first error wins but
    /// every unit is still flushed.
    pub fn flush_all(&self) -> std::io::Result<()> {
        let mut first = Ok(());
        for (lun, lu) in self.units() {
            if let Err(e) = lu.flush() {
                warn!(lun, error = %e, "flush failed");
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// A command to a LUN with no unit (SPC-4 4.6.4 / 6.6.2): INQUIRY
    /// answers with peripheral qualifier 3, REPORT LUNS and REQUEST SENSE
    /// work, anything else is LOGICAL UNIT NOT SUPPORTED.
    fn no_such_lun(&self, req: &ScsiRequest<'_>) -> ScsiResult {
        let opcode = req.cdb.first().copied().unwrap_or(0xff);
        let decoded = Cdb::decode(req.cdb);
        let outcome: CmdResult = match (opcode, decoded) {
            (
                _,
                Ok(Cdb::Inquiry {
                    evpd: false,
                    allocation_length,
                    ..
                }),
            ) => {
                let mut inq = StandardInquiry::new("", "", "");
                inq.peripheral = Peripheral::NO_LUN;
                Ok(Done::data(inq.encode(), u32::from(allocation_length)))
            }
            (
                _,
                Ok(Cdb::ReportLuns {
                    select_report,
                    allocation_length,
                }),
            ) => report_luns(&self.lun_ids(), select_report, allocation_length),
            (
                _,
                Ok(Cdb::RequestSense {
                    desc,
                    allocation_length,
                }),
            ) => {
                let s = Sense::new(SenseKey::IllegalRequest, Asc::LU_NOT_SUPPORTED);
                let f = if desc {
                    SenseFormat::Descriptor
                } else {
                    SenseFormat::Fixed
                };
                Ok(Done::data(s.encode(f), u32::from(allocation_length)))
            }
            (op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE, Err(e)) => {
                Err(super::outcome::Failure::Check(e.to_sense()))
            }
            _ => Err(illegal(Asc::LU_NOT_SUPPORTED)),
        };
        finish(outcome, 0, SenseFormat::Fixed, req.data_in_capacity)
    }
}

/// REPORT LUNS parameter data. SELECT REPORT 00h, 01h (well-known LUNs:
/// there are none) and 02h are defined by SPC-4; 10h-12h (SPC-5
/// administrative LUN forms) have nothing to report here.
pub(crate) fn report_luns(ids: &[u16], select_report: u8, allocation_length: u32) -> CmdResult {
    let list = match select_report {
        0 | 2 => ReportLuns::from_luns(ids.iter().filter_map(|&i| Lun::new(i))),
        1 | 0x10..=0x12 => ReportLuns::default(),
        _ => return Err(invalid_cdb(2, None)),
    };
    // SPC-4 6.33: an allocation length under 16 is an invalid field.
    if allocation_length < 16 {
        return Err(invalid_cdb(6, None));
    }
    Ok(Done::data(list.encode(), allocation_length))
}
