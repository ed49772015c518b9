//! Turning a SCSI result into Data-In and SCSI Response PDUs, as a pure
//! function: segmentation, phase collapse and residual counts.
//!
//! Sequence numbers (StatSN, ExpCmdSN, MaxCmdSN) are left at zero: the
//! connection's writer stamps them when the PDUs leave, in send order.

use blockwire_pdu::pdu::codes::ServiceResponse;
use blockwire_pdu::pdu::{DataIn, ScsiCommand, ScsiResponse, RESERVED_TAG};
use blockwire_pdu::{Bhs, Pdu};
use bytes::Bytes;

use super::datain;
use crate::scsi::ScsiResult;

/// GOOD status.
const GOOD: u8 = 0x00;

/// Limits that shape the Data-In PDUs of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataInLimits {
    /// The initiator's MaxRecvDataSegmentLength.
    pub max_recv_data_segment_length: u32,
    /// MaxBurstLength.
    pub max_burst_length: u32,
}

/// How a result compares with what the initiator expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Residual {
    /// O bit: the command wanted more than the Expected Data Transfer Length.
    pub overflow: bool,
    /// U bit: it moved less than expected.
    pub underflow: bool,
    /// The difference in bytes.
    pub count: u32,
}

impl Residual {
    /// Residual of a command that wanted `transfer` bytes when the initiator
    /// expected `expected` (RFC 7143 §11.4.5).
    pub fn of(expected: u32, transfer: u32) -> Residual {
        match transfer.cmp(&expected) {
            std::cmp::Ordering::Greater => Residual {
                overflow: true,
                underflow: false,
                count: transfer - expected,
            },
            std::cmp::Ordering::Less => Residual {
                overflow: false,
                underflow: true,
                count: expected - transfer,
            },
            std::cmp::Ordering::Equal => Residual::default(),
        }
    }
}

/// The PDUs that answer `cmd`. `r2t_count` is how many R2Ts the command
/// caused (a WRITE's ExpDataSN).
pub fn response_pdus(
    cmd: &ScsiCommand,
    result: ScsiResult,
    limits: DataInLimits,
    r2t_count: u32,
) -> Vec<Pdu> {
    response_pdus_holding(cmd, result, limits, r2t_count, None)
}

/// READ data and the share of the connection's READ budget it holds, if
/// any: when the last Data-In PDU carrying a piece of the data has been
/// written (or dropped with the connection), the share returns and the
/// buffer goes back to be read into again (crate::payload_buffers).
struct HeldData {
    data: crate::payload_buffers::Returning,
    _share: Option<crate::iscsi::budget::ReadDataHeld>,
}

impl AsRef<[u8]> for HeldData {
    fn as_ref(&self) -> &[u8] {
        self.data.as_ref()
    }
}

/// [`response_pdus`], the READ data holding `share` of the connection's READ
/// budget until every PDU carrying it is gone.
pub(super) fn response_pdus_holding(
    cmd: &ScsiCommand,
    result: ScsiResult,
    limits: DataInLimits,
    r2t_count: u32,
    share: Option<crate::iscsi::budget::ReadDataHeld>,
) -> Vec<Pdu> {
    let expected = cmd.expected_data_transfer_length;
    let residual = Residual::of(expected, result.transfer_length);
    let capacity = if cmd.read { expected as usize } else { 0 };
    let mut data = if result.data_in.is_empty() {
        Bytes::new()
    } else {
        Bytes::from_owner(HeldData {
            data: crate::payload_buffers::Returning(result.data_in),
            _share: share,
        })
    };
    data.truncate(capacity);
    let collapse = result.status == GOOD && result.sense.is_none() && !data.is_empty();

    let mut out = Vec::new();
    let mut data_ins = 0u32;
    for seg in datain::segments(
        data.len() as u32,
        limits.max_recv_data_segment_length,
        limits.max_burst_length,
    ) {
        let with_status = collapse && seg.last;
        let bhs = data_in_header(cmd, &seg, with_status.then_some((result.status, residual)));
        let payload = data.slice(seg.offset as usize..(seg.offset + seg.length) as usize);
        out.push(Pdu::with_data(bhs, payload));
        data_ins += 1;
    }
    if !collapse {
        let segment = result.sense.map(|sense| {
            let mut seg = Vec::with_capacity(2 + sense.len());
            seg.extend_from_slice(&(sense.len() as u16).to_be_bytes());
            seg.extend_from_slice(&sense);
            seg
        });
        let bhs = Bhs::ScsiResponse(ScsiResponse {
            bidi_read_overflow: false,
            bidi_read_underflow: false,
            overflow: residual.overflow,
            underflow: residual.underflow,
            response: ServiceResponse::CommandCompleted,
            status: result.status,
            itt: cmd.itt,
            snack_tag: 0,
            stat_sn: 0,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
            exp_data_sn: if cmd.read { data_ins } else { r2t_count },
            bidi_read_residual_count: 0,
            residual_count: residual.count,
        });
        out.push(match segment {
            Some(seg) => Pdu::with_data(bhs, seg),
            None => Pdu::new(bhs),
        });
    }
    out
}

