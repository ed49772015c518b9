//! Quality of service of a logical unit: a ceiling on the media commands per
//! second and on the bytes per second they move, so that one busy initiator
//! on a shared target cannot take every other LUN's share of the disks and
//! the network (a noisy neighbour).
//!
//! The gate is a scheduler, not a waiter: [`QosGate::turn_at_lun`] says how
//! long a command must wait before it may start and books its place, and the
//! fabric does the waiting (on its own timers, not on a blocking thread, so
//! a throttled LUN with a deep queue holds no threads other LUNs need), and
//! gives the place back with [`QosGate::cancel`] when the task is aborted
//! before it started.
//!
//! Each ceiling is a generic cell rate algorithm (the virtual-scheduling
//! form of a token bucket): a command of cost `c` against a rate `r` takes
//! `c / r` of the unit's time, the theoretical arrival time of the next
//! command moves on by that much, and a command may start up to [`BURST`]
//! before its theoretical time, so short bursts of up to `r x BURST` pass
//! unhindered. Over any stretch of time `t` between two command starts,
//! what started in it costs at most `r x t` plus the burst plus the last
//! command's cost; a cancelled booking is given back, which lets at most
//! its cost start early.
//!
//! Commands are booked in arrival order, but no initiator may book far
//! ahead of the others ([`QosGate::turn_at_lun`]): while its latest
//! booked command starts more than [`LOOKAHEAD`] from now, its next one
//! books nothing and comes back when that one is [`LOOKAHEAD`] from its
//! start. So at any time each initiator has at most one command booked to
//! start later than [`LOOKAHEAD`] from now, and a command of another
//! initiator sharing the LUN waits behind at most that: not behind a busy
//! host's whole queue (at 1000 IOPS, 32 commands queued at once would
//! otherwise make it wait 32 ms), while the busy host's bookings still run
//! [`LOOKAHEAD`] ahead of the schedule, so the LUN keeps its full rate.
//!
//! A LUN shared by several hosts (a cluster's datastore) can also hold each
//! initiator to its own ceilings ([`QosLimits::initiator_iops`],
//! [`QosLimits::initiator_bytes_per_sec`]), so that one host's deep queue
//! cannot take more than its own share from the others. A command then
//! passes two gates in turn: its initiator's ([`QosGate::reserve_for`]),
//! and, once that wait is over, the LUN's ([`QosGate::turn_at_lun`]). It is
//! booked at the
//! LUN only as its initiator's pace lets it through, so a host whose queue
//! runs ahead of its own ceiling books nothing at the LUN ahead of the
//! others' commands: another host's command waits behind at most what the
//! busy host's ceiling lets in.
//!
//! Only media commands count (those that reach the backstore,
//! [`super::stall::is_media_command`]); their bytes are those of the data
//! transfer the command carries (READ and WRITE payloads). WRITE SAME,
//! UNMAP and EXTENDED COPY count as one command each whatever they touch.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::stats::QosDelays;

/// How far ahead of its theoretical time a command may start: the size of
/// a burst that passes unhindered, in time at the configured rate.
pub const BURST: Duration = Duration::from_millis(50);

/// The ceilings of one logical unit; `None`: no ceiling.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QosLimits {
    /// Media commands per second.
    pub iops: Option<u64>,
    /// Bytes of data transferred per second.
    pub bytes_per_sec: Option<u64>,
    /// Media commands per second of each initiator (by its name: the
    /// sessions of one host share it).
    pub initiator_iops: Option<u64>,
    /// Bytes of data per second of each initiator.
    pub initiator_bytes_per_sec: Option<u64>,
}

impl QosLimits {
    /// No ceiling at all.
    pub const NONE: QosLimits = QosLimits {
        iops: None,
        bytes_per_sec: None,
        initiator_iops: None,
        initiator_bytes_per_sec: None,
    };

    /// Whether any ceiling is set.
    pub fn is_limited(&self) -> bool {
        self.rates().iter().any(Option::is_some) || self.limits_initiators()
    }

    /// Whether each initiator has ceilings of its own.
    pub fn limits_initiators(&self) -> bool {
        self.initiator_rates().iter().any(Option::is_some)
    }

    /// The rates of the LUN's two ceilings, in the order the gate keeps
    /// them.
    fn rates(&self) -> [Option<u64>; 2] {
        // A rate of 0 would never let anything through; the configuration
        // refuses it, and here it means no ceiling rather than a dead LUN.
        [
            self.iops.filter(|&r| r > 0),
            self.bytes_per_sec.filter(|&r| r > 0),
        ]
    }

    /// The rates of each initiator's two ceilings.
    fn initiator_rates(&self) -> [Option<u64>; 2] {
        [
            self.initiator_iops.filter(|&r| r > 0),
            self.initiator_bytes_per_sec.filter(|&r| r > 0),
        ]
    }
}

/// "100 MiB/s", "3 KiB/s", "1000 bytes/s".
fn rate_of_bytes(b: u64) -> String {
    const MIB: u64 = 1 << 20;
    if b.is_multiple_of(MIB) {
        format!("{} MiB/s", b / MIB)
    } else if b.is_multiple_of(1 << 10) {
        format!("{} KiB/s", b >> 10)
    } else {
        format!("{b} bytes/s")
    }
}

