//! The `blockwire` CLI as scripts use it, against a real blockwire-target
//! on a free port (the binary `cargo build -p blockwire-mgmt` builds; the
//! test fails, naming the command, when it is missing):
//!
//! - iscsiadm's exit statuses: 24 when the ACL or CHAP refuses the login,
//!   21 when discovery lists no targets, 4 when the portal refuses the
//!   connection;
//! - the initiator name defaults to open-iscsi's InitiatorName= file;
//! - dd's own operands (if= of= bs= count= skip= seek= status=none);
//! - a stdout closed by the reader (`| head -1`) ends the command quietly.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod target_binary;
use target_binary::target_bin;

const IQN: &str = "iqn.2026-11.io.blockwire:ops";
const ADMITTED: &str = "iqn.2026-11.io.blockwire.test:admitted";

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!(
            "blockwire-cli-ops-{tag}-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Target(Child);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A target admitting only ADMITTED, with CHAP user "ops"; a second target
/// admitting nobody this test uses.
fn start(dir: &Path) -> (Target, String) {
    let port = free_port();
    let config = dir.join("ops.toml");
    std::fs::write(
        &config,
        format!(
            "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:{port}\"]\n\n\
             [[target]]\nname = \"{IQN}\"\nallow = [\"{ADMITTED}\"]\n\
             chap = [{{ user = \"ops\", secret = \"ops-secret-123\" }}]\n\n\
             [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"1M\"\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(target_bin())
        .arg("--config")
        .arg(&config)
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
    (Target(child), format!("127.0.0.1:{port}"))
}

/// Runs `blockwire ARGS` with the initiator name taken from `name_file`
/// (open-iscsi's format), never from the environment.
fn blockwire(args: &[&str], name_file: &Path) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_blockwire"))
        .args(args)
        .env_remove("BLOCKWIRE_INITIATOR_NAME")
        .env_remove("BLOCKWIRE_CHAP_SECRET")
        .env("BLOCKWIRE_INITIATORNAME_FILE", name_file)
        .env("BLOCKWIRE_CONFIG_DIR", name_file.parent().unwrap())
        .output()
        .expect("run blockwire");
    eprintln!(
        "$ blockwire {} -> {}\n{}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn name_file(dir: &Path, file: &str, name: &str) -> PathBuf {
    let p = dir.join(file);
    std::fs::write(
        &p,
        format!("## written by open-iscsi\n# InitiatorName=iqn.not:this\nInitiatorName={name}\n"),
    )
    .unwrap();
    p
}

#[test]
fn exit_statuses_and_the_default_initiator_name() {
    let dir = Scratch::new("exit");
    let (_t, portal) = start(dir.path());
    let admitted = name_file(dir.path(), "admitted.iscsi", ADMITTED);
    let stranger = name_file(
        dir.path(),
        "stranger.iscsi",
        "iqn.2026-11.io.blockwire.test:stranger",
    );
    let chap = ["--chap-user", "ops", "--chap-secret", "ops-secret-123"];

    // The name from the file passes the ACL; with CHAP the login succeeds.
    let mut args = vec!["readcap", "-p", &portal, "-T", IQN];
    args.extend(chap);
    let out = blockwire(&args, &admitted);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Capacity:      1048576 bytes"));

    // Another name from the file: the ACL refuses it, exit 24.
    let out = blockwire(&args, &stranger);
    assert_eq!(out.status.code(), Some(24));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("authorization failure"),
        "the refusal is named"
    );

    // The admitted name with a wrong CHAP secret: exit 24.
    let out = blockwire(
        &[
            "readcap",
            "-p",
            &portal,
            "-T",
            IQN,
            "--chap-user",
            "ops",
            "--chap-secret",
            "wrong-secret-123",
        ],
        &admitted,
    );
    assert_eq!(out.status.code(), Some(24));

    // Discovery as a stranger lists nothing: exit 21, for every command
    // that discovers.
    for cmd in [
        vec!["discover", "-p", &portal],
        vec!["ls", "-p", &portal],
        vec!["readcap", "-p", &portal],
        vec!["iscsiadm", "-m", "discovery", "-t", "st", "-p", &portal],
    ] {
        let out = blockwire(&cmd, &stranger);
        assert_eq!(out.status.code(), Some(21), "{cmd:?}");
    }
    // As the admitted initiator the same discovery lists the target.
    let out = blockwire(&["discover", "-p", &portal], &admitted);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(IQN));

    // A portal nobody listens on: exit 4.
    let closed = format!("127.0.0.1:{}", free_port());
    let out = blockwire(&["discover", "-p", &closed], &admitted);
    assert_eq!(out.status.code(), Some(4));

    // --help documents all of it.
    let out = blockwire(&["--help"], &admitted);
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "/etc/iscsi/initiatorname.iscsi",
        "21  nothing found",
        "24  authentication or authorization failure",
        "if=disk.img",
    ] {
        assert!(help.contains(needle), "--help lacks {needle:?}");
    }
}

