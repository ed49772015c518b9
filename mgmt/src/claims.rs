//! What each logical unit of a configuration must hold alone: the files
//! under it (its data, striped members, atomic-write journal, saved
//! persistent reservations) and the identity hosts know it by (VPD 80h
//! unit serial number, VPD 83h NAA designator).
//!
//! Two units over one file are two views of one medium with separate
//! reservations, range locks, caches and journals: a reservation taken
//! through one does not fence writes through the other, and one unit's
//! journal replay or reservation file overwrites the other's. Two units
//! with one identity are worse: multipath (SPC-4 device identification)
//! takes them for two paths to one disk and spreads one file system's
//! writes over both. So a configuration that names a file or an identity
//! twice is refused, naming both users.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// Where a file is. A file that exists is its inode: every spelling of its path, hard links
/// and symbolic links meet there, and a stat is all it costs (the configuration is checked
/// whole at every start and live change, so with thousands of file LUNs a path resolution
/// per file would dominate). A file a start will create is its absolute path with `.`, `..`
/// and the links of its directory resolved; it cannot be one of the files that exist.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FileKey(Key);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Inode { dev: u64, ino: u64 },
    Path(PathBuf),
}

impl FileKey {
    /// Whether the file existed when its key was taken: a key of a file
    /// yet to be created names a path, which the file, once there, no
    /// longer meets (it is an inode then).
    fn existed(&self) -> bool {
        matches!(self.0, Key::Inode { .. })
    }

    /// Where `path` is now.
    pub fn of(path: &Path) -> FileKey {
        let inode = |p: &Path| {
            std::fs::metadata(p).ok().map(|m| {
                FileKey(Key::Inode {
                    dev: m.dev(),
                    ino: m.ino(),
                })
            })
        };
        if let Some(key) = inode(path) {
            return key;
        }
        let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let lexical = lexically_normal(&absolute);
        let resolved = match (lexical.parent(), lexical.file_name()) {
            (Some(dir), Some(name)) => std::fs::canonicalize(dir)
                .map(|d| d.join(name))
                .unwrap_or(lexical.clone()),
            _ => lexical,
        };
        // `dir/missing/../disk.img` does not resolve, but names `dir/disk.img` as written.
        inode(&resolved).unwrap_or(FileKey(Key::Path(resolved)))
    }
}

/// The keys of the files each unit held open when a check last took them
/// (its data or striped members and its atomic-write journal), by
/// lower-case target name and LUN.
///
/// A live change checks the whole configuration, and with thousands of
/// file LUNs a look at each of their files would be most of its cost. A
/// unit the change keeps serving holds the same files open as when it was
/// checked, so what its paths name now is not what it holds: its keys are
/// taken from here (a file replaced under its path since is another file,
/// met by its own key if another unit names it). Saved reservations are
/// not held open and are replaced at each save: their key is taken afresh.
#[derive(Debug, Default)]
pub struct KnownFiles(HashMap<(String, u16), Vec<FileKey>>);

impl KnownFiles {
    /// The keys of the files of LUN `id` of `target` (lower case), if a
    /// check took them.
    pub fn of(&self, target: &str, id: u16) -> Option<&[FileKey]> {
        self.0.get(&(target.to_owned(), id)).map(Vec::as_slice)
    }

    /// Records `keys` for LUN `id` of `target` (lower case), unless one of
    /// them names a file that did not exist yet: the unit's build created
    /// it, and only a look at it now says where it is.
    pub fn insert_existing(&mut self, target: String, id: u16, keys: Vec<FileKey>) {
        if keys.iter().all(FileKey::existed) {
            self.0.insert((target, id), keys);
        }
    }
}

/// `path` with `.` dropped and `..` taking away the component before it.
fn lexically_normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// What a unit holds a file for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileUse {
    /// A file LUN's data.
    Data,
    /// One member of a striped LUN.
    StripeMember,
    /// The write-ahead journal of a LUN's atomic writes.
    AtomicJournal,
    /// The saved persistent reservations (APTPL) of a LUN.
    Reservations,
    /// The protection information (8-byte tuples per block) of a file LUN.
    ProtectionInformation,
    /// The ALUA states initiators set on a target (SET TARGET PORT GROUPS).
    AluaStates,
}

impl FileUse {
    fn describe(self) -> &'static str {
        match self {
            FileUse::Data => "data file",
            FileUse::StripeMember => "striped member",
            FileUse::AtomicJournal => "atomic-write journal",
            FileUse::Reservations => "saved reservations",
            FileUse::ProtectionInformation => "protection information file",
            FileUse::AluaStates => "saved ALUA states",
        }
    }
}

/// A unit's hold on something, for the message that refuses a second one.
#[derive(Debug, Clone)]
struct Holder {
    /// "LUN 0 of iqn...".
    unit: String,
    /// The configuration line of the unit's definition; None when the text
    /// checked is no file a reader has.
    line: Option<usize>,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            None => write!(f, "{}", self.unit),
            Some(line) => write!(f, "{} (line {line})", self.unit),
        }
    }
}

/// The files and identities the units defined so far hold, each looked up by hash: a
/// configuration is checked whole at every start and live change, so with thousands of
/// LUNs a scan of the earlier units for each unit would cost the square of their number.
#[derive(Debug, Default)]
pub struct Claims {
    files: HashMap<FileKey, (FileUse, Holder)>,
    /// By the serial as hosts compare it: leading and trailing spaces dropped, ASCII
    /// case ignored.
    serials: HashMap<String, Holder>,
    naa_ids: HashMap<u64, Holder>,
}

