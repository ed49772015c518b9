//! SANITIZE (SBC-4 5.30, 4.11): OVERWRITE, BLOCK ERASE and EXIT FAILURE
//! MODE. CRYPTO ERASE is refused: no backstore encrypts its blocks, so
//! there is no key whose change would make them unreadable.
//!
//! A sanitize operation runs on a thread of its own, apart from the
//! command that started it (SBC-4 4.11: it survives task aborts, logical
//! unit and target resets and I_T nexus loss). While it runs every command
//! but INQUIRY, REPORT LUNS and REQUEST SENSE ends NOT READY, LOGICAL UNIT
//! NOT READY, SANITIZE IN PROGRESS with a progress indication, which
//! REQUEST SENSE also reports. With IMMED=0 the SANITIZE command itself
//! waits for the end (and gives up, not the operation, if its task is
//! aborted). A failed operation leaves the unit in sanitize failure mode:
//! media commands end MEDIUM ERROR, SANITIZE COMMAND FAILED until a
//! sanitize succeeds or, if the failed one had AUSE=1, EXIT FAILURE MODE.
//!
//! An operation also erases what the store keeps of written data apart
//! from the medium: a file LUN's atomic-write journal keeps each finished
//! atomic write in its slot until the slot is reused.
//!
//! The operation holds the whole medium exclusively in the range lock, so
//! writes that were already running when it was accepted finish first.
//! `LuConfig::sanitize_min_duration` stretches it to a minimum time (a
//! RAM disk overwrites itself in well under a second; an emulated slow
//! medium lets initiators and tests see the operation in progress).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use blockwire_pdu::scsi::{Asc, ScsiStatus, Sense, SenseKey, SenseKeySpecific};

use super::logical_unit::LogicalUnit;
use super::outcome::{
    backstore_failure, invalid_cdb, invalid_param, param_length, CmdResult, Done, Failure,
};
use super::range_lock::RangeLock;
use crate::backstore::Backstore;

/// SANITIZE opcode (SBC-4 5.30).
pub(crate) const SANITIZE: u8 = 0x48;
/// Service action: overwrite with a pattern.
pub(crate) const SA_OVERWRITE: u8 = 0x01;
/// Service action: block erase (deallocate every block).
pub(crate) const SA_BLOCK_ERASE: u8 = 0x02;
/// Service action: crypto erase (not supported).
pub(crate) const SA_CRYPTO_ERASE: u8 = 0x03;
/// Service action: leave sanitize failure mode.
pub(crate) const SA_EXIT_FAILURE_MODE: u8 = 0x1f;

/// Bytes an OVERWRITE pass writes at a time (a whole number of blocks for
/// both block sizes), and an erase deallocates at a time: the progress
/// indication moves in these steps.
const OVERWRITE_CHUNK: usize = 1 << 20;
const ERASE_CHUNK: u64 = 64 << 20;

/// How often a SANITIZE with IMMED=0 looks at its task's abort flag.
const WAIT_POLL: Duration = Duration::from_millis(20);

/// The fields of a SANITIZE CDB (SBC-4 5.30).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SanitizeCdb {
    /// IMMED: GOOD once the CDB and parameter list are checked.
    pub immed: bool,
    /// AUSE: EXIT FAILURE MODE may end the failure mode if this one fails.
    pub ause: bool,
    /// SERVICE ACTION.
    pub service_action: u8,
    /// PARAMETER LIST LENGTH.
    pub parameter_list_length: u16,
}

/// Decodes and checks the CDB: reserved bits and bytes must be zero, the
/// service action one this unit knows.
pub(crate) fn parse_cdb(cdb: &[u8]) -> Result<SanitizeCdb, Failure> {
    if cdb.len() < 10 {
        return Err(invalid_cdb(0, None));
    }
    if cdb[1] & 0x40 != 0 {
        return Err(invalid_cdb(1, Some(6)));
    }
    if let Some(i) = (2..7).find(|&i| cdb[i] != 0) {
        return Err(invalid_cdb(i as u16, None));
    }
    let sa = cdb[1] & 0x1f;
    if !matches!(
        sa,
        SA_OVERWRITE | SA_BLOCK_ERASE | SA_CRYPTO_ERASE | SA_EXIT_FAILURE_MODE
    ) {
        return Err(invalid_cdb(1, Some(4)));
    }
    Ok(SanitizeCdb {
        immed: cdb[1] & 0x80 != 0,
        ause: cdb[1] & 0x20 != 0,
        service_action: sa,
        parameter_list_length: u16::from_be_bytes([cdb[7], cdb[8]]),
    })
}

