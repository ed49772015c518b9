//! A target that asks for a WRITE's data by R2T and then stops reading, in
//! the middle of a Data-Out PDU bigger than loopback's socket buffers.
//!
//! - The caller gives up on the WRITE (a timeout drops its future) while
//!   the Data-Out is half sent. Before, the writer lock was released with
//!   half a PDU on the stream, for the next PDU's bytes (a keepalive, another
//!   command) to complete: data made of another PDU's header and data, taken
//!   as the WRITE's. Now the connection ends: the target sees the stream end
//!   inside the PDU, never a PDU made of two.
//! - Nobody gives up: the target simply takes nothing more. Before, the send
//!   waited for good, holding the connection's writer (keepalives and every
//!   command waited behind it); now it is cut after the send timeout and the
//!   connection ends, for recovery to take over.
//! - A READ waits for the writer behind the stalled WRITE, and a LOGICAL UNIT
//!   RESET is asked for after it. The reset covers the commands numbered
//!   below its CmdSN (RFC 7143 §4.2.2.1, §11.5.1), so it must take its CmdSN
//!   once it has the writer, after the READ's. Before, it took it at once:
//!   the READ went out first under the same CmdSN, the target ended it with
//!   the reset, and the initiator, sparing it, waited for its answer.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use blockwire_initiator::InitiatorConfig;
use blockwire_pdu::keys::{encode_text, parse_text};
use blockwire_pdu::pdu::codes::TmfResponse;
use blockwire_pdu::pdu::R2t;
use blockwire_pdu::{Bhs, Digests, Pdu, Stage};

mod scripted;
use scripted::read_pdu;

/// The WRITE's immediate data (its FirstBurstLength, open-iscsi's 256 KiB).
const IMMEDIATE: usize = 256 << 10;
/// What the R2T asks for, in one Data-Out PDU: more than loopback's socket
/// buffers hold, so the initiator's send stops inside it.
const ASKED: usize = 12 << 20;
/// How long the target reads nothing after its R2T.
const DEAF_FOR: Duration = Duration::from_secs(4);

/// The login, agreeing to every step as `scripted::log_in` does, and
/// declaring a MaxRecvDataSegmentLength of 16 MiB - 1 with the operational
/// stage, so that the R2T's data comes in one Data-Out PDU.
fn log_in(s: &mut TcpStream) -> u32 {
    let mut stat_sn = 0u32;
    let mut declared = false;
    loop {
        let pdu = read_pdu(s).expect("a login request");
        let Bhs::LoginRequest(r) = pdu.bhs else {
            panic!("expected a login request, got {:?}", pdu.bhs)
        };
        let mut reply = scripted::agree_to_login(&r, &pdu.data, stat_sn);
        if r.csg == Stage::Operational && !declared {
            let mut keys = parse_text(&reply.data).unwrap();
            keys.push(("MaxRecvDataSegmentLength".into(), "16777215".into()));
            reply.data = encode_text(&keys).unwrap().into();
            declared = true;
        }
        stat_sn += 1;
        s.write_all(&reply.encode(Digests::NONE)).unwrap();
        if r.transit && r.nsg == Stage::FullFeature {
            return stat_sn;
        }
    }
}

/// Logs the initiator in, takes its WRITE with the immediate data, asks
/// for the rest by one R2T, and reads nothing for [`DEAF_FOR`]; then reads
/// the Data-Out that came. Returns the bytes of its data segment that came
/// and whether the stream ended before the segment did.
fn deaf_target(listener: TcpListener) -> (usize, bool) {
    let (mut s, _) = listener.accept().unwrap();
    let stat_sn = log_in(&mut s);
    let pdu = read_pdu(&mut s).expect("the WRITE");
    let Bhs::ScsiCommand(c) = pdu.bhs else {
        panic!("expected the WRITE, got {:?}", pdu.bhs)
    };
    assert_eq!(pdu.data.len(), IMMEDIATE, "its immediate data");
    let r2t = Pdu::new(Bhs::R2t(R2t {
        lun: c.lun,
        itt: c.itt,
        ttt: 0x10,
        stat_sn,
        exp_cmd_sn: c.cmd_sn.wrapping_add(1),
        max_cmd_sn: c.cmd_sn.wrapping_add(8),
        r2t_sn: 0,
        buffer_offset: IMMEDIATE as u32,
        desired_data_transfer_length: ASKED as u32,
    }));
    s.write_all(&r2t.encode(Digests::NONE)).unwrap();
    std::thread::sleep(DEAF_FOR);
    let mut head = [0u8; 48];
    s.read_exact(&mut head).expect("the Data-Out's header");
    assert_eq!(head[0] & 0x3f, 0x05, "a Data-Out");
    let len = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
    assert_eq!(len, ASKED, "the R2T's data in one PDU");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = 0;
    let mut buf = vec![0u8; 1 << 20];
    while got < len {
        let want = (len - got).min(buf.len());
        match s.read(&mut buf[..want]) {
            Ok(0) => return (got, true),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return (got, true),
            Err(_) => return (got, false),
        }
    }
    (got, false)
}

