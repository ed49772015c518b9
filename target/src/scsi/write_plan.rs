//! WRITE planning for the fabric's pipelined data path (double
//! buffered writes): the WRITE is validated by the normal command path, and
//! instead of taking the data the core tells the fabric where they go, so
//! the fabric can write each chunk as soon as its Data-Out PDUs arrived,
//! while the next chunk is still on the wire.
//!
//! Validation is the normal path, called, not repeated:
//! 1. The length-dependent checks (MAXIMUM TRANSFER LENGTH, the range end)
//!    come first: when one would fail, the real command goes through
//!    [`LunTable::execute`] with no data and its answer is returned. The
//!    normal path fails these in `media_checks`, before it looks at a byte
//!    of Data-Out, so the answer is the one it would give with the data
//!    (unit attentions and reservation conflicts still come first, since
//!    `execute` checks them first).
//! 2. [`LunTable::execute`] runs on the same WRITE with TRANSFER LENGTH 0:
//!    the whole command lifecycle (unit attentions, CAPACITY DATA HAS
//!    CHANGED, reservations, CDB decoding, WRPROTECT, write protection, the
//!    LBA) without a byte of I/O; any failure it reports is the answer,
//!    with the transfer length of the real CDB (residuals).
//!
//! The guarantees of the normal path's `write` are kept for the whole
//! pipelined write by a [`WriteHold`]:
//! - the command counts as in flight on its I_T nexus from before the
//!   reservation check until the last chunk is on the backstore, so a
//!   PREEMPT AND ABORT from another initiator waits for it (no write of a
//!   fenced initiator lands after the fencing one got GOOD);
//! - the block range is held in the unit's range lock, shared as plain
//!   writes hold it, so a COMPARE AND WRITE or ORWRITE of an overlapping
//!   range never sees half of it. For an O_DIRECT LUN it is held
//!   exclusively: the file backstore's unaligned direct writes
//!   read-modify-write whole 4 KiB units under a lock of the backstore that
//!   the fabric's engine does not take, so an overlapping one must not run
//!   beside a pipelined write.
//!
//! The normal path keeps no other state for a WRITE (no "media written"
//! flag, no provisioning map: thin provisioning is the file's own holes).
//! Only WRITE(10), WRITE(12) and WRITE(16) with a non-zero length whose
//! Data-Out carries exactly the CDB's bytes are planned; everything else is
//! [`WritePlan::NotPlanned`] (run it the normal way).

use std::sync::Arc;

use blockwire_pdu::scsi::{Cdb, CdbSize, ScsiStatus, SenseFormat};

use super::logical_unit::finish;
use super::outcome::{backstore_failure, clamp32, Done, Failure};
use super::stats::{record_command, CommandClock, Direction};
use super::{ItNexus, LogicalUnit, LunTable, ScsiRequest, ScsiResult};

/// The range lock and in-flight count a planned WRITE holds until dropped
/// (see the module docs). Dropping it is the end of the command for the
/// logical unit: drop it only once no chunk write is in flight.
pub struct WriteHold {
    lu: Arc<LogicalUnit>,
    nexus: ItNexus,
    /// Its count in the unit's commands in flight.
    entry: super::in_flight::Entry,
    range: u64,
    /// Held for its drop: counts the WRITE when the hold ends, the
    /// command's end for the unit.
    clock: Arc<CommandClock>,
}

impl WriteHold {
    /// The WRITE failed: when the hold ends it counts as an error, its
    /// bytes not written.
    pub(crate) fn fail(&self) {
        self.clock.fail();
    }
}

impl std::fmt::Debug for WriteHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteHold")
            .field("initiator", &self.nexus.initiator_port)
            .finish()
    }
}

impl Drop for WriteHold {
    fn drop(&mut self) {
        self.lu.ranges.unlock_id(self.range);
        self.lu.in_flight.release(&self.nexus, self.entry);
    }
}

/// A WRITE being planned: its count in flight and, once taken, its range,
/// given back when dropped before they become its [`WriteHold`]. So a plan
/// that answers early, gives up, or panics (the probe runs the SCSI core)
/// leaves neither behind: a count left would hold every PREEMPT AND ABORT
/// for its full wait and keep the LUN in use; a range left would hold
/// every later command to those blocks.
struct Planning<'a> {
    lu: &'a Arc<LogicalUnit>,
    nexus: &'a ItNexus,
    entry: super::in_flight::Entry,
    range: Option<u64>,
}

