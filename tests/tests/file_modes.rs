//! Every data-path mode passes the data-integrity
//! end-to-end test. A random pattern is written through blockwire-target
//! (release binary when built, see `support::target_bin`) and read back in
//! 1 MiB READs at queue depth 32; the checksums must be equal.
//!
//! One daemon serves one LUN per backstore mode (the table in [`modes`]):
//! cached with sendfile Data-In and with the copy path, direct (O_DIRECT
//! through the I/O engine, serial and synchronized), cached with
//! synchronized sends, double-buffered writes on cached and direct LUNs,
//! and striped LUNs (SCSI core path, multi-stream synchronized sends).
//! The same daemon is then read by sessions that change how the data
//! travel: DataPDUInOrder=No (Data-In in completion order), header and
//! data digests (the sendfile LUN's writer reads each payload into memory
//! to digest it), and an
//! RDMA-assisted session (READ data placed by one RDMA Write per chunk).
//! A second daemon runs with zero-copy socket sends off. Before any I/O,
//! each daemon is checked to really run its direct LUNs with O_DIRECT
//! (/proc/PID/fdinfo flags) and its engine-path LUNs on io_uring (its
//! start-up log), so that a silent fallback to buffered I/O or to the
//! thread pool fails the test.
//!
//! Sizes: `BLOCKWIRE_E2E_MIB` sets the pattern size; by default 256 MiB
//! with the release target and 32 MiB with the debug one.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_initiator::rdma::{AssistedSession, Mode as RdmaMode, RdmaConfig};
use blockwire_initiator::{InitiatorConfig, Session};
use support::*;

const IQN: &str = "iqn.2026-11.io.blockwire:modes";

fn e2e_mib() -> usize {
    if let Some(v) = std::env::var("BLOCKWIRE_E2E_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return v;
    }
    if target_bin().1 {
        256
    } else {
        32
    }
}

/// One LUN of the mode table.
struct Mode {
    label: &'static str,
    /// The LUN's TOML after `id`, `path(s)` and `size`.
    toml: &'static str,
    /// Striped over this many member files (0: one file).
    members: usize,
    /// Read again by the DataPDUInOrder=No and RDMA sessions (engine path).
    engine: bool,
}

/// Every backstore mode, LUN number = index.
fn modes() -> Vec<Mode> {
    let m = |label, toml, members, engine| Mode {
        label,
        toml,
        members,
        engine,
    };
    vec![
        m(
            "cached, sendfile Data-In",
            "backstore = \"file\"\nmode = \"cached\"\n",
            0,
            false,
        ),
        m(
            "cached, copy path (zero_copy = false)",
            "backstore = \"file\"\nmode = \"cached\"\nzero_copy = false\n",
            0,
            false,
        ),
        m(
            "direct, engine serial",
            "backstore = \"file\"\nmode = \"direct\"\n",
            0,
            true,
        ),
        m(
            "direct + sync_send 64K",
            "backstore = \"file\"\nmode = \"direct\"\nsync_send = true\nsync_chunk = \"64K\"\n",
            0,
            true,
        ),
        m(
            "cached + sync_send 128K",
            "backstore = \"file\"\nmode = \"cached\"\nsync_send = true\nsync_chunk = \"128K\"\n",
            0,
            true,
        ),
        m(
            "cached + sync_write 64K (double-buffered writes)",
            "backstore = \"file\"\nmode = \"cached\"\nsync_write = true\nsync_chunk = \"64K\"\n",
            0,
            false,
        ),
        m(
            "direct + sync_write + sync_send 64K",
            "backstore = \"file\"\nmode = \"direct\"\nsync_write = true\nsync_send = true\nsync_chunk = \"64K\"\n",
            0,
            true,
        ),
        m(
            "striped x3 cached (SCSI core)",
            "backstore = \"striped\"\nstripe_chunk = \"64K\"\nmode = \"cached\"\n",
            3,
            false,
        ),
        m(
            "striped x3 direct + sync_send 16K (multi-stream)",
            "backstore = \"striped\"\nstripe_chunk = \"64K\"\nmode = \"direct\"\nsync_send = true\nsync_chunk = \"16K\"\n",
            3,
            true,
        ),
        m(
            "striped x3 cached + sync_send 128K",
            "backstore = \"striped\"\nstripe_chunk = \"64K\"\nmode = \"cached\"\nsync_send = true\nsync_chunk = \"128K\"\n",
            3,
            true,
        ),
    ]
}

