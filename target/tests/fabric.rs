//! The fabric over real sockets: an in-process target on 127.0.0.1:0 and a
//! minimal initiator built from the pdu crate (its Negotiator, framer and
//! typed PDUs). Covers what libiscsi's suites cannot: data digests, the
//! CmdSN window, keepalive, reinstatement, shutdown and rejects.

use std::sync::Arc;
use std::time::Duration;

use blockwire_pdu::keys::{encode_text, Digest, SessionParams};
use blockwire_pdu::pdu::codes::{AsyncEvent, RejectReason, TmfFunction, TmfResponse};
use blockwire_pdu::pdu::{
    DataOut, LoginRequest, LogoutRequest, NopOut, R2t, ScsiCommand, TaskMgmtRequest, RESERVED_TAG,
};
use blockwire_pdu::{Bhs, Digests, Lun, Pdu, Stage};
use blockwire_target::backstore::{Backstore, RamBackstore};
use blockwire_target::iscsi::catalog::Acl;
use blockwire_target::iscsi::FabricSettings;
use blockwire_target::scsi::{LogicalUnit, LuConfig};
use tokio::io::AsyncWriteExt;

mod support;
use support::{lun0_command, rw10, start_target, RawConn, TestTarget};

const TARGET: &str = "iqn.2026-11.io.blockwire:fabric-test";
const INITIATOR: &str = "iqn.2026-11.io.blockwire:test-initiator";

async fn start(settings: FabricSettings) -> TestTarget {
    start_with(settings, Arc::new(RamBackstore::new(64 << 20))).await
}

async fn start_with(settings: FabricSettings, store: Arc<dyn Backstore>) -> TestTarget {
    let lu = LogicalUnit::new(LuConfig::new(store));
    start_target(TARGET, Acl::Any, lu, settings).await
}

/// A test initiator session on one connection.
struct Client {
    conn: RawConn,
    cmd_sn: u32,
    itt: u32,
    params: SessionParams,
}

impl Client {
    async fn login(addr: std::net::SocketAddr, isid: [u8; 6], digests: Digests) -> Client {
        Self::login_tsih(addr, isid, 0, digests).await.0
    }

    /// Logs in with a given TSIH (0: new session); returns the TSIH the
    /// target assigned.
    async fn login_tsih(
        addr: std::net::SocketAddr,
        isid: [u8; 6],
        tsih: u16,
        digests: Digests,
    ) -> (Client, u16) {
        let l = RawConn::login(addr, INITIATOR, TARGET, isid, tsih, digests, 0x100, 1).await;
        let c = Client {
            conn: l.conn,
            cmd_sn: 1,
            itt: 0x100,
            params: l.params,
        };
        (c, l.tsih)
    }

    async fn send(&mut self, pdu: Pdu) {
        self.conn.send(pdu).await;
    }

    async fn recv_within(&mut self, wait: Duration) -> Option<Pdu> {
        self.conn.recv_within(wait).await
    }

    async fn recv(&mut self) -> Option<Pdu> {
        self.recv_within(Duration::from_secs(2)).await
    }

    fn command(
        &mut self,
        cdb: &[u8],
        read: bool,
        write: bool,
        edtl: u32,
        final_bit: bool,
    ) -> ScsiCommand {
        self.itt += 1;
        let cmd = lun0_command(cdb, (read, write), edtl, final_bit, self.itt, self.cmd_sn);
        self.cmd_sn += 1;
        cmd
    }

