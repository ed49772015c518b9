//! `blockwire mount`: each LUN of a session as a file in a FUSE mount.
//!
//! The mount's root directory holds one regular file per LUN (`lun0`,
//! `lun1`, ...) whose size is the LUN's capacity. `losetup` turns such a file
//! into a block device.
//!
//! - Every open is `FOPEN_DIRECT_IO` (with parallel direct writes): the
//!   kernel keeps no page cache for the files, so a filesystem on a loop
//!   device above them is not cached twice, and each read or write of the
//!   file is one FUSE request that becomes a READ(16) or WRITE(16).
//! - Block-aligned I/O goes straight to the LUN. Unaligned reads read the
//!   covering blocks; unaligned writes read-modify-write them, excluding
//!   aligned writes meanwhile so none is lost.
//! - A write whose file was opened (or whose `pwritev2` asked) for data
//!   integrity — the kernel passes `O_DSYNC` (set by `O_SYNC` too) in the
//!   write's flags — is sent with FUA. `O_DIRECT` alone bypasses caches but
//!   promises no durability, as on a local disk, so it gets no FUA unless
//!   `--fua-direct` is given.
//! - fsync/fdatasync become SYNCHRONIZE CACHE.
//! - The FUSE requests are answered from tokio tasks, so many commands can
//!   be in flight at once (the kernel issues async direct I/O in parallel
//!   when it supports `FUSE_ASYNC_DIO`), up to the session's queue depth.
//!
//! It runs in the foreground until the mount is unmounted (`umount`,
//! `fusermount3 -u`) or SIGINT/SIGTERM arrives (which unmounts it; a busy
//! mount, e.g. with a loop device still attached, stays, and a second
//! signal detaches it lazily), then synchronizes the caches and logs out.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use blockwire_initiator::{rw16, Capacity, Error as IscsiError, Session};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, MountOption, OpenAccMode, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    WriteFlags,
};
use tokio::runtime::Handle;
use tokio::sync::RwLock;

/// Attribute cache lifetime: sizes never change while mounted.
const TTL: Duration = Duration::from_secs(60);
/// Largest FUSE read/write request asked for (the kernel may cap it lower).
const MAX_IO: u32 = 1 << 20;

/// What `blockwire mount` needs besides the session.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Where to mount.
    pub mountpoint: PathBuf,
    /// Refuse writes (the mount is read-only).
    pub read_only: bool,
    /// Let other users than the mounting one in (FUSE allow_other).
    pub allow_other: bool,
    /// FUA on O_DIRECT writes too (not only on O_SYNC/O_DSYNC ones).
    pub fua_direct: bool,
}

/// Counters printed when the mount ends.
#[derive(Debug, Default)]
pub struct Stats {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    fua_writes: AtomicU64,
    rmw_writes: AtomicU64,
    syncs: AtomicU64,
    errors: AtomicU64,
}

impl Stats {
    fn summary(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "reads={} ({} bytes) writes={} ({} bytes, {} with FUA, {} read-modify-write) \
             synchronize_cache={} errors={}",
            g(&self.reads),
            g(&self.read_bytes),
            g(&self.writes),
            g(&self.write_bytes),
            g(&self.fua_writes),
            g(&self.rmw_writes),
            g(&self.syncs),
            g(&self.errors)
        )
    }
}

/// One LUN shown as a file.
#[derive(Debug)]
struct LunFile {
    lun: u16,
    name: String,
    ino: u64,
    cap: Capacity,
    /// The most blocks one READ or WRITE may ask for (the unit's MAXIMUM
    /// TRANSFER LENGTH; u32::MAX without one): longer requests go out as
    /// several commands.
    max_blocks: u32,
    /// The unit takes the FUA bit (DPOFUA): else a write that must be
    /// durable is followed by SYNCHRONIZE CACHE, as the unit may ignore it.
    takes_fua: bool,
    /// Shared by aligned writes, exclusive for a read-modify-write.
    rmw: RwLock<()>,
}

impl LunFile {
    fn size(&self) -> u64 {
        self.cap.bytes()
    }
}

