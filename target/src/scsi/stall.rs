//! The stall switch of a logical unit: a fault-injection gate every media
//! command passes before it reaches the backstore.
//!
//! While a unit is stalled, each command that would touch the medium (READ,
//! WRITE, VERIFY, WRITE SAME, UNMAP, COMPARE AND WRITE, ORWRITE, PRE-FETCH,
//! SYNCHRONIZE CACHE, GET LBA STATUS, EXTENDED COPY, SANITIZE) waits at the gate, on
//! its blocking thread, before the unit counts it in flight, checks
//! reservations or takes a range lock; everything else (TEST UNIT READY,
//! INQUIRY, REPORT LUNS, MODE SENSE, REPORT TARGET PORT GROUPS, persistent
//! reservations...) is answered as usual, and so is task management, which
//! the fabric handles apart. It is what a dead disk behind a live
//! controller looks like to an initiator, and what makes the Linux SCSI
//! error handler escalate (ABORT TASK, LUN RESET, target reset, session
//! drop).
//!
//! A waiting command leaves the gate when the stall is lifted, or as soon
//! as its task is aborted: the fabric runs each command's core calls inside
//! [`abortable`] with the task's abort flag, and the gate looks at that flag
//! while it waits ([`POLL`]) and once more when it opens. An aborted command
//! never reaches the backstore; the core answers it TASK ABORTED, which the
//! fabric does not send (the task is gone). The fabric's own data paths
//! (sendfile, the I/O engine, double-buffered writes) validate each READ and
//! WRITE through [`LunTable::plan_read`](super::LunTable::plan_read) and
//! [`LunTable::plan_write`](super::LunTable::plan_write), which pass the
//! same gate first, so no path goes around it.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use blockwire_pdu::scsi::opcode as op;

/// How often a command waiting at a stalled gate looks at its abort flag.
pub const POLL: Duration = Duration::from_millis(20);

