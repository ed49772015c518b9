//! A file (or block device) backstore.
//!
//! Two modes:
//! - **cached**: positional reads and writes through the page cache
//!   (server read-ahead, write-back); `flush` is `fdatasync`.
//! - **direct**: `O_DIRECT`, no page cache on the target. Every transfer
//!   goes through a 4 KiB-aligned bounce buffer (the SCSI core's buffers
//!   have no alignment guarantee); a write that does not cover whole 4 KiB
//!   units reads the partial units first (read-modify-write) while holding
//!   the store's RMW lock exclusively, so no aligned write can land in
//!   between. If the filesystem refuses `O_DIRECT` (tmpfs on older kernels,
//!   some FUSE filesystems) the store falls back to cached mode and says so
//!   in [`FileBackstore::fallback_reason`] and in the logs.
//!
//! In both modes a durable write (FUA, or WCE off) is `pwritev2` with
//! `RWF_DSYNC` (per-write `O_DSYNC`: only this write's data and the metadata
//! needed to read it back are synced), falling back to write + `fdatasync`
//! where the kernel lacks it. UNMAP punches holes with
//! `fallocate(PUNCH_HOLE | KEEP_SIZE)` (the range then reads as zeros, so
//! LBPRZ=1 is truthful), and the allocation map comes from
//! `SEEK_DATA`/`SEEK_HOLE`. Where the filesystem cannot punch holes, zeros
//! are written instead (still LBPRZ-truthful).

use super::device_atomic::{self, DeviceAtomicUnits};
use super::journal::Journal;
use super::{Backstore, Extent};
use rustix::fs::{FallocateFlags, SeekFrom};
use rustix::io::{Errno, ReadWriteFlags};
use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tracing::{debug, warn};

/// Alignment of `O_DIRECT` transfers: offsets, lengths and memory. 4 KiB
/// satisfies every device with logical blocks up to 4 KiB.
pub const DIRECT_ALIGN: u64 = 4096;

/// Largest piece one bounce-buffer transfer moves.
const BOUNCE_CHUNK: usize = 1 << 20;

/// How a file backstore does its I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileMode {
    /// Through the page cache.
    Cached,
    /// `O_DIRECT`, bypassing the page cache.
    Direct,
}

#[cfg(test)]
thread_local! {
    /// Syncs of the backing file by this thread that fail (EIO), as the
    /// kernel fails one after a lost write-back: to test what the store
    /// says after.
    static FAILING_SYNCS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A regular file or block device.
#[derive(Debug)]
pub struct FileBackstore {
    file: File,
    path: PathBuf,
    /// Capacity in bytes; only ever grows while the store is open.
    size: AtomicU64,
    mode: FileMode,
    fallback: Option<String>,
    regular: bool,
    /// Direct mode: aligned transfers hold it shared, read-modify-write
    /// exclusively.
    rmw: RwLock<()>,
    /// `fallocate(PUNCH_HOLE)` still believed to work.
    can_punch: AtomicBool,
    /// `fallocate(ZERO_RANGE)` still believed to work.
    can_zero_range: AtomicBool,
    /// `pwritev2(RWF_DSYNC)` still believed to work.
    can_dsync: AtomicBool,
    /// A sync of the file failed: cached writes acknowledged before it may
    /// be lost, and Linux reports a write-back error to one sync only (a
    /// later `fdatasync` succeeds without them), so every flush fails from
    /// then on rather than tell an initiator its data is safe.
    writeback_lost: AtomicBool,
    /// The file lives in tmpfs, which is memory: a cached read of it never
    /// waits for a device.
    tmpfs: bool,
    /// `preadv2(RWF_NOWAIT)` still believed to work (see
    /// [`Backstore::read_at_without_waiting`]).
    can_nowait: AtomicBool,
    /// The write-ahead journal that makes WRITE ATOMIC whole-or-nothing
    /// (see [`super::journal`]); none: no atomic writes.
    journal: Option<Arc<Journal>>,
    /// The untorn writes the kernel offers for the file (direct mode
    /// only: `RWF_ATOMIC` needs `O_DIRECT`; see [`super::device_atomic`]).
    device_atomic: Option<DeviceAtomicUnits>,
    /// The one atomic write size offered by the kernel's untorn writes,
    /// when WRITE ATOMIC goes that way instead of through a journal.
    device_atomic_unit: Option<u32>,
    /// The run of data [`Backstore::allocation`] last found (see
    /// [`KnownData`]).
    known_data: Mutex<KnownData>,
    /// Held by the one allocation query that is seeking, so that queries
    /// arriving together (QEMU asks GET LBA STATUS before its first reads,
    /// one per command in flight) wait for that walk's run instead of each
    /// walking the file themselves.
    walking: Mutex<()>,
    /// `SEEK_DATA` calls made, for the tests of [`Self::walking`].
    #[cfg(test)]
    data_seeks: AtomicU64,
}

/// A byte range the file was last seen to hold data throughout (`SEEK_DATA`
/// then `SEEK_HOLE`), so that the next allocation query inside it needs no
/// system call. `SEEK_HOLE` finds the next hole wherever it is: in a fully
/// written file that is the end, and on tmpfs the search walks every page
/// up to it (about 4 ms for 1 GiB). QEMU asks GET LBA STATUS before reads,
/// so each of those paid the walk.
///
/// Writes only turn holes into data, so they leave the run true. A
/// deallocation (UNMAP's hole punch, WRITE SAME's zero range) forgets it
/// and counts a generation: a query that began before a deallocation ended
/// does not record what it saw.
#[derive(Debug, Default)]
struct KnownData {
    run: Option<std::ops::Range<u64>>,
    generation: u64,
}

thread_local! {
    /// Per-thread bounce buffer for direct I/O (the SCSI core runs on a
    /// blocking pool, so this is a handful of megabytes in all).
    static BOUNCE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on an aligned, zeroed-or-stale buffer of `len` bytes.
fn with_bounce<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    BOUNCE.with(|cell| {
        let mut v = cell.borrow_mut();
        let need = len + DIRECT_ALIGN as usize;
        if v.len() < need {
            v.resize(need, 0);
        }
        let start = v.as_ptr().align_offset(DIRECT_ALIGN as usize);
        f(&mut v[start..start + len])
    })
}

/// statfs(2)'s f_type of tmpfs (linux/magic.h).
const TMPFS_MAGIC: u64 = 0x0102_1994;

/// Whether `fd` (a file or a directory) lives in tmpfs, which is memory: a
/// read of it never waits for a device. False when the file system cannot
/// be asked.
pub fn lives_in_memory(fd: impl std::os::fd::AsFd) -> bool {
    rustix::fs::fstatfs(fd)
        .map(|s| s.f_type as u64 == TMPFS_MAGIC)
        .unwrap_or(false)
}

fn is_unsupported(e: &Errno) -> bool {
    *e == Errno::OPNOTSUPP || *e == Errno::NOSYS || *e == Errno::INVAL
}

/// What a file of type `ft` is when it cannot back a LUN (None: a regular
/// file or a block device, which can). A FIFO opened read-only waits for a
/// writer, holding whoever opened it (a live change, and every change
/// after it, behind its lock); a socket or a character device has no
/// blocks to serve.
pub fn unusable_kind(ft: &std::fs::FileType) -> Option<&'static str> {
    if ft.is_file() || ft.is_block_device() {
        None
    } else if ft.is_dir() {
        Some("a directory")
    } else if ft.is_fifo() {
        Some("a FIFO")
    } else if ft.is_socket() {
        Some("a socket")
    } else if ft.is_char_device() {
        Some("a character device")
    } else {
        Some("neither a regular file nor a block device")
    }
}

