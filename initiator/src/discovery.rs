//! SendTargets discovery (RFC 7143 §12.3, Appendix C), without I/O.
//!
//! [`SendTargets`] builds the Text Requests of one `SendTargets=All`
//! exchange (including the empty requests that fetch continued text) and
//! turns the assembled response into [`DiscoveredTarget`]s.

use blockwire_pdu::keys::{
    check_peer_name, check_portal_host, encode_text, TextAssembler, TextPairs,
};
use blockwire_pdu::pdu::{TextRequest, RESERVED_TAG};
use blockwire_pdu::{Bhs, Lun, Pdu};

use crate::error::{Error, Result};

/// One network portal of a target.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Portal {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Target portal group tag.
    pub tpgt: u16,
}

impl Portal {
    /// `host:port` (IPv6 in brackets), ready for `TcpStream::connect`.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl std::fmt::Display for Portal {
    /// iscsiadm's form: `HOST:PORT,TPGT`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{},{}", self.address(), self.tpgt)
    }
}

/// A target a SendTargets response listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredTarget {
    /// TargetName.
    pub name: String,
    /// Its portals (the discovery portal when the target listed none).
    pub portals: Vec<Portal>,
}

/// What a SendTargets response listed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendTargetsList {
    /// The targets whose names can name files, with their portals.
    pub targets: Vec<DiscoveredTarget>,
    /// What was left out, and why: names that cannot name files (with their
    /// addresses) and addresses that are not `HOST[:PORT][,TPGT]`.
    pub refused: Vec<String>,
}

/// Parses `host:port,tpgt`, `[v6]:port,tpgt`, `host,tpgt` or `host`. A
/// missing port is iSCSI's IANA port, 3260 (RFC 7143 §13.8), whatever port
/// the answer came through; a missing tag is `default`'s. The host must be
/// a domain name or an address (see [`check_portal_host`]); says what is
/// wrong.
pub fn parse_target_address(value: &str, default: &Portal) -> Result<Portal, String> {
    const IANA_PORT: u16 = 3260;
    let number = |what: &str, n: &str| {
        n.trim()
            .parse()
            .map_err(|_| format!("{value:?} has {what} {n:?}, not a number up to 65535"))
    };
    let (addr, tpgt) = match value.rsplit_once(',') {
        Some((a, t)) => (a, number("portal group tag", t)?),
        None => (value, default.tpgt),
    };
    let (host, port) = if let Some(rest) = addr.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{value:?} opens '[' and never closes it"))?;
        let port = match after.strip_prefix(':') {
            Some(p) => number("port", p)?,
            None if after.is_empty() => IANA_PORT,
            None => return Err(format!("{value:?} has {after:?} after ']'")),
        };
        (h.to_owned(), port)
    } else {
        match addr.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h.to_owned(), number("port", p)?),
            _ => (addr.to_owned(), IANA_PORT),
        }
    };
    check_portal_host(&host)?;
    Ok(Portal { host, port, tpgt })
}

/// Groups SendTargets pairs into targets. `discovery_portal` stands in for
/// targets listed without a TargetAddress (RFC 7143 Appendix C).
///
/// The names and hosts end up in file names and records (the CLI's node database
/// keeps `nodes/<TargetName>/<host>,<port>,<tpgt>`), so a TargetName that holds a `/`
/// or a control character (no iSCSI name does, RFC 7143 §4.2.7) is left out with its
/// addresses, and so is a TargetAddress whose host is not a host;
/// [`SendTargetsList::refused`] says why.
pub fn parse_send_targets(pairs: &TextPairs, discovery_portal: &Portal) -> SendTargetsList {
    let mut list = SendTargetsList::default();
    // Whether the last TargetName was taken: its addresses follow it.
    let mut taking = false;
    for (k, v) in pairs {
        match k.as_str() {
            "TargetName" => match check_peer_name(v) {
                Ok(()) => {
                    taking = true;
                    list.targets.push(DiscoveredTarget {
                        name: v.clone(),
                        portals: Vec::new(),
                    });
                }
                Err(why) => {
                    taking = false;
                    list.refused.push(format!("TargetName left out: {why}"));
                }
            },
            "TargetAddress" if taking => {
                let t = list.targets.last_mut().expect("taking a listed target");
                match parse_target_address(v, discovery_portal) {
                    Ok(p) => t.portals.push(p),
                    Err(why) => list
                        .refused
                        .push(format!("TargetAddress of {} left out: {why}", t.name)),
                }
            }
            _ => {}
        }
    }
    for t in &mut list.targets {
        if t.portals.is_empty() {
            t.portals.push(discovery_portal.clone());
        }
    }
    list
}

/// One SendTargets exchange.
#[derive(Debug)]
pub struct SendTargets {
    itt: u32,
    cmd_sn: u32,
    assembler: TextAssembler,
    portal: Portal,
}

/// What to do after a Text Response.
#[derive(Debug)]
pub enum TextStep {
    /// Send this request (continued text).
    Send(Pdu),
    /// The exchange is over.
    Done(SendTargetsList),
}

impl SendTargets {
    /// An exchange with task tag `itt` and CmdSN `cmd_sn` (requests are
    /// sent immediate), listing `portal` for targets without addresses.
    pub fn new(itt: u32, cmd_sn: u32, portal: Portal) -> SendTargets {
        SendTargets {
            itt,
            cmd_sn,
            assembler: TextAssembler::new(1 << 20),
            portal,
        }
    }

    fn request(&self, ttt: u32, exp_stat_sn: u32, data: Vec<u8>) -> Pdu {
        Pdu::with_data(
            Bhs::TextRequest(TextRequest {
                immediate: true,
                final_bit: true,
                continue_bit: false,
                lun: Lun::default(),
                itt: self.itt,
                ttt,
                cmd_sn: self.cmd_sn,
                exp_stat_sn,
            }),
            data,
        )
    }

