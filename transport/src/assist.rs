//! RDMA-assisted iSCSI: the wire formats both sides share (see
//! `docs/rdma-assisted-iscsi.md`).
//!
//! * The login key [`OFFLOAD_KEY`]: the initiator offers the backends it can use
//!   ([`offer_value`]), the target answers with a [`Grant`] (backend, RDMA endpoint,
//!   per-session token) or `No`.
//! * The RDMA connection's private data, [`BindRequest`]: magic, version, TSIH, token.
//! * The per-command buffer descriptor, [`Descriptor`], carried in a vendor-specific AHS
//!   ([`AHS_RDMA_DESCRIPTOR`]) that embeds an iSER control header (RFC 7145 §9) followed
//!   by the list of contiguous remote chunks.

use std::net::SocketAddr;

use blockwire_pdu::iser::{IserHeader, RemoteBuffer, ISER_HEADER_LEN};
use blockwire_pdu::pdu::Ahs;

use crate::rdma::RemoteBuf;

/// The vendor login key (RFC 7143 §13.5.2: `X-` + reversed domain).
pub const OFFLOAD_KEY: &str = "X-io.blockwire.RdmaOffload";

/// AHSType of the RDMA buffer descriptor: the first of the vendor-specific range
/// 64..=127 (RFC 7143 §11.2.1.2).
pub const AHS_RDMA_DESCRIPTOR: u8 = 64;

/// Version byte of the descriptor AHS and of the bind request.
pub const VERSION: u8 = 1;

/// Most chunks one descriptor carries: TotalAHSLength counts 4-byte words in one byte,
/// so all AHS of a PDU fit in 1020 bytes (3 + 33 + 16·60 = 996).
pub const MAX_CHUNKS: usize = 60;

/// Length of the token granted at login.
pub const TOKEN_LEN: usize = 16;

/// Magic at the start of [`BindRequest`] private data.
pub const BIND_MAGIC: [u8; 4] = *b"BWRO";

/// Reject codes (first byte of the reject private data).
pub mod reject {
    /// The private data is not a bind request.
    pub const MALFORMED: u8 = 1;
    /// No session holds this token (or the TSIH does not match).
    pub const UNKNOWN_TOKEN: u8 = 2;
    /// The session already has a working RDMA connection.
    pub const ALREADY_BOUND: u8 = 3;
}

/// The initiator's offer: the backends it can use, most preferred first.
pub fn offer_value(backends: &[&str]) -> String {
    backends.join(",")
}

/// Backends named in an offer.
pub fn parse_offer(value: &str) -> Vec<&str> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// What the target answers when it agrees: `backend,host:port,token-hex`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub backend: String,
    pub endpoint: SocketAddr,
    pub token: [u8; TOKEN_LEN],
}

impl Grant {
    pub fn to_value(&self) -> String {
        let hex: String = self.token.iter().map(|b| format!("{b:02x}")).collect();
        format!("{},{},{}", self.backend, self.endpoint, hex)
    }

    /// Parses an answer; `None` for `No`, `NotUnderstood`, `Reject`, `Irrelevant` or
    /// anything malformed (all mean: plain iSCSI).
    pub fn parse(value: &str) -> Option<Grant> {
        let mut it = value.split(',');
        let backend = it.next()?.trim();
        let endpoint: SocketAddr = it.next()?.trim().parse().ok()?;
        let hex = it.next()?.trim();
        if it.next().is_some() || backend.is_empty() || hex.len() != 2 * TOKEN_LEN {
            return None;
        }
        let mut token = [0u8; TOKEN_LEN];
        for (i, t) in token.iter_mut().enumerate() {
            *t = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Grant {
            backend: backend.to_owned(),
            endpoint,
            token,
        })
    }
}

/// Private data of the initiator's RDMA connect: binds the queue pair to one session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindRequest {
    pub tsih: u16,
    pub token: [u8; TOKEN_LEN],
}

