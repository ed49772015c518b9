//! Parameter lists a target receives as Data-Out: UNMAP (SBC-3 5.28.2) and
//! PERSISTENT RESERVE OUT (SPC-4 6.14.3, 6.14.4).

use super::cdb::PrOutAction;
use super::error::{need, DataError};
use super::vpd::PROTOCOL_ISCSI;
use super::wire::{be16, be32, be64, bit, flag, u8_at};

/// One UNMAP block descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UnmapDescriptor {
    /// UNMAP LOGICAL BLOCK ADDRESS.
    pub lba: u64,
    /// NUMBER OF LOGICAL BLOCKS.
    pub blocks: u32,
}

/// UNMAP parameter list.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct UnmapList {
    /// Block descriptors in order.
    pub descriptors: Vec<UnmapDescriptor>,
}

impl UnmapList {
    /// Wire form.
    pub fn encode(&self) -> Vec<u8> {
        let bd = self.descriptors.len().saturating_mul(16);
        let mut v = Vec::with_capacity(8 + bd);
        v.extend_from_slice(&u16::try_from(bd + 6).unwrap_or(u16::MAX).to_be_bytes());
        v.extend_from_slice(&u16::try_from(bd).unwrap_or(!15).to_be_bytes());
        v.extend_from_slice(&[0; 4]);
        for d in &self.descriptors {
            v.extend_from_slice(&d.lba.to_be_bytes());
            v.extend_from_slice(&d.blocks.to_be_bytes());
            v.extend_from_slice(&[0; 4]);
        }
        v
    }

    /// Parses an UNMAP parameter list. Fuzz entry point.
    ///
    /// An empty list means "nothing to do" (SBC-3 allows a zero PARAMETER
    /// LIST LENGTH). A non-empty list shorter than the 8-byte header is a
    /// PARAMETER LIST LENGTH ERROR. Per SBC-3 the descriptors used are those
    /// within both BLOCK DESCRIPTOR DATA LENGTH and the buffer, and a
    /// trailing partial descriptor is ignored.
    pub fn decode(buf: &[u8]) -> Result<Self, DataError> {
        if buf.is_empty() {
            return Ok(Self::default());
        }
        let h = need(buf, 8)?;
        let bd_len = usize::from(be16(h, 2).unwrap_or(0));
        let avail = buf.len() - 8;
        let n = bd_len.min(avail);
        let body = buf.get(8..8 + n).unwrap_or_default();
        Ok(Self {
            descriptors: body
                .chunks_exact(16)
                .map(|c| UnmapDescriptor {
                    lba: be64(c, 0).unwrap_or(0),
                    blocks: be32(c, 8).unwrap_or(0),
                })
                .collect(),
        })
    }
}

/// A TransportID (SPC-4 7.6.4) naming an initiator port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TransportId {
    /// iSCSI: format 00b (name only) when `isid` is `None`, format 01b
    /// ("name,i,0x<isid>") otherwise.
    Iscsi {
        /// iSCSI initiator name.
        name: String,
        /// ISID as hex digits, for an initiator port identifier.
        isid: Option<String>,
    },
    /// Another protocol's fixed-size TransportID, raw (all bytes, header
    /// included).
    Other {
        /// PROTOCOL IDENTIFIER.
        protocol_identifier: u8,
        /// The whole TransportID.
        bytes: Vec<u8>,
    },
}

const ISID_SEPARATOR: &str = ",i,0x";

