//! `blockwire mount` against a scripted target, with the real CLI binary
//! and a real FUSE mount in a scratch directory (root and /dev/fuse, as CI
//! has; without them the test fails, naming what is missing). The mount is
//! stopped with SIGTERM, as a service manager stops it.
//!
//! - It ends with a SYNCHRONIZE CACHE of each LUN it served writable, then
//!   a logout. What the files acknowledged is on the target's medium only
//!   after that flush, so its exit status says whether the flush held: a
//!   flush the target fails makes the command fail, naming the LUN. A logout
//!   the target leaves unanswered after a good flush loses nothing (the
//!   target ends the session on its own): it is said on stderr and the
//!   command still succeeds.
//! - A unit whose Block Limits VPD page sets a MAXIMUM TRANSFER LENGTH
//!   refuses longer READs and WRITEs (SBC-4 6.6.4): the mount cuts its
//!   requests to that length, so a file write or read longer than it still
//!   works.

use std::io::{Read, Seek, SeekFrom, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use blockwire_pdu::pdu::{NopIn, RESERVED_TAG};
use blockwire_pdu::{Bhs, Digests, Pdu};

mod scripted;
use scripted::read_pdu;

const TARGET: &str = "iqn.2026-12.io.blockwire:scripted";
/// The LUN: 1 MiB of 512-byte blocks.
const BLOCKS: u64 = 2048;

/// How the scripted target ends the session.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// SYNCHRONIZE CACHE fails (MEDIUM ERROR, WRITE ERROR); the logout is
    /// answered.
    FlushFails,
    /// SYNCHRONIZE CACHE succeeds; the logout is read and never answered.
    LogoutUnanswered,
    /// SYNCHRONIZE CACHE succeeds and the logout is answered.
    Clean,
    /// SYNCHRONIZE CACHE is refused as a command the unit does not
    /// implement (ILLEGAL REQUEST, INVALID COMMAND OPERATION CODE); the
    /// logout is answered.
    NoSynchronizeCache,
}

/// What the scripted target plays.
#[derive(Clone, Copy)]
struct Script {
    ending: Ending,
    /// MAXIMUM TRANSFER LENGTH of its Block Limits page; None: no such page
    /// (INQUIRY for it ends in CHECK CONDITION, as tgtd's older versions do).
    max_transfer: Option<u32>,
    /// The first READ is answered UNIT ATTENTION, CAPACITY DATA HAS CHANGED.
    resized: bool,
    /// MODE SENSE says DPOFUA=1: the unit takes the FUA bit.
    dpofua: bool,
}

/// What the target saw.
#[derive(Debug, Default)]
struct Seen {
    flushes: u32,
    /// READs and WRITEs longer than MAXIMUM TRANSFER LENGTH (refused).
    too_long: u32,
    /// READs and WRITEs served.
    transfers: u32,
    /// CAPACITY DATA HAS CHANGED was answered.
    resize_said: bool,
    /// WRITEs with the FUA bit.
    fua_writes: u32,
}

