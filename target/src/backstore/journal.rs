//! The write-ahead journal that makes WRITE ATOMIC(16) whole-or-nothing on a
//! file backstore.
//!
//! SBC-4 4.29 promises that an atomic write either changes every block it
//! names or none of them, also when the device loses power or the target
//! process dies in the middle. A regular file cannot promise that by itself:
//! `pwrite` of 16 KiB may reach the disk in pieces, and `RWF_ATOMIC` on
//! regular files is limited to one file-system block on the kernels this
//! runs on (ext4 and the lab's 6.12). So each atomic write is journalled:
//!
//! 1. the record `{sequence, byte offset, length, CRC32C of the data, the
//!    data}` is written to a free slot of the journal and `fdatasync`ed;
//! 2. the data is written in place in the backing file and `fdatasync`ed;
//! 3. the record's header is rewritten as *done* and `fdatasync`ed; only
//!    then is the slot reused, and only then may an overlapping write run
//!    (the SCSI core holds the range exclusively throughout).
//!
//! When the store is opened, every slot is parsed. A record whose header and
//! data checksums hold and that is not marked done is replayed (written in
//! place again, oldest sequence first), then marked done; anything else — a
//! zeroed slot, a torn header, a record whose data checksum fails, a record
//! already done — is left alone. A crash before step 1 completes leaves a
//! torn or stale record, so the blocks stay old; a crash after it makes the
//! blocks new at the next open, however far step 2 got. Step 3 is durable
//! before the range is released, so a record is never replayed over a later
//! write of the same blocks.
//!
//! The journal is a sidecar file (`<backing file>.atomic-journal` unless
//! configured): a 4 KiB file header (magic, slot count, slot data size,
//! CRC32C), then `slots` slots, each a 64-byte record header and
//! `slot_data` bytes of data, padded to 4 KiB. Integers are big-endian.
//! The file header is written once, to a temporary file that is synced
//! and renamed into place, so it is never torn.
//!
//! The parsers here take bytes read back from disk and trust none of them:
//! every length is checked against the slot and the backing file before use
//! (property tests below; the `journal_recovery` fuzz target).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};

use blockwire_pdu::digest::crc32c_digest;
use tracing::info;

/// Magic at the start of the journal file.
pub const FILE_MAGIC: [u8; 8] = *b"BWATJNL1";
/// Magic at the start of each record header.
pub const RECORD_MAGIC: [u8; 8] = *b"BWATREC1";
/// Bytes of the journal's file header.
pub const FILE_HEADER_LEN: u64 = 4096;
/// Bytes of a record header.
pub const RECORD_HEADER_LEN: usize = 64;
/// Slots in a new journal: atomic writes to different ranges that may be
/// in flight at once before the next one waits for a slot.
pub const DEFAULT_SLOTS: u32 = 4;
/// Largest atomic write a new journal takes, in bytes. 128 KiB is 256
/// blocks of 512 bytes (what libiscsi's WRITE ATOMIC tests send at most)
/// and a power of two (Linux needs one for its atomic write unit).
pub const DEFAULT_SLOT_DATA: u32 = 128 << 10;
/// Most slots and bytes per slot a journal file may claim (bounds the
/// memory recovery allocates from a header read off the disk).
const MAX_SLOTS: u32 = 64;
const MAX_SLOT_DATA: u32 = 16 << 20;

const STATE_PENDING: u8 = 1;
const STATE_DONE: u8 = 2;

/// Shape of a journal file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Number of slots.
    pub slots: u32,
    /// Data bytes one slot holds: the largest atomic write.
    pub slot_data: u32,
}

impl Geometry {
    /// The shape of a new journal.
    pub const DEFAULT: Geometry = Geometry {
        slots: DEFAULT_SLOTS,
        slot_data: DEFAULT_SLOT_DATA,
    };

    /// Bytes from one slot to the next.
    pub fn stride(&self) -> u64 {
        (RECORD_HEADER_LEN as u64 + u64::from(self.slot_data)).next_multiple_of(4096)
    }

