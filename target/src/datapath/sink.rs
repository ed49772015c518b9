//! Where a READ's data go, and where a WRITE's data come from.
//!
//! The fabric implements [`ChunkSink`] over its connection (Data-In PDUs
//! on TCP, RDMA Writes on iSER) and [`ChunkProducer`] over Data-Out / R2T
//! (or RDMA Reads). The sinks here serve tests and benchmarks.

use std::io::{self, Read, Write};
use std::ops::Range;

use super::chunk::SendOrder;
use super::stats::CopyCost;

/// Receives a READ's data unit by unit.
pub trait ChunkSink {
    /// Whether units must arrive in offset order.
    fn order(&self) -> SendOrder;
    /// Sends request bytes `bytes` (offsets relative to the request start;
    /// `data.len() == bytes.len()`). Returns what it copied.
    fn send(&mut self, bytes: Range<u64>, data: &[u8]) -> io::Result<CopyCost>;
    /// Every unit was sent: send the status.
    fn finish(&mut self) -> io::Result<CopyCost> {
        Ok(CopyCost::default())
    }
}

/// Supplies a WRITE's data chunk by chunk, in offset order.
pub trait ChunkProducer {
    /// Fills `buf` with request bytes `bytes` (blocks until they arrive).
    fn fill(&mut self, bytes: Range<u64>, buf: &mut [u8]) -> io::Result<CopyCost>;
}

/// The bogus no-net sink: drops everything (the synchronized-sends paper's
/// bogus configurations).
#[derive(Debug, Clone, Copy)]
pub struct DiscardSink(pub SendOrder);

impl ChunkSink for DiscardSink {
    fn order(&self) -> SendOrder {
        self.0
    }
    fn send(&mut self, _: Range<u64>, _: &[u8]) -> io::Result<CopyCost> {
        Ok(CopyCost::default())
    }
}

/// Copies units into a vector at their offsets (tests): one user copy.
#[derive(Debug, Clone)]
pub struct CollectSink {
    /// The request's bytes as received.
    pub data: Vec<u8>,
    /// The order promised.
    pub order: SendOrder,
    /// Offsets in arrival order.
    pub arrivals: Vec<u64>,
    /// Whether `finish` ran.
    pub finished: bool,
}

impl CollectSink {
    /// For a request of `len` bytes.
    pub fn new(len: usize, order: SendOrder) -> CollectSink {
        CollectSink {
            data: vec![0; len],
            order,
            arrivals: Vec::new(),
            finished: false,
        }
    }
}

impl ChunkSink for CollectSink {
    fn order(&self) -> SendOrder {
        self.order
    }
    fn send(&mut self, bytes: Range<u64>, data: &[u8]) -> io::Result<CopyCost> {
        assert!(!self.finished, "send after finish");
        self.data[bytes.start as usize..bytes.end as usize].copy_from_slice(data);
        self.arrivals.push(bytes.start);
        Ok(CopyCost {
            user: data.len(),
            kernel: 0,
        })
    }
    fn finish(&mut self) -> io::Result<CopyCost> {
        self.finished = true;
        Ok(CopyCost::default())
    }
}

/// Writes units in order to a byte stream (a TCP socket): the kernel copies
/// each byte from our buffer into socket buffers.
#[derive(Debug)]
pub struct StreamSink<W: Write>(pub W);

impl<W: Write> ChunkSink for StreamSink<W> {
    fn order(&self) -> SendOrder {
        SendOrder::InOrder
    }
    fn send(&mut self, _: Range<u64>, data: &[u8]) -> io::Result<CopyCost> {
        self.0.write_all(data)?;
        Ok(CopyCost {
            user: 0,
            kernel: data.len(),
        })
    }
    fn finish(&mut self) -> io::Result<CopyCost> {
        self.0.flush()?;
        Ok(CopyCost::default())
    }
}

/// Produces a WRITE's data from a byte stream (a TCP socket).
#[derive(Debug)]
pub struct StreamProducer<R: Read>(pub R);

impl<R: Read> ChunkProducer for StreamProducer<R> {
    fn fill(&mut self, _: Range<u64>, buf: &mut [u8]) -> io::Result<CopyCost> {
        self.0.read_exact(buf)?;
        Ok(CopyCost {
            user: 0,
            kernel: buf.len(),
        })
    }
}

/// Produces given bytes (tests): one user copy.
#[derive(Debug, Clone)]
pub struct SliceProducer<'a>(pub &'a [u8]);

impl ChunkProducer for SliceProducer<'_> {
    fn fill(&mut self, bytes: Range<u64>, buf: &mut [u8]) -> io::Result<CopyCost> {
        buf.copy_from_slice(&self.0[bytes.start as usize..bytes.end as usize]);
        Ok(CopyCost {
            user: buf.len(),
            kernel: 0,
        })
    }
}
