//! Which chunks of a double-buffered WRITE are complete, being written, or
//! written (sans-IO bookkeeping for `syncwrite`).
//!
//! A WRITE of `len` bytes is cut into chunks of `chunk` bytes aligned to
//! the command (chunk k is bytes `k*chunk .. (k+1)*chunk`, the last one
//! possibly shorter). Data-Out payloads land anywhere (several R2Ts are
//! answered at once, and with DataPDUInOrder=No in any order), so a chunk
//! is complete when the bytes placed in it add up to its length: the
//! collector in `dataout` has already refused any payload that overlaps
//! one placed before, and [`ChunkFill::place`] refuses bytes for a chunk
//! that is no longer filling, so counting is exact. A complete chunk is
//! handed out once by [`ChunkFill::take_complete`] (to be submitted) and
//! ends [`ChunkFill::on_written`].

use std::ops::Range;

/// Where one chunk is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkState {
    /// Waiting for bytes.
    Filling,
    /// Every byte arrived; not submitted yet.
    Complete,
    /// Submitted to the disk.
    Writing,
    /// On the disk.
    Written,
}

/// Bytes that cannot be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FillError {
    /// Outside the command.
    #[error("bytes {start}..{end} outside the {len}-byte command")]
    Outside {
        /// First byte.
        start: u64,
        /// End.
        end: u64,
        /// Command length.
        len: u64,
    },
    /// The chunk already had all its bytes (overlap).
    #[error("bytes {start}..{end} land in chunk {chunk}, which is already complete")]
    Overfilled {
        /// First byte.
        start: u64,
        /// End.
        end: u64,
        /// The chunk.
        chunk: usize,
    },
}

/// The chunks of one WRITE.
#[derive(Debug)]
pub struct ChunkFill {
    len: u64,
    chunk: u64,
    filled: Vec<u64>,
    state: Vec<ChunkState>,
    writing: usize,
    written: usize,
    arrived: u64,
}

impl ChunkFill {
    /// A WRITE of `len` bytes in chunks of `chunk` bytes (at least 1).
    pub fn new(len: u64, chunk: u64) -> ChunkFill {
        let chunk = chunk.max(1);
        let n = len.div_ceil(chunk) as usize;
        ChunkFill {
            len,
            chunk,
            filled: vec![0; n],
            state: vec![ChunkState::Filling; n],
            writing: 0,
            written: 0,
            arrived: 0,
        }
    }

    /// Number of chunks.
    pub fn count(&self) -> usize {
        self.state.len()
    }

    /// Command-relative byte range of chunk `k`.
    pub fn range(&self, k: usize) -> Range<u64> {
        let start = k as u64 * self.chunk;
        start..(start + self.chunk).min(self.len)
    }

    /// Where chunk `k` is.
    pub fn state(&self, k: usize) -> ChunkState {
        self.state[k]
    }

    /// Records `len` bytes placed at command offset `start`. Checks
    /// everything before changing anything: on an error nothing was
    /// recorded, and the bytes must not be copied.
    pub fn place(&mut self, start: u64, len: u64) -> Result<(), FillError> {
        let end = start.saturating_add(len);
        if end > self.len {
            return Err(FillError::Outside {
                start,
                end,
                len: self.len,
            });
        }
        if len == 0 {
            return Ok(());
        }
        let first = (start / self.chunk) as usize;
        let last = ((end - 1) / self.chunk) as usize;
        for k in first..=last {
            let r = self.range(k);
            let here = end.min(r.end) - start.max(r.start);
            if self.state[k] != ChunkState::Filling || self.filled[k] + here > r.end - r.start {
                return Err(FillError::Overfilled {
                    start,
                    end,
                    chunk: k,
                });
            }
        }
        for k in first..=last {
            let r = self.range(k);
            self.filled[k] += end.min(r.end) - start.max(r.start);
            if self.filled[k] == r.end - r.start {
                self.state[k] = ChunkState::Complete;
            }
        }
        self.arrived += len;
        Ok(())
    }

    /// Chunks that became complete and were not handed out yet, ascending;
    /// they are now [`ChunkState::Writing`].
    pub fn take_complete(&mut self) -> Vec<usize> {
        let mut out = Vec::new();
        for (k, s) in self.state.iter_mut().enumerate() {
            if *s == ChunkState::Complete {
                *s = ChunkState::Writing;
                out.push(k);
            }
        }
        self.writing += out.len();
        out
    }

