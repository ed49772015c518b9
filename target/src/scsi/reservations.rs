//! Reservations: SPC-2 RESERVE/RELEASE and SPC-4 persistent reservations
//! (5.9, 6.13, 6.14), with the RESERVATION CONFLICT rules of SPC-4 table
//! 63 / SBC-3 table 13 and APTPL state persisted atomically.
//!
//! Registrations are keyed by I_T nexus. An initiator that comes back with
//! a new ISID is a different initiator port, hence a different nexus: it
//! is not registered and must register again (cluster fencing relies on
//! exactly this: a fenced node cannot regain access by reconnecting).
//! A registration made with ALL_TG_PT covers the initiator port through
//! every target port; one made through SPEC_I_PT with a name-only
//! TransportID covers every ISID of that initiator name.

use std::path::Path;
use std::sync::Arc;

use blockwire_pdu::scsi::{
    Asc, Cdb, PrInAction, PrOutAction, PrOutData, PrOutParameters, PrType,
    RegisterAndMoveParameters, TransportId,
};
use tracing::{error, info, warn};

use super::logical_unit::LogicalUnit;
use super::lun_table::LunTable;
use super::outcome::{
    illegal, internal_failure, invalid_cdb, invalid_param, param_length, CmdResult, Done, Failure,
};
use super::saved_file::{read_saved, remove_durably, save_atomically};
use super::ItNexus;

/// Most registrations one logical unit keeps (INSUFFICIENT REGISTRATION
/// RESOURCES beyond): bounds memory against a peer that registers in a loop
/// with new ISIDs.
const MAX_REGISTRATIONS: usize = 1024;

/// One registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Registration {
    /// Initiator port name ("name,i,0xisid"), or the bare initiator name
    /// when `name_only`.
    initiator: Arc<str>,
    /// Matches every ISID of `initiator` (SPEC_I_PT with a TransportID of
    /// format 00b).
    name_only: bool,
    /// Target port it was made through.
    target_port: Arc<str>,
    /// Relative target port identifier of `target_port`.
    rtpi: u16,
    /// Registered through all target ports.
    all_tg_pt: bool,
    /// RESERVATION KEY.
    key: u64,
}

impl Registration {
    fn for_nexus(n: &ItNexus, key: u64, all_tg_pt: bool) -> Registration {
        Registration {
            initiator: n.initiator_port.clone(),
            name_only: false,
            target_port: n.target_port.clone(),
            rtpi: n.relative_target_port,
            all_tg_pt,
            key,
        }
    }

    fn matches(&self, n: &ItNexus) -> bool {
        let who = if self.name_only {
            n.initiator_name().eq_ignore_ascii_case(&self.initiator)
        } else {
            n.initiator_port.eq_ignore_ascii_case(&self.initiator)
        };
        who && (self.all_tg_pt || *self.target_port == *n.target_port)
    }

    /// Whether some I_T nexus would match both: each I_T nexus has at most
    /// one registration, hence one reservation key (SPC-4 5.9.7).
    fn overlaps(&self, o: &Registration) -> bool {
        let ports = self.all_tg_pt || o.all_tg_pt || *self.target_port == *o.target_port;
        let initiators = if self.name_only || o.name_only {
            // A name-only registration covers every ISID of the name.
            self.initiator_name()
                .eq_ignore_ascii_case(o.initiator_name())
        } else {
            self.initiator.eq_ignore_ascii_case(&o.initiator)
        };
        ports && initiators
    }

    /// The initiator name, without the ISID part of a port name.
    fn initiator_name(&self) -> &str {
        if self.name_only {
            return &self.initiator;
        }
        self.initiator
            .split_once(",i,")
            .map_or(&*self.initiator, |(name, _)| name)
    }

    fn transport_id(&self) -> TransportId {
        if self.name_only {
            return TransportId::Iscsi {
                name: self.initiator.to_string(),
                isid: None,
            };
        }
        match self.initiator.split_once(",i,0x") {
            Some((name, isid)) => TransportId::Iscsi {
                name: name.to_owned(),
                isid: Some(isid.to_owned()),
            },
            None => TransportId::Iscsi {
                name: self.initiator.to_string(),
                isid: None,
            },
        }
    }
}

/// A persistent reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reservation {
    /// Index into `PrState::regs` of the holder's registration (unused for
    /// the all-registrants types, where every registrant holds it).
    holder: usize,
    ty: PrType,
}

/// Persistent reservation state: changed on a copy and committed only
/// after APTPL state is safely on disk, so a failed save changes nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PrState {
    generation: u32,
    regs: Vec<Registration>,
    resv: Option<Reservation>,
    aptpl: bool,
}

fn all_registrants(t: PrType) -> bool {
    matches!(
        t,
        PrType::WriteExclusiveAllRegistrants | PrType::ExclusiveAccessAllRegistrants
    )
}

fn registrants_only(t: PrType) -> bool {
    matches!(
        t,
        PrType::WriteExclusiveRegistrantsOnly | PrType::ExclusiveAccessRegistrantsOnly
    )
}

impl PrState {
    fn find(&self, n: &ItNexus) -> Option<usize> {
        self.regs.iter().position(|r| r.matches(n))
    }

    fn is_holder(&self, n: &ItNexus) -> bool {
        match &self.resv {
            None => false,
            Some(r) if all_registrants(r.ty) => self.find(n).is_some(),
            Some(r) => self.regs.get(r.holder).is_some_and(|h| h.matches(n)),
        }
    }

    /// Removes registrations for which `pick` is true, keeping `holder`
    /// pointing at the same registration. Returns the removed ones and
    /// whether the holder was among them.
    fn remove_where(
        &mut self,
        pick: impl Fn(usize, &Registration) -> bool,
    ) -> (Vec<Registration>, bool) {
        let holder = self.resv.as_ref().map(|r| r.holder);
        let mut removed = Vec::new();
        let mut kept = Vec::new();
        let mut new_holder = None;
        let mut holder_removed = false;
        for (i, r) in self.regs.drain(..).enumerate() {
            if pick(i, &r) {
                if Some(i) == holder {
                    holder_removed = true;
                }
                removed.push(r);
            } else {
                if Some(i) == holder {
                    new_holder = Some(kept.len());
                }
                kept.push(r);
            }
        }
        self.regs = kept;
        if let Some(r) = self.resv.as_mut() {
            match new_holder {
                Some(h) => r.holder = h,
                // An all-registrants reservation is held by every registrant (SPC-4
                // 5.9.10.3); its record names one of them, which must stay a registration:
                // the APTPL file is read back by that index, and one past the end reads as
                // damaged (the unit would come back NOT READY).
                None if holder_removed && all_registrants(r.ty) && !self.regs.is_empty() => {
                    r.holder = 0;
                }
                None => {}
            }
        }
        (removed, holder_removed)
    }

