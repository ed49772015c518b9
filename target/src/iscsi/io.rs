//! Reading PDUs from a socket and writing them back: the thin async layer
//! around the sans-IO framer.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use blockwire_pdu::digest::DIGEST_LEN;
use blockwire_pdu::pdu::{data_digest, encode_header, padded_len, RESERVED_TAG};
use blockwire_pdu::{Bhs, DecodeError, Digests, Frame, FrameDecoder, FrameSize, Pdu};
use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;

use super::file_map::{FileMap, MappedPart, MAX_PARTS};
use super::send_stall::StallLimit;
use super::sendfile::SendfileLun;
use super::socket_room::{send_when_room, SocketRoom};
use super::zerocopy::{self, Held, ZeroCopy, ZC_MIN};
use crate::copies::{CopyPath, Counts, Tracker};

/// Why reading the next PDU failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The socket failed.
    #[error("connection error: {0}")]
    Io(#[from] std::io::Error),
    /// The bytes are not a valid PDU.
    #[error("{error}")]
    Decode {
        /// What was wrong.
        error: DecodeError,
        /// The offending header, when 48 bytes of it were there (for a Reject).
        header: Option<[u8; 48]>,
        /// Bytes to skip to continue after the bad PDU, if it can be skipped.
        skip: Option<usize>,
    },
}

/// Buffers a socket's bytes and cuts them into PDUs.
pub struct PduReader<R> {
    inner: R,
    buf: BytesMut,
    /// Framing limits; replaced when login ends and digests start.
    pub framer: FrameDecoder,
}

impl<R: AsyncRead + Unpin> PduReader<R> {
    /// A reader with login-phase limits (8 KiB segments, no digests).
    pub fn new(inner: R) -> Self {
        PduReader {
            inner,
            buf: BytesMut::with_capacity(64 * 1024),
            framer: FrameDecoder::default(),
        }
    }

    /// The stream, for a test that reads the bytes after the PDUs read so
    /// far at its own pace; none may be left buffered.
    #[cfg(test)]
    pub(crate) fn into_stream(self) -> R {
        assert!(self.buf.is_empty(), "bytes read ahead would be lost");
        self.inner
    }

