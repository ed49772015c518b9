//! Token-based copy offload (Windows ODX): POPULATE TOKEN, WRITE USING
//! TOKEN and RECEIVE ROD TOKEN INFORMATION (SBC-3 5.10, 5.31, 5.20;
//! SPC-4 6.18.4), and the Third-party Copy VPD page (SPC-4 7.8.17).
//!
//! POPULATE TOKEN names ranges of a unit and gets back, through RECEIVE ROD
//! TOKEN INFORMATION, a 512-byte ROD token that stands for their data; WRITE
//! USING TOKEN on any unit of the same target (by the same host or another
//! that was handed the token) writes that data to its own ranges, without
//! the bytes crossing the network. Tokens here are "access upon reference"
//! (ROD type 0001_0000h): they stand for the data as it is when the token is
//! used, not a snapshot taken at POPULATE TOKEN, so holding one pins no
//! memory and no blocks. The block device zero ROD token (FFFF_0001h) writes
//! zeros and needs no POPULATE TOKEN.
//!
//! Both commands run to completion inside the command, as EXTENDED COPY
//! does: IMMED only means RECEIVE ROD TOKEN INFORMATION finds the operation
//! finished, never in progress. A WRITE USING TOKEN moves at most
//! [`MAX_TOKEN_TRANSFER_BYTES`], which bounds the time one command holds a
//! backstore thread.
//!
//! A token is 512 random-looking bytes to the host; here it is checked whole
//! against the copy kept when it was made (its 16-byte random part is what
//! makes it unguessable), and it lapses after its inactivity timeout, when
//! the unit that made it leaves the target, or when WRITE USING TOKEN asks
//! to delete it. The table of live tokens is bounded
//! ([`MAX_TOKENS`] per target, least recently used dropped first).

use std::time::{Duration, Instant};

use blockwire_pdu::scsi::opcode::copy_out;
use blockwire_pdu::scsi::{Asc, SenseFormat};
use tracing::info;

use super::logical_unit::LogicalUnit;
use super::outcome::{illegal, invalid_cdb, invalid_param, param_length, CmdResult, Done, Failure};
use super::xcopy::{self, copy_segment, read_cdb, write_cdb, ListResults};
use super::{ItNexus, LunTable};

mod params;
mod store;

pub use params::{
    encode_populate_token, encode_write_using_token, BlockRange, PopulateTokenParams,
    WriteUsingTokenParams,
};
pub(crate) use params::{parse_populate_token, parse_write_using_token};
use params::{PT_HEADER, WUT_HEADER};
pub use store::{block_zero_token, RodTokens, TokenRefusal};
pub(crate) use store::{TokenOrigin, TokenSource};

/// Bytes of a ROD token (SPC-4 8.3.1: ROD TOKEN LENGTH 01F8h).
pub const TOKEN_LEN: usize = 512;
/// ROD type "access upon reference" (SPC-4 table 111).
pub const ROD_TYPE_ACCESS_UPON_REFERENCE: u32 = 0x0001_0000;
/// ROD type "block device zero" (SBC-3 5.x): the well-known token whose
/// data is all zeros.
pub const ROD_TYPE_BLOCK_ZERO: u32 = 0xffff_0001;
/// Most block device range descriptors in one parameter list.
pub const MAX_RANGES: usize = 64;
/// Most bytes one token may stand for, and one WRITE USING TOKEN may write.
pub const MAX_TOKEN_TRANSFER_BYTES: u64 = 256 << 20;
/// Inactivity timeout when the host asks for none (seconds).
pub const DEFAULT_INACTIVITY_SECS: u32 = 60;
/// Longest inactivity timeout a host may ask for (seconds).
pub const MAX_INACTIVITY_SECS: u32 = 600;
/// Live tokens one target keeps.
pub const MAX_TOKENS: usize = 1024;

/// The outcome of one POPULATE TOKEN or WRITE USING TOKEN, kept for
/// RECEIVE ROD TOKEN INFORMATION.
#[derive(Debug, Clone)]
pub(crate) struct TokenOpResult {
    /// 10h POPULATE TOKEN, 11h WRITE USING TOKEN.
    service_action: u8,
    /// Why it failed, or None.
    failure: Option<Failure>,
    /// Blocks the token stands for (POPULATE TOKEN) or written (WRITE
    /// USING TOKEN).
    transfer_blocks: u64,
    token: Option<Box<[u8; TOKEN_LEN]>>,
}

/// POPULATE TOKEN and WRITE USING TOKEN results of one unit.
pub(crate) type TokenOpResults = ListResults<u32, TokenOpResult>;

