//! A scripted target that drops READ(16)s without a word, as a LOGICAL UNIT
//! RESET from another initiator does (SAM-5 5.6, TAS=0). Past the command
//! timeout the initiator aborts the command (ABORT TASK) and sends it again:
//! here the first ABORT TASK finds no such task, the second ends one, and
//! the third READ is answered. Before, the READ waited forever.

use std::io::Write;
use std::net::TcpListener;
use std::time::Duration;

use blockwire_initiator::InitiatorConfig;
use blockwire_pdu::pdu::codes::TmfResponse;
use blockwire_pdu::{Bhs, Digests};

mod scripted;
use scripted::read_pdu;

/// What the target saw, in order.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Read(u32),
    AbortTask(u32),
}

/// Logs the initiator in, drops the first `drops` READs, answers the first
/// ABORT TASK "task does not exist" and the others "function complete",
/// the READs after with their data (after `late`); then answers the
/// logout.
fn silent_target(listener: TcpListener, drops: usize) -> Vec<Seen> {
    late_target(listener, drops, Duration::ZERO)
}

fn late_target(listener: TcpListener, drops: usize, late: Duration) -> Vec<Seen> {
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (mut stat_sn, mut cmd_sn) = scripted::log_in(&mut s);
    let mut seen = Vec::new();
    while let Some(pdu) = read_pdu(&mut s) {
        match pdu.bhs {
            Bhs::ScsiCommand(c) => {
                cmd_sn = cmd_sn.wrapping_add(1);
                seen.push(Seen::Read(c.itt));
                if seen.iter().filter(|s| matches!(s, Seen::Read(_))).count() > drops {
                    std::thread::sleep(late);
                    let answer = if c.read {
                        let data = vec![0x6b; c.expected_data_transfer_length as usize];
                        scripted::single_data_in(&c, Some(0), stat_sn, cmd_sn, data)
                    } else {
                        scripted::response(&c, 0, None, 0, stat_sn, cmd_sn)
                    };
                    s.write_all(&answer.encode(Digests::NONE)).unwrap();
                    stat_sn += 1;
                }
            }
            Bhs::TaskMgmtRequest(r) => {
                seen.push(Seen::AbortTask(r.referenced_task_tag));
                let first = seen
                    .iter()
                    .filter(|s| matches!(s, Seen::AbortTask(_)))
                    .count()
                    == 1;
                let response = if first {
                    TmfResponse::TaskDoesNotExist
                } else {
                    TmfResponse::FunctionComplete
                };
                let answer = scripted::tmf_answer(&r, response, stat_sn, cmd_sn);
                s.write_all(&answer.encode(Digests::NONE)).unwrap();
                stat_sn += 1;
            }
            Bhs::LogoutRequest(r) => {
                let reply = scripted::agree_to_logout(&r, stat_sn);
                s.write_all(&reply.encode(Digests::NONE)).unwrap();
                return seen;
            }
            Bhs::NopOut(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_the_target_drops_is_aborted_and_sent_again() {
    let config = InitiatorConfig::new("iqn.2026-12.io.blockwire:silent")
        .with_command_timeout(Some(Duration::from_millis(300)));
    let (session, target) = scripted::session_configured(config, |l| silent_target(l, 2)).await;
    let mut buf = vec![0u8; 8 * 512];
    tokio::time::timeout(Duration::from_secs(20), session.read(0, 0, 8, &mut buf))
        .await
        .expect("the READ ends")
        .expect("the third READ is answered");
    assert!(buf.iter().all(|&b| b == 0x6b), "the target's data");
    session.logout().await.expect("logout");
    let seen = target.join().unwrap();
    let [Seen::Read(a), Seen::AbortTask(x), Seen::Read(b), Seen::AbortTask(y), Seen::Read(_)] =
        seen[..]
    else {
        panic!("the target saw {seen:?}")
    };
    assert_eq!((x, y), (a, b), "each ABORT TASK names the READ it ends");
}

/// A SYNCHRONIZE CACHE the target drops is aborted and sent again too,
/// after twice the command timeout (the Linux disk's flush timeout is twice
/// its command timeout): before, an fsync through `blockwire mount` or a
/// ublk flush waited for it forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_the_target_drops_is_aborted_and_sent_again() {
    let config = InitiatorConfig::new("iqn.2026-12.io.blockwire:silent-flush")
        .with_command_timeout(Some(Duration::from_millis(300)));
    let (session, target) = scripted::session_configured(config, |l| silent_target(l, 1)).await;
    let started = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(20), session.synchronize_cache(0))
        .await
        .expect("the SYNCHRONIZE CACHE ends")
        .expect("the second one is answered");
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "aborted before twice the command timeout"
    );
    session.logout().await.expect("logout");
    let seen = target.join().unwrap();
    let [Seen::Read(a), Seen::AbortTask(x), Seen::Read(_)] = seen[..] else {
        panic!("the target saw {seen:?}")
    };
    assert_eq!(x, a, "the ABORT TASK names the flush");
}

/// A READ the target drops every time fails after its third try, naming
/// the timeout, rather than waiting forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_the_target_always_drops_fails_after_three_tries() {
    let config = InitiatorConfig::new("iqn.2026-12.io.blockwire:silent-always")
        .with_command_timeout(Some(Duration::from_millis(200)));
    let (session, target) =
        scripted::session_configured(config, |l| silent_target(l, usize::MAX)).await;
    let mut buf = vec![0u8; 8 * 512];
    let e = tokio::time::timeout(Duration::from_secs(20), session.read(0, 0, 8, &mut buf))
        .await
        .expect("the READ ends")
        .expect_err("no READ is ever answered");
    assert!(e.to_string().contains("3 times"), "{e}");
    session.logout().await.expect("logout");
    let seen = target.join().unwrap();
    assert_eq!(seen.len(), 6, "three READs, three ABORT TASKs: {seen:?}");
}

/// A command run for another SCSI stack (the kernel host driver) is that
/// stack's to time out and abort: the session neither aborts nor re-sends
/// it, however late its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_through_command_has_no_deadline_of_the_sessions() {
    let config = InitiatorConfig::new("iqn.2026-12.io.blockwire:silent-pass-through")
        .with_command_timeout(Some(Duration::from_millis(100)));
    let (session, target) =
        scripted::session_configured(config, |l| late_target(l, 0, Duration::from_millis(800)))
            .await;
    let mut buf = vec![0u8; 8 * 512];
    let cdb = blockwire_initiator::rw16(false, 0, 8, false);
    let itt = std::sync::atomic::AtomicU32::new(0);
    let done = tokio::time::timeout(
        Duration::from_secs(20),
        session.pass_through(0, &cdb, blockwire_initiator::DataDir::Read(&mut buf), &itt),
    )
    .await
    .expect("the READ ends")
    .expect("answered, late");
    assert_eq!(done.status.0, 0);
    session.logout().await.expect("logout");
    let seen = target.join().unwrap();
    assert!(
        matches!(seen[..], [Seen::Read(_)]),
        "one READ, no ABORT TASK: {seen:?}"
    );
}
