//! Sans-IO bookkeeping of a synchronized send: which chunks of a READ's
//! buffer are valid, and which send units (Data-In PDUs, RDMA Writes) may
//! leave now.
//!
//! A READ of `len` bytes is cut into chunks of `chunk` bytes (the unit of
//! disk completion, the synchronized-sends paper's `c`). Sends go out in *units*, which may differ from
//! chunks (a Data-In PDU may span two chunks). [`Sequencer::on_valid`] takes
//! one chunk completion and returns the units that became sendable:
//! in offset order for [`SendOrder::InOrder`] (TCP, DataPDUInOrder=Yes), or
//! every unit whose bytes are all valid for [`SendOrder::AnyOrder`] (TCP with
//! DataPDUInOrder=No and BufferOffset, RDMA Writes at their offsets).

use std::ops::Range;

/// How a sink accepts data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOrder {
    /// Units leave in offset order (single-stream).
    InOrder,
    /// Units leave as soon as valid, in any order (multi-stream).
    AnyOrder,
}

/// The chunks of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkPlan {
    /// Request length in bytes.
    pub len: u64,
    /// Chunk size in bytes (the last chunk may be shorter).
    pub chunk: u64,
}

impl ChunkPlan {
    /// `len` bytes in chunks of `chunk` (at least 1).
    pub fn new(len: u64, chunk: u64) -> ChunkPlan {
        ChunkPlan {
            len,
            chunk: chunk.max(1),
        }
    }
    /// Number of chunks.
    pub fn count(&self) -> usize {
        self.len.div_ceil(self.chunk) as usize
    }
    /// Byte range of chunk `i`.
    pub fn range(&self, i: usize) -> Range<u64> {
        let start = i as u64 * self.chunk;
        start..(start + self.chunk).min(self.len)
    }
    /// Every chunk's byte range.
    pub fn ranges(&self) -> impl Iterator<Item = Range<u64>> + '_ {
        (0..self.count()).map(|i| self.range(i))
    }
    /// The chunks that `bytes` touches.
    pub fn chunks_of(&self, bytes: &Range<u64>) -> Range<usize> {
        if bytes.start >= bytes.end {
            return 0..0;
        }
        (bytes.start / self.chunk) as usize..bytes.end.div_ceil(self.chunk) as usize
    }
}

/// Tracks valid chunks and releases send units (the per-chunk dirty bitmap
/// proposed in the synchronized-sends paper).
#[derive(Debug, Clone)]
pub struct Sequencer {
    plan: ChunkPlan,
    order: SendOrder,
    units: Vec<Range<u64>>,
    /// Per unit: chunks still missing.
    missing: Vec<u32>,
    /// Per chunk: first and one-past-last unit touching it.
    unit_span: Vec<Range<usize>>,
    valid: Vec<bool>,
    released: Vec<bool>,
    next_in_order: usize,
    released_count: usize,
    valid_bytes: u64,
}

impl Sequencer {
    /// Units equal to the chunks.
    pub fn per_chunk(plan: ChunkPlan, order: SendOrder) -> Sequencer {
        let units = plan.ranges().collect();
        Sequencer::new(plan, units, order)
    }

    /// Units are `units`: contiguous, ascending, covering `0..plan.len`
    /// exactly (e.g. `iscsi::datain::segments`). Panics otherwise.
    pub fn new(plan: ChunkPlan, units: Vec<Range<u64>>, order: SendOrder) -> Sequencer {
        let mut at = 0;
        for u in &units {
            assert!(
                u.start == at && u.end > u.start,
                "units must tile the request"
            );
            at = u.end;
        }
        assert_eq!(at, plan.len, "units must cover the request");
        let mut unit_span: Vec<Option<Range<usize>>> = vec![None; plan.count()];
        let missing = units
            .iter()
            .enumerate()
            .map(|(ui, u)| {
                let cs = plan.chunks_of(u);
                for c in cs.clone() {
                    let s = unit_span[c].get_or_insert(ui..ui + 1);
                    s.start = s.start.min(ui);
                    s.end = s.end.max(ui + 1);
                }
                cs.len() as u32
            })
            .collect();
        Sequencer {
            plan,
            order,
            missing,
            unit_span: unit_span.into_iter().map(|s| s.unwrap_or(0..0)).collect(),
            valid: vec![false; plan.count()],
            released: vec![false; units.len()],
            units,
            next_in_order: 0,
            released_count: 0,
            valid_bytes: 0,
        }
    }

