//! The login phase as a whole is bounded (`FabricSettings::login_deadline`),
//! not only the wait for each Login Request: a peer that trickles its
//! login, or stops reading the target's Login Responses, loses its
//! connection once the deadline passes. Time is tokio's paused clock, so
//! the deadline is a minute that takes no real time.

use super::*;
use crate::iscsi::io::{PduReader, PduWriter};

const DEADLINE: Duration = Duration::from_secs(60);

/// The test fabric with the default per-PDU login timeout (15 s) and a
/// whole-login deadline of [`DEADLINE`].
fn fabric_with_deadline() -> Arc<Fabric> {
    fabric_with(FabricSettings {
        login_deadline: DEADLINE,
        ..FabricSettings::default()
    })
}

fn fabric_with(settings: FabricSettings) -> Arc<Fabric> {
    let lu = LogicalUnit::new(LuConfig::new(Arc::new(RamBackstore::new(1 << 20))));
    let catalog = Catalog::one_target(TARGET, local(), Acl::Any, Arc::new(lu));
    let (_, shutdown) = watch::channel(false);
    Fabric::new(Arc::new(catalog), settings, shutdown)
}

type Ends = (
    tokio::task::JoinHandle<()>,
    PduReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>,
    PduWriter,
    watch::Sender<bool>,
);

/// One connection's driver over a pipe of `pipe_bytes` each way, and the
/// initiator's ends of it.
fn connect(pipe_bytes: usize) -> Ends {
    connect_to(fabric_with_deadline(), pipe_bytes, None)
}

/// [`connect`] to `fabric`, as if from `peer`.
fn connect_to(fabric: Arc<Fabric>, pipe_bytes: usize, peer: Option<std::net::SocketAddr>) -> Ends {
    let (client, server) = tokio::io::duplex(pipe_bytes);
    let (keep, cut) = watch::channel(false);
    let served = tokio::spawn(crate::iscsi::connection::serve_stream(
        fabric,
        server,
        1,
        local(),
        peer,
        cut,
    ));
    let (rd, wr) = tokio::io::split(client);
    (served, PduReader::new(rd), PduWriter::over_stream(wr), keep)
}

/// A security-stage Login Request carrying `text`, continued (C bit) when
/// more of its text follows, never asking to move on (T bit clear).
fn request(text: Vec<u8>, continued: bool) -> Pdu {
    let mut pdu = login_pdu(Stage::Security, Stage::Security, &[]);
    if let Bhs::LoginRequest(l) = &mut pdu.bhs {
        l.transit = false;
        l.continue_bit = continued;
    }
    pdu.data = text.into();
    pdu
}

/// A first Login Request of a discovery session offering AuthMethod=None,
/// asking to stay in the security stage.
fn discovery_without_chap() -> Pdu {
    let text = encode_text(&[
        ("InitiatorName", INITIATOR),
        ("SessionType", "Discovery"),
        ("AuthMethod", "None"),
    ])
    .unwrap();
    request(text, false)
}

/// A login whose text comes 7 bytes at a time, each piece 10 s after the
/// last answer, well within the 15 s allowed between PDUs: it never ends
/// by itself (256 pieces would take 43 minutes), and the target closes
/// the connection once the login has taken [`DEADLINE`].
#[tokio::test(start_paused = true)]
async fn a_login_trickled_within_its_timeout_ends_at_its_deadline() {
    let (served, mut reader, mut writer, _keep) = connect(64 << 10);
    let began = tokio::time::Instant::now();
    let mut pieces = 0;
    let closed_after = loop {
        writer
            .push(&request(b"X-trick".to_vec(), true))
            .await
            .unwrap();
        writer.flush().await.unwrap();
        pieces += 1;
        let answer = reader
            .next()
            .await
            .unwrap()
            .expect("an answer to each piece");
        assert!(
            matches!(answer.bhs, Bhs::LoginResponse(ref l) if l.status == LoginStatus::SUCCESS),
            "{:?}",
            answer.bhs
        );
        assert!(pieces < 100, "the login went on past {pieces} pieces");
        // The next piece in 10 s, unless the target closes meanwhile.
        match tokio::time::timeout(Duration::from_secs(10), reader.next()).await {
            Err(_) => continue,
            Ok(Ok(None)) | Ok(Err(_)) => break began.elapsed(),
            Ok(Ok(Some(p))) => panic!("unasked for: {:?}", p.bhs),
        }
    };
    assert!(
        closed_after >= DEADLINE && closed_after < DEADLINE + Duration::from_secs(15),
        "closed after {closed_after:?}, the deadline being {DEADLINE:?}"
    );
    tokio::time::timeout(Duration::from_secs(30), served)
        .await
        .expect("the connection's driver ended")
        .unwrap();
    // Nothing was told, so nothing lingers for the peer to read: the
    // connection (and its login slot) is gone with the close, though this
    // end is still open.
    let lingered = began.elapsed() - closed_after;
    assert!(
        lingered < Duration::from_secs(1),
        "a login that timed out lingered {lingered:?} after its close"
    );
}

