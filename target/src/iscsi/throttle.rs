//! Waiting out a LUN's quality-of-service ceilings (see
//! [`crate::scsi::qos`]) before a command starts.
//!
//! The connection's machine books each media command with its unit's gate
//! as the command arrives, and the core says how long it must wait. A
//! WRITE whose data the target must still ask for (by R2T, or read by
//! RDMA) waits in the machine, its data not yet asked for (so it holds
//! neither write budget nor buffer); any
//! other command waits here, on the runtime's timers, before its road
//! (core, sendfile, I/O engine, pipelined WRITE) starts. So every road and
//! every wire (TCP, RDMA-assisted, iSER) is held to the same ceiling, and a
//! throttled command holds no thread. A task aborted while it waits (ABORT
//! TASK, LUN RESET, PREEMPT AND ABORT, its connection gone) stops waiting
//! within [`crate::scsi::stall::POLL`], never starts, and gives its booked
//! place back so it does not hold later commands back. A booked command
//! counts as waiting at its unit until it starts or goes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_pdu::pdu::ScsiCommand;

use crate::scsi::qos::{LunTurn, Reservation};
use crate::scsi::stall::{is_media_command, POLL};
use crate::scsi::stats::IoStats;
use crate::scsi::{LogicalUnit, LunTable};

/// A command's booked place at a LUN whose ceilings hold it back: first
/// at its initiator's own ceilings when the LUN sets them, then at the
/// LUN's, once its initiator has no more than
/// [`LOOKAHEAD`](crate::scsi::qos::LOOKAHEAD) booked ahead there.
#[derive(Debug)]
pub(super) struct Throttle {
    unit: Arc<LogicalUnit>,
    /// The bytes it moves (to book at the LUN when its first wait ends).
    bytes: u64,
    /// Its initiator's name, to take its turn at the LUN under.
    initiator: Arc<str>,
    /// Its place at its initiator's ceilings, while it still has to book
    /// at the LUN's.
    at_initiator: Option<Reservation>,
    /// Its place at the LUN's ceilings, once booked there.
    at_lun: Option<Reservation>,
    /// Its place in its initiator's line at the LUN while it is told to
    /// come back ([`LunTurn::NotYet`]).
    ticket: Option<u64>,
    /// Its initiator's counters on the target, where its waits are
    /// counted too (None: not kept, as for discovery).
    initiator_io: Option<Arc<IoStats>>,
    /// When the current wait ends.
    due: Instant,
    /// The latest `now` it was booked or advanced at, on the clock its
    /// bookings are made with (the connection's).
    last_now: Instant,
    /// The command started (or was never going to): nothing to give back.
    settled: bool,
}

impl Throttle {
    /// Books `cmd` (with `cdb`) of `initiator` (whose counters are
    /// `initiator_io`), arriving at `now`, at its LUN in `luns`: `None` when
    /// it may start at once (not a media command, a LUN without ceilings or
    /// unknown, or a place free now).
    pub fn book(
        luns: &LunTable,
        cmd: &ScsiCommand,
        cdb: &[u8],
        initiator: &str,
        initiator_io: Option<&Arc<IoStats>>,
        now: Instant,
    ) -> Option<Throttle> {
        if !is_media_command(cdb) {
            return None;
        }
        let unit = luns.get(cmd.lun.index()?)?;
        let bytes = u64::from(cmd.expected_data_transfer_length);
        let gate = unit.qos();
        let first = gate.reserve_for(initiator, now, bytes);
        let first_wait = first.as_ref().map_or(Duration::ZERO, |r| r.wait);
        let mut ticket = None;
        let (at_lun, due) = if first_wait.is_zero() {
            match gate.turn_at_lun(initiator, now, bytes, false, &mut ticket)? {
                LunTurn::Booked(r) if r.wait.is_zero() => return None,
                LunTurn::Booked(r) => {
                    let due = now + r.wait;
                    (Some(r), due)
                }
                LunTurn::NotYet(until) => (None, until),
            }
        } else {
            (None, now + first_wait)
        };
        gate.begin_wait();
        count_wait(initiator_io, due - now, true);
        Some(Throttle {
            unit,
            bytes,
            initiator: Arc::from(initiator),
            // Its initiator's place, taken at once or not, stays with it: a
            // command aborted while it waits at the LUN gives both back.
            at_initiator: first,
            at_lun,
            ticket,
            initiator_io: initiator_io.cloned(),
            due,
            last_now: now,
            settled: false,
        })
    }

    /// When the current wait ends.
    pub fn due(&self) -> Instant {
        self.due
    }

