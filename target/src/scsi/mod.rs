//! The transport-independent SCSI core: SPC-4/SBC-3 block device emulation.
//!
//! The core sees a command (CDB, I_T nexus, the data the initiator sent,
//! how much it can take back) and a backstore; it never sees a PDU, so a
//! second fabric (iSER, another protocol) can use it without edits. Calls
//! block on backstore I/O: the fabric runs them on a blocking thread pool.

use std::sync::Arc;

use blockwire_pdu::pdu::codes::TaskAttr;

mod alua;
mod alua_saved;
mod atomic;
mod control;
mod format_unit;
mod guard_crc;
mod identity;
mod in_flight;
mod inquiry;
mod logical_unit;
mod lun_table;
mod mode;
mod opcodes;
mod outcome;
mod param_bytes;
mod protection;
mod provisioning;
pub mod qos;
mod range_lock;
pub mod read_plan;
mod read_write;
mod reservations;
mod sanitize;
mod saved_file;
pub mod stall;
pub mod stats;
pub mod token_copy;
mod unit_attention;
mod wake;
pub mod write_plan;
mod xcopy;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_alua_stall;
#[cfg(test)]
mod tests_atomic;
#[cfg(test)]
mod tests_explicit_alua;
#[cfg(test)]
mod tests_media;
#[cfg(test)]
mod tests_pr;
#[cfg(test)]
mod tests_protection;
#[cfg(test)]
mod tests_provisioning;
#[cfg(test)]
mod tests_sanitize;
#[cfg(test)]
mod tests_token_copy;

pub use alua::{state_changes, AluaState, TargetPortGroup};
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub use alua_saved::fuzzing as alua_state_fuzzing;
pub use identity::{identity_from_uuid, parse_uuid, stable_identity, DEFAULT_COMPANY_ID};
pub use logical_unit::{Activity, LogicalUnit, LuConfig, MAX_TRANSFER_BYTES};
pub use lun_table::{AddLunError, LunTable, NoSuchLun, Settling, TableAbortHandler};
pub use protection::PiFailureCounts;
pub use qos::{QosCounters, QosGate, QosLimits};
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub use reservations::fuzzing as pr_state_fuzzing;
pub use reservations::AbortHandler;
pub use stall::{abortable, StallChange};

/// The I_T nexus a command arrived on (SAM-5 §4.7): which initiator port,
/// through which target port. Reservations and unit attentions are kept per
/// nexus.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ItNexus {
    /// SCSI initiator port name, "<InitiatorName>,i,0x<ISID in hex>" (RFC 7143 §4.4.1).
    pub initiator_port: Arc<str>,
    /// SCSI target port name, "<TargetName>,t,0x<TPGT in hex>".
    pub target_port: Arc<str>,
    /// Relative target port identifier (blockwire uses the portal group tag).
    pub relative_target_port: u16,
}

impl ItNexus {
    /// The nexus of an iSCSI session.
    pub fn iscsi(initiator_name: &str, isid: [u8; 6], target_name: &str, tpgt: u16) -> ItNexus {
        let isid_hex: String = isid.iter().map(|b| format!("{b:02x}")).collect();
        ItNexus {
            initiator_port: format!("{initiator_name},i,0x{isid_hex}").into(),
            target_port: format!("{target_name},t,0x{tpgt:04x}").into(),
            relative_target_port: tpgt,
        }
    }

    /// The initiator's name without the ISID part.
    pub fn initiator_name(&self) -> &str {
        self.initiator_port
            .split_once(",i,")
            .map_or(&*self.initiator_port, |(name, _)| name)
    }
}

/// One SCSI command as the fabric hands it to the core.
#[derive(Debug)]
pub struct ScsiRequest<'a> {
    /// LUN index (SAM flat/peripheral addressing already decoded by the fabric).
    pub lun: u16,
    /// The whole CDB (6 to 260 bytes).
    pub cdb: &'a [u8],
    /// The I_T nexus.
    pub nexus: &'a ItNexus,
    /// Task tag (the iSCSI ITT), for logs and task management.
    pub task_tag: u32,
    /// Task attribute.
    pub attr: TaskAttr,
    /// The data the initiator sent, as many bytes as arrived (its Expected
    /// Data Transfer Length); may be shorter or longer than the CDB asks for.
    pub data_out: &'a [u8],
    /// How many bytes of data the initiator will accept back (its Expected
    /// Data Transfer Length for reads, or the bidirectional read length).
    pub data_in_capacity: u32,
    /// The initiator's READ/WRITE counters on this target, if the fabric
    /// keeps them: a READ or WRITE is counted there as on its LUN.
    pub initiator_stats: Option<&'a Arc<stats::IoStats>>,
}

/// What a command produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScsiResult {
    /// SCSI status byte (GOOD, CHECK CONDITION, RESERVATION CONFLICT, ...).
    pub status: u8,
    /// Sense data, already encoded in fixed or descriptor format (D_SENSE).
    pub sense: Option<Vec<u8>>,
    /// Data for the initiator. Never longer than `data_in_capacity`.
    pub data_in: Vec<u8>,
    /// Bytes the command would have transferred in its data direction
    /// (e.g. the CDB's transfer length in bytes, or the full length of the
    /// parameter data before truncation). The fabric derives residual
    /// counts from this and the initiator's Expected Data Transfer Length.
    pub transfer_length: u32,
}
