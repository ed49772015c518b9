//! Operations basics of the real `blockwire-target` binary, with stderr
//! redirected to a file as a service manager would:
//!
//! - the text log carries no ANSI escape codes when stderr is not a terminal;
//! - SIGHUP does not end the daemon: it reloads the unchanged file, logs
//!   that nothing changed and keeps accepting connections on its portal;
//!   SIGTERM then ends it with exit 0;
//! - `--log-format json` writes one JSON object per line;
//! - `--log json` (a format name given as the filter) is refused with a
//!   message naming --log-format;
//! - RAM LUNs hold at most `[fabric] ram_limit` together: the start warns
//!   when they could hold more, a WRITE that needs memory past it is
//!   answered DATA PROTECT, SPACE ALLOCATION FAILED WRITE PROTECT and the
//!   daemon serves on; memory an UNMAP frees takes writes again.

use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

mod daemon;
use daemon::{DaemonProcess as Daemon, BIN};

const HUP_LINE: &str = "configuration applied: nothing to change";

/// Starts the daemon with one portal on a free port of 127.0.0.1 and one
/// 8 MiB RAM LUN, stderr to a file, plus `extra` arguments.
fn start(extra: &[&str]) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ops.toml");
    std::fs::write(
        &config,
        "[fabric]\nnop_interval_secs = 0\n\n\
         [[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:0\"]\n\n\
         [[target]]\nname = \"iqn.2026-11.io.blockwire:ops\"\n\n\
         [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"8M\"\n",
    )
    .unwrap();
    Daemon::spawn(dir, &config, extra)
}

/// The portal address of a text log's "listening" line.
fn text_portal(log: &str) -> Option<SocketAddr> {
    log.lines()
        .filter(|l| l.contains("listening"))
        .find_map(|l| {
            l.split_once("portal=")?
                .1
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
}

/// The portal address of a JSON log's "listening" event.
fn json_portal(log: &str) -> Option<SocketAddr> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["fields"]["message"] == "listening")
        .and_then(|v| v["fields"]["portal"].as_str()?.parse().ok())
}

fn assert_accepts(portal: SocketAddr) {
    TcpStream::connect_timeout(&portal, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("the portal {portal} refused a connection: {e}"));
}

/// Sends SIGHUP, checks the reload's log line and that the portal still accepts a
/// connection, then SIGTERM and a clean exit. Returns the whole log.
fn hup_then_term(d: &mut Daemon, portal: SocketAddr) -> String {
    d.signal("HUP");
    d.wait_log("the reload line", |log| {
        log.contains(HUP_LINE).then_some(())
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        d.child.try_wait().unwrap().is_none(),
        "the daemon exited on SIGHUP"
    );
    assert_accepts(portal);
    d.signal("TERM");
    let status = d.wait_exit();
    assert!(status.success(), "exit after SIGTERM: {status}");
    d.log_text()
}

#[test]
fn sighup_reloads_and_keeps_serving_text_log_has_no_escape_codes() {
    let mut d = start(&["--log", "info"]);
    let portal = d.wait_log("the portal address", text_portal);
    assert_accepts(portal);
    let log = hup_then_term(&mut d, portal);
    let line = log
        .lines()
        .find(|l| l.contains(HUP_LINE))
        .expect("the reload line");
    assert!(line.contains("INFO"), "not at info level: {line}");
    assert!(log.contains("SIGTERM received"), "{log}");
    assert!(
        !log.as_bytes().contains(&0x1b),
        "the log (stderr not a terminal) has ESC bytes: {log:?}"
    );
}

#[test]
fn json_log_format_writes_one_object_per_line() {
    let mut d = start(&["--log", "info", "--log-format", "json"]);
    let portal = d.wait_log("the portal address", json_portal);
    let log = hup_then_term(&mut d, portal);
    let mut events = 0;
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a log line is not JSON ({e}): {line:?}"));
        assert!(v.is_object(), "not an object: {line}");
        events += 1;
        if v["fields"]["message"] == HUP_LINE {
            assert_eq!(v["level"], "INFO", "{line}");
        }
    }
    assert!(events >= 3, "too few events: {log}");
    assert!(!log.as_bytes().contains(&0x1b), "{log:?}");
}

