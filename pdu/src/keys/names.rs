//! The syntax of names a peer sends: iSCSI names (TargetName, InitiatorName) and the
//! host part of a TargetAddress. Both end up in file names and records (the target's
//! configuration, the initiator's node database), so nothing else may pass.

/// Checks an iSCSI name's syntax (RFC 7143 §4.2.7, RFC 3720 §3.2.6.3):
/// `iqn.YYYY-MM.reversed.domain[:unique]`, `eui.` and 16 hex digits, or
/// `naa.` and 16 or 32 hex digits; at most 223 bytes, only letters,
/// digits, `-`, `.`, `:` and non-ASCII characters. Says what is wrong.
pub fn check_iscsi_name(name: &str) -> Result<(), String> {
    const FORMS: &str =
        "iqn.YYYY-MM.reversed.domain:id, eui. + 16 hex digits or naa. + 16 or 32 hex digits";
    if name.len() > 223 {
        return Err(format!(
            "{name:?} is {} bytes, longer than the 223 an iSCSI name may have",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| c.is_ascii() && !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':')))
    {
        return Err(format!(
            "{name:?} holds {c:?}: iSCSI names have only letters, digits, '-', '.' and ':' ({FORMS})"
        ));
    }
    let lower = name.to_ascii_lowercase();
    let hex = |h: &str, lens: &[usize]| {
        lens.contains(&h.len()) && h.bytes().all(|b| b.is_ascii_hexdigit())
    };
    if let Some(rest) = lower.strip_prefix("iqn.") {
        let b = rest.as_bytes();
        let date_ok = b.len() >= 8
            && b[..4].iter().all(u8::is_ascii_digit)
            && b[4] == b'-'
            && b[5..7].iter().all(u8::is_ascii_digit)
            && (1..=12).contains(&((b[5] - b'0') * 10 + (b[6] - b'0')))
            && b[7] == b'.';
        if !date_ok {
            return Err(format!(
                "{name:?} lacks the date after iqn. (write iqn.YYYY-MM.reversed.domain:id, e.g. iqn.2026-11.com.example:disk0)"
            ));
        }
        let authority = rest[8..].split(':').next().unwrap_or("");
        if authority.is_empty()
            || authority.starts_with('.')
            || authority.ends_with('.')
            || authority.contains("..")
        {
            return Err(format!(
                "{name:?} lacks a reversed domain name after the date (write iqn.YYYY-MM.reversed.domain:id, e.g. iqn.2026-11.com.example:disk0)"
            ));
        }
        Ok(())
    } else if let Some(h) = lower.strip_prefix("eui.") {
        if hex(h, &[16]) {
            Ok(())
        } else {
            Err(format!(
                "{name:?} is not an EUI-64 name (eui. and 16 hex digits)"
            ))
        }
    } else if let Some(h) = lower.strip_prefix("naa.") {
        if hex(h, &[16, 32]) {
            Ok(())
        } else {
            Err(format!(
                "{name:?} is not an NAA name (naa. and 16 or 32 hex digits)"
            ))
        }
    } else {
        Err(format!("{name:?} is not an iSCSI name ({FORMS})"))
    }
}