impl TransportId {
    /// Appends the wire form. iSCSI names are NUL terminated and padded to
    /// a multiple of 4, at least 20 bytes, as SPC-4 requires.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        match self {
            TransportId::Iscsi { name, isid } => {
                let mut s: Vec<u8> = name.as_bytes().to_vec();
                if let Some(i) = isid {
                    s.extend_from_slice(ISID_SEPARATOR.as_bytes());
                    s.extend_from_slice(i.as_bytes());
                }
                s.push(0);
                while s.len() & 3 != 0 || s.len() < 20 {
                    s.push(0);
                }
                s.truncate(usize::from(u16::MAX) & !3);
                let fmt = if isid.is_some() { 0x40 } else { 0 };
                out.push(fmt | PROTOCOL_ISCSI);
                out.push(0);
                out.extend_from_slice(&(s.len() as u16).to_be_bytes());
                out.extend_from_slice(&s);
            }
            TransportId::Other { bytes, .. } => out.extend_from_slice(bytes),
        }
    }

    /// Parses one TransportID at the start of `b`; returns it and its
    /// length. Offsets in errors are relative to `b`.
    pub fn decode(b: &[u8]) -> Result<(TransportId, usize), DataError> {
        let b0 = u8_at(need(b, 1)?, 0).unwrap_or(0);
        let proto = b0 & 0x0f;
        let fixed = match proto {
            0 | 1 | 3 | 6 => Some(24), // FC, SPI, 1394, SAS
            4 => Some(40),             // SRP
            PROTOCOL_ISCSI => None,
            _ => {
                return Err(DataError::InvalidField {
                    byte: 0,
                    bit: Some(3),
                })
            }
        };
        if let Some(n) = fixed {
            let bytes = need(b, n)?.to_vec();
            let tid = TransportId::Other {
                protocol_identifier: proto,
                bytes,
            };
            return Ok((tid, n));
        }
        let len = usize::from(be16(need(b, 4)?, 2).unwrap_or(0));
        if len % 4 != 0 {
            return Err(DataError::InvalidField { byte: 2, bit: None });
        }
        let s = need(b, 4 + len)?.get(4..).unwrap_or_default();
        let end = s.iter().position(|&c| c == 0).unwrap_or(s.len());
        let text = String::from_utf8_lossy(s.get(..end).unwrap_or_default()).into_owned();
        let tid = match b0 >> 6 {
            0 => TransportId::Iscsi {
                name: text,
                isid: None,
            },
            1 => {
                let lower = text.to_ascii_lowercase();
                match lower.find(ISID_SEPARATOR) {
                    Some(p) => TransportId::Iscsi {
                        name: text.get(..p).unwrap_or_default().to_owned(),
                        isid: text.get(p + ISID_SEPARATOR.len()..).map(str::to_owned),
                    },
                    None => return Err(DataError::InvalidField { byte: 4, bit: None }),
                }
            }
            _ => {
                return Err(DataError::InvalidField {
                    byte: 0,
                    bit: Some(7),
                })
            }
        };
        Ok((tid, 4 + len))
    }
}

/// The basic PERSISTENT RESERVE OUT parameter list (every action but
/// REGISTER AND MOVE).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct PrOutParameters {
    /// RESERVATION KEY.
    pub reservation_key: u64,
    /// SERVICE ACTION RESERVATION KEY.
    pub service_action_key: u64,
    /// SPEC_I_PT: register the listed initiator ports too.
    pub spec_i_pt: bool,
    /// ALL_TG_PT: register through all target ports.
    pub all_tg_pt: bool,
    /// APTPL: persist through power loss.
    pub aptpl: bool,
    /// TransportIDs (only with SPEC_I_PT).
    pub transport_ids: Vec<TransportId>,
}

/// REGISTER AND MOVE parameter list.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RegisterAndMoveParameters {
    /// RESERVATION KEY.
    pub reservation_key: u64,
    /// SERVICE ACTION RESERVATION KEY.
    pub service_action_key: u64,
    /// UNREG: unregister the I_T nexus that sent the command.
    pub unreg: bool,
    /// APTPL.
    pub aptpl: bool,
    /// RELATIVE TARGET PORT IDENTIFIER.
    pub relative_target_port: u16,
    /// The destination initiator port.
    pub transport_id: TransportId,
}

/// A decoded PERSISTENT RESERVE OUT parameter list.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PrOutData {
    /// All actions but REGISTER AND MOVE.
    Basic(PrOutParameters),
    /// REGISTER AND MOVE.
    RegisterAndMove(RegisterAndMoveParameters),
}

/// The TransportIDs of `b` (at `base` in its parameter list), at most
/// `max` of them; whether more follow is the second value, and they are
/// not decoded: a list is refused for its length before it costs memory in
/// proportion to what its sender chose.
fn tids(b: &[u8], base: usize, max: usize) -> Result<(Vec<TransportId>, bool), DataError> {
    let mut out = Vec::new();
    let mut off = 0;
    while off < b.len() {
        if out.len() == max {
            return Ok((out, true));
        }
        let (t, n) =
            TransportId::decode(b.get(off..).unwrap_or_default()).map_err(|e| match e {
                DataError::InvalidField { byte, bit } => DataError::InvalidField {
                    byte: byte + base + off,
                    bit,
                },
                // A TransportID running past its parameter data length.
                _ => DataError::Length {
                    expected: base + b.len(),
                    got: base + off,
                },
            })?;
        out.push(t);
        off += n;
    }
    Ok((out, false))
}

impl PrOutParameters {
    /// Where each TransportID of a basic parameter list with SPEC_I_PT
    /// starts, in bytes from the list's start: what a sense-key-specific
    /// field pointer names for a listed port the target refuses (SPC-4
    /// 6.16.3; TransportIDs differ in length, an iSCSI one by its name).
    /// Stops at the first TransportID that does not decode.
    pub fn transport_id_offsets(list: &[u8]) -> Vec<usize> {
        let mut out = Vec::new();
        let mut off = 28;
        while let Some(rest) = list.get(off..).filter(|r| !r.is_empty()) {
            let Ok((_, n)) = TransportId::decode(rest) else {
                break;
            };
            out.push(off);
            off += n;
        }
        out
    }
}

