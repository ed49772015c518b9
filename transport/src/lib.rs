//! blockwire transport layer.
//!
//! * [`rdma`]: a verbs-shaped RDMA interface (protection domain, memory regions,
//!   reliable-connection queue pairs, completion queues, connection setup with private
//!   data) and its backends: [`rdma::soft`] (user-space RDMA over TCP, runs anywhere) and,
//!   with the `verbs` feature, `rdma::verbs` (libibverbs + librdmacm).
//! * [`reg`]: the memory registration layer (dynamic, pin-down cache, FMRD, arena),
//!   scatter-gather coalescing (buffer re-organization) and the target's pre-registered
//!   buffer pool in size classes.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod assist;
pub mod rdma;
pub mod reg;
