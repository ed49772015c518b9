//! One logical unit: its configuration, its shared state (mode pages, unit
//! attentions, reservations) and the command dispatcher.
//!
//! `execute` runs on many blocking threads at once for the same unit. The
//! state mutex is held only for bookkeeping, never across backstore I/O;
//! block-level atomicity comes from the range lock instead.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use blockwire_pdu::scsi::opcode as op;
use blockwire_pdu::scsi::opcode::{copy_in, copy_out};
use blockwire_pdu::scsi::{Asc, Cdb, ScsiStatus, Sense, SenseFormat, SenseKey};
use tracing::{debug, warn};

use super::identity::DEFAULT_COMPANY_ID;
use super::mode::ModeState;
use super::outcome::{illegal, CmdResult, Done, Failure};
use super::range_lock::RangeLock;
use super::reservations::{target_ports, AbortHandler, Reservations};
use super::sanitize::{SanitizeJob, SANITIZE};
use super::stall::{is_media_command, StallChange, StallGate};
use super::stats::{record_command, Direction, IoStats};
use super::token_copy::TokenOpResults;
use super::unit_attention::UnitAttentions;
use super::xcopy::CopyResults;
use super::{ItNexus, LunTable, ScsiRequest, ScsiResult};
use crate::backstore::Backstore;

/// Largest data transfer one command may ask for, in bytes. Every length
/// from the wire is checked against it before a buffer is allocated, and
/// VPD B0h advertises it as MAXIMUM TRANSFER LENGTH.
pub const MAX_TRANSFER_BYTES: u32 = 32 << 20;

/// How a logical unit is built.
#[derive(Debug, Clone)]
pub struct LuConfig {
    /// Where the blocks live.
    pub backstore: Arc<dyn Backstore>,
    /// T10 protection information, Type 1: where each block's 8-byte tuple
    /// lives (8 bytes per block, see [`super::protection`]). `None`: the
    /// unit is not formatted with protection information.
    pub pi_store: Option<Arc<dyn Backstore>>,
    /// Logical block size: 512 (default) or 4096.
    pub block_size: u32,
    /// Reject every write with DATA PROTECT, WRITE PROTECTED.
    pub read_only: bool,
    /// T10 vendor identification (8 ASCII characters, space padded).
    pub vendor: String,
    /// Product identification (16 characters).
    pub product: String,
    /// Product revision level (4 characters).
    pub revision: String,
    /// Unit serial number (VPD 80h); see [`super::stable_identity`].
    pub serial: String,
    /// Stable 64-bit identity behind the NAA designator (VPD 83h); the
    /// caller derives it from target name and LUN so it never changes.
    pub naa_id: u64,
    /// IEEE company ID for the NAA designator.
    pub company_id: u32,
    /// LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT reported by READ
    /// CAPACITY (16): 0 (default) reports physical = logical blocks; 3 with
    /// 512-byte blocks reports 4 KiB physical blocks (hosts then align I/O
    /// to 4 KiB).
    pub physical_block_exponent: u8,
    /// Thin provisioning: UNMAP, WRITE SAME with UNMAP, LBPME, VPD B2h.
    pub thin_provisioning: bool,
    /// Initial WCE: writes complete before they are durable (the backstore
    /// has a volatile cache, e.g. the page cache). With WCE off every write
    /// is durable before status. [`LuConfig::new`] takes it from
    /// `Backstore::volatile_cache`.
    pub write_cache: bool,
    /// Where persistent reservations with APTPL are kept (written to a
    /// temporary file, fsynced, renamed). `None`: APTPL is refused.
    pub pr_state_path: Option<PathBuf>,
    /// Removable medium (INQUIRY RMB=1): START STOP UNIT with LOEJ ejects
    /// and loads it, PREVENT ALLOW MEDIUM REMOVAL guards it, and while it
    /// is out every command that needs it ends NOT READY, MEDIUM NOT
    /// PRESENT (SBC-3 START STOP UNIT and PREVENT ALLOW MEDIUM REMOVAL).
    pub removable: bool,
    /// The least time a SANITIZE operation takes (it runs as fast as the
    /// backstore allows, then waits out the rest, the unit NOT READY,
    /// SANITIZE IN PROGRESS throughout): emulates a slow medium. Zero by
    /// default.
    pub sanitize_min_duration: Duration,
    /// Offer WRITE ATOMIC(16) where the backstore can make writes atomic
    /// (`Backstore::atomic_write_max`); false: never (the Block Limits
    /// page reports no atomic support). On by default.
    pub atomic_writes: bool,
    /// Ceilings on media commands and bytes per second (see
    /// [`super::qos`]); none by default. Changed while the unit serves
    /// with [`LogicalUnit::set_qos`].
    pub qos: super::QosLimits,
}

