//! A block range lock: many writers of one logical unit run in parallel,
//! while a read-modify-write command (COMPARE AND WRITE, ORWRITE) holds its
//! range alone, so no other writer's data can land between its read and its
//! write.

use std::sync::Mutex;

use super::wake::QuietCondvar;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    id: u64,
    start: u64,
    end: u64,
    exclusive: bool,
    held: bool,
}

impl Entry {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start < end && start < self.end
    }
}

impl State {
    /// Whether request `id` (queued) must still wait for another entry.
    fn blocked(&self, id: u64, start: u64, end: u64, exclusive: bool) -> bool {
        self.entries.iter().any(|e| {
            e.id != id
                && e.overlaps(start, end)
                && if exclusive {
                    // Exclusive waits for every holder and every request
                    // queued before it, shared ones too: one it overtook
                    // could be overtaken again by each later exclusive
                    // request, for good. No cycle: a request only waits
                    // for holders and for earlier requests.
                    e.held || e.id < id
                } else {
                    // Shared waits for any exclusive holder or earlier
                    // exclusive waiter.
                    e.exclusive && (e.held || e.id < id)
                }
        })
    }
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    entries: Vec<Entry>,
}

/// Shared/exclusive locks over block ranges `[start, end)`.
///
/// Waiting exclusive requests block new overlapping shared ones, so a
/// steady stream of writes cannot starve a COMPARE AND WRITE; a waiting
/// shared request blocks new overlapping exclusive ones, so a stream of
/// exclusive holds cannot starve a write either.
#[derive(Debug, Default)]
pub(crate) struct RangeLock {
    state: Mutex<State>,
    changed: QuietCondvar,
}

/// A held range; released on drop.
#[derive(Debug)]
pub(crate) struct RangeGuard<'a> {
    lock: &'a RangeLock,
    id: u64,
}

