//! The wait before logging in again after a lost connection. A new login
//! with the session's ISID ends the old session on the target (an implicit
//! logout), which RFC 7143 makes wait at least DefaultTime2Wait after the
//! connection ended (§13.15), or the Time2Wait of the Async Message that
//! ended it (§11.9.1, Parameter2), or the Time2Wait of a Logout Response
//! saying the cleanup failed (§11.15.4). The initiator logged in again after
//! 100 ms whatever the target had asked.
//!
//! Both tests also see a connection the target ends right after the login
//! recovered by the reader, where it was missed until a keepalive ping went
//! unanswered (never, with keepalives off): the reader could see the end
//! before the session counted the connection as up.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use blockwire_initiator::InitiatorConfig;
use blockwire_pdu::keys::{encode_text, parse_text};
use blockwire_pdu::pdu::codes::{AsyncEvent, LogoutResponseCode};
use blockwire_pdu::pdu::LogoutResponse;
use blockwire_pdu::{Bhs, Digests, Pdu, Stage};

mod scripted;
use scripted::read_pdu;

/// How the target ends the first connection.
#[derive(Clone, Copy)]
enum Ending {
    /// It negotiated DefaultTime2Wait=1 and drops the connection.
    DefaultTime2Wait,
    /// An Async Message, "connection dropped", Time2Wait 1 s.
    AsyncDrop,
    /// An Async Message asking for a logout, answered "cleanup failed"
    /// with Time2Wait 1 s (RFC 7143 §11.15.4).
    LogoutCleanupFailed,
}

/// Logs the initiator in as [`scripted::log_in`] does, answering
/// DefaultTime2Wait with `time2wait` when the initiator offers it;
/// returns StatSN and CmdSN as that does.
fn log_in_with_time2wait(s: &mut TcpStream, time2wait: u32) -> (u32, u32) {
    let mut stat_sn = 0u32;
    loop {
        let pdu = read_pdu(s).expect("a login request");
        let Bhs::LoginRequest(r) = pdu.bhs else {
            panic!("expected a login request, got {:?}", pdu.bhs)
        };
        let mut reply = scripted::agree_to_login(&r, &pdu.data, stat_sn);
        let answers: Vec<(String, String)> = parse_text(&reply.data)
            .unwrap()
            .into_iter()
            .map(|(k, v)| match k.as_str() {
                "DefaultTime2Wait" => (k, time2wait.to_string()),
                _ => (k, v),
            })
            .collect();
        reply.data = encode_text(&answers).unwrap().into();
        stat_sn += 1;
        s.write_all(&reply.encode(Digests::NONE)).unwrap();
        if r.transit && r.nsg == Stage::FullFeature {
            return (stat_sn, r.cmd_sn);
        }
    }
}

/// Ends the first connection as `ending` says, then takes the next login
/// and its logout. Returns how long after the end the next connection came.
fn ending_target(listener: TcpListener, ending: Ending) -> Duration {
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    match ending {
        Ending::DefaultTime2Wait => {
            log_in_with_time2wait(&mut s, 1);
        }
        Ending::AsyncDrop => {
            let (stat_sn, cmd_sn) = scripted::log_in(&mut s);
            let drop_it =
                scripted::async_message(AsyncEvent::ConnectionDrop, stat_sn, cmd_sn, 1, 0);
            s.write_all(&drop_it.encode(Digests::NONE)).unwrap();
        }
        Ending::LogoutCleanupFailed => {
            let (stat_sn, cmd_sn) = scripted::log_in(&mut s);
            let ask = scripted::async_message(AsyncEvent::LogoutRequest, stat_sn, cmd_sn, 0, 5);
            s.write_all(&ask.encode(Digests::NONE)).unwrap();
            let r = scripted::next_logout(&mut s);
            let failed = Pdu::new(Bhs::LogoutResponse(LogoutResponse {
                response: LogoutResponseCode::CleanupFailed,
                itt: r.itt,
                stat_sn: stat_sn + 1,
                exp_cmd_sn: r.cmd_sn,
                max_cmd_sn: r.cmd_sn.wrapping_add(8),
                time2wait: 1,
                time2retain: 0,
            }));
            s.write_all(&failed.encode(Digests::NONE)).unwrap();
        }
    }
    let ended = Instant::now();
    drop(s);
    let (mut s, _) = listener.accept().unwrap();
    let waited = ended.elapsed();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (stat_sn, _) = scripted::log_in(&mut s);
    scripted::agree_to_next_logout(&mut s, stat_sn);
    waited
}

async fn waited_before_the_next_login(ending: Ending) -> Duration {
    // No keepalive: the loss must be seen by the reader, also when it comes
    // right after the login (it was missed until a ping went unanswered).
    let mut config = InitiatorConfig::new("iqn.2026-12.io.blockwire:time2wait");
    config.nop_interval = None;
    let (session, target) =
        scripted::session_configured(config, move |l| ending_target(l, ending)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while session.recoveries() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the session never logged in again"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    session.logout().await.expect("logout");
    target.join().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_login_waits_the_negotiated_default_time2wait() {
    let waited = waited_before_the_next_login(Ending::DefaultTime2Wait).await;
    assert!(
        waited >= Duration::from_secs(1),
        "logged in again {waited:?} after the connection ended, within DefaultTime2Wait=1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_login_waits_the_time2wait_of_the_async_message() {
    let waited = waited_before_the_next_login(Ending::AsyncDrop).await;
    assert!(
        waited >= Duration::from_secs(1),
        "logged in again {waited:?} after the target dropped the connection asking for Time2Wait 1 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_login_waits_the_time2wait_of_a_failed_logout() {
    let waited = waited_before_the_next_login(Ending::LogoutCleanupFailed).await;
    assert!(
        waited >= Duration::from_secs(1),
        "logged in again {waited:?} after a logout answered \"cleanup failed\" with Time2Wait 1 s"
    );
}