    /// Chunk `k`'s write completed.
    pub fn on_written(&mut self, k: usize) {
        assert_eq!(self.state[k], ChunkState::Writing, "chunk {k} not writing");
        self.state[k] = ChunkState::Written;
        self.writing -= 1;
        self.written += 1;
    }

    /// Chunk writes submitted and not completed.
    pub fn writing(&self) -> usize {
        self.writing
    }

    /// Chunks on the disk.
    pub fn written(&self) -> usize {
        self.written
    }

    /// Whether every byte of the command arrived.
    pub fn all_arrived(&self) -> bool {
        self.arrived == self.len
    }

    /// Whether every chunk is on the disk.
    pub fn all_written(&self) -> bool {
        self.written == self.count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn out_of_order_payloads_complete_chunks_and_the_last_is_partial() {
        // 10000 bytes in 4096-byte chunks: 4096, 4096, 1808.
        let mut f = ChunkFill::new(10000, 4096);
        assert_eq!(f.count(), 3);
        assert_eq!(f.range(2), 8192..10000);
        // The last chunk first (a later R2T answered first).
        f.place(8192, 1808).unwrap();
        assert_eq!(f.take_complete(), vec![2]);
        // A payload spanning chunks 0 and 1, then the rest of each.
        f.place(3000, 2000).unwrap();
        assert!(f.take_complete().is_empty());
        f.place(5000, 3192).unwrap();
        assert_eq!(f.take_complete(), vec![1]);
        assert_eq!(f.state(0), ChunkState::Filling);
        f.place(0, 3000).unwrap();
        assert!(f.all_arrived());
        assert_eq!(f.take_complete(), vec![0]);
        assert_eq!(f.writing(), 3);
        f.on_written(1);
        f.on_written(0);
        assert!(!f.all_written());
        f.on_written(2);
        assert!(f.all_written());
        assert!(f.take_complete().is_empty(), "handed out once");
    }

    #[test]
    fn refuses_outside_and_overfill_without_recording() {
        let mut f = ChunkFill::new(8192, 4096);
        assert!(matches!(f.place(8000, 500), Err(FillError::Outside { .. })));
        assert!(matches!(
            f.place(u64::MAX, 2),
            Err(FillError::Outside { .. })
        ));
        f.place(0, 4096).unwrap();
        // Chunk 0 is complete: bytes for it (even spanning into chunk 1)
        // are refused and chunk 1 stays untouched.
        assert!(matches!(
            f.place(4000, 200),
            Err(FillError::Overfilled { chunk: 0, .. })
        ));
        f.place(4096, 4096).unwrap();
        assert_eq!(f.take_complete(), vec![0, 1]);
        assert!(f.all_arrived());
        // A chunk being written takes no bytes.
        let mut g = ChunkFill::new(4096, 4096);
        g.place(0, 4096).unwrap();
        g.take_complete();
        assert!(g.place(0, 1).is_err());
    }

    proptest! {
        // Any tiling of the command, placed in any order, completes every
        // chunk exactly once, each as soon as its last byte arrived.
        #[test]
        fn any_order_completes_each_chunk_once(len in 1u64..100_000, chunk in 1u64..20_000,
                                               pdu in 1u64..9000, seed in any::<u64>()) {
            let mut pieces: Vec<(u64, u64)> = (0..len.div_ceil(pdu))
                .map(|i| (i * pdu, pdu.min(len - i * pdu))).collect();
            let mut s = seed;
            for i in (1..pieces.len()).rev() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                pieces.swap(i, (s >> 33) as usize % (i + 1));
            }
            let mut f = ChunkFill::new(len, chunk);
            let mut seen = vec![false; f.count()];
            let mut got = vec![0u64; f.count()];
            for (o, n) in pieces {
                f.place(o, n).unwrap();
                for (k, g) in got.iter_mut().enumerate() {
                    let r = f.range(k);
                    *g += (o + n).min(r.end).saturating_sub(o.max(r.start));
                }
                for k in f.take_complete() {
                    prop_assert!(!seen[k]);
                    let r = f.range(k);
                    prop_assert_eq!(got[k], r.end - r.start);
                    seen[k] = true;
                }
                for (k, (&s, &g)) in seen.iter().zip(&got).enumerate() {
                    let r = f.range(k);
                    prop_assert_eq!(s, g == r.end - r.start);
                }
            }
            prop_assert!(seen.iter().all(|&x| x));
            prop_assert!(f.all_arrived());
        }
    }
}
