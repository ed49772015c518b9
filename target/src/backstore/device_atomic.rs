//! Atomic writes the kernel makes untorn: `pwritev2(RWF_ATOMIC)` on a file
//! opened `O_DIRECT` (Linux 6.11+), for a file LUN on a block device whose
//! queue offers them (an NVMe namespace with a power-fail atomic write
//! unit, a SCSI disk whose Block Limits page advertises WRITE ATOMIC(16)).
//! The device keeps the promise, so no journal is needed (LIO's iblock
//! backstore passes WRITE ATOMIC(16) to the block layer the same way).
//!
//! `statx(STATX_WRITE_ATOMIC)` says what the kernel takes: one write of a
//! power of two between `stx_atomic_write_unit_min` and
//! `stx_atomic_write_unit_max` bytes, at an offset that is a multiple of its
//! length. SBC-4's Block Limits page can only say "multiples of G blocks,
//! aligned to A blocks, at most M blocks", and a WRITE ATOMIC(16) of three
//! units, or of two at an odd unit, would be valid there but refused by
//! the kernel. So the unit offers exactly one size U (A = G = M = U): every
//! valid command is then one write the kernel takes, and Linux's sd, which
//! turns the page into `atomic_write_unit_min_bytes` =
//! `atomic_write_unit_max_bytes` = U, sends nothing else. U is
//! `atomic_unit` in the configuration, by default [`DEFAULT_UNIT`] bytes
//! within the device's range.

use std::fs::File;
use std::io::{self, IoSlice};

use rustix::fs::{AtFlags, StatxFlags};
use rustix::io::{Errno, ReadWriteFlags};

/// `STATX_WRITE_ATOMIC` (include/uapi/linux/stat.h, Linux 6.11).
const STATX_WRITE_ATOMIC: u32 = 0x0001_0000;
/// `RWF_ATOMIC` (include/uapi/linux/fs.h, Linux 6.11).
const RWF_ATOMIC: u32 = 0x0000_0040;

/// The atomic write size a LUN on such a device offers unless configured:
/// the page of InnoDB (16 KiB), the most common database page that relies
/// on untorn writes; PostgreSQL's 8 KiB pages want `atomic_unit = "8K"`.
pub const DEFAULT_UNIT: u32 = 16 << 10;

/// The untorn writes the kernel offers for one open file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAtomicUnits {
    /// `stx_atomic_write_unit_min`, bytes.
    pub min: u32,
    /// `stx_atomic_write_unit_max`, bytes.
    pub max: u32,
}

impl DeviceAtomicUnits {
    /// What the kernel says of `file` (opened `O_DIRECT`); None where it
    /// offers no atomic writes (or predates `STATX_WRITE_ATOMIC`).
    pub fn probe(file: &File) -> Option<DeviceAtomicUnits> {
        let st = rustix::fs::statx(
            file,
            "",
            AtFlags::EMPTY_PATH,
            StatxFlags::from_bits_retain(STATX_WRITE_ATOMIC),
        )
        .ok()?;
        let units = DeviceAtomicUnits {
            min: st.stx_atomic_write_unit_min,
            max: st.stx_atomic_write_unit_max,
        };
        (st.stx_mask & STATX_WRITE_ATOMIC != 0
            && units.min.is_power_of_two()
            && units.max >= units.min)
            .then_some(units)
    }

    /// Whether `unit` bytes is one size the kernel takes in one write.
    pub fn takes(&self, unit: u32) -> bool {
        unit.is_power_of_two() && (self.min..=self.max).contains(&unit)
    }

    /// The size offered when the configuration names none: [`DEFAULT_UNIT`]
    /// within the device's range.
    pub fn default_unit(&self) -> u32 {
        // The largest power of two within the maximum is at least the
        // minimum, itself a power of two.
        let largest = 1u32 << (31 - self.max.leading_zeros());
        DEFAULT_UNIT.min(largest).max(self.min)
    }
}

/// Writes `data` (one unit, at an offset aligned to its length, from
/// memory aligned for `O_DIRECT`) with `RWF_ATOMIC`, and `RWF_DSYNC` when
/// `durable`: the kernel writes all of it or none, also across a power
/// loss; a short write cannot happen (the kernel refuses instead).
pub fn write_untorn(file: &File, offset: u64, data: &[u8], durable: bool) -> io::Result<()> {
    let mut flags = ReadWriteFlags::from_bits_retain(RWF_ATOMIC);
    if durable {
        flags |= ReadWriteFlags::DSYNC;
    }
    loop {
        match rustix::io::pwritev2(file, &[IoSlice::new(data)], offset, flags) {
            Ok(n) if n == data.len() => return Ok(()),
            Ok(n) => {
                return Err(io::Error::other(format!(
                    "an atomic write of {} bytes at {offset} wrote {n}",
                    data.len()
                )))
            }
            Err(Errno::INTR) => {}
            // The errno itself, which says what the initiator is told: EIO
            // is a MEDIUM ERROR at the write's LBA, ENOSPC a thin unit out
            // of space (DATA PROTECT); a wrapped message would hide it.
            Err(e) => {
                tracing::warn!(bytes = data.len(), offset, error = %e, "pwritev2(RWF_ATOMIC) failed");
                return Err(e.into());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused atomic write keeps the kernel's errno, which the SCSI core
    /// maps to the sense the initiator gets (EIO: MEDIUM ERROR). A file on
    /// a file system without untorn writes, opened without `O_DIRECT`,
    /// refuses every one.
    #[test]
    fn a_refused_atomic_write_keeps_its_errno() {
        let f = tempfile::tempfile().unwrap();
        f.set_len(1 << 20).unwrap();
        let e = write_untorn(&f, 0, &[1; 4096], true).unwrap_err();
        assert!(e.raw_os_error().is_some(), "no errno in {e:?}");
    }

    #[test]
    fn the_default_unit_lies_in_the_devices_range() {
        let u = |min, max| DeviceAtomicUnits { min, max };
        assert_eq!(u(512, 1 << 20).default_unit(), 16 << 10);
        assert_eq!(u(512, 4096).default_unit(), 4096);
        assert_eq!(u(64 << 10, 1 << 20).default_unit(), 64 << 10);
        // A maximum that is no power of two: the largest power below it.
        assert_eq!(u(512, 12 << 10).default_unit(), 8 << 10);
        for (min, max) in [(512, 1 << 20), (512, 4096), (512, 12 << 10), (4096, 4096)] {
            let d = u(min, max);
            assert!(d.takes(d.default_unit()), "{d:?}");
        }
        assert!(!u(512, 1 << 20).takes(12 << 10));
        assert!(!u(4096, 1 << 20).takes(2048));
    }
}
