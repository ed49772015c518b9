//! A per-connection bound on the memory WRITE data may pin.
//!
//! Each WRITE gathers its whole Expected Data Transfer Length before it
//! runs (from Data-Out, or by RDMA Read from an RDMA-assisted initiator's
//! buffer), so without a bound an initiator could pin window × max transfer
//! bytes (128 × 32 MiB). A command that would exceed the budget is answered
//! TASK SET FULL and retried by the initiator later.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes of WRITE data a connection may hold at once.
#[derive(Debug)]
pub struct WriteBudget {
    limit: u64,
    used: AtomicU64,
}

/// Bytes held against a budget until dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<WriteBudget>,
    bytes: u64,
}

impl WriteBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Arc<WriteBudget> {
        Arc::new(WriteBudget {
            limit,
            used: AtomicU64::new(0),
        })
    }

    /// Reserves `bytes`, or None when that would exceed the limit. A
    /// command larger than the whole budget (a `write_budget` below the
    /// 32 MiB MAXIMUM TRANSFER LENGTH) takes the whole budget, when nothing
    /// else holds any: refused each time, it would be answered TASK SET
    /// FULL for good, as the READ budget's largest share is the whole of it.
    pub fn try_reserve(self: &Arc<Self>, bytes: u64) -> Option<Reservation> {
        let bytes = bytes.min(self.limit);
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let next = used.checked_add(bytes)?;
            if next > self.limit {
                return None;
            }
            match self
                .used
                .compare_exchange_weak(used, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    return Some(Reservation {
                        budget: self.clone(),
                        bytes,
                    })
                }
                Err(now) => used = now,
            }
        }
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
}