impl FileBackstore {
    /// Opens `path` in cached mode; see [`FileBackstore::open_with`].
    pub fn open(path: &Path, size: Option<u64>, read_only: bool) -> io::Result<FileBackstore> {
        Self::open_with(path, size, read_only, FileMode::Cached)
    }

    /// Opens `path`, creating a regular file of `size` bytes if it does not
    /// exist, or growing it to `size` if it is shorter. With `size` None the
    /// existing length is used. `Direct` mode needs a size that is a
    /// multiple of 4 KiB; when the filesystem refuses `O_DIRECT` the store
    /// runs cached and [`FileBackstore::fallback_reason`] says why.
    pub fn open_with(
        path: &Path,
        size: Option<u64>,
        read_only: bool,
        mode: FileMode,
    ) -> io::Result<FileBackstore> {
        let annotate = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("cannot open backstore {}: {e}", path.display()),
            )
        };
        // Looked at before the open, which for a FIFO would not return.
        if let Some(kind) = std::fs::metadata(path)
            .ok()
            .and_then(|m| unusable_kind(&m.file_type()))
        {
            return Err(annotate(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("it is {kind}: a LUN is backed by a regular file or a block device"),
            )));
        }
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.read(true)
                .write(!read_only)
                .create(!read_only && size.is_some())
                .truncate(false);
            if direct {
                o.custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32);
            }
            o.open(path)
        };
        let mut fallback = None;
        let mut file = match (mode, open(mode == FileMode::Direct)) {
            (_, Ok(f)) => f,
            (FileMode::Direct, Err(e)) if e.raw_os_error() == Some(Errno::INVAL.raw_os_error()) => {
                fallback = Some(format!("the filesystem refuses O_DIRECT ({e})"));
                open(false).map_err(annotate)?
            }
            (_, Err(e)) => return Err(annotate(e)),
        };
        let meta = file.metadata()?;
        let regular = meta.is_file();
        let mut actual = if regular {
            meta.len()
        } else if meta.file_type().is_block_device() {
            // Block devices report 0 in metadata; seek to the end instead.
            rustix::fs::seek(&file, SeekFrom::End(0))?
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "backstore {} is neither a regular file nor a block device",
                    path.display()
                ),
            ));
        };
        if let Some(want) = size {
            if actual < want && regular && !read_only {
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
        if mode == FileMode::Direct && fallback.is_none() {
            if actual % DIRECT_ALIGN != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "backstore {}: direct mode needs a size that is a multiple of {DIRECT_ALIGN} bytes ({actual} is not); use mode = \"cached\" or change the size",
                        path.display()
                    ),
                ));
            }
            // Some filesystems accept the flag at open and refuse the I/O.
            let probe = with_bounce(DIRECT_ALIGN as usize, |b| file.read_at(b, 0));
            if let Err(e) = probe {
                if e.raw_os_error() == Some(Errno::INVAL.raw_os_error()) {
                    fallback = Some(format!("the filesystem refuses O_DIRECT reads ({e})"));
                    file = open(false).map_err(annotate)?;
                } else {
                    return Err(annotate(e));
                }
            }
        }
        let effective = if fallback.is_some() {
            FileMode::Cached
        } else {
            mode
        };
        if let Some(why) = &fallback {
            warn!(path = %path.display(), reason = %why, "direct mode unavailable: running this LUN in cached mode (page cache); put the file on a filesystem that supports O_DIRECT (ext4, xfs, a block device) for direct I/O");
        }
        let tmpfs = lives_in_memory(&file);
        let device_atomic = (effective == FileMode::Direct && !read_only)
            .then(|| DeviceAtomicUnits::probe(&file))
            .flatten();
        Ok(FileBackstore {
            file,
            path: path.to_owned(),
            size: AtomicU64::new(actual),
            mode: effective,
            fallback,
            regular,
            rmw: RwLock::new(()),
            can_punch: AtomicBool::new(true),
            can_zero_range: AtomicBool::new(true),
            can_dsync: AtomicBool::new(true),
            writeback_lost: AtomicBool::new(false),
            tmpfs,
            can_nowait: AtomicBool::new(true),
            journal: None,
            device_atomic,
            device_atomic_unit: None,
            known_data: Mutex::new(KnownData::default()),
            walking: Mutex::new(()),
            #[cfg(test)]
            data_seeks: AtomicU64::new(0),
        })
    }

    /// Records `run` as data if no deallocation ended since `generation`.
    fn remember_known_data(&self, run: std::ops::Range<u64>, generation: u64) {
        let mut k = self.known_data.lock().unwrap_or_else(|e| e.into_inner());
        if k.generation == generation {
            // Two runs that meet are one run of data (no deallocation
            // came between the walks that found them).
            k.run = Some(match k.run.take() {
                Some(old) if old.start <= run.end && run.start <= old.end => {
                    old.start.min(run.start)..old.end.max(run.end)
                }
                _ => run,
            });
        }
    }

    /// The run of data known now, and the generation it belongs to.
    fn known_data_now(&self) -> (Option<std::ops::Range<u64>>, u64) {
        let k = self.known_data.lock().unwrap_or_else(|e| e.into_inner());
        (k.run.clone(), k.generation)
    }

    /// A deallocation ended: what [`KnownData`] knew may be a hole now.
    fn forget_known_data(&self) {
        let mut k = self.known_data.lock().unwrap_or_else(|e| e.into_inner());
        k.run = None;
        k.generation += 1;
    }

    /// Where the atomic-write journal of the backing file `path` lives
    /// unless configured otherwise: `<path>.atomic-journal`.
    pub fn default_journal_path(path: &Path) -> PathBuf {
        let mut p = path.as_os_str().to_owned();
        p.push(".atomic-journal");
        PathBuf::from(p)
    }

    /// Turns WRITE ATOMIC on with the write-ahead journal at `journal`
    /// (created when missing; see [`super::journal`]). Every atomic write
    /// the journal holds unfinished, from before a crash, is written in
    /// place first, so the store opens with each one wholly old or wholly
    /// new. Returns the store and how many writes were replayed.
    pub fn with_atomic_journal(mut self, journal: &Path) -> io::Result<(FileBackstore, usize)> {
        let (j, replayed) = Journal::open_shared(
            journal,
            self.size(),
            |offset, data| self.write(offset, data, false),
            || self.sync_data(),
        )?;
        self.journal = Some(j);
        Ok((self, replayed))
    }

    /// The untorn writes the kernel offers for this store's file, if any
    /// (direct mode, writable; see [`super::device_atomic`]).
    pub fn device_atomic_units(&self) -> Option<DeviceAtomicUnits> {
        self.device_atomic
    }

    /// Turns WRITE ATOMIC on through the kernel's untorn writes, of exactly
    /// `unit` bytes at offsets aligned to it (see [`super::device_atomic`]).
    /// Refused where the kernel offers none, or not that size.
    pub fn with_device_atomic_writes(mut self, unit: u32) -> io::Result<FileBackstore> {
        let refuse = |why: String| {
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{}: {why}", self.path.display()),
            ))
        };
        match self.device_atomic {
            None => {
                return refuse(
                    "the kernel offers no untorn writes for it (statx STATX_WRITE_ATOMIC; they need mode = \"direct\" and a device with atomic write units)".into(),
                )
            }
            Some(d) if !d.takes(unit) => {
                return refuse(format!(
                    "the kernel takes untorn writes of a power of two from {} to {} bytes, not {unit}",
                    d.min, d.max
                ))
            }
            Some(_) => {}
        }
        self.device_atomic_unit = Some(unit);
        Ok(self)
    }

    /// The atomic-write journal, if WRITE ATOMIC is on.
    pub fn atomic_journal(&self) -> Option<&Path> {
        self.journal.as_deref().map(Journal::path)
    }

    /// The mode the store really runs in.
    pub fn mode(&self) -> FileMode {
        self.mode
    }

    /// Why direct mode was asked for but cached mode is used, if it was.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size() => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "range {offset}+{len} beyond backstore {} of {} bytes",
                    self.path.display(),
                    self.size()
                ),
            )),
        }
    }

    /// `pwrite` of all of `data`, with `RWF_DSYNC` when `durable` (then
    /// the data is on stable storage when this returns).
    fn pwrite_all(&self, mut offset: u64, mut data: &[u8], durable: bool) -> io::Result<()> {
        if !durable {
            return self.file.write_all_at(data, offset);
        }
        if self.can_dsync.load(Ordering::Relaxed) {
            while !data.is_empty() {
                match rustix::io::pwritev2(
                    &self.file,
                    &[IoSlice::new(data)],
                    offset,
                    ReadWriteFlags::DSYNC,
                ) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => {
                        data = &data[n..];
                        offset += n as u64;
                    }
                    Err(Errno::INTR) => {}
                    Err(e) if is_unsupported(&e) => {
                        self.can_dsync.store(false, Ordering::Relaxed);
                        break;
                    }
                    // A DSYNC write reports write-back errors (EIO) of the
                    // whole file, not only of its own range; its own want
                    // of space (ENOSPC, EDQUOT) loses nothing written before.
                    Err(Errno::IO) => return Err(self.sync_failed(Errno::IO.into())),
                    Err(e) => return Err(e.into()),
                }
            }
            if data.is_empty() {
                return Ok(());
            }
        }
        self.file.write_all_at(data, offset)?;
        self.sync_data()
    }

    /// `fdatasync`, remembering a failure (see `writeback_lost`).
    fn sync_data(&self) -> io::Result<()> {
        #[cfg(test)]
        if FAILING_SYNCS.with(|n| n.replace(n.get().saturating_sub(1))) > 0 {
            return Err(self.sync_failed(io::Error::from_raw_os_error(libc::EIO)));
        }
        self.file.sync_data().map_err(|e| self.sync_failed(e))
    }

    /// Records that a sync of the file failed, and gives its error back.
    fn sync_failed(&self, e: io::Error) -> io::Error {
        if !self.writeback_lost.swap(true, Ordering::AcqRel) {
            tracing::error!(
                path = %self.path.display(),
                error = %e,
                "syncing the backing file failed: writes acknowledged before may be lost, so every \
                 SYNCHRONIZE CACHE of this LUN fails from now on; check the device, then restart \
                 the target"
            );
        }
        e
    }

    fn direct_read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let _shared = self.rmw.read().unwrap_or_else(|e| e.into_inner());
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let start = pos & !(DIRECT_ALIGN - 1);
            let head = (pos - start) as usize;
            let want = (buf.len() - done).min(BOUNCE_CHUNK - head);
            let span = (head + want).next_multiple_of(DIRECT_ALIGN as usize);
            with_bounce(span, |b| -> io::Result<()> {
                self.file.read_exact_at(b, start)?;
                buf[done..done + want].copy_from_slice(&b[head..head + want]);
                crate::copies::note_user_copy(want);
                Ok(())
            })?;
            done += want;
        }
        Ok(())
    }

    fn direct_write(&self, offset: u64, data: &[u8], durable: bool) -> io::Result<()> {
        let aligned =
            offset.is_multiple_of(DIRECT_ALIGN) && (data.len() as u64).is_multiple_of(DIRECT_ALIGN);
        let _shared;
        let _exclusive;
        if aligned {
            _shared = self.rmw.read().unwrap_or_else(|e| e.into_inner());
        } else {
            _exclusive = self.rmw.write().unwrap_or_else(|e| e.into_inner());
        }
        let mut done = 0usize;
        while done < data.len() {
            let pos = offset + done as u64;
            let start = pos & !(DIRECT_ALIGN - 1);
            let head = (pos - start) as usize;
            let want = (data.len() - done).min(BOUNCE_CHUNK - head);
            let span = (head + want).next_multiple_of(DIRECT_ALIGN as usize);
            with_bounce(span, |b| -> io::Result<()> {
                if head != 0 {
                    self.file
                        .read_exact_at(&mut b[..DIRECT_ALIGN as usize], start)?;
                }
                if !(head + want).is_multiple_of(DIRECT_ALIGN as usize) {
                    let last = span - DIRECT_ALIGN as usize;
                    self.file
                        .read_exact_at(&mut b[last..], start + last as u64)?;
                }
                b[head..head + want].copy_from_slice(&data[done..done + want]);
                self.pwrite_all(start, b, durable)
            })?;
            done += want;
        }
        Ok(())
    }

    /// One atomic write by the kernel (see [`super::device_atomic`]): one
    /// `unit` at an offset aligned to it, from an aligned buffer.
    fn write_untorn(&self, unit: u32, offset: u64, data: &[u8], durable: bool) -> io::Result<()> {
        self.check(offset, data.len() as u64)?;
        if data.len() != unit as usize || !offset.is_multiple_of(u64::from(unit)) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: an atomic write is {unit} bytes at a multiple of {unit}, not {} bytes at {offset}",
                    self.path.display(),
                    data.len()
                ),
            ));
        }
        // A partial 4 KiB unit of a plain write next to this one is
        // rewritten whole under the lock held exclusively (see the module
        // docs): shared here, as for an aligned write.
        let _shared = self.rmw.read().unwrap_or_else(|e| e.into_inner());
        with_bounce(data.len(), |b| {
            b.copy_from_slice(data);
            device_atomic::write_untorn(&self.file, offset, b, durable)
        })
        .map_err(|e| match e.raw_os_error() {
            // As for any write-through write: an EIO reports the file's
            // write-back errors, not only this write's.
            Some(libc::EIO) if durable => self.sync_failed(e),
            _ => e,
        })
    }

    fn write(&self, offset: u64, data: &[u8], durable: bool) -> io::Result<()> {
        self.check(offset, data.len() as u64)?;
        self.check_unreplayed(offset, data.len() as u64)?;
        match self.mode {
            FileMode::Cached => self.pwrite_all(offset, data, durable),
            FileMode::Direct => self.direct_write(offset, data, durable),
        }
    }

    /// Leaves an atomic write of `data` at `offset` unfinished, as an I/O
    /// error in place does (its record durable, the write abandoned).
    #[cfg(test)]
    pub(crate) fn leave_atomic_write_unfinished(&self, offset: u64, data: &[u8]) {
        let j = self.journal.as_ref().expect("a store with a journal");
        let ticket = j.begin(offset, data).expect("the record");
        j.abandon(ticket);
    }

    /// Refuses a change of bytes an unfinished atomic write will be
    /// replayed over (see [`Journal::check_unreplayed`]).
    fn check_unreplayed(&self, offset: u64, len: u64) -> io::Result<()> {
        self.journal
            .as_ref()
            .map_or(Ok(()), |j| j.check_unreplayed(offset, len))
    }

    fn fallocate(&self, flags: FallocateFlags, offset: u64, len: u64) -> Result<(), Errno> {
        loop {
            match rustix::fs::fallocate(&self.file, flags, offset, len) {
                Err(Errno::INTR) => continue,
                other => return other,
            }
        }
    }
}

