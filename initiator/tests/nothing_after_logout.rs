//! Nothing follows a Logout Request on its connection (RFC 7143 §11.14):
//! a target slow to answer it got keepalive NOP-Out pings after it.

use std::io::Write;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use blockwire_initiator::InitiatorConfig;
use blockwire_pdu::Digests;

mod scripted;
use scripted::read_pdu;

/// Logs the initiator in, takes its Logout Request and answers it only
/// after `quiet`; returns the opcodes of what came in between.
fn slow_to_log_out(listener: TcpListener, quiet: Duration) -> Vec<String> {
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (stat_sn, _) = scripted::log_in(&mut s);
    let logout = scripted::next_logout(&mut s);
    let mut after = Vec::new();
    let until = Instant::now() + quiet;
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match read_pdu(&mut s) {
            Some(p) => after.push(format!("{:?}", p.bhs.opcode())),
            None => break,
        }
    }
    let reply = scripted::agree_to_logout(&logout, stat_sn);
    let _ = s.write_all(&reply.encode(Digests::NONE));
    after
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_keepalive_ping_follows_a_logout_request() {
    let mut config = InitiatorConfig::new("iqn.2026-12.io.blockwire:quiet-logout");
    config.nop_interval = Some(Duration::from_millis(100));
    let (session, target) =
        scripted::session_configured(config, |l| slow_to_log_out(l, Duration::from_millis(1500)))
            .await;
    session.logout().await.expect("logout");
    let after = target.join().unwrap();
    assert!(
        after.is_empty(),
        "sent after the Logout Request, on its connection: {after:?}"
    );
}
