//! A scripted iSER target that answers a TEST UNIT READY BUSY, then TASK SET FULL,
//! before it takes it. The target did nothing of those commands (SAM-5 5.3): the iSER
//! initiator sends the command again after a pause, as its TCP session does
//! (`busy_retry.rs`), and the caller gets GOOD. Before, iSER returned the first BUSY
//! as an error, which the ublk and FUSE front ends turn into EIO.

use std::net::SocketAddr;
use std::time::Duration;

use blockwire_initiator::iser::IserSession;
use blockwire_initiator::rdma::RdmaConfig;
use blockwire_initiator::InitiatorConfig;
use blockwire_pdu::Bhs;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

mod scripted;
use scripted::soft_rdma::{accept, frame, message, next_pdu, ACK, SEND};

const TARGET: &str = "iqn.2026-12.io.blockwire:scripted-iser-busy";

/// The statuses the target answers the command with before it takes it: BUSY, TASK
/// SET FULL.
const REFUSALS: [u8; 2] = [0x08, 0x28];

/// Serves one iSER session, acknowledging each Send: agrees to the login, answers
/// the SCSI commands with [`REFUSALS`] and then GOOD, and answers the logout.
/// Returns how many SCSI commands came.
async fn refusing_target(listener: TcpListener) -> usize {
    let mut s = accept(&listener).await;
    let mut stat_sn = 0u32;
    let mut commands = 0;
    while let Some(pdu) = next_pdu(&mut s).await {
        let reply = match &pdu.bhs {
            Bhs::LoginRequest(r) => scripted::agree_to_login(r, &pdu.data, stat_sn),
            Bhs::ScsiCommand(c) => {
                let status = REFUSALS.get(commands).copied().unwrap_or(0);
                commands += 1;
                scripted::response(c, status, None, 0, stat_sn, c.cmd_sn.wrapping_add(1))
            }
            Bhs::LogoutRequest(r) => scripted::agree_to_logout(r, stat_sn),
            other => panic!("scripted target got {other:?}"),
        };
        stat_sn += 1;
        s.write_all(&frame(ACK, &[])).await.unwrap();
        s.write_all(&frame(SEND, &message(&reply))).await.unwrap();
        if matches!(pdu.bhs, Bhs::LogoutRequest(_)) {
            // The connection ends with the response (RFC 7143 §11.14); what the
            // initiator still sends is read and dropped.
            s.shutdown().await.unwrap();
            let _ = s.read_to_end(&mut Vec::new()).await;
            return commands;
        }
    }
    panic!("the initiator closed before logging out");
}

#[tokio::test]
async fn an_iser_command_the_target_cannot_take_yet_is_sent_again() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let portal: SocketAddr = listener.local_addr().unwrap();
    let target = tokio::spawn(refusing_target(listener));
    let config = InitiatorConfig::new("iqn.2026-12.io.blockwire:busy-iser");
    let session = IserSession::connect(config, RdmaConfig::default(), portal, TARGET)
        .await
        .expect("login to the scripted iSER target");
    let done = tokio::time::timeout(Duration::from_secs(20), session.command(0, &[0u8; 6]))
        .await
        .expect("the TEST UNIT READY ends");
    done.expect("GOOD once the target takes the command");
    tokio::time::timeout(Duration::from_secs(20), session.logout())
        .await
        .expect("logout ends")
        .expect("logout");
    let commands = target.await.expect("the scripted target ran to the end");
    assert_eq!(commands, REFUSALS.len() + 1, "TEST UNIT READYs sent");
}
