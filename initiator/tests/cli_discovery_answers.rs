//! `blockwire iscsiadm -m discovery` against a scripted discovery target whose
//! SendTargets answer holds a TargetName that is a path and a TargetAddress whose host
//! carries a line break. The node database keeps `nodes/<TargetName>/<host>,<port>,<tpgt>`,
//! so taken as they came these would write files outside it and other keys into a
//! record. The CLI must record only the real target and say what it left out.

use std::io::Write;
use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use blockwire_pdu::keys::encode_text;
use blockwire_pdu::pdu::{TextResponse, RESERVED_TAG};
use blockwire_pdu::{Bhs, Digests, Lun, Pdu};

mod scripted;
use scripted::read_pdu;

/// Serves one discovery session: agrees to every login step (answering the digests
/// it is asked for with None), answers SendTargets with `answer`, and logs out.
fn scripted_target(listener: TcpListener, answer: Vec<(&'static str, String)>) {
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut stat_sn = 0u32;
    while let Some(pdu) = read_pdu(&mut s) {
        let reply = match pdu.bhs {
            Bhs::LoginRequest(r) => scripted::agree_to_login(&r, &pdu.data, stat_sn),
            Bhs::TextRequest(r) => {
                let pairs: Vec<(&str, &str)> =
                    answer.iter().map(|(k, v)| (*k, v.as_str())).collect();
                Pdu::with_data(
                    Bhs::TextResponse(TextResponse {
                        final_bit: true,
                        continue_bit: false,
                        lun: Lun::default(),
                        itt: r.itt,
                        ttt: RESERVED_TAG,
                        stat_sn,
                        exp_cmd_sn: r.cmd_sn,
                        max_cmd_sn: r.cmd_sn.wrapping_add(8),
                    }),
                    encode_text(&pairs).unwrap(),
                )
            }
            Bhs::LogoutRequest(r) => scripted::agree_to_logout(&r, stat_sn),
            other => panic!("scripted target got {other:?}"),
        };
        stat_sn += 1;
        s.write_all(&reply.encode(Digests::NONE)).unwrap();
    }
}

#[test]
fn discovery_records_only_names_and_hosts() {
    let base = std::env::temp_dir().join(format!("blockwire-disc-answers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let db = base.join("db");
    let outside = base.join("outside");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let answer = vec![
        ("TargetName", outside.display().to_string()),
        ("TargetAddress", format!("127.0.0.1:{port},1")),
        ("TargetName", "iqn.2026-11.io.blockwire:real".to_owned()),
        (
            "TargetAddress",
            "evil\nnode.startup = automatic:3260,1".to_owned(),
        ),
        ("TargetAddress", format!("127.0.0.1:{port},1")),
    ];
    let target = std::thread::spawn(move || scripted_target(listener, answer));

    let portal = format!("127.0.0.1:{port}");
    let out = Command::new(env!("CARGO_BIN_EXE_blockwire"))
        .args([
            "iscsiadm",
            "-m",
            "discovery",
            "-t",
            "sendtargets",
            "-p",
            &portal,
        ])
        .env("BLOCKWIRE_CONFIG_DIR", &db)
        .env(
            "BLOCKWIRE_INITIATOR_NAME",
            "iqn.2026-11.io.blockwire.test:disc",
        )
        .output()
        .expect("run blockwire");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    eprintln!("stdout:\n{stdout}stderr:\n{stderr}");
    target.join().unwrap();
    assert!(out.status.success());
    assert_eq!(
        stdout,
        format!("{portal},1 iqn.2026-11.io.blockwire:real\n")
    );
    assert!(stderr.contains("TargetName left out"), "{stderr}");
    assert!(
        stderr.contains("TargetAddress of iqn.2026-11.io.blockwire:real left out"),
        "{stderr}"
    );
    assert!(
        !outside.exists(),
        "discovery wrote {} outside its database",
        outside.display()
    );
    let records: Vec<_> = walk(&db);
    assert_eq!(records.len(), 1, "{records:?}");
    let record = std::fs::read_to_string(&records[0]).unwrap();
    assert!(record.contains("node.startup = manual"), "{record}");
    assert!(!record.contains("automatic"), "{record}");
    let _ = std::fs::remove_dir_all(&base);
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
