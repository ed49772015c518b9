//! blockwire's management layer: the declarative TOML configuration, the
//! daemons built from it, the runtime control API (JSON-RPC on a Unix
//! socket) and (later) metrics.
#![forbid(unsafe_code)]

pub mod config;
pub mod control;
pub mod target_daemon;