    /// The next PDU, or `None` at a clean end of stream. Cancel-safe: bytes
    /// already read stay buffered.
    pub async fn next(&mut self) -> Result<Option<Pdu>, ReadError> {
        loop {
            let need = match self.cut()? {
                Cut::Pdu(pdu) => return Ok(Some(pdu)),
                Cut::NeedMore(n) => n,
            };
            // NeedMore is bounded by the framer's length checks.
            self.buf.reserve(need.max(4096));
            if self.inner.read_buf(&mut self.buf).await? == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(ReadError::Io(std::io::ErrorKind::UnexpectedEof.into()))
                };
            }
        }
    }

    /// Reads and drops what the peer still sends until it closes its end,
    /// at most `max_bytes` of it: true at the peer's end of stream, false
    /// past the bound or on an error. A TCP socket closed with received
    /// bytes unread ends with a reset rather than a FIN, and a reset may
    /// cost the peer the last response sent before it (RFC 1122 4.2.2.13;
    /// RFC 7143 7.14 wants a connection taken down gracefully).
    pub async fn discard_until_end(&mut self, max_bytes: usize) -> bool {
        let mut dropped = 0;
        while dropped <= max_bytes {
            dropped += self.buf.len();
            self.buf.clear();
            self.buf.reserve(4096);
            match self.inner.read_buf(&mut self.buf).await {
                Ok(0) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
        false
    }

    /// A PDU whose bytes were all received already, without reading the
    /// socket: None when the buffer holds no whole PDU. One socket read
    /// often brings several commands; the connection handles them all
    /// before it waits again.
    pub fn next_buffered(&mut self) -> Option<Result<Pdu, ReadError>> {
        match self.cut() {
            Ok(Cut::Pdu(pdu)) => Some(Ok(pdu)),
            Ok(Cut::NeedMore(_)) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// Cuts the first PDU off the buffer, or says how many more bytes it
    /// needs. A bad PDU that can be skipped is dropped from the buffer.
    fn cut(&mut self) -> Result<Cut, ReadError> {
        // A whole PDU is cut off the buffer and decoded in place: its
        // data segment shares the received bytes (no copy).
        if let Ok(FrameSize::Total(total)) = self.framer.frame_size(&self.buf) {
            if self.buf.len() >= total {
                let frame = self.buf.split_to(total).freeze();
                return match Pdu::decode_shared(&frame, self.framer.digests) {
                    Ok((pdu, _)) => Ok(Cut::Pdu(pdu)),
                    Err(error) => {
                        let skip = matches!(
                            error,
                            DecodeError::UnknownOpcode(_) | DecodeError::DataDigest { .. }
                        )
                        .then_some(total);
                        Err(ReadError::Decode {
                            error,
                            header: first_header(&frame),
                            skip,
                        })
                    }
                };
            }
        }
        match self.framer.decode(&self.buf) {
            Ok(Frame::Pdu { pdu, consumed }) => {
                let _ = self.buf.split_to(consumed);
                Ok(Cut::Pdu(pdu))
            }
            Ok(Frame::NeedMore(n)) => Ok(Cut::NeedMore(n)),
            Err(error) => {
                let header = first_header(&self.buf);
                let skip = match (&error, self.framer.frame_size(&self.buf)) {
                    (
                        DecodeError::UnknownOpcode(_) | DecodeError::DataDigest { .. },
                        Ok(FrameSize::Total(t)),
                    ) => Some(t),
                    _ => None,
                };
                if let Some(t) = skip {
                    let _ = self.buf.split_to(t);
                }
                Err(ReadError::Decode {
                    error,
                    header,
                    skip,
                })
            }
        }
    }
}

/// What the buffer gave: a PDU, or how many more bytes one needs.
enum Cut {
    Pdu(Pdu),
    NeedMore(usize),
}

/// The 48-byte header at the start of `bytes`, when it is all there (for a
/// Reject).
fn first_header(bytes: &[u8]) -> Option<[u8; 48]> {
    bytes.get(..48).map(|h| {
        let mut a = [0u8; 48];
        a.copy_from_slice(h);
        a
    })
}

/// Writes PDUs, coalescing small ones into one buffer and sending large
/// data segments straight from their own memory.
///
/// A PDU with a large payload (at least [`DIRECT_WRITE_MIN`] bytes) leaves
/// in ONE gathered send: whatever small PDUs are queued, its header, the
/// payload from its own buffer (not copied) and its padding and data
/// digest, as one `writev` — or one `sendmsg(MSG_ZEROCOPY)` when zero-copy
/// sends are on and the payload is at least [`zerocopy::ZC_MIN`] bytes
/// (see [`zerocopy`]). Only a partial send (socket buffer full) makes a
/// second call for the same PDU. [`PduWriter::push_file`] sends a payload
/// straight from a file with `sendfile(2)` (see [`super::sendfile`]).
///
/// Every Data-In payload's copies are tallied per command (see
/// [`crate::copies`]) when a tracker is attached.
pub struct PduWriter {
    inner: Sink,
    /// Queued bytes the writer owns: headers, small payloads, padding.
    out: Vec<u8>,
    /// Queued payloads sent from their own buffers, each with the length
    /// of `out` it follows (see [`GATHER_MIN`]).
    gather: Vec<(usize, bytes::Bytes)>,
    /// Digests in force.
    pub digests: Digests,
    zc: Option<ZeroCopy>,
    tracker: Option<Arc<Tracker>>,
    /// Large payloads of in-memory files go by copying sends from the
    /// file's mapping rather than by `sendfile(2)` (see
    /// [`PduWriter::copy_local_sends`]).
    mapped_sends: bool,
    /// What the writer did, for tests and debugging.
    pub stats: WriterStats,
    /// Set when the connection is cut: the writer, dropped, resets the
    /// connection at once rather than let the initiator take what the
    /// kernel still holds of its zero-copy sends.
    cut: Arc<std::sync::atomic::AtomicBool>,
    /// How long a send may wait for the socket to take bytes.
    stall: StallLimit,
    /// Where a socket that sends with `MSG_ZEROCOPY` is waited on for room
    /// (see [`super::socket_room`]).
    room: Option<SocketRoom>,
}

/// Counts of a writer's system calls.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WriterStats {
    /// PDUs with a large payload sent by a gathered send.
    pub gathered_pdus: u64,
    /// Send calls made for them (one each unless the socket was full).
    pub gathered_calls: u64,
    /// Payload bytes sent by `sendfile(2)`.
    pub sendfile_bytes: u64,
    /// Payload bytes of file PDUs read from the page cache into the
    /// coalescing buffer instead ([`FILE_COPY_MAX`]).
    pub file_copied_bytes: u64,
    /// Payload bytes sent by copying sends from a file's mapping.
    pub mapped_bytes: u64,
    /// Zero-copy send calls.
    pub zc_calls: u64,
}

/// The byte stream a [`PduWriter`] writes to. A TCP socket gets gathered,
/// zero-copy and `sendfile(2)` sends; any other stream (an in-memory pipe
/// in tests, a future transport) gets plain writes of the same bytes.
enum Sink {
    Tcp(OwnedWriteHalf),
    Stream(Box<dyn AsyncWrite + Send + Unpin>),
}

impl Sink {
    fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Sink::Tcp(w) => Some(w.as_ref()),
            Sink::Stream(_) => None,
        }
    }

    async fn flush(&mut self, stall: &StallLimit) -> std::io::Result<()> {
        match self {
            Sink::Tcp(w) => w.flush().await,
            Sink::Stream(w) => stall.wait(w.flush()).await,
        }
    }

    /// Writes `parts` in order: one gathered `sendmsg` with `flags` on a
    /// TCP socket when it takes them all, plain writes on any other stream.
    /// Returns the number of calls that wrote.
    async fn write_parts(
        &mut self,
        parts: &[&[u8]],
        flags: libc::c_int,
        stall: &StallLimit,
        room: Option<&SocketRoom>,
    ) -> std::io::Result<u64> {
        match self {
            Sink::Tcp(w) => write_gathered(w.as_ref(), parts, flags, stall, room).await,
            Sink::Stream(w) => {
                for part in parts {
                    let mut done = 0;
                    while done < part.len() {
                        match stall.send(w.write(&part[done..])).await? {
                            0 => return Err(std::io::ErrorKind::WriteZero.into()),
                            n => done += n,
                        }
                    }
                }
                Ok(1)
            }
        }
    }

    async fn shutdown(&mut self, stall: &StallLimit) -> std::io::Result<()> {
        match self {
            Sink::Tcp(w) => w.shutdown().await,
            Sink::Stream(w) => stall.wait(w.shutdown()).await,
        }
    }
}