/// Logs the initiator in and serves LUN 0 from memory: READ CAPACITY(16),
/// the Block Limits page as `script` says, READ(16)/WRITE(16) (a WRITE's
/// data all immediate, as blocks up to 8 KiB are with the initiator's
/// defaults), and SYNCHRONIZE CACHE and the logout as its ending says.
fn target(listener: TcpListener, script: Script) -> Seen {
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let (mut stat_sn, mut cmd_sn) = scripted::log_in(&mut s);
    let mut disk = vec![0u8; (BLOCKS * 512) as usize];
    let mut seen = Seen::default();
    while let Some(pdu) = read_pdu(&mut s) {
        let c = match pdu.bhs {
            Bhs::ScsiCommand(c) => c,
            Bhs::LogoutRequest(r) => {
                if script.ending == Ending::LogoutUnanswered {
                    // Held open, unanswered, until the initiator gives up.
                    while read_pdu(&mut s).is_some() {}
                } else {
                    let reply = scripted::agree_to_logout(&r, stat_sn);
                    s.write_all(&reply.encode(Digests::NONE)).unwrap();
                }
                return seen;
            }
            // A keepalive ping: answered, or the initiator would give the
            // connection up on a slow machine.
            Bhs::NopOut(n) if n.itt != RESERVED_TAG => {
                let pong = Pdu::with_data(
                    Bhs::NopIn(NopIn {
                        lun: n.lun,
                        itt: n.itt,
                        ttt: RESERVED_TAG,
                        stat_sn,
                        exp_cmd_sn: cmd_sn,
                        max_cmd_sn: cmd_sn.wrapping_add(8),
                    }),
                    pdu.data.clone(),
                );
                s.write_all(&pong.encode(Digests::NONE)).unwrap();
                stat_sn += 1;
                continue;
            }
            Bhs::NopOut(_) | Bhs::DataOut(_) => continue,
            other => panic!("unexpected {other:?}"),
        };
        cmd_sn = cmd_sn.wrapping_add(1);
        // GOOD with `data`, no more than the initiator asked for, and the
        // rest said as a residual underflow (RFC 7143 §11.7.5).
        let good = |data: Vec<u8>| {
            let mut data = data;
            let expected = c.expected_data_transfer_length;
            data.truncate(expected as usize);
            let short = expected - data.len() as u32;
            let mut pdu = scripted::single_data_in(&c, Some(0), stat_sn, cmd_sn, data);
            if let Bhs::DataIn(d) = &mut pdu.bhs {
                d.underflow = short > 0;
                d.residual_count = short;
            }
            pdu
        };
        let reply = match c.cdb[0] {
            // READ CAPACITY(16): the last LBA, 512-byte blocks.
            0x9e => {
                let mut data = vec![0u8; 32];
                data[..8].copy_from_slice(&(BLOCKS - 1).to_be_bytes());
                data[8..12].copy_from_slice(&512u32.to_be_bytes());
                good(data)
            }
            // INQUIRY of the Block Limits VPD page.
            0x12 if c.cdb[1] & 1 == 1 && c.cdb[2] == 0xb0 => match script.max_transfer {
                Some(max) => {
                    let mut page = vec![0u8; 64];
                    page[1] = 0xb0;
                    page[3] = 0x3c;
                    page[8..12].copy_from_slice(&max.to_be_bytes());
                    good(page)
                }
                None => {
                    scripted::check_condition(&c, stat_sn, cmd_sn, ILLEGAL_REQUEST_INVALID_FIELD)
                }
            },
            // MODE SENSE(6): the header, DPOFUA as the script says.
            0x1a => good(vec![3, 0, if script.dpofua { 0x10 } else { 0 }, 0]),
            0x88 | 0x8a => {
                let lba = u64::from_be_bytes(c.cdb[2..10].try_into().unwrap());
                let blocks = u32::from_be_bytes(c.cdb[10..14].try_into().unwrap());
                let range = (lba * 512) as usize..((lba + u64::from(blocks)) * 512) as usize;
                if script.resized && seen.transfers == 0 && !seen.resize_said {
                    seen.resize_said = true;
                    scripted::check_condition(&c, stat_sn, cmd_sn, CAPACITY_CHANGED)
                } else if script.max_transfer.is_some_and(|m| blocks > m) {
                    seen.too_long += 1;
                    scripted::check_condition(&c, stat_sn, cmd_sn, ILLEGAL_REQUEST_INVALID_FIELD)
                } else if c.cdb[0] == 0x88 {
                    seen.transfers += 1;
                    good(disk[range].to_vec())
                } else {
                    assert_eq!(pdu.data.len(), range.len(), "a WRITE's data, all immediate");
                    seen.transfers += 1;
                    seen.fua_writes += u32::from(c.cdb[1] & 0x08 != 0);
                    disk[range].copy_from_slice(&pdu.data);
                    scripted::response(&c, 0, None, 0, stat_sn, cmd_sn)
                }
            }
            0x35 | 0x91 => {
                seen.flushes += 1;
                if script.ending == Ending::FlushFails {
                    scripted::check_condition(&c, stat_sn, cmd_sn, MEDIUM_ERROR_WRITE_ERROR)
                } else if script.ending == Ending::NoSynchronizeCache {
                    scripted::check_condition(&c, stat_sn, cmd_sn, INVALID_COMMAND_OPERATION_CODE)
                } else {
                    scripted::response(&c, 0, None, 0, stat_sn, cmd_sn)
                }
            }
            // TEST UNIT READY and anything else a mount may send: GOOD.
            _ => scripted::response(&c, 0, None, 0, stat_sn, cmd_sn),
        };
        s.write_all(&reply.encode(Digests::NONE)).unwrap();
        stat_sn += 1;
    }
    panic!("the initiator left without logging out: {seen:?}")
}

