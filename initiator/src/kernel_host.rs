//! The wire between the `blockwire_scsi` kernel driver (`initiator/kmod/`)
//! and the daemon that runs its commands on an iSCSI session: the attach
//! request, the shared area's descriptor slots, the events `read()` gives
//! and the replies `write()` takes, as laid out in `blockwire_scsi.h`.
//!
//! Pure encoding and decoding, no system calls: the daemon's I/O lives in
//! the `blockwire attach` command. Everything the kernel wrote is checked
//! before it is used (CDB length, direction, data length against the
//! negotiated maximum), so a bad slot fails one command, not the daemon.

use thiserror::Error;

/// `BW_SCSI_ABI_VERSION`.
pub const ABI_VERSION: u32 = 1;
/// `BW_SCSI_MAX_CDB`: longer CDBs never reach the daemon.
pub const MAX_CDB: usize = 16;
/// `BW_SCSI_MAX_SENSE`.
pub const MAX_SENSE: usize = 96;
/// `BW_SCSI_SLOT_BYTES`: the distance between descriptor slots.
pub const SLOT_BYTES: usize = 256;
/// `BW_SCSI_MAX_QUEUE_DEPTH`.
pub const MAX_QUEUE_DEPTH: u32 = 256;
/// `BW_SCSI_MIN_IO_BYTES`: the largest transfer is a multiple of this.
pub const MIN_IO_BYTES: u32 = 4096;
/// `BW_SCSI_MAX_IO_BYTES`.
pub const MAX_IO_BYTES: u32 = 1024 * 1024;
/// `BW_SCSI_MAX_AREA_BYTES`: the most the shared area may take.
pub const MAX_AREA_BYTES: u64 = 64 * 1024 * 1024;

/// `sizeof(struct bw_scsi_attach)`.
pub const ATTACH_BYTES: usize = 256;
/// `sizeof(struct bw_scsi_event)`.
pub const EVENT_BYTES: usize = 24;
/// `sizeof(struct bw_scsi_reply)`.
pub const REPLY_BYTES: usize = 16;
/// The bytes of `struct bw_scsi_slot` that are used.
pub const SLOT_USED_BYTES: usize = 144;
/// Room for the target name in the attach request, NUL included.
pub const TARGET_NAME_BYTES: usize = 224;

const IOC_MAGIC: u64 = 0xb7;
/// `BW_SCSI_IOC_ATTACH`: `_IOWR(0xb7, 1, struct bw_scsi_attach)`.
pub const IOC_ATTACH: u64 = (3 << 30) | ((ATTACH_BYTES as u64) << 16) | (IOC_MAGIC << 8) | 1;
/// `BW_SCSI_IOC_DETACH`: `_IO(0xb7, 2)`.
pub const IOC_DETACH: u64 = (IOC_MAGIC << 8) | 2;

// Offsets in `struct bw_scsi_slot`.
const SLOT_LUN: usize = 0;
const SLOT_DATA_LEN: usize = 8;
const SLOT_DIR: usize = 12;
const SLOT_CDB_LEN: usize = 13;
const SLOT_CDB: usize = 16;
const SLOT_SEQ: usize = 32;
const SLOT_STATUS: usize = 40;
const SLOT_HOST_STATUS: usize = 41;
const SLOT_SENSE_LEN: usize = 42;
const SLOT_RESID: usize = 44;
const SLOT_SENSE: usize = 48;

/// What the driver wrote that the daemon cannot use.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KernelHostError {
    /// A buffer shorter than the structure it should hold.
    #[error("{what}: {len} bytes, need {need}")]
    Short {
        /// Which structure.
        what: &'static str,
        /// Bytes there.
        len: usize,
        /// Bytes needed.
        need: usize,
    },
    /// A CDB length outside 1..=16.
    #[error("CDB length {0}: the driver passes 1 to 16 bytes")]
    CdbLength(u8),
    /// An unknown data direction.
    #[error("data direction {0}: unknown")]
    Direction(u8),
    /// A data length beyond the host's largest transfer, or data without a
    /// direction.
    #[error("data length {len} ({dir:?}): the host moves at most {max} bytes per command")]
    DataLength {
        /// The slot's data length.
        len: u32,
        /// The slot's direction.
        dir: Direction,
        /// The negotiated maximum.
        max: u32,
    },
    /// An unknown event kind.
    #[error("event kind {0}: unknown")]
    EventKind(u32),
    /// The driver's answer to the attach does not describe a usable area.
    #[error("attach answer: {0}")]
    Attach(String),
}