impl LogicalUnit {
    /// The 32-byte identification CSCD descriptor (E4h) naming this unit by
    /// its NAA designator, as EXTENDED COPY takes it and a ROD token's
    /// CREATOR LOGICAL UNIT DESCRIPTOR carries it.
    pub(crate) fn cscd_descriptor(&self) -> [u8; 32] {
        let mut d = [0u8; 32];
        d[0] = 0xe4;
        let des = self.naa_designator_full().encode();
        let n = des.len().min(20);
        d[4..4 + n].copy_from_slice(&des[..n]);
        // Device type specific parameters: DISK BLOCK LENGTH.
        d[29..32].copy_from_slice(&self.cfg.block_size.to_be_bytes()[1..]);
        d
    }

    /// How a token made on this unit names it.
    pub(crate) fn token_origin(&self) -> TokenOrigin {
        let mut device_data = [0u8; 24];
        device_data.copy_from_slice(&self.capacity16().encode()[8..32]);
        TokenOrigin {
            creator: self.naa_designator(),
            descriptor: self.cscd_descriptor(),
            device_data,
            block_size: self.cfg.block_size,
        }
    }

    /// POPULATE TOKEN: checks the ranges as a READ of them would be
    /// checked, then makes a token for them.
    pub(crate) fn populate_token(
        &self,
        nexus: &ItNexus,
        table: &LunTable,
        list_id: u32,
        parameter_list_length: u32,
        data_out: &[u8],
    ) -> CmdResult {
        let result = self.populate_token_inner(nexus, table, parameter_list_length, data_out);
        let (failure, transfer_blocks, token) = match &result {
            Ok((blocks, token)) => (None, *blocks, Some(token.clone())),
            Err(f) => (Some(f.clone()), 0, None),
        };
        self.record_token_op(
            nexus,
            list_id,
            TokenOpResult {
                service_action: copy_out::POPULATE_TOKEN,
                failure,
                transfer_blocks,
                token,
            },
        );
        result.map(|_| Done::out(u64::from(parameter_list_length)))
    }

    /// Keeps a token command's outcome for RECEIVE ROD TOKEN INFORMATION,
    /// and logs it.
    fn record_token_op(&self, nexus: &ItNexus, list_id: u32, op: TokenOpResult) {
        let what = if op.service_action == copy_out::POPULATE_TOKEN {
            "populate token"
        } else {
            "write using token"
        };
        info!(initiator = %nexus.initiator_port, list_id, blocks = op.transfer_blocks, ok = op.failure.is_none(), "{what}");
        self.lock().token_ops.record(nexus, list_id, op);
    }

    fn populate_token_inner(
        &self,
        nexus: &ItNexus,
        table: &LunTable,
        parameter_list_length: u32,
        data_out: &[u8],
    ) -> Result<(u64, Box<[u8; TOKEN_LEN]>), Failure> {
        let p = data_out
            .get(..parameter_list_length as usize)
            .ok_or_else(param_length)?;
        let params = parse_populate_token(p)?;
        match params.rod_type {
            None | Some(0) | Some(ROD_TYPE_ACCESS_UPON_REFERENCE) => {}
            Some(_) => return Err(invalid_param(8, None)),
        }
        if params.inactivity_timeout > MAX_INACTIVITY_SECS {
            return Err(invalid_param(4, None));
        }
        let bs = u64::from(self.cfg.block_size);
        let blocks: u64 = params.ranges.iter().map(|r| u64::from(r.blocks)).sum();
        if blocks * bs > MAX_TOKEN_TRANSFER_BYTES {
            return Err(invalid_param(PT_HEADER as u16 + 8, None));
        }
        for r in &params.ranges {
            self.check_range(r.lba, u64::from(r.blocks))?;
            self.reservation_check(nexus, &read_cdb(r.lba))?;
        }
        let secs = match params.inactivity_timeout {
            0 => DEFAULT_INACTIVITY_SECS,
            s => s,
        };
        let token = table.rod_tokens().create(
            &self.token_origin(),
            &params.ranges,
            Duration::from_secs(u64::from(secs)),
            Instant::now(),
        );
        Ok((blocks, token))
    }

