//! The iSNS protocol (iSNSP, RFC 4171): the messages a target exchanges with
//! an Internet Storage Name Service server to register its network entity,
//! portals, targets and portal groups, so that initiators can find them
//! (`iscsiadm -m discovery -t isns`) without knowing a portal first.
//!
//! A message travels in one or more PDUs (§5.1): a 12-byte header, then a
//! payload of attributes; a response's payload starts with a status code.
//! Nothing here trusts a length before checking it against the bytes that
//! arrived and against [`MAX_MESSAGE`].

pub mod attr;

pub use attr::{node_type, tag, Attr, ENTITY_PROTOCOL_ISCSI};

/// The TCP port iSNS servers listen on (IANA, RFC 4171 §5.1).
pub const DEFAULT_PORT: u16 = 3205;
/// Length of the iSNSP PDU header (§5.1).
pub const HEADER_LEN: usize = 12;
/// The iSNSP version of RFC 4171.
pub const VERSION: u16 = 1;
/// The largest payload one PDU carries: the PDU Length field is 16 bits,
/// and attributes come in multiples of four bytes.
pub const MAX_PDU_PAYLOAD: usize = 65532;
/// The largest message this side reassembles from several PDUs: a bound on
/// what a server can make it hold.
pub const MAX_MESSAGE: usize = 4 << 20;

/// Function IDs (§5.1.3); a response is its request's ID with
/// [`function::RESPONSE`] set.
pub mod function {
    /// Device Attribute Registration Request.
    pub const DEV_ATTR_REG: u16 = 0x0001;
    /// Device Attribute Query Request.
    pub const DEV_ATTR_QRY: u16 = 0x0002;
    /// Device Get Next Request.
    pub const DEV_GET_NEXT: u16 = 0x0003;
    /// Deregister Device Request.
    pub const DEV_DEREG: u16 = 0x0004;
    /// SCN Register Request.
    pub const SCN_REG: u16 = 0x0005;
    /// SCN Deregister Request.
    pub const SCN_DEREG: u16 = 0x0006;
    /// State Change Notification (server to client).
    pub const SCN: u16 = 0x0008;
    /// Entity Status Inquiry (server to client).
    pub const ESI: u16 = 0x000d;
    /// Set on every response.
    pub const RESPONSE: u16 = 0x8000;

    /// A short name of a function ID, for logs.
    pub fn name(id: u16) -> &'static str {
        match id & !RESPONSE {
            DEV_ATTR_REG => "DevAttrReg",
            DEV_ATTR_QRY => "DevAttrQry",
            DEV_GET_NEXT => "DevGetNext",
            DEV_DEREG => "DevDereg",
            SCN_REG => "SCNReg",
            SCN_DEREG => "SCNDereg",
            0x0007 => "SCNEvent",
            SCN => "SCN",
            ESI => "ESI",
            _ => "function",
        }
    }
}

/// Header flags (§5.1.4).
pub mod flag {
    /// Sent by an iSNS client.
    pub const CLIENT: u16 = 0x8000;
    /// Sent by an iSNS server.
    pub const SERVER: u16 = 0x4000;
    /// An authentication block follows the attributes.
    pub const AUTH: u16 = 0x2000;
    /// DevAttrReg: replace the entity's registration instead of adding to it.
    pub const REPLACE: u16 = 0x1000;
    /// The last PDU of its message.
    pub const LAST_PDU: u16 = 0x0800;
    /// The first PDU of its message.
    pub const FIRST_PDU: u16 = 0x0400;
}

/// Response status codes (§5.4).
pub mod status {
    /// The request succeeded.
    pub const SUCCESSFUL: u32 = 0;
    /// The server knows no object the request names.
    pub const NO_SUCH_ENTRY: u32 = 9;

    /// The name RFC 4171 gives a status code.
    pub fn name(code: u32) -> &'static str {
        match code {
            0 => "Successful",
            1 => "Unknown Error",
            2 => "Message Format Error",
            3 => "Invalid Registration",
            5 => "Invalid Query",
            6 => "Source Unknown",
            7 => "Source Absent",
            8 => "Source Unauthorized",
            9 => "No Such Entry",
            10 => "Version Not Supported",
            11 => "Internal Error",
            12 => "Busy",
            13 => "Option Not Understood",
            14 => "Invalid Update",
            15 => "Message (FUNCTION_ID) Not Supported",
            16 => "SCN Event Rejected",
            17 => "SCN Registration Rejected",
            18 => "Attribute Not Implemented",
            21 => "ESI Not Available",
            22 => "Invalid Deregistration",
            23 => "Registration Feature Not Supported",
            _ => "unknown status",
        }
    }
}

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

