//! The CmdSN window of a session (RFC 7143 §4.2.2.1), as a state machine.
//!
//! Non-immediate commands must be delivered to the SCSI layer in CmdSN
//! order. A command below ExpCmdSN or above MaxCmdSN is silently dropped;
//! one inside the window but ahead of ExpCmdSN waits until the gap closes.
//! MaxCmdSN stops advancing while commands are in flight, so the ordered
//! commands the target holds are bounded by `depth`. It never moves back:
//! an initiator takes MaxCmdSN only when it is greater than the one it has
//! (§4.2.2.1), so the window advertised once is the window it may fill, and
//! a command inside it must be taken. Immediate commands bypass the window;
//! the caller refuses them once `depth` commands are in flight
//! ([`CmdWindow::over_depth`]), so all told the target holds at most twice
//! `depth` (what their data may pin is bounded apart, by the connection's
//! READ and write budgets).

use std::collections::BTreeMap;

use blockwire_pdu::serial::{cmd_sn_in_window, sn_gt};

/// What to do with an arriving command.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission<T> {
    /// Deliver these commands now, in this order (the arrival plus any
    /// queued commands whose gap it closed).
    Deliver(Vec<T>),
    /// Held until the commands before it arrive.
    Queued,
    /// Outside the window: drop without an answer.
    Dropped,
}

/// CmdSN bookkeeping for one session.
#[derive(Debug)]
pub struct CmdWindow<T> {
    exp_cmd_sn: u32,
    depth: u32,
    /// Commands delivered and not yet completed.
    in_flight: u32,
    /// Commands that arrived ahead of a gap, by CmdSN.
    waiting: BTreeMap<u32, T>,
    /// The highest MaxCmdSN the window has stood at: what the initiator
    /// may have been told, which an immediate command (counted in flight,
    /// outside the window) must not take back.
    max_cmd_sn: u32,
}

impl<T> CmdWindow<T> {
    /// A window starting at `exp_cmd_sn` admitting up to `depth` commands.
    pub fn new(exp_cmd_sn: u32, depth: u32) -> Self {
        let depth = depth.max(1);
        CmdWindow {
            exp_cmd_sn,
            depth,
            in_flight: 0,
            waiting: BTreeMap::new(),
            max_cmd_sn: exp_cmd_sn.wrapping_add(depth).wrapping_sub(1),
        }
    }

    /// ExpCmdSN to advertise.
    pub fn exp_cmd_sn(&self) -> u32 {
        self.exp_cmd_sn
    }

    /// MaxCmdSN to advertise: ExpCmdSN - 1 (closed) when full.
    pub fn max_cmd_sn(&self) -> u32 {
        self.max_cmd_sn
    }

    /// Moves MaxCmdSN up to what the free slots allow, never down.
    fn widen(&mut self) {
        // Commands waiting for a gap already lie inside the advertised
        // window, so only delivered ones hold it back.
        let free = self.depth.saturating_sub(self.in_flight);
        let max = self.exp_cmd_sn.wrapping_add(free).wrapping_sub(1);
        if sn_gt(max, self.max_cmd_sn) {
            self.max_cmd_sn = max;
        }
    }

    /// Commands delivered and not completed.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Whether more commands are delivered than the depth admits. Only
    /// immediate ones take it there: they bypass the window (RFC 7143
    /// §3.2.2.1), so the caller bounds them itself (SCSI commands past the
    /// depth are answered TASK SET FULL). The ordered commands of the
    /// window already advertised may still come on top of them.
    pub fn over_depth(&self) -> bool {
        self.in_flight > self.depth
    }

    /// A command arrived. Immediate commands bypass ordering (but still count
    /// against the depth, holding MaxCmdSN back from the others until they
    /// end; see [`Self::over_depth`]).
    pub fn admit(&mut self, cmd_sn: u32, immediate: bool, item: T) -> Admission<T> {
        let admission = self.admit_one(cmd_sn, immediate, item);
        self.widen();
        admission
    }

    fn admit_one(&mut self, cmd_sn: u32, immediate: bool, item: T) -> Admission<T> {
        if immediate {
            self.in_flight += 1;
            return Admission::Deliver(vec![item]);
        }
        if !cmd_sn_in_window(cmd_sn, self.exp_cmd_sn, self.max_cmd_sn()) {
            return Admission::Dropped;
        }
        if cmd_sn != self.exp_cmd_sn {
            if self.waiting.contains_key(&cmd_sn) {
                return Admission::Dropped;
            }
            self.waiting.insert(cmd_sn, item);
            return Admission::Queued;
        }
        let mut out = vec![item];
        self.advance();
        while let Some(next) = self.waiting.remove(&self.exp_cmd_sn) {
            out.push(next);
            self.advance();
        }
        Admission::Deliver(out)
    }

    /// Counts an already delivered command and moves ExpCmdSN past it.
    fn advance(&mut self) {
        self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
        self.in_flight += 1;
    }

