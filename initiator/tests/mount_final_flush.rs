//! `blockwire mount` ends with a SYNCHRONIZE CACHE of each LUN it served
//! writable, then a logout. What the files acknowledged is on the target's
//! medium only after that flush, so its exit status says whether the flush
//! held: a flush the target fails makes the command fail, naming the LUN. A
//! logout the target leaves unanswered after a good flush loses nothing (the
//! target ends the session on its own): it is said on stderr and the command
//! still succeeds.
//!
//! Each test plays the target on a loopback port and runs the real CLI
//! binary with a real FUSE mount in a scratch directory (root and /dev/fuse,
//! as CI has; without them the test fails, naming what is missing). The
//! mount is stopped with SIGTERM, as a service manager stops it.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use blockwire_pdu::{Bhs, Digests, Pdu};

mod scripted;
use scripted::read_pdu;

const TARGET: &str = "iqn.2026-12.io.blockwire:scripted";
/// SCSI status CHECK CONDITION.
const CHECK_CONDITION: u8 = 0x02;

/// How the scripted target ends the session.
#[derive(Clone, Copy)]
enum Ending {
    /// SYNCHRONIZE CACHE fails (MEDIUM ERROR, WRITE ERROR); the logout is
    /// answered.
    FlushFails,
    /// SYNCHRONIZE CACHE succeeds; the logout is read and never answered.
    LogoutUnanswered,
}

/// Logs the initiator in and serves a 1 MiB LUN 0 of 512-byte blocks: READ
/// CAPACITY(16), READs (zeros), WRITEs (taken), and SYNCHRONIZE CACHE as
/// `ending` says. Returns the SYNCHRONIZE CACHE commands it saw.
fn target(listener: TcpListener, ending: Ending) -> u32 {
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let (mut stat_sn, mut cmd_sn) = scripted::log_in(&mut s);
    let mut flushes = 0;
    while let Some(pdu) = read_pdu(&mut s) {
        let c = match pdu.bhs {
            Bhs::ScsiCommand(c) => c,
            Bhs::LogoutRequest(r) => {
                match ending {
                    Ending::FlushFails => {
                        let reply = scripted::agree_to_logout(&r, stat_sn);
                        s.write_all(&reply.encode(Digests::NONE)).unwrap();
                    }
                    // Held open, unanswered, until the initiator gives up.
                    Ending::LogoutUnanswered => while read_pdu(&mut s).is_some() {},
                }
                return flushes;
            }
            Bhs::NopOut(_) | Bhs::DataOut(_) => continue,
            other => panic!("unexpected {other:?}"),
        };
        cmd_sn = cmd_sn.wrapping_add(1);
        let reply = match c.cdb[0] {
            // READ CAPACITY(16): last LBA 2047, 512-byte blocks.
            0x9e => {
                let mut data = vec![0u8; 32];
                data[..8].copy_from_slice(&2047u64.to_be_bytes());
                data[8..12].copy_from_slice(&512u32.to_be_bytes());
                data.truncate(c.expected_data_transfer_length as usize);
                scripted::single_data_in(&c, Some(0), stat_sn, cmd_sn, data)
            }
            0x28 | 0x88 => {
                let len = c.expected_data_transfer_length as usize;
                scripted::single_data_in(&c, Some(0), stat_sn, cmd_sn, vec![0; len])
            }
            0x35 | 0x91 => {
                flushes += 1;
                match ending {
                    Ending::FlushFails => Pdu::with_data(
                        scripted::response(&c, CHECK_CONDITION, None, 0, stat_sn, cmd_sn).bhs,
                        medium_error_sense(),
                    ),
                    Ending::LogoutUnanswered => scripted::response(&c, 0, None, 0, stat_sn, cmd_sn),
                }
            }
            // TEST UNIT READY, WRITEs (their data is taken and dropped) and
            // anything else a mount may send: GOOD.
            _ => scripted::response(&c, 0, None, 0, stat_sn, cmd_sn),
        };
        s.write_all(&reply.encode(Digests::NONE)).unwrap();
        stat_sn += 1;
    }
    panic!("the initiator left without logging out ({flushes} flushes seen)")
}