    /// Whether this is a state the device server could hold: at most
    /// [`MAX_REGISTRATIONS`] registrations, no I_T nexus matched by two of
    /// them, and a reservation's record naming one of them.
    #[cfg(any(test, feature = "fuzzing"))]
    fn well_formed(&self) -> bool {
        self.regs.len() <= MAX_REGISTRATIONS
            && self
                .regs
                .iter()
                .enumerate()
                .all(|(i, r)| !self.regs[..i].iter().any(|o| o.overlaps(r)))
            && self
                .resv
                .as_ref()
                .is_none_or(|r| r.holder < self.regs.len())
    }

    /// Text form for the APTPL file: one record a line, fields separated
    /// by spaces. The names come from the initiators' logins, so each is
    /// written escaped ([`escape_field`]): whatever it holds, it stays one
    /// field of its own record.
    ///
    /// The last line, `end <registrations> <0|1: a reservation>`, says the
    /// file is whole: one cut short (damaged after it was written, since
    /// it is written beside and renamed into place) lacks it or
    /// disagrees with it, and does not silently lose the reservation or
    /// the registrations after the cut.
    fn to_text(&self) -> String {
        let mut s = format!("blockwire-pr 2\ngeneration {}\n", self.generation);
        for r in &self.regs {
            s.push_str(&format!(
                "reg {:016x} {} {} {} {} {}\n",
                r.key,
                u8::from(r.all_tg_pt),
                u8::from(r.name_only),
                r.rtpi,
                escape_field(&r.initiator),
                escape_field(&r.target_port)
            ));
        }
        if let Some(r) = &self.resv {
            s.push_str(&format!("resv {} {}\n", r.ty.code(), r.holder));
        }
        s.push_str(&format!(
            "end {} {}\n",
            self.regs.len(),
            u8::from(self.resv.is_some())
        ));
        s
    }

    /// Reads [`Self::to_text`]'s form back. Only a state the device server
    /// could have saved is accepted: one generation and at most one
    /// reservation record, at most [`MAX_REGISTRATIONS`] registrations and
    /// never two that one I_T nexus would match (each nexus has at most one
    /// registration, SPC-4 5.9.7). Anything else is damage: restored, it
    /// would give a nexus two keys, or say a unit is reserved twice.
    ///
    /// Version 1 files, written before the `end` line, are read as they
    /// were; a version 2 file must end with its `end` line and a newline.
    fn from_text(text: &str) -> Option<PrState> {
        let mut lines = text.lines();
        let ends_checked = match lines.next()? {
            "blockwire-pr 1" => false,
            "blockwire-pr 2" => true,
            _ => return None,
        };
        if ends_checked && !text.ends_with('\n') {
            return None;
        }
        let mut st = PrState {
            aptpl: true,
            ..PrState::default()
        };
        let mut generation_seen = false;
        let mut ended = false;
        for line in lines {
            if ended {
                return None;
            }
            let f: Vec<&str> = line.split(' ').collect();
            match f.as_slice() {
                ["generation", g] if !generation_seen => {
                    generation_seen = true;
                    st.generation = g.parse().ok()?;
                }
                ["reg", key, atp, no, rtpi, ini, tp] => {
                    if st.regs.len() == MAX_REGISTRATIONS {
                        return None;
                    }
                    let r = Registration {
                        key: u64::from_str_radix(key, 16).ok()?,
                        all_tg_pt: flag(atp)?,
                        name_only: flag(no)?,
                        rtpi: rtpi.parse().ok()?,
                        initiator: Arc::from(unescape_field(ini)?),
                        target_port: Arc::from(unescape_field(tp)?),
                    };
                    if st.regs.iter().any(|o| o.overlaps(&r)) {
                        return None;
                    }
                    st.regs.push(r);
                }
                ["resv", ty, holder] if st.resv.is_none() => {
                    st.resv = Some(Reservation {
                        ty: PrType::from_code(ty.parse().ok()?)?,
                        holder: holder.parse().ok()?,
                    })
                }
                ["end", regs, resv] if ends_checked => {
                    if *regs != st.regs.len().to_string() || flag(resv)? != st.resv.is_some() {
                        return None;
                    }
                    ended = true;
                }
                [""] if !ends_checked => {}
                _ => return None,
            }
        }
        if ends_checked != ended {
            return None;
        }
        if st.resv.as_ref().is_some_and(|r| r.holder >= st.regs.len()) {
            return None;
        }
        Some(st)
    }
}

/// A flag field of the APTPL file: `0` or `1`, nothing else.
fn flag(field: &str) -> Option<bool> {
    match field {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    }
}

/// The APTPL file reader for the `pr_state_file` fuzz target.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    use super::PrState;

    /// Reads `text` as a logical unit reads its APTPL file at start-up.
    /// Whatever it accepts must be a state the device server could hold,
    /// and must be written back as it was read; panics otherwise. Returns
    /// whether the text was accepted.
    pub fn read_pr_state_file(text: &str) -> bool {
        let Some(st) = PrState::from_text(text) else {
            return false;
        };
        assert!(
            st.well_formed(),
            "accepted a state no device server holds: {st:?}"
        );
        assert_eq!(PrState::from_text(&st.to_text()).as_ref(), Some(&st));
        true
    }
}

