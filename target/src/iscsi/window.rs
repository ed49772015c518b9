//! The CmdSN window of a session (RFC 7143 §4.2.2.1), as a state machine.
//!
//! Non-immediate commands must be delivered to the SCSI layer in CmdSN
//! order. A command below ExpCmdSN or above MaxCmdSN is silently dropped;
//! one inside the window but ahead of ExpCmdSN waits until the gap closes.
//! MaxCmdSN shrinks as commands are in flight, so the number of commands
//! the target holds (and the memory they pin) is bounded by `depth`.

use std::collections::BTreeMap;

use blockwire_pdu::serial::cmd_sn_in_window;

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
}

impl<T> CmdWindow<T> {
    /// A window starting at `exp_cmd_sn` admitting up to `depth` commands.
    pub fn new(exp_cmd_sn: u32, depth: u32) -> Self {
        CmdWindow {
            exp_cmd_sn,
            depth: depth.max(1),
            in_flight: 0,
            waiting: BTreeMap::new(),
        }
    }

    /// ExpCmdSN to advertise.
    pub fn exp_cmd_sn(&self) -> u32 {
        self.exp_cmd_sn
    }

    /// MaxCmdSN to advertise: ExpCmdSN - 1 (closed) when full.
    pub fn max_cmd_sn(&self) -> u32 {
        // Commands waiting for a gap already lie inside the advertised
        // window, so only delivered ones shrink it.
        let free = self.depth.saturating_sub(self.in_flight);
        self.exp_cmd_sn.wrapping_add(free).wrapping_sub(1)
    }

    /// Commands delivered and not completed.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Whether more commands are delivered than the depth admits. Only
    /// immediate ones take it there: they bypass the window (RFC 7143
    /// §3.2.2.1), so the caller bounds them itself (SCSI commands past the
    /// depth are answered TASK SET FULL).
    pub fn over_depth(&self) -> bool {
        self.in_flight > self.depth
    }

    /// A command arrived. Immediate commands bypass ordering (but still count
    /// against the depth, closing the window to the others; see
    /// [`Self::over_depth`]).
    pub fn admit(&mut self, cmd_sn: u32, immediate: bool, item: T) -> Admission<T> {
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