impl LuConfig {
    /// Defaults: 512-byte blocks, writable, "BLOCKWIR" / "VIRTUAL-DISK",
    /// write cache on, thin provisioning on where the store reads a
    /// discarded range as zeros, a fixed placeholder identity (callers set
    /// `serial` and `naa_id` from [`super::stable_identity`]).
    pub fn new(backstore: Arc<dyn Backstore>) -> LuConfig {
        let (serial, naa_id) = super::stable_identity("blockwire", 0);
        // LBPRZ=1 is promised of every thin unit.
        let thin_provisioning = backstore.reads_zeros_where_discarded();
        LuConfig {
            write_cache: backstore.volatile_cache(),
            backstore,
            pi_store: None,
            block_size: 512,
            read_only: false,
            vendor: "BLOCKWIR".into(),
            product: "VIRTUAL-DISK".into(),
            revision: "0001".into(),
            serial,
            naa_id,
            company_id: DEFAULT_COMPANY_ID,
            physical_block_exponent: 0,
            thin_provisioning,
            pr_state_path: None,
            removable: false,
            sanitize_min_duration: Duration::ZERO,
            atomic_writes: true,
            qos: super::QosLimits::NONE,
        }
    }
}

/// Mutable state of a logical unit, behind one mutex.
#[derive(Debug)]
pub(crate) struct LuState {
    /// Current mode parameters.
    pub mode: ModeState,
    /// Pending unit attentions per nexus.
    pub ua: UnitAttentions,
    /// SPC-2 and persistent reservations.
    pub res: Reservations,
    /// Nexuses that sent PREVENT ALLOW MEDIUM REMOVAL with PREVENT=1.
    pub prevent: HashSet<ItNexus>,
    /// Capacity in blocks when last looked at (CAPACITY DATA HAS CHANGED).
    pub blocks: u64,
    /// EXTENDED COPY results for RECEIVE COPY RESULTS.
    pub copies: CopyResults,
    /// POPULATE TOKEN and WRITE USING TOKEN results for RECEIVE ROD TOKEN
    /// INFORMATION.
    pub token_ops: TokenOpResults,
    /// A removable unit's medium is loaded (always true for the others).
    pub medium_present: bool,
    /// The sanitize operation running, or ended and not yet looked at.
    pub sanitize: Option<Arc<SanitizeJob>>,
    /// Sanitize failure mode (SBC-4 4.11): `Some(ause)` of the failed
    /// operation.
    pub sanitize_failed: Option<bool>,
    /// The soft threshold on the space left (SBC-4 4.7.3.7).
    pub low_space: super::provisioning::LowSpace,
}

impl LuState {
    /// The progress of the sanitize operation in progress, if one is;
    /// an operation that ended is retired here (a failed one enters
    /// sanitize failure mode, a successful one leaves it).
    pub(crate) fn sanitizing(&mut self) -> Option<u16> {
        let job = self.sanitize.as_ref()?;
        match job.outcome() {
            None => Some(job.progress()),
            Some(result) => {
                self.sanitize_failed = result.is_err().then_some(job.ause);
                self.sanitize = None;
                None
            }
        }
    }

    /// Why the unit cannot run a command with this `opcode` now (a
    /// sanitize in progress or sanitize failure mode, SBC-4 4.11; no
    /// medium in a removable unit), if it cannot. `media`: the command reads
    /// or changes the medium.
    fn not_ready(&mut self, opcode: u8, cdb: &[u8], media: bool) -> Option<Failure> {
        // Only INQUIRY, REPORT LUNS and REQUEST SENSE are processed while the
        // saved reservations are unreadable, as during a sanitize (SBC-4 4.11).
        let served_anyway = matches!(opcode, op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE);
        if self.res.unreadable() && !served_anyway {
            return Some(Failure::Check(reservations_unreadable()));
        }
        if let Some(progress) = self.sanitizing() {
            if !served_anyway {
                return Some(super::sanitize::in_progress(progress));
            }
            return None;
        }
        let needs_medium = media
            || opcode == op::TEST_UNIT_READY
            || opcode == op::READ_CAPACITY_10
            || (opcode == op::SERVICE_ACTION_IN_16
                && cdb.get(1).is_some_and(|sa| sa & 0x1f == 0x10));
        if !self.medium_present && needs_medium {
            return Some(medium_not_present());
        }
        if self.sanitize_failed.is_some() && media && opcode != SANITIZE {
            return Some(super::sanitize::failure_mode());
        }
        None
    }
}