    /// Reads every Data-In into a buffer until the status arrives.
    async fn read_response(&mut self, itt: u32, len: usize) -> (u8, Vec<u8>) {
        let mut data = vec![0u8; len];
        loop {
            let pdu = self.recv().await.expect("response");
            match pdu.bhs {
                Bhs::DataIn(d) if d.itt == itt => {
                    let at = d.buffer_offset as usize;
                    data[at..at + pdu.data.len()].copy_from_slice(&pdu.data);
                    if let Some(status) = d.status {
                        return (status, data);
                    }
                }
                Bhs::ScsiResponse(r) if r.itt == itt => return (r.status, data),
                Bhs::NopIn(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// An immediate task management request for LUN 0, under the next ITT
    /// (`referenced`: the task it names, with its CmdSN).
    fn tmf(&mut self, function: TmfFunction, referenced: (u32, u32)) -> TaskMgmtRequest {
        self.itt += 1;
        TaskMgmtRequest {
            immediate: true,
            function,
            lun: Lun::from_index(0),
            itt: self.itt,
            referenced_task_tag: referenced.0,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: 0,
            ref_cmd_sn: referenced.1,
            exp_data_sn: 0,
        }
    }

    async fn test_unit_ready(&mut self) -> Option<u8> {
        let cmd = self.command(&[0; 6], false, false, 0, true);
        self.send(Pdu::new(Bhs::ScsiCommand(cmd))).await;
        loop {
            match self.recv().await?.bhs {
                Bhs::ScsiResponse(r) if r.itt == cmd.itt => return Some(r.status),
                _ => {}
            }
        }
    }
}

/// Writes `data` at `lba` with immediate data, unsolicited Data-Out and
/// R2T-solicited Data-Out as negotiated, and returns the SCSI status.
async fn write(c: &mut Client, lba: u32, data: &[u8]) -> u8 {
    let first_burst = c.params.first_burst_length as usize;
    let seg = c.params.target_max_recv_data_segment_length as usize;
    let imm = data.len().min(first_burst).min(seg);
    let unsolicited_end = if c.params.initial_r2t {
        imm
    } else {
        data.len().min(first_burst)
    };
    let cmd = c.command(
        &rw10(0x2a, lba, (data.len() / 512) as u16),
        false,
        true,
        data.len() as u32,
        unsolicited_end == imm,
    );
    c.send(Pdu::with_data(Bhs::ScsiCommand(cmd), data[..imm].to_vec()))
        .await;
    let (mut off, mut sn) = (imm, 0);
    while off < unsolicited_end {
        let end = (off + seg).min(unsolicited_end);
        let d = DataOut {
            final_bit: end == unsolicited_end,
            lun: cmd.lun,
            itt: cmd.itt,
            ttt: RESERVED_TAG,
            exp_stat_sn: 0,
            data_sn: sn,
            buffer_offset: off as u32,
        };
        c.send(Pdu::with_data(Bhs::DataOut(d), data[off..end].to_vec()))
            .await;
        off = end;
        sn += 1;
    }
    loop {
        let pdu = c.recv().await.expect("R2T or response");
        match pdu.bhs {
            Bhs::R2t(r) => answer_r2t(c, &r, data).await,
            Bhs::ScsiResponse(r) if r.itt == cmd.itt => return r.status,
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// Sends the Data-Out sequence `r2t` asks for, out of `data` (the whole
/// command's data).
async fn answer_r2t(c: &mut Client, r2t: &R2t, data: &[u8]) {
    let seg = c.params.target_max_recv_data_segment_length as usize;
    let (start, stop) = (
        r2t.buffer_offset as usize,
        (r2t.buffer_offset + r2t.desired_data_transfer_length) as usize,
    );
    let (mut o, mut sn) = (start, 0);
    while o < stop {
        let end = (o + seg).min(stop);
        let d = DataOut {
            final_bit: end == stop,
            lun: r2t.lun,
            itt: r2t.itt,
            ttt: r2t.ttt,
            exp_stat_sn: 0,
            data_sn: sn,
            buffer_offset: o as u32,
        };
        c.send(Pdu::with_data(Bhs::DataOut(d), data[o..end].to_vec()))
            .await;
        o = end;
        sn += 1;
    }
}

#[tokio::test]
async fn digests_protect_a_write_and_read_back() {
    let t = start(FabricSettings::default()).await;
    let mut c = Client::login(t.addr, [0x80, 1, 2, 3, 4, 5], Digests::BOTH).await;
    assert_eq!(c.params.header_digest, Digest::Crc32c);
    assert_eq!(c.params.data_digest, Digest::Crc32c);
    let _ = c.test_unit_ready().await; // consumes the power-on unit attention
    let data: Vec<u8> = (0..1 << 20)
        .map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    assert_eq!(write(&mut c, 2048, &data).await, 0);
    let cmd = c.command(&rw10(0x28, 2048, 2048), true, false, 1 << 20, true);
    c.send(Pdu::new(Bhs::ScsiCommand(cmd))).await;
    let (status, back) = c.read_response(cmd.itt, 1 << 20).await;
    assert_eq!(status, 0);
    assert!(back == data, "data read back differs");

    // A corrupted data digest: the PDU is rejected, nothing is written.
    let cmd = c.command(&rw10(0x2a, 0, 1), false, true, 512, true);
    let mut wire = Pdu::with_data(Bhs::ScsiCommand(cmd), vec![0xee; 512]).encode(Digests::BOTH);
    let n = wire.len();
    wire[n - 1] ^= 0xff;
    c.conn.stream.write_all(&wire).await.unwrap();
    let pdu = c.recv().await.expect("a Reject");
    let Bhs::Reject(r) = pdu.bhs else {
        panic!("expected Reject, got {pdu:?}")
    };
    assert_eq!(r.reason, RejectReason::DataDigestError);
}

#[tokio::test]
async fn nop_out_is_echoed_and_window_holds_128_commands() {
    let t = start(FabricSettings::default()).await;
    let mut c = Client::login(t.addr, [0x80, 0, 0, 0, 0, 2], Digests::NONE).await;
    let _ = c.test_unit_ready().await;
    c.itt += 1;
    let itt = c.itt;
    let nop = NopOut {
        immediate: true,
        lun: Lun::default(),
        itt,
        ttt: RESERVED_TAG,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: 0,
    };
    c.send(Pdu::with_data(Bhs::NopOut(nop), b"ping data".to_vec()))
        .await;
    let pdu = c.recv().await.unwrap();
    let Bhs::NopIn(n) = pdu.bhs else {
        panic!("expected NOP-In")
    };
    assert_eq!((n.itt, &pdu.data[..]), (itt, &b"ping data"[..]));
    assert!(
        n.max_cmd_sn.wrapping_sub(n.exp_cmd_sn) >= 127,
        "window below 128 commands"
    );

    // 128 reads in flight at once, all answered.
    let mut itts = std::collections::HashSet::new();
    let mut burst = Vec::new();
    for i in 0..128u32 {
        let cmd = c.command(&rw10(0x28, i * 8, 8), true, false, 4096, true);
        itts.insert(cmd.itt);
        burst.extend_from_slice(&Pdu::new(Bhs::ScsiCommand(cmd)).encode(Digests::NONE));
    }
    c.conn.stream.write_all(&burst).await.unwrap();
    while !itts.is_empty() {
        let pdu = c.recv().await.expect("all 128 commands answered");
        if let Bhs::DataIn(d) = pdu.bhs {
            if d.status == Some(0) {
                assert!(itts.remove(&d.itt));
            }
        }
    }
}

#[tokio::test]
async fn commands_outside_the_window_are_dropped_silently() {
    let t = start(FabricSettings::default()).await;
    let mut c = Client::login(t.addr, [0x80, 0, 0, 0, 0, 3], Digests::NONE).await;
    let _ = c.test_unit_ready().await;
    let good = c.cmd_sn;
    c.cmd_sn = good + 1000;
    let cmd = c.command(&[0; 6], false, false, 0, true);
    c.send(Pdu::new(Bhs::ScsiCommand(cmd))).await;
    assert!(
        c.recv_within(Duration::from_millis(500)).await.is_none(),
        "answered a CmdSN beyond MaxCmdSN"
    );
    c.cmd_sn = good;
    assert_eq!(
        c.test_unit_ready().await,
        Some(0),
        "the session still works"
    );
}

#[tokio::test]
async fn unanswered_keepalives_drop_the_connection() {
    let settings = FabricSettings {
        nop_interval: Some(Duration::from_millis(100)),
        nop_timeout: Duration::from_millis(300),
        ..FabricSettings::default()
    };
    let t = start(settings).await;
    let mut c = Client::login(t.addr, [0x80, 0, 0, 0, 0, 4], Digests::NONE).await;
    let ping = c.recv().await.expect("a NOP-In ping");
    let Bhs::NopIn(n) = ping.bhs else {
        panic!("expected NOP-In")
    };
    assert_eq!(n.itt, RESERVED_TAG);
    assert_ne!(n.ttt, RESERVED_TAG, "a ping that wants an answer");
    // Answer this one: the connection stays.
    let answer = NopOut {
        immediate: true,
        lun: n.lun,
        itt: RESERVED_TAG,
        ttt: n.ttt,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: n.stat_sn,
    };
    c.send(Pdu::new(Bhs::NopOut(answer))).await;
    // Then stay silent: the target must hang up within a bounded time.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        match c.recv_within(Duration::from_secs(3)).await {
            None => break,
            Some(p) => assert!(matches!(p.bhs, Bhs::NopIn(_)), "unexpected {p:?}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "connection not dropped"
        );
    }
}

#[tokio::test]
async fn same_isid_reinstates_the_session() {
    let t = start(FabricSettings::default()).await;
    let isid = [0x80, 9, 9, 9, 9, 9];
    let mut old = Client::login(t.addr, isid, Digests::NONE).await;
    let _ = old.test_unit_ready().await;
    let mut new = Client::login(t.addr, isid, Digests::NONE).await;
    assert!(
        old.recv().await.is_none(),
        "the old connection must be closed"
    );
    let _ = new.test_unit_ready().await;
    assert_eq!(new.test_unit_ready().await, Some(0));
}

#[tokio::test]
async fn known_tsih_and_cid_reinstate_the_connection() {
    let t = start(FabricSettings::default()).await;
    let isid = [0x80, 7, 7, 7, 7, 7];
    let (mut old, tsih) = Client::login_tsih(t.addr, isid, 0, Digests::NONE).await;
    assert_ne!(tsih, 0);
    let _ = old.test_unit_ready().await;
    let (mut new, again) = Client::login_tsih(t.addr, isid, tsih, Digests::NONE).await;
    assert_eq!(again, tsih, "the connection joins the same session");
    assert!(
        old.recv().await.is_none(),
        "the old connection must be closed"
    );
    let _ = new.test_unit_ready().await;
    assert_eq!(new.test_unit_ready().await, Some(0));
}

/// A first Login Request (ITT 1, CID 0, CmdSN 1) from the operational stage
/// straight to full feature phase, with `keys`.
fn straight_to_full_feature(isid: [u8; 6], tsih: u16, keys: Vec<u8>) -> Pdu {
    let req = Bhs::LoginRequest(LoginRequest {
        transit: true,
        continue_bit: false,
        csg: Stage::Operational,
        nsg: Stage::FullFeature,
        version_max: 0,
        version_min: 0,
        isid,
        tsih,
        itt: 1,
        cid: 0,
        cmd_sn: 1,
        exp_stat_sn: 0,
    });
    Pdu::with_data(req, keys)
}

/// A discovery login needs no CHAP and no access list: one that carries the TSIH,
/// ISID and CID of another initiator's normal session (all guessable) must not join
/// it, which would end that initiator's connection and give the discovery login its
/// SCSI access.
#[tokio::test]
async fn a_discovery_login_naming_a_normal_sessions_tsih_joins_nothing() {
    let t = start(FabricSettings::default()).await;
    let isid = [0x80, 6, 6, 6, 6, 6];
    let (mut victim, tsih) = Client::login_tsih(t.addr, isid, 0, Digests::NONE).await;
    let _ = victim.test_unit_ready().await;
    let mut intruder = RawConn::connect(t.addr).await;
    let keys = encode_text(&[("InitiatorName", INITIATOR), ("SessionType", "Discovery")]).unwrap();
    intruder
        .send(straight_to_full_feature(isid, tsih, keys))
        .await;
    let pdu = intruder
        .recv_within(Duration::from_secs(2))
        .await
        .expect("a login response");
    let Bhs::LoginResponse(r) = pdu.bhs else {
        panic!("expected a login response, got {:?}", pdu.bhs)
    };
    assert_eq!(
        r.status,
        blockwire_pdu::LoginStatus::SESSION_DOES_NOT_EXIST,
        "the discovery login joined the normal session"
    );
    // The session's own connection serves on.
    assert_eq!(victim.test_unit_ready().await, Some(0));
}

#[tokio::test]
async fn unknown_tsih_is_refused_with_session_does_not_exist() {
    let t = start(FabricSettings::default()).await;
    let mut c = Client {
        conn: RawConn::connect(t.addr).await,
        cmd_sn: 1,
        itt: 1,
        params: SessionParams::default(),
    };
    let keys = encode_text(&[
        ("InitiatorName", INITIATOR),
        ("TargetName", TARGET),
        ("SessionType", "Normal"),
    ])
    .unwrap();
    c.send(straight_to_full_feature(
        [0x80, 1, 1, 1, 1, 1],
        0x4242,
        keys,
    ))
    .await;
    let pdu = c.recv().await.expect("a login response");
    let Bhs::LoginResponse(r) = pdu.bhs else {
        panic!("expected a login response")
    };
    assert_eq!(r.status, blockwire_pdu::LoginStatus::SESSION_DOES_NOT_EXIST);
    assert!(
        c.recv().await.is_none(),
        "the connection closes after a failed login"
    );
}

/// A refused login ends with a FIN, not a reset, even when the initiator
/// sent more than the target read: here a Login Request whose data segment
/// is past the login phase's 8192 bytes, and 256 KiB pipelined after it.
/// Closed with those bytes unread, the socket would be reset, and a reset
/// can cost the initiator the Login Response saying why (a lost segment is
/// never sent again). Meanwhile the connection keeps its login slot, and
/// gives it back once the initiator closes its end.
#[tokio::test]
async fn a_refused_login_ends_with_a_fin_though_the_initiator_sent_more() {
    use tokio::io::AsyncReadExt;
    let t = start(FabricSettings::default()).await;
    let stream = tokio::net::TcpStream::connect(t.addr).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let mut bytes = straight_to_full_feature([0x80, 0, 0, 0, 0, 9], 0, vec![b'x'; 9000])
        .encode(Digests::NONE)
        .to_vec();
    bytes.extend(std::iter::repeat(0xa5u8).take(256 << 10));
    // Written beside the reads: the target reads it only once it has
    // answered.
    let sent = tokio::spawn(async move {
        let _ = wr.write_all(&bytes).await;
        wr
    });
    let mut header = [0u8; 48];
    tokio::time::timeout(Duration::from_secs(5), rd.read_exact(&mut header))
        .await
        .expect("a Login Response within 5 s")
        .expect("a Login Response before the close");
    let Ok((Bhs::LoginResponse(r), _)) = Bhs::decode(&header) else {
        panic!("not a Login Response: {:?}", Bhs::decode(&header));
    };
    assert_eq!(r.status, blockwire_pdu::LoginStatus::INITIATOR_ERROR);
    let mut rest = Vec::new();
    let end = tokio::time::timeout(Duration::from_secs(5), rd.read_to_end(&mut rest))
        .await
        .expect("the target closes its end within 5 s");
    assert!(
        end.is_ok(),
        "the refused connection was reset, not closed: {end:?}"
    );
    // A reset may still follow the FIN: the target must be reading what
    // comes until this end closes too.
    let mut stream = rd.reunite(sent.await.unwrap()).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        stream.take_error().unwrap().is_none(),
        "the refused connection was reset after its FIN"
    );
    stream
        .write_all(b"more")
        .await
        .expect("the target still takes what this end sends");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        stream.take_error().unwrap().is_none(),
        "the refused connection was reset after its FIN"
    );
    assert_eq!(
        t.fabric.login_slots.held(),
        (1, 1),
        "the connection holds its login slot while it lingers"
    );
    drop(stream);
    let released = async {
        while t.fabric.login_slots.held() != (0, 0) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), released)
        .await
        .expect("the login slot given back once this end closed");
}

#[tokio::test]
async fn shutdown_asks_for_logout() {
    let t = start(FabricSettings::default()).await;
    let mut c = Client::login(t.addr, [0x80, 0, 0, 0, 0, 6], Digests::NONE).await;
    t.stop.send(true).unwrap();
    let pdu = c.recv().await.expect("an Async Message");
    let Bhs::AsyncMessage(a) = pdu.bhs else {
        panic!("expected Async Message, got {pdu:?}")
    };
    assert_eq!(a.event, AsyncEvent::LogoutRequest);
}

#[tokio::test]
async fn unknown_opcodes_are_rejected_and_tmf_answers() {
    let t = start(FabricSettings::default()).await;
    let mut c = Client::login(t.addr, [0x80, 0, 0, 0, 0, 7], Digests::NONE).await;
    let _ = c.test_unit_ready().await;
    let mut vendor = [0u8; 48];
    vendor[0] = 0x1c; // a vendor-specific initiator opcode
    c.conn.stream.write_all(&vendor).await.unwrap();
    let pdu = c.recv().await.expect("a Reject");
    let Bhs::Reject(r) = pdu.bhs else {
        panic!("expected Reject, got {pdu:?}")
    };
    assert_eq!(r.reason, RejectReason::CommandNotSupported);
    assert_eq!(&pdu.data[..], &vendor[..]);

    for (function, referenced, expected) in [
        (
            TmfFunction::AbortTask,
            0xdead,
            TmfResponse::TaskDoesNotExist,
        ),
        (
            TmfFunction::LogicalUnitReset,
            RESERVED_TAG,
            TmfResponse::FunctionComplete,
        ),
    ] {
        let req = c.tmf(function, (referenced, c.cmd_sn + 5));
        c.send(Pdu::new(Bhs::TaskMgmtRequest(req))).await;
        let pdu = c.recv().await.expect("a TMF response");
        let Bhs::TaskMgmtResponse(r) = pdu.bhs else {
            panic!("expected TMF response, got {pdu:?}")
        };
        assert_eq!(r.response, expected, "{function:?}");
    }
    // After the LUN reset the initiator sees a unit attention, then GOOD.
    assert_eq!(c.test_unit_ready().await, Some(2));
    assert_eq!(c.test_unit_ready().await, Some(0));
}

/// TARGET COLD RESET drops "all of its TCP connections to all initiators"
/// (RFC 7143 §11.5.1): another initiator's session ends too, where only the
/// connection that asked for the reset was closed and the others went on
/// after a unit attention.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_cold_reset_ends_every_session_of_the_target() {
    let t = start(FabricSettings::default()).await;
    let mut a = Client::login(t.addr, [0x80, 0, 0, 0, 0, 0x21], Digests::NONE).await;
    let mut b = Client::login(t.addr, [0x80, 0, 0, 0, 0, 0x22], Digests::NONE).await;
    assert!(a.test_unit_ready().await.is_some());
    assert!(b.test_unit_ready().await.is_some());
    assert_eq!(t.fabric.sessions.all().len(), 2);
    let reset = a.tmf(TmfFunction::TargetColdReset, (RESERVED_TAG, a.cmd_sn));
    a.send(Pdu::new(Bhs::TaskMgmtRequest(reset))).await;
    let pdu = a.recv().await.expect("the cold reset is answered");
    let Bhs::TaskMgmtResponse(r) = pdu.bhs else {
        panic!("expected the TMF response, got {pdu:?}")
    };
    assert_eq!(r.response, TmfResponse::FunctionComplete);
    // The other initiator's connection closes: its reads end well before
    // the wait does.
    let started = tokio::time::Instant::now();
    while b.recv_within(Duration::from_secs(10)).await.is_some() {}
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the other session's connection stayed open"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !t.fabric.sessions.all().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "sessions left after a cold reset"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Which of a [`HeldStore`]'s operations hang until it is released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Reads: a disk that stopped answering.
    Reads,
    /// Writes: a slow disk with a WRITE on it.
    Writes,
}

/// A RAM backstore whose reads or writes hang until released.
#[derive(Debug)]
struct HeldStore {
    inner: RamBackstore,
    held: Held,
    released: std::sync::Mutex<bool>,
    wake: std::sync::Condvar,
    /// Held reads that returned after the release.
    served: std::sync::atomic::AtomicUsize,
    /// Held reads or writes that reached the store.
    entered: std::sync::atomic::AtomicUsize,
}

impl HeldStore {
    fn new(held: Held) -> Arc<HeldStore> {
        Arc::new(HeldStore {
            inner: RamBackstore::new(1 << 20),
            held,
            released: std::sync::Mutex::new(false),
            wake: std::sync::Condvar::new(),
            served: Default::default(),
            entered: Default::default(),
        })
    }

    fn release(&self) {
        *self.released.lock().unwrap() = true;
        self.wake.notify_all();
    }

    /// Waits until a held read or write has reached the store, so the
    /// command is in the task set rather than on its way.
    async fn wait_entered(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.entered.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no command reached the backstore"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn wait_for_release(&self) {
        let mut released = self.released.lock().unwrap();
        while !*released {
            released = self.wake.wait(released).unwrap();
        }
    }
}

/// Releases the store when dropped: a failed assertion must not leave a
/// blocking thread waiting for ever, and the test's runtime with it.
struct ReleaseOnDrop(Arc<HeldStore>);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl Backstore for HeldStore {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        if self.held != Held::Reads {
            return self.inner.read_at(offset, buf);
        }
        self.entered
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.wait_for_release();
        let r = self.inner.read_at(offset, buf);
        self.served
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        r
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        if self.held == Held::Writes {
            self.entered
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.wait_for_release();
        }
        self.inner.write_at(offset, data)
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn describe(&self) -> String {
        format!("held {:?}", self.held)
    }
}

#[tokio::test]
async fn abort_task_answers_while_the_backstore_is_stuck() {
    let store = HeldStore::new(Held::Reads);
    let t = start_with(FabricSettings::default(), store.clone()).await;
    let mut c = Client::login(t.addr, [0x80, 0, 0, 0, 0, 8], Digests::NONE).await;
    let _ = c.test_unit_ready().await;
    let read = c.command(&rw10(0x28, 0, 8), true, false, 4096, true);
    c.send(Pdu::new(Bhs::ScsiCommand(read))).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let abort = c.tmf(TmfFunction::AbortTask, (read.itt, read.cmd_sn));
    c.send(Pdu::new(Bhs::TaskMgmtRequest(abort))).await;
    let pdu = c
        .recv_within(Duration::from_secs(1))
        .await
        .expect("TMF answered while the read hangs");
    let Bhs::TaskMgmtResponse(r) = pdu.bhs else {
        panic!("expected TMF response, got {pdu:?}")
    };
    assert_eq!(r.response, TmfResponse::FunctionComplete);
    // When the disk wakes up, the aborted read's data must not be sent:
    // let the backstore finish the read, give a late answer time to go
    // out, then inspect every PDU that arrives up to the TUR's response and
    // for a while after it.
    store.release();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while store.served.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the released backstore never served the aborted read"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let tur = c.command(&[0; 6], false, false, 0, true);
    c.send(Pdu::new(Bhs::ScsiCommand(tur))).await;
    let mut tur_status = None;
    let mut seen = Vec::new();
    let quiet_until = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let wait = quiet_until.saturating_duration_since(tokio::time::Instant::now());
        if tur_status.is_some() && wait.is_zero() {
            break;
        }
        let Some(pdu) = c.recv_within(wait.max(Duration::from_millis(500))).await else {
            break;
        };
        match &pdu.bhs {
            Bhs::DataIn(d) => assert_ne!(
                d.itt, read.itt,
                "Data-In for the aborted READ after its TMF response: {:?}",
                pdu.bhs
            ),
            Bhs::ScsiResponse(r) if r.itt == read.itt => {
                panic!("SCSI Response for the aborted READ after its TMF response: {r:?}")
            }
            Bhs::ScsiResponse(r) if r.itt == tur.itt => {
                assert!(tur_status.is_none(), "two responses to the TUR");
                tur_status = Some(r.status);
            }
            _ => {}
        }
        seen.push(pdu.bhs.opcode());
    }
    assert_eq!(
        tur_status,
        Some(0),
        "the TUR is answered GOOD (PDUs after the TMF response: {seen:?})"
    );
}

/// CLEAR TASK SET clears the unit's one task set, every initiator's commands
/// in it (SAM-5 7.4, TST=000b): another initiator's READ then in the
/// backstore gets no answer, and that initiator hears of it by a unit
/// attention, COMMANDS CLEARED BY ANOTHER INITIATOR (TAS=0). It was handled
/// as ABORT TASK SET: the other READ was answered GOOD and nothing was said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_task_set_clears_other_initiators_commands_and_tells_them() {
    let store = HeldStore::new(Held::Reads);
    let t = start_with(FabricSettings::default(), store.clone()).await;
    let mut a = Client::login(t.addr, [0x80, 0, 0, 0, 0, 0x31], Digests::NONE).await;
    let mut b = Client::login(t.addr, [0x80, 0, 0, 0, 0, 0x32], Digests::NONE).await;
    // Dropped first, also when an assertion fails.
    let _release = ReleaseOnDrop(store.clone());
    assert!(a.test_unit_ready().await.is_some());
    assert!(b.test_unit_ready().await.is_some());
    assert_eq!(b.test_unit_ready().await, Some(0));
    let read = b.command(&rw10(0x28, 0, 8), true, false, 4096, true);
    b.send(Pdu::new(Bhs::ScsiCommand(read))).await;
    store.wait_entered().await;
    let clear = a.tmf(TmfFunction::ClearTaskSet, (RESERVED_TAG, a.cmd_sn));
    a.send(Pdu::new(Bhs::TaskMgmtRequest(clear))).await;
    let pdu = a.recv().await.expect("the clear is answered");
    let Bhs::TaskMgmtResponse(r) = pdu.bhs else {
        panic!("expected the TMF response, got {pdu:?}")
    };
    assert_eq!(r.response, TmfResponse::FunctionComplete);
    // The disk wakes: B's READ was cleared and is never answered.
    store.release();
    let tur = b.command(&[0; 6], false, false, 0, true);
    b.send(Pdu::new(Bhs::ScsiCommand(tur))).await;
    let mut tur_answer = None;
    while let Some(pdu) = b.recv_within(Duration::from_secs(2)).await {
        match pdu.bhs {
            Bhs::DataIn(d) if d.itt == read.itt => panic!("the cleared READ sent data"),
            Bhs::ScsiResponse(r) if r.itt == read.itt => panic!("the cleared READ was answered"),
            Bhs::ScsiResponse(r) if r.itt == tur.itt => {
                tur_answer = Some((r.status, pdu.data.clone()));
                break;
            }
            _ => {}
        }
    }
    let (status, sense) = tur_answer.expect("B's TEST UNIT READY is answered");
    assert_eq!(status, 2, "CHECK CONDITION with the unit attention");
    // Sense data after its 2-byte length, fixed format: the sense key in
    // byte 2, ASC and ASCQ in bytes 12 and 13.
    assert_eq!(
        (sense[2 + 2] & 0x0f, sense[2 + 12], sense[2 + 13]),
        (0x06, 0x2f, 0x00),
        "UNIT ATTENTION, COMMANDS CLEARED BY ANOTHER INITIATOR"
    );
    // A, which asked, hears nothing of it.
    assert_eq!(a.test_unit_ready().await, Some(0));
}

