//! Which failed SCSI commands are sent again, and when: the policy every
//! transport's `execute` shares (TCP, RDMA-assisted offload, iSER), so a
//! command gets the same second chances whichever way its data moves.
//!
//! As the Linux SCSI midlayer does, a UNIT ATTENTION is retried at once, up
//! to four times: it reports an event (a reset, a changed mode page), not a
//! fault of the command, which the device server did not run (SAM-5 5.14).
//! BUSY and TASK SET FULL (SAM-5 5.3) say the target could not take the
//! command now and did nothing of it: retried after a pause that grows
//! from 10 ms to 500 ms, for up to [`BUSY_RETRY_FOR`] from the first.
//! TASK ABORTED (SAM-5 5.3.1: another I_T nexus aborted the command, as a
//! LOGICAL UNIT RESET or PREEMPT AND ABORT from another cluster node does
//! where the unit's TAS bit is one) did not complete the command: it is
//! retried at once, up to four times, as the midlayer retries it.
//! A deferred error (sense response code 71h/73h, SPC-4 4.5.5) is an
//! earlier command's failure reported on this one, which the device server
//! did not process: it is logged as an error naming the unit, and the
//! command retried at once, up to four times, as the midlayer does; the
//! next SYNCHRONIZE CACHE of the unit fails with it ([`DeferredErrors`]),
//! where the midlayer lets it go.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blockwire_pdu::scsi::{ScsiStatus, SenseKey};

use crate::{Error, ScsiError};

/// How long a command is retried while the target answers BUSY or TASK
/// SET FULL, counted from the first such answer: the Linux SCSI disk's
/// default command timeout.
pub const BUSY_RETRY_FOR: Duration = Duration::from_secs(30);

/// UNIT ATTENTIONs, TASK ABORTED answers and deferred errors each retried
/// per command.
const AT_ONCE_RETRIES: u32 = 4;

/// [`Next::Now`] while `count` (one kind of answer's retries so far) is
/// below [`AT_ONCE_RETRIES`], counting this one; [`Next::GiveUp`] after.
fn at_once(count: &mut u32) -> Next {
    if *count < AT_ONCE_RETRIES {
        *count += 1;
        Next::Now
    } else {
        Next::GiveUp
    }
}

/// What to do after a command failed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Send it again now.
    Now,
    /// Send it again after this pause.
    After(Duration),
    /// Return the error.
    GiveUp,
}

/// One command's retries.
#[derive(Default)]
pub(crate) struct Retries {
    attentions: u32,
    aborted: u32,
    deferred: u32,
    /// Where a deferred error heard is kept for the unit's next flush
    /// (the session's; none for sessions without one).
    keep_deferred: Option<Arc<DeferredErrors>>,
    // From the first BUSY: time spent before on other answers is not the
    // target's being busy.
    busy: Option<Backoff>,
}

impl Retries {
    /// Retries whose deferred errors go to `kept` (see [`DeferredErrors`]).
    pub(crate) fn keeping_deferred_errors_in(kept: Arc<DeferredErrors>) -> Retries {
        Retries {
            keep_deferred: Some(kept),
            ..Retries::default()
        }
    }

    /// Whether, and when, to send the command again after `e`.
    pub(crate) fn after(&mut self, e: &Error) -> Next {
        let Error::Scsi(e) = e else {
            return Next::GiveUp;
        };
        if let Some(sense) = e.sense.as_ref().filter(|s| s.deferred) {
            if let Some(kept) = &self.keep_deferred {
                kept.note(e);
            }
            tracing::error!(
                lun = e.lun,
                %sense,
                "deferred error: an earlier command to this LUN failed after it was answered \
                 (data it wrote may be lost); the command that heard of it is sent again"
            );
            return at_once(&mut self.deferred);
        }
        if e.sense.as_ref().map(|s| s.key) == Some(SenseKey::UnitAttention) {
            return at_once(&mut self.attentions);
        }
        if e.status == ScsiStatus::TASK_ABORTED {
            return at_once(&mut self.aborted);
        }
        if matches!(e.status, ScsiStatus::BUSY | ScsiStatus::TASK_SET_FULL) {
            let backoff = self
                .busy
                .get_or_insert_with(|| Backoff::new(BUSY_RETRY_FOR));
            return backoff.next_pause().map_or(Next::GiveUp, Next::After);
        }
        Next::GiveUp
    }

    /// [`Retries::after`] for a command loop: true after sleeping out the
    /// pause when the command is to be sent again.
    pub(crate) async fn again_after(&mut self, e: &Error) -> bool {
        match self.after(e) {
            Next::Now => true,
            Next::After(pause) => {
                tokio::time::sleep(pause).await;
                true
            }
            Next::GiveUp => false,
        }
    }
}

/// The deferred errors a session heard, per LUN, that no SYNCHRONIZE
/// CACHE has reported yet. A deferred error says an earlier command,
/// already answered GOOD, failed (SPC-4 4.5.5): a WRITE the cache took and
/// could not write back. The command that heard of it is sent again, and
/// its caller is not the one to tell; the next flush of the LUN is, since
/// a flush is how a caller asks whether what it wrote is on the medium.
#[derive(Default)]
pub(crate) struct DeferredErrors(Mutex<HashMap<u16, ScsiError>>);

