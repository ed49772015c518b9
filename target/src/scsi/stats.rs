//! READ/WRITE counters and latency histograms, for a metrics exporter: one
//! set per logical unit, and one per initiator on a target when the fabric
//! hands the core one with the command ([`ScsiRequest::initiator_stats`](super::ScsiRequest::initiator_stats):
//! the per-host view, every LUN and session of that initiator there).
//!
//! A command is counted once in each, when the logical unit is done with it:
//! - commands the core executes (RAM LUNs, the serial path, every failure)
//!   at the end of [`LunTable::execute`](super::LunTable::execute), timed
//!   from its start (a stalled unit's wait included);
//! - READs the fabric reads itself (sendfile, the engine path) when the
//!   fabric drops the plan, timed from the start of the validation. Both
//!   paths keep the plan's clock until the command's last Data-In (or
//!   RDMA Write) and status are queued, so the whole command is timed;
//! - WRITEs the fabric writes itself (double-buffered writes) when the
//!   range hold is dropped after the last chunk write, timed likewise.
//!
//! The length-0 validation probes the planned paths run through the
//! normal path are not commands of their own and are not counted.
//!
//! The hot path costs a clock read and a handful of relaxed atomic adds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Upper bound of the first latency bucket: 2^10 ns (about 1 µs).
const FIRST_BOUND_LOG2: u32 = 10;
/// Finite latency buckets: 2^10 ns .. 2^35 ns (about 34 s), doubling.
pub const LATENCY_BUCKETS: usize = 26;

/// A lock-free latency histogram with doubling bucket bounds, shaped for
/// Prometheus' cumulative `le` buckets.
#[derive(Debug)]
pub struct LatencyHistogram {
    /// Non-cumulative counts: slot `i < LATENCY_BUCKETS` holds samples in
    /// (bound(i-1), bound(i)], the last slot those above every bound.
    buckets: [AtomicU64; LATENCY_BUCKETS + 1],
    sum_ns: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl LatencyHistogram {
    /// The upper bound of finite bucket `i`.
    pub fn bound(i: usize) -> Duration {
        Duration::from_nanos(1u64 << (FIRST_BOUND_LOG2 + i as u32))
    }

    /// Adds one sample.
    pub fn record(&self, d: Duration) {
        let ns = d.as_nanos().min(u128::from(u64::MAX)) as u64;
        // Samples in (2^(k-1), 2^k] ns have bit length k once 1 is taken off.
        let k = 64 - ns.saturating_sub(1).leading_zeros();
        let slot = (k.saturating_sub(FIRST_BOUND_LOG2) as usize).min(LATENCY_BUCKETS);
        self.buckets[slot].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Cumulative counts for each finite bound, then the total (`+Inf`).
    pub fn cumulative(&self) -> [u64; LATENCY_BUCKETS + 1] {
        let mut acc = 0;
        std::array::from_fn(|i| {
            acc += self.buckets[i].load(Ordering::Relaxed);
            acc
        })
    }

    /// Sum of every sample.
    pub fn sum(&self) -> Duration {
        Duration::from_nanos(self.sum_ns.load(Ordering::Relaxed))
    }
}

/// The two directions counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// READ(6/10/12/16).
    Read,
    /// WRITE(6/10/12/16).
    Write,
}

impl Direction {
    /// Both, in report order.
    pub const ALL: [Direction; 2] = [Direction::Read, Direction::Write];

    /// Label value.
    pub fn name(self) -> &'static str {
        match self {
            Direction::Read => "read",
            Direction::Write => "write",
        }
    }
}

/// Counters of one direction.
#[derive(Debug, Default)]
pub struct DirectionStats {
    /// Commands finished (GOOD or not).
    pub commands: AtomicU64,
    /// Of those, commands that did not end GOOD.
    pub errors: AtomicU64,
    /// Data bytes moved by commands that ended GOOD (a planned command
    /// whose backstore I/O failed counts its planned bytes and an error).
    pub bytes: AtomicU64,
    /// Time until the logical unit was done with the command.
    pub latency: LatencyHistogram,
}

/// Media commands that QoS ceilings made wait before they started, and
/// their waits summed.
#[derive(Debug, Default)]
pub struct QosDelays {
    delayed: AtomicU64,
    delay_ns: AtomicU64,
}

impl QosDelays {
    /// A wait of `wait` given to a command; `first` when it is the
    /// command's first (a command waiting at its initiator's ceilings and
    /// then at the LUN's is one delayed command with two waits).
    pub fn count(&self, wait: Duration, first: bool) {
        if wait.is_zero() {
            return;
        }
        if first {
            self.delayed.fetch_add(1, Ordering::Relaxed);
        }
        let ns = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        self.delay_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Commands delayed so far.
    pub fn delayed(&self) -> u64 {
        self.delayed.load(Ordering::Relaxed)
    }

    /// Their waits, summed.
    pub fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_ns.load(Ordering::Relaxed))
    }
}