/// Fixed-format sense data (SPC-4 4.5.3), with the two-byte SenseLength the
/// iSCSI data segment carries before it (RFC 7143 §11.4.7.2): MEDIUM ERROR,
/// WRITE ERROR (0Ch/00h).
fn medium_error_sense() -> Vec<u8> {
    let mut sense = vec![0u8; 18];
    sense[0] = 0x70;
    sense[2] = 0x03;
    sense[7] = 10;
    sense[12] = 0x0c;
    let mut data = (sense.len() as u16).to_be_bytes().to_vec();
    data.extend(sense);
    data
}

/// A scratch mount point, unmounted (lazily, in case the test failed with
/// the mount up) and removed when dropped.
struct MountPoint(PathBuf);

impl Drop for MountPoint {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The CLI process, killed when dropped (a test that failed midway leaves
/// nothing running).
struct Mounted(Child);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `blockwire mount` of LUN 0 against a target playing `ending`, waits
/// for `lun0` to appear, writes a block through it with fsync, stops the
/// mount with SIGTERM and returns its exit success, its stderr and the
/// flushes the target saw.
fn mount_and_stop(tag: &str, ending: Ending) -> (bool, String, u32) {
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: `blockwire mount` cannot be tested on this machine"
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let portal = listener.local_addr().unwrap().to_string();
    let script = std::thread::spawn(move || target(listener, ending));
    let dir = std::env::temp_dir().join(format!(
        "blockwire-mount-final-{tag}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let dir = MountPoint(dir);
    let child = Command::new(env!("CARGO_BIN_EXE_blockwire"))
        .args(["mount", "-p", &portal, "-T", TARGET, "--lun", "0"])
        .arg(&dir.0)
        .env(
            "BLOCKWIRE_INITIATOR_NAME",
            format!("iqn.2026-12.io.blockwire.test:{tag}"),
        )
        .env("BLOCKWIRE_CONFIG_DIR", dir.0.with_extension("db"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run blockwire mount");
    let mut mounted = Mounted(child);
    let file = dir.0.join("lun0");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !file.exists() {
        if let Some(status) = mounted.0.try_wait().unwrap() {
            panic!("blockwire mount ended before mounting: {status}");
        }
        assert!(Instant::now() < deadline, "lun0 did not appear within 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    {
        let mut f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        f.write_all(&[0xa5; 512]).unwrap();
        // The fsync's own SYNCHRONIZE CACHE: a failure of it is the write's
        // error, said to the writer, as for any file.
        let synced = f.sync_all();
        if let Ending::LogoutUnanswered = ending {
            synced.expect("fsync through the mount");
        }
    }
    let pid = mounted.0.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success(), "kill -TERM {pid}");
    let deadline = Instant::now() + Duration::from_secs(45);
    let status = loop {
        if let Some(status) = mounted.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "blockwire mount still running 45 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(mounted.0.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    eprintln!("blockwire mount ({status}):\n{stderr}");
    let flushes = script.join().expect("the scripted target");
    let _ = std::fs::remove_dir_all(dir.0.with_extension("db"));
    (status.success(), stderr, flushes)
}

#[test]
fn a_final_flush_the_target_fails_fails_the_mount() {
    let (ok, stderr, flushes) = mount_and_stop("flush-fails", Ending::FlushFails);
    assert!(
        flushes >= 2,
        "the fsync's flush and the final one: {flushes}"
    );
    assert!(
        !ok,
        "blockwire mount succeeded though its final SYNCHRONIZE CACHE failed"
    );
    assert!(
        stderr.contains("the final SYNCHRONIZE CACHE of lun0 failed"),
        "{stderr}"
    );
}

#[test]
fn a_logout_left_unanswered_after_a_good_flush_still_succeeds() {
    let (ok, stderr, flushes) = mount_and_stop("logout-unanswered", Ending::LogoutUnanswered);
    assert!(
        flushes >= 2,
        "the fsync's flush and the final one: {flushes}"
    );
    assert!(stderr.contains("blockwire mount: logout:"), "{stderr}");
    assert!(
        ok,
        "blockwire mount failed though every write was flushed: {stderr}"
    );
}