fn config(name: &str) -> InitiatorConfig {
    let mut config = InitiatorConfig::new(name);
    config.send_timeout = Duration::from_secs(2);
    // Recovery would log in again to a target that accepts one connection.
    config.recovery.max_attempts = 0;
    config
}

/// The WRITE: its immediate data and the R2T's, 512-byte blocks.
fn data() -> (Vec<u8>, u32) {
    let data = vec![0x5a; IMMEDIATE + ASKED];
    let blocks = (data.len() / 512) as u32;
    (data, blocks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_given_up_on_mid_pdu_ends_the_connection_not_the_pdu() {
    let mut config = config("iqn.2026-12.io.blockwire:gives-up");
    // Only the caller's timeout cuts the send here.
    config.send_timeout = Duration::from_secs(600);
    let (session, target) = scripted::session_configured(config, deaf_target).await;
    let (data, blocks) = data();
    let given_up =
        tokio::time::timeout(Duration::from_secs(2), session.write(0, 0, blocks, &data)).await;
    assert!(given_up.is_err(), "the WRITE ended: {given_up:?}");
    let (got, ended) = tokio::task::spawn_blocking(move || target.join().unwrap())
        .await
        .unwrap();
    assert!(
        ended && got < ASKED,
        "{got} of the Data-Out's {ASKED} bytes came, and the stream {}: a cut PDU must end the connection",
        if ended { "ended" } else { "went on" }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_stops_reading_has_its_connection_ended_after_the_send_timeout() {
    let (session, target) =
        scripted::session_configured(config("iqn.2026-12.io.blockwire:deaf"), deaf_target).await;
    let (data, blocks) = data();
    let write = tokio::spawn(async move { session.write(0, 0, blocks, &data).await.map(|_| ()) });
    let (got, ended) = tokio::task::spawn_blocking(move || target.join().unwrap())
        .await
        .unwrap();
    assert!(
        ended && got < ASKED,
        "{got} of the Data-Out's {ASKED} bytes came, and the stream {}: the send was not cut",
        if ended { "ended" } else { "went on" }
    );
    let done = tokio::time::timeout(Duration::from_secs(20), write)
        .await
        .expect("the WRITE ends once its connection is gone")
        .unwrap();
    assert!(done.is_err(), "no connection left to answer it: {done:?}");
}

/// Logs the initiator in, asks for its WRITE's data by one R2T (saying so on
/// `r2t_sent`) and reads nothing for [`DEAF_FOR`], then takes the data and
/// answers the WRITE. The first READ it meets it leaves unanswered, as the
/// LOGICAL UNIT RESET that follows it ends it; READs after the reset are
/// answered. Returns the CmdSNs of that first READ and of the reset.
fn resetting_target(listener: TcpListener, r2t_sent: std::sync::mpsc::Sender<()>) -> (u32, u32) {
    let (mut s, _) = listener.accept().unwrap();
    let mut stat_sn = log_in(&mut s);
    let pdu = read_pdu(&mut s).expect("the WRITE");
    let Bhs::ScsiCommand(write) = pdu.bhs else {
        panic!("expected the WRITE, got {:?}", pdu.bhs)
    };
    let mut cmd_sn = write.cmd_sn.wrapping_add(1);
    let r2t = Pdu::new(Bhs::R2t(R2t {
        lun: write.lun,
        itt: write.itt,
        ttt: 0x10,
        stat_sn,
        exp_cmd_sn: cmd_sn,
        max_cmd_sn: cmd_sn.wrapping_add(8),
        r2t_sn: 0,
        buffer_offset: IMMEDIATE as u32,
        desired_data_transfer_length: ASKED as u32,
    }));
    s.write_all(&r2t.encode(Digests::NONE)).unwrap();
    let _ = r2t_sent.send(());
    std::thread::sleep(DEAF_FOR);
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let (mut read_sn, mut reset_sn) = (None, None);
    while let Some(pdu) = read_pdu(&mut s) {
        match pdu.bhs {
            Bhs::DataOut(d) if d.itt == write.itt => {
                assert_eq!(pdu.data.len(), ASKED, "the R2T's data in one PDU");
                let done = scripted::response(&write, 0, None, 1, stat_sn, cmd_sn);
                s.write_all(&done.encode(Digests::NONE)).unwrap();
                stat_sn += 1;
            }
            Bhs::ScsiCommand(c) => {
                cmd_sn = c.cmd_sn.wrapping_add(1);
                if read_sn.is_none() {
                    read_sn = Some(c.cmd_sn);
                } else {
                    let data = vec![0x6b; c.expected_data_transfer_length as usize];
                    let answer = scripted::single_data_in(&c, Some(0), stat_sn, cmd_sn, data);
                    s.write_all(&answer.encode(Digests::NONE)).unwrap();
                    stat_sn += 1;
                }
            }
            Bhs::TaskMgmtRequest(r) => {
                reset_sn = Some(r.cmd_sn);
                let answer =
                    scripted::tmf_answer(&r, TmfResponse::FunctionComplete, stat_sn, cmd_sn);
                s.write_all(&answer.encode(Digests::NONE)).unwrap();
                stat_sn += 1;
            }
            Bhs::LogoutRequest(r) => {
                let reply = scripted::agree_to_logout(&r, stat_sn);
                s.write_all(&reply.encode(Digests::NONE)).unwrap();
                return (
                    read_sn.expect("a READ came"),
                    reset_sn.expect("the reset came"),
                );
            }
            Bhs::NopOut(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    panic!("the stream ended before the logout")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_asked_for_after_a_waiting_read_is_numbered_after_it() {
    let mut config = config("iqn.2026-12.io.blockwire:reset-order");
    config.send_timeout = Duration::from_secs(60);
    let (r2t_sent, r2t_seen) = std::sync::mpsc::channel();
    let (session, target) =
        scripted::session_configured(config, move |l| resetting_target(l, r2t_sent)).await;
    let session = std::sync::Arc::new(session);
    let (data, blocks) = data();
    let writer = session.clone();
    let write = tokio::spawn(async move { writer.write(0, 0, blocks, &data).await.map(|_| ()) });
    tokio::task::spawn_blocking(move || r2t_seen.recv())
        .await
        .unwrap()
        .expect("the target sent its R2T");
    // The WRITE's R2T data soon hold the writer; the READ waits behind them,
    // and the reset behind the READ (the target reads nothing for DEAF_FOR).
    tokio::time::sleep(Duration::from_millis(800)).await;
    let reader = session.clone();
    let read = tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        reader.read(0, 0, 8, &mut buf).await.map(|_| ())
    });
    tokio::time::sleep(Duration::from_millis(1200)).await;
    tokio::time::timeout(Duration::from_secs(30), session.lun_reset(0))
        .await
        .expect("the reset is answered")
        .expect("the reset is done");
    let read = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the READ the reset ended does not wait for an answer that never comes")
        .unwrap();
    eprintln!("the READ: {read:?}");
    write.await.unwrap().expect("the WRITE");
    std::sync::Arc::into_inner(session)
        .expect("the only handle left")
        .logout()
        .await
        .expect("logout");
    let (read_sn, reset_sn) = tokio::task::spawn_blocking(move || target.join().unwrap())
        .await
        .unwrap();
    assert!(
        reset_sn > read_sn,
        "the reset went out with CmdSN {reset_sn}, the READ before it with {read_sn}"
    );
}