/// ILLEGAL REQUEST, INVALID FIELD IN CDB.
const ILLEGAL_REQUEST_INVALID_FIELD: scripted::Sense = (0x05, 0x24, 0x00);
/// ILLEGAL REQUEST, INVALID COMMAND OPERATION CODE.
const INVALID_COMMAND_OPERATION_CODE: scripted::Sense = (0x05, 0x20, 0x00);
/// MEDIUM ERROR, WRITE ERROR.
const MEDIUM_ERROR_WRITE_ERROR: scripted::Sense = (0x03, 0x0c, 0x00);
/// UNIT ATTENTION, CAPACITY DATA HAS CHANGED.
const CAPACITY_CHANGED: scripted::Sense = (0x06, 0x2a, 0x09);

/// A scratch mount point, unmounted (lazily, in case the test failed with
/// the mount up) and removed when dropped.
struct MountPoint(PathBuf);

impl Drop for MountPoint {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
        let _ = std::fs::remove_dir_all(&self.0);
        let _ = std::fs::remove_dir_all(self.0.with_extension("db"));
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

/// Runs `blockwire mount` of LUN 0 against a target playing `script`, waits
/// for `lun0` to appear, runs `work` on it, stops the mount with SIGTERM
/// and returns its exit success, its stderr and what the target saw.
fn mount_and_stop(tag: &str, script: Script, work: impl FnOnce(&Path)) -> (bool, String, Seen) {
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: `blockwire mount` cannot be tested on this machine"
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let portal = listener.local_addr().unwrap().to_string();
    let played = std::thread::spawn(move || target(listener, script));
    let dir = std::env::temp_dir().join(format!(
        "blockwire-mount-scripted-{tag}-{}",
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
            let mut stderr = String::new();
            let _ = mounted
                .0
                .stderr
                .as_mut()
                .unwrap()
                .read_to_string(&mut stderr);
            panic!("blockwire mount ended before mounting ({status}): {stderr}");
        }
        assert!(Instant::now() < deadline, "lun0 did not appear within 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    work(&file);
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
    mounted
        .0
        .stderr
        .as_mut()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    eprintln!("blockwire mount ({status}):\n{stderr}");
    let seen = played.join().expect("the scripted target");
    (status.success(), stderr, seen)
}

/// Writes a block through the mount and fsyncs it (the fsync's own
/// SYNCHRONIZE CACHE; its failure is the writer's, as for any file).
fn write_and_sync(file: &Path) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().write(true).open(file)?;
    f.write_all(&[0xa5; 512])?;
    f.sync_all()
}

/// A unit that does not implement SYNCHRONIZE CACHE (SBC-4 makes it
/// optional) writes through: an fsync and the final flush succeed on its
/// refusal, as Linux's sd takes it. Every fsync failed with EINVAL, and the
/// mount's exit status said its data were lost.
#[test]
fn a_unit_without_synchronize_cache_is_flushed_by_its_refusal() {
    let script = Script {
        ending: Ending::NoSynchronizeCache,
        max_transfer: None,
        resized: false,
        dpofua: true,
    };
    let (ok, stderr, seen) = mount_and_stop("no-sync-cache", script, |file| {
        write_and_sync(file).expect("an fsync through the mount");
    });
    assert!(
        seen.flushes >= 2,
        "the fsync's flush and the final one: {seen:?}"
    );
    assert!(ok, "{stderr}");
}

#[test]
fn a_final_flush_the_target_fails_fails_the_mount() {
    let script = Script {
        ending: Ending::FlushFails,
        max_transfer: None,
        resized: false,
        dpofua: true,
    };
    let (ok, stderr, seen) = mount_and_stop("flush-fails", script, |file| {
        let _ = write_and_sync(file);
    });
    assert!(
        seen.flushes >= 2,
        "the fsync's flush and the final one: {seen:?}"
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
    let script = Script {
        ending: Ending::LogoutUnanswered,
        max_transfer: None,
        resized: false,
        dpofua: true,
    };
    let (ok, stderr, seen) = mount_and_stop("logout-unanswered", script, |file| {
        write_and_sync(file).expect("a write and fsync through the mount");
    });
    assert!(
        seen.flushes >= 2,
        "the fsync's flush and the final one: {seen:?}"
    );
    assert!(stderr.contains("blockwire mount: logout:"), "{stderr}");
    assert!(
        ok,
        "blockwire mount failed though every write was flushed: {stderr}"
    );
}

#[test]
fn requests_longer_than_the_units_maximum_transfer_length_go_out_in_pieces() {
    const MAX: u32 = 8;
    let script = Script {
        ending: Ending::Clean,
        max_transfer: Some(MAX),
        resized: false,
        dpofua: true,
    };
    // 64 KiB, then 5000 bytes at an unaligned offset (a read-modify-write
    // of 10 blocks, itself more than one command).
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let tail: Vec<u8> = (0..5000u32).map(|i| (i % 13) as u8 + 1).collect();
    let (ok, stderr, seen) = mount_and_stop("max-transfer", script, |file| {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(file)
            .unwrap();
        f.write_all(&data)
            .expect("a 64 KiB write through the mount");
        f.seek(SeekFrom::Start(70_000)).unwrap();
        f.write_all(&tail)
            .expect("an unaligned write through the mount");
        f.sync_all().expect("fsync");
        let mut back = vec![0u8; data.len()];
        f.seek(SeekFrom::Start(0)).unwrap();
        f.read_exact(&mut back)
            .expect("a 64 KiB read through the mount");
        assert!(back == data, "the 64 KiB read back differs");
        let mut back = vec![0u8; tail.len()];
        f.seek(SeekFrom::Start(70_000)).unwrap();
        f.read_exact(&mut back)
            .expect("an unaligned read through the mount");
        assert!(back == tail, "the unaligned read back differs");
    });
    assert_eq!(
        seen.too_long, 0,
        "commands longer than the unit's {MAX} blocks went out: {seen:?}"
    );
    assert!(seen.transfers >= 2 * 65536 / (MAX * 512), "{seen:?}");
    assert!(ok, "{stderr}");
}

/// A capacity change the target reports (UNIT ATTENTION, CAPACITY DATA HAS
/// CHANGED, retried past by the session) is said on stderr: the mounted
/// file keeps the size it started with until the mount is started again.
#[test]
fn a_capacity_change_the_target_reports_is_said() {
    let script = Script {
        ending: Ending::Clean,
        max_transfer: None,
        resized: true,
        dpofua: true,
    };
    let (ok, stderr, seen) = mount_and_stop("resized", script, |file| {
        let mut f = std::fs::File::open(file).unwrap();
        let mut block = vec![0u8; 512];
        f.read_exact(&mut block).expect("a read through the mount");
    });
    assert!(seen.resize_said, "{seen:?}");
    assert!(
        stderr.contains("the target says a LUN's capacity changed"),
        "{stderr}"
    );
    assert!(ok, "{stderr}");
}

/// An O_DSYNC write must be durable when it returns. To a unit that takes
/// the FUA bit (DPOFUA=1 in its mode parameter header) it goes with FUA;
/// to one that does not, which may ignore the bit, it goes without and a
/// SYNCHRONIZE CACHE follows it before the write returns. FUA was sent to
/// every unit, and trusted.
#[test]
fn an_o_dsync_write_is_flushed_where_the_unit_does_not_take_fua() {
    use std::os::unix::fs::OpenOptionsExt;
    let mut flushes = Vec::new();
    for dpofua in [true, false] {
        let script = Script {
            ending: Ending::Clean,
            max_transfer: None,
            resized: false,
            dpofua,
        };
        let (ok, stderr, seen) = mount_and_stop("dsync", script, |file| {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DSYNC)
                .open(file)
                .unwrap();
            f.write_all(&[0x5a; 4096])
                .expect("an O_DSYNC write through the mount");
        });
        assert!(ok, "{stderr}");
        assert_eq!(
            seen.fua_writes,
            u32::from(dpofua),
            "DPOFUA={dpofua}: {seen:?}"
        );
        assert_eq!(stderr.contains("does not take FUA"), !dpofua, "{stderr}");
        flushes.push(seen.flushes);
    }
    assert_eq!(
        flushes[1],
        flushes[0] + 1,
        "the write to the unit without FUA was followed by SYNCHRONIZE CACHE"
    );
}