/// What a sanitize operation does to the medium.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Operation {
    /// OVERWRITE: `count` passes writing `pattern` repeated over each
    /// logical block, inverted on every other pass when `invert` is set
    /// (the last pass leaves the pattern itself when the count is odd).
    Overwrite {
        pattern: Vec<u8>,
        invert: bool,
        count: u8,
    },
    /// BLOCK ERASE: every block deallocated (reads back as zeros, LBPRZ=1).
    BlockErase,
}

/// Checks an OVERWRITE parameter list (SBC-4 5.30) of
/// `parameter_list_length` bytes against `block_size`.
pub(crate) fn parse_overwrite(
    parameter_list_length: u16,
    data: &[u8],
    block_size: u32,
) -> Result<Operation, Failure> {
    // SBC-4 5.30: shorter than a 4-byte header and a 1-byte pattern,
    // or longer than a header and one block, is an invalid CDB.
    let len = usize::from(parameter_list_length);
    if len < 5 || len > block_size as usize + 4 {
        return Err(invalid_cdb(7, None));
    }
    let Some(p) = data.get(..len) else {
        return Err(param_length());
    };
    let invert = p[0] & 0x80 != 0;
    if p[0] & 0x60 != 0 {
        // TEST: only 00b (a real sanitize) is honoured.
        return Err(invalid_param(0, Some(6)));
    }
    let count = p[0] & 0x1f;
    if count == 0 {
        return Err(invalid_param(0, Some(4)));
    }
    let pattern_len = usize::from(u16::from_be_bytes([p[2], p[3]]));
    if pattern_len == 0 || pattern_len > block_size as usize || pattern_len + 4 > len {
        return Err(invalid_param(2, None));
    }
    Ok(Operation::Overwrite {
        pattern: p[4..4 + pattern_len].to_vec(),
        invert,
        count,
    })
}

/// One sanitize operation, shared by its worker thread, the logical unit
/// (which reports its progress) and a SANITIZE command waiting for it.
#[derive(Debug)]
pub(crate) struct SanitizeJob {
    /// Work done so far, in 65536ths.
    work: AtomicU32,
    started: Instant,
    /// The operation lasts at least this long.
    min: Duration,
    /// AUSE of the command that started it.
    pub ause: bool,
    outcome: Mutex<Option<Result<(), Failure>>>,
    finished: Condvar,
}

impl SanitizeJob {
    fn new(ause: bool, min: Duration) -> SanitizeJob {
        SanitizeJob {
            work: AtomicU32::new(0),
            started: Instant::now(),
            min,
            ause,
            outcome: Mutex::new(None),
            finished: Condvar::new(),
        }
    }

    /// PROGRESS INDICATION (SPC-5 4.4.2.4.2): the fraction done, in
    /// 65536ths, of the slower of the work and the minimum duration.
    pub fn progress(&self) -> u16 {
        let work = u64::from(self.work.load(Ordering::Relaxed));
        let time = if self.min.is_zero() {
            65536
        } else {
            (self.started.elapsed().as_nanos() * 65536 / self.min.as_nanos()).min(65536) as u64
        };
        work.min(time).min(65535) as u16
    }

