//! A command whose every connection the target drops as it arrives (a CDB
//! its parser cannot take, say) fails after a few connections, saying so.
//! It was sent again on each new connection for good, and its caller never
//! answered. So does one whose answer, a final Data-In with its status,
//! never arrives whole: that loss went uncounted, the command being sent
//! again for good.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use blockwire_initiator::COMMAND_LOSSES;
use blockwire_pdu::pdu::ScsiCommand;
use blockwire_pdu::{Bhs, Digests};

mod scripted;
use scripted::read_pdu;

/// On each of `drops` connections: logs the initiator in, hands the first
/// SCSI command to `last_words` (the stream, the command, the StatSN and
/// CmdSN to go on with) and drops the connection. Then takes one more login
/// and its logout: a command sent again after it failed would come there
/// instead. Returns the commands seen.
fn dropping_connections(
    listener: TcpListener,
    drops: u32,
    mut last_words: impl FnMut(&mut TcpStream, &ScsiCommand, u32, u32),
) -> u32 {
    let mut seen = 0;
    for _ in 0..drops {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let (stat_sn, cmd_sn) = scripted::log_in(&mut s);
        loop {
            match read_pdu(&mut s).map(|p| p.bhs) {
                Some(Bhs::ScsiCommand(c)) => {
                    seen += 1;
                    last_words(&mut s, &c, stat_sn, cmd_sn);
                    break;
                }
                Some(Bhs::NopOut(_)) => {}
                other => panic!("expected a SCSI command, got {other:?}"),
            }
        }
    }
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (stat_sn, _) = scripted::log_in(&mut s);
    scripted::agree_to_next_logout(&mut s, stat_sn);
    seen
}

/// Drops each connection as a SCSI command arrives on it, `drops` times;
/// then takes one more login and its logout. Returns the commands seen.
fn dropping_target(listener: TcpListener, drops: u32) -> u32 {
    dropping_connections(listener, drops, |_, _, _, _| {})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_the_target_drops_the_connection_on_fails_after_a_few_connections() {
    let (session, target) = scripted::session_with("iqn.2026-12.io.blockwire:dropped", |l| {
        dropping_target(l, COMMAND_LOSSES)
    })
    .await;
    let mut buf = vec![0u8; 8 * 512];
    let e = tokio::time::timeout(Duration::from_secs(60), session.read(0, 0, 8, &mut buf))
        .await
        .expect("the READ ends")
        .expect_err("a READ never answered fails");
    assert!(
        e.to_string().contains("lost 5 times with it in flight"),
        "{e}"
    );
    session.logout().await.expect("logout");
    assert_eq!(target.join().unwrap(), COMMAND_LOSSES);
}

/// Answers each connection's first SCSI command with the header of a final
/// Data-In (status GOOD) and part of its payload, then drops the
/// connection, `drops` times; then takes one more login and its logout.
/// Returns the commands seen.
fn cut_answer_target(listener: TcpListener, drops: u32) -> u32 {
    dropping_connections(listener, drops, |s, c, stat_sn, cmd_sn| {
        let data = vec![0x77; c.expected_data_transfer_length as usize];
        let pdu = scripted::single_data_in(c, Some(0), stat_sn, cmd_sn + 1, data);
        let bytes = pdu.encode(Digests::NONE);
        s.write_all(&bytes[..48 + 100]).unwrap();
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_whose_final_data_in_never_arrives_whole_fails_after_a_few_connections() {
    let (session, target) = scripted::session_with("iqn.2026-12.io.blockwire:cut", |l| {
        cut_answer_target(l, COMMAND_LOSSES)
    })
    .await;
    let mut buf = vec![0u8; 8 * 512];
    let e = tokio::time::timeout(Duration::from_secs(60), session.read(0, 0, 8, &mut buf))
        .await
        .expect("the READ ends")
        .expect_err("a READ never answered whole fails");
    assert!(
        e.to_string().contains("lost 5 times with it in flight"),
        "{e}"
    );
    session.logout().await.expect("logout");
    assert_eq!(target.join().unwrap(), COMMAND_LOSSES);
}