impl BindRequest {
    /// 24 bytes: magic "BWRO", version, reserved, TSIH (big endian), token.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(8 + TOKEN_LEN);
        v.extend_from_slice(&BIND_MAGIC);
        v.push(VERSION);
        v.push(0);
        v.extend_from_slice(&self.tsih.to_be_bytes());
        v.extend_from_slice(&self.token);
        v
    }

    /// Decodes a bind request. InfiniBand's connection manager pads private data to a
    /// fixed length, so zeros after the request are accepted; anything else is not.
    /// The reserved byte is ignored, as reserved fields are on receipt.
    pub fn decode(b: &[u8]) -> Option<BindRequest> {
        let end = 8 + TOKEN_LEN;
        if b.len() < end
            || b[..4] != BIND_MAGIC
            || b[4] != VERSION
            || b[end..].iter().any(|&x| x != 0)
        {
            return None;
        }
        let mut token = [0u8; TOKEN_LEN];
        token.copy_from_slice(&b[8..end]);
        Some(BindRequest {
            tsih: u16::from_be_bytes([b[6], b[7]]),
            token,
        })
    }
}

/// Direction of an offloaded transfer, seen from the SCSI command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// SCSI READ: the target RDMA-Writes into the chunks (iSER read STag, RSV).
    Read,
    /// SCSI WRITE: the target RDMA-Reads from the chunks (iSER write STag, WSV).
    Write,
}

/// The initiator's buffer for one command: contiguous remote chunks in transfer order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    pub dir: Direction,
    pub chunks: Vec<RemoteBuf>,
}