    /// The result, once the operation ended.
    pub fn outcome(&self) -> Option<Result<(), Failure>> {
        self.outcome
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Waits at most `limit` for the end; the result if it came.
    pub fn wait(&self, limit: Duration) -> Option<Result<(), Failure>> {
        let g = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        let (g, _) = self
            .finished
            .wait_timeout_while(g, limit, |o| o.is_none())
            .unwrap_or_else(|e| e.into_inner());
        g.clone()
    }

    fn finish(&self, result: Result<(), Failure>) {
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
        self.finished.notify_all();
    }

    fn set_work(&self, done: u64, total: u64) {
        let w = if total == 0 {
            65536
        } else {
            (u128::from(done) * 65536 / u128::from(total)) as u32
        };
        self.work.store(w, Ordering::Relaxed);
    }
}

/// NOT READY, LOGICAL UNIT NOT READY, SANITIZE IN PROGRESS with the
/// progress indication (SBC-4 4.11).
pub(crate) fn in_progress(progress: u16) -> Failure {
    Failure::Check(in_progress_sense(progress))
}

/// The sense data of [`in_progress`], which REQUEST SENSE also returns.
pub(crate) fn in_progress_sense(progress: u16) -> Sense {
    let mut s = Sense::new(SenseKey::NotReady, Asc::LU_NOT_READY_SANITIZE_IN_PROGRESS);
    s.sks = Some(SenseKeySpecific::Progress(progress));
    s
}

/// MEDIUM ERROR, SANITIZE COMMAND FAILED: the unit is in sanitize failure
/// mode (SBC-4 4.11).
pub(crate) fn failure_mode() -> Failure {
    Failure::Check(Sense::new(
        SenseKey::MediumError,
        Asc::SANITIZE_COMMAND_FAILED,
    ))
}

/// The pattern of pass `pass` (0-based) repeated over one logical block,
/// then over a whole chunk of blocks.
fn pass_chunk(pattern: &[u8], invert: bool, pass: u8, block_size: usize) -> Vec<u8> {
    let flip = if invert && pass % 2 == 1 { 0xff } else { 0 };
    let block: Vec<u8> = pattern
        .iter()
        .cycle()
        .take(block_size)
        .map(|b| b ^ flip)
        .collect();
    block.repeat((OVERWRITE_CHUNK / block_size).max(1))
}

/// The work of one operation on `store` (`size` bytes): passes of
/// writes or deallocation, then a flush so the result is durable.
fn run(
    job: &SanitizeJob,
    store: &dyn Backstore,
    size: u64,
    block_size: u32,
    op: &Operation,
) -> Result<(), Failure> {
    let bs = u64::from(block_size);
    match op {
        Operation::Overwrite {
            pattern,
            invert,
            count,
        } => {
            let total = size * u64::from(*count);
            for pass in 0..*count {
                let chunk = pass_chunk(pattern, *invert, pass, block_size as usize);
                let mut at = 0;
                while at < size {
                    let n = (size - at).min(chunk.len() as u64) as usize;
                    store
                        .write_at(at, &chunk[..n])
                        .map_err(|e| backstore_failure(&e, true, at / bs))?;
                    at += n as u64;
                    job.set_work(u64::from(pass) * size + at, total);
                }
            }
        }
        Operation::BlockErase => {
            let mut at = 0;
            while at < size {
                let n = (size - at).min(ERASE_CHUNK);
                store
                    .discard(at, n)
                    .map_err(|e| backstore_failure(&e, true, at / bs))?;
                at += n;
                job.set_work(at, size);
            }
        }
    }
    // Copies of written data kept apart from the medium (an atomic-write
    // journal's finished records) go too (SBC-4 4.11.1).
    store
        .erase_copies()
        .and_then(|()| store.flush())
        .map_err(|e| backstore_failure(&e, true, 0))?;
    job.set_work(1, 1);
    Ok(())
}

/// Protection information of a medium erased or overwritten: every tuple
/// deallocated, FFh, so the new contents are never checked against tuples
/// of the old; durably.
fn discard_tuples(pi_store: Option<&Arc<dyn Backstore>>) -> Result<(), Failure> {
    match pi_store {
        Some(pi) => pi
            .discard(0, pi.size())
            .and_then(|()| pi.flush())
            .map_err(|e| backstore_failure(&e, true, 0)),
        None => Ok(()),
    }
}

/// BLOCK ERASE's work for a command that reports no progress (FORMAT
/// UNIT of a thin unit): every block of `store` and every tuple
/// deallocated, durably. The caller holds the whole medium.
pub(super) fn deallocate_all(
    store: &dyn Backstore,
    pi_store: Option<&Arc<dyn Backstore>>,
    block_size: u32,
) -> Result<(), Failure> {
    let size = store.size() / u64::from(block_size) * u64::from(block_size);
    let unwatched = SanitizeJob::new(false, Duration::ZERO);
    run(&unwatched, store, size, block_size, &Operation::BlockErase)?;
    discard_tuples(pi_store)
}

/// The worker: holds the whole medium in the range lock, does the work,
/// stretches it to the minimum duration, then publishes the result.
fn worker(
    job: Arc<SanitizeJob>,
    store: Arc<dyn Backstore>,
    pi_store: Option<Arc<dyn Backstore>>,
    ranges: Arc<RangeLock>,
    block_size: u32,
    op: Operation,
) {
    let hold = ranges.lock_id(0, u64::MAX, true);
    let size = store.size() / u64::from(block_size) * u64::from(block_size);
    // A panic in the backstore must not leave the unit NOT READY forever.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run(&job, &*store, size, block_size, &op)?;
        discard_tuples(pi_store.as_ref())
    }))
    .unwrap_or_else(|_| Err(super::outcome::internal_failure()));
    ranges.unlock_id(hold);
    if let Err(f) = &result {
        tracing::warn!(failure = ?f, "sanitize operation failed: sanitize failure mode");
    }
    let end = job.started + job.min;
    let now = Instant::now();
    if end > now {
        std::thread::sleep(end - now);
    }
    tracing::info!(ok = result.is_ok(), elapsed = ?job.started.elapsed(), "sanitize operation ended");
    job.finish(result);
}

