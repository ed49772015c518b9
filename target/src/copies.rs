//! A debug copy counter: how many times the bytes of READ payloads are
//! copied on their way from the backstore to the socket, per data path
//! (the bytes user space copies per command, so that a benchmark proves
//! each path's copy count).
//!
//! What is counted, and where it is incremented:
//! - `user_copied`: bytes our own code memcpys (the RAM backstore's read,
//!   the O_DIRECT bounce buffer's copy into the command's buffer, the
//!   writer's coalescing of small payloads into one send buffer). Counted
//!   at each `copy_from_slice` / `encode_into`.
//! - `read_to_user`: bytes the kernel copied from the page cache into a
//!   user buffer (a buffered `pread`). Counted where the read is issued; an
//!   `O_DIRECT` read (DMA) and `sendfile` count nothing here.
//! - `sent_from_user`: payload bytes a plain `write`/`writev` handed to the
//!   kernel from user memory (the kernel copies them into socket buffers).
//! - `sendfile`: payload bytes `sendfile(2)` moved from the page cache to
//!   the socket (no user-space buffer).
//! - `zc_sent`: payload bytes sent with `MSG_ZEROCOPY`; once the kernel's
//!   completion notification arrives they are split into `zc_copied` (the
//!   kernel copied anyway, e.g. on loopback: `SO_EE_CODE_ZEROCOPY_COPIED`)
//!   and `zc_zero` (the NIC read the pages).
//!
//! Copies per payload byte = (user_copied + read_to_user + sent_from_user
//! + zc_copied) / payload.
//!
//! Counters are process-wide atomics per [`CopyPath`]; a connection's
//! writer keeps a per-command tally (by ITT) and adds it here when the
//! command's status leaves, logging it at trace level. [`log_summary`]
//! prints the totals (the daemon calls it at shutdown).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The data path a READ's payload took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CopyPath {
    /// The SCSI core reads into a buffer (serial path), the writer sends it.
    Copy,
    /// The payload goes from the page cache to the socket by `sendfile(2)`.
    Sendfile,
    /// The I/O engine reads into a registered buffer (synchronized or
    /// direct path), the writer sends from it.
    Engine,
    /// `--no-net`: read, not sent.
    NoNet,
}

impl CopyPath {
    /// Every path, in report order.
    pub const ALL: [CopyPath; 4] = [
        CopyPath::Copy,
        CopyPath::Sendfile,
        CopyPath::Engine,
        CopyPath::NoNet,
    ];

    /// Name for logs.
    pub fn name(self) -> &'static str {
        match self {
            CopyPath::Copy => "copy",
            CopyPath::Sendfile => "sendfile",
            CopyPath::Engine => "engine",
            CopyPath::NoNet => "no-net",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Counts of one command, or totals of one path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Commands (READs) finished.
    pub commands: u64,
    /// Data-In payload bytes (read, and sent unless `--no-net`).
    pub payload: u64,
    /// Bytes memcpy'd by user space.
    pub user_copied: u64,
    /// Bytes the kernel copied from the page cache into user buffers.
    pub read_to_user: u64,
    /// Payload bytes sent from user memory by a copying send.
    pub sent_from_user: u64,
    /// Payload bytes sent by `sendfile(2)`.
    pub sendfile: u64,
    /// Payload bytes sent with `MSG_ZEROCOPY`.
    pub zc_sent: u64,
    /// Of those, bytes the kernel reported it copied anyway.
    pub zc_copied: u64,
    /// Of those, bytes the kernel reported sent without a copy.
    pub zc_zero: u64,
}

impl Counts {
    /// CPU copies of payload bytes (user or kernel), known so far.
    pub fn copies(&self) -> u64 {
        self.user_copied + self.read_to_user + self.sent_from_user + self.zc_copied
    }

    /// Copies per payload byte.
    pub fn copies_per_byte(&self) -> f64 {
        if self.payload == 0 {
            0.0
        } else {
            self.copies() as f64 / self.payload as f64
        }
    }

    /// `self - earlier`, field by field (for test deltas).
    pub fn since(&self, earlier: &Counts) -> Counts {
        Counts {
            commands: self.commands - earlier.commands,
            payload: self.payload - earlier.payload,
            user_copied: self.user_copied - earlier.user_copied,
            read_to_user: self.read_to_user - earlier.read_to_user,
            sent_from_user: self.sent_from_user - earlier.sent_from_user,
            sendfile: self.sendfile - earlier.sendfile,
            zc_sent: self.zc_sent - earlier.zc_sent,
            zc_copied: self.zc_copied - earlier.zc_copied,
            zc_zero: self.zc_zero - earlier.zc_zero,
        }
    }
}

struct Atomics([AtomicU64; 9]);

impl Atomics {
    fn add(&self, c: &Counts) {
        let v = [
            c.commands,
            c.payload,
            c.user_copied,
            c.read_to_user,
            c.sent_from_user,
            c.sendfile,
            c.zc_sent,
            c.zc_copied,
            c.zc_zero,
        ];
        for (a, v) in self.0.iter().zip(v) {
            if v != 0 {
                a.fetch_add(v, Ordering::Relaxed);
            }
        }
    }

