//! Failed authentications answered one at a time per initiator address, so
//! that guessing a CHAP secret over many connections at once is no faster
//! than over one.
//!
//! A login that fails authentication (Login Response status 0x0201) is told
//! so [`DELAY`] after the address's previous failure was told, and no
//! sooner than [`DELAY`] after it failed. An initiator that fails, is told,
//! and tries again (an administrator with a mistyped secret) waits 2 s each
//! time, well within every initiator's login timeout (ESXi's is 5 s). A
//! host that sends many guesses at once gets their answers 2 s apart, each
//! holding its connection and login slot until then, until its answers are
//! queued [`MOST_AHEAD`]; past that each waits that long, so the host makes
//! at most as many guesses a minute as it has login slots (256 by default,
//! about 4 a second), where it made one a round trip on each connection. A
//! login with the right secret is never delayed.
//!
//! How far ahead an address's answers are queued is capped at [`MOST_AHEAD`]
//! (past it a connection meets its login deadline first), so an address
//! that stops guessing is answered promptly again soon after. IPv6
//! addresses count by their /64 prefix, which one host usually holds whole.
//! The table keeps at most [`MOST_ADDRESSES`] addresses: those whose queue
//! has run out go first, then the one that runs out soonest.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use blockwire_pdu::{Bhs, LoginStatus, Pdu};
use tokio::time::Instant;

/// The time between an address's failure answers, and the least time
/// before one.
pub const DELAY: Duration = Duration::from_secs(2);
/// How far ahead of now an address's answers may be queued.
pub const MOST_AHEAD: Duration = Duration::from_secs(60);
/// The most addresses remembered at once.
pub const MOST_ADDRESSES: usize = 4096;

/// One fabric's failed authentications.
#[derive(Debug, Default)]
pub struct AuthFailures {
    /// When each address's latest failure answer is (or was) released.
    released_at: Mutex<HashMap<IpAddr, Instant>>,
}

/// The key an address counts under: itself for IPv4, its /64 for IPv6.
/// An IPv4 initiator on a dual-stack portal (`[::]`) arrives as an
/// IPv4-mapped IPv6 address, whose /64 every IPv4 address shares: it is
/// counted as the IPv4 address it is.
fn key(address: IpAddr) -> IpAddr {
    match address.to_canonical() {
        v4 @ IpAddr::V4(_) => v4,
        IpAddr::V6(a) => {
            let prefix = u128::from(a) & !((1u128 << 64) - 1);
            IpAddr::V6(prefix.into())
        }
    }
}

impl AuthFailures {
    /// Records a failed authentication from `address` at `now` and returns
    /// how long its Login Response waits. A connection without an address
    /// waits [`DELAY`] and is not queued.
    pub fn failed(&self, address: Option<IpAddr>, now: Instant) -> Duration {
        let Some(address) = address.map(key) else {
            return DELAY;
        };
        let mut table = self.released_at.lock().unwrap_or_else(|e| e.into_inner());
        let previous = table.get(&address).copied().unwrap_or(now);
        if !table.contains_key(&address) && table.len() >= MOST_ADDRESSES {
            table.retain(|_, at| *at > now);
            if table.len() >= MOST_ADDRESSES {
                let soonest = table.iter().min_by_key(|(_, at)| **at).map(|(a, _)| *a);
                if let Some(a) = soonest {
                    table.remove(&a);
                }
            }
        }
        let release = (previous.max(now) + DELAY).min(now + MOST_AHEAD);
        table.insert(address, release);
        release - now
    }

    /// How long the refusal `response` to a login from `address` waits, at
    /// `now`, before it is sent: for an authentication failure its place in
    /// the address's queue ([`AuthFailures::failed`]); else nothing.
    pub fn refusal_delay(&self, address: Option<IpAddr>, response: &Pdu, now: Instant) -> Duration {
        match &response.bhs {
            Bhs::LoginResponse(l) if l.status == LoginStatus::AUTHENTICATION_FAILURE => {
                self.failed(address, now)
            }
            _ => Duration::ZERO,
        }
    }

    /// Addresses remembered now.
    pub fn remembered(&self) -> usize {
        self.released_at
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

    /// Failures one after another, each told before the next: 2 s each.
    /// Failures at once from one address: 2 s apart, up to a minute ahead.
    /// Another address is not held up by them.
    #[test]
    fn an_addresss_failures_are_answered_two_seconds_apart() {
        let f = AuthFailures::default();
        let t = Instant::now();
        let mut now = t;
        for _ in 0..4 {
            let d = f.failed(v4(1), now);
            assert_eq!(d, DELAY, "a failure after the last was told");
            now += d + Duration::from_millis(100);
        }
        let at_once: Vec<u64> = (0..40).map(|_| f.failed(v4(2), t).as_secs()).collect();
        assert_eq!(at_once[..4], [2, 4, 6, 8]);
        assert!(at_once[29..].iter().all(|&s| s == 60), "{at_once:?}");
        assert_eq!(f.failed(v4(3), t).as_secs(), 2);
        assert_eq!(f.failed(None, t).as_secs(), 2);
        assert_eq!(
            f.remembered(),
            3,
            "no entry for a connection without an address"
        );
        // Once its queue has run out, an address waits 2 s again.
        assert_eq!(f.failed(v4(2), t + MOST_AHEAD).as_secs(), 2);
    }

    /// The addresses of one IPv6 /64 share one queue; the table keeps at
    /// most [`MOST_ADDRESSES`], the address whose queue runs out soonest
    /// going first.
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
        // IPv4 initiators on a dual-stack portal come as IPv4-mapped
        // addresses: each its own, not all of ::ffff:0:0/96's one /64.
        let mapped = |last: u8| -> Option<IpAddr> {
            Some(
                std::net::Ipv4Addr::new(198, 51, 100, last)
                    .to_ipv6_mapped()
                    .into(),
            )
        };
        assert_eq!(f.failed(mapped(1), t).as_secs(), 2);
        assert_eq!(f.failed(mapped(2), t).as_secs(), 2);
        assert_eq!(
            f.failed(Some(IpAddr::from([198, 51, 100, 1])), t).as_secs(),
            4
        );
        let f = AuthFailures::default();
        for i in 0..MOST_ADDRESSES as u32 + 10 {
            // 0.1 ms apart: none of their queues runs out meanwhile.
            let at = t + Duration::from_micros(100 * u64::from(i));
            f.failed(Some(IpAddr::from(i.to_be_bytes())), at);
        }
        assert_eq!(f.remembered(), MOST_ADDRESSES);
        // The first went; the last is still queued.
        let at = t + Duration::from_secs(1);
        assert_eq!(
            f.failed(Some(IpAddr::from(0u32.to_be_bytes())), at)
                .as_secs(),
            2
        );
        let last = MOST_ADDRESSES as u32 + 9;
        let d = f.failed(Some(IpAddr::from(last.to_be_bytes())), at);
        assert!(d > DELAY, "the newest address's queue was forgotten: {d:?}");
    }
}
