//! Registration with an iSNS server (RFC 4171), as `[isns] server` asks:
//! the daemon's targets, portals and portal groups are registered as one
//! network entity and kept registered while it runs, so initiators find
//! them through the server (`iscsiadm -m discovery -t isns`), including
//! after live changes, and lose them when the daemon stops.

pub mod driver;
pub mod registrar;
pub mod registration;

pub use driver::Client;
pub use registration::Registration;

use std::sync::{Arc, Mutex};

pub use blockwire_pdu::isns::{server_address, DEFAULT_PORT};

/// The registration period asked for by default, in seconds: the server
/// forgets the entity this long after its last message if the daemon dies
/// without deregistering.
pub const DEFAULT_PERIOD_SECS: u32 = 900;

/// The Entity Identifier used when `[isns] entity` is not set: this
/// machine's host name (as target-isns and open-iscsi do), so that the
/// daemon's entity keeps its name across restarts.
pub fn default_entity() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "blockwire-target".into())
}

/// The daemon's iSNS client, if `[isns]` configures one. A live change of
/// `[isns]` replaces it; the control socket and the metrics endpoint look
/// it up here each time.
#[derive(Debug, Default)]
pub struct Slot(Mutex<Option<Arc<Client>>>);

impl Slot {
    /// The client registering now.
    pub fn get(&self) -> Option<Arc<Client>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Puts `client` in place and returns the one it replaces.
    pub fn replace(&self, client: Option<Arc<Client>>) -> Option<Arc<Client>> {
        std::mem::replace(
            &mut *self.0.lock().unwrap_or_else(|p| p.into_inner()),
            client,
        )
    }
}