fn refused(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("BLOCKWIRE_LOG")
        .env_remove("BLOCKWIRE_LOG_FORMAT")
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} was accepted: {stderr}");
    stderr
}

#[test]
fn format_name_as_log_filter_is_refused() {
    for args in [
        &["--log", "json"][..],
        &["--log", "text"],
        &["--log", "info,json", "--check"],
    ] {
        let stderr = refused(args);
        assert!(stderr.contains("--log-format"), "{args:?}: {stderr}");
    }
    let stderr = refused(&["--log-format", "yaml"]);
    assert!(stderr.contains("json"), "{stderr}");
}

/// UNMAP of `blocks` 512-byte blocks at `lba` (one descriptor): its CDB
/// and its parameter list.
fn unmap(lba: u64, blocks: u32) -> (Vec<u8>, Vec<u8>) {
    use blockwire_pdu::scsi::{Cdb, UnmapDescriptor, UnmapList};
    let param = UnmapList {
        descriptors: vec![UnmapDescriptor { lba, blocks }],
    }
    .encode();
    let cdb = Cdb::Unmap {
        anchor: false,
        group: 0,
        parameter_list_length: param.len() as u16,
    }
    .encode();
    (cdb, param)
}

#[test]
fn ram_luns_past_their_memory_limit_refuse_writes_and_serve_on() {
    use blockwire_initiator::{DataDir, Error, InitiatorConfig, Session};
    use blockwire_pdu::scsi::SenseKey;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ram.toml");
    std::fs::write(
        &config,
        "[fabric]\nnop_interval_secs = 0\nram_limit = \"2M\"\n\n\
         [[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:0\"]\n\n\
         [[target]]\nname = \"iqn.2026-11.io.blockwire:ram\"\n\n\
         [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"8M\"\n",
    )
    .unwrap();
    let mut d = Daemon::spawn(dir, &config, ["--log", "info"]);
    let portal = d.wait_log("the portal address", text_portal);
    let log = d.log_text();
    assert!(
        log.contains("the RAM LUNs add up to 8 MiB, more than the 2 MiB they may hold together ([fabric] ram_limit)"),
        "{log}"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = Session::connect(
            InitiatorConfig::new("iqn.2026-11.io.blockwire.test:ram"),
            &portal.to_string(),
            "iqn.2026-11.io.blockwire:ram",
        )
        .await
        .expect("login");
        // The power-on unit attention goes to a TEST UNIT READY.
        let _ = s.execute(0, &[0u8; 6], DataDir::None).await;
        let mib = vec![0x5au8; 1 << 20];
        // Two MiB fit, in the LUN's first and last chunks.
        s.write(0, 0, 2048, &mib).await.expect("the first MiB");
        s.write(0, 14336, 2048, &mib).await.expect("the last MiB");
        // A third chunk does not, and nothing of the write lands.
        let refused = match s.write(0, 4096, 8, &mib[..4096]).await {
            Err(Error::Scsi(e)) => e,
            other => panic!("a write past ram_limit: {other:?}"),
        };
        assert_eq!(
            refused.sense_code(),
            Some((SenseKey::DataProtect, 0x27, 0x07)),
            "{refused:?}"
        );
        let mut back = vec![1u8; 4096];
        s.read(0, 4096, 8, &mut back).await.expect("READ");
        assert!(
            back.iter().all(|&b| b == 0),
            "bytes of the refused write landed"
        );
        // UNMAP of the first chunk gives its memory back.
        let (cdb, param) = unmap(0, 2048);
        s.execute(0, &cdb, DataDir::Write(&param))
            .await
            .expect("UNMAP");
        s.write(0, 4096, 8, &mib[..4096])
            .await
            .expect("a write after UNMAP");
        s.read(0, 4096, 8, &mut back).await.expect("READ");
        assert!(back.iter().all(|&b| b == 0x5a));
    });
    d.signal("TERM");
    assert!(d.wait_exit().success(), "{}", d.log_text());
}
