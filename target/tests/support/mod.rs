//! Shared by the socket-level tests: an in-process target on a free port of
//! 127.0.0.1 ([`start_target`], [`bind_target`]), and a bare-bones initiator connection
//! ([`RawConn`]): the pdu crate's Negotiator, framer and typed PDUs over a
//! TcpStream, with no other logic, so a test sees exactly what the target
//! sends.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use blockwire_pdu::keys::{
    encode_text, parse_text, Digest, LocalConfig, Negotiator, Phase, Role, SessionParams,
};
use blockwire_pdu::pdu::codes::TaskAttr;
use blockwire_pdu::pdu::{LoginRequest, ScsiCommand};
use blockwire_pdu::{Bhs, Digests, Frame, FrameDecoder, Lun, Pdu, Stage};
use blockwire_target::iscsi::catalog::{Acl, Catalog};
use blockwire_target::iscsi::portal::Portal;
use blockwire_target::iscsi::{Fabric, FabricSettings};
use blockwire_target::scsi::LogicalUnit;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// An in-process target, accepting connections.
pub struct TestTarget {
    /// Where its portal listens.
    pub addr: SocketAddr,
    /// Its fabric (data path registries, statistics).
    pub fabric: Arc<Fabric>,
    /// Sending true shuts the target down.
    pub stop: watch::Sender<bool>,
}

/// An in-process target bound to its port but not accepting yet: set up
/// its fabric (e.g. put the LUN on a data path), then [`Self::serve`].
pub struct BoundTarget {
    portal: Portal,
    /// Where its portal listens.
    pub addr: SocketAddr,
    /// Its fabric.
    pub fabric: Arc<Fabric>,
    stop: watch::Sender<bool>,
}

impl BoundTarget {
    /// Starts accepting connections.
    pub fn serve(self) -> TestTarget {
        tokio::spawn(self.portal.run(self.fabric.clone()));
        TestTarget {
            addr: self.addr,
            fabric: self.fabric,
            stop: self.stop,
        }
    }
}

/// A target named `name` whose only LUN, 0, is `lu`, open to the
/// initiators `acl` allows, bound to a free port of 127.0.0.1.
pub async fn bind_target(
    name: &str,
    acl: Acl,
    lu: LogicalUnit,
    settings: FabricSettings,
) -> BoundTarget {
    let portal = Portal::bind("127.0.0.1:0".parse().unwrap(), 1)
        .await
        .unwrap();
    let addr = portal.local_addr().unwrap();
    let catalog = Catalog::one_target(name, addr, acl, Arc::new(lu));
    let (stop, shutdown) = watch::channel(false);
    let fabric = Fabric::new(Arc::new(catalog), settings, shutdown);
    BoundTarget {
        portal,
        addr,
        fabric,
        stop,
    }
}

/// [`bind_target`], then [`BoundTarget::serve`].
pub async fn start_target(
    name: &str,
    acl: Acl,
    lu: LogicalUnit,
    settings: FabricSettings,
) -> TestTarget {
    bind_target(name, acl, lu, settings).await.serve()
}

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

/// A READ(10) or WRITE(10) CDB (`op` 0x28 or 0x2a) of `blocks` blocks at `lba`.
pub fn rw10(op: u8, lba: u32, blocks: u16) -> Vec<u8> {
    let mut cdb = vec![op, 0];
    cdb.extend_from_slice(&lba.to_be_bytes());
    cdb.push(0);
    cdb.extend_from_slice(&blocks.to_be_bytes());
    cdb.push(0);
    cdb
}

/// A SIMPLE SCSI Command to LUN 0 carrying `cdb` (padded to 16 bytes), numbered `itt`
/// and `cmd_sn`, expecting `edtl` bytes in the direction `read` or `write` says.
pub fn lun0_command(
    cdb: &[u8],
    (read, write): (bool, bool),
    edtl: u32,
    final_bit: bool,
    itt: u32,
    cmd_sn: u32,
) -> ScsiCommand {
    let mut c = [0u8; 16];
    c[..cdb.len()].copy_from_slice(cdb);
    ScsiCommand {
        immediate: false,
        final_bit,
        read,
        write,
        attr: TaskAttr::Simple,
        lun: Lun::from_index(0),
        itt,
        expected_data_transfer_length: edtl,
        cmd_sn,
        exp_stat_sn: 0,
        cdb: c,
    }
}

/// This process's resident memory, in bytes (`/proc/self/statm`).
pub fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// How far resident memory rose above `base`: watched for at least two
/// seconds, then until it grew by less than a MiB for one second.
pub async fn resident_growth_since(base: usize) -> usize {
    const MIB: usize = 1 << 20;
    let (mut high, mut since) = (resident_bytes(), std::time::Instant::now());
    let begun = std::time::Instant::now();
    while begun.elapsed() < Duration::from_secs(2) || since.elapsed() < Duration::from_secs(1) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if resident_bytes() > high + MIB {
            (high, since) = (resident_bytes(), std::time::Instant::now());
        }
    }
    high.saturating_sub(base)
}
