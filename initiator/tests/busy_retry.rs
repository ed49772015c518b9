//! A scripted target that answers a READ(16) TASK SET FULL twice and BUSY
//! once before it takes it. The target did nothing of those commands (SAM-5
//! 5.3): as the SCSI midlayer does, the initiator sends the command again
//! after a pause, and the caller gets the data. Before, the first TASK SET
//! FULL came back as an error (EIO under ublk or FUSE).

use std::io::Write;
use std::net::TcpListener;
use std::time::Duration;

use blockwire_pdu::{Bhs, Digests};

mod scripted;
use scripted::read_pdu;

/// The statuses the target answers the READs with before it takes one.
const REFUSALS: [u8; 3] = [0x28, 0x28, 0x08];

/// Logs the initiator in, answers the first READs with [`REFUSALS`] and
/// the next with its data; then answers the logout. Returns how many READs
/// came.
fn refusing_target(listener: TcpListener) -> usize {
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (mut stat_sn, mut cmd_sn) = scripted::log_in(&mut s);
    let mut reads = 0;
    while let Some(pdu) = read_pdu(&mut s) {
        match pdu.bhs {
            Bhs::ScsiCommand(c) => {
                cmd_sn = cmd_sn.wrapping_add(1);
                let answer = match REFUSALS.get(reads) {
                    Some(&status) => scripted::response(&c, status, None, 0, stat_sn, cmd_sn),
                    None => {
                        let data = vec![0x3c; c.expected_data_transfer_length as usize];
                        scripted::single_data_in(&c, Some(0), stat_sn, cmd_sn, data)
                    }
                };
                reads += 1;
                s.write_all(&answer.encode(Digests::NONE)).unwrap();
                stat_sn += 1;
            }
            Bhs::LogoutRequest(r) => {
                let reply = scripted::agree_to_logout(&r, stat_sn);
                s.write_all(&reply.encode(Digests::NONE)).unwrap();
                return reads;
            }
            Bhs::NopOut(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    reads
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_the_target_cannot_take_yet_is_sent_again() {
    let (session, target) =
        scripted::session_with("iqn.2026-12.io.blockwire:busy", refusing_target).await;
    let mut buf = vec![0u8; 8 * 512];
    tokio::time::timeout(Duration::from_secs(20), session.read(0, 0, 8, &mut buf))
        .await
        .expect("the READ ends")
        .expect("the READ succeeds once the target takes it");
    assert!(buf.iter().all(|&b| b == 0x3c), "the target's data");
    session.logout().await.expect("logout");
    assert_eq!(target.join().unwrap(), REFUSALS.len() + 1, "READs sent");
}
