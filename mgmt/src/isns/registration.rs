//! What the daemon registers with an iSNS server (RFC 4171 §3): one network
//! entity holding every portal the daemon listens on and every target as an
//! iSCSI storage node, with a Portal Group object for each target and
//! portal, so that an initiator querying the server learns exactly the
//! portals (and their tags) a target is served through, as SendTargets
//! would tell it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use blockwire_pdu::isns::{flag, function, node_type, tag, Attr, Message, ENTITY_PROTOCOL_ISCSI};
use blockwire_target::iscsi::catalog::Catalog;

/// One target as a storage node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Its iSCSI name.
    pub name: String,
    /// Its alias, if configured.
    pub alias: Option<String>,
    /// The portal group tags it is served through.
    pub groups: Vec<u16>,
}

/// The whole registration: the entity, its portals and its nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The Entity Identifier.
    pub entity: String,
    /// The registration period asked for, in seconds (the server may
    /// answer with another).
    pub period_secs: u32,
    /// Each listening address with its portal group's tag. An unspecified
    /// address (0.0.0.0, ::) stands for the address the server is reached
    /// from.
    pub portals: Vec<(SocketAddr, u16)>,
    /// The targets.
    pub nodes: Vec<Node>,
}

/// Payload bytes a DevAttrReg may take before the registration is split in
/// several. open-isns takes PDUs of at most 8 KiB, header included, and its
/// answer echoes the registration with an index per object (about a
/// quarter more), which must fit 8 KiB too or it answers Internal Error.
const MESSAGE_BUDGET: usize = 4096;

impl Registration {
    /// What `catalog` serves, its portals at the addresses they are bound
    /// to (`bound`: configured address and tag to bound address).
    pub fn of(
        entity: &str,
        period_secs: u32,
        catalog: &Catalog,
        bound: &HashMap<(SocketAddr, u16), SocketAddr>,
    ) -> Registration {
        let mut portals = Vec::new();
        for g in &catalog.portal_groups {
            for a in &g.addresses {
                let at = bound.get(&(*a, g.tag)).copied().unwrap_or(*a);
                if !portals.contains(&(at, g.tag)) {
                    portals.push((at, g.tag));
                }
            }
        }
        let nodes = catalog
            .targets
            .iter()
            .map(|t| Node {
                name: t.name.clone(),
                alias: t.alias.clone(),
                groups: t.portal_groups.clone(),
            })
            .collect();
        Registration {
            entity: entity.to_string(),
            period_secs,
            portals,
            nodes,
        }
    }

    /// The portals as registered: unspecified addresses replaced by
    /// `local` (the address this side reaches the server from), each
    /// address and port once, with the tags it carries.
    fn wire_portals(&self, local: IpAddr) -> Vec<(SocketAddr, Vec<u16>)> {
        let mut out: Vec<(SocketAddr, Vec<u16>)> = Vec::new();
        for (addr, tag) in &self.portals {
            let ip = if addr.ip().is_unspecified() {
                local
            } else {
                addr.ip()
            };
            let at = SocketAddr::new(ip, addr.port());
            match out.iter_mut().find(|(a, _)| *a == at) {
                Some((_, tags)) => tags.push(*tag),
                None => out.push((at, vec![*tag])),
            }
        }
        out
    }

    /// The DevAttrReg messages that register all of this, transaction IDs
    /// from `first_transaction` up. The first replaces whatever the server
    /// held for the entity (the Replace flag); when the registration does
    /// not fit one message, each further one adds the next portals, nodes
    /// and portal groups to the entity (a portal group always after its
    /// node and portal). Every node gets a Portal Group object for every
    /// portal of the entity: its group's tag where the target is served, a
    /// NULL tag where it is not (RFC 4171 §3.4: a portal gives no access to
    /// a node whose tag for it is NULL; without one the server would give
    /// the pair tag 1 and advertise the target on every portal).
    pub fn messages(&self, local: IpAddr, first_transaction: u16) -> Vec<Message> {
        let portals = self.wire_portals(local);
        // Units that stay together: the entity, each portal, each node,
        // each portal group.
        let mut units: Vec<Vec<Attr>> = vec![vec![
            Attr::u32(tag::ENTITY_PROTOCOL, ENTITY_PROTOCOL_ISCSI),
            Attr::u32(tag::REGISTRATION_PERIOD, self.period_secs),
        ]];
        for (at, _) in &portals {
            units.push(vec![
                Attr::ip(tag::PORTAL_IP_ADDRESS, at.ip()),
                Attr::tcp_port(tag::PORTAL_PORT, at.port()),
            ]);
        }
        for node in &self.nodes {
            let mut n = vec![
                Attr::string(tag::ISCSI_NAME, &node.name),
                Attr::u32(tag::ISCSI_NODE_TYPE, node_type::TARGET),
            ];
            if let Some(alias) = &node.alias {
                n.push(Attr::string(tag::ISCSI_ALIAS, alias));
            }
            units.push(n);
            for (at, tags) in &portals {
                // An address listed in two groups the target is served
                // through has one Portal Group object: the first group's tag.
                let pgt = match tags.iter().find(|t| node.groups.contains(t)) {
                    Some(t) => Attr::u32(tag::PG_TAG, u32::from(*t)),
                    None => Attr::empty(tag::PG_TAG),
                };
                units.push(vec![
                    Attr::string(tag::PG_ISCSI_NAME, &node.name),
                    Attr::ip(tag::PG_PORTAL_IP_ADDRESS, at.ip()),
                    Attr::tcp_port(tag::PG_PORTAL_PORT, at.port()),
                    pgt,
                ]);
            }
        }
        // (The first message registers the source node.)
        let source = self.source();
        let opening = |replace: bool| {
            let mut m = Message::request(
                function::DEV_ATTR_REG,
                0,
                vec![
                    Attr::string(tag::ISCSI_NAME, source),
                    Attr::string(tag::ENTITY_IDENTIFIER, &self.entity),
                    Attr::empty(tag::DELIMITER),
                    // The key is among the operating attributes too (§5.6.5.1).
                    Attr::string(tag::ENTITY_IDENTIFIER, &self.entity),
                ],
            );
            if replace {
                m.flags |= flag::REPLACE;
            }
            m
        };
        let mut out = vec![opening(true)];
        for unit in units {
            let len: usize = unit.iter().map(Attr::wire_len).sum();
            let current = out.last().map_or(0, Message::payload_len);
            if current + len > MESSAGE_BUDGET && current > opening(false).payload_len() {
                out.push(opening(false));
            }
            if let Some(m) = out.last_mut() {
                m.attrs.extend(unit);
            }
        }
        for (i, m) in out.iter_mut().enumerate() {
            m.transaction = first_transaction.wrapping_add(i as u16);
        }
        out
    }

    /// The source of every message: the first target, a node of the
    /// entity (open-isns would make an unknown source a node of it).
    pub fn source(&self) -> &str {
        self.nodes.first().map_or("", |n| n.name.as_str())
    }

    /// The DevDereg that removes the entity with all its portals, nodes
    /// and portal groups (RFC 4171 §5.6.5.4).
    pub fn deregistration(&self, transaction: u16) -> Message {
        let source = self.source();
        Message::request(
            function::DEV_DEREG,
            transaction,
            vec![
                Attr::string(tag::ISCSI_NAME, source),
                Attr::empty(tag::DELIMITER),
                Attr::string(tag::ENTITY_IDENTIFIER, &self.entity),
            ],
        )
    }
}
