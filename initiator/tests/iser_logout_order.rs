//! blockwire's iSER initiator logs out cleanly when the target's Logout Response arrives
//! before the acknowledgement of the Logout Request's Send.
//!
//! On a reliable connection the target's adapter acknowledges a Send when it lands, but
//! the acknowledgement may be coalesced or delayed (InfiniBand allows a responder to
//! acknowledge several requests at once). A target that answers Logout and then closes
//! the connection at once (RFC 7143 §11.14: the connection ends after the response)
//! can therefore leave the initiator's Logout Request Send unacknowledged; the close
//! flushes it. The response says the target received the request, so the logout
//! succeeded whatever the Send's completion says.
//!
//! The target here is scripted on the soft RDMA provider's frame format
//! (`scripted::soft_rdma`), so that it can withhold that one
//! acknowledgement, which no real adapter lets software do on purpose.

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

const TARGET: &str = "iqn.2026-11.io.blockwire:scripted-iser";

/// Serves one iSER session: acknowledges each Send the initiator makes and answers it;
/// for the Logout Request, unless `ack_logout`, sends the response without the
/// acknowledgement and closes the connection at once.
async fn scripted_target(listener: TcpListener, ack_logout: bool) {
    let mut s = accept(&listener).await;
    let mut stat_sn = 0u32;
    while let Some(pdu) = next_pdu(&mut s).await {
        let reply = match &pdu.bhs {
            Bhs::LoginRequest(r) => scripted::agree_to_login(r, &pdu.data, stat_sn),
            Bhs::LogoutRequest(r) => scripted::agree_to_logout(r, stat_sn),
            other => panic!("scripted target got {other:?}"),
        };
        stat_sn += 1;
        let logout = matches!(pdu.bhs, Bhs::LogoutRequest(_));
        if ack_logout || !logout {
            s.write_all(&frame(ACK, &[])).await.unwrap();
        }
        s.write_all(&frame(SEND, &message(&reply))).await.unwrap();
        if logout {
            // The connection ends with the response (RFC 7143 §11.14): an orderly
            // close, then whatever the initiator still sends is read and dropped (a
            // close with unread bytes would reset the connection, and a reset may
            // discard the response before the initiator reads it).
            s.shutdown().await.unwrap();
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest).await;
            return;
        }
    }
    panic!("the initiator closed before logging out");
}

async fn log_in_and_out(ack_logout: bool) -> blockwire_initiator::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let portal: SocketAddr = listener.local_addr().unwrap();
    let target = tokio::spawn(scripted_target(listener, ack_logout));
    let config = InitiatorConfig::new("iqn.2026-11.io.blockwire:logout-order");
    let session = IserSession::connect(config, RdmaConfig::default(), portal, TARGET)
        .await
        .expect("login to the scripted iSER target");
    let out = tokio::time::timeout(Duration::from_secs(30), session.logout())
        .await
        .expect("logout ends");
    target.await.expect("the scripted target ran to the end");
    out
}

/// The control: the Logout Request's Send is acknowledged before the response.
#[tokio::test]
async fn logout_with_the_request_acknowledged() {
    log_in_and_out(true).await.expect("logout");
}

/// The response comes, then the close flushes the unacknowledged request Send.
#[tokio::test]
async fn logout_whose_request_send_is_flushed_after_the_response() {
    for round in 0..20 {
        if let Err(e) = log_in_and_out(false).await {
            panic!("round {round}: the target answered Logout, yet: {e}");
        }
    }
}