/// An ABORT TASK of a WRITE the backstore is already writing is answered
/// only once that write has returned (SAM-5: an aborted command changes
/// nothing after the task management function completes). It was answered
/// at once, so a WRITE of the same blocks sent after "Function complete"
/// could be overtaken by the aborted one, whose data then stayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_task_of_a_write_being_written_is_answered_after_it() {
    let store = HeldStore::new(Held::Writes);
    let t = start_with(FabricSettings::default(), store.clone()).await;
    let mut c = Client::login(t.addr, [0x80, 0, 0, 0, 0, 9], Digests::NONE).await;
    // Dropped first, also when an assertion fails.
    let _release = ReleaseOnDrop(store.clone());
    let _ = c.test_unit_ready().await;
    assert!(
        c.params.immediate_data,
        "the WRITE goes whole with its command"
    );
    let write = c.command(&rw10(0x2a, 0, 8), false, true, 4096, true);
    c.send(Pdu::with_data(Bhs::ScsiCommand(write), vec![0xabu8; 4096]))
        .await;
    store.wait_entered().await;
    let abort = c.tmf(TmfFunction::AbortTask, (write.itt, write.cmd_sn));
    c.send(Pdu::new(Bhs::TaskMgmtRequest(abort))).await;
    if let Some(pdu) = c.recv_within(Duration::from_millis(500)).await {
        panic!("answered while the aborted WRITE was still being written: {pdu:?}");
    }
    store.release();
    let pdu = c
        .recv_within(Duration::from_secs(5))
        .await
        .expect("the abort is answered once the write returned");
    let Bhs::TaskMgmtResponse(r) = pdu.bhs else {
        panic!("expected the TMF response, got {pdu:?}")
    };
    assert_eq!(r.response, TmfResponse::FunctionComplete);
    // Nothing of the aborted WRITE follows; the session goes on.
    assert_eq!(c.test_unit_ready().await, Some(0));
}