impl DeferredErrors {
    /// Keeps `e`, a deferred error (the first of its LUN until a flush
    /// takes it).
    fn note(&self, e: &ScsiError) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(e.lun)
            .or_insert_with(|| e.clone());
    }

    /// The deferred error of `lun` not yet reported, taken.
    pub(crate) fn take(&self, lun: u16) -> Option<ScsiError> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&lun)
    }
}

/// Pauses between retries of a busy target: 10 ms, doubling to 500 ms,
/// until a time limit.
struct Backoff {
    next: Duration,
    until: tokio::time::Instant,
}

impl Backoff {
    fn new(limit: Duration) -> Backoff {
        Backoff {
            next: Duration::from_millis(10),
            until: tokio::time::Instant::now() + limit,
        }
    }

    /// The pause before the next attempt; None once the limit is reached.
    fn next_pause(&mut self) -> Option<Duration> {
        self.pause_at(tokio::time::Instant::now())
    }

    /// [`Backoff::next_pause`] at `now`.
    fn pause_at(&mut self, now: tokio::time::Instant) -> Option<Duration> {
        if now >= self.until {
            return None;
        }
        let pause = self.next.min(self.until - now);
        self.next = (self.next * 2).min(Duration::from_millis(500));
        Some(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ScsiError;

    /// Retries of a busy target pause 10 ms, doubling to 500 ms, and stop
    /// at the limit (the last pause cut to what is left of it).
    #[test]
    fn busy_retries_back_off_and_stop_at_their_limit() {
        let mut b = Backoff::new(Duration::from_secs(2));
        let mut now = b.until - Duration::from_secs(2);
        let mut pauses = Vec::new();
        while let Some(p) = b.pause_at(now) {
            pauses.push(p.as_millis());
            now += p;
        }
        assert_eq!(pauses, [10, 20, 40, 80, 160, 320, 500, 500, 370]);
        assert!(Backoff::new(Duration::ZERO).next_pause().is_none());
    }

    fn failed(status: ScsiStatus, key: Option<SenseKey>) -> Error {
        Error::Scsi(ScsiError {
            lun: 0,
            opcode: 0x8a,
            status,
            sense: key.map(|k| blockwire_pdu::scsi::Sense::new(k, Asc::new(0x29, 0))),
        })
    }

    use blockwire_pdu::scsi::Asc;

    /// Four UNIT ATTENTIONs are retried at once; the fifth is returned.
    #[test]
    fn unit_attentions_are_retried_four_times_at_once() {
        let mut r = Retries::default();
        let ua = failed(ScsiStatus::CHECK_CONDITION, Some(SenseKey::UnitAttention));
        let got: Vec<Next> = (0..5).map(|_| r.after(&ua)).collect();
        assert_eq!(
            got,
            [Next::Now, Next::Now, Next::Now, Next::Now, Next::GiveUp]
        );
    }

    /// A command another nexus aborted (TASK ABORTED, TAS=1) is sent again
    /// at once, four times; the fifth answer is returned. It failed the
    /// caller's I/O at the first.
    #[test]
    fn commands_another_nexus_aborted_are_retried_four_times_at_once() {
        let mut r = Retries::default();
        let aborted = failed(ScsiStatus::TASK_ABORTED, None);
        let got: Vec<Next> = (0..5).map(|_| r.after(&aborted)).collect();
        assert_eq!(
            got,
            [Next::Now, Next::Now, Next::Now, Next::Now, Next::GiveUp]
        );
    }

    /// A deferred error (an earlier command's, SPC-4 4.5.5) is not this
    /// command's: it is sent again at once, four times at most. It failed
    /// the command that heard of it, though that command never ran.
    #[test]
    fn deferred_errors_are_not_the_commands_own() {
        let mut r = Retries::default();
        let Error::Scsi(mut e) = failed(ScsiStatus::CHECK_CONDITION, Some(SenseKey::MediumError))
        else {
            unreachable!()
        };
        e.sense.as_mut().unwrap().deferred = true;
        let deferred = Error::Scsi(e);
        let got: Vec<Next> = (0..5).map(|_| r.after(&deferred)).collect();
        assert_eq!(
            got,
            [Next::Now, Next::Now, Next::Now, Next::Now, Next::GiveUp]
        );
    }

    /// BUSY and TASK SET FULL share one growing pause; what else fails is
    /// returned at once: the command may have run (a MEDIUM ERROR, a lost
    /// connection) or will fail the same way again.
    #[test]
    fn busy_pauses_grow_and_other_failures_are_returned() {
        let mut r = Retries::default();
        let busy = failed(ScsiStatus::BUSY, None);
        let full = failed(ScsiStatus::TASK_SET_FULL, None);
        let p1 = r.after(&busy);
        let p2 = r.after(&full);
        assert!(
            matches!(p1, Next::After(d) if d <= Duration::from_millis(10)),
            "{p1:?}"
        );
        assert!(
            matches!(p2, Next::After(d) if d > Duration::from_millis(10)),
            "{p2:?}"
        );
        let medium = failed(ScsiStatus::CHECK_CONDITION, Some(SenseKey::MediumError));
        assert_eq!(r.after(&medium), Next::GiveUp);
        assert_eq!(
            r.after(&failed(ScsiStatus::RESERVATION_CONFLICT, None)),
            Next::GiveUp
        );
        assert_eq!(r.after(&Error::Closed), Next::GiveUp);
    }
}