    /// The plan.
    pub fn plan(&self) -> ChunkPlan {
        self.plan
    }
    /// Byte range of unit `i`.
    pub fn unit(&self, i: usize) -> Range<u64> {
        self.units[i].clone()
    }
    /// Number of units.
    pub fn unit_count(&self) -> usize {
        self.units.len()
    }
    /// Bytes known valid so far.
    pub fn valid_bytes(&self) -> u64 {
        self.valid_bytes
    }
    /// Whether every chunk is valid.
    pub fn all_valid(&self) -> bool {
        self.valid_bytes == self.plan.len
    }
    /// Whether every unit has been released.
    pub fn all_released(&self) -> bool {
        self.released_count == self.units.len()
    }

    /// Chunk `chunk` became valid: the units that may be sent now (indices
    /// into the unit list). A chunk reported twice releases nothing.
    pub fn on_valid(&mut self, chunk: usize) -> Vec<usize> {
        if self.valid[chunk] {
            return Vec::new();
        }
        self.valid[chunk] = true;
        let r = self.plan.range(chunk);
        self.valid_bytes += r.end - r.start;
        let span = self.unit_span[chunk].clone();
        for u in span.clone() {
            self.missing[u] -= 1;
        }
        let mut out = Vec::new();
        match self.order {
            SendOrder::InOrder => {
                while self.next_in_order < self.units.len() && self.missing[self.next_in_order] == 0
                {
                    out.push(self.next_in_order);
                    self.next_in_order += 1;
                }
            }
            SendOrder::AnyOrder => {
                for u in span {
                    if self.missing[u] == 0 && !self.released[u] {
                        out.push(u);
                    }
                }
            }
        }
        for &u in &out {
            self.released[u] = true;
        }
        self.released_count += out.len();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn in_order_waits_for_the_prefix() {
        let plan = ChunkPlan::new(10, 4);
        let mut s = Sequencer::per_chunk(plan, SendOrder::InOrder);
        assert_eq!(plan.count(), 3);
        assert!(s.on_valid(2).is_empty());
        assert!(s.on_valid(1).is_empty());
        assert_eq!(s.on_valid(0), vec![0, 1, 2]);
        assert!(s.all_released() && s.all_valid());
    }

    #[test]
    fn units_spanning_chunks() {
        // Units of 6 over chunks of 4: unit 0 needs chunks 0,1.
        let plan = ChunkPlan::new(12, 4);
        let mut s = Sequencer::new(plan, vec![0..6, 6..12], SendOrder::AnyOrder);
        assert!(s.on_valid(1).is_empty());
        assert_eq!(s.on_valid(2), vec![1]);
        assert_eq!(s.on_valid(0), vec![0]);
    }

    fn perm(n: usize, seed: Vec<usize>) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        for (i, k) in seed.into_iter().enumerate().take(n) {
            let j = i + k % (n - i);
            v.swap(i, j);
        }
        v
    }

    proptest! {
        #[test]
        fn every_byte_exactly_once_in_any_completion_order(
            len in 1u64..200_000,
            chunk in 1u64..40_000,
            unit in 1u64..50_000,
            any in any::<bool>(),
            seed in proptest::collection::vec(0usize..1_000_000, 0..256),
        ) {
            let plan = ChunkPlan::new(len, chunk);
            let units: Vec<Range<u64>> = (0..len.div_ceil(unit)).map(|i| i*unit..((i+1)*unit).min(len)).collect();
            let order = if any { SendOrder::AnyOrder } else { SendOrder::InOrder };
            let mut s = Sequencer::new(plan, units, order);
            let mut seen = vec![0u8; len as usize];
            let mut valid = vec![false; plan.count()];
            let mut last_end = 0;
            let mut seed = seed;
            seed.resize(plan.count(), 7);
            for c in perm(plan.count(), seed) {
                valid[c] = true;
                for u in s.on_valid(c) {
                    let r = s.unit(u);
                    // Released units are fully valid.
                    for k in plan.chunks_of(&r) { prop_assert!(valid[k]); }
                    if order == SendOrder::InOrder { prop_assert_eq!(r.start, last_end); last_end = r.end; }
                    for b in r { seen[b as usize] += 1; }
                }
            }
            prop_assert!(s.all_released());
            prop_assert!(seen.iter().all(|&n| n == 1));
        }
    }
}