#[test]
fn dd_operands_and_a_closed_stdout() {
    let dir = Scratch::new("dd");
    let (_t, portal) = start(dir.path());
    let admitted = name_file(dir.path(), "admitted.iscsi", ADMITTED);
    let url = format!("iscsi://ops%ops-secret-123@{portal}/{IQN}/0");

    // 16 KiB of a pattern; dd writes 4 KiB blocks 1..=3 of it to LUN
    // blocks 5..=7, then reads LUN blocks 5..=7 back.
    let src = dir.path().join("in.img");
    let data: Vec<u8> = (0..16384u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    let if_ = format!("if={}", src.display());
    let of_ = format!("of={url}");
    let out = blockwire(
        &[
            "dd",
            &if_,
            &of_,
            "bs=4k",
            "count=3",
            "skip=1",
            "seek=5",
            "status=none",
        ],
        &admitted,
    );
    assert!(out.status.success());
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains('['),
        "status=none still drew a progress line"
    );
    let back = dir.path().join("back.img");
    let out = blockwire(
        &[
            "dd",
            &format!("if={url}"),
            &format!("of={}", back.display()),
            "bs=4096",
            "skip=5",
            "count=3",
            "status=none",
        ],
        &admitted,
    );
    assert!(out.status.success());
    assert_eq!(std::fs::read(&back).unwrap(), &data[4096..16384]);
    // Long options and operands agree: the block before is still zero.
    let before = dir.path().join("before.img");
    let out = blockwire(
        &[
            "dd",
            "--if",
            &url,
            "--of",
            before.to_str().unwrap(),
            "--bs",
            "4k",
            "--skip",
            "4",
            "--count",
            "1",
            "--quiet",
        ],
        &admitted,
    );
    assert!(out.status.success());
    assert_eq!(std::fs::read(&before).unwrap(), vec![0u8; 4096]);
    let out = blockwire(&["dd", &if_, &of_, "skip=99"], &admitted);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("skip=99"));

    // `blockwire ls ... | head -0`: the reader is gone before the first
    // line; the command ends with status 0 and no panic.
    let mut child = Command::new(env!("CARGO_BIN_EXE_blockwire"))
        .args(["ls", "-p", &portal])
        .env_remove("BLOCKWIRE_INITIATOR_NAME")
        .env("BLOCKWIRE_INITIATORNAME_FILE", &admitted)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // And a reader that takes one line, as `head -1` does.
    let mut child = Command::new(env!("CARGO_BIN_EXE_blockwire"))
        .args(["ls", "-p", &portal])
        .env_remove("BLOCKWIRE_INITIATOR_NAME")
        .env("BLOCKWIRE_INITIATORNAME_FILE", &admitted)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = Vec::new();
    let mut byte = [0u8; 1];
    while std::io::Read::read(&mut stdout, &mut byte).unwrap() == 1 && byte[0] != b'\n' {
        first.push(byte[0]);
    }
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&first), format!("Target: {IQN}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

/// A CHAP secret shorter than RFC 7143's 96 bits is said on stderr (the
/// login still goes ahead: the target decides); one of 12 bytes is not.
#[test]
fn a_short_chap_secret_is_warned_of() {
    let run = |secret: &str| {
        Command::new(env!("CARGO_BIN_EXE_blockwire"))
            .args([
                "discover",
                "-p",
                "127.0.0.1:1",
                "--chap-user",
                "u",
                "--chap-secret",
                secret,
            ])
            .env(
                "BLOCKWIRE_INITIATOR_NAME",
                "iqn.2026-11.io.blockwire.test:cli",
            )
            .output()
            .expect("run blockwire")
    };
    let short = run("short");
    let said = String::from_utf8_lossy(&short.stderr);
    assert!(
        said.contains("--chap-secret is 5 bytes; RFC 7143 asks for at least 12"),
        "{said}"
    );
    assert_eq!(
        short.status.code(),
        Some(4),
        "the portal is unreachable: {said}"
    );
    let long = run("twelve-bytes");
    let said = String::from_utf8_lossy(&long.stderr);
    assert!(!said.contains("warning"), "{said}");
}

/// Two live sessions of one initiator name to one target must differ in
/// ISID: a login with the ISID of a live session reinstates it, ending the
/// older (RFC 7143 §6.3.5). A one-shot command (`inq`) beside a held
/// session of the same name (as `blockwire mount` holds one), and `dd`
/// between two places of one target, each log in with an ISID of their
/// own. Both used the held session's: `inq` ended it, and dd's two ends
/// ended each other until the copy failed.
#[test]
fn one_shot_commands_leave_a_held_session_of_the_same_name_alone() {
    use blockwire_initiator::{ChapConfig, InitiatorConfig, Session};
    let dir = Scratch::new("isid");
    let (_t, portal) = start(dir.path());
    let admitted = name_file(dir.path(), "admitted.iscsi", ADMITTED);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // Held as `blockwire mount` holds its session: ISID qualifier 0.
    let mut cfg = InitiatorConfig::new(ADMITTED);
    cfg.chap = Some(ChapConfig::new("ops", "ops-secret-123"));
    let held = rt
        .block_on(Session::connect(cfg, &portal, IQN))
        .expect("the held session logs in");
    let chap = ["--chap-user", "ops", "--chap-secret", "ops-secret-123"];
    let mut inq = vec!["inq", "-p", &portal, "-T", IQN];
    inq.extend(chap);
    assert!(blockwire(&inq, &admitted).status.success(), "inq");
    // LUN 0's first 16 KiB to its blocks 100..104 (of 4 KiB): an input and
    // an output session to one target, side by side.
    let url = format!("iscsi://ops%ops-secret-123@{portal}/{IQN}/0");
    let (if_, of_) = (format!("if={url}"), format!("of={url}"));
    let dd = [
        "dd",
        &if_,
        &of_,
        "bs=4k",
        "count=4",
        "seek=100",
        "status=none",
    ];
    let started = Instant::now();
    assert!(blockwire(&dd, &admitted).status.success(), "dd LUN to LUN");
    eprintln!("dd took {:?}", started.elapsed());
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), held.test_unit_ready(0))
            .await
            .expect("TEST UNIT READY ends")
            .expect("TEST UNIT READY on the held session");
    });
    assert_eq!(
        held.recoveries(),
        0,
        "the held session was ended by a login with its ISID, and logged in again"
    );
    rt.block_on(held.logout()).expect("logout");
}