/// A first Login Request of 250 made-up keys, each answered NotUnderstood:
/// about 6 KB of Login Response into a 256-byte pipe its peer never reads.
/// The target's send waits, and the login's deadline ends it (and the
/// connection), where it waited for good.
#[tokio::test(start_paused = true)]
async fn a_peer_that_stops_reading_login_responses_is_closed_at_the_deadline() {
    let (served, _reader, mut writer, _keep) = connect(256);
    let mut keys: Vec<(String, String)> = vec![
        ("InitiatorName".into(), INITIATOR.into()),
        ("SessionType".into(), "Discovery".into()),
        ("AuthMethod".into(), "None".into()),
    ];
    keys.extend((0..250).map(|k| (format!("X-unread.key.{k}"), "1".to_owned())));
    let pairs: Vec<(&str, &str)> = keys.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let text = encode_text(&pairs).unwrap();
    assert!(text.len() <= 8192, "one request: {} bytes", text.len());
    writer.push(&request(text, false)).await.unwrap();
    writer.flush().await.unwrap();
    let began = tokio::time::Instant::now();
    tokio::time::timeout(DEADLINE + Duration::from_secs(30), served)
        .await
        .expect("the connection's driver still waits on its unread Login Response")
        .unwrap();
    assert!(began.elapsed() >= DEADLINE - Duration::from_secs(1));
}

/// With room for one login in progress, a second connection is closed as
/// soon as it is accepted, before it has sent anything, while the first
/// stays in its login; once the first hangs up, a third is answered.
#[tokio::test(start_paused = true)]
async fn a_connection_past_the_logins_in_progress_is_closed_at_once() {
    let fabric = fabric_with(FabricSettings {
        max_logins_in_progress: 1,
        ..FabricSettings::default()
    });
    let from = |last: u8| Some(std::net::SocketAddr::from(([127, 0, 0, last], 50000)));
    let (first, first_reader, first_writer, _k1) = connect_to(fabric.clone(), 64 << 10, from(1));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(fabric.login_slots.held(), (1, 1), "the first login's slot");
    let (second, mut second_reader, _w2, _k2) = connect_to(fabric.clone(), 64 << 10, from(2));
    tokio::time::timeout(Duration::from_secs(1), second)
        .await
        .expect("the second connection was kept")
        .unwrap();
    assert!(matches!(second_reader.next().await, Ok(None) | Err(_)));
    assert!(
        !first.is_finished(),
        "the first connection is still in its login"
    );
    drop((first_reader, first_writer));
    tokio::time::timeout(Duration::from_secs(1), first)
        .await
        .expect("the first connection ended when its peer hung up")
        .unwrap();
    assert_eq!(fabric.login_slots.held(), (0, 0));
    let (_third, mut reader, mut writer, _k3) = connect_to(fabric.clone(), 64 << 10, from(3));
    writer.push(&discovery_without_chap()).await.unwrap();
    writer.flush().await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(1), reader.next())
        .await
        .expect("the third connection is answered")
        .unwrap()
        .expect("a Login Response");
    assert!(
        matches!(answer.bhs, Bhs::LoginResponse(ref l) if l.status == LoginStatus::SUCCESS),
        "{:?}",
        answer.bhs
    );
}