fn config(dir: &Path, mib: usize, fabric: &str, modes: &[Mode]) -> String {
    let mut c = format!(
        "[fabric]\n{fabric}\n[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n[[target]]\nname = \"{IQN}\"\n"
    );
    for (id, m) in modes.iter().enumerate() {
        let files = if m.members == 0 {
            format!("path = {:?}\n", dir.join(format!("lun{id}.img")))
        } else {
            let paths: Vec<String> = (0..m.members)
                .map(|k| format!("{:?}", dir.join(format!("lun{id}-m{k}.img"))))
                .collect();
            format!("paths = [{}]\n", paths.join(", "))
        };
        c += &format!(
            "\n[[target.lun]]\nid = {id}\n{files}size = \"{mib}M\"\n{}",
            m.toml
        );
    }
    c
}

/// The backing files of LUN `id` (its members when striped).
fn lun_files(dir: &Path, id: usize, m: &Mode) -> Vec<PathBuf> {
    if m.members == 0 {
        vec![dir.join(format!("lun{id}.img"))]
    } else {
        (0..m.members)
            .map(|k| dir.join(format!("lun{id}-m{k}.img")))
            .collect()
    }
}

fn no_io_uring_allowed() -> bool {
    std::env::var("BLOCKWIRE_ALLOW_NO_IO_URING").is_ok_and(|v| v == "1")
}

/// The daemon really runs every `direct` LUN with O_DIRECT and reads the
/// engine-path LUNs through io_uring, and the cached LUNs without O_DIRECT:
/// - the kernel's view: every descriptor the daemon holds on a direct LUN's
///   file (or member) has O_DIRECT in /proc/PID/fdinfo `flags` (octal
///   040000), none on a cached LUN's file;
/// - the daemon's start-up log: each engine-path LUN's "READ engine" line
///   (and "WRITE engine" line with sync_write) names io_uring and, on a
///   direct LUN, O_DIRECT. A direct LUN that fell back to buffered I/O, or
///   an engine that fell back to the thread pool, fails here (the latter
///   unless BLOCKWIRE_ALLOW_NO_IO_URING=1).
fn check_direct_io(pid: u32, log: &Path, dir: &Path, modes: &[Mode]) {
    // The engine lines come just after the portal listens: wait for the
    // last "serving" line.
    let deadline = Instant::now() + Duration::from_secs(20);
    let lines: Vec<String> = loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(strip_ansi).collect();
        let last = format!(" lun={}", modes.len() - 1);
        if lines
            .iter()
            .any(|l| l.contains("serving") && l.trim_end().ends_with(&last))
        {
            break lines;
        }
        assert!(
            Instant::now() < deadline,
            "the daemon did not log every LUN; log:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let line = |what: &str, id: usize| -> Option<&String> {
        let lun = format!(" lun={id}");
        lines
            .iter()
            .find(|l| l.contains(what) && l.trim_end().ends_with(&lun))
    };
    // Open file descriptions of the daemon, by path.
    let mut fds: std::collections::HashMap<PathBuf, Vec<u32>> = Default::default();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).expect("/proc/PID/fd") {
        let e = e.unwrap();
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        let Ok(info) = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            e.file_name().to_string_lossy()
        )) else {
            continue;
        };
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .map(|f| u32::from_str_radix(f.trim(), 8).expect("octal flags"))
            .expect("a flags line");
        fds.entry(target).or_default().push(flags);
    }
    const O_DIRECT: u32 = 0o40000;
    for (id, m) in modes.iter().enumerate() {
        let direct = m.toml.contains("mode = \"direct\"");
        for f in lun_files(dir, id, m) {
            let flags = fds
                .get(&f)
                .unwrap_or_else(|| panic!("LUN {id} {}: the daemon has no fd on {f:?}", m.label));
            let n_direct = flags.iter().filter(|&&x| x & O_DIRECT != 0).count();
            println!(
                "LUN {id} {}: {} fds on {:?}, {n_direct} with O_DIRECT (flags {:?})",
                m.label,
                flags.len(),
                f.file_name().unwrap(),
                flags.iter().map(|x| format!("{x:o}")).collect::<Vec<_>>()
            );
            if direct {
                assert_eq!(
                    n_direct,
                    flags.len(),
                    "LUN {id} {}: an fd on {f:?} without O_DIRECT: buffered I/O on a direct LUN",
                    m.label
                );
            } else {
                assert_eq!(
                    n_direct, 0,
                    "LUN {id} {}: O_DIRECT on a cached LUN",
                    m.label
                );
            }
        }
        let uring = |l: &str, what: &str| {
            if !no_io_uring_allowed() {
                assert!(
                    l.contains("engine io_uring"),
                    "LUN {id} {}: the {what} engine is not io_uring (set \
                     BLOCKWIRE_ALLOW_NO_IO_URING=1 only where io_uring is missing): {l}",
                    m.label
                );
            }
        };
        if m.engine || direct {
            let l = line("READ engine: engine path", id)
                .unwrap_or_else(|| panic!("LUN {id} {}: no engine-path READ line", m.label));
            uring(l, "READ");
            if direct {
                assert!(
                    l.contains("O_DIRECT reads"),
                    "LUN {id} {}: not O_DIRECT: {l}",
                    m.label
                );
            }
        }
        if m.toml.contains("sync_write = true") {
            let l = line("WRITE engine:", id)
                .unwrap_or_else(|| panic!("LUN {id} {}: no WRITE engine line", m.label));
            uring(l, "WRITE");
            if direct {
                assert!(
                    l.contains("O_DIRECT writes"),
                    "LUN {id} {}: not O_DIRECT: {l}",
                    m.label
                );
            }
        }
    }
}

