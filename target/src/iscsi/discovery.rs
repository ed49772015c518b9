//! SendTargets discovery (RFC 7143 appendix C) and the full-feature Text
//! Request/Response exchange (RFC 7143 sections 11.10, 11.11), sans-IO.
//!
//! [`send_targets`] lists the targets an initiator may see with their
//! portals. [`TextExchange`] answers Text Requests on one connection: it
//! joins requests continued with the C bit, answers SendTargets and other
//! keys, and splits a long answer over several Text Responses that the
//! initiator pulls one by one by echoing the Target Transfer Tag.
//!
//! The PDUs it returns leave StatSN, ExpCmdSN and MaxCmdSN at 0: the caller
//! (the connection, which owns the sequence numbers) sets them before
//! sending, and advances its ExpCmdSN for non-immediate requests as for any
//! command.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use blockwire_pdu::keys::{
    encode_text, Negotiator, Phase, SessionParams, SessionType, TextAssembler, TextPairs,
};
use blockwire_pdu::pdu::codes::RejectReason;
use blockwire_pdu::pdu::{Reject, TextRequest, TextResponse, RESERVED_TAG};
use blockwire_pdu::{Bhs, Pdu};

use super::catalog::{Catalog, TargetEntry};
use super::login::LoginOutcome;

/// Bound on the text of one Text Request sequence.
const MAX_REQUEST_TEXT: usize = 64 * 1024;

/// One `TargetAddress` value: `addr:port,tpgt`, IPv6 in brackets, a
/// wildcard portal reported as the address the initiator connected to.
/// None for a wildcard that address does not reach: an IPv4 wildcard asked
/// about over IPv6, or an IPv6 wildcard over IPv4 where it is bound IPv6
/// only (`dual_stack` false, see
/// [`super::portal::ipv6_wildcard_takes_ipv4`]). Naming the connection's
/// address there sent initiators to a port nothing of that family listens
/// on, or to another portal group's portal.
pub fn target_address(
    portal: SocketAddr,
    tag: u16,
    local_addr: SocketAddr,
    dual_stack: bool,
) -> Option<String> {
    // A dual-stack socket reports IPv4 peers as IPv4-mapped IPv6: then
    // IPv6 wildcards are evidently dual-stack here.
    let local = local_addr.ip().to_canonical();
    let came_mapped = local_addr.ip().is_ipv6() && local.is_ipv4();
    let ip = match portal.ip() {
        IpAddr::V4(a) if a.is_unspecified() => local.is_ipv4().then_some(local)?,
        IpAddr::V6(a) if a.is_unspecified() => {
            (local.is_ipv6() || dual_stack || came_mapped).then_some(local)?
        }
        ip => ip.to_canonical(),
    };
    let port = if portal.port() == 0 {
        local_addr.port()
    } else {
        portal.port()
    };
    Some(match ip {
        IpAddr::V4(a) => format!("{a}:{port},{tag}"),
        IpAddr::V6(a) => format!("[{a}]:{port},{tag}"),
    })
}

fn push_target(
    out: &mut TextPairs,
    catalog: &Catalog,
    target: &TargetEntry,
    local_addr: SocketAddr,
) {
    out.push(("TargetName".to_owned(), target.name.clone()));
    let mut seen: Vec<String> = Vec::new();
    let dual_stack = super::portal::ipv6_wildcard_takes_ipv4();
    for &tag in &target.portal_groups {
        let Some(group) = catalog.portal_group(tag) else {
            continue;
        };
        for &portal in &group.addresses {
            let Some(addr) = target_address(portal, tag, local_addr, dual_stack) else {
                continue;
            };
            if !seen.contains(&addr) {
                seen.push(addr.clone());
                out.push(("TargetAddress".to_owned(), addr));
            }
        }
    }
}

/// The SendTargets answer for `request`: `"All"` (every target the
/// initiator's ACL allows), a target name, or `""` meaning
/// `current_target`. Each target comes as `TargetName=` followed by one
/// `TargetAddress=` per portal of its portal groups. Targets whose ACL does
/// not allow `initiator_name`, and unknown names, give nothing.
pub fn send_targets(
    catalog: &Catalog,
    initiator_name: &str,
    request: &str,
    current_target: Option<&TargetEntry>,
    local_addr: SocketAddr,
) -> TextPairs {
    let mut out = TextPairs::new();
    let visible = |t: &TargetEntry| t.acl.allows(initiator_name);
    match request {
        "All" => {
            for t in catalog.targets.iter().filter(|t| visible(t)) {
                push_target(&mut out, catalog, t, local_addr);
            }
        }
        "" => {
            if let Some(t) = current_target.filter(|t| visible(t)) {
                push_target(&mut out, catalog, t, local_addr);
            }
        }
        name => {
            if let Some(t) = catalog.target(name).filter(|t| visible(t)) {
                push_target(&mut out, catalog, t, local_addr);
            }
        }
    }
    out
}