    fn get(&self) -> Counts {
        let v: Vec<u64> = self.0.iter().map(|a| a.load(Ordering::Relaxed)).collect();
        Counts {
            commands: v[0],
            payload: v[1],
            user_copied: v[2],
            read_to_user: v[3],
            sent_from_user: v[4],
            sendfile: v[5],
            zc_sent: v[6],
            zc_copied: v[7],
            zc_zero: v[8],
        }
    }
}

static TOTALS: [Atomics; 4] = [
    Atomics::new(),
    Atomics::new(),
    Atomics::new(),
    Atomics::new(),
];

impl Atomics {
    const fn new() -> Atomics {
        Atomics([const { AtomicU64::new(0) }; 9])
    }
}

/// The totals of `path` since the process started.
pub fn totals(path: CopyPath) -> Counts {
    TOTALS[path.index()].get()
}

/// Adds `c` to the totals of `path`.
pub fn add(path: CopyPath, c: &Counts) {
    TOTALS[path.index()].add(c);
}

/// Logs the totals of every path that carried a command (at info level:
/// called once, at shutdown).
pub fn log_summary() {
    for path in CopyPath::ALL {
        let t = totals(path);
        if t.commands == 0 && t.payload == 0 {
            continue;
        }
        tracing::info!(
            path = path.name(),
            commands = t.commands,
            payload = t.payload,
            user_copied = t.user_copied,
            read_to_user = t.read_to_user,
            sent_from_user = t.sent_from_user,
            sendfile = t.sendfile,
            zc_sent = t.zc_sent,
            zc_copied = t.zc_copied,
            zc_zero = t.zc_zero,
            copies_per_byte = format!("{:.3}", t.copies_per_byte()),
            "copy counter summary"
        );
    }
}

thread_local! {
    /// Copies made by the SCSI core on this thread since the last
    /// [`take_thread`]: (user_copied, read_to_user).
    static CORE: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Our code memcpy'd `n` payload bytes on this thread (backstores).
pub fn note_user_copy(n: usize) {
    CORE.with(|c| {
        let (u, r) = c.get();
        c.set((u + n as u64, r));
    });
}

/// The kernel copied `n` bytes from the page cache into a user buffer on
/// this thread (a buffered pread).
pub fn note_read_to_user(n: usize) {
    CORE.with(|c| {
        let (u, r) = c.get();
        c.set((u, r + n as u64));
    });
}

/// The copies noted on this thread since the last call, as counts; resets
/// them. Call before and after running a command on a blocking thread.
pub fn take_thread() -> Counts {
    let (user_copied, read_to_user) = CORE.with(|c| c.replace((0, 0)));
    Counts {
        user_copied,
        read_to_user,
        ..Counts::default()
    }
}

/// Runs `f` (a command in the SCSI core, on a blocking thread) and returns
/// its result with the copies it noted on this thread.
pub fn counted<T>(f: impl FnOnce() -> T) -> (T, Counts) {
    let _ = take_thread();
    let r = f();
    (r, take_thread())
}

/// Entries a connection's tracker keeps at most: a full window of commands
/// many times over. Commands aborted before their status leaves never
/// finish their entry; beyond this bound those entries are dropped.
const MAX_TRACKED: usize = 4096;

/// One connection's per-command tallies, keyed by ITT.
#[derive(Debug, Default)]
pub struct Tracker {
    open: Mutex<foldhash::HashMap<u32, (CopyPath, Counts, bool)>>,
}

impl Tracker {
    fn lock(&self) -> std::sync::MutexGuard<'_, foldhash::HashMap<u32, (CopyPath, Counts, bool)>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A READ `itt` takes `path`; `core` holds copies already made reading
    /// it. `buffered_read` says the payload will have been read through the
    /// page cache into a user buffer (the engine's buffered reads), counted
    /// once per payload byte when the command finishes.
    pub fn begin(&self, itt: u32, path: CopyPath, core: Counts, buffered_read: bool) {
        let mut open = self.lock();
        if open.len() >= MAX_TRACKED {
            tracing::debug!(
                entries = open.len(),
                "copy tracker full (aborted commands): dropping its entries"
            );
            open.clear();
        }
        open.insert(itt, (path, core, buffered_read));
    }

    /// Adds what sending part of `itt`'s payload cost; `payload` bytes sent.
    pub fn on_send(&self, itt: u32, f: impl FnOnce(&mut Counts)) -> Option<CopyPath> {
        let mut open = self.lock();
        let e = open.get_mut(&itt)?;
        f(&mut e.1);
        Some(e.0)
    }

    /// `itt`'s status left: add its tally to the path totals and log it.
    pub fn finish(&self, itt: u32) {
        let Some((path, mut c, buffered_read)) = self.lock().remove(&itt) else {
            return;
        };
        c.commands = 1;
        if buffered_read {
            c.read_to_user += c.payload;
        }
        add(path, &c);
        tracing::trace!(
            itt,
            path = path.name(),
            payload = c.payload,
            user_copied = c.user_copied,
            read_to_user = c.read_to_user,
            sent_from_user = c.sent_from_user,
            sendfile = c.sendfile,
            zc_sent = c.zc_sent,
            "READ copies"
        );
    }

    /// Forgets `itt` (aborted: nothing more will be sent).
    pub fn forget(&self, itt: u32) {
        self.lock().remove(&itt);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_notes_are_taken_once() {
        let _ = take_thread();
        note_user_copy(10);
        note_read_to_user(7);
        let c = take_thread();
        assert_eq!((c.user_copied, c.read_to_user), (10, 7));
        assert_eq!(take_thread(), Counts::default());
    }

    #[test]
    fn tracker_adds_to_its_path_on_finish() {
        let t = Tracker::default();
        let before = totals(CopyPath::NoNet);
        t.begin(5, CopyPath::NoNet, Counts::default(), true);
        t.on_send(5, |c| {
            c.payload += 100;
            c.sent_from_user += 100;
        });
        t.finish(5);
        t.finish(5);
        let d = totals(CopyPath::NoNet).since(&before);
        assert_eq!((d.commands, d.payload, d.read_to_user), (1, 100, 100));
        assert_eq!(d.copies_per_byte(), 2.0);
    }
}
