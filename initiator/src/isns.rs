//! iSNS discovery (RFC 4171): asking an iSNS server which targets this
//! initiator may see, and through which portals, instead of asking a target
//! portal (SendTargets). The messages and the reading of the answer have no
//! I/O; [`discover_isns`] runs them over TCP.
//!
//! The query is the one open-iscsi's `iscsiadm -m discovery -t isns` sends:
//! a DevAttrQry from the initiator's name for every storage node of type
//! Target, asking for the Portal Group objects (§3.4). A target is reachable
//! through each portal whose group object carries a tag; a NULL tag means
//! the portal does not serve it. Servers that answer only registered nodes
//! (status Source Unknown) get the initiator registered for the query and
//! deregistered after it. A server that cannot answer for every target at
//! once (open-isns answers in one PDU of at most 8 KiB) is asked one target
//! at a time: DevGetNext through its target nodes, and each one's portal
//! groups.

use blockwire_pdu::isns::{
    function, node_type, server_address, status, tag, Attr, Message, MessageReader,
};
use blockwire_pdu::keys::{check_peer_name, check_portal_host};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::config::InitiatorConfig;
use crate::discovery::{DiscoveredTarget, Portal, SendTargetsList};
use crate::error::{Error, Result};

/// Status code 6: the server does not know the query's source.
const SOURCE_UNKNOWN: u32 = 6;

/// A Portal Group object's attributes, asked for with NULL values.
const PORTAL_GROUP_TAGS: [u32; 4] = [
    tag::PG_ISCSI_NAME,
    tag::PG_PORTAL_IP_ADDRESS,
    tag::PG_PORTAL_PORT,
    tag::PG_TAG,
];

/// The DevAttrQry for every target and its portal groups, from `initiator`.
pub fn targets_query(initiator: &str, transaction: u16) -> Message {
    let mut attrs = vec![
        Attr::string(tag::ISCSI_NAME, initiator),
        Attr::u32(tag::ISCSI_NODE_TYPE, node_type::TARGET),
        Attr::empty(tag::DELIMITER),
    ];
    attrs.push(Attr::empty(tag::ISCSI_NAME));
    attrs.push(Attr::empty(tag::ISCSI_NODE_TYPE));
    attrs.extend(PORTAL_GROUP_TAGS.map(Attr::empty));
    Message::request(function::DEV_ATTR_QRY, transaction, attrs)
}

/// The DevGetNext for the storage node after `last` (none: the first),
/// targets only (RFC 4171 §5.6.5.3: the operating attributes filter).
pub fn next_target_query(initiator: &str, last: Option<&str>, transaction: u16) -> Message {
    Message::request(
        function::DEV_GET_NEXT,
        transaction,
        vec![
            Attr::string(tag::ISCSI_NAME, initiator),
            match last {
                Some(name) => Attr::string(tag::ISCSI_NAME, name),
                None => Attr::empty(tag::ISCSI_NAME),
            },
            Attr::empty(tag::DELIMITER),
            Attr::u32(tag::ISCSI_NODE_TYPE, node_type::TARGET),
        ],
    )
}

/// The DevAttrQry for one target's portal groups.
pub fn portal_groups_query(initiator: &str, target: &str, transaction: u16) -> Message {
    let mut attrs = vec![
        Attr::string(tag::ISCSI_NAME, initiator),
        Attr::string(tag::ISCSI_NAME, target),
        Attr::empty(tag::DELIMITER),
    ];
    attrs.extend(PORTAL_GROUP_TAGS.map(Attr::empty));
    Message::request(function::DEV_ATTR_QRY, transaction, attrs)
}

/// The node a DevGetNext answer names (its key, the first iSCSI Name) and
/// whether it is a target (when the answer says).
fn next_node(answer: &Message) -> Option<(String, bool)> {
    let name = answer.attr(tag::ISCSI_NAME)?.as_str()?.to_owned();
    let target = answer
        .attr(tag::ISCSI_NODE_TYPE)
        .and_then(Attr::as_u32)
        .is_none_or(|t| t & node_type::TARGET != 0);
    Some((name, target))
}

/// The most nodes a walk of the server's nodes visits.
const MAX_WALK: usize = 100_000;

