//! blockwire's management layer: the declarative TOML configuration, the
//! daemons built from it, and (later) the control API and metrics.

pub mod config;
pub mod target_daemon;
