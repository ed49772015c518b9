//! Login answers a scripted target gives that the initiator must act on.
//!
//! - "Target moved" (status 0101h or 0102h) with a TargetAddress (RFC 7143
//!   §11.13.5), as a storage array's group portal sends initiators on to the
//!   member holding the volume: the session logs in where it was sent.
//!   Before, the redirection was a refused login, its TargetAddress unread,
//!   and recovery asked the same portal again.
//! - HeaderDigest=Reject to a login that offered CRC32C alone: the login
//!   fails, naming the key, where the session ran without digests.

use std::io::Write;
use std::net::TcpListener;
use std::time::Duration;

use blockwire_initiator::{InitiatorConfig, Session};
use blockwire_pdu::keys::{encode_text, parse_text};
use blockwire_pdu::pdu::LoginResponse;
use blockwire_pdu::{Bhs, Digests, LoginStatus, Pdu};

mod scripted;
use scripted::read_pdu;

const TARGET: &str = "iqn.2026-12.io.blockwire:scripted";

/// Answers each of `logins` connections' first Login Request with `status`
/// and `TargetAddress=to`; returns how many it answered.
fn redirector(listener: TcpListener, logins: usize, status: LoginStatus, to: String) -> usize {
    slow_redirector(listener, logins, status, to, Duration::ZERO)
}

/// [`redirector`], answering each login `delay` after its request came.
fn slow_redirector(
    listener: TcpListener,
    logins: usize,
    status: LoginStatus,
    to: String,
    delay: Duration,
) -> usize {
    let mut answered = 0;
    for _ in 0..logins {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let pdu = read_pdu(&mut s).expect("a login request");
        let Bhs::LoginRequest(r) = pdu.bhs else {
            panic!("expected a login request, got {:?}", pdu.bhs)
        };
        let reply = Pdu::with_data(
            Bhs::LoginResponse(LoginResponse {
                transit: false,
                continue_bit: false,
                csg: r.csg,
                nsg: r.csg,
                version_max: 0,
                version_active: 0,
                isid: r.isid,
                tsih: 0,
                itt: r.itt,
                stat_sn: 0,
                exp_cmd_sn: r.cmd_sn,
                max_cmd_sn: r.cmd_sn,
                status,
            }),
            encode_text(&[("TargetAddress".to_owned(), to.clone())]).unwrap(),
        );
        std::thread::sleep(delay);
        // The initiator may have given up meanwhile.
        let _ = s.write_all(&reply.encode(Digests::NONE));
        answered += 1;
    }
    answered
}

/// The target the redirection names: logs the initiator in and answers its
/// logout.
fn member(listener: TcpListener) {
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (stat_sn, _) = scripted::log_in(&mut s);
    while let Some(pdu) = read_pdu(&mut s) {
        if let Bhs::LogoutRequest(r) = pdu.bhs {
            let reply = scripted::agree_to_logout(&r, stat_sn);
            s.write_all(&reply.encode(Digests::NONE)).unwrap();
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_target_is_logged_in_to_where_it_moved() {
    for status in [
        LoginStatus::TARGET_MOVED_TEMPORARILY,
        LoginStatus::TARGET_MOVED_PERMANENTLY,
    ] {
        let member_listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let to = format!("{},1", member_listener.local_addr().unwrap());
        let group = TcpListener::bind("127.0.0.1:0").unwrap();
        let portal = group.local_addr().unwrap().to_string();
        let member = std::thread::spawn(move || member(member_listener));
        let redirector = std::thread::spawn(move || redirector(group, 1, status, to));
        let session = Session::connect(
            InitiatorConfig::new("iqn.2026-12.io.blockwire:redirected"),
            &portal,
            TARGET,
        )
        .await
        .unwrap_or_else(|e| panic!("{status:?}: {e}"));
        session.logout().await.expect("logout at the member");
        assert_eq!(redirector.join().unwrap(), 1);
        member.join().unwrap();
    }
}

/// Portals that send the login round in a circle: the login gives up after a
/// few hops, saying so, rather than going round for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirection_loop_ends_the_login() {
    let group = TcpListener::bind("127.0.0.1:0").unwrap();
    let portal = group.local_addr().unwrap().to_string();
    let to = format!("{portal},1");
    // The first login and four redirections, all to itself.
    let redirector =
        std::thread::spawn(move || redirector(group, 5, LoginStatus::TARGET_MOVED_TEMPORARILY, to));
    let e = Session::connect(
        InitiatorConfig::new("iqn.2026-12.io.blockwire:redirected"),
        &portal,
        TARGET,
    )
    .await
    .err()
    .expect("a redirection loop fails the login");
    assert!(
        e.to_string().contains("redirected more than 4 times"),
        "{e}"
    );
    assert_eq!(redirector.join().unwrap(), 5);
}

/// The login timeout bounds a login with its redirections, not each hop:
/// portals that each take most of it to redirect end the login when it
/// runs out, saying where it was sent. Each hop had the whole timeout, so
/// such a login could take five times as long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_login_timeout_bounds_all_the_redirections() {
    let group = TcpListener::bind("127.0.0.1:0").unwrap();
    let portal = group.local_addr().unwrap().to_string();
    let to = format!("{portal},1");
    // 0.4 s per hop against a 1 s timeout: the third answer comes too late.
    let redirector = std::thread::spawn(move || {
        slow_redirector(
            group,
            3,
            LoginStatus::TARGET_MOVED_TEMPORARILY,
            to,
            Duration::from_millis(400),
        )
    });
    let mut config = InitiatorConfig::new("iqn.2026-12.io.blockwire:redirected");
    config.login_timeout = Duration::from_secs(1);
    let e = Session::connect(config, &portal, TARGET)
        .await
        .err()
        .expect("the login runs out of time");
    let shown = e.to_string();
    assert!(
        shown.contains("took longer than 1s") && shown.contains("2 hop(s)"),
        "{shown}"
    );
    assert_eq!(redirector.join().unwrap(), 3);
}

/// Logs the initiator in as [`scripted::log_in`] does, but answers
/// HeaderDigest=Reject.
fn refuses_header_digests(listener: TcpListener) {
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut stat_sn = 0;
    while let Some(pdu) = read_pdu(&mut s) {
        let Bhs::LoginRequest(r) = pdu.bhs else {
            return;
        };
        let mut reply = scripted::agree_to_login(&r, &pdu.data, stat_sn);
        stat_sn += 1;
        let answers: Vec<(String, String)> = parse_text(&reply.data)
            .unwrap()
            .into_iter()
            .map(|(k, v)| {
                if k == "HeaderDigest" {
                    (k, "Reject".to_owned())
                } else {
                    (k, v)
                }
            })
            .collect();
        reply.data = encode_text(&answers).unwrap().into();
        if s.write_all(&reply.encode(Digests::NONE)).is_err() {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digests_insisted_on_and_refused_fail_the_login() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let portal = listener.local_addr().unwrap().to_string();
    let target = std::thread::spawn(move || refuses_header_digests(listener));
    let config = InitiatorConfig::new("iqn.2026-12.io.blockwire:digests").with_digests(true, false);
    let e = Session::connect(config, &portal, TARGET)
        .await
        .err()
        .expect("a login whose digests were refused fails");
    assert!(
        e.to_string().contains("did not take HeaderDigest=CRC32C"),
        "{e}"
    );
    target.join().unwrap();
}