/// A regular file's allocated bytes and the free space an unprivileged
/// writer still has on its file system (`f_bavail`: the blocks reserved for
/// root are not the daemon's to count on).
pub(super) fn file_space(file: &File) -> io::Result<super::Space> {
    use std::os::unix::fs::MetadataExt;
    let used = file.metadata()?.blocks().saturating_mul(512);
    let fs = rustix::fs::fstatvfs(file)?;
    Ok(super::Space {
        used,
        available: fs.f_bavail.saturating_mul(fs.f_frsize),
    })
}

impl Backstore for FileBackstore {
    fn capabilities(&self) -> super::Capabilities {
        super::Capabilities {
            file: Some(super::StoreFile {
                path: self.path.clone(),
                direct: self.mode == FileMode::Direct,
            }),
            engine_reads: true,
            allocation_map: self.regular,
        }
    }

    fn engine_source(&self) -> io::Result<Option<(crate::datapath::Source, bool)>> {
        // A descriptor of its own, read-only: O_DIRECT like the store (when
        // the filesystem still allows it), else the page cache.
        let (file, direct) = if self.mode == FileMode::Direct {
            crate::datapath::open_direct_or_buffered(&self.path, false)?
        } else {
            (File::open(&self.path)?, false)
        };
        Ok(Some((
            crate::datapath::Source::File(std::sync::Arc::new(file)),
            direct,
        )))
    }

    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    /// A file LUN only grows (shrinking would cut data that commands in
    /// flight may still address); in direct mode by whole O_DIRECT units;
    /// a block device only up to the size it has now.
    fn check_resize(&self, new_size: u64) -> io::Result<()> {
        let now = self.size();
        if new_size < now {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{} is {now} bytes: a file LUN only grows; copy the data to a smaller LUN instead",
                    self.path.display()
                ),
            ));
        }
        if self.mode == FileMode::Direct && new_size % DIRECT_ALIGN != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("direct mode needs a size that is a multiple of {DIRECT_ALIGN} bytes"),
            ));
        }
        if !self.regular {
            // A block device cannot be grown from here, only followed: its
            // size now is where its end lies (every read and write of the
            // store names its offset, so the seek moves nothing they use).
            let device = rustix::fs::seek(&self.file, SeekFrom::End(0))?;
            if new_size > device {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{} is a block device of {device} bytes: grow the device first (lvextend, \
                         losetup -c, ...), then resize the LUN to at most its size",
                        self.path.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Grows a regular file, or follows a block device grown underneath
    /// (`lvextend`, `losetup -c`) up to its new size (see
    /// [`Backstore::check_resize`]).
    fn resize(&self, new_size: u64) -> io::Result<()> {
        self.check_resize(new_size)?;
        if self.regular && self.file.metadata()?.len() < new_size {
            self.file.set_len(new_size)?;
        }
        self.size.store(new_size, Ordering::Release);
        Ok(())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        match self.mode {
            FileMode::Cached => {
                // Page cache -> this buffer: one kernel copy per byte.
                crate::copies::note_read_to_user(buf.len());
                self.file.read_exact_at(buf, offset)
            }
            FileMode::Direct => self.direct_read(offset, buf),
        }
    }

    fn read_to_vec(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        self.check(offset, len as u64)?;
        if self.mode == FileMode::Direct || len == 0 {
            let mut v = crate::payload_buffers::take(len);
            v.resize(len, 0);
            self.read_at(offset, &mut v)?;
            return Ok(v);
        }
        // Page cache -> the buffer's unwritten capacity, which pread fills
        // and counts into its length.
        let mut v = crate::payload_buffers::take(len);
        while v.len() < len {
            let at = offset + v.len() as u64;
            match rustix::io::pread(&self.file, rustix::buffer::spare_capacity(&mut v), at) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("{} ends before byte {at}", self.path.display()),
                    ))
                }
                Ok(_) | Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        v.truncate(len);
        crate::copies::note_read_to_user(len);
        Ok(v)
    }

    fn read_at_without_waiting(&self, offset: u64, buf: &mut [u8]) -> io::Result<bool> {
        self.check(offset, buf.len() as u64)?;
        if self.mode == FileMode::Direct {
            return Ok(false);
        }
        if self.tmpfs {
            crate::copies::note_read_to_user(buf.len());
            return self.file.read_exact_at(buf, offset).map(|()| true);
        }
        if !self.can_nowait.load(Ordering::Relaxed) {
            return Ok(false);
        }
        // RWF_NOWAIT: only what the page cache holds; a page that is not
        // there ends the read short (or EAGAIN) instead of waiting for it.
        let mut done = 0usize;
        while done < buf.len() {
            let dst = buf.get_mut(done..).unwrap_or_default();
            match rustix::io::preadv2(
                &self.file,
                &mut [io::IoSliceMut::new(dst)],
                offset + done as u64,
                rustix::io::ReadWriteFlags::NOWAIT,
            ) {
                Ok(0) => return Ok(false),
                Ok(n) => done += n,
                Err(Errno::INTR) => {}
                Err(Errno::AGAIN) => return Ok(false),
                Err(e) if is_unsupported(&e) => {
                    self.can_nowait.store(false, Ordering::Relaxed);
                    return Ok(false);
                }
                Err(e) => return Err(e.into()),
            }
        }
        crate::copies::note_read_to_user(buf.len());
        Ok(true)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.write(offset, data, false)
    }

    fn write_at_durable(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.write(offset, data, true)
    }

    fn flush(&self) -> io::Result<()> {
        if self.writeback_lost.load(Ordering::Acquire) {
            return Err(io::Error::new(
                io::ErrorKind::Other,
                format!(
                    "an earlier sync of {} failed: writes acknowledged before it may be lost",
                    self.path.display()
                ),
            ));
        }
        self.sync_data()
    }

    fn erase_copies(&self) -> io::Result<()> {
        match &self.journal {
            Some(j) => j.erase_finished(),
            None => Ok(()),
        }
    }

    fn atomic_write_max(&self) -> u64 {
        match (&self.journal, self.device_atomic_unit) {
            (Some(j), _) => u64::from(j.max_bytes()),
            (None, Some(unit)) => u64::from(unit),
            (None, None) => 0,
        }
    }

    fn atomic_write_unit(&self) -> u64 {
        match (&self.journal, self.device_atomic_unit) {
            (None, Some(unit)) => u64::from(unit),
            _ => 0,
        }
    }

    /// Journal, write in place, mark done: each step durable before the
    /// next (see [`super::journal`]), so the data is durable when this
    /// returns whatever `durable` says. A failure after the record is in
    /// the journal leaves it there, unfinished: the next open writes it in
    /// place, so the blocks still end up wholly old or wholly new, and until
    /// then they take no other write (see [`Journal::check_unreplayed`]).
    fn write_atomic(&self, offset: u64, data: &[u8], durable: bool) -> io::Result<()> {
        if let (None, Some(unit)) = (&self.journal, self.device_atomic_unit) {
            return self.write_untorn(unit, offset, data, durable);
        }
        let Some(j) = &self.journal else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{}: no atomic-write journal, so no atomic writes",
                    self.path.display()
                ),
            ));
        };
        self.check(offset, data.len() as u64)?;
        j.check_unreplayed(offset, data.len() as u64)?;
        let ticket = j.begin(offset, data)?;
        if let Err(e) = self
            .write(offset, data, false)
            .and_then(|()| self.sync_data())
        {
            j.abandon(ticket);
            return Err(e);
        }
        j.finish(ticket)
    }

    fn writes_to_memory(&self) -> bool {
        // The mode the store really runs in: a direct LUN that fell back to
        // cached mode writes to the page cache too.
        self.mode == FileMode::Cached
    }

    /// The bytes an unfinished atomic write will be replayed over take no
    /// write from the engine either (see [`Journal::check_unreplayed`]).
    fn check_write(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len)?;
        self.check_unreplayed(offset, len)
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        self.check_unreplayed(offset, len)?;
        if self.can_punch.load(Ordering::Relaxed) {
            // Punching invalidates the page cache of the range; in direct
            // mode a concurrent read-modify-write must not resurrect data.
            let _exclusive = self.rmw.write().unwrap_or_else(|e| e.into_inner());
            match self.fallocate(
                FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
                offset,
                len,
            ) {
                Ok(()) => {
                    self.forget_known_data();
                    return Ok(());
                }
                // A block device refuses (EINVAL) a range its logical block
                // size does not divide, an UNMAP of one 512-byte block on a
                // 4Kn disk: that range is written as zeros, and the next
                // is punched again.
                Err(Errno::INVAL) if !self.regular => {
                    debug!(path = %self.path.display(), offset, len, "the device refused to discard a range its logical blocks do not divide: zeros written instead");
                }
                Err(e) if is_unsupported(&e) => {
                    warn!(path = %self.path.display(), error = %e, "cannot punch holes here: UNMAP writes zeros instead");
                    self.can_punch.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.write_zeroes(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        // Zeroing by fallocate never passes through `write`.
        self.check_unreplayed(offset, len)?;
        if self.regular && self.can_zero_range.load(Ordering::Relaxed) {
            let _exclusive = self.rmw.write().unwrap_or_else(|e| e.into_inner());
            match self.fallocate(
                FallocateFlags::ZERO_RANGE | FallocateFlags::KEEP_SIZE,
                offset,
                len,
            ) {
                // Some file systems keep a zeroed range as unwritten
                // extents, which SEEK_HOLE reports as holes.
                Ok(()) => {
                    self.forget_known_data();
                    return Ok(());
                }
                Err(e) if is_unsupported(&e) => {
                    self.can_zero_range.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(e.into()),
            }
        }
        let zeros = vec![0u8; (len as usize).min(BOUNCE_CHUNK)];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(zeros.len() as u64) as usize;
            self.write_at(offset + done, &zeros[..n])?;
            done += n as u64;
        }
        Ok(())
    }

    fn space(&self) -> io::Result<Option<super::Space>> {
        if !self.regular {
            return Ok(None);
        }
        Ok(Some(file_space(&self.file)?))
    }

    fn allocation(&self, offset: u64, len: u64) -> io::Result<Option<Vec<Extent>>> {
        self.check(offset, len)?;
        if !self.regular {
            return Ok(None);
        }
        let end = offset + len;
        let mut out: Vec<Extent> = Vec::new();
        let mut push = |from: u64, to: u64, mapped: bool| {
            let (from, to) = (from.max(offset), to.min(end));
            if from < to {
                match out.last_mut() {
                    Some(last) if last.mapped == mapped && last.offset + last.len == from => {
                        last.len += to - from;
                    }
                    _ => out.push(Extent {
                        offset: from,
                        len: to - from,
                        mapped,
                    }),
                }
            }
        };
        let (mut known, mut generation) = self.known_data_now();
        let mut walking = None;
        let mut pos = offset;
        while pos < end {
            if let Some(run) = known.as_ref().filter(|r| r.contains(&pos)) {
                push(pos, run.end.min(end), true);
                pos = run.end;
                continue;
            }
            if walking.is_none() {
                walking = Some(self.walking.lock().unwrap_or_else(|e| e.into_inner()));
                // Whoever held it may have found the run this query needs.
                (known, generation) = self.known_data_now();
                continue;
            }
            #[cfg(test)]
            self.data_seeks.fetch_add(1, Ordering::Relaxed);
            let data = match rustix::fs::seek(&self.file, SeekFrom::Data(pos)) {
                Ok(d) => d,
                // No data at or after pos: the rest is a hole.
                Err(Errno::NXIO) => end,
                Err(e) if is_unsupported(&e) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            push(pos, data.min(end), false);
            if data >= end {
                break;
            }
            let hole = match rustix::fs::seek(&self.file, SeekFrom::Hole(data)) {
                Ok(h) => {
                    if h > data {
                        self.remember_known_data(data..h, generation);
                        known = Some(data..h);
                    }
                    h
                }
                Err(Errno::NXIO) => end,
                Err(e) => return Err(e.into()),
            };
            push(data, hole.min(end), true);
            pos = hole.max(data + 1);
        }
        Ok(Some(out))
    }

    fn describe(&self) -> String {
        let mode = match (self.mode, &self.fallback) {
            (FileMode::Direct, _) => "direct".to_string(),
            (FileMode::Cached, None) => "cached".to_string(),
            (FileMode::Cached, Some(why)) => format!("cached: direct refused, {why}"),
        };
        let atomic = match (&self.journal, self.device_atomic_unit) {
            (Some(j), _) => format!(", atomic writes up to {} KiB", j.max_bytes() >> 10),
            (None, Some(unit)) => format!(
                ", atomic writes of {} KiB by the device (RWF_ATOMIC)",
                unit >> 10
            ),
            (None, None) => String::new(),
        };
        format!(
            "file {} ({} MiB, {mode}{atomic})",
            self.path.display(),
            self.size() >> 20
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linux reports a lost write-back to one sync only: the next
    /// `fdatasync` succeeds without the lost pages. So once a sync failed,
    /// every flush fails, where a SYNCHRONIZE CACHE after the failed one
    /// used to end GOOD with the data gone.
    #[test]
    fn a_failed_sync_fails_every_flush_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileBackstore::open(&dir.path().join("lun.img"), Some(1 << 20), false).unwrap();
        s.write_at(0, &[0x5a; 4096]).unwrap();
        s.flush().expect("a sync that works");
        FAILING_SYNCS.with(|n| n.set(1));
        s.write_at(4096, &[0x5a; 4096]).unwrap();
        assert!(s.flush().is_err(), "the failed sync");
        let again = s.flush();
        assert!(
            again.is_err(),
            "the flush after a failed sync ended {again:?}"
        );
        assert!(
            s.write_at_durable(8192, &[0x5a; 512]).is_ok(),
            "durable writes still go"
        );
    }

    /// A 1 MiB store at `path` with its atomic-write journal at `journal`,
    /// and how many writes its open replayed.
    fn journalled_store(path: &Path, journal: &Path) -> (FileBackstore, usize) {
        FileBackstore::open(path, Some(1 << 20), false)
            .unwrap()
            .with_atomic_journal(journal)
            .unwrap()
    }

    /// An atomic write whose record is durable but whose in-place write
    /// then failed (ENOSPC, EIO) stays in the journal, and the next open
    /// replays it. A later write of the same bytes acknowledged before then
    /// would be overwritten by that replay: silently older data. So until
    /// the store is opened again those bytes take no write, UNMAP or atomic
    /// write, while the rest of the LUN serves as before; after the reopen
    /// the record is whole in place and the bytes are writable again.
    #[test]
    fn bytes_of_an_unfinished_atomic_write_take_no_write_until_it_is_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lun.img");
        let journal = FileBackstore::default_journal_path(&path);
        let open = || journalled_store(&path, &journal);
        let (s, _) = open();
        // Step 1 of an atomic write of 8 KiB at 64 KiB, then an I/O error
        // in place: the store abandons the ticket (as `write_atomic` does).
        let j = s.journal.as_ref().unwrap();
        let ticket = j.begin(64 << 10, &[0x11; 8192]).unwrap();
        j.abandon(ticket);
        for (what, r) in [
            ("WRITE", s.write_at(68 << 10, &[0x22; 512])),
            ("durable WRITE", s.write_at_durable(60 << 10, &[0x22; 8192])),
            (
                "atomic WRITE",
                s.write_atomic(64 << 10, &[0x22; 4096], true),
            ),
            ("UNMAP", s.discard((72 << 10) - 512, 1024)),
            ("WRITE SAME of zeros", s.write_zeroes(66 << 10, 512)),
            (
                "a pipelined WRITE's plan",
                s.check_write(56 << 10, 16 << 10),
            ),
        ] {
            let e = r.expect_err(what).to_string();
            assert!(
                e.contains("unfinished") && e.contains("65536"),
                "{what}: {e}"
            );
        }
        // Bytes the record does not cover are served as before.
        s.write_at(72 << 10, &[0x33; 512]).unwrap();
        s.write_at((60 << 10) - 512, &[0x33; 512]).unwrap();
        drop(s);
        let (s, replayed) = open();
        assert_eq!(replayed, 1);
        let mut back = vec![0u8; 8192];
        s.read_at(64 << 10, &mut back).unwrap();
        assert_eq!(back, vec![0x11; 8192], "the record is whole in place");
        s.write_at(68 << 10, &[0x22; 512]).unwrap();
        let (s, replayed) = {
            drop(s);
            open()
        };
        assert_eq!(replayed, 0);
        let mut back = vec![0u8; 512];
        s.read_at(68 << 10, &mut back).unwrap();
        assert_eq!(back, vec![0x22; 512], "the later write stands");
    }

    /// A live change of a file LUN's definition builds a new store over
    /// the same files while the running one still serves. The new store
    /// shares the running one's journal: its open replays nothing of the
    /// atomic writes still in flight (a replay would write one over what
    /// lands on its blocks after it), and both hand out slots from one
    /// free list. Once every store of it is gone, the next open is a fresh
    /// one, which replays what a crash left.
    #[test]
    fn a_store_opened_beside_a_running_one_shares_its_journal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lun.img");
        let journal = FileBackstore::default_journal_path(&path);
        let open = || journalled_store(&path, &journal);
        let (running, _) = open();
        // An atomic write in flight: its record durable, the blocks not
        // yet written in place.
        let j = running.journal.as_ref().unwrap();
        let in_flight = j.begin(64 << 10, &[0x11; 4096]).unwrap();
        let (rebuilt, replayed) = open();
        assert_eq!(
            replayed, 0,
            "the running store's write in flight was replayed"
        );
        let mut back = vec![0u8; 4096];
        rebuilt.read_at(64 << 10, &mut back).unwrap();
        assert_eq!(
            back,
            vec![0; 4096],
            "the blocks are the running store's to write"
        );
        assert!(
            Arc::ptr_eq(j, rebuilt.journal.as_ref().unwrap()),
            "one journal for both stores"
        );
        drop((running, rebuilt));
        // Gone unfinished, as in a crash: the next open replays it.
        drop(in_flight);
        let (_, replayed) = open();
        assert_eq!(replayed, 1);
    }

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
        s.write_at_durable(8192, b"durable").unwrap();
        let mut back = [0u8; 7];
        s.read_at(8192, &mut back).unwrap();
        assert_eq!(&back, b"durable");
        let ro = FileBackstore::open(&path, None, true).unwrap();
        assert_eq!(ro.size(), 1 << 20);
        assert!(ro.write_at(0, b"x").is_err());
        assert!(s.read_at((1 << 20) - 1, &mut [0u8; 2]).is_err());
        assert_eq!(s.read_to_vec(4096, 9).unwrap(), b"blockwire");
        assert_eq!(s.read_to_vec(8190, 11).unwrap(), b"\0\0durable\0\0");
        assert!(s.read_to_vec((1 << 20) - 1, 2).is_err());
        // Cut short behind the store's back: an error, not a short buffer.
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(8192)
            .unwrap();
        let e = s.read_to_vec(4096, 8192).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
    }

    #[test]
    fn reads_without_waiting_take_only_what_memory_holds() {
        let pattern: Vec<u8> = (0..64 << 10)
            .map(|i: u32| (i * 7 + i / 4096) as u8)
            .collect();
        // A device's file system (Debian never mounts /var/tmp in memory):
        // pages dropped from the page cache are not read without waiting.
        let disk = tempfile::tempdir_in("/var/tmp").unwrap();
        assert!(
            !lives_in_memory(File::open(disk.path()).unwrap()),
            "/var/tmp is in tmpfs here: this test needs a device's file system there"
        );
        let path = disk.path().join("lun.img");
        let s = FileBackstore::open(&path, Some(1 << 20), false).unwrap();
        s.write_at(0, &pattern).unwrap();
        s.flush().unwrap();
        let drop_cache = || {
            rustix::fs::fadvise(
                File::open(&path).unwrap(),
                0,
                None,
                rustix::fs::Advice::DontNeed,
            )
            .unwrap()
        };
        drop_cache();
        let mut buf = vec![0u8; 8192];
        assert!(
            !s.read_at_without_waiting(4096, &mut buf).unwrap(),
            "not cached"
        );
        s.read_at(4096, &mut buf).unwrap();
        buf.fill(0);
        assert!(
            s.read_at_without_waiting(4096, &mut buf).unwrap(),
            "cached now"
        );
        assert_eq!(buf, pattern[4096..12288]);
        assert!(s
            .read_at_without_waiting((1 << 20) - 1, &mut [0u8; 2])
            .is_err());
        // O_DIRECT reads always wait for the device.
        let direct = FileBackstore::open_with(&path, None, false, FileMode::Direct).unwrap();
        if direct.mode() == FileMode::Direct {
            assert!(!direct.read_at_without_waiting(4096, &mut buf).unwrap());
        }

        // tmpfs is memory: read whatever the page cache was told.
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = shm.path().join("lun.img");
        let s = FileBackstore::open(&path, Some(1 << 20), false).unwrap();
        s.write_at(0, &pattern).unwrap();
        drop_cache();
        buf.fill(0);
        assert!(s.read_at_without_waiting(4096, &mut buf).unwrap());
        assert_eq!(buf, pattern[4096..12288]);
    }

    /// The loop device helper the daemon tests share.
    mod loop_device {
        include!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/support/loop_device.rs"
        ));
    }
    use loop_device::LoopDevice;

    /// A block device LUN takes the device's size, follows the device when
    /// it grows (`lvextend`, `losetup -c`), and never past it.
    #[test]
    fn a_block_device_is_followed_when_it_grows() {
        let dir = tempfile::tempdir().unwrap();
        let backing = dir.path().join("device.img");
        std::fs::File::create(&backing)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let dev = LoopDevice::over(&backing);
        let s = FileBackstore::open_with(&dev.0, None, false, FileMode::Direct).unwrap();
        assert_eq!(s.size(), 1 << 20);
        s.write_at(4096, b"kept").unwrap();
        let e = s.resize(2 << 20).unwrap_err().to_string();
        assert!(
            e.contains("is a block device of 1048576 bytes: grow the device first"),
            "{e}"
        );
        std::fs::OpenOptions::new()
            .write(true)
            .open(&backing)
            .unwrap()
            .set_len(4 << 20)
            .unwrap();
        dev.refresh();
        s.resize(2 << 20).unwrap();
        assert_eq!(s.size(), 2 << 20);
        s.write_at((2 << 20) - 4, b"end!").unwrap();
        let mut back = [0u8; 4];
        s.read_at(4096, &mut back).unwrap();
        assert_eq!(&back, b"kept");
        s.read_at((2 << 20) - 4, &mut back).unwrap();
        assert_eq!(&back, b"end!");
        assert!(
            s.read_at(2 << 20, &mut back).is_err(),
            "nothing past the size given"
        );
        let e = s.resize(5 << 20).unwrap_err().to_string();
        assert!(e.contains("of 4194304 bytes"), "{e}");
        assert!(s.resize(1 << 20).is_err(), "never shrinks");
    }

    /// An UNMAP of a range a 4Kn device's logical blocks do not divide
    /// (one 512-byte LUN block) is written as zeros, and the next aligned
    /// one is still discarded by the device. The device's EINVAL turned
    /// discards off for good: every later UNMAP wrote its whole range.
    #[test]
    fn a_misaligned_discard_leaves_discards_on() {
        let dir = tempfile::tempdir().unwrap();
        let backing = dir.path().join("4kn.img");
        std::fs::File::create(&backing)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let dev = LoopDevice::with_sector_size(&backing, 4096);
        let s = FileBackstore::open_with(&dev.0, None, false, FileMode::Direct).unwrap();
        s.write_at(0, &[0x5a; 16384]).unwrap();
        s.discard(512, 512).unwrap();
        let mut back = vec![0u8; 2048];
        s.read_at(0, &mut back).unwrap();
        assert!(back[..512].iter().all(|&b| b == 0x5a));
        assert!(
            back[512..1024].iter().all(|&b| b == 0),
            "the range reads as zeros"
        );
        assert!(back[1024..].iter().all(|&b| b == 0x5a));
        assert!(
            s.can_punch.load(Ordering::Relaxed),
            "one misaligned range turned discards off"
        );
        s.discard(8192, 8192).unwrap();
        let mut back = vec![1u8; 8192];
        s.read_at(8192, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        assert!(s.can_punch.load(Ordering::Relaxed));
    }

    /// Direct mode (or its announced fallback) reads and writes unaligned
    /// ranges exactly like cached mode.
    #[test]
    fn direct_mode_unaligned_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("direct.img");
        let s = FileBackstore::open_with(&path, Some(1 << 20), false, FileMode::Direct).unwrap();
        if let Some(why) = s.fallback_reason() {
            eprintln!("direct mode fell back: {why}");
        }
        let pattern: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        s.write_at(512 + 7, &pattern).unwrap();
        s.write_at_durable(65536, &pattern[..4096]).unwrap();
        let mut back = vec![0u8; pattern.len()];
        s.read_at(512 + 7, &mut back).unwrap();
        assert_eq!(back, pattern);
        let mut head = [1u8; 519];
        s.read_at(0, &mut head).unwrap();
        assert!(
            head.iter().all(|&b| b == 0),
            "bytes before the write stay zero"
        );
        let cached = FileBackstore::open(&path, None, true).unwrap();
        let mut via_cache = vec![0u8; 4096];
        cached.read_at(65536, &mut via_cache).unwrap();
        assert_eq!(via_cache, pattern[..4096]);
        // A size that is not a multiple of 4 KiB cannot run direct.
        let odd = dir.path().join("odd.img");
        let r = FileBackstore::open_with(&odd, Some(4096 + 512), false, FileMode::Direct);
        if s.fallback_reason().is_none() {
            assert!(r.unwrap_err().to_string().contains("multiple of 4096"));
        }
    }

    /// UNMAP punches a hole: the range reads zeros and SEEK_HOLE sees it.
    #[test]
    fn discard_punches_holes_and_allocation_sees_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("thin.img");
        let s = FileBackstore::open(&path, Some(4 << 20), false).unwrap();
        s.write_at(0, &vec![0xa5u8; 2 << 20]).unwrap();
        s.flush().unwrap();
        s.discard(1 << 20, 1 << 20).unwrap();
        let mut back = vec![1u8; 1 << 20];
        s.read_at(1 << 20, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        let map = s.allocation(0, 4 << 20).unwrap().unwrap();
        assert_eq!(map.first().map(|e| (e.offset, e.mapped)), Some((0, true)));
        // Everything from 1 MiB on is a hole (punched, then never written).
        let holes: u64 = map.iter().filter(|e| !e.mapped).map(|e| e.len).sum();
        assert_eq!(holes, 3 << 20, "{map:?}");
        let covered: u64 = map.iter().map(|e| e.len).sum();
        assert_eq!(covered, 4 << 20);
        // The run of data the query found is remembered; a later punch
        // inside it must still show.
        s.discard(512 << 10, 4096).unwrap();
        let map = s.allocation(0, 1 << 20).unwrap().unwrap();
        let got: Vec<(u64, u64, bool)> = map.iter().map(|e| (e.offset, e.len, e.mapped)).collect();
        assert_eq!(
            got,
            vec![
                (0, 512 << 10, true),
                (512 << 10, 4096, false),
                ((512 << 10) + 4096, (512 << 10) - 4096, true)
            ]
        );
        // Remembered runs answer queries that start inside them.
        let map = s.allocation(4096, 8192).unwrap().unwrap();
        assert_eq!(
            map.iter()
                .map(|e| (e.offset, e.len, e.mapped))
                .collect::<Vec<_>>(),
            vec![(4096, 8192, true)]
        );
        s.write_zeroes(0, 4096).unwrap();
        let mut z = [1u8; 4096];
        s.read_at(0, &mut z).unwrap();
        assert!(z.iter().all(|&b| b == 0));
    }

    /// Queries that arrive together on a fully written file: one of them
    /// walks it, the others take the run it found. A query that starts
    /// before that run walks again, and the two runs become one.
    #[test]
    fn concurrent_allocation_queries_walk_the_file_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("full.img");
        let size = 64u64 << 20;
        let s = FileBackstore::open(&path, Some(size), false).unwrap();
        s.write_at(0, &vec![0x5au8; size as usize]).unwrap();
        let start = std::sync::Barrier::new(8);
        let maps: Vec<Vec<Extent>> = std::thread::scope(|scope| {
            let queries: Vec<_> = (0..8)
                .map(|_| {
                    let (s, start) = (&s, &start);
                    scope.spawn(move || {
                        start.wait();
                        s.allocation(4 << 20, size - (4 << 20)).unwrap().unwrap()
                    })
                })
                .collect();
            queries.into_iter().map(|q| q.join().unwrap()).collect()
        });
        for map in maps {
            let got: Vec<(u64, u64, bool)> =
                map.iter().map(|e| (e.offset, e.len, e.mapped)).collect();
            assert_eq!(got, vec![(4 << 20, size - (4 << 20), true)]);
        }
        assert_eq!(s.data_seeks.load(Ordering::Relaxed), 1, "one walk");
        let map = s.allocation(1 << 20, 8192).unwrap().unwrap();
        assert_eq!(
            (map[0].offset, map[0].len, map[0].mapped),
            (1 << 20, 8192, true)
        );
        assert_eq!(s.data_seeks.load(Ordering::Relaxed), 2, "a walk from 1 MiB");
        for from in [0, 2 << 20, 9 << 20] {
            s.allocation(from, 4096).unwrap().unwrap();
        }
        assert_eq!(
            s.data_seeks.load(Ordering::Relaxed),
            3,
            "a walk from 0, then none"
        );
    }
}
