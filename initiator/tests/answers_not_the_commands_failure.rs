//! Answers a scripted target gives that are not the failure of the
//! command they end:
//!
//! - TASK ABORTED, as a target whose unit has TAS=1 answers the commands of
//!   one nexus that another nexus's LOGICAL UNIT RESET or PREEMPT AND ABORT
//!   ended (SAM-5 5.3.1). The command did not complete: as the SCSI midlayer
//!   does, the initiator sends it again, four times at most. Before, the
//!   first TASK ABORTED came back as an error (EIO under ublk or FUSE).
//! - CHECK CONDITION with a deferred error (sense response code 71h, SPC-4
//!   4.5.5): an earlier command's failure; this one was not processed, and
//!   is sent again. The unit's next SYNCHRONIZE CACHE fails with it.
//! - CHECK CONDITION with RECOVERED ERROR (SPC-4 4.5.6): the command
//!   completed; its data are the caller's. Both failed the command. As a
//!   completed command it owes all its data, as a GOOD one does.

use std::net::TcpListener;
use std::time::Duration;

mod scripted;

/// TASK ABORTED.
const TASK_ABORTED: u8 = 0x40;

/// How the scripted target ends a READ it does not simply answer.
#[derive(Clone, Copy)]
enum Refusal {
    /// TASK ABORTED.
    Aborted,
    /// CHECK CONDITION, a deferred MEDIUM ERROR, WRITE ERROR.
    Deferred,
}

/// Logs the initiator in, answers the first `aborted` READs TASK ABORTED
/// and the next with data; then answers the logout. Returns how many READs
/// came.
fn aborting_target(listener: TcpListener, aborted: usize) -> usize {
    refusing_target(listener, aborted, Refusal::Aborted)
}

