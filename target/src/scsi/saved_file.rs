//! State a logical unit or target keeps across restarts (persistent
//! reservations with APTPL, ALUA states set by SET TARGET PORT GROUPS),
//! written so that a crash never leaves half of it.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// What a saved-state file holds: Ok(None) when there is none (nothing was
/// saved), Err with the reason, for the log, when it cannot be read.
pub(crate) fn read_saved(path: &Path) -> Result<Option<String>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("it cannot be read: {e}")),
    }
}

/// Removes a saved-state file that no longer holds: one already gone is
/// fine, one that cannot be removed is said at warn level.
pub(crate) fn remove_saved(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(path = %path.display(), "cannot remove the saved state: {e}"),
    }
}

/// Writes `text` to `path` atomically: a temporary file beside it, fsync,
/// rename over, fsync of the directory. A crash leaves the old or the new
/// state, never a torn file.
pub(crate) fn save_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}
