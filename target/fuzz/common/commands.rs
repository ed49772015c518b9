//! The READs and WRITEs the paired fuzz targets run on a 1 MiB LUN 0 and
//! check against a model of it (included with `#[path]`; a target uses what
//! it needs of it).
#![allow(dead_code)]

use libfuzzer_sys::arbitrary::{self, Arbitrary};

pub const BLOCK: usize = 512;
/// LUN 0's size.
pub const LUN_BYTES: usize = 1 << 20;

#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct Io {
    pub write: bool,
    pub lba: u16,
    pub blocks: u16,
    pub seed: u8,
    /// For a READ: an Expected Data Transfer Length other than the CDB's
    /// (0: the same; odd: shorter by this many bytes; even: longer).
    pub edtl_off: u16,
    /// Whole 4 KiB units, as O_DIRECT engine paths take them.
    pub aligned: bool,
    /// Where a target that can cut the command's buffer cuts it (0: one
    /// piece).
    pub split: u16,
}

/// The bytes a WRITE of `io.seed` carries.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (usize::from(seed) * 131 + i * 7 + i / 509) as u8)
        .collect()
}

/// The block range of `io`, clamped to the LUN (and to 4 KiB units when
/// `aligned`).
pub fn blocks_of(io: &Io) -> std::ops::Range<u64> {
    let lun_blocks = (LUN_BYTES / BLOCK) as u64;
    let unit = if io.aligned { 4096 / BLOCK as u64 } else { 1 };
    let lba = u64::from(io.lba) % lun_blocks / unit * unit;
    let blocks = (1 + u64::from(io.blocks) % 600).div_ceil(unit) * unit;
    lba..lba + blocks.min(lun_blocks - lba)
}

/// The Expected Data Transfer Length of `io` whose CDB moves `len` bytes:
/// a WRITE's is its CDB's.
pub fn edtl(io: &Io, len: usize) -> usize {
    if io.write {
        return len;
    }
    let off = usize::from(io.edtl_off % 1024);
    match off {
        0 => len,
        _ if off % 2 == 1 => len - off.min(len - 1),
        _ => len + off,
    }
}

/// The first 8 commands of `batch` whose ranges do not overlap one taken
/// before: commands of one batch are in flight together, so the order the
/// target runs them in cannot matter to the model.
pub fn disjoint(batch: &[Io]) -> Vec<Io> {
    let mut taken: Vec<(std::ops::Range<u64>, Io)> = Vec::new();
    for io in batch.iter().take(8) {
        let r = blocks_of(io);
        if !taken
            .iter()
            .any(|(t, _)| t.start < r.end && r.start < t.end)
        {
            taken.push((r, *io));
        }
    }
    taken.into_iter().map(|(_, io)| io).collect()
}
