//! Sending the first responses of a batch while the rest still run.
//!
//! One socket read often brings many commands (16 on average with 4 KiB
//! READs at QD32 on the 2-vCPU VM of interop/results/bench-vs-tgtd.md). On
//! a connection thread the reader, the writer and the commands share one
//! thread, so without a pause the writer sends nothing until the whole
//! batch has run: the initiator waits for the batch, then the target waits
//! for the initiator's next commands, and neither overlaps the other.
//!
//! Letting the writer run after every few commands sends those responses
//! at once, so an initiator on another CPU handles them while the target
//! runs the rest. Each pause costs a `sendmsg` and a look at the socket, so
//! it pays only while the connection's thread has CPU to spare: there the
//! initiator sets the pace and an earlier response is an earlier next
//! command. On a thread that is busy all the time the target sets the pace,
//! and the pauses only spend its CPU (iscsi-perf at QD32 on the same VM
//! lost 13 % of its IOPS to a pause every 4 commands, while the Python
//! client gained 25-40 %).
//!
//! Whether the thread has CPU to spare is measured over windows of a few
//! milliseconds: the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`) against
//! the time passed. The decision is made here; the connection's loop does
//! the pausing.

use std::time::{Duration, Instant};

/// How long one measurement of the thread's load lasts: long enough for
/// several batches, short enough to follow a change of client.
const WINDOW: Duration = Duration::from_millis(5);

/// A thread busy for less than this share of a window has CPU to spare
/// (in percent).
const SPARE_BELOW_PERCENT: u128 = 75;

/// Commands handled between pauses while the thread has CPU to spare: on
/// the 2-vCPU VM a pause every 4 gave the Python client's QD32 READs the
/// most IOPS (every 1: 8.2-8.8 us of target CPU per command against 5.5-5.6
/// without pauses; every 8: half the gain).
pub const PAUSE_EVERY: u32 = 4;

/// Tells a connection's loop when to let its writer send what the commands
/// handled so far produced.
#[derive(Debug)]
pub struct EarlyResponses {
    /// When the current window began, and the thread's CPU time then.
    window: Option<(Instant, Duration)>,
    /// Whether the thread had CPU to spare in the last whole window.
    spare: bool,
}

impl Default for EarlyResponses {
    fn default() -> Self {
        EarlyResponses::new()
    }
}

impl EarlyResponses {
    /// No measurement yet: no pauses until the first window has passed.
    pub fn new() -> EarlyResponses {
        EarlyResponses {
            window: None,
            spare: false,
        }
    }

    /// Whether the thread had CPU to spare in the last whole window.
    pub fn spare(&self) -> bool {
        self.spare
    }

    /// The connection goes to wait on its socket. `thread_cpu` is read
    /// only when a window ends (it costs a system call).
    pub fn at_wait(&mut self, now: Instant, thread_cpu: impl FnOnce() -> Duration) {
        match self.window {
            Some((began, _)) if now.saturating_duration_since(began) < WINDOW => {}
            Some((began, cpu_then)) => {
                let cpu_now = thread_cpu();
                let busy = cpu_now.saturating_sub(cpu_then).as_nanos();
                let passed = now.saturating_duration_since(began).as_nanos();
                self.spare = busy * 100 < passed * SPARE_BELOW_PERCENT;
                self.window = Some((now, cpu_now));
            }
            None => self.window = Some((now, thread_cpu())),
        }
    }

    /// Whether to pause after the `handled`th command of this socket read.
    pub fn pause_after(&self, handled: u32) -> bool {
        self.spare && handled.is_multiple_of(PAUSE_EVERY)
    }
}

/// The CPU time the calling thread has used.
pub fn this_thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    #[test]
    fn no_pauses_before_the_first_window_has_passed() {
        let mut early = EarlyResponses::new();
        let t0 = Instant::now();
        early.at_wait(t0, || Duration::ZERO);
        early.at_wait(after(t0, 1), || panic!("read inside a window"));
        assert!(!early.pause_after(4));
    }

    #[test]
    fn a_thread_with_cpu_to_spare_pauses_every_few_commands() {
        let mut early = EarlyResponses::new();
        let t0 = Instant::now();
        early.at_wait(t0, || Duration::from_millis(100));
        // Busy 2 ms of 6: spare.
        early.at_wait(after(t0, 6), || Duration::from_millis(102));
        assert!(early.pause_after(PAUSE_EVERY));
        assert!(early.pause_after(2 * PAUSE_EVERY));
        assert!(!early.pause_after(PAUSE_EVERY + 1));
    }

    #[test]
    fn a_busy_thread_does_not_pause_and_a_quiet_one_starts_again() {
        let mut early = EarlyResponses::new();
        let t0 = Instant::now();
        early.at_wait(t0, || Duration::ZERO);
        // Busy 5.5 ms of 6.
        early.at_wait(after(t0, 6), || Duration::from_micros(5500));
        assert!(!early.pause_after(PAUSE_EVERY));
        // The next window: busy 1 ms of 6.
        early.at_wait(after(t0, 12), || Duration::from_micros(6500));
        assert!(early.pause_after(PAUSE_EVERY));
    }

    #[test]
    fn the_thread_clock_moves_with_work() {
        // Spins until the clock shows 5 ms of this thread's work: on a
        // loaded machine 20 ms of wall time may hold less than that, so
        // only a clock that stands still runs out the 30 s.
        let before = this_thread_cpu();
        let give_up = Instant::now() + Duration::from_secs(30);
        let mut x = 0u64;
        while this_thread_cpu() <= before + Duration::from_millis(5) {
            assert!(Instant::now() < give_up, "the thread clock did not move");
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
    }
}