impl Descriptor {
    /// Total bytes described.
    pub fn len(&self) -> u64 {
        self.chunks.iter().map(|c| c.len).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The AHS: AHSLength = 33 + 16·N, AHSType 64, then
    /// `version(1) | iSER control header(28) | chunk count(2) | reserved(2) |
    /// N × (base offset u64, length u32, stag u32)`, all big endian. The iSER header's
    /// read (RSV) or write (WSV) STag/base offset repeat the first chunk.
    pub fn to_ahs(&self) -> Ahs {
        let first = self.chunks.first().map(|c| RemoteBuffer {
            stag: c.rkey,
            base_offset: c.addr,
        });
        let iser = match self.dir {
            Direction::Read => IserHeader::Control {
                write: None,
                read: first,
            },
            Direction::Write => IserHeader::Control {
                write: first,
                read: None,
            },
        };
        let mut b = Vec::with_capacity(33 + 16 * self.chunks.len());
        b.push(VERSION);
        b.extend_from_slice(&iser.encode());
        b.extend_from_slice(&(self.chunks.len() as u16).to_be_bytes());
        b.extend_from_slice(&[0, 0]);
        for c in &self.chunks {
            b.extend_from_slice(&c.addr.to_be_bytes());
            b.extend_from_slice(&(c.len as u32).to_be_bytes());
            b.extend_from_slice(&c.rkey.to_be_bytes());
        }
        Ahs::Other {
            ahs_type: AHS_RDMA_DESCRIPTOR,
            specific: b,
        }
    }

    /// Finds and decodes the descriptor among a PDU's AHS. `Ok(None)`: there is none.
    pub fn from_ahs(ahs: &[Ahs]) -> Result<Option<Descriptor>, String> {
        let Some(body) = ahs.iter().find_map(|a| match a {
            Ahs::Other {
                ahs_type: AHS_RDMA_DESCRIPTOR,
                specific,
            } => Some(specific),
            _ => None,
        }) else {
            return Ok(None);
        };
        if body.len() < 1 + ISER_HEADER_LEN + 4 || body[0] != VERSION {
            return Err("descriptor AHS too short or of an unknown version".into());
        }
        let iser = IserHeader::decode(&body[1..1 + ISER_HEADER_LEN])
            .map_err(|e| format!("descriptor iSER header: {e}"))?;
        let (dir, first) = match iser {
            IserHeader::Control {
                read: Some(r),
                write: None,
            } => (Direction::Read, r),
            IserHeader::Control {
                write: Some(w),
                read: None,
            } => (Direction::Write, w),
            _ => return Err("descriptor must advertise exactly one of RSV/WSV".into()),
        };
        let at = 1 + ISER_HEADER_LEN;
        let n = u16::from_be_bytes([body[at], body[at + 1]]) as usize;
        let list = &body[at + 4..];
        if n == 0 || n > MAX_CHUNKS || list.len() < 16 * n {
            return Err(format!("descriptor chunk count {n} invalid"));
        }
        let chunks: Vec<RemoteBuf> = list
            .chunks_exact(16)
            .take(n)
            .map(|c| RemoteBuf {
                addr: u64::from_be_bytes(c[0..8].try_into().unwrap()),
                len: u32::from_be_bytes(c[8..12].try_into().unwrap()) as u64,
                rkey: u32::from_be_bytes(c[12..16].try_into().unwrap()),
            })
            .collect();
        if chunks[0].addr != first.base_offset || chunks[0].rkey != first.stag {
            return Err("first chunk differs from the iSER header".into());
        }
        // Every address the target computes inside a chunk must exist.
        if let Some(c) = chunks.iter().find(|c| c.addr.checked_add(c.len).is_none()) {
            return Err(format!(
                "descriptor chunk of {} bytes at {:#x} runs past the end of the address space",
                c.len, c.addr
            ));
        }
        Ok(Some(Descriptor { dir, chunks }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A chunk that fits in the address space (the others are refused).
    fn any_chunk() -> impl Strategy<Value = RemoteBuf> {
        (any::<u32>(), any::<u32>()).prop_flat_map(|(len, rkey)| {
            (0..=u64::MAX - u64::from(len)).prop_map(move |addr| RemoteBuf {
                addr,
                len: u64::from(len),
                rkey,
            })
        })
    }

    /// The target adds offsets inside a chunk to its address: a chunk that
    /// wraps past the end of the address space is refused as it is read
    /// (in a debug build the sum panicked the connection's task).
    #[test]
    fn a_chunk_past_the_end_of_the_address_space_is_refused() {
        for (addr, len) in [(u64::MAX - 10, 100), (u64::MAX, 1)] {
            let d = Descriptor {
                dir: Direction::Read,
                chunks: vec![RemoteBuf { addr, len, rkey: 7 }],
            };
            let e = Descriptor::from_ahs(&[d.to_ahs()]).unwrap_err();
            assert!(e.contains("past the end of the address space"), "{e}");
        }
        let d = Descriptor {
            dir: Direction::Write,
            chunks: vec![RemoteBuf {
                addr: u64::MAX - 100,
                len: 100,
                rkey: 7,
            }],
        };
        assert_eq!(Descriptor::from_ahs(&[d.to_ahs()]), Ok(Some(d)));
    }

    proptest! {
        #[test]
        fn descriptors_roundtrip(
            read in any::<bool>(),
            chunks in proptest::collection::vec(any_chunk(), 1..=MAX_CHUNKS),
        ) {
            let dir = if read { Direction::Read } else { Direction::Write };
            let d = Descriptor { dir, chunks };
            prop_assert_eq!(Descriptor::from_ahs(&[d.to_ahs()]), Ok(Some(d)));
        }

        #[test]
        fn descriptor_bodies_decode_to_what_they_encode(
            body in proptest::collection::vec(any::<u8>(), 0..1100),
        ) {
            let ahs = Ahs::Other { ahs_type: AHS_RDMA_DESCRIPTOR, specific: body };
            if let Ok(Some(d)) = Descriptor::from_ahs(std::slice::from_ref(&ahs)) {
                prop_assert!((1..=MAX_CHUNKS).contains(&d.chunks.len()));
                prop_assert_eq!(Descriptor::from_ahs(&[d.to_ahs()]), Ok(Some(d)));
            }
        }

        #[test]
        fn grants_roundtrip(
            backend in "[a-z][a-z0-9_-]{0,15}",
            ip in any::<std::net::IpAddr>(),
            port in any::<u16>(),
            token in any::<[u8; TOKEN_LEN]>(),
        ) {
            let g = Grant { backend, endpoint: SocketAddr::new(ip, port), token };
            prop_assert_eq!(Grant::parse(&g.to_value()), Some(g));
        }

        #[test]
        fn bind_requests_roundtrip_with_padding(
            tsih in any::<u16>(),
            token in any::<[u8; TOKEN_LEN]>(),
            pad in 0usize..32,
            junk in 1u8..,
        ) {
            let b = BindRequest { tsih, token };
            let mut wire = b.encode();
            wire.resize(wire.len() + pad, 0);
            prop_assert_eq!(BindRequest::decode(&wire), Some(b));
            if pad > 0 {
                *wire.last_mut().unwrap() = junk;
                prop_assert_eq!(BindRequest::decode(&wire), None);
            }
        }
    }

    #[test]
    fn grant_roundtrip_and_refusals() {
        let g = Grant {
            backend: "soft".into(),
            endpoint: "127.0.0.1:4000".parse().unwrap(),
            token: [0xab; TOKEN_LEN],
        };
        let v = g.to_value();
        assert_eq!(Grant::parse(&v), Some(g.clone()));
        let g6 = Grant {
            endpoint: "[::1]:7".parse().unwrap(),
            ..g
        };
        assert_eq!(Grant::parse(&g6.to_value()), Some(g6));
        for bad in ["No", "NotUnderstood", "soft,1.2.3.4:5,abc", "", "soft,x,00"] {
            assert_eq!(Grant::parse(bad), None, "{bad}");
        }
        assert_eq!(parse_offer("verbs, soft"), vec!["verbs", "soft"]);
    }

    #[test]
    fn bind_request_roundtrip() {
        let b = BindRequest {
            tsih: 0x1234,
            token: [7; TOKEN_LEN],
        };
        let e = b.encode();
        assert!(e.len() <= crate::rdma::MAX_PRIVATE_DATA);
        assert_eq!(BindRequest::decode(&e), Some(b));
        assert_eq!(BindRequest::decode(&e[1..]), None);
    }

    #[test]
    fn descriptor_roundtrip_through_a_pdu() {
        use blockwire_pdu::pdu::codes::TaskAttr;
        use blockwire_pdu::pdu::ScsiCommand;
        use blockwire_pdu::{Bhs, Digests, Lun, Pdu};
        let d = Descriptor {
            dir: Direction::Write,
            chunks: (0..MAX_CHUNKS as u64)
                .map(|i| RemoteBuf {
                    addr: 0x10_0000 + i * 0x2000,
                    len: 4096,
                    rkey: 0x300 + i as u32,
                })
                .collect(),
        };
        let pdu = Pdu {
            bhs: Bhs::ScsiCommand(ScsiCommand {
                immediate: false,
                final_bit: true,
                read: false,
                write: true,
                attr: TaskAttr::Simple,
                lun: Lun::from_index(0),
                itt: 1,
                expected_data_transfer_length: d.len() as u32,
                cmd_sn: 1,
                exp_stat_sn: 1,
                cdb: [0; 16],
            }),
            ahs: vec![d.to_ahs()],
            data: Default::default(),
        };
        let wire = pdu.encode(Digests::NONE);
        let (back, _) = Pdu::decode(&wire, Digests::NONE).unwrap();
        assert_eq!(Descriptor::from_ahs(&back.ahs).unwrap(), Some(d.clone()));
        let r = Descriptor {
            dir: Direction::Read,
            chunks: d.chunks[..1].to_vec(),
        };
        assert_eq!(Descriptor::from_ahs(&[r.to_ahs()]).unwrap(), Some(r));
        assert_eq!(Descriptor::from_ahs(&[]).unwrap(), None);
    }
}
