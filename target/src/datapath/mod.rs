//! The gmblock data path (issue 7): direct I/O into registered buffers and
//! synchronized sends.
//!
//! - [`buffer`]: aligned buffers in size classes, registered with the kernel.
//! - [`engine`]: the [`Engine`] trait (batches of [`IoOp`] in, [`Completion`]s
//!   out on a channel); [`uring`] (io_uring, READ_FIXED/WRITE_FIXED) and
//!   [`threadpool`] (pread/pwrite fallback), chosen by [`open_engine`].
//! - [`chunk`] (sans-IO): chunk plans and the [`Sequencer`] that releases
//!   send units as chunks become valid, in order or in any order.
//! - [`stripe`] (pure): RAID0 address mapping; [`source`]: file, striped
//!   files, or the no-disk pattern.
//! - [`pipeline`]: [`ReadCommand`] (one READ's state) and [`Pipeline`]
//!   (blocking driver: synchronized or serial reads, double-buffered writes).
//! - [`sink`]: where data go ([`ChunkSink`]) and come from
//!   ([`ChunkProducer`]); [`emulate`]: token-bucket disk and network.
//! - [`stats`]: per-command state timers, histograms, copy counters.

pub mod buffer;
pub mod chunk;
pub mod emulate;
pub mod engine;
pub mod pipeline;
pub mod sink;
pub mod source;
pub mod stats;
pub mod stripe;
pub mod threadpool;
pub mod uring;

#[cfg(test)]
mod tests;

pub use buffer::{BufLease, BufferPool};
pub use chunk::{ChunkPlan, SendOrder, Sequencer};
pub use engine::{
    completion_channel, open_direct, open_direct_or_buffered, open_engine, Completion,
    CompletionRx, CompletionTx, Engine, EngineKind, EnginePref, IoOp, OpKind,
};
pub use pipeline::{CommandReport, Mode, Pipeline, ReadCommand, ReadConfig, WriteConfig};
pub use sink::{ChunkProducer, ChunkSink};
pub use source::Source;
pub use stats::{CommandTimers, CopyCost, Phase, PhaseStats};
pub use stripe::StripeLayout;