    /// WRITE USING TOKEN: writes the data the token stands for, from
    /// OFFSET INTO ROD on, to the ranges, each checked as a WRITE of it
    /// would be.
    pub(crate) fn write_using_token(
        &self,
        nexus: &ItNexus,
        table: &LunTable,
        list_id: u32,
        parameter_list_length: u32,
        data_out: &[u8],
    ) -> CmdResult {
        let mut written = 0u64;
        let result = self.write_using_token_inner(
            nexus,
            table,
            parameter_list_length,
            data_out,
            &mut written,
        );
        let failure = result.as_ref().err().cloned();
        self.record_token_op(
            nexus,
            list_id,
            TokenOpResult {
                service_action: copy_out::WRITE_USING_TOKEN,
                failure,
                transfer_blocks: written,
                token: None,
            },
        );
        result.map(|_| Done::out(u64::from(parameter_list_length)))
    }

    fn write_using_token_inner(
        &self,
        nexus: &ItNexus,
        table: &LunTable,
        parameter_list_length: u32,
        data_out: &[u8],
        written: &mut u64,
    ) -> Result<(), Failure> {
        let p = data_out
            .get(..parameter_list_length as usize)
            .ok_or_else(param_length)?;
        let params = parse_write_using_token(p)?;
        let bs = u64::from(self.cfg.block_size);
        let want: u64 = params.ranges.iter().map(|r| u64::from(r.blocks)).sum();
        if want * bs > MAX_TOKEN_TRANSFER_BYTES {
            return Err(invalid_param(WUT_HEADER as u16 + 8, None));
        }
        let source = table
            .rod_tokens()
            .resolve(&params.token, Instant::now())
            .map_err(|r| illegal(r.asc()))?;
        for r in &params.ranges {
            self.check_range(r.lba, u64::from(r.blocks))?;
            self.reservation_check(nexus, &write_cdb(r.lba))?;
        }
        self.check_writable()?;
        match source {
            TokenSource::Zeros => {
                for r in &params.ranges {
                    self.write_zeros(r.lba, u64::from(r.blocks))?;
                    *written += u64::from(r.blocks);
                }
            }
            TokenSource::Ranges {
                creator,
                block_size,
                ranges,
            } => {
                let Some(src) = table
                    .units()
                    .into_iter()
                    .map(|(_, u)| u)
                    .find(|u| u.naa_designator() == creator)
                else {
                    // The unit the token's data lives on left the target.
                    return Err(illegal(Asc::TOKEN_REVOKED));
                };
                if block_size != self.cfg.block_size || src.cfg.block_size != block_size {
                    return Err(illegal(Asc::INCORRECT_COPY_TARGET_DEVICE_TYPE));
                }
                // The ranges may not ask for more than the token holds past
                // OFFSET INTO ROD: refused before a block moves, so a host
                // never finds part of its ranges silently left unwritten.
                let total: u64 = ranges.iter().map(|r| u64::from(r.blocks)).sum();
                if params.offset >= total {
                    return Err(invalid_param(8, None));
                }
                if want > total - params.offset {
                    return Err(invalid_param(534, None));
                }
                for (slba, dlba, n) in pair_ranges(&ranges, params.offset, &params.ranges) {
                    copy_segment(nexus, &src, self, slba, dlba, n)?;
                    *written += n;
                }
            }
        };
        if params.delete_token {
            table.rod_tokens().delete(&params.token);
        }
        Ok(())
    }

    /// Writes zeros over `blocks` blocks from `lba`, a MiB at a time, as
    /// WRITE SAME of a zero block does (the backstore's `write_zeroes`,
    /// which may not move the bytes).
    fn write_zeros(&self, lba: u64, blocks: u64) -> Result<(), Failure> {
        let bs = u64::from(self.cfg.block_size);
        let per = ((1 << 20) / bs).max(1);
        let mut done = 0;
        while done < blocks {
            let n = (blocks - done).min(per);
            let _g = self.hold_for_write(lba + done, lba + done + n);
            self.zero_blocks(lba + done, n * bs)?;
            done += n;
        }
        self.persist(lba, false)
    }