impl Planning<'_> {
    /// The planned WRITE's hold, from here on released when it is dropped.
    fn into_hold(self, clock: Arc<CommandClock>) -> WriteHold {
        let planning = std::mem::ManuallyDrop::new(self);
        WriteHold {
            lu: planning.lu.clone(),
            nexus: planning.nexus.clone(),
            entry: planning.entry,
            range: planning.range.expect("a planned WRITE holds its range"),
            clock,
        }
    }
}

impl Drop for Planning<'_> {
    fn drop(&mut self) {
        if let Some(range) = self.range {
            self.lu.ranges.unlock_id(range);
        }
        self.lu.in_flight.release(self.nexus, self.entry);
    }
}

/// A validated WRITE: where its data go and how to finish it.
#[derive(Debug)]
pub struct PlannedWrite {
    /// The logical unit.
    pub lu: Arc<LogicalUnit>,
    /// First logical block.
    pub lba: u64,
    /// Byte offset in the backstore.
    pub offset: u64,
    /// Bytes to write (the CDB's transfer length, equal to the Data-Out).
    pub len: u64,
    /// Logical block size.
    pub block_size: u32,
    /// FUA was set.
    pub fua: bool,
    /// The data must be durable before GOOD (FUA, or the write cache is
    /// off): the fabric syncs the file after the last chunk.
    pub write_through: bool,
    /// Held until the last chunk write completed.
    pub hold: WriteHold,
}

/// What to do with a WRITE the fabric would like to write itself.
#[derive(Debug)]
pub enum WritePlan {
    /// Valid: write `len` bytes at `offset`, then answer
    /// [`LogicalUnit::write_done`].
    Write(Box<PlannedWrite>),
    /// Answered by the normal path (an error).
    Answer(ScsiResult),
    /// Not a plannable WRITE: nothing was done, run it with
    /// [`LunTable::execute`] once its data arrived.
    NotPlanned,
}

impl LunTable {
    /// Validates `req` as [`LunTable::execute`] would and, for a valid
    /// WRITE(10/12/16) whose Data-Out is `data_len` bytes, exactly the
    /// CDB's transfer length, returns where its data go instead of writing
    /// them. `req.data_out` is not looked at (the data have not arrived).
    /// Blocks while an overlapping COMPARE AND WRITE holds the range; does
    /// no backstore I/O. `exclusive` holds the range exclusively (O_DIRECT
    /// LUNs, see the module docs).
    pub fn plan_write(&self, req: &ScsiRequest<'_>, data_len: u64, exclusive: bool) -> WritePlan {
        match self.plan_write_with(req, data_len, exclusive, true, false) {
            Some(plan) => plan,
            // Waiting was allowed, so it never gave up.
            None => WritePlan::NotPlanned,
        }
    }