/// The Data-In header for segment `seg` of `cmd`'s data. `status` is the
/// status and residual collapsed into it (the last segment of a GOOD read).
pub fn data_in_header(
    cmd: &ScsiCommand,
    seg: &datain::DataInSegment,
    status: Option<(u8, Residual)>,
) -> Bhs {
    let residual = status.map(|s| s.1).unwrap_or_default();
    Bhs::DataIn(DataIn {
        final_bit: seg.final_in_sequence,
        acknowledge: false,
        overflow: residual.overflow,
        underflow: residual.underflow,
        status: status.map(|s| s.0),
        lun: cmd.lun,
        itt: cmd.itt,
        ttt: RESERVED_TAG,
        stat_sn: 0,
        exp_cmd_sn: 0,
        max_cmd_sn: 0,
        data_sn: seg.data_sn,
        buffer_offset: seg.offset,
        residual_count: residual.count,
    })
}

/// A SCSI Response with only a status and optional sense, for commands the
/// fabric answers itself (e.g. a transfer too large to buffer).
pub fn status_only(cmd: &ScsiCommand, status: u8, sense: Option<Vec<u8>>) -> Vec<Pdu> {
    status_after_r2ts(cmd, status, sense, 0)
}

/// [`status_only`] for a WRITE the target sent `r2t_count` R2Ts for: the
/// response's ExpDataSN counts them (RFC 7143 §11.4.8), whatever its status.
pub fn status_after_r2ts(
    cmd: &ScsiCommand,
    status: u8,
    sense: Option<Vec<u8>>,
    r2t_count: u32,
) -> Vec<Pdu> {
    response_pdus(
        cmd,
        ScsiResult {
            status,
            sense,
            data_in: Vec::new(),
            transfer_length: 0,
        },
        DataInLimits {
            max_recv_data_segment_length: 8192,
            max_burst_length: 262_144,
        },
        r2t_count,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockwire_pdu::pdu::codes::TaskAttr;
    use blockwire_pdu::Lun;

    fn read_cmd(edtl: u32) -> ScsiCommand {
        ScsiCommand {
            immediate: false,
            final_bit: true,
            read: true,
            write: false,
            attr: TaskAttr::Simple,
            lun: Lun::from_index(1),
            itt: 9,
            expected_data_transfer_length: edtl,
            cmd_sn: 1,
            exp_stat_sn: 1,
            cdb: [0; 16],
        }
    }

    const LIMITS: DataInLimits = DataInLimits {
        max_recv_data_segment_length: 4096,
        max_burst_length: 8192,
    };

    #[test]
    fn good_read_collapses_status_into_the_last_data_in() {
        let r = ScsiResult {
            status: 0,
            sense: None,
            data_in: vec![7; 10000],
            transfer_length: 10000,
        };
        let pdus = response_pdus(&read_cmd(10000), r, LIMITS, 0);
        assert_eq!(pdus.len(), 3);
        let Bhs::DataIn(last) = pdus[2].bhs else {
            panic!()
        };
        assert_eq!(last.status, Some(0));
        assert_eq!((last.data_sn, last.buffer_offset), (2, 8192));
        assert!(!last.underflow && !last.overflow);
        let Bhs::DataIn(first) = pdus[1].bhs else {
            panic!()
        };
        assert!(first.final_bit, "end of the first 8 KiB burst");
    }

    #[test]
    fn short_read_reports_underflow_and_long_read_overflow() {
        let r = ScsiResult {
            status: 0,
            sense: None,
            data_in: vec![1; 512],
            transfer_length: 512,
        };
        let pdus = response_pdus(&read_cmd(4096), r, LIMITS, 0);
        let Bhs::DataIn(d) = pdus[0].bhs else {
            panic!()
        };
        assert!(d.underflow && d.residual_count == 3584);

        let r = ScsiResult {
            status: 0,
            sense: None,
            data_in: vec![1; 1024],
            transfer_length: 1024,
        };
        let pdus = response_pdus(&read_cmd(512), r, LIMITS, 0);
        assert_eq!(pdus[0].data.len(), 512);
        let Bhs::DataIn(d) = pdus[0].bhs else {
            panic!()
        };
        assert!(d.overflow && d.residual_count == 512);
    }

    #[test]
    fn check_condition_sends_sense_in_a_scsi_response() {
        let sense = vec![0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0];
        let r = ScsiResult {
            status: 2,
            sense: Some(sense.clone()),
            data_in: vec![],
            transfer_length: 0,
        };
        let pdus = response_pdus(&read_cmd(512), r, LIMITS, 0);
        assert_eq!(pdus.len(), 1);
        let Bhs::ScsiResponse(s) = pdus[0].bhs else {
            panic!()
        };
        assert_eq!(s.status, 2);
        assert!(s.underflow && s.residual_count == 512);
        assert_eq!(&pdus[0].data[..2], &[0, 18]);
        assert_eq!(&pdus[0].data[2..], &sense[..]);
    }
}