/// "500 IOPS", "100 MiB/s", "500 IOPS and 100 MiB/s"; None: neither.
fn pair_of(iops: Option<u64>, bytes: Option<u64>) -> Option<String> {
    match (iops, bytes.map(rate_of_bytes)) {
        (None, None) => None,
        (Some(i), None) => Some(format!("{i} IOPS")),
        (None, Some(b)) => Some(b),
        (Some(i), Some(b)) => Some(format!("{i} IOPS and {b}")),
    }
}

impl fmt::Display for QosLimits {
    /// "no limit", "500 IOPS", "100 MiB/s", "500 IOPS and 100 MiB/s",
    /// "2000 IOPS, each initiator 500 IOPS".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lun = pair_of(self.iops, self.bytes_per_sec);
        let each = pair_of(self.initiator_iops, self.initiator_bytes_per_sec);
        match (lun, each) {
            (None, None) => f.write_str("no limit"),
            (Some(l), None) => f.write_str(&l),
            (None, Some(e)) => write!(f, "each initiator {e}"),
            (Some(l), Some(e)) => write!(f, "{l}, each initiator {e}"),
        }
    }
}

/// A command's booked place: how long it waits before it starts, and what
/// it took from each ceiling (given back by [`QosGate::cancel`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// How long the command must wait before it starts.
    pub wait: Duration,
    /// The limits' generation it was booked under: a change of limits
    /// starts the schedule afresh, and nothing is given back to it.
    generation: u64,
    /// The time it took from the IOPS and the bytes ceiling.
    taken: [Duration; 2],
    /// Whose ceilings it was booked at.
    at: Booked,
}

/// The ceilings a [`Reservation`] was booked at.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Booked {
    /// The LUN's, for an initiator whose look-ahead counts it, or (None)
    /// for no initiator's.
    Lun(Option<LunBooking>),
    /// The initiator's own (its name in lower case).
    Initiator(Arc<str>),
}

/// An initiator's booking at the LUN's ceilings, as its look-ahead counts
/// it: given back, the initiator's latest booking is the one before it
/// again, so its next command does not wait for a start that is not there.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LunBooking {
    /// The initiator (its name in lower case).
    host: Arc<str>,
    /// When the booking starts.
    start: Instant,
    /// The initiator's latest booking at the LUN before this one.
    before: Option<Instant>,
}

/// Commands the ceilings delayed so far, and for how long in all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QosCounters {
    /// Media commands that had to wait.
    pub delayed: u64,
    /// The waits they were given, summed (nanoseconds).
    pub delay_ns: u64,
    /// Commands waiting now.
    pub waiting: u64,
}

/// Theoretical arrival time of the next command, per ceiling (IOPS,
/// bytes).
type NextTimes = [Option<Instant>; 2];

/// How many initiators' schedules a gate keeps before it forgets those
/// with nothing booked ahead (which are as good as new).
const KEPT_INITIATORS: usize = 64;

/// How far ahead of now an initiator may have booked its latest command at
/// the LUN's ceilings and still book another there (see the module docs):
/// what another initiator's command waits behind, per busy initiator. It
/// covers a few late timer ticks (the runtime's timers tick in whole
/// milliseconds), so a busy initiator's next booking comes before the
/// schedule runs dry and the LUN keeps its whole rate.
pub const LOOKAHEAD: Duration = Duration::from_millis(5);

/// When a command that waits in its initiator's line at the LUN only
/// because an earlier one of that line has not taken its turn yet asks
/// again (the earlier one's timer is due at the same time or just before).
const LINE_RETRY: Duration = Duration::from_millis(1);

/// One initiator's standing at a LUN's gate.
#[derive(Debug, Default, Clone)]
struct HostSchedule {
    /// Its schedule against its own ceilings.
    next: NextTimes,
    /// When its latest command booked at the LUN's ceilings starts.
    last_at_lun: Option<Instant>,
    /// Its commands told to come back ([`LunTurn::NotYet`]), by ticket in
    /// arrival order: they book at the LUN in that order.
    line: BTreeSet<u64>,
}

impl HostSchedule {
    /// Whether anything of it lies after `now` or waits in its line (else
    /// it books as a new one).
    fn ahead_of(&self, now: Instant) -> bool {
        !self.line.is_empty()
            || self
                .next
                .iter()
                .chain([&self.last_at_lun])
                .flatten()
                .any(|&t| t > now)
    }
}

#[derive(Debug, Default)]
struct Schedule {
    limits: QosLimits,
    generation: u64,
    /// The LUN's schedule.
    next: NextTimes,
    /// Each initiator's standing, by its name in lower case (iSCSI names
    /// compare without case, RFC 3722).
    initiators: HashMap<Arc<str>, HostSchedule>,
    /// The next ticket of a command told to come back: never reused, not
    /// even under new limits, so a ticket of an earlier schedule holds no
    /// place in a later one.
    next_ticket: u64,
}

impl Schedule {
    /// `initiator`'s standing (a new one if it has none) and its key.
    fn host(&mut self, initiator: &str, now: Instant) -> (Arc<str>, &mut HostSchedule) {
        let name: Cow<'_, str> = if initiator.bytes().any(|b| b.is_ascii_uppercase()) {
            Cow::Owned(initiator.to_ascii_lowercase())
        } else {
            Cow::Borrowed(initiator)
        };
        // The map's own key is handed out: no copy of the name per command.
        let key: Arc<str> = match self.initiators.get_key_value(name.as_ref()) {
            Some((key, _)) => key.clone(),
            None => {
                if self.initiators.len() >= KEPT_INITIATORS {
                    self.initiators.retain(|_, h| h.ahead_of(now));
                }
                let key: Arc<str> = Arc::from(name.as_ref());
                self.initiators.insert(key.clone(), HostSchedule::default());
                key
            }
        };
        let host = self
            .initiators
            .get_mut(&*key)
            .expect("inserted above if it was missing");
        (key, host)
    }
}

