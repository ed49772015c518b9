//! Napping between batches: after a connection has answered what one socket
//! read brought, it may sleep a little before it looks for more, so that the
//! initiator's next commands gather and come in one read.
//!
//! Why: every wake-up of a connection costs a `recv`, a `sendmsg` of the
//! answers and the `epoll_wait` with its wake-up of a sleeping CPU (an
//! inter-processor interrupt, on a virtual machine a trip through the
//! hypervisor), whether it brings one command or ten. Through qemu-nbd,
//! whose one thread is the pace at 4 KiB and QD32, socket reads brought 1.6-1.9
//! PDUs, and those per-wake-up costs were most of the target's 28 us of CPU
//! per WRITE on the 2-vCPU AMD VM of interop/results/bench-vs-tgtd.md. In
//! alternating runs a nap of [`NAP`] on every wait took that from 27-33 us
//! to 21-26 us, and qemu-nbd, woken less often with more answers at a time,
//! kept or raised its pace.
//!
//! The price is latency: a command that comes during the nap waits for its
//! end. An initiator that keeps few commands in flight waits for each answer,
//! and loses rate in proportion; one that keeps many does not notice. What
//! the target sees of the initiator does not tell the two apart (qemu-nbd's
//! iscsi driver, fed by fio at QD32, had seen every answer when it sent each
//! command, as a QD2 initiator would), so naps are put to the test: the
//! connection's rate of PDUs over a [`WINDOW`] without naps is compared with
//! the next window's with them, and naps stay for [`KEEP_WINDOWS`] windows
//! only if the rate held at [`KEEP_IF_RATE_PERCENT`] or more; then the test
//! is run again. An initiator that loses by the naps loses one window in
//! `KEEP_WINDOWS + 2`.
//!
//! The connection's loop also naps only where it harms no one else and
//! saves something (see `connection::full_feature`): on a connection thread
//! with CPU to spare (where the target sets the pace a nap only slows it:
//! iscsi-perf at QD32 lost 29 % of its IOPS to untested 60 us naps after
//! every read of 3 PDUs or more), while no other connection is awake (the
//! nap holds the thread), and while reads bring more than one PDU on
//! average (1.125 or more, see
//! `BusyPoll::reads_bring_several`; at QD1 busy polling is the answer).

use std::time::{Duration, Instant};

/// How long a nap lasts: the kernel adds its timer slack (50 us by default
/// for a thread of normal priority), so a nap ends 30-80 us after it began.
/// On the 2-vCPU AMD VM 30 us and 60 us saved about the same.
pub const NAP: Duration = Duration::from_micros(30);

/// How long one measurement of the connection's rate lasts: at 20 000 PDUs a
/// second, about 400 of them.
pub const WINDOW: Duration = Duration::from_millis(20);

/// Windows that naps stay on (or off) after a test, before the next test.
pub const KEEP_WINDOWS: u32 = 8;

/// Naps stay when the rate with them was at least this share of the rate
/// without, in percent: some loss is noise between two windows.
pub const KEEP_IF_RATE_PERCENT: u64 = 97;

/// Where the test stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Measuring the rate without naps.
    Without,
    /// Measuring the rate with naps, against `without` PDUs per second.
    With { without: u64 },
    /// The test is decided: naps (`nap`) or none for `windows` more windows.
    Decided { nap: bool, windows: u32 },
}

/// One connection's naps: whether to take one at a wait.
#[derive(Debug)]
pub struct BatchNap {
    phase: Phase,
    /// When the current window began (None: not yet).
    began: Option<Instant>,
    /// PDUs read in the current window.
    pdus: u64,
}

impl Default for BatchNap {
    fn default() -> Self {
        BatchNap::new()
    }
}

impl BatchNap {
    /// Starts with a window without naps.
    pub fn new() -> BatchNap {
        BatchNap {
            phase: Phase::Without,
            began: None,
            pdus: 0,
        }
    }

    /// The connection read `pdus` PDUs.
    pub fn note_read(&mut self, pdus: u32) {
        self.pdus += u64::from(pdus);
    }