    /// Byte offset of slot `i` in the journal file.
    pub fn slot_offset(&self, i: u32) -> u64 {
        FILE_HEADER_LEN + u64::from(i) * self.stride()
    }

    /// Length of the whole journal file.
    pub fn file_len(&self) -> u64 {
        self.slot_offset(self.slots)
    }
}

/// Why a journal file's header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Shorter than a header.
    #[error("journal header truncated ({0} bytes)")]
    Truncated(usize),
    /// Not a blockwire atomic-write journal.
    #[error("not an atomic-write journal (bad magic)")]
    Magic,
    /// The header's checksum does not match.
    #[error("journal header checksum mismatch")]
    Checksum,
    /// Slot count or size out of bounds.
    #[error("journal geometry out of bounds ({slots} slots of {slot_data} bytes)")]
    Geometry {
        /// Slots claimed.
        slots: u32,
        /// Bytes per slot claimed.
        slot_data: u32,
    },
}

/// The journal file's header bytes for `g`.
pub fn encode_file_header(g: Geometry) -> Vec<u8> {
    let mut h = vec![0u8; FILE_HEADER_LEN as usize];
    h[..8].copy_from_slice(&FILE_MAGIC);
    h[8..12].copy_from_slice(&g.slots.to_be_bytes());
    h[12..16].copy_from_slice(&g.slot_data.to_be_bytes());
    let crc = crc32c_digest(&h[..16]);
    h[16..20].copy_from_slice(&crc.to_be_bytes());
    h
}

fn be32(b: &[u8], at: usize) -> u32 {
    let mut v = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        v.copy_from_slice(s);
    }
    u32::from_be_bytes(v)
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        v.copy_from_slice(s);
    }
    u64::from_be_bytes(v)
}

/// Parses the journal file's header.
pub fn parse_file_header(b: &[u8]) -> Result<Geometry, HeaderError> {
    let h = b.get(..20).ok_or(HeaderError::Truncated(b.len()))?;
    if h[..8] != FILE_MAGIC {
        return Err(HeaderError::Magic);
    }
    if crc32c_digest(&h[..16]) != be32(h, 16) {
        return Err(HeaderError::Checksum);
    }
    let g = Geometry {
        slots: be32(h, 8),
        slot_data: be32(h, 12),
    };
    if g.slots == 0 || g.slots > MAX_SLOTS || g.slot_data == 0 || g.slot_data > MAX_SLOT_DATA {
        return Err(HeaderError::Geometry {
            slots: g.slots,
            slot_data: g.slot_data,
        });
    }
    Ok(g)
}

/// A record header's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    /// Sequence number: records are replayed oldest first.
    pub seq: u64,
    /// Byte offset of the write in the backing file.
    pub offset: u64,
    /// Bytes written.
    pub len: u32,
    /// CRC32C of the data.
    pub data_crc: u32,
    /// Marked done: the data is durable in place.
    pub done: bool,
}

impl RecordHeader {
    /// The 64 header bytes.
    pub fn encode(&self) -> [u8; RECORD_HEADER_LEN] {
        let mut h = [0u8; RECORD_HEADER_LEN];
        h[..8].copy_from_slice(&RECORD_MAGIC);
        h[8..16].copy_from_slice(&self.seq.to_be_bytes());
        h[16..24].copy_from_slice(&self.offset.to_be_bytes());
        h[24..28].copy_from_slice(&self.len.to_be_bytes());
        h[28..32].copy_from_slice(&self.data_crc.to_be_bytes());
        h[32] = if self.done { STATE_DONE } else { STATE_PENDING };
        let crc = crc32c_digest(&h[..33]);
        h[36..40].copy_from_slice(&crc.to_be_bytes());
        h
    }
}

/// The bytes step 1 writes to a slot: a pending header, then the data.
pub fn encode_record(seq: u64, offset: u64, data: &[u8]) -> Vec<u8> {
    let header = RecordHeader {
        seq,
        offset,
        len: data.len() as u32,
        data_crc: crc32c_digest(data),
        done: false,
    };
    let mut r = Vec::with_capacity(RECORD_HEADER_LEN + data.len());
    r.extend_from_slice(&header.encode());
    r.extend_from_slice(data);
    r
}

