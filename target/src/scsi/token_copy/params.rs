//! The parameter lists of POPULATE TOKEN and WRITE USING TOKEN (SBC-3
//! 5.10.3, 5.31.3): parsed with every length checked against the bytes that
//! came before any is trusted, and encoded (for tests, fuzzing and
//! initiators).

use blockwire_pdu::scsi::Asc;

use super::super::outcome::{illegal, invalid_param, param_length, Failure};
use super::super::param_bytes::{be16, be32, be64};
use super::{MAX_RANGES, TOKEN_LEN};

/// POPULATE TOKEN's parameter list header, before the range descriptors.
pub(super) const PT_HEADER: usize = 16;
/// WRITE USING TOKEN's parameter list header, ROD token included.
pub(super) const WUT_HEADER: usize = 536;
/// One block device range descriptor.
const RANGE_LEN: usize = 16;

/// One block device range descriptor: `blocks` blocks from `lba`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRange {
    /// LOGICAL BLOCK ADDRESS.
    pub lba: u64,
    /// NUMBER OF LOGICAL BLOCKS.
    pub blocks: u32,
}

/// POPULATE TOKEN's parameter list (SBC-3 table 70).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PopulateTokenParams {
    /// IMMED: status may come before the token is made.
    pub immed: bool,
    /// ROD TYPE, when RTV is set; `None` lets the copy manager choose.
    pub rod_type: Option<u32>,
    /// INACTIVITY TIMEOUT in seconds (0: the default).
    pub inactivity_timeout: u32,
    /// The ranges the token is to stand for, in order.
    pub ranges: Vec<BlockRange>,
}

/// WRITE USING TOKEN's parameter list (SBC-3 table 100).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteUsingTokenParams {
    /// IMMED.
    pub immed: bool,
    /// DEL_TKN: the token lapses once this command ends.
    pub delete_token: bool,
    /// OFFSET INTO ROD, in blocks.
    pub offset: u64,
    /// The ROD token.
    pub token: Box<[u8; TOKEN_LEN]>,
    /// The ranges to write, in order.
    pub ranges: Vec<BlockRange>,
}

/// Parses the range descriptors of a parameter list: `len` bytes of them at
/// `at`. Refuses a length that is not whole descriptors or names more than
/// [`MAX_RANGES`], and ranges that overlap (SBC-3 5.10.3, 5.31.3).
fn parse_ranges(
    p: &[u8],
    at: usize,
    len: usize,
    len_field: usize,
) -> Result<Vec<BlockRange>, Failure> {
    if len == 0 || !len.is_multiple_of(RANGE_LEN) {
        return Err(invalid_param(len_field as u16, None));
    }
    if len / RANGE_LEN > MAX_RANGES {
        return Err(illegal(Asc::TOO_MANY_SEGMENT_DESCRIPTORS));
    }
    let body = p.get(at..at + len).ok_or_else(param_length)?;
    let ranges: Vec<BlockRange> = body
        .chunks_exact(RANGE_LEN)
        .map(|d| BlockRange {
            lba: be64(d, 0),
            blocks: be32(d, 8),
        })
        .collect();
    for (i, a) in ranges.iter().enumerate() {
        for b in &ranges[..i] {
            let (a_end, b_end) = (
                a.lba.saturating_add(u64::from(a.blocks)),
                b.lba.saturating_add(u64::from(b.blocks)),
            );
            if a.blocks != 0 && b.blocks != 0 && a.lba < b_end && b.lba < a_end {
                return Err(invalid_param((at + i * RANGE_LEN) as u16, None));
            }
        }
    }
    Ok(ranges)
}

/// Checks a token command's parameter list lengths against each other and
/// against the bytes that came: the list holds its `header`, its DATA
/// LENGTH (bytes 0-1, counting the bytes after itself) fits in it, and the
/// BLOCK DEVICE RANGE DESCRIPTOR LENGTH at `ranges_field` fits in that.
/// Returns the range descriptor length.
fn checked_lengths(p: &[u8], header: usize, ranges_field: usize) -> Result<usize, Failure> {
    if p.len() < header || be16(p, 0) + 2 > p.len() {
        return Err(param_length());
    }
    let ranges_len = be16(p, ranges_field);
    if header + ranges_len > be16(p, 0) + 2 {
        return Err(invalid_param(ranges_field as u16, None));
    }
    Ok(ranges_len)
}

/// Parses POPULATE TOKEN's parameter list (`p` is exactly PARAMETER LIST
/// LENGTH bytes). Lengths are checked against each other and against `p`
/// before any is trusted.
pub(crate) fn parse_populate_token(p: &[u8]) -> Result<PopulateTokenParams, Failure> {
    let ranges_len = checked_lengths(p, PT_HEADER, 14)?;
    let rtv = p[2] & 0x02 != 0;
    Ok(PopulateTokenParams {
        immed: p[2] & 0x01 != 0,
        rod_type: rtv.then(|| be32(p, 8)),
        inactivity_timeout: be32(p, 4),
        ranges: parse_ranges(p, PT_HEADER, ranges_len, 14)?,
    })
}

/// Parses WRITE USING TOKEN's parameter list.
pub(crate) fn parse_write_using_token(p: &[u8]) -> Result<WriteUsingTokenParams, Failure> {
    let ranges_len = checked_lengths(p, WUT_HEADER, 534)?;
    let mut token = Box::new([0u8; TOKEN_LEN]);
    token.copy_from_slice(&p[16..16 + TOKEN_LEN]);
    Ok(WriteUsingTokenParams {
        immed: p[2] & 0x01 != 0,
        delete_token: p[2] & 0x02 != 0,
        offset: be64(p, 8),
        token,
        ranges: parse_ranges(p, WUT_HEADER, ranges_len, 534)?,
    })
}

/// Encodes a POPULATE TOKEN parameter list (for tests, fuzzing and the
/// initiator side).
pub fn encode_populate_token(params: &PopulateTokenParams) -> Vec<u8> {
    let mut p = vec![0u8; PT_HEADER];
    p[2] = u8::from(params.immed) | if params.rod_type.is_some() { 0x02 } else { 0 };
    p[4..8].copy_from_slice(&params.inactivity_timeout.to_be_bytes());
    p[8..12].copy_from_slice(&params.rod_type.unwrap_or(0).to_be_bytes());
    p[14..16].copy_from_slice(&((params.ranges.len() * RANGE_LEN) as u16).to_be_bytes());
    encode_ranges(&mut p, &params.ranges);
    let n = (p.len() - 2) as u16;
    p[..2].copy_from_slice(&n.to_be_bytes());
    p
}

/// Encodes a WRITE USING TOKEN parameter list.
pub fn encode_write_using_token(params: &WriteUsingTokenParams) -> Vec<u8> {
    let mut p = vec![0u8; WUT_HEADER];
    p[2] = u8::from(params.immed) | if params.delete_token { 0x02 } else { 0 };
    p[8..16].copy_from_slice(&params.offset.to_be_bytes());
    p[16..16 + TOKEN_LEN].copy_from_slice(&params.token[..]);
    p[534..536].copy_from_slice(&((params.ranges.len() * RANGE_LEN) as u16).to_be_bytes());
    encode_ranges(&mut p, &params.ranges);
    let n = (p.len() - 2) as u16;
    p[..2].copy_from_slice(&n.to_be_bytes());
    p
}

fn encode_ranges(p: &mut Vec<u8>, ranges: &[BlockRange]) {
    for r in ranges {
        p.extend_from_slice(&r.lba.to_be_bytes());
        p.extend_from_slice(&r.blocks.to_be_bytes());
        p.extend_from_slice(&[0; 4]);
    }
}
