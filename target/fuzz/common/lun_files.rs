//! LUN files and the I/O engine of one fuzzing process, shared by the fuzz
//! targets of this crate that keep LUNs in files (included with `#[path]`;
//! a target uses what it needs of it).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use blockwire_target::backstore::{FileBackstore, FileMode, StripedBackstore};
use blockwire_target::datapath::{open_engine, BufferPool, Engine, EnginePref};

/// The scratch directories of this process, named `PREFIX` and the process
/// id: one on a file system that takes O_DIRECT (the temporary directory)
/// for `direct`, else one in memory when there is one (/dev/shm).
/// libFuzzer ends the process without unwinding, so the directories of
/// processes gone are removed here, on first use.
pub fn scratch(prefix: &str, direct: bool) -> &'static Path {
    static DIRS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    let (disk, memory) = DIRS.get_or_init(|| {
        let shm = Path::new("/dev/shm");
        let bases = [std::env::temp_dir(), shm.to_path_buf()];
        for base in &bases {
            for entry in std::fs::read_dir(base).into_iter().flatten().flatten() {
                let name = entry.file_name();
                let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
                    continue;
                };
                if !Path::new("/proc").join(pid).exists() {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        let mine = format!("{prefix}{}", std::process::id());
        let disk = bases[0].join(&mine);
        let memory = if shm.is_dir() {
            shm.join(&mine)
        } else {
            disk.clone()
        };
        std::fs::create_dir_all(&disk).expect("scratch directory");
        std::fs::create_dir_all(&memory).expect("scratch directory");
        (disk, memory)
    });
    if direct {
        disk
    } else {
        memory
    }
}

/// A new file LUN of `bytes` zeros named `name` in this process's scratch
/// directory (see [`scratch`]), through the page cache or O_DIRECT.
pub fn zeroed_file_lun(prefix: &str, name: &str, direct: bool, bytes: u64) -> FileBackstore {
    let path = scratch(prefix, direct).join(name);
    let _ = std::fs::remove_file(&path);
    FileBackstore::open_with(&path, Some(bytes), false, file_mode(direct)).expect("the LUN file")
}

/// A new RAID0 LUN of `bytes` zeros over `members` files (named `name`
/// and the member's number) in stripes of `stripe` bytes.
pub fn zeroed_striped_lun(
    prefix: &str,
    name: &str,
    members: usize,
    stripe: u64,
    direct: bool,
    bytes: u64,
) -> StripedBackstore {
    let paths: Vec<PathBuf> = (0..members)
        .map(|i| scratch(prefix, direct).join(format!("{name}.{i}")))
        .collect();
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
    StripedBackstore::open(&paths, stripe, Some(bytes), false, file_mode(direct))
        .expect("the striped LUN")
}

/// O_DIRECT or through the page cache.
pub fn file_mode(direct: bool) -> FileMode {
    if direct {
        FileMode::Direct
    } else {
        FileMode::Cached
    }
}

/// The I/O engine of the process (io_uring where the kernel has it), as a
/// daemon has one for all its LUNs.
pub fn io_engine() -> &'static Arc<dyn Engine> {
    static ENGINE: OnceLock<Arc<dyn Engine>> = OnceLock::new();
    ENGINE.get_or_init(|| {
        open_engine(BufferPool::with_defaults(), EnginePref::Auto)
            .expect("I/O engine")
            .0
    })
}