/// What one slot holds, as read back from the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot<'a> {
    /// Never used (an all-zero header).
    Empty,
    /// Not a whole record: a header or data torn by a crash, or garbage.
    /// Discarded.
    Torn,
    /// A record whose write is durable in place.
    Done {
        /// Its sequence number.
        seq: u64,
    },
    /// A whole record not marked done: to be replayed.
    Pending {
        /// The header.
        header: RecordHeader,
        /// The data to write at `header.offset`.
        data: &'a [u8],
    },
    /// A whole record that names bytes beyond the backing file (the file
    /// was shrunk behind the journal's back): cannot be replayed.
    OutOfRange(RecordHeader),
}

/// Parses one slot's bytes (`slot` may be short when the journal file was
/// truncated). `slot_data` is the journal's slot size and `capacity` the
/// backing file's length in bytes.
pub fn parse_slot(slot: &[u8], slot_data: u32, capacity: u64) -> Slot<'_> {
    let Some(h) = slot.get(..RECORD_HEADER_LEN) else {
        return if slot.iter().all(|&b| b == 0) {
            Slot::Empty
        } else {
            Slot::Torn
        };
    };
    if h.iter().all(|&b| b == 0) {
        return Slot::Empty;
    }
    if h[..8] != RECORD_MAGIC || crc32c_digest(&h[..33]) != be32(h, 36) {
        return Slot::Torn;
    }
    let header = RecordHeader {
        seq: be64(h, 8),
        offset: be64(h, 16),
        len: be32(h, 24),
        data_crc: be32(h, 28),
        done: match h[32] {
            STATE_PENDING => false,
            STATE_DONE => true,
            _ => return Slot::Torn,
        },
    };
    if header.done {
        return Slot::Done { seq: header.seq };
    }
    if header.len == 0 || header.len > slot_data {
        return Slot::Torn;
    }
    let end = RECORD_HEADER_LEN + header.len as usize;
    let Some(data) = slot.get(RECORD_HEADER_LEN..end) else {
        return Slot::Torn;
    };
    if crc32c_digest(data) != header.data_crc {
        return Slot::Torn;
    }
    match header.offset.checked_add(u64::from(header.len)) {
        Some(e) if e <= capacity => Slot::Pending { header, data },
        _ => Slot::OutOfRange(header),
    }
}

/// The records to replay from a whole journal image (`image` starts with
/// the file header) with their slot numbers, oldest first, and the highest
/// sequence number seen.
#[allow(clippy::type_complexity)]
pub fn pending_records(
    image: &[u8],
    capacity: u64,
) -> Result<(Vec<(u32, Slot<'_>)>, u64), HeaderError> {
    let g = parse_file_header(image)?;
    let mut pending = Vec::new();
    let mut last = 0u64;
    for i in 0..g.slots {
        let start = g.slot_offset(i);
        let end = start + g.stride();
        let from = usize::try_from(start)
            .unwrap_or(usize::MAX)
            .min(image.len());
        let to = usize::try_from(end).unwrap_or(usize::MAX).min(image.len());
        let slot = image.get(from..to).unwrap_or_default();
        let s = parse_slot(slot, g.slot_data, capacity);
        match &s {
            Slot::Done { seq } => last = last.max(*seq),
            Slot::Pending { header, .. } | Slot::OutOfRange(header) => {
                last = last.max(header.seq);
                pending.push((i, s));
            }
            Slot::Empty | Slot::Torn => {}
        }
    }
    pending.sort_by_key(|(_, s)| match s {
        Slot::Pending { header, .. } | Slot::OutOfRange(header) => header.seq,
        _ => 0,
    });
    Ok((pending, last))
}

/// How many unfinished atomic writes the journal at `path` holds for a
/// backing file of `capacity` bytes, read without changing anything (a
/// read-only LUN cannot replay them, so it must not serve the file while
/// there are any). No journal: 0.
pub fn unfinished(path: &Path, capacity: u64) -> io::Result<usize> {
    if regular_len(path)?.unwrap_or(0) == 0 {
        return Ok(0);
    }
    let (_, image) = read_image(&File::open(path)?, path)?;
    let (pending, _) = pending_records(&image, capacity).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "atomic-write journal {}: cannot be read: {e}",
                path.display()
            ),
        )
    })?;
    Ok(pending.len())
}