/// The FUSE filesystem: a root directory with one file per LUN.
struct LunFs {
    session: Arc<Session>,
    rt: Handle,
    luns: Vec<Arc<LunFile>>,
    opts: MountOptions,
    uid: u32,
    gid: u32,
    mounted_at: SystemTime,
    stats: Arc<Stats>,
}

fn errno_of(e: &IscsiError) -> Errno {
    Errno::from_i32(e.errno())
}

impl LunFs {
    fn file(&self, ino: INodeNo) -> Option<Arc<LunFile>> {
        let ino = u64::from(ino);
        self.luns.iter().find(|l| l.ino == ino).cloned()
    }

    fn root_attr(&self) -> FileAttr {
        FileAttr {
            ino: INodeNo::ROOT,
            size: 0,
            blocks: 0,
            atime: self.mounted_at,
            mtime: self.mounted_at,
            ctime: self.mounted_at,
            crtime: self.mounted_at,
            kind: FileType::Directory,
            perm: 0o755,
            nlink: 2,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        }
    }

    fn file_attr(&self, f: &LunFile) -> FileAttr {
        FileAttr {
            ino: INodeNo(f.ino),
            size: f.size(),
            blocks: f.size().div_ceil(512),
            atime: self.mounted_at,
            mtime: self.mounted_at,
            ctime: self.mounted_at,
            crtime: self.mounted_at,
            kind: FileType::RegularFile,
            perm: if self.opts.read_only { 0o400 } else { 0o600 },
            nlink: 1,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            flags: 0,
            blksize: f.cap.block_size.max(512),
        }
    }
}

/// Reads `len` bytes at byte offset `off` (inside the LUN), whatever the
/// alignment: block-aligned requests go straight through, others read the
/// covering blocks.
async fn read_at(s: &Session, f: &LunFile, off: u64, len: usize) -> Result<Vec<u8>, IscsiError> {
    let sp = Span::of(off, len, f.cap.block_size);
    let mut buf = read_blocks(s, f, sp.lba, sp.blocks).await?;
    if !sp.aligned(len, f.cap.block_size) {
        buf.drain(..sp.skip);
        buf.truncate(len);
    }
    Ok(buf)
}

/// READs `blocks` blocks from `lba`, in commands of at most the unit's
/// MAXIMUM TRANSFER LENGTH (SBC-4 6.6.4): a longer one it would refuse
/// with ILLEGAL REQUEST, and the read fail.
async fn read_blocks(
    s: &Session,
    f: &LunFile,
    lba: u64,
    blocks: u32,
) -> Result<Vec<u8>, IscsiError> {
    let bs = f.cap.block_size as usize;
    let mut out = Vec::new();
    let (mut at, mut left) = (lba, blocks);
    while left > 0 {
        let n = left.min(f.max_blocks);
        let mut piece = vec![0u8; n as usize * bs];
        s.read(f.lun, at, n, &mut piece).await?;
        if n == blocks {
            return Ok(piece);
        }
        out.extend_from_slice(&piece);
        at += u64::from(n);
        left -= n;
    }
    Ok(out)
}

/// WRITEs `data` to the blocks from `lba`, in commands of at most the
/// unit's MAXIMUM TRANSFER LENGTH, each with FUA when `fua`.
async fn write_blocks(
    s: &Session,
    f: &LunFile,
    lba: u64,
    data: &[u8],
    fua: bool,
) -> Result<(), IscsiError> {
    let bs = f.cap.block_size as usize;
    let mut at = lba;
    for piece in data.chunks(piece_bytes(f)) {
        let blocks = (piece.len() / bs) as u32;
        s.write_blocks(f.lun, &rw16(true, at, blocks, fua), piece)
            .await?;
        at += u64::from(blocks);
    }
    Ok(())
}

/// Bytes of one READ or WRITE of `f` at most.
fn piece_bytes(f: &LunFile) -> usize {
    (f.max_blocks as usize).saturating_mul(f.cap.block_size as usize)
}

/// The whole blocks that cover `len` bytes at byte offset `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    /// First block.
    lba: u64,
    /// Number of blocks.
    blocks: u32,
    /// Bytes from the start of the first block to `off`.
    skip: usize,
}

impl Span {
    fn of(off: u64, len: usize, block_size: u32) -> Span {
        let bs = u64::from(block_size);
        let lba = off / bs;
        let last = (off + len as u64).div_ceil(bs);
        Span {
            lba,
            blocks: (last - lba) as u32,
            skip: (off - lba * bs) as usize,
        }
    }