/// Which way a command's data go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// No data.
    None,
    /// Data-Out (a WRITE): the driver copied it into the data buffer.
    ToDevice,
    /// Data-In (a READ): the daemon fills the data buffer.
    FromDevice,
}

/// The attach request (`struct bw_scsi_attach`, the daemon's half).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachRequest {
    /// Commands in flight at most (1..=256).
    pub queue_depth: u32,
    /// The largest transfer, a multiple of 4096 up to 1 MiB.
    pub max_io_bytes: u32,
    /// The iSCSI target's name, shown in the host's sysfs.
    pub target: String,
}

impl AttachRequest {
    /// Checks the request against the driver's limits, so that a bad one is
    /// refused here with a message instead of EINVAL from the ioctl.
    pub fn check(&self) -> Result<(), String> {
        if self.queue_depth == 0 || self.queue_depth > MAX_QUEUE_DEPTH {
            return Err(format!(
                "queue depth {}: the driver takes 1 to {MAX_QUEUE_DEPTH}",
                self.queue_depth
            ));
        }
        if self.max_io_bytes < MIN_IO_BYTES
            || self.max_io_bytes > MAX_IO_BYTES
            || self.max_io_bytes % MIN_IO_BYTES != 0
        {
            return Err(format!(
                "largest transfer {} bytes: the driver takes a multiple of {MIN_IO_BYTES} \
                 from {MIN_IO_BYTES} to {MAX_IO_BYTES}",
                self.max_io_bytes
            ));
        }
        let area = self.area_bytes();
        if area > MAX_AREA_BYTES {
            return Err(format!(
                "queue depth {} x {} bytes needs a shared area of {area} bytes; the driver \
                 allows {MAX_AREA_BYTES}: lower the queue depth or the largest transfer",
                self.queue_depth, self.max_io_bytes
            ));
        }
        Ok(())
    }

    /// The shared area this request asks for (as the driver computes it).
    pub fn area_bytes(&self) -> u64 {
        data_offset(self.queue_depth) + u64::from(self.queue_depth) * u64::from(self.max_io_bytes)
    }

    /// `struct bw_scsi_attach` as the ioctl takes it.
    pub fn encode(&self) -> [u8; ATTACH_BYTES] {
        let mut b = [0u8; ATTACH_BYTES];
        put32(&mut b, 0, ABI_VERSION);
        put32(&mut b, 4, self.queue_depth);
        put32(&mut b, 8, self.max_io_bytes);
        let name = self.target.as_bytes();
        let n = name.len().min(TARGET_NAME_BYTES - 1);
        b[32..32 + n].copy_from_slice(&name[..n]);
        b
    }
}

/// The driver's answer to the attach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attached {
    /// The SCSI host number (`/sys/class/scsi_host/hostN`).
    pub host_no: u32,
    /// Bytes to map.
    pub area_bytes: u32,
    /// Where data buffer 0 starts.
    pub data_offset: u32,
}

impl Attached {
    /// Reads the answer and checks that the area holds `req`'s slots and
    /// buffers where the driver says they are.
    pub fn decode(b: &[u8], req: &AttachRequest) -> Result<Attached, KernelHostError> {
        need(b, ATTACH_BYTES, "attach answer")?;
        let a = Attached {
            host_no: get32(b, 12),
            area_bytes: get32(b, 16),
            data_offset: get32(b, 24),
        };
        let slot_bytes = get32(b, 20);
        if slot_bytes as usize != SLOT_BYTES {
            return Err(KernelHostError::Attach(format!(
                "slots of {slot_bytes} bytes, this blockwire knows {SLOT_BYTES}"
            )));
        }
        let depth = u64::from(req.queue_depth);
        let slots_end = depth * SLOT_BYTES as u64;
        let data_end = u64::from(a.data_offset) + depth * u64::from(req.max_io_bytes);
        if u64::from(a.data_offset) < slots_end || data_end > u64::from(a.area_bytes) {
            return Err(KernelHostError::Attach(format!(
                "area of {} bytes with data from {} cannot hold {depth} slots and buffers of {}",
                a.area_bytes, a.data_offset, req.max_io_bytes
            )));
        }
        Ok(a)
    }
}

/// Where the data buffers start for `depth` slots: after the slots, on a
/// page boundary.
fn data_offset(depth: u32) -> u64 {
    (u64::from(depth) * SLOT_BYTES as u64).div_ceil(4096) * 4096
}