    /// A non-data command that takes a CmdSN but holds no slot (NOP-Out,
    /// Text, Logout, TMF, non-immediate) advanced the window and finished.
    pub fn complete(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.widen();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn in_order_delivery_and_drops() {
        let mut w = CmdWindow::new(10, 4);
        assert_eq!(w.max_cmd_sn(), 13);
        assert_eq!(w.admit(10, false, 'a'), Admission::Deliver(vec!['a']));
        assert_eq!(w.exp_cmd_sn(), 11);
        assert_eq!(w.max_cmd_sn(), 13);
        assert_eq!(w.admit(9, false, 'x'), Admission::Dropped);
        assert_eq!(w.admit(14, false, 'x'), Admission::Dropped);
        assert_eq!(w.admit(12, false, 'c'), Admission::Queued);
        assert_eq!(w.admit(11, false, 'b'), Admission::Deliver(vec!['b', 'c']));
        assert_eq!(w.in_flight(), 3);
        assert_eq!(w.max_cmd_sn(), 13);
        w.complete();
        w.complete();
        assert_eq!(w.max_cmd_sn(), 15);
    }

    #[test]
    fn full_window_closes() {
        let mut w = CmdWindow::new(0, 2);
        w.admit(0, false, ());
        w.admit(1, false, ());
        assert_eq!(w.max_cmd_sn(), w.exp_cmd_sn().wrapping_sub(1));
        assert_eq!(w.admit(2, false, ()), Admission::Dropped);
    }

    /// An immediate command runs while the initiator fills the window it
    /// was given: the last command of that window is taken, not dropped
    /// (which left a CmdSN gap no later command could close, so every
    /// command after it waited for good).
    #[test]
    fn an_immediate_command_does_not_take_back_the_window() {
        let mut w = CmdWindow::new(10, 4);
        assert_eq!(w.max_cmd_sn(), 13);
        assert_eq!(w.admit(10, true, 'i'), Admission::Deliver(vec!['i']));
        assert_eq!(w.max_cmd_sn(), 13, "MaxCmdSN taken back");
        for (sn, c) in [(10, 'a'), (11, 'b'), (12, 'c'), (13, 'd')] {
            assert_eq!(
                w.admit(sn, false, c),
                Admission::Deliver(vec![c]),
                "CmdSN {sn}"
            );
        }
        // Full (five in flight for a depth of four): closed until two end.
        assert_eq!(w.max_cmd_sn(), w.exp_cmd_sn().wrapping_sub(1));
        assert_eq!(w.admit(14, false, 'x'), Admission::Dropped);
        w.complete();
        assert_eq!(w.max_cmd_sn(), 13);
        w.complete();
        assert_eq!(w.max_cmd_sn(), 14);
        assert_eq!(w.admit(14, false, 'e'), Admission::Deliver(vec!['e']));
    }

    #[derive(Debug, Clone)]
    enum Step {
        /// The next non-immediate command, in order.
        Next,
        /// An immediate command.
        Immediate,
        /// The oldest command in flight ends.
        Complete,
    }

    proptest! {
        // Whatever mix of immediate and ordered commands and completions
        // comes, MaxCmdSN never moves back, every ordered command inside
        // the window advertised is taken, and, with immediate commands
        // refused past the depth as the caller refuses them, what the
        // window holds stays within twice the depth.
        #[test]
        fn max_cmd_sn_never_moves_back(
            start: u32,
            depth in 1u32..8,
            steps in proptest::collection::vec(
                prop_oneof![Just(Step::Next), Just(Step::Immediate), Just(Step::Complete)],
                0..64,
            ),
        ) {
            let mut w = CmdWindow::new(start, depth);
            let mut next = start;
            for step in steps {
                let before = w.max_cmd_sn();
                match step {
                    Step::Next => {
                        let inside = cmd_sn_in_window(next, w.exp_cmd_sn(), before);
                        let a = w.admit(next, false, ());
                        prop_assert_eq!(inside, a == Admission::Deliver(vec![()]), "CmdSN {}", next);
                        if inside {
                            next = next.wrapping_add(1);
                        }
                    }
                    Step::Immediate => {
                        w.admit(0, true, ());
                        if w.over_depth() {
                            // TASK SET FULL: its slot is freed at once.
                            w.complete();
                        }
                    }
                    Step::Complete => w.complete(),
                }
                prop_assert!(!sn_gt(before, w.max_cmd_sn()), "MaxCmdSN {} -> {}", before, w.max_cmd_sn());
                prop_assert!(w.in_flight() <= 2 * depth, "{} in flight", w.in_flight());
            }
        }
    }

    proptest! {
        // Any arrival order of a window's worth of commands delivers each
        // exactly once, in CmdSN order.
        #[test]
        fn delivers_every_command_once_in_order(start: u32, perm in Just((0u32..16).collect::<Vec<_>>()).prop_shuffle()) {
            let mut w = CmdWindow::new(start, 16);
            let mut delivered = Vec::new();
            for i in perm {
                if let Admission::Deliver(v) = w.admit(start.wrapping_add(i), false, i) {
                    delivered.extend(v);
                }
            }
            prop_assert_eq!(delivered, (0u32..16).collect::<Vec<_>>());
        }
    }
}
