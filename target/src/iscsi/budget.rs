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

    /// Reserves `bytes`, or None when that would exceed the limit.
    pub fn try_reserve(self: &Arc<Self>, bytes: u64) -> Option<Reservation> {
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
        assert!(b.try_reserve(u64::MAX).is_none());
    }
}