/// Why bytes could not be taken as an iSNS message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IsnsError {
    /// More bytes are needed.
    #[error("truncated iSNS PDU: {need} more bytes needed")]
    Truncated {
        /// Bytes still missing.
        need: usize,
    },
    /// The peer speaks another iSNSP version.
    #[error("iSNSP version {0} (this side speaks version 1)")]
    Version(u16),
    /// An attribute's length runs past its message.
    #[error("attribute {tag} claims {len} bytes where {left} remain in the message")]
    AttrOverrun {
        /// The attribute's tag.
        tag: u32,
        /// Its length field.
        len: u32,
        /// Bytes left in the payload after its tag and length.
        left: usize,
    },
    /// A response too short to hold its status code.
    #[error("{0} response without a status code")]
    NoStatus(&'static str),
    /// The message carries an authentication block (§5.6.1), which this
    /// side does not verify.
    #[error("the message carries an authentication block: iSNS authentication is not supported (turn it off on the server for this client)")]
    Authenticated,
    /// A PDU of a multi-PDU message out of order or of another message.
    #[error("iSNS PDU out of sequence: {0}")]
    Sequence(String),
    /// A message longer than this side takes.
    #[error("iSNS message of {0} bytes (more than {MAX_MESSAGE} in all, or more than {MAX_PDU_PAYLOAD} in one PDU)")]
    TooLong(usize),
}

/// The iSNSP PDU header (§5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// iSNSP version (1).
    pub version: u16,
    /// Function ID.
    pub function: u16,
    /// Payload length in bytes.
    pub length: u16,
    /// Flags ([`flag`]).
    pub flags: u16,
    /// Transaction ID: a response carries its request's.
    pub transaction: u16,
    /// Sequence ID of this PDU within its message, from 0.
    pub sequence: u16,
}

impl Header {
    /// Reads a header from the first [`HEADER_LEN`] bytes of `b`.
    pub fn decode(b: &[u8]) -> Result<Header, IsnsError> {
        if b.len() < HEADER_LEN {
            return Err(IsnsError::Truncated {
                need: HEADER_LEN - b.len(),
            });
        }
        let word = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
        let h = Header {
            version: word(0),
            function: word(2),
            length: word(4),
            flags: word(6),
            transaction: word(8),
            sequence: word(10),
        };
        if h.version != VERSION {
            return Err(IsnsError::Version(h.version));
        }
        Ok(h)
    }

    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        for (i, w) in [
            self.version,
            self.function,
            self.length,
            self.flags,
            self.transaction,
            self.sequence,
        ]
        .into_iter()
        .enumerate()
        {
            b[2 * i..2 * i + 2].copy_from_slice(&w.to_be_bytes());
        }
        b
    }
}

/// One iSNS message: a request, a response, or a server's own message
/// (SCN, ESI).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Function ID ([`function`]).
    pub function: u16,
    /// Flags other than first/last PDU (the encoder sets those).
    pub flags: u16,
    /// Transaction ID.
    pub transaction: u16,
    /// A response's status code; `None` for requests.
    pub status: Option<u32>,
    /// The attributes, in order.
    pub attrs: Vec<Attr>,
}

impl Message {
    /// A client's request.
    pub fn request(function: u16, transaction: u16, attrs: Vec<Attr>) -> Message {
        Message {
            function,
            flags: flag::CLIENT,
            transaction,
            status: None,
            attrs,
        }
    }

    /// A client's response to a server's message (ESI, SCN).
    pub fn response_to(request: &Message, status: u32, attrs: Vec<Attr>) -> Message {
        Message {
            function: request.function | function::RESPONSE,
            flags: flag::CLIENT,
            transaction: request.transaction,
            status: Some(status),
            attrs,
        }
    }

    /// Whether this is a response.
    pub fn is_response(&self) -> bool {
        self.function & function::RESPONSE != 0
    }

    /// The first attribute with `tag`.
    pub fn attr(&self, tag: u32) -> Option<&Attr> {
        self.attrs.iter().find(|a| a.tag == tag)
    }

    /// The operating attributes: those after the delimiter that ends the
    /// source and message key (§5.6.1); all of them when there is none.
    pub fn operating_attrs(&self) -> &[Attr] {
        let start = self
            .attrs
            .iter()
            .position(|a| a.tag == tag::DELIMITER)
            .map_or(0, |i| i + 1);
        &self.attrs[start..]
    }

    /// The payload's length on the wire.
    pub fn payload_len(&self) -> usize {
        let status = if self.status.is_some() { 4 } else { 0 };
        status + self.attrs.iter().map(Attr::wire_len).sum::<usize>()
    }