/// A Logout closing the session is answered only once a WRITE the
/// backstore is writing has returned: the response tells the initiator the
/// session's commands are terminated (RFC 7143 §11.14, §11.15), so nothing
/// of them may land after it, over what the initiator writes next through
/// another session. It was answered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logout_is_answered_after_a_write_being_written() {
    let store = HeldStore::new(Held::Writes);
    let t = start_with(FabricSettings::default(), store.clone()).await;
    let mut c = Client::login(t.addr, [0x80, 0, 0, 0, 0, 0x0b], Digests::NONE).await;
    // Dropped first, also when an assertion fails.
    let _release = ReleaseOnDrop(store.clone());
    let _ = c.test_unit_ready().await;
    let write = c.command(&rw10(0x2a, 0, 8), false, true, 4096, true);
    c.send(Pdu::with_data(Bhs::ScsiCommand(write), vec![0xabu8; 4096]))
        .await;
    store.wait_entered().await;
    c.itt += 1;
    let logout = LogoutRequest {
        immediate: true,
        reason: blockwire_pdu::pdu::codes::LogoutReason::CloseSession,
        itt: c.itt,
        cid: 0,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: 0,
    };
    c.send(Pdu::new(Bhs::LogoutRequest(logout))).await;
    if let Some(pdu) = c.recv_within(Duration::from_millis(500)).await {
        panic!("answered while the session's WRITE was still being written: {pdu:?}");
    }
    store.release();
    let pdu = c
        .recv_within(Duration::from_secs(5))
        .await
        .expect("the logout is answered once the write returned");
    assert!(
        matches!(pdu.bhs, Bhs::LogoutResponse(_)),
        "expected the Logout Response, got {pdu:?}"
    );
}