/// The DevAttrReg of `initiator` as a node of its own entity, for servers
/// that answer only registered sources.
pub fn initiator_registration(initiator: &str, transaction: u16) -> Message {
    Message::request(
        function::DEV_ATTR_REG,
        transaction,
        vec![
            Attr::string(tag::ISCSI_NAME, initiator),
            Attr::empty(tag::DELIMITER),
            Attr::string(tag::ISCSI_NAME, initiator),
            Attr::u32(tag::ISCSI_NODE_TYPE, node_type::INITIATOR),
        ],
    )
}

/// The DevDereg of `initiator`.
pub fn initiator_deregistration(initiator: &str, transaction: u16) -> Message {
    Message::request(
        function::DEV_DEREG,
        transaction,
        vec![
            Attr::string(tag::ISCSI_NAME, initiator),
            Attr::empty(tag::DELIMITER),
            Attr::string(tag::ISCSI_NAME, initiator),
        ],
    )
}

/// Reads the targets and portals out of an answer to [`targets_query`]:
/// each Portal Group object with a tag is a portal of its target. Names and
/// addresses that could not name a node record are left out, with the
/// reason, as SendTargets answers are ([`crate::discovery::parse_send_targets`]).
pub fn parse_targets(answer: &Message) -> std::result::Result<SendTargetsList, String> {
    let code = answer.status.unwrap_or(status::SUCCESSFUL);
    if code != status::SUCCESSFUL {
        return Err(format!(
            "the iSNS server answered the query with status {code} ({})",
            status::name(code)
        ));
    }
    let mut list = SendTargetsList::default();
    let mut group: (Option<String>, Option<String>, Option<u16>) = (None, None, None);
    for a in answer.operating_attrs() {
        match a.tag {
            tag::PG_ISCSI_NAME => group = (a.as_str().map(str::to_owned), None, None),
            tag::PG_PORTAL_IP_ADDRESS => group.1 = a.as_ip().map(|ip| ip.to_string()),
            tag::PG_PORTAL_PORT => group.2 = a.as_port().filter(|(_, udp)| !udp).map(|(p, _)| p),
            tag::PG_TAG => {
                let (name, host, port) = std::mem::take(&mut group);
                // A NULL tag: the portal does not serve the node.
                let Some(tpgt) = a.as_u32() else { continue };
                let (Some(name), Some(host), Some(port)) = (name, host, port) else {
                    list.refused.push(
                        "a portal group without its node's name, address or TCP port left out"
                            .into(),
                    );
                    continue;
                };
                if let Err(why) = check_peer_name(&name) {
                    list.refused.push(format!("target name left out: {why}"));
                    continue;
                }
                if let Err(why) = check_portal_host(&host) {
                    list.refused
                        .push(format!("portal of {name} left out: {why}"));
                    continue;
                }
                let Ok(tpgt) = u16::try_from(tpgt) else {
                    list.refused.push(format!(
                        "portal {host}:{port} of {name} left out: tag {tpgt} is not 0-65535"
                    ));
                    continue;
                };
                add_portal(&mut list, name, Portal { host, port, tpgt });
            }
            _ => {}
        }
    }
    Ok(list)
}

/// Adds `portal` to target `name` in `list` (once), the target too if new.
fn add_portal(list: &mut SendTargetsList, name: String, portal: Portal) {
    match list.targets.iter_mut().find(|t| t.name == name) {
        Some(t) if !t.portals.contains(&portal) => t.portals.push(portal),
        Some(_) => {}
        None => list.targets.push(DiscoveredTarget {
            name,
            portals: vec![portal],
        }),
    }
}

/// Asks the iSNS server at `server` (`HOST[:PORT]`, port 3205 by default)
/// which targets `config.initiator_name` may see; each with the portals
/// that serve it. Bounded by `config.login_timeout`.
pub async fn discover_isns(config: &InitiatorConfig, server: &str) -> Result<SendTargetsList> {
    let addr = server_address(server).map_err(|why| Error::Config(format!("iSNS server {why}")))?;
    tokio::time::timeout(config.login_timeout, ask(&config.initiator_name, &addr))
        .await
        .map_err(|_| Error::Timeout(format!("iSNS query at {addr}")))?
}