/// Data segments at least this long are written at once, from their own
/// buffer, in one gathered write with everything queued before them.
pub const DIRECT_WRITE_MIN: usize = 16 * 1024;

/// File payloads up to this size are read from the page cache into the
/// coalescing buffer next to their header (`preadv2` with `RWF_NOWAIT`, so a
/// page not cached never stalls the writer; a plain read for a file in
/// tmpfs, which is memory) rather than sent by `sendfile(2)`. A 4 KiB READ then costs one read instead of a header
/// write and a sendfile call of its own, and the responses queued together
/// leave in one write. Above this size the copy costs more than the calls
/// it saves.
pub const FILE_COPY_MAX: u32 = 16 * 1024;

/// A Data-In PDU whose payload is `len` bytes of a LUN's file at `offset`
/// (see [`PduWriter::push_files`]); its header is stamped already.
#[derive(Debug, Clone, Copy)]
pub struct FilePayload {
    pub bhs: Bhs,
    pub offset: u64,
    pub len: u32,
}

/// Data-In payloads from this size up to [`DIRECT_WRITE_MIN`] are queued by
/// reference too, and leave from their own buffer in the next gathered
/// write with the headers around them, instead of being copied into the
/// coalescing buffer: a READ's payload is then copied only where it was read and by
/// the socket. Smaller ones (sense data, text) are cheaper to copy than to
/// gather.
pub const GATHER_MIN: usize = 2 * 1024;

/// Queued bytes are written once they reach this much.
const FLUSH_AT: usize = 256 * 1024;

/// At most this many payloads wait in the gather list: with the pieces of
/// `out` between them a flush stays within one `sendmsg`'s IOV_MAX (1024).
const GATHER_MAX: usize = 256;

/// What the writer needs to know of a PDU for the copy counter.
fn accounting(bhs: &Bhs) -> (Option<u32>, bool) {
    match bhs {
        // (ITT whose payload this is, whether its status leaves with it)
        Bhs::DataIn(d) => (Some(d.itt), d.status.is_some()),
        Bhs::ScsiResponse(r) => (Some(r.itt), true),
        _ => (None, false),
    }
}

impl PduWriter {
    /// A writer with no digests, plain sends and no copy tracking.
    pub fn new(inner: OwnedWriteHalf) -> Self {
        Self::with_sink(Sink::Tcp(inner))
    }

    /// A writer over any byte stream (plain writes: no gathered, zero-copy
    /// or `sendfile(2)` sends).
    pub fn over_stream(inner: impl AsyncWrite + Send + Unpin + 'static) -> Self {
        Self::with_sink(Sink::Stream(Box::new(inner)))
    }

    fn with_sink(inner: Sink) -> Self {
        PduWriter {
            inner,
            out: Vec::with_capacity(64 * 1024),
            gather: Vec::new(),
            digests: Digests::NONE,
            zc: None,
            tracker: None,
            mapped_sends: false,
            stats: WriterStats::default(),
            cut: Arc::default(),
            stall: StallLimit::default(),
            room: None,
        }
    }

    /// Has every send that waits `limit` for the socket to take any bytes
    /// fail with `TimedOut` (see [`StallLimit`]); by default sends wait as
    /// long as it takes.
    pub fn limit_stalls(&mut self, limit: std::time::Duration) {
        self.stall.set(limit);
    }

    /// The count of bytes this writer has sent, shared: it moves while the
    /// initiator takes data.
    pub fn progress(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.stall.progress()
    }

    /// A flag that, once set, has this writer reset the connection at once
    /// when dropped (see [`ZeroCopy::retire_cut`]): for a connection cut
    /// while the writer runs in a task of its own.
    pub fn cut_flag(&self) -> Arc<std::sync::atomic::AtomicBool> {
        self.cut.clone()
    }

