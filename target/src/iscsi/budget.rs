//! Bounds on the memory WRITE and READ data may pin: one per connection,
//! within one for the whole fabric.
//!
//! Each WRITE gathers its whole Expected Data Transfer Length before it
//! runs (from Data-Out, or by RDMA Read from an RDMA-assisted initiator's
//! buffer), so without a bound an initiator could pin window × max transfer
//! bytes (128 × 32 MiB). A command that would exceed its connection's
//! budget is answered TASK SET FULL and retried by the initiator later.
//! The connections' budgets together are bounded by the fabric's
//! (`[fabric] write_budget_total`), or a thousand connections could each
//! pin their own: a command the fabric's budget cannot take is answered
//! TASK SET FULL when its session has other commands in the task set, and
//! BUSY when it has none (SAM-5 5.3: TASK SET FULL tells an initiator its
//! own commands fill the task set), and retried. The fabric's budget
//! bounds memory, not fairness (see
//! [`default_budget_total`](super::default_budget_total)).
//!
//! READ data the core has read whole wait in memory until the writer sends
//! them, and an initiator that stops reading its socket would leave them
//! there: each such READ holds a share of its connection's READ budget and
//! of the fabric's ([`ReadDataHeld`]) and waits for one when both are
//! taken, so READs slow to the initiator's pace instead of filling memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes of WRITE data a connection (or the whole fabric) may hold at once.
#[derive(Debug)]
pub struct WriteBudget {
    limit: u64,
    used: AtomicU64,
    /// The budget this one is drawn from as well (the fabric's, for a
    /// connection's).
    within: Option<Arc<WriteBudget>>,
}

/// Bytes held against a budget (and the budget it is within) until
/// dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<WriteBudget>,
    bytes: u64,
    /// The same bytes held against the enclosing budget (given back when
    /// this is dropped).
    _within: Option<Box<Reservation>>,
}

/// Why a reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The budget itself is full.
    Full,
    /// The budget it is within is full.
    EnclosingFull,
}

impl WriteBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Arc<WriteBudget> {
        Arc::new(WriteBudget {
            limit,
            used: AtomicU64::new(0),
            within: None,
        })
    }

    /// A budget of `limit` bytes whose reservations are also drawn from
    /// `enclosing`.
    pub fn within(limit: u64, enclosing: Arc<WriteBudget>) -> Arc<WriteBudget> {
        Arc::new(WriteBudget {
            limit,
            used: AtomicU64::new(0),
            within: Some(enclosing),
        })
    }

    /// Reserves `bytes`, or None when that would exceed the limit (this
    /// one's or the enclosing budget's).
    #[cfg(test)]
    pub fn try_reserve(self: &Arc<Self>, bytes: u64) -> Option<Reservation> {
        self.reserve(bytes).ok()
    }

    /// Reserves `bytes`, or says which budget is full. A command larger
    /// than the whole budget (a `write_budget` below the 32 MiB MAXIMUM
    /// TRANSFER LENGTH) takes the whole budget, when nothing else holds
    /// any: refused each time, it would be answered TASK SET FULL for good,
    /// as the READ budget's largest share is the whole of it.
    pub fn reserve(self: &Arc<Self>, bytes: u64) -> Result<Reservation, Refused> {
        let bytes = bytes.min(self.limit);
        // This budget first: a connection at its own limit, retrying,
        // never takes the enclosing budget's room from other connections,
        // even for a moment.
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let next = used.checked_add(bytes).ok_or(Refused::Full)?;
            if next > self.limit {
                return Err(Refused::Full);
            }
            match self
                .used
                .compare_exchange_weak(used, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => used = now,
            }
        }
        let mut mine = Reservation {
            budget: self.clone(),
            bytes,
            _within: None,
        };
        if let Some(enclosing) = &self.within {
            // Refused there, `mine` is dropped and gives its share back.
            let outer = enclosing
                .reserve(bytes)
                .map_err(|_| Refused::EnclosingFull)?;
            mine._within = Some(Box::new(outer));
        }
        Ok(mine)
    }

    /// Bytes reserved now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A READ budget: a semaphore of one permit per byte, and its size.
#[derive(Clone, Debug)]
pub(crate) struct ReadBudget {
    permits: Arc<tokio::sync::Semaphore>,
    size: usize,
}

impl ReadBudget {
    /// A budget of `bytes` (at least one, at most the semaphore's most).
    pub(crate) fn new(bytes: u64) -> ReadBudget {
        let size = usize::try_from(bytes)
            .unwrap_or(usize::MAX)
            .clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        ReadBudget {
            permits: Arc::new(tokio::sync::Semaphore::new(size)),
            size,
        }
    }

    /// Bytes held now.
    pub(crate) fn held(&self) -> u64 {
        self.size.saturating_sub(self.permits.available_permits()) as u64
    }