impl LogicalUnit {
    /// Whether BLOCK ERASE is offered: the unit is thin provisioned, so
    /// deallocated blocks read back as zeros (LBPRZ=1) and GET LBA STATUS
    /// shows them deallocated afterwards.
    pub(crate) fn offers_block_erase(&self) -> bool {
        self.cfg.thin_provisioning
    }

    /// Whether REPORT SUPPORTED OPERATION CODES lists this command of the
    /// core's table for this unit.
    pub(crate) fn offers(&self, opcode: u8, service_action: Option<u16>) -> bool {
        match (opcode, service_action) {
            (SANITIZE, Some(sa)) if sa == u16::from(SA_BLOCK_ERASE) => self.offers_block_erase(),
            (blockwire_pdu::scsi::opcode::WRITE_ATOMIC_16, None) => self.atomic_max_blocks() > 0,
            // A unit without thin provisioning answers UNMAP INVALID
            // COMMAND OPERATION CODE: it does not list it either (SPC-4
            // REPORT SUPPORTED OPERATION CODES).
            (blockwire_pdu::scsi::opcode::UNMAP, None) => self.cfg.thin_provisioning,
            _ => true,
        }
    }

    /// SANITIZE (the unit is known to be ready: no operation running, the
    /// medium present).
    pub(crate) fn sanitize(&self, cdb: &[u8], data_out: &[u8]) -> CmdResult {
        let c = parse_cdb(cdb)?;
        let op = match c.service_action {
            SA_OVERWRITE => {
                parse_overwrite(c.parameter_list_length, data_out, self.cfg.block_size)?
            }
            SA_CRYPTO_ERASE => {
                tracing::info!("SANITIZE CRYPTO ERASE refused: the medium is not encrypted");
                return Err(invalid_cdb(1, Some(4)));
            }
            SA_BLOCK_ERASE if !self.offers_block_erase() => {
                tracing::info!("SANITIZE BLOCK ERASE refused: the unit is not thin provisioned");
                return Err(invalid_cdb(1, Some(4)));
            }
            // BLOCK ERASE and EXIT FAILURE MODE take no parameter list.
            _ if c.parameter_list_length != 0 => return Err(invalid_cdb(7, None)),
            SA_BLOCK_ERASE => Operation::BlockErase,
            _ => return self.exit_failure_mode(),
        };
        self.check_writable()?;
        let job = Arc::new(SanitizeJob::new(c.ause, self.cfg.sanitize_min_duration));
        {
            let mut st = self.lock();
            if let Some(running) = &st.sanitize {
                // Another SANITIZE started since this one was checked.
                return Err(in_progress(running.progress()));
            }
            st.sanitize = Some(job.clone());
        }
        tracing::info!(
            service_action = c.service_action,
            immed = c.immed,
            "sanitize operation started"
        );
        let (store, pi_store, ranges, bs) = (
            self.cfg.backstore.clone(),
            self.cfg.pi_store.clone(),
            self.ranges.clone(),
            self.cfg.block_size,
        );
        let spawned = {
            let job = job.clone();
            std::thread::Builder::new()
                .name("sanitize".into())
                .spawn(move || worker(job, store, pi_store, ranges, bs, op))
        };
        let worker_thread = match spawned {
            Ok(handle) => Some(handle),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the sanitize thread");
                job.finish(Err(super::outcome::internal_failure()));
                None
            }
        };
        if c.immed {
            // The operation runs on, its thread detached.
            return Ok(Done::none());
        }
        loop {
            if let Some(result) = job.wait(WAIT_POLL) {
                // The worker publishes its result as its last step: it is
                // joined here, so no thread of a SANITIZE that answered
                // still holds the medium or is still exiting.
                if let Some(handle) = worker_thread {
                    let _ = handle.join();
                }
                return result.map(|()| Done::none());
            }
            if super::stall::task_aborted() {
                // The command goes, the operation goes on (SBC-4 4.11).
                return Ok(Done {
                    status: ScsiStatus::TASK_ABORTED.0,
                    ..Done::default()
                });
            }
        }
    }

    /// EXIT FAILURE MODE: leaves sanitize failure mode if the failed
    /// operation allowed it (AUSE=1); refused otherwise (SBC-4 5.30).
    /// Outside failure mode there is nothing to leave.
    fn exit_failure_mode(&self) -> CmdResult {
        let mut st = self.lock();
        match st.sanitize_failed {
            Some(false) => Err(invalid_cdb(1, Some(4))),
            Some(true) => {
                st.sanitize_failed = None;
                tracing::info!("sanitize failure mode left by EXIT FAILURE MODE");
                Ok(Done::none())
            }
            None => Ok(Done::none()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cdb(sa: u8, len: u16) -> [u8; 10] {
        let [h, l] = len.to_be_bytes();
        [SANITIZE, sa, 0, 0, 0, 0, 0, h, l, 0]
    }

    #[test]
    fn cdb_reserved_fields_and_service_actions() {
        assert_eq!(parse_cdb(&cdb(1, 8)).unwrap().parameter_list_length, 8);
        let mut c = cdb(0x80 | 0x20 | 2, 0);
        let p = parse_cdb(&c).unwrap();
        assert!(p.immed && p.ause && p.service_action == 2);
        c[1] |= 0x40;
        assert_eq!(parse_cdb(&c), Err(invalid_cdb(1, Some(6))));
        for i in 2..7 {
            let mut c = cdb(1, 8);
            c[i] = i as u8;
            assert_eq!(parse_cdb(&c), Err(invalid_cdb(i as u16, None)));
        }
        for sa in (0..0x20).filter(|sa| ![1, 2, 3, 0x1f].contains(sa)) {
            assert_eq!(parse_cdb(&cdb(sa, 0)), Err(invalid_cdb(1, Some(4))));
        }
        assert!(parse_cdb(&cdb(1, 8)[..9]).is_err());
    }

    #[test]
    fn overwrite_parameter_list() {
        let mut p = vec![0x01, 0, 0, 4, 1, 2, 3, 4];
        assert_eq!(
            parse_overwrite(8, &p, 512),
            Ok(Operation::Overwrite {
                pattern: vec![1, 2, 3, 4],
                invert: false,
                count: 1
            })
        );
        for len in 0..5 {
            assert_eq!(parse_overwrite(len, &p, 512), Err(invalid_cdb(7, None)));
        }
        assert_eq!(
            parse_overwrite(517, &[0; 520], 512),
            Err(invalid_cdb(7, None))
        );
        assert_eq!(parse_overwrite(8, &p[..6], 512), Err(param_length()));
        p[0] = 0x80 | 3;
        assert!(matches!(
            parse_overwrite(8, &p, 512),
            Ok(Operation::Overwrite {
                invert: true,
                count: 3,
                ..
            })
        ));
        p[0] = 0;
        assert_eq!(parse_overwrite(8, &p, 512), Err(invalid_param(0, Some(4))));
        p[0] = 0x21;
        assert_eq!(parse_overwrite(8, &p, 512), Err(invalid_param(0, Some(6))));
        p[0] = 1;
        p[3] = 0;
        assert_eq!(parse_overwrite(8, &p, 512), Err(invalid_param(2, None)));
        p[3] = 5;
        assert_eq!(parse_overwrite(8, &p, 512), Err(invalid_param(2, None)));
        let mut big = vec![0u8; 516];
        big[0] = 1;
        big[2..4].copy_from_slice(&516u16.to_be_bytes());
        assert_eq!(parse_overwrite(516, &big, 512), Err(invalid_param(2, None)));
    }

    #[test]
    fn passes_invert_every_other_one() {
        let a = pass_chunk(&[0x0f, 0xf0, 0x55], true, 0, 512);
        let b = pass_chunk(&[0x0f, 0xf0, 0x55], true, 1, 512);
        assert_eq!(a.len() % 512, 0);
        assert_eq!(&a[..4], &[0x0f, 0xf0, 0x55, 0x0f]);
        // Every block starts the pattern again.
        assert_eq!(&a[512..515], &[0x0f, 0xf0, 0x55]);
        assert!(a.iter().zip(&b).all(|(x, y)| x ^ y == 0xff));
        assert_eq!(pass_chunk(&[7], false, 1, 4096)[..4096], [7; 4096]);
    }

    #[test]
    fn progress_is_the_slower_of_work_and_time() {
        let job = SanitizeJob::new(false, Duration::ZERO);
        assert_eq!(job.progress(), 0);
        job.set_work(1, 4);
        assert_eq!(job.progress(), 16384);
        job.set_work(4, 4);
        assert_eq!(job.progress(), 65535);
        let slow = SanitizeJob::new(false, Duration::from_secs(3600));
        slow.set_work(1, 1);
        assert!(slow.progress() < 100);
    }
}
