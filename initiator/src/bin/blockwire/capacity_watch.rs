//! Says when the target resized a LUN that `blockwire mount` or `blockwire
//! ublk` serves. Both size what they show the kernel by READ CAPACITY once,
//! at the start; the target's UNIT ATTENTION, CAPACITY DATA HAS CHANGED
//! (SBC-4 4.6), is retried away by the session, which only counts it. A
//! grown LUN's new blocks stay out of reach, and a shrunk one fails I/O past
//! its end, until the command is started again: that is said, once per
//! change, rather than left to be found.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use blockwire_initiator::Session;

/// How often the session's count is looked at.
const EVERY: Duration = Duration::from_secs(1);

/// A running watch; [`Watch::stop`] ends it.
pub struct Watch {
    task: tokio::task::JoinHandle<()>,
    session: Weak<Session>,
    what: &'static str,
    /// The count last said (or seen when the sizes were read).
    said: Arc<AtomicU64>,
}

/// Watches `session` (without keeping it: the command's own shutdown waits
/// for its last reference) and prints, as `what`, a line on stderr for each
/// capacity change the target reports past the count `read_at`, the
/// session's count when the sizes were read (a change pending at login was
/// retried past by that READ CAPACITY, which read the new size).
pub fn spawn(session: Weak<Session>, what: &'static str, read_at: u64) -> Watch {
    let said = Arc::new(AtomicU64::new(read_at));
    let task = {
        let (session, said) = (session.clone(), said.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(EVERY).await;
                let Some(s) = session.upgrade() else { return };
                let now = s.capacity_changes();
                drop(s);
                say_if_grown(&said, now, what);
            }
        })
    };
    Watch {
        task,
        session,
        what,
        said,
    }
}

impl Watch {
    /// Ends the watch, and says a change it had not said yet: once this
    /// returns it holds no reference to the session.
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
        if let Some(s) = self.session.upgrade() {
            let now = s.capacity_changes();
            drop(s);
            say_if_grown(&self.said, now, self.what);
        }
    }
}

fn say_if_grown(said: &AtomicU64, now: u64, what: &str) {
    if said.fetch_max(now, Ordering::Relaxed) < now {
        eprintln!(
            "blockwire {what}: the target says a LUN's capacity changed; this {what} keeps \
             the size it started with until it is started again"
        );
    }
}
