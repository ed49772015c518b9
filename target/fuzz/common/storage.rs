//! LUN 0 of the paired fuzz targets: RAM, a file or files striped RAID0,
//! with the data paths a daemon's `[[target.lun]]` would start on them, or
//! RAM or a file formatted with protection information (Type 1), which a
//! daemon gives no data paths: every READ then checks every block against
//! its tuple, on the connection's task or the core's threads (included
//! with `#[path]` beside `lun_files.rs`).

use std::sync::Arc;

use blockwire_target::backstore::{Backstore, RamBackstore};
use blockwire_target::datapath::Mode;
use blockwire_target::iscsi::catalog::DataPathPolicy;
use blockwire_target::iscsi::connection::fuzzing::DataPaths;
use blockwire_target::scsi::LuConfig;
use libfuzzer_sys::arbitrary::{self, Arbitrary};

use crate::lun_files;

/// LUN 0's storage and data paths.
#[derive(Arbitrary, Debug)]
pub enum Storage {
    Ram,
    File {
        /// O_DIRECT: the engine paths then take 4 KiB-aligned commands only.
        direct: bool,
        sendfile: bool,
        /// None, synchronized or serial engine READs.
        engine_reads: u8,
        double_buffered_writes: bool,
        chunk: u8,
    },
    /// Formatted with protection information: RAM with its tuples in RAM,
    /// or a file through the page cache with its tuples in a second file.
    Protected { file: bool },
    /// RAID0 over 2 to 4 files, read by the engine one stream per member
    /// (the only data path a striped LUN has).
    Striped {
        members: u8,
        stripe: u8,
        direct: bool,
        engine_reads: u8,
        chunk: u8,
    },
}

/// LUN 0 as `storage` asks: a new zeroed store of `bytes` (its files in
/// the scratch directories named by `prefix`) and the data paths to start
/// on it.
pub fn lun0(storage: &Storage, prefix: &str, bytes: u64) -> (LuConfig, DataPaths) {
    let engine_reads =
        |n: u8| [None, Some(Mode::Synchronized), Some(Mode::Serial)][usize::from(n % 3)];
    let chunk = |n: u8| [4 << 10, 8 << 10, 64 << 10][usize::from(n % 3)];
    // New files each time: zeros, as a model starts.
    let (store, policy): (Arc<dyn Backstore>, _) = match *storage {
        Storage::Ram => return (LuConfig::new(Arc::new(RamBackstore::new(bytes))), None),
        Storage::Protected { file } => {
            // 8 bytes of tuples per 512-byte block; zeros stored are
            // tuples of FFh, never checked, as a new tuples file holds.
            let tuple_bytes = bytes / 512 * 8;
            let (data, tuples): (Arc<dyn Backstore>, Arc<dyn Backstore>) = if file {
                (
                    Arc::new(lun_files::zeroed_file_lun(prefix, "lun0.img", false, bytes)),
                    Arc::new(lun_files::zeroed_file_lun(
                        prefix,
                        "lun0.img.protection",
                        false,
                        tuple_bytes,
                    )),
                )
            } else {
                (
                    Arc::new(RamBackstore::new(bytes)),
                    Arc::new(RamBackstore::new(tuple_bytes)),
                )
            };
            let mut unit = LuConfig::new(data);
            unit.pi_store = Some(tuples);
            return (unit, None);
        }
        Storage::File {
            direct,
            sendfile,
            engine_reads: reads,
            double_buffered_writes,
            chunk: c,
        } => (
            Arc::new(lun_files::zeroed_file_lun(
                prefix, "lun0.img", direct, bytes,
            )),
            DataPathPolicy {
                engine_reads: engine_reads(reads),
                sendfile,
                double_buffered_writes,
                chunk: chunk(c),
            },
        ),
        Storage::Striped {
            members,
            stripe,
            direct,
            engine_reads: reads,
            chunk: c,
        } => {
            // O_DIRECT stripes are whole 4 KiB units.
            let stripes: &[u64] = if direct {
                &[4096, 8192, 65536]
            } else {
                &[512, 4096, 8192, 65536]
            };
            let stripe = stripes[usize::from(stripe) % stripes.len()];
            let members = 2 + usize::from(members % 3);
            (
                Arc::new(lun_files::zeroed_striped_lun(
                    prefix, "lun0", members, stripe, direct, bytes,
                )),
                DataPathPolicy {
                    engine_reads: engine_reads(reads),
                    sendfile: false,
                    double_buffered_writes: false,
                    chunk: chunk(c),
                },
            )
        }
    };
    (
        LuConfig::new(store),
        Some((policy, lun_files::io_engine().clone())),
    )
}