/// A command's turn at the LUN's ceilings ([`QosGate::turn_at_lun`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LunTurn {
    /// Booked: its place (a zero wait when it may start at once).
    Booked(Reservation),
    /// Its initiator's latest command there starts more than
    /// [`LOOKAHEAD`] from now, or an earlier command of that initiator is
    /// still to take its turn: nothing is booked, and the command asks
    /// again at this time (keeping its place in its initiator's line).
    NotYet(Instant),
}

/// Books a command of `costs` (commands, bytes) arriving at `now` on the
/// schedule `next` of ceilings `rates`: its start and what it took.
fn book(
    next: &mut NextTimes,
    rates: [Option<u64>; 2],
    costs: [u64; 2],
    now: Instant,
) -> (Instant, [Duration; 2]) {
    let mut start = now;
    for (next, rate) in next.iter().zip(rates) {
        if rate.is_some() {
            let due = next.map_or(now, |n| n.max(now));
            start = start.max(due.checked_sub(BURST).unwrap_or(now));
        }
    }
    let mut taken = [Duration::ZERO; 2];
    for (i, rate) in rates.into_iter().enumerate() {
        if let Some(rate) = rate {
            taken[i] = time_of(costs[i], rate);
            let from = next[i].map_or(start, |n| n.max(start));
            next[i] = Some(from + taken[i]);
        }
    }
    (start, taken)
}

/// Gives back what a cancelled booking took from `next`.
fn give_back(next: &mut NextTimes, taken: [Duration; 2]) {
    for (next, taken) in next.iter_mut().zip(taken) {
        if let Some(n) = next {
            *next = Some(n.checked_sub(taken).unwrap_or(*n));
        }
    }
}

/// One logical unit's ceilings (see the module docs).
#[derive(Debug, Default)]
pub struct QosGate {
    /// Fast path: a unit without ceilings takes no lock.
    limited: AtomicBool,
    schedule: Mutex<Schedule>,
    delays: QosDelays,
    waiting: AtomicU64,
}

