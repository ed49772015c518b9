//! A scripted target that answers READ(16)s with only part of their data.
//! The initiator must not hand the caller a buffer whose missing bytes it
//! takes for data: with a good status and no residual (the target claims it
//! sent everything, RFC 7143 §11.4.5.2), and with the residual said (a
//! block READ that brought fewer bytes than its blocks), `Session::read`
//! fails. Before, both came back `Ok`, the first with the buffer's unsent
//! half passed off as data and the second with a buffer shorter than its
//! blocks. The same holds for the RDMA-assisted session's block READ, whose
//! plain-TCP path (taken whenever the target grants no offload) used to copy
//! the whole buffer, its unsent tail included, and end `Ok`.

use std::io::Write;
use std::net::TcpListener;
use std::time::Duration;

use blockwire_pdu::{Bhs, Digests};

mod scripted;
use scripted::read_pdu;

/// Logs the initiator in, then answers each READ with the first half of
/// its data: with the status in the Data-In and no residual for the first,
/// with a SCSI Response saying the residual for the second; then answers
/// the logout.
fn half_answering_target(listener: TcpListener) {
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (mut stat_sn, mut cmd_sn) = scripted::log_in(&mut s);
    let mut reads = 0;
    while let Some(pdu) = read_pdu(&mut s) {
        match pdu.bhs {
            Bhs::ScsiCommand(c) => {
                cmd_sn = cmd_sn.wrapping_add(1);
                let half = c.expected_data_transfer_length / 2;
                let say_residual = reads == 1;
                reads += 1;
                let status = (!say_residual).then_some(0);
                let data = vec![0xa5; half as usize];
                let data_in = scripted::single_data_in(&c, status, stat_sn, cmd_sn, data);
                s.write_all(&data_in.encode(Digests::NONE)).unwrap();
                if say_residual {
                    let left = c.expected_data_transfer_length - half;
                    let response = scripted::response(&c, 0, Some(left), 1, stat_sn, cmd_sn);
                    s.write_all(&response.encode(Digests::NONE)).unwrap();
                }
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
async fn a_read_the_target_answers_in_part_fails() {
    let (session, target) =
        scripted::session_with("iqn.2026-12.io.blockwire:short-read", half_answering_target).await;
    for what in ["no residual", "a residual"] {
        let mut buf = vec![0u8; 8 * 512];
        let read = tokio::time::timeout(Duration::from_secs(20), session.read(0, 0, 8, &mut buf))
            .await
            .expect("the READ ends");
        assert!(
            read.is_err(),
            "a READ answered with half its data and {what} succeeded with {} bytes",
            buf.len()
        );
        eprintln!("with {what}: {}", read.unwrap_err());
    }
    session.logout().await.expect("logout");
    target.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assisted_read_the_target_answers_in_part_fails() {
    use blockwire_initiator::rdma::{AssistedSession, RdmaConfig};
    use blockwire_initiator::InitiatorConfig;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let portal = listener.local_addr().unwrap().to_string();
    let target = std::thread::spawn(move || half_answering_target(listener));
    let plain = RdmaConfig {
        offer: false,
        ..RdmaConfig::default()
    };
    let config = InitiatorConfig::new("iqn.2026-12.io.blockwire:short-read-assisted");
    let session =
        AssistedSession::connect(config, plain, &portal, "iqn.2026-12.io.blockwire:scripted")
            .await
            .expect("the scripted target logs the initiator in");
    for what in ["no residual", "a residual"] {
        let mut buf = session.alloc(8 * 512).unwrap();
        let read = tokio::time::timeout(Duration::from_secs(20), session.read(0, 0, 8, &mut buf))
            .await
            .expect("the READ ends");
        let e = read.expect_err(&format!(
            "an assisted READ answered with half its data and {what} succeeded"
        ));
        eprintln!("with {what}: {e}");
    }
    session.logout().await.expect("logout");
    target.join().unwrap();
}
