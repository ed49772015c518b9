//! A scripted target that answers a READ(16) TASK SET FULL twice and BUSY
//! once before it takes it. The target did nothing of those commands (SAM-5
//! 5.3): as the SCSI midlayer does, the initiator sends the command again
//! after a pause, and the caller gets the data. Before, the first TASK SET
//! FULL came back as an error (EIO under ublk or FUSE).

use std::net::TcpListener;
use std::time::Duration;

mod scripted;

/// The statuses the target answers the READs with before it takes one.
const REFUSALS: [u8; 3] = [0x28, 0x28, 0x08];

/// Logs the initiator in, answers the first READs with [`REFUSALS`] and
/// the next with its data; then answers the logout. Returns how many READs
/// came.
fn refusing_target(listener: TcpListener) -> usize {
    scripted::serve_commands(listener, |c, stat_sn, cmd_sn, before| {
        vec![match REFUSALS.get(before) {
            Some(&status) => scripted::response(c, status, None, 0, stat_sn, cmd_sn),
            None => {
                let data = vec![0x3c; c.expected_data_transfer_length as usize];
                scripted::single_data_in(c, Some(0), stat_sn, cmd_sn, data)
            }
        }]
    })
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
