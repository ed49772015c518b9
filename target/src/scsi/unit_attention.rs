//! Unit attention conditions, kept per I_T nexus (SAM-5 5.14, SPC-4 5.12).
//!
//! A nexus the logical unit has never seen gets POWER ON, RESET, OR BUS
//! DEVICE RESET OCCURRED on its first command, so an initiator learns that
//! any state it assumed (reservations, mode pages) may be gone.

use std::collections::{HashSet, VecDeque};

use blockwire_pdu::scsi::Asc;

use super::ItNexus;

/// Most conditions queued per nexus; older ones are kept and newer dropped
/// beyond this (SPC-4 allows reporting the overflow instead of queueing
/// without bound, which would let a misbehaving peer grow memory).
const MAX_QUEUED: usize = 16;

/// Pending unit attentions of one logical unit.
#[derive(Debug, Default)]
pub(crate) struct UnitAttentions {
    known: HashSet<ItNexus>,
    // Looked up for every command (foldhash: see `InFlight`).
    pending: foldhash::HashMap<ItNexus, VecDeque<Asc>>,
}

impl UnitAttentions {
    /// Records `nexus`; on first sight queues the power-on/reset condition.
    pub fn first_contact(&mut self, nexus: &ItNexus) {
        if !self.known.contains(nexus) {
            self.known.insert(nexus.clone());
            self.push(nexus, Asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET);
        }
    }

    /// Queues `code` for `nexus` unless it is already pending there.
    pub fn push(&mut self, nexus: &ItNexus, code: Asc) {
        let q = self.pending.entry(nexus.clone()).or_default();
        if !q.contains(&code) && q.len() < MAX_QUEUED {
            q.push_back(code);
        }
    }

    /// Queues `code` for every known nexus except `except`.
    pub fn push_others(&mut self, except: Option<&ItNexus>, code: Asc) {
        let all: Vec<ItNexus> = self
            .known
            .iter()
            .filter(|n| Some(*n) != except)
            .cloned()
            .collect();
        for n in all {
            self.push(&n, code);
        }
    }

    /// Every nexus seen since it was last lost.
    pub fn known(&self) -> impl Iterator<Item = &ItNexus> {
        self.known.iter()
    }

    /// Takes the oldest pending condition of `nexus`.
    pub fn take(&mut self, nexus: &ItNexus) -> Option<Asc> {
        let q = self.pending.get_mut(nexus)?;
        let c = q.pop_front();
        if q.is_empty() {
            self.pending.remove(nexus);
        }
        c
    }

    /// Whether `nexus` has a condition pending.
    #[cfg(test)]
    pub fn has_pending(&self, nexus: &ItNexus) -> bool {
        self.pending.get(nexus).is_some_and(|q| !q.is_empty())
    }

    /// A reset: every nexus's queue is replaced by `code` (older conditions
    /// are subsumed by the reset itself).
    pub fn reset_all(&mut self, code: Asc) {
        self.pending.clear();
        let all: Vec<ItNexus> = self.known.iter().cloned().collect();
        for n in all {
            self.push(&n, code);
        }
    }

    /// I_T nexus loss: the nexus is forgotten, so if it returns it starts
    /// over with a power-on/reset condition like any new nexus.
    pub fn forget(&mut self, nexus: &ItNexus) {
        self.known.remove(nexus);
        self.pending.remove(nexus);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_contact_queue_and_reset() {
        let a = ItNexus::iscsi("iqn.a", [0, 1, 2, 3, 4, 5], "iqn.t", 1);
        let b = ItNexus::iscsi("iqn.b", [0, 1, 2, 3, 4, 5], "iqn.t", 1);
        let mut u = UnitAttentions::default();
        u.first_contact(&a);
        u.first_contact(&a);
        assert_eq!(u.take(&a), Some(Asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET));
        assert_eq!(u.take(&a), None);
        u.first_contact(&b);
        u.push_others(Some(&b), Asc::MODE_PARAMETERS_CHANGED);
        assert_eq!(u.take(&a), Some(Asc::MODE_PARAMETERS_CHANGED));
        assert_eq!(u.take(&b), Some(Asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET));
        assert!(!u.has_pending(&b));
        for _ in 0..100 {
            u.push(&a, Asc::new(0x2a, 0x09));
        }
        u.reset_all(Asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED);
        assert_eq!(u.take(&a), Some(Asc::BUS_DEVICE_RESET_FUNCTION_OCCURRED));
        assert_eq!(u.take(&a), None);
        u.forget(&a);
        u.first_contact(&a);
        assert_eq!(u.take(&a), Some(Asc::POWER_ON_RESET_OR_BUS_DEVICE_RESET));
    }
}