    /// At most the whole budget: a READ larger than the budget holds all
    /// of it, rather than waiting for good.
    fn share(&self, len: u32) -> u32 {
        u32::try_from(self.size).map_or(len, |size| len.min(size))
    }

    /// `len` bytes of it (see [`Self::share`]), if there is room now.
    fn try_take(&self, len: u32) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.permits
            .clone()
            .try_acquire_many_owned(self.share(len))
            .ok()
    }

    /// `len` bytes of it (see [`Self::share`]), once they are free.
    async fn take(&self, len: u32) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.permits
            .clone()
            .acquire_many_owned(self.share(len))
            .await
            .ok()
    }
}

/// A READ's data held in memory until sent: its shares of its connection's
/// READ budget and the fabric's, given back when dropped.
#[derive(Debug)]
pub(crate) struct ReadDataHeld {
    _connection: tokio::sync::OwnedSemaphorePermit,
    _fabric: tokio::sync::OwnedSemaphorePermit,
}

impl ReadDataHeld {
    /// `len` bytes of `connection`'s budget and of `fabric`'s, if both have
    /// room now (without room in the fabric's, the connection's share goes
    /// back).
    pub(crate) fn try_take(
        connection: &ReadBudget,
        fabric: &ReadBudget,
        len: u32,
    ) -> Option<ReadDataHeld> {
        let connection = connection.try_take(len)?;
        let fabric = fabric.try_take(len)?;
        Some(ReadDataHeld {
            _connection: connection,
            _fabric: fabric,
        })
    }

    /// `len` bytes of `connection`'s budget, then of `fabric`'s, once they
    /// are free (None only if a budget were closed, which it never is).
    /// The connection's share first: a connection whose own data fill its
    /// budget waits on its initiator without holding any of the fabric's.
    pub(crate) async fn take(
        connection: &ReadBudget,
        fabric: &ReadBudget,
        len: u32,
    ) -> Option<ReadDataHeld> {
        let connection = connection.take(len).await?;
        let fabric = fabric.take(len).await?;
        Some(ReadDataHeld {
            _connection: connection,
            _fabric: fabric,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_bounded_and_returned() {
        let b = WriteBudget::new(100);
        let r1 = b.try_reserve(60).unwrap();
        assert!(b.try_reserve(50).is_none());
        let r2 = b.try_reserve(40).unwrap();
        assert_eq!(b.used(), 100);
        drop(r1);
        assert_eq!(b.used(), 40);
        drop(r2);
        assert_eq!(b.used(), 0);
    }

    /// A command larger than the budget runs alone, holding all of it:
    /// refused whenever anything else holds a share, taken once none does.
    #[test]
    fn a_command_larger_than_the_budget_takes_all_of_it_when_it_is_free() {
        let b = WriteBudget::new(100);
        let small = b.try_reserve(10).unwrap();
        assert!(b.try_reserve(150).is_none(), "not beside another share");
        drop(small);
        let big = b.try_reserve(150).expect("taken once the budget is free");
        assert_eq!(b.used(), 100);
        assert!(b.try_reserve(1).is_none(), "it holds the whole budget");
        drop(big);
        assert_eq!(b.used(), 0);
        assert!(b.try_reserve(u64::MAX).is_some());
    }

    /// Connection budgets within a fabric's: each connection's reservation
    /// is drawn from both, a full fabric budget refuses a connection whose
    /// own budget has room (and says so), and a refusal takes nothing from
    /// either.
    #[test]
    fn connection_budgets_are_drawn_from_the_fabrics() {
        let fabric = WriteBudget::new(100);
        let a = WriteBudget::within(80, fabric.clone());
        let b = WriteBudget::within(80, fabric.clone());
        let held = a.reserve(70).unwrap();
        assert_eq!((a.used(), fabric.used()), (70, 70));
        assert_eq!(a.reserve(20).unwrap_err(), Refused::Full);
        assert_eq!(fabric.used(), 70, "nothing taken from the fabric's");
        assert_eq!(b.reserve(40).unwrap_err(), Refused::EnclosingFull);
        assert_eq!(
            (b.used(), fabric.used()),
            (0, 70),
            "a refusal takes nothing"
        );
        let small = b.reserve(30).unwrap();
        assert_eq!(fabric.used(), 100);
        drop(held);
        assert_eq!((a.used(), fabric.used()), (0, 30));
        // The connection's own limit, with the fabric's room: Full, and
        // the fabric's share given back.
        let c = WriteBudget::within(10, fabric.clone());
        let ten = c.reserve(10).unwrap();
        assert_eq!(c.reserve(5).unwrap_err(), Refused::Full);
        assert_eq!(fabric.used(), 40);
        drop((small, ten));
        assert_eq!(fabric.used(), 0);
    }
}
