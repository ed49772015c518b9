//! READ planning for the fabric's pipelined data path (synchronized
//! sends): the READ is validated by the normal command path, and instead of
//! the data the fabric gets where the data are, so it can read them itself
//! (chunked, into registered buffers) and send each Data-In PDU as soon as
//! its bytes are valid.
//!
//! Validation is the normal path, called, not repeated:
//! 1. [`LunTable::execute`] runs on the same READ with TRANSFER LENGTH 0.
//!    That is the whole command lifecycle (in-flight accounting, unit
//!    attentions, CAPACITY DATA HAS CHANGED, reservations, CDB decoding,
//!    RDPROTECT, the LBA) without a byte of I/O; any failure it reports is
//!    the answer, with the transfer length of the real CDB (residuals).
//! 2. The length-dependent checks (MAXIMUM TRANSFER LENGTH, the range end):
//!    when one would fail, the real command goes through
//!    [`LunTable::execute`] and its answer is returned, so the sense is the
//!    normal path's own.
//!
//! Only READ(10), READ(12) and READ(16) with a non-zero length are planned;
//! everything else is [`ReadPlan::NotPlanned`] (run it the normal way).
//!
//! A unit formatted with protection information checks every block it
//! reads against the block's stored tuple, so the fabric must not send its
//! blocks from wherever they lie: its READs (RDPROTECT 000b) are planned as
//! [`ReadPlan::Checked`], whose data only
//! [`LogicalUnit::read_checked`] reads. A READ that moves tuples
//! (RDPROTECT 001b-101b) is not planned.

use std::sync::Arc;

use blockwire_pdu::scsi::{Cdb, CdbSize, ScsiStatus};

use super::logical_unit::finish;
use super::outcome::{backstore_failure, clamp32};
use super::stats::{record_command, CommandClock, Direction};
use super::{LogicalUnit, LunTable, ScsiRequest, ScsiResult};

/// A validated READ: what to read and how to answer.
#[derive(Debug, Clone)]
pub struct PlannedRead {
    /// The logical unit.
    pub lu: Arc<LogicalUnit>,
    /// First logical block.
    pub lba: u64,
    /// Byte offset in the backstore.
    pub offset: u64,
    /// Bytes the CDB asks for (the `ScsiResult::transfer_length` of the
    /// normal path; the fabric sends at most the initiator's Expected Data
    /// Transfer Length of them and reports the residual).
    pub len: u64,
    /// Logical block size.
    pub block_size: u32,
    /// Counts the READ in the unit's statistics once every copy of the
    /// plan is dropped: a fabric that keeps it until the status is sent
    /// gets the whole command timed, one that drops it on taking the
    /// fields the core's part.
    pub clock: Arc<CommandClock>,
}

/// What to do with a command the fabric would like to read itself.
#[derive(Debug)]
pub enum ReadPlan {
    /// Valid: read `len` bytes at `offset` and answer GOOD.
    Read(PlannedRead),
    /// Valid, on a unit formatted with protection information: have
    /// [`LogicalUnit::read_checked`] read and check the blocks and answer.
    Checked(PlannedRead),
    /// Answered by the normal path (an error, or a command it had to run).
    Answer(ScsiResult),
    /// Not a plannable READ: nothing was done, run it with
    /// [`LunTable::execute`].
    NotPlanned,
    /// Planning under [`stall::without_waiting`](super::stall::without_waiting) met a
    /// stalled unit: nothing was done; plan again where waiting is allowed.
    WouldWait,
}