/// A portal closed while a login's final Login Response, which carries an
/// RDMA offload grant, waits on a peer that does not read: the grant's
/// token, registered just before that response, stops working with the
/// login, where it stayed bound to the session's TSIH for the target's
/// life.
#[tokio::test]
async fn a_login_cut_during_its_final_response_leaves_no_rdma_token() {
    let fabric = fabric_with(FabricSettings::default());
    fabric
        .start_rdma("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let svc = fabric.rdma.get().unwrap().clone();
    let (served, mut reader, mut writer, keep) = connect_to(fabric.clone(), 64, None);
    let security = [
        ("InitiatorName", INITIATOR),
        ("AuthMethod", "None"),
        ("SessionType", "Normal"),
        ("TargetName", TARGET),
    ];
    writer
        .push(&login_pdu(Stage::Security, Stage::Operational, &security))
        .await
        .unwrap();
    writer.flush().await.unwrap();
    let answer = reader.next().await.unwrap().expect("a Login Response");
    assert!(
        matches!(answer.bhs, Bhs::LoginResponse(ref l) if l.status == LoginStatus::SUCCESS),
        "{:?}",
        answer.bhs
    );
    let operational = [
        (blockwire_transport::assist::OFFLOAD_KEY, "soft"),
        ("HeaderDigest", "None"),
        ("DataDigest", "None"),
        ("MaxRecvDataSegmentLength", "262144"),
        ("InitialR2T", "No"),
        ("ImmediateData", "Yes"),
        ("MaxBurstLength", "262144"),
        ("FirstBurstLength", "65536"),
        ("MaxConnections", "1"),
        ("MaxOutstandingR2T", "1"),
        ("DefaultTime2Wait", "2"),
        ("DefaultTime2Retain", "0"),
        ("DataPDUInOrder", "Yes"),
        ("DataSequenceInOrder", "Yes"),
        ("ErrorRecoveryLevel", "0"),
    ];
    writer
        .push(&login_pdu(
            Stage::Operational,
            Stage::FullFeature,
            &operational,
        ))
        .await
        .unwrap();
    writer.flush().await.unwrap();
    // The final response is larger than the pipe, which is not read.
    let began = std::time::Instant::now();
    while svc.registered_tokens() == 0 {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "no grant was registered"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!served.is_finished(), "the final response was sent");
    keep.send_replace(true);
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("the cut connection ended")
        .unwrap();
    assert_eq!(
        svc.registered_tokens(),
        0,
        "the cut login's token still works"
    );
}

/// A login that fails authentication (here a discovery login offering
/// AuthMethod=None where discovery requires CHAP) is told so 2 s later;
/// failures from one address, sent one after another, each wait 2 s;
/// five at once are answered four after 2 s (a burst, as logins over
/// several paths are) and the fifth 2 s later, while another address is
/// not held up. The connection then closes.
#[tokio::test(start_paused = true)]
async fn an_authentication_failure_is_answered_after_its_delay() {
    let lu = LogicalUnit::new(LuConfig::new(Arc::new(RamBackstore::new(1 << 20))));
    let mut catalog = Catalog::one_target(TARGET, local(), Acl::Any, Arc::new(lu));
    catalog.discovery_auth.incoming = vec![crate::iscsi::catalog::ChapSecret {
        user: "discoverer".into(),
        secret: "discovery-secret".into(),
    }];
    let (_, shutdown) = watch::channel(false);
    let fabric = Fabric::new(Arc::new(catalog), FabricSettings::default(), shutdown);
    let from = |last: u8| Some(std::net::SocketAddr::from(([198, 51, 100, last], 50000)));
    // Each of `peers` sends a failing login at once; the seconds each
    // waits for its refusal.
    let refused = |peers: Vec<Option<std::net::SocketAddr>>| {
        let fabric = fabric.clone();
        async move {
            let mut logins = Vec::new();
            for peer in peers {
                let (served, reader, mut writer, keep) = connect_to(fabric.clone(), 64 << 10, peer);
                writer.push(&discovery_without_chap()).await.unwrap();
                writer.flush().await.unwrap();
                logins.push((served, reader, writer, keep));
            }
            let asked = tokio::time::Instant::now();
            let answers: Vec<_> = logins
                .into_iter()
                .map(|(served, mut reader, writer, keep)| {
                    tokio::spawn(async move {
                        let answer = reader.next().await.unwrap().expect("a Login Response");
                        assert!(
                            matches!(answer.bhs, Bhs::LoginResponse(ref l) if l.status == LoginStatus::AUTHENTICATION_FAILURE),
                            "{:?}",
                            answer.bhs
                        );
                        let waited = asked.elapsed().as_secs();
                        tokio::time::timeout(Duration::from_secs(30), served)
                            .await
                            .expect("the refused connection closed")
                            .unwrap();
                        drop((writer, keep));
                        waited
                    })
                })
                .collect();
            let mut waited = Vec::new();
            for a in answers {
                waited.push(a.await.unwrap());
            }
            waited
        }
    };
    for _ in 0..3 {
        assert_eq!(
            refused(vec![from(1)]).await,
            [2],
            "one failure after another"
        );
    }
    let mut waited = refused(vec![from(1), from(1), from(1), from(1), from(1), from(2)]).await;
    assert_eq!(waited.pop(), Some(2), "another address, beside them");
    waited.sort_unstable();
    assert_eq!(waited, [2, 2, 2, 2, 4], "five at once from one address");
}

/// A discovery login of `initiator` over a pipe as if from `peer`: the status of the
/// Login Response that ends it (SUCCESS once in full feature phase), and
/// the connection's ends, kept open so that its session stays.
async fn discovery_login(
    fabric: &Arc<Fabric>,
    initiator: &str,
    peer: std::net::SocketAddr,
) -> (LoginStatus, Ends) {
    let mut ends = connect_to(fabric.clone(), 64 << 10, Some(peer));
    let security = [
        ("InitiatorName", initiator),
        ("SessionType", "Discovery"),
        ("AuthMethod", "None"),
    ];
    let operational = [
        ("HeaderDigest", "None"),
        ("DataDigest", "None"),
        ("MaxRecvDataSegmentLength", "8192"),
    ];
    for (pdu, last) in [
        (
            login_pdu(Stage::Security, Stage::Operational, &security),
            false,
        ),
        (
            login_pdu(Stage::Operational, Stage::FullFeature, &operational),
            true,
        ),
    ] {
        ends.2.push(&pdu).await.unwrap();
        ends.2.flush().await.unwrap();
        let answer = ends.1.next().await.unwrap().expect("a Login Response");
        let Bhs::LoginResponse(l) = answer.bhs else {
            panic!("{:?}", answer.bhs)
        };
        if l.status != LoginStatus::SUCCESS || last {
            assert!(!last || l.status != LoginStatus::SUCCESS || l.transit);
            return (l.status, ends);
        }
    }
    unreachable!()
}

/// The address a connection comes from reaches the session table: one
/// address opens at most its share of discovery sessions, and another
/// address still opens one.
#[tokio::test(start_paused = true)]
async fn a_discovery_login_past_its_addresss_share_is_refused() {
    let fabric = fabric_with(FabricSettings {
        max_discovery_sessions_per_address: 1,
        ..FabricSettings::default()
    });
    let from = |last: u8| std::net::SocketAddr::from(([192, 0, 2, last], 50000));
    // Initiators of other names: the same name and ISID would reinstate
    // the first session, not open a second.
    let (first, _kept) = discovery_login(&fabric, "iqn.2026-11.test:one", from(1)).await;
    assert_eq!(first, LoginStatus::SUCCESS);
    let (second, _) = discovery_login(&fabric, "iqn.2026-11.test:two", from(1)).await;
    assert_eq!(second, LoginStatus::OUT_OF_RESOURCES);
    let (other, _kept_too) = discovery_login(&fabric, "iqn.2026-11.test:three", from(2)).await;
    assert_eq!(other, LoginStatus::SUCCESS);
}

/// Bytes that do not decode as a PDU during login are answered with a
/// Login Response that says why before the connection closes, not by a
/// bare close the initiator must guess at: a Login Request whose data
/// segment is past the login phase's 8192 bytes is an initiator error
/// (0200h) answered with its own ITT and ISID; a reserved opcode is
/// invalid during login (020Bh).
#[tokio::test(start_paused = true)]
async fn an_undecodable_pdu_during_login_is_answered_before_the_close() {
    let mut oversized = login_pdu(Stage::Security, Stage::Security, &[]);
    if let Bhs::LoginRequest(l) = &mut oversized.bhs {
        l.transit = false;
        l.itt = 0x1234_5678;
        l.cmd_sn = 7;
    }
    oversized.data = vec![b'x'; 9000].into();
    let mut reserved_opcode = discovery_without_chap().encode(Digests::NONE);
    reserved_opcode[0] = 0x0f;
    let cases = [
        (
            oversized.encode(Digests::NONE),
            LoginStatus::INITIATOR_ERROR,
        ),
        (reserved_opcode, LoginStatus::INVALID_DURING_LOGIN),
    ];
    for (bytes, status) in cases {
        let (client, server) = tokio::io::duplex(64 << 10);
        let (_keep, cut) = watch::channel(false);
        let served = tokio::spawn(crate::iscsi::connection::serve_stream(
            fabric_with_deadline(),
            server,
            1,
            local(),
            None,
            cut,
        ));
        let (rd, mut wr) = tokio::io::split(client);
        let mut reader = PduReader::new(rd);
        tokio::io::AsyncWriteExt::write_all(&mut wr, &bytes)
            .await
            .unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(5), reader.next())
            .await
            .expect("an answer within 5 s")
            .unwrap()
            .expect("a Login Response before the close");
        let Bhs::LoginResponse(r) = answer.bhs else {
            panic!("not a Login Response: {:?}", answer.bhs);
        };
        assert_eq!(r.status, status, "{r:?}");
        if status == LoginStatus::INITIATOR_ERROR {
            assert_eq!((r.itt, r.isid, r.exp_cmd_sn), (0x1234_5678, ISID, 7));
        }
        let closed = tokio::time::timeout(Duration::from_secs(10), reader.next()).await;
        assert!(
            matches!(closed, Ok(Ok(None)) | Ok(Err(_))),
            "the connection was kept after the refusal"
        );
        tokio::time::timeout(Duration::from_secs(30), served)
            .await
            .expect("the driver ends")
            .unwrap();
    }
}