impl RangeLock {
    /// Blocks until `[start, end)` can be held shared (for plain writes).
    pub fn shared(&self, start: u64, end: u64) -> RangeGuard<'_> {
        self.acquire(start, end, false)
    }

    /// Blocks until `[start, end)` can be held exclusively.
    pub fn exclusive(&self, start: u64, end: u64) -> RangeGuard<'_> {
        self.acquire(start, end, true)
    }

    fn acquire(&self, start: u64, end: u64, exclusive: bool) -> RangeGuard<'_> {
        let id = self.lock_id(start, end, exclusive);
        RangeGuard { lock: self, id }
    }

    /// Blocks until `[start, end)` is held (shared or exclusive) and returns
    /// the hold's id, which [`RangeLock::unlock_id`] releases. For holders
    /// that cannot keep a borrowed guard (a pipelined WRITE holds its range
    /// across asynchronous chunk writes, see `write_plan`).
    pub(crate) fn lock_id(&self, start: u64, end: u64, exclusive: bool) -> u64 {
        let end = end.max(start.saturating_add(1));
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let id = st.next_id;
        st.next_id += 1;
        st.entries.push(Entry {
            id,
            start,
            end,
            exclusive,
            held: false,
        });
        while st.blocked(id, start, end, exclusive) {
            st = self.changed.wait(st);
        }
        if let Some(e) = st.entries.iter_mut().find(|e| e.id == id) {
            e.held = true;
        }
        id
    }

    /// [`RangeLock::shared`] when that needs no waiting; None (nothing held
    /// or queued) otherwise. For callers that may not block.
    pub fn try_shared(&self, start: u64, end: u64) -> Option<RangeGuard<'_>> {
        let id = self.try_lock_id(start, end, false)?;
        Some(RangeGuard { lock: self, id })
    }

    /// Holds `[start, end)` as [`RangeLock::lock_id`] would when that needs
    /// no waiting, and returns the hold's id; None (nothing held or
    /// queued) when an overlapping holder or an earlier waiter it must
    /// yield to is there. For callers that may not block (an async worker
    /// thread), which then hand the command to a thread that may.
    pub(crate) fn try_lock_id(&self, start: u64, end: u64, exclusive: bool) -> Option<u64> {
        let end = end.max(start.saturating_add(1));
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let id = st.next_id;
        if st.blocked(id, start, end, exclusive) {
            return None;
        }
        st.next_id += 1;
        st.entries.push(Entry {
            id,
            start,
            end,
            exclusive,
            held: true,
        });
        Some(id)
    }

    /// How many requests wait for their range (queued, not yet held).
    #[cfg(feature = "fuzzing")]
    pub(crate) fn queued(&self) -> usize {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.entries.iter().filter(|e| !e.held).count()
    }

    /// Releases a hold taken with [`RangeLock::lock_id`].
    pub(crate) fn unlock_id(&self, id: u64) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.entries.retain(|e| e.id != id);
        drop(st);
        self.changed.notify_all();
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        self.lock.unlock_id(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    /// A shared request waiting for an exclusive holder is not overtaken
    /// by a later exclusive request over its range: otherwise a stream of
    /// exclusive holds that never overlap each other (an O_DIRECT unit's
    /// pipelined WRITEs, COMPARE AND WRITEs of neighbouring blocks) keeps
    /// one always held over the shared request, which waits for good.
    #[test]
    fn a_waiting_shared_request_is_not_overtaken_by_a_later_exclusive_one() {
        let l = Arc::new(RangeLock::default());
        let first = l.lock_id(0, 5, true);
        let waiter = std::thread::spawn({
            let l = l.clone();
            move || {
                let id = l.lock_id(0, 10, false);
                l.unlock_id(id);
            }
        });
        while l.state.lock().unwrap().entries.len() < 2 {
            std::thread::yield_now();
        }
        assert!(
            l.try_lock_id(5, 10, true).is_none(),
            "a later exclusive request went ahead of the waiting shared one"
        );
        l.unlock_id(first);
        waiter.join().unwrap();
        let later = l.try_lock_id(5, 10, true).expect("free again");
        l.unlock_id(later);
    }

    #[test]
    fn shared_overlap_exclusive_serialises() {
        let l = RangeLock::default();
        let a = l.shared(0, 10);
        let b = l.shared(5, 15);
        let c = l.exclusive(20, 30);
        drop((a, b, c));

        let lock = Arc::new(RangeLock::default());
        let inside = Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = lock.clone();
                let inside = inside.clone();
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let _g = lock.exclusive(0, 8);
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn try_lock_never_waits_and_leaves_nothing_queued_when_refused() {
        let l = RangeLock::default();
        // Shared beside shared.
        let a = l.try_lock_id(0, 8, false).expect("free range");
        let b = l.try_lock_id(4, 12, false).expect("shared beside shared");
        // Exclusive refused while shared holders overlap; disjoint is fine.
        assert!(l.try_lock_id(6, 7, true).is_none());
        let c = l.try_lock_id(12, 16, true).expect("disjoint exclusive");
        // Shared refused inside an exclusive hold.
        assert!(l.try_lock_id(15, 20, false).is_none());
        for id in [a, b, c] {
            l.unlock_id(id);
        }
        // A refused request left no waiter behind: everything is free again.
        let d = l.try_lock_id(0, 20, true).expect("all released");
        l.unlock_id(d);
        // An exclusive request waiting (queued, not held) makes a new
        // shared one yield too, so writes cannot starve it.
        let lock = Arc::new(RangeLock::default());
        let s = lock.lock_id(0, 4, false);
        let l2 = lock.clone();
        let waiter = std::thread::spawn(move || l2.unlock_id(l2.lock_id(2, 3, true)));
        while lock.state.lock().unwrap().entries.len() < 2 {
            std::thread::yield_now();
        }
        assert!(lock.try_lock_id(2, 3, false).is_none());
        lock.unlock_id(s);
        waiter.join().unwrap();
        assert!(lock.try_lock_id(2, 3, false).is_some());
    }
}