/// `s` without ANSI colour sequences.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

async fn connect(cfg: InitiatorConfig, port: u16) -> Arc<Session> {
    Arc::new(
        Session::connect(cfg, &format!("127.0.0.1:{port}"), IQN)
            .await
            .expect("login"),
    )
}

async fn logout(s: Arc<Session>) {
    match Arc::try_unwrap(s) {
        Ok(s) => s.logout().await.expect("logout"),
        Err(_) => panic!("a worker still holds the session"),
    }
}

/// Writes a random pattern to every LUN and reads it back; returns the
/// patterns for later sessions to compare with.
async fn write_and_read_back(s: &Arc<Session>, modes: &[Mode], mib: usize) -> Vec<Arc<Vec<u8>>> {
    let mut patterns = Vec::new();
    for (lun, m) in modes.iter().enumerate() {
        let lun = lun as u16;
        let cap = s.read_capacity(lun).await.expect("READ CAPACITY");
        let block = cap.block_size as usize;
        let len = mib << 20;
        assert!(cap.bytes() >= len as u64, "LUN {lun} too small");
        let data = Arc::new(pattern(len, 0x7e57 ^ u64::from(lun)));
        let t = Instant::now();
        let cmds = write_all(s, lun, 0, block, &data, 32, 2048).await;
        let tw = t.elapsed();
        let t = Instant::now();
        let back = read_all(s, lun, 0, block, len, 32).await;
        let tr = t.elapsed();
        let (cw, cr) = (checksum(&data), checksum(&back));
        println!(
            "LUN {lun} {}: {mib} MiB: {cmds} WRITEs in {:.2} s ({:.0} MB/s), READ back in {:.2} s ({:.0} MB/s); crc32c written {cw:#010x} read {cr:#010x}",
            m.label,
            tw.as_secs_f64(),
            len as f64 / tw.as_secs_f64() / 1e6,
            tr.as_secs_f64(),
            len as f64 / tr.as_secs_f64() / 1e6,
        );
        assert_eq!(cw, cr, "{}: checksums differ", m.label);
        assert!(back == *data, "{}: data differs", m.label);
        patterns.push(data);
    }
    patterns
}

