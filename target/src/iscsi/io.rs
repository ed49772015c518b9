//! Reading PDUs from a socket and writing them back: the thin async layer
//! around the sans-IO framer.

use blockwire_pdu::pdu::RESERVED_TAG;
use blockwire_pdu::{Bhs, DecodeError, Digests, Frame, FrameDecoder, FrameSize, Pdu};
use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

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

    /// The next PDU, or `None` at a clean end of stream. Cancel-safe: bytes
    /// already read stay buffered.
    pub async fn next(&mut self) -> Result<Option<Pdu>, ReadError> {
        loop {
            // A whole PDU is cut off the buffer and decoded in place: its
            // data segment shares the received bytes (no copy).
            if let Ok(FrameSize::Total(total)) = self.framer.frame_size(&self.buf) {
                if self.buf.len() >= total {
                    let frame = self.buf.split_to(total).freeze();
                    match Pdu::decode_shared(&frame, self.framer.digests) {
                        Ok((pdu, _)) => return Ok(Some(pdu)),
                        Err(error) => {
                            let header = frame.get(..48).map(|h| {
                                let mut a = [0u8; 48];
                                a.copy_from_slice(h);
                                a
                            });
                            let skip = matches!(
                                error,
                                DecodeError::UnknownOpcode(_) | DecodeError::DataDigest { .. }
                            )
                            .then_some(total);
                            return Err(ReadError::Decode {
                                error,
                                header,
                                skip,
                            });
                        }
                    }
                }
            }
            match self.framer.decode(&self.buf) {
                Ok(Frame::Pdu { pdu, consumed }) => {
                    let _ = self.buf.split_to(consumed);
                    return Ok(Some(pdu));
                }
                Ok(Frame::NeedMore(n)) => {
                    // NeedMore is bounded by the framer's length checks.
                    self.buf.reserve(n.max(4096));
                    if self.inner.read_buf(&mut self.buf).await? == 0 {
                        return if self.buf.is_empty() {
                            Ok(None)
                        } else {
                            Err(ReadError::Io(std::io::ErrorKind::UnexpectedEof.into()))
                        };
                    }
                }
                Err(error) => {
                    let header = self.buf.get(..48).map(|h| {
                        let mut a = [0u8; 48];
                        a.copy_from_slice(h);
                        a
                    });
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
                    return Err(ReadError::Decode {
                        error,
                        header,
                        skip,
                    });
                }
            }
        }
    }
}

/// Writes PDUs, coalescing small ones into one buffer and sending large
/// data segments straight from their own memory.
pub struct PduWriter<W> {
    inner: W,
    out: Vec<u8>,
    /// Digests in force.
    pub digests: Digests,
}

/// Data segments at least this long are written from their own buffer
/// rather than copied into the coalescing buffer.
const DIRECT_WRITE_MIN: usize = 16 * 1024;

impl<W: AsyncWrite + Unpin> PduWriter<W> {
    /// A writer with no digests.
    pub fn new(inner: W) -> Self {
        PduWriter {
            inner,
            out: Vec::with_capacity(64 * 1024),
            digests: Digests::NONE,
        }
    }

    /// Queues one PDU; large payloads are written immediately.
    pub async fn push(&mut self, pdu: &Pdu) -> std::io::Result<()> {
        if pdu.data.len() < DIRECT_WRITE_MIN {
            pdu.encode_into(&mut self.out, self.digests);
            if self.out.len() >= 256 * 1024 {
                self.flush().await?;
            }
            return Ok(());
        }
        let header = blockwire_pdu::pdu::encode_header(
            &pdu.bhs,
            &pdu.ahs,
            pdu.data.len() as u32,
            self.digests,
        );
        self.out.extend_from_slice(&header);
        self.flush_buffer().await?;
        self.inner.write_all(&pdu.data).await?;
        let pad = blockwire_pdu::pdu::padded_len(pdu.data.len()) - pdu.data.len();
        self.out.extend_from_slice(&[0u8; 3][..pad]);
        if self.digests.data {
            self.out
                .extend_from_slice(&blockwire_pdu::pdu::data_digest(&pdu.data));
        }
        Ok(())
    }

    async fn flush_buffer(&mut self) -> std::io::Result<()> {
        if !self.out.is_empty() {
            self.inner.write_all(&self.out).await?;
            self.out.clear();
        }
        Ok(())
    }

    /// Sends everything queued.
    pub async fn flush(&mut self) -> std::io::Result<()> {
        self.flush_buffer().await?;
        self.inner.flush().await
    }

    /// Shuts the write side down after flushing.
    pub async fn shutdown(&mut self) -> std::io::Result<()> {
        self.flush().await?;
        self.inner.shutdown().await
    }
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
