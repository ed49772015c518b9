//! A bare-bones initiator connection shared by the socket-level tests: the
//! pdu crate's Negotiator, framer and typed PDUs over a TcpStream, with no
//! other logic, so a test sees exactly what the target sends.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use blockwire_pdu::keys::{
    encode_text, parse_text, Digest, LocalConfig, Negotiator, Phase, Role, SessionParams,
};
use blockwire_pdu::pdu::LoginRequest;
use blockwire_pdu::{Bhs, Digests, Frame, FrameDecoder, Pdu, Stage};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One TCP connection speaking PDUs.
pub struct RawConn {
    /// The socket, for tests that write raw bytes.
    pub stream: TcpStream,
    buf: Vec<u8>,
    framer: FrameDecoder,
    /// Digests in force (after login).
    pub digests: Digests,
}

/// What a successful login gave.
pub struct LoggedIn {
    /// The connection, now in full feature phase.
    pub conn: RawConn,
    /// Negotiated parameters.
    pub params: SessionParams,
    /// The TSIH the target assigned.
    pub tsih: u16,
}

impl RawConn {
    /// Connects without logging in.
    pub async fn connect(addr: SocketAddr) -> RawConn {
        RawConn {
            stream: TcpStream::connect(addr).await.unwrap(),
            buf: Vec::new(),
            framer: FrameDecoder::default(),
            digests: Digests::NONE,
        }
    }

    /// Logs `initiator` into `target` (operational stage straight to full
    /// feature phase), offering only the given digests. Panics on failure.
    #[allow(clippy::too_many_arguments)]
    pub async fn login(
        addr: SocketAddr,
        initiator: &str,
        target: &str,
        isid: [u8; 6],
        tsih: u16,
        digests: Digests,
        itt: u32,
        cmd_sn: u32,
    ) -> LoggedIn {
        let mut conn = RawConn::connect(addr).await;
        let mut cfg = LocalConfig::initiator(initiator, target);
        let pick = |on| {
            if on {
                vec![Digest::Crc32c]
            } else {
                vec![Digest::None]
            }
        };
        cfg.header_digests = pick(digests.header);
        cfg.data_digests = pick(digests.data);
        cfg.initial_r2t = false;
        cfg.max_recv_data_segment_length = 65536;
        let mut neg = Negotiator::new(Role::Initiator, cfg).unwrap();
        let mut offer = neg.offer(Phase::Operational).unwrap();
        loop {
            let req = Bhs::LoginRequest(LoginRequest {
                transit: true,
                continue_bit: false,
                csg: Stage::Operational,
                nsg: Stage::FullFeature,
                version_max: 0,
                version_min: 0,
                isid,
                tsih,
                itt,
                cid: 0,
                cmd_sn,
                exp_stat_sn: 0,
            });
            conn.send(Pdu::with_data(req, encode_text(&offer).unwrap()))
                .await;
            let resp = conn
                .recv_within(Duration::from_secs(5))
                .await
                .expect("login response");
            let Bhs::LoginResponse(r) = resp.bhs else {
                panic!("expected a login response, got {resp:?}")
            };
            assert!(
                r.status.is_success(),
                "login of {initiator} failed: {}",
                r.status
            );
            let answers = neg
                .receive(Phase::Operational, &parse_text(&resp.data).unwrap())
                .unwrap();
            if r.transit && r.nsg == Stage::FullFeature {
                neg.finish().unwrap();
                conn.digests = digests;
                conn.framer = FrameDecoder::new(65536, digests);
                return LoggedIn {
                    conn,
                    params: neg.params().clone(),
                    tsih: r.tsih,
                };
            }
            offer = answers.answers;
        }
    }

    /// Sends one PDU with the digests in force.
    pub async fn send(&mut self, pdu: Pdu) {
        self.stream
            .write_all(&pdu.encode(self.digests))
            .await
            .unwrap();
    }

    /// The next PDU, or None when the target closed the connection or
    /// nothing came within `wait`.
    pub async fn recv_within(&mut self, wait: Duration) -> Option<Pdu> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Frame::Pdu { pdu, consumed } = self.framer.decode(&self.buf).unwrap() {
                self.buf.drain(..consumed);
                return Some(pdu);
            }
            let mut chunk = vec![0u8; 65536];
            match tokio::time::timeout_at(deadline, self.stream.read(&mut chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return None,
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }
}
