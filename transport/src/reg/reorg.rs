//! Buffer re-organization (RDMA-assisted iSCSI paper §4.3): an RDMA operation may gather/scatter many local
//! SGEs but targets one contiguous remote buffer, so a caller's scatter-gather list of
//! remote buffers is merged into the fewest contiguous chunks, one operation per chunk.

use crate::rdma::{RemoteBuf, Sge};

/// A contiguous remote range and where it sits in the logical transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub remote: RemoteBuf,
    /// Offset of this chunk's first byte in the transfer.
    pub offset: u64,
}

/// Merge `list` (in transfer order) into the fewest chunks: neighbours merge when they
/// are adjacent in memory under the same rkey; a chunk never exceeds `max_chunk` bytes
/// (longer runs are split). Empty entries are dropped.
pub fn coalesce(list: &[RemoteBuf], max_chunk: u64) -> Vec<Chunk> {
    let max_chunk = max_chunk.max(1);
    // Maximal runs first.
    let mut runs: Vec<Chunk> = Vec::new();
    let mut offset = 0u64;
    for b in list.iter().filter(|b| b.len > 0) {
        match runs.last_mut() {
            Some(c)
                if c.remote.rkey == b.rkey
                    && c.remote.addr.checked_add(c.remote.len) == Some(b.addr) =>
            {
                c.remote.len += b.len;
            }
            _ => runs.push(Chunk { remote: *b, offset }),
        }
        offset += b.len;
    }
    // Then split runs longer than max_chunk: ceil(len / max) pieces each, which is minimal.
    let mut out = Vec::with_capacity(runs.len());
    for r in runs {
        let mut done = 0;
        while done < r.remote.len {
            let n = (r.remote.len - done).min(max_chunk);
            out.push(Chunk {
                remote: RemoteBuf {
                    addr: r.remote.addr + done,
                    len: n,
                    rkey: r.remote.rkey,
                },
                offset: r.offset + done,
            });
            done += n;
        }
    }
    out
}

/// One RDMA operation of a plan: local SGL ↔ one contiguous remote range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RdmaOp {
    pub local: Vec<Sge>,
    pub remote_addr: u64,
    pub rkey: u32,
    pub len: u64,
}