/// Reads `lun` whole through `s` and compares with `data`.
async fn read_back(s: &Arc<Session>, lun: u16, data: &[u8], what: &str) {
    let t = Instant::now();
    let back = read_all(s, lun, 0, 512, data.len(), 32).await;
    let (cw, cr) = (checksum(data), checksum(&back));
    println!(
        "LUN {lun} {what}: READ back in {:.2} s; crc32c written {cw:#010x} read {cr:#010x}",
        t.elapsed().as_secs_f64()
    );
    assert!(back == data, "LUN {lun} {what}: data differs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mode_random_write_read_back() {
    let scratch = Scratch::new("modes");
    let mib = e2e_mib();
    let modes = modes();
    let fabric = "rdma_listen = \"127.0.0.1:0\"\n";
    let (t, port, log) = start_blockwire_logging(
        Some(&config(&scratch.0, mib, fabric, &modes)),
        &scratch,
        "info",
    );
    check_direct_io(t.pid(), &log, &scratch.0, &modes);
    tokio::time::timeout(Duration::from_secs(900), async {
        let c = InitiatorConfig::new("iqn.2026-11.io.blockwire.test:modes").with_queue_depth(32);
        let s = connect(c, port).await;
        let patterns = write_and_read_back(&s, &modes, mib).await;
        logout(s).await;

        // Data-In in completion order on the engine-path LUNs.
        let mut c = InitiatorConfig::new("iqn.2026-11.io.blockwire.test:any-order")
            .with_queue_depth(32)
            .with_data_pdu_in_order(false);
        c.max_recv_data_segment_length = 8192;
        let s = connect(c, port).await;
        assert!(!s.params().data_pdu_in_order, "DataPDUInOrder=No refused");
        for (lun, m) in modes.iter().enumerate().filter(|(_, m)| m.engine) {
            let what = format!("{}, DataPDUInOrder=No", m.label);
            read_back(&s, lun as u16, &patterns[lun], &what).await;
        }
        logout(s).await;

        // Header and data digests: the sendfile LUN's writer reads each
        // payload into memory and digests it.
        let c = InitiatorConfig::new("iqn.2026-11.io.blockwire.test:digests")
            .with_queue_depth(32)
            .with_digests(true, true);
        let s = connect(c, port).await;
        for lun in [0u16, 3, 8] {
            let what = format!("{}, header+data digests", modes[lun as usize].label);
            read_back(&s, lun, &patterns[lun as usize], &what).await;
        }
        logout(s).await;

        // RDMA-assisted: READ data placed by RDMA Writes, one per chunk on
        // the engine-path LUNs.
        let c = InitiatorConfig::new("iqn.2026-11.io.blockwire.test:rdma");
        let s =
            AssistedSession::connect(c, RdmaConfig::default(), &format!("127.0.0.1:{port}"), IQN)
                .await
                .expect("RDMA-assisted login");
        assert_eq!(s.mode().await, RdmaMode::Offloaded);
        // At most RdmaConfig::max_offload per command (larger ones go over TCP).
        let per = RdmaConfig::default().max_offload;
        let mut reads = 0;
        for (lun, m) in modes.iter().enumerate().filter(|(_, m)| m.engine) {
            let data = &patterns[lun];
            let t = Instant::now();
            let mut at = 0;
            while at < data.len() {
                let n = per.min(data.len() - at);
                let mut r = s.alloc(n).expect("registered buffer");
                let c = s
                    .read(lun as u16, (at / 512) as u64, (n / 512) as u32, &mut r)
                    .await
                    .expect("RDMA-assisted READ");
                assert_eq!(c.transferred, n);
                assert!(
                    r.to_vec()[..] == data[at..at + n],
                    "LUN {lun} {} over RDMA: data differ at {at}",
                    m.label
                );
                at += n;
                reads += 1;
            }
            println!(
                "LUN {lun} {}, RDMA-assisted: READ back equal in {:.2} s",
                m.label,
                t.elapsed().as_secs_f64()
            );
        }
        assert_eq!(s.stats().offloaded_reads, reads, "every READ offloaded");
        s.logout().await.expect("logout");
    })
    .await
    .expect("all-modes test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modes_with_zero_copy_sends_off() {
    let scratch = Scratch::new("modes-nozc");
    let mib = e2e_mib();
    let modes: Vec<Mode> = modes()
        .into_iter()
        .filter(|m| {
            m.label.starts_with("cached, copy") || m.label.starts_with("direct + sync_send")
        })
        .collect();
    assert_eq!(modes.len(), 2);
    let fabric = "zero_copy_send = false\n";
    let (t, port, log) = start_blockwire_logging(
        Some(&config(&scratch.0, mib, fabric, &modes)),
        &scratch,
        "info",
    );
    check_direct_io(t.pid(), &log, &scratch.0, &modes);
    tokio::time::timeout(Duration::from_secs(600), async {
        let c = InitiatorConfig::new("iqn.2026-11.io.blockwire.test:nozc").with_queue_depth(32);
        let s = connect(c, port).await;
        write_and_read_back(&s, &modes, mib).await;
        logout(s).await;
    })
    .await
    .expect("zero-copy-off test timed out");
}