/// What [`Journal::open`] would find wrong with the journal at `path`,
/// without creating, replaying or writing anything (a dry run of a
/// change): the same errors, word for word, for a header or record that
/// cannot be read and for an unfinished write beyond `capacity`. A
/// missing or empty file is fine (opening creates it).
pub fn check_openable(path: &Path, capacity: u64) -> io::Result<()> {
    if regular_len(path)?.unwrap_or(0) == 0 {
        return Ok(());
    }
    let (_, image) = read_image(&File::open(path)?, path)?;
    readable_records(&image, path, capacity).map(drop)
}

/// The length of the journal file at `path` (none: there is none),
/// refused unless it is a regular file: a device node has no length to
/// read records from (it would be taken for an empty journal and replaced
/// by a file on /dev's tmpfs, where nothing survives a power loss), and a
/// FIFO would block its reader.
fn regular_len(path: &Path) -> io::Result<Option<u64>> {
    let m = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if !m.is_file() {
        return Err(annotate(
            path,
            "is not a regular file",
            &"name a file on a file system that keeps its data across a power loss",
        ));
    }
    Ok(Some(m.len()))
}

/// "atomic-write journal PATH: WHAT: E", the words of every journal error.
fn annotate(path: &Path, what: &str, e: &dyn std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("atomic-write journal {}: {what}: {e}", path.display()),
    )
}

/// The journal's geometry and the image its header says it has (less
/// where the file is shorter): no more is read than the header claims, so
/// a large file named as a journal by mistake is not read whole.
fn read_image(file: &File, path: &Path) -> io::Result<(Geometry, Vec<u8>)> {
    let mut head = vec![0u8; FILE_HEADER_LEN as usize];
    let got = read_upto(file, &mut head, 0)?;
    let g = parse_file_header(&head[..got]).map_err(|e| {
        annotate(
            path,
            "cannot be read (move it away only if the LUN holds no atomic write in progress)",
            &e,
        )
    })?;
    // No more than the file holds: a header may claim any geometry.
    let len = g.file_len().min(file.metadata()?.len());
    let mut image = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
    let got = read_upto(file, &mut image, 0)?;
    image.truncate(got);
    Ok((g, image))
}

/// The journal's records and the last sequence number, refused where a
/// record cannot be read or an unfinished one lies beyond `capacity`.
fn readable_records<'a>(
    image: &'a [u8],
    path: &Path,
    capacity: u64,
) -> io::Result<(Vec<(u32, Slot<'a>)>, u64)> {
    let (pending, last) =
        pending_records(image, capacity).map_err(|e| annotate(path, "cannot be read", &e))?;
    for (_, s) in &pending {
        if let Slot::OutOfRange(h) = s {
            return Err(annotate(
                path,
                "holds an unfinished atomic write beyond the end of the backing file",
                &format!(
                    "{} bytes at {} (restore the file's size, then open it again)",
                    h.len, h.offset
                ),
            ));
        }
    }
    Ok((pending, last))
}

/// An open journal.
#[derive(Debug)]
pub struct Journal {
    file: File,
    path: PathBuf,
    geometry: Geometry,
    next_seq: AtomicU64,
    free: Mutex<Vec<u32>>,
    freed: Condvar,
    /// Slots kept by abandoned tickets (an I/O error after their record).
    abandoned: AtomicU64,
    /// The byte ranges (offset, length) of those tickets' records: the next
    /// open replays each one whole, so no later write of those bytes may be
    /// acknowledged before then (see [`Journal::check_unreplayed`]).
    stuck: Mutex<Vec<(u64, u32)>>,
}

/// A record written and durable (step 1 done): the caller writes in place,
/// then hands it to [`Journal::finish`]. A ticket that is never finished
/// keeps its slot (and its record stays pending, to be replayed when the
/// store is next opened).
#[derive(Debug)]
pub struct Ticket {
    slot: u32,
    header: RecordHeader,
}

fn sync_dir(path: &Path) -> io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    File::open(dir.unwrap_or(Path::new(".")))?.sync_all()
}