    fn fd(&self) -> Option<RawFd> {
        self.inner.tcp().map(|s| s.as_raw_fd())
    }

    /// The TCP socket written to, if the stream is one.
    pub fn tcp_stream(&self) -> Option<&TcpStream> {
        self.inner.tcp()
    }

    /// Turns zero-copy sends on for large payloads; false (logged once)
    /// when the kernel refuses, and sends stay plain.
    pub fn enable_zero_copy(&mut self) -> bool {
        if let (None, Some(stream)) = (&self.zc, self.inner.tcp()) {
            // Without a room waiter the writer would spin on a full socket
            // once the first completion came (see super::socket_room).
            match SocketRoom::watch(stream) {
                Ok(room) => {
                    self.zc = ZeroCopy::enable(stream.as_raw_fd());
                    self.room = self.zc.is_some().then_some(room);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "no epoll instance to wait for room in the socket: zero-copy sends off");
                }
            }
        }
        self.zc.is_some()
    }

    /// For an initiator on this host: payloads above [`FILE_COPY_MAX`] whose
    /// pages are all in the page cache leave by one copying `sendmsg` from
    /// the file's mapping instead of by `sendfile(2)`, which over the loopback
    /// interface costs the target twice the CPU per byte and leaves the
    /// initiator cold pages to copy (see [`super::file_map`]). The caller
    /// leaves zero-copy sends off for such a writer as well. False when the
    /// writer is not on a TCP socket.
    pub fn copy_local_sends(&mut self) -> bool {
        self.mapped_sends = self.inner.tcp().is_some();
        self.mapped_sends
    }

    /// The zero-copy state, when zero-copy sends are on.
    pub fn zero_copy(&self) -> Option<&ZeroCopy> {
        self.zc.as_ref()
    }

    /// Tallies Data-In payload copies per command into `tracker`.
    pub fn track_copies(&mut self, tracker: Arc<Tracker>) {
        self.tracker = Some(tracker);
    }

    fn note(&self, itt: Option<u32>, f: impl FnOnce(&mut Counts)) -> Option<CopyPath> {
        match (&self.tracker, itt) {
            (Some(t), Some(itt)) => t.on_send(itt, f),
            _ => None,
        }
    }

    fn finish(&self, itt: Option<u32>, status: bool) {
        if let (Some(t), Some(itt), true) = (&self.tracker, itt, status) {
            t.finish(itt);
        }
    }

    /// Queues one PDU; large payloads are written immediately.
    pub async fn push(&mut self, pdu: &Pdu) -> std::io::Result<()> {
        let (itt, status) = accounting(&pdu.bhs);
        let n = pdu.data.len();
        let len = n as u64;
        let data_in = matches!(pdu.bhs, Bhs::DataIn(_));
        if n < DIRECT_WRITE_MIN && !(data_in && n >= GATHER_MIN) {
            // Copied into the coalescing buffer, then written from it.
            pdu.encode_into(&mut self.out, self.digests);
            if data_in {
                self.note(itt, |c| {
                    c.payload += len;
                    c.user_copied += len;
                    c.sent_from_user += len;
                });
            }
            self.finish(itt, status);
            return self.flush_if_full().await;
        }
        if let (true, Sink::Tcp(_)) = (self.zc.is_some() && n >= ZC_MIN, &self.inner) {
            return self.push_zero_copy(pdu, itt, status).await;
        }
        // Queued by reference: header and tail copied, the payload not. A
        // large one leaves at once, in one gathered write with everything
        // queued before it.
        let (tail, tail_len) = self.tail_of(&pdu.data);
        self.out
            .extend_from_slice(&encode_header(&pdu.bhs, &pdu.ahs, n as u32, self.digests));
        self.gather.push((self.out.len(), pdu.data.clone()));
        self.out.extend_from_slice(&tail[..tail_len]);
        self.note(itt, |c| {
            c.payload += len;
            c.sent_from_user += len;
        });
        self.finish(itt, status);
        if n < DIRECT_WRITE_MIN {
            return self.flush_if_full().await;
        }
        self.stats.gathered_calls += self.flush_buffer().await?;
        self.stats.gathered_pdus += 1;
        Ok(())
    }

    /// Sends a large payload with `MSG_ZEROCOPY` (the queued bytes and the
    /// header ahead of it), its buffer held until the kernel lets it go.
    async fn push_zero_copy(
        &mut self,
        pdu: &Pdu,
        itt: Option<u32>,
        status: bool,
    ) -> std::io::Result<()> {
        // The queued bytes become the head of the zero-copy send: what is
        // gathered by reference among them leaves first.
        if !self.gather.is_empty() {
            self.flush_buffer().await?;
        }
        let (tail, tail_len) = self.tail_of(&pdu.data);
        let header = encode_header(&pdu.bhs, &pdu.ahs, pdu.data.len() as u32, self.digests);
        self.out.extend_from_slice(&header);
        let Sink::Tcp(w) = &self.inner else {
            unreachable!("zero-copy sends only on TCP")
        };
        let stream = w.as_ref();
        let fd = stream.as_raw_fd();
        let path = self.note(itt, |c| c.payload += pdu.data.len() as u64);
        let held = Arc::new(Held {
            head: std::mem::take(&mut self.out),
            payload: pdu.data.clone(),
            tail: tail[..tail_len].to_vec(),
        });
        let zc = self.zc.as_mut().expect("zero-copy is on");
        let (zc_bytes, copied, calls) = zc
            .send(stream, fd, held, path, &self.stall, self.room.as_ref())
            .await?;
        self.stats.zc_calls += calls;
        self.stats.gathered_calls += calls;
        self.note(itt, |c| {
            c.zc_sent += zc_bytes;
            c.sent_from_user += copied;
        });
        self.stats.gathered_pdus += 1;
        self.finish(itt, status);
        Ok(())
    }

    /// The padding and data digest that follow `data` on the wire.
    fn tail_of(&self, data: &[u8]) -> ([u8; 3 + DIGEST_LEN], usize) {
        let mut tail = [0u8; 3 + DIGEST_LEN];
        let pad = padded_len(data.len()) - data.len();
        if self.digests.data && !data.is_empty() {
            tail[pad..pad + DIGEST_LEN].copy_from_slice(&data_digest(data));
            return (tail, pad + DIGEST_LEN);
        }
        (tail, pad)
    }

    /// Writes what is queued once enough of it has gathered.
    async fn flush_if_full(&mut self) -> std::io::Result<()> {
        if self.gather.len() >= GATHER_MAX || self.out.len() >= FLUSH_AT {
            self.flush().await?;
        }
        Ok(())
    }

    /// Sends Data-In PDUs whose payloads are ranges of one LUN's file, in
    /// order, as [`PduWriter::push_file`] would one by one, except that to
    /// an initiator on this host, when every payload would leave by a
    /// copying send from the file's mapping, all of them leave in one
    /// `sendmsg` (at most [`MAX_PARTS`] at a time).
    ///
    /// Why: a 256 KiB PDU and its header fill four 64 KiB segments of the
    /// loopback interface and a fifth of a few hundred bytes, and each send
    /// ends by pushing that fifth. Sent together, the PDUs of one 1 MiB
    /// READ fill 16.6 segments instead of 20, and each end handles fewer. On
    /// the 2-vCPU VM of interop/results/bench-vs-tgtd.md the bare pair
    /// (`target/examples/loopback_pair.rs --mapped --pdus 4`) moved a 1 GiB
    /// tmpfs file at 3.4-3.6 GB/s as four PDUs a MiB sent one by one
    /// (`--pdu-sends`) and at 5.5-6.0 GB/s sent in one call. (`MSG_MORE` on
    /// all but the last send, tried in a scratch sender, was slower than
    /// either.)
    pub async fn push_files(
        &mut self,
        lun: &SendfileLun,
        pdus: &[FilePayload],
    ) -> std::io::Result<()> {
        let map = lun.map.as_ref().filter(|map| {
            pdus.len() > 1
                && self.mapped_sends
                && !self.digests.data
                && pdus.iter().all(|p| {
                    p.len > FILE_COPY_MAX
                        && padded_len(p.len as usize) == p.len as usize
                        && map.allocated(p.offset, p.len as usize)
                })
        });
        let Some(map) = map else {
            for p in pdus {
                self.push_file(&p.bhs, lun, p.offset, p.len).await?;
            }
            return Ok(());
        };
        for chunk in pdus.chunks(MAX_PARTS) {
            self.push_mapped(lun, map, chunk).await?;
        }
        Ok(())
    }

    /// Sends a PDU whose payload is `len` bytes of `lun`'s file at `offset`:
    /// the header (and what is queued) first, then the payload by
    /// `sendfile(2)` from the page cache straight to the socket; the padding
    /// is queued. Payloads up to [`FILE_COPY_MAX`] whose pages are cached are
    /// copied next to their header instead. With data digests on (which
    /// need the bytes) the payload is read into memory and sent as
    /// [`PduWriter::push`] would.
    ///
    /// A file that ends before `offset + len` is an `UnexpectedEof` error
    /// naming the LUN: the header already left, so the connection cannot
    /// continue and the caller must drop it.
    pub async fn push_file(
        &mut self,
        bhs: &Bhs,
        lun: &SendfileLun,
        offset: u64,
        len: u32,
    ) -> std::io::Result<()> {
        let (file, label) = (&lun.file, lun.label.as_str());
        if self.digests.data || self.inner.tcp().is_none() {
            use std::os::unix::fs::FileExt;
            let mut buf = vec![0u8; len as usize];
            file.read_exact_at(&mut buf, offset).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("{label}: reading {len} bytes at {offset}: {e}"),
                )
            })?;
            let (itt, _) = accounting(bhs);
            self.note(itt, |c| c.read_to_user += u64::from(len));
            return self.push(&Pdu::with_data(*bhs, buf)).await;
        }
        if len <= FILE_COPY_MAX && self.copy_cached(bhs, lun, offset, len) {
            return self.flush_if_full().await;
        }
        if self.mapped_sends {
            if let Some(map) = lun
                .map
                .as_ref()
                .filter(|m| m.allocated(offset, len as usize))
            {
                let pdu = FilePayload {
                    bhs: *bhs,
                    offset,
                    len,
                };
                return self.push_mapped(lun, map, &[pdu]).await;
            }
        }
        let (itt, status) = accounting(bhs);
        let header = encode_header(bhs, &[], len, self.digests);
        self.out.extend_from_slice(&header);
        // MSG_MORE: the header rides in the payload's first segment rather
        // than in a segment of its own that wakes the initiator for 48 bytes.
        self.flush_buffer_with(libc::MSG_MORE).await?;
        let stream = self
            .inner
            .tcp()
            .expect("a stream sink reads the file above");
        let mut at = offset;
        let end = offset + u64::from(len);
        while at < end {
            let want = (end - at) as usize;
            let n = self
                .stall
                .send(send_when_room(stream, self.room.as_ref(), || {
                    let mut off = at;
                    rustix::fs::sendfile(stream, file, Some(&mut off), want)
                        .map_err(std::io::Error::from)
                }))
                .await?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "{label}: the file ends before byte {end} (sendfile stopped at {at}; was it truncated?)"
                    ),
                ));
            }
            at += n as u64;
        }
        self.stats.sendfile_bytes += u64::from(len);
        self.file_payload_sent(itt, status, len, |c| c.sendfile += u64::from(len));
        Ok(())
    }

    /// After a file payload of `len` bytes left: queues its padding and
    /// tallies it, `how` saying the way it went.
    fn file_payload_sent(
        &mut self,
        itt: Option<u32>,
        status: bool,
        len: u32,
        how: impl FnOnce(&mut Counts),
    ) {
        let pad = padded_len(len as usize) - len as usize;
        self.out.extend_from_slice(&[0u8; 3][..pad]);
        self.note(itt, |c| {
            c.payload += u64::from(len);
            how(c);
        });
        self.finish(itt, status);
    }

    /// Sends PDUs whose payloads are byte ranges of `lun`'s mapping: what is
    /// queued first, then each header and payload, all in one copying
    /// `sendmsg` (more only if the socket fills); the padding is queued (the
    /// caller sends several only when none needs any). A file that shrank
    /// below a payload is an `UnexpectedEof` error naming the LUN, as for
    /// `sendfile`.
    async fn push_mapped(
        &mut self,
        lun: &SendfileLun,
        map: &FileMap,
        pdus: &[FilePayload],
    ) -> std::io::Result<()> {
        // A file cut short within its last page leaves that page mapped
        // and cached, its tail zeros: the send would not fault but carry
        // the zeros as data. Its length is looked at first, as sendfile
        // stops at it.
        let end = pdus
            .iter()
            .map(|p| p.offset + u64::from(p.len))
            .max()
            .unwrap_or_default();
        let size = lun.file.metadata()?.len();
        if size < end {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: the file ends at byte {size}, before byte {end} (was it truncated?)",
                    lun.label
                ),
            ));
        }
        if !self.out.is_empty() || !self.gather.is_empty() {
            // MSG_MORE: these PDUs follow at once.
            self.flush_buffer_with(libc::MSG_MORE).await?;
        }
        let headers: Vec<_> = pdus
            .iter()
            .map(|p| encode_header(&p.bhs, &[], p.len, self.digests))
            .collect();
        let parts: Vec<MappedPart<'_>> = pdus
            .iter()
            .zip(&headers)
            .map(|(p, header)| MappedPart {
                head: header,
                offset: p.offset,
                len: p.len as usize,
            })
            .collect();
        let stream = self.inner.tcp().expect("mapped sends only on TCP sockets");
        let fd = stream.as_raw_fd();
        let total: usize = parts.iter().map(|p| p.head.len() + p.len).sum();
        let mut done = 0;
        while done < total {
            done += self
                .stall
                .send(send_when_room(stream, self.room.as_ref(), || {
                    map.send_parts(fd, &parts, done)
                }))
                .await
                .map_err(|e| {
                    if e.raw_os_error() == Some(libc::EFAULT) {
                        let end = pdus.iter().map(|p| p.offset + u64::from(p.len)).max();
                        std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            format!(
                                "{}: the file ends before byte {} (the mapped send faulted; was it truncated?)",
                                lun.label,
                                end.unwrap_or_default()
                            ),
                        )
                    } else {
                        e
                    }
                })?;
        }
        for p in pdus {
            let (itt, status) = accounting(&p.bhs);
            self.stats.mapped_bytes += u64::from(p.len);
            self.file_payload_sent(itt, status, p.len, |c| c.sent_from_user += u64::from(p.len));
        }
        Ok(())
    }

    /// Queues the PDU with its payload read from the page cache, if every
    /// page of it is cached (`RWF_NOWAIT`) or the file is in memory. False,
    /// with nothing queued, when a page is not cached, the file system
    /// cannot say, the file ends early or the read fails:
    /// [`PduWriter::push_file`] then sends it by `sendfile`, which waits for
    /// the pages and reports the errors.
    fn copy_cached(&mut self, bhs: &Bhs, lun: &SendfileLun, offset: u64, len: u32) -> bool {
        let Some(flags) = lun.small_read_flags() else {
            return false;
        };
        let start = self.out.len();
        self.out
            .extend_from_slice(&encode_header(bhs, &[], len, self.digests));
        let at = self.out.len();
        self.out.resize(at + padded_len(len as usize), 0);
        let mut done = 0usize;
        while done < len as usize {
            let dst = &mut self.out[at + done..at + len as usize];
            match rustix::io::preadv2(
                &lun.file,
                &mut [std::io::IoSliceMut::new(dst)],
                offset + done as u64,
                flags,
            ) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::OPNOTSUPP) => {
                    lun.refuse_nowait_reads();
                    break;
                }
                Err(_) => break,
            }
        }
        if done < len as usize {
            self.out.truncate(start);
            return false;
        }
        let (itt, status) = accounting(bhs);
        self.stats.file_copied_bytes += u64::from(len);
        self.note(itt, |c| {
            c.payload += u64::from(len);
            c.read_to_user += u64::from(len);
            c.sent_from_user += u64::from(len);
        });
        self.finish(itt, status);
        true
    }

    async fn flush_buffer(&mut self) -> std::io::Result<u64> {
        self.flush_buffer_with(0).await
    }

    /// Writes what is queued, gathered payloads in their places, with
    /// `sendmsg` `flags` (plain writes on a stream sink); returns the number
    /// of calls that wrote.
    async fn flush_buffer_with(&mut self, flags: libc::c_int) -> std::io::Result<u64> {
        // The owned bytes cut where each gathered payload goes, in order.
        let mut parts: Vec<&[u8]> = Vec::with_capacity(2 * self.gather.len() + 1);
        let mut at = 0;
        for (pos, data) in &self.gather {
            parts.push(&self.out[at..*pos]);
            parts.push(data);
            at = *pos;
        }
        parts.push(&self.out[at..]);
        parts.retain(|p| !p.is_empty());
        let calls = if parts.is_empty() {
            0
        } else {
            self.inner
                .write_parts(&parts, flags, &self.stall, self.room.as_ref())
                .await?
        };
        self.gather.clear();
        self.out.clear();
        Ok(calls)
    }

    /// Sends everything queued.
    pub async fn flush(&mut self) -> std::io::Result<()> {
        self.flush_buffer().await?;
        self.inner.flush(&self.stall).await
    }

    /// Shuts the write side down after flushing, after waiting (boundedly)
    /// for the kernel to release zero-copy buffers.
    pub async fn shutdown(&mut self) -> std::io::Result<()> {
        self.flush().await?;
        self.release_zero_copy().await;
        self.inner.shutdown(&self.stall).await
    }

    /// Whether zero-copy buffers wait for the kernel's notification.
    pub fn zero_copy_pending(&self) -> bool {
        self.zc.as_ref().is_some_and(|z| z.inflight() > 0)
    }

    /// Waits for a zero-copy completion and releases the buffers it covers
    /// (for an idle writer, so buffers go back to their pool without
    /// waiting for the next send). Cancel-safe. A completion comes once the
    /// initiator has taken the data: none for the stall limit is a stall,
    /// as the READ data it holds back would otherwise stay for good.
    pub async fn reap_zero_copy(&mut self) -> std::io::Result<()> {
        match (self.zc.as_mut(), self.inner.tcp()) {
            (Some(zc), Some(stream)) if zc.inflight() > 0 => {
                zc.reap(stream, stream.as_raw_fd(), &self.stall).await
            }
            _ => std::future::pending().await,
        }
    }

    /// Waits (at most a few seconds) until the kernel has released every
    /// zero-copy buffer, so none returns to its pool while still referenced.
    pub async fn release_zero_copy(&mut self) {
        if let (Some(zc), Some(stream)) = (self.zc.as_mut(), self.inner.tcp()) {
            if zc.inflight() > 0 {
                let _ = tokio::time::timeout(
                    std::time::Duration::from_secs(5),
                    zc.wait_below(stream, stream.as_raw_fd(), 1, &self.stall),
                )
                .await;
            }
        }
    }

    /// Ends the connection in both directions at once (the reader sees end
    /// of stream): for a failure after a PDU's header left.
    pub fn abort(&self) {
        // A stream sink has no socket to shut: the caller drops the writer
        // (and with it the stream) right after.
        if let Some(fd) = self.fd() {
            // SAFETY: shutdown on our own, still open socket fd.
            unsafe {
                libc::shutdown(fd, libc::SHUT_RDWR);
            }
        }
    }
}

