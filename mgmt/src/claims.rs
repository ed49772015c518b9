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

use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// Where a file is: its inode when it exists (hard links and symbolic
/// links meet there), and its absolute path with `.`, `..` and the links
/// of its directory resolved (a file a start will create meets there).
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileKey {
    inode: Option<(u64, u64)>,
    path: PathBuf,
}

impl FileKey {
    fn of(path: &Path) -> FileKey {
        let inode = std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()));
        let path = std::fs::canonicalize(path).unwrap_or_else(|_| {
            let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
            let lexical = lexically_normal(&absolute);
            match (lexical.parent(), lexical.file_name()) {
                (Some(dir), Some(name)) => std::fs::canonicalize(dir)
                    .map(|d| d.join(name))
                    .unwrap_or(lexical.clone()),
                _ => lexical,
            }
        });
        FileKey { inode, path }
    }

    fn same(&self, other: &FileKey) -> bool {
        self.path == other.path || (self.inode.is_some() && self.inode == other.inode)
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
}

impl FileUse {
    fn describe(self) -> &'static str {
        match self {
            FileUse::Data => "data file",
            FileUse::StripeMember => "striped member",
            FileUse::AtomicJournal => "atomic-write journal",
            FileUse::Reservations => "saved reservations",
        }
    }
}

/// A unit's hold on something, for the message that refuses a second one.
#[derive(Debug, Clone)]
struct Holder {
    /// "LUN 0 of iqn...".
    unit: String,
    /// The configuration line of the unit's definition.
    line: usize,
}

/// The files and identities the units defined so far hold.
#[derive(Debug, Default)]
pub struct Claims {
    files: Vec<(FileKey, FileUse, Holder)>,
    serials: Vec<(String, Holder)>,
    naa_ids: Vec<(u64, Holder)>,
}

impl Claims {
    /// Takes `path` for `unit` (defined on `line`), or says which unit
    /// holds it already and what to do.
    pub fn file(
        &mut self,
        unit: &str,
        line: usize,
        path: &Path,
        what: FileUse,
    ) -> Result<(), String> {
        let key = FileKey::of(path);
        if let Some((_, theirs, holder)) = self.files.iter().find(|(k, _, _)| k.same(&key)) {
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
            } else {
                (
                    "two logical units over one file keep separate reservations and caches, so \
                     neither fences nor sees the other's writes",
                    "give each LUN its own files (to reach one LUN through several portals, \
                     list the portal groups in its target instead)",
                )
            };
            return Err(format!(
                "{} would be the {} of {unit} and also the {} of {} (line {}): {why}; {fix}",
                path.display(),
                what.describe(),
                theirs.describe(),
                holder.unit,
                holder.line
            ));
        }
        self.files.push((
            key,
            what,
            Holder {
                unit: unit.to_owned(),
                line,
            },
        ));
        Ok(())
    }

    /// Takes the unit serial number `serial` and NAA identifier `naa_id`
    /// for `unit`, or says which unit has either already.
    pub fn identity(
        &mut self,
        unit: &str,
        line: usize,
        serial: &str,
        naa_id: u64,
    ) -> Result<(), String> {
        const WHY: &str = "hosts would take the two for paths to one disk (multipath merges \
                           devices by their identifiers, udev names them by serial)";
        if let Some((_, holder)) = self.naa_ids.iter().find(|(n, _)| *n == naa_id) {
            return Err(format!(
                "{unit} has the same identity (NAA {naa_id:016x}) as {} (line {}): {WHY}; \
                 give each LUN its own uuid (uuidgen), or none",
                holder.unit, holder.line
            ));
        }
        if let Some((_, holder)) = self
            .serials
            .iter()
            .find(|(s, _)| s.trim().eq_ignore_ascii_case(serial.trim()))
        {
            return Err(format!(
                "{unit} has the unit serial number {serial:?} of {} (line {}): {WHY}; \
                 give each LUN its own serial, or none",
                holder.unit, holder.line
            ));
        }
        let holder = Holder {
            unit: unit.to_owned(),
            line,
        };
        self.serials.push((serial.to_owned(), holder.clone()));
        self.naa_ids.push((naa_id, holder));
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
            c.file("LUN 0 of a", 3, &file, FileUse::Data).unwrap();
            let e = c
                .file("LUN 1 of a", 9, other, FileUse::AtomicJournal)
                .unwrap_err();
            assert!(e.contains("atomic-write journal of LUN 1 of a"), "{e}");
            assert!(e.contains("data file of LUN 0 of a (line 3)"), "{e}");
        }
        let mut c = Claims::default();
        c.file("LUN 0 of a", 3, &missing, FileUse::Data).unwrap();
        assert!(c
            .file("LUN 1 of a", 9, &missing_dotted, FileUse::Data)
            .is_err());
        c.file("LUN 2 of a", 12, &file, FileUse::Data).unwrap();
    }

    #[test]
    fn identities_are_held_once() {
        let mut c = Claims::default();
        c.identity("LUN 0 of a", 3, "abc", 7).unwrap();
        let e = c.identity("LUN 1 of a", 9, "def", 7).unwrap_err();
        assert!(
            e.contains("(NAA 0000000000000007) as LUN 0 of a (line 3)"),
            "{e}"
        );
        let e = c.identity("LUN 1 of a", 9, "ABC", 8).unwrap_err();
        assert!(e.contains("serial number \"ABC\" of LUN 0 of a"), "{e}");
        c.identity("LUN 1 of a", 9, "def", 8).unwrap();
    }
}