/// The time `cost` takes at `rate` per second, rounded up so the schedule
/// never runs faster than the ceiling.
fn time_of(cost: u64, rate: u64) -> Duration {
    let ns = (u128::from(cost) * 1_000_000_000).div_ceil(u128::from(rate));
    Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

impl QosGate {
    /// A gate with `limits`.
    pub fn new(limits: QosLimits) -> QosGate {
        let gate = QosGate::default();
        gate.set_limits(limits);
        gate
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Schedule> {
        self.schedule.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The ceilings now.
    pub fn limits(&self) -> QosLimits {
        self.lock().limits
    }

    /// Sets new ceilings; returns the old ones. The schedule starts afresh:
    /// commands booked already keep their waits.
    pub fn set_limits(&self, limits: QosLimits) -> QosLimits {
        let mut s = self.lock();
        let old = std::mem::replace(&mut s.limits, limits);
        s.generation += 1;
        s.next = [None; 2];
        s.initiators.clear();
        self.limited.store(limits.is_limited(), Ordering::SeqCst);
        old
    }

    /// Books a media command moving `bytes` that arrives at `now` at the
    /// LUN's ceilings: `None` when the LUN has none, else its place (with a
    /// zero wait when it may start at once). A command of an initiator with
    /// ceilings of its own comes here once [`Self::reserve_for`]'s wait is
    /// over.
    #[cfg(test)]
    pub(crate) fn reserve(&self, now: Instant, bytes: u64) -> Option<Reservation> {
        self.reserve_at_lun(now, bytes, false)
    }

    /// As [`Self::reserve`], for a command that waited at its initiator's
    /// ceilings before (`delayed`): counted as delayed once.
    #[cfg(test)]
    pub(crate) fn reserve_at_lun(
        &self,
        now: Instant,
        bytes: u64,
        delayed: bool,
    ) -> Option<Reservation> {
        let (mut s, rates) = self.limited_by(QosLimits::rates)?;
        let (start, taken) = book(&mut s.next, rates, [1, bytes], now);
        let wait = start - now;
        self.delays.count(wait, !delayed);
        Some(Reservation {
            wait,
            generation: s.generation,
            taken,
            at: Booked::Lun(None),
        })
    }

    /// Books a media command of `initiator` moving `bytes` that arrives at
    /// `now` at that initiator's own ceilings: `None` when the LUN sets
    /// none, else its place there. When its wait is over the command books
    /// its place at the LUN ([`Self::turn_at_lun`]).
    pub fn reserve_for(&self, initiator: &str, now: Instant, bytes: u64) -> Option<Reservation> {
        let (mut s, rates) = self.limited_by(QosLimits::initiator_rates)?;
        let generation = s.generation;
        let (key, host) = s.host(initiator, now);
        let (start, taken) = book(&mut host.next, rates, [1, bytes], now);
        let wait = start - now;
        self.delays.count(wait, true);
        Some(Reservation {
            wait,
            generation,
            taken,
            at: Booked::Initiator(key),
        })
    }

    /// `initiator`'s command moving `bytes`, arriving at `now` (after its
    /// wait at its own ceilings, if any), at the LUN's ceilings: `None` when
    /// the LUN has none; else its place there, or, when that initiator has
    /// booked as far ahead as it may ([`LOOKAHEAD`]) or has earlier
    /// commands still to book, when to ask again. A command told to come
    /// back gets a place in its initiator's line (`ticket`), which it
    /// passes back when it asks again and gives up with
    /// [`Self::leave_line`] if it goes before booking. A command that
    /// waited before (`delayed`) is counted as delayed once.
    pub fn turn_at_lun(
        &self,
        initiator: &str,
        now: Instant,
        bytes: u64,
        delayed: bool,
        ticket: &mut Option<u64>,
    ) -> Option<LunTurn> {
        let (mut s, rates) = self.limited_by(QosLimits::rates)?;
        let generation = s.generation;
        let (_, host) = s.host(initiator, now);
        // A ticket of an earlier schedule (new limits) holds no place.
        if ticket.is_some_and(|t| !host.line.contains(&t)) {
            *ticket = None;
        }
        let first_in_line = host.line.first().copied();
        let last = host.last_at_lun.filter(|&l| l > now + LOOKAHEAD);
        if last.is_some() || first_in_line.is_some_and(|t| Some(t) != *ticket) {
            if ticket.is_none() {
                let t = s.next_ticket;
                s.next_ticket += 1;
                let (_, host) = s.host(initiator, now);
                host.line.insert(t);
                *ticket = Some(t);
            }
            let until = last.map_or(now + LINE_RETRY, |l| l - LOOKAHEAD);
            self.delays.count(until - now, !delayed);
            return Some(LunTurn::NotYet(until));
        }
        if let Some(t) = ticket.take() {
            host.line.remove(&t);
        }
        let host_last = host.last_at_lun;
        let (start, taken) = book(&mut s.next, rates, [1, bytes], now);
        // Bookings at the LUN come in time order, but a booking given back
        // may let a later one start earlier: keep the latest.
        let (key, host) = s.host(initiator, now);
        host.last_at_lun = Some(host_last.map_or(start, |l| l.max(start)));
        let wait = start - now;
        self.delays.count(wait, !delayed);
        Some(LunTurn::Booked(Reservation {
            wait,
            generation,
            taken,
            at: Booked::Lun(Some(LunBooking {
                host: key,
                start,
                before: host_last,
            })),
        }))
    }

    /// Commands told to come back that hold a place in their initiators'
    /// lines now (each also counts as waiting until it starts or goes).
    pub fn in_lines(&self) -> usize {
        self.lock().initiators.values().map(|h| h.line.len()).sum()
    }

    /// A command told to come back ([`LunTurn::NotYet`]) goes without
    /// booking (aborted, its connection gone): its place in its
    /// initiator's line is given up.
    pub fn leave_line(&self, initiator: &str, ticket: u64) {
        let mut s = self.lock();
        let lower = initiator.to_ascii_lowercase();
        if let Some(host) = s.initiators.get_mut(lower.as_str()) {
            host.line.remove(&ticket);
        }
    }

    /// The schedule, and the ceilings `pick` takes from the limits, when
    /// any of those is set.
    fn limited_by(
        &self,
        pick: fn(&QosLimits) -> [Option<u64>; 2],
    ) -> Option<(std::sync::MutexGuard<'_, Schedule>, [Option<u64>; 2])> {
        if !self.limited.load(Ordering::Relaxed) {
            return None;
        }
        let s = self.lock();
        let rates = pick(&s.limits);
        rates.iter().any(Option::is_some).then_some((s, rates))
    }

    /// Gives back the place of a command that will not run (its task was
    /// aborted while it waited), so aborted commands do not push later
    /// ones back.
    pub fn cancel(&self, r: &Reservation) {
        let mut s = self.lock();
        if s.generation != r.generation {
            return;
        }
        match &r.at {
            Booked::Lun(by) => {
                give_back(&mut s.next, r.taken);
                // The initiator's look-ahead no longer counts this booking,
                // unless a later one of its own has taken its place as the
                // latest.
                if let Some(b) = by {
                    if let Some(host) = s.initiators.get_mut(&*b.host) {
                        if host.last_at_lun == Some(b.start) {
                            host.last_at_lun = b.before;
                        }
                    }
                }
            }
            Booked::Initiator(name) => {
                if let Some(host) = s.initiators.get_mut(&**name) {
                    give_back(&mut host.next, r.taken);
                }
            }
        }
    }

    /// A command starts waiting at the gate ([`QosCounters::waiting`]);
    /// each call is paired with one [`Self::end_wait`].
    pub fn begin_wait(&self) {
        self.waiting.fetch_add(1, Ordering::Relaxed);
    }

    /// A command stopped waiting: it started, or it went.
    pub fn end_wait(&self) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
    }

    /// What the ceilings did so far.
    pub fn counters(&self) -> QosCounters {
        QosCounters {
            delayed: self.delays.delayed(),
            delay_ns: u64::try_from(self.delays.delay().as_nanos()).unwrap_or(u64::MAX),
            waiting: self.waiting.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    fn limits(iops: Option<u64>, bytes_per_sec: Option<u64>) -> QosLimits {
        QosLimits {
            iops,
            bytes_per_sec,
            ..QosLimits::NONE
        }
    }

    fn each_initiator(iops: Option<u64>, bytes_per_sec: Option<u64>) -> QosLimits {
        QosLimits {
            initiator_iops: iops,
            initiator_bytes_per_sec: bytes_per_sec,
            ..QosLimits::NONE
        }
    }

    #[test]
    fn each_initiator_is_held_to_its_own_ceiling() {
        // 100 IOPS each: 10 ms a command, bursts of 5 pass.
        let g = QosGate::new(each_initiator(Some(100), None));
        let t0 = Instant::now();
        // No ceiling of the LUN's own: nothing to book there.
        assert_eq!(g.reserve(t0, 4096), None);
        let waits: Vec<Duration> = (0..8)
            .map(|_| g.reserve_for("iqn.2026-11.host:a", t0, 4096).unwrap().wait)
            .collect();
        assert_eq!(&waits[..6], &[Duration::ZERO; 6]);
        assert_eq!(waits[6..], [10 * MS, 20 * MS]);
        // Another host has its own schedule; the same host under another
        // spelling (iSCSI names compare without case) has not.
        assert_eq!(
            g.reserve_for("iqn.2026-11.host:b", t0, 4096).unwrap().wait,
            Duration::ZERO
        );
        let same = g.reserve_for("IQN.2026-11.HOST:A", t0, 4096).unwrap();
        assert_eq!(same.wait, 30 * MS);
        // Giving a place back gives it to that host's schedule.
        g.cancel(&same);
        assert_eq!(
            g.reserve_for("iqn.2026-11.host:a", t0, 4096).unwrap().wait,
            30 * MS
        );
        let c = g.counters();
        assert_eq!((c.delayed, c.delay_ns), (4, 90_000_000));
        // A wait at the LUN after one at the initiator's counts once.
        let g = QosGate::new(QosLimits {
            iops: Some(1),
            ..each_initiator(Some(1), None)
        });
        g.reserve_at_lun(t0, 0, false);
        assert!(!g.reserve_at_lun(t0, 0, true).unwrap().wait.is_zero());
        assert_eq!(g.counters().delayed, 0);
        assert_eq!(g.limits().to_string(), "1 IOPS, each initiator 1 IOPS");
    }

    /// The commands of `line` (their tickets: None for a new one) of
    /// `host` take their turns at the LUN of `g` at `now`, in that order:
    /// the waits of those booked, and when the others come back (left in
    /// `line` with their tickets).
    fn turns(
        g: &QosGate,
        host: &str,
        line: &mut Vec<Option<u64>>,
        now: Instant,
    ) -> (Vec<Duration>, Vec<Instant>) {
        let (mut booked, mut later, mut still) = (Vec::new(), Vec::new(), Vec::new());
        for mut ticket in line.drain(..) {
            match g.turn_at_lun(host, now, 4096, false, &mut ticket).unwrap() {
                LunTurn::Booked(r) => {
                    assert_eq!(ticket, None, "a booked command leaves the line");
                    booked.push(r.wait)
                }
                LunTurn::NotYet(until) => {
                    assert!(ticket.is_some(), "told to come back without a place");
                    later.push(until);
                    still.push(ticket);
                }
            }
        }
        *line = still;
        (booked, later)
    }

    #[test]
    fn a_busy_initiator_books_at_most_the_lookahead_ahead_at_the_lun() {
        // Host A queues 20 commands at once under the LUN's 100 IOPS; host
        // B then sends one.
        let t0 = Instant::now();
        let g = QosGate::new(limits(Some(100), None));
        let mut a = vec![None; 20];
        let (booked, later) = turns(&g, "iqn.host:a", &mut a, t0);
        // The burst (50 ms at 10 ms a command) lets six start at once, the
        // seventh is booked 10 ms ahead: past the look-ahead, so the rest
        // come back when it is LOOKAHEAD from its start.
        assert_eq!(booked.len(), 7, "{booked:?}");
        assert_eq!(booked[6], 10 * MS);
        assert_eq!(later, vec![t0 + 10 * MS - LOOKAHEAD; 13]);
        // B waits behind A's one booking ahead, not behind its queue.
        assert_eq!(turns(&g, "iqn.host:b", &mut vec![None], t0).0, [20 * MS]);
        // Booked first come, first served (a command of no initiator's
        // look-ahead), B would wait behind all 20.
        let fifo = QosGate::new(limits(Some(100), None));
        for _ in 0..20 {
            fifo.reserve(t0, 4096);
        }
        assert_eq!(fifo.reserve(t0, 4096).unwrap().wait, 150 * MS);
        // When A's come back, the first in its line is booked, after B's.
        let (again, later) = turns(&g, "iqn.host:a", &mut a, t0 + 5 * MS);
        assert_eq!(again, [25 * MS]);
        assert_eq!(later, vec![t0 + 30 * MS - LOOKAHEAD; 12]);
        // A new command of A's queues behind its line even with the
        // look-ahead open, as do those of the line that come back before
        // the first of it: they book in arrival order.
        a.reverse();
        a.insert(0, None);
        let at = t0 + 25 * MS;
        let (booked, later) = turns(&g, "iqn.host:a", &mut a, at);
        assert_eq!(booked, [15 * MS], "the first in line, when it came");
        assert_eq!(later, vec![at + LINE_RETRY; 12]);
        assert_eq!(
            a.iter().flatten().min(),
            a.last().unwrap().as_ref(),
            "the first in line came back last"
        );
        // An initiator's standing is by its name without case: B's one
        // booking starts 15 ms from then, past the look-ahead.
        let (b_booked, b_later) = turns(&g, "IQN.HOST:B", &mut vec![None], t0 + 5 * MS);
        assert_eq!((b_booked, b_later), (vec![], vec![t0 + 15 * MS]));
        // Commands that go give their places up.
        for t in a.iter().flatten() {
            g.leave_line("iqn.host:a", *t);
        }
        assert!(g.lock().initiators.values().all(|h| h.line.len() <= 1));
    }

    #[test]
    fn an_aborted_booking_at_the_lun_no_longer_holds_its_initiator_back() {
        let t0 = Instant::now();
        let g = QosGate::new(limits(Some(100), None));
        let turn = |ticket: &mut Option<u64>| g.turn_at_lun("iqn.host:a", t0, 4096, false, ticket);
        // Host A books until its look-ahead is full: six at once (the
        // burst), the seventh 10 ms ahead.
        let mut bookings = Vec::new();
        for _ in 0..7 {
            match turn(&mut None) {
                Some(LunTurn::Booked(r)) => bookings.push(r),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(bookings[6].wait, 10 * MS);
        let mut ticket = None;
        assert!(
            matches!(turn(&mut ticket), Some(LunTurn::NotYet(at)) if at == t0 + 10 * MS - LOOKAHEAD),
            "the eighth comes back when the seventh is LOOKAHEAD from its start"
        );
        g.leave_line("iqn.host:a", ticket.unwrap());
        // The seventh is aborted: its place at the LUN goes, and so does
        // its standing as A's latest booking, so A's next command books
        // that place now rather than coming back for a start that is gone.
        g.cancel(&bookings[6]);
        match turn(&mut None) {
            Some(LunTurn::Booked(r)) => assert_eq!(r.wait, 10 * MS, "the aborted one's place"),
            other => panic!("{other:?}"),
        }
        // An aborted booking that is not A's latest leaves the latest as it is.
        g.cancel(&bookings[0]);
        assert!(matches!(turn(&mut None), Some(LunTurn::NotYet(_))));
    }

    #[test]
    fn each_initiators_ceiling_books_its_commands_at_the_lun_at_its_pace() {
        // With each initiator held to 50 IOPS, A's commands reach the LUN
        // only at A's pace (three at once, the burst), so B waits for none.
        let t0 = Instant::now();
        let shared = QosGate::new(QosLimits {
            iops: Some(100),
            ..each_initiator(Some(50), None)
        });
        let mut lun_turns = Vec::new();
        for _ in 0..20 {
            let r = shared.reserve_for("iqn.host:a", t0, 4096).unwrap();
            if r.wait.is_zero() {
                lun_turns.extend(turns(&shared, "iqn.host:a", &mut vec![None], t0).0);
            }
        }
        assert_eq!(lun_turns, [Duration::ZERO; 3]);
        let b = shared.reserve_for("iqn.host:b", t0, 4096).unwrap();
        assert_eq!(b.wait, Duration::ZERO);
        assert_eq!(
            turns(&shared, "iqn.host:b", &mut vec![None], t0).0,
            [Duration::ZERO]
        );
    }

    #[test]
    fn a_gate_forgets_initiators_with_nothing_booked_ahead() {
        let g = QosGate::new(each_initiator(Some(1000), None));
        let t0 = Instant::now();
        for i in 0..10 * KEPT_INITIATORS {
            let now = t0 + Duration::from_secs(i as u64);
            g.reserve_for(&format!("iqn.host:{i}"), now, 0);
        }
        assert!(g.lock().initiators.len() <= KEPT_INITIATORS);
    }

    #[test]
    fn a_unit_without_ceilings_books_nothing() {
        let g = QosGate::default();
        assert_eq!(g.reserve(Instant::now(), 1 << 20), None);
        g.set_limits(limits(Some(10), None));
        g.set_limits(QosLimits::NONE);
        assert_eq!(g.reserve(Instant::now(), 1 << 20), None);
        assert_eq!(g.counters(), QosCounters::default());
    }

    #[test]
    fn commands_over_the_iops_ceiling_wait_their_turn() {
        // 100 IOPS: 10 ms a command, bursts of 50 ms (5 commands) pass.
        let g = QosGate::new(limits(Some(100), None));
        let t0 = Instant::now();
        let waits: Vec<Duration> = (0..8)
            .map(|_| g.reserve(t0, 4096).expect("limited").wait)
            .collect();
        assert_eq!(&waits[..6], &[Duration::ZERO; 6]);
        assert_eq!(waits[6], 10 * MS);
        assert_eq!(waits[7], 20 * MS);
        let c = g.counters();
        assert_eq!((c.delayed, c.delay_ns), (2, 30_000_000));
        // A command arriving after the schedule emptied goes at once.
        assert_eq!(
            g.reserve(t0 + Duration::from_secs(1), 4096).unwrap().wait,
            Duration::ZERO
        );
    }

    #[test]
    fn the_bytes_ceiling_spaces_large_transfers() {
        // 1 MiB/s: a 1 MiB command takes a second of the unit's time.
        let g = QosGate::new(limits(None, Some(1 << 20)));
        let t0 = Instant::now();
        assert_eq!(g.reserve(t0, 1 << 20).unwrap().wait, Duration::ZERO);
        assert_eq!(
            g.reserve(t0, 1 << 20).unwrap().wait,
            Duration::from_millis(950)
        );
        // Small commands count by their size, not per command.
        let g = QosGate::new(limits(None, Some(1 << 20)));
        for _ in 0..12 {
            assert_eq!(g.reserve(t0, 4096).unwrap().wait, Duration::ZERO);
        }
    }

    #[test]
    fn the_tighter_ceiling_decides() {
        let g = QosGate::new(limits(Some(1000), Some(1 << 20)));
        let t0 = Instant::now();
        g.reserve(t0, 1 << 20);
        // The IOPS ceiling would let it go; the bytes ceiling does not.
        assert_eq!(g.reserve(t0, 512).unwrap().wait, Duration::from_millis(950));
    }

    #[test]
    fn a_cancelled_booking_is_given_back() {
        let g = QosGate::new(limits(Some(10), None));
        let t0 = Instant::now();
        let booked: Vec<Reservation> = (0..5).map(|_| g.reserve(t0, 0).unwrap()).collect();
        assert_eq!(booked[4].wait, Duration::from_millis(350));
        for r in booked.iter().rev().take(3) {
            g.cancel(r);
        }
        assert_eq!(g.reserve(t0, 0).unwrap().wait, Duration::from_millis(150));
    }

    #[test]
    fn new_limits_start_a_fresh_schedule() {
        let g = QosGate::new(limits(Some(1), None));
        let t0 = Instant::now();
        g.reserve(t0, 0);
        let late = g.reserve(t0, 0).unwrap();
        assert_eq!(late.wait, Duration::from_millis(950));
        assert_eq!(
            g.set_limits(limits(Some(1000), None)),
            limits(Some(1), None)
        );
        assert_eq!(g.reserve(t0, 0).unwrap().wait, Duration::ZERO);
        // A booking of the old schedule gives nothing back to the new one.
        let before = g.reserve(t0, 0).unwrap();
        g.cancel(&late);
        assert!(g.reserve(t0, 0).unwrap().wait >= before.wait);
    }

    #[test]
    fn limits_read_as_an_operator_writes_them() {
        assert_eq!(QosLimits::NONE.to_string(), "no limit");
        assert_eq!(limits(Some(500), None).to_string(), "500 IOPS");
        assert_eq!(limits(None, Some(100 << 20)).to_string(), "100 MiB/s");
        assert_eq!(
            limits(Some(5), Some(3 << 10)).to_string(),
            "5 IOPS and 3 KiB/s"
        );
        assert_eq!(limits(None, Some(1000)).to_string(), "1000 bytes/s");
    }

    /// One command of a random run: when it arrives after the previous
    /// one, what it moves, and whether its task is aborted before it
    /// starts.
    fn arrivals() -> impl Strategy<Value = Vec<(u64, u64, bool)>> {
        // Half the commands arrive together with the one before: queues form.
        let gap = prop_oneof![Just(0u64), 0u64..30_000_000];
        prop::collection::vec((gap, 0u64..(2 << 20), prop::bool::weighted(0.1)), 1..200)
    }

    proptest! {
        /// Over every stretch between two starts, what started costs at
        /// most the rate times the stretch, plus the burst and the last
        /// command, plus what cancelled bookings gave back; and a command
        /// arriving to an idle schedule never waits.
        #[test]
        fn no_stretch_runs_faster_than_its_ceilings(
            iops in prop::option::of(1u64..2000),
            bytes_per_sec in prop::option::of(1u64 << 16..1 << 28),
            run in arrivals(),
        ) {
            let l = limits(iops, bytes_per_sec);
            let g = QosGate::new(l);
            let t0 = Instant::now();
            let mut now = t0;
            let mut started: Vec<(Instant, u64)> = Vec::new();
            let mut given_back = [0u128; 2];
            let mut cancels = 0u64;
            let mut previous_end: Option<Instant> = None;
            for (gap, bytes, aborted) in run {
                now += Duration::from_nanos(gap);
                let r = g.reserve(now, bytes);
                prop_assert_eq!(r.is_some(), l.is_limited());
                let Some(r) = r else { continue };
                if previous_end.is_none_or(|e| e <= now) {
                    prop_assert_eq!(r.wait, Duration::ZERO, "an idle unit held a command back");
                }
                previous_end = Some(previous_end.map_or(now, |e| e.max(now)) + r.taken[0].max(r.taken[1]));
                if aborted {
                    g.cancel(&r);
                    given_back[0] += 1;
                    given_back[1] += u128::from(bytes);
                    cancels += 1;
                } else {
                    started.push((now + r.wait, bytes));
                }
            }
            // What cancelled bookings gave back may start early; each
            // booking's time is rounded up to a nanosecond, so giving one
            // back may return up to rate x 1 ns more than it took.
            let slack = |d: usize, rate: u64| {
                given_back[d] + u128::from(cancels) * (u128::from(rate) / 1_000_000_000 + 1)
            };
            check_stretches(&started, l.rates(), &slack, &l.to_string())?;
        }
    }

    /// What started on one schedule (`started`: start, bytes, in the order
    /// they were booked), checked against ceilings `rates`: over every
    /// stretch from one start to a later-booked one, at most the rate times
    /// the stretch plus the burst, the last command and `slack(ceiling,
    /// rate)`.
    fn check_stretches(
        started: &[(Instant, u64)],
        rates: [Option<u64>; 2],
        slack: &dyn Fn(usize, u64) -> u128,
        what: &str,
    ) -> Result<(), TestCaseError> {
        for (d, rate) in rates.into_iter().enumerate() {
            let Some(rate) = rate else { continue };
            let cost = |b: u64| if d == 0 { 1u128 } else { u128::from(b) };
            for j in 0..started.len() {
                let mut sum = 0u128;
                for k in j..started.len() {
                    let stretch = started[k].0.saturating_duration_since(started[j].0);
                    let allowed = (stretch + BURST).as_nanos() * u128::from(rate) / 1_000_000_000
                        + cost(started[k].1)
                        + slack(d, rate)
                        + 1;
                    sum += cost(started[k].1);
                    prop_assert!(
                        sum <= allowed,
                        "{}: ceiling {}: {} started in {:?} (allowed {})",
                        what,
                        d,
                        sum,
                        stretch,
                        allowed
                    );
                }
            }
        }
        Ok(())
    }

    proptest! {
        /// Commands of several initiators pass their own gate and then the
        /// LUN's, each taking its turn at the LUN when its first wait ends
        /// (and again when told to come back): every initiator keeps to its
        /// own ceilings, all of them together to the LUN's, and no command
        /// waits at the LUN behind more than [`LOOKAHEAD`] and one command
        /// of each initiator.
        #[test]
        fn initiators_keep_to_their_ceilings_and_together_to_the_luns(
            iops in prop::option::of(1u64..2000),
            bytes_per_sec in prop::option::of(1u64 << 16..1 << 28),
            initiator_iops in prop::option::of(1u64..1000),
            initiator_bytes in prop::option::of(1u64 << 16..1 << 27),
            // Half the commands arrive together with the one before.
            run in prop::collection::vec(
                (prop_oneof![Just(0u64), 0u64..20_000_000], 0u64..(1 << 20), 0usize..3),
                1..120,
            ),
        ) {
            let l = QosLimits {
                iops,
                bytes_per_sec,
                initiator_iops,
                initiator_bytes_per_sec: initiator_bytes,
            };
            let g = QosGate::new(l);
            let t0 = Instant::now();
            // Every event in time order: an arrival, or the end of a
            // command's wait at its initiator's gate (then it books at the
            // LUN's).
            let mut events = std::collections::BinaryHeap::new();
            let mut at = t0;
            for (seq, (gap, bytes, host)) in run.into_iter().enumerate() {
                at += Duration::from_nanos(gap);
                events.push(std::cmp::Reverse((at, seq, bytes, host, false, None)));
            }
            let mut per_host: Vec<Vec<(Instant, u64)>> = vec![Vec::new(); 3];
            let mut at_lun: Vec<(Instant, u64)> = Vec::new();
            // The arrival of each host's latest command booked at the LUN.
            let mut booked_seq: [Option<usize>; 3] = [None; 3];
            // The longest any one command holds the LUN's schedule.
            let longest = |bytes: u64| {
                let rates = l.rates();
                [rates[0].map(|r| time_of(1, r)), rates[1].map(|r| time_of(bytes, r))]
                    .into_iter()
                    .flatten()
                    .max()
                    .unwrap_or_default()
            };
            let step = events.iter().map(|e| longest(e.0 .2)).max().unwrap_or_default();
            while let Some(std::cmp::Reverse((now, seq, bytes, host, passed, mut ticket))) =
                events.pop()
            {
                let name = format!("iqn.2026-11.host:{host}");
                if !passed {
                    let r = g.reserve_for(&name, now, bytes);
                    prop_assert_eq!(r.is_some(), l.limits_initiators());
                    let wait = r.map_or(Duration::ZERO, |r| r.wait);
                    per_host[host].push((now + wait, bytes));
                    events.push(std::cmp::Reverse((now + wait, seq, bytes, host, true, None)));
                    continue;
                }
                match g.turn_at_lun(&name, now, bytes, false, &mut ticket) {
                    None => at_lun.push((now, bytes)),
                    Some(LunTurn::NotYet(until)) => {
                        prop_assert!(until > now);
                        events.push(std::cmp::Reverse((until, seq, bytes, host, true, ticket)));
                    }
                    Some(LunTurn::Booked(r)) => {
                        // Each initiator has at most one command booked to
                        // start later than LOOKAHEAD from now, so none waits
                        // longer than that and one command of each
                        // initiator (and the one starting just before).
                        let bound = LOOKAHEAD + step * 4;
                        prop_assert!(
                            r.wait <= bound,
                            "host {} waited {:?} at the LUN of {} (bound {:?})",
                            host,
                            r.wait,
                            l,
                            bound
                        );
                        at_lun.push((now + r.wait, bytes));
                        // A host's commands book at the LUN in the order
                        // they came.
                        prop_assert!(
                            booked_seq[host] < Some(seq),
                            "host {}: command {} booked after {:?}",
                            host,
                            seq,
                            booked_seq[host]
                        );
                        booked_seq[host] = Some(seq);
                        prop_assert_eq!(ticket, None);
                    }
                }
            }
            prop_assert!(
                g.lock().initiators.values().all(|h| h.line.is_empty()),
                "every line emptied"
            );
            // Commands pass the gates in time order here: checked in the
            // order they start.
            let none = |_: usize, _: u64| 0;
            for (host, started) in per_host.iter_mut().enumerate() {
                started.sort();
                check_stretches(started, l.initiator_rates(), &none, &format!("host {host} of {l}"))?;
            }
            at_lun.sort();
            check_stretches(&at_lun, l.rates(), &none, &format!("the LUN of {l}"))?;
        }
    }
}
