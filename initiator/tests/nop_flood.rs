//! A scripted target that, once logged in, sends NOP-In pings that each want
//! an answer and never reads a byte. The initiator answers each ping from a
//! task of its own (its reader never waits for its writer); once the socket
//! stops taking the answers they used to pile up, a task and a PDU each,
//! for as long as the target kept sending. The session must drop such a
//! connection instead.

use std::io::Write;
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::Duration;

use blockwire_initiator::{InitiatorConfig, Session};
use blockwire_pdu::pdu::{NopIn, RESERVED_TAG};
use blockwire_pdu::{Bhs, Digests, Lun, Pdu};

mod scripted;

/// Pings the target sends at most: far more answers than the loopback
/// socket buffers of the initiator hold (48 bytes each).
const PINGS: u32 = 400_000;

/// Logs the initiator in, then pings it without reading; says how many
/// pings left before the initiator closed the connection (PINGS: it never
/// did).
fn flooding_target(listener: TcpListener, done: mpsc::Sender<u32>) {
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (stat_sn, cmd_sn) = scripted::log_in(&mut s);
    s.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut sent = 0;
    while sent < PINGS {
        let ping = Pdu::new(Bhs::NopIn(NopIn {
            lun: Lun::default(),
            itt: RESERVED_TAG,
            ttt: sent,
            stat_sn,
            exp_cmd_sn: cmd_sn,
            max_cmd_sn: cmd_sn.wrapping_add(8),
        }));
        if s.write_all(&ping.encode(Digests::NONE)).is_err() {
            break;
        }
        sent += 1;
    }
    let _ = done.send(sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_pings_and_never_reads_loses_the_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let portal = listener.local_addr().unwrap().to_string();
    let (done, sent) = mpsc::channel();
    let target = std::thread::spawn(move || flooding_target(listener, done));
    let config = InitiatorConfig::new("iqn.2026-12.io.blockwire:nop-flood");
    let session = Session::connect(config, &portal, "iqn.2026-12.io.blockwire:flooding")
        .await
        .expect("the scripted target logs the initiator in");
    let sent = tokio::task::spawn_blocking(move || sent.recv_timeout(Duration::from_secs(120)))
        .await
        .unwrap()
        .expect("the flood ends within 120 s");
    eprintln!("pings sent before the initiator closed: {sent}");
    assert!(
        sent < PINGS,
        "the initiator took all {PINGS} pings, its answers waiting without bound"
    );
    drop(session);
    target.join().unwrap();
}
