//! Two `blockwire mount`s of different LUNs of one target, from one
//! initiator name, against the real blockwire-target (root and /dev/fuse,
//! as CI has; without them the test fails, naming what is missing).
//!
//! Two live sessions of one initiator name to one target must differ in
//! ISID: a login with the ISID of a live session reinstates it, ending the
//! older (RFC 7143 §6.3.5). Every mount logged in with one ISID, so the
//! second mount's login ended the first's session, whose recovery logged
//! in again and ended the second's, over and over.

use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod target_binary;
use target_binary::target_bin;

const IQN: &str = "iqn.2026-12.io.blockwire:two-mounts";

/// A child process killed when dropped (a failed test leaves nothing running).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A scratch directory; mount points in it are unmounted (lazily, in case
/// the test failed with a mount up) before it is removed.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        for m in ["a", "b"] {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.0.join(m))
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts a target of two RAM LUNs logging to `log`; returns it and its portal.
fn start_target(dir: &Path, log: &Path) -> (Killed, String) {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.join("t.toml");
    std::fs::write(
        &config,
        format!(
            "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:{port}\"]\n\n\
             [[target]]\nname = \"{IQN}\"\n\n\
             [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n\n\
             [[target.lun]]\nid = 1\nbackstore = \"ram\"\nsize = \"1M\"\n"
        ),
    )
    .unwrap();
    let child = Command::new(target_bin())
        .arg("--config")
        .arg(&config)
        .env("BLOCKWIRE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("start blockwire-target");
    let mut target = Killed(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(target.0.try_wait().unwrap().is_none(), "target exited");
        assert!(Instant::now() < deadline, "target did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    (target, format!("127.0.0.1:{port}"))
}

/// `blockwire mount` of `lun` at `at`, once its file is there.
fn mount(portal: &str, lun: u16, at: &Path, db: &Path) -> Killed {
    std::fs::create_dir_all(at).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_blockwire"))
        .args(["mount", "-p", portal, "-T", IQN, "--lun", &lun.to_string()])
        .arg(at)
        .env(
            "BLOCKWIRE_INITIATOR_NAME",
            "iqn.2026-12.io.blockwire.test:host",
        )
        .env("BLOCKWIRE_CONFIG_DIR", db)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run blockwire mount");
    let mut mounted = Killed(child);
    let file = at.join(format!("lun{lun}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !file.exists() {
        if let Some(status) = mounted.0.try_wait().unwrap() {
            panic!("blockwire mount of LUN {lun} ended before mounting ({status})");
        }
        assert!(
            Instant::now() < deadline,
            "lun{lun} did not appear within 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    mounted
}

/// Writes `fill` to the first 4 KiB of `file`, fsyncs and reads it back.
fn write_and_read(file: &Path, fill: u8) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)?;
    f.write_all(&[fill; 4096])?;
    f.sync_all()?;
    f.seek(SeekFrom::Start(0))?;
    let mut back = vec![0u8; 4096];
    f.read_exact(&mut back)?;
    assert!(
        back.iter().all(|&b| b == fill),
        "{} read back",
        file.display()
    );
    Ok(())
}

/// Stops `m` with SIGTERM (it flushes and logs out); its exit status.
fn stop(mut m: Killed) -> std::process::ExitStatus {
    let pid = m.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        if let Some(status) = m.0.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "mount still running 45 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn mounts_of_different_luns_of_one_target_keep_their_sessions() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: `blockwire mount` cannot be tested on this machine"
    );
    let dir = std::env::temp_dir().join(format!("blockwire-two-mounts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dir = Scratch(dir);
    let log = dir.0.join("target.log");
    let (_target, portal) = start_target(&dir.0, &log);
    let db = dir.0.join("db");
    let a = mount(&portal, 0, &dir.0.join("a"), &db);
    let b = mount(&portal, 1, &dir.0.join("b"), &db);
    // Each mount writes and reads its LUN over a few seconds: longer than
    // DefaultTime2Wait (2 s), after which a session ended by the other's
    // login would have logged in again.
    let until = Instant::now() + Duration::from_secs(5);
    let mut round = 0u8;
    while Instant::now() < until {
        round = round.wrapping_add(1);
        write_and_read(&dir.0.join("a/lun0"), round).expect("LUN 0 through its mount");
        write_and_read(&dir.0.join("b/lun1"), !round).expect("LUN 1 through its mount");
        std::thread::sleep(Duration::from_millis(200));
    }
    let said = std::fs::read_to_string(&log).unwrap();
    let reinstated = said.matches("session reinstated").count();
    assert_eq!(
        reinstated, 0,
        "one mount's login ended the other's session {reinstated} times:\n{said}"
    );
    assert!(stop(b).success(), "mount of LUN 1");
    assert!(stop(a).success(), "mount of LUN 0");
}
