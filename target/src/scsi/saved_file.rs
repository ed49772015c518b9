//! State a logical unit or target keeps across restarts (persistent
//! reservations with APTPL, ALUA states set by SET TARGET PORT GROUPS),
//! written so that a crash never leaves half of it.

use std::io::Write as _;
use std::path::{Path, PathBuf};

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
