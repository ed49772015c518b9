//! A scripted iSER target that answers a command with a PDU no target sends in
//! the full feature phase (a Login Response). The initiator gives the connection
//! up and fails its commands; it must also take the connection down, so that the
//! target can no longer RDMA Write into a failed READ's buffer, which the caller
//! has back and may be filling with other data (with the pre-registered arena
//! its STag stays valid). Before, the queue pair stayed connected until the
//! session was dropped. A command the target never answers gives the connection up
//! the same way at its deadline.

use std::net::SocketAddr;
use std::time::Duration;

use blockwire_initiator::iser::IserSession;
use blockwire_initiator::rdma::RdmaConfig;
use blockwire_initiator::InitiatorConfig;
use blockwire_pdu::Bhs;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

mod scripted;
use scripted::soft_rdma::{accept, frame, message, next_pdu, ACK, SEND};

const TARGET: &str = "iqn.2026-12.io.blockwire:scripted-iser-lost";

/// Agrees to the login, answers the first SCSI command with a second Login
/// Response, then waits for the initiator to close the connection. Returns
/// whether it did.
async fn misbehaving_target(listener: TcpListener) -> bool {
    let mut s = accept(&listener).await;
    let mut stat_sn = 0u32;
    let mut login = None;
    while let Some(pdu) = next_pdu(&mut s).await {
        let reply = match &pdu.bhs {
            Bhs::LoginRequest(r) => {
                let reply = scripted::agree_to_login(r, &pdu.data, stat_sn);
                login = Some(reply.clone());
                reply
            }
            Bhs::ScsiCommand(_) => login.clone().expect("logged in first"),
            other => panic!("scripted target got {other:?}"),
        };
        stat_sn += 1;
        s.write_all(&frame(ACK, &[])).await.unwrap();
        s.write_all(&frame(SEND, &message(&reply))).await.unwrap();
        if matches!(pdu.bhs, Bhs::ScsiCommand(_)) {
            break;
        }
    }
    // Whatever else comes, until the connection closes.
    tokio::time::timeout(Duration::from_secs(10), async {
        while next_pdu(&mut s).await.is_some() {}
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn a_connection_given_up_is_taken_down() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let portal: SocketAddr = listener.local_addr().unwrap();
    let target = tokio::spawn(misbehaving_target(listener));
    let config = InitiatorConfig::new("iqn.2026-12.io.blockwire:lost-iser");
    let session = IserSession::connect(config, RdmaConfig::default(), portal, TARGET)
        .await
        .expect("login to the scripted iSER target");
    let done = tokio::time::timeout(Duration::from_secs(20), session.command(0, &[0u8; 6]))
        .await
        .expect("the command ends");
    assert!(
        done.is_err(),
        "a command answered by a Login Response: {done:?}"
    );
    // The session is still held: only giving the connection up closes it.
    let closed = target.await.expect("the scripted target ran");
    assert!(
        closed,
        "the connection stayed up after the initiator gave it up"
    );
    drop(session);
}

/// Agrees to the login, takes the first SCSI command without a word, then
/// waits for the initiator to close the connection. Returns whether it did.
async fn silent_target(listener: TcpListener) -> bool {
    let mut s = accept(&listener).await;
    let mut stat_sn = 0u32;
    while let Some(pdu) = next_pdu(&mut s).await {
        s.write_all(&frame(ACK, &[])).await.unwrap();
        match &pdu.bhs {
            Bhs::LoginRequest(r) => {
                let reply = scripted::agree_to_login(r, &pdu.data, stat_sn);
                stat_sn += 1;
                s.write_all(&frame(SEND, &message(&reply))).await.unwrap();
            }
            Bhs::ScsiCommand(_) => break,
            other => panic!("scripted target got {other:?}"),
        }
    }
    tokio::time::timeout(Duration::from_secs(10), async {
        while next_pdu(&mut s).await.is_some() {}
    })
    .await
    .is_ok()
}

/// A command the target never answers ends at its deadline (twice the
/// command timeout for SYNCHRONIZE CACHE), where it used to wait forever:
/// the connection is given up, and taken down, since the command's buffers
/// are the target's until it ends and it cannot be aborted and sent again
/// as on TCP.
#[tokio::test]
async fn an_unanswered_command_gives_the_connection_up_at_its_deadline() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let portal: SocketAddr = listener.local_addr().unwrap();
    let target = tokio::spawn(silent_target(listener));
    let config = InitiatorConfig::new("iqn.2026-12.io.blockwire:silent-iser")
        .with_command_timeout(Some(Duration::from_secs(1)));
    let session = IserSession::connect(config, RdmaConfig::default(), portal, TARGET)
        .await
        .expect("login to the scripted iSER target");
    let synchronize_cache = [0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let started = std::time::Instant::now();
    let done = tokio::time::timeout(
        Duration::from_secs(15),
        session.command(0, &synchronize_cache),
    )
    .await
    .expect("a SYNCHRONIZE CACHE the target never answers still ends");
    let e = done.expect_err("an unanswered command succeeded");
    assert!(e.to_string().contains("within 2s"), "{e}");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "given up before its deadline: {:?}",
        started.elapsed()
    );
    let closed = target.await.expect("the scripted target ran");
    assert!(
        closed,
        "the connection stayed up after the command timed out"
    );
    drop(session);
}