    /// [`LunTable::plan_write`]; with `wait` false it returns None instead of
    /// blocking on an overlapping range holder, having done nothing that
    /// counts (the probe's validation is repeated by whoever runs it next).
    /// A protected unit's WRITE is planned only for a caller that writes
    /// the tuples it generates with the blocks (`generates_tuples`), and
    /// only when it brings none (WRPROTECT 000b).
    fn plan_write_with(
        &self,
        req: &ScsiRequest<'_>,
        data_len: u64,
        exclusive: bool,
        wait: bool,
        generates_tuples: bool,
    ) -> Option<WritePlan> {
        let Some(lu) = self.get(req.lun) else {
            return Some(WritePlan::NotPlanned);
        };
        let Ok(Cdb::Write(rw)) = Cdb::decode(req.cdb) else {
            return Some(WritePlan::NotPlanned);
        };
        if lu.protected() && (!generates_tuples || rw.protect != 0) {
            return Some(WritePlan::NotPlanned);
        }
        let started = std::time::Instant::now();
        let bs = lu.block_size();
        let bytes = u64::from(rw.length) * u64::from(bs);
        if rw.size == CdbSize::Six || rw.length == 0 || bytes != data_len {
            return Some(WritePlan::NotPlanned);
        }
        let no_data = ScsiRequest {
            lun: req.lun,
            cdb: req.cdb,
            nexus: req.nexus,
            task_tag: req.task_tag,
            attr: req.attr,
            data_out: &[],
            data_in_capacity: 0,
            initiator_stats: req.initiator_stats,
        };
        // A stalled unit holds the WRITE here, before it is validated or
        // counted in flight (the fabric writes the data itself after this).
        if !wait && lu.is_stalled() {
            return None;
        }
        if let Err(aborted) = lu.pass_stall_gate(bytes) {
            return Some(WritePlan::Answer(aborted));
        }
        // 1. Length-dependent failures: the real command answers.
        if rw.length > lu.max_transfer_blocks()
            || lu.check_range(rw.lba, u64::from(rw.length)).is_err()
        {
            return Some(WritePlan::Answer(self.execute(&no_data)));
        }
        // In flight from before the reservation check (PREEMPT AND ABORT).
        let mut planning = Planning {
            lu: &lu,
            nexus: req.nexus,
            entry: lu.in_flight.hold(req.nexus),
            range: None,
        };
        // 2. The normal path on the same command with no data.
        let probe_cdb = Cdb::Write(blockwire_pdu::scsi::Rw { length: 0, ..rw }).encode();
        let probe = ScsiRequest {
            cdb: &probe_cdb,
            ..no_data
        };
        let mut first = self.execute_probe(&probe);
        if first.status != ScsiStatus::GOOD.0 || first.sense.is_some() {
            drop(planning);
            record_command(
                &lu.stats,
                req.initiator_stats,
                Direction::Write,
                false,
                0,
                started,
            );
            first.transfer_length = clamp32(bytes);
            return Some(WritePlan::Answer(first));
        }
        let (start, end) = (rw.lba, rw.lba + u64::from(rw.length));
        planning.range = Some(if wait {
            lu.ranges.lock_id(start, end, exclusive)
        } else {
            lu.ranges.try_lock_id(start, end, exclusive)?
        });
        // The caller writes the bytes itself, past the store's own checks
        // (an unfinished atomic write's bytes, say): those run here, once
        // the range is held, so a write that ended before is seen.
        let offset = rw.lba * u64::from(bs);
        if let Err(e) = lu.cfg.backstore.check_write(offset, bytes) {
            drop(planning);
            record_command(
                &lu.stats,
                req.initiator_stats,
                Direction::Write,
                false,
                0,
                started,
            );
            return Some(WritePlan::Answer(lu.write_failure(rw.lba, bytes, &e)));
        }
        let clock = CommandClock::start(
            lu.stats.clone(),
            req.initiator_stats,
            Direction::Write,
            bytes,
            started,
        );
        Some(WritePlan::Write(Box::new(PlannedWrite {
            lu: lu.clone(),
            lba: rw.lba,
            offset,
            len: bytes,
            block_size: bs,
            fua: rw.fua,
            write_through: lu.write_through(rw.fua),
            hold: planning.into_hold(clock),
        })))
    }

    /// Runs a small plain WRITE here and now, for a caller that must not
    /// block (an async worker thread): a WRITE(10/12/16) of at most
    /// `max_bytes` whose Data-Out is exactly the CDB's bytes, not durable
    /// (no FUA, write cache on), to a unit whose store writes to memory
    /// ([`Backstore::writes_to_memory`](crate::backstore::Backstore::writes_to_memory)),
    /// as its store of protection information does if it has one (the
    /// tuples generated for the blocks are written with them: a WRITE that
    /// brings tuples is the core's), not stalled, whose range no COMPARE AND WRITE or ORWRITE holds or
    /// waits for. Returns its answer, the same as [`LunTable::execute`]
    /// gives (it is validated by the same probe as a planned WRITE, holds
    /// its range shared and counts in flight on its nexus while the data
    /// are copied, as the normal path does). None: nothing was done; run it
    /// with [`LunTable::execute`] where waiting is allowed.
    pub fn write_without_waiting(
        &self,
        req: &ScsiRequest<'_>,
        max_bytes: u64,
    ) -> Option<ScsiResult> {
        let lu = self.get(req.lun)?;
        // A protected unit's tuples are written here too.
        let tuples_to_memory = lu
            .cfg
            .pi_store
            .as_ref()
            .is_none_or(|t| t.writes_to_memory());
        if !lu.cfg.backstore.writes_to_memory() || !tuples_to_memory || lu.is_stalled() {
            return None;
        }
        let Ok(Cdb::Write(rw)) = Cdb::decode(req.cdb) else {
            return None;
        };
        let bytes = u64::from(rw.length) * u64::from(lu.block_size());
        // A durable write waits for the device; a large one may be throttled
        // by the page cache's dirty limits longer than a worker may stall.
        if bytes > max_bytes || bytes != req.data_out.len() as u64 || lu.write_through(rw.fua) {
            return None;
        }
        // Exclusive on a protected unit: see LogicalUnit::hold_for_write.
        let plan = match self.plan_write_with(req, bytes, lu.protected(), false, true)? {
            WritePlan::Write(p) => p,
            WritePlan::Answer(r) => return Some(r),
            WritePlan::NotPlanned => return None,
        };
        // WCE may have been turned off since the check above: then this one
        // write waits for the device, as it must.
        let written = if plan.write_through {
            lu.cfg.backstore.write_at_durable(plan.offset, req.data_out)
        } else {
            lu.cfg.backstore.write_at(plan.offset, req.data_out)
        };
        let answer = match written {
            Ok(()) => match lu.generate_pi(plan.lba, req.data_out, plan.write_through) {
                Ok(()) => lu.write_done(plan.len),
                Err(f) => {
                    plan.hold.fail();
                    lu.write_failed(plan.len, f)
                }
            },
            Err(e) => {
                plan.hold.fail();
                lu.write_failure(plan.lba, plan.len, &e)
            }
        };
        // Ends the command for the unit: range, in-flight count, statistics.
        drop(plan);
        Some(answer)
    }
}

