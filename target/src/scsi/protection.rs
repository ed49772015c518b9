//! T10 protection information, Type 1 (SBC-3 4.18): a logical unit
//! formatted with protection keeps an 8-byte tuple (guard CRC, application
//! tag, reference tag) beside every logical block, generates it for every
//! write that brings none, checks it on every read, and moves it with the
//! data when RDPROTECT, WRPROTECT or VRPROTECT ask for it.
//!
//! The tuples live in their own store (`LuConfig::pi_store`, 8 bytes per
//! block), every byte inverted: a store nobody wrote, or a range of it that
//! was deallocated, reads back as tuples of FFh, whose application tag is
//! the escape that turns every check off (SBC-4 4.7.4.5: an unmapped block
//! of a unit with LBPRZ=1 reads with protection information of FFh). So a
//! new sparse file or a RAM store needs no formatting pass, and UNMAP of
//! the data deallocates the tuples alongside.
//!
//! What a failed check answers: ABORTED COMMAND with LOGICAL BLOCK GUARD
//! CHECK FAILED or LOGICAL BLOCK REFERENCE TAG CHECK FAILED, INFORMATION
//! the first failing LBA; on a write nothing of the command is written.

use std::sync::atomic::{AtomicU64, Ordering};

use blockwire_pdu::scsi::protection::TUPLE_BYTES;
use blockwire_pdu::scsi::{Asc, PiCheckFailure, PiChecks, PiTuple, Sense, SenseKey};
use tracing::warn;

use super::guard_crc::block_guard;
use super::logical_unit::{finish, LogicalUnit};
use super::outcome::{backstore_failure, invalid_cdb, Done, Failure};
use super::range_lock::RangeGuard;
use super::read_plan::PlannedRead;
use super::read_write::blocks_taken;
use super::ScsiResult;
use crate::backstore::Backstore;

/// Bytes of tuples per run the tuple store is read or written in.
const TUPLE_RUN_BYTES: usize = 64 << 10;

/// The ABORTED COMMAND that reports `failure` at `lba`.
fn check_failed(failure: PiCheckFailure, lba: u64) -> Failure {
    let asc = match failure {
        PiCheckFailure::Guard => Asc::LOGICAL_BLOCK_GUARD_CHECK_FAILED,
        PiCheckFailure::ReferenceTag => Asc::LOGICAL_BLOCK_REFERENCE_TAG_CHECK_FAILED,
    };
    let mut s = Sense::new(SenseKey::AbortedCommand, asc);
    s.information = Some(lba);
    Failure::Check(s)
}

/// How many protection information checks failed on a unit, by check.
#[derive(Debug, Default)]
pub(crate) struct PiFailures {
    guard: AtomicU64,
    reference: AtomicU64,
}

/// Failed protection information checks of one unit so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PiFailureCounts {
    /// LOGICAL BLOCK GUARD CHECK FAILED: the data do not match their CRC.
    pub guard: u64,
    /// LOGICAL BLOCK REFERENCE TAG CHECK FAILED: a block where another
    /// LBA's belongs (a misplaced write).
    pub reference: u64,
}

/// Stored form of a tuple: its wire bytes inverted (see the module docs).
fn stored(t: &PiTuple) -> [u8; TUPLE_BYTES] {
    t.encode().map(|b| !b)
}

fn from_stored(b: &[u8]) -> PiTuple {
    let mut w = [0u8; TUPLE_BYTES];
    for (d, s) in w.iter_mut().zip(b) {
        *d = !s;
    }
    PiTuple::decode(&w)
}

impl LogicalUnit {
    /// Whether the unit is formatted with protection information.
    pub fn protected(&self) -> bool {
        self.cfg.pi_store.is_some()
    }

    /// The checks a RDPROTECT, WRPROTECT or VRPROTECT value (at byte 1,
    /// bits 7-5 of the CDB) asks for. Without protection every non-zero
    /// value is INVALID FIELD IN CDB (SBC-3 5.16 table 82); with it only
    /// the reserved ones (110b, 111b) are. `None`: 000b, no tuples move.
    pub(crate) fn protect_field(&self, protect: u8) -> Result<Option<PiChecks>, Failure> {
        if protect == 0 {
            return Ok(None);
        }
        if !self.protected() {
            return Err(invalid_cdb(1, Some(7)));
        }
        PiChecks::for_field(protect)
            .map(Some)
            .ok_or_else(|| invalid_cdb(1, Some(7)))
    }