/// READ and WRITE counters of one logical unit, or of one initiator on a
/// target.
#[derive(Debug, Default)]
pub struct IoStats {
    read: DirectionStats,
    write: DirectionStats,
    /// An initiator's commands held back by the QoS ceilings of any LUN of
    /// its target, at the LUN's ceilings or at its own there. Counted for
    /// initiators only: a LUN's are in its gate
    /// ([`QosGate::counters`](super::qos::QosGate::counters)).
    pub qos: QosDelays,
}

impl IoStats {
    /// The counters of `d`.
    pub fn direction(&self, d: Direction) -> &DirectionStats {
        match d {
            Direction::Read => &self.read,
            Direction::Write => &self.write,
        }
    }

    /// One finished command of `d`: `bytes` moved (0 unless GOOD), taking
    /// `elapsed`.
    pub fn record(&self, d: Direction, good: bool, bytes: u64, elapsed: Duration) {
        let s = self.direction(d);
        s.commands.fetch_add(1, Ordering::Relaxed);
        if good {
            s.bytes.fetch_add(bytes, Ordering::Relaxed);
        } else {
            s.errors.fetch_add(1, Ordering::Relaxed);
        }
        s.latency.record(elapsed);
    }
}

/// Counts one finished command of `d`, started at `started`, on its logical
/// unit and, if the fabric gave them, on its initiator's counters.
pub(crate) fn record_command(
    lun: &IoStats,
    initiator: Option<&Arc<IoStats>>,
    d: Direction,
    good: bool,
    bytes: u64,
    started: Instant,
) {
    let elapsed = started.elapsed();
    lun.record(d, good, bytes, elapsed);
    if let Some(i) = initiator {
        i.record(d, good, bytes, elapsed);
    }
}

/// Counts a planned command when the last holder of its plan lets go: a
/// plan may be cloned while the fabric moves the data, and the command is
/// over for the logical unit only when every copy is gone.
#[derive(Debug)]
pub struct CommandClock {
    stats: Arc<IoStats>,
    initiator: Option<Arc<IoStats>>,
    direction: Direction,
    bytes: u64,
    started: Instant,
    failed: std::sync::atomic::AtomicBool,
    forgotten: std::sync::atomic::AtomicBool,
}

impl CommandClock {
    pub(crate) fn start(
        stats: Arc<IoStats>,
        initiator: Option<&Arc<IoStats>>,
        direction: Direction,
        bytes: u64,
        started: Instant,
    ) -> Arc<CommandClock> {
        Arc::new(CommandClock {
            stats,
            initiator: initiator.cloned(),
            direction,
            bytes,
            started,
            failed: std::sync::atomic::AtomicBool::new(false),
            forgotten: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The backstore failed the command: it counts as an error.
    pub fn fail(&self) {
        self.failed.store(true, Ordering::Relaxed);
    }

    /// The plan was given up before any of its I/O (the command runs
    /// whole elsewhere, which counts it): nothing is counted.
    pub(crate) fn forget(&self) {
        self.forgotten.store(true, Ordering::Relaxed);
    }
}

impl Drop for CommandClock {
    fn drop(&mut self) {
        if self.forgotten.load(Ordering::Relaxed) {
            return;
        }
        let good = !self.failed.load(Ordering::Relaxed);
        record_command(
            &self.stats,
            self.initiator.as_ref(),
            self.direction,
            good,
            self.bytes,
            self.started,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_land_in_the_first_bucket_whose_bound_holds_them() {
        let h = LatencyHistogram::default();
        h.record(Duration::from_nanos(0));
        h.record(Duration::from_nanos(1024)); // exactly the first bound
        h.record(Duration::from_nanos(1025)); // just above: second bucket
        h.record(Duration::from_secs(3600)); // above every bound
        let c = h.cumulative();
        assert_eq!(c[0], 2);
        assert_eq!(c[1], 3);
        assert_eq!(c[LATENCY_BUCKETS - 1], 3);
        assert_eq!(c[LATENCY_BUCKETS], 4);
        assert_eq!(LatencyHistogram::bound(1), Duration::from_nanos(2048));
        assert_eq!(
            h.sum(),
            Duration::from_nanos(2049) + Duration::from_secs(3600)
        );
    }

    #[test]
    fn a_cloned_plan_counts_once_when_the_last_copy_goes() {
        let stats = Arc::new(IoStats::default());
        let initiator = Arc::new(IoStats::default());
        let clock = CommandClock::start(
            stats.clone(),
            Some(&initiator),
            Direction::Read,
            4096,
            Instant::now(),
        );
        let copy = clock.clone();
        drop(clock);
        for s in [&stats, &initiator] {
            assert_eq!(
                s.direction(Direction::Read)
                    .commands
                    .load(Ordering::Relaxed),
                0
            );
        }
        copy.fail();
        drop(copy);
        for s in [&stats, &initiator] {
            let r = s.direction(Direction::Read);
            assert_eq!(r.commands.load(Ordering::Relaxed), 1);
            assert_eq!(r.errors.load(Ordering::Relaxed), 1);
            assert_eq!(r.bytes.load(Ordering::Relaxed), 0);
            assert_eq!(r.latency.cumulative()[LATENCY_BUCKETS], 1);
        }
    }
}
