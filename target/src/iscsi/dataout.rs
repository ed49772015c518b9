//! Collecting a WRITE's data (RFC 7143 §4.2.5, §11.7), as a state machine.
//!
//! Data arrives as immediate data in the command PDU, as unsolicited
//! Data-Out PDUs up to FirstBurstLength (when InitialR2T=No), and as
//! Data-Out PDUs answering the target's R2Ts, each R2T asking for at most
//! MaxBurstLength bytes with at most MaxOutstandingR2T of them open. Every
//! Data-Out is checked (Target Transfer Tag, DataSN, BufferOffset, length)
//! before its bytes are placed; any violation is a protocol error, which
//! at ErrorRecoveryLevel 0 ends the connection.
//!
//! A collector either gathers the bytes itself ([`WriteCollector::new`]) or
//! only checks the sequence rules ([`WriteCollector::validating`]) while
//! the caller places the bytes elsewhere: the double-buffered WRITE path
//! (`syncwrite`) copies them into a registered I/O buffer and writes each
//! chunk as soon as it is complete. The checks are the same either way, so
//! every placed range is inside the command and overlaps nothing placed
//! before.

use blockwire_pdu::coverage::Coverage;

/// Bytes of a WRITE gathered so far, and what still has to be asked for.
#[derive(Debug)]
pub struct WriteCollector {
    /// The gathered bytes so far: the buffer grows as data arrives and
    /// takes its whole length when R2Ts first ask for data, so a WRITE
    /// whose R2Ts are held back holds only its unsolicited bytes. Empty
    /// when only validating.
    buf: Vec<u8>,
    /// Whether the bytes are kept (else only checked).
    gather: bool,
    /// Expected Data Transfer Length.
    expected: u32,
    limits: WriteLimits,
    covered: Coverage,
    unsolicited: Option<Sequence>,
    /// First offset not yet asked for by an R2T.
    next_r2t_offset: u32,
    next_r2t_sn: u32,
    open: Vec<Sequence>,
}

/// The negotiated parameters that shape a WRITE's data transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteLimits {
    /// FirstBurstLength.
    pub first_burst_length: u32,
    /// MaxBurstLength.
    pub max_burst_length: u32,
    /// InitialR2T.
    pub initial_r2t: bool,
    /// ImmediateData.
    pub immediate_data: bool,
    /// MaxOutstandingR2T.
    pub max_outstanding_r2t: u32,
    /// DataPDUInOrder.
    pub data_pdu_in_order: bool,
}

/// An R2T the target must send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct R2tRequest {
    /// Target Transfer Tag the Data-Out PDUs will carry.
    pub ttt: u32,
    /// R2TSN.
    pub r2t_sn: u32,
    /// BufferOffset.
    pub offset: u32,
    /// Desired Data Transfer Length.
    pub length: u32,
}

/// One Data-Out sequence: the unsolicited burst, or the answer to one R2T.
#[derive(Debug, Clone)]
struct Sequence {
    ttt: u32,
    start: u32,
    end: u32,
    next_data_sn: u32,
    /// Next offset expected when DataPDUInOrder=Yes.
    next_offset: u32,
    received: u32,
}

/// Why a Data-Out (or the command's immediate data) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DataOutError {
    /// Immediate data was sent although ImmediateData=No.
    #[error("immediate data sent although ImmediateData=No was negotiated")]
    ImmediateDataNotAllowed,
    /// More immediate or unsolicited data than FirstBurstLength or the
    /// Expected Data Transfer Length allows.
    #[error("unsolicited data of {got} bytes exceeds the {limit}-byte limit")]
    TooMuchUnsolicited {
        /// Bytes sent.
        got: u32,
        /// The limit.
        limit: u32,
    },
    /// Unsolicited Data-Out although InitialR2T=Yes or the command had F set.
    #[error("unsolicited Data-Out not expected for this command")]
    UnexpectedUnsolicited,
    /// The Target Transfer Tag matches no open R2T.
    #[error("Data-Out with unknown Target Transfer Tag {0:#x}")]
    UnknownTtt(u32),
    /// DataSN out of sequence.
    #[error("Data-Out DataSN {got}, expected {expected}")]
    DataSn {
        /// DataSN received.
        got: u32,
        /// DataSN expected.
        expected: u32,
    },
    /// BufferOffset and length fall outside the sequence, overlap data
    /// already received, or break DataPDUInOrder.
    #[error("Data-Out for bytes {offset}..{end} outside or out of order in its sequence")]
    BadOffset {
        /// BufferOffset.
        offset: u32,
        /// BufferOffset + length.
        end: u32,
    },
    /// The F bit came before the sequence was complete, or not at its end.
    #[error("Data-Out F bit does not match the end of its sequence")]
    FinalBit,
}

