//! Which byte ranges of one command's data have arrived, to refuse
//! overlaps: a target placing Data-Out, an initiator placing Data-In.
//!
//! With DataPDUInOrder=No (RFC 7143 §13.19) a data PDU may land anywhere
//! in its sequence, so the sender chooses how the filled ranges fragment:
//! one-byte PDUs at every other offset leave one range per PDU. The ranges
//! are kept in a map, so each PDU costs a logarithm of their number rather
//! than a shift of all of them; the filled total is counted as they come;
//! and data lying in more than [`MAX_PIECES`] separate ranges is refused.

use std::collections::BTreeMap;

/// The most separate filled ranges one command's data may lie in at once:
/// far more than a peer sending whole PDUs in any order makes (its bursts
/// over MaxRecvDataSegmentLength), far fewer than a hostile one's
/// byte-sized pieces of a 32 MiB transfer would.
pub const MAX_PIECES: usize = 1 << 16;

/// Why a piece of data was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Some of its bytes had already arrived.
    Overlap,
    /// It would leave the data in more than [`MAX_PIECES`] separate ranges.
    TooManyPieces,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Overlap => f.write_str("overlaps data already received"),
            Refused::TooManyPieces => write!(
                f,
                "would leave the data in more than {MAX_PIECES} separate pieces"
            ),
        }
    }
}

/// The filled byte ranges of one command's data.
#[derive(Debug, Default, Clone)]
pub struct Coverage {
    /// Start to end of each filled range: non-overlapping, non-adjacent.
    ranges: BTreeMap<u64, u64>,
    /// Bytes filled.
    filled: u64,
}

impl Coverage {
    /// Marks `start..start + len` filled, merged with the ranges it
    /// touches; refused (and nothing marked) if it overlaps a filled range
    /// or would make one range too many. An empty piece fills nothing.
    pub fn insert(&mut self, start: u64, len: u64) -> Result<(), Refused> {
        if len == 0 {
            return Ok(());
        }
        let end = start.saturating_add(len);
        let before = self
            .ranges
            .range(..=start)
            .next_back()
            .map(|(&s, &e)| (s, e));
        if before.is_some_and(|(_, e)| e > start) {
            return Err(Refused::Overlap);
        }
        let after = self.ranges.range(start..).next().map(|(&s, &e)| (s, e));
        if after.is_some_and(|(s, _)| s < end) {
            return Err(Refused::Overlap);
        }
        let joins_before = before.filter(|&(_, e)| e == start);
        let joins_after = after.filter(|&(s, _)| s == end);
        if joins_before.is_none() && joins_after.is_none() && self.ranges.len() >= MAX_PIECES {
            return Err(Refused::TooManyPieces);
        }
        let new_start = joins_before.map_or(start, |(s, _)| s);
        let new_end = joins_after.map_or(end, |(_, e)| e);
        if let Some((s, _)) = joins_after {
            self.ranges.remove(&s);
        }
        self.ranges.insert(new_start, new_end);
        self.filled += end - start;
        Ok(())
    }

    /// Bytes filled.
    pub fn filled(&self) -> u64 {
        self.filled
    }

    /// End of the filled prefix (0 while byte 0 has not arrived).
    pub fn contiguous_end(&self) -> u64 {
        match self.ranges.first_key_value() {
            Some((0, &end)) => end,
            _ => 0,
        }
    }

    /// How many separate filled ranges there are.
    pub fn pieces(&self) -> usize {
        self.ranges.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn pieces_merge_and_overlaps_are_refused() {
        let mut c = Coverage::default();
        assert_eq!(c.insert(10, 10), Ok(()));
        assert_eq!(c.insert(30, 10), Ok(()));
        assert_eq!(c.contiguous_end(), 0);
        assert_eq!(c.insert(15, 1), Err(Refused::Overlap));
        assert_eq!(c.insert(5, 6), Err(Refused::Overlap));
        assert_eq!(c.insert(19, 12), Err(Refused::Overlap));
        assert_eq!(c.insert(20, 10), Ok(()));
        assert_eq!(c.pieces(), 1);
        assert_eq!(c.insert(0, 10), Ok(()));
        assert_eq!(c.contiguous_end(), 40);
        assert_eq!(c.filled(), 40);
        assert_eq!(c.insert(0, 0), Ok(()), "empty pieces fill nothing");
    }

    /// One-byte pieces at every other offset, from the end down (the
    /// pattern that fragments most): past [`MAX_PIECES`] separate ranges
    /// the next piece is refused; one that joins a range still goes in.
    #[test]
    fn data_in_too_many_pieces_is_refused() {
        let mut c = Coverage::default();
        let top = 2 * MAX_PIECES as u64;
        for k in 0..MAX_PIECES as u64 {
            assert_eq!(c.insert(top - 2 * k, 1), Ok(()), "piece {k}");
        }
        assert_eq!(c.pieces(), MAX_PIECES);
        assert_eq!(c.insert(0, 1), Err(Refused::TooManyPieces));
        assert_eq!(c.insert(top - 1, 1), Ok(()), "a piece joining two ranges");
        assert_eq!(c.filled(), MAX_PIECES as u64 + 1);
    }

    proptest! {
        /// Against a byte map: a piece goes in exactly when none of its
        /// bytes is filled; the total counts the filled bytes, the prefix
        /// the filled bytes from 0, and no two ranges touch.
        #[test]
        fn coverage_follows_a_byte_map(pieces in prop::collection::vec((0u64..256, 0u64..24), 0..64)) {
            let mut c = Coverage::default();
            let mut filled = [false; 280];
            for (start, len) in pieces {
                let free = (start..start + len).all(|b| !filled[b as usize]);
                prop_assert_eq!(c.insert(start, len).is_ok(), free, "{} +{}", start, len);
                if free {
                    for b in start..start + len {
                        filled[b as usize] = true;
                    }
                }
                prop_assert_eq!(c.filled() as usize, filled.iter().filter(|&&f| f).count());
                prop_assert_eq!(c.contiguous_end() as usize, filled.iter().take_while(|&&f| f).count());
                let mut prev_end = None;
                for (&s, &e) in &c.ranges {
                    prop_assert!(s < e);
                    prop_assert!(prev_end.is_none_or(|p| p < s), "ranges touch or overlap");
                    prev_end = Some(e);
                }
            }
        }
    }
}
