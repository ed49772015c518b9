//! The real `blockwire-target` binary under a stand-in service manager: a
//! Unix datagram socket named by NOTIFY_SOCKET, as systemd sets it for a
//! `Type=notify` unit (packaging/blockwire-target.service).
//!
//! - the first notification is READY=1, and when it arrives the portal
//!   already accepts connections;
//! - SIGHUP is acknowledged with RELOADING=1 then READY=1, and the daemon
//!   keeps serving;
//! - SIGTERM makes it send STOPPING=1 and exit 0;
//! - the unit file is Type=notify, reloads with SIGHUP, and systemd's
//!   `systemd-analyze verify` finds nothing wrong in it.

use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::Duration;

mod daemon;
use daemon::DaemonProcess as Daemon;

/// The next notification, at most 20 s away.
fn next(sock: &UnixDatagram, d: &Daemon) -> String {
    let mut buf = [0u8; 4096];
    match sock.recv(&mut buf) {
        Ok(n) => String::from_utf8(buf[..n].to_vec()).expect("UTF-8 notification"),
        Err(e) => panic!(
            "no notification from the daemon within 20 s ({e})\n--- log ---\n{}",
            d.log_text()
        ),
    }
}

#[test]
fn ready_after_the_portal_serves_reloading_on_hup_and_stopping_on_term() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("notify.toml");
    std::fs::write(
        &config,
        "[fabric]\nnop_interval_secs = 0\n\n\
         [[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:0\"]\n\n\
         [[target]]\nname = \"iqn.2026-11.io.blockwire:notify\"\n\n\
         [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"8M\"\n",
    )
    .unwrap();
    let notify_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&notify_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut d = Daemon::spawn_env(
        dir,
        &config,
        ["--log", "info"],
        [("NOTIFY_SOCKET", notify_path.as_os_str())],
    );

    let ready = next(&sock, &d);
    assert!(
        ready.lines().any(|l| l == "READY=1"),
        "the first notification is not READY=1: {ready:?}"
    );
    // READY=1 means served: the portal is bound and logged, and a
    // connection to it is accepted now.
    let portal: SocketAddr = d.wait_log("the listening portal", |log| {
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
    });
    TcpStream::connect_timeout(&portal, Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("READY=1 was sent but {portal} refuses connections: {e}"));

    d.signal("HUP");
    let reloading = next(&sock, &d);
    assert!(
        reloading.lines().any(|l| l == "RELOADING=1"),
        "SIGHUP did not send RELOADING=1 first: {reloading:?}"
    );
    let again = next(&sock, &d);
    assert!(
        again.lines().any(|l| l == "READY=1"),
        "SIGHUP's RELOADING=1 was not followed by READY=1: {again:?}"
    );
    assert!(
        d.child.try_wait().unwrap().is_none(),
        "the daemon exited on SIGHUP"
    );
    TcpStream::connect_timeout(&portal, Duration::from_secs(2))
        .expect("still serving after SIGHUP");

    d.signal("TERM");
    let stopping = next(&sock, &d);
    assert!(
        stopping.lines().any(|l| l == "STOPPING=1"),
        "SIGTERM did not send STOPPING=1: {stopping:?}"
    );
    let status = d.wait_exit();
    assert!(status.success(), "exit after SIGTERM: {status}");
}

#[test]
fn without_notify_socket_nothing_is_required() {
    // A daemon started by hand (no NOTIFY_SOCKET) serves and stops as before.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("plain.toml");
    std::fs::write(
        &config,
        "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:0\"]\n\n\
         [[target]]\nname = \"iqn.2026-11.io.blockwire:plain\"\n\n\
         [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"8M\"\n",
    )
    .unwrap();
    let mut d = Daemon::spawn(dir, &config, ["--log", "debug"]);
    d.wait_log("serving", |log| log.contains("serving").then_some(()));
    d.signal("TERM");
    assert!(d.wait_exit().success());
    assert!(
        !d.log_text().contains("NOTIFY_SOCKET"),
        "a daemon without a service manager complained about NOTIFY_SOCKET:\n{}",
        d.log_text()
    );
}

#[test]
fn the_unit_file_is_type_notify_reloads_with_sighup_and_passes_systemd_analyze() {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../packaging/blockwire-target.service"
    ))
    .expect("packaging/blockwire-target.service");
    let key = |k: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("the unit has no {k}="))
            .trim()
            .to_owned()
    };
    assert_eq!(key("Type"), "notify");
    assert_eq!(key("ExecReload"), "/bin/kill -HUP $MAINPID");
    // The control socket where `blockwire-target ctl` looks when not told, in the
    // directory systemd makes for the unit.
    assert_eq!(
        key("ExecStart"),
        format!(
            "/usr/local/bin/blockwire-target --control {}",
            blockwire_mgmt::control::DEFAULT_CONTROL_SOCKET
        )
    );
    assert_eq!(
        Path::new(blockwire_mgmt::control::DEFAULT_CONTROL_SOCKET).parent(),
        Some(Path::new("/run").join(key("RuntimeDirectory")).as_path())
    );

    // systemd's own parser, on the unit as installed with this build's
    // binary: any unknown key, bad value or missing executable is reported.
    let dir = tempfile::tempdir().unwrap();
    let installed = dir.path().join("blockwire-target.service");
    std::fs::write(
        &installed,
        unit.replace("/usr/local/bin/blockwire-target", daemon::BIN),
    )
    .unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&installed)
        .output()
        .unwrap_or_else(|e| {
            panic!("systemd-analyze (Debian's systemd package) cannot run: {e}; install systemd")
        });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {}\n{stderr}",
        out.status
    );
}

#[test]
fn help_names_the_default_configuration_and_the_service_protocol() {
    let out = std::process::Command::new(daemon::BIN)
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "/etc/blockwire/target.toml",
        "READY=1",
        "STOPPING=1",
        "--metrics",
    ] {
        assert!(help.contains(needle), "--help lacks {needle}:\n{help}");
    }
}
