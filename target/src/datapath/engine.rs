//! The I/O engine interface: batches of reads and writes between files and
//! pool buffers, completions delivered on a channel as they finish.

use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

use super::buffer::{BufLease, BufferPool};
use super::threadpool::ThreadPoolEngine;
use super::uring::UringEngine;

/// Read from the file into the buffer, or write the buffer to the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// File to buffer.
    Read,
    /// Buffer to file.
    Write,
}

/// One operation: `len` bytes between `file` at `file_offset` and `buf` at
/// `buf_offset`. The engine keeps `file` and `buf` alive until it has
/// delivered the completion, and drops its clones *before* delivering it.
#[derive(Debug, Clone)]
pub struct IoOp {
    /// Direction.
    pub kind: OpKind,
    /// The file (O_DIRECT or not).
    pub file: Arc<File>,
    /// Byte offset in the file.
    pub file_offset: u64,
    /// The pool buffer.
    pub buf: Arc<BufLease>,
    /// Byte offset in the buffer.
    pub buf_offset: usize,
    /// Length in bytes.
    pub len: usize,
    /// Which independent stream (stripe member, disk) this op belongs to:
    /// a hint real engines ignore and the emulated disk paces by.
    pub stream: u16,
    /// Returned in the completion.
    pub tag: u64,
}

/// The end of one [`IoOp`].
#[derive(Debug)]
pub struct Completion {
    /// The op's tag.
    pub tag: u64,
    /// Bytes moved (less than `len` only at end of file), or the error.
    pub result: io::Result<usize>,
}

/// Where completions go. Unbounded tokio channel: `send` never blocks, so
/// engine threads can use it, and the receiver may be async (`recv().await`
/// in the fabric) or blocking (`blocking_recv()` on a plain thread).
pub type CompletionTx = tokio::sync::mpsc::UnboundedSender<Completion>;
/// The receiving side of [`CompletionTx`].
pub type CompletionRx = tokio::sync::mpsc::UnboundedReceiver<Completion>;

/// A new completion channel.
pub fn completion_channel() -> (CompletionTx, CompletionRx) {
    tokio::sync::mpsc::unbounded_channel()
}

/// Which engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// io_uring with registered buffers (READ_FIXED/WRITE_FIXED).
    IoUring,
    /// pread/pwrite on a thread pool.
    ThreadPool,
    /// The token-bucket disk emulator (benchmarks, tests).
    Emulated,
}

/// Moves data between files and pool buffers.
pub trait Engine: Send + Sync {
    /// Which engine this is.
    fn kind(&self) -> EngineKind;
    /// One line for the start-up banner.
    fn describe(&self) -> String;
    /// The buffers this engine can use (registered with the kernel for
    /// io_uring). Every op's buffer must come from it.
    fn pool(&self) -> &BufferPool;
    /// Starts every op of the batch (one submission for io_uring); each op's
    /// completion goes to `done` as soon as it finishes, in any order, and
    /// exactly once: an op the engine could not start completes at once
    /// with the error. A caller may therefore take every op as ended only
    /// when it heard of it: a WRITE that lets its block range go earlier
    /// could see its data land over a later command's. An error returned
    /// means the engine has stopped and no op of the batch is in flight.
    fn submit(&self, ops: Vec<IoOp>, done: &CompletionTx) -> io::Result<()>;
}

/// Which engine to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EnginePref {
    /// io_uring when the kernel allows it, else the thread pool. The
    /// environment variable `BLOCKWIRE_IO_ENGINE` (`uring` or `threadpool`)
    /// overrides.
    #[default]
    Auto,
    /// io_uring or an error.
    IoUring,
    /// The thread pool.
    ThreadPool,
}

/// Opens an engine over `pool`: io_uring if available (detected by creating
/// a ring and registering the pool), else the pread/pwrite thread pool.
/// The returned string says which and, for a fallback, why: log it.
pub fn open_engine(pool: BufferPool, pref: EnginePref) -> io::Result<(Arc<dyn Engine>, String)> {
    let pref = match (pref, std::env::var("BLOCKWIRE_IO_ENGINE").ok().as_deref()) {
        (EnginePref::Auto, Some("uring")) => EnginePref::IoUring,
        (EnginePref::Auto, Some("threadpool")) => EnginePref::ThreadPool,
        (p, _) => p,
    };
    match pref {
        EnginePref::IoUring => {
            let e = UringEngine::new(pool, 1024)?;
            let d = e.describe();
            Ok((Arc::new(e), d))
        }
        EnginePref::ThreadPool => {
            let e = ThreadPoolEngine::new(pool, 4);
            let d = e.describe();
            Ok((Arc::new(e), d))
        }
        EnginePref::Auto => match UringEngine::new(pool.clone(), 1024) {
            Ok(e) => {
                let d = e.describe();
                Ok((Arc::new(e), d))
            }
            Err(err) => {
                let e = ThreadPoolEngine::new(pool, 4);
                let d = format!("{} (io_uring unavailable: {err})", e.describe());
                Ok((Arc::new(e), d))
            }
        },
    }
}

/// Opens `path` with O_DIRECT (reads and, if `write`, writes). Fails with
/// the OS error when the file system refuses O_DIRECT (tmpfs does).
pub fn open_direct(path: &Path, write: bool) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

/// Opens `path` with O_DIRECT when the file system supports it, else
/// buffered; the flag says which.
pub fn open_direct_or_buffered(path: &Path, write: bool) -> io::Result<(File, bool)> {
    match open_direct(path, write) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((
            std::fs::OpenOptions::new()
                .read(true)
                .write(write)
                .open(path)?,
            false,
        )),
        Err(e) => Err(e),
    }
}
