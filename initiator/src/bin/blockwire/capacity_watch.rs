//! Says when the target resized a LUN that `blockwire mount` or `blockwire
//! ublk` serves. Both size what they show the kernel by READ CAPACITY once,
//! at the start; the target's UNIT ATTENTION, CAPACITY DATA HAS CHANGED
//! (SBC-4 4.6), is retried away by the session, which only counts it. A
//! grown LUN's new blocks stay out of reach, and a shrunk one fails I/O past
//! its end, until the command is started again: that is said, once per
//! change, rather than left to be found.

use std::sync::Weak;
use std::time::Duration;

use blockwire_initiator::Session;

/// How often the session's count is looked at.
const EVERY: Duration = Duration::from_secs(1);

/// Watches `session` (without keeping it: the command's own shutdown waits
/// for its last reference) and prints, as `what`, a line on stderr for each
/// capacity change the target reports. Ends with the session.
pub fn spawn(session: Weak<Session>, what: &'static str) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut seen = 0;
        loop {
            tokio::time::sleep(EVERY).await;
            let Some(s) = session.upgrade() else { return };
            let now = s.capacity_changes();
            drop(s);
            if now > seen {
                seen = now;
                eprintln!(
                    "blockwire {what}: the target says a LUN's capacity changed; this {what} keeps \
                     the size it started with until it is started again"
                );
            }
        }
    })
}