    /// RECEIVE ROD TOKEN INFORMATION (SBC-3 5.20, SPC-4 6.18.4 format).
    pub(crate) fn receive_rod_token_information(
        &self,
        nexus: &ItNexus,
        list_id: u32,
        allocation_length: u32,
    ) -> CmdResult {
        let st = self.lock();
        let format = if st.mode.d_sense {
            SenseFormat::Descriptor
        } else {
            SenseFormat::Fixed
        };
        let Some(r) = st.token_ops.get(nexus, list_id) else {
            return Err(invalid_cdb(2, None));
        };
        let (status, sense) = match &r.failure {
            None => (0x00, Vec::new()),
            Some(Failure::Check(s)) => (0x02, s.encode(format)),
            Some(Failure::Conflict) => (0x18, Vec::new()),
        };
        let sense = &sense[..sense.len().min(255)];
        let mut d = vec![0u8; 32];
        d[4] = r.service_action;
        // COPY OPERATION STATUS: 01h completed without errors, 02h with
        // errors (SPC-4 6.18.3). Nothing runs in the background here.
        d[5] = if r.failure.is_some() { 0x02 } else { 0x01 };
        // EXTENDED COPY COMPLETION STATUS: the SCSI status the operation
        // ended with (CHECK CONDITION, RESERVATION CONFLICT).
        d[12] = status;
        d[13] = sense.len() as u8;
        d[14] = sense.len() as u8;
        // TRANSFER COUNT UNITS F1h: logical blocks.
        d[15] = 0xf1;
        d[16..24].copy_from_slice(&r.transfer_blocks.to_be_bytes());
        d.extend_from_slice(sense);
        match &r.token {
            Some(t) => {
                d.extend_from_slice(&((TOKEN_LEN + 2) as u32).to_be_bytes());
                d.extend_from_slice(&[0, 0]);
                d.extend_from_slice(&t[..]);
            }
            None => d.extend_from_slice(&0u32.to_be_bytes()),
        }
        let avail = (d.len() - 4) as u32;
        d[..4].copy_from_slice(&avail.to_be_bytes());
        Ok(Done::data(d, allocation_length))
    }

    /// VPD 8Fh, the Third-party Copy page (SPC-4 7.8.17): the limits of
    /// the token commands and of EXTENDED COPY (LID1), in the descriptor
    /// order SPC-4 lists them.
    pub(crate) fn third_party_copy_page(&self) -> Vec<u8> {
        let bs = u64::from(self.cfg.block_size);
        let max_blocks = MAX_TOKEN_TRANSFER_BYTES / bs;
        let mut d = Vec::new();
        // Block Device ROD Token Limits (0000h, SBC-3 6.6.5.2).
        let mut limits = vec![0u8; 6];
        limits.extend_from_slice(&(MAX_RANGES as u16).to_be_bytes());
        limits.extend_from_slice(&MAX_INACTIVITY_SECS.to_be_bytes());
        limits.extend_from_slice(&DEFAULT_INACTIVITY_SECS.to_be_bytes());
        limits.extend_from_slice(&max_blocks.to_be_bytes()); // MAXIMUM TOKEN TRANSFER SIZE
        limits.extend_from_slice(&max_blocks.to_be_bytes()); // OPTIMAL TRANSFER COUNT
        descriptor(&mut d, 0x0000, &limits);
        // Supported Commands (0001h): each opcode with its service actions.
        let mut cmds = vec![0u8];
        for (opcode, sas) in [
            (0x83u8, &[0x00u8, 0x10, 0x11][..]),
            (0x84, &[0x00, 0x03, 0x07][..]),
        ] {
            cmds.push(opcode);
            cmds.push(sas.len() as u8);
            cmds.extend_from_slice(sas);
        }
        cmds[0] = (cmds.len() - 1) as u8;
        descriptor(&mut d, 0x0001, &cmds);
        // Parameter Data (0004h): EXTENDED COPY's list limits.
        let mut params = vec![0u8; 4];
        params.extend_from_slice(&(xcopy::MAX_CSCD_DESCRIPTORS as u16).to_be_bytes());
        params.extend_from_slice(&(xcopy::MAX_SEGMENT_DESCRIPTORS as u16).to_be_bytes());
        params.extend_from_slice(&(xcopy::MAX_LIST_LENGTH as u32).to_be_bytes());
        params.extend_from_slice(&0u32.to_be_bytes()); // MAXIMUM INLINE DATA LENGTH
        params.extend_from_slice(&[0u8; 12]);
        descriptor(&mut d, 0x0004, &params);
        // Supported Descriptors (0008h): block to block segments (02h),
        // identification CSCD descriptors (E4h).
        descriptor(&mut d, 0x0008, &[2, 0x02, 0xe4]);
        // ROD Token Features (0106h): no remote tokens; lifetimes in
        // seconds; one block device features descriptor.
        let mut feats = vec![0u8; 12];
        feats.extend_from_slice(&1u32.to_be_bytes()); // MINIMUM TOKEN LIFETIME
        feats.extend_from_slice(&MAX_INACTIVITY_SECS.to_be_bytes()); // MAXIMUM TOKEN LIFETIME
        feats.extend_from_slice(&MAX_INACTIVITY_SECS.to_be_bytes()); // MAXIMUM TOKEN INACTIVITY TIMEOUT
        feats.extend_from_slice(&[0u8; 18]);
        feats.extend_from_slice(&48u16.to_be_bytes());
        let mut block = vec![0u8, 0];
        block.extend_from_slice(&44u16.to_be_bytes());
        block.extend_from_slice(&[0u8; 2]);
        block.extend_from_slice(&1u16.to_be_bytes()); // OPTIMAL BLOCK ROD LENGTH GRANULARITY
        block.extend_from_slice(&MAX_TOKEN_TRANSFER_BYTES.to_be_bytes()); // MAXIMUM BYTES IN BLOCK ROD
        block.extend_from_slice(&MAX_TOKEN_TRANSFER_BYTES.to_be_bytes()); // OPTIMAL BYTES IN BLOCK ROD TRANSFER
        block.extend_from_slice(&MAX_TOKEN_TRANSFER_BYTES.to_be_bytes()); // OPTIMAL BYTES TO TOKEN PER SEGMENT
        block.extend_from_slice(&MAX_TOKEN_TRANSFER_BYTES.to_be_bytes()); // OPTIMAL BYTES FROM TOKEN PER SEGMENT
        block.extend_from_slice(&[0u8; 8]);
        feats.extend_from_slice(&block);
        descriptor(&mut d, 0x0106, &feats);
        // Supported ROD Token and ROD Types (0108h): access upon reference
        // tokens are made and taken (TOKEN_OUT, TOKEN_IN), the block device
        // zero token only taken.
        let mut types = vec![0u8; 2];
        types.extend_from_slice(&128u16.to_be_bytes());
        for (rod_type, flags) in [
            (ROD_TYPE_ACCESS_UPON_REFERENCE, 0x03u8),
            (ROD_TYPE_BLOCK_ZERO, 0x02),
        ] {
            let mut one = vec![0u8; 64];
            one[..4].copy_from_slice(&rod_type.to_be_bytes());
            one[4] = flags;
            types.extend_from_slice(&one);
        }
        descriptor(&mut d, 0x0108, &types);
        // General Copy Operations (8001h): one copy at a time per command,
        // segments as long as a token may be.
        let mut general = Vec::new();
        general.extend_from_slice(&1u32.to_be_bytes()); // TOTAL CONCURRENT COPIES
        general.extend_from_slice(&1u32.to_be_bytes()); // MAXIMUM IDENTIFIED CONCURRENT COPIES
        general.extend_from_slice(&xcopy::MAX_SEGMENT_BYTES.to_be_bytes()); // MAXIMUM SEGMENT LENGTH
        general.push(bs.trailing_zeros() as u8); // DATA SEGMENT GRANULARITY
        general.push(0);
        general.extend_from_slice(&[0u8; 18]);
        descriptor(&mut d, 0x8001, &general);
        d
    }
}

