//! What a command reads from or writes to: one file, a striped set of
//! files, or nothing (the bogus no-disk mode, pattern data).

use std::fs::File;
use std::ops::Range;
use std::sync::Arc;

use super::buffer::BufLease;
use super::engine::{IoOp, OpKind};
use super::stripe::StripeLayout;

/// The block store behind a command.
#[derive(Debug, Clone)]
pub enum Source {
    /// One file (O_DIRECT or not): a single stream.
    File(Arc<File>),
    /// RAID0 over several files: one stream per member.
    Striped {
        /// Member files, in layout order.
        files: Vec<Arc<File>>,
        /// The layout.
        layout: StripeLayout,
    },
    /// No disk: reads return [`pattern_fill`] data at once, writes are
    /// dropped (the synchronized-sends paper's `gmblock-bogus`).
    Pattern,
}

/// The no-disk pattern: a cheap function of the device offset.
pub fn pattern_byte(dev_offset: u64) -> u8 {
    (dev_offset as u8) ^ ((dev_offset >> 9) as u8) ^ 0x5a
}

/// Fills `buf` with the pattern of device bytes from `dev_offset`.
///
/// Within one 512-byte block the high term of [`pattern_byte`] is constant,
/// so each block is a byte counter XOR one key: a loop the compiler
/// vectorizes (this runs for every byte `--no-disk` serves).
pub fn pattern_fill(dev_offset: u64, buf: &mut [u8]) {
    let mut at = dev_offset;
    let mut rest = buf;
    while !rest.is_empty() {
        let in_block = (512 - (at % 512)) as usize;
        let (block, tail) = rest.split_at_mut(in_block.min(rest.len()));
        let key = ((at >> 9) as u8) ^ 0x5a;
        let low = at as u8;
        for (i, b) in block.iter_mut().enumerate() {
            *b = low.wrapping_add(i as u8) ^ key;
        }
        at += block.len() as u64;
        rest = tail;
    }
}

impl Source {
    /// Number of independent streams.
    pub fn streams(&self) -> usize {
        match self {
            Source::File(_) => 1,
            Source::Striped { files, .. } => files.len(),
            Source::Pattern => 0,
        }
    }

    /// The ops that move device range `dev` to or from `buf` at
    /// `buf_offset` (one per stripe extent), all tagged `tag`. Empty for
    /// [`Source::Pattern`].
    pub fn ops(
        &self,
        kind: OpKind,
        dev: Range<u64>,
        buf: &Arc<BufLease>,
        buf_offset: usize,
        tag: u64,
    ) -> Vec<IoOp> {
        match self {
            Source::Pattern => Vec::new(),
            Source::File(f) => vec![IoOp {
                kind,
                file: f.clone(),
                file_offset: dev.start,
                buf: buf.clone(),
                buf_offset,
                len: (dev.end - dev.start) as usize,
                stream: 0,
                tag,
            }],
            Source::Striped { files, layout } => layout
                .map(dev)
                .map(|e| IoOp {
                    kind,
                    file: files[e.member as usize].clone(),
                    file_offset: e.member_offset,
                    buf: buf.clone(),
                    buf_offset: buf_offset + e.rel_offset as usize,
                    len: e.len as usize,
                    stream: e.member as u16,
                    tag,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod pattern_tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn pattern_fill_matches_pattern_byte(at in 0u64..(1u64 << 40), len in 0usize..3000) {
            let mut buf = vec![0u8; len];
            pattern_fill(at, &mut buf);
            for (i, b) in buf.iter().enumerate() {
                prop_assert_eq!(*b, pattern_byte(at + i as u64));
            }
        }
    }
}
