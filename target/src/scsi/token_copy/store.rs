//! The live ROD tokens of one target: made by POPULATE TOKEN, looked up by
//! WRITE USING TOKEN, lapsing after their inactivity timeout or on
//! DEL_TKN, at most [`MAX_TOKENS`] of them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use blockwire_pdu::scsi::{Asc, DesignatorId};
use tracing::warn;

use super::super::param_bytes::{be16, be32, be64};
use super::{
    BlockRange, MAX_TOKENS, ROD_TYPE_ACCESS_UPON_REFERENCE, ROD_TYPE_BLOCK_ZERO, TOKEN_LEN,
};

/// The block device zero ROD token (SBC-3 table 113): ROD type
/// FFFF_0001h, ROD TOKEN LENGTH 01F8h, every other byte zero.
pub fn block_zero_token() -> Box<[u8; TOKEN_LEN]> {
    let mut t = Box::new([0u8; TOKEN_LEN]);
    t[..4].copy_from_slice(&ROD_TYPE_BLOCK_ZERO.to_be_bytes());
    t[6..8].copy_from_slice(&((TOKEN_LEN - 8) as u16).to_be_bytes());
    t
}

/// The unit a token is made on, as the token names it.
#[derive(Debug, Clone)]
pub(crate) struct TokenOrigin {
    /// Its NAA designator, by which WRITE USING TOKEN finds it.
    pub creator: DesignatorId,
    /// CREATOR LOGICAL UNIT DESCRIPTOR: its identification CSCD descriptor.
    pub descriptor: [u8; 32],
    /// Device type specific data: its READ CAPACITY (16) data from byte 8.
    pub device_data: [u8; 24],
    pub block_size: u32,
}

/// A token as the target keeps it.
#[derive(Debug)]
struct HeldToken {
    /// The bytes handed out; a token used must match them whole.
    bytes: Box<[u8; TOKEN_LEN]>,
    /// The NAA designator of the unit whose ranges it stands for.
    creator: DesignatorId,
    block_size: u32,
    ranges: Box<[BlockRange]>,
    inactivity: Duration,
    last_use: Instant,
}

/// What a WRITE USING TOKEN copies from.
#[derive(Debug, Clone)]
pub(crate) enum TokenSource {
    /// Ranges of the unit with this NAA designator.
    Ranges {
        creator: DesignatorId,
        block_size: u32,
        ranges: Box<[BlockRange]>,
    },
    /// The block device zero ROD token.
    Zeros,
}

/// The live ROD tokens of one target (its copy manager).
#[derive(Debug, Default)]
pub struct RodTokens {
    held: Mutex<TokenTable>,
}

#[derive(Debug, Default)]
struct TokenTable {
    by_id: HashMap<u64, HeldToken>,
    next_id: u64,
}

/// Why a token cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRefusal {
    /// Not a ROD type this copy manager makes (23h/01h).
    UnsupportedType,
    /// ROD TOKEN LENGTH is not 01F8h (23h/0Ah).
    InvalidLength,
    /// Never made here, or dropped from the table (23h/04h).
    Unknown,
    /// Its identifier is known but its bytes differ (23h/05h).
    Corrupt,
    /// Its inactivity timeout passed (23h/07h).
    Expired,
}

impl TokenRefusal {
    pub(super) fn asc(self) -> Asc {
        match self {
            TokenRefusal::UnsupportedType => Asc::TOKEN_UNSUPPORTED_TYPE,
            TokenRefusal::InvalidLength => Asc::TOKEN_INVALID_LENGTH,
            TokenRefusal::Unknown => Asc::TOKEN_UNKNOWN,
            TokenRefusal::Corrupt => Asc::TOKEN_CORRUPT,
            TokenRefusal::Expired => Asc::TOKEN_EXPIRED,
        }
    }
}

