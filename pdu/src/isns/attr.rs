//! iSNS attributes (RFC 4171 §5.5, §6): tag-length-value triples whose
//! values are padded to a multiple of four bytes.

use std::net::{IpAddr, Ipv6Addr};

/// Attribute tags this crate names (RFC 4171 §6.1, the iSNS attribute table).
pub mod tag {
    /// Separates a message's key attributes from its operating attributes.
    pub const DELIMITER: u32 = 0;
    /// Entity Identifier (EID): the network entity's name.
    pub const ENTITY_IDENTIFIER: u32 = 1;
    /// Entity Protocol: 2 for iSCSI.
    pub const ENTITY_PROTOCOL: u32 = 2;
    /// Management IP Address of the entity.
    pub const MANAGEMENT_IP_ADDRESS: u32 = 3;
    /// Timestamp of the last registration (server-set).
    pub const TIMESTAMP: u32 = 4;
    /// Registration Period, in seconds: the entity refreshes within it.
    pub const REGISTRATION_PERIOD: u32 = 6;
    /// Entity Index (server-assigned).
    pub const ENTITY_INDEX: u32 = 7;
    /// Portal IP Address (16 bytes; IPv4 mapped into IPv6).
    pub const PORTAL_IP_ADDRESS: u32 = 16;
    /// Portal TCP/UDP Port.
    pub const PORTAL_PORT: u32 = 17;
    /// Portal Symbolic Name.
    pub const PORTAL_SYMBOLIC_NAME: u32 = 18;
    /// ESI Interval, in seconds.
    pub const ESI_INTERVAL: u32 = 19;
    /// ESI Port.
    pub const ESI_PORT: u32 = 20;
    /// Portal Index (server-assigned).
    pub const PORTAL_INDEX: u32 = 22;
    /// SCN Port.
    pub const SCN_PORT: u32 = 23;
    /// iSCSI Name of a storage node.
    pub const ISCSI_NAME: u32 = 32;
    /// iSCSI Node Type: a bitmap of target, initiator, control.
    pub const ISCSI_NODE_TYPE: u32 = 33;
    /// iSCSI Alias.
    pub const ISCSI_ALIAS: u32 = 34;
    /// iSCSI SCN Bitmap.
    pub const ISCSI_SCN_BITMAP: u32 = 35;
    /// iSCSI Node Index (server-assigned).
    pub const ISCSI_NODE_INDEX: u32 = 36;
    /// iSCSI AuthMethod.
    pub const ISCSI_AUTH_METHOD: u32 = 42;
    /// Portal Group: the iSCSI Name of its node.
    pub const PG_ISCSI_NAME: u32 = 48;
    /// Portal Group: its portal's IP address.
    pub const PG_PORTAL_IP_ADDRESS: u32 = 49;
    /// Portal Group: its portal's TCP/UDP port.
    pub const PG_PORTAL_PORT: u32 = 50;
    /// Portal Group Tag: non-NULL gives the node access through the portal;
    /// NULL (length 0) denies it.
    pub const PG_TAG: u32 = 51;
    /// Portal Group Index (server-assigned).
    pub const PG_INDEX: u32 = 52;
}

/// iSCSI Node Type bits (RFC 4171 §6.4.2).
pub mod node_type {
    /// The node is a target.
    pub const TARGET: u32 = 0x1;
    /// The node is an initiator.
    pub const INITIATOR: u32 = 0x2;
    /// The node is a control node.
    pub const CONTROL: u32 = 0x4;
}

/// Entity Protocol value of an iSCSI entity (RFC 4171 §6.2.2).
pub const ENTITY_PROTOCOL_ISCSI: u32 = 2;

/// The UDP flag of a port attribute (RFC 4171 §6.3.2: bit 15 of the word's
/// upper half, counting from its most significant bit).
const PORT_UDP: u32 = 1 << 16;

/// One attribute: its tag and its value as on the wire (padding included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    /// The attribute's tag.
    pub tag: u32,
    /// The value, exactly as many bytes as the attribute's length field says.
    pub value: Vec<u8>,
}

impl Attr {
    /// An attribute with no value: the delimiter, a query's "return this"
    /// request, or a NULL PG Tag.
    pub fn empty(tag: u32) -> Attr {
        Attr {
            tag,
            value: Vec::new(),
        }
    }

    /// A 32-bit integer attribute.
    pub fn u32(tag: u32, v: u32) -> Attr {
        Attr {
            tag,
            value: v.to_be_bytes().to_vec(),
        }
    }

    /// A string attribute: UTF-8, NUL-terminated, padded with NULs to a
    /// multiple of four bytes (RFC 4171 §5.5).
    pub fn string(tag: u32, s: &str) -> Attr {
        let mut value = s.as_bytes().to_vec();
        value.push(0);
        while value.len() % 4 != 0 {
            value.push(0);
        }
        Attr { tag, value }
    }

    /// An IP address attribute: 16 bytes, an IPv4 address mapped into IPv6
    /// (RFC 4171 §6.3.1).
    pub fn ip(tag: u32, ip: IpAddr) -> Attr {
        let v6 = match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        Attr {
            tag,
            value: v6.octets().to_vec(),
        }
    }

    /// A TCP port attribute.
    pub fn tcp_port(tag: u32, port: u16) -> Attr {
        Attr::u32(tag, u32::from(port))
    }

    /// The value as a 32-bit integer, if it is four bytes long.
    pub fn as_u32(&self) -> Option<u32> {
        let b: [u8; 4] = self.value.as_slice().try_into().ok()?;
        Some(u32::from_be_bytes(b))
    }

    /// The value as a string: up to its first NUL, if that is UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        let end = self
            .value
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.value.len());
        std::str::from_utf8(&self.value[..end]).ok()
    }

    /// The value as an IP address, if it is 16 bytes long; an IPv4-mapped
    /// address comes back as IPv4.
    pub fn as_ip(&self) -> Option<IpAddr> {
        let b: [u8; 16] = self.value.as_slice().try_into().ok()?;
        let v6 = Ipv6Addr::from(b);
        Some(match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        })
    }

    /// The value as a port: the port number and whether it is UDP.
    pub fn as_port(&self) -> Option<(u16, bool)> {
        let v = self.as_u32()?;
        Some(((v & 0xffff) as u16, v & PORT_UDP != 0))
    }

    /// Bytes this attribute takes on the wire.
    pub fn wire_len(&self) -> usize {
        8 + self.value.len()
    }

    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.tag.to_be_bytes());
        // Attribute values are bounded by the PDU length (16 bits), so
        // their length always fits the 32-bit field.
        out.extend_from_slice(&(self.value.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.value);
    }
}
