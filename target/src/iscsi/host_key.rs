//! Which initiator host a peer address stands for, where a bound is kept
//! per host rather than per address (authentication failures, logins in
//! progress, discovery sessions).
//!
//! - IPv4: the address itself.
//! - An IPv4-mapped IPv6 address (an IPv4 initiator on a dual-stack portal,
//!   `[::]`): the IPv4 address it is, for every IPv4 address shares
//!   `::ffff:0:0/96`'s /64.
//! - IPv6: its /64, which one host usually holds whole (SLAAC and privacy
//!   addresses): a host gains nothing by taking more addresses of it.
//!   Hosts of one subnet whose /64 they share are counted as one; so are
//!   all hosts using link-local addresses (`fe80::/64`) on the portal's
//!   links, for anyone on a link may take as many of those as it likes.

use std::net::IpAddr;

/// The key `address` counts under (see the module docs).
pub fn host_key(address: IpAddr) -> IpAddr {
    match address.to_canonical() {
        v4 @ IpAddr::V4(_) => v4,
        IpAddr::V6(a) => {
            let prefix = u128::from(a) & !((1u128 << 64) - 1);
            IpAddr::V6(prefix.into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(a: &str) -> String {
        host_key(a.parse().unwrap()).to_string()
    }

    #[test]
    fn each_kind_of_address_counts_under_its_host() {
        assert_eq!(key("198.51.100.7"), "198.51.100.7");
        assert_eq!(key("::ffff:198.51.100.7"), "198.51.100.7");
        assert_eq!(key("2001:db8:1:2::1"), "2001:db8:1:2::");
        assert_eq!(key("2001:db8:1:2:ffff::7"), "2001:db8:1:2::");
        assert_eq!(key("fe80::1"), "fe80::");
        assert_eq!(key("fe80::1"), key("fe80::2:3:4:5"));
    }
}
