//! A scripted iSER target's side of the soft RDMA provider's wire format (a 24-byte
//! frame header, see `blockwire_transport::rdma::soft`): frames, the connection's
//! handshake, and iSER messages. A script speaks it to control what no real adapter
//! lets software control, such as which Sends it acknowledges.

use blockwire_pdu::iser::{IserHeader, ISER_HEADER_LEN};
use blockwire_pdu::{Digests, Pdu};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Frame kinds of the soft provider's wire format.
pub const CONNECT: u8 = 1;
pub const ACCEPT: u8 = 2;
pub const SEND: u8 = 6;
pub const ACK: u8 = 7;
pub const FRAME_HEADER_LEN: usize = 24;
/// The soft provider's CONNECT magic ("SFRD").
pub const MAGIC: u32 = 0x5346_5244;

/// A frame this target sends (addr, rkey and aux zero).
pub fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![kind, 0, 0, 0];
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    f.extend_from_slice(&[0; 16]);
    f.extend_from_slice(payload);
    f
}

/// One frame: its kind, its status byte, its aux field and its payload.
pub async fn read_frame(s: &mut TcpStream) -> Option<(u8, u8, u32, Vec<u8>)> {
    let mut h = [0u8; FRAME_HEADER_LEN];
    s.read_exact(&mut h).await.ok()?;
    let len = u32::from_be_bytes(h[4..8].try_into().unwrap()) as usize;
    assert!(len <= 1 << 20, "a {len}-byte frame from the initiator");
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).await.ok()?;
    let aux = u32::from_be_bytes(h[20..24].try_into().unwrap());
    Some((h[0], h[1], aux, payload))
}

/// An iSER message: the iSER control header, then the PDU without digests.
pub fn message(pdu: &Pdu) -> Vec<u8> {
    let mut m = IserHeader::Control {
        write: None,
        read: None,
    }
    .encode()
    .to_vec();
    pdu.encode_into(&mut m, Digests::NONE);
    m
}

/// Accepts one initiator's connection and answers its CONNECT.
pub async fn accept(listener: &TcpListener) -> TcpStream {
    let (mut s, _) = listener.accept().await.unwrap();
    s.set_nodelay(true).unwrap();
    let (kind, _, aux, _) = read_frame(&mut s).await.expect("CONNECT");
    assert_eq!((kind, aux), (CONNECT, MAGIC), "a soft RDMA CONNECT");
    s.write_all(&frame(ACCEPT, &[])).await.unwrap();
    s
}

/// The next PDU the initiator Sends, past the acknowledgements of this
/// target's own Sends (each must be a success); None once it closes.
pub async fn next_pdu(s: &mut TcpStream) -> Option<Pdu> {
    loop {
        let (kind, status, _, payload) = read_frame(s).await?;
        match kind {
            // The initiator's adapter acknowledging our Sends.
            ACK => {
                assert_eq!(status, 0, "the initiator refused a Send");
                continue;
            }
            SEND => {}
            other => panic!("frame kind {other} from the initiator"),
        }
        assert!(payload.len() >= ISER_HEADER_LEN, "a short iSER message");
        let (pdu, _) = Pdu::decode(&payload[ISER_HEADER_LEN..], Digests::NONE)
            .expect("the initiator sends PDUs");
        return Some(pdu);
    }
}