impl Claims {
    /// Takes `path` for `unit` (defined on `line`, if the reader has the text), or says which unit
    /// holds it already and what to do.
    pub fn file(
        &mut self,
        unit: &str,
        line: Option<usize>,
        path: &Path,
        what: FileUse,
    ) -> Result<(), String> {
        self.file_at(unit, line, path, what, FileKey::of(path))
    }

    /// [`Self::file`] for a file whose key was taken already (see
    /// [`KnownFiles`]).
    pub fn file_at(
        &mut self,
        unit: &str,
        line: Option<usize>,
        path: &Path,
        what: FileUse,
        key: FileKey,
    ) -> Result<(), String> {
        if let Some((theirs, holder)) = self.files.get(&key) {
            if holder.unit == unit {
                return Err(format!(
                    "{} is named twice for {unit}, as its {} and as its {}: every member, \
                     journal and data file needs its own file",
                    path.display(),
                    theirs.describe(),
                    what.describe()
                ));
            }
            let (why, fix) = if what == FileUse::Reservations {
                (
                    "each LUN's reservations would overwrite the other's, and a restart would \
                     restore one LUN's reservations on the other",
                    "the file is named after the target, and these names differ only in \
                     characters a file name cannot hold: rename one of the targets",
                )
            } else if what == FileUse::AluaStates {
                (
                    "each target's ALUA states set by SET TARGET PORT GROUPS would overwrite the \
                     other's, and a restart would restore one target's states on the other",
                    "the file is named after the target, and these names differ only in \
                     characters a file name cannot hold: rename one of the targets",
                )
            } else if FileUse::ProtectionInformation == what
                || FileUse::ProtectionInformation == *theirs
            {
                (
                    "one LUN's protection information tuples would overwrite the other's blocks \
                     or tuples",
                    "give each protected LUN its own protection_file",
                )
            } else {
                (
                    "two logical units over one file keep separate reservations and caches, so \
                     neither fences nor sees the other's writes",
                    "give each LUN its own files (to reach one LUN through several portals, \
                     list the portal groups in its target instead)",
                )
            };
            return Err(format!(
                "{} would be the {} of {unit} and also the {} of {holder}: {why}; {fix}",
                path.display(),
                what.describe(),
                theirs.describe(),
            ));
        }
        let holder = Holder {
            unit: unit.to_owned(),
            line,
        };
        self.files.insert(key, (what, holder));
        Ok(())
    }

    /// Takes the unit serial number `serial` and NAA identifier `naa_id`
    /// for `unit`, or says which unit has either already.
    pub fn identity(
        &mut self,
        unit: &str,
        line: Option<usize>,
        serial: &str,
        naa_id: u64,
    ) -> Result<(), String> {
        const WHY: &str = "hosts would take the two for paths to one disk (multipath merges \
                           devices by their identifiers, udev names them by serial)";
        if let Some(holder) = self.naa_ids.get(&naa_id) {
            return Err(format!(
                "{unit} has the same identity (NAA {naa_id:016x}) as {holder}: {WHY}; \
                 give each LUN its own uuid (uuidgen), or none"
            ));
        }
        let serial_key = serial.trim().to_ascii_lowercase();
        if let Some(holder) = self.serials.get(&serial_key) {
            return Err(format!(
                "{unit} has the unit serial number {serial:?} of {holder}: {WHY}; \
                 give each LUN its own serial, or none"
            ));
        }
        let holder = Holder {
            unit: unit.to_owned(),
            line,
        };
        self.serials.insert(serial_key, holder.clone());
        self.naa_ids.insert(naa_id, holder);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_file_meets_itself_by_any_spelling_and_link() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("disk.img");
        std::fs::write(&file, b"x").unwrap();
        let hard = dir.path().join("hard.img");
        std::fs::hard_link(&file, &hard).unwrap();
        let soft = dir.path().join("soft.img");
        std::os::unix::fs::symlink(&file, &soft).unwrap();
        let dotted = dir.path().join("sub/../disk.img");
        let missing = dir.path().join("new.img");
        let missing_dotted = dir.path().join("./new.img");

        for other in [&file, &hard, &soft, &dotted] {
            let mut c = Claims::default();
            c.file("LUN 0 of a", Some(3), &file, FileUse::Data).unwrap();
            let e = c
                .file("LUN 1 of a", Some(9), other, FileUse::AtomicJournal)
                .unwrap_err();
            assert!(e.contains("atomic-write journal of LUN 1 of a"), "{e}");
            assert!(e.contains("data file of LUN 0 of a (line 3)"), "{e}");
        }
        let mut c = Claims::default();
        c.file("LUN 0 of a", Some(3), &missing, FileUse::Data)
            .unwrap();
        assert!(c
            .file("LUN 1 of a", Some(9), &missing_dotted, FileUse::Data)
            .is_err());
        c.file("LUN 2 of a", Some(12), &file, FileUse::Data)
            .unwrap();
    }

    #[test]
    fn identities_are_held_once() {
        let mut c = Claims::default();
        c.identity("LUN 0 of a", Some(3), "abc", 7).unwrap();
        let e = c.identity("LUN 1 of a", Some(9), "def", 7).unwrap_err();
        assert!(
            e.contains("(NAA 0000000000000007) as LUN 0 of a (line 3)"),
            "{e}"
        );
        let e = c.identity("LUN 1 of a", Some(9), "ABC", 8).unwrap_err();
        assert!(e.contains("serial number \"ABC\" of LUN 0 of a"), "{e}");
        // Hosts compare serials without their padding (VPD 80h pads with spaces).
        assert!(c.identity("LUN 1 of a", Some(9), " Abc  ", 8).is_err());
        c.identity("LUN 1 of a", Some(9), "def", 8).unwrap();
    }
}
