//! Commands executing on a unit, per nexus, for PREEMPT AND ABORT (SPC-4
//! 5.12.11.5): no write of a fenced initiator may reach the medium after
//! the fencing initiator got GOOD. A command counts from before its
//! reservation check, so one that passed the check before the preemption
//! is waited for, and one that checks after it conflicts.
//!
//! Each command is counted under the epoch it entered in. A preemption
//! opens a new epoch once it is committed and waits only for the commands
//! of the preempted nexuses counted before: whatever they send after (a
//! fenced node still READs under the Write Exclusive types, on every path)
//! checks the new reservation state, so waiting for it too would hold the
//! PREEMPT AND ABORT until the node stops sending. The nexuses are found
//! here, not among those the unit keeps unit attentions for: a fenced
//! node's connection has often ended already (the reason it is fenced),
//! which forgets the nexus there while its commands still run.

use std::sync::Mutex;
use std::time::Duration;

use super::wake::QuietCondvar;
use super::ItNexus;

/// One nexus's commands: those of the epoch it last saw, and older ones.
#[derive(Debug, Default, Clone, Copy)]
struct Count {
    epoch: u64,
    current: usize,
    older: usize,
}

impl Count {
    /// Moves the commands counted before `epoch` to the older ones.
    fn at(&mut self, epoch: u64) {
        if self.epoch < epoch {
            self.older += self.current;
            self.current = 0;
            self.epoch = epoch;
        }
    }

    /// Commands that entered before `epoch` (an epoch opened since counts
    /// its commands as older too: then this is an upper bound).
    fn before(&self, epoch: u64) -> usize {
        if self.epoch < epoch {
            self.older + self.current
        } else {
            self.older
        }
    }

    fn total(&self) -> usize {
        self.older + self.current
    }
}

#[derive(Debug, Default)]
struct State {
    epoch: u64,
    // foldhash, not SipHash: every command holds and releases its nexus
    // here, and SipHash of the two port names cost about 2 % of a 4 KiB WRITE.
    counts: foldhash::HashMap<ItNexus, Count>,
}

/// Commands executing on one unit, per nexus (see the module).
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    state: Mutex<State>,
    idle: QuietCondvar,
}

/// One command counted in; it leaves with [`InFlight::release`] (or the
/// guard of [`InFlight::enter`]) naming the epoch it entered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry(u64);

/// Removes its command from [`InFlight`] when dropped.
pub(crate) struct InFlightGuard<'a> {
    owner: &'a InFlight,
    nexus: &'a ItNexus,
    entry: Entry,
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn enter<'a>(&'a self, nexus: &'a ItNexus) -> InFlightGuard<'a> {
        let entry = self.hold(nexus);
        InFlightGuard {
            owner: self,
            nexus,
            entry,
        }
    }

    /// Counts one command of `nexus` in until [`InFlight::release`]: for a
    /// pipelined WRITE, whose chunk writes outlive any borrowed guard.
    pub(crate) fn hold(&self, nexus: &ItNexus) -> Entry {
        let mut st = self.lock();
        let epoch = st.epoch;
        let c = st.counts.entry(nexus.clone()).or_default();
        c.at(epoch);
        c.current += 1;
        Entry(epoch)
    }

    /// Ends one [`InFlight::hold`] of `nexus`.
    pub(crate) fn release(&self, nexus: &ItNexus, entry: Entry) {
        let mut st = self.lock();
        let epoch = st.epoch;
        if let Some(c) = st.counts.get_mut(nexus) {
            c.at(epoch);
            if entry.0 == c.epoch && c.current > 0 {
                c.current -= 1;
            } else {
                c.older = c.older.saturating_sub(1);
            }
            if c.total() == 0 {
                st.counts.remove(nexus);
            }
        }
        drop(st);
        self.idle.notify_all();
    }

    /// Commands executing on the unit now.
    pub(crate) fn total(&self) -> usize {
        self.lock().counts.values().map(Count::total).sum()
    }

    /// Opens a new epoch: the commands counted so far are those
    /// [`InFlight::wait_before`] waits for. Called once a preemption is
    /// committed.
    pub(crate) fn new_epoch(&self) -> u64 {
        let mut st = self.lock();
        st.epoch += 1;
        st.epoch
    }

    /// Waits, at most `limit` in all, until no nexus `pick` selects has a
    /// command that entered before `epoch`; the nexuses that still had some
    /// then.
    pub(crate) fn wait_before(
        &self,
        epoch: u64,
        pick: impl Fn(&ItNexus) -> bool,
        limit: Duration,
    ) -> Vec<ItNexus> {
        let waited_for = |n: &ItNexus, c: &Count| c.before(epoch) > 0 && pick(n);
        let st = self.lock();
        let st = self.idle.wait_timeout_while(st, limit, |st| {
            st.counts.iter().any(|(n, c)| waited_for(n, c))
        });
        st.counts
            .iter()
            .filter(|(n, c)| waited_for(n, c))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Waits until `nexus` has no command on the unit, at most `limit`;
    /// false if some were still running then.
    #[cfg(test)]
    pub(crate) fn wait_idle(&self, nexus: &ItNexus, limit: Duration) -> bool {
        let st = self.lock();
        let st = self.idle.wait_timeout_while(st, limit, |st| {
            st.counts.get(nexus).is_some_and(|c| c.total() > 0)
        });
        st.counts.get(nexus).is_none_or(|c| c.total() == 0)
    }
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.owner.release(self.nexus, self.entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A preemption waits for the commands counted before it, not for
    /// those that entered after, and sees a nexus's older commands however
    /// its commands leave.
    #[test]
    fn a_new_epoch_waits_only_for_the_commands_before_it() {
        let f = InFlight::default();
        let (b, other) = (
            ItNexus::iscsi("iqn.b", [0x40, 0, 0, 0, 0, 1], "iqn.t", 1),
            ItNexus::iscsi("iqn.c", [0x40, 0, 0, 0, 0, 1], "iqn.t", 1),
        );
        let old = f.hold(&b);
        let bystander = f.hold(&other);
        let epoch = f.new_epoch();
        let new = f.hold(&b);
        let only_b = |n: &ItNexus| *n == b;
        assert_eq!(
            f.wait_before(epoch, only_b, Duration::from_millis(10)),
            vec![b.clone()]
        );
        f.release(&b, old);
        assert!(f
            .wait_before(epoch, only_b, Duration::from_millis(10))
            .is_empty());
        assert_eq!(f.total(), 2, "the newer command and the bystander");
        f.release(&b, new);
        f.release(&other, bystander);
        assert_eq!(f.total(), 0);
    }
}
