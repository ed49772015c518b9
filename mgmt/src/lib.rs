//! blockwire's management layer: the declarative TOML configuration, the
//! daemons built from it, the runtime control API (JSON-RPC on a Unix
//! socket), the Prometheus metrics endpoint and the service manager
//! notifications.
#![forbid(unsafe_code)]

pub mod claims;
pub mod config;
pub mod control;
pub mod isns;
pub mod live;
pub mod metrics;
pub mod notify;
pub mod target_daemon;
