//! A scripted target that asks the initiator to log out (Async Message,
//! AsyncEvent 1, RFC 7143 §11.9.1) while a READ is in flight, as a target
//! shutting down does. The initiator must let the READ finish, send a
//! Logout Request rather than drop the connection, and log in again for
//! the commands that follow. Before, it dropped the connection at once: the
//! target saw no logout, and the READ it was answering went out a second
//! time on the next connection.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use blockwire_pdu::pdu::codes::AsyncEvent;
use blockwire_pdu::pdu::{AsyncMessage, ScsiCommand};
use blockwire_pdu::{Bhs, Digests, Lun, Pdu};

mod scripted;
use scripted::read_pdu;

/// The seconds the target gives the initiator to log out.
const LOGOUT_WITHIN: u16 = 5;

/// What the target saw of the first connection.
#[derive(Debug, PartialEq, Eq)]
struct FirstConnection {
    /// The PDU the initiator sent after the READ was answered: "Logout"
    /// or what ended the connection instead.
    after_the_read: String,
}

/// The READ's data and status in one Data-In; writes to a connection the
/// initiator may have dropped are let fail.
fn answer_read(s: &mut TcpStream, c: &ScsiCommand, stat_sn: u32, cmd_sn: u32) {
    let data = vec![0xa5; c.expected_data_transfer_length as usize];
    let data_in = scripted::single_data_in(c, Some(0), stat_sn, cmd_sn, data);
    let _ = s.write_all(&data_in.encode(Digests::NONE));
}

fn next_command(s: &mut TcpStream) -> Option<ScsiCommand> {
    loop {
        match read_pdu(s)?.bhs {
            Bhs::ScsiCommand(c) => return Some(c),
            Bhs::NopOut(_) => {}
            other => panic!("expected a SCSI command, got {other:?}"),
        }
    }
}

/// First connection: asks for a logout as the READ arrives, answers the
/// READ after a moment, and notes what comes next. Second connection:
/// answers READs until the logout. Returns what it saw of the first
/// connection and how many READs the second one carried.
fn asking_target(listener: TcpListener) -> (FirstConnection, usize) {
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (mut stat_sn, mut cmd_sn) = scripted::log_in(&mut s);
    let read = next_command(&mut s).expect("the first READ");
    cmd_sn = cmd_sn.wrapping_add(1);
    let ask = Pdu::new(Bhs::AsyncMessage(AsyncMessage {
        lun: Lun::default(),
        stat_sn,
        exp_cmd_sn: cmd_sn,
        max_cmd_sn: cmd_sn.wrapping_add(8),
        event: AsyncEvent::LogoutRequest,
        vcode: 0,
        parameter1: 0,
        parameter2: 0,
        parameter3: LOGOUT_WITHIN,
    }));
    stat_sn += 1;
    s.write_all(&ask.encode(Digests::NONE)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    answer_read(&mut s, &read, stat_sn, cmd_sn);
    stat_sn += 1;
    let after_the_read = loop {
        match read_pdu(&mut s).map(|p| p.bhs) {
            Some(Bhs::NopOut(_)) => {}
            Some(Bhs::LogoutRequest(r)) => {
                let reply = scripted::agree_to_logout(&r, stat_sn);
                s.write_all(&reply.encode(Digests::NONE)).unwrap();
                break "Logout".to_string();
            }
            Some(other) => break format!("{:?}", other.opcode()),
            None => break "the connection ended".to_string(),
        }
    };
    drop(s);
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (mut stat_sn, mut cmd_sn) = scripted::log_in(&mut s);
    let mut reads = 0;
    loop {
        match read_pdu(&mut s).map(|p| p.bhs) {
            Some(Bhs::ScsiCommand(c)) => {
                cmd_sn = cmd_sn.wrapping_add(1);
                answer_read(&mut s, &c, stat_sn, cmd_sn);
                stat_sn += 1;
                reads += 1;
            }
            Some(Bhs::NopOut(_)) => {}
            Some(Bhs::LogoutRequest(r)) => {
                let reply = scripted::agree_to_logout(&r, stat_sn);
                s.write_all(&reply.encode(Digests::NONE)).unwrap();
                break;
            }
            other => panic!("unexpected {other:?} on the second connection"),
        }
    }
    (FirstConnection { after_the_read }, reads)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logout_the_target_asks_for_lets_the_read_in_flight_finish_then_logs_out() {
    let (session, target) =
        scripted::session_with("iqn.2026-12.io.blockwire:async-logout", asking_target).await;
    for which in ["in flight as the target asks", "after the new login"] {
        let mut buf = vec![0u8; 8 * 512];
        tokio::time::timeout(Duration::from_secs(30), session.read(0, 0, 8, &mut buf))
            .await
            .unwrap_or_else(|_| panic!("the READ {which} ends"))
            .unwrap_or_else(|e| panic!("the READ {which}: {e}"));
        assert!(
            buf.iter().all(|&b| b == 0xa5),
            "the READ {which} has its data"
        );
    }
    session.logout().await.expect("logout");
    let (first, reads_after) = target.join().unwrap();
    assert_eq!(
        first,
        FirstConnection {
            after_the_read: "Logout".into()
        },
        "the initiator logs out when the target asks, after the READ in flight finished"
    );
    assert_eq!(
        reads_after, 1,
        "only the READ sent after the new login goes to the second connection"
    );
}