impl PrOutData {
    /// Wire form.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        match self {
            PrOutData::Basic(p) => {
                v.extend_from_slice(&p.reservation_key.to_be_bytes());
                v.extend_from_slice(&p.service_action_key.to_be_bytes());
                v.extend_from_slice(&[0; 4]);
                v.extend_from_slice(&[
                    flag(p.spec_i_pt, 3) | flag(p.all_tg_pt, 2) | flag(p.aptpl, 0),
                    0,
                    0,
                    0,
                ]);
                if p.spec_i_pt {
                    let mut t = Vec::new();
                    for id in &p.transport_ids {
                        id.encode_into(&mut t);
                    }
                    v.extend_from_slice(&u32::try_from(t.len()).unwrap_or(0).to_be_bytes());
                    v.extend_from_slice(&t);
                }
            }
            PrOutData::RegisterAndMove(p) => {
                v.extend_from_slice(&p.reservation_key.to_be_bytes());
                v.extend_from_slice(&p.service_action_key.to_be_bytes());
                v.extend_from_slice(&[0, flag(p.unreg, 1) | flag(p.aptpl, 0)]);
                v.extend_from_slice(&p.relative_target_port.to_be_bytes());
                let mut t = Vec::new();
                p.transport_id.encode_into(&mut t);
                v.extend_from_slice(&u32::try_from(t.len()).unwrap_or(0).to_be_bytes());
                v.extend_from_slice(&t);
            }
        }
        v
    }

    /// Parses the parameter list of `action`. Fuzz entry point.
    ///
    /// Follows SPC-4: without SPEC_I_PT the list must be exactly 24 bytes;
    /// with it, 28 bytes plus TRANSPORTID PARAMETER DATA LENGTH; otherwise
    /// PARAMETER LIST LENGTH ERROR.
    pub fn decode(action: PrOutAction, buf: &[u8]) -> Result<Self, DataError> {
        Self::decode_listing_at_most(action, buf, usize::MAX)
    }

    /// [`PrOutData::decode`] for a device server that registers at most
    /// `max_ports` I_T nexuses: a SPEC_I_PT list of more TransportIDs is
    /// refused ([`DataError::TooManyTransportIds`]) once the one past it
    /// is found, without decoding the rest.
    pub fn decode_listing_at_most(
        action: PrOutAction,
        buf: &[u8],
        max_ports: usize,
    ) -> Result<Self, DataError> {
        let h = need(buf, 24)?;
        let reservation_key = be64(h, 0).unwrap_or(0);
        let service_action_key = be64(h, 8).unwrap_or(0);
        if action == PrOutAction::RegisterAndMove {
            let flags = u8_at(h, 17).unwrap_or(0);
            let tlen = be32(h, 20).unwrap_or(0) as usize;
            let expected = 24usize.saturating_add(tlen);
            if buf.len() != expected {
                return Err(DataError::Length {
                    expected,
                    got: buf.len(),
                });
            }
            let (mut t, more) = tids(buf.get(24..).unwrap_or_default(), 24, 1)?;
            if more || t.len() != 1 {
                return Err(DataError::InvalidField {
                    byte: 20,
                    bit: None,
                });
            }
            return Ok(PrOutData::RegisterAndMove(RegisterAndMoveParameters {
                reservation_key,
                service_action_key,
                unreg: bit(flags, 1),
                aptpl: bit(flags, 0),
                relative_target_port: be16(h, 18).unwrap_or(0),
                transport_id: t.remove(0),
            }));
        }
        let flags = u8_at(h, 20).unwrap_or(0);
        let spec_i_pt = bit(flags, 3);
        let transport_ids = if spec_i_pt {
            let tlen = be32(need(buf, 28)?, 24).unwrap_or(0) as usize;
            let expected = 28usize.saturating_add(tlen);
            if buf.len() != expected {
                return Err(DataError::Length {
                    expected,
                    got: buf.len(),
                });
            }
            let (listed, more) = tids(buf.get(28..).unwrap_or_default(), 28, max_ports)?;
            if more {
                return Err(DataError::TooManyTransportIds { limit: max_ports });
            }
            listed
        } else {
            if buf.len() != 24 {
                return Err(DataError::Length {
                    expected: 24,
                    got: buf.len(),
                });
            }
            Vec::new()
        };
        Ok(PrOutData::Basic(PrOutParameters {
            reservation_key,
            service_action_key,
            spec_i_pt,
            all_tg_pt: bit(flags, 2),
            aptpl: bit(flags, 0),
            transport_ids,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scsi::asc::Asc;

    #[test]
    fn unmap_list() {
        let l = UnmapList {
            descriptors: vec![
                UnmapDescriptor {
                    lba: 0x10,
                    blocks: 8,
                },
                UnmapDescriptor {
                    lba: 1 << 40,
                    blocks: 0xffff_ffff,
                },
            ],
        };
        let b = l.encode();
        assert_eq!(b.get(..8), Some(&[0, 38, 0, 32, 0, 0, 0, 0][..]));
        assert_eq!(UnmapList::decode(&b).unwrap(), l);
        assert_eq!(UnmapList::decode(&[]).unwrap(), UnmapList::default());
        let e = UnmapList::decode(&[0, 6, 0]).unwrap_err();
        assert_eq!(e.to_sense().code(), Asc::PARAMETER_LIST_LENGTH_ERROR);
        // Partial trailing descriptor ignored.
        let one = UnmapList::decode(b.get(..30).unwrap()).unwrap();
        assert_eq!(one.descriptors.len(), 1);
    }

    /// A SPEC_I_PT list of more ports than the device server registers is
    /// refused once the first port past that many is found: what follows
    /// (here bytes that are no TransportID) is never decoded, so a list's
    /// cost stops at the limit whatever its length.
    #[test]
    fn a_listing_past_the_limit_is_refused_before_the_rest_is_decoded() {
        let port = |n: usize| TransportId::Iscsi {
            name: format!("iqn.2026-01.test:{n}"),
            isid: None,
        };
        let listing = |ports: usize| {
            PrOutData::Basic(PrOutParameters {
                service_action_key: 1,
                spec_i_pt: true,
                transport_ids: (0..ports).map(port).collect(),
                ..Default::default()
            })
            .encode()
        };
        let register = PrOutAction::Register;
        let four = listing(4);
        assert!(PrOutData::decode_listing_at_most(register, &four, 4).is_ok());
        // Five ports, then four bytes of an unknown protocol, the list's
        // length grown to cover them.
        let mut five = listing(5);
        five.extend_from_slice(&[0x0f, 0, 0, 0]);
        let tlen = u32::from_be_bytes(five[24..28].try_into().unwrap()) + 4;
        five[24..28].copy_from_slice(&tlen.to_be_bytes());
        assert_eq!(
            PrOutData::decode_listing_at_most(register, &five, 4),
            Err(DataError::TooManyTransportIds { limit: 4 })
        );
        assert!(matches!(
            PrOutData::decode(register, &five),
            Err(DataError::InvalidField { .. })
        ));
        assert_eq!(
            DataError::TooManyTransportIds { limit: 4 }
                .to_sense()
                .code(),
            Asc::INSUFFICIENT_REGISTRATION_RESOURCES
        );
    }

    #[test]
    fn pr_out_register_and_spec_i_pt() {
        let basic = PrOutData::Basic(PrOutParameters {
            reservation_key: 0,
            service_action_key: 0x1122_3344_5566_7788,
            aptpl: true,
            ..Default::default()
        });
        let b = basic.encode();
        assert_eq!(b.len(), 24);
        assert_eq!(b.get(20), Some(&1));
        assert_eq!(PrOutData::decode(PrOutAction::Register, &b).unwrap(), basic);
        let mut long = b.clone();
        long.push(0);
        assert_eq!(
            PrOutData::decode(PrOutAction::Register, &long),
            Err(DataError::Length {
                expected: 24,
                got: 25
            })
        );

        let spec = PrOutData::Basic(PrOutParameters {
            service_action_key: 1,
            spec_i_pt: true,
            transport_ids: vec![
                TransportId::Iscsi {
                    name: "iqn.2024-01.org.example:host".into(),
                    isid: None,
                },
                TransportId::Iscsi {
                    name: "iqn.x".into(),
                    isid: Some("23d000000001".into()),
                },
            ],
            ..Default::default()
        });
        let b = spec.encode();
        assert_eq!(
            PrOutData::decode(PrOutAction::RegisterAndIgnoreExistingKey, &b).unwrap(),
            spec
        );
        // First TransportID: iSCSI, format 0, 28-byte name + NUL -> 32.
        assert_eq!(b.get(28..32), Some(&[0x05, 0, 0, 32][..]));
    }

    #[test]
    fn pr_out_register_and_move() {
        let m = PrOutData::RegisterAndMove(RegisterAndMoveParameters {
            reservation_key: 7,
            service_action_key: 9,
            unreg: true,
            aptpl: false,
            relative_target_port: 2,
            transport_id: TransportId::Iscsi {
                name: "iqn.dest".into(),
                isid: None,
            },
        });
        let b = m.encode();
        assert_eq!(
            PrOutData::decode(PrOutAction::RegisterAndMove, &b).unwrap(),
            m
        );
        let bad = b.get(..b.len() - 4).unwrap();
        assert!(PrOutData::decode(PrOutAction::RegisterAndMove, bad).is_err());
    }
}