impl LunTable {
    /// Validates `req` as [`LunTable::execute`] would and, for a valid
    /// READ(10/12/16), returns where its data are instead of reading them.
    /// Does no backstore I/O (except when it answers with the normal path).
    pub fn plan_read(&self, req: &ScsiRequest<'_>) -> ReadPlan {
        let Some(lu) = self.get(req.lun) else {
            return ReadPlan::NotPlanned;
        };
        let Ok(Cdb::Read { rw, rarc }) = Cdb::decode(req.cdb) else {
            return ReadPlan::NotPlanned;
        };
        if rw.size == CdbSize::Six || rw.length == 0 {
            return ReadPlan::NotPlanned;
        }
        // Blocks of a protected unit are checked against their tuples as
        // they are read (see the module docs); one that moves its tuples
        // to the initiator is the core's whole.
        let checked = lu.protected();
        if checked && rw.protect != 0 {
            return ReadPlan::NotPlanned;
        }
        let started = std::time::Instant::now();
        let bs = lu.block_size();
        let bytes = u64::from(rw.length) * u64::from(bs);
        // A stalled unit holds the READ here, before it is validated (the
        // fabric reads the data itself after this, so the gate is now).
        if super::stall::waiting_forbidden() && lu.is_stalled() {
            return ReadPlan::WouldWait;
        }
        if let Err(aborted) = lu.pass_stall_gate(bytes) {
            return ReadPlan::Answer(aborted);
        }
        // 1. The normal path on the same command with no data.
        let probe_cdb = Cdb::Read {
            rw: blockwire_pdu::scsi::Rw { length: 0, ..rw },
            rarc,
        }
        .encode();
        let probe = ScsiRequest {
            lun: req.lun,
            cdb: &probe_cdb,
            nexus: req.nexus,
            task_tag: req.task_tag,
            attr: req.attr,
            data_out: req.data_out,
            data_in_capacity: 0,
            initiator_stats: req.initiator_stats,
        };
        let mut first = self.execute_probe(&probe);
        if first.status != ScsiStatus::GOOD.0 || first.sense.is_some() {
            record_command(
                &lu.stats,
                req.initiator_stats,
                Direction::Read,
                false,
                0,
                started,
            );
            // As `finish` reports failures: the CDB's transfer length.
            first.transfer_length = clamp32(bytes);
            return ReadPlan::Answer(first);
        }
        // 2. Length-dependent checks: failures are answered by the real thing.
        if rw.length > lu.max_transfer_blocks()
            || lu.check_range(rw.lba, u64::from(rw.length)).is_err()
        {
            return ReadPlan::Answer(self.execute(req));
        }
        let plan = PlannedRead {
            lu: lu.clone(),
            lba: rw.lba,
            offset: rw.lba * u64::from(bs),
            len: bytes,
            block_size: bs,
            clock: CommandClock::start(
                lu.stats.clone(),
                req.initiator_stats,
                Direction::Read,
                bytes,
                started,
            ),
        };
        if checked {
            ReadPlan::Checked(plan)
        } else {
            ReadPlan::Read(plan)
        }
    }
}

impl LunTable {
    /// Runs, here and now, a command the unit answers from memory: a READ
    /// of at most `max_bytes`, or GET LBA STATUS, on a unit whose store keeps
    /// its blocks and its allocation map in memory
    /// ([`Backstore::in_memory`](crate::backstore::Backstore::in_memory))
    /// and that is not stalled; for a caller that must not block (an async
    /// worker thread). The answer is [`LunTable::execute`]'s own: it is
    /// that call, under [`stall::without_waiting`](super::stall::without_waiting)
    /// (a stall set after the check finds the command already past the
    /// gate). Neither command takes a range lock. On a unit formatted with
    /// protection information only a READ is answered here, when its
    /// blocks and tuples are in memory (RAM, or a file's page cache) and
    /// no WRITE holds them ([`LogicalUnit::read_checked_without_waiting`]).
    /// None: nothing was done; run it where waiting is allowed.
    pub fn execute_from_memory(&self, req: &ScsiRequest<'_>, max_bytes: u64) -> Option<ScsiResult> {
        let lu = self.get(req.lun)?;
        if lu.is_stalled() {
            return None;
        }
        if lu.protected() {
            return self.read_checked_at_once(req, &lu, max_bytes);
        }
        if !lu.cfg.backstore.in_memory() {
            return None;
        }
        match Cdb::decode(req.cdb) {
            Ok(Cdb::Read { rw, .. })
                if u64::from(rw.length) * u64::from(lu.block_size()) <= max_bytes => {}
            Ok(Cdb::GetLbaStatus { .. }) => {}
            _ => return None,
        }
        Some(super::stall::without_waiting(|| self.execute(req)))
    }

    /// [`LunTable::execute_from_memory`] for a READ of at most `max_bytes`
    /// of protected unit `lu`: planned, then read and checked if its stores
    /// hold every block and tuple in memory and no WRITE holds them; None,
    /// with nothing counted, if not.
    fn read_checked_at_once(
        &self,
        req: &ScsiRequest<'_>,
        lu: &LogicalUnit,
        max_bytes: u64,
    ) -> Option<ScsiResult> {
        match Cdb::decode(req.cdb) {
            Ok(Cdb::Read { rw, .. })
                if u64::from(rw.length) * u64::from(lu.block_size()) <= max_bytes => {}
            _ => return None,
        }
        match super::stall::without_waiting(|| self.plan_read(req)) {
            ReadPlan::Checked(p) => {
                let answer = p.lu.read_checked_without_waiting(&p, req.data_in_capacity);
                if answer.is_none() {
                    p.clock.forget();
                }
                answer
            }
            ReadPlan::Answer(r) => Some(r),
            ReadPlan::Read(p) => {
                // Not a protected unit after all (replaced meanwhile).
                p.clock.forget();
                None
            }
            ReadPlan::NotPlanned | ReadPlan::WouldWait => None,
        }
    }
}

impl LogicalUnit {
    /// The answer to a planned READ whose backstore read failed with `e`
    /// at `lba`: the same status and sense the normal path gives. The plan's
    /// clock counts the command, once: fail it
    /// ([`CommandClock::fail`](super::stats::CommandClock::fail)).
    pub fn read_failure(&self, lba: u64, len: u64, e: &std::io::Error) -> ScsiResult {
        let format = self.sense_format();
        tracing::warn!(lba, len, error = %e, "backstore read failed");
        finish(Err(backstore_failure(e, false, lba)), len, format, 0)
    }
}