    /// The first request: `SendTargets=All`.
    pub fn start(&self, exp_stat_sn: u32) -> Result<Pdu> {
        let data = encode_text(&[("SendTargets", "All")])?;
        Ok(self.request(RESERVED_TAG, exp_stat_sn, data))
    }

    /// Takes a Text Response.
    pub fn receive(&mut self, pdu: Pdu) -> Result<TextStep> {
        let Bhs::TextResponse(r) = pdu.bhs else {
            return Err(Error::Protocol(format!(
                "expected a Text Response to SendTargets, got {:?}",
                pdu.bhs.opcode()
            )));
        };
        if r.itt != self.itt {
            return Err(Error::Protocol(format!(
                "Text Response for ITT {:#x}, expected {:#x}",
                r.itt, self.itt
            )));
        }
        let more = r.continue_bit || !r.final_bit;
        match self.assembler.push(&pdu.data, r.continue_bit)? {
            Some(pairs) if !more => Ok(TextStep::Done(parse_send_targets(&pairs, &self.portal))),
            Some(pairs) => {
                // F=0 without C: a complete batch, more batches follow. Keep
                // what we have by re-feeding it after the next batch.
                let keep = encode_text(&pairs)?;
                self.assembler.reset();
                self.assembler.push(&keep, true)?;
                Ok(TextStep::Send(self.request(
                    r.ttt,
                    r.stat_sn.wrapping_add(1),
                    Vec::new(),
                )))
            }
            None => Ok(TextStep::Send(self.request(
                r.ttt,
                r.stat_sn.wrapping_add(1),
                Vec::new(),
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dp() -> Portal {
        Portal {
            host: "10.0.0.1".into(),
            port: 3260,
            tpgt: 1,
        }
    }

    #[test]
    fn addresses() {
        assert_eq!(
            parse_target_address("127.0.0.1:3261,7", &dp())
                .unwrap()
                .to_string(),
            "127.0.0.1:3261,7"
        );
        assert_eq!(
            parse_target_address("[fe80::1]:3260,2", &dp())
                .unwrap()
                .to_string(),
            "[fe80::1]:3260,2"
        );
        assert_eq!(
            parse_target_address("host", &dp()).unwrap().to_string(),
            "host:3260,1"
        );
        assert!(parse_target_address("h:notaport,1", &dp()).is_err());
        // Without a port, iSCSI's port (RFC 7143 §13.8), not the port the
        // answer came through: discovery on 3261 listing 10.0.0.5,1 sent
        // the login to 10.0.0.5:3261.
        let on_3261 = Portal { port: 3261, ..dp() };
        for (value, parsed) in [
            ("10.0.0.5,1", "10.0.0.5:3260,1"),
            ("[fe80::1],2", "[fe80::1]:3260,2"),
            ("host", "host:3260,1"),
            ("10.0.0.5:3262,1", "10.0.0.5:3262,1"),
        ] {
            assert_eq!(
                parse_target_address(value, &on_3261).unwrap().to_string(),
                parsed,
                "{value}"
            );
        }
    }

    /// A discovery target's answer ends up in file names and records (the node
    /// database keeps `nodes/<TargetName>/<host>,<port>,<tpgt>`), so names that cannot
    /// name a file and hosts that are not hosts are refused, each with its reason, and
    /// the addresses of a refused name go with it. A name the RFC does not allow but
    /// that names a file safely (tgtd takes any name) is kept.
    #[test]
    fn refuses_names_and_hosts_that_are_not() {
        let pairs: TextPairs = [
            ("TargetName", "/etc/cron.d"),
            ("TargetAddress", "127.0.0.1:3260,1"),
            ("TargetName", "../../x"),
            ("TargetName", "disk_1"),
            ("TargetName", "iqn.2026-11.io.blockwire:ok"),
            ("TargetAddress", "evil\n* * * * * root sh:3260,1"),
            ("TargetAddress", "a/b,1"),
            ("TargetAddress", "127.0.0.2:3261,2"),
            ("TargetAddress", "[fe80::1%eth0]:3262,3"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let list = parse_send_targets(&pairs, &dp());
        assert_eq!(list.targets.len(), 2, "{list:?}");
        assert_eq!(list.targets[0].name, "disk_1");
        assert_eq!(list.targets[0].portals, vec![dp()]);
        assert_eq!(list.targets[1].name, "iqn.2026-11.io.blockwire:ok");
        let portals: Vec<String> = list.targets[1]
            .portals
            .iter()
            .map(Portal::to_string)
            .collect();
        assert_eq!(portals, ["127.0.0.2:3261,2", "[fe80::1%eth0]:3262,3"]);
        assert_eq!(list.refused.len(), 4, "{:#?}", list.refused);
        assert!(
            list.refused[0].contains("\"/etc/cron.d\" holds '/'"),
            "{}",
            list.refused[0]
        );
        assert!(
            list.refused[2].contains("holds '\\n'"),
            "{}",
            list.refused[2]
        );
        assert!(
            list.refused[3].contains("iqn.2026-11.io.blockwire:ok"),
            "{}",
            list.refused[3]
        );
    }

    #[test]
    fn groups_targets() {
        let pairs: TextPairs = [
            ("TargetName", "iqn.2026-11.io.example:a"),
            ("TargetAddress", "127.0.0.1:3260,1"),
            ("TargetAddress", "127.0.0.2:3260,1"),
            ("TargetName", "iqn.2026-11.io.example:b"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let t = parse_send_targets(&pairs, &dp()).targets;
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].portals.len(), 2);
        assert_eq!(t[1].portals, vec![dp()]);
    }
}