impl WriteCollector {
    /// Starts collecting `expected_len` bytes. `immediate` is the command
    /// PDU's data segment; `final_bit` is its F bit (no unsolicited Data-Out
    /// follows). The caller bounds `expected_len` before calling.
    pub fn new(
        expected_len: u32,
        immediate: &[u8],
        final_bit: bool,
        limits: WriteLimits,
    ) -> Result<WriteCollector, DataOutError> {
        Self::start(expected_len, immediate, final_bit, limits, true)
    }

    /// Like [`WriteCollector::new`], but keeps no bytes: it checks every
    /// Data-Out and the caller places the payload (the immediate data at
    /// offset 0, each accepted Data-Out at its BufferOffset).
    /// [`WriteCollector::into_data`] is then empty.
    pub fn validating(
        expected_len: u32,
        immediate: &[u8],
        final_bit: bool,
        limits: WriteLimits,
    ) -> Result<WriteCollector, DataOutError> {
        Self::start(expected_len, immediate, final_bit, limits, false)
    }

    fn start(
        expected_len: u32,
        immediate: &[u8],
        final_bit: bool,
        limits: WriteLimits,
        gather: bool,
    ) -> Result<WriteCollector, DataOutError> {
        let imm = immediate.len() as u32;
        if imm > 0 && !limits.immediate_data {
            return Err(DataOutError::ImmediateDataNotAllowed);
        }
        let unsolicited_limit = limits.first_burst_length.min(expected_len);
        if imm > unsolicited_limit {
            return Err(DataOutError::TooMuchUnsolicited {
                got: imm,
                limit: unsolicited_limit,
            });
        }
        // The immediate data is copied in, not written over zeroes: with all
        // of a small WRITE's data in its command PDU, nothing is zeroed. A
        // large WRITE's buffer is one kept from an earlier command, its pages
        // already faulted in (crate::payload_buffers); the caller has refused
        // an Expected Data Transfer Length beyond the target's buffers.
        let buf = if gather {
            let mut buf = crate::payload_buffers::take(expected_len as usize);
            buf.extend_from_slice(immediate);
            buf
        } else {
            Vec::new()
        };
        let mut c = WriteCollector {
            buf,
            gather,
            expected: expected_len,
            limits,
            covered: Coverage::default(),
            unsolicited: None,
            next_r2t_offset: imm,
            next_r2t_sn: 0,
            open: Vec::new(),
        };
        c.covered
            .insert(0, u64::from(imm))
            .expect("nothing has arrived yet for the immediate data to overlap");
        if Self::unsolicited_follow(imm, expected_len, final_bit, limits) {
            c.unsolicited = Some(Sequence {
                ttt: blockwire_pdu::pdu::RESERVED_TAG,
                start: 0,
                end: unsolicited_limit,
                next_data_sn: 0,
                next_offset: imm,
                received: imm,
            });
            c.next_r2t_offset = unsolicited_limit;
        }
        Ok(c)
    }

    /// Whether unsolicited Data-Out PDUs follow a command that brought
    /// `immediate` bytes of `expected_len` (RFC 7143 §11.7: InitialR2T=No,
    /// the F bit clear, the first burst not yet full).
    fn unsolicited_follow(
        immediate: u32,
        expected_len: u32,
        final_bit: bool,
        limits: WriteLimits,
    ) -> bool {
        !final_bit && !limits.initial_r2t && immediate < limits.first_burst_length.min(expected_len)
    }

