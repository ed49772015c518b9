//! State a logical unit or target keeps across restarts (persistent
//! reservations with APTPL, ALUA states set by SET TARGET PORT GROUPS),
//! written so that a crash never leaves half of it.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

/// What a saved-state file holds: Ok(None) when there is none (nothing was
/// saved), Err with the reason, for the log, when it cannot be read.
pub(crate) fn read_saved(path: &Path) -> Result<Option<String>, String> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("it cannot be read: {e}")),
    };
    let mut text = String::new();
    file.take(MAX_SAVED_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("it cannot be read: {e}"))?;
    if text.len() as u64 > MAX_SAVED_BYTES {
        return Err(format!(
            "it is larger than the {MAX_SAVED_BYTES} bytes any saved state takes"
        ));
    }
    Ok(Some(text))
}

/// Most bytes a saved-state file is read for: far more than 1024
/// registrations with the longest names take, so a larger file is damage,
/// not something to read into memory whole.
const MAX_SAVED_BYTES: u64 = 16 << 20;

/// Removes a saved-state file that no longer holds: one already gone is
/// fine, one that cannot be removed is said at warn level.
pub(crate) fn remove_saved(path: &Path) {
    if let Err(e) = remove_durably(path) {
        tracing::warn!(path = %path.display(), "cannot remove the saved state: {e}");
    }
}

/// Removes `path` (one already gone is fine) and syncs its directory, so
/// that after a power loss the file stays gone: a state that no longer
/// holds must not come back at the next start.
pub(crate) fn remove_durably(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => std::fs::File::open(parent_dir(path))?.sync_all(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The directory a saved-state file lives in.
fn parent_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Writes `text` to `path` atomically: a temporary file beside it, fsync,
/// rename over, fsync of the directory. A crash leaves the old or the new
/// state, never a torn file.
pub(crate) fn save_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = parent_dir(path);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A saved-state file is read whole only up to the bound: one past it is
    /// damage (a state file never grows that large), said as such, where it
    /// used to be read into memory whatever its size.
    #[test]
    fn a_saved_file_past_the_bound_is_refused_not_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let at_bound = "x".repeat(MAX_SAVED_BYTES as usize);
        std::fs::write(&path, &at_bound).unwrap();
        assert_eq!(
            read_saved(&path).unwrap().map(|t| t.len()),
            Some(at_bound.len())
        );
        std::fs::write(&path, format!("{at_bound}x")).unwrap();
        // A device endlessly giving bytes ends at the bound too.
        for path in [path.as_path(), Path::new("/dev/zero")] {
            match read_saved(path) {
                Err(e) => assert!(e.contains("larger than"), "{e}"),
                Ok(t) => panic!(
                    "{} bytes of {} read whole",
                    t.map_or(0, |t| t.len()),
                    path.display()
                ),
            }
        }
    }

    #[test]
    fn a_missing_saved_file_is_no_state_and_removing_it_is_fine() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        assert_eq!(read_saved(&path), Ok(None));
        save_atomically(&path, "saved\n").unwrap();
        assert_eq!(read_saved(&path), Ok(Some("saved\n".to_owned())));
        remove_durably(&path).unwrap();
        assert_eq!(read_saved(&path), Ok(None));
        remove_durably(&path).expect("removing a file already gone");
    }
}