/// Writes a fresh, empty journal at `path` (temporary file, sync, rename).
fn create(path: &Path, g: Geometry) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = PathBuf::from(tmp);
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    f.write_all_at(&encode_file_header(g), 0)?;
    // The slots read as zeros: Empty.
    f.set_len(g.file_len())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    sync_dir(path)
}

/// The journals open in this process, by path. A unit built anew over the
/// same files (a live change of its definition) shares the running unit's
/// journal rather than opening a second one: two would each hand out slots
/// from a free list of their own (one's record overwriting the other's in
/// flight, whose "done" mark then spoils it), and the second's open would
/// replay the first's records of writes still in flight, over whatever
/// lands on those blocks after them.
fn open_journals() -> &'static Mutex<Vec<(PathBuf, Weak<Journal>)>> {
    static OPEN: OnceLock<Mutex<Vec<(PathBuf, Weak<Journal>)>>> = OnceLock::new();
    OPEN.get_or_init(Mutex::default)
}

/// `path` with its directory resolved, so two spellings of one journal
/// meet (the file itself may not exist yet).
fn journal_key(path: &Path) -> PathBuf {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = std::fs::canonicalize(dir.unwrap_or(Path::new("."))).ok();
    match (dir, path.file_name()) {
        (Some(dir), Some(name)) => dir.join(name),
        _ => path.to_owned(),
    }
}

impl Journal {
    /// [`Journal::open`], unless this process has the journal at `path`
    /// open already: then that one, shared, and nothing is replayed (its
    /// records are writes in flight or left by an I/O error, which it
    /// keeps guarded; see [`open_journals`]).
    pub fn open_shared(
        path: &Path,
        capacity: u64,
        apply: impl FnMut(u64, &[u8]) -> io::Result<()>,
        sync_backing: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<(Arc<Journal>, usize)> {
        let key = journal_key(path);
        let mut open = open_journals().lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|(_, j)| j.strong_count() > 0);
        if let Some(j) = open
            .iter()
            .find(|(p, _)| *p == key)
            .and_then(|(_, j)| j.upgrade())
        {
            return Ok((j, 0));
        }
        let (j, replayed) = Journal::open(path, capacity, apply, sync_backing)?;
        let j = Arc::new(j);
        open.push((key, Arc::downgrade(&j)));
        Ok((j, replayed))
    }

