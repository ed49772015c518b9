//! A scripted target that answers the first READ with UNIT ATTENTION,
//! CAPACITY DATA HAS CHANGED (SBC-4 4.6: another initiator, or its
//! administrator, resized the LUN). The session retries the READ past it,
//! as the SCSI midlayer does, and the caller gets its data; the session
//! counts the change, so that what sized itself by READ CAPACITY (`blockwire
//! mount`, `blockwire ublk`) can say its size is stale. Before, the change
//! was retried away without a trace.

use std::io::Write;
use std::net::TcpListener;
use std::time::Duration;

use blockwire_pdu::{Bhs, Digests};

mod scripted;
use scripted::read_pdu;

/// UNIT ATTENTION, CAPACITY DATA HAS CHANGED.
const CAPACITY_CHANGED: scripted::Sense = (0x06, 0x2a, 0x09);

/// Logs the initiator in, answers the first READ with [`CAPACITY_CHANGED`]
/// and the others with data; then answers the logout.
fn resized_target(listener: TcpListener) {
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (mut stat_sn, mut cmd_sn) = scripted::log_in(&mut s);
    let mut reads = 0;
    while let Some(pdu) = read_pdu(&mut s) {
        match pdu.bhs {
            Bhs::ScsiCommand(c) => {
                cmd_sn = cmd_sn.wrapping_add(1);
                let answer = if reads == 0 {
                    scripted::check_condition(&c, stat_sn, cmd_sn, CAPACITY_CHANGED)
                } else {
                    let data = vec![0x3c; c.expected_data_transfer_length as usize];
                    scripted::single_data_in(&c, Some(0), stat_sn, cmd_sn, data)
                };
                reads += 1;
                s.write_all(&answer.encode(Digests::NONE)).unwrap();
                stat_sn += 1;
            }
            Bhs::LogoutRequest(r) => {
                let reply = scripted::agree_to_logout(&r, stat_sn);
                s.write_all(&reply.encode(Digests::NONE)).unwrap();
                return;
            }
            Bhs::NopOut(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capacity_change_is_retried_past_and_counted() {
    let (session, target) =
        scripted::session_with("iqn.2026-12.io.blockwire:resized", resized_target).await;
    assert_eq!(session.capacity_changes(), 0);
    let mut buf = vec![0u8; 8 * 512];
    tokio::time::timeout(Duration::from_secs(20), session.read(0, 0, 8, &mut buf))
        .await
        .expect("the READ ends")
        .expect("the READ, retried past the unit attention");
    assert!(buf.iter().all(|&b| b == 0x3c));
    assert_eq!(
        session.capacity_changes(),
        1,
        "the target's CAPACITY DATA HAS CHANGED went uncounted"
    );
    // Read again: no new change.
    session.read(0, 0, 8, &mut buf).await.unwrap();
    assert_eq!(session.capacity_changes(), 1);
    session.logout().await.expect("logout");
    target.join().unwrap();
}