impl RodTokens {
    /// Makes a token for `ranges` of the unit named `creator`, which will
    /// lapse after `inactivity` without use. Drops expired tokens first,
    /// then, at [`MAX_TOKENS`], the least recently used one.
    pub(crate) fn create(
        &self,
        origin: &TokenOrigin,
        ranges: &[BlockRange],
        inactivity: Duration,
        now: Instant,
    ) -> Box<[u8; TOKEN_LEN]> {
        let blocks: u64 = ranges.iter().map(|r| u64::from(r.blocks)).sum();
        let mut t = self.held.lock().unwrap_or_else(|e| e.into_inner());
        t.by_id.retain(|_, h| !expired(h, now));
        if t.by_id.len() >= MAX_TOKENS {
            if let Some(oldest) = t
                .by_id
                .iter()
                .min_by_key(|(_, h)| h.last_use)
                .map(|(id, _)| *id)
            {
                warn!(
                    token = oldest,
                    "ROD token table full: dropping the least recently used token"
                );
                t.by_id.remove(&oldest);
            }
        }
        t.next_id = t.next_id.wrapping_add(1);
        let id = t.next_id;
        let mut bytes = Box::new([0u8; TOKEN_LEN]);
        bytes[..4].copy_from_slice(&ROD_TYPE_ACCESS_UPON_REFERENCE.to_be_bytes());
        bytes[6..8].copy_from_slice(&((TOKEN_LEN - 8) as u16).to_be_bytes());
        bytes[8..16].copy_from_slice(&id.to_be_bytes());
        bytes[16..48].copy_from_slice(&origin.descriptor);
        let represented = u128::from(blocks) * u128::from(origin.block_size);
        bytes[48..64].copy_from_slice(&represented.to_be_bytes());
        // Bytes 96..128, device type specific data: for a block device,
        // READ CAPACITY (16) data from its LOGICAL BLOCK LENGTH on.
        bytes[96..120].copy_from_slice(&origin.device_data);
        // Extended ROD token data (vendor specific): the unguessable part,
        // so that a host can only use a token it was given.
        let secret: [u8; 32] = rand::random();
        bytes[128..160].copy_from_slice(&secret);
        t.by_id.insert(
            id,
            HeldToken {
                bytes: bytes.clone(),
                creator: origin.creator.clone(),
                block_size: origin.block_size,
                ranges: ranges.into(),
                inactivity,
                last_use: now,
            },
        );
        bytes
    }

    /// What `token` stands for, if it is live; marks it used.
    pub(crate) fn resolve(
        &self,
        token: &[u8; TOKEN_LEN],
        now: Instant,
    ) -> Result<TokenSource, TokenRefusal> {
        // The zero token is known by its ROD type alone (its other bytes
        // are all zero but for ROD TOKEN LENGTH).
        match be32(token, 0) {
            ROD_TYPE_BLOCK_ZERO => return Ok(TokenSource::Zeros),
            ROD_TYPE_ACCESS_UPON_REFERENCE => {}
            _ => return Err(TokenRefusal::UnsupportedType),
        }
        if be16(token, 6) != TOKEN_LEN - 8 {
            return Err(TokenRefusal::InvalidLength);
        }
        let id = be64(token, 8);
        let mut t = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let Some(h) = t.by_id.get_mut(&id) else {
            return Err(TokenRefusal::Unknown);
        };
        if !same_bytes(&h.bytes, token) {
            return Err(TokenRefusal::Corrupt);
        }
        if expired(h, now) {
            t.by_id.remove(&id);
            return Err(TokenRefusal::Expired);
        }
        h.last_use = now;
        Ok(TokenSource::Ranges {
            creator: h.creator.clone(),
            block_size: h.block_size,
            ranges: h.ranges.clone(),
        })
    }

    /// Drops `token` (DEL_TKN), if it is held.
    pub(crate) fn delete(&self, token: &[u8; TOKEN_LEN]) {
        let id = be64(token, 8);
        let mut t = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if t.by_id
            .get(&id)
            .is_some_and(|h| same_bytes(&h.bytes, token))
        {
            t.by_id.remove(&id);
        }
    }

    /// Tokens held now.
    pub fn len(&self) -> usize {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_id
            .len()
    }

    /// Whether no token is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether two tokens are the same, in time that does not depend on where
/// they differ (a host learns nothing of the secret part by timing).
fn same_bytes(a: &[u8; TOKEN_LEN], b: &[u8; TOKEN_LEN]) -> bool {
    a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

fn expired(h: &HeldToken, now: Instant) -> bool {
    now.saturating_duration_since(h.last_use) > h.inactivity
}