/// What an event asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A command is in the slot.
    Command,
    /// ABORT TASK for the command in the slot.
    Abort,
    /// LOGICAL UNIT RESET of the event's LUN.
    LunReset,
    /// TARGET WARM RESET.
    TargetReset,
    /// End every command the daemon holds.
    HostReset,
}

/// One `struct bw_scsi_event`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// What it asks.
    pub kind: EventKind,
    /// The slot (Command, Abort).
    pub tag: u32,
    /// The slot's command number (Command, Abort).
    pub seq: u32,
    /// Task management only: quoted in the reply.
    pub tmf_id: u32,
    /// The mid-layer's LUN (Abort, LunReset).
    pub lun: u64,
}

impl Event {
    /// Decodes one event.
    pub fn decode(b: &[u8]) -> Result<Event, KernelHostError> {
        need(b, EVENT_BYTES, "event")?;
        let kind = match get32(b, 0) {
            1 => EventKind::Command,
            2 => EventKind::Abort,
            3 => EventKind::LunReset,
            4 => EventKind::TargetReset,
            5 => EventKind::HostReset,
            k => return Err(KernelHostError::EventKind(k)),
        };
        Ok(Event {
            kind,
            tag: get32(b, 4),
            seq: get32(b, 8),
            tmf_id: get32(b, 12),
            lun: get64(b, 16),
        })
    }

    /// Encodes one event (the driver's side; for tests).
    pub fn encode(&self) -> [u8; EVENT_BYTES] {
        let mut b = [0u8; EVENT_BYTES];
        let kind = match self.kind {
            EventKind::Command => 1,
            EventKind::Abort => 2,
            EventKind::LunReset => 3,
            EventKind::TargetReset => 4,
            EventKind::HostReset => 5,
        };
        put32(&mut b, 0, kind);
        put32(&mut b, 4, self.tag);
        put32(&mut b, 8, self.seq);
        put32(&mut b, 12, self.tmf_id);
        b[16..24].copy_from_slice(&self.lun.to_ne_bytes());
        b
    }
}

/// One `struct bw_scsi_reply`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// The command in slot `tag`, number `seq`, ended: its answer is in
    /// the slot.
    Command {
        /// The slot.
        tag: u32,
        /// The command's number.
        seq: u32,
    },
    /// The task management request `tmf_id` ended.
    Tmf {
        /// The event's `tmf_id`.
        tmf_id: u32,
        /// Every command it covered has ended (true), or the mid-layer
        /// should escalate (false).
        done: bool,
    },
}

impl Reply {
    /// `struct bw_scsi_reply` as `write()` takes it.
    pub fn encode(&self) -> [u8; REPLY_BYTES] {
        let mut b = [0u8; REPLY_BYTES];
        match *self {
            Reply::Command { tag, seq } => {
                put32(&mut b, 0, 1);
                put32(&mut b, 4, tag);
                put32(&mut b, 8, seq);
            }
            Reply::Tmf { tmf_id, done } => {
                put32(&mut b, 0, 2);
                put32(&mut b, 8, tmf_id);
                put32(&mut b, 12, if done { 0 } else { 1 });
            }
        }
        b
    }
}

/// A command as the driver placed it in a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotCommand {
    /// The mid-layer's LUN (`scsilun_to_int` form).
    pub lun: u64,
    /// Bytes to move.
    pub data_len: u32,
    /// Which way.
    pub dir: Direction,
    /// The CDB (1 to 16 bytes).
    pub cdb: Vec<u8>,
    /// The command's number in its slot.
    pub seq: u32,
}

impl SlotCommand {
    /// Reads and checks a slot the driver filled; `max_io` is the host's
    /// largest transfer.
    pub fn decode(slot: &[u8], max_io: u32) -> Result<SlotCommand, KernelHostError> {
        need(slot, SLOT_USED_BYTES, "slot")?;
        let cdb_len = slot[SLOT_CDB_LEN];
        if cdb_len == 0 || usize::from(cdb_len) > MAX_CDB {
            return Err(KernelHostError::CdbLength(cdb_len));
        }
        let dir = match slot[SLOT_DIR] {
            0 => Direction::None,
            1 => Direction::ToDevice,
            2 => Direction::FromDevice,
            d => return Err(KernelHostError::Direction(d)),
        };
        let data_len = get32(slot, SLOT_DATA_LEN);
        if data_len > max_io || (dir == Direction::None && data_len != 0) {
            return Err(KernelHostError::DataLength {
                len: data_len,
                dir,
                max: max_io,
            });
        }
        Ok(SlotCommand {
            lun: get64(slot, SLOT_LUN),
            data_len,
            dir,
            cdb: slot[SLOT_CDB..SLOT_CDB + usize::from(cdb_len)].to_vec(),
            seq: get32(slot, SLOT_SEQ),
        })
    }

