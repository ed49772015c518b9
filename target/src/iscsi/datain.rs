//! Cutting a READ's data into Data-In PDUs (RFC 7143 §11.7), as a pure
//! function of the lengths.
//!
//! Each PDU carries at most the initiator's MaxRecvDataSegmentLength;
//! PDUs form sequences of at most MaxBurstLength bytes and the last PDU of
//! each sequence has the F bit. DataSN counts PDUs across the whole command.

/// One Data-In PDU's place in the command's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataInSegment {
    /// BufferOffset.
    pub offset: u32,
    /// Payload length.
    pub length: u32,
    /// DataSN.
    pub data_sn: u32,
    /// Last PDU of its sequence (F bit).
    pub final_in_sequence: bool,
    /// Last PDU of the command (may carry the status).
    pub last: bool,
}

/// The Data-In PDUs for `total` bytes.
pub fn segments(
    total: u32,
    max_recv_data_segment_length: u32,
    max_burst_length: u32,
) -> impl Iterator<Item = DataInSegment> {
    let mrdsl = max_recv_data_segment_length.max(512);
    let burst = max_burst_length.max(512);
    let mut offset = 0u32;
    let mut data_sn = 0u32;
    let mut in_burst = 0u32;
    std::iter::from_fn(move || {
        if offset >= total {
            return None;
        }
        let length = (total - offset).min(mrdsl).min(burst - in_burst);
        in_burst += length;
        let last = offset + length == total;
        let final_in_sequence = last || in_burst == burst;
        if final_in_sequence {
            in_burst = 0;
        }
        let seg = DataInSegment {
            offset,
            length,
            data_sn,
            final_in_sequence,
            last,
        };
        offset += length;
        data_sn += 1;
        Some(seg)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bursts_and_segments() {
        let s: Vec<_> = segments(20000, 8192, 10000).collect();
        let lens: Vec<u32> = s.iter().map(|x| x.length).collect();
        assert_eq!(lens, vec![8192, 1808, 8192, 1808]);
        assert!(s[1].final_in_sequence && !s[0].final_in_sequence);
        assert!(s[3].last && s[3].final_in_sequence);
        assert_eq!(s[3].data_sn, 3);
        assert_eq!(segments(0, 8192, 8192).count(), 0);
    }

    proptest! {
        #[test]
        fn covers_exactly(total in 0u32..1_000_000, mrdsl in 512u32..300_000, mbl in 512u32..300_000) {
            let mut next = 0;
            let mut burst = 0;
            for (i, s) in segments(total, mrdsl, mbl).enumerate() {
                prop_assert_eq!(s.offset, next);
                prop_assert_eq!(s.data_sn, i as u32);
                prop_assert!(s.length > 0 && s.length <= mrdsl);
                burst += s.length;
                prop_assert!(burst <= mbl);
                if s.final_in_sequence { burst = 0; }
                next += s.length;
                prop_assert_eq!(s.last, next == total);
            }
            prop_assert_eq!(next, total);
        }
    }
}