/// A login that reinstates a session (the same initiator and ISID) is
/// answered only once the old session's WRITE that the backstore is writing
/// has returned: the old session's tasks end before the new one serves
/// (RFC 7143 §6.3.5), so none of them may land over what the initiator
/// writes on the new session, as after an abort or a logout. It was
/// answered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reinstating_login_is_answered_after_the_old_sessions_write_being_written() {
    let store = HeldStore::new(Held::Writes);
    let t = start_with(FabricSettings::default(), store.clone()).await;
    let isid = [0x80, 0, 0, 0, 0, 0x0c];
    let mut c = Client::login(t.addr, isid, Digests::NONE).await;
    // Dropped first, also when an assertion fails.
    let _release = ReleaseOnDrop(store.clone());
    let _ = c.test_unit_ready().await;
    let write = c.command(&rw10(0x2a, 0, 8), false, true, 4096, true);
    c.send(Pdu::with_data(Bhs::ScsiCommand(write), vec![0xabu8; 4096]))
        .await;
    store.wait_entered().await;
    let addr = t.addr;
    let mut again = tokio::spawn(async move { Client::login(addr, isid, Digests::NONE).await });
    if tokio::time::timeout(Duration::from_millis(500), &mut again)
        .await
        .is_ok()
    {
        panic!(
            "the reinstating login was answered while the old session's WRITE was being written"
        );
    }
    store.release();
    let mut fresh = tokio::time::timeout(Duration::from_secs(5), again)
        .await
        .expect("the login is answered once the write returned")
        .unwrap();
    assert!(fresh.test_unit_ready().await.is_some());
    drop(c);
}