    /// Writes a command into a slot (the driver's side; for tests).
    pub fn encode_into(&self, slot: &mut [u8]) {
        slot[SLOT_LUN..SLOT_LUN + 8].copy_from_slice(&self.lun.to_ne_bytes());
        put32(slot, SLOT_DATA_LEN, self.data_len);
        slot[SLOT_DIR] = match self.dir {
            Direction::None => 0,
            Direction::ToDevice => 1,
            Direction::FromDevice => 2,
        };
        let n = self.cdb.len().min(MAX_CDB);
        slot[SLOT_CDB_LEN] = n as u8;
        slot[SLOT_CDB..SLOT_CDB + MAX_CDB].fill(0);
        slot[SLOT_CDB..SLOT_CDB + n].copy_from_slice(&self.cdb[..n]);
        put32(slot, SLOT_SEQ, self.seq);
    }
}

/// How the transport ended a command (the slot's `host_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostStatus {
    /// The target answered: status and sense are valid.
    Ok,
    /// The session is recovering: the mid-layer retries.
    Retry,
    /// The session is gone: the command fails.
    NoConnect,
    /// A protocol failure for this command.
    Error,
}

/// The daemon's answer for a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotAnswer {
    /// How the transport ended it.
    pub host: HostStatus,
    /// The SCSI status (with `HostStatus::Ok`).
    pub status: u8,
    /// Sense bytes (the first 96 are kept).
    pub sense: Vec<u8>,
    /// Bytes of the data length not transferred.
    pub resid: u32,
}

impl SlotAnswer {
    /// Writes the answer into the slot.
    pub fn write_into(&self, slot: &mut [u8]) {
        slot[SLOT_STATUS] = self.status;
        slot[SLOT_HOST_STATUS] = match self.host {
            HostStatus::Ok => 0,
            HostStatus::Retry => 1,
            HostStatus::NoConnect => 2,
            HostStatus::Error => 3,
        };
        let n = self.sense.len().min(MAX_SENSE);
        slot[SLOT_SENSE_LEN..SLOT_SENSE_LEN + 2].copy_from_slice(&(n as u16).to_ne_bytes());
        put32(slot, SLOT_RESID, self.resid);
        slot[SLOT_SENSE..SLOT_SENSE + n].copy_from_slice(&self.sense[..n]);
    }

    /// Reads an answer back (the driver's side; for tests).
    pub fn read_from(slot: &[u8]) -> SlotAnswer {
        let n = usize::from(u16::from_ne_bytes([
            slot[SLOT_SENSE_LEN],
            slot[SLOT_SENSE_LEN + 1],
        ]))
        .min(MAX_SENSE);
        SlotAnswer {
            host: match slot[SLOT_HOST_STATUS] {
                0 => HostStatus::Ok,
                1 => HostStatus::Retry,
                2 => HostStatus::NoConnect,
                _ => HostStatus::Error,
            },
            status: slot[SLOT_STATUS],
            sense: slot[SLOT_SENSE..SLOT_SENSE + n].to_vec(),
            resid: get32(slot, SLOT_RESID),
        }
    }
}

/// The iSCSI LUN for the mid-layer's LUN number (`scsilun_to_int` of SAM's
/// peripheral or flat addressing, SAM-5 4.7): None for LUNs beyond 16383
/// or in another addressing method.
pub fn iscsi_lun(kernel_lun: u64) -> Option<u16> {
    match kernel_lun {
        0..=255 => Some(kernel_lun as u16),
        // Flat space addressing: 01b in the top two bits of the first level.
        0x4000..=0x7fff => Some((kernel_lun & 0x3fff) as u16),
        _ => None,
    }
}

fn need(b: &[u8], n: usize, what: &'static str) -> Result<(), KernelHostError> {
    if b.len() < n {
        return Err(KernelHostError::Short {
            what,
            len: b.len(),
            need: n,
        });
    }
    Ok(())
}

// The driver's structures are in the machine's byte order (one machine
// holds both sides).
fn get32(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn get64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(v)
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

#[cfg(test)]
mod tests;