/// A name as one field of an APTPL record: `%`, and every byte that is not
/// printable ASCII other than space, as `%` and two hex digits. A valid
/// iSCSI name has none of these, so it is written unchanged (files written
/// before names were escaped read the same).
fn escape_field(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for &b in name.as_bytes() {
        if b.is_ascii_graphic() && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The name [`escape_field`] wrote; None if `field` is not its output.
fn unescape_field(field: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(field.len());
    let mut rest = field.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

/// Reservation state of one logical unit.
#[derive(Debug, Default)]
pub(crate) struct Reservations {
    /// SPC-2 reservation holder.
    spc2: Option<ItNexus>,
    /// Persistent reservations.
    pr: PrState,
    /// The saved reservations could not be read back: the unit then stays
    /// not ready (the reason is logged once, by [`Self::load`]).
    unreadable: bool,
}

impl Reservations {
    /// Registrations kept in memory only (APTPL off): a unit built anew
    /// over the same store starts without them, and without the
    /// reservation they carry.
    pub(crate) fn unsaved_registrations(&self) -> usize {
        if self.pr.aptpl {
            0
        } else {
            self.pr.regs.len()
        }
    }

    /// State at start-up: persistent reservations saved with APTPL are
    /// read back from `path`; a missing file is a clean start. A file that
    /// is there but cannot be read or parsed leaves the unit not ready
    /// rather than up without its reservations, which would let a node
    /// they fenced out read and write again.
    pub fn load(path: Option<&Path>) -> Reservations {
        let mut r = Reservations::default();
        let Some(p) = path else { return r };
        let why = match read_saved(p) {
            Ok(Some(text)) => match PrState::from_text(&text) {
                Some(mut st) => {
                    info!(path = %p.display(), registrations = st.regs.len(), "persistent reservations restored");
                    // A start of the unit is its power on: the registrations
                    // and the reservation persist through it (APTPL), but
                    // "regardless of the APTPL bit value the PRgeneration
                    // value shall be set to zero by a power on" (SPC-4
                    // 6.16.2). The saved generation is kept in the file only
                    // so that files stay in one format.
                    st.generation = 0;
                    r.pr = st;
                    return r;
                }
                None => "it is damaged (not the format blockwire writes)".to_owned(),
            },
            Ok(None) => return r,
            Err(why) => why,
        };
        error!(
            path = %p.display(),
            "persistent reservation file not restored, {why}: the logical unit answers NOT READY, \
             MANUAL INTERVENTION REQUIRED to everything but INQUIRY, REPORT LUNS and REQUEST SENSE \
             rather than run without the reservations that fence nodes out; restore the file, or \
             move it aside to start with no reservations, then restart the target"
        );
        r.unreadable = true;
        r
    }

    /// Whether the saved reservations could not be read back (see
    /// [`Self::load`]): the unit is not ready until the file is dealt with.
    pub fn unreadable(&self) -> bool {
        self.unreadable
    }

    /// Logical unit reset: SPC-2 reservations go; persistent ones stay.
    pub fn reset(&mut self) {
        self.spc2 = None;
    }

    /// I_T nexus loss.
    pub fn nexus_lost(&mut self, nexus: &ItNexus) {
        if self.spc2.as_ref() == Some(nexus) {
            self.spc2 = None;
        }
    }
}

/// How a command is treated under reservations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Never conflicts.
    Always,
    /// Reads the medium or unit state: allowed under Write Exclusive.
    Read,
    /// Changes the medium or unit state.
    Write,
    /// PERSISTENT RESERVE IN/OUT: the PR rules apply inside the command.
    Pr,
    /// RESERVE / RELEASE (SPC-2).
    Spc2,
}

fn access(cdb: &Cdb) -> Access {
    use Cdb::*;
    match cdb {
        Inquiry { .. }
        | ReportLuns { .. }
        | RequestSense { .. }
        | ReportTargetPortGroups { .. }
        | ReportSupportedOperationCodes { .. }
        | ReportSupportedTmfs { .. }
        | TestUnitReady
        | ReadCapacity10 { .. }
        | ReadCapacity16 { .. }
        // Allowed under every persistent reservation type (SPC-4 table
        // "SPC commands that are allowed in the presence of various
        // reservations"): they neither read nor change the medium.
        | LogSense { .. }
        | PreventAllowMediumRemoval { prevent: 0 } => Access::Always,
        PersistentReserveIn { .. } | PersistentReserveOut { .. } => Access::Pr,
        Reserve6 | Release6 | Reserve10 { .. } | Release10 { .. } => Access::Spc2,
        Read { .. }
        | Verify { .. }
        | ModeSense6 { .. }
        | ModeSense10 { .. }
        | GetLbaStatus { .. }
        | PreFetch { .. }
        | ReceiveCopyResults { .. }
        | TokenCopy {
            service_action: blockwire_pdu::scsi::opcode::copy_out::POPULATE_TOKEN,
            ..
        } => Access::Read,
        Unknown {
            opcode: super::control::READ_DEFECT_DATA_10 | super::control::READ_DEFECT_DATA_12,
            ..
        } => Access::Read,
        _ => Access::Write,
    }
}

impl LogicalUnit {
    /// RESERVATION CONFLICT when `nexus` may not run `cdb` now.
    pub(crate) fn reservation_check(&self, nexus: &ItNexus, cdb: &Cdb) -> Result<(), Failure> {
        let st = self.lock();
        let acc = access(cdb);
        if let Some(holder) = &st.res.spc2 {
            // SPC-2: everything but the identification commands and RELEASE
            // conflicts for other nexuses, PR commands included.
            let allowed = matches!(cdb, Cdb::Release6 | Cdb::Release10 { .. })
                || (acc == Access::Always
                    && !matches!(
                        cdb,
                        Cdb::TestUnitReady
                            | Cdb::ReadCapacity10 { .. }
                            | Cdb::ReadCapacity16 { .. }
                            | Cdb::LogSense { .. }
                            | Cdb::PreventAllowMediumRemoval { .. }
                    ));
            if holder != nexus && !allowed {
                return Err(Failure::Conflict);
            }
        }
        let pr = &st.res.pr;
        if acc == Access::Spc2 && !pr.regs.is_empty() {
            // CRH=1 (SPC-4 5.9.3): RESERVE and RELEASE from the holder, or
            // from a registered nexus under a registrants-only or
            // all-registrants reservation, are successful no-ops; every
            // other one conflicts with the registrations, as SPC-2 5.5.1
            // has it. (A RESERVE granted here would shut the registrants'
            // PREEMPT out: fencing would stop working.)
            return if crh_exempt(pr, nexus) {
                Ok(())
            } else {
                Err(Failure::Conflict)
            };
        }
        let Some(resv) = &pr.resv else {
            return Ok(());
        };
        if acc == Access::Always || acc == Access::Pr || pr.is_holder(nexus) {
            return Ok(());
        }
        let registered = pr.find(nexus).is_some();
        let exclusive_access = matches!(
            resv.ty,
            PrType::ExclusiveAccess
                | PrType::ExclusiveAccessRegistrantsOnly
                | PrType::ExclusiveAccessAllRegistrants
        );
        let registrants_ok = registrants_only(resv.ty) || all_registrants(resv.ty);
        if registrants_ok && registered {
            return Ok(());
        }
        match acc {
            Access::Read if !exclusive_access => Ok(()),
            _ => Err(Failure::Conflict),
        }
    }

    pub(crate) fn reserve_spc2(&self, nexus: &ItNexus) -> CmdResult {
        let mut st = self.lock();
        let pr = &st.res.pr;
        if pr.resv.is_some() || !pr.regs.is_empty() {
            // Decided again under the lock `reservation_check` let go of: a
            // registration made since conflicts as one made before (CRH=1,
            // SPC-4 5.9.3), or the RESERVE would shut the registrants'
            // PREEMPT out. The holder's is a successful no-op.
            return if crh_exempt(pr, nexus) {
                Ok(Done::none())
            } else {
                Err(Failure::Conflict)
            };
        }
        match &st.res.spc2 {
            Some(h) if h != nexus => Err(Failure::Conflict),
            _ => {
                st.res.spc2 = Some(nexus.clone());
                Ok(Done::none())
            }
        }
    }

    pub(crate) fn release_spc2(&self, nexus: &ItNexus) -> CmdResult {
        let mut st = self.lock();
        if st.res.spc2.as_ref() == Some(nexus) {
            st.res.spc2 = None;
        }
        Ok(Done::none())
    }

    /// PERSISTENT RESERVE IN.
    pub(crate) fn pr_in(&self, sa: PrInAction, allocation_length: u16) -> CmdResult {
        let st = self.lock();
        let pr = &st.res.pr;
        let mut d = Vec::new();
        d.extend_from_slice(&pr.generation.to_be_bytes());
        match sa {
            PrInAction::ReadKeys => {
                d.extend_from_slice(&((pr.regs.len() * 8) as u32).to_be_bytes());
                for r in &pr.regs {
                    d.extend_from_slice(&r.key.to_be_bytes());
                }
            }
            PrInAction::ReadReservation => match &pr.resv {
                None => d.extend_from_slice(&0u32.to_be_bytes()),
                Some(r) => {
                    d.extend_from_slice(&16u32.to_be_bytes());
                    // All-registrants reservations report key 0 (SPC-4 6.13.3.3).
                    let key = if all_registrants(r.ty) {
                        0
                    } else {
                        pr.regs.get(r.holder).map_or(0, |h| h.key)
                    };
                    d.extend_from_slice(&key.to_be_bytes());
                    d.extend_from_slice(&[0, 0, 0, 0, 0, r.ty.code(), 0, 0]);
                }
            },
            PrInAction::ReportCapabilities => {
                d.clear();
                let ptpl_c = self.cfg.pr_state_path.is_some();
                d.extend_from_slice(&8u16.to_be_bytes());
                // CRH, SIP_C, ATP_C, PTPL_C.
                d.push(0x10 | 0x08 | 0x04 | u8::from(ptpl_c));
                // TMV, ALLOW COMMANDS 001b (TEST UNIT READY et al. allowed
                // under Exclusive Access), PTPL_A.
                d.push(0x80 | 0x10 | u8::from(pr.aptpl));
                // Type mask: WR_EX_AR, EX_AC_RO, WR_EX_RO, EX_AC, WR_EX; EX_AC_AR.
                d.extend_from_slice(&[0x80 | 0x40 | 0x20 | 0x08 | 0x02, 0x01, 0, 0]);
            }
            PrInAction::ReadFullStatus => {
                let mut body = Vec::new();
                for (i, r) in pr.regs.iter().enumerate() {
                    let holder = match &pr.resv {
                        Some(res) if all_registrants(res.ty) => true,
                        Some(res) => res.holder == i,
                        None => false,
                    };
                    body.extend_from_slice(&r.key.to_be_bytes());
                    body.extend_from_slice(&[0; 4]);
                    body.push(u8::from(r.all_tg_pt) << 1 | u8::from(holder));
                    body.push(match (&pr.resv, holder) {
                        (Some(res), true) => res.ty.code(),
                        _ => 0,
                    });
                    body.extend_from_slice(&[0; 4]);
                    body.extend_from_slice(&r.rtpi.to_be_bytes());
                    let mut tid = Vec::new();
                    r.transport_id().encode_into(&mut tid);
                    body.extend_from_slice(&(tid.len() as u32).to_be_bytes());
                    body.extend_from_slice(&tid);
                }
                d.extend_from_slice(&(body.len() as u32).to_be_bytes());
                d.extend_from_slice(&body);
            }
        }
        Ok(Done::data(d, u32::from(allocation_length)))
    }

    /// PERSISTENT RESERVE OUT.
    pub(crate) fn pr_out(
        &self,
        nexus: &ItNexus,
        ports: &[u16],
        sa: PrOutAction,
        scope: u8,
        ty: u8,
        parameter_list_length: u32,
        data_out: &[u8],
    ) -> CmdResult {
        if sa == PrOutAction::ReplaceLostReservation {
            return Err(invalid_cdb(1, Some(4)));
        }
        let len = parameter_list_length as usize;
        let buf = data_out.get(..len).ok_or_else(param_length)?;
        // SPEC_I_PT with any action but REGISTER is an invalid field (SPC-4
        // 6.16.3), before its list is read as TransportIDs that are not
        // there (which would say PARAMETER LIST LENGTH ERROR).
        let spec_i_pt =
            sa != PrOutAction::RegisterAndMove && buf.get(20).is_some_and(|b| b & 0x08 != 0);
        if spec_i_pt && sa != PrOutAction::Register {
            return Err(invalid_param(20, Some(3)));
        }
        // A list of more ports than a unit registers is refused before it
        // is decoded whole (its length is the sender's choice).
        let params = PrOutData::decode_listing_at_most(sa, buf, MAX_REGISTRATIONS)
            .map_err(|e| Failure::Check(e.to_sense()))?;
        // Only actions that use the type check it (and LU_SCOPE). A PREEMPT
        // uses them only when it makes a reservation: one that only removes
        // registrations ignores both (SPC-4 5.12.11.2.2, 5.12.11.2.3).
        let type_and_scope = || {
            if scope != 0 {
                return Err(invalid_cdb(2, Some(7)));
            }
            PrType::from_code(ty).ok_or_else(|| invalid_cdb(2, Some(3)))
        };
        let pr_type = if matches!(sa, PrOutAction::Reserve | PrOutAction::Release) {
            Some(type_and_scope()?)
        } else {
            None
        };
        // APTPL is for the actions that register (SPC-4 6.16.3: ignored by
        // the others), SPEC_I_PT for REGISTER alone (any other action with
        // it is an invalid parameter list).
        let registers = matches!(
            sa,
            PrOutAction::Register
                | PrOutAction::RegisterAndIgnoreExistingKey
                | PrOutAction::RegisterAndMove
        );
        let aptpl_req = registers
            && match &params {
                PrOutData::Basic(p) => p.aptpl,
                PrOutData::RegisterAndMove(p) => p.aptpl,
            };
        if aptpl_req && self.cfg.pr_state_path.is_none() {
            // APTPL: byte 20 bit 0, or byte 17 bit 0 in REGISTER AND MOVE's
            // list (SPC-4 6.16.4).
            let byte = if sa == PrOutAction::RegisterAndMove {
                17
            } else {
                20
            };
            return Err(invalid_param(byte, Some(0)));
        }

        let mut st = self.lock();
        // An SPC-2 reservation taken since `reservation_check` let go of the
        // lock conflicts as one taken before: a registration beside it
        // could never preempt it.
        if st.res.spc2.as_ref().is_some_and(|h| h != nexus) {
            return Err(Failure::Conflict);
        }
        let mut next = st.res.pr.clone();
        let mut uas: Vec<(ItNexus, Asc)> = Vec::new();
        let mut aborted: Vec<Registration> = Vec::new();
        // Whether a registering action registered, unregistered or moved
        // anything: only then does its APTPL bit count.
        let mut registered = false;
        {
            let known: Vec<ItNexus> = st.ua.known().cloned().collect();
            let mut ctx = PrCtx {
                st: &mut next,
                nexus,
                known: &known,
                uas: &mut uas,
            };
            match (&params, sa) {
                (PrOutData::Basic(p), PrOutAction::Register) => {
                    registered = ctx.register(p, buf, false)?
                }
                (PrOutData::Basic(p), PrOutAction::RegisterAndIgnoreExistingKey) => {
                    registered = ctx.register(p, buf, true)?
                }
                (PrOutData::Basic(p), PrOutAction::Reserve) => {
                    ctx.reserve(p, pr_type.unwrap_or(PrType::WriteExclusive))?
                }
                (PrOutData::Basic(p), PrOutAction::Release) => {
                    ctx.release(p, pr_type.unwrap_or(PrType::WriteExclusive))?
                }
                (PrOutData::Basic(p), PrOutAction::Clear) => ctx.clear(p)?,
                (PrOutData::Basic(p), PrOutAction::Preempt | PrOutAction::PreemptAndAbort) => {
                    aborted = ctx.preempt(p, type_and_scope)?;
                    if sa != PrOutAction::PreemptAndAbort {
                        aborted.clear();
                    }
                }
                (PrOutData::RegisterAndMove(p), PrOutAction::RegisterAndMove) => {
                    ctx.register_and_move(p, ports)?;
                    registered = true;
                }
                _ => return Err(invalid_cdb(1, Some(4))),
            }
        }
        // APTPL: set by the actions that register, kept by the others. An
        // unregistered nexus's REGISTER of key zero does nothing at all
        // (SPC-4 table "Register behaviors"): it leaves APTPL, and with it
        // the saved reservations a fenced node might otherwise remove.
        if registered {
            next.aptpl = aptpl_req;
        }
        if next.regs.is_empty() {
            next.aptpl = false;
        }
        if next != st.res.pr {
            if let Some(path) = &self.cfg.pr_state_path {
                let res = if next.aptpl {
                    save_atomically(path, &next.to_text())
                } else if st.res.pr.aptpl {
                    remove_durably(path)
                } else {
                    Ok(())
                };
                if let Err(e) = res {
                    // A step after the rename or the unlink may have failed
                    // (its directory's sync): the file then holds the new
                    // state already, and memory must follow it, or a restart
                    // would bring back what the initiators were told failed.
                    // What the file says decides.
                    let on_disk = read_saved(path).ok().flatten();
                    let took = if next.aptpl {
                        on_disk.as_deref() == Some(next.to_text().as_str())
                    } else {
                        on_disk.is_none()
                    };
                    if !took {
                        warn!(path = %path.display(), error = %e, "cannot persist reservations");
                        return Err(internal_failure());
                    }
                    tracing::error!(path = %path.display(), error = %e, "the reservations were saved, but syncing their directory failed: they may not survive a power loss");
                }
            }
            st.res.pr = next;
        }
        for (n, code) in uas {
            st.ua.push(&n, code);
        }
        let known: Vec<ItNexus> = st.ua.known().cloned().collect();
        drop(st);
        info!(
            initiator = %nexus.initiator_port,
            action = ?sa,
            "persistent reservation changed"
        );
        if !aborted.is_empty() {
            // Committed: commands counted in from here check the new state.
            let epoch = self.in_flight.new_epoch();
            let preempted = |n: &ItNexus| n != nexus && aborted.iter().any(|r| r.matches(n));
            let handler = self.abort_handler();
            for n in known.iter().filter(|n| preempted(n)) {
                if let Some(h) = &handler {
                    h(n);
                }
                self.lock()
                    .ua
                    .push(n, Asc::COMMANDS_CLEARED_BY_ANOTHER_INITIATOR);
            }
            // Commands of the preempted nexuses already past their
            // reservation check (a write inside the backstore, say) finish
            // before this PREEMPT AND ABORT reports GOOD, whether or not
            // their connection still stands (see `in_flight`), however long
            // that takes (SPC-4 5.12.11.2.6): a GOOD before it would let the
            // fenced node's write land on the fencing node's data. Said
            // every PREEMPT_DRAIN_REPORT; the fencing initiator may give up
            // by aborting this command.
            let started = std::time::Instant::now();
            let mut said = std::time::Duration::ZERO;
            loop {
                let still = self
                    .in_flight
                    .wait_before(epoch, preempted, PREEMPT_DRAIN_STEP);
                if still.is_empty() {
                    break;
                }
                if super::stall::task_aborted() {
                    return Ok(Done {
                        status: blockwire_pdu::scsi::ScsiStatus::TASK_ABORTED.0,
                        ..Done::default()
                    });
                }
                let waited = started.elapsed();
                if waited >= said + PREEMPT_DRAIN_REPORT {
                    said = waited;
                    for n in &still {
                        tracing::warn!(
                            preempted = %n.initiator_port,
                            waited_s = waited.as_secs(),
                            "PREEMPT AND ABORT waits for commands of the preempted nexus still \
                             running in the backstore: it answers once they end"
                        );
                    }
                }
            }
        }
        Ok(Done::out(len as u64))
    }
}

/// How often PREEMPT AND ABORT, waiting for the preempted nexuses' running
/// commands, looks whether its own task was aborted.
const PREEMPT_DRAIN_STEP: std::time::Duration = std::time::Duration::from_millis(100);

/// How often PREEMPT AND ABORT says which preempted nexuses it still waits
/// for (a stuck backstore holds it as long as it holds their commands).
const PREEMPT_DRAIN_REPORT: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether an SPC-2 RESERVE or RELEASE from `nexus` is a successful no-op
/// beside persistent registrations (CRH=1, SPC-4 5.9.3): from the holder,
/// or from a registered nexus under a registrants-only or all-registrants
/// reservation. Any other conflicts.
fn crh_exempt(pr: &PrState, nexus: &ItNexus) -> bool {
    pr.is_holder(nexus)
        || (pr.find(nexus).is_some()
            && pr
                .resv
                .as_ref()
                .is_some_and(|r| registrants_only(r.ty) || all_registrants(r.ty)))
}

/// One PERSISTENT RESERVE OUT action being applied to a copy of the state.
struct PrCtx<'a> {
    st: &'a mut PrState,
    nexus: &'a ItNexus,
    known: &'a [ItNexus],
    uas: &'a mut Vec<(ItNexus, Asc)>,
}

impl PrCtx<'_> {
    /// Queues `code` for every known nexus some registration of `regs`
    /// covers, except the sender.
    fn ua_for(&mut self, regs: &[Registration], code: Asc) {
        for n in self.known {
            if n != self.nexus && regs.iter().any(|r| r.matches(n)) {
                self.uas.push((n.clone(), code));
            }
        }
    }

    /// The sender's registration, checked against RESERVATION KEY.
    fn own(&self, key: u64) -> Result<usize, Failure> {
        match self.st.find(self.nexus) {
            Some(i) if self.st.regs.get(i).is_some_and(|r| r.key == key) => Ok(i),
            _ => Err(Failure::Conflict),
        }
    }

    /// REGISTER and REGISTER AND IGNORE EXISTING KEY; false when the
    /// command does nothing (an unregistered nexus registering key zero).
    /// `list` is the parameter list `p` was decoded from: a refused
    /// listed port is named by where its TransportID starts in it.
    fn register(
        &mut self,
        p: &PrOutParameters,
        list: &[u8],
        ignore: bool,
    ) -> Result<bool, Failure> {
        match self.st.find(self.nexus) {
            None => {
                if !ignore && p.reservation_key != 0 {
                    return Err(Failure::Conflict);
                }
                if p.service_action_key == 0 {
                    if p.spec_i_pt {
                        return Err(invalid_param(20, Some(3)));
                    }
                    return Ok(false);
                }
                let mine = Registration::for_nexus(self.nexus, p.service_action_key, p.all_tg_pt);
                // With ALL_TG_PT the initiator port is registered through
                // every target port, as if the command ran on each of those
                // I_T nexuses (T10's reading of SPC-4 5.9.7). One of them
                // already registered through another port would need its
                // own key for REGISTER; REGISTER AND IGNORE EXISTING KEY
                // replaces that registration. A registration of the whole
                // initiator name (SPEC_I_PT) cannot be split by port.
                let covered: Vec<usize> = (0..self.st.regs.len())
                    .filter(|&i| self.st.regs[i].overlaps(&mine))
                    .collect();
                if covered.iter().any(|&i| {
                    let o = &self.st.regs[i];
                    !ignore || o.name_only || !o.initiator.eq_ignore_ascii_case(&mine.initiator)
                }) {
                    return Err(Failure::Conflict);
                }
                // Counted before any listed port is matched against the
                // others, which takes time that grows with the square of
                // the list, with the state locked for every command.
                if self.st.regs.len() - covered.len() + 1 + p.transport_ids.len()
                    > MAX_REGISTRATIONS
                {
                    return Err(illegal(Asc::INSUFFICIENT_REGISTRATION_RESOURCES));
                }
                let mut new = vec![mine];
                // The listed port refused: named where its TransportID
                // starts (the list is walked again only then).
                let refused = |i: usize| {
                    let at = PrOutParameters::transport_id_offsets(list)
                        .get(i)
                        .copied()
                        .unwrap_or(28);
                    invalid_param(u16::try_from(at).unwrap_or(u16::MAX), None)
                };
                for (i, t) in p.transport_ids.iter().enumerate() {
                    let TransportId::Iscsi { name, isid } = t else {
                        // Another protocol's port cannot be on this
                        // iSCSI target's I_T nexuses.
                        return Err(refused(i));
                    };
                    let (initiator, name_only) = match isid {
                        Some(i) => (format!("{name},i,0x{}", i.to_ascii_lowercase()), false),
                        None => (name.clone(), true),
                    };
                    let r = Registration {
                        initiator: initiator.into(),
                        name_only,
                        target_port: self.nexus.target_port.clone(),
                        rtpi: self.nexus.relative_target_port,
                        all_tg_pt: p.all_tg_pt,
                        key: p.service_action_key,
                    };
                    // A listed port already registered (or listed twice).
                    if self.st.regs.iter().chain(&new).any(|o| o.overlaps(&r)) {
                        return Err(refused(i));
                    }
                    new.push(r);
                }
                let (_, held) = self.st.remove_where(|i, _| covered.contains(&i));
                let at = self.st.regs.len();
                self.st.regs.extend(new);
                // A replaced holder keeps its reservation under its new key.
                if let (true, Some(r)) = (held, self.st.resv.as_mut()) {
                    r.holder = at;
                }
            }
            Some(i) => {
                let cur = self.st.regs.get(i).map_or(0, |r| r.key);
                if !ignore && cur != p.reservation_key {
                    return Err(Failure::Conflict);
                }
                if p.spec_i_pt {
                    return Err(invalid_param(20, Some(3)));
                }
                if p.service_action_key == 0 {
                    self.unregister(i);
                } else if let Some(r) = self.st.regs.get_mut(i) {
                    r.key = p.service_action_key;
                }
            }
        }
        self.st.generation = self.st.generation.wrapping_add(1);
        Ok(true)
    }

    /// Removes registration `i`, releasing the reservation when it held it
    /// (SPC-4 5.9.11.2: registrants-only types tell the other registrants).
    fn unregister(&mut self, i: usize) {
        let (_, was_holder) = self.st.remove_where(|j, _| j == i);
        let Some(resv) = self.st.resv.clone() else {
            return;
        };
        if all_registrants(resv.ty) {
            if self.st.regs.is_empty() {
                self.st.resv = None;
            }
        } else if was_holder {
            self.st.resv = None;
            if registrants_only(resv.ty) {
                let regs = self.st.regs.clone();
                self.ua_for(&regs, Asc::RESERVATIONS_RELEASED);
            }
        }
    }

    fn reserve(&mut self, p: &PrOutParameters, ty: PrType) -> Result<(), Failure> {
        let i = self.own(p.reservation_key)?;
        match &self.st.resv {
            Some(r) if self.st.is_holder(self.nexus) && r.ty == ty => Ok(()),
            Some(_) => Err(Failure::Conflict),
            None => {
                self.st.resv = Some(Reservation { holder: i, ty });
                Ok(())
            }
        }
    }

    fn release(&mut self, p: &PrOutParameters, ty: PrType) -> Result<(), Failure> {
        self.own(p.reservation_key)?;
        let Some(resv) = self.st.resv.clone() else {
            return Ok(());
        };
        if !self.st.is_holder(self.nexus) {
            return Ok(());
        }
        if resv.ty != ty {
            return Err(illegal(Asc::INVALID_RELEASE_OF_PERSISTENT_RESERVATION));
        }
        self.st.resv = None;
        if registrants_only(ty) || all_registrants(ty) {
            let regs = self.st.regs.clone();
            self.ua_for(&regs, Asc::RESERVATIONS_RELEASED);
        }
        Ok(())
    }

    fn clear(&mut self, p: &PrOutParameters) -> Result<(), Failure> {
        self.own(p.reservation_key)?;
        let regs = std::mem::take(&mut self.st.regs);
        self.st.resv = None;
        self.ua_for(&regs, Asc::RESERVATIONS_PREEMPTED);
        self.st.generation = self.st.generation.wrapping_add(1);
        Ok(())
    }

    /// PREEMPT (SPC-4 5.9.11.4); returns the registrations removed.
    /// `ty`: the TYPE (and SCOPE) of the CDB, checked only when the
    /// PREEMPT makes a reservation of that type.
    fn preempt(
        &mut self,
        p: &PrOutParameters,
        ty: impl Fn() -> Result<PrType, Failure>,
    ) -> Result<Vec<Registration>, Failure> {
        let me = self.own(p.reservation_key)?;
        let sak = p.service_action_key;
        let removed = match self.st.resv.clone() {
            None => {
                if sak == 0 {
                    return Err(invalid_param(8, None));
                }
                let (removed, _) = self.st.remove_where(|_, r| r.key == sak);
                if removed.is_empty() {
                    return Err(Failure::Conflict);
                }
                removed
            }
            Some(resv) if all_registrants(resv.ty) => {
                if sak == 0 {
                    let ty = ty()?;
                    let (removed, _) = self.st.remove_where(|j, _| j != me);
                    self.st.resv = Some(Reservation { holder: 0, ty });
                    removed
                } else {
                    let (removed, _) = self.st.remove_where(|j, r| r.key == sak && j != me);
                    if removed.is_empty() {
                        return Err(Failure::Conflict);
                    }
                    removed
                }
            }
            Some(resv) => {
                let holder_key = self.st.regs.get(resv.holder).map_or(0, |h| h.key);
                if sak == holder_key {
                    let ty = ty()?;
                    let (removed, _) = self.st.remove_where(|j, r| r.key == sak && j != me);
                    let me_now = self.st.find(self.nexus).unwrap_or(0);
                    self.st.resv = Some(Reservation { holder: me_now, ty });
                    if resv.ty != ty {
                        let remaining = self.st.regs.clone();
                        self.ua_for(&remaining, Asc::RESERVATIONS_RELEASED);
                    }
                    removed
                } else {
                    if sak == 0 {
                        return Err(invalid_param(8, None));
                    }
                    let (removed, _) = self.st.remove_where(|_, r| r.key == sak);
                    if removed.is_empty() {
                        return Err(Failure::Conflict);
                    }
                    removed
                }
            }
        };
        self.ua_for(&removed, Asc::REGISTRATIONS_PREEMPTED);
        self.st.generation = self.st.generation.wrapping_add(1);
        Ok(removed)
    }

    /// REGISTER AND MOVE (SPC-4 5.9.8). `ports`: the relative target port
    /// identifiers the unit is reached through (none: not known, any but
    /// zero is taken).
    fn register_and_move(
        &mut self,
        p: &RegisterAndMoveParameters,
        ports: &[u16],
    ) -> Result<(), Failure> {
        let me = self.own(p.reservation_key)?;
        let Some(resv) = self.st.resv.clone() else {
            return Err(Failure::Conflict);
        };
        if !self.st.is_holder(self.nexus) {
            return Err(Failure::Conflict);
        }
        // Every registrant holds an all-registrants reservation: there is no
        // one holder to move it from.
        if all_registrants(resv.ty) {
            return Err(Failure::Conflict);
        }
        // The destination's target port must be one of the unit's (port 0
        // is reserved).
        let rtpi = p.relative_target_port;
        if rtpi == 0 || !(ports.is_empty() || ports.contains(&rtpi)) {
            return Err(invalid_param(18, None));
        }
        if p.service_action_key == 0 {
            return Err(invalid_param(8, None));
        }
        let TransportId::Iscsi { name, isid } = &p.transport_id else {
            return Err(invalid_param(24, None));
        };
        let Some(isid) = isid else {
            // A move needs one initiator port, not a name.
            return Err(invalid_param(24, Some(7)));
        };
        let target = self
            .nexus
            .target_port
            .split_once(",t,")
            .map_or(&*self.nexus.target_port, |(t, _)| t);
        let dest = ItNexus {
            initiator_port: format!("{name},i,0x{}", isid.to_ascii_lowercase()).into(),
            target_port: format!("{target},t,0x{:04x}", p.relative_target_port).into(),
            relative_target_port: p.relative_target_port,
        };
        if dest
            .initiator_port
            .eq_ignore_ascii_case(&self.nexus.initiator_port)
            && dest.target_port == self.nexus.target_port
        {
            return Err(invalid_param(24, None));
        }
        let di = match self.st.find(&dest) {
            // The sender's own registration covers the destination (made
            // with ALL_TG_PT, or for the whole initiator name by SPEC_I_PT):
            // it holds the reservation there already, and one registration
            // cannot be split into two nexuses with two keys.
            Some(i) if i == me => return Err(invalid_param(24, None)),
            Some(i) => {
                if let Some(r) = self.st.regs.get_mut(i) {
                    r.key = p.service_action_key;
                }
                i
            }
            None => {
                if self.st.regs.len() + 1 - usize::from(p.unreg) > MAX_REGISTRATIONS {
                    return Err(illegal(Asc::INSUFFICIENT_REGISTRATION_RESOURCES));
                }
                self.st
                    .regs
                    .push(Registration::for_nexus(&dest, p.service_action_key, false));
                self.st.regs.len() - 1
            }
        };
        self.st.resv = Some(Reservation {
            holder: di,
            ty: resv.ty,
        });
        if p.unreg {
            self.st.remove_where(|j, _| j == me);
        }
        self.st.generation = self.st.generation.wrapping_add(1);
        Ok(())
    }
}