/// The data-integrity check with both digests on (libiscsi never offers
/// DataDigest, so this client does it): 256 MiB of a pseudo-random pattern
/// written in 1 MiB commands and read back, checksums compared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integrity_256_mib_with_header_and_data_digests() {
    // No keepalive: on a loaded machine the run can outlast the 15 s NOP-In
    // interval, and this raw client does not answer pings (keepalive has
    // its own test).
    let t = start_with(
        FabricSettings {
            nop_interval: None,
            ..FabricSettings::default()
        },
        Arc::new(RamBackstore::new(256 << 20)),
    )
    .await;
    let mut c = Client::login(t.addr, [0x80, 0, 0, 0, 1, 0], Digests::BOTH).await;
    let _ = c.test_unit_ready().await;
    const CHUNK: usize = 1 << 20;
    let pattern = |i: usize| -> Vec<u8> {
        let mut x = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (0..CHUNK)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    };
    let (mut written, mut read) = (0u32, 0u32);
    for i in 0..256 {
        let data = pattern(i);
        written = crc32c::crc32c_append(written, &data);
        assert_eq!(
            write(&mut c, (i * CHUNK / 512) as u32, &data).await,
            0,
            "write {i}"
        );
    }
    for i in 0..256 {
        let cmd = c.command(
            &rw10(0x28, (i * CHUNK / 512) as u32, (CHUNK / 512) as u16),
            true,
            false,
            CHUNK as u32,
            true,
        );
        c.send(Pdu::new(Bhs::ScsiCommand(cmd))).await;
        let (status, back) = c.read_response(cmd.itt, CHUNK).await;
        assert_eq!(status, 0, "read {i}");
        read = crc32c::crc32c_append(read, &back);
    }
    println!("256 MiB with HeaderDigest=DataDigest=CRC32C: written crc32c {written:#010x}, read back {read:#010x}");
    assert_eq!(written, read);
}

