//! What a dry run finds out about a new LUN's existing file or block
//! device by opening it as the change would (read and write, or read only)
//! and closing it at once: what access(2) and metadata cannot tell (a
//! device that is busy or has no medium, a security module's refusal) and
//! a block device's size. Nothing is created, grown or written. Missing
//! files, their directories and permissions are `check`'s.

use std::fs::OpenOptions;
use std::io::{ErrorKind, Seek, SeekFrom};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// Opens `path` as a LUN's backstore would open it (`read_only` or not):
/// `Ok(None)` if it does not exist (the change would create it) or is a
/// regular file, `Ok(Some(bytes))` for a block device of that size; the
/// error says why it would not open, in the words the change would use.
pub(super) fn existing_backstore(path: &Path, read_only: bool) -> Result<Option<u64>, String> {
    let cannot = |why: String| format!("cannot open backstore {}: {why}", path.display());
    // Looked at before the open, which for a FIFO would not return.
    if let Some(kind) = std::fs::metadata(path)
        .ok()
        .and_then(|m| blockwire_target::backstore::unusable_kind(&m.file_type()))
    {
        return Err(cannot(format!(
            "it is {kind}: a LUN is backed by a regular file or a block device"
        )));
    }
    let mut file = match OpenOptions::new().read(true).write(!read_only).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(cannot(e.to_string())),
    };
    let meta = file.metadata().map_err(|e| cannot(e.to_string()))?;
    if !meta.file_type().is_block_device() {
        return Ok(None);
    }
    // Block devices report 0 in metadata; their end is their size.
    let size = file
        .seek(SeekFrom::End(0))
        .map_err(|e| cannot(e.to_string()))?;
    Ok(Some(size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_existing_backstore_is_opened_as_the_change_would_and_left_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let present = dir.path().join("a.img");
        std::fs::write(&present, [7u8; 512]).unwrap();
        assert_eq!(existing_backstore(&present, false), Ok(None));
        assert_eq!(existing_backstore(&present, true), Ok(None));
        assert_eq!(std::fs::read(&present).unwrap(), [7u8; 512]);
        // Missing: the change would create it (check says whether it can).
        let fresh = dir.path().join("b.img");
        assert_eq!(existing_backstore(&fresh, false), Ok(None));
        assert!(!fresh.exists(), "the probe made the file");
        // A directory, or a character device, backs no LUN: named with why.
        // (A block device's size: mgmt/tests/control_socket.rs, over a
        // loop device.)
        for (path, kind) in [
            (dir.path(), "it is a directory"),
            (Path::new("/dev/zero"), "it is a character device"),
        ] {
            let e = existing_backstore(path, false).unwrap_err();
            assert!(
                e.starts_with("cannot open backstore") && e.contains(kind),
                "{e}"
            );
        }
    }
}