/// What to send for a Text Request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextStep {
    /// A Text Response (StatSN, ExpCmdSN, MaxCmdSN for the caller to set).
    Respond(Pdu),
    /// A Reject carrying the request's header (StatSN, ExpCmdSN, MaxCmdSN
    /// for the caller to set); the connection stays up.
    Reject(Pdu),
}

/// The request currently being received or answered.
#[derive(Debug)]
struct Current {
    itt: u32,
    ttt: u32,
    /// Answer text not yet sent.
    remaining: Vec<u8>,
    /// True while the initiator is still sending its request (C bit).
    receiving: bool,
}

/// The full-feature Text Request/Response machine of one connection.
#[derive(Debug)]
pub struct TextExchange {
    catalog: Arc<Catalog>,
    initiator_name: String,
    session_type: SessionType,
    target: Option<Arc<TargetEntry>>,
    local_addr: SocketAddr,
    negotiator: Negotiator,
    assembler: TextAssembler,
    current: Option<Current>,
    next_ttt: u32,
}

impl TextExchange {
    /// A machine for a session of `session_type` (to `target`, `None` for
    /// discovery) on a connection accepted at `local_addr`, carrying on the
    /// login's `negotiator`.
    pub fn new(
        catalog: Arc<Catalog>,
        initiator_name: String,
        session_type: SessionType,
        target: Option<Arc<TargetEntry>>,
        local_addr: SocketAddr,
        negotiator: Negotiator,
    ) -> TextExchange {
        TextExchange {
            catalog,
            initiator_name,
            session_type,
            target,
            local_addr,
            negotiator,
            assembler: TextAssembler::new(MAX_REQUEST_TEXT),
            current: None,
            next_ttt: 1,
        }
    }

    /// Answers later SendTargets requests from `catalog`, what is served
    /// now: an initiator may keep a discovery session open and ask again
    /// to find new targets (RFC 7143 appendix C), and a target it may no
    /// longer see must not be listed. An answer already being pulled in
    /// pieces is not changed.
    pub fn use_catalog(&mut self, catalog: Arc<Catalog>) {
        self.catalog = catalog;
    }

    /// The machine for the connection a login produced.
    pub fn from_outcome(
        catalog: Arc<Catalog>,
        outcome: &LoginOutcome,
        local_addr: SocketAddr,
    ) -> TextExchange {
        TextExchange::new(
            catalog,
            outcome.initiator_name.clone(),
            outcome.session_type,
            outcome.target.clone(),
            local_addr,
            outcome.negotiator.clone(),
        )
    }

    /// The parameters as negotiated so far (Text negotiation may change
    /// the initiator's MaxRecvDataSegmentLength).
    pub fn params(&self) -> &SessionParams {
        self.negotiator.params()
    }

    /// Longest data segment the initiator accepts: its
    /// MaxRecvDataSegmentLength, or on iSER its
    /// InitiatorRecvDataSegmentLength, the size of the buffers its Sends
    /// land in (RFC 7145 §6.3).
    fn max_send(&self) -> usize {
        let params = self.negotiator.params();
        let limit = if params.rdma_extensions {
            params.initiator_recv_data_segment_length
        } else {
            params.initiator_max_recv_data_segment_length
        };
        (limit as usize).max(512)
    }

    fn alloc_ttt(&mut self) -> u32 {
        let ttt = self.next_ttt;
        self.next_ttt = self.next_ttt.wrapping_add(1);
        if self.next_ttt == RESERVED_TAG {
            self.next_ttt = 1;
        }
        ttt
    }

    fn reject(&mut self, req: &TextRequest, data: &[u8], reason: RejectReason) -> TextStep {
        self.current = None;
        self.assembler.reset();
        let header = Bhs::TextRequest(*req).encode(0, data.len() as u32);
        let bhs = Reject {
            reason,
            stat_sn: 0,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
            data_sn_or_r2t_sn: 0,
        };
        TextStep::Reject(Pdu::with_data(Bhs::Reject(bhs), header.to_vec()))
    }

    fn response(
        req: &TextRequest,
        final_bit: bool,
        cont: bool,
        ttt: u32,
        data: Vec<u8>,
    ) -> TextStep {
        let bhs = TextResponse {
            final_bit,
            continue_bit: cont,
            lun: req.lun,
            itt: req.itt,
            ttt,
            stat_sn: 0,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
        };
        TextStep::Respond(Pdu::with_data(Bhs::TextResponse(bhs), data))
    }

