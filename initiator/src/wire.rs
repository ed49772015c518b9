//! Moving PDUs over a TCP stream (tokio). Framing, digests and header
//! decoding are `blockwire_pdu`'s; this module only reads and writes bytes.
//!
//! Data-In payloads are read straight from the socket into the command's
//! buffer ([`PduReader::read_data_into`]): the stream is buffered for
//! headers only, and large reads bypass that buffer.

use blockwire_pdu::digest::{crc32c_digest, DIGEST_LEN};
use blockwire_pdu::pdu::{data_digest, encode_header, padded_len, HeaderLengths, BHS_LEN};
use blockwire_pdu::{Bhs, DecodeError, Digests, FrameDecoder, FrameSize, Opcode, Pdu};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

use crate::error::{Error, Result};

/// Data segments up to this size are copied next to their header and sent
/// with one write; larger ones go out from the caller's buffer.
const COALESCE: usize = 16 * 1024;

/// Writes one PDU whose data segment is `data`.
pub async fn write_pdu<W: AsyncWrite + Unpin>(
    w: &mut W,
    bhs: &Bhs,
    data: &[u8],
    digests: Digests,
) -> std::io::Result<()> {
    let mut head = encode_header(bhs, &[], data.len() as u32, digests);
    let pad = padded_len(data.len()) - data.len();
    let mut tail = [0u8; 3 + DIGEST_LEN];
    let mut tail_len = pad;
    if digests.data && !data.is_empty() {
        tail[pad..pad + DIGEST_LEN].copy_from_slice(&data_digest(data));
        tail_len += DIGEST_LEN;
    }
    if data.len() <= COALESCE {
        head.extend_from_slice(data);
        head.extend_from_slice(&tail[..tail_len]);
        w.write_all(&head).await
    } else {
        w.write_all(&head).await?;
        w.write_all(data).await?;
        w.write_all(&tail[..tail_len]).await
    }
}

/// Writes a whole [`Pdu`].
pub async fn write_whole<W: AsyncWrite + Unpin>(
    w: &mut W,
    pdu: &Pdu,
    digests: Digests,
) -> std::io::Result<()> {
    if pdu.ahs.is_empty() {
        write_pdu(w, &pdu.bhs, &pdu.data, digests).await
    } else {
        w.write_all(&pdu.encode(digests)).await
    }
}

/// A header read from the stream, its data segment still unread.
#[derive(Debug)]
pub struct Header {
    /// The decoded BHS.
    pub bhs: Bhs,
    /// The raw header bytes (BHS, AHS; without the digest).
    pub raw: Vec<u8>,
    /// DataSegmentLength.
    pub data_len: usize,
}

/// Reads PDUs from a stream under the connection's limits.
#[derive(Debug)]
pub struct PduReader<R> {
    inner: BufReader<R>,
    framing: FrameDecoder,
}

impl<R: AsyncRead + Unpin> PduReader<R> {
    /// A reader with the login-time limits (8 KiB, no digests).
    pub fn new(r: R) -> Self {
        PduReader {
            inner: BufReader::with_capacity(64 * 1024, r),
            framing: FrameDecoder::default(),
        }
    }

    /// Applies the negotiated MaxRecvDataSegmentLength and digests.
    pub fn set_limits(&mut self, max_recv_data_segment_length: u32, digests: Digests) {
        self.framing = FrameDecoder::new(max_recv_data_segment_length, digests);
    }

    fn digests(&self) -> Digests {
        self.framing.digests
    }

    /// Reads a header (BHS, AHS, header digest) and checks it.
    pub async fn read_header(&mut self) -> Result<Header> {
        let mut raw = vec![0u8; BHS_LEN];
        self.inner
            .read_exact(&mut raw)
            .await
            .map_err(|e| Error::io("reading a PDU header", e))?;
        // Bounds the data segment by MaxRecvDataSegmentLength.
        let FrameSize::Total(_) = self.framing.frame_size(&raw)? else {
            unreachable!("48 bytes hold the lengths")
        };
        let lengths = HeaderLengths::peek(&raw).expect("48 bytes");
        if lengths.ahs_len > 0 {
            raw.resize(BHS_LEN + lengths.ahs_len, 0);
            self.inner
                .read_exact(&mut raw[BHS_LEN..])
                .await
                .map_err(|e| Error::io("reading an AHS", e))?;
        }
        if self.digests().header {
            let mut d = [0u8; DIGEST_LEN];
            self.inner
                .read_exact(&mut d)
                .await
                .map_err(|e| Error::io("reading a header digest", e))?;
            let got = u32::from_le_bytes(d);
            let expected = crc32c_digest(&raw);
            if got != expected {
                return Err(DecodeError::HeaderDigest { expected, got }.into());
            }
        }
        let (bhs, _) = Bhs::decode(&raw)?;
        Ok(Header {
            bhs,
            raw,
            data_len: lengths.data_segment_length as usize,
        })
    }

    async fn read_tail(&mut self, data: &[u8]) -> Result<()> {
        let pad = padded_len(data.len()) - data.len();
        let digest = self.digests().data && !data.is_empty();
        let mut tail = [0u8; 3 + DIGEST_LEN];
        let n = pad + if digest { DIGEST_LEN } else { 0 };
        self.inner
            .read_exact(&mut tail[..n])
            .await
            .map_err(|e| Error::io("reading a data segment", e))?;
        if digest {
            let got = u32::from_le_bytes([tail[pad], tail[pad + 1], tail[pad + 2], tail[pad + 3]]);
            let expected = u32::from_le_bytes(data_digest(data));
            if got != expected {
                return Err(DecodeError::DataDigest {
                    expected,
                    got,
                    pdu_len: 0,
                }
                .into());
            }
        }
        Ok(())
    }

    /// Reads the data segment of the header just read into `dst` (its
    /// length is the DataSegmentLength), then padding and data digest.
    pub async fn read_data_into(&mut self, dst: &mut [u8]) -> Result<()> {
        self.inner
            .read_exact(dst)
            .await
            .map_err(|e| Error::io("reading Data-In", e))?;
        self.read_tail(dst).await
    }

    /// Reads and drops a data segment of `len` bytes (checking its digest).
    pub async fn skip_data(&mut self, len: usize) -> Result<()> {
        let mut v = vec![0u8; len];
        self.read_data_into(&mut v).await
    }

    /// Reads the rest of the PDU whose header is `h` and decodes it whole.
    pub async fn finish_pdu(&mut self, h: Header) -> Result<Pdu> {
        let mut data = vec![0u8; h.data_len];
        self.read_data_into(&mut data).await?;
        // Re-assemble so that the pdu crate decodes AHS and fields.
        let mut frame = h.raw;
        frame.extend_from_slice(&data);
        frame.resize(padded_len(frame.len()), 0);
        let (pdu, _) = Pdu::decode(&frame, Digests::NONE)?;
        Ok(pdu)
    }

    /// Reads one whole PDU.
    pub async fn read_pdu(&mut self) -> Result<Pdu> {
        let h = self.read_header().await?;
        self.finish_pdu(h).await
    }
}

/// Whether a header is a Data-In PDU.
pub fn is_data_in(h: &Header) -> bool {
    h.bhs.opcode() == Opcode::DataIn
}