#[tokio::test]
async fn write_data_beyond_the_connection_budget_gets_task_set_full() {
    let settings = FabricSettings {
        write_budget_bytes: 64 << 10,
        ..FabricSettings::default()
    };
    let t = start(settings).await;
    let mut c = Client::login(t.addr, [0x80, 0, 0, 0, 2, 0], Digests::NONE).await;
    let _ = c.test_unit_ready().await;
    // A 48 KiB write with no data yet: its buffer is reserved while it waits.
    let first = c.command(&rw10(0x2a, 0, 96), false, true, 48 << 10, true);
    c.send(Pdu::new(Bhs::ScsiCommand(first))).await;
    let r2t = c.recv().await.expect("an R2T");
    let Bhs::R2t(r2t) = r2t.bhs else {
        panic!("expected R2T, got {r2t:?}")
    };
    // A second one does not fit: TASK SET FULL, and nothing is held for it.
    let second = c.command(&rw10(0x2a, 200, 96), false, true, 48 << 10, true);
    c.send(Pdu::new(Bhs::ScsiCommand(second))).await;
    let pdu = c.recv().await.expect("a response");
    let Bhs::ScsiResponse(r) = pdu.bhs else {
        panic!("expected a SCSI Response, got {pdu:?}")
    };
    assert_eq!((r.itt, r.status), (second.itt, 0x28));
    // Finishing the first returns its share: the next write fits again.
    let data = vec![0x5au8; 48 << 10];
    answer_r2t(&mut c, &r2t, &data).await;
    let pdu = c.recv().await.expect("the first write's status");
    let Bhs::ScsiResponse(r) = pdu.bhs else {
        panic!("expected a SCSI Response, got {pdu:?}")
    };
    assert_eq!((r.itt, r.status), (first.itt, 0));
    // The budget is returned before the status is sent, so this fits.
    assert_eq!(write(&mut c, 400, &data).await, 0);
    // A WRITE larger than the whole budget runs once nothing else holds a
    // share, where it used to be answered TASK SET FULL every time.
    assert_eq!(write(&mut c, 600, &vec![0x33; 128 << 10]).await, 0);
}

/// The connections' WRITE budgets are drawn from the fabric's
/// (`write_budget_total_bytes`): with one connection holding all of it, a
/// WRITE on another connection, which holds none, is answered BUSY (not
/// TASK SET FULL: none of its own commands fill the task set), and a second
/// WRITE on the holding connection TASK SET FULL; once the first has its
/// data, both fit again.
#[tokio::test]
async fn write_data_beyond_the_fabrics_budget_gets_busy_on_a_connection_holding_none() {
    let settings = FabricSettings {
        write_budget_bytes: 64 << 10,
        write_budget_total_bytes: 64 << 10,
        ..FabricSettings::default()
    };
    let t = start(settings).await;
    let mut a = Client::login(t.addr, [0x80, 0, 0, 0, 3, 0], Digests::NONE).await;
    let mut b = Client::login(t.addr, [0x80, 0, 0, 0, 3, 1], Digests::NONE).await;
    let _ = a.test_unit_ready().await;
    let _ = b.test_unit_ready().await;
    // A 48 KiB write with no data yet holds its share of both budgets.
    let first = a.command(&rw10(0x2a, 0, 96), false, true, 48 << 10, true);
    a.send(Pdu::new(Bhs::ScsiCommand(first))).await;
    let r2t = a.recv().await.expect("an R2T");
    let Bhs::R2t(r2t) = r2t.bhs else {
        panic!("expected R2T, got {r2t:?}")
    };
    let status = |pdu: Option<Pdu>| {
        let pdu = pdu.expect("a response");
        let Bhs::ScsiResponse(r) = pdu.bhs else {
            panic!("expected a SCSI Response, got {pdu:?}")
        };
        (r.itt, r.status)
    };
    let other = b.command(&rw10(0x2a, 200, 64), false, true, 32 << 10, true);
    b.send(Pdu::new(Bhs::ScsiCommand(other))).await;
    assert_eq!(status(b.recv().await), (other.itt, 0x08), "BUSY");
    let second = a.command(&rw10(0x2a, 300, 64), false, true, 32 << 10, true);
    a.send(Pdu::new(Bhs::ScsiCommand(second))).await;
    assert_eq!(status(a.recv().await), (second.itt, 0x28), "TASK SET FULL");
    let data = vec![0x5au8; 48 << 10];
    answer_r2t(&mut a, &r2t, &data).await;
    assert_eq!(status(a.recv().await), (first.itt, 0));
    assert_eq!(write(&mut b, 400, &vec![0x11; 32 << 10]).await, 0);
    assert_eq!(write(&mut a, 500, &vec![0x22; 32 << 10]).await, 0);
}

