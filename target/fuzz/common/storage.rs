//! LUN 0 of the paired fuzz targets: RAM, a file or files striped RAID0,
//! with the data paths a daemon's `[[target.lun]]` would start on them
//! (included with `#[path]` beside `lun_files.rs`).

use std::sync::Arc;

use blockwire_target::backstore::{Backstore, RamBackstore};
use blockwire_target::datapath::Mode;
use blockwire_target::iscsi::catalog::DataPathPolicy;
use blockwire_target::iscsi::connection::fuzzing::DataPaths;
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
pub fn lun0(storage: &Storage, prefix: &str, bytes: u64) -> (Arc<dyn Backstore>, DataPaths) {
    let engine_reads =
        |n: u8| [None, Some(Mode::Synchronized), Some(Mode::Serial)][usize::from(n % 3)];
    let chunk = |n: u8| [4 << 10, 8 << 10, 64 << 10][usize::from(n % 3)];
    // New files each time: zeros, as a model starts.
    let (store, policy): (Arc<dyn Backstore>, _) = match *storage {
        Storage::Ram => return (Arc::new(RamBackstore::new(bytes)), None),
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
    (store, Some((policy, lun_files::io_engine().clone())))
}