    /// Holds blocks `[start, end)` while a command writes them: shared with
    /// other writes on a plain unit. On a protected unit a block and its
    /// tuple are written one after the other, so the hold is exclusive: a
    /// READ between the two would fail its check on data no medium holds,
    /// and two WRITEs could leave one's block with the other's tuple.
    pub(crate) fn hold_for_write(&self, start: u64, end: u64) -> RangeGuard<'_> {
        if self.protected() {
            self.ranges.exclusive(start, end)
        } else {
            self.ranges.shared(start, end)
        }
    }

    /// Holds blocks `[start, end)` while a command reads them with their
    /// tuples, against the writes of a protected unit (see
    /// [`LogicalUnit::hold_for_write`]); nothing on a plain unit, whose
    /// READs need no hold.
    pub(crate) fn hold_for_read(&self, start: u64, end: u64) -> Option<RangeGuard<'_>> {
        self.protected().then(|| self.ranges.shared(start, end))
    }

    /// Bytes one block takes in a transfer that carries its tuple.
    pub(crate) fn protected_block_bytes(&self) -> usize {
        self.cfg.block_size as usize + TUPLE_BYTES
    }

    /// The stored tuples of `n` blocks from `lba`.
    pub(crate) fn load_pi(&self, lba: u64, n: usize) -> Result<Vec<PiTuple>, Failure> {
        let Some(store) = &self.cfg.pi_store else {
            return Ok(vec![PiTuple::UNWRITTEN; n]);
        };
        let mut out = Vec::with_capacity(n);
        let mut buf = vec![0u8; TUPLE_RUN_BYTES.min(n * TUPLE_BYTES)];
        let mut done = 0;
        while done < n {
            let k = (n - done).min(TUPLE_RUN_BYTES / TUPLE_BYTES);
            let part = buf.get_mut(..k * TUPLE_BYTES).unwrap_or_default();
            let at = lba + done as u64;
            store.read_at(at * TUPLE_BYTES as u64, part).map_err(|e| {
                warn!(lba = at, error = %e, "protection information read failed");
                backstore_failure(&e, false, at)
            })?;
            out.extend(part.chunks_exact(TUPLE_BYTES).map(from_stored));
            done += k;
        }
        Ok(out)
    }

    /// Stores `tuples` for the blocks from `lba`; durable before it
    /// returns when `durable` (FUA, WCE off), as the data are.
    pub(crate) fn store_pi(
        &self,
        lba: u64,
        tuples: &[PiTuple],
        durable: bool,
    ) -> Result<(), Failure> {
        let Some(store) = &self.cfg.pi_store else {
            return Ok(());
        };
        for (i, run) in tuples.chunks(TUPLE_RUN_BYTES / TUPLE_BYTES).enumerate() {
            let at = lba + (i * (TUPLE_RUN_BYTES / TUPLE_BYTES)) as u64;
            let bytes: Vec<u8> = run.iter().flat_map(stored).collect();
            let offset = at * TUPLE_BYTES as u64;
            let r = if durable {
                store.write_at_durable(offset, &bytes)
            } else {
                store.write_at(offset, &bytes)
            };
            r.map_err(|e| {
                warn!(lba = at, error = %e, "protection information write failed");
                backstore_failure(&e, true, at)
            })?;
        }
        Ok(())
    }

    /// Generates and stores the tuples of `data` written at `lba` (a write
    /// that brought none: WRPROTECT 000b, WRITE SAME, COMPARE AND WRITE,
    /// ORWRITE, copies). Nothing when the unit is not protected.
    pub(crate) fn generate_pi(&self, lba: u64, data: &[u8], durable: bool) -> Result<(), Failure> {
        if !self.protected() {
            return Ok(());
        }
        let bs = self.cfg.block_size as usize;
        let tuples: Vec<PiTuple> = data
            .chunks(bs)
            .enumerate()
            .map(|(i, b)| PiTuple {
                guard: block_guard(b),
                app_tag: 0,
                ref_tag: (lba + i as u64) as u32,
            })
            .collect();
        self.store_pi(lba, &tuples, durable)
    }

    /// Tuples for `blocks` zero-filled blocks from `lba`: the guard of a
    /// block of zeros is 0, so no block needs to be looked at.
    pub(crate) fn generate_zero_pi(&self, lba: u64, blocks: u64) -> Result<(), Failure> {
        if !self.protected() {
            return Ok(());
        }
        let per = (TUPLE_RUN_BYTES / TUPLE_BYTES) as u64;
        let mut at = lba;
        while at < lba + blocks {
            let n = (lba + blocks - at).min(per);
            let tuples: Vec<PiTuple> = (at..at + n)
                .map(|l| PiTuple {
                    guard: 0,
                    app_tag: 0,
                    ref_tag: l as u32,
                })
                .collect();
            self.store_pi(at, &tuples, false)?;
            at += n;
        }
        Ok(())
    }

    /// Deallocates the tuples of `blocks` blocks from `lba` along with
    /// their data: they read back as FFh, never checked.
    pub(crate) fn discard_pi(&self, lba: u64, blocks: u64) -> Result<(), Failure> {
        let Some(store) = &self.cfg.pi_store else {
            return Ok(());
        };
        store
            .discard(lba * TUPLE_BYTES as u64, blocks * TUPLE_BYTES as u64)
            .map_err(|e| {
                warn!(lba, blocks, error = %e, "protection information discard failed");
                backstore_failure(&e, true, lba)
            })
    }

    /// Checks `data` read from `lba` against the stored tuples (a read
    /// that moves none: RDPROTECT 000b, and every internal read).
    pub(crate) fn check_stored_pi(&self, lba: u64, data: &[u8]) -> Result<(), Failure> {
        if !self.protected() {
            return Ok(());
        }
        let bs = self.cfg.block_size as usize;
        let tuples = self.load_pi(lba, data.len() / bs)?;
        self.check_tuples(data.chunks(bs), &tuples, lba, PiChecks::ALL)
    }

    /// Every block against its tuple as `checks` says; the first failure,
    /// at its LBA, counted and logged with the store it was found on.
    pub(crate) fn check_tuples<'a>(
        &self,
        blocks: impl Iterator<Item = &'a [u8]>,
        tuples: &[PiTuple],
        lba: u64,
        checks: PiChecks,
    ) -> Result<(), Failure> {
        for (i, (block, t)) in blocks.zip(tuples).enumerate() {
            let at = lba + i as u64;
            if let Some(f) = t.check_with(|| block_guard(block), at, checks) {
                let counter = match f {
                    PiCheckFailure::Guard => &self.pi_failures.guard,
                    PiCheckFailure::ReferenceTag => &self.pi_failures.reference,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                warn!(
                    lba = at,
                    failure = ?f,
                    store = %self.cfg.backstore.describe(),
                    "protection information check failed"
                );
                return Err(check_failed(f, at));
            }
        }
        Ok(())
    }

    /// Failed protection information checks so far.
    pub fn pi_check_failures(&self) -> PiFailureCounts {
        PiFailureCounts {
            guard: self.pi_failures.guard.load(Ordering::Relaxed),
            reference: self.pi_failures.reference.load(Ordering::Relaxed),
        }
    }

    /// The answer to a planned READ of this protected unit
    /// ([`ReadPlan::Checked`](super::read_plan::ReadPlan::Checked)): its
    /// blocks, each checked against its stored tuple, as the normal path
    /// answers a READ with RDPROTECT 000b, at most `capacity` bytes of
    /// them. Waits for the stores; see also
    /// [`LogicalUnit::read_checked_without_waiting`].
    pub fn read_checked(&self, plan: &PlannedRead, capacity: u32) -> ScsiResult {
        match self.read_checked_from_stores(plan, capacity, true) {
            Some(r) => r,
            // Stores that may wait never decline.
            None => unreachable!("a read that may wait declined"),
        }
    }

    /// [`LogicalUnit::read_checked`] for a caller that must not block (an
    /// async worker thread): it reads only what the stores hold in memory
    /// ([`Backstore::read_at_without_waiting`]) and returns None when either
    /// would have to wait for a device: the plan is then still to be
    /// answered (by [`LogicalUnit::read_checked`] where waiting is allowed)
    /// or given up (its clock forgotten, the command run whole elsewhere).
    ///
    /// [`Backstore::read_at_without_waiting`]: crate::backstore::Backstore::read_at_without_waiting
    pub fn read_checked_without_waiting(
        &self,
        plan: &PlannedRead,
        capacity: u32,
    ) -> Option<ScsiResult> {
        self.read_checked_from_stores(plan, capacity, false)
    }

    fn read_checked_from_stores(
        &self,
        plan: &PlannedRead,
        capacity: u32,
        wait: bool,
    ) -> Option<ScsiResult> {
        // As the core's READ does, only the blocks the initiator takes are
        // read: the plan's READ budget share counts those, not the CDB's.
        let bs = plan.block_size as usize;
        let blocks = blocks_taken(
            capacity,
            bs,
            (plan.len / u64::from(plan.block_size)) as usize,
        );
        let len = blocks * bs;
        let end = plan.lba + blocks as u64;
        let checked = if blocks == 0 {
            Ok(Vec::new())
        } else if wait {
            // The core's own READ: blocks, then their stored tuples.
            let _hold = self.hold_for_read(plan.lba, end);
            self.read_unchecked_to_vec(plan.lba, len)
                .and_then(|data| self.check_stored_pi(plan.lba, &data).map(|()| data))
        } else {
            // A WRITE of these blocks is under way: read them where
            // waiting for it is allowed.
            let _hold = self.ranges.try_shared(plan.lba, end)?;
            self.read_checked_in_memory(plan.lba, len)?
        };
        let format = self.sense_format();
        Some(match checked {
            Ok(data) => {
                let done = Done {
                    transfer_length: super::outcome::clamp32(plan.len),
                    ..Done::media(data)
                };
                finish(Ok(done), plan.len, format, capacity)
            }
            Err(f) => {
                plan.clock.fail();
                finish(Err(f), plan.len, format, capacity)
            }
        })
    }

    /// `len` bytes of blocks from `lba` checked against their stored
    /// tuples, read only from what the stores hold in memory; None when
    /// either would have to wait for a device.
    fn read_checked_in_memory(&self, lba: u64, len: usize) -> Option<Result<Vec<u8>, Failure>> {
        let bs = self.cfg.block_size as usize;
        let read = |store: &dyn Backstore, offset: u64, buf: &mut [u8]| {
            store.read_at_without_waiting(offset, buf).map_err(|e| {
                warn!(lba, len, error = %e, "backstore read failed");
                backstore_failure(&e, false, lba)
            })
        };
        let mut data = vec![0u8; len];
        match read(self.cfg.backstore.as_ref(), lba * bs as u64, &mut data) {
            Ok(true) => {}
            Ok(false) => return None,
            Err(f) => return Some(Err(f)),
        }
        let tuples = match &self.cfg.pi_store {
            Some(store) => {
                let mut stored = vec![0u8; len / bs * TUPLE_BYTES];
                match read(store.as_ref(), lba * TUPLE_BYTES as u64, &mut stored) {
                    Ok(true) => {}
                    Ok(false) => return None,
                    Err(f) => return Some(Err(f)),
                }
                stored.chunks_exact(TUPLE_BYTES).map(from_stored).collect()
            }
            None => vec![PiTuple::UNWRITTEN; len / bs],
        };
        Some(
            self.check_tuples(data.chunks(bs), &tuples, lba, PiChecks::ALL)
                .map(|()| data),
        )
    }

    /// READ with RDPROTECT 001b-101b: the blocks from `lba`, each followed
    /// by its stored tuple, checked as `checks` says.
    pub(crate) fn read_with_pi(
        &self,
        lba: u64,
        blocks: usize,
        checks: PiChecks,
    ) -> Result<Vec<u8>, Failure> {
        let bs = self.cfg.block_size as usize;
        let data = self.read_unchecked_to_vec(lba, blocks * bs)?;
        let tuples = self.load_pi(lba, blocks)?;
        self.check_tuples(data.chunks(bs), &tuples, lba, checks)?;
        let mut out = Vec::with_capacity(blocks * (bs + TUPLE_BYTES));
        for (block, t) in data.chunks(bs).zip(&tuples) {
            out.extend_from_slice(block);
            out.extend_from_slice(&t.encode());
        }
        Ok(out)
    }
}

/// The user data and tuples of a transfer that carries protection
/// information (each block followed by its tuple); `wire` must be whole
/// blocks with their tuples.
pub(crate) fn split_protected(wire: &[u8], block_size: usize) -> (Vec<u8>, Vec<PiTuple>) {
    let per = block_size + TUPLE_BYTES;
    let mut data = Vec::with_capacity(wire.len() / per * block_size);
    let mut tuples = Vec::with_capacity(wire.len() / per);
    for unit in wire.chunks_exact(per) {
        let (block, tuple) = unit.split_at(block_size);
        data.extend_from_slice(block);
        let mut t = [0u8; TUPLE_BYTES];
        t.copy_from_slice(tuple);
        tuples.push(PiTuple::decode(&t));
    }
    (data, tuples)
}