/// Appends one third-party copy descriptor: type, length, body padded to a
/// multiple of four bytes.
fn descriptor(out: &mut Vec<u8>, kind: u16, body: &[u8]) {
    let padded = body.len().next_multiple_of(4);
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(padded as u16).to_be_bytes());
    out.extend_from_slice(body);
    out.resize(out.len() + padded - body.len(), 0);
}

/// Lines up the token's ranges, from `offset` blocks in, with the
/// destination ranges: (source LBA, destination LBA, blocks) pieces, until
/// either runs out.
pub(crate) fn pair_ranges(
    source: &[BlockRange],
    offset: u64,
    dest: &[BlockRange],
) -> Vec<(u64, u64, u64)> {
    let mut src = source
        .iter()
        .filter(|r| r.blocks != 0)
        .map(|r| (r.lba, u64::from(r.blocks)));
    let mut skip = offset;
    let mut cur: Option<(u64, u64)> = None;
    let mut out = Vec::new();
    for d in dest.iter().filter(|r| r.blocks != 0) {
        let (mut dlba, mut left) = (d.lba, u64::from(d.blocks));
        while left > 0 {
            let (slba, avail) = match cur.take() {
                Some(c) => c,
                None => loop {
                    let Some((lba, n)) = src.next() else {
                        return out;
                    };
                    if skip >= n {
                        skip -= n;
                        continue;
                    }
                    let c = (lba + skip, n - skip);
                    skip = 0;
                    break c;
                },
            };
            let n = left.min(avail);
            out.push((slba, dlba, n));
            dlba += n;
            left -= n;
            if avail > n {
                cur = Some((slba + n, avail - n));
            }
        }
    }
    out
}