    /// The current wait ended at `now`: `None` when the command may start,
    /// or when its next wait (at the LUN's ceilings, after its initiator's
    /// or while its initiator has enough booked there) ends.
    pub fn advance(&mut self, now: Instant) -> Option<Instant> {
        if self.at_lun.is_some() {
            return None;
        }
        self.last_now = now;
        let due = match self.unit.qos().turn_at_lun(
            &self.initiator,
            now,
            self.bytes,
            true,
            &mut self.ticket,
        )? {
            LunTurn::Booked(r) => {
                let due = now + r.wait;
                self.at_lun = Some(r);
                due
            }
            LunTurn::NotYet(until) => until,
        };
        count_wait(self.initiator_io.as_ref(), due - now, false);
        if due <= now {
            return None;
        }
        self.due = due;
        Some(due)
    }

    /// The wait is over and the command goes on (its place is kept).
    pub fn settle(mut self) {
        self.settled = true;
    }

    /// How long the command waits from its latest booking (for a fresh
    /// one, its first wait).
    #[cfg(test)]
    pub fn wait(&self) -> Duration {
        self.due.saturating_duration_since(self.last_now)
    }

    /// Waits out the booked place; false if the task was aborted meanwhile
    /// (its place is given back, and the command must not start).
    pub async fn wait_out(mut self, aborted: &AtomicBool) -> bool {
        // Booked as the command arrived, a moment ago: its whole wait from
        // now, timed by the runtime's clock. Its next turn is asked for on
        // the clock it was booked with, run on by as much as the runtime's
        // ran: the two may differ (a connection driven on a clock of its
        // own), and a turn asked for at another clock's `now` would book a
        // place on a schedule kept in the first one.
        let booked_now = self.last_now;
        let started = tokio::time::Instant::now();
        let mut wait = self.due.saturating_duration_since(booked_now);
        loop {
            let until = tokio::time::Instant::now() + wait;
            loop {
                if aborted.load(Ordering::SeqCst) {
                    return false;
                }
                let now = tokio::time::Instant::now();
                if now >= until {
                    break;
                }
                tokio::time::sleep_until(until.min(now + POLL)).await;
            }
            let now = booked_now + started.elapsed();
            match self.advance(now) {
                None => break,
                Some(due) => wait = due - now,
            }
        }
        self.settled = true;
        true
    }
}

/// Counts a command's wait on its initiator's counters, when there are
/// any (see [`QosDelays::count`](crate::scsi::stats::QosDelays::count)).
fn count_wait(initiator_io: Option<&Arc<IoStats>>, wait: Duration, first: bool) {
    if let Some(io) = initiator_io {
        io.qos.count(wait, first);
    }
}

impl Drop for Throttle {
    /// An unsettled booking is given back: the task was aborted, or its
    /// future dropped with the connection, before the command started.
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.unit.qos().leave_line(&self.initiator, ticket);
        }
        if !self.settled {
            for booked in [&self.at_initiator, &self.at_lun].into_iter().flatten() {
                self.unit.qos().cancel(booked);
            }
        }
        self.unit.qos().end_wait();
    }
}