async fn ask(initiator: &str, addr: &str) -> Result<SendTargetsList> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| Error::io(format!("connecting to the iSNS server {addr}"), e))?;
    let mut reader = MessageReader::new();
    let answer = exchange(&mut stream, &mut reader, targets_query(initiator, 1), addr).await?;
    if answer.status == Some(SOURCE_UNKNOWN) {
        // Registered for the query, deregistered after it.
        let reg = exchange(
            &mut stream,
            &mut reader,
            initiator_registration(initiator, 2),
            addr,
        )
        .await?;
        let code = reg.status.unwrap_or(status::SUCCESSFUL);
        if code != status::SUCCESSFUL {
            return Err(Error::Protocol(format!(
                "the iSNS server {addr} does not know {initiator} and refused to register it: status {code} ({})",
                status::name(code)
            )));
        }
        let again = exchange(&mut stream, &mut reader, targets_query(initiator, 3), addr).await;
        let _ = exchange(
            &mut stream,
            &mut reader,
            initiator_deregistration(initiator, 4),
            addr,
        )
        .await;
        return parse_targets(&again?).map_err(Error::Protocol);
    }
    match parse_targets(&answer) {
        Ok(list) => Ok(list),
        // A server that cannot answer for every target at once (open-isns
        // answers in one PDU of at most 8 KiB and says Internal Error past
        // it): one target at a time.
        Err(why) => walk(initiator, addr, &mut stream, &mut reader)
            .await
            .map_err(|e| {
                Error::Protocol(format!("{addr}: {why}; asking one target at a time: {e}"))
            }),
    }
}

/// The targets one by one: DevGetNext through the target nodes, and a
/// DevAttrQry of each one's portal groups.
async fn walk(
    initiator: &str,
    addr: &str,
    stream: &mut TcpStream,
    reader: &mut MessageReader,
) -> Result<SendTargetsList> {
    let mut list = SendTargetsList::default();
    let mut last: Option<String> = None;
    let mut transaction: u16 = 10;
    for _ in 0..MAX_WALK {
        transaction = transaction.wrapping_add(1);
        let q = next_target_query(initiator, last.as_deref(), transaction);
        let answer = exchange(stream, reader, q, addr).await?;
        match answer.status.unwrap_or(status::SUCCESSFUL) {
            status::SUCCESSFUL => {}
            // Past the last node.
            status::NO_SUCH_ENTRY => return Ok(list),
            code => {
                return Err(Error::Protocol(format!(
                    "DevGetNext answered status {code} ({})",
                    status::name(code)
                )))
            }
        }
        let Some((name, is_target)) = next_node(&answer) else {
            return Ok(list);
        };
        if last.as_deref() == Some(name.as_str()) {
            return Err(Error::Protocol(format!(
                "DevGetNext answered {name} twice: the walk would not end"
            )));
        }
        last = Some(name.clone());
        if !is_target {
            continue;
        }
        transaction = transaction.wrapping_add(1);
        let q = portal_groups_query(initiator, &name, transaction);
        let groups =
            parse_targets(&exchange(stream, reader, q, addr).await?).map_err(Error::Protocol)?;
        list.refused.extend(groups.refused);
        for t in groups.targets {
            for p in t.portals {
                add_portal(&mut list, t.name.clone(), p);
            }
        }
    }
    Err(Error::Protocol(format!(
        "more than {MAX_WALK} nodes: the walk was cut short"
    )))
}

/// Sends `request` and reads its answer (server messages in between are
/// skipped).
async fn exchange(
    stream: &mut TcpStream,
    reader: &mut MessageReader,
    request: Message,
    addr: &str,
) -> Result<Message> {
    let bytes = request
        .encode()
        .map_err(|e| Error::Protocol(format!("iSNS query: {e}")))?;
    stream
        .write_all(&bytes)
        .await
        .map_err(|e| Error::io(format!("sending to the iSNS server {addr}"), e))?;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if let Some(m) = reader
            .next_message()
            .map_err(|e| Error::Protocol(format!("the iSNS server {addr} sent {e}")))?
        {
            if m.is_response() && m.transaction == request.transaction {
                return Ok(m);
            }
            continue;
        }
        let n = stream
            .read(&mut buf)
            .await
            .map_err(|e| Error::io(format!("reading from the iSNS server {addr}"), e))?;
        if n == 0 {
            return Err(Error::Protocol(format!(
                "the iSNS server {addr} closed the connection without answering"
            )));
        }
        reader.feed(&buf[..n]);
    }
}

#[cfg(test)]
mod tests;