    /// Whether the target must ask with R2Ts for some of the data of a
    /// WRITE of `expected_len` bytes whose command brought `immediate`: the
    /// data is neither all immediate nor all within the unsolicited first
    /// burst. Known before any collector is made.
    pub fn would_solicit(
        immediate: u32,
        expected_len: u32,
        final_bit: bool,
        limits: WriteLimits,
    ) -> bool {
        let asked_from = if Self::unsolicited_follow(immediate, expected_len, final_bit, limits) {
            limits.first_burst_length.min(expected_len)
        } else {
            immediate
        };
        asked_from < expected_len
    }

    /// Whether the target still has data to ask for with R2Ts.
    fn solicits(&self) -> bool {
        self.next_r2t_offset < self.expected
    }

    /// Bytes expected in all.
    pub fn expected_len(&self) -> u32 {
        self.expected
    }

    /// Whether every byte has arrived.
    pub fn is_complete(&self) -> bool {
        self.covered.filled() == u64::from(self.expected_len())
    }

    /// The gathered data (empty when only validating).
    pub fn into_data(mut self) -> Vec<u8> {
        if self.gather {
            self.buf.resize(self.expected as usize, 0);
        }
        self.buf
    }

    /// R2Ts to send now, up to MaxOutstandingR2T open at once. `new_ttt`
    /// hands out Target Transfer Tags.
    pub fn next_r2ts(&mut self, mut new_ttt: impl FnMut() -> u32) -> Vec<R2tRequest> {
        let mut out = Vec::new();
        if self.gather && self.solicits() {
            // The data is asked for now: room for all of it at once.
            self.buf
                .reserve_exact(self.expected as usize - self.buf.len());
        }
        while self.next_r2t_offset < self.expected_len()
            && (self.open.len() as u32) < self.limits.max_outstanding_r2t.max(1)
        {
            let offset = self.next_r2t_offset;
            let length = (self.expected_len() - offset).min(self.limits.max_burst_length.max(512));
            let req = R2tRequest {
                ttt: new_ttt(),
                r2t_sn: self.next_r2t_sn,
                offset,
                length,
            };
            self.open.push(Sequence {
                ttt: req.ttt,
                start: offset,
                end: offset + length,
                next_data_sn: 0,
                next_offset: offset,
                received: 0,
            });
            self.next_r2t_sn += 1;
            self.next_r2t_offset += length;
            out.push(req);
        }
        out
    }

    /// R2TSN of the next R2T (the number sent so far), for ExpDataSN.
    pub fn r2t_count(&self) -> u32 {
        self.next_r2t_sn
    }

