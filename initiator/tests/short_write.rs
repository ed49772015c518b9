//! A scripted target that answers WRITE(16)s GOOD with a residual underflow:
//! it says it took fewer bytes than the command's blocks (RFC 7143
//! §11.4.5). Those blocks were not all written; a caller that took the
//! WRITE as done (dd, a file system over ublk) would lose data silently, so
//! `Session::write` fails. Before, it came back `Ok`, and the RDMA-assisted
//! session's block WRITE still did on its plain-TCP path.

use std::io::Write;
use std::net::TcpListener;
use std::time::Duration;

use blockwire_pdu::{Bhs, Digests};

mod scripted;
use scripted::read_pdu;

/// Logs the initiator in, then answers each WRITE GOOD with half its bytes
/// said to be left over (and Data-Out it may still send ignored); then
/// answers the logout.
fn half_taking_target(listener: TcpListener) {
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (mut stat_sn, mut cmd_sn) = scripted::log_in(&mut s);
    while let Some(pdu) = read_pdu(&mut s) {
        match pdu.bhs {
            Bhs::ScsiCommand(c) => {
                assert!(c.write, "a WRITE");
                cmd_sn = cmd_sn.wrapping_add(1);
                let left = c.expected_data_transfer_length / 2;
                let response = scripted::response(&c, 0, Some(left), 0, stat_sn, cmd_sn);
                s.write_all(&response.encode(Digests::NONE)).unwrap();
                stat_sn += 1;
            }
            Bhs::LogoutRequest(r) => {
                let reply = scripted::agree_to_logout(&r, stat_sn);
                s.write_all(&reply.encode(Digests::NONE)).unwrap();
                return;
            }
            Bhs::NopOut(_) | Bhs::DataOut(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_target_takes_in_part_fails() {
    let (session, target) =
        scripted::session_with("iqn.2026-12.io.blockwire:short-write", half_taking_target).await;
    let data = vec![0x5a; 8 * 512];
    let write = tokio::time::timeout(Duration::from_secs(20), session.write(0, 0, 8, &data))
        .await
        .expect("the WRITE ends");
    let e = write.expect_err("a WRITE whose target took half its bytes succeeded");
    eprintln!("{e}");
    assert!(e.to_string().contains("2048 of its 4096 bytes"), "{e}");
    session.logout().await.expect("logout");
    target.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assisted_write_the_target_takes_in_part_fails() {
    use blockwire_initiator::rdma::{AssistedSession, RdmaConfig};
    use blockwire_initiator::InitiatorConfig;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let portal = listener.local_addr().unwrap().to_string();
    let target = std::thread::spawn(move || half_taking_target(listener));
    let plain = RdmaConfig {
        offer: false,
        ..RdmaConfig::default()
    };
    let config = InitiatorConfig::new("iqn.2026-12.io.blockwire:short-write-assisted");
    let session =
        AssistedSession::connect(config, plain, &portal, "iqn.2026-12.io.blockwire:scripted")
            .await
            .expect("the scripted target logs the initiator in");
    let mut buf = session.alloc(8 * 512).unwrap();
    buf.write_at(0, &[0x5a; 8 * 512]).unwrap();
    let write = tokio::time::timeout(Duration::from_secs(20), session.write(0, 0, 8, &buf))
        .await
        .expect("the WRITE ends");
    let e = write.expect_err("an assisted WRITE whose target took half its bytes succeeded");
    eprintln!("{e}");
    assert!(e.to_string().contains("2048 of its 4096 bytes"), "{e}");
    session.logout().await.expect("logout");
    target.join().unwrap();
}