    /// The message as one PDU (first and last). A message whose payload is
    /// longer than one PDU takes is refused: senders split their
    /// registrations into messages that fit.
    pub fn encode(&self) -> Result<Vec<u8>, IsnsError> {
        let len = self.payload_len();
        if len > MAX_PDU_PAYLOAD {
            return Err(IsnsError::TooLong(len));
        }
        let header = Header {
            version: VERSION,
            function: self.function,
            length: len as u16,
            flags: (self.flags & !(flag::FIRST_PDU | flag::LAST_PDU))
                | flag::FIRST_PDU
                | flag::LAST_PDU,
            transaction: self.transaction,
            sequence: 0,
        };
        let mut out = Vec::with_capacity(HEADER_LEN + len);
        out.extend_from_slice(&header.encode());
        if let Some(s) = self.status {
            out.extend_from_slice(&s.to_be_bytes());
        }
        for a in &self.attrs {
            a.encode_into(&mut out);
        }
        Ok(out)
    }

    /// Reads a whole message's payload (its PDUs' payloads put together),
    /// described by the first PDU's `header`.
    pub fn parse(header: &Header, payload: &[u8]) -> Result<Message, IsnsError> {
        if header.flags & flag::AUTH != 0 {
            return Err(IsnsError::Authenticated);
        }
        let mut rest = payload;
        let status = if header.function & function::RESPONSE != 0 {
            if rest.len() < 4 {
                return Err(IsnsError::NoStatus(function::name(header.function)));
            }
            let s = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
            rest = &rest[4..];
            Some(s)
        } else {
            None
        };
        let mut attrs = Vec::new();
        while !rest.is_empty() {
            if rest.len() < 8 {
                return Err(IsnsError::Truncated {
                    need: 8 - rest.len(),
                });
            }
            let tag = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
            let len = u32::from_be_bytes([rest[4], rest[5], rest[6], rest[7]]);
            let left = rest.len() - 8;
            if len as usize > left {
                return Err(IsnsError::AttrOverrun { tag, len, left });
            }
            let end = 8 + len as usize;
            attrs.push(Attr {
                tag,
                value: rest[8..end].to_vec(),
            });
            rest = &rest[end..];
        }
        Ok(Message {
            function: header.function,
            flags: header.flags & !(flag::FIRST_PDU | flag::LAST_PDU),
            transaction: header.transaction,
            status,
            attrs,
        })
    }
}

/// Takes bytes as they arrive from a stream and hands out whole messages,
/// putting multi-PDU messages together (§5.1.4: first and last PDU flags,
/// sequence IDs counting from 0).
#[derive(Debug, Default)]
pub struct MessageReader {
    buf: Vec<u8>,
    /// The first PDU's header and the payload so far of a message whose
    /// last PDU has not come.
    partial: Option<(Header, Vec<u8>)>,
}

impl MessageReader {
    /// A reader with nothing buffered.
    pub fn new() -> MessageReader {
        MessageReader::default()
    }

    /// Adds bytes read from the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes buffered and not yet taken.
    pub fn buffered(&self) -> usize {
        self.buf.len() + self.partial.as_ref().map_or(0, |(_, p)| p.len())
    }

    /// The next whole message, if its bytes have all come. An error leaves
    /// the stream unusable: the caller closes the connection.
    pub fn next_message(&mut self) -> Result<Option<Message>, IsnsError> {
        loop {
            if self.buf.len() < HEADER_LEN {
                return Ok(None);
            }
            let h = Header::decode(&self.buf)?;
            let end = HEADER_LEN + usize::from(h.length);
            if self.buf.len() < end {
                return Ok(None);
            }
            let payload: Vec<u8> = self.buf[HEADER_LEN..end].to_vec();
            self.buf.drain(..end);
            let first = h.flags & flag::FIRST_PDU != 0;
            let last = h.flags & flag::LAST_PDU != 0;
            let (head, whole) = match self.partial.take() {
                None => {
                    if !first || h.sequence != 0 {
                        return Err(IsnsError::Sequence(format!(
                            "{} PDU with sequence ID {} does not start a message",
                            function::name(h.function),
                            h.sequence
                        )));
                    }
                    (h, payload)
                }
                Some((head, mut so_far)) => {
                    // The partial's header keeps the sequence ID of its latest PDU.
                    let expected = head.sequence.wrapping_add(1);
                    if first
                        || h.function != head.function
                        || h.transaction != head.transaction
                        || h.sequence != expected
                    {
                        return Err(IsnsError::Sequence(format!(
                            "{} PDU (transaction {}, sequence {}) inside {} transaction {} (sequence {expected} expected)",
                            function::name(h.function),
                            h.transaction,
                            h.sequence,
                            function::name(head.function),
                            head.transaction
                        )));
                    }
                    so_far.extend_from_slice(&payload);
                    if so_far.len() > MAX_MESSAGE {
                        return Err(IsnsError::TooLong(so_far.len()));
                    }
                    (
                        Header {
                            sequence: h.sequence,
                            ..head
                        },
                        so_far,
                    )
                }
            };
            if last {
                return Message::parse(&head, &whole).map(Some);
            }
            self.partial = Some((head, whole));
        }
    }
}

#[cfg(test)]
mod tests;
