//! Failed authentications remembered per initiator address, so that
//! guessing a CHAP secret gets slower with each wrong guess.
//!
//! A login that fails authentication (Login Response status 0x0201) is told
//! so only after a delay: 2 s for an address's first failure, doubling with
//! each further failure from that address, up to a minute, and forgotten
//! ten minutes after its last failure. The delay holds the guessing
//! connection and its login slot, so one address, whatever the number of
//! connections it opens, soon makes only a few guesses a minute. A login
//! with the right secret is never delayed, and a success does not clear an
//! address's failures (a host could otherwise clear them with a login to
//! an open target between guesses).
//!
//! IPv6 addresses count by their /64 prefix, which one host usually holds
//! whole. The table is bounded: past [`MOST_ADDRESSES`] the entry whose
//! last failure is oldest goes.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The delay of an address's first failure.
pub const FIRST_DELAY: Duration = Duration::from_secs(2);
/// The longest delay.
pub const MOST_DELAY: Duration = Duration::from_secs(60);
/// An address's failures are forgotten this long after its last one.
pub const FORGET_AFTER: Duration = Duration::from_secs(600);
/// The most addresses remembered at once.
pub const MOST_ADDRESSES: usize = 4096;

/// One fabric's failed authentications.
#[derive(Debug, Default)]
pub struct AuthFailures {
    by_address: Mutex<HashMap<IpAddr, Failures>>,
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
}

/// The key an address counts under: itself for IPv4, its /64 for IPv6.
fn key(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(_) => address,
        IpAddr::V6(a) => {
            let prefix = u128::from(a) & !((1u128 << 64) - 1);
            IpAddr::V6(prefix.into())
        }
    }
}

impl AuthFailures {
    /// Records a failed authentication from `address` at `now` and returns
    /// how long its Login Response waits. A connection without an address
    /// gets [`FIRST_DELAY`] and is not remembered.
    pub fn failed(&self, address: Option<IpAddr>, now: Instant) -> Duration {
        let Some(address) = address.map(key) else {
            return FIRST_DELAY;
        };
        let mut table = self.by_address.lock().unwrap_or_else(|e| e.into_inner());
        let earlier = table
            .get(&address)
            .filter(|f| now.saturating_duration_since(f.last) < FORGET_AFTER)
            .map_or(0, |f| f.count);
        if !table.contains_key(&address) && table.len() >= MOST_ADDRESSES {
            table.retain(|_, f| now.saturating_duration_since(f.last) < FORGET_AFTER);
            if table.len() >= MOST_ADDRESSES {
                let oldest = table.iter().min_by_key(|(_, f)| f.last).map(|(a, _)| *a);
                if let Some(a) = oldest {
                    table.remove(&a);
                }
            }
        }
        let count = earlier.saturating_add(1);
        table.insert(address, Failures { count, last: now });
        // 2 s, 4 s, 8 s, ... up to MOST_DELAY.
        let doublings = (count - 1).min(16);
        (FIRST_DELAY * (1u32 << doublings)).min(MOST_DELAY)
    }

    /// Addresses remembered now.
    pub fn remembered(&self) -> usize {
        self.by_address
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([198, 51, 100, last]))
    }

    /// Each failure from one address doubles its delay up to a minute;
    /// another address starts at 2 s; ten minutes after its last failure
    /// an address starts again.
    #[test]
    fn an_addresss_delay_doubles_with_each_failure_and_is_forgotten() {
        let f = AuthFailures::default();
        let t = Instant::now();
        let delays: Vec<u64> = (0..8).map(|_| f.failed(v4(1), t).as_secs()).collect();
        assert_eq!(delays, [2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(f.failed(v4(2), t).as_secs(), 2);
        assert_eq!(f.failed(None, t).as_secs(), 2);
        assert_eq!(
            f.remembered(),
            2,
            "no entry for a connection without an address"
        );
        assert_eq!(
            f.failed(v4(1), t + FORGET_AFTER - Duration::from_secs(1))
                .as_secs(),
            60
        );
        let later = t + FORGET_AFTER * 2;
        assert_eq!(f.failed(v4(1), later).as_secs(), 2);
    }

    /// The addresses of one IPv6 /64 count as one; the table keeps at most
    /// [`MOST_ADDRESSES`], the one whose last failure is oldest going.
    #[test]
    fn ipv6_counts_by_its_64_and_the_table_is_bounded() {
        let f = AuthFailures::default();
        let t = Instant::now();
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::7".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(f.failed(Some(a), t).as_secs(), 2);
        assert_eq!(f.failed(Some(b), t).as_secs(), 4);
        assert_eq!(f.failed(Some(other), t).as_secs(), 2);
        let f = AuthFailures::default();
        for i in 0..MOST_ADDRESSES as u32 + 10 {
            let at = t + Duration::from_millis(u64::from(i));
            f.failed(Some(IpAddr::from(i.to_be_bytes())), at);
        }
        assert_eq!(f.remembered(), MOST_ADDRESSES);
        // The oldest went; the newest are remembered.
        let at = t + Duration::from_secs(60);
        assert_eq!(
            f.failed(Some(IpAddr::from(0u32.to_be_bytes())), at)
                .as_secs(),
            2
        );
        let newest = MOST_ADDRESSES as u32 + 9;
        assert_eq!(
            f.failed(Some(IpAddr::from(newest.to_be_bytes())), at)
                .as_secs(),
            4
        );
    }
}
