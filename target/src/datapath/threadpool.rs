//! The fallback engine: pread/pwrite on a few threads, for kernels or
//! sandboxes without io_uring. Same contract as the io_uring engine.

use std::io;
use std::os::unix::fs::FileExt;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::buffer::BufferPool;
use super::engine::{Completion, CompletionTx, Engine, EngineKind, IoOp, OpKind};

type Job = (IoOp, CompletionTx);

/// pread/pwrite on `threads` worker threads.
pub struct ThreadPoolEngine {
    pool: BufferPool,
    tx: Option<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
}

impl ThreadPoolEngine {
    /// Starts `threads` workers.
    pub fn new(pool: BufferPool, threads: usize) -> ThreadPoolEngine {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let workers = (0..threads.max(1))
            .map(|i| {
                let rx = rx.clone();
                std::thread::Builder::new()
                    .name(format!("bw-io-{i}"))
                    .spawn(move || worker(&rx))
                    .expect("spawn I/O worker")
            })
            .collect();
        ThreadPoolEngine {
            pool,
            tx: Some(tx),
            workers,
        }
    }
}

/// Runs one op to completion with pread/pwrite, retrying short transfers.
pub(crate) fn run_op(op: &IoOp) -> io::Result<usize> {
    // The caller's bug, answered as an error: a panic here would take a
    // worker away from every LUN for good.
    if op
        .buf_offset
        .checked_add(op.len)
        .is_none_or(|end| end > op.buf.capacity())
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "I/O op beyond its buffer",
        ));
    }
    let mut done = 0;
    while done < op.len {
        // SAFETY: in bounds; the op owns this range of the buffer until it
        // completes (the engine contract).
        let region = unsafe {
            std::slice::from_raw_parts_mut(op.buf.as_ptr().add(op.buf_offset + done), op.len - done)
        };
        let off = op.file_offset + done as u64;
        let r = match op.kind {
            OpKind::Read => op.file.read_at(region, off),
            OpKind::Write => op.file.write_at(region, off),
        };
        match r {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

fn worker(rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = rx.lock().unwrap().recv();
        let Ok((op, tx)) = job else { return };
        let result = run_op(&op);
        let tag = op.tag;
        drop(op);
        let _ = tx.send(Completion { tag, result });
    }
}

impl Engine for ThreadPoolEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::ThreadPool
    }
    fn describe(&self) -> String {
        format!("thread pool ({} pread/pwrite workers)", self.workers.len())
    }
    fn pool(&self) -> &BufferPool {
        &self.pool
    }
    fn submit(&self, ops: Vec<IoOp>, done: &CompletionTx) -> io::Result<()> {
        let tx = self.tx.as_ref().expect("engine running");
        for op in ops {
            if let Err(refused) = tx.send((op, done.clone())) {
                let (op, done) = refused.0;
                let tag = op.tag;
                drop(op); // the buffer goes back before its owner hears
                let _ = done.send(Completion {
                    tag,
                    result: Err(io::Error::other("I/O workers stopped")),
                });
            }
        }
        Ok(())
    }
}

impl Drop for ThreadPoolEngine {
    fn drop(&mut self) {
        self.tx.take();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