    /// The connection has answered what it read and goes to wait for more,
    /// at `now`. `allowed`: the loop's own conditions for a nap hold (see the
    /// module docs). Returns the nap to take before looking at the socket.
    pub fn at_wait(&mut self, now: Instant, allowed: bool) -> Option<Duration> {
        let Some(began) = self.began else {
            self.began = Some(now);
            self.pdus = 0;
            return None;
        };
        let passed = now.saturating_duration_since(began);
        if passed >= WINDOW {
            let rate = (u128::from(self.pdus) * 1_000_000 / passed.as_micros().max(1)) as u64;
            self.phase = match self.phase {
                Phase::Without => Phase::With { without: rate },
                Phase::With { without } => Phase::Decided {
                    nap: rate * 100 >= without * KEEP_IF_RATE_PERCENT,
                    windows: KEEP_WINDOWS,
                },
                Phase::Decided { windows: 0 | 1, .. } => Phase::Without,
                Phase::Decided { nap, windows } => Phase::Decided {
                    nap,
                    windows: windows - 1,
                },
            };
            self.began = Some(now);
            self.pdus = 0;
        }
        let napping = match self.phase {
            Phase::Without => false,
            Phase::With { .. } => true,
            Phase::Decided { nap, .. } => nap,
        };
        (napping && allowed).then_some(NAP)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `windows` windows of waits every 100 us from `*now`, `per_wait`
    /// PDUs read before each (one rate with naps, another without), and
    /// returns how many waits napped.
    fn run(
        nap: &mut BatchNap,
        now: &mut Instant,
        windows: u32,
        per_wait: impl Fn(bool) -> u32,
    ) -> u32 {
        let step = Duration::from_micros(100);
        let waits = (WINDOW.as_micros() / step.as_micros()) as u32 * windows;
        let mut napped = 0;
        let mut napping = false;
        for _ in 0..waits {
            nap.note_read(per_wait(napping));
            *now += step;
            napping = nap.at_wait(*now, true).is_some();
            napped += u32::from(napping);
        }
        napped
    }

    #[test]
    fn naps_that_keep_the_rate_stay() {
        let mut nap = BatchNap::new();
        let mut now = Instant::now();
        assert_eq!(
            nap.at_wait(now, true),
            None,
            "the first wait only starts a window"
        );
        // The same rate either way: after the test window, naps stay on
        // for KEEP_WINDOWS windows.
        run(&mut nap, &mut now, 2, |_| 2);
        assert!(
            matches!(nap.phase, Phase::Decided { nap: true, .. }),
            "{:?}",
            nap.phase
        );
        let napped = run(&mut nap, &mut now, KEEP_WINDOWS - 1, |_| 2);
        assert!(napped >= (KEEP_WINDOWS - 2) * 190, "napped {napped} waits");
    }

    #[test]
    fn naps_that_cost_rate_are_dropped_and_tried_again_later() {
        let mut nap = BatchNap::new();
        let mut now = Instant::now();
        nap.at_wait(now, true);
        // With naps the initiator sends a third less: off.
        run(&mut nap, &mut now, 2, |napping| if napping { 2 } else { 3 });
        assert_eq!(
            nap.phase,
            Phase::Decided {
                nap: false,
                windows: KEEP_WINDOWS
            }
        );
        let napped = run(&mut nap, &mut now, KEEP_WINDOWS, |napping| {
            if napping {
                2
            } else {
                3
            }
        });
        assert_eq!(napped, 0, "no nap while decided against");
        // Then the test runs again: a window without, one with.
        assert_eq!(nap.phase, Phase::Without);
        run(&mut nap, &mut now, 1, |_| 3);
        assert!(matches!(nap.phase, Phase::With { .. }), "{:?}", nap.phase);
    }

    #[test]
    fn a_loss_within_the_margin_keeps_naps() {
        let mut nap = BatchNap::new();
        let mut now = Instant::now();
        nap.at_wait(now, true);
        // 100 PDUs per wait without, 98 with: 98 %, above the margin.
        run(
            &mut nap,
            &mut now,
            2,
            |napping| if napping { 98 } else { 100 },
        );
        assert!(
            matches!(nap.phase, Phase::Decided { nap: true, .. }),
            "{:?}",
            nap.phase
        );
    }

    #[test]
    fn no_nap_where_the_loop_does_not_allow_one() {
        let mut nap = BatchNap::new();
        let mut now = Instant::now();
        nap.at_wait(now, false);
        for _ in 0..10_000 {
            nap.note_read(4);
            now += Duration::from_micros(100);
            assert_eq!(nap.at_wait(now, false), None);
        }
    }

    proptest::proptest! {
        /// Whatever the reads and the times between waits, the test never
        /// panics and a nap is never longer than NAP.
        #[test]
        fn any_sequence_of_waits(steps in proptest::collection::vec((0u32..1000, 0u64..50_000, proptest::bool::ANY), 0..400)) {
            let mut nap = BatchNap::new();
            let mut now = Instant::now();
            for (pdus, micros, allowed) in steps {
                nap.note_read(pdus);
                now += Duration::from_micros(micros);
                let taken = nap.at_wait(now, allowed);
                proptest::prop_assert!(taken.is_none_or(|d| d == NAP));
                proptest::prop_assert!(allowed || taken.is_none());
            }
        }
    }
}
