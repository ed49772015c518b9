//! Wire format of the soft RDMA protocol over TCP (sans-IO: encode and decode only).
//!
//! Every frame is a 24-byte header followed by `len` payload bytes:
//!
//! ```text
//! 0      1        2    4          8                16       20        24
//! | kind | status | 0 0 | len (BE) | addr (BE u64)  | rkey   | aux    | payload...
//! ```
//!
//! Kinds: CONNECT/ACCEPT/REJECT carry private data (connection establishment);
//! WRITE (addr, rkey, data), READ_REQ (addr, rkey, aux = length), SEND (data) are requests
//! served by the peer's responder; ACK (status) answers WRITE and SEND, READ_RESP (status,
//! data) answers READ_REQ. Responses come back in request order (reliable connection).

use bytes::{BufMut, BytesMut};

use crate::rdma::{RdmaError, Result, WcStatus};

pub const HEADER_LEN: usize = 24;
/// Largest payload of one frame (and so of one RDMA operation on the soft backend).
pub const MAX_PAYLOAD: usize = 64 << 20;
/// Magic sent in CONNECT's `aux` so that a stray TCP client is refused quickly.
pub const MAGIC: u32 = 0x5346_5244; // "SFRD"

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Connect = 1,
    Accept = 2,
    Reject = 3,
    Write = 4,
    ReadReq = 5,
    Send = 6,
    Ack = 7,
    ReadResp = 8,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Connect,
            2 => Kind::Accept,
            3 => Kind::Reject,
            4 => Kind::Write,
            5 => Kind::ReadReq,
            6 => Kind::Send,
            7 => Kind::Ack,
            8 => Kind::ReadResp,
            _ => return None,
        })
    }
    /// Requests are served by the responder; the rest are responses or setup.
    pub fn is_request(self) -> bool {
        matches!(self, Kind::Write | Kind::ReadReq | Kind::Send)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub status: WcStatus,
    pub len: u32,
    pub addr: u64,
    pub rkey: u32,
    pub aux: u32,
}

impl Header {
    pub fn new(kind: Kind) -> Header {
        Header {
            kind,
            status: WcStatus::Success,
            len: 0,
            addr: 0,
            rkey: 0,
            aux: 0,
        }
    }

    pub fn encode(&self, out: &mut BytesMut) {
        out.reserve(HEADER_LEN);
        out.put_u8(self.kind as u8);
        out.put_u8(self.status.code());
        out.put_u16(0);
        out.put_u32(self.len);
        out.put_u64(self.addr);
        out.put_u32(self.rkey);
        out.put_u32(self.aux);
    }

    /// Decode and validate a header; the payload length is bounded by [`MAX_PAYLOAD`] and a
    /// READ_REQ's requested length likewise, before anything is allocated.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header> {
        let kind = Kind::from_u8(b[0])
            .ok_or_else(|| RdmaError::Protocol(format!("unknown frame kind {}", b[0])))?;
        let status = WcStatus::from_code(b[1])
            .ok_or_else(|| RdmaError::Protocol(format!("unknown status {}", b[1])))?;
        if b[2] != 0 || b[3] != 0 {
            return Err(RdmaError::Protocol("reserved bytes not zero".into()));
        }
        let len = u32::from_be_bytes(b[4..8].try_into().unwrap());
        let addr = u64::from_be_bytes(b[8..16].try_into().unwrap());
        let rkey = u32::from_be_bytes(b[16..20].try_into().unwrap());
        let aux = u32::from_be_bytes(b[20..24].try_into().unwrap());
        if len as usize > MAX_PAYLOAD {
            return Err(RdmaError::Protocol(format!(
                "payload of {len} bytes too large"
            )));
        }
        if kind == Kind::ReadReq && (len != 0 || aux as usize > MAX_PAYLOAD) {
            return Err(RdmaError::Protocol("bad READ request length".into()));
        }
        if matches!(kind, Kind::Connect | Kind::Accept | Kind::Reject)
            && len as usize > crate::rdma::MAX_PRIVATE_DATA
        {
            return Err(RdmaError::Protocol("private data too long".into()));
        }
        Ok(Header {
            kind,
            status,
            len,
            addr,
            rkey,
            aux,
        })
    }
}

/// Encode a whole frame with `payload`.
pub fn frame(mut h: Header, payload: &[u8]) -> BytesMut {
    h.len = payload.len() as u32;
    let mut out = BytesMut::with_capacity(HEADER_LEN + payload.len());
    h.encode(&mut out);
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn roundtrip() {
        let h = Header {
            kind: Kind::Write,
            status: WcStatus::Success,
            len: 5,
            addr: 0xdead_beef_0000,
            rkey: 0x1234_5601,
            aux: 0,
        };
        let f = frame(h, b"hello");
        assert_eq!(f.len(), HEADER_LEN + 5);
        let d = Header::decode(f[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(d, h);
    }

    #[test]
    fn rejects_bad_headers() {
        let mut b = [0u8; HEADER_LEN];
        assert!(Header::decode(&b).is_err()); // kind 0
        b[0] = Kind::Send as u8;
        b[4..8].copy_from_slice(&((MAX_PAYLOAD as u32) + 1).to_be_bytes());
        assert!(Header::decode(&b).is_err());
        b[4..8].copy_from_slice(&0u32.to_be_bytes());
        b[1] = 99;
        assert!(Header::decode(&b).is_err());
        b[1] = 0;
        b[0] = Kind::Connect as u8;
        b[4..8].copy_from_slice(&57u32.to_be_bytes());
        assert!(Header::decode(&b).is_err());
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::array::uniform24(any::<u8>())) {
            if let Ok(h) = Header::decode(&bytes) {
                prop_assert!(h.len as usize <= MAX_PAYLOAD);
                let mut out = BytesMut::new();
                h.encode(&mut out);
                prop_assert_eq!(&out[..], &bytes[..]);
            }
        }
    }
}
