//! Issue 7 acceptance: every data-path mode passes the data-integrity
//! end-to-end test. A random pattern is written through blockwire-target
//! (release binary when built, see `support::target_bin`) and read back in
//! 1 MiB READs at queue depth 32, on file LUNs in cached mode, direct mode
//! (O_DIRECT) and direct mode with synchronized sends (`sync_send`); the
//! checksums must be equal.
//!
//! Sizes: `BLOCKWIRE_E2E_MIB` sets the pattern size; by default 256 MiB
//! with the release target and 32 MiB with the debug one.

mod support;

use std::sync::Arc;
use std::time::Instant;

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

/// One target, one file LUN per mode: 0 cached, 1 direct, 2 direct with
/// synchronized sends, 3 cached with synchronized sends.
fn config(dir: &std::path::Path, mib: usize) -> String {
    let mut c = format!(
        "[[portal_group]]\ntag = 1\nlisten = [\"127.0.0.1:3260\"]\n\n[[target]]\nname = \"{IQN}\"\n"
    );
    let luns = [
        ("cached", ""),
        ("direct", ""),
        ("direct", "sync_send = true\nsync_chunk = \"64K\"\n"),
        ("cached", "sync_send = true\nsync_chunk = \"128K\"\n"),
    ];
    for (id, (mode, extra)) in luns.iter().enumerate() {
        let path = dir.join(format!("lun{id}.img"));
        c += &format!(
            "\n[[target.lun]]\nid = {id}\nbackstore = \"file\"\npath = {path:?}\nsize = \"{mib}M\"\nmode = \"{mode}\"\n{extra}"
        );
    }
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_lun_modes_random_write_read_back() {
    let scratch = Scratch::new("modes");
    let mib = e2e_mib();
    let (_t, port) = start_blockwire(Some(&config(&scratch.0, mib)), &scratch);
    let c = InitiatorConfig::new("iqn.2026-11.io.blockwire.test:modes").with_queue_depth(32);
    let s = Arc::new(
        Session::connect(c, &format!("127.0.0.1:{port}"), IQN)
            .await
            .expect("login"),
    );
    let labels = [
        "cached",
        "direct (O_DIRECT)",
        "direct + sync_send 64K",
        "cached + sync_send 128K",
    ];
    for (lun, label) in labels.iter().enumerate() {
        let lun = lun as u16;
        let cap = s.read_capacity(lun).await.expect("READ CAPACITY");
        let block = cap.block_size as usize;
        let len = mib << 20;
        assert!(cap.bytes() >= len as u64, "LUN {lun} too small");
        let data = Arc::new(pattern(len, 0x7e57 ^ u64::from(lun)));
        let t = Instant::now();
        let cmds = write_all(&s, lun, 0, block, &data, 32, 2048).await;
        let tw = t.elapsed();
        let t = Instant::now();
        let back = read_all(&s, lun, 0, block, len, 32).await;
        let tr = t.elapsed();
        let (cw, cr) = (checksum(&data), checksum(&back));
        println!(
            "{label}: {mib} MiB: {cmds} WRITEs in {:.2} s ({:.0} MB/s), READ back in {:.2} s ({:.0} MB/s); crc32c written {cw:#010x} read {cr:#010x}",
            tw.as_secs_f64(),
            len as f64 / tw.as_secs_f64() / 1e6,
            tr.as_secs_f64(),
            len as f64 / tr.as_secs_f64() / 1e6,
        );
        assert_eq!(cw, cr, "{label}: checksums differ");
        assert!(back == *data, "{label}: data differs");
    }
    Arc::try_unwrap(s)
        .expect("no other users")
        .logout()
        .await
        .expect("logout");
}