    fn bytes(&self, block_size: u32) -> usize {
        self.blocks as usize * block_size as usize
    }

    /// True when the request is exactly these blocks.
    fn aligned(&self, len: usize, block_size: u32) -> bool {
        self.skip == 0 && self.bytes(block_size) == len
    }
}

/// Writes `data` at byte offset `off` (inside the LUN), read-modify-write
/// for the partial blocks at either end.
async fn write_at(
    s: &Session,
    f: &LunFile,
    off: u64,
    data: &[u8],
    fua: bool,
    stats: &Stats,
) -> Result<(), IscsiError> {
    let bsz = f.cap.block_size;
    let sp = Span::of(off, data.len(), bsz);
    if sp.aligned(data.len(), bsz) {
        let _shared = f.rmw.read().await;
        return write_blocks(s, f, sp.lba, data, fua).await;
    }
    stats.rmw_writes.fetch_add(1, Ordering::Relaxed);
    let _exclusive = f.rmw.write().await;
    let mut buf = read_blocks(s, f, sp.lba, sp.blocks).await?;
    buf[sp.skip..sp.skip + data.len()].copy_from_slice(data);
    write_blocks(s, f, sp.lba, &buf, fua).await
}

impl Filesystem for LunFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Requests as large as the kernel allows (1 MiB with FUSE_MAX_PAGES),
        // and parallel async direct I/O.
        let _ = config
            .set_max_write(MAX_IO)
            .or_else(|n| config.set_max_write(n));
        let _ = config
            .set_max_readahead(MAX_IO)
            .or_else(|n| config.set_max_readahead(n));
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
        let _ = config.set_max_background(64);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        match self.luns.iter().find(|l| OsStr::new(&l.name) == name) {
            Some(f) => reply.entry(&TTL, &self.file_attr(f), Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino == INodeNo::ROOT {
            return reply.attr(&TTL, &self.root_attr());
        }
        match self.file(ino) {
            Some(f) => reply.attr(&TTL, &self.file_attr(&f)),
            None => reply.error(Errno::ENOENT),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let Some(f) = self.file(ino) else {
            return reply.error(Errno::ENOENT);
        };
        // The size is the LUN's capacity: it cannot change. Truncating to
        // the same size (O_TRUNC on a device-like file is not) is harmless;
        // times and modes are not kept.
        match size {
            Some(s) if s != f.size() => reply.error(Errno::EPERM),
            _ => reply.attr(&TTL, &self.file_attr(&f)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if self.file(ino).is_none() {
            return reply.error(if ino == INodeNo::ROOT {
                Errno::EISDIR
            } else {
                Errno::ENOENT
            });
        }
        if self.opts.read_only && flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        reply.opened(
            FileHandle(0),
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES,
        );
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(f) = self.file(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let len = u64::from(size).min(f.size().saturating_sub(offset)) as usize;
        if len == 0 {
            return reply.data(&[]);
        }
        let (s, stats) = (self.session.clone(), self.stats.clone());
        self.rt.spawn(async move {
            match read_at(&s, &f, offset, len).await {
                Ok(buf) => {
                    stats.reads.fetch_add(1, Ordering::Relaxed);
                    stats.read_bytes.fetch_add(len as u64, Ordering::Relaxed);
                    reply.data(&buf)
                }
                Err(e) => {
                    stats.errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("blockwire mount: read {} at {offset}+{len}: {e}", f.name);
                    reply.error(errno_of(&e))
                }
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Some(f) = self.file(ino) else {
            return reply.error(Errno::ENOENT);
        };
        if self.opts.read_only {
            return reply.error(Errno::EROFS);
        }
        if offset >= f.size() {
            return reply.error(Errno::ENOSPC);
        }
        let len = (data.len() as u64).min(f.size() - offset) as usize;
        let fua =
            flags.0 & libc::O_DSYNC != 0 || (self.opts.fua_direct && flags.0 & libc::O_DIRECT != 0);
        // The request buffer is the session loop's: the task needs its own copy.
        let data = data[..len].to_vec();
        let (s, stats) = (self.session.clone(), self.stats.clone());
        self.rt.spawn(async move {
            let written = match write_at(&s, &f, offset, &data, fua && f.takes_fua, &stats).await {
                Ok(()) if fua && !f.takes_fua => {
                    stats.syncs.fetch_add(1, Ordering::Relaxed);
                    s.synchronize_cache(f.lun).await
                }
                other => other,
            };
            match written {
                Ok(()) => {
                    stats.writes.fetch_add(1, Ordering::Relaxed);
                    stats.write_bytes.fetch_add(len as u64, Ordering::Relaxed);
                    if fua {
                        stats.fua_writes.fetch_add(1, Ordering::Relaxed);
                    }
                    reply.written(len as u32)
                }
                Err(e) => {
                    stats.errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("blockwire mount: write {} at {offset}+{len}: {e}", f.name);
                    reply.error(errno_of(&e))
                }
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) promises no durability; nothing is buffered here.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let Some(f) = self.file(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let (s, stats) = (self.session.clone(), self.stats.clone());
        self.rt.spawn(async move {
            match s.synchronize_cache(f.lun).await {
                Ok(()) => {
                    stats.syncs.fetch_add(1, Ordering::Relaxed);
                    reply.ok()
                }
                Err(e) => {
                    stats.errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("blockwire mount: SYNCHRONIZE CACHE {}: {e}", f.name);
                    reply.error(errno_of(&e))
                }
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let mut entries = vec![
            (1u64, FileType::Directory, ".".to_owned()),
            (1, FileType::Directory, "..".to_owned()),
        ];
        entries.extend(
            self.luns
                .iter()
                .map(|l| (l.ino, FileType::RegularFile, l.name.clone())),
        );
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let total: u64 = self.luns.iter().map(|l| l.size()).sum();
        reply.statfs(
            total / 4096,
            0,
            0,
            self.luns.len() as u64,
            0,
            4096,
            255,
            4096,
        );
    }
}

/// Runs `fusermount3 -u [-z] DIR` (falling back to `umount [-l] DIR`).
fn unmount(dir: &Path, lazy: bool) -> Result<()> {
    let mut last = String::new();
    for (prog, flag) in [
        ("fusermount3", "-z"),
        ("fusermount", "-z"),
        ("umount", "-l"),
    ] {
        let mut c = std::process::Command::new(prog);
        if prog == "umount" {
            if lazy {
                c.arg(flag);
            }
        } else {
            c.arg("-u");
            if lazy {
                c.arg(flag);
            }
        }
        match c.arg(dir).output() {
            Ok(o) if o.status.success() => return Ok(()),
            Ok(o) => {
                last = String::from_utf8_lossy(&o.stderr).trim().to_owned();
                // The tool ran and refused (busy, not mounted): no point in another.
                break;
            }
            Err(e) => last = format!("{prog}: {e}"),
        }
    }
    bail!("{last}")
}

/// Mounts the LUNs of `session` (all that REPORT LUNS lists, or `luns`) and
/// serves them until unmounted or signalled; then SYNCHRONIZE CACHE on each
/// and logout.
pub async fn mount(session: Session, luns: &[u16], opts: MountOptions) -> Result<()> {
    let session = Arc::new(session);
    let explicit = !luns.is_empty();
    let luns = if explicit {
        luns.to_vec()
    } else {
        session.report_luns().await.unwrap_or_else(|_| vec![0])
    };
    let mut files = Vec::new();
    for lun in luns {
        if !explicit {
            // Only disks (SBC direct-access): tgtd's LUN 0, for one, is a
            // controller that answers no READ CAPACITY.
            match session.inquiry(lun).await {
                Ok(i) if i.peripheral.device_type == 0x00 => {}
                Ok(i) => {
                    eprintln!(
                        "blockwire mount: skipping LUN {lun} (device type {:#04x}, not a disk)",
                        i.peripheral.device_type
                    );
                    continue;
                }
                Err(e) => {
                    eprintln!("blockwire mount: skipping LUN {lun}: INQUIRY failed: {e}");
                    continue;
                }
            }
        }
        let cap = session
            .read_capacity(lun)
            .await
            .with_context(|| format!("READ CAPACITY of LUN {lun}"))?;
        let max_blocks = session
            .max_transfer_blocks(lun)
            .await
            .with_context(|| format!("Block Limits VPD page of LUN {lun}"))?
            .map_or(u32::MAX, |m| m.get());
        let takes_fua = session.takes_fua(lun).await;
        if !takes_fua {
            eprintln!(
                "blockwire mount: LUN {lun} does not take FUA (DPOFUA=0): each O_DSYNC write is \
                 followed by SYNCHRONIZE CACHE"
            );
        }
        files.push(Arc::new(LunFile {
            lun,
            name: format!("lun{lun}"),
            ino: 2 + u64::from(lun),
            cap,
            max_blocks,
            takes_fua,
            rmw: RwLock::new(()),
        }));
    }
    if files.is_empty() {
        bail!("the target has no disk LUNs");
    }
    let resizes = crate::capacity_watch::spawn(
        Arc::downgrade(&session),
        "mount",
        session.capacity_changes(),
    );
    let meta = std::fs::metadata(&opts.mountpoint)
        .with_context(|| format!("mount point {}", opts.mountpoint.display()))?;
    if !meta.is_dir() {
        bail!(
            "mount point {} is not a directory",
            opts.mountpoint.display()
        );
    }
    let stats = Arc::new(Stats::default());
    let fs = LunFs {
        session: session.clone(),
        rt: Handle::current(),
        luns: files.clone(),
        opts: opts.clone(),
        uid: std::os::unix::fs::MetadataExt::uid(&meta),
        gid: std::os::unix::fs::MetadataExt::gid(&meta),
        mounted_at: SystemTime::now(),
        stats: stats.clone(),
    };
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("blockwire:{}", session.target())),
        MountOption::Subtype("blockwire".into()),
        MountOption::DefaultPermissions,
        MountOption::NoExec,
        MountOption::NoSuid,
        MountOption::NoDev,
        if opts.read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    if opts.allow_other {
        config.acl = fuser::SessionACL::All;
    }
    // Requests are answered from tokio tasks: one thread reading /dev/fuse
    // keeps the LUNs busy.
    config.n_threads = Some(1);
    let dir = opts.mountpoint.clone();
    let fuse = tokio::task::spawn_blocking(move || fuser::Session::new(fs, &dir, &config))
        .await
        .context("mount task")?
        .with_context(|| format!("FUSE mount at {}", opts.mountpoint.display()))?;
    for f in &files {
        println!(
            "mounted LUN {} of {} at {} ({} blocks of {} bytes = {} bytes)",
            f.lun,
            session.target(),
            opts.mountpoint.join(&f.name).display(),
            f.cap.blocks,
            f.cap.block_size,
            f.size()
        );
        // A loop device takes 512-byte sectors unless told: every write
        // smaller than the LUN's block would be read, changed and written
        // back whole, racing another initiator writing the rest of it.
        if f.cap.block_size != 512 {
            println!(
                "  for a block device of the LUN's {}-byte blocks: losetup --sector-size {} -f --show {}",
                f.cap.block_size,
                f.cap.block_size,
                opts.mountpoint.join(&f.name).display()
            );
        }
    }
    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("blockwire-fuse".into())
        .spawn(move || {
            let _ = done_tx.send(fuse.run());
        })
        .context("starting the FUSE thread")?;

    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("SIGTERM handler")?;
    let mut signals = 0;
    let ended = loop {
        tokio::select! {
            r = &mut done_rx => break r,
            _ = tokio::signal::ctrl_c() => {}
            _ = sigterm.recv() => {}
        }
        signals += 1;
        let lazy = signals > 1;
        let dir = opts.mountpoint.clone();
        match tokio::task::spawn_blocking(move || {
            // A second signal still tries a clean unmount first.
            // Busy right after its last user let go is common (a loop device
            // detaches asynchronously): retry for a few seconds.
            let mut tries = 0;
            let clean = loop {
                match unmount(&dir, false) {
                    Err(_) if tries < 15 => {
                        tries += 1;
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    r => break r,
                }
            };
            match clean {
                Ok(()) => Ok(false),
                Err(_) if lazy => unmount(&dir, true).map(|()| true),
                Err(e) => Err(e),
            }
        })
        .await
        {
            Ok(Ok(true)) => eprintln!(
                "blockwire mount: {} detached lazily; serving until its last user lets go",
                opts.mountpoint.display()
            ),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => eprintln!(
                "blockwire mount: cannot unmount {}: {e:#}; detach its users (losetup -d, \
                 umount) and signal again, or signal again now for a lazy unmount",
                opts.mountpoint.display()
            ),
            Err(e) => eprintln!("blockwire mount: unmount task: {e}"),
        }
    };
    let served = match ended {
        Ok(r) => r.context("FUSE session"),
        Err(_) => Err(anyhow::anyhow!("the FUSE thread ended without a result")),
    };
    // Tasks answering the last requests hold the session; wait for them.
    resizes.stop().await;
    let mut session = session;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let session = loop {
        match Arc::try_unwrap(session) {
            Ok(s) => break Some(s),
            Err(s) if std::time::Instant::now() < deadline => {
                session = s;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(_) => break None,
        }
    };
    eprintln!("blockwire mount: unmounted; {}", stats.summary());
    // What the files acknowledged is on the target's medium only after the
    // final flush: one that fails, or never runs, fails the command.
    let finished = match session {
        None => Err(anyhow::anyhow!(
            "requests still held the session 30 s after the unmount: no final SYNCHRONIZE \
             CACHE, no logout"
        )),
        Some(s) => {
            // Bounded: with the target gone, recovery would retry for a while.
            let finish = async {
                let mut unflushed = Vec::new();
                for f in &files {
                    if !opts.read_only {
                        if let Err(e) = s.synchronize_cache(f.lun).await {
                            eprintln!("blockwire mount: final SYNCHRONIZE CACHE {}: {e}", f.name);
                            unflushed.push(f.name.clone());
                        }
                    }
                }
                (unflushed, s.logout().await)
            };
            match tokio::time::timeout(Duration::from_secs(15), finish).await {
                Ok((unflushed, logout)) => {
                    // With every write flushed the data are safe: a logout
                    // the target leaves unanswered (istgt now and then) is
                    // said, and the target ends the session on its own.
                    match &logout {
                        Ok(()) => eprintln!("blockwire mount: logged out"),
                        Err(e) => eprintln!(
                            "blockwire mount: logout: {e} (the target ends the session itself)"
                        ),
                    }
                    if unflushed.is_empty() {
                        Ok(())
                    } else {
                        Err(anyhow::anyhow!(
                            "the final SYNCHRONIZE CACHE of {} failed",
                            unflushed.join(", ")
                        ))
                    }
                }
                Err(_) => Err(anyhow::anyhow!(
                    "no final SYNCHRONIZE CACHE and logout within 15 s; giving up"
                )),
            }
        }
    };
    served.and(finished)
}

#[cfg(test)]
mod tests {
    use super::Span;

    #[test]
    fn spans_cover_the_request() {
        // Aligned: exactly the blocks.
        let s = Span::of(4096, 8192, 512);
        assert_eq!((s.lba, s.blocks, s.skip), (8, 16, 0));
        assert!(s.aligned(8192, 512));
        // Inside one block.
        let s = Span::of(1000, 5, 512);
        assert_eq!((s.lba, s.blocks, s.skip), (1, 1, 488));
        assert!(!s.aligned(5, 512));
        // Straddling a boundary.
        let s = Span::of(510, 4, 512);
        assert_eq!((s.lba, s.blocks, s.skip), (0, 2, 510));
        assert_eq!(s.bytes(512), 1024);
        // Aligned start, ragged end; 4 KiB blocks.
        let s = Span::of(8192, 4097, 4096);
        assert_eq!((s.lba, s.blocks, s.skip), (2, 2, 0));
        assert!(!s.aligned(4097, 4096));
        // Every byte of the request lies inside the span, with no spare block.
        for off in [0u64, 1, 511, 512, 513, 4095, 4096, 1 << 30] {
            for len in [1usize, 511, 512, 513, 4096, 65537] {
                let s = Span::of(off, len, 512);
                assert_eq!(s.lba * 512 + s.skip as u64, off);
                assert!(s.skip < 512);
                assert!(s.skip + len <= s.bytes(512));
                assert!(s.skip + len > s.bytes(512) - 512);
            }
        }
    }
}