impl LogicalUnit {
    /// Whether a copy may read or write this unit's medium now, as a READ
    /// sent to it would be answered: not while a sanitize runs or has
    /// failed, with the medium out, or with its saved reservations
    /// unreadable. A copy between units reaches the unit it does not run on
    /// without a command of its own, so it asks here.
    pub(crate) fn ready_for_copy(&self) -> Result<(), Failure> {
        match self.lock().not_ready(op::READ_16, &[op::READ_16], true) {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }
}

/// NOT READY, LOGICAL UNIT NOT READY, MANUAL INTERVENTION REQUIRED: the
/// saved persistent reservations could not be read back (see
/// [`super::reservations::Reservations::load`]).
fn reservations_unreadable() -> Sense {
    Sense::new(
        SenseKey::NotReady,
        Asc::LU_NOT_READY_MANUAL_INTERVENTION_REQUIRED,
    )
}

/// NOT READY, MEDIUM NOT PRESENT (a removable unit's medium is ejected).
pub(crate) fn medium_not_present() -> Failure {
    Failure::Check(Sense::new(SenseKey::NotReady, Asc::MEDIUM_NOT_PRESENT))
}

/// An emulated SBC-3 direct-access block device.
#[derive(Debug)]
pub struct LogicalUnit {
    pub(crate) cfg: LuConfig,
    pub(crate) state: Mutex<LuState>,
    /// Shared with a running sanitize operation, which holds all of it.
    pub(crate) ranges: Arc<RangeLock>,
    /// Told which nexuses' tasks a PREEMPT AND ABORT aborts (the fabric
    /// owns the tasks).
    abort: AbortSlot,
    /// Commands executing, per nexus (for PREEMPT AND ABORT).
    pub(crate) in_flight: InFlight,
    /// The stall switch media commands pass before anything else.
    pub(crate) stall: StallGate,
    /// The ceilings the fabric books media commands against.
    qos: super::QosGate,
    /// READ/WRITE counters and latencies (shared with planned commands'
    /// clocks, which count after the plan is dropped).
    pub(crate) stats: Arc<IoStats>,
    /// When the unit was made: the origin of `last_media_ms`.
    born: Instant,
    /// Milliseconds after `born` of the last media command (0: none yet),
    /// for telling an operator whether a LUN is in use before removing it.
    last_media_ms: AtomicU64,
    /// The store allocates as it is written and says how much space it
    /// has (see [`super::provisioning`]).
    pub(crate) store_reports_space: bool,
    /// Protection information checks that failed, for the operator.
    pub(crate) pi_failures: super::protection::PiFailures,
}

/// How busy a unit is, for the management plane's "in use" checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Activity {
    /// Commands executing on the unit now.
    pub in_flight: usize,
    /// Time since the last media command (READ, WRITE, ...), if any came.
    pub last_media: Option<Duration>,
    /// Persistent reservation registrations the unit keeps in memory only
    /// (APTPL off): a unit built in its place starts without them, so a
    /// node they fence out would write again.
    pub unsaved_registrations: usize,
}

use super::in_flight::InFlight;

/// Holder of the abort handler (closures have no `Debug`).
#[derive(Default)]
struct AbortSlot(Mutex<Option<AbortHandler>>);

impl std::fmt::Debug for AbortSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AbortSlot")
    }
}

/// Commands that neither report nor clear a unit attention (SPC-4 5.12:
/// INQUIRY, REPORT LUNS; REQUEST SENSE reports it as its data).
fn ua_exempt(opcode: u8) -> bool {
    matches!(opcode, op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE)
}

