//! A READ whose connection is lost before its answer is sent again on the
//! next connection under a new Initiator Task Tag, one the first connection
//! never used. Before, each connection's tags started again at the same
//! value, so a tag another stack had taken from the first connection (the
//! kernel host driver's ABORT TASK) named another command on the second.

use std::io::Write;
use std::net::TcpListener;
use std::time::Duration;

use blockwire_pdu::{Bhs, Digests};

mod scripted;
use scripted::read_pdu;

/// The next SCSI command on `s` (NOP-Outs passed over).
fn next_command(s: &mut std::net::TcpStream) -> blockwire_pdu::pdu::ScsiCommand {
    loop {
        match read_pdu(s).expect("a PDU").bhs {
            Bhs::ScsiCommand(c) => return c,
            Bhs::NopOut(_) => {}
            other => panic!("expected a SCSI command, got {other:?}"),
        }
    }
}

/// First connection: takes the READ and drops the connection unanswered.
/// Second: answers the READ sent again, then the logout. Returns the two
/// tags the READ came under.
fn dropping_target(listener: TcpListener) -> (u32, u32) {
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    scripted::log_in(&mut s);
    let first = next_command(&mut s).itt;
    drop(s);
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (stat_sn, cmd_sn) = scripted::log_in(&mut s);
    let c = next_command(&mut s);
    let data = vec![0xa5; c.expected_data_transfer_length as usize];
    let answer = scripted::single_data_in(&c, Some(0), stat_sn, cmd_sn.wrapping_add(1), data);
    s.write_all(&answer.encode(Digests::NONE)).unwrap();
    scripted::agree_to_next_logout(&mut s, stat_sn + 1);
    (first, c.itt)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_sent_again_on_a_new_connection_gets_a_tag_the_old_one_never_used() {
    let (session, target) =
        scripted::session_with("iqn.2026-12.io.blockwire:tags", dropping_target).await;
    let mut buf = vec![0u8; 8 * 512];
    tokio::time::timeout(Duration::from_secs(30), session.read(0, 0, 8, &mut buf))
        .await
        .expect("the READ ends")
        .expect("the READ sent again is answered");
    assert!(buf.iter().all(|&b| b == 0xa5));
    session.logout().await.expect("logout");
    let (first, again) = target.join().unwrap();
    assert_ne!(
        first, again,
        "the READ went out again under the tag {first:#x} it had on the lost connection"
    );
}