    /// Opens (or creates) the journal at `path` for a backing file of
    /// `capacity` bytes, replays every pending record through `apply`
    /// (offset, data), calls `sync_backing` once if anything was replayed,
    /// then marks the replayed records done. Returns the journal and how
    /// many records were replayed.
    pub fn open(
        path: &Path,
        capacity: u64,
        mut apply: impl FnMut(u64, &[u8]) -> io::Result<()>,
        sync_backing: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<(Journal, usize)> {
        let existing = regular_len(path)?.unwrap_or(0) > 0;
        if !existing {
            create(path, Geometry::DEFAULT)?;
        }
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let (g, image) = read_image(&file, path)?;
        let (pending, last) = readable_records(&image, path, capacity)?;
        let mut replayed = Vec::new();
        for (slot, s) in &pending {
            if let Slot::Pending { header, data } = s {
                apply(header.offset, data)?;
                replayed.push((*slot, *header));
            }
        }
        if !replayed.is_empty() {
            sync_backing()?;
            for (slot, h) in &replayed {
                let done = RecordHeader { done: true, ..*h };
                file.write_all_at(&done.encode(), g.slot_offset(*slot))?;
            }
            file.sync_data()?;
            info!(journal = %path.display(), records = replayed.len(), "replayed unfinished atomic writes");
        }
        let geometry = if g == Geometry::DEFAULT {
            g
        } else {
            // Every record is done now: a journal of another shape is
            // replaced by the current one.
            drop(file);
            create(path, Geometry::DEFAULT)?;
            return Ok((
                Journal::with_file(
                    OpenOptions::new().read(true).write(true).open(path)?,
                    path,
                    Geometry::DEFAULT,
                    last + 1,
                ),
                replayed.len(),
            ));
        };
        Ok((
            Journal::with_file(file, path, geometry, last + 1),
            replayed.len(),
        ))
    }

    fn with_file(file: File, path: &Path, geometry: Geometry, next_seq: u64) -> Journal {
        Journal {
            file,
            path: path.to_owned(),
            geometry,
            next_seq: AtomicU64::new(next_seq),
            free: Mutex::new((0..geometry.slots).rev().collect()),
            freed: Condvar::new(),
            abandoned: AtomicU64::new(0),
            stuck: Mutex::new(Vec::new()),
        }
    }

    /// Where the journal lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Largest write one record holds, in bytes.
    pub fn max_bytes(&self) -> u32 {
        self.geometry.slot_data
    }

    /// Step 1: writes the record for `data` at `offset` to a free slot
    /// (waiting for one) and makes it durable.
    pub fn begin(&self, offset: u64, data: &[u8]) -> io::Result<Ticket> {
        if data.is_empty() || data.len() > self.geometry.slot_data as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "atomic write of {} bytes: the journal takes 1 to {}",
                    data.len(),
                    self.geometry.slot_data
                ),
            ));
        }
        let slot = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(s) = free.pop() {
                    break s;
                }
                if self.abandoned.load(Ordering::Relaxed) >= u64::from(self.geometry.slots) {
                    return Err(io::Error::other(format!(
                        "atomic-write journal {}: every slot holds an atomic write left unfinished by an I/O error; reopen the LUN to replay them",
                        self.path.display()
                    )));
                }
                free = self.freed.wait(free).unwrap_or_else(|e| e.into_inner());
            }
        };
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let record = encode_record(seq, offset, data);
        let header = RecordHeader {
            seq,
            offset,
            len: data.len() as u32,
            data_crc: crc32c_digest(data),
            done: false,
        };
        let ticket = Ticket { slot, header };
        let written = self
            .file
            .write_all_at(&record, self.geometry.slot_offset(slot))
            .and_then(|()| self.file.sync_data());
        match written {
            Ok(()) => Ok(ticket),
            Err(e) => {
                self.abandon(ticket);
                Err(e)
            }
        }
    }

    /// Gives up on a ticket after an I/O error: its record stays as it is
    /// (replayed at the next open if it is whole) and its slot stays taken,
    /// so that nothing overwrites a record that may still be needed.
    pub fn abandon(&self, t: Ticket) {
        self.stuck
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((t.header.offset, t.header.len));
        self.abandoned.fetch_add(1, Ordering::Relaxed);
        // Waiters re-check whether any slot can still come free.
        self.freed.notify_all();
    }

    /// Refuses a write of `len` bytes at `offset` over a record an I/O
    /// error left unfinished ([`Journal::abandon`]): the next open replays
    /// that record whole, which would put its data back over this write's
    /// after the write was acknowledged. Until the store is opened again
    /// those bytes take no write.
    pub fn check_unreplayed(&self, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 || self.abandoned.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        let stuck = self.stuck.lock().unwrap_or_else(|e| e.into_inner());
        let end = offset.saturating_add(len);
        match stuck
            .iter()
            .find(|&&(o, l)| offset < o.saturating_add(u64::from(l)) && o < end)
        {
            None => Ok(()),
            Some(&(o, l)) => Err(io::Error::other(format!(
                "atomic-write journal {}: bytes {o} to {} hold an atomic write an I/O error left \
                 unfinished, which the next open of the LUN writes in place; no write to them is \
                 taken until then (fix the error, then restart blockwire-target, or remove the \
                 LUN and add it back once its commands ended)",
                self.path.display(),
                o + u64::from(l)
            ))),
        }
    }

    /// Zeros every free slot and makes that durable: a finished record
    /// keeps its data in its slot until the slot is reused, a copy of user
    /// data apart from the medium that SANITIZE must not leave behind
    /// (SBC-4 4.11.1). A zeroed slot holds no record. Slots of atomic
    /// writes in flight, or left unfinished by an I/O error, are not free
    /// and are kept: the next open may still need them.
    pub fn erase_finished(&self) -> io::Result<()> {
        let free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let zeros = vec![0u8; self.geometry.stride() as usize];
        for &slot in free.iter() {
            self.file
                .write_all_at(&zeros, self.geometry.slot_offset(slot))?;
        }
        self.file.sync_data()
    }

    /// Step 3: the data is durable in place; marks the record done, makes
    /// that durable and frees the slot. If that fails the slot stays taken
    /// and the record pending: the data is whole in place, so replaying it
    /// at the next open is harmless, since those blocks take no later write
    /// before it ([`Journal::check_unreplayed`]).
    pub fn finish(&self, t: Ticket) -> io::Result<()> {
        let done = RecordHeader {
            done: true,
            ..t.header
        };
        let marked = self
            .file
            .write_all_at(&done.encode(), self.geometry.slot_offset(t.slot))
            .and_then(|()| self.file.sync_data());
        if let Err(e) = marked {
            self.abandon(t);
            return Err(e);
        }
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(t.slot);
        self.freed.notify_one();
        Ok(())
    }
}