    /// Handles one Text Request with its data segment.
    pub fn on_request(&mut self, req: &TextRequest, data: &[u8]) -> TextStep {
        if req.final_bit && req.continue_bit {
            return self.reject(req, data, RejectReason::InvalidPduField);
        }
        if data.len() > self.negotiator.params().target_max_recv_data_segment_length as usize {
            return self.reject(req, data, RejectReason::ProtocolError);
        }
        let continuing = match &self.current {
            Some(c) if req.ttt != RESERVED_TAG => {
                if c.ttt != req.ttt || c.itt != req.itt {
                    return self.reject(req, data, RejectReason::InvalidPduField);
                }
                true
            }
            // TTT 0xffffffff is a new request, also under the ITT of one
            // whose text was still coming (RFC 7143 §11.10.4): its state
            // goes, so the new text is not appended to the old.
            Some(_) => false,
            None if req.ttt != RESERVED_TAG => {
                return self.reject(req, data, RejectReason::InvalidPduField)
            }
            None => false,
        };
        if !continuing {
            // A new request (TTT 0xffffffff) abandons any earlier one, and
            // starts a negotiation: a key may come once in it, across all
            // the requests that continue it (RFC 7143 §6.2).
            self.current = None;
            self.assembler.reset();
            self.negotiator.start_text_exchange();
        }
        if let Some(c) = &self.current {
            if !c.receiving {
                // The initiator pulls the next piece of our answer.
                if !data.is_empty() {
                    return self.reject(req, data, RejectReason::ProtocolError);
                }
                return self.next_piece(req);
            }
        }
        let pairs = match self.assembler.push(data, req.continue_bit) {
            Err(_) => return self.reject(req, data, RejectReason::ProtocolError),
            Ok(None) => {
                // Acknowledge a continued request; the initiator echoes the TTT.
                let ttt = match &self.current {
                    Some(c) => c.ttt,
                    None => self.alloc_ttt(),
                };
                self.current = Some(Current {
                    itt: req.itt,
                    ttt,
                    remaining: Vec::new(),
                    receiving: true,
                });
                return Self::response(req, false, false, ttt, Vec::new());
            }
            Ok(Some(pairs)) => pairs,
        };
        let answer = match self.answer(&pairs) {
            Ok(a) => a,
            Err(reason) => return self.reject(req, data, reason),
        };
        let text = match encode_text(&answer) {
            Ok(t) => t,
            Err(_) => return self.reject(req, data, RejectReason::ProtocolError),
        };
        let ttt = match &self.current {
            Some(c) => c.ttt,
            None => self.alloc_ttt(),
        };
        self.current = Some(Current {
            itt: req.itt,
            ttt,
            remaining: text,
            receiving: false,
        });
        self.next_piece(req)
    }

    /// Sends the next piece of the pending answer.
    fn next_piece(&mut self, req: &TextRequest) -> TextStep {
        let max = self.max_send();
        let Some(mut c) = self.current.take() else {
            return Self::response(req, true, false, RESERVED_TAG, Vec::new());
        };
        if c.remaining.len() <= max {
            if !req.final_bit {
                // A request with F=0 says the initiator has more to send under this ITT
                // (RFC 7143 §11.10.1), and a response with F=1 to it is a protocol error
                // (§11.11.1): the answer ends F=0 with a tag the next request echoes, and
                // the exchange goes on until a request comes with F=1.
                let (ttt, answer) = (c.ttt, std::mem::take(&mut c.remaining));
                c.receiving = true;
                self.current = Some(c);
                return Self::response(req, false, false, ttt, answer);
            }
            return Self::response(req, true, false, RESERVED_TAG, c.remaining);
        }
        let rest = c.remaining.split_off(max);
        let piece = std::mem::replace(&mut c.remaining, rest);
        let ttt = c.ttt;
        self.current = Some(c);
        Self::response(req, false, true, ttt, piece)
    }

    /// The answer to a whole request's pairs.
    fn answer(&mut self, pairs: &[(String, String)]) -> Result<TextPairs, RejectReason> {
        // The negotiator takes keys one by one and stops at a bad one: a
        // rejected request must change nothing (RFC 7143 §11.17), so the
        // keys taken before it are undone.
        let before = self.negotiator.clone();
        let responses = match self.negotiator.receive(Phase::FullFeature, pairs) {
            Ok(r) => r,
            Err(_) => {
                self.negotiator = before;
                return Err(RejectReason::ProtocolError);
            }
        };
        let mut out = responses.answers;
        let mut listing = TextPairs::new();
        for (key, value) in responses.passthrough {
            match key.as_str() {
                "SendTargets" => {
                    let allowed = match self.session_type {
                        SessionType::Discovery => true,
                        // Normal sessions: only the current target or a name.
                        SessionType::Normal => value != "All",
                    };
                    if allowed {
                        listing.extend(send_targets(
                            &self.catalog,
                            &self.initiator_name,
                            &value,
                            self.target.as_deref(),
                            self.local_addr,
                        ));
                    } else {
                        out.push((key, "Reject".to_owned()));
                    }
                }
                _ if !value.is_empty()
                    && !matches!(value.as_str(), "NotUnderstood" | "Irrelevant" | "Reject") =>
                {
                    out.push((key, "NotUnderstood".to_owned()));
                }
                _ => {}
            }
        }
        out.extend(listing);
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