/// A writer going away with zero-copy sends the kernel has not let go of
/// leaves their buffers held until it does (see [`ZeroCopy::retire`]).
impl Drop for PduWriter {
    fn drop(&mut self) {
        if let (Some(zc), Some(stream)) = (self.zc.take(), self.inner.tcp()) {
            if self.cut.load(std::sync::atomic::Ordering::Acquire) {
                let _ = zc.retire_cut(stream);
            } else {
                let _ = zc.retire(stream);
            }
        }
    }
}

/// Writes `parts` in one `sendmsg` when the socket takes it all, resuming
/// after partial writes; returns the number of calls that wrote. `flags`
/// are sendmsg's (MSG_MORE: more of the same PDU follows at once, so TCP
/// need not send what it has as a segment of its own).
async fn write_gathered(
    stream: &TcpStream,
    parts: &[&[u8]],
    flags: libc::c_int,
    stall: &StallLimit,
    room: Option<&SocketRoom>,
) -> std::io::Result<u64> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let fd = stream.as_raw_fd();
    let (mut done, mut calls) = (0usize, 0u64);
    while done < total {
        let iov = zerocopy::slices_from(parts, done);
        let sent = send_when_room(stream, room, || zerocopy::sendmsg(fd, &iov, flags));
        match stall.send(sent).await? {
            0 => return Err(std::io::ErrorKind::WriteZero.into()),
            n => {
                done += n;
                calls += 1;
            }
        }
    }
    Ok(calls)
}

