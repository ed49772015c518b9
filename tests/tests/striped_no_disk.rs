//! Striped LUNs and `--no-disk` end to end, through the real daemon
//! (`support::target_bin`: the release build when it exists):
//! - striped (RAID0) LUNs in every READ path: cached on the SCSI core (one
//!   thread per member), direct on the engine's serial baseline, direct and
//!   cached with synchronized sends (one stream per member). A random
//!   pattern is written and read back, and the member files are checked to
//!   hold it in RAID0 order (`BLOCKWIRE_E2E_MIB` sets the size, default 24).
//! - `--no-disk`: READs return the offset pattern on every kind of LUN,
//!   WRITEs succeed and are not stored, no backstore file is created, and
//!   the start-up log says it is a benchmark-only mode.

mod support;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use blockwire_initiator::{InitiatorConfig, Session};
use blockwire_target::datapath::source::pattern_fill;
use support::*;

const IQN: &str = "iqn.2026-11.io.blockwire:striped";
const STRIPE: usize = 64 << 10;

/// blockwire-target with extra flags, killed by PID on drop.
struct Target {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(config: &str, flags: &[&str], scratch: &Scratch) -> Target {
    let (bin, _) = target_bin();
    let port = free_port();
    let path = scratch.0.join(format!("target-{port}.toml"));
    std::fs::write(&path, config).expect("write config");
    let log = scratch.0.join(format!("target-{port}.log"));
    let out = std::fs::File::create(&log).expect("log");
    let mut child = Command::new(&bin)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--config")
        .arg(&path)
        .args(flags)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log"))
        .stderr(out)
        .env("BLOCKWIRE_LOG", "info")
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    wait_port(port, &mut child, "blockwire-target");
    // Portals listen before the per-LUN start-up lines are logged: wait
    // (bounded) for the last of them.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("reach it with")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "blockwire-target did not finish starting within 20 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Target { child, port, log }
}

fn members(dir: &Path, lun: usize) -> Vec<PathBuf> {
    (0..3)
        .map(|m| dir.join(format!("lun{lun}-m{m}.img")))
        .collect()
}

/// LUN 0 striped cached (core path), 1 direct (engine, serial), 2 direct +
/// sync_send, 3 cached + sync_send; 3 members, 64K stripes.
fn striped_config(dir: &Path, mib: usize) -> String {
    let mut c = format!(
        "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n[[target]]\nname = \"{IQN}\"\n"
    );
    let luns = [
        "mode = \"cached\"\n",
        "mode = \"direct\"\n",
        "mode = \"direct\"\nsync_send = true\nsync_chunk = \"64K\"\n",
        "mode = \"cached\"\nsync_send = true\nsync_chunk = \"128K\"\n",
    ];
    for (id, extra) in luns.iter().enumerate() {
        let paths: Vec<String> = members(dir, id).iter().map(|p| format!("{p:?}")).collect();
        c += &format!(
            "\n[[target.lun]]\nid = {id}\nbackstore = \"striped\"\npaths = [{}]\nstripe_chunk = \"64K\"\nsize = \"{mib}M\"\n{extra}",
            paths.join(", ")
        );
    }
    c
}

async fn login(port: u16, iqn: &str) -> Arc<Session> {
    let c = InitiatorConfig::new("iqn.2026-11.io.blockwire.test:striped").with_queue_depth(16);
    Arc::new(
        Session::connect(c, &format!("127.0.0.1:{port}"), iqn)
            .await
            .expect("login"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn striped_luns_round_trip_in_every_read_path() {
    let scratch = Scratch::new("striped");
    // BLOCKWIRE_E2E_MIB sets the size; 24 MiB keeps the default run short.
    let mib = std::env::var("BLOCKWIRE_E2E_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24usize);
    let t = start(&striped_config(&scratch.0, mib), &[], &scratch);
    let log = std::fs::read_to_string(&t.log).unwrap();
    // LUNs 1, 2 and 3 read through the engine, one stream per member.
    assert_eq!(
        log.matches("3 striped members, ").count(),
        3,
        "the engine path names its streams:\n{log}"
    );
    let s = login(t.port, IQN).await;
    let len = mib << 20;
    for lun in 0..4u16 {
        let data = Arc::new(pattern(len, 0x5719 ^ u64::from(lun)));
        write_all(&s, lun, 0, 512, &data, 16, 2048).await;
        let back = read_all(&s, lun, 0, 512, len, 16).await;
        assert_eq!(
            checksum(&back),
            checksum(&data),
            "LUN {lun}: read back differs"
        );
        assert!(back == *data, "LUN {lun}: data differs");
        // RAID0 placement on disk: chunk k on member k mod 3 at (k / 3) chunks.
        let files: Vec<std::fs::File> = members(&scratch.0, lun as usize)
            .iter()
            .map(|p| std::fs::File::open(p).unwrap())
            .collect();
        for k in [0usize, 1, 2, 3, 7, len / STRIPE - 1] {
            let mut chunk = vec![0u8; STRIPE];
            files[k % 3]
                .read_exact_at(&mut chunk, ((k / 3) * STRIPE) as u64)
                .unwrap();
            assert!(
                chunk == data[k * STRIPE..(k + 1) * STRIPE],
                "LUN {lun}: chunk {k} not on member {}",
                k % 3
            );
        }
    }
    Arc::try_unwrap(s)
        .expect("no other users")
        .logout()
        .await
        .expect("logout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_disk_reads_the_pattern_and_drops_writes() {
    let scratch = Scratch::new("nodisk");
    let file = scratch.0.join("never.img");
    let m: Vec<PathBuf> = (0..2)
        .map(|i| scratch.0.join(format!("never{i}.img")))
        .collect();
    let config = format!(
        "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n[[target]]\nname = \"{IQN}\"\n\n\
         [[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = \"16M\"\n\n\
         [[target.lun]]\nid = 1\nbackstore = \"file\"\npath = {file:?}\nsize = \"16M\"\nmode = \"direct\"\nsync_send = true\n\n\
         [[target.lun]]\nid = 2\nbackstore = \"striped\"\npaths = [{:?}, {:?}]\nsize = \"16M\"\n",
        m[0], m[1]
    );
    let t = start(&config, &["--no-disk"], &scratch);
    let log = std::fs::read_to_string(&t.log).unwrap();
    assert!(
        log.contains("--no-disk: BENCHMARK-ONLY MODE") && log.contains("WRITE IS DROPPED"),
        "{log}"
    );
    assert!(
        log.contains("no-disk pattern data"),
        "LUN 1 reads the pattern on the engine path:\n{log}"
    );
    let s = login(t.port, IQN).await;
    for lun in 0..3u16 {
        let cap = s.read_capacity(lun).await.expect("READ CAPACITY");
        assert_eq!(cap.bytes(), 16 << 20, "LUN {lun}");
        // 1 MiB at LBA 100 (unaligned to the chunk, large enough for the
        // engine path and the striped split).
        let lba = 100u64;
        let mut want = vec![0u8; 1 << 20];
        pattern_fill(lba * 512, &mut want);
        let mut got = vec![0u8; 1 << 20];
        s.read(lun, lba, 2048, &mut got).await.expect("READ");
        assert!(got == want, "LUN {lun}: READ is not the offset pattern");
        // A WRITE succeeds and is not stored.
        let junk = vec![0xa5u8; 64 << 10];
        s.write(lun, lba, 128, &junk).await.expect("WRITE");
        let mut again = vec![0u8; 64 << 10];
        s.read(lun, lba, 128, &mut again).await.expect("READ");
        assert!(again == want[..64 << 10], "LUN {lun}: the WRITE was stored");
    }
    Arc::try_unwrap(s)
        .expect("no other users")
        .logout()
        .await
        .expect("logout");
    assert!(
        !file.exists() && !m[0].exists() && !m[1].exists(),
        "--no-disk created a backstore file"
    );
}
