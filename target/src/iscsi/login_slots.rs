//! A bound on connections in their login phase: at most
//! `FabricSettings::max_logins_in_progress` at once, and at most
//! `FabricSettings::max_logins_in_progress_per_address` from one host (an
//! IPv4 address, an IPv6 /64: see [`super::host_key`]).
//!
//! Each login holds buffers, a negotiation and a task until its final Login
//! Response or its deadline. Without a bound, a peer opening connections
//! and sending nothing holds all of that for the whole login deadline, as
//! many times as it can connect. The per-host share keeps one such host
//! from taking every slot, however many addresses of its /64 it takes: other initiators, including those logging in
//! again after a network blip, still find room.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use super::host_key::host_key;

/// The slots of one fabric.
#[derive(Debug)]
pub struct LoginSlots {
    total: usize,
    per_address: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    /// Slots held per peer host ([`host_key`]); a host holding none has no
    /// entry, so there are never more entries than slots held.
    by_address: HashMap<IpAddr, usize>,
}

/// One connection's place in its login phase, given back when dropped.
#[derive(Debug)]
pub struct LoginSlot {
    slots: Arc<LoginSlots>,
    address: Option<IpAddr>,
}

/// Why no slot was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NoSlot {
    /// `max_logins_in_progress` connections of all addresses are logging in.
    #[error("{0} connections are already in their login phase (max_logins_in_progress)")]
    Total(usize),
    /// `max_logins_in_progress_per_address` connections from this host
    /// (its IPv4 address or IPv6 /64) are logging in.
    #[error("{0} connections from this host (its IPv4 address or IPv6 /64) are already in their login phase (max_logins_in_progress_per_address)")]
    Address(usize),
}

impl LoginSlots {
    /// Room for `total` logins at once, `per_address` of them from one
    /// address.
    pub fn new(total: usize, per_address: usize) -> Arc<LoginSlots> {
        Arc::new(LoginSlots {
            total,
            per_address,
            held: Mutex::new(Held::default()),
        })
    }

    /// A slot for a connection from `address` (None: a stream with no peer
    /// address, counted in the total only), or why there is none.
    pub fn take(self: &Arc<Self>, address: Option<IpAddr>) -> Result<LoginSlot, NoSlot> {
        let address = address.map(host_key);
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.total >= self.total {
            return Err(NoSlot::Total(self.total));
        }
        if let Some(a) = address {
            if held.by_address.get(&a).copied().unwrap_or(0) >= self.per_address {
                return Err(NoSlot::Address(self.per_address));
            }
            *held.by_address.entry(a).or_insert(0) += 1;
        }
        held.total += 1;
        Ok(LoginSlot {
            slots: self.clone(),
            address,
        })
    }

    /// Slots held now: in all, and by how many hosts.
    pub fn held(&self) -> (usize, usize) {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        (held.total, held.by_address.len())
    }
}

impl Drop for LoginSlot {
    fn drop(&mut self) {
        let mut held = self.slots.held.lock().unwrap_or_else(|e| e.into_inner());
        held.total -= 1;
        if let Some(a) = self.address {
            if let Some(mine) = held.by_address.get_mut(&a) {
                *mine -= 1;
                if *mine == 0 {
                    held.by_address.remove(&a);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([127, 0, 0, last]))
    }

    /// One address gets its share and no more; all addresses together get
    /// the total; a slot given back makes room again, and an address that
    /// holds none leaves no entry behind.
    #[test]
    fn one_address_takes_at_most_its_share_and_the_total_bounds_all() {
        let slots = LoginSlots::new(5, 2);
        let a: Vec<_> = (0..2).map(|_| slots.take(at(1)).unwrap()).collect();
        assert_eq!(slots.take(at(1)).unwrap_err(), NoSlot::Address(2));
        let b = slots.take(at(2)).unwrap();
        let c = slots.take(at(3)).unwrap();
        let none = slots.take(None).unwrap();
        assert_eq!(slots.held(), (5, 3));
        assert_eq!(slots.take(at(4)).unwrap_err(), NoSlot::Total(5));
        assert_eq!(slots.take(None).unwrap_err(), NoSlot::Total(5));
        drop(b);
        let d = slots.take(at(4)).unwrap();
        assert_eq!(slots.take(at(2)).unwrap_err(), NoSlot::Total(5));
        drop(a);
        assert_eq!(slots.held(), (3, 2));
        let again: Vec<_> = (0..2).map(|_| slots.take(at(1)).unwrap()).collect();
        drop((again, c, d, none));
        assert_eq!(slots.held(), (0, 0));
    }

    /// A host's share counts every address it may take: those of one IPv6
    /// /64, and an IPv4 address written IPv4-mapped.
    #[test]
    fn a_hosts_addresses_share_its_share() {
        let slots = LoginSlots::new(10, 2);
        let at = |a: &str| Some(a.parse::<IpAddr>().unwrap());
        let v6 = [
            slots.take(at("2001:db8:1:2::1")).unwrap(),
            slots.take(at("2001:db8:1:2:ffff::9")).unwrap(),
        ];
        assert_eq!(
            slots.take(at("2001:db8:1:2::3")).unwrap_err(),
            NoSlot::Address(2)
        );
        let other = slots.take(at("2001:db8:1:3::1")).unwrap();
        let v4 = slots.take(at("198.51.100.7")).unwrap();
        let mapped = slots.take(at("::ffff:198.51.100.7")).unwrap();
        assert_eq!(
            slots.take(at("198.51.100.7")).unwrap_err(),
            NoSlot::Address(2)
        );
        assert_eq!(slots.held(), (5, 3));
        drop((v6, other, v4, mapped));
        assert_eq!(slots.held(), (0, 0));
    }
}
