//! The soft completion queue: a locked FIFO and a tokio `Notify`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::rdma::{Completion, CompletionQueue, Result};

#[derive(Clone)]
pub struct SoftCq {
    inner: Arc<Inner>,
}

struct Inner {
    queue: Mutex<VecDeque<Completion>>,
    notify: Notify,
    depth: usize,
    overflow_warned: AtomicBool,
}

impl SoftCq {
    pub fn new(depth: usize) -> SoftCq {
        SoftCq {
            inner: Arc::new(Inner {
                queue: Mutex::new(VecDeque::with_capacity(depth.min(4096))),
                notify: Notify::new(),
                depth: depth.max(1),
                overflow_warned: AtomicBool::new(false),
            }),
        }
    }

    pub(crate) fn push(&self, c: Completion) {
        let mut q = self.inner.queue.lock().unwrap();
        q.push_back(c);
        if q.len() > self.inner.depth && !self.inner.overflow_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "soft RDMA: completion queue over its depth {} (a verbs CQ would overflow)",
                self.inner.depth
            );
        }
        drop(q);
        // Waiters create their `Notified` before checking the queue, so none is missed.
        self.inner.notify.notify_waiters();
    }

    pub fn len(&self) -> usize {
        self.inner.queue.lock().unwrap().len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl CompletionQueue for SoftCq {
    fn poll(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        let mut q = self.inner.queue.lock().unwrap();
        let n = max.min(q.len());
        out.extend(q.drain(..n));
        n
    }

    async fn next(&self) -> Result<Completion> {
        loop {
            let notified = self.inner.notify.notified();
            if let Some(c) = self.inner.queue.lock().unwrap().pop_front() {
                return Ok(c);
            }
            notified.await;
        }
    }
}