impl LogicalUnit {
    /// A logical unit over `cfg.backstore`. The block size must be 512 or
    /// 4096 (anything else falls back to 512, logged).
    pub fn new(mut cfg: LuConfig) -> LogicalUnit {
        if cfg.block_size != 512 && cfg.block_size != 4096 {
            warn!(
                block_size = cfg.block_size,
                "unsupported block size, using 512"
            );
            cfg.block_size = 512;
        }
        let blocks = cfg.backstore.size() / u64::from(cfg.block_size);
        let mode = ModeState::defaults(&cfg);
        let res = Reservations::load(cfg.pr_state_path.as_deref());
        LogicalUnit {
            state: Mutex::new(LuState {
                mode,
                ua: UnitAttentions::default(),
                res,
                prevent: HashSet::new(),
                blocks,
                copies: CopyResults::default(),
                token_ops: TokenOpResults::default(),
                medium_present: true,
                sanitize: None,
                sanitize_failed: None,
                low_space: Default::default(),
            }),
            ranges: Arc::default(),
            abort: AbortSlot::default(),
            in_flight: InFlight::default(),
            stall: StallGate::default(),
            qos: super::QosGate::new(cfg.qos),
            stats: Arc::default(),
            born: Instant::now(),
            last_media_ms: AtomicU64::new(0),
            store_reports_space: matches!(cfg.backstore.space(), Ok(Some(_))),
            pi_failures: Default::default(),
            cfg,
        }
    }

    /// READ/WRITE commands, bytes and latencies so far.
    pub fn stats(&self) -> &Arc<IoStats> {
        &self.stats
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &LuConfig {
        &self.cfg
    }

    /// Capacity in logical blocks.
    pub fn blocks(&self) -> u64 {
        self.cfg.backstore.size() / u64::from(self.cfg.block_size)
    }

    /// Logical block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.cfg.block_size
    }

    /// Stalls (`true`) or releases (`false`) the unit: while stalled, every
    /// media command waits before it reaches the backstore (see
    /// [`super::stall`]). Returns the previous state and how many commands
    /// were waiting.
    pub fn set_stalled(&self, stalled: bool) -> StallChange {
        self.stall.set(stalled)
    }

    /// Changes the capacity to `new_size` bytes while the unit serves; each
    /// initiator hears CAPACITY DATA HAS CHANGED (SBC-4 4.6) with its next
    /// command and may READ CAPACITY again.
    pub fn resize(&self, new_size: u64) -> std::io::Result<()> {
        self.check_resize(new_size)?;
        let bs = u64::from(self.cfg.block_size);
        // The tuples first, so no block is ever without room for its tuple;
        // put back as they were when the blocks cannot follow.
        if let Some(pi) = &self.cfg.pi_store {
            let before = pi.size();
            pi.resize(new_size / bs * blockwire_pdu::scsi::protection::TUPLE_BYTES as u64)?;
            if let Err(e) = self.cfg.backstore.resize(new_size) {
                if let Err(undo) = pi.resize(before) {
                    warn!(error = %undo, "cannot put the protection information back to its size");
                }
                return Err(e);
            }
        } else {
            self.cfg.backstore.resize(new_size)?;
        }
        let mut st = self.lock();
        let now = self.blocks();
        if now != st.blocks {
            st.blocks = now;
            st.ua.push_others(None, Asc::CAPACITY_DATA_HAS_CHANGED);
        }
        Ok(())
    }