/// Checks a TargetName or InitiatorName that a peer sent, before it names a file or
/// a record: 1 to 223 bytes, no `/`, no white space or other control character, and
/// not `.` or `..`.
/// This is looser than [`check_iscsi_name`], because targets in use list names that
/// RFC 7143 does not allow (tgtd takes any name), and an initiator must still reach
/// them. Says what is wrong.
pub fn check_peer_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 223 {
        return Err(format!(
            "{name:?} is not a name: an iSCSI name has 1 to 223 bytes"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|&c| c == '/' || c.is_control() || c.is_whitespace())
    {
        return Err(format!(
            "{name:?} holds {c:?}, which no iSCSI name has ({})",
            "names become file names here"
        ));
    }
    if name == "." || name == ".." {
        return Err(format!("{name:?} is not a name"));
    }
    Ok(())
}

/// Checks the host of a TargetAddress (RFC 7143 §13.8: a domain name, an IPv4 address
/// or an IPv6 address, the last without its brackets here): at most 255 bytes of
/// letters, digits, `-`, `_` and `.` in non-empty labels, or an IPv6 address with an
/// optional `%zone`. Says what is wrong.
pub fn check_portal_host(host: &str) -> Result<(), String> {
    if host.is_empty() || host.len() > 255 {
        return Err(format!(
            "{host:?} is not a host: a domain name or an address has 1 to 255 bytes"
        ));
    }
    if host.contains(':') {
        let (address, zone) = host.split_once('%').unwrap_or((host, "lo"));
        let zone_ok = !zone.is_empty()
            && zone
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        return match address.parse::<std::net::Ipv6Addr>() {
            Ok(_) if zone_ok => Ok(()),
            _ => Err(format!("{host:?} is not an IPv6 address")),
        };
    }
    if let Some(c) = host
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "{host:?} holds {c:?}: a host is a domain name or an address (letters, digits, '-', '_' and '.')"
        ));
    }
    if host
        .split('.')
        .any(|label| label.is_empty() || label.starts_with('-'))
    {
        return Err(format!(
            "{host:?} is not a domain name: it has an empty label or one that starts with '-'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iscsi_name_syntax() {
        for ok in [
            "iqn.2026-11.io.blockwire:t",
            "iqn.1993-08.org.debian:01:host2",
            "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test",
            "IQN.2026-01.COM.Example",
            "eui.02004567A425678D",
            "naa.52004567BA64678D",
            "naa.62004567BA64678D0123456789ABCDEF",
        ] {
            check_iscsi_name(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for (bad, why) in [
            ("target0", "not an iSCSI name"),
            ("iqn.26-11.io.x:t", "lacks the date"),
            ("iqn.2026-13.io.x:t", "lacks the date"),
            ("iqn.2026-11:t", "lacks the date"),
            ("iqn.2026-11.:t", "reversed domain"),
            ("iqn.2026-11.io..x:t", "reversed domain"),
            ("iqn.2026-11.io.x:my disk", "holds ' '"),
            ("iqn.2026-11.io.x:a_b", "holds '_'"),
            ("eui.0200", "EUI-64"),
            ("naa.52004567BA64678", "NAA"),
            ("naa.52004567BA64678G", "NAA"),
        ] {
            let e = check_iscsi_name(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
        }
        let long = format!("iqn.2026-11.io.x:{}", "a".repeat(220));
        assert!(check_iscsi_name(&long).unwrap_err().contains("223"));
    }

    #[test]
    fn peer_names() {
        for ok in [
            "iqn.2026-11.io.blockwire:t",
            "mytarget",
            "iqn.2004-04.com.qnap:ts-453:iscsi.disk_1",
        ] {
            check_peer_name(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for (bad, why) in [
            ("", "1 to 223"),
            ("/etc/cron.d", "holds '/'"),
            ("../x", "holds '/'"),
            ("..", "not a name"),
            ("a\nb", "holds '\\n'"),
            ("a\u{85}b", "holds '\\u{85}'"),
            ("iqn.x:a b", "holds ' '"),
        ] {
            let e = check_peer_name(bad).expect_err(bad);
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        assert!(check_peer_name(&"a".repeat(224))
            .unwrap_err()
            .contains("223"));
    }

    #[test]
    fn portal_hosts() {
        for ok in [
            "127.0.0.1",
            "fe80::1",
            "fe80::1%eth0",
            "::1",
            "san-1.example.com",
            "host_2",
        ] {
            check_portal_host(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for (bad, why) in [
            ("", "1 to 255"),
            ("a/b", "holds '/'"),
            ("..", "empty label"),
            (".hidden", "empty label"),
            ("-x", "starts with '-'"),
            ("evil\nhost", "holds '\\n'"),
            ("fe80::1%", "IPv6"),
            ("fe80::1%a/b", "IPv6"),
            ("1:2:3", "IPv6"),
        ] {
            let e = check_portal_host(bad).expect_err(bad);
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        assert!(check_portal_host(&"a".repeat(256))
            .unwrap_err()
            .contains("255"));
    }
}