/// `fut` (a command's road), after `throttle`'s wait when there is one;
/// the command never starts if its task (`aborted`) is aborted first.
pub(super) async fn after_wait(
    throttle: Option<Throttle>,
    aborted: Arc<AtomicBool>,
    fut: impl std::future::Future<Output = ()>,
) {
    if let Some(t) = throttle {
        if !t.wait_out(&aborted).await {
            tracing::debug!(
                "a command held by its LUN's QoS ceiling was aborted before it started"
            );
            return;
        }
    }
    fut.await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backstore::RamBackstore;
    use crate::scsi::qos::LOOKAHEAD;
    use crate::scsi::{LuConfig, QosLimits};
    use blockwire_pdu::pdu::Lun;
    use std::time::Duration;

    const HOST: &str = "iqn.2026-11.io.blockwire:host";

    fn read_of(lun: u16, bytes: u32) -> (ScsiCommand, Vec<u8>) {
        let cdb = vec![0x28, 0, 0, 0, 0, 0, 0, 0, (bytes / 512) as u8, 0];
        let mut cdb16 = [0u8; 16];
        cdb16[..10].copy_from_slice(&cdb);
        let cmd = ScsiCommand {
            immediate: false,
            final_bit: true,
            read: true,
            write: false,
            attr: blockwire_pdu::pdu::codes::TaskAttr::Simple,
            lun: Lun::from_index(lun),
            itt: 1,
            expected_data_transfer_length: bytes,
            cmd_sn: 0,
            exp_stat_sn: 0,
            cdb: cdb16,
        };
        (cmd, cdb)
    }

    /// Whether a command held by `held`, never aborted, ran after its wait.
    async fn runs_after_its_wait(held: Throttle) -> bool {
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        after_wait(Some(held), Arc::new(AtomicBool::new(false)), async move {
            r.store(true, Ordering::SeqCst)
        })
        .await;
        ran.load(Ordering::SeqCst)
    }

    fn table(limits: QosLimits) -> LunTable {
        let mut cfg = LuConfig::new(Arc::new(RamBackstore::new(1 << 20)));
        cfg.qos = limits;
        LunTable::new(vec![(0, Arc::new(LogicalUnit::new(cfg)))])
    }

    /// A unit whose initiators are each held to 10 IOPS, and the LUN too.
    fn each_host_and_the_lun_at_10_iops() -> LunTable {
        table(QosLimits {
            iops: Some(10),
            initiator_iops: Some(10),
            ..Default::default()
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_on_a_clock_of_its_own_waits_only_for_its_turn() {
        // The connection books on a clock of its own, 300 s ahead of the
        // runtime's (as a connection driven on a virtual clock is).
        let t = each_host_and_the_lun_at_10_iops();
        let (cmd, cdb) = read_of(0, 4096);
        let connection_now = Instant::now() + Duration::from_secs(300);
        assert!(Throttle::book(&t, &cmd, &cdb, HOST, None, connection_now).is_none());
        let held = Throttle::book(&t, &cmd, &cdb, HOST, None, connection_now)
            .expect("over the host's ceiling");
        // After its wait at the host's ceiling it asks for its turn at the
        // LUN's on the connection's clock, where the LUN's schedule is: a
        // turn asked for at the runtime's `now` would wait the 300 s.
        let started = tokio::time::Instant::now();
        assert!(runs_after_its_wait(held).await);
        let waited = started.elapsed();
        assert!(
            waited < Duration::from_secs(1),
            "waited {waited:?} of the runtime's (paused) clock"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_command_over_the_ceiling_starts_when_its_place_comes() {
        let t = table(QosLimits {
            iops: Some(10),
            bytes_per_sec: None,
            ..Default::default()
        });
        let (cmd, cdb) = read_of(0, 4096);
        // The burst (50 ms at 10 IOPS) lets one through.
        assert!(Throttle::book(&t, &cmd, &cdb, HOST, None, Instant::now()).is_none());
        let held =
            Throttle::book(&t, &cmd, &cdb, HOST, None, Instant::now()).expect("over the ceiling");
        // Booked on the real clock: a moment after the first.
        let wait = held.wait();
        assert!(
            wait > Duration::from_millis(40) && wait <= Duration::from_millis(50),
            "{wait:?}"
        );
        let t0 = tokio::time::Instant::now();
        assert!(runs_after_its_wait(held).await);
        // Tokio's timers tick in whole milliseconds.
        let waited = t0.elapsed();
        assert!(
            waited >= wait && waited <= wait + Duration::from_millis(1),
            "{waited:?}"
        );
        // INQUIRY is not a media command: never held.
        let inquiry = [0x12u8, 0, 0, 0, 36, 0];
        assert!(Throttle::book(&t, &cmd, &inquiry, HOST, None, Instant::now()).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn an_aborted_command_never_starts_and_gives_its_place_back() {
        let t = table(QosLimits {
            iops: Some(1),
            bytes_per_sec: None,
            ..Default::default()
        });
        let (cmd, cdb) = read_of(0, 512);
        assert!(Throttle::book(&t, &cmd, &cdb, HOST, None, Instant::now()).is_none());
        let held =
            Throttle::book(&t, &cmd, &cdb, HOST, None, Instant::now()).expect("over the ceiling");
        assert!(
            held.wait() > Duration::from_millis(900),
            "{:?}",
            held.wait()
        );
        let aborted = Arc::new(AtomicBool::new(false));
        let ran = Arc::new(AtomicBool::new(false));
        let (a, r) = (aborted.clone(), ran.clone());
        let task = tokio::spawn(after_wait(Some(held), a, async move {
            r.store(true, Ordering::SeqCst)
        }));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(t.get(0).unwrap().qos().counters().waiting, 1);
        aborted.store(true, Ordering::SeqCst);
        let t0 = tokio::time::Instant::now();
        task.await.unwrap();
        assert!(t0.elapsed() <= POLL, "the abort was seen within a poll");
        assert!(!ran.load(Ordering::SeqCst), "an aborted command started");
        assert_eq!(t.get(0).unwrap().qos().counters().waiting, 0);
        // Its place was given back: the next command waits as the second did.
        let next = Throttle::book(&t, &cmd, &cdb, HOST, None, Instant::now())
            .expect("still over the ceiling");
        assert!(
            next.wait() <= Duration::from_millis(950),
            "{:?}",
            next.wait()
        );
        // A dropped booking (its connection gone) is given back too.
        let before = next.wait();
        drop(next);
        let again = Throttle::book(&t, &cmd, &cdb, HOST, None, Instant::now()).unwrap();
        assert!(
            again.wait() <= before,
            "{:?} after {before:?}",
            again.wait()
        );
    }

    #[tokio::test]
    async fn a_command_waits_for_its_initiators_turn_and_then_the_luns() {
        let t = each_host_and_the_lun_at_10_iops();
        let gate = t.get(0).unwrap();
        let t0 = Instant::now();
        // This host's last command 100 ms ahead, another host's two at the
        // LUN 200 ms ahead.
        gate.qos().reserve_for(HOST, t0, 0);
        gate.qos().reserve(t0, 0);
        gate.qos().reserve(t0, 0);
        // The other host's second command waited 50 ms.
        let others = gate.qos().counters().delay_ns;
        assert_eq!(others, 50_000_000);
        let (cmd, cdb) = read_of(0, 512);
        let host_io = Arc::new(IoStats::default());
        let held = Throttle::book(&t, &cmd, &cdb, HOST, Some(&host_io), t0)
            .expect("over its host's ceiling");
        assert_eq!(held.due(), t0 + Duration::from_millis(50));
        assert!(runs_after_its_wait(held).await);
        // Booked at the LUN at 50 ms, its turn there came at 150 ms.
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_millis(150) && waited < Duration::from_secs(1),
            "{waited:?}"
        );
        assert_eq!(gate.qos().counters().waiting, 0);
        // On its initiator's counters: one delayed command, both its waits
        // (as the LUN counted them).
        let lun = gate.qos().counters();
        assert_eq!(host_io.qos.delayed(), 1);
        assert_eq!(lun.delayed, 2);
        assert_eq!(
            host_io.qos.delay().as_nanos(),
            u128::from(lun.delay_ns - others)
        );
        assert!(
            host_io.qos.delay() >= Duration::from_millis(140),
            "{:?}",
            host_io.qos.delay()
        );
    }

    #[tokio::test]
    async fn a_busy_initiators_queue_comes_back_for_its_turns_and_another_waits_for_none_of_it() {
        let t = table(QosLimits {
            iops: Some(1000),
            ..Default::default()
        });
        let (cmd, cdb) = read_of(0, 512);
        let t0 = Instant::now();
        // 100 at once: the burst (50 ms at 1 ms a command) lets 51 start;
        // 6 more are booked up to the look-ahead, 43 told to come back.
        let held: Vec<Throttle> = (0..100)
            .filter_map(|_| Throttle::book(&t, &cmd, &cdb, HOST, None, t0))
            .collect();
        assert_eq!(held.len(), 49);
        assert_eq!(held.iter().filter(|h| h.at_lun.is_some()).count(), 6);
        // Another host's command waits behind those six, not the 43.
        let other = Throttle::book(&t, &cmd, &cdb, "iqn.2026-11.io.blockwire:other", None, t0)
            .expect("behind the busy host's bookings");
        assert_eq!(other.wait(), LOOKAHEAD + Duration::from_millis(2));
        // Every one of them runs, each after its turn at the LUN.
        let tasks: Vec<_> = held
            .into_iter()
            .chain([other])
            .map(|h| tokio::spawn(runs_after_its_wait(h)))
            .collect();
        for task in tasks {
            assert!(task.await.unwrap());
        }
        assert!(
            t0.elapsed() >= Duration::from_millis(43),
            "{:?}",
            t0.elapsed()
        );
        assert_eq!(t.get(0).unwrap().qos().counters().waiting, 0);
    }

    #[tokio::test]
    async fn a_command_aborted_at_the_luns_gate_gives_its_initiators_place_back_too() {
        let t = each_host_and_the_lun_at_10_iops();
        let gate = t.get(0).unwrap();
        let t0 = Instant::now();
        // Another host's two commands at the LUN, 200 ms ahead.
        gate.qos().reserve(t0, 0);
        gate.qos().reserve(t0, 0);
        let (cmd, cdb) = read_of(0, 512);
        // This host's own schedule is empty: it passes its gate at once and
        // waits at the LUN's.
        let held = Throttle::book(&t, &cmd, &cdb, HOST, None, t0).expect("over the LUN's ceiling");
        assert_eq!(held.due(), t0 + Duration::from_millis(150));
        // Aborted before its turn (dropped unsettled, as `wait_out` does).
        drop(held);
        assert_eq!(gate.qos().counters().waiting, 0);
        // Its place at this host's ceiling was given back: the host's next
        // command passes its own gate at once, as the aborted one did.
        let next = gate.qos().reserve_for(HOST, t0, 0).expect("ceiling set");
        assert_eq!(next.wait, Duration::ZERO, "the host's place was kept");
        // And the LUN's place too: the next command there waits as the
        // aborted one did.
        let lun = gate.qos().reserve(t0, 0).expect("ceiling set");
        assert_eq!(lun.wait, Duration::from_millis(150));
    }
}
