//! Registration with an iSNS server (RFC 4171), as `[isns] server` asks:
//! the daemon's targets, portals and portal groups are registered as one
//! network entity and kept registered while it runs, so initiators find
//! them through the server (`iscsiadm -m discovery -t isns`), including
//! after live changes, and lose them when the daemon stops.

pub mod driver;
pub mod registrar;
pub mod registration;

pub use driver::Client;
pub use registration::Registration;

pub use blockwire_pdu::isns::DEFAULT_PORT;

/// The registration period asked for by default, in seconds: the server
/// forgets the entity this long after its last message if the daemon dies
/// without deregistering.
pub const DEFAULT_PERIOD_SECS: u32 = 900;

/// `host`, `host:port`, `a.b.c.d`, `[v6]` or `[v6]:port` with the iSNS port
/// filled in where none is given.
pub fn server_address(s: &str) -> Result<String, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err(
            "is empty: give the iSNS server's host name or address, e.g. \"isns.example:3205\""
                .into(),
        );
    }
    if s.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(s.to_string());
    }
    if let Ok(ip) = s.parse::<std::net::IpAddr>() {
        return Ok(std::net::SocketAddr::new(ip, DEFAULT_PORT).to_string());
    }
    if s.starts_with('[') {
        let inner = s.trim_start_matches('[').trim_end_matches(']');
        return match inner.parse::<std::net::Ipv6Addr>() {
            Ok(ip) => Ok(std::net::SocketAddr::new(ip.into(), DEFAULT_PORT).to_string()),
            Err(_) => Err(format!("{s:?} is not an IPv6 address in brackets")),
        };
    }
    match s.rsplit_once(':') {
        Some((host, port)) => {
            let valid_host = !host.is_empty() && !host.contains(':');
            match port.parse::<u16>() {
                Ok(p) if p != 0 && valid_host => Ok(s.to_string()),
                _ => Err(format!(
                    "{s:?} is not HOST:PORT (the port 1-65535; IPv6 addresses in brackets)"
                )),
            }
        }
        None if s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.') =>
        {
            Ok(format!("{s}:{DEFAULT_PORT}"))
        }
        None => Err(format!("{s:?} is not a host name or address")),
    }
}

/// The Entity Identifier used when `[isns] entity` is not set: this
/// machine's host name (as target-isns and open-iscsi do), so that the
/// daemon's entity keeps its name across restarts.
pub fn default_entity() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "blockwire-target".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_addresses_get_the_isns_port() {
        assert_eq!(server_address("192.0.2.7").unwrap(), "192.0.2.7:3205");
        assert_eq!(server_address("192.0.2.7:4000").unwrap(), "192.0.2.7:4000");
        assert_eq!(server_address("isns.example").unwrap(), "isns.example:3205");
        assert_eq!(
            server_address("isns.example:13205").unwrap(),
            "isns.example:13205"
        );
        assert_eq!(server_address("[::1]").unwrap(), "[::1]:3205");
        assert_eq!(server_address("[::1]:9").unwrap(), "[::1]:9");
        assert_eq!(server_address("::1").unwrap(), "[::1]:3205");
        for bad in ["", "host:0", "host:x", "a b", "[zz]", ":3205"] {
            assert!(server_address(bad).is_err(), "{bad:?} taken");
        }
    }
}