impl LogicalUnit {
    /// How the unit's sense data are encoded (D_SENSE of the control mode
    /// page).
    pub(super) fn sense_format(&self) -> SenseFormat {
        if self.lock().mode.d_sense {
            SenseFormat::Descriptor
        } else {
            SenseFormat::Fixed
        }
    }

    /// The answer to a planned WRITE of `len` bytes whose backstore write
    /// (or the sync that makes it durable) failed with `e` at `lba`: the
    /// status and sense the normal path gives (MEDIUM ERROR, WRITE ERROR
    /// for EIO; DATA PROTECT, SPACE ALLOCATION FAILED for ENOSPC; ...),
    /// with `lba` in INFORMATION.
    pub fn write_failure(&self, lba: u64, len: u64, e: &std::io::Error) -> ScsiResult {
        tracing::warn!(lba, len, error = %e, "backstore write failed");
        self.write_failed(len, backstore_failure(e, true, lba))
    }

    /// The answer to a planned WRITE of `len` bytes that failed with
    /// `failure`. It is counted where it is known: the plan's hold, failed
    /// ([`WriteHold::fail`]), counts it as an error when it ends, once.
    fn write_failed(&self, len: u64, failure: Failure) -> ScsiResult {
        finish(Err(failure), len, self.sense_format(), 0)
    }