    /// Why [`Self::resize`] to `new_size` bytes would be refused for what
    /// it asks, changing nothing (see [`Backstore::check_resize`]).
    pub fn check_resize(&self, new_size: u64) -> std::io::Result<()> {
        let bs = u64::from(self.cfg.block_size);
        if new_size < bs || new_size % bs != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{new_size} bytes is not a whole number of {bs}-byte blocks"),
            ));
        }
        if let Some(pi) = &self.cfg.pi_store {
            pi.check_resize(new_size / bs * blockwire_pdu::scsi::protection::TUPLE_BYTES as u64)?;
        }
        self.cfg.backstore.check_resize(new_size)
    }

    /// Commands running now and how long since the last media command.
    pub fn activity(&self) -> Activity {
        let in_flight = self.in_flight.total();
        let ms = self.last_media_ms.load(Ordering::Relaxed);
        let last_media = (ms != 0).then(|| {
            self.born
                .elapsed()
                .saturating_sub(Duration::from_millis(ms))
        });
        let unsaved_registrations = self.lock().res.unsaved_registrations();
        Activity {
            in_flight,
            last_media,
            unsaved_registrations,
        }
    }

    /// The unit's ceilings (see [`super::qos`]): the fabric books each
    /// media command with it and waits what it says before starting it.
    pub fn qos(&self) -> &super::QosGate {
        &self.qos
    }

    /// Sets new ceilings while the unit serves; returns the old ones.
    pub fn set_qos(&self, limits: super::QosLimits) -> super::QosLimits {
        self.qos.set_limits(limits)
    }

    /// Whether the unit is stalled.
    pub fn is_stalled(&self) -> bool {
        self.stall.is_stalled()
    }

    /// Media commands waiting at the stalled unit now.
    pub fn held_commands(&self) -> usize {
        self.stall.held()
    }

    /// Passes the stall gate for a media command (at once when the unit is
    /// not stalled); on `Err` the command's task was aborted while it was
    /// held, and this is its answer.
    pub(crate) fn pass_stall_gate(&self, transfer: u64) -> Result<(), ScsiResult> {
        self.stall.pass().map_err(|_| ScsiResult {
            status: ScsiStatus::TASK_ABORTED.0,
            sense: None,
            data_in: Vec::new(),
            transfer_length: super::outcome::clamp32(transfer),
        })
    }

    /// Sets what PREEMPT AND ABORT calls for each preempted nexus, so the
    /// fabric can abort that nexus's tasks on this unit.
    pub fn set_abort_handler(&self, handler: AbortHandler) {
        *self.abort.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(handler);
    }

    pub(crate) fn abort_handler(&self) -> Option<AbortHandler> {
        self.abort
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, LuState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs one command (see `LunTable::execute`). `table` is the target's
    /// LUN table, for REPORT LUNS and EXTENDED COPY between its units.
    /// `counted` is false for the length-0 validation probes of planned
    /// commands, which are counted as the planned command instead.
    pub(crate) fn execute(
        &self,
        lun: u16,
        req: &ScsiRequest<'_>,
        table: &LunTable,
        counted: bool,
    ) -> ScsiResult {
        let started = Instant::now();
        // A stalled unit holds media commands here, before they count as
        // in flight or look at reservations (see `stall`).
        let media = is_media_command(req.cdb);
        if media {
            if let Err(aborted) = self.pass_stall_gate(0) {
                return aborted;
            }
        }
        let _in_flight = self.in_flight.enter(req.nexus);
        if media {
            let ms = started.saturating_duration_since(self.born).as_millis() as u64;
            self.last_media_ms.store(ms.max(1), Ordering::Relaxed);
        }
        let opcode = req.cdb.first().copied().unwrap_or(0xff);
        let decoded = Cdb::decode(req.cdb);
        // A block of a protected unit travels with its tuple when the CDB
        // asks for them (RDPROTECT, WRPROTECT, VRPROTECT): the residual of
        // a failed command counts them, as a good one's does.
        let wire_block = match &decoded {
            Ok(
                Cdb::Read { rw, .. }
                | Cdb::Write(rw)
                | Cdb::OrWrite16(rw)
                | Cdb::WriteAndVerify { rw, .. }
                | Cdb::Verify { rw, .. },
            ) if rw.protect != 0 && self.protected() => self.protected_block_bytes() as u32,
            Ok(Cdb::WriteSame { wrprotect, .. }) if *wrprotect != 0 && self.protected() => {
                self.protected_block_bytes() as u32
            }
            _ => self.cfg.block_size,
        };
        let transfer_in = |block: u32| match &decoded {
            Ok(c) => c.transfer_length().map_or(0, |t| t.bytes(block)),
            Err(_) => 0,
        };
        let transfer = transfer_in(wire_block);
        // The statistics count the blocks' data, as the data paths do.
        let data_bytes = transfer_in(self.cfg.block_size);
        let direction = match &decoded {
            Ok(Cdb::Read { .. }) => Some(Direction::Read),
            Ok(Cdb::Write(_) | Cdb::WriteAtomic16 { .. }) => Some(Direction::Write),
            _ => None,
        };
        let (format, ua, not_ready) = {
            let mut st = self.lock();
            st.ua.first_contact(req.nexus);
            let now = self.blocks();
            if now != st.blocks {
                st.blocks = now;
                st.ua.push_others(None, Asc::CAPACITY_DATA_HAS_CHANGED);
            }
            let ua = if ua_exempt(opcode) {
                None
            } else {
                st.ua.take(req.nexus)
            };
            let format = if st.mode.d_sense {
                SenseFormat::Descriptor
            } else {
                SenseFormat::Fixed
            };
            // A pending unit attention is reported first (SAM-5 5.14).
            let not_ready = if ua.is_none() {
                st.not_ready(opcode, req.cdb, media)
            } else {
                None
            };
            (format, ua, not_ready)
        };
        // Through a port in standby, media commands get NOT READY (after a
        // pending unit attention, before reservations).
        let standby = if media {
            table
                .port_groups()
                .check_media_access(req.nexus.relative_target_port)
                .err()
        } else {
            None
        };
        let outcome: CmdResult = if let Some(code) = ua {
            Err(Failure::Check(super::provisioning::unit_attention(code)))
        } else if let Some(standby) = standby {
            Err(standby)
        } else if let Some(not_ready) = not_ready {
            Err(not_ready)
        } else {
            match decoded {
                Err(e) => Err(Failure::Check(e.to_sense())),
                Ok(
                    ref cdb @ Cdb::Unknown {
                        opcode:
                            super::control::READ_DEFECT_DATA_10 | super::control::READ_DEFECT_DATA_12,
                        ..
                    },
                ) => self
                    .reservation_check(req.nexus, cdb)
                    .and_then(|()| self.read_defect_data(req.cdb)),
                Ok(
                    ref cdb @ Cdb::Unknown {
                        opcode: SANITIZE, ..
                    },
                ) => self
                    .reservation_check(req.nexus, cdb)
                    .and_then(|()| self.sanitize(req.cdb, req.data_out)),
                Ok(
                    ref cdb @ Cdb::Unknown {
                        opcode: super::format_unit::FORMAT_UNIT,
                        ..
                    },
                ) => self
                    .reservation_check(req.nexus, cdb)
                    .and_then(|()| self.format_unit(req.cdb, req.data_out)),
                Ok(Cdb::Unknown { .. }) => Err(illegal(Asc::INVALID_COMMAND_OPERATION_CODE)),
                Ok(cdb) => match self.reservation_check(req.nexus, &cdb) {
                    Err(f) => Err(f),
                    Ok(()) => self.dispatch(req, &cdb, table),
                },
            }
        };
        let result = finish(outcome, transfer, format, req.data_in_capacity);
        if let Some(d) = direction.filter(|_| counted) {
            let good = result.status == ScsiStatus::GOOD.0;
            record_command(
                &self.stats,
                req.initiator_stats,
                d,
                good,
                data_bytes,
                started,
            );
        }
        if result.status != ScsiStatus::GOOD.0 {
            debug!(
                lun,
                initiator = %req.nexus.initiator_port,
                opcode,
                itt = req.task_tag,
                status = result.status,
                "command failed"
            );
        }
        result
    }

    fn dispatch(&self, req: &ScsiRequest<'_>, cdb: &Cdb, table: &LunTable) -> CmdResult {
        use Cdb::*;
        match cdb {
            TestUnitReady => self.test_unit_ready(),
            RequestSense {
                desc,
                allocation_length,
            } => self.request_sense(req.nexus, *desc, *allocation_length),
            Inquiry {
                evpd,
                page_code,
                allocation_length,
            } => self.inquiry(
                req.nexus,
                &table.port_groups(),
                *evpd,
                *page_code,
                *allocation_length,
            ),
            ReportLuns {
                select_report,
                allocation_length,
            } => {
                super::lun_table::report_luns(&table.lun_ids(), *select_report, *allocation_length)
            }
            ModeSense6 { .. } | ModeSense10 { .. } => self.mode_sense(cdb),
            ModeSelect6 { .. } | ModeSelect10 { .. } => self.mode_select(req, cdb),
            LogSense { .. } => self.log_sense(cdb),
            Read { rw, .. } => self.read(rw, req.data_in_capacity),
            Write(rw) => self.write(rw, req.data_out),
            WriteAndVerify { rw, bytchk } => self.write_and_verify(rw, *bytchk, req.data_out),
            Verify { rw, bytchk } => self.verify(rw, *bytchk, req.data_out),
            OrWrite16(rw) => self.orwrite(rw, req.data_out),
            WriteSame { .. } => self.write_same(cdb, req.data_out),
            Unmap {
                anchor,
                parameter_list_length,
                ..
            } => self.unmap(*anchor, *parameter_list_length, req.data_out),
            CompareAndWrite {
                lba,
                blocks,
                wrprotect,
                fua,
                ..
            } => self.compare_and_write(*lba, *blocks, *wrprotect, *fua, req.data_out),
            WriteAtomic16 {
                lba,
                boundary,
                blocks,
                wrprotect,
                fua,
                ..
            } => self.write_atomic(
                &super::atomic::AtomicWrite {
                    lba: *lba,
                    boundary: *boundary,
                    blocks: *blocks,
                    wrprotect: *wrprotect,
                    fua: *fua,
                },
                req.data_out,
            ),
            PreFetch { lba, blocks, .. } => self.prefetch(*lba, *blocks),
            SynchronizeCache { lba, blocks, .. } => self.synchronize_cache(*lba, *blocks),
            ReadCapacity10 { lba, pmi } => self.read_capacity10(*lba, *pmi),
            ReadCapacity16 {
                lba,
                allocation_length,
                pmi,
            } => self.read_capacity16(*lba, *allocation_length, *pmi),
            GetLbaStatus {
                lba,
                allocation_length,
            } => self.get_lba_status(*lba, *allocation_length),
            ReportTargetPortGroups {
                parameter_data_format,
                allocation_length,
            } => table.port_groups().report(
                req.nexus.relative_target_port,
                *parameter_data_format,
                *allocation_length,
            ),
            ReportSupportedOperationCodes {
                rctd,
                reporting_options,
                requested_opcode,
                requested_service_action,
                allocation_length,
            } => super::opcodes::report_supported_operation_codes(
                &|opcode, sa| {
                    self.offers(opcode, sa)
                        && (opcode != blockwire_pdu::scsi::opcode::MAINTENANCE_OUT
                            || table.explicit_alua())
                },
                *rctd,
                *reporting_options,
                *requested_opcode,
                *requested_service_action,
                *allocation_length,
            ),
            ReportSupportedTmfs {
                repd,
                allocation_length,
            } => super::opcodes::report_supported_tmfs(*repd, *allocation_length),
            SetTargetPortGroups {
                parameter_list_length,
            } => table.set_target_port_groups(req.nexus, *parameter_list_length, req.data_out),
            StartStopUnit {
                power_condition,
                no_flush,
                loej,
                start,
                ..
            } => self.start_stop_unit(req.nexus, *power_condition, *no_flush, *loej, *start),
            PreventAllowMediumRemoval { prevent } => self.prevent_allow(req.nexus, *prevent),
            Reserve6 => self.reserve_spc2(req.nexus),
            Release6 => self.release_spc2(req.nexus),
            Reserve10 {
                third_party,
                long_id,
                ..
            } => {
                if *third_party || *long_id {
                    Err(super::outcome::invalid_cdb(
                        1,
                        Some(if *third_party { 4 } else { 1 }),
                    ))
                } else {
                    self.reserve_spc2(req.nexus)
                }
            }
            Release10 {
                third_party,
                long_id,
                ..
            } => {
                if *third_party || *long_id {
                    Err(super::outcome::invalid_cdb(
                        1,
                        Some(if *third_party { 4 } else { 1 }),
                    ))
                } else {
                    self.release_spc2(req.nexus)
                }
            }
            ExtendedCopy {
                service_action,
                parameter_list_length,
            } => self.extended_copy(
                req.nexus,
                table,
                *service_action,
                *parameter_list_length,
                req.data_out,
            ),
            TokenCopy {
                service_action: copy_out::POPULATE_TOKEN,
                list_identifier,
                parameter_list_length,
                ..
            } => self.populate_token(
                req.nexus,
                table,
                *list_identifier,
                *parameter_list_length,
                req.data_out,
            ),
            TokenCopy {
                list_identifier,
                parameter_list_length,
                ..
            } => self.write_using_token(
                req.nexus,
                table,
                *list_identifier,
                *parameter_list_length,
                req.data_out,
            ),
            ReceiveCopyResults {
                service_action: copy_in::RECEIVE_ROD_TOKEN_INFORMATION,
                list_identifier,
                allocation_length,
            } => {
                self.receive_rod_token_information(req.nexus, *list_identifier, *allocation_length)
            }
            ReceiveCopyResults {
                service_action,
                list_identifier,
                allocation_length,
            } => self.receive_copy_results(
                req.nexus,
                *service_action,
                *list_identifier,
                *allocation_length,
            ),
            PersistentReserveIn {
                service_action,
                allocation_length,
            } => self.pr_in(*service_action, *allocation_length),
            PersistentReserveOut {
                service_action,
                scope,
                pr_type,
                parameter_list_length,
            } => self.pr_out(
                req.nexus,
                &target_ports(table),
                *service_action,
                *scope,
                *pr_type,
                *parameter_list_length,
                req.data_out,
            ),
            Unknown { .. } => Err(illegal(Asc::INVALID_COMMAND_OPERATION_CODE)),
        }
    }

    /// TEST UNIT READY: GOOD once `execute` found the unit ready (no
    /// sanitize running, the medium present); START STOP UNIT without
    /// LOEJ changes no readiness on a virtual disk (see `control`).
    fn test_unit_ready(&self) -> CmdResult {
        Ok(Done::none())
    }

    /// REQUEST SENSE: a pending unit attention (which it clears), else
    /// the condition that makes the unit not ready (SPC-5 5.12: saved
    /// reservations that could not be read back, a sanitize in progress
    /// with its progress indication, or no medium), or NO
    /// SENSE. Other errors are reported with the command (autosense), so
    /// nothing else is ever pending.
    fn request_sense(&self, nexus: &ItNexus, desc: bool, allocation_length: u8) -> CmdResult {
        let sense = {
            let mut st = self.lock();
            match st.ua.take(nexus) {
                Some(code) => super::provisioning::unit_attention(code),
                None if st.res.unreadable() => reservations_unreadable(),
                None => match st.sanitizing() {
                    Some(progress) => super::sanitize::in_progress_sense(progress),
                    None if !st.medium_present => {
                        Sense::new(SenseKey::NotReady, Asc::MEDIUM_NOT_PRESENT)
                    }
                    None => Sense::new(SenseKey::NoSense, Asc::NO_ADDITIONAL_SENSE),
                },
            }
        };
        let format = if desc {
            SenseFormat::Descriptor
        } else {
            SenseFormat::Fixed
        };
        Ok(Done::data(
            sense.encode(format),
            u32::from(allocation_length),
        ))
    }

    /// LOGICAL UNIT RESET (SAM-5 6.3.3): SPC-2 reservations and PREVENT
    /// states go, mode parameters return to their defaults (none are
    /// saved), every nexus gets BUS DEVICE RESET FUNCTION OCCURRED.
    /// Persistent reservations survive, as SPC-4 requires; a removable
    /// medium stays loaded or ejected, and a sanitize operation in progress
    /// goes on (SBC-4 4.11).
    pub fn reset(&self, code: Asc) {
        let mut st = self.lock();
        st.res.reset();
        st.prevent.clear();
        st.mode = ModeState::defaults(&self.cfg);
        st.ua.reset_all(code);
    }

    /// Another initiator's CLEAR TASK SET aborted commands of `nexus`
    /// (TAS=0): it hears so by a unit attention, COMMANDS CLEARED BY
    /// ANOTHER INITIATOR (SAM-5 7.4).
    pub fn commands_cleared(&self, nexus: &ItNexus) {
        self.lock()
            .ua
            .push(nexus, Asc::COMMANDS_CLEARED_BY_ANOTHER_INITIATOR);
    }

    /// I_T nexus loss: its SPC-2 reservation and PREVENT state are
    /// released and its unit attentions forgotten. Persistent reservations
    /// and registrations are kept (that is their point), and a sanitize
    /// operation it started goes on (SBC-4 4.11).
    pub fn nexus_lost(&self, nexus: &ItNexus) {
        let mut st = self.lock();
        st.res.nexus_lost(nexus);
        st.prevent.remove(nexus);
        st.ua.forget(nexus);
    }

    /// Makes every acknowledged write durable: the blocks, and the
    /// tuples of a unit formatted with protection information.
    pub fn flush(&self) -> std::io::Result<()> {
        self.cfg.backstore.flush()?;
        match &self.cfg.pi_store {
            Some(pi) => pi.flush(),
            None => Ok(()),
        }
    }
}

/// Turns a handler outcome into the fabric's result: status, sense in the
/// unit's format, data cut to what the initiator can take.
pub(crate) fn finish(
    outcome: CmdResult,
    cdb_transfer: u64,
    format: SenseFormat,
    capacity: u32,
) -> ScsiResult {
    match outcome {
        Ok(mut done) => {
            done.data.truncate(capacity as usize);
            ScsiResult {
                status: done.status,
                sense: None,
                data_in: done.data,
                transfer_length: done.transfer_length,
            }
        }
        Err(Failure::Check(sense)) => ScsiResult {
            status: ScsiStatus::CHECK_CONDITION.0,
            sense: Some(sense.encode(format)),
            data_in: Vec::new(),
            transfer_length: super::outcome::clamp32(cdb_transfer),
        },
        Err(Failure::Conflict) => ScsiResult {
            status: ScsiStatus::RESERVATION_CONFLICT.0,
            sense: None,
            data_in: Vec::new(),
            transfer_length: super::outcome::clamp32(cdb_transfer),
        },
    }
}