/// Pair a local SGL (e.g. the target's pool buffers, in transfer order) with remote
/// chunks: one operation per chunk, or more when a chunk needs more than `max_sge` local
/// entries. Returns `None` if the totals differ.
pub fn plan_ops(local: &[Sge], chunks: &[Chunk], max_sge: usize) -> Option<Vec<RdmaOp>> {
    let max_sge = max_sge.max(1);
    let local_total: u64 = local.iter().map(|s| s.length as u64).sum();
    let remote_total: u64 = chunks.iter().map(|c| c.remote.len).sum();
    if local_total != remote_total {
        return None;
    }
    let mut ops = Vec::with_capacity(chunks.len());
    let mut li = 0usize; // current local SGE
    let mut lo = 0u64; // offset inside it
    for c in chunks {
        let mut done = 0u64;
        while done < c.remote.len {
            let mut op = RdmaOp {
                local: Vec::new(),
                remote_addr: c.remote.addr + done,
                rkey: c.remote.rkey,
                len: 0,
            };
            while done < c.remote.len && op.local.len() < max_sge {
                let s = &local[li];
                let avail = s.length as u64 - lo;
                let n = avail.min(c.remote.len - done);
                op.local.push(Sge {
                    addr: s.addr + lo,
                    length: n as u32,
                    lkey: s.lkey,
                });
                op.len += n;
                done += n;
                lo += n;
                if lo == s.length as u64 {
                    li += 1;
                    lo = 0;
                }
            }
            ops.push(op);
        }
    }
    Some(ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rb(addr: u64, len: u64, rkey: u32) -> RemoteBuf {
        RemoteBuf { addr, len, rkey }
    }

    #[test]
    fn p3_fig9_four_buffers_one_op() {
        let l = [
            rb(0x1000, 0x1000, 7),
            rb(0x2000, 0x1000, 7),
            rb(0x3000, 0x800, 7),
            rb(0x3800, 0x800, 7),
        ];
        let c = coalesce(&l, u64::MAX);
        assert_eq!(
            c,
            vec![Chunk {
                remote: rb(0x1000, 0x3000, 7),
                offset: 0
            }]
        );
        // different key or a gap breaks the chunk
        let l2 = [
            rb(0x1000, 0x1000, 7),
            rb(0x2000, 0x1000, 8),
            rb(0x4000, 16, 8),
        ];
        assert_eq!(coalesce(&l2, u64::MAX).len(), 3);
        // splitting at max_chunk
        let c = coalesce(&l, 0x1400);
        assert_eq!(c.len(), 3);
        assert_eq!(c[2].offset, 0x2800);
    }

    #[test]
    fn plan_splits_local_sgl() {
        let chunks = coalesce(&[rb(0x10_000, 100, 1), rb(0x20_000, 50, 1)], u64::MAX);
        let local = [
            Sge {
                addr: 0,
                length: 60,
                lkey: 9,
            },
            Sge {
                addr: 1000,
                length: 90,
                lkey: 9,
            },
        ];
        let ops = plan_ops(&local, &chunks, 16).unwrap();
        assert_eq!(ops.len(), 2);
        assert_eq!(
            ops[0].local,
            vec![
                Sge {
                    addr: 0,
                    length: 60,
                    lkey: 9
                },
                Sge {
                    addr: 1000,
                    length: 40,
                    lkey: 9
                }
            ]
        );
        assert_eq!(
            ops[1].local,
            vec![Sge {
                addr: 1040,
                length: 50,
                lkey: 9
            }]
        );
        assert!(plan_ops(&local[..1], &chunks, 16).is_none());
        // max_sge 1 forces one op per local piece
        assert_eq!(plan_ops(&local, &chunks, 1).unwrap().len(), 3);
    }

    fn sg_list() -> impl Strategy<Value = Vec<RemoteBuf>> {
        // Buffers drawn from a few pages, often adjacent, under two keys.
        proptest::collection::vec((0u64..64, 0u64..3, 1u32..3), 0..24).prop_map(|v| {
            let mut out: Vec<RemoteBuf> = Vec::new();
            let mut next = 0x10_000u64;
            for (jump, lenp, key) in v {
                let addr = if jump < 40 {
                    next
                } else {
                    0x10_000 + jump * 0x1000
                };
                let len = [0, 512, 4096][lenp as usize];
                out.push(RemoteBuf {
                    addr,
                    len,
                    rkey: key,
                });
                next = addr + len;
            }
            out
        })
    }

    fn bytes_of(list: &[RemoteBuf]) -> Vec<(u64, u32)> {
        list.iter()
            .flat_map(|b| (0..b.len).map(move |i| (b.addr + i, b.rkey)))
            .collect()
    }

    proptest! {
        /// The chunks cover exactly the input ranges, in order; every chunk respects the
        /// limit; no two neighbouring chunks could have been merged (minimality).
        #[test]
        fn coalesce_covers_exactly(list in sg_list(), max in 1u64..20_000) {
            let chunks = coalesce(&list, max);
            let got: Vec<RemoteBuf> = chunks.iter().map(|c| c.remote).collect();
            prop_assert_eq!(bytes_of(&got), bytes_of(&list));
            let mut off = 0;
            for (i, c) in chunks.iter().enumerate() {
                prop_assert_eq!(c.offset, off);
                prop_assert!(c.remote.len > 0 && c.remote.len <= max);
                off += c.remote.len;
                if i > 0 {
                    let p = &chunks[i - 1];
                    let mergeable = p.remote.rkey == c.remote.rkey
                        && p.remote.addr + p.remote.len == c.remote.addr;
                    // only split because of the limit, and then the previous one is full
                    prop_assert!(!mergeable || p.remote.len == max);
                }
            }
        }

        #[test]
        fn plan_preserves_bytes(list in sg_list(), max in 1u64..20_000, split in 1u32..5000, max_sge in 1usize..4) {
            let chunks = coalesce(&list, max);
            let total: u64 = chunks.iter().map(|c| c.remote.len).sum();
            // local SGL: the same total cut into pieces of `split`
            let mut local = Vec::new();
            let mut left = total;
            let mut a = 0u64;
            while left > 0 {
                let n = left.min(split as u64);
                local.push(Sge { addr: a, length: n as u32, lkey: 1 });
                a += n + 100;
                left -= n;
            }
            let ops = plan_ops(&local, &chunks, max_sge).unwrap();
            let mut lbytes = Vec::new();
            let mut rbytes = Vec::new();
            for op in &ops {
                prop_assert!(op.local.len() <= max_sge);
                prop_assert_eq!(op.local.iter().map(|s| s.length as u64).sum::<u64>(), op.len);
                lbytes.extend(op.local.iter().flat_map(|s| (0..s.length as u64).map(move |i| s.addr + i)));
                rbytes.extend((0..op.len).map(|i| (op.remote_addr + i, op.rkey)));
            }
            let want_l: Vec<u64> = local.iter().flat_map(|s| (0..s.length as u64).map(move |i| s.addr + i)).collect();
            prop_assert_eq!(lbytes, want_l);
            prop_assert_eq!(rbytes, bytes_of(&list));
            if max_sge >= local.len() {
                prop_assert_eq!(ops.len(), chunks.len());
            }
        }
    }
}
