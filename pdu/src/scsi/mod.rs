//! SCSI wire types shared by target and initiator: CDBs, sense data, status, VPD pages.
//!
//! Everything here is a pure codec over byte slices (SPC-4, SBC-3, SAM-5):
//! no I/O, no `unsafe`, and no panics on any input. Decoders of untrusted
//! bytes (`Cdb::decode`, `Sense::decode`, `parse_sense_segment`,
//! `StandardInquiry::decode`, `VpdPage::decode`, `ReadCapacity10::decode`,
//! `ReadCapacity16::decode`, `Lun::decode`, `ReportLuns::decode`,
//! `ModeParameters::decode6/decode10`, `UnmapList::decode`,
//! `PrOutData::decode`, `LogPage::decode`) are the fuzz entry points.

pub(crate) mod asc;
pub(crate) mod capacity;
pub mod cdb;
pub(crate) mod error;
pub(crate) mod inquiry;
pub mod log;
pub(crate) mod lun;
pub mod mode;
pub mod opcode;
pub(crate) mod param;
pub mod protection;
pub(crate) mod sense;
pub(crate) mod status;
pub mod vpd;
mod wire;

pub use asc::{asc_name, Asc};
pub use capacity::{ReadCapacity10, ReadCapacity16};
pub use cdb::{
    Cdb, CdbError, CdbSize, DataDirection, PageControl, PrInAction, PrOutAction, PrType, Rw,
    TransferLength,
};
pub use error::DataError;
pub use inquiry::{Peripheral, StandardInquiry};
pub use log::{LogBody, LogPage, LogParameter, ResourceCount, ResourceScope};
pub use lun::{Lun, ReportLuns};
pub use mode::{
    BlockDescriptor, CachingPage, ControlPage, InformationalExceptionsPage,
    LogicalBlockProvisioningPage, ModeHeader, ModePage, ModeParameters, ReadWriteErrorRecoveryPage,
    ThresholdDescriptor,
};
pub use param::{
    PrOutData, PrOutParameters, RegisterAndMoveParameters, TransportId, UnmapDescriptor, UnmapList,
};
pub use protection::{crc16_t10dif, PiCheckFailure, PiChecks, PiTuple};
pub use sense::{
    parse_sense_segment, sense_segment, split_sense_segment, FieldPointer, Sense, SenseError,
    SenseFormat, SenseKey, SenseKeySpecific,
};
pub use status::ScsiStatus;
pub use vpd::{
    Association, BlockDeviceCharacteristics, BlockLimits, CodeSet, Designator, DesignatorId,
    ExtendedInquiry, LogicalBlockProvisioning, Naa, Vpd, VpdPage,
};
