//! blockwire's iSCSI initiator.
//!
//! - [`discover`]: SendTargets discovery at a portal.
//! - [`Session`]: a logged-in normal session with a command engine — many
//!   commands in flight from many tasks (queue depth inside the target's
//!   CmdSN window), immediate and unsolicited data up to FirstBurstLength,
//!   R2T handling, Data-In placed straight into the caller's buffer,
//!   residuals, sense data decoded into [`ScsiError`], NOP keepalives, task
//!   management, logout, and recovery after a lost connection (bounded,
//!   backed-off re-login with session reinstatement at ErrorRecoveryLevel 0,
//!   re-issuing the commands that were in flight).
//!
//! The protocol logic is sans-IO and deterministic: the crate-private
//! `login::LoginMachine`, `discovery::SendTargets` and `engine::Engine` take
//! PDUs and return PDUs or events, never touching a socket or a clock. The tokio shell
//! (`session`, `connect`, `wire`) moves the bytes. PDU formats, key
//! negotiation, CHAP and SCSI structures are all `blockwire_pdu`'s.
//!
//! ```no_run
//! # async fn demo() -> Result<(), blockwire_initiator::Error> {
//! use blockwire_initiator::{discover, InitiatorConfig, Session};
//! let cfg = InitiatorConfig::new("iqn.2026-11.io.blockwire:host1");
//! let targets = discover(&cfg, "127.0.0.1:3260").await?;
//! let s = Session::connect(cfg, "127.0.0.1:3260", &targets[0].name).await?;
//! let cap = s.read_capacity(0).await?;
//! let mut buf = vec![0u8; cap.block_size as usize * 8];
//! s.read(0, 0, 8, &mut buf).await?;
//! s.logout().await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod config;
mod connect;
pub(crate) mod discovery;
#[cfg(not(feature = "fuzzing"))]
pub(crate) mod engine;
/// The session's sans-IO engine, open to the stateful fuzz target in `fuzz/`;
/// not part of the library's API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod engine;
mod error;
pub mod iser;
mod isid;
pub mod isns;
pub mod kernel_host;
pub(crate) mod login;
pub mod rdma;
mod retry;
mod scsi;
mod session;
mod wire;

pub use blockwire_pdu::chap::{ChapAlgorithm, Credential};
pub use config::{ChapConfig, InitiatorConfig, RecoveryPolicy};
pub use connect::{discover, discover_list, normalize_portal};
pub use discovery::{
    parse_send_targets, parse_target_address, DiscoveredTarget, Portal, SendTargetsList,
};
pub use engine::TaskInfo;
pub use error::{Error, Result, ScsiError};
pub use isid::isid_for;
pub use scsi::{rw16, serial_of, Capacity};
pub use session::{Completion, DataDir, RawCompletion, Residual, Session, COMMAND_LOSSES};