/// The relative target port identifiers `table`'s units are reached
/// through: the ports of its target port groups (none configured: not
/// known).
pub(crate) fn target_ports(table: &LunTable) -> Vec<u16> {
    table
        .target_port_groups()
        .iter()
        .flat_map(|g| g.ports.iter().copied())
        .collect()
}

/// Called for each I_T nexus whose tasks a PREEMPT AND ABORT aborts.
pub type AbortHandler = Arc<dyn Fn(&ItNexus) + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any names, keys and flags come back from the APTPL text as they
        /// went in, one record each.
        #[test]
        fn any_state_round_trips_through_its_text(
            generation in any::<u32>(),
            regs in proptest::collection::vec(
                (".*", ".*", any::<u64>(), any::<bool>(), any::<bool>(), any::<u16>()),
                0..6,
            ),
            resv in proptest::option::of((any::<usize>(), 1u8..=8)),
        ) {
            // Only states the device server could hold: a registration one
            // nexus would share with an earlier one is left out, as REGISTER
            // would refuse it.
            let mut kept: Vec<Registration> = Vec::new();
            for (ini, tp, key, name_only, all_tg_pt, rtpi) in regs {
                let r = Registration {
                    initiator: Arc::from(ini),
                    name_only,
                    target_port: Arc::from(tp),
                    rtpi,
                    all_tg_pt,
                    key,
                };
                if !kept.iter().any(|o| o.overlaps(&r)) {
                    kept.push(r);
                }
            }
            let regs = kept;
            let resv = resv.filter(|_| !regs.is_empty()).and_then(|(h, code)| {
                Some(Reservation { holder: h % regs.len(), ty: PrType::from_code(code)? })
            });
            let st = PrState { generation, regs, resv, aptpl: true };
            let text = st.to_text();
            // Header, generation, the records, the end line.
            prop_assert_eq!(text.lines().count(), 3 + st.regs.len() + usize::from(st.resv.is_some()));
            prop_assert_eq!(PrState::from_text(&text), Some(st));
        }

        /// Whatever a damaged or hand-edited file holds, reading it never
        /// panics, and what it reads as is what it would be written as.
        #[test]
        fn any_text_reads_as_what_it_writes(
            lines in proptest::collection::vec(
                prop_oneof![
                    Just("blockwire-pr 1".to_owned()),
                    Just("blockwire-pr 2".to_owned()),
                    "end [0-9]{1,2} [01]",
                    "generation [0-9]{1,11}",
                    "reg [0-9a-f]{1,17} [01] [01] [0-9]{1,6} [!-~]{0,12} [!-~]{0,12}",
                    "resv [0-9]{1,3} [0-9]{1,3}",
                    ".{0,20}",
                ],
                0..8,
            ),
        ) {
            let text = lines.join("\n");
            if let Some(st) = PrState::from_text(&text) {
                prop_assert!(st.well_formed(), "{:?}", st);
                prop_assert_eq!(PrState::from_text(&st.to_text()), Some(st));
            }
        }

        #[test]
        fn escaped_fields_are_one_field(name in ".*") {
            let f = escape_field(&name);
            prop_assert!(!f.is_empty() || name.is_empty());
            prop_assert!(f.bytes().all(|b| b.is_ascii_graphic()));
            prop_assert_eq!(unescape_field(&f), Some(name));
        }
    }

    #[test]
    fn text_round_trip() {
        let n = ItNexus::iscsi("iqn.a", [1, 2, 3, 4, 5, 6], "iqn.t", 1);
        let mut st = PrState {
            generation: 7,
            aptpl: true,
            ..PrState::default()
        };
        st.regs.push(Registration::for_nexus(&n, 0xabc, true));
        st.resv = Some(Reservation {
            holder: 0,
            ty: PrType::ExclusiveAccessRegistrantsOnly,
        });
        assert_eq!(PrState::from_text(&st.to_text()), Some(st));
        assert_eq!(PrState::from_text("garbage"), None);
        assert_eq!(PrState::from_text("blockwire-pr 1\nresv 1 0\n"), None);
    }

    /// A file the device server could not have written reads as damaged
    /// (the unit then stays NOT READY rather than restore it): two
    /// registrations one nexus would match, a reservation or generation
    /// given twice, more registrations than a unit keeps.
    #[test]
    fn states_no_device_server_holds_read_as_damaged() {
        let file =
            |records: &[String]| format!("blockwire-pr 1\ngeneration 3\n{}\n", records.join("\n"));
        let reg = |key: u64, all: u8, name_only: u8, ini: &str, tp: &str| {
            format!("reg {key:016x} {all} {name_only} 1 {ini} {tp}")
        };
        let a = "iqn.a,i,0x400000000001";
        let fine = [
            reg(1, 0, 0, a, "iqn.t,t,0x1"),
            reg(2, 0, 0, a, "iqn.t,t,0x2"),
        ];
        assert!(
            PrState::from_text(&file(&fine)).is_some(),
            "one port through two target ports"
        );
        for (why, records) in [
            (
                "the same nexus twice",
                vec![
                    reg(1, 0, 0, a, "iqn.t,t,0x1"),
                    reg(2, 0, 0, &a.to_uppercase(), "iqn.t,t,0x1"),
                ],
            ),
            (
                "ALL_TG_PT beside one port",
                vec![
                    reg(1, 0, 0, a, "iqn.t,t,0x1"),
                    reg(2, 1, 0, a, "iqn.t,t,0x2"),
                ],
            ),
            (
                "a whole name beside one of its ISIDs",
                vec![
                    reg(1, 0, 1, "iqn.a", "iqn.t,t,0x1"),
                    reg(2, 0, 0, a, "iqn.t,t,0x1"),
                ],
            ),
            (
                "two reservations",
                vec![
                    reg(1, 0, 0, a, "iqn.t,t,0x1"),
                    "resv 1 0".into(),
                    "resv 3 0".into(),
                ],
            ),
            ("two generations", vec!["generation 4".into()]),
        ] {
            assert_eq!(PrState::from_text(&file(&records)), None, "{why}");
        }
        let many: Vec<String> = (0..=MAX_REGISTRATIONS)
            .map(|i| reg(1, 0, 0, &format!("iqn.a,i,0x{i:012x}"), "iqn.t,t,0x1"))
            .collect();
        assert!(PrState::from_text(&file(&many[..MAX_REGISTRATIONS])).is_some());
        assert_eq!(
            PrState::from_text(&file(&many)),
            None,
            "one past MAX_REGISTRATIONS"
        );
    }
}