    /// Places one Data-Out PDU's payload.
    pub fn on_data_out(
        &mut self,
        ttt: u32,
        data_sn: u32,
        offset: u32,
        data: &[u8],
        final_bit: bool,
    ) -> Result<(), DataOutError> {
        let in_order = self.limits.data_pdu_in_order;
        let (seq, index) = if ttt == blockwire_pdu::pdu::RESERVED_TAG {
            (
                self.unsolicited
                    .as_mut()
                    .ok_or(DataOutError::UnexpectedUnsolicited)?,
                None,
            )
        } else {
            let i = self
                .open
                .iter()
                .position(|s| s.ttt == ttt)
                .ok_or(DataOutError::UnknownTtt(ttt))?;
            (&mut self.open[i], Some(i))
        };
        if data_sn != seq.next_data_sn {
            return Err(DataOutError::DataSn {
                got: data_sn,
                expected: seq.next_data_sn,
            });
        }
        let len = data.len() as u32;
        let end = offset.checked_add(len).ok_or(DataOutError::BadOffset {
            offset,
            end: u32::MAX,
        })?;
        let bad = DataOutError::BadOffset { offset, end };
        if offset < seq.start || end > seq.end || (in_order && offset != seq.next_offset) {
            return Err(bad);
        }
        // Overlapping data, or data in too many pieces (DataPDUInOrder=No).
        if self
            .covered
            .insert(u64::from(offset), u64::from(len))
            .is_err()
        {
            return Err(bad);
        }
        if self.gather {
            let (at, end) = (offset as usize, end as usize);
            if at == self.buf.len() {
                self.buf.extend_from_slice(data);
            } else {
                // Out of order (DataPDUInOrder=No) or past a gap: the gap
                // is zeroes until its own Data-Out fills it.
                if self.buf.len() < end {
                    self.buf.resize(end, 0);
                }
                self.buf[at..end].copy_from_slice(data);
            }
        }
        seq.next_data_sn += 1;
        seq.next_offset = end;
        seq.received += len;
        let seq_done = seq.received == seq.end - seq.start;
        if final_bit != seq_done {
            return Err(DataOutError::FinalBit);
        }
        if seq_done {
            match index {
                None => self.unsolicited = None,
                Some(i) => {
                    self.open.remove(i);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockwire_pdu::pdu::RESERVED_TAG;
    use proptest::prelude::*;

    fn limits() -> WriteLimits {
        WriteLimits {
            first_burst_length: 8192,
            max_burst_length: 16384,
            initial_r2t: false,
            immediate_data: true,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
        }
    }

    #[test]
    fn immediate_unsolicited_and_solicited() {
        let data: Vec<u8> = (0..40000u32).map(|i| i as u8).collect();
        let mut c = WriteCollector::new(40000, &data[..4096], false, limits()).unwrap();
        c.on_data_out(RESERVED_TAG, 0, 4096, &data[4096..8192], true)
            .unwrap();
        let mut ttt = 100;
        let r2ts = c.next_r2ts(|| {
            ttt += 1;
            ttt
        });
        assert_eq!(
            r2ts,
            vec![R2tRequest {
                ttt: 101,
                r2t_sn: 0,
                offset: 8192,
                length: 16384
            }]
        );
        c.on_data_out(101, 0, 8192, &data[8192..16384], false)
            .unwrap();
        assert_eq!(
            c.on_data_out(101, 2, 16384, &data[16384..24576], true),
            Err(DataOutError::DataSn {
                got: 2,
                expected: 1
            })
        );
        c.on_data_out(101, 1, 16384, &data[16384..24576], true)
            .unwrap();
        let r2ts = c.next_r2ts(|| 7);
        assert_eq!(
            r2ts,
            vec![R2tRequest {
                ttt: 7,
                r2t_sn: 1,
                offset: 24576,
                length: 15424
            }]
        );
        assert!(!c.is_complete());
        c.on_data_out(7, 0, 24576, &data[24576..], true).unwrap();
        assert!(c.is_complete());
        assert_eq!(c.into_data(), data);
    }

    #[test]
    fn refuses_protocol_violations() {
        let mut l = limits();
        l.immediate_data = false;
        assert_eq!(
            WriteCollector::new(100, &[0; 10], true, l).unwrap_err(),
            DataOutError::ImmediateDataNotAllowed
        );
        let mut c = WriteCollector::new(1024, &[], true, limits()).unwrap();
        assert_eq!(
            c.on_data_out(RESERVED_TAG, 0, 0, &[0; 512], false),
            Err(DataOutError::UnexpectedUnsolicited)
        );
        let r = c.next_r2ts(|| 5);
        assert_eq!(r.len(), 1);
        assert_eq!(
            c.on_data_out(6, 0, 0, &[0; 512], false),
            Err(DataOutError::UnknownTtt(6))
        );
        assert!(matches!(
            c.on_data_out(5, 0, 512, &[0; 512], false),
            Err(DataOutError::BadOffset { .. })
        ));
        assert_eq!(
            c.on_data_out(5, 0, 0, &[0; 1024], false),
            Err(DataOutError::FinalBit)
        );
    }

    #[test]
    fn validating_checks_the_same_and_keeps_nothing() {
        let mut c = WriteCollector::validating(16384, &[1; 4096], false, limits()).unwrap();
        assert_eq!(c.expected_len(), 16384);
        c.on_data_out(RESERVED_TAG, 0, 4096, &[2; 4096], true)
            .unwrap();
        let r = c.next_r2ts(|| 9);
        assert_eq!((r[0].offset, r[0].length), (8192, 8192));
        // Overlap with bytes already placed is refused as when gathering.
        assert!(matches!(
            c.on_data_out(9, 0, 4096, &[0; 512], false),
            Err(DataOutError::BadOffset { .. })
        ));
        c.on_data_out(9, 0, 8192, &[3; 8192], true).unwrap();
        assert!(c.is_complete());
        assert!(c.into_data().is_empty());
    }

    proptest! {
        // Whatever the limits and PDU size, answering every R2T in order
        // reassembles exactly the initiator's bytes.
        #[test]
        fn reassembles(len in 1u32..200_000, imm_frac in 0u32..4, pdu in 512u32..20000,
                       fbl in 512u32..65536, mbl in 512u32..65536, r2ts in 1u32..4, ir2t: bool) {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let l = WriteLimits { first_burst_length: fbl, max_burst_length: mbl, initial_r2t: ir2t,
                immediate_data: true, max_outstanding_r2t: r2ts, data_pdu_in_order: true };
            let imm = (fbl.min(len).min(pdu) * imm_frac / 4) as usize;
            let unsol_end = if ir2t { imm as u32 } else { fbl.min(len) };
            let mut c = WriteCollector::new(len, &data[..imm], ir2t || imm as u32 == unsol_end, l).unwrap();
            let mut off = imm as u32; let mut sn = 0;
            while off < unsol_end {
                let end = (off + pdu).min(unsol_end);
                c.on_data_out(RESERVED_TAG, sn, off, &data[off as usize..end as usize], end == unsol_end).unwrap();
                off = end; sn += 1;
            }
            let mut tag = 0;
            loop {
                let reqs = c.next_r2ts(|| { tag += 1; tag });
                if reqs.is_empty() { break; }
                for r in reqs {
                    let (mut o, mut sn) = (r.offset, 0);
                    while o < r.offset + r.length {
                        let end = (o + pdu).min(r.offset + r.length);
                        c.on_data_out(r.ttt, sn, o, &data[o as usize..end as usize], end == r.offset + r.length).unwrap();
                        o = end; sn += 1;
                    }
                }
            }
            prop_assert!(c.is_complete());
            prop_assert_eq!(c.into_data(), data);
        }

        // With DataPDUInOrder=No, the PDUs of each burst in any order and the
        // bursts of one round of R2Ts interleaved (the buffer grows past gaps
        // that later PDUs fill) still reassemble exactly the initiator's bytes.
        #[test]
        fn reassembles_out_of_order(len in 1u32..100_000, pdu in 512u32..8192,
                                    mbl in 512u32..32768, r2ts in 1u32..4, seed: u64) {
            let data: Vec<u8> = (0..len).map(|i| (i * 13 + 5) as u8).collect();
            let l = WriteLimits { first_burst_length: 512, max_burst_length: mbl, initial_r2t: true,
                immediate_data: true, max_outstanding_r2t: r2ts, data_pdu_in_order: false };
            let mut c = WriteCollector::new(len, &[], true, l).unwrap();
            let mut rng = seed | 1;
            let mut next = move |n: usize| {
                rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
                (rng % n as u64) as usize
            };
            let mut tag = 0;
            loop {
                let reqs = c.next_r2ts(|| { tag += 1; tag });
                if reqs.is_empty() { break; }
                // Each burst's PDUs, in a shuffled order.
                let mut bursts: Vec<(u32, u32, Vec<(u32, u32)>)> = reqs.iter().map(|r| {
                    let mut pdus: Vec<(u32, u32)> = (r.offset..r.offset + r.length).step_by(pdu as usize)
                        .map(|o| (o, (o + pdu).min(r.offset + r.length))).collect();
                    for i in (1..pdus.len()).rev() { let j = next(i + 1); pdus.swap(i, j); }
                    (r.ttt, 0, pdus)
                }).collect();
                // Interleaved across the bursts; DataSN counts in sending order.
                while !bursts.is_empty() {
                    let b = next(bursts.len());
                    let (ttt, sn, pdus) = &mut bursts[b];
                    let (o, end) = pdus.pop().unwrap();
                    c.on_data_out(*ttt, *sn, o, &data[o as usize..end as usize], pdus.is_empty()).unwrap();
                    *sn += 1;
                    if pdus.is_empty() { bursts.swap_remove(b); }
                }
            }
            prop_assert!(c.is_complete());
            prop_assert_eq!(c.into_data(), data);
        }
    }
}
