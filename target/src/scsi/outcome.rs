//! How a command handler reports its outcome, and the sense data the core
//! returns most often.
//!
//! Handlers return [`CmdResult`]: data plus the length the command would
//! transfer, or a [`Failure`] that the logical unit turns into a status and
//! (format-aware) sense bytes in one place.

use blockwire_pdu::scsi::{Asc, FieldPointer, ScsiStatus, Sense, SenseKey};

/// A successful command: its Data-In bytes and its transfer length.
#[derive(Debug, Default)]
pub(crate) struct Done {
    /// Data for the initiator, already cut to the allocation length.
    pub data: Vec<u8>,
    /// Bytes the command transfers in its direction (see
    /// `ScsiResult::transfer_length`).
    pub transfer_length: u32,
    /// GOOD, or CONDITION MET for PRE-FETCH.
    pub status: u8,
}

impl Done {
    /// No data phase.
    pub fn none() -> Done {
        Done::default()
    }

    /// A data-out command that consumed `len` bytes.
    pub fn out(len: u64) -> Done {
        Done {
            transfer_length: clamp32(len),
            ..Done::default()
        }
    }

    /// Parameter data for the initiator, cut to the allocation length; the
    /// transfer length is the shorter of the two, as SPC-4 4.2.5.6 defines
    /// what a device "transfers".
    pub fn data(mut data: Vec<u8>, allocation_length: u32) -> Done {
        data.truncate(allocation_length as usize);
        Done {
            transfer_length: clamp32(data.len() as u64),
            data,
            status: ScsiStatus::GOOD.0,
        }
    }

    /// Media data (READ): `data` is exactly the CDB's transfer length.
    pub fn media(data: Vec<u8>) -> Done {
        Done {
            transfer_length: clamp32(data.len() as u64),
            data,
            status: ScsiStatus::GOOD.0,
        }
    }
}

/// Why a command did not complete with GOOD status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// CHECK CONDITION with this sense.
    Check(Sense),
    /// RESERVATION CONFLICT (no sense).
    Conflict,
}

impl From<Sense> for Failure {
    fn from(s: Sense) -> Self {
        Failure::Check(s)
    }
}

/// What every handler returns.
pub(crate) type CmdResult = Result<Done, Failure>;

/// Saturating u64 → u32 (transfer lengths never exceed 4 GiB on the wire).
pub(crate) fn clamp32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// ILLEGAL REQUEST, INVALID FIELD IN CDB, pointing at `byte`/`bit`.
pub(crate) fn invalid_cdb(byte: u16, bit: Option<u8>) -> Failure {
    Failure::Check(Sense::illegal_request(
        Asc::INVALID_FIELD_IN_CDB,
        Some(FieldPointer::cdb(byte, bit)),
    ))
}

/// ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST, pointing at `byte`/`bit`.
pub(crate) fn invalid_param(byte: u16, bit: Option<u8>) -> Failure {
    Failure::Check(Sense::illegal_request(
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
        Some(FieldPointer::parameter(byte, bit)),
    ))
}

/// ILLEGAL REQUEST with an ASC and no field pointer.
pub(crate) fn illegal(code: Asc) -> Failure {
    Failure::Check(Sense::illegal_request(code, None))
}

/// ILLEGAL REQUEST, LOGICAL BLOCK ADDRESS OUT OF RANGE.
pub(crate) fn lba_out_of_range() -> Failure {
    illegal(Asc::LBA_OUT_OF_RANGE)
}

/// ILLEGAL REQUEST, PARAMETER LIST LENGTH ERROR.
pub(crate) fn param_length() -> Failure {
    illegal(Asc::PARAMETER_LIST_LENGTH_ERROR)
}

/// DATA PROTECT with `code` (WRITE PROTECTED for read-only LUNs, SOFTWARE
/// WRITE PROTECTED when the control page's SWP bit is set).
pub(crate) fn data_protect(code: Asc) -> Failure {
    Failure::Check(Sense::new(SenseKey::DataProtect, code))
}

/// A backstore error as MEDIUM ERROR (UNRECOVERED READ ERROR or WRITE ERROR)
/// with the first LBA of the failed range in INFORMATION, so the initiator
/// knows where; never a panic or a silent success.
pub(crate) fn io_failure(write: bool, lba: u64) -> Failure {
    let code = if write {
        Asc::WRITE_ERROR
    } else {
        Asc::UNRECOVERED_READ_ERROR
    };
    let mut s = Sense::new(SenseKey::MediumError, code);
    s.information = Some(lba);
    Failure::Check(s)
}

/// A backstore I/O error at `lba` as the initiator should see it:
/// - EIO and other media-like errors (the storage under the file failed):
///   MEDIUM ERROR, UNRECOVERED READ ERROR or WRITE ERROR, LBA in INFORMATION;
/// - ENOSPC/EDQUOT on a write (a thin file could not grow): DATA PROTECT,
///   SPACE ALLOCATION FAILED WRITE PROTECT (SBC-3 4.7.3.7), LBA in INFORMATION;
/// - anything else (a bug, a vanished device, a truncated file): HARDWARE
///   ERROR, INTERNAL TARGET FAILURE, LBA in INFORMATION.
pub(crate) fn backstore_failure(e: &std::io::Error, write: bool, lba: u64) -> Failure {
    use rustix::io::Errno;
    let errno = e.raw_os_error().map(Errno::from_raw_os_error);
    let mut s = match errno {
        Some(Errno::IO | Errno::BADMSG | Errno::NODATA | Errno::UCLEAN) => {
            return io_failure(write, lba)
        }
        // A file system or quota out of space, or the RAM LUNs' budget
        // spent: a thin-provisioned device out of space.
        Some(Errno::NOSPC | Errno::DQUOT) if write => Sense::new(
            SenseKey::DataProtect,
            Asc::SPACE_ALLOCATION_FAILED_WRITE_PROTECT,
        ),
        _ if write && e.kind() == std::io::ErrorKind::StorageFull => Sense::new(
            SenseKey::DataProtect,
            Asc::SPACE_ALLOCATION_FAILED_WRITE_PROTECT,
        ),
        _ if e.kind() == std::io::ErrorKind::UnexpectedEof => return io_failure(write, lba),
        _ => Sense::new(SenseKey::HardwareError, Asc::INTERNAL_TARGET_FAILURE),
    };
    s.information = Some(lba);
    Failure::Check(s)
}

/// HARDWARE ERROR, INTERNAL TARGET FAILURE: for failures that are not tied
/// to a block (flush errors, persisting reservation state).
pub(crate) fn internal_failure() -> Failure {
    Failure::Check(Sense::new(
        SenseKey::HardwareError,
        Asc::INTERNAL_TARGET_FAILURE,
    ))
}
