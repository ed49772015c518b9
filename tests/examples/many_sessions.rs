//! Many sessions against one running blockwire-target: `--sessions N` log in
//! (each its own TCP connection and ISID), then `--busy M` of them run 4 KiB
//! random READs at queue depth 1 for `--secs S` while the others sit idle.
//! Prints the target's resident memory before and after the logins (memory
//! per idle session), how long the logins took, READ latency percentiles and
//! IOPS under that load, and whether every session still answers at the end.
//!
//! Run by bench/many-sessions.sh, which starts the release daemon:
//!   many_sessions --portal 127.0.0.1:3260 --target IQN --pid PID --sessions 1000 --busy 100 --secs 10

use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_initiator::{InitiatorConfig, Session};
use rand::{Rng, SeedableRng};

struct Args {
    portal: String,
    target: String,
    pid: u32,
    sessions: usize,
    busy: usize,
    secs: u64,
}

fn args() -> Args {
    let mut a = Args {
        portal: "127.0.0.1:3260".into(),
        target: String::new(),
        pid: 0,
        sessions: 1000,
        busy: 100,
        secs: 10,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--portal" => a.portal = v,
            "--target" => a.target = v,
            "--pid" => a.pid = v.parse().expect("--pid N"),
            "--sessions" => a.sessions = v.parse().expect("--sessions N"),
            "--busy" => a.busy = v.parse().expect("--busy N"),
            "--secs" => a.secs = v.parse().expect("--secs N"),
            other => panic!("unknown argument {other}"),
        }
    }
    assert!(
        !a.target.is_empty() && a.pid != 0,
        "give --target and --pid"
    );
    assert!(a.busy <= a.sessions, "--busy is at most --sessions");
    a
}

/// VmRSS of `pid` in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("target's status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[tokio::main]
async fn main() {
    let a = args();
    let before = rss_kib(a.pid);
    let started = Instant::now();
    let mut sessions: Vec<Arc<Session>> = Vec::with_capacity(a.sessions);
    // Logins in batches, as a cluster's nodes come up, not all in one burst.
    for batch in (0..a.sessions).collect::<Vec<_>>().chunks(50) {
        let mut joins = Vec::new();
        for &i in batch {
            let mut cfg =
                InitiatorConfig::new(format!("iqn.2026-11.io.blockwire:many-{:04}", i % 1000));
            cfg.isid_qualifier = i as u16;
            let (portal, target) = (a.portal.clone(), a.target.clone());
            joins.push(tokio::spawn(async move {
                Session::connect(cfg, &portal, &target).await
            }));
        }
        for j in joins {
            let s = j.await.expect("login task").unwrap_or_else(|e| {
                panic!("login {} of {} failed: {e}", sessions.len() + 1, a.sessions)
            });
            sessions.push(Arc::new(s));
        }
    }
    let login_time = started.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib(a.pid);
    println!(
        "sessions logged in: {} in {:.2} s; target RSS {before} KiB -> {after} KiB: {:.1} KiB per idle session",
        a.sessions,
        login_time.as_secs_f64(),
        (after.saturating_sub(before)) as f64 / a.sessions as f64
    );

    let blocks = 2u64 << 20; // the script's LUN: 1 GiB of 512-byte blocks
    let deadline = Instant::now() + Duration::from_secs(a.secs);
    let mut joins = Vec::new();
    for (i, s) in sessions.iter().take(a.busy).cloned().enumerate() {
        joins.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut buf = Vec::new();
            let mut rng = rand::rngs::StdRng::seed_from_u64(i as u64);
            while Instant::now() < deadline {
                let lba = rng.gen_range(0..blocks / 8) * 8;
                buf.resize(4096, 0);
                let t = Instant::now();
                s.read(0, lba, 8, &mut buf).await.expect("READ");
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for j in joins {
        all.extend(j.await.expect("reader"));
    }
    all.sort();
    println!(
        "4 KiB random READ, QD1 on each of {} busy sessions ({} idle), {} s: {:.0} IOPS; latency p50 {} us, p99 {} us, p99.9 {} us, max {} us",
        a.busy,
        a.sessions - a.busy,
        a.secs,
        all.len() as f64 / a.secs as f64,
        percentile(&all, 0.50).as_micros(),
        percentile(&all, 0.99).as_micros(),
        percentile(&all, 0.999).as_micros(),
        all.last().copied().unwrap_or_default().as_micros(),
    );

    // Every session, idle ones included, still answers.
    let mut bad = 0;
    for s in &sessions {
        if s.execute(0, &[0u8; 6], blockwire_initiator::DataDir::None)
            .await
            .is_err()
        {
            bad += 1;
        }
    }
    println!(
        "TEST UNIT READY on all {} sessions afterwards: {} failed; target RSS now {} KiB",
        sessions.len(),
        bad,
        rss_kib(a.pid)
    );
    let mut out = 0;
    for s in sessions {
        if let Ok(s) = Arc::try_unwrap(s) {
            if s.logout().await.is_ok() {
                out += 1;
            }
        }
    }
    println!("logged out: {out}");
    if bad > 0 {
        std::process::exit(1);
    }
}