thread_local! {
    /// The abort flag of the task whose core calls run on this thread.
    static TASK_ABORT: RefCell<Option<Arc<AtomicBool>>> = const { RefCell::new(None) };
    /// Core calls on this thread must not wait at a gate (they run on an async
    /// worker, see [`without_waiting`]).
    static NO_WAIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` (core calls that must not block: on an async worker thread) so that no
/// stall gate waits: a caller checks [`StallGate::is_stalled`] first and goes to a
/// blocking thread when the unit is stalled; a stall set after that check finds the
/// command already past the gate, as if it had arrived a moment earlier.
pub fn without_waiting<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            NO_WAIT.with(|n| n.set(self.0));
        }
    }
    let _restore = Restore(NO_WAIT.with(|n| n.replace(true)));
    f()
}

/// Whether core calls on this thread run under [`without_waiting`].
pub(crate) fn waiting_forbidden() -> bool {
    NO_WAIT.with(|n| n.get())
}

/// Runs `f` (the core calls of one task, on this thread) with `aborted` as
/// the task's abort flag: a media command of the task waiting at a stalled
/// unit gives up when the flag turns true. Nests; restores the outer flag
/// when `f` returns or panics.
pub fn abortable<T>(aborted: &Arc<AtomicBool>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Arc<AtomicBool>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            TASK_ABORT.with(|t| *t.borrow_mut() = outer);
        }
    }
    let outer = TASK_ABORT.with(|t| t.borrow_mut().replace(aborted.clone()));
    let _restore = Restore(outer);
    f()
}

/// Whether the task running on this thread was aborted (false outside
/// [`abortable`]).
pub(crate) fn task_aborted() -> bool {
    TASK_ABORT.with(|t| {
        t.borrow()
            .as_ref()
            .is_some_and(|f| f.load(Ordering::SeqCst))
    })
}

/// Whether the command with this CDB reads or changes the medium (goes to
/// the backstore), and so waits at a stalled unit and is refused through a
/// port in standby.
pub fn is_media_command(cdb: &[u8]) -> bool {
    let Some(&opcode) = cdb.first() else {
        return false;
    };
    match opcode {
        op::SERVICE_ACTION_IN_16 => {
            // GET LBA STATUS reads the allocation map; READ CAPACITY (16)
            // does not touch the medium.
            cdb.get(1).is_some_and(|sa| sa & 0x1f == 0x12)
        }
        op::READ_6
        | op::READ_10
        | op::READ_12
        | op::READ_16
        | op::WRITE_6
        | op::WRITE_10
        | op::WRITE_12
        | op::WRITE_16
        | op::WRITE_AND_VERIFY_10
        | op::WRITE_AND_VERIFY_12
        | op::WRITE_AND_VERIFY_16
        | op::VERIFY_10
        | op::VERIFY_12
        | op::VERIFY_16
        | op::ORWRITE_16
        | op::COMPARE_AND_WRITE
        | op::WRITE_ATOMIC_16
        | op::WRITE_SAME_10
        | op::WRITE_SAME_16
        | op::UNMAP
        | op::PRE_FETCH_10
        | op::PRE_FETCH_16
        | op::SYNCHRONIZE_CACHE_10
        | op::SYNCHRONIZE_CACHE_16
        | op::EXTENDED_COPY
        | super::sanitize::SANITIZE
        | super::format_unit::FORMAT_UNIT => true,
        _ => false,
    }
}

/// Whether the command with this CDB only reads the medium or its state
/// (READ, VERIFY, PRE-FETCH, GET LBA STATUS): an abort of it need not wait
/// for it to leave the backstore, since nothing it does shows afterwards.
/// Every other command may change what a later one finds.
pub fn only_reads_the_medium(cdb: &[u8]) -> bool {
    let Some(&opcode) = cdb.first() else {
        return false;
    };
    match opcode {
        op::SERVICE_ACTION_IN_16 => cdb.get(1).is_some_and(|sa| sa & 0x1f == 0x12),
        op::READ_6
        | op::READ_10
        | op::READ_12
        | op::READ_16
        | op::VERIFY_10
        | op::VERIFY_12
        | op::VERIFY_16
        | op::PRE_FETCH_10
        | op::PRE_FETCH_16 => true,
        _ => false,
    }
}

/// The gate had to let a command go without running it: its task was
/// aborted while it waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldAndAborted;

/// What [`StallGate::set`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StallChange {
    /// Whether the unit was stalled before.
    pub was_stalled: bool,
    /// Commands waiting at the gate at that moment (they resume, or give up
    /// if aborted, when a stall is lifted).
    pub held: usize,
}

#[derive(Debug, Default)]
struct GateState {
    stalled: bool,
    /// Commands waiting at the gate.
    held: usize,
}

/// One logical unit's stall switch (see the module docs).
#[derive(Debug, Default)]
pub struct StallGate {
    /// Fast path: media commands of a unit that is not stalled take no lock.
    stalled: AtomicBool,
    state: Mutex<GateState>,
    opened: Condvar,
}

impl StallGate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stalls (`true`) or releases (`false`) the unit.
    pub fn set(&self, stalled: bool) -> StallChange {
        let mut st = self.lock();
        let change = StallChange {
            was_stalled: st.stalled,
            held: st.held,
        };
        st.stalled = stalled;
        self.stalled.store(stalled, Ordering::SeqCst);
        drop(st);
        if !stalled {
            self.opened.notify_all();
        }
        change
    }

    /// Whether the unit is stalled.
    pub fn is_stalled(&self) -> bool {
        self.stalled.load(Ordering::SeqCst)
    }

    /// Commands waiting at the gate now.
    pub fn held(&self) -> usize {
        self.lock().held
    }

    /// Lets a media command through: at once when the unit is not stalled;
    /// otherwise waits until the stall is lifted. Fails if the task running
    /// on this thread (see [`abortable`]) was aborted while it waited.
    pub fn pass(&self) -> Result<(), HeldAndAborted> {
        if !self.stalled.load(Ordering::SeqCst) || waiting_forbidden() {
            return Ok(());
        }
        let mut st = self.lock();
        if !st.stalled {
            return Ok(());
        }
        st.held += 1;
        let mut aborted = false;
        while st.stalled {
            if task_aborted() {
                aborted = true;
                break;
            }
            st = self
                .opened
                .wait_timeout(st, POLL)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        st.held -= 1;
        drop(st);
        // Released: a task aborted while it was held is dropped, not run.
        if aborted || task_aborted() {
            tracing::debug!("held media command dropped: its task was aborted");
            return Err(HeldAndAborted);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn media_commands_are_those_that_reach_the_backstore() {
        for cdb in [
            &[0x28u8, 0, 0, 0, 0, 0, 0, 0, 8, 0][..],
            &[0x2a, 0, 0, 0, 0, 0, 0, 0, 8, 0],
            &[0x88; 16],
            &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0],
            &[0x89; 16],
            &[0x9e, 0x12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
        ] {
            assert!(is_media_command(cdb), "{cdb:02x?}");
        }
        for cdb in [
            &[0x00u8, 0, 0, 0, 0, 0][..], // TEST UNIT READY
            &[0x12, 0, 0, 0, 36, 0],      // INQUIRY
            &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0],
            &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0], // READ CAPACITY (16)
            &[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],              // RTPG
            &[0x5e, 0, 0, 0, 0, 0, 0, 0, 8, 0],                       // PR IN
            &[],
        ] {
            assert!(!is_media_command(cdb), "{cdb:02x?}");
        }
    }

    #[test]
    fn an_open_gate_lets_everything_through() {
        let g = StallGate::default();
        assert_eq!(g.pass(), Ok(()));
        let flag = Arc::new(AtomicBool::new(true));
        // Not stalled: even an aborted task passes (the fabric checks its
        // own flag before it calls the core).
        assert_eq!(abortable(&flag, || g.pass()), Ok(()));
    }

    #[test]
    fn a_stalled_gate_holds_until_released() {
        let g = Arc::new(StallGate::default());
        assert_eq!(
            g.set(true),
            StallChange {
                was_stalled: false,
                held: 0
            }
        );
        let g2 = g.clone();
        let waiter = std::thread::spawn(move || g2.pass());
        let deadline = Instant::now() + Duration::from_secs(5);
        while g.held() == 0 {
            assert!(
                Instant::now() < deadline,
                "the command never reached the gate"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "passed a stalled gate");
        let change = g.set(false);
        assert_eq!(
            change,
            StallChange {
                was_stalled: true,
                held: 1
            }
        );
        assert_eq!(waiter.join().unwrap(), Ok(()));
        assert_eq!(g.held(), 0);
    }

    #[test]
    fn an_aborted_task_leaves_the_gate_without_passing() {
        let g = Arc::new(StallGate::default());
        g.set(true);
        let flag = Arc::new(AtomicBool::new(false));
        let (g2, f2) = (g.clone(), flag.clone());
        let waiter = std::thread::spawn(move || abortable(&f2, || g2.pass()));
        while g.held() == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
        flag.store(true, Ordering::SeqCst);
        let t0 = Instant::now();
        assert_eq!(waiter.join().unwrap(), Err(HeldAndAborted));
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert!(g.is_stalled(), "the unit stays stalled");
        assert_eq!(g.held(), 0);
    }

    #[test]
    fn abortable_scopes_nest_and_restore() {
        let outer = Arc::new(AtomicBool::new(true));
        let inner = Arc::new(AtomicBool::new(false));
        abortable(&outer, || {
            assert!(task_aborted());
            abortable(&inner, || assert!(!task_aborted()));
            assert!(task_aborted());
        });
        assert!(!task_aborted());
    }
}