/// Reads into `buf` from `offset` until it is full or the file ends;
/// returns the bytes read.
fn read_upto(f: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SLOT: u32 = 4096;

    #[test]
    fn record_round_trip_and_done() {
        let data = vec![0x5au8; 1024];
        let r = encode_record(7, 4096, &data);
        let mut slot = r.clone();
        slot.resize(SLOT as usize + RECORD_HEADER_LEN, 0);
        match parse_slot(&slot, SLOT, 1 << 20) {
            Slot::Pending { header, data: d } => {
                assert_eq!((header.seq, header.offset, header.len), (7, 4096, 1024));
                assert_eq!(d, &data[..]);
            }
            other => panic!("{other:?}"),
        }
        let h = RecordHeader {
            seq: 7,
            offset: 4096,
            len: 1024,
            data_crc: crc32c_digest(&data),
            done: true,
        };
        slot[..RECORD_HEADER_LEN].copy_from_slice(&h.encode());
        assert_eq!(parse_slot(&slot, SLOT, 1 << 20), Slot::Done { seq: 7 });
        // Beyond the backing file.
        slot[..RECORD_HEADER_LEN].copy_from_slice(&RecordHeader { done: false, ..h }.encode());
        assert!(matches!(parse_slot(&slot, SLOT, 4096), Slot::OutOfRange(_)));
        // Longer than the slot: torn, whatever the checksums say.
        assert_eq!(parse_slot(&slot, 512, 1 << 20), Slot::Torn);
        assert_eq!(parse_slot(&[0u8; 10], SLOT, 1 << 20), Slot::Empty);
        assert_eq!(parse_slot(&[1u8; 10], SLOT, 1 << 20), Slot::Torn);
    }

    #[test]
    fn file_header_checks() {
        let h = encode_file_header(Geometry::DEFAULT);
        assert_eq!(parse_file_header(&h), Ok(Geometry::DEFAULT));
        assert_eq!(parse_file_header(&h[..10]), Err(HeaderError::Truncated(10)));
        let mut bad = h.clone();
        bad[9] ^= 1;
        assert_eq!(parse_file_header(&bad), Err(HeaderError::Checksum));
        let huge = encode_file_header(Geometry {
            slots: 1 << 20,
            slot_data: 1,
        });
        assert!(matches!(
            parse_file_header(&huge),
            Err(HeaderError::Geometry { .. })
        ));
    }

    #[test]
    fn abandoned_slots_are_kept_and_never_waited_for_forever() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let (j, _) = Journal::open(&path, 1 << 20, |_, _| Ok(()), || Ok(())).unwrap();
        let tickets: Vec<Ticket> = (0..DEFAULT_SLOTS)
            .map(|i| j.begin(u64::from(i) * 512, &[i as u8; 512]).unwrap())
            .collect();
        let mut tickets = tickets.into_iter();
        let last = tickets.next().unwrap();
        for t in tickets {
            j.abandon(t);
        }
        j.finish(last).unwrap();
        // One slot is free again.
        let t = j.begin(0, &[9; 512]).unwrap();
        j.abandon(t);
        // Every slot now holds an abandoned record: an error, not a hang.
        let e = j.begin(0, &[9; 512]).unwrap_err();
        assert!(e.to_string().contains("reopen the LUN"), "{e}");
        drop(j);
        // The abandoned records are whole: the next open replays them.
        let mut seen = Vec::new();
        let (_, replayed) = Journal::open(
            &path,
            1 << 20,
            |off, data| {
                seen.push((off, data[0]));
                Ok(())
            },
            || Ok(()),
        )
        .unwrap();
        assert_eq!(replayed, DEFAULT_SLOTS as usize);
        // Oldest first: records 2, 3, 4 (offsets 512.., fills 1..), then 5.
        assert_eq!(seen, vec![(512, 1), (1024, 2), (1536, 3), (0, 9)]);
    }

    proptest! {
        /// Any bytes: no panic, and `Pending` only for a record whose
        /// header and data checksums hold and whose range fits.
        #[test]
        fn parse_slot_never_trusts_garbage(
            bytes in proptest::collection::vec(any::<u8>(), 0..600),
            slot_data in 0u32..1024,
            capacity in any::<u64>(),
        ) {
            if let Slot::Pending { header, data } = parse_slot(&bytes, slot_data, capacity) {
                prop_assert_eq!(data.len(), header.len as usize);
                prop_assert!(header.len <= slot_data);
                prop_assert_eq!(crc32c_digest(data), header.data_crc);
                prop_assert!(header.offset + u64::from(header.len) <= capacity);
            }
        }

        /// A record cut short at any byte, or with any one byte changed,
        /// is never replayed with other data than was written.
        #[test]
        fn damaged_record_is_torn_or_intact(
            data in proptest::collection::vec(any::<u8>(), 1..300),
            offset in 0u64..1_000_000,
            cut in any::<prop::sample::Index>(),
            flip in any::<prop::sample::Index>(),
            xor in 1u8..=255,
        ) {
            let r = encode_record(3, offset, &data);
            let cut = cut.index(r.len() + 1);
            match parse_slot(&r[..cut], 512, 2_000_000) {
                Slot::Pending { data: d, .. } => {
                    prop_assert_eq!(cut, r.len());
                    prop_assert_eq!(d, &data[..]);
                }
                Slot::Empty | Slot::Torn => prop_assert!(cut < r.len()),
                other => prop_assert!(false, "{:?}", other),
            }
            let mut bent = r.clone();
            let at = flip.index(bent.len());
            bent[at] ^= xor;
            if let Slot::Pending { header, data: d } = parse_slot(&bent, 512, 2_000_000) {
                // Only a change in the bytes no checksum covers (the
                // header's padding) can leave it whole.
                prop_assert!((33..36).contains(&at) || (40..64).contains(&at));
                prop_assert_eq!(header.offset, offset);
                prop_assert_eq!(d, &data[..]);
            }
        }

        /// Whole journal images of arbitrary bytes after a valid header.
        #[test]
        fn pending_records_on_garbage(
            tail in proptest::collection::vec(any::<u8>(), 0..9000),
            capacity in any::<u64>(),
        ) {
            let mut image = encode_file_header(Geometry { slots: 2, slot_data: 4000 });
            image.extend_from_slice(&tail);
            let (pending, _) = pending_records(&image, capacity).unwrap();
            prop_assert!(pending.len() <= 2);
        }
    }
}