    /// The answer to a planned WRITE of `len` bytes that reached the
    /// backstore: GOOD, as the normal path reports it.
    pub fn write_done(&self, len: u64) -> ScsiResult {
        finish(Ok(Done::out(len)), len, self.sense_format(), 0)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use blockwire_pdu::pdu::codes::TaskAttr;
    use blockwire_pdu::scsi::{Asc, Rw, SenseKey};

    use super::super::tests::{
        c, expect_check, nexus, ready, run, sense, table, table_with, CHECK, GOOD,
    };
    use super::*;

    fn rw(size: CdbSize, lba: u64, length: u32, fua: bool) -> Vec<u8> {
        c(Cdb::Write(Rw {
            size,
            lba,
            length,
            protect: 0,
            dpo: false,
            fua,
            group: 0,
        }))
    }

    fn plan(t: &LunTable, n: &ItNexus, cdb: &[u8], len: u64) -> WritePlan {
        let req = ScsiRequest {
            lun: 0,
            cdb,
            nexus: n,
            task_tag: 7,
            attr: TaskAttr::Simple,
            data_out: &[],
            data_in_capacity: 0,
            initiator_stats: None,
        };
        t.plan_write(&req, len, false)
    }

    #[test]
    fn valid_write_is_planned_and_holds_range_and_in_flight() {
        let t = table();
        let n = nexus("iqn.2024-01.test:a");
        ready(&t, &n);
        let WritePlan::Write(p) = plan(&t, &n, &rw(CdbSize::Sixteen, 8, 16, true), 16 * 512) else {
            panic!("not planned")
        };
        assert_eq!((p.lba, p.offset, p.len, p.fua), (8, 4096, 8192, true));
        assert!(p.write_through, "FUA means durable before status");
        let lu = p.lu.clone();
        // PREEMPT AND ABORT would wait for it.
        assert!(!lu.in_flight.wait_idle(&n, Duration::from_millis(10)));
        // A COMPARE AND WRITE of an overlapping range waits for the hold.
        let done = Arc::new(AtomicBool::new(false));
        let (l2, d2) = (lu.clone(), done.clone());
        let caw = std::thread::spawn(move || {
            let _g = l2.ranges.exclusive(20, 21);
            d2.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !done.load(Ordering::SeqCst),
            "exclusive ran inside the hold"
        );
        drop(p);
        caw.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
        assert!(lu.in_flight.wait_idle(&n, Duration::from_millis(10)));
        assert_eq!(lu.write_done(8192).transfer_length, 8192);
    }

    /// A pipelined WRITE's bytes reach the file through the I/O engine,
    /// not the store: its plan refuses the bytes of an atomic write an I/O
    /// error left unfinished, which the next open writes in place (a WRITE
    /// acknowledged over them would silently be undone), as the store's
    /// own writes do; the rest of the unit plans as before.
    #[test]
    fn a_plan_refuses_the_bytes_of_an_unfinished_atomic_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lun.img");
        let journal = crate::backstore::FileBackstore::default_journal_path(&path);
        let (store, _) = crate::backstore::FileBackstore::open(&path, Some(1 << 20), false)
            .unwrap()
            .with_atomic_journal(&journal)
            .unwrap();
        store.leave_atomic_write_unfinished(64 << 10, &[0x11; 8192]);
        let lu = LogicalUnit::new(super::super::LuConfig::new(Arc::new(store)));
        let t = LunTable::new(vec![(0, Arc::new(lu))]);
        let n = nexus("iqn.2024-01.test:a");
        ready(&t, &n);
        // LBA 120, 16 blocks: bytes 60 KiB to 68 KiB, half of them held.
        let WritePlan::Answer(r) = plan(&t, &n, &rw(CdbSize::Ten, 120, 16, false), 8192) else {
            panic!("planned a write over an unfinished atomic write")
        };
        assert_eq!(r.status, CHECK);
        assert!(
            matches!(
                plan(&t, &n, &rw(CdbSize::Ten, 0, 16, false), 8192),
                WritePlan::Write(_)
            ),
            "the rest of the unit takes writes"
        );
        let lu = t.get(0).unwrap();
        assert!(
            lu.in_flight.wait_idle(&n, Duration::from_millis(10)),
            "the refused plan holds nothing"
        );
        assert!(
            lu.ranges.try_lock_id(120, 136, true).is_some(),
            "nor its range"
        );
    }

    /// A RAM store whose pre-write check panics (a bug in a store).
    #[derive(Debug)]
    struct PanicsInCheck(crate::backstore::RamBackstore);

    impl crate::backstore::Backstore for PanicsInCheck {
        fn size(&self) -> u64 {
            self.0.size()
        }
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
            self.0.read_at(offset, buf)
        }
        fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
            self.0.write_at(offset, data)
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn check_write(&self, _offset: u64, _len: u64) -> std::io::Result<()> {
            panic!("a store's bug")
        }
        fn describe(&self) -> String {
            "ram whose write check panics".into()
        }
    }

