//! A file (or block device) backstore using positional reads and writes.

use super::Backstore;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A regular file or block device.
#[derive(Debug)]
pub struct FileBackstore {
    file: File,
    path: PathBuf,
    size: u64,
}

impl FileBackstore {
    /// Opens `path`, creating a regular file of `size` bytes if it does not
    /// exist, or growing it to `size` if it is shorter. With `size` None the
    /// existing length is used.
    pub fn open(path: &Path, size: Option<u64>, read_only: bool) -> io::Result<FileBackstore> {
        let file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .create(!read_only && size.is_some())
            .truncate(false)
            .open(path)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot open backstore {}: {e}", path.display()),
                )
            })?;
        let meta = file.metadata()?;
        let mut actual = if meta.is_file() {
            meta.len()
        } else {
            // Block devices report 0 in metadata; seek to the end instead.
            use std::io::Seek;
            (&file).seek(io::SeekFrom::End(0))?
        };
        if let Some(want) = size {
            if actual < want && meta.is_file() && !read_only {
                file.set_len(want)?;
                actual = want;
            }
            actual = actual.min(want);
        }
        if actual == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("backstore {} is empty: give it a size", path.display()),
            ));
        }
        Ok(FileBackstore {
            file,
            path: path.to_owned(),
            size: actual,
        })
    }
}

impl Backstore for FileBackstore {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.file.write_all_at(data, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn describe(&self) -> String {
        format!("file {} ({} MiB)", self.path.display(), self.size >> 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_grows_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lun.img");
        let s = FileBackstore::open(&path, Some(1 << 20), false).unwrap();
        assert_eq!(s.size(), 1 << 20);
        s.write_at(4096, b"blockwire").unwrap();
        s.flush().unwrap();
        let mut back = [0u8; 9];
        s.read_at(4096, &mut back).unwrap();
        assert_eq!(&back, b"blockwire");
        let ro = FileBackstore::open(&path, None, true).unwrap();
        assert_eq!(ro.size(), 1 << 20);
        assert!(ro.write_at(0, b"x").is_err());
    }
}