/// Whether sending this PDU consumes a StatSN (RFC 7143 §4.2.2.2): every
/// response does; R2T, Data-In without status and unsolicited NOP-In do not.
pub fn advances_stat_sn(bhs: &Bhs) -> bool {
    match bhs {
        Bhs::DataIn(d) => d.status.is_some(),
        Bhs::NopIn(n) => n.itt != RESERVED_TAG,
        Bhs::R2t(_) => false,
        Bhs::ScsiResponse(_)
        | Bhs::TaskMgmtResponse(_)
        | Bhs::TextResponse(_)
        | Bhs::LogoutResponse(_)
        | Bhs::LoginResponse(_)
        | Bhs::AsyncMessage(_)
        | Bhs::Reject(_) => true,
        _ => false,
    }
}

/// The ExpStatSN an initiator's PDU carries (every request and Data-Out
/// has one, RFC 7143 §11); None for a target's PDU.
pub fn exp_stat_sn(bhs: &Bhs) -> Option<u32> {
    match bhs {
        Bhs::NopOut(p) => Some(p.exp_stat_sn),
        Bhs::ScsiCommand(p) => Some(p.exp_stat_sn),
        Bhs::TaskMgmtRequest(p) => Some(p.exp_stat_sn),
        Bhs::LoginRequest(p) => Some(p.exp_stat_sn),
        Bhs::TextRequest(p) => Some(p.exp_stat_sn),
        Bhs::DataOut(p) => Some(p.exp_stat_sn),
        Bhs::LogoutRequest(p) => Some(p.exp_stat_sn),
        Bhs::SnackRequest(p) => Some(p.exp_stat_sn),
        _ => None,
    }
}

/// Fills StatSN, ExpCmdSN and MaxCmdSN of a target PDU.
pub fn stamp(bhs: &mut Bhs, stat_sn: u32, exp_cmd_sn: u32, max_cmd_sn: u32) {
    macro_rules! set {
        ($p:expr) => {{
            $p.stat_sn = stat_sn;
            $p.exp_cmd_sn = exp_cmd_sn;
            $p.max_cmd_sn = max_cmd_sn;
        }};
    }
    match bhs {
        Bhs::NopIn(p) => set!(p),
        Bhs::ScsiResponse(p) => set!(p),
        Bhs::TaskMgmtResponse(p) => set!(p),
        Bhs::LoginResponse(p) => set!(p),
        Bhs::TextResponse(p) => set!(p),
        Bhs::DataIn(p) => set!(p),
        Bhs::LogoutResponse(p) => set!(p),
        Bhs::R2t(p) => set!(p),
        Bhs::AsyncMessage(p) => set!(p),
        Bhs::Reject(p) => set!(p),
        _ => {}
    }
}

#[cfg(test)]
mod tests;