    /// A plan that panics partway (the fabric runs it on a thread whose
    /// panic ends only that command) gives back its count in flight and its
    /// range: left behind, the count would hold every PREEMPT AND ABORT
    /// for its full wait and keep the LUN in use, the range every later
    /// command to those blocks.
    #[test]
    fn a_plan_that_panics_leaves_nothing_held() {
        let store = PanicsInCheck(crate::backstore::RamBackstore::new(1 << 20));
        let lu = LogicalUnit::new(super::super::LuConfig::new(Arc::new(store)));
        let t = LunTable::new(vec![(0, Arc::new(lu))]);
        let n = nexus("iqn.2024-01.test:a");
        ready(&t, &n);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            plan(&t, &n, &rw(CdbSize::Ten, 120, 16, false), 8192)
        }));
        assert!(panicked.is_err(), "the store's check ran");
        let lu = t.get(0).unwrap();
        assert!(
            lu.in_flight.wait_idle(&n, Duration::from_millis(10)),
            "the panicked plan is not counted in flight"
        );
        assert_eq!(lu.activity().in_flight, 0);
        assert!(
            lu.ranges.try_lock_id(120, 136, true).is_some(),
            "nor holds its range"
        );
    }

    #[test]
    fn failures_are_the_normal_paths_answers() {
        let n = nexus("iqn.2024-01.test:a");
        // Read-only: DATA PROTECT, with the CDB's transfer length.
        let ro = table_with(|c| c.read_only = true);
        ready(&ro, &n);
        let WritePlan::Answer(r) = plan(&ro, &n, &rw(CdbSize::Ten, 0, 8, false), 4096) else {
            panic!("planned a write to a read-only LUN")
        };
        assert_eq!(r.status, CHECK);
        assert_eq!(sense(&r).key, SenseKey::DataProtect);
        assert_eq!(r.transfer_length, 4096);
        let lu = ro.get(0).unwrap().clone();
        assert!(lu.in_flight.wait_idle(&n, Duration::from_millis(10)));
        // Past the end: LBA OUT OF RANGE, as the normal path says it.
        let t = table();
        ready(&t, &n);
        let cdb = rw(CdbSize::Ten, 2047, 2, false);
        let WritePlan::Answer(r) = plan(&t, &n, &cdb, 1024) else {
            panic!("planned a write past the end")
        };
        let normal = run(&t, &n, &cdb, &[0; 1024], 0);
        assert_eq!(r, normal);
        expect_check(&r, SenseKey::IllegalRequest, Asc::LBA_OUT_OF_RANGE);
        // Unit attention first (a fresh nexus), consumed once.
        let m = nexus("iqn.2024-01.test:b");
        let WritePlan::Answer(r) = plan(&t, &m, &rw(CdbSize::Ten, 0, 1, false), 512) else {
            panic!("a pending unit attention must answer")
        };
        assert_eq!(sense(&r).key, SenseKey::UnitAttention);
        assert!(matches!(
            plan(&t, &m, &rw(CdbSize::Ten, 0, 1, false), 512),
            WritePlan::Write(_)
        ));
    }

    #[test]
    fn only_exact_write_10_12_16_are_planned() {
        let t = table();
        let n = nexus("iqn.2024-01.test:a");
        ready(&t, &n);
        assert!(matches!(
            plan(&t, &n, &rw(CdbSize::Six, 0, 1, false), 512),
            WritePlan::NotPlanned
        ));
        // Data-Out shorter than the CDB: the normal path's residual rules.
        assert!(matches!(
            plan(&t, &n, &rw(CdbSize::Twelve, 0, 4, false), 1024),
            WritePlan::NotPlanned
        ));
        assert!(matches!(
            plan(&t, &n, &rw(CdbSize::Twelve, 0, 0, false), 0),
            WritePlan::NotPlanned
        ));
        assert!(matches!(
            plan(&t, &n, &c(Cdb::TestUnitReady), 0),
            WritePlan::NotPlanned
        ));
        assert_eq!(run(&t, &n, &c(Cdb::TestUnitReady), &[], 0).status, GOOD);
    }

    fn write_now(t: &LunTable, n: &ItNexus, cdb: &[u8], data: &[u8]) -> Option<ScsiResult> {
        let req = ScsiRequest {
            lun: 0,
            cdb,
            nexus: n,
            task_tag: 9,
            attr: TaskAttr::Simple,
            data_out: data,
            data_in_capacity: 0,
            initiator_stats: None,
        };
        crate::scsi::stall::without_waiting(|| t.write_without_waiting(&req, 64 << 10))
    }

    #[test]
    fn small_write_to_memory_runs_at_once_with_the_normal_answer() {
        let t = table();
        let n = nexus("iqn.2024-01.test:a");
        ready(&t, &n);
        let data: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        let cdb = rw(CdbSize::Ten, 16, 8, false);
        let r = write_now(&t, &n, &cdb, &data).expect("written at once");
        assert_eq!(r, run(&t, &n, &cdb, &data, 0), "the normal path's answer");
        assert_eq!(super::super::tests::read(&t, &n, 16, 8).data_in, data);
        // Nothing is left held: not in flight, the range free for an exclusive holder.
        let lu = t.get(0).unwrap().clone();
        assert!(lu.in_flight.wait_idle(&n, Duration::from_millis(10)));
        drop(lu.ranges.exclusive(16, 24));
        // A pending unit attention is the answer, as on the normal path.
        let m = nexus("iqn.2024-01.test:b");
        let r = write_now(&t, &m, &cdb, &data).expect("answered at once");
        assert_eq!(sense(&r).key, SenseKey::UnitAttention);
        // Read-only: DATA PROTECT, the normal path's answer.
        let ro = table_with(|c| c.read_only = true);
        ready(&ro, &n);
        let r = write_now(&ro, &n, &cdb, &data).expect("answered at once");
        assert_eq!(r, run(&ro, &n, &cdb, &data, 0));
        expect_check(&r, SenseKey::DataProtect, Asc::WRITE_PROTECTED);
    }

    #[test]
    fn writes_that_would_wait_are_left_for_a_blocking_thread_untouched() {
        let t = table();
        let n = nexus("iqn.2024-01.test:a");
        ready(&t, &n);
        let lu = t.get(0).unwrap().clone();
        let data = vec![0x5a; 4096];
        // FUA: durable before status, the device is waited for.
        assert!(write_now(&t, &n, &rw(CdbSize::Ten, 0, 8, true), &data).is_none());
        // Larger than the bound.
        let big = vec![1; 128 << 10];
        assert!(write_now(&t, &n, &rw(CdbSize::Ten, 0, 256, false), &big).is_none());
        // Data-Out shorter than the CDB: the normal path's residual rules.
        assert!(write_now(&t, &n, &rw(CdbSize::Ten, 0, 16, false), &data).is_none());
        // A stalled unit.
        lu.set_stalled(true);
        assert!(write_now(&t, &n, &rw(CdbSize::Ten, 0, 8, false), &data).is_none());
        lu.set_stalled(false);
        // A COMPARE AND WRITE holding an overlapping range; a disjoint one goes.
        {
            let _caw = lu.ranges.exclusive(4, 5);
            assert!(write_now(&t, &n, &rw(CdbSize::Ten, 0, 8, false), &data).is_none());
            assert!(write_now(&t, &n, &rw(CdbSize::Ten, 8, 8, false), &data).is_some());
        }
        // None of the refusals changed the medium or left anything held.
        assert!(super::super::tests::read(&t, &n, 0, 8)
            .data_in
            .iter()
            .all(|&b| b == 0));
        assert!(lu.in_flight.wait_idle(&n, Duration::from_millis(10)));
        drop(lu.ranges.exclusive(0, 16));
        // Write cache off: every write is write-through.
        let wt = table_with(|c| c.write_cache = false);
        ready(&wt, &n);
        assert!(write_now(&wt, &n, &rw(CdbSize::Ten, 0, 8, false), &data).is_none());
    }

    #[test]
    fn write_failure_maps_errno_like_the_core() {
        let t = table();
        let lu = t.get(0).unwrap();
        let eio = std::io::Error::from_raw_os_error(libc::EIO);
        let r = lu.write_failure(42, 4096, &eio);
        let s = expect_check(&r, SenseKey::MediumError, Asc::WRITE_ERROR);
        assert_eq!(s.information, Some(42));
        assert_eq!(r.transfer_length, 4096);
        let nospc = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let s = expect_check(
            &lu.write_failure(9, 512, &nospc),
            SenseKey::DataProtect,
            Asc::SPACE_ALLOCATION_FAILED_WRITE_PROTECT,
        );
        assert_eq!(s.information, Some(9));
    }

    #[test]
    fn a_ram_lun_past_its_memory_budget_answers_space_allocation_failed() {
        use crate::backstore::ram_budget::RamBudget;
        use crate::backstore::RamBackstore;
        use crate::scsi::LuConfig;
        let budget = RamBudget::with_limit(1 << 20);
        let store = Arc::new(RamBackstore::with_budget(4 << 20, budget.clone()));
        let t = LunTable::new(vec![(0, Arc::new(LogicalUnit::new(LuConfig::new(store))))]);
        let n = nexus("iqn.x");
        ready(&t, &n);
        let data = vec![7u8; 1 << 20];
        // The first MiB fits; one in the next chunk does not.
        let r = run(&t, &n, &rw(CdbSize::Ten, 0, 2048, false), &data, 0);
        assert_eq!(r.status, GOOD, "{r:?}");
        let r = run(&t, &n, &rw(CdbSize::Ten, 2048, 8, false), &data[..4096], 0);
        let s = expect_check(
            &r,
            SenseKey::DataProtect,
            Asc::SPACE_ALLOCATION_FAILED_WRITE_PROTECT,
        );
        assert_eq!(s.information, Some(2048));
        assert_eq!(budget.held(), 1 << 20);
    }
}