/// Logs the initiator in, ends the first `refused` READs as `how` says and
/// answers the next with data (and commands without data GOOD); then
/// answers the logout. Returns how many
/// READs came.
fn refusing_target(listener: TcpListener, refused: usize, how: Refusal) -> usize {
    scripted::serve_commands(listener, |c, stat_sn, cmd_sn, before| {
        let answer = if before >= refused && c.expected_data_transfer_length == 0 {
            // A command without data (SYNCHRONIZE CACHE): GOOD.
            scripted::response(c, 0, None, 0, stat_sn, cmd_sn)
        } else if before >= refused {
            let data = vec![0x5e; c.expected_data_transfer_length as usize];
            scripted::single_data_in(c, Some(0), stat_sn, cmd_sn, data)
        } else {
            match how {
                Refusal::Aborted => scripted::response(c, TASK_ABORTED, None, 0, stat_sn, cmd_sn),
                Refusal::Deferred => {
                    let pdu = scripted::check_condition(c, stat_sn, cmd_sn, (0x03, 0x0c, 0x00));
                    // Response code 71h: deferred, fixed format (after the
                    // two-byte SenseLength).
                    let mut data = pdu.data.to_vec();
                    data[2] = 0x71;
                    blockwire_pdu::Pdu::with_data(pdu.bhs, data)
                }
            }
        };
        vec![answer]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_another_nexus_aborted_is_sent_again() {
    let (session, target) = scripted::session_with("iqn.2026-12.io.blockwire:aborted-once", |l| {
        aborting_target(l, 1)
    })
    .await;
    let mut buf = vec![0u8; 8 * 512];
    tokio::time::timeout(Duration::from_secs(20), session.read(0, 0, 8, &mut buf))
        .await
        .expect("the READ ends")
        .expect("the READ succeeds when sent again");
    assert!(buf.iter().all(|&b| b == 0x5e), "the target's data");
    session.logout().await.expect("logout");
    assert_eq!(target.join().unwrap(), 2, "READs sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_aborted_every_time_fails_after_four_retries() {
    let (session, target) =
        scripted::session_with("iqn.2026-12.io.blockwire:aborted-always", |l| {
            aborting_target(l, usize::MAX)
        })
        .await;
    let mut buf = vec![0u8; 8 * 512];
    let e = tokio::time::timeout(Duration::from_secs(20), session.read(0, 0, 8, &mut buf))
        .await
        .expect("the READ ends")
        .expect_err("a READ aborted every time fails");
    assert!(
        matches!(&e, blockwire_initiator::Error::Scsi(s) if s.status.0 == TASK_ABORTED),
        "{e}"
    );
    session.logout().await.expect("logout");
    assert_eq!(target.join().unwrap(), 5, "READs sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_hears_of_an_earlier_commands_failure_is_sent_again() {
    let (session, target) = scripted::session_with("iqn.2026-12.io.blockwire:deferred", |l| {
        refusing_target(l, 1, Refusal::Deferred)
    })
    .await;
    let mut buf = vec![0u8; 8 * 512];
    tokio::time::timeout(Duration::from_secs(20), session.read(0, 0, 8, &mut buf))
        .await
        .expect("the READ ends")
        .expect("the READ succeeds when sent again");
    assert!(buf.iter().all(|&b| b == 0x5e), "the target's data");
    session.logout().await.expect("logout");
    assert_eq!(target.join().unwrap(), 2, "READs sent");
}

/// A deferred error says a WRITE already answered GOOD failed later: the
/// command that hears of it is sent again, and the next SYNCHRONIZE CACHE
/// of the unit, which asks whether what was written is on the medium,
/// fails with it, once. Before, the flush succeeded and the loss was only
/// logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_flush_fails_with_a_deferred_error() {
    let (session, target) =
        scripted::session_with("iqn.2026-12.io.blockwire:deferred-flush", |l| {
            // The READ hears of the error, is answered when sent again;
            // both SYNCHRONIZE CACHEs are GOOD.
            refusing_target(l, 1, Refusal::Deferred)
        })
        .await;
    let mut buf = vec![0u8; 8 * 512];
    tokio::time::timeout(Duration::from_secs(20), session.read(0, 0, 8, &mut buf))
        .await
        .expect("the READ ends")
        .expect("the READ succeeds when sent again");
    let e = tokio::time::timeout(Duration::from_secs(20), session.synchronize_cache(0))
        .await
        .expect("the flush ends")
        .expect_err("the flush reports the deferred error");
    let blockwire_initiator::Error::Scsi(s) = &e else {
        panic!("not the deferred error: {e}")
    };
    let sense = s.sense.as_ref().expect("its sense data");
    assert!(sense.deferred, "{e}");
    assert_eq!((sense.asc, sense.ascq), (0x0c, 0x00), "{e}");
    tokio::time::timeout(Duration::from_secs(20), session.synchronize_cache(0))
        .await
        .expect("the second flush ends")
        .expect("the error was reported once");
    session.logout().await.expect("logout");
    assert_eq!(target.join().unwrap(), 4, "two READs, two flushes");
}

/// Answers each READ with its data and then CHECK CONDITION, RECOVERED
/// ERROR, RECOVERED DATA WITH RETRIES (17h/01h); then the logout.
fn recovering_target(listener: TcpListener) -> usize {
    scripted::serve_commands(listener, |c, stat_sn, cmd_sn, _| {
        let data = vec![0x6a; c.expected_data_transfer_length as usize];
        vec![
            scripted::single_data_in(c, None, stat_sn, cmd_sn, data),
            scripted::check_condition(c, stat_sn, cmd_sn, (0x01, 0x17, 0x01)),
        ]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_the_target_recovered_on_its_own_completes() {
    let (session, target) =
        scripted::session_with("iqn.2026-12.io.blockwire:recovered", recovering_target).await;
    let mut buf = vec![0u8; 8 * 512];
    let done = tokio::time::timeout(Duration::from_secs(20), session.read(0, 0, 8, &mut buf))
        .await
        .expect("the READ ends")
        .expect("a READ with RECOVERED ERROR completed");
    assert!(buf.iter().all(|&b| b == 0x6a), "the target's data");
    let sense = done.sense.expect("the sense data reach the caller");
    assert_eq!((sense.asc, sense.ascq), (0x17, 0x01));
    session.logout().await.expect("logout");
    assert_eq!(target.join().unwrap(), 1, "READs sent");
}

/// Answers each READ with half its data, then CHECK CONDITION, RECOVERED
/// ERROR with no residual: a completion claiming bytes never sent.
fn recovering_in_part_target(listener: TcpListener) -> usize {
    scripted::serve_commands(listener, |c, stat_sn, cmd_sn, _| {
        let data = vec![0x6a; c.expected_data_transfer_length as usize / 2];
        vec![
            scripted::single_data_in(c, None, stat_sn, cmd_sn, data),
            scripted::check_condition(c, stat_sn, cmd_sn, (0x01, 0x17, 0x01)),
        ]
    })
}

/// A command the target ends with RECOVERED ERROR completed, so it owes
/// all its data as a GOOD one does (RFC 7143 §11.4.5.2): a READ given half
/// of it fails, where the other half's stale bytes went back as data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_read_missing_data_fails() {
    let (session, target) = scripted::session_with(
        "iqn.2026-12.io.blockwire:recovered-in-part",
        recovering_in_part_target,
    )
    .await;
    let mut buf = vec![0u8; 8 * 512];
    let e = tokio::time::timeout(Duration::from_secs(20), session.read(0, 0, 8, &mut buf))
        .await
        .expect("the READ ends")
        .expect_err("a READ given half its data fails");
    assert!(e.to_string().contains("2048 bytes of Data-In"), "{e}");
    drop(session);
    let _ = target.join();
}

/// A WRITE the target ends with RECOVERED ERROR before asking for its data
/// (no R2T) claims, with no residual, that all of it was taken: the WRITE
/// fails, where its blocks never sent were taken as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_write_whose_data_was_never_asked_for_fails() {
    let (session, target) =
        scripted::session_with("iqn.2026-12.io.blockwire:recovered-unasked", |l| {
            scripted::serve_commands(l, |c, stat_sn, cmd_sn, _| {
                vec![scripted::check_condition(
                    c,
                    stat_sn,
                    cmd_sn,
                    (0x01, 0x17, 0x01),
                )]
            })
        })
        .await;
    // 1 MiB: past any first burst, so most of it waits for R2Ts.
    let data = vec![0x3c; 1 << 20];
    let e = tokio::time::timeout(
        Duration::from_secs(20),
        session.write(0, 0, (data.len() / 512) as u32, &data),
    )
    .await
    .expect("the WRITE ends")
    .expect_err("a WRITE whose data was never asked for fails");
    assert!(
        e.to_string()
            .contains("were sent unsolicited or asked for by R2T"),
        "{e}"
    );
    drop(session);
    // The scripted target takes no Data-Out: its thread may end on the
    // unsolicited data that follow the command. The initiator's verdict
    // is what this shows.
    let _ = target.join();
}