/// The connections' READ budgets are taken within the fabric's
/// (`read_budget_total_bytes`): while one initiator leaves 64 MiB of READ
/// data unread, filling the fabric's 16 MiB, a READ on another connection
/// waits (where each connection could hold its own 256 MiB), and it is
/// answered once the first takes its data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_read_data_of_one_connection_holds_back_the_others_past_the_fabrics_budget() {
    const MIB: usize = 1 << 20;
    let settings = FabricSettings {
        read_budget_total_bytes: 16 << 20,
        read_budget_bytes: 16 << 20,
        ..FabricSettings::default()
    };
    let t = start(settings).await;
    let mut a = Client::login(t.addr, [0x80, 0, 0, 0, 9, 1], Digests::NONE).await;
    let mut b = Client::login(t.addr, [0x80, 0, 0, 0, 9, 2], Digests::NONE).await;
    let _ = a.test_unit_ready().await;
    let _ = b.test_unit_ready().await;
    let blocks = (4 * MIB / 512) as u16;
    let mut itts = Vec::new();
    for _ in 0..16 {
        let cmd = a.command(&rw10(0x28, 0, blocks), true, false, 4 * MIB as u32, true);
        itts.push(cmd.itt);
        a.send(Pdu::new(Bhs::ScsiCommand(cmd))).await;
    }
    // The first connection's READs fill the socket buffers, then the
    // fabric's budget.
    let began = std::time::Instant::now();
    while t.fabric.read_data_held() < 16 << 20 {
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "the unread READs hold {} bytes",
            t.fabric.read_data_held()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let small = b.command(&rw10(0x28, 0, 2048), true, false, 1 << 20, true);
    b.send(Pdu::new(Bhs::ScsiCommand(small))).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(500), b.recv())
            .await
            .is_err(),
        "a READ was answered while another connection's unread data filled the fabric's budget"
    );
    let mut ended = 0;
    while ended < itts.len() {
        let pdu = a.recv().await.expect("the READs' data and status");
        match pdu.bhs {
            Bhs::DataIn(d) => {
                if let Some(status) = d.status {
                    assert_eq!(status, 0, "READ {:#x}", d.itt);
                    ended += 1;
                }
            }
            Bhs::NopIn(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    loop {
        let pdu = b
            .recv_within(Duration::from_secs(10))
            .await
            .expect("the held READ is answered once the data were taken");
        let Bhs::DataIn(d) = pdu.bhs else {
            panic!("expected Data-In, got {:?}", pdu.bhs)
        };
        assert_eq!(d.itt, small.itt);
        if let Some(status) = d.status {
            assert_eq!(status, 0);
            break;
        }
    }
}

/// READs from an initiator that does not take its data: the core reads each
/// whole into memory before the writer sends it, so without a bound 120
/// READs of 4 MiB would hold 480 MiB for one connection (32 MiB READs, the
/// largest, 3.8 GiB: measured before the READ budget). With a 16 MiB budget
/// the target holds back the READs beyond it; once the initiator reads,
/// every READ arrives whole and GOOD.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_read_data_stays_within_the_read_budget() {
    const MIB: usize = 1 << 20;
    let settings = FabricSettings {
        read_budget_bytes: 16 << 20,
        ..FabricSettings::default()
    };
    let t = start(settings).await;
    let mut c = Client::login(t.addr, [0x80, 0, 0, 0, 9, 0], Digests::NONE).await;
    let _ = c.test_unit_ready().await;
    let data: Vec<u8> = (0..4 * MIB).map(|i| (i % 253) as u8).collect();
    assert_eq!(write(&mut c, 0, &data).await, 0);

    let base = support::resident_bytes();
    let blocks = (4 * MIB / 512) as u16;
    let mut itts = Vec::new();
    for _ in 0..120 {
        let cmd = c.command(&rw10(0x28, 0, blocks), true, false, 4 * MIB as u32, true);
        itts.push(cmd.itt);
        c.send(Pdu::new(Bhs::ScsiCommand(cmd))).await;
    }
    let growth = support::resident_growth_since(base).await;
    assert!(
        growth < 128 * MIB,
        "resident memory grew by {} MiB while the initiator left READ data unread",
        growth / MIB
    );
    // The READs' Data-In interleave: gather each by its task tag.
    let mut back: std::collections::HashMap<u32, Vec<u8>> =
        itts.iter().map(|&i| (i, vec![0u8; 4 * MIB])).collect();
    let mut ended = 0;
    while ended < itts.len() {
        let pdu = c.recv().await.expect("the READs' data and status");
        match pdu.bhs {
            Bhs::DataIn(d) => {
                let buf = back.get_mut(&d.itt).expect("a READ's task tag");
                let at = d.buffer_offset as usize;
                buf[at..at + pdu.data.len()].copy_from_slice(&pdu.data);
                if let Some(status) = d.status {
                    assert_eq!(status, 0, "READ {:#x}", d.itt);
                    ended += 1;
                }
            }
            Bhs::ScsiResponse(r) => panic!("READ {:#x} ended {:#x} without data", r.itt, r.status),
            Bhs::NopIn(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    for (itt, got) in back {
        assert!(got == data, "READ {itt:#x} returned other data");
    }
}

/// With NOP-In pings off, an initiator on TCP that sends READs and then
/// takes none of their data: once the socket is full, the writer's wait for
/// room in it runs out after the NOP timeout, the connection is cut, and
/// the READ data held for it are given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_initiator_on_tcp_that_stops_reading_is_cut_with_pings_off() {
    const MIB: usize = 1 << 20;
    let settings = FabricSettings {
        nop_interval: None,
        nop_timeout: Duration::from_secs(1),
        read_budget_bytes: 16 << 20,
        ..FabricSettings::default()
    };
    let t = start(settings).await;
    let mut c = Client::login(t.addr, [0x80, 0, 0, 0, 9, 3], Digests::NONE).await;
    let _ = c.test_unit_ready().await;
    // 64 MiB of READs: far more than the socket buffers and the budget.
    let blocks = (4 * MIB / 512) as u16;
    for _ in 0..16 {
        let cmd = c.command(&rw10(0x28, 0, blocks), true, false, 4 * MIB as u32, true);
        c.send(Pdu::new(Bhs::ScsiCommand(cmd))).await;
    }
    let began = std::time::Instant::now();
    while !t.fabric.sessions.all().is_empty() || t.fabric.read_data_held() != 0 {
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "an initiator taking nothing still has its session ({}) and {} bytes of READ data held",
            t.fabric.sessions.all().len(),
            t.fabric.read_data_held()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(c);
}
