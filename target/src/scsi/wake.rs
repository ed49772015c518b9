//! A condition variable that costs nothing to notify when no thread waits.
//!
//! `std::sync::Condvar::notify_all` is a futex system call every time. The
//! SCSI core notifies on every command's end (the unit's in-flight count,
//! the range lock), and almost always nobody waits, so each command paid a
//! system call for nothing. [`QuietCondvar`] counts its waiters and notifies
//! only when there are some.
//!
//! Why no wake-up is lost: a waiter counts itself while it holds the mutex,
//! before it checks its condition and waits. A notifier changes the state
//! under that mutex and reads the count afterwards. Either the waiter
//! counted itself before the notifier took the mutex (the notifier sees the
//! count), or it took the mutex after the notifier's change (its condition
//! check sees the change and it does not wait).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, MutexGuard};
use std::time::Duration;

#[derive(Debug, Default)]
pub(crate) struct QuietCondvar {
    inner: Condvar,
    waiters: AtomicUsize,
}

impl QuietCondvar {
    /// [`Condvar::wait`], the guard recovered from poisoning.
    pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let guard = self.inner.wait(guard).unwrap_or_else(|e| e.into_inner());
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        guard
    }

    /// [`Condvar::wait_timeout_while`], the guard recovered from poisoning.
    pub fn wait_timeout_while<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        limit: Duration,
        condition: impl FnMut(&mut T) -> bool,
    ) -> MutexGuard<'a, T> {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let (guard, _) = self
            .inner
            .wait_timeout_while(guard, limit, condition)
            .unwrap_or_else(|e| e.into_inner());
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        guard
    }

    /// Wakes every waiter, if there is one. Call after changing the state
    /// under the mutex the waiters use.
    pub fn notify_all(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.inner.notify_all();
        }
    }
}
