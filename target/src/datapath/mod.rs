//! The gmblock data path (after the GMBlock and synchronized-sends papers):
//! direct I/O into registered buffers and synchronized sends.
//!
//! - [`buffer`]: aligned buffers in size classes, registered with the kernel.
//! - [`engine`]: the [`Engine`] trait (batches of [`IoOp`] in, [`Completion`]s
//!   out on a channel); [`uring`] (io_uring, READ_FIXED/WRITE_FIXED) and
//!   [`threadpool`] (pread/pwrite fallback), chosen by [`open_engine`].
//! - [`chunk`] (sans-IO): chunk plans and the [`Sequencer`] that releases
//!   send units as chunks become valid, in order or in any order.
//! - [`stripe`] (pure): RAID0 address mapping; [`source`]: file, striped
//!   files, or the no-disk pattern.
//! - [`read`]: [`ReadCommand`] (one READ's state: its pool buffer, its
//!   chunks, the units it releases); the fabric's data mover
//!   (`iscsi::mover`) moves the units as TCP Data-In or RDMA Writes.
//! - With the `bench` feature (and in this crate's tests) only, for the
//!   benchmarks in `benches/`: `pipeline` (`Pipeline`, a blocking driver:
//!   synchronized or serial reads, double-buffered writes), `sink` (where
//!   its data go, `ChunkSink`, and come from, `ChunkProducer`) and
//!   `emulate` (token-bucket disk and network).
//! - [`stats`]: per-command state timers, histograms, copy counters.
//!
//! # Wiring a READ into the fabric
//!
//! At start-up: `let (engine, banner) = open_engine(BufferPool::with_defaults(),
//! EnginePref::Auto)?` (log `banner`: it names io_uring or the thread pool
//! and why), and one [`Source`] per LUN (`Source::File` of an
//! [`open_direct`] file for `direct` mode). Per READ larger than the
//! threshold, on the connection's task (what `iscsi::syncread` does):
//!
//! ```text
//! let units = datain::segments(len, mrdsl, mbl).map(|s| s.offset as u64..(s.offset + s.length) as u64).collect();
//! let order = if data_pdu_in_order { SendOrder::InOrder } else { SendOrder::AnyOrder };
//! let cfg = ReadConfig { mode: Mode::Synchronized, chunk: 64 << 10, units: Some(units) };
//! let (mut cmd, mut rx) = ReadCommand::start(&*engine, &src, lba * bs, len, order, &cfg, now)?;
//! loop {
//!     for u in cmd.take_ready() { let (range, data) = cmd.unit(u); /* Data-In u: BufferOffset range.start, DataSN u */ }
//!     if cmd.all_released() { break }
//!     cmd.on_completion(rx.recv().await.unwrap(), Instant::now())?;   // Err => CHECK CONDITION
//! }
//! // SCSI Response (or status in the last Data-In); drop `cmd` to return the buffer.
//! ```
//!
//! `unit_bytes(u)` shares the registered buffer: write header then payload
//! (`write_vectored`, no copy), or post an RDMA Write at `range.start`.
//! With DataPDUInOrder=No, DataSN still has to count in send order
//! (`iscsi::syncread::DataInStamper`).

pub mod buffer;
pub mod chunk;
#[cfg(any(test, feature = "bench"))]
pub mod emulate;
pub mod engine;
#[cfg(any(test, feature = "bench"))]
pub mod pipeline;
pub mod read;
#[cfg(any(test, feature = "bench"))]
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
#[cfg(any(test, feature = "bench"))]
pub use pipeline::{CommandReport, Pipeline, WriteConfig};
pub use read::{Mode, ReadCommand, ReadConfig};
#[cfg(any(test, feature = "bench"))]
pub use sink::{ChunkProducer, ChunkSink};
pub use source::Source;
pub use stats::{CommandTimers, CopyCost, Phase, PhaseStats};
pub use stripe::StripeLayout;
