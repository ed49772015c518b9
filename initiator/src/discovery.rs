//! SendTargets discovery (RFC 7143 §12.3, Appendix C), without I/O.
//!
//! [`SendTargets`] builds the Text Requests of one `SendTargets=All`
//! exchange (including the empty requests that fetch continued text) and
//! turns the assembled response into [`DiscoveredTarget`]s.

use blockwire_pdu::keys::{encode_text, TextAssembler, TextPairs};
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

/// Parses `host:port,tpgt`, `[v6]:port,tpgt`, `host,tpgt` or `host`
/// (defaults from `default`).
pub fn parse_target_address(value: &str, default: &Portal) -> Option<Portal> {
    let (addr, tpgt) = match value.rsplit_once(',') {
        Some((a, t)) => (a, t.trim().parse().ok()?),
        None => (value, default.tpgt),
    };
    let (host, port) = if let Some(rest) = addr.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None => default.port,
        };
        (h.to_owned(), port)
    } else {
        match addr.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h.to_owned(), p.parse().ok()?),
            _ => (addr.to_owned(), default.port),
        }
    };
    if host.is_empty() {
        return None;
    }
    Some(Portal { host, port, tpgt })
}

/// Groups SendTargets pairs into targets. `discovery_portal` stands in for
/// targets listed without a TargetAddress (RFC 7143 Appendix C).
pub fn parse_send_targets(pairs: &TextPairs, discovery_portal: &Portal) -> Vec<DiscoveredTarget> {
    let mut out: Vec<DiscoveredTarget> = Vec::new();
    for (k, v) in pairs {
        match k.as_str() {
            "TargetName" => out.push(DiscoveredTarget {
                name: v.clone(),
                portals: Vec::new(),
            }),
            "TargetAddress" => {
                if let (Some(t), Some(p)) =
                    (out.last_mut(), parse_target_address(v, discovery_portal))
                {
                    t.portals.push(p);
                }
            }
            _ => {}
        }
    }
    for t in &mut out {
        if t.portals.is_empty() {
            t.portals.push(discovery_portal.clone());
        }
    }
    out
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
    Done(Vec<DiscoveredTarget>),
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
        assert!(parse_target_address("h:notaport,1", &dp()).is_none());
    }

    #[test]
    fn groups_targets() {
        let pairs: TextPairs = [
            ("TargetName", "iqn.a"),
            ("TargetAddress", "127.0.0.1:3260,1"),
            ("TargetAddress", "127.0.0.2:3260,1"),
            ("TargetName", "iqn.b"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let t = parse_send_targets(&pairs, &dp());
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].portals.len(), 2);
        assert_eq!(t[1].portals, vec![dp()]);
    }
}
