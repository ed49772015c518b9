//! Failed authentications answered one at a time per initiator host, so
//! that guessing a CHAP secret over many connections at once is no faster
//! than over one.
//!
//! A login that fails authentication (Login Response status 0x0201) is told
//! so no sooner than [`DELAY`] after it failed. A host's failures are
//! queued: past a burst of [`BURST`] told together, each is told [`DELAY`]
//! after the one before it, and a host's answers are queued at most
//! [`MOST_AHEAD`] ahead.
//!
//! - An initiator that fails, is told, and tries again (an administrator
//!   with a mistyped secret) waits 2 s each time, well within every
//!   initiator's login timeout (ESXi's is 5 s).
//! - Logins to several portals at once with one wrong secret (`iscsiadm -m
//!   node -L all` over multipath) hear their first [`BURST`] failures after
//!   2 s and the rest 2 s apart: eight paths are all told within 10 s,
//!   inside open-iscsi's 15 s login timeout.
//! - A host that sends many guesses at once has them answered 2 s apart,
//!   each holding its connection and login slot until then, and once its
//!   queue is [`MOST_AHEAD`] long each waits that long. So each of its
//!   addresses makes at most as many guesses as it has login slots (256 by
//!   default) in a minute, or in the login deadline where that is shorter
//!   (a connection is closed at its deadline, slot and all): about 4 a
//!   second, where it made one a round trip on each connection. The total
//!   of login slots (1024) bounds a host holding several addresses.
//!
//! A login with the right secret is never delayed. Hosts are counted as
//! [`super::host_key`] says (an IPv6 host by its /64, which also puts
//! hosts of one SLAAC subnet together: one's guessing delays the others'
//! failures, never their successful logins). The table keeps at most
//! [`MOST_ADDRESSES`] hosts: those whose queue has run out go first, then
//! the one that runs out soonest.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use blockwire_pdu::{Bhs, LoginStatus, Pdu};
use tokio::time::Instant;

use super::host_key::host_key;

/// The time between a host's failure answers past its burst, and the
/// least time before one.
pub const DELAY: Duration = Duration::from_secs(2);
/// How many failures of a host at once are told together, [`DELAY`] after
/// they failed.
pub const BURST: u32 = 4;
/// How far ahead of now a host's answers may be queued.
pub const MOST_AHEAD: Duration = Duration::from_secs(60);
/// The most hosts remembered at once.
pub const MOST_ADDRESSES: usize = 4096;

/// One fabric's failed authentications.
#[derive(Debug, Default)]
pub struct AuthFailures {
    /// When each host's queue of failures runs out: a burst's worth
    /// ([`BURST`] - 1 times [`DELAY`]) after its latest answer is released.
    booked_until: Mutex<HashMap<IpAddr, Instant>>,
}

impl AuthFailures {
    /// Records a failed authentication from `address` at `now` and returns
    /// how long its Login Response waits. A connection without an address
    /// waits [`DELAY`] and is not queued.
    pub fn failed(&self, address: Option<IpAddr>, now: Instant) -> Duration {
        let Some(host) = address.map(host_key) else {
            return DELAY;
        };
        let burst_span = DELAY * (BURST - 1);
        let mut table = self.booked_until.lock().unwrap_or_else(|e| e.into_inner());
        let previous = table.get(&host).copied().unwrap_or(now);
        if !table.contains_key(&host) && table.len() >= MOST_ADDRESSES {
            table.retain(|_, at| *at > now);
            if table.len() >= MOST_ADDRESSES {
                let soonest = table.iter().min_by_key(|(_, at)| **at).map(|(a, _)| *a);
                if let Some(a) = soonest {
                    table.remove(&a);
                }
            }
        }
        // A virtual queue (the generic cell rate algorithm): each failure
        // books DELAY more; the answer goes out once all but a burst of the
        // booked time has passed, and never sooner than DELAY.
        let booked = (previous.max(now) + DELAY).min(now + MOST_AHEAD + burst_span);
        table.insert(host, booked);
        booked
            .saturating_duration_since(now)
            .saturating_sub(burst_span)
            .max(DELAY)
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
        self.booked_until
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
    /// Failures at once from one address: a burst of four after 2 s, then
    /// 2 s apart, up to a minute ahead. Another address is not held up by
    /// them.
    #[test]
    fn an_addresss_failures_are_answered_two_seconds_apart() {
        let f = AuthFailures::default();
        let t = Instant::now();
        let mut now = t;
        for _ in 0..8 {
            let d = f.failed(v4(1), now);
            assert_eq!(d, DELAY, "a failure after the last was told");
            now += d + Duration::from_millis(100);
        }
        let at_once: Vec<u64> = (0..40).map(|_| f.failed(v4(2), t).as_secs()).collect();
        assert_eq!(at_once[..8], [2, 2, 2, 2, 4, 6, 8, 10]);
        assert!(at_once[32..].iter().all(|&s| s == 60), "{at_once:?}");
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

    /// `BURST` failures at once from `address` at `t`: how long each waits.
    fn burst(f: &AuthFailures, address: Option<IpAddr>, t: Instant) -> Vec<u64> {
        (0..BURST).map(|_| f.failed(address, t).as_secs()).collect()
    }

    /// The addresses of one IPv6 /64 share one queue; the table keeps at most [`MOST_ADDRESSES`], the address
    /// whose queue runs out soonest going first.
    #[test]
    fn ipv6_counts_by_its_64_and_the_table_is_bounded() {
        let f = AuthFailures::default();
        let t = Instant::now();
        let ip = |a: &str| -> Option<IpAddr> { Some(a.parse().unwrap()) };
        assert_eq!(burst(&f, ip("2001:db8:1:2::1"), t), [2; BURST as usize]);
        assert_eq!(f.failed(ip("2001:db8:1:2:ffff::7"), t).as_secs(), 4);
        assert_eq!(f.failed(ip("2001:db8:1:3::1"), t).as_secs(), 2);
        // A host on the portal's link taking more link-local addresses
        // does not start another queue.
        assert_eq!(burst(&f, ip("fe80::1"), t), [2; BURST as usize]);
        assert_eq!(f.failed(ip("fe80::2"), t).as_secs(), 4);
        // IPv4 initiators on a dual-stack portal come as IPv4-mapped
        // addresses: each its own, not all of ::ffff:0:0/96's one /64.
        assert_eq!(burst(&f, ip("::ffff:198.51.100.1"), t), [2; BURST as usize]);
        assert_eq!(f.failed(ip("::ffff:198.51.100.2"), t).as_secs(), 2);
        assert_eq!(f.failed(v4(1), t).as_secs(), 4);
        let f = AuthFailures::default();
        for i in 0..MOST_ADDRESSES as u32 + 10 {
            // 0.1 ms apart: none of their queues runs out meanwhile.
            let at = t + Duration::from_micros(100 * u64::from(i));
            burst(&f, Some(IpAddr::from(i.to_be_bytes())), at);
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
