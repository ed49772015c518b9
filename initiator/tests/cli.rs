//! The `blockwire` CLI against a real blockwire-target on a free port.
//! Skipped (with a message) when no blockwire-target binary is built.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Target(Child);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

mod target_binary;
use target_binary::target_bin;

fn start() -> (Target, u16) {
    let bin = target_bin();
    let port = (20000..32000)
        .map(|_| 20000 + (rand_u16() % 12000))
        .find(|p| TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("free port");
    let mut child = Command::new(bin)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("BLOCKWIRE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start blockwire-target");
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(child.try_wait().unwrap().is_none(), "target exited");
        assert!(Instant::now() < deadline, "target did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    (Target(child), port)
}

fn rand_u16() -> u16 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    (t ^ std::process::id()) as u16
}

fn blockwire(args: &[&str], cfg: &std::path::Path) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_blockwire"))
        .args(args)
        .env("BLOCKWIRE_CONFIG_DIR", cfg)
        .env(
            "BLOCKWIRE_INITIATOR_NAME",
            "iqn.2026-11.io.blockwire.test:cli",
        )
        .output()
        .expect("run blockwire");
    eprintln!(
        "$ blockwire {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn cli_against_blockwire_target() {
    let (_t, port) = start();
    let portal = format!("127.0.0.1:{port}");
    let dir = std::env::temp_dir().join(format!("blockwire-cli-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let iqn = "iqn.2026-11.io.blockwire:default";

    let out = blockwire(
        &[
            "iscsiadm",
            "-m",
            "discovery",
            "-t",
            "sendtargets",
            "-p",
            &portal,
        ],
        &dir,
    );
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{portal},1 {iqn}\n")
    );

    let out = blockwire(&["readcap", "-p", &portal], &dir);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Capacity:      1073741824 bytes"));

    let out = blockwire(&["ls", "-p", &portal], &dir);
    assert!(String::from_utf8_lossy(&out.stdout).contains("Lun: 0"));

    // dd: file -> LUN -> file.
    let src = dir.join("in.img");
    let back = dir.join("out.img");
    let data: Vec<u8> = (0..4u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    let url = format!("iscsi://{portal}/{iqn}/0");
    assert!(blockwire(
        &[
            "dd",
            "--if",
            src.to_str().unwrap(),
            "--of",
            &url,
            "--bs",
            "256k",
            "--quiet"
        ],
        &dir
    )
    .status
    .success());
    assert!(blockwire(
        &[
            "dd",
            "--if",
            &url,
            "--of",
            back.to_str().unwrap(),
            "--bs",
            "1M",
            "--count",
            "4",
            "--quiet"
        ],
        &dir
    )
    .status
    .success());
    assert!(
        std::fs::read(&back).unwrap() == data,
        "dd round trip differs"
    );

    let out = blockwire(
        &["bench", "-p", &portal, "--time", "300ms", "--qd", "4"],
        &dir,
    );
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("IOPS="));

    // Node database and sessions.
    let out = blockwire(&["iscsiadm", "-m", "node"], &dir);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{portal},1 {iqn}\n")
    );
    assert_eq!(
        blockwire(&["iscsiadm", "-m", "session"], &dir)
            .status
            .code(),
        Some(21)
    );
    let out = blockwire(
        &[
            "iscsiadm", "-m", "node", "-T", iqn, "-p", &portal, "--login",
        ],
        &dir,
    );
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("successful."));
    let out = blockwire(&["iscsiadm", "-m", "session"], &dir);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("tcp: [1] {portal},1 {iqn} (non-flash)\n")
    );
    assert!(
        blockwire(&["iscsiadm", "-m", "node", "-T", iqn, "--logout"], &dir)
            .status
            .success()
    );
    assert_eq!(
        blockwire(&["iscsiadm", "-m", "session"], &dir)
            .status
            .code(),
        Some(21)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
